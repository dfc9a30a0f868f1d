/* Shared host logic of the GPU plugins; see gpu_core.h. */
#include "gpu_core.h"
#include "oscar_format.h" /* layout checks and page geometry: one home for the format */

#include "append_params.h"
#include "decode_tc_params.h"

#include <stdlib.h>
#include <string.h>

#define LOG2E 1.4426950408889634f
#define ALIGN256(x) (((x) + 255u) & ~(size_t)255u)
/* Grids of up to this many CTAs per compute unit take the warp write path's cp.async-ring
 * instance (latency), larger ones the plain-load one (occupancy). */
#define OSCAR_APPENDW_RING_CTAS 4
/* Grids of more than this many warp-path CTAs per compute unit take the tile write path
 * (rotation and feedback weights shared by a CTA's tokens) at head_dim 256, and at head_dim 128
 * with feedback weights where the shared-F warp instance (append_wk) is off: measured on the
 * H200 (perf/RESULTS-attention.md, sixteenth session), at head_dim 128 with feedback the tile path wins at batch 256 x 8 KV heads (31
 * per SM: 42 vs 64 us) and loses by 2 us at 128 (15.5: 36 vs 34 us); the lines cross near 17. At
 * head_dim 256 the tile path already won at batch 128 (eighth session: 94 vs 99 us with feedback, 44
 * vs 52 nearest), so the lower threshold moves it the same way there. */
#define OSCAR_APPEND_TILE_CTAS 16
/* ... and where the shared-F warp instance runs feedback appends at head_dim 128 (append_wk), past
 * this many: H100, twenty-fourth session, 32/8/128 batch 256 (31 per SM) append_wk 38.3 vs the tile
 * path 42.5 us, 32/32/128 batch 128 (62 per SM) 76.3 vs 60.8; append_wk grows ~9.3 us per 1000
 * CTAs there, the tile path ~4.5: the lines cross near 38. */
#define OSCAR_APPEND_TILE_WK_CTAS 38
/* Shorter decodes keep the 16-head variants' 2-CTA kernel unless the grid is large:
 * at 4K the 3-CTA twin measured 0.81-0.96x, at 32K 1.06x (H200, tenth session); the
 * threshold lies between, not measured more finely. */
#define OSCAR_DECODE_O3_MIN_LEN 16384
/* W3 layers split the 2-bit history of their heads with a plane twice as fine from 2-bit splits of this
 * many tokens up ($OSCAR_DECODE_W3_SPLIT), the further splits in grid rows of their own. H100,
 * twenty-eighth session, d 128 GQA 1-12, one 3-bit head-tensor: 256 and 2048 alike from batch 8 up;
 * batch 1 x 32K (splits of ~550 tokens) 1.17-1.21x a 2-bit layer without, 1.27-1.32x with (from 256);
 * batch 1 x 128K (~2K) 1.22-1.65x without, 1.18-1.27x with. */
#define OSCAR_DECODE_W3_SPLIT_MIN 1024
/* The long-chunk extend (extend_fa.jinja) from this many (query row, head) pairs per KV head: a CTA
 * of 64 pairs unpacks each tile once for all of them, where the decode family's widest CTA holds 16. */
#define OSCAR_EXTEND_FA_MIN_PAIRS 64
/* ... and from PART_PAIRS where the call holds at least PART_GRID (sequence, KV head) pairs: its CTA,
 * at most a quarter empty, then costs less than the decode family's four CTAs of 16 columns (H100,
 * thirty-third session, perf/RESULTS-attention.md: 49-63 pairs at batch 8-32 1.2-1.6x faster, at
 * 33-48 from 13 % slower to 21 % faster; at batch 1 the decode family's more CTAs win up to 63). */
#define OSCAR_EXTEND_FA_PART_PAIRS 49
#define OSCAR_EXTEND_FA_PART_GRID 32

typedef struct gpu_plan {
    oscar_layout_desc l;
    int num_layers, num_rot, identity, quantized, lm, S0, W, lp, gqa;
    size_t slot_bytes, kc, vc, km, vm;
    size_t *page_bytes; /* host [layers]: each layer's page size (format/layout.c; they differ only with
                           layout.wide_per_layer 1, FORMAT.md §3.3), passed to the kernels per call */
    void *rot_k, *rot_v, *rot_vt; /* device fp32 [layers][num_rot][d][d]; rot_vt transposed; NULL if identity */
    void *fb_k, *fb_v; /* device fp32 error-feedback weights, same layout; NULL: round to nearest */
    void *clip_k, *clip_v;        /* device fp32 [layers][kv heads] */
    /* 3-bit head-tensors (FORMAT.md §2.7): planes is device int32 [layers][kv heads][2] (K, V), the
     * 1-bit plane index of each head-tensor or -1 (2 bits); NULL and wide 0 when the descriptor has
     * no code_bits. hi_off: the first plane's offset in a page. layer_wide (host, [layers], NULL when
     * wide is 0): how many KV heads of the layer hold a 3-bit head-tensor (K, V or both). Such a
     * layer takes the tensor-core W3 decode/extend kernels where the plugin has them (else the
     * generic fp32 extend kernels) and the block-wide write kernels, which read and store the
     * planes; a layer
     * of 2-bit head-tensors keeps every other kernel (its codes and metadata sit at the same offsets,
     * only page_bytes counts the plane room). */
    void *planes;
    int wide;
    uint16_t *layer_wide;
    int64_t hi_off;
    int ring_ctas; /* warp write path: grids up to ring_ctas CTAs per compute unit take the ring instance */
    int wf_ctas;   /* ... and up to wf_ctas (-1: as many as fit at once) the one with all of F in shared memory */
    int tile_ctas; /* grids of more than tile_ctas warp-path CTAs per compute unit take the tile path (-1: the defaults) */
    int wk_pairs;  /* feedback past one wave of the wf instance: tokens per CTA of the shared-F one (-1: the rule) */
    /* decode grids of at least o3_ctas CTAs before splitting take the 3-CTA twin, if the plan's
     * longest sequence reaches o3_len or the grid o3_big CTAs (o3_len 0: the count alone) */
    int o3_ctas, o3_len, o3_big;
    int w3_split; /* W3 layers: the heads with a plane take twice the 2-bit splits from this chunk up */
    int w3_rows;  /* ... in rows of their own (gpu_tc_choose's heavy_rows; $OSCAR_DECODE_W3_ROWS, tests, A/B) */
    /* extend calls run their 2-bit splits on the long-chunk kernel where the plan has it: fa_min is
     * OSCAR_EXTEND_FA_MIN_PAIRS for the default rule (fa_choose lowers it for large grids), or
     * $OSCAR_EXTEND_FA's fixed choice (-1 never, 1 every extend; tests, A/B);
     * fa_splits > 0 fixes its split count ($OSCAR_EXTEND_FA_SPLITS, A/B) */
    int fa_min, fa_splits;
    int dec_splits; /* > 0: the tensor-core family's split count n before the carve ($OSCAR_DECODE_SPLITS, A/B) */
    gpu_kernels k;
} gpu_plan;

static const gpu_vendor *V(void *ctx) { return ((gpu_ctx_head *)ctx)->vendor; }

int gpu_env_count(const char *name, int def, int max, const char **bad) {
    const char *e = getenv(name);
    if (!e || !*e) return def;
    char *end = NULL;
    long v = strtol(e, &end, 10);
    if (end && *end == '\0' && v >= 0 && v <= max) return (int)v;
    if (!*bad) *bad = name;
    return def;
}

/* Tokens per CTA of the shared-F warp write path (append_wk) for total_new tokens of H heads: of
 * K = 2, 4, 8, the fewest waves of CTAs (resident counts from the occupancy query), the smallest K
 * among equals (a CTA waits for its copy of F; fewer pairs wait less); 0 where none is resident. */
static int wk_tokens(const gpu_plan *p, int fk, int64_t total_new, int H, int64_t cus) {
    int best = 0;
    int64_t best_waves = 0;
    for (int i = 0; i < 3; i++) {
        const int K = 2 << i;
        const int64_t res = (int64_t)p->k.wk_resident[fk][i] * (cus > 0 ? cus : 1);
        if (res < 1) continue;
        const int64_t ctas = (total_new + K - 1) / K * 2 * H, waves = (ctas + res - 1) / res;
        if (!best || waves < best_waves) {
            best = K;
            best_waves = waves;
        }
    }
    return best;
}

static int log2_exact(int x) {
    int b = 0;
    while ((1 << b) < x) b++;
    return (1 << b) == x ? b : -1;
}

void gpu_choose_splits(int num_seqs, int kv_heads, int max_len, int threads, int min_chunk, int target_blocks,
                       int resident, int max_splits, int *nsplit, int *chunk) {
    int64_t per = (int64_t)num_seqs * kv_heads;
    int64_t cap = ((int64_t)max_len + min_chunk - 1) / min_chunk;
    if (cap > max_splits) cap = max_splits;
    if (cap < 1) cap = 1;
    int64_t want;
    if (resident > 0 && per > 0) {
        int64_t best = -1;
        want = 1;
        /* Runs on every decode call: visit each distinct chunk once (a few
         * dozen), not every split count. */
        for (int64_t ns = 1; ns <= cap && ns <= 4096;) {
            int64_t c = ((int64_t)max_len + ns - 1) / ns;
            c = (c + threads - 1) / threads * threads;
            int64_t used = ((int64_t)max_len + c - 1) / c;
            if (used == ns) { /* else: same chunk as a smaller count */
                /* a CTA's fixed cost (q setup, pipeline fill, partial write) ~ 512 tokens */
                int64_t waves = (per * ns + resident - 1) / resident;
                int64_t cost = waves * (c + 512);
                if (best < 0 || cost < best) {
                    best = cost;
                    want = ns;
                }
            }
            if (c <= threads) break;
            /* next count whose chunk is smaller: ceil(max_len / ns') <= c - threads */
            int64_t next = ((int64_t)max_len + c - threads - 1) / (c - threads);
            ns = next > ns ? next : ns + 1;
        }
    } else {
        want = per > 0 ? (target_blocks + per - 1) / per : 1;
        if (want > cap) want = cap;
        if (want < 1) want = 1;
    }
    int64_t c = ((int64_t)max_len + want - 1) / want;
    c = (c + threads - 1) / threads * threads;
    if (c < threads) c = threads;
    *chunk = (int)c;
    *nsplit = (int)(((int64_t)max_len + c - 1) / c);
    if (*nsplit < 1) *nsplit = 1;
}

/* The n splits of gpu_tc_choose carved between the two kinds of rows by their bytes, on the
 * 32-token / 16-row tile grid. */
static void tc_carve(int64_t n, int64_t lh, int64_t nwin, int64_t row2, int64_t total, int64_t *ns2_, int64_t *nsw_,
                     int64_t *c2_, int64_t *c16_) {
    int64_t ns2 = 0, nsw = 0;
    if (lh > 0 && nwin > 0) {
        ns2 = (n * lh * row2 + total / 2) / total;
        if (ns2 < 1) ns2 = 1;
        nsw = n - ns2 > 1 ? n - ns2 : 1;
    } else if (lh > 0) {
        ns2 = n;
    } else {
        nsw = n;
    }
    int64_t c2 = 32, c16 = 16;
    if (ns2 > 0) {
        c2 = (lh + ns2 - 1) / ns2;
        c2 = (c2 + 31) / 32 * 32;
        ns2 = (lh + c2 - 1) / c2;
    }
    if (nsw > 0) {
        c16 = (nwin + nsw - 1) / nsw;
        c16 = (c16 + 15) / 16 * 16;
        nsw = (nwin + c16 - 1) / c16;
    }
    *ns2_ = ns2, *nsw_ = nsw, *c2_ = c2, *c16_ = c16;
}

/* The heavy heads' further 2-bit splits (gpu_tc_choose): twice as many chunks where chunks are
 * long; returns their count ns2x (0: none) and sets *cw to their chunk. */
static int64_t tc_heavy(int64_t lh, int64_t ns2, int64_t c2, int64_t heavy_chunk, int64_t *cw) {
    *cw = 0;
    if (ns2 < 1 || c2 < heavy_chunk) return 0;
    int64_t c = (lh + 2 * ns2 - 1) / (2 * ns2);
    c = (c + 31) / 32 * 32;
    int64_t ns2w = c > 0 ? (lh + c - 1) / c : ns2;
    if (ns2w <= ns2) return 0;
    *cw = c;
    return ns2w - ns2;
}

void gpu_tc_choose(int num_seqs, int kv_heads, int gqa, int cap, int max_len, int sink, int recent, int bf16m,
                   int head_dim, int row2_bytes, int resident, int max_splits, int heavy_heads, int heavy_chunk,
                   int heavy_rows, int force_n, gpu_tc_splits *t) {
    t->hchunks = (gqa + cap - 1) / cap;
    int64_t units = (int64_t)num_seqs * kv_heads * t->hchunks;
    int64_t lh = bf16m ? 0 : (max_len > sink + recent ? max_len - sink - recent : 0);
    int64_t nwin = bf16m ? max_len : (max_len < sink + recent ? max_len : sink + recent);
    int64_t row16 = 4 * (int64_t)head_dim, row2 = row2_bytes > 0 ? row2_bytes : 1;
    int64_t total = lh * row2 + nwin * row16; /* bytes one (sequence, head chunk) reads */
    /* Wave model: CTAs of equal bytes; a CTA also costs ~36 KB worth of fixed work
     * (q setup, pipeline fill, partial write). Splits are limited by the rows
     * (16-row tiles) and by the workspace. */
    int64_t cap_s = (lh + 31) / 32 + (nwin + 15) / 16;
    /* with both kinds of rows the carving below can add one split */
    int64_t lim = lh > 0 && nwin > 0 ? (int64_t)max_splits - 1 : max_splits;
    if (cap_s > lim) cap_s = lim;
    if (cap_s > 256) cap_s = 256;
    if (cap_s < 1) cap_s = 1;
    int64_t res = resident > 0 ? resident : 132 * 4, best = -1, ns = 1;
    /* W3 layers (rows of their own): the heavy heads' further splits each cost about a 2-bit one, so
     * the model counts every CTA the carve of n gives them and the others; with the 2-bit layer's count,
     * a grid it filled to one wave spilled a thin second one (1.2-1.3x a 2-bit layer at batch 32-64
     * against 1.02-1.06x counted, d 128 GQA 4-8, H100, twenty-eighth session) */
    const int64_t heavy_units = (int64_t)num_seqs * heavy_heads * t->hchunks;
    /* More than a quarter of the heads heavy (GQA 7, 2 of 4 heads, H100; the one shape measured past a
     * quarter, 2 of 8 at GQA 3-4 gained): rows of their own and the counting model ran up to 1.22x
     * slower (4 of 7 points, 0.96-1.01x at the others) than the 2-bit layer's splits with the heavy
     * heads' second halves in their own rows (the other heads' empty) from twice the chunk, so that
     * layout is kept there (in_row), as where the rows past the heads would not fit a grid's y
     * dimension (65535 on CUDA and HIP: a long extend chunk's head chunks) */
    const int in_row = heavy_units > 0 && (heavy_rows == 0 || (heavy_rows == 1 && 4 * heavy_heads > kv_heads) ||
                                           (int64_t)(kv_heads + heavy_heads) * t->hchunks > 65535);
    const int weigh = heavy_units > 0 && lh > 0 && !in_row;
    for (int64_t n = 1; n <= cap_s && force_n <= 0; n++) {
        int64_t work = units * n;
        if (weigh) { /* (where the carve of n gives none, the count of a 2-bit layer) */
            int64_t n2, nw, c2, c16, cw;
            tc_carve(n, lh, nwin, row2, total, &n2, &nw, &c2, &c16);
            const int64_t nx = tc_heavy(lh, n2, c2, heavy_chunk, &cw);
            if (nx > 0) work = units * (n2 + nw) + heavy_units * nx;
        }
        int64_t waves = (work + res - 1) / res;
        int64_t cost = waves * ((total + n - 1) / n + 36864);
        if (best < 0 || cost < best) {
            best = cost;
            ns = n;
        }
    }
    if (force_n > 0) ns = force_n < cap_s ? force_n : cap_s;
    int64_t ns2, nsw, c2, c16, cw;
    tc_carve(ns, lh, nwin, row2, total, &ns2, &nsw, &c2, &c16);
    t->ns2 = (int)ns2;
    t->chunk2 = (int)c2;
    t->chunk16 = (int)c16;
    t->nsplit = (int)(ns2 + nsw) > 0 ? (int)(ns2 + nsw) : 1;
    /* The heavy heads split their history in twice as many chunks where chunks are long: the first
     * ns2 in their own grid rows, the ns2x others in rows of their own past the heads (in_row: the
     * others in their own rows too, ns2 counting them) */
    int64_t nx = heavy_units > 0 ? tc_heavy(lh, ns2, c2, in_row ? 2 * (int64_t)heavy_chunk : heavy_chunk, &cw) : 0;
    if (t->nsplit + nx > max_splits) nx = 0;
    t->chunk2w = nx > 0 ? (int)cw : 0;
    if (in_row) {
        t->ns2 += (int)nx;
        t->nsplit += (int)nx;
        nx = 0;
    }
    t->ns2x = (int)nx;
    t->pstride = t->nsplit + t->ns2x;
}

static void plan_free(void *ctx, gpu_plan *p) {
    if (!p) return;
    if (p->rot_k) V(ctx)->free(ctx, p->rot_k);
    if (p->rot_v) V(ctx)->free(ctx, p->rot_v);
    if (p->rot_vt) V(ctx)->free(ctx, p->rot_vt);
    if (p->fb_k) V(ctx)->free(ctx, p->fb_k);
    if (p->fb_v) V(ctx)->free(ctx, p->fb_v);
    if (p->k.owner || p->k.decode) V(ctx)->release(ctx, &p->k);
    if (p->clip_k) V(ctx)->free(ctx, p->clip_k);
    if (p->clip_v) V(ctx)->free(ctx, p->clip_v);
    if (p->planes) V(ctx)->free(ctx, p->planes);
    free(p->layer_wide);
    free(p->page_bytes);
    free(p);
}

/* The tensor-core decode addresses inside a page with 32-bit offsets: the largest
 * page the layout rules allow (num_q_heads <= OSCAR_Q_HEADS_MAX KV heads, 128
 * tokens, d 256, 8 groups of f32 metadata, 2 H 1-bit planes) is ~42 MB. */
_Static_assert(2LL * OSCAR_Q_HEADS_MAX * 128 * (256 / 4) + 2LL * OSCAR_Q_HEADS_MAX * 128 * 8 * 2 * 4 +
                       2LL * OSCAR_Q_HEADS_MAX * 128 * (256 / 8) <
                   0x7fffffffLL,
               "a page must stay below 2 GiB");

/* The layer holds a 3-bit head-tensor (its row of the plane table has a plane). */
static int wide_layer(const gpu_plan *p, int layer) {
    return p->layer_wide && layer >= 0 && layer < p->num_layers && p->layer_wide[layer];
}

oscar_status gpu_plan_create(void *ctx, const oscar_backend_plan_desc *desc, void **bplan, char *variant,
                             size_t variant_len, oscar_errbuf *err) {
    const char *nm = V(ctx)->name;
    if (!desc || !bplan) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s plan: NULL descriptor", nm);
    const oscar_layout_desc *l = &desc->layout;
    int d = l->head_dim;
    char why[256];
    oscar_status st = oscar_format_check_layout(l, why, sizeof why);
    if (st != OSCAR_OK) return oscar_errbuf_set(err, st, "%s plan: %s", nm, why);
    if (desc->num_layers < 1 || (desc->num_rot != 1 && desc->num_rot != l->num_kv_heads))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s plan: %d layers with %d rotations per layer; need >= 1 layer and 1 or "
                                "num_kv_heads (%d) rotations",
                                nm, desc->num_layers, desc->num_rot, l->num_kv_heads);
    int bf16m = l->method == OSCAR_METHOD_BF16;
    int lp = log2_exact(l->page_size);
    if (!desc->identity_rotation && (!desc->rot_k || !desc->rot_v))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s plan: rotations missing (rot_k/rot_v NULL)", nm);

    gpu_plan *p = calloc(1, sizeof *p);
    if (!p) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
    p->l = *l;
    p->num_layers = desc->num_layers;
    p->num_rot = desc->num_rot;
    p->identity = desc->identity_rotation;
    p->quantized = !bf16m;
    p->lm = l->method == OSCAR_METHOD_OSCAR2_LM;
    p->S0 = bf16m ? 0 : l->sink;
    p->W = bf16m ? 0 : l->recent;
    p->lp = lp;
    p->gqa = l->num_q_heads / l->num_kv_heads;
    /* $OSCAR_APPEND_RING_CTAS, $OSCAR_APPEND_TILE_CTAS (tuning and A/B timing; docs/API.md):
     * read once, kept by the plan */
    const char *bad = NULL;
    enum { CNT = 1000000 };
    p->ring_ctas = gpu_env_count("OSCAR_APPEND_RING_CTAS", OSCAR_APPENDW_RING_CTAS, CNT, &bad);
    p->wf_ctas = gpu_env_count("OSCAR_APPEND_WF_CTAS", -1, CNT, &bad);
    p->tile_ctas = gpu_env_count("OSCAR_APPEND_TILE_CTAS", -1, CNT, &bad);
    p->wk_pairs = gpu_env_count("OSCAR_APPEND_WK", -1, CNT, &bad);
    int cus = V(ctx)->compute_units(ctx);
    /* default: a third of the CUs, and a call of >= 16K tokens or 3 CTAs per CU; an explicit
     * $OSCAR_DECODE_O3_CTAS (tests, A/B) is the whole rule */
    p->o3_ctas = gpu_env_count("OSCAR_DECODE_O3_CTAS", ((cus > 0 ? cus : 1) + 2) / 3, CNT, &bad);
    p->o3_len = gpu_env_count("OSCAR_DECODE_O3_CTAS", -1, CNT, &bad) >= 0 ? 0 : OSCAR_DECODE_O3_MIN_LEN;
    p->o3_big = 3 * (cus > 0 ? cus : 1);
    p->w3_split = gpu_env_count("OSCAR_DECODE_W3_SPLIT", OSCAR_DECODE_W3_SPLIT_MIN, CNT, &bad);
    p->w3_rows = gpu_env_count("OSCAR_DECODE_W3_ROWS", 1, CNT, &bad);
    p->dec_splits = gpu_env_count("OSCAR_DECODE_SPLITS", 0, CNT, &bad);
    {
        const int fe = gpu_env_count("OSCAR_EXTEND_FA", -1, 1, &bad);
        p->fa_min = fe == 0 ? -1 : fe == 1 ? 1 : OSCAR_EXTEND_FA_MIN_PAIRS;
        p->fa_splits = gpu_env_count("OSCAR_EXTEND_FA_SPLITS", 0, CNT, &bad);
    }
    if (bad) {
        st = oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                              "%s plan: %s='%.40s' is not one of its values (a count 0 to 1000000; "
                              "OSCAR_EXTEND_FA: 0 or 1); unset it for the default rule (a tuning variable, "
                              "docs/API.md)",
                              nm, bad, getenv(bad));
        free(p);
        return st;
    }
    size_t D = (size_t)d;
    oscar_page_geom g;
    oscar_page_geom_init(l, &g);
    p->kc = g.k_codes;
    p->vc = g.v_codes;
    p->km = g.k_meta;
    p->vm = g.v_meta;
    p->slot_bytes = g.window_slot_bytes;
    if (bf16m) p->l.group = d; /* the kernels read a BF16 row as one group */
    size_t nl = (size_t)desc->num_layers;
    if (!(p->page_bytes = malloc(nl * sizeof *p->page_bytes))) {
        plan_free(ctx, p);
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
    }
    for (size_t i = 0; i < nl; i++) p->page_bytes[i] = oscar_format_layer_page_bytes(l, desc->code_bits, (int)i);
    const size_t nclip = nl * (size_t)l->num_kv_heads;
    float *clip = malloc(2 * nclip * sizeof(float)); /* host staging: K then V */
    if (!clip) {
        plan_free(ctx, p);
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
    }
    int clips = l->method == OSCAR_METHOD_OSCAR2 || l->method == OSCAR_METHOD_OSCAR2_LM;
    for (size_t i = 0; i < nclip; i++) {
        float ck = clips && desc->clip_k ? desc->clip_k[i] : 1.0f;
        float cv = clips && desc->clip_v ? desc->clip_v[i] : 1.0f;
        if (!(ck > 0.0f && ck <= 1.0f) || !(cv > 0.0f && cv <= 1.0f)) {
            free(clip);
            plan_free(ctx, p);
            return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                    "%s plan: clip ratio of layer %zu KV head %zu outside (0, 1] (K %g, V %g)", nm,
                                    i / (size_t)l->num_kv_heads, i % (size_t)l->num_kv_heads, (double)ck, (double)cv);
        }
        clip[i] = ck;
        clip[nclip + i] = cv;
    }
    const size_t cbytes = nclip * sizeof(float);
    if ((st = V(ctx)->alloc(ctx, cbytes, &p->clip_k, err)) || (st = V(ctx)->alloc(ctx, cbytes, &p->clip_v, err)) ||
        (st = V(ctx)->write(ctx, p->clip_k, 0, clip, cbytes, NULL, err)) ||
        (st = V(ctx)->write(ctx, p->clip_v, 0, clip + nclip, cbytes, NULL, err)) || (st = V(ctx)->sync(ctx, NULL, err))) {
        free(clip);
        plan_free(ctx, p);
        return st;
    }
    free(clip);
    if (!p->identity) {
        size_t n = nl * (size_t)desc->num_rot * D * D, bytes = n * sizeof(float);
        float *t = malloc(bytes);
        if (!t) {
            plan_free(ctx, p);
            return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
        }
        /* R_V^T per (layer, rotation) so the merge kernel reads it coalesced. */
        for (size_t r = 0; r < nl * (size_t)desc->num_rot; r++)
            for (size_t i = 0; i < D; i++)
                for (size_t j = 0; j < D; j++) t[r * D * D + i * D + j] = desc->rot_v[r * D * D + j * D + i];
        if ((st = V(ctx)->alloc(ctx, bytes, &p->rot_k, err)) || (st = V(ctx)->alloc(ctx, bytes, &p->rot_v, err)) ||
            (st = V(ctx)->alloc(ctx, bytes, &p->rot_vt, err)) ||
            (st = V(ctx)->write(ctx, p->rot_k, 0, desc->rot_k, bytes, NULL, err)) ||
            (st = V(ctx)->write(ctx, p->rot_v, 0, desc->rot_v, bytes, NULL, err)) ||
            (st = V(ctx)->write(ctx, p->rot_vt, 0, t, bytes, NULL, err)) || (st = V(ctx)->sync(ctx, NULL, err))) {
            free(t);
            plan_free(ctx, p);
            return st;
        }
        free(t);
    }
    /* Error-feedback weights: used when both are given, as the CPU backend
     * does; only the 2-bit methods quantize. */
    if (p->quantized && desc->fb_k && desc->fb_v) {
        size_t bytes = nl * (size_t)desc->num_rot * D * D * sizeof(float);
        if ((st = V(ctx)->alloc(ctx, bytes, &p->fb_k, err)) || (st = V(ctx)->alloc(ctx, bytes, &p->fb_v, err)) ||
            (st = V(ctx)->write(ctx, p->fb_k, 0, desc->fb_k, bytes, NULL, err)) ||
            (st = V(ctx)->write(ctx, p->fb_v, 0, desc->fb_v, bytes, NULL, err)) ||
            (st = V(ctx)->sync(ctx, NULL, err))) {
            plan_free(ctx, p);
            return st;
        }
    }
    p->hi_off = (int64_t)g.hi;
    if (desc->code_bits) { /* the plane of each head-tensor (format/layout.c) */
        int32_t *pl = malloc(2 * nclip * sizeof(int32_t));
        if (!pl) {
            plan_free(ctx, p);
            return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
        }
        if ((st = oscar_format_planes(l, desc->num_layers, desc->code_bits, pl, why, sizeof why)) != OSCAR_OK) {
            free(pl);
            plan_free(ctx, p);
            return oscar_errbuf_set(err, st, "%s plan: %s", nm, why);
        }
        const size_t pb = 2 * nclip * sizeof(int32_t);
        if (!(p->layer_wide = calloc(nl, sizeof *p->layer_wide))) {
            free(pl);
            plan_free(ctx, p);
            return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "%s plan: out of host memory", nm);
        }
        for (size_t i = 0; i < nclip; i++) /* [layer][kv head][K, V] */
            if (pl[2 * i] >= 0 || pl[2 * i + 1] >= 0) p->layer_wide[i / (size_t)l->num_kv_heads]++;
        if ((st = V(ctx)->alloc(ctx, pb, &p->planes, err)) || (st = V(ctx)->write(ctx, p->planes, 0, pl, pb, NULL, err)) ||
            (st = V(ctx)->sync(ctx, NULL, err))) {
            free(pl);
            plan_free(ctx, p);
            return st;
        }
        free(pl);
        p->wide = 1;
    }
    if ((st = V(ctx)->select(ctx, &p->l, &p->k, err))) {
        plan_free(ctx, p);
        return st;
    }
    if (p->wide && p->k.tc && !p->k.decode_w3 && (!p->k.extend || !p->k.merge_ext)) {
        /* Without W3 kernels (OSCAR_DECODE_W3=0) a layer with a 3-bit head-tensor attends with the
         * generic extend kernels, which every tensor-core shape is built with. */
        plan_free(ctx, p);
        return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                "%s plan: %s has no generic extend kernel, which layers with 3-bit head-tensors "
                                "(code_bits, FORMAT.md 2.7) need; rebuild the plugin, or use parameters calibrated "
                                "with --wide-bits 0",
                                nm, p->k.name);
    }
    /* "_w3": a plan with 3-bit head-tensors; "_w3t": their layers on the tensor-core W3 kernels */
    if (variant && variant_len)
        snprintf(variant, variant_len, "%s:%s%s", nm, p->k.name, p->wide ? (p->k.decode_w3 ? "_w3t" : "_w3") : "");
    *bplan = p;
    return OSCAR_OK;
}

void gpu_plan_destroy(void *ctx, void *bplan) { plan_free(ctx, bplan); }

size_t gpu_plan_page_bytes(const void *bplan, int layer) {
    const gpu_plan *p = bplan;
    return p && layer >= 0 && layer < p->num_layers ? p->page_bytes[layer] : 0;
}

/* Appends v to the ", "-separated list in buf (len bytes) unless it is there already. */
static void list_add(char *buf, size_t len, int *seen, int nseen_max, int *nseen, int v) {
    for (int i = 0; i < *nseen; i++)
        if (seen[i] == v) return;
    if (*nseen < nseen_max) seen[(*nseen)++] = v;
    size_t used = strlen(buf);
    if (used + 16 < len) snprintf(buf + used, len - used, "%s%d", used ? ", " : "", v);
}

oscar_status gpu_check_compiled_shape(const char *nm, int d, int group, const int (*pairs)[2], int n,
                                      oscar_errbuf *err) {
    char dims[128] = "", groups[128] = "";
    int seen_d[32], seen_g[32], nd = 0, ng = 0, have_d = 0;
    for (int i = 0; i < n; i++) {
        if (pairs[i][0] == d && pairs[i][1] == group) return OSCAR_OK;
        list_add(dims, sizeof dims, seen_d, 32, &nd, pairs[i][0]);
        if (pairs[i][0] == d) {
            have_d = 1;
            list_add(groups, sizeof groups, seen_g, 32, &ng, pairs[i][1]);
        }
    }
    if (!have_d)
        return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED_HEAD_DIM,
                                "%s plan: head_dim %d is not compiled into this plugin (it has head_dim %s); the cpu "
                                "and opencl backends run every head_dim the format allows (" OSCAR_HEAD_DIM_RULE
                                "); %s kernels for it need a variant in gen/variants.json (docs/CODEGEN.md)",
                                nm, d, nd ? dims : "none", nm);
    return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED_GROUP,
                            "%s plan: group %d is not compiled for head_dim %d into this plugin (it has group %s); "
                            "the cpu and opencl backends run every group the format allows (" OSCAR_GROUP_RULE
                            "); %s kernels for it need the group in gen/variants.json (docs/CODEGEN.md)",
                            nm, group, d, groups, nm);
}

static int target_blocks(void *ctx, const gpu_plan *p) {
    int cu = V(ctx)->compute_units(ctx);
    if (cu < 1) cu = 1;
    return cu * (p->k.blocks_per_sm > 0 ? p->k.blocks_per_sm : 2);
}
static int resident_of(void *ctx, int per_cu) {
    int cu = V(ctx)->compute_units(ctx);
    return per_cu > 0 ? (cu < 1 ? 1 : cu) * per_cu : 0;
}
static int resident_blocks(void *ctx, const gpu_plan *p) { return resident_of(ctx, p->k.resident); }

static int hchunks_of(const gpu_plan *p) {
    int cap = p->k.cap > 0 ? p->k.cap : p->gqa;
    return (p->gqa + cap - 1) / cap;
}
/* The tensor-core kernel for cols MMA columns per (sequence, KV head) of nseq
 * sequences (max_len tokens at most): decode's, or for extend its extend instantiation,
 * or the widest variant of the family once cols passes the decode variant's capacity.
 * A decode with a 3-CTA-per-SM twin (the 16-head 2-bit variants) takes it once the
 * (sequence, KV head, head chunk) CTAs before splitting reach a third of the compute
 * units and the call is long (>= 16K tokens) or its grid large (3 such CTAs per unit):
 * H200, GQA 12 / 16 at d 128, 1.04-1.07x from 64 such CTAs up at 32K and 128K, 0.90-0.94x
 * at 4-32 (ninth session); at 4K 0.81-0.96x with 64-128 CTAs, 1.00 with 256, 1.05x with
 * 512 (tenth session; perf/RESULTS-attention.md). */
typedef struct tc_kernel {
    const void *fn;
    int cap, resident;
    unsigned smem;
} tc_kernel;
/* The decode kernel, or (o3, where the variant has one) its 3-CTA twin. */
static tc_kernel tc_decode_kernel(const gpu_plan *p, int o3) {
    return o3 && p->k.decode_o3 ? (tc_kernel){p->k.decode_o3, p->k.cap, p->k.resident_o3, p->k.smem}
                                : (tc_kernel){p->k.decode, p->k.cap, p->k.resident, p->k.smem};
}
/* A layer with 3-bit head-tensors on the tensor-core family: its W3 kernels (decode_tc.jinja). */
static int w3_layer(const gpu_plan *p, int layer) { return p->k.decode_w3 && wide_layer(p, layer); }
static tc_kernel tc_w3_kernel(const gpu_plan *p, int ext) {
    return (tc_kernel){ext ? p->k.extend_w3 : p->k.decode_w3, p->k.cap, ext ? p->k.ext_resident_w3 : p->k.resident_w3,
                       p->k.smem_w3};
}
/* The 3-CTA twin's rule: a grid of units CTAs before splitting. */
static int o3_takes(const gpu_plan *p, int64_t units, int max_len) {
    return units >= p->o3_ctas && (max_len >= p->o3_len || units >= p->o3_big);
}
static tc_kernel tc_kernel_for(const gpu_plan *p, int ext, int cols, int nseq, int max_len, int w3) {
    if (w3) return tc_w3_kernel(p, ext);
    int64_t units = (int64_t)nseq * p->l.num_kv_heads * hchunks_of(p);
    tc_kernel k = tc_decode_kernel(p, o3_takes(p, units, max_len));
    if (!ext) return k;
    k.fn = p->k.tc_extend;
    k.resident = p->k.tc_ext_resident;
    const void *o3 = p->k.tc_extend_o3;
    int o3_resident = p->k.tc_ext_resident_o3;
    if (p->k.xextend && p->k.xcap > p->k.cap && cols > p->k.cap) {
        k = (tc_kernel){p->k.xextend, p->k.xcap, p->k.xresident, p->k.xsmem};
        o3 = p->k.xextend_o3;
        o3_resident = p->k.xresident_o3;
    }
    /* the twin where the extend CTAs (column chunks of k.cap included) make the decode twin's grid */
    if (o3 && o3_takes(p, (int64_t)nseq * p->l.num_kv_heads * ((cols + k.cap - 1) / k.cap), max_len)) {
        k.fn = o3;
        k.resident = o3_resident;
    }
    return k;
}

/* cols: MMA columns per (sequence, KV head): the GQA ratio for decode, max_q_len x it for extend. */
static void tc_choose(void *ctx, const gpu_plan *p, size_t page_bytes, const tc_kernel *k, int nseq, int cols,
                      int max_len, int max_splits, int heavy, gpu_tc_splits *t) {
    /* bytes of one token of one KV head in a page of the layer (codes + metadata of K and V, planes) */
    int row2 = (int)(page_bytes / ((size_t)p->l.num_kv_heads * (size_t)p->l.page_size));
    gpu_tc_choose(nseq, p->l.num_kv_heads, cols, k->cap, max_len, p->S0, p->W, !p->quantized, p->l.head_dim,
                  row2, resident_of(ctx, k->resident), max_splits, heavy, p->w3_split, p->w3_rows, p->dec_splits, t);
}

/* The long-chunk extend's split of the 2-bit history for nseq sequences of up to cols (query row, head)
 * pairs per KV head (extend_fa.jinja: CTAs of 64 pairs): the count of stage-aligned chunks that
 * minimises waves x (chunk + a CTA's fixed cost, ~256 tokens), at most max_splits; 0 where the call
 * does not take that kernel (no kernel, a layer with 3-bit head-tensors, too few pairs, no 2-bit rows,
 * a grid past its y limit). */
static int fa_choose(void *ctx, const gpu_plan *p, int ext, int w3, int nseq, int any_grid, int max_q, int max_len,
                     int max_splits, int *chunk) {
    const int64_t cols = (int64_t)max_q * p->gqa, lh = (int64_t)max_len - p->S0 - p->W, pch = (cols + 63) / 64;
    /* the default rule's pair count for this grid (FORMAT.md §5.1; any_grid: the lower one, for the
     * workspace's bound); $OSCAR_EXTEND_FA's fixed choices as set */
    const int64_t fa_min = p->fa_min == OSCAR_EXTEND_FA_MIN_PAIRS &&
                                   (any_grid || (int64_t)nseq * p->l.num_kv_heads >= OSCAR_EXTEND_FA_PART_GRID)
                               ? OSCAR_EXTEND_FA_PART_PAIRS
                               : p->fa_min;
    /* max_q 1: one query per sequence, as decode (FORMAT.md §5.1: such calls keep §5's kernels) */
    if (!ext || !p->k.extend_fa || w3 || !p->quantized || p->fa_min < 0 || max_q < 2 || cols < fa_min ||
        lh <= 0 || max_splits < 1 || pch * p->l.num_kv_heads > 65535)
        return 0;
    /* chunks in whole pipeline stages (any chunk is correct, a partial stage only wastes its empty half) */
    const int64_t st = 64 * OSCAR_FA_SUB_OF(p->l.head_dim);
    const int64_t base = (int64_t)nseq * p->l.num_kv_heads * pch, tiles = (lh + st - 1) / st;
    int64_t res = resident_of(ctx, p->k.fa_resident), best = -1, ns = 1;
    if (res < 1) res = 132 * 3;
    int64_t cap = tiles < max_splits ? tiles : max_splits;
    if (cap > 256) cap = 256;
    for (int64_t n = 1; n <= cap; n++) {
        const int64_t c = ((lh + n - 1) / n + st - 1) / st * st, waves = (base * n + res - 1) / res;
        const int64_t cost = waves * (c + 256);
        if (best < 0 || cost < best) {
            best = cost;
            ns = n;
        }
    }
    if (p->fa_splits > 0) ns = p->fa_splits < cap ? p->fa_splits : cap;
    *chunk = (int)(((lh + ns - 1) / ns + st - 1) / st * st);
    return (int)((lh + *chunk - 1) / *chunk);
}

/* Workspace: [error word | pad to 256][q~ fp32 [seqs][Hq][d]][partials fp32 [seqs][Hq][splits][d+2]]. */
static size_t qt_bytes(const gpu_plan *p, int seqs) {
    return ALIGN256((size_t)seqs * (size_t)p->l.num_q_heads * (size_t)p->l.head_dim * sizeof(float));
}
static size_t part_bytes(const gpu_plan *p, int seqs, int splits) {
    return (size_t)seqs * (size_t)p->l.num_q_heads * (size_t)splits * (size_t)(p->l.head_dim + 2) * sizeof(float);
}

oscar_status gpu_workspace_bytes(void *ctx, void *bplan, int max_seqs, int max_seq_len, size_t *bytes,
                                 oscar_errbuf *err) {
    const gpu_plan *p = bplan;
    if (!p || !bytes || max_seqs < 1 || max_seq_len < 1)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s workspace_bytes: need a plan, an output and max_seqs, max_seq_len >= 1",
                                V(ctx)->name);
    int nsplit, chunk;
    if (p->k.tc) {
        gpu_tc_splits t;
        nsplit = 0;
        /* the splits depend on the page size: those of every layer's (one value without wide_per_layer) */
        for (int li = 0; li < p->num_layers; li++) {
            int seen = 0;
            for (int j = 0; j < li && !seen; j++) seen = p->page_bytes[j] == p->page_bytes[li];
            if (seen) continue;
            const size_t pb = p->page_bytes[li];
            /* the splits of either decode kernel (the 3-CTA twin may want more) */
            for (int o3 = 0; o3 < (p->k.decode_o3 ? 2 : 1); o3++) {
                tc_kernel k = tc_decode_kernel(p, o3);
                tc_choose(ctx, p, pb, &k, max_seqs, p->gqa, max_seq_len, 1 << 20, 0, &t);
                if (t.nsplit > nsplit) nsplit = t.nsplit;
            }
            if (p->wide && p->k.decode_w3) { /* the W3 layers' splits, for any count of heads with a plane */
                tc_kernel k = tc_w3_kernel(p, 0);
                for (int heavy = 0; heavy <= p->l.num_kv_heads; heavy++) {
                    tc_choose(ctx, p, pb, &k, max_seqs, p->gqa, max_seq_len, 1 << 20, heavy, &t);
                    if (t.pstride > nsplit) nsplit = t.pstride;
                }
            }
        }
    } else {
        gpu_choose_splits(max_seqs, p->l.num_kv_heads * hchunks_of(p), max_seq_len, p->k.threads, p->k.min_chunk,
                          target_blocks(ctx, p), resident_blocks(ctx, p), 1 << 20, &nsplit, &chunk);
    }
    if (p->k.tc && p->k.extend_fa) {
        /* the long-chunk extend's splits for one sequence of max_seqs query rows (its grid is smallest
         * there; and the 16-bit rows' split) */
        const int mq = max_seqs > (1 << 20) ? (1 << 20) : max_seqs;
        int fchunk = 0;
        const int fns = fa_choose(ctx, p, 1, 0, 1, 1, mq, max_seq_len, 1 << 20, &fchunk) + (p->S0 + p->W > 0);
        if (fns > nsplit) nsplit = fns;
    }
    if (p->k.tc && p->wide) { /* the generic extend kernels that decode the layers with 3-bit head-tensors */
        int cap = p->k.ext_cap > 0 ? p->k.ext_cap : p->gqa, ns = 0;
        gpu_choose_splits(max_seqs, p->l.num_kv_heads * ((p->gqa + cap - 1) / cap), max_seq_len, p->k.ext_threads,
                          p->k.min_chunk, target_blocks(ctx, p), 0, 1 << 20, &ns, &chunk);
        if (ns > nsplit) nsplit = ns;
    }
    /* At least two splits: a batch with both 2-bit and 16-bit rows runs them in
     * splits of their own (the minimum the runtime checks is the size for
     * length 1). */
    if (nsplit < 2) nsplit = 2;
    *bytes = OSCAR_WORKSPACE_HEADER + qt_bytes(p, max_seqs) + part_bytes(p, max_seqs, nsplit);
    return OSCAR_OK;
}

oscar_status gpu_workspace_init(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    (void)bplan;
    uint32_t zero = 0;
    if (!workspace) return oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE, "%s workspace_init: workspace is NULL", V(ctx)->name);
    return V(ctx)->write(ctx, workspace, 0, &zero, sizeof zero, stream, err);
}

oscar_status gpu_check(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    (void)bplan;
    const char *nm = V(ctx)->name;
    if (!workspace) return oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE, "%s check: workspace is NULL", nm);
    uint32_t w = 0, zero = 0;
    oscar_status st;
    if ((st = V(ctx)->read(ctx, &w, workspace, 0, sizeof w, stream, err)) || (st = V(ctx)->sync(ctx, stream, err)))
        return st;
    if (!w) return OSCAR_OK;
    if ((st = V(ctx)->write(ctx, workspace, 0, &zero, sizeof zero, stream, err)) || (st = V(ctx)->sync(ctx, stream, err)))
        return st;
    /* The kernels only OR these flags into a zeroed word: any other bit is a workspace that never
     * went through oscar_plan_workspace_init (or was overwritten), not an error a kernel raised. */
    const uint32_t known = OSCAR_DEVERR_BLOCK_TABLE | OSCAR_DEVERR_NONFINITE | OSCAR_DEVERR_LENGTH;
    if (w & ~known)
        return oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE,
                                "%s check: the workspace's error word holds 0x%08x, bits no kernel sets: the "
                                "workspace was not initialised (call oscar_plan_workspace_init once after allocating "
                                "it) or something wrote over its first bytes; the word is cleared now, and errors the "
                                "calls since the last check raised cannot be told apart from it",
                                nm, (unsigned)w);
    oscar_status s = (w & OSCAR_DEVERR_BLOCK_TABLE) ? OSCAR_ERR_BLOCK_TABLE
                     : (w & OSCAR_DEVERR_NONFINITE) ? OSCAR_ERR_NONFINITE
                                                    : OSCAR_ERR_TOO_LONG;
    /* The NaN/Inf flag is raised for K/V rows (append) and for queries (decode, extend): a message
     * naming K/V alone sent the caller looking at the wrong tensor. */
    return oscar_errbuf_set(err, s,
                            "%s device kernels reported:%s%s%s; rows with a page, slot or length out of range were "
                            "skipped, non-finite K/V rows stored as zeros, and the outputs of non-finite queries are "
                            "not valid; fix the block table, window slots, seq_lens or max_seq_len, cu_new, cu_q / "
                            "total_q / max_q_len or the activations",
                            nm, (w & OSCAR_DEVERR_BLOCK_TABLE) ? " block table entry or window slot out of range" : "",
                            (w & OSCAR_DEVERR_NONFINITE) ? " NaN/Inf in a K/V row or a query (q)" : "",
                            /* extend's kernels raise it for a bad query table too */
                            (w & OSCAR_DEVERR_LENGTH)
                                ? " seq_len (below 1 or above the batch's max_seq_len), new-token count (cu_new) or "
                                  "extend query table (cu_q, total_q, max_q_len) out of range"
                                : "");
}

static oscar_status check_common(void *ctx, const gpu_plan *p, int layer, const oscar_cache *c, const oscar_batch *b,
                                 const void *ws, size_t ws_bytes, const char *fn, oscar_errbuf *err) {
    const char *nm = V(ctx)->name;
    if (!p) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: plan is NULL", nm, fn);
    if (layer < 0 || layer >= p->num_layers)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: layer %d outside [0, %d)", nm, fn, layer,
                                p->num_layers);
    if (b->num_seqs < 1)
        return oscar_errbuf_set(err, OSCAR_ERR_EMPTY, "%s %s: num_seqs is %d; pass at least one sequence", nm, fn,
                                b->num_seqs);
    if (b->num_seqs > 65535)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: num_seqs %d above 65535; split the batch",
                                nm, fn, b->num_seqs);
    if (!b->seq_lens || !b->block_table || (p->quantized && p->S0 + p->W > 0 && (!b->window_slots || !c->windows)))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s %s: seq_lens, block_table%s must not be NULL", nm, fn,
                                p->quantized ? ", window_slots and cache.windows" : "");
    if (!c->pages && c->num_pages > 0)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: cache.pages is NULL", nm, fn);
    if (b->block_table_stride < 0 || c->num_pages < 0 || c->num_window_slots < 0)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: negative stride or pool size", nm, fn);
    if (!ws || ws_bytes < OSCAR_WORKSPACE_HEADER)
        return oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE,
                                "%s %s: workspace missing or smaller than %u bytes; size it with "
                                "oscar_plan_workspace_bytes",
                                nm, fn, OSCAR_WORKSPACE_HEADER);
    return OSCAR_OK;
}

static int batch_max_len(const gpu_plan *p, const oscar_batch *b) {
    int max_len = p->l.max_seq_len;
    if (b->max_seq_len > 0 && b->max_seq_len < max_len) max_len = b->max_seq_len;
    return max_len;
}
/* Aliasing on the plugins of device pointers (CUDA, HIP; OpenCL checks its cl_mem objects itself): a
 * buffer the call writes that shares bytes with another of its buffers is refused before anything runs,
 * as on the CPU backend; otherwise the kernels read what the call overwrites (an out row over q or a
 * pool: a wrong result without a word). own: the call's own buffers, the first nw_own written (out, lse),
 * then read ones (q, cu_q; k, v, cu_new); the workspace is written, the pools too by an append. The
 * block table's span is its rows up to the last row's first entry: seq_lens live on the device, and a
 * bound from max_seq_len would reach past a table sized to the sequences into a neighbouring buffer
 * of a caching allocator (a valid call refused). */
static oscar_status check_aliasing(void *ctx, const gpu_plan *p, const char *fn, int layer, const oscar_cache *c,
                                   const oscar_batch *b, const void *ws, size_t ws_bytes, int append,
                                   const oscar_span *own, int nw_own, int n_own, oscar_errbuf *err) {
    if (!V(ctx)->device_pointers) return OSCAR_OK;
    oscar_span s[16];
    int n = 0, npools = 0;
    for (int i = 0; i < nw_own; i++) s[n++] = own[i];
    s[n++] = oscar_span_of(ws, ws_bytes, "workspace");
    int nw = n;
    size_t bt = 0;
    if (b->num_seqs > 0) {
        const size_t r = oscar_sat_mul((size_t)b->num_seqs - 1, (size_t)b->block_table_stride);
        bt = r == SIZE_MAX ? r : r + 1;
    }
    n += oscar_batch_spans(c, b, p->page_bytes[layer], p->slot_bytes, p->quantized && p->S0 + p->W > 0, bt, s + n,
                           &npools);
    if (append) nw += npools; /* the pools follow the workspace */
    for (int i = nw_own; i < n_own; i++) s[n++] = own[i];
    char who[64];
    snprintf(who, sizeof who, "%s %s", V(ctx)->name, fn);
    return oscar_refuse_overlap(s, nw, n, who, err);
}
/* check_aliasing of a decode or extend call: out and lse written, q and cu_q (NULL for decode) read. */
static oscar_status check_attn_aliasing(void *ctx, const gpu_plan *p, const char *fn,
                                        const oscar_backend_extend_args *a, oscar_errbuf *err) {
    const int64_t row = (int64_t)p->l.num_q_heads * p->l.head_dim, rows = a->total_q;
    const size_t es = oscar_dtype_size(p->l.kv_dtype);
    const oscar_span own[] = {
        oscar_span_of(a->out, oscar_rows_span(rows, a->out_stride, row, es), "out"),
        oscar_span_of(a->lse, oscar_sat_mul(rows > 0 ? (size_t)rows : 0, (size_t)p->l.num_q_heads * 4), "lse"),
        oscar_span_of(a->q, oscar_rows_span(rows, a->q_stride, row, es), "q"),
        oscar_span_of(a->cu_q, oscar_sat_mul((size_t)a->batch.num_seqs + 1, 4), "cu_q")};
    return check_aliasing(ctx, p, fn, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes, 0, own, 2, 4,
                          err);
}
oscar_status gpu_append(void *ctx, void *bplan, const oscar_backend_append_args *a, oscar_errbuf *err) {
    const gpu_plan *p = bplan;
    const char *nm = V(ctx)->name;
    oscar_status st = check_common(ctx, p, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes,
                                   "oscar_append", err);
    if (st) return st;
    if (!a->cu_new) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s oscar_append: cu_new is NULL", nm);
    if (a->total_new < 0)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s oscar_append: total_new %d is negative", nm,
                                a->total_new);
    if (a->total_new == 0) return OSCAR_OK;
    int H = p->l.num_kv_heads, D = p->l.head_dim;
    if (!a->k || !a->v) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s oscar_append: k or v is NULL", nm);
    if (a->kv_stride < (int64_t)H * D)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s oscar_append: kv_stride %lld smaller than num_kv_heads * head_dim = %d", nm,
                                (long long)a->kv_stride, H * D);
    const oscar_batch *b = &a->batch;
    {
        const size_t kv_bytes =
            oscar_rows_span(a->total_new, a->kv_stride, (int64_t)H * D, oscar_dtype_size(p->l.kv_dtype));
        const oscar_span own[] = {oscar_span_of(a->cu_new, oscar_sat_mul((size_t)b->num_seqs + 1, 4), "cu_new"),
                                  oscar_span_of(a->k, kv_bytes, "k"), oscar_span_of(a->v, kv_bytes, "v")};
        if ((st = check_aliasing(ctx, p, "oscar_append", a->layer, &a->cache, b, a->workspace, a->workspace_bytes, 1,
                                 own, 0, 3, err)))
            return st;
    }
    int nseq = b->num_seqs, num_rot = p->num_rot, identity = p->identity, lm = p->lm, lp = p->lp, S0 = p->S0,
        W = p->W, max_len = p->l.max_seq_len, bt_stride = b->block_table_stride, num_pages = a->cache.num_pages,
        num_slots = a->cache.num_window_slots;
    if (b->max_seq_len > 0 && b->max_seq_len < max_len) max_len = b->max_seq_len;
    void *ck = p->clip_k, *cv = p->clip_v;
    int clip_off = a->layer * H; /* the layer's row of the [layers][kv heads] clips */
    int64_t kv_stride = a->kv_stride, rot_off = (int64_t)a->layer * num_rot * D * D;
    int64_t page_bytes = (int64_t)p->page_bytes[a->layer], slot_bytes = (int64_t)p->slot_bytes, kc = (int64_t)p->kc,
            vc = (int64_t)p->vc, km = (int64_t)p->km, vm = (int64_t)p->vm;
    void *pages = a->cache.pages, *windows = a->cache.windows, *ws = a->workspace;
    const void *bt = b->block_table, *lens = b->seq_lens, *slots = b->window_slots, *cu = a->cu_new, *k = a->k,
               *v = a->v;
    void *rk = p->rot_k, *rv = p->rot_v, *fk = p->fb_k, *fv = p->fb_v;
    int fb_on = fk != NULL;
    int64_t ctas = (int64_t)a->total_new * 2 * H;
    /* 3-bit head-tensors: the plane table's row of this layer (absent: a buffer never read behind
     * wide 0); a layer of 2-bit head-tensors only passes wide 0 */
    int wide = wide_layer(p, a->layer), plane_off = a->layer * H * 2;
    int64_t hi_off = p->hi_off;
    const void *planes = p->wide ? p->planes : p->clip_k;
    oscar_append1_params ap = {
        .k = k, .v = v, .pages = pages, .windows = windows, .bt = bt, .lens = lens, .slots = slots,
        .cu_new = cu, .ws = ws, .rot_k = rk, .rot_v = rv, .fb_k = fk, .fb_v = fv, .kv_stride = kv_stride,
        .rot_off = rot_off, .page_bytes = page_bytes, .slot_bytes = slot_bytes, .kc_off = kc, .vc_off = vc,
        .km_off = km, .vm_off = vm, .total_new = a->total_new, .nseq = nseq, .num_rot = num_rot,
        .identity = identity, .lm = lm, .clip_k = ck, .clip_v = cv, .clip_off = clip_off,
        .num_pages = num_pages, .num_slots = num_slots, .bt_stride = bt_stride, .H = H, .lp = lp, .S0 = S0, .W = W, .max_len = max_len,
        .planes = planes, .plane_off = plane_off, .wide = wide, .hi_off = hi_off};
    gpu_arg aa[] = {{&ap, sizeof ap}};
    /* Warp write path (CUDA, quantized): two warps per (token, row kind, head), every
     * row's quantization inside one warp. Same slot rule as the one-launch path (with
     * W = 0 nothing is demoted, so any count). The cp.async-ring instance while the grid
     * is small (a row's latency decides), the plain-load one when it fills the GPU
     * (occupancy decides; measured, perf/RESULTS-attention.md). */
    int64_t cus = V(ctx)->compute_units(ctx);
    /* Tile write path (CUDA, quantized): a CTA per tile of new tokens and (row kind, head),
     * the rotation and feedback weights read once per tile; for grids past tile_ctas
     * warp-path CTAs per compute unit, where the per-row reads of R and F decide; not at
     * head_dim 64 nor with nearest rounding at 128, where a CTA's serial work is longer
     * than the warp path's whole grid (measured, perf/RESULTS-attention.md). Same slot
     * rule as below. */
    int tile_wins = (D >= 128 && (fk || D > 128)) || p->tile_ctas == 0; /* 0: forced (tests, A/B) */
    /* with feedback where the shared-F warp instance runs (below), the tile path from a larger grid */
    const int wk_on = fk && p->k.append_wk && p->wk_pairs != 0;
    const int tile_min = p->tile_ctas >= 0 ? p->tile_ctas : wk_on ? OSCAR_APPEND_TILE_WK_CTAS : OSCAR_APPEND_TILE_CTAS;
    /* The tile and warp write paths do not store 1-bit planes: a layer with a 3-bit head-tensor takes
     * the block-wide kernels. */
    if (p->quantized && !wide && p->k.append_t && tile_wins && (W == 0 || a->total_new <= W) &&
        ctas > (int64_t)tile_min * cus) {
        unsigned tiles = (unsigned)((a->total_new + p->k.tile_tokens - 1) / p->k.tile_tokens);
        return V(ctx)->launch_smem(ctx, p->k.append_t, tiles, (unsigned)(2 * H), 1, 128, p->k.tile_smem, aa, 1,
                                   a->stream, err);
    }
    int small = ctas <= (int64_t)p->ring_ctas * cus;
    /* With feedback weights, all of F in shared memory while the grid is one wave of that
     * instance (at d 128 its 81 KB hold 2 CTAs per SM; in a second wave the 17 KB ring instance
     * at 4 per SM was faster: perf/RESULTS-attention.md, seventeenth session) */
    int wf_cap = p->wf_ctas >= 0 ? p->wf_ctas : p->k.wf_resident;
    int full = fk && p->k.append_wf && ctas <= (int64_t)wf_cap * cus;
    /* Measured exceptions (perf/RESULTS-attention.md), where the block-wide kernels win:
     * head_dim 256 in a small grid (one warp's rotation is 2048 multiply-adds per lane),
     * and feedback at head_dim 64 (blocks of 2 values: the per-block cost dominates). */
    int blockwise = (small && D > 128 && p->k.append1) || (fk && D < 128);
    /* Past one wave of that instance, K tokens of one (row kind, head) per CTA share one copy of F
     * and the L1 lines of R: one token per CTA streamed both from L2 for every row (64 KB each at
     * d 128), which bounded batch >= 32 (twenty-fourth session). $OSCAR_APPEND_WK (A/B, tests) fixes
     * K, with nearest rounding too. */
    int wk = p->wk_pairs >= 0 ? (p->wk_pairs > 8 ? 8 : p->wk_pairs) : fk && !full ? wk_tokens(p, 1, a->total_new, H, cus) : 0;
    if (p->quantized && !wide && p->k.append_wk && wk > 0 && !blockwise && (W == 0 || a->total_new <= W))
        return V(ctx)->launch_smem(ctx, wk > 4 ? p->k.append_wk8 : p->k.append_wk,
                                   (unsigned)((a->total_new + wk - 1) / wk), (unsigned)(2 * H), 1, (unsigned)(64 * wk),
                                   fk ? p->k.wf_smem : 0, aa, 1, a->stream, err);
    if (p->quantized && !wide && p->k.append_w && (W == 0 || a->total_new <= W) && !blockwise)
        return V(ctx)->launch_smem(ctx, full ? p->k.append_wf : small ? p->k.append_wr : p->k.append_w,
                                   (unsigned)a->total_new, (unsigned)(2 * H), 1, 64, full ? p->k.wf_smem : 0, aa, 1,
                                   a->stream, err);
    /* One launch (CUDA/HIP): each CTA demotes the row its token's window slot
     * held, then stores the token. Only when no sequence can gain more than
     * W tokens (else two tokens of the launch could share a slot). With
     * feedback weights and more CTAs than ~4 per compute unit the two
     * launches are faster (measured, perf/RESULTS-attention.md): the long
     * demote chains then run in their own launch. */
    if (p->k.append1 && (!p->quantized || a->total_new <= W) &&
        !(fk && ctas > 4 * (int64_t)V(ctx)->compute_units(ctx))) {
        return V(ctx)->launch(ctx, p->k.append1, (unsigned)a->total_new, (unsigned)(2 * H), 1, (unsigned)D, aa, 1,
                              a->stream, err);
    }
    if (p->quantized && W > 0) {
        gpu_arg da[] = {{&pages, sizeof pages}, {&windows, sizeof windows}, {&bt, sizeof bt}, {&lens, sizeof lens},
                        {&slots, sizeof slots}, {&cu, sizeof cu}, {&ws, sizeof ws}, {&fk, sizeof fk},
                        {&fv, sizeof fv}, {&rot_off, 8}, {&num_rot, 4}, {&fb_on, 4}, {&ck, sizeof ck}, {&cv, sizeof cv},
                        {&clip_off, 4}, {&lm, 4},
                        {&num_pages, 4}, {&num_slots, 4}, {&bt_stride, 4}, {&H, 4}, {&lp, 4}, {&S0, 4}, {&W, 4},
                        {&max_len, 4}, {&page_bytes, 8}, {&slot_bytes, 8}, {&kc, 8}, {&vc, 8}, {&km, 8}, {&vm, 8},
                        {&planes, sizeof planes}, {&plane_off, 4}, {&wide, 4}, {&hi_off, 8}};
        GPU_ARGS_FIT(da);
        /* Blocks per (row kind, head, sequence); each walks rows x, x + gx, ...
         * A sequence demotes at most min(new tokens, W) rows, so size by the
         * mean new tokens per sequence: a decode step (one token each) gets
         * one block per sequence instead of total_new mostly idle ones. */
        int64_t per = ((int64_t)a->total_new + nseq - 1) / nseq;
        unsigned gx = (unsigned)(per < W ? per : W);
        if (gx < 1) gx = 1;
        if (gx > 1024) gx = 1024;
        st = V(ctx)->launch(ctx, p->k.demote, gx, (unsigned)(2 * H), (unsigned)nseq, (unsigned)D, da,
                            (int)(sizeof da / sizeof da[0]), a->stream, err);
        if (st) return st;
    }
    gpu_arg sa[] = {{&k, sizeof k}, {&v, sizeof v}, {&kv_stride, 8}, {&pages, sizeof pages},
                    {&windows, sizeof windows}, {&bt, sizeof bt}, {&lens, sizeof lens}, {&slots, sizeof slots},
                    {&cu, sizeof cu}, {&nseq, 4}, {&ws, sizeof ws}, {&rk, sizeof rk}, {&rv, sizeof rv},
                    {&rot_off, 8}, {&num_rot, 4}, {&identity, 4}, {&fk, sizeof fk}, {&fv, sizeof fv},
                    {&fb_on, 4}, {&ck, sizeof ck}, {&cv, sizeof cv}, {&clip_off, 4}, {&lm, 4}, {&num_pages, 4},
                    {&num_slots, 4}, {&bt_stride, 4}, {&H, 4}, {&lp, 4}, {&S0, 4}, {&W, 4}, {&max_len, 4},
                    {&page_bytes, 8}, {&slot_bytes, 8}, {&kc, 8}, {&vc, 8}, {&km, 8}, {&vm, 8},
                    {&planes, sizeof planes}, {&plane_off, 4}, {&wide, 4}, {&hi_off, 8}};
    GPU_ARGS_FIT(sa);
    return V(ctx)->launch(ctx, p->k.store, (unsigned)a->total_new, (unsigned)(2 * H), 1, (unsigned)D, sa,
                          (int)(sizeof sa / sizeof sa[0]), a->stream, err);
}

/* q rotation, one tensor-core launch over every split, one merge launch. ext 0:
 * decode (one query row per sequence, a->cu_q NULL); ext 1: extend (the oscar_extend_tc
 * kernels: the query rows of cu_q as MMA columns, causal over the 16-bit rows and, for chunks
 * longer than W, over the 2-bit rows). */
static oscar_status tc_launch(void *ctx, const gpu_plan *p, const oscar_backend_extend_args *a, int ext,
                              int max_len, int max_splits, size_t qtb, float *lse, oscar_errbuf *err) {
    const oscar_batch *b = &a->batch;
    int H = p->l.num_kv_heads, Hq = p->l.num_q_heads, D = p->l.head_dim, nseq = b->num_seqs;
    int rows = ext ? a->total_q : nseq, max_q = ext ? a->max_q_len : 1, cols = max_q * p->gqa;
    const char *fn = ext ? "oscar_extend" : "oscar_decode";
    gpu_tc_splits t;
    const int w3 = w3_layer(p, a->layer);
    tc_kernel k = tc_kernel_for(p, ext, cols, nseq, max_len, w3);
    tc_choose(ctx, p, p->page_bytes[a->layer], &k, nseq, cols, max_len, max_splits, w3 ? p->layer_wide[a->layer] : 0,
              &t);
    /* Long chunks: the long-chunk kernel alone (its own split of the 2-bit history; the 16-bit rows
     * where there are any on one more split, or with the 2-bit rows where one split fills the
     * grid), then the merge */
    int fchunk = 0;
    const int w16 = p->S0 + p->W > 0;
    const int fns = fa_choose(ctx, p, ext, wide_layer(p, a->layer), nseq, 0, max_q, max_len, max_splits - w16, &fchunk);
    if (fns > 0) {
        t.ns2 = fns;
        t.chunk2 = fchunk;
        t.nsplit = t.pstride = fns + (w16 && fns > 1);
        t.ns2x = t.chunk2w = 0;
    }
    if (t.pstride > max_splits)
        return oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE,
                                "%s %s: workspace holds %d splits, this batch needs %d; size it with "
                                "oscar_plan_workspace_bytes for at least this batch and length",
                                V(ctx)->name, fn, max_splits, t.pstride);
    int64_t qt_off = OSCAR_WORKSPACE_HEADER, part_off = OSCAR_WORKSPACE_HEADER + (int64_t)qtb;
    int64_t q_stride = a->q_stride, rot_off = (int64_t)a->layer * p->num_rot * D * D;
    int num_rot = p->num_rot, identity = p->identity;
    float scale = a->sm_scale * LOG2E;
    const void *q = a->q, *rk = p->rot_k;
    void *ws = a->workspace;
    gpu_arg ra[] = {{&q, sizeof q}, {&q_stride, 8}, {&ws, sizeof ws}, {&qt_off, 8}, {&rk, sizeof rk}, {&rot_off, 8},
                    {&num_rot, 4}, {&identity, 4}, {&scale, 4}, {&Hq, 4}, {&H, 4}};
    GPU_ARGS_FIT(ra);
    /* Rotation and merge: 4 D threads (four groups sharing a row's dot products or
     * splits) while the grid is smaller than two blocks per compute unit, D threads
     * once Hq x rows blocks fill the device (the groups then cost more than the
     * latency they hide). The generic family (OpenCL, HIP) keeps 4 D. */
    int cu = V(ctx)->compute_units(ctx);
    unsigned grp = (int64_t)Hq * rows >= 2 * (int64_t)(cu > 0 ? cu : 1) ? 1u : 4u;
    /* The BF16 method (no rotation): its attention kernel reads and scales q itself */
    const int qdirect = p->l.method == OSCAR_METHOD_BF16; /* its tc variants read P.q (always set here) */
    /* the long-chunk path's many rows: OSCAR_FA_ROWS rows of a query head per block (rotate_rows,
     * merge_rows) */
    const int many = fns > 0 && p->k.rotate_rows && p->k.merge_rows;
    oscar_status st = OSCAR_OK;
    if (many) {
        gpu_arg rr[] = {{&q, sizeof q}, {&q_stride, 8}, {&ws, sizeof ws}, {&qt_off, 8}, {&rk, sizeof rk},
                        {&rot_off, 8}, {&num_rot, 4}, {&identity, 4}, {&scale, 4}, {&Hq, 4}, {&H, 4}, {&rows, 4}};
        GPU_ARGS_FIT(rr);
        st = V(ctx)->launch(ctx, p->k.rotate_rows, (unsigned)Hq, (unsigned)((rows + OSCAR_FA_ROWS - 1) / OSCAR_FA_ROWS),
                            1, (unsigned)D, rr, (int)(sizeof rr / sizeof rr[0]), a->stream, err);
    } else if (!qdirect) {
        st = V(ctx)->launch(ctx, p->k.rotate_q, (unsigned)Hq, (unsigned)rows, 1, grp * (unsigned)D, ra,
                            (int)(sizeof ra / sizeof ra[0]), a->stream, err);
    }
    if (st) return st;
    oscar_tc_decode_params dp = {
        .pages = a->cache.pages, .windows = a->cache.windows, .bt = b->block_table, .lens = b->seq_lens,
        .slots = b->window_slots, .ws = ws, .qt_off = qt_off, .part_off = part_off,
        .page_bytes = (int64_t)p->page_bytes[a->layer], .slot_bytes = (int64_t)p->slot_bytes, .kc_off = (int64_t)p->kc,
        .vc_off = (int64_t)p->vc, .km_off = (int64_t)p->km, .vm_off = (int64_t)p->vm,
        .num_pages = a->cache.num_pages, .num_slots = a->cache.num_window_slots,
        .bt_stride = b->block_table_stride, .H = H, .Hq = Hq, .gq = p->gqa, .hchunks = t.hchunks, .lp = p->lp,
        .S0 = p->S0, .W = p->W, .max_len = max_len, .ns2 = t.ns2, .chunk2 = t.chunk2, .chunk16 = t.chunk16,
        .nsplit = t.nsplit, .cu_q = ext ? a->cu_q : NULL, .max_q = max_q, .total_q = rows,
        .nseq = nseq, .q = qdirect ? (const uint16_t *)a->q : NULL, .q_stride = q_stride, .qscale = scale,
        .planes = w3 ? (const int32_t *)p->planes : NULL, .plane_off = a->layer * H * 2, .hi_off = p->hi_off,
        .lp_decode = p->k.decode_lp, .chunk2w = t.chunk2w, .ns2x = t.ns2x, .pstride = t.pstride};
    /* W3: the rows past the heads run the further splits of the heads with a plane (gpu_tc_choose) */
    const unsigned rows_y = (unsigned)(H * t.hchunks + (t.ns2x > 0 ? p->layer_wide[a->layer] * t.hchunks : 0));
    gpu_arg da[] = {{&dp, sizeof dp}};
    if (fns > 0) {
        st = V(ctx)->launch_dep(ctx, p->k.extend_fa, (unsigned)t.nsplit, (unsigned)(H * ((cols + 63) / 64)),
                                (unsigned)nseq, 128, 0, da, 1, a->stream, err);
    } else {
        /* attention and merge start under the previous kernel's tail (they wait for its results);
         * without the rotation kernel the attention launches plainly: its prologue reads the
         * lengths before it waits, so what came before (the caller's kernels) must be done */
        st = (qdirect ? V(ctx)->launch_smem : V(ctx)->launch_dep)(ctx, k.fn, (unsigned)t.nsplit, rows_y,
                                                                   (unsigned)nseq, 128, k.smem, da, 1, a->stream, err);
    }
    if (st) return st;
    oscar_tc_merge_params mp = {.ws = ws, .part_off = part_off, .lens = b->seq_lens, .rot_t = p->rot_vt,
                                .rot_off = rot_off, .out = a->out, .out_stride = a->out_stride, .lse = lse,
                                .nsplit = t.nsplit, .max_len = max_len, .num_rot = num_rot, .identity = identity,
                                .rotated_output = a->rotated_output ? 1 : 0, .Hq = Hq, .H = H,
                                .cu_q = ext ? a->cu_q : NULL, .ext = ext, .nseq = nseq, .total_q = rows,
                                .max_q = max_q, .planes = w3 ? (const int32_t *)p->planes : NULL,
                                .plane_off = a->layer * H * 2, .ns2x = t.ns2x, .pstride = t.pstride};
    gpu_arg ma[] = {{&mp, sizeof mp}};
    if (many)
        return V(ctx)->launch_dep(ctx, p->k.merge_rows, (unsigned)Hq,
                                  (unsigned)((rows + OSCAR_FA_ROWS - 1) / OSCAR_FA_ROWS), 1, (unsigned)D, 0, ma, 1,
                                  a->stream, err);
    return V(ctx)->launch_dep(ctx, p->k.merge, (unsigned)Hq, (unsigned)rows, 1, grp * (unsigned)D, 0, ma, 1, a->stream,
                              err);
}

/* Checks shared by decode and extend: q/out present, strides. */
static oscar_status check_q_out(void *ctx, const gpu_plan *p, const void *q, int64_t q_stride, const void *out,
                                int64_t out_stride, const char *fn, oscar_errbuf *err) {
    const char *nm = V(ctx)->name;
    int Hq = p->l.num_q_heads, D = p->l.head_dim;
    if (!q || !out) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: q or out is NULL", nm, fn);
    if (q_stride < (int64_t)Hq * D || out_stride < (int64_t)Hq * D)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s %s: q_stride %lld / out_stride %lld smaller than num_q_heads * head_dim = %d", nm,
                                fn, (long long)q_stride, (long long)out_stride, Hq * D);
    return OSCAR_OK;
}
/* Splits the workspace holds for `rows` query rows (q~ first, then partials of
 * one split each); 0 with the error set when not even one fits. */
static int workspace_splits(void *ctx, const gpu_plan *p, size_t ws_bytes, int rows, const char *fn, size_t *qtb,
                            oscar_errbuf *err) {
    *qtb = qt_bytes(p, rows);
    size_t avail = ws_bytes > OSCAR_WORKSPACE_HEADER + *qtb ? ws_bytes - OSCAR_WORKSPACE_HEADER - *qtb : 0;
    size_t one = part_bytes(p, rows, 1);
    if (avail < one) {
        oscar_errbuf_set(err, OSCAR_ERR_WORKSPACE,
                         "%s %s: workspace of %zu bytes too small for %d query rows (need at least %zu); size it "
                         "with oscar_plan_workspace_bytes",
                         V(ctx)->name, fn, ws_bytes, rows, OSCAR_WORKSPACE_HEADER + *qtb + one);
        return 0;
    }
    return (int)(avail / one > (size_t)(1 << 20) ? (1 << 20) : avail / one);
}

/* Decode; lse (tensor-core family only, NULL otherwise): natural-log LSE per (sequence, q head). */
/* The generic (fp32) family: q rotation, split-KV attention, merge. ext 0:
 * decode (one query per sequence, decode/merge kernels, a->cu_q NULL and no
 * LSE); ext 1: extend (per query token, extend/merge_ext kernels, LSE).
 * Both kernels take the same leading arguments; extend's follow them. */
static oscar_status generic_launch(void *ctx, const gpu_plan *p, const oscar_backend_extend_args *a, int ext,
                                   size_t qtb, int max_splits, oscar_errbuf *err) {
    const oscar_batch *b = &a->batch;
    int H = p->l.num_kv_heads, Hq = p->l.num_q_heads, D = p->l.head_dim, nseq = b->num_seqs;
    int rows = ext ? a->total_q : nseq, max_len = batch_max_len(p, b);
    int cap = ext ? p->k.ext_cap : p->k.cap;
    if (cap < 1) cap = p->gqa;
    int hch = (p->gqa + cap - 1) / cap, threads = ext ? p->k.ext_threads : p->k.threads;
    int nsplit, chunk;
    gpu_choose_splits(rows, H * hch, max_len, threads, p->k.min_chunk, target_blocks(ctx, p),
                      ext ? 0 : resident_blocks(ctx, p), max_splits, &nsplit, &chunk);
    if (nsplit > max_splits) {
        /* chunk rounding can need one more split than fits: widen chunks. */
        chunk = (int)(((int64_t)max_len + max_splits - 1) / max_splits);
        chunk = (chunk + threads - 1) / threads * threads;
        nsplit = (max_len + chunk - 1) / chunk;
    }
    int64_t qt_off = OSCAR_WORKSPACE_HEADER, part_off = OSCAR_WORKSPACE_HEADER + (int64_t)qtb;
    int64_t q_stride = a->q_stride, out_stride = a->out_stride, rot_off = (int64_t)a->layer * p->num_rot * D * D;
    int num_rot = p->num_rot, identity = p->identity, rotated = a->rotated_output ? 1 : 0, lp = p->lp, S0 = p->S0,
        W = p->W, bt_stride = b->block_table_stride, num_pages = a->cache.num_pages,
        num_slots = a->cache.num_window_slots, has_cu = a->cu_q != NULL, total_q = a->total_q,
        max_q = a->max_q_len, has_lse = a->lse != NULL;
    float scale = a->sm_scale * LOG2E;
    int64_t page_bytes = (int64_t)p->page_bytes[a->layer], slot_bytes = (int64_t)p->slot_bytes, kc = (int64_t)p->kc,
            vc = (int64_t)p->vc, km = (int64_t)p->km, vm = (int64_t)p->vm;
    const void *q = a->q, *pages = a->cache.pages, *windows = a->cache.windows, *bt = b->block_table,
               *lens = b->seq_lens, *slots = b->window_slots, *rk = p->rot_k, *rvt = p->rot_vt;
    /* Absent optional buffers are passed as buffers the kernels never touch
     * behind their flags (OpenCL wants a valid argument). */
    const void *cu = has_cu ? (const void *)a->cu_q : lens;
    void *ws = a->workspace, *out = a->out, *lse = has_lse ? (void *)a->lse : a->workspace;
    int wide = wide_layer(p, a->layer), plane_off = a->layer * H * 2;
    int64_t hi_off = p->hi_off;
    const void *planes = p->wide ? p->planes : p->clip_k; /* absent: never read behind wide 0 */
    gpu_arg ra[] = {{&q, sizeof q}, {&q_stride, 8}, {&ws, sizeof ws}, {&qt_off, 8}, {&rk, sizeof rk}, {&rot_off, 8},
                    {&num_rot, 4}, {&identity, 4}, {&scale, 4}, {&Hq, 4}, {&H, 4}};
    GPU_ARGS_FIT(ra);
    oscar_status st = V(ctx)->launch(ctx, p->k.rotate_q, (unsigned)Hq, (unsigned)rows, 1,
                                     (unsigned)((p->k.rot_single ? 1 : 4) * D), ra,
                                     (int)(sizeof ra / sizeof ra[0]), a->stream, err);
    if (st) return st;
    gpu_arg dargs[] = {{&pages, sizeof pages}, {&windows, sizeof windows}, {&bt, sizeof bt}, {&lens, sizeof lens},
                       {&slots, sizeof slots}, {&ws, sizeof ws}, {&qt_off, 8}, {&part_off, 8}, {&num_pages, 4},
                       {&num_slots, 4}, {&bt_stride, 4}, {&H, 4}, {&Hq, 4}, {&lp, 4}, {&S0, 4}, {&W, 4},
                       {&max_len, 4}, {&chunk, 4}, {&nsplit, 4}, {&page_bytes, 8}, {&slot_bytes, 8}, {&kc, 8},
                       {&vc, 8}, {&km, 8}, {&vm, 8}, {&planes, sizeof planes}, {&plane_off, 4}, {&wide, 4},
                       {&hi_off, 8},
                       /* extend only */
                       {&cu, sizeof cu}, {&has_cu, 4}, {&nseq, 4}, {&total_q, 4}, {&max_q, 4}};
    GPU_ARGS_FIT(dargs);
    int nd = (int)(sizeof dargs / sizeof dargs[0]) - (ext ? 0 : 5);
    st = V(ctx)->launch(ctx, ext ? p->k.extend : p->k.decode, (unsigned)nsplit, (unsigned)(H * hch), (unsigned)rows,
                        (unsigned)threads, dargs, nd, a->stream, err);
    if (st) return st;
    gpu_arg ma[] = {{&ws, sizeof ws}, {&part_off, 8}, {&lens, sizeof lens}, {&chunk, 4}, {&nsplit, 4}, {&max_len, 4},
                    {&rvt, sizeof rvt}, {&rot_off, 8}, {&num_rot, 4}, {&identity, 4}, {&rotated, 4},
                    {&out, sizeof out}, {&out_stride, 8}, {&Hq, 4}, {&H, 4},
                    /* extend only */
                    {&cu, sizeof cu}, {&has_cu, 4}, {&nseq, 4}, {&total_q, 4}, {&max_q, 4}, {&lse, sizeof lse},
                    {&has_lse, 4}};
    GPU_ARGS_FIT(ma);
    int nm = (int)(sizeof ma / sizeof ma[0]) - (ext ? 0 : 7);
    return V(ctx)->launch(ctx, ext ? p->k.merge_ext : p->k.merge, (unsigned)Hq, (unsigned)rows, 1, (unsigned)D, ma,
                          nm, a->stream, err);
}

/* Decode; lse (tensor-core family only, NULL otherwise): natural-log LSE per (sequence, q head). */
static oscar_status decode_impl(void *ctx, const gpu_plan *p, const oscar_backend_decode_args *a, float *lse,
                                oscar_errbuf *err) {
    oscar_status st = check_common(ctx, p, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes,
                                   "oscar_decode", err);
    if (!st) st = check_q_out(ctx, p, a->q, a->q_stride, a->out, a->out_stride, "oscar_decode", err);
    if (st) return st;
    oscar_backend_extend_args x = {.layer = a->layer, .cache = a->cache, .batch = a->batch, .total_q = a->batch.num_seqs,
                                   .max_q_len = 1, .q = a->q, .q_stride = a->q_stride, .out = a->out,
                                   .out_stride = a->out_stride, .sm_scale = a->sm_scale,
                                   .rotated_output = a->rotated_output, .workspace = a->workspace,
                                   .workspace_bytes = a->workspace_bytes, .stream = a->stream, .lse = lse};
    if ((st = check_attn_aliasing(ctx, p, lse ? "oscar_extend" : "oscar_decode", &x, err))) return st;
    size_t qtb;
    int max_splits = workspace_splits(ctx, p, a->workspace_bytes, a->batch.num_seqs, "oscar_decode", &qtb, err);
    if (!max_splits) return OSCAR_ERR_WORKSPACE;
    if (p->k.tc && (!wide_layer(p, a->layer) || p->k.decode_w3))
        return tc_launch(ctx, p, &x, 0, batch_max_len(p, &a->batch), max_splits, qtb, lse, err);
    /* a tensor-core plan's layer with a 3-bit head-tensor and no W3 kernels (OSCAR_DECODE_W3=0): the
     * generic extend kernels, one query row per sequence (cu_q NULL), LSE when asked */
    return generic_launch(ctx, p, &x, p->k.tc, qtb, max_splits, err);
}

oscar_status gpu_decode(void *ctx, void *bplan, const oscar_backend_decode_args *a, oscar_errbuf *err) {
    return decode_impl(ctx, bplan, a, NULL, err);
}

/* Extend: q rotation per query token, the generic extend kernel (one
 * work-group per split, KV head chunk and query token, causal), the extend
 * merge (LSE). Decode with an LSE on the tensor-core family takes its decode. */
oscar_status gpu_extend(void *ctx, void *bplan, const oscar_backend_extend_args *a, oscar_errbuf *err) {
    const gpu_plan *p = bplan;
    const char *nm = V(ctx)->name, *fn = "oscar_extend";
    if (!p) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s %s: plan is NULL", nm, fn);
    if (!a->cu_q && a->total_q != a->batch.num_seqs)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s %s: cu_q is NULL (one query per sequence) but total_q %d != num_seqs %d", nm, fn,
                                a->total_q, a->batch.num_seqs);
    if (!a->cu_q && p->k.tc) {
        oscar_backend_decode_args da = {.layer = a->layer, .cache = a->cache, .batch = a->batch, .q = a->q,
                                        .q_stride = a->q_stride, .out = a->out, .out_stride = a->out_stride,
                                        .sm_scale = a->sm_scale, .rotated_output = a->rotated_output,
                                        .workspace = a->workspace, .workspace_bytes = a->workspace_bytes,
                                        .stream = a->stream};
        return decode_impl(ctx, p, &da, a->lse, err);
    }
    oscar_status st = check_common(ctx, p, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes, fn, err);
    if (!st) st = check_q_out(ctx, p, a->q, a->q_stride, a->out, a->out_stride, fn, err);
    if (st) return st;
    if ((st = check_attn_aliasing(ctx, p, fn, a, err))) return st;
    if (!p->k.extend || !p->k.merge_ext)
        return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED, "%s %s: no extend kernel for %s", nm, fn, p->k.name);
    if (a->total_q < 1 || a->total_q > 65535 || a->max_q_len < 1)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s %s: total_q %d outside [1, 65535] or max_q_len %d < 1; split the batch", nm, fn,
                                a->total_q, a->max_q_len);
    size_t qtb;
    int max_splits = workspace_splits(ctx, p, a->workspace_bytes, a->total_q, fn, &qtb, err);
    if (!max_splits) return OSCAR_ERR_WORKSPACE;
    /* The tensor-core family takes the chunk's (query row, head) pairs as MMA columns
     * (while the grid's y dimension fits). */
    const int wl = wide_layer(p, a->layer);
    tc_kernel k = tc_kernel_for(p, 1, a->max_q_len * p->gqa, a->batch.num_seqs, batch_max_len(p, &a->batch),
                                w3_layer(p, a->layer));
    int64_t hch = ((int64_t)a->max_q_len * p->gqa + k.cap - 1) / (k.cap > 0 ? k.cap : 1);
    if (p->k.tc && k.fn && hch * p->l.num_kv_heads <= 65535 && (!wl || p->k.extend_w3))
        return tc_launch(ctx, p, a, 1, batch_max_len(p, &a->batch), max_splits, qtb, a->lse, err);
    return generic_launch(ctx, p, a, 1, qtb, max_splits, err);
}
