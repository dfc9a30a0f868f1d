/* Calibration core: the OSCAR targets C_K and C_V, their eigen-rotations
 * R = U.H.P, and clip ratios fitted on held-back rows (GUIDE §1, FORMAT §1).
 *
 * Normalisation (what oscar_calib_target returns), per layer, N tokens fed,
 * g = num_q_heads / num_kv_heads, query head j reads KV head h = j / g:
 *
 *   C_Q,h = 1/(N g) * sum_t sum_{j: j/g = h} q_{t,j} q_{t,j}^T
 *   C_K   = 1/Hkv * sum_h C_Q,h                (per_head: C_K,h = C_Q,h)
 *   w_{t,h} = k_{t,h}^T C_Q,h k_{t,h}          (C_Q,h final from pass 0)
 *   C_V,h = sum_t w_{t,h} v_{t,h} v_{t,h}^T / sum_t w_{t,h}
 *         (= E_t[w~ v v^T] with w~ = w / mean_t(w), mean 1 over tokens of head h)
 *   C_V   = 1/Hkv * sum_h C_V,h                (per_head: C_V,h)
 *
 * Every token counts once whatever window it came in (independent windows of
 * 2048 are just N = 65536 rows); each KV head counts equally in the means.
 *
 * Clips (docs/CALIBRATION.md, "Clip objective"): by default chosen on
 * attention probes (a few query positions per layer and KV head with their
 * window's keys and values), minimising the relative attention-output error
 * of the cache's 2-bit region; clip_objective = 1 keeps the older mean
 * e^T C~ e over held-back rows. Probes are kept under either objective (the
 * attention report needs them).
 * Sums are fp64; rows are accumulated as rank-k updates (cblas_dsyrk from
 * OpenBLAS), so memory does not grow with the number of tokens.
 */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "oscar_ref.h"
#include "oscar_internal.h"

/* Rows per rank-k update: bounds the scratch whatever n_tokens is. */
#define CHUNK_ROWS 4096
#define MAX_LAYERS 1024
#define MAX_HEADS 4096
#define MAX_HOLDOUT (1 << 20)
/* Attention probes per (layer, KV head): memory is at most
 * L * Hkv * PROBES_PER_HEAD * (2 * n + probe_queries * g) * d floats for windows of n tokens,
 * whatever the number of windows. */
#define PROBES_PER_HEAD 8
#define PROBE_MARGIN 32 /* the 2-bit region of a probe holds at least this many rows */
#define MAX_PROBE_QUERIES 64 /* query positions per text probe (options.probe_queries) */
#define PROBE_QUERIES_S0W0 16 /* probe_queries 0 (default) without windows (sink 0, recent 0) */
/* Ridge on the error-feedback metric, a share of its mean eigenvalue, for feedback_damp 0 (default):
 * a nearly singular metric stays well posed. A double, not the option's float, so the files stay
 * byte-identical to those before the option existed. 0.01 lowered s0w0 KL on the validation slices
 * but not on eval.tokens, and lost with windows (docs/eval/retrieval.md, seventh step). */
#define FB_DAMP 1e-3

enum { STATE_CREATED = -1, STATE_PASS0 = 0, STATE_PASS1 = 1, STATE_FINAL = 2 };

static const float k_clip_grid[] = {1.0f, 0.99f, 0.98f, 0.97f, 0.96f, 0.95f,
                                    0.94f, 0.92f, 0.90f, 0.88f, 0.85f, 0.80f};
#define CLIP_GRID_N ((int)(sizeof k_clip_grid / sizeof k_clip_grid[0]))

const float *oscar_calib_clip_grid(int *count) {
    if (count) *count = CLIP_GRID_N;
    return k_clip_grid;
}

typedef oscar_calib_copy_report copy_report;
typedef oscar_calib_width_report width_report;

/* One attention probe: the g queries that read KV head h at nq positions
 * tq[0] < ... <= tq[nq-1] = t of one fed window, and that window's keys and
 * values of h at 0..t. Query position tq[j] reads rows [sink, tq[j] - recent]
 * in 2 bits and the others exact (the cache layout at that position). */
typedef struct probe {
    int64_t feed; /* per-layer feed index (same in both passes) */
    int n, t;     /* feed length and last query position; t < 0: slot empty or dropped */
    int period;   /* copy probe: position t + 1 - period holds the copied token's source; 0: text probe */
    int nq;       /* query positions (1 for copy probes; options.probe_queries for text probes) */
    int tq[MAX_PROBE_QUERIES]; /* the positions, increasing; tq[nq - 1] == t */
    float *q;     /* [nq][g][d], pass 0 */
    float *k, *v; /* [t + 1][d], from pass 0 when given there, else pass 1; NULL until then */
} probe;

struct oscar_calib {
    oscar_calib_options o;
    char model_hash[65];
    int state;
    int L, hq, hkv, d, g;
    size_t dd;
    double *cq;      /* [L][hkv][d][d] pass 0: sum of q q^T (upper triangle while accumulating) */
    double *cqn;     /* [L][hkv][d][d] C_Q,h, full symmetric, set when pass 1 begins */
    double *cw;      /* [L][hkv][d][d] pass 0, key_attn_weight > 0: sum of a q q^T (upper triangle) */
    double *sv;      /* [L][hkv][d][d] pass 1: sum of w v v^T (upper triangle) */
    double *sw;      /* [L][hkv] pass 1: sum of w */
    int64_t *n0, *n1; /* [L] tokens fed in pass 0 / pass 1 */
    /* Hold-out reservoir per layer (pass 1): rows of one token and one KV head. */
    int cap;
    float *res_k, *res_v; /* [L][cap][d] */
    float *res_w;         /* [L][cap] raw weight w of the row's token and head */
    int32_t *res_h;       /* [L][cap] KV head of the row */
    int64_t *res_seen;    /* [L] rows offered */
    uint64_t *rng;        /* [L] reservoir sampling state */
    double *x, *y, *wt;   /* scratch: [CHUNK_ROWS][d], [CHUNK_ROWS][d], [CHUNK_ROWS] */
    int64_t fed[2];       /* tokens fed per pass over all layers (progress) */
    oscar_calib_layer_report *report; /* [L] after finalize */
    int slots;            /* probe slots per (layer, KV head): PROBES_PER_HEAD text + o.copy_probes copy */
    probe *probes;        /* [L][hkv][slots]: text probes in [0, PROBES_PER_HEAD), copy probes after */
    int64_t *copy_offers; /* [L][hkv] copy windows offered (oscar_calib_feed_copy) */
    uint64_t *copy_rng;   /* [L] */
    int64_t *probe_offers; /* [L][hkv] windows offered to the probe reservoir */
    uint64_t *probe_rng;  /* [L] */
    int64_t *feeds;       /* [2][L] feeds per pass and layer */
    oscar_calib_attn_report *attn; /* [L] after finalize */
    copy_report *copy;    /* [L] after finalize */
    oscar_calib_head_copy_report *head_copy; /* [L][hkv] after finalize */
    width_report *width;  /* [L][hkv][2] after finalize: code-width scores */
    double *vmetric;      /* [L][hkv][d][d] value-error metrics (oscar_calib_set_value_metric), or NULL */
    uint8_t *vmetric_set; /* [L][hkv] */
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

OSCAR_API void oscar_calib_options_default(oscar_calib_options *o, int num_layers, int num_q_heads,
                                           int num_kv_heads, int head_dim) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->num_layers = num_layers;
    o->num_q_heads = num_q_heads;
    o->num_kv_heads = num_kv_heads;
    o->head_dim = head_dim;
    o->group = oscar_group_default(head_dim) ? oscar_group_default(head_dim) : 128; /* format/oscar_format.h */
    o->per_head = 1; /* one rotation per KV head (docs/EVAL.md, how the defaults were chosen) */
    o->method = OSCAR_METHOD_OSCAR2;
    o->clip_k = 0.0f;
    o->clip_v = 0.0f;
    o->holdout_rows = 4096;
    o->sink = 64;
    o->recent = 256;
    o->clip_objective = 0;
    o->probe_queries = 0; /* auto: 16 without windows, 1 with (docs/eval/retrieval.md, fourth step) */
    o->clip_margin = 0.0f;
    o->probe_span = 0;
    o->permutation = 2; /* m-sequence: -15% KL at the fitted clips (docs/eval/permutation.md) */
    o->rounding = 1;    /* error feedback (docs/eval/feedback.md) */
    o->copy_probes = 0;
    o->copy_mass_loss = 0.002f;
    o->clip_per_head = 0; /* per-head ratios won on one calibration text only (docs/eval/retrieval.md) */
    o->key_attn_weight = 1.0f; /* attention-weighted C_K: lower KL on 2 calibration texts x 2 slices (docs/EVAL.md) */
    o->feedback_damp = 0.0f; /* FB_DAMP */
    o->copy_head_mass = 0.0f;  /* copy heads off (docs/EVAL.md, twenty-fourth session) */
    o->copy_head_clip = 0.97f; /* their key clip floor when on */
    /* Code-width budget: 0.05 bits per element where the rule applies (OSCAR2, probe objective), resolved
     * in oscar_calib_create (docs/eval/retrieval.md, fourteenth step) */
    o->wide_bits = OSCAR_CALIB_WIDE_BITS_AUTO;
}

OSCAR_API void oscar_calib_destroy(oscar_calib *c) {
    if (!c) return;
    free(c->cq);
    free(c->cqn);
    free(c->cw);
    free(c->sv);
    free(c->sw);
    free(c->n0);
    free(c->n1);
    free(c->res_k);
    free(c->res_v);
    free(c->res_w);
    free(c->res_h);
    free(c->res_seen);
    free(c->rng);
    free(c->x);
    free(c->y);
    free(c->wt);
    free(c->report);
    if (c->probes)
        for (size_t i = 0; i < (size_t)c->L * (size_t)c->hkv * (size_t)c->slots; i++) {
            free(c->probes[i].q);
            free(c->probes[i].k);
            free(c->probes[i].v);
        }
    free(c->probes);
    free(c->probe_offers);
    free(c->probe_rng);
    free(c->copy_offers);
    free(c->copy_rng);
    free(c->feeds);
    free(c->attn);
    free(c->copy);
    free(c->head_copy);
    free(c->width);
    free(c->vmetric);
    free(c->vmetric_set);
    free(c);
}

OSCAR_API oscar_status oscar_calib_create(const oscar_calib_options *o, oscar_calib **out) {
    oscar_clear_error();
    if (!o || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_create: NULL argument");
    *out = NULL;
    if (o->struct_size < sizeof *o)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_calib_options.struct_size is %u, expected %zu: fill the options with "
                               "oscar_calib_options_default",
                               o->struct_size, sizeof *o);
    if (!oscar_head_dim_supported(o->head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not supported: use " OSCAR_HEAD_DIM_RULE,
                               o->head_dim);
    if (o->num_layers <= 0 || o->num_layers > MAX_LAYERS)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "num_layers %d must be in [1, %d]", o->num_layers,
                               MAX_LAYERS);
    if (o->num_q_heads <= 0 || o->num_kv_heads <= 0 || o->num_q_heads > MAX_HEADS || o->num_kv_heads > MAX_HEADS ||
        o->num_q_heads % o->num_kv_heads != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "num_q_heads %d / num_kv_heads %d: both must be positive and KV heads must divide "
                               "query heads",
                               o->num_q_heads, o->num_kv_heads);
    if (!oscar_group_supported(o->group, o->head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_GROUP,
                               "group %d is not supported for head_dim %d: use " OSCAR_GROUP_RULE " (default %d)",
                               o->group, o->head_dim, oscar_group_default(o->head_dim));
    if (o->per_head != 0 && o->per_head != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "per_head must be 0 or 1 (got %d)", o->per_head);
    if (o->method != OSCAR_METHOD_OSCAR2 && o->method != OSCAR_METHOD_OSCAR2_LM)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "calibration method must be OSCAR2 or OSCAR2_LM (got %d); other methods need no "
                               "calibration: use oscar_params_create_builtin",
                               (int)o->method);
    if (!(o->clip_k >= 0.0f && o->clip_k <= 1.0f) || !(o->clip_v >= 0.0f && o->clip_v <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "clip_k %g / clip_v %g: use 0 to fit on held-back rows or a fixed ratio in (0, 1]",
                               (double)o->clip_k, (double)o->clip_v);
    if (o->holdout_rows < 1 || o->holdout_rows > MAX_HOLDOUT)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "holdout_rows %d must be in [1, %d] (default 4096)",
                               o->holdout_rows, MAX_HOLDOUT);
    if (o->sink < 0 || o->recent < 0 || o->sink > (1 << 24) || o->recent > (1 << 24))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "sink %d / recent %d: the cache layout wants sink >= 0 and recent >= 0 (defaults 64, "
                               "256; recent 0: the current token too is read in 2 bits)",
                               o->sink, o->recent);
    if (o->clip_objective != 0 && o->clip_objective != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "clip_objective must be 0 (attention probes) or 1 (held-back rows), got %d",
                               o->clip_objective);
    if (o->permutation < 0 || o->permutation > 2)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "permutation must be 0 (bit-reversal), 1 (random) or 2 (m-sequence), got %d",
                               o->permutation);
    if (o->rounding != 0 && o->rounding != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "rounding must be 0 (nearest) or 1 (error feedback), got %d", o->rounding);
    if (o->copy_probes < 0 || o->copy_probes > 64)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "copy_probes %d must be in [0, 64]", o->copy_probes);
    if (o->clip_per_head != 0 && o->clip_per_head != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "clip_per_head must be 0 or 1 (got %d)", o->clip_per_head);
    if (!(o->copy_mass_loss >= 0.0f && o->copy_mass_loss <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "copy_mass_loss %g must be in [0, 1]",
                               (double)o->copy_mass_loss);
    if (!(o->copy_head_mass >= 0.0f && o->copy_head_mass <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "copy_head_mass %g must be in [0, 1] (the source attention weight that names a copy "
                               "head; 0: off)",
                               (double)o->copy_head_mass);
    if (o->copy_head_mass > 0.0f && !(o->copy_head_clip > 0.0f && o->copy_head_clip <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "copy_head_clip %g must be in (0, 1] (the copy heads' key clip floor)",
                               (double)o->copy_head_clip);
    if (o->copy_head_mass > 0.0f && o->copy_probes == 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "copy_head_mass %g names copy heads by their copy probes: set copy_probes > 0 and feed "
                               "copy windows (oscar_calib_feed_copy)",
                               (double)o->copy_head_mass);
    if (o->copy_head_mass > 0.0f && o->clip_objective != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "copy_head_mass works on the attention probes: use clip_objective 0");
    if (!(o->key_attn_weight >= 0.0f && o->key_attn_weight <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "key_attn_weight %g must be in [0, 1]",
                               (double)o->key_attn_weight);
    if (!(o->wide_bits >= 0.0f && o->wide_bits <= 1.0f) && o->wide_bits != OSCAR_CALIB_WIDE_BITS_AUTO)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "wide_bits %g must be in [0, 1] (bits per element the code-width rule may add; 0: "
                               "none) or OSCAR_CALIB_WIDE_BITS_AUTO (-1, the default)", (double)o->wide_bits);
    if (o->wide_bits > 0.0f && o->method != OSCAR_METHOD_OSCAR2)
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED,
                               "wide_bits needs method OSCAR2: 3-bit codes have uniform levels (no Lloyd-Max set)");
    if (o->wide_bits > 0.0f && o->clip_objective != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "wide_bits ranks head-tensors on the attention probes: use clip_objective 0");
    if (o->probe_queries < 0 || o->probe_queries > MAX_PROBE_QUERIES)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "probe_queries %d must be in [0, %d] (query positions per attention probe; 0: 16 for "
                               "the layout without windows, sink 0 and recent 0, else 1)",
                               o->probe_queries, MAX_PROBE_QUERIES);
    if (o->probe_span != 0 && o->probe_span != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "probe_span must be 0 (second half of a window) or 1 (from sink + recent + %d on), got %d",
                               PROBE_MARGIN, o->probe_span);
    if (!(o->clip_margin >= 0.0f && o->clip_margin <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "clip_margin %g must be in [0, 1] (share of the smallest probe error a milder clip may "
                               "exceed it by)",
                               (double)o->clip_margin);
    if (!(o->feedback_damp >= 0.0f && o->feedback_damp <= 1.0f))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "feedback_damp %g must be in [0, 1] (ridge on the error-feedback metric, a share of its "
                               "mean eigenvalue; 0: the default 0.001)",
                               (double)o->feedback_damp);
    if (o->threads < 0 || o->threads > 64)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "threads %d must be in [0, 64] (0: the online CPUs)",
                               o->threads);
    if (o->model_hash && strlen(o->model_hash) > 64)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "model_hash is longer than 64 characters: shorten it");
    /* The parameter file takes printable ASCII only (its loader refuses anything else, so that a
     * hostile file's escapes stay out of terminals): a hash with other bytes made a file, after the
     * whole calibration, that oscar_params_load then refused as corrupt. */
    for (const char *h = o->model_hash; h && *h; h++)
        if ((unsigned char)*h < 0x20 || (unsigned char)*h > 0x7e)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                   "model_hash has byte 0x%02x at %d, not printable ASCII: the parameter file stores "
                                   "printable ASCII only; use e.g. a hex digest",
                                   (unsigned)(unsigned char)*h, (int)(h - o->model_hash));

    /* The accumulators (up to four d x d per layer and KV head, written in full) and the hold-out
     * reservoir are sized by the shape alone: one that cannot fit in this machine's memory is
     * refused here, naming its size. Asked of malloc, 1024 layers x 4096 KV heads x d 256 (2 TiB)
     * was out of memory at best and an abort under ASan. */
    {
        const double dd = (double)o->head_dim * (double)o->head_dim;
        const double res = (double)o->num_layers * (double)o->holdout_rows *
                           (2.0 * (double)o->head_dim * sizeof(float) + sizeof(float) + sizeof(int32_t));
        const double need = 4.0 * (double)o->num_layers * (double)o->num_kv_heads * dd * sizeof(double) + res;
        const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        const double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0.0;
        if (have > 0.0 && need > have)
            return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY,
                                   "calibration state for %d layers, %d KV heads, head_dim %d and %d hold-out rows "
                                   "needs %.3g GiB, more than this machine's %.3g GiB of memory: run it on a "
                                   "machine with more memory, or lower holdout_rows (its reservoir takes %.3g GiB)",
                                   o->num_layers, o->num_kv_heads, o->head_dim, o->holdout_rows,
                                   need / 1073741824.0, have / 1073741824.0, res / 1073741824.0);
    }
    oscar_calib *c = calloc(1, sizeof *c);
    if (!c) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory creating the calibration");
    c->o = *o;
    c->o.struct_size = sizeof c->o;
    /* The default budget applies where the rule does; an explicit one was checked above. */
    if (c->o.wide_bits == OSCAR_CALIB_WIDE_BITS_AUTO)
        c->o.wide_bits = o->method == OSCAR_METHOD_OSCAR2 && o->clip_objective == 0 ? OSCAR_CALIB_WIDE_BITS_DEFAULT
                                                                                     : 0.0f;
    if (o->model_hash) memcpy(c->model_hash, o->model_hash, strlen(o->model_hash) + 1);
    if (c->o.threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        c->o.threads = n < 1 ? 1 : n > 64 ? 64 : (int32_t)n;
    }
    if (c->o.probe_queries == 0) c->o.probe_queries = c->o.sink == 0 && c->o.recent == 0 ? PROBE_QUERIES_S0W0 : 1;
    c->o.model_hash = NULL; /* not kept: the caller's string may not outlive us */
    c->state = STATE_CREATED;
    c->L = o->num_layers;
    c->hq = o->num_q_heads;
    c->hkv = o->num_kv_heads;
    c->d = o->head_dim;
    c->g = o->num_q_heads / o->num_kv_heads;
    c->dd = (size_t)c->d * (size_t)c->d;
    c->cap = o->holdout_rows;
    size_t nm = (size_t)c->L * (size_t)c->hkv * c->dd, nres = (size_t)c->L * (size_t)c->cap;
    c->cq = calloc(nm, sizeof(double));
    c->cqn = calloc(nm, sizeof(double));
    if (o->key_attn_weight > 0.0f) {
        c->cw = calloc(nm, sizeof(double));
        if (!c->cw) {
            oscar_calib_destroy(c);
            return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory for the attention-weighted key target");
        }
    }
    c->sv = calloc(nm, sizeof(double));
    c->sw = calloc((size_t)c->L * (size_t)c->hkv, sizeof(double));
    c->n0 = calloc((size_t)c->L, sizeof(int64_t));
    c->n1 = calloc((size_t)c->L, sizeof(int64_t));
    c->res_k = malloc(nres * (size_t)c->d * sizeof(float));
    c->res_v = malloc(nres * (size_t)c->d * sizeof(float));
    c->res_w = malloc(nres * sizeof(float));
    c->res_h = malloc(nres * sizeof(int32_t));
    c->res_seen = calloc((size_t)c->L, sizeof(int64_t));
    c->rng = calloc((size_t)c->L, sizeof(uint64_t));
    c->x = malloc((size_t)CHUNK_ROWS * (size_t)c->d * sizeof(double));
    c->y = malloc((size_t)CHUNK_ROWS * (size_t)c->d * sizeof(double));
    c->wt = malloc((size_t)CHUNK_ROWS * sizeof(double));
    c->report = calloc((size_t)c->L, sizeof *c->report);
    c->slots = PROBES_PER_HEAD + o->copy_probes;
    c->probes = calloc((size_t)c->L * (size_t)c->hkv * (size_t)c->slots, sizeof *c->probes);
    c->copy_offers = calloc((size_t)c->L * (size_t)c->hkv, sizeof(int64_t));
    c->copy_rng = calloc((size_t)c->L, sizeof(uint64_t));
    c->probe_offers = calloc((size_t)c->L * (size_t)c->hkv, sizeof(int64_t));
    c->probe_rng = calloc((size_t)c->L, sizeof(uint64_t));
    c->feeds = calloc(2 * (size_t)c->L, sizeof(int64_t));
    c->attn = calloc((size_t)c->L, sizeof *c->attn);
    c->copy = calloc((size_t)c->L, sizeof *c->copy);
    c->head_copy = calloc((size_t)c->L * (size_t)c->hkv, sizeof *c->head_copy);
    c->width = calloc((size_t)c->L * (size_t)c->hkv * 2, sizeof *c->width);
    if (!c->probes || !c->probe_offers || !c->probe_rng || !c->copy_offers || !c->copy_rng || !c->feeds ||
        !c->attn || !c->copy || !c->head_copy || !c->width) {
        oscar_calib_destroy(c);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory for calibration state (%d layers)",
                               o->num_layers);
    }
    for (size_t i = 0; i < (size_t)c->L * (size_t)c->hkv * (size_t)c->slots; i++) c->probes[i].t = -1;
    if (!c->cq || !c->cqn || !c->sv || !c->sw || !c->n0 || !c->n1 || !c->res_k || !c->res_v || !c->res_w ||
        !c->res_h || !c->res_seen || !c->rng || !c->x || !c->y || !c->wt || !c->report) {
        oscar_calib_destroy(c);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY,
                               "out of memory for calibration state (%d layers, %d KV heads, head_dim %d, %d "
                               "hold-out rows): lower holdout_rows",
                               o->num_layers, o->num_kv_heads, o->head_dim, o->holdout_rows);
    }
    /* Deterministic reservoir: the same feed order gives the same rows. */
    for (int l = 0; l < c->L; l++) {
        c->rng[l] = 0x05ca12000000ull + (uint64_t)l;
        c->probe_rng[l] = 0x9e0be5000000ull + (uint64_t)l;
        c->copy_rng[l] = 0xc0b1e5000000ull + (uint64_t)l;
    }
    *out = c;
    return OSCAR_OK;
}

/* Mirrors the upper triangle of a d x d row-major matrix into the lower. */
static void symmetrize_upper(int d, double *a) {
    for (int i = 0; i < d; i++)
        for (int j = 0; j < i; j++) a[i * d + j] = a[j * d + i];
}

OSCAR_API oscar_status oscar_calib_begin_pass(oscar_calib *c, int pass) {
    oscar_clear_error();
    if (!c) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_begin_pass: calib is NULL");
    if (pass == 0) {
        if (c->state != STATE_CREATED)
            return oscar_set_error(OSCAR_ERR_STATE,
                                   "pass 0 can only begin once, right after oscar_calib_create: create a new "
                                   "calibration to start over");
        c->state = STATE_PASS0;
        return OSCAR_OK;
    }
    if (pass == 1) {
        if (c->state != STATE_PASS0)
            return oscar_set_error(OSCAR_ERR_STATE,
                                   "pass 1 begins after pass 0 (call oscar_calib_begin_pass(c, 0) and feed every "
                                   "layer first)");
        for (int l = 0; l < c->L; l++)
            if (c->n0[l] == 0)
                return oscar_set_error(OSCAR_ERR_STATE,
                                       "layer %d got no tokens in pass 0: feed every layer before beginning pass 1",
                                       l);
        /* C_Q,h final: 1/(N g) * sum of q q^T over tokens and the group's query heads. */
        for (int l = 0; l < c->L; l++)
            for (int h = 0; h < c->hkv; h++) {
                size_t off = ((size_t)l * (size_t)c->hkv + (size_t)h) * c->dd;
                double inv = 1.0 / ((double)c->n0[l] * (double)c->g);
                for (size_t i = 0; i < c->dd; i++) c->cqn[off + i] = c->cq[off + i] * inv;
                symmetrize_upper(c->d, c->cqn + off);
            }
        c->state = STATE_PASS1;
        return OSCAR_OK;
    }
    return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "pass must be 0 or 1 (got %d)", pass);
}

/* Finds the first non-finite element of a [n][heads][d] array; -1 if none. */
static int64_t first_nonfinite(const void *a, oscar_dtype t, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!isfinite(oscar_load(t, a, i))) return (int64_t)i;
    return -1;
}

/* Converts d elements of a host array of dtype t, from index base, to fp64
 * (one dtype switch per row, not per element). */
static void load_row(oscar_dtype t, const void *a, size_t base, int d, double *out) {
    if (t == OSCAR_DTYPE_F32) {
        const float *f = (const float *)a + base;
        for (int i = 0; i < d; i++) out[i] = f[i];
    } else if (t == OSCAR_DTYPE_BF16) {
        const uint16_t *h = (const uint16_t *)a + base;
        for (int i = 0; i < d; i++) out[i] = oscar_bf16_to_f32(h[i]);
    } else {
        const uint16_t *h = (const uint16_t *)a + base;
        for (int i = 0; i < d; i++) out[i] = oscar_f16_to_f32(h[i]);
    }
}

/* Offers one (K, V) row pair to the layer's reservoir (Algorithm R with a
 * deterministic generator): memory stays `cap` rows whatever N is. */
static void reservoir_offer(oscar_calib *c, int l, int h, const void *k, const void *v, oscar_dtype t, size_t base,
                            double w) {
    int64_t seen = c->res_seen[l]++;
    int64_t slot = seen;
    if (seen >= c->cap) {
        slot = (int64_t)(splitmix64(&c->rng[l]) % (uint64_t)(seen + 1));
        if (slot >= c->cap) return;
    }
    size_t o = ((size_t)l * (size_t)c->cap + (size_t)slot);
    for (int i = 0; i < c->d; i++) {
        c->res_k[o * (size_t)c->d + (size_t)i] = oscar_load(t, k, base + (size_t)i);
        c->res_v[o * (size_t)c->d + (size_t)i] = oscar_load(t, v, base + (size_t)i);
    }
    c->res_w[o] = (float)w;
    c->res_h[o] = h;
}

/* Probes. A feed is one causal window; a window long enough offers one probe
 * per KV head to that (layer, head)'s reservoir in pass 0 (Algorithm R with a
 * deterministic generator, so the same feeds give the same probes): the query
 * position t is drawn from the window's second half with at least
 * PROBE_MARGIN rows in the 2-bit region [sink, t - recent]. Pass 1 feeds the
 * same windows in the same order, so the probe's keys and values are copied
 * from pass 0's feed when it gave them (the tool does), else from pass 1's
 * feed with the same per-layer index. Allocation failures are
 * reported before anything of the feed is accumulated. */
/* Copies KV head h's rows 0..t of a feed into the probe; -1 out of memory. */
static int probe_copy_kv(const oscar_calib *c, probe *p, int h, const void *k, const void *v, oscar_dtype dtype) {
    const int d = c->d, hkv = c->hkv;
    size_t rows = (size_t)p->t + 1;
    p->k = malloc(rows * (size_t)d * sizeof(float));
    p->v = malloc(rows * (size_t)d * sizeof(float));
    if (!p->k || !p->v) {
        free(p->k);
        free(p->v);
        p->k = p->v = NULL;
        return -1;
    }
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < d; i++) {
            size_t src = (r * (size_t)hkv + (size_t)h) * (size_t)d + (size_t)i;
            p->k[r * (size_t)d + (size_t)i] = oscar_load(dtype, k, src);
            p->v[r * (size_t)d + (size_t)i] = oscar_load(dtype, v, src);
        }
    return 0;
}


/* The g query rows of KV head h at the probe's positions p->tq, as fp32. */
static void probe_copy_q(probe *p, const void *q, oscar_dtype dtype, int hq, int h, int g, int d) {
    for (int a = 0; a < p->nq; a++)
        for (int j = 0; j < g; j++)
            for (int i = 0; i < d; i++)
                p->q[((size_t)a * (size_t)g + (size_t)j) * (size_t)d + (size_t)i] = oscar_load(
                    dtype, q, ((size_t)p->tq[a] * (size_t)hq + (size_t)(h * g + j)) * (size_t)d + (size_t)i);
}

static oscar_status probes_capture(oscar_calib *c, int layer, int n, const void *q, const void *k, const void *v,
                                   oscar_dtype dtype, int pass) {
    const int d = c->d, g = c->g, hq = c->hq, hkv = c->hkv;
    const int64_t feed = c->feeds[(size_t)pass * (size_t)c->L + (size_t)layer];
    const int64_t lo0 = (int64_t)c->o.sink + c->o.recent + PROBE_MARGIN;
    if ((int64_t)n < lo0 + 1) return OSCAR_OK;
    for (int h = 0; h < hkv; h++) {
        probe *ph = c->probes + ((size_t)layer * (size_t)hkv + (size_t)h) * (size_t)c->slots;
        if (pass == 0) {
            int64_t seen = c->probe_offers[(size_t)layer * (size_t)hkv + (size_t)h]++;
            int64_t slot = seen;
            if (seen >= PROBES_PER_HEAD) {
                slot = (int64_t)(splitmix64(&c->probe_rng[layer]) % (uint64_t)(seen + 1));
                if (slot >= PROBES_PER_HEAD) continue;
            }
            probe *p = ph + slot;
            const int nq = c->o.probe_queries;
            if (!p->q && !(p->q = malloc((size_t)nq * (size_t)g * (size_t)d * sizeof(float))))
                return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory keeping an attention probe");
            /* probe_span 0: the window's second half; 1: every position with a 2-bit region. */
            int64_t lo = n / 2 > lo0 && c->o.probe_span == 0 ? n / 2 : lo0, hi = n - 1;
            if (nq == 1) {
                p->t = (int)(lo + (int64_t)(splitmix64(&c->probe_rng[layer]) % (uint64_t)(hi - lo + 1)));
                p->tq[0] = p->t;
            } else { /* stratified: one position drawn in each nq-th of [lo, hi] */
                const int64_t span = hi - lo + 1;
                for (int a = 0; a < nq; a++) {
                    int64_t s0 = lo + span * a / nq, s1 = lo + span * (a + 1) / nq - 1;
                    if (s1 < s0) s1 = s0;
                    p->tq[a] = (int)(s0 + (int64_t)(splitmix64(&c->probe_rng[layer]) % (uint64_t)(s1 - s0 + 1)));
                }
                p->t = p->tq[nq - 1];
            }
            p->nq = nq;
            p->n = n;
            p->period = 0;
            p->feed = feed;
            probe_copy_q(p, q, dtype, hq, h, g, d);
            /* Keys and values given in pass 0 are kept right away; otherwise pass 1 brings them. */
            free(p->k);
            free(p->v);
            p->k = p->v = NULL;
            if (k && v && probe_copy_kv(c, p, h, k, v, dtype))
                return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory keeping an attention probe");
        } else {
            for (int s = 0; s < PROBES_PER_HEAD; s++) {
                probe *p = ph + s;
                if (p->t < 0 || p->feed != feed || p->k) continue;
                if (p->n != n) /* not the window pass 0 saw: its probe would be lost without a word */
                    return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                           "layer %d: pass 1 feed %lld has %d tokens, but pass 0's feed %lld had %d "
                                           "and holds an attention probe: feed the same windows in the same order in "
                                           "both passes (or give pass 0 the keys and values); nothing accumulated",
                                           layer, (long long)feed, n, (long long)p->feed, p->n);
                if (probe_copy_kv(c, p, h, k, v, dtype))
                    return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory keeping an attention probe");
            }
        }
    }
    return OSCAR_OK;
}

/* Runs fn(ctx, part, parts) for part = 0..parts-1, parts - 1 of them in new threads (a part whose
 * thread cannot start runs here). Each part writes only its own outputs, so results do not depend on
 * the count (options.threads). */
#define MAX_WORKERS 64
typedef struct part_job {
    void (*fn)(void *ctx, int part, int parts);
    void *ctx;
    int part, parts;
} part_job;

static void *part_run(void *arg) {
    const part_job *j = arg;
    j->fn(j->ctx, j->part, j->parts);
    return NULL;
}

static void parallel_parts(int parts, void (*fn)(void *ctx, int part, int parts), void *ctx) {
    if (parts < 1) parts = 1;
    if (parts > MAX_WORKERS) parts = MAX_WORKERS;
    part_job jobs[MAX_WORKERS];
    pthread_t tid[MAX_WORKERS];
    int started[MAX_WORKERS] = {0};
    for (int w = 0; w < parts; w++) {
        jobs[w] = (part_job){.fn = fn, .ctx = ctx, .part = w, .parts = parts};
        if (w > 0) started[w] = pthread_create(&tid[w], NULL, part_run, &jobs[w]) == 0;
    }
    part_run(&jobs[0]);
    for (int w = 1; w < parts; w++) {
        if (started[w])
            pthread_join(tid[w], NULL);
        else
            part_run(&jobs[w]);
    }
}

/* Attention-weighted key target (key_attn_weight > 0), pass 0: for every ATTN_STRIDE-th query
 * position t of the window whose 2-bit region [sink, t - recent] is not empty, and every query head
 * of KV head h, a = sum over that region of the squared softmax weights (causal, over 0..t) adds
 * a q q^T to cw. A key error dk moves the head's output by about
 * sum_p P_p (q . dk_p) (v_p - o): its squared size grows with P_p^2 (q^T E[dk dk^T] q), so queries
 * whose attention concentrates on a few 2-bit keys (copy and induction queries) weigh most,
 * queries spread over many keys or kept on the sink and recent window little. */
#define ATTN_STRIDE 8
#define ATTN_BLOCK 32 /* query rows per score product */
/* Rows [m part / parts, m (part + 1) / parts) of attn_weighted_queries: row i (position first + 8 i)
 * of the scores S [m][n] gives a = sum over the 2-bit region of the squared softmax weights, and the
 * query row X[i] is scaled by sqrt(a). */
typedef struct attn_rows_job {
    const float *S;
    double *X;
    int n, m, d, first, sink, recent;
} attn_rows_job;

static void attn_rows(void *arg, int part, int parts) {
    const attn_rows_job *j = arg;
    const int i0 = (int)((int64_t)j->m * part / parts), i1 = (int)((int64_t)j->m * (part + 1) / parts);
    for (int i = i0; i < i1; i++) {
        const int t = j->first + i * ATTN_STRIDE;
        const float *s = j->S + (size_t)i * (size_t)j->n;
        float mx = s[0];
        for (int p = 1; p <= t; p++) mx = s[p] > mx ? s[p] : mx;
        double z = 0.0, a2 = 0.0;
        for (int p = 0; p <= t; p++) {
            double e = exp((double)s[p] - (double)mx);
            z += e;
            if (p >= j->sink && p <= t - j->recent) a2 += e * e;
        }
        const double sq = sqrt(a2 / (z * z));
        for (int e = 0; e < j->d; e++) j->X[(size_t)i * (size_t)j->d + e] *= sq;
    }
}
static oscar_status attn_weighted_queries(oscar_calib *c, int layer, int n, const void *q, const void *k,
                                          oscar_dtype dtype) {
    const int d = c->d, g = c->g, hq = c->hq, hkv = c->hkv, sink = c->o.sink, recent = c->o.recent;
    const int64_t lo = (int64_t)sink + recent;
    if ((int64_t)n <= lo) return OSCAR_OK;
    /* The window's sample of positions shifts with the feed index, so all positions get sampled. */
    const int first = (int)(lo + c->feeds[layer] % ATTN_STRIDE);
    if (first >= n) return OSCAR_OK;
    const int m = (n - 1 - first) / ATTN_STRIDE + 1;
    float *K = malloc((size_t)n * (size_t)d * sizeof(float)), *Q = malloc((size_t)m * (size_t)d * sizeof(float)),
          *S = malloc((size_t)m * (size_t)n * sizeof(float));
    double *row = malloc((size_t)d * sizeof(double)), *X = malloc((size_t)m * (size_t)d * sizeof(double));
    if (!K || !Q || !S || !row || !X) {
        free(K), free(Q), free(S), free(row), free(X);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory for the attention-weighted key target");
    }
    const float scale = (float)(1.0 / sqrt((double)d));
    for (int h = 0; h < hkv; h++) {
        for (int t = 0; t < n; t++) {
            load_row(dtype, k, ((size_t)t * (size_t)hkv + (size_t)h) * (size_t)d, d, row);
            for (int i = 0; i < d; i++) K[(size_t)t * (size_t)d + (size_t)i] = (float)row[i];
        }
        const size_t mo = ((size_t)layer * (size_t)hkv + (size_t)h) * c->dd;
        for (int j = h * g; j < (h + 1) * g; j++) {
            for (int i = 0; i < m; i++) {
                load_row(dtype, q, ((size_t)(first + i * ATTN_STRIDE) * (size_t)hq + (size_t)j) * (size_t)d, d,
                         X + (size_t)i * (size_t)d);
                for (int e = 0; e < d; e++) Q[(size_t)i * (size_t)d + (size_t)e] = (float)X[(size_t)i * (size_t)d + e];
            }
            /* Causal: a block of rows needs the keys up to its last position only. */
            for (int i0 = 0; i0 < m; i0 += ATTN_BLOCK) {
                const int rows = m - i0 < ATTN_BLOCK ? m - i0 : ATTN_BLOCK;
                const int keys = first + (i0 + rows - 1) * ATTN_STRIDE + 1;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, Q + (size_t)i0 * (size_t)d,
                            d, K, d, 0.0f, S + (size_t)i0 * (size_t)n, n);
            }
            attn_rows_job job = {.S = S, .X = X, .n = n, .m = m, .d = d, .first = first, .sink = sink, .recent = recent};
            parallel_parts(c->o.threads, attn_rows, &job);
            cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, m, 1.0, X, d, 1.0, c->cw + mo, d);
        }
    }
    free(K), free(Q), free(S), free(row), free(X);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_feed(oscar_calib *c, int layer, int n_tokens, const void *q, const void *k,
                                        const void *v, oscar_dtype dtype) {
    oscar_clear_error();
    if (!c) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_feed: calib is NULL");
    if (c->state != STATE_PASS0 && c->state != STATE_PASS1)
        return oscar_set_error(OSCAR_ERR_STATE,
                               c->state == STATE_FINAL
                                   ? "oscar_calib_feed after finalize: create a new calibration to feed more tokens"
                                   : "oscar_calib_feed before oscar_calib_begin_pass(c, 0): begin pass 0 first");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_feed: layer %d out of range [0, %d)", layer,
                               c->L);
    if (n_tokens < 0) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "n_tokens %d is negative", n_tokens);
    if (n_tokens == 0) return oscar_set_error(OSCAR_ERR_EMPTY, "oscar_calib_feed: n_tokens is 0: feed at least one token");
    if (dtype != OSCAR_DTYPE_F32 && dtype != OSCAR_DTYPE_BF16 && dtype != OSCAR_DTYPE_F16)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "dtype %d is not F32, BF16 or F16", (int)dtype);
    const int pass = c->state;
    if (pass == 0 && !q)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "pass 0 needs the queries q (and the keys k while key_attn_weight > 0)");
    if (pass == 1 && (!k || !v))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "pass 1 needs the keys k and values v (q may be NULL)");
    if (pass == 0 && c->cw && !k)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "key_attn_weight %g needs the keys k in pass 0 (the attention weights of the "
                               "queries): pass k, or set key_attn_weight 0",
                               (double)c->o.key_attn_weight);
    const int d = c->d, hq = c->hq, hkv = c->hkv, g = c->g;
    const size_t n = (size_t)n_tokens;

    /* Refuse before accumulating anything: a bad row leaves no trace. */
    if (pass == 0) {
        int64_t bad = first_nonfinite(q, dtype, n * (size_t)hq * (size_t)d);
        if (bad >= 0)
            return oscar_set_error(OSCAR_ERR_NONFINITE,
                                   "layer %d: query of token %lld, head %lld is not finite: nothing accumulated; "
                                   "check the model's activations",
                                   layer, (long long)(bad / ((int64_t)hq * d)), (long long)(bad / d % hq));
    }
    /* Keys and values: always in pass 1, and in pass 0 when given (the probes
     * keep them there). */
    {
        for (int which = 0; which < 2; which++) {
            if (!(which ? v : k)) continue;
            int64_t bad = first_nonfinite(which ? v : k, dtype, n * (size_t)hkv * (size_t)d);
            if (bad >= 0)
                return oscar_set_error(OSCAR_ERR_NONFINITE,
                                       "layer %d: %s of token %lld, KV head %lld is not finite: nothing accumulated; "
                                       "check the model's activations",
                                       layer, which ? "value" : "key", (long long)(bad / ((int64_t)hkv * d)),
                                       (long long)(bad / d % hkv));
        }
    }

    oscar_status ps = probes_capture(c, layer, n_tokens, q, k, v, dtype, pass);
    if (ps) return ps;
    if (pass == 0 && c->cw && (ps = attn_weighted_queries(c, layer, n_tokens, q, k, dtype))) return ps;
    if (pass == 0) {
        /* Per KV head: rows q_{t,j} for the group's query heads, rank-k update. */
        const size_t tok_per_chunk = (size_t)(CHUNK_ROWS / g > 0 ? CHUNK_ROWS / g : 1);
        for (int h = 0; h < hkv; h++) {
            double *C = c->cq + ((size_t)layer * (size_t)hkv + (size_t)h) * c->dd;
            for (size_t t0 = 0; t0 < n; t0 += tok_per_chunk) {
                size_t t1 = t0 + tok_per_chunk < n ? t0 + tok_per_chunk : n, rows = 0;
                for (size_t t = t0; t < t1; t++)
                    for (int j = h * g; j < (h + 1) * g; j++, rows++) {
                        load_row(dtype, q, (t * (size_t)hq + (size_t)j) * (size_t)d, d, c->x + rows * (size_t)d);
                    }
                cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, (int)rows, 1.0, c->x, d, 1.0, C, d);
            }
        }
        c->n0[layer] += (int64_t)n;
    } else {
        for (size_t t0 = 0; t0 < n; t0 += CHUNK_ROWS) {
            size_t t1 = t0 + CHUNK_ROWS < n ? t0 + CHUNK_ROWS : n, rows = t1 - t0;
            for (int h = 0; h < hkv; h++) {
                size_t mo = ((size_t)layer * (size_t)hkv + (size_t)h) * c->dd;
                for (size_t t = t0; t < t1; t++) {
                    load_row(dtype, k, (t * (size_t)hkv + (size_t)h) * (size_t)d, d, c->x + (t - t0) * (size_t)d);
                }
                /* w_t = k_t^T C_Q,h k_t: Y = K C_Q,h, then row dots. */
                cblas_dsymm(CblasRowMajor, CblasRight, CblasUpper, (int)rows, d, 1.0, c->cqn + mo, d, c->x, d, 0.0,
                            c->y, d);
                double wsum = 0.0;
                for (size_t r = 0; r < rows; r++) {
                    double w = 0.0;
                    for (int i = 0; i < d; i++) w += c->x[r * (size_t)d + (size_t)i] * c->y[r * (size_t)d + (size_t)i];
                    if (w < 0.0) w = 0.0; /* C_Q is PSD: only rounding makes w negative */
                    c->wt[r] = w;
                    wsum += w;
                }
                /* sum w v v^T as a rank-k update of rows sqrt(w) v. */
                for (size_t t = t0; t < t1; t++) {
                    size_t base = (t * (size_t)hkv + (size_t)h) * (size_t)d;
                    double sq = sqrt(c->wt[t - t0]), *row = c->x + (t - t0) * (size_t)d;
                    load_row(dtype, v, base, d, row);
                    for (int i = 0; i < d; i++) row[i] *= sq;
                    reservoir_offer(c, layer, h, k, v, dtype, base, c->wt[t - t0]);
                }
                cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, (int)rows, 1.0, c->x, d, 1.0, c->sv + mo, d);
                c->sw[(size_t)layer * (size_t)hkv + (size_t)h] += wsum;
            }
        }
        c->n1[layer] += (int64_t)n;
    }
    c->fed[pass] += (int64_t)n;
    c->feeds[(size_t)pass * (size_t)c->L + (size_t)layer]++;
    if (c->o.progress) {
        /* Pass 1 knows its total: the tokens pass 0 saw. */
        int64_t total = 0;
        if (pass == 1)
            for (int l = 0; l < c->L; l++) total += c->n0[l];
        c->o.progress(c->o.progress_user, pass == 0 ? "pass 0" : "pass 1", c->fed[pass], total);
    }
    return OSCAR_OK;
}

/* Copy probes: a window whose later part repeats earlier text (the tool
 * feeds a span of calibration text twice). One probe per KV head goes to the
 * (layer, head)'s copy reservoir (Algorithm R, own deterministic generator),
 * query position t drawn from [max(first_query, sink + recent + 32, sink +
 * period - 1), n - 2] (t + 1, the token it predicts, is inside the window);
 * nothing is accumulated into the targets, so rotations do not change. */
OSCAR_API oscar_status oscar_calib_feed_copy(oscar_calib *c, int layer, int n_tokens, int first_query, int period,
                                             const void *q, const void *k, const void *v, oscar_dtype dtype) {
    oscar_clear_error();
    if (!c) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_feed_copy: calib is NULL");
    if (c->state != STATE_PASS0)
        return oscar_set_error(OSCAR_ERR_STATE, "oscar_calib_feed_copy belongs to pass 0 (call "
                                                "oscar_calib_begin_pass(c, 0) first, feed copies before pass 1)");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_feed_copy: layer %d out of range [0, %d)",
                               layer, c->L);
    if (!q || !k || !v)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_feed_copy needs q, k and v");
    if (dtype != OSCAR_DTYPE_F32 && dtype != OSCAR_DTYPE_BF16 && dtype != OSCAR_DTYPE_F16)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "dtype %d is not F32, BF16 or F16", (int)dtype);
    const int64_t lo0 = (int64_t)c->o.sink + c->o.recent + PROBE_MARGIN;
    /* The source t + 1 - period must lie in the 2-bit region [sink, t - recent]. */
    int64_t lo = first_query > lo0 ? first_query : lo0;
    if ((int64_t)c->o.sink + period - 1 > lo) lo = (int64_t)c->o.sink + period - 1;
    if (period <= c->o.recent || n_tokens < 2 || first_query < 0 || lo > (int64_t)n_tokens - 2)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_calib_feed_copy: %d tokens, first query %d, period %d: the period must exceed "
                               "recent (%d) and the query range hold a position >= sink + recent + %d = %lld whose "
                               "source t + 1 - period is >= sink",
                               n_tokens, first_query, period, c->o.recent, PROBE_MARGIN, (long long)lo0);
    const int d = c->d, g = c->g, hq = c->hq, hkv = c->hkv;
    const size_t n = (size_t)n_tokens;
    if (first_nonfinite(q, dtype, n * (size_t)hq * (size_t)d) >= 0 ||
        first_nonfinite(k, dtype, n * (size_t)hkv * (size_t)d) >= 0 ||
        first_nonfinite(v, dtype, n * (size_t)hkv * (size_t)d) >= 0)
        return oscar_set_error(OSCAR_ERR_NONFINITE, "layer %d: a copy window's q, k or v is not finite", layer);
    if (c->o.copy_probes == 0) return OSCAR_OK; /* no copy reservoir: nothing to keep */
    for (int h = 0; h < hkv; h++) {
        probe *ph = c->probes + ((size_t)layer * (size_t)hkv + (size_t)h) * (size_t)c->slots + PROBES_PER_HEAD;
        int64_t seen = c->copy_offers[(size_t)layer * (size_t)hkv + (size_t)h]++;
        int64_t slot = seen;
        if (seen >= c->o.copy_probes) {
            slot = (int64_t)(splitmix64(&c->copy_rng[layer]) % (uint64_t)(seen + 1));
            if (slot >= c->o.copy_probes) continue;
        }
        probe *p = ph + slot;
        if (!p->q && !(p->q = malloc((size_t)g * (size_t)d * sizeof(float))))
            return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory keeping a copy probe");
        p->t = (int)(lo + (int64_t)(splitmix64(&c->copy_rng[layer]) % (uint64_t)(n_tokens - 1 - lo)));
        p->nq = 1;
        p->tq[0] = p->t;
        p->n = n_tokens;
        p->feed = -1; /* never matched by a pass-1 feed */
        p->period = period;
        probe_copy_q(p, q, dtype, hq, h, g, d);
        free(p->k);
        free(p->v);
        p->k = p->v = NULL;
        if (probe_copy_kv(c, p, h, k, v, dtype)) {
            p->t = -1;
            return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory keeping a copy probe");
        }
    }
    return OSCAR_OK;
}

/* Target of (layer, which) for rotation index r (a KV head when per_head,
 * else the mean over heads), full symmetric d x d. */
static void target(const oscar_calib *c, int layer, int which, int r, double *out) {
    int h0 = c->o.per_head ? r : 0, h1 = c->o.per_head ? r + 1 : c->hkv;
    double scale = 1.0 / (double)(h1 - h0);
    memset(out, 0, c->dd * sizeof(double));
    for (int h = h0; h < h1; h++) {
        size_t mo = ((size_t)layer * (size_t)c->hkv + (size_t)h) * c->dd;
        if (which == OSCAR_K) {
            /* (1 - a) C_Q,h + a C_W,h, C_W,h the attention-weighted one scaled to C_Q,h's trace. */
            double a = c->cw ? (double)c->o.key_attn_weight : 0.0, trq = 0.0, trw = 0.0;
            for (int i = 0; a > 0.0 && i < c->d; i++) {
                trq += c->cqn[mo + (size_t)i * (size_t)c->d + (size_t)i];
                trw += c->cw[mo + (size_t)i * (size_t)c->d + (size_t)i];
            }
            if (!(trw > 0.0)) a = 0.0; /* no weighted query (windows too short): the published target */
            const double fw = a > 0.0 ? a * scale * trq / trw : 0.0;
            for (size_t i = 0; i < c->dd; i++) out[i] += (1.0 - a) * scale * c->cqn[mo + i];
            for (int i = 0; fw > 0.0 && i < c->d; i++)
                for (int j = 0; j < c->d; j++) {
                    int lo = i < j ? i : j, hi = i < j ? j : i;
                    out[(size_t)i * (size_t)c->d + (size_t)j] += fw * c->cw[mo + (size_t)lo * (size_t)c->d + (size_t)hi];
                }
        } else {
            double sw = c->sw[(size_t)layer * (size_t)c->hkv + (size_t)h];
            double f = sw > 0.0 ? scale / sw : 0.0;
            for (int i = 0; i < c->d; i++)
                for (int j = i; j < c->d; j++) out[i * c->d + j] += f * c->sv[mo + (size_t)i * (size_t)c->d + (size_t)j];
        }
    }
    if (which == OSCAR_V) symmetrize_upper(c->d, out);
}

OSCAR_API oscar_status oscar_calib_target(const oscar_calib *c, int layer, int kv_head, oscar_kv which,
                                          double *out) {
    oscar_clear_error();
    if (!c || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_target: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_target: layer %d out of range [0, %d)", layer,
                               c->L);
    if (which != OSCAR_K && which != OSCAR_V)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "which must be OSCAR_K or OSCAR_V (got %d)", (int)which);
    int r = 0;
    if (c->o.per_head) {
        if (kv_head < 0 || kv_head >= c->hkv)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "kv_head %d out of range [0, %d)", kv_head, c->hkv);
        r = kv_head;
    }
    if (which == OSCAR_K && c->state < STATE_PASS1)
        return oscar_set_error(OSCAR_ERR_STATE,
                               "C_K is defined after pass 0: call oscar_calib_begin_pass(c, 1) (or finalize) first");
    if (which == OSCAR_V && !(c->state == STATE_FINAL || (c->state == STATE_PASS1 && c->n1[layer] > 0)))
        return oscar_set_error(OSCAR_ERR_STATE, "C_V of layer %d is defined after pass 1 has fed that layer", layer);
    target(c, layer, (int)which, r, out);
    return OSCAR_OK;
}

/* Value metrics: the largest entry taken, and how negative an eigenvalue may be (a share of the
 * largest) and still be rounding of a PSD matrix; the feedback ridge (>= 1e-3 of the mean eigenvalue
 * by default) absorbs it. */
#define VMETRIC_MAX 1e100
#define VMETRIC_NEG_TOL 1e-6

OSCAR_API oscar_status oscar_calib_set_value_metric(oscar_calib *c, int layer, int kv_head, const double *M) {
    oscar_clear_error();
    if (!c || !M) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_set_value_metric: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)", layer, c->L);
    if (kv_head < 0 || kv_head >= c->hkv)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "kv_head %d out of range [0, %d)", kv_head, c->hkv);
    if (c->state == STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE, "oscar_calib_set_value_metric after finalize: set it before");
    const int d = c->d;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = M[(size_t)i * d + j], b = M[(size_t)j * d + i];
            if (!isfinite(a) || fabs(a - b) > 1e-6 * (fabs(a) + fabs(b)) + 1e-300 || (i == j && a < 0.0))
                return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                       "value metric of layer %d head %d: entry (%d, %d) = %g is not finite, not "
                                       "symmetric or a negative diagonal; pass W_O^T W_O-like PSD matrices",
                                       layer, kv_head, i, j, a);
            if (fabs(a) > VMETRIC_MAX)
                return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                       "value metric of layer %d head %d: entry (%d, %d) = %g is above %g, where "
                                       "sums over the metric (its trace, its rotation) can overflow fp64; scale M down "
                                       "(W_O^T W_O of a real model is many orders of magnitude below)",
                                       layer, kv_head, i, j, a, VMETRIC_MAX);
        }
    /* Symmetric with a non-negative diagonal is not yet PSD ([[1, 3], [3, 1]] has eigenvalue -2): an
     * indefinite metric passed here and made finalize fail, after all its work, with an internal error
     * ("Cholesky factor ... failed: report this"). Its eigenvalues are checked now, to rounding. */
    double *E = malloc(c->dd * sizeof(double)), *lam = malloc((size_t)d * sizeof(double));
    if (!E || !lam) {
        free(E);
        free(lam);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory checking a value metric");
    }
    memcpy(E, M, c->dd * sizeof(double));
    const lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'N', 'U', d, E, d, lam); /* ascending */
    const double lo = lam[0], hi = lam[d - 1];
    free(E);
    free(lam);
    if (info != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "value metric of layer %d head %d: its eigenvalues could not be computed (LAPACK "
                               "dsyevd info %d); pass W_O^T W_O-like PSD matrices",
                               layer, kv_head, (int)info);
    if (lo < -VMETRIC_NEG_TOL * fmax(hi, 0.0))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "value metric of layer %d head %d is not positive semi-definite: smallest eigenvalue "
                               "%g, largest %g; pass W_O^T W_O-like PSD matrices (a sum of X^T X)",
                               layer, kv_head, lo, hi);
    if (!c->vmetric) {
        c->vmetric = calloc((size_t)c->L * (size_t)c->hkv * c->dd, sizeof(double));
        c->vmetric_set = calloc((size_t)c->L * (size_t)c->hkv, 1);
        if (!c->vmetric || !c->vmetric_set) {
            free(c->vmetric);
            free(c->vmetric_set);
            c->vmetric = NULL;
            c->vmetric_set = NULL;
            return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory storing value metrics");
        }
    }
    size_t slot = (size_t)layer * (size_t)c->hkv + (size_t)kv_head;
    memcpy(c->vmetric + slot * c->dd, M, c->dd * sizeof(double));
    c->vmetric_set[slot] = 1;
    return OSCAR_OK;
}

/* ------------------------------------------------------------ finalize */

/* The value metric of (layer, rotation index r) into M: the head's, or with
 * one rotation per layer the mean over heads. 0 when not given. */
static int value_metric(const oscar_calib *c, int layer, int r, double *M) {
    if (!c->vmetric) return 0;
    const size_t base = (size_t)layer * (size_t)c->hkv;
    if (c->o.per_head) {
        if (!c->vmetric_set[base + (size_t)r]) return 0;
        memcpy(M, c->vmetric + (base + (size_t)r) * c->dd, c->dd * sizeof(double));
        return 1;
    }
    int n = 0;
    memset(M, 0, c->dd * sizeof(double));
    for (int h = 0; h < c->hkv; h++) {
        if (!c->vmetric_set[base + (size_t)h]) continue;
        const double *Mh = c->vmetric + (base + (size_t)h) * c->dd;
        for (size_t i = 0; i < c->dd; i++) M[i] += Mh[i];
        n++;
    }
    for (size_t i = 0; i < c->dd && n; i++) M[i] /= n;
    return n > 0;
}

/* Error-feedback weights for metric Ct (rotated space, d x d): with
 * U^T U = (Ct + damp I)^-1, U upper triangular, F[j][k] = U[j][k] / U[j][j]
 * for k > j (0 elsewhere). Rounding value j then moves the later values so the
 * error e minimises e^T Ct e given the earlier choices (the GPTQ/OBQ update).
 * A zero metric gives F = 0 (nearest). Returns 0, or -1 when LAPACK fails. */
static int feedback_weights(int d, const double *Ct, double damp0, double *A, float *F) {
    const size_t dd = (size_t)d * (size_t)d;
    double tr = 0.0;
    for (int i = 0; i < d; i++) tr += Ct[(size_t)i * d + i];
    memset(F, 0, dd * sizeof(float));
    if (!(tr > 0.0)) return 0;
    int factored = 0;
    for (double damp = damp0; damp <= 1.0; damp *= 10.0) {
        memcpy(A, Ct, dd * sizeof(double));
        for (int i = 0; i < d; i++) A[(size_t)i * d + i] += damp * tr / d;
        /* A singular metric (fewer calibration rows than head_dim) at a tiny feedback_damp fails the
         * factorization to rounding: more ridge, as for weights that are too large (it returned -1,
         * finalize's internal error, with feedback_damp 1e-30). */
        if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', d, A, d) || LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'U', d, A, d) ||
            LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', d, A, d))
            continue;
        factored = 1;
        int ok = 1;
        for (int j = 0; j < d && ok; j++)
            for (int k = j + 1; k < d; k++) {
                double v = A[(size_t)j * d + k] / A[(size_t)j * d + j];
                if (!(fabs(v) <= (double)OSCAR_FB_MAX)) {
                    ok = 0;
                    break;
                }
                F[(size_t)j * d + k] = (float)v;
            }
        if (ok) return 0;
        memset(F, 0, dd * sizeof(float)); /* more ridge: smaller weights */
    }
    return factored ? 0 : -1; /* nearest for this metric, or no ridge up to its mean eigenvalue factored it */
}


/* Ridges the layout without windows chooses from per (layer, K/V), on the probes. */
static const double k_damp_grid[] = {1e-3, 1e-2, 1e-1};
#define DAMP_GRID_N ((int)(sizeof k_damp_grid / sizeof k_damp_grid[0]))

/* Layer l's feedback weights (every rotation index with weights, Fp[which * nrot + r] != NULL) from
 * the kept metrics Mfs[which][r] at ridge damp_k (keys) and damp_v (values); the error set when a
 * Cholesky factor fails. */
static oscar_status layer_feedback(int d, int nrot, int l, oscar_params *p, const double *Mfs, const float *const *Fp,
                                   double damp_k, double damp_v, double *A) {
    const size_t dd = (size_t)d * (size_t)d;
    for (int which = 0; which < 2; which++)
        for (int r = 0; r < nrot; r++)
            if (Fp[(size_t)which * (size_t)nrot + (size_t)r] &&
                feedback_weights(d, Mfs + ((size_t)which * (size_t)nrot + (size_t)r) * dd,
                                 which == OSCAR_K ? damp_k : damp_v, A, oscar_params_fb_ptr(p, l, which, r)))
                return oscar_set_error(OSCAR_ERR_INTERNAL,
                                       "Cholesky factor of layer %d %c feedback metric failed: report this with the "
                                       "calibration data",
                                       l, which ? 'V' : 'K');
    return OSCAR_OK;
}

/* Context of one error evaluation on the held-back rows of a layer. */
typedef struct eval_ctx {
    const oscar_calib *c;
    int layer, which, nrot, lloyd_max;
    const float *const *R; /* [nrot] rotation per rotation index, NULL = identity */
    const double *const *Ct; /* [nrot] metric in rotated space, d x d */
    const float *const *F;   /* [nrot] error-feedback weights, or NULL: nearest */
    double *e, *f;          /* scratch [CHUNK_ROWS][d] */
    float *xr, *xq, *deq;   /* scratch [d] */
    float *rot_rows;        /* [cap][d] held-back rows rotated by R (computed once per R) */
    int rotated;            /* rot_rows valid for the current R */
    uint8_t *codes;         /* [d/4] */
    float *meta;            /* [2 * ng] */
    const float *clips;     /* [hkv] per-head ratios used instead of `clip` (>= 0), or NULL */
} eval_ctx;

/* Weighted sum over held-back rows of e^T Ct e, e = dequant(quant(x R)) - x R
 * with clip ratio `clip`; clip < 0 evaluates x^T Ct x instead (the scale the
 * relative errors are divided by). Weights: 1 for K; w / mean(w) of the row's
 * head for V. Returns the sum; *wsum gets the sum of weights. */
static double eval_error(eval_ctx *x, float clip, double *wsum) {
    const oscar_calib *c = x->c;
    const int d = c->d, l = x->layer;
    const int64_t nrows = c->res_seen[l] < c->cap ? c->res_seen[l] : c->cap;
    const float *rows = (x->which == OSCAR_K ? c->res_k : c->res_v) + (size_t)l * (size_t)c->cap * (size_t)d;
    double total = 0.0, wt_total = 0.0;
    /* Rotating is the costly part and the same for every clip ratio: once per R. */
    if (!x->rotated) {
        for (int64_t i = 0; i < nrows; i++) {
            const float *Ri = x->R[x->nrot > 1 ? c->res_h[(size_t)l * (size_t)c->cap + (size_t)i] : 0];
            float *dst = x->rot_rows + (size_t)i * (size_t)d;
            if (Ri)
                oscar_ref_rotate(d, rows + (size_t)i * (size_t)d, Ri, dst);
            else
                memcpy(dst, rows + (size_t)i * (size_t)d, (size_t)d * sizeof(float));
        }
        x->rotated = 1;
    }
    for (int r = 0; r < x->nrot; r++) {
        size_t nb = 0;
        double wts[CHUNK_ROWS > 256 ? 256 : CHUNK_ROWS];
        for (int64_t i = 0; i <= nrows; i++) {
            int flush = (i == nrows) || nb == sizeof wts / sizeof wts[0];
            if (flush && nb) {
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, d, d, 1.0, x->e, d, x->Ct[r], d, 0.0,
                            x->f, d);
                for (size_t b = 0; b < nb; b++) {
                    double s = 0.0;
                    for (int j = 0; j < d; j++) s += x->e[b * (size_t)d + (size_t)j] * x->f[b * (size_t)d + (size_t)j];
                    total += wts[b] * s;
                    wt_total += wts[b];
                }
                nb = 0;
            }
            if (i == nrows) break;
            size_t slot = (size_t)l * (size_t)c->cap + (size_t)i;
            int h = c->res_h[slot];
            if (x->nrot > 1 && h != r) continue;
            double w = 1.0;
            if (x->which == OSCAR_V) {
                double mean = c->sw[(size_t)l * (size_t)c->hkv + (size_t)h] / (double)c->n1[l];
                w = mean > 0.0 ? (double)c->res_w[slot] / mean : 0.0;
            }
            memcpy(x->xr, x->rot_rows + (size_t)i * (size_t)d, (size_t)d * sizeof(float));
            double *e = x->e + nb * (size_t)d;
            if (clip < 0.0f) {
                for (int j = 0; j < d; j++) e[j] = x->xr[j];
            } else {
                /* The cache quantizes the bf16-rounded rotated row. */
                for (int j = 0; j < d; j++) x->xq[j] = oscar_round_to(OSCAR_DTYPE_BF16, x->xr[j]);
                oscar_ref_quantize_row_fb(d, c->o.group, x->lloyd_max, x->clips ? x->clips[h] : clip, OSCAR_DTYPE_F16,
                                          x->xq, x->F ? x->F[r] : NULL, x->codes, x->meta);
                oscar_ref_dequantize_row(d, c->o.group, x->lloyd_max, x->codes, x->meta, x->deq);
                for (int j = 0; j < d; j++) e[j] = (double)x->deq[j] - (double)x->xr[j];
            }
            wts[nb++] = w;
        }
    }
    *wsum = wt_total;
    return total;
}

/* The row objective's clip: the grid from mild to harsh (ties keep the milder), or `fixed` when > 0. */
static void row_grid(eval_ctx *x, float fixed, float *best_c, double *best) {
    double wsum;
    *best_c = fixed > 0.0f ? fixed : 1.0f;
    *best = eval_error(x, *best_c, &wsum);
    for (int gi = 1; fixed <= 0.0f && gi < CLIP_GRID_N; gi++) {
        double err = eval_error(x, k_clip_grid[gi], &wsum);
        if (err < *best) {
            *best = err;
            *best_c = k_clip_grid[gi];
        }
    }
}

/* Ct = R^T C R (R fp32 row-major, NULL = identity). */
static void rotate_metric(int d, const double *C, const float *R, double *Rd, double *tmp, double *Ct) {
    if (!R) {
        memcpy(Ct, C, (size_t)d * (size_t)d * sizeof(double));
        return;
    }
    for (size_t i = 0; i < (size_t)d * (size_t)d; i++) Rd[i] = R[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, C, d, Rd, d, 0.0, tmp, d);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, d, 1.0, Rd, d, tmp, d, 0.0, Ct, d);
}

/* The probes of one layer under one rotation set: rotated, bf16-rounded keys
 * and values (as the cache stores them before quantizing), the same with the
 * 2-bit region [sink, t - recent] quantized, rotated queries and the exact
 * attention outputs. Scores and outputs do not depend on the rotation (it is
 * orthogonal), so everything is computed in the rotated space. */
typedef struct probe_set {
    const oscar_calib *c;
    int np, maxT;
    const probe **p; /* [np] */
    int *h;          /* [np] KV head */
    float **kr, **vr, **kq, **vq, **qr; /* [np] each */
    /* [np] each, [CLIP_GRID_N][rows]: clip threshold of every row of kr / vr at every grid ratio
     * (oscar_ref_clip_taus), so a grid scan selects each row's order statistics once, not per ratio */
    float **tk, **tv;
    double **o;      /* [np] exact outputs [nq][g][d] */
    float *S;        /* scratch [g][maxT] */
    float *ob;       /* scratch [g][d] */
    const double *const *om; /* [nrot] output metric in the rotated V space (value metric), or NULL: identity */
} probe_set;

static void probe_set_free(probe_set *ps) {
    for (int i = 0; i < ps->np; i++) {
        if (ps->kr) free(ps->kr[i]);
        if (ps->vr) free(ps->vr[i]);
        if (ps->kq) free(ps->kq[i]);
        if (ps->vq) free(ps->vq[i]);
        if (ps->qr) free(ps->qr[i]);
        if (ps->o) free(ps->o[i]);
        if (ps->tk) free(ps->tk[i]);
        if (ps->tv) free(ps->tv[i]);
    }
    free(ps->p);
    free(ps->h);
    free(ps->kr);
    free(ps->vr);
    free(ps->kq);
    free(ps->vq);
    free(ps->qr);
    free(ps->o);
    free(ps->tk);
    free(ps->tv);
    free(ps->S);
    free(ps->ob);
    memset(ps, 0, sizeof *ps);
}

/* Collects the complete probes of `layer`; 0 on success (np may be 0), -1 out of memory. */
static int probe_set_init(const oscar_calib *c, int layer, probe_set *ps) {
    memset(ps, 0, sizeof *ps);
    ps->c = c;
    const size_t cap = (size_t)c->hkv * (size_t)c->slots, d = (size_t)c->d, g = (size_t)c->g;
    ps->p = calloc(cap, sizeof *ps->p);
    ps->h = calloc(cap, sizeof *ps->h);
    if (!ps->p || !ps->h) return -1;
    for (size_t i = 0; i < cap; i++) {
        const probe *p = c->probes + (size_t)layer * cap + i;
        if (p->t < 0 || !p->k) continue;
        ps->p[ps->np] = p;
        ps->h[ps->np] = (int)(i / (size_t)c->slots);
        if (p->t + 1 > ps->maxT) ps->maxT = p->t + 1;
        ps->np++;
    }
    if (ps->np == 0) return 0;
    size_t np = (size_t)ps->np;
    ps->kr = calloc(np, sizeof(float *));
    ps->vr = calloc(np, sizeof(float *));
    ps->kq = calloc(np, sizeof(float *));
    ps->vq = calloc(np, sizeof(float *));
    ps->qr = calloc(np, sizeof(float *));
    ps->o = calloc(np, sizeof(double *));
    ps->tk = calloc(np, sizeof(float *));
    ps->tv = calloc(np, sizeof(float *));
    ps->S = malloc(g * (size_t)ps->maxT * sizeof(float));
    ps->ob = malloc(g * d * sizeof(float));
    if (!ps->kr || !ps->vr || !ps->kq || !ps->vq || !ps->qr || !ps->o || !ps->tk || !ps->tv || !ps->S || !ps->ob)
        return -1;
    for (size_t i = 0; i < np; i++) {
        size_t rows = (size_t)ps->p[i]->t + 1;
        ps->kr[i] = malloc(rows * d * sizeof(float));
        ps->vr[i] = malloc(rows * d * sizeof(float));
        ps->kq[i] = malloc(rows * d * sizeof(float));
        ps->vq[i] = malloc(rows * d * sizeof(float));
        const size_t nq = (size_t)ps->p[i]->nq;
        ps->qr[i] = malloc(nq * g * d * sizeof(float));
        ps->o[i] = malloc(nq * g * d * sizeof(double));
        ps->tk[i] = malloc(rows * CLIP_GRID_N * sizeof(float));
        ps->tv[i] = malloc(rows * CLIP_GRID_N * sizeof(float));
        if (!ps->kr[i] || !ps->vr[i] || !ps->kq[i] || !ps->vq[i] || !ps->qr[i] || !ps->o[i] || !ps->tk[i] ||
            !ps->tv[i])
            return -1;
    }
    return 0;
}

/* y = bf16(x R) row by row (R NULL: identity), rows x d. */
static void rotate_rows(int d, size_t rows, const float *x, const float *R, int round_bf16, float *y) {
    if (R)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, d, d, 1.0f, x, d, R, d, 0.0f, y, d);
    else
        memcpy(y, x, rows * (size_t)d * sizeof(float));
    if (round_bf16)
        for (size_t i = 0; i < rows * (size_t)d; i++) y[i] = oscar_round_to(OSCAR_DTYPE_BF16, y[i]);
}

/* Rows [sink, t - recent] of probe i: the 2-bit region of its last position, the rows quantized. */
static void probe_region(const probe_set *ps, int i, int *lo, int *n) {
    *lo = ps->c->o.sink;
    *n = ps->p[i]->t - ps->c->o.recent - *lo + 1;
}

typedef struct tau_job {
    probe_set *ps;
    int which;
} tau_job;

/* The grid thresholds of a share of every probe's quantized rows (K or V). */
static void tau_rows(void *arg, int part, int parts) {
    const tau_job *j = arg;
    probe_set *ps = j->ps;
    const int d = ps->c->d;
    float t[CLIP_GRID_N];
    for (int i = 0; i < ps->np; i++) {
        int lo, n;
        probe_region(ps, i, &lo, &n);
        if (n <= 0) continue;
        const size_t rows = (size_t)ps->p[i]->t + 1;
        const float *x = j->which == OSCAR_K ? ps->kr[i] : ps->vr[i];
        float *tau = j->which == OSCAR_K ? ps->tk[i] : ps->tv[i];
        const int r0 = lo + (int)((int64_t)n * part / parts), r1 = lo + (int)((int64_t)n * (part + 1) / parts);
        for (int r = r0; r < r1; r++) {
            oscar_ref_clip_taus(d, x + (size_t)r * (size_t)d, CLIP_GRID_N, k_clip_grid, t);
            for (int gi = 0; gi < CLIP_GRID_N; gi++) tau[(size_t)gi * rows + (size_t)r] = t[gi];
        }
    }
}

/* Rotates the probes' keys and queries (which == K) or values (V) by the
 * rotation set R[nrot] (R[r] NULL: identity); the quantized copy starts exact.
 * taus: also fill the rows' grid thresholds (needed where clips < 1 are tried). */
static void probe_set_rotate(probe_set *ps, int which, const float *const *R, int nrot, int taus) {
    const oscar_calib *c = ps->c;
    const int d = c->d;
    for (int i = 0; i < ps->np; i++) {
        const float *Ri = R[nrot > 1 ? ps->h[i] : 0];
        size_t rows = (size_t)ps->p[i]->t + 1;
        if (which == OSCAR_K) {
            rotate_rows(d, rows, ps->p[i]->k, Ri, 1, ps->kr[i]);
            rotate_rows(d, (size_t)ps->p[i]->nq * (size_t)c->g, ps->p[i]->q, Ri, 0, ps->qr[i]);
            memcpy(ps->kq[i], ps->kr[i], rows * (size_t)d * sizeof(float));
        } else {
            rotate_rows(d, rows, ps->p[i]->v, Ri, 1, ps->vr[i]);
            memcpy(ps->vq[i], ps->vr[i], rows * (size_t)d * sizeof(float));
        }
    }
    if (!taus) return;
    tau_job tj = {.ps = ps, .which = which};
    parallel_parts(c->o.threads, tau_rows, &tj);
}

/* probe_set_quantize's arguments; part `part` of `parts` quantizes that share of every selected probe's rows. */
typedef struct quant_job {
    probe_set *ps;
    int which, head, lloyd_max, copies, bits;
    float clip;
    const float *const *F;
} quant_job;

/* Rows coded per oscar_ref_quantize_rows_wide call in quant_rows. */
#define QUANT_BLOCK 64

static void quant_rows(void *arg, int part, int parts) {
    const quant_job *j = arg;
    probe_set *ps = j->ps;
    const oscar_calib *c = ps->c;
    const int d = c->d, ng = d / c->o.group;
    uint8_t codes[QUANT_BLOCK * 64], hi[QUANT_BLOCK * 32]; /* d / 4 and d / 8 per row, d <= 256 */
    float meta[QUANT_BLOCK * 2 * 8];                          /* two per group, at most 8 groups */
    /* The grid ratio's column of the threshold cache, or -1: thresholds from the ratio. */
    int gi = -1;
    for (int g = 0; j->clip < 1.0f && g < CLIP_GRID_N && gi < 0; g++)
        if (k_clip_grid[g] == j->clip) gi = g;
    for (int i = 0; i < ps->np; i++) {
        if ((ps->p[i]->period != 0) != j->copies) continue; /* copies 0: text probes, 1: copy probes */
        if (j->head >= 0 && ps->h[i] != j->head) continue;
        const float *src = j->which == OSCAR_K ? ps->kr[i] : ps->vr[i];
        float *dst = j->which == OSCAR_K ? ps->kq[i] : ps->vq[i];
        const float *tau = gi < 0 ? NULL
                                  : (j->which == OSCAR_K ? ps->tk[i] : ps->tv[i]) +
                                        (size_t)gi * ((size_t)ps->p[i]->t + 1);
        const float *Fi = j->F ? j->F[c->o.per_head ? ps->h[i] : 0] : NULL;
        int lo, n;
        probe_region(ps, i, &lo, &n);
        if (n <= 0) continue;
        const int r0 = lo + (int)((int64_t)n * part / parts), r1 = lo + (int)((int64_t)n * (part + 1) / parts);
        for (int r = r0; r < r1; r += QUANT_BLOCK) {
            const int m = r1 - r < QUANT_BLOCK ? r1 - r : QUANT_BLOCK;
            oscar_ref_quantize_rows_wide(m, d, c->o.group, j->bits, j->lloyd_max, j->clip, tau ? tau + r : NULL,
                                         OSCAR_DTYPE_F16, src + (size_t)r * (size_t)d, Fi, codes, hi, meta);
            for (int a = 0; a < m; a++)
                oscar_ref_dequantize_row_wide(d, c->o.group, j->bits, j->lloyd_max, codes + (size_t)a * (size_t)d / 4,
                                              hi + (size_t)a * (size_t)d / 8, meta + (size_t)a * 2 * (size_t)ng,
                                              dst + (size_t)(r + a) * (size_t)d);
        }
    }
}

/* Quantizes the 2-bit region [sink, t - recent] of the K or V rows of every
 * probe of KV head `head` (-1: every head) with clip ratio `clip`, as the
 * cache does (group, fp16 metadata). Rows are independent: options.threads
 * workers take a contiguous share of each probe's rows. */
static void probe_set_quantize_bits(probe_set *ps, int which, int head, int bits, float clip, int lloyd_max,
                                    const float *const *F, int copies) {
    quant_job j = {.ps = ps, .which = which, .head = head, .lloyd_max = lloyd_max, .copies = copies, .clip = clip,
                   .F = F, .bits = bits};
    parallel_parts(ps->c->o.threads, quant_rows, &j);
}
static void probe_set_quantize(probe_set *ps, int which, int head, float clip, int lloyd_max, const float *const *F,
                               int copies) {
    probe_set_quantize_bits(ps, which, head, 2, clip, lloyd_max, F, copies);
}

/* Text-probe query evaluations of KV head `head` (the count the error sums run over). */
static int probe_set_queries(const probe_set *ps, int head) {
    int n = 0;
    for (int i = 0; i < ps->np; i++)
        if (!ps->p[i]->period && ps->h[i] == head) n += ps->p[i]->nq;
    return n;
}

/* softmax(q K^T / sqrt(d)) V for the g queries at position a of probe i
 * into ps->ob, with the quantized keys (qk) and/or values (qv) read in the
 * 2-bit region of that position, [sink, tq[a] - recent], the exact rows
 * elsewhere. The quantized copies hold the region of the probe's last
 * position t; an earlier position reads the rows after its own region
 * exact. */
static void probe_attend(probe_set *ps, int i, int a, int qk, int qv) {
    const probe *p = ps->p[i];
    const int d = ps->c->d, g = ps->c->g, T = p->tq[a] + 1;
    const float *K = qk ? ps->kq[i] : ps->kr[i], *V = qv ? ps->vq[i] : ps->vr[i];
    const float *q = ps->qr[i] + (size_t)a * (size_t)g * (size_t)d;
    const float scale = (float)(1.0 / sqrt((double)d));
    /* First row after position a's 2-bit region that the quantized copies may still hold. */
    int x = p->tq[a] - ps->c->o.recent + 1;
    if (x < ps->c->o.sink) x = ps->c->o.sink;
    const int tail = T < p->t + 1 && x < T; /* an earlier position with rows to read exact */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, T, d, scale, q, d, K, d, 0.0f, ps->S, T);
    if (tail && qk)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g, T - x, d, scale, q, d, ps->kr[i] + (size_t)x * d, d,
                    0.0f, ps->S + x, T);
    for (int j = 0; j < g; j++) {
        float *s = ps->S + (size_t)j * (size_t)T;
        float m = s[0];
        for (int r = 1; r < T; r++) m = s[r] > m ? s[r] : m;
        double z = 0.0;
        for (int r = 0; r < T; r++) z += exp((double)s[r] - (double)m);
        for (int r = 0; r < T; r++) s[r] = (float)(exp((double)s[r] - (double)m) / z);
    }
    if (tail && qv) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g, d, x, 1.0f, ps->S, T, V, d, 0.0f, ps->ob, d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g, d, T - x, 1.0f, ps->S + x, T,
                    ps->vr[i] + (size_t)x * d, d, x > 0 ? 1.0f : 0.0f, ps->ob, d);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g, d, T, 1.0f, ps->S, T, V, d, 0.0f, ps->ob, d);
    }
}

/* Exact outputs from the rotated bf16 rows (after rotating both K and V). */
static void probe_set_exact(probe_set *ps) {
    const size_t gd = (size_t)ps->c->g * (size_t)ps->c->d;
    for (int i = 0; i < ps->np; i++)
        for (int a = 0; a < ps->p[i]->nq; a++) {
            probe_attend(ps, i, a, 0, 0);
            for (size_t e = 0; e < gd; e++) ps->o[i][(size_t)a * gd + e] = ps->ob[e];
        }
}

/* sum ||o^ - o||^2 / sum ||o||^2 over the probes of KV head `head` (-1:
 * every head) and their query heads, with the quantized K (qk) and/or V (qv)
 * rows. A head's probes attend to its own rows only: the heads' errors add. */
static double probe_set_error_nd(probe_set *ps, int head, int qk, int qv, double *num_out, double *den_out) {
    const int d = ps->c->d, g = ps->c->g;
    const size_t gd = (size_t)g * (size_t)d;
    double num = 0.0, den = 0.0;
    for (int i = 0; i < ps->np; i++) {
        if (ps->p[i]->period) continue; /* copy probes constrain c_K (probe_set_copy_mass), not the error */
        if (head >= 0 && ps->h[i] != head) continue;
        for (int qa = 0; qa < ps->p[i]->nq; qa++) {
            probe_attend(ps, i, qa, qk, qv);
            const double *M = ps->om ? ps->om[ps->c->o.per_head ? ps->h[i] : 0] : NULL;
            const double *oi = ps->o[i] + (size_t)qa * gd;
            if (!M) {
                for (size_t e = 0; e < gd; e++) {
                    double diff = (double)ps->ob[e] - oi[e];
                    num += diff * diff;
                    den += oi[e] * oi[e];
                }
                continue;
            }
            /* As the output projection sees it: e^T M e per query head. */
            for (int j = 0; j < g; j++) {
                const float *ob = ps->ob + (size_t)j * (size_t)d;
                const double *o = oi + (size_t)j * (size_t)d;
                for (int a = 0; a < d; a++) {
                    double ea = (double)ob[a] - o[a], ma = 0.0, mo = 0.0;
                    for (int b = 0; b < d; b++) {
                        ma += M[(size_t)a * d + b] * ((double)ob[b] - o[b]);
                        mo += M[(size_t)a * d + b] * o[b];
                    }
                    num += ea * ma;
                    den += o[a] * mo;
                }
            }
        }
    }
    *num_out = num;
    *den_out = den;
    return den > 0.0 ? num / den : 0.0;
}
static double probe_set_error(probe_set *ps, int head, int qk, int qv) {
    double num, den;
    return probe_set_error_nd(ps, head, qk, qv, &num, &den);
}

/* Mean attention weight the copy probes' queries (of KV head `head`, -1:
 * every head) put on their source key (position t + 1 - period), with exact
 * (qk 0) or quantized (qk 1) keys; 0 when there are no such probes (*count 0). */
static double probe_set_copy_mass(probe_set *ps, int head, int qk, int *count) {
    const int g = ps->c->g;
    double sum = 0.0;
    int cnt = 0;
    for (int i = 0; i < ps->np; i++) {
        const probe *p = ps->p[i];
        if (!p->period || (head >= 0 && ps->h[i] != head)) continue;
        probe_attend(ps, i, 0, qk, 0); /* a copy probe has one query position, t */
        const int T = p->t + 1, src = p->t + 1 - p->period;
        for (int j = 0; j < g; j++, cnt++) sum += ps->S[(size_t)j * (size_t)T + (size_t)src];
    }
    *count = cnt;
    return cnt ? sum / cnt : 0.0;
}

/* Rotation set s (0 none, 1 Hadamard, 2 OSCAR) of (layer, which) as nrot pointers. */
static void rotation_set(const oscar_params *p, int layer, int which, int s, int nrot, const float *H,
                         const float **out) {
    for (int r = 0; r < nrot; r++)
        out[r] = s == 0 ? NULL : s == 1 ? H : oscar_params_rot_ptr(p, layer, which, r);
}

/* Probe objective of one layer: fits each KV head's c_K with V exact, then
 * its c_V with K quantized at the heads' c_K (fixed ratios are kept), and
 * fills the attention report. A head's probes read only its own rows, so the
 * layer's error is the sum of the heads' and each head's ratio is fitted on
 * its own probes (a head without probes keeps the mildest ratio tried).
 * fix_k / fix_v > 0 are used as they are (fixed ratios, or the row
 * objective's choice when only the report is wanted).
 * clip_k, clip_v: [num_kv_heads] out.
 * Returns 0, or -1 out of memory; *fitted is 1 when the layer has probes. */
static int probe_fit_layer(oscar_calib *c, const oscar_params *p, int layer, const float *H, const float **Rk,
                           const float **Rv, const float *const *Fk, const float *const *Fv, float fix_k, float fix_v,
                           float *clip_k, float *clip_v, int quick, int *fitted) {
    probe_set ps;
    *fitted = 0;
    oscar_calib_attn_report *rep = c->attn + layer;
    memset(rep, 0, sizeof *rep);
    if (probe_set_init(c, layer, &ps)) {
        probe_set_free(&ps);
        return -1;
    }
    rep->probes = ps.np;
    if (ps.np == 0) {
        probe_set_free(&ps);
        return 0;
    }
    const int nrot = c->o.per_head ? c->hkv : 1, lm = c->o.method == OSCAR_METHOD_OSCAR2_LM;
    /* With a value metric the outputs are compared as the output projection
     * sees them (in each rotation set's V space). */
    const size_t dd = c->dd;
    double *omb = NULL, *mscr = NULL;
    const double **omp = NULL;
    if (c->vmetric) {
        omb = malloc((size_t)nrot * dd * sizeof(double));
        mscr = malloc(3 * dd * sizeof(double));
        omp = calloc((size_t)nrot, sizeof *omp);
        if (!omb || !mscr || !omp) {
            free(omb);
            free(mscr);
            free(omp);
            probe_set_free(&ps);
            return -1;
        }
    }
    /* quick: only the OSCAR set's clip fit (no none / Hadamard errors, no code-width scores) */
    for (int s = quick ? 2 : 0; s < 3; s++) {
        rotation_set(p, layer, OSCAR_K, s, nrot, H, Rk);
        rotation_set(p, layer, OSCAR_V, s, nrot, H, Rv);
        ps.om = NULL;
        for (int r = 0; omb && r < nrot; r++) {
            omp[r] = NULL;
            if (!value_metric(c, layer, r, mscr)) continue;
            rotate_metric(c->d, mscr, Rv[r], mscr + dd, mscr + 2 * dd, omb + (size_t)r * dd);
            omp[r] = omb + (size_t)r * dd;
            ps.om = omp;
        }
        probe_set_rotate(&ps, OSCAR_K, Rk, nrot, s == 2); /* s < 2: none and Hadamard, at clip 1 */
        probe_set_rotate(&ps, OSCAR_V, Rv, nrot, s == 2);
        probe_set_exact(&ps);
        if (s < 2) {
            probe_set_quantize(&ps, OSCAR_K, -1, 1.0f, 0, NULL, 0);
            probe_set_quantize(&ps, OSCAR_V, -1, 1.0f, 0, NULL, 0);
            rep->err_k[s] = probe_set_error(&ps, -1, 1, 0);
            rep->err_v[s] = probe_set_error(&ps, -1, 0, 1);
            rep->err_kv[s] = probe_set_error(&ps, -1, 1, 1);
            continue;
        }
        /* Copy probes: a key clip may cost a head's copy queries at most copy_mass_loss of the
         * attention weight on their source (mean over its copy probes' query heads); the K scan
         * stops at the first clip that would win on the attention error but breaks that bound. */
        int ncq = 0;
        copy_report *cr = c->copy + layer;
        cr->mass[0] = probe_set_copy_mass(&ps, -1, 0, &ncq);
        cr->probes = ncq / c->g;
        cr->clip_free = 0.0f;
        double sum_num[2] = {0.0, 0.0}, sum_den[2] = {0.0, 0.0}; /* heads' errors at their chosen ratios */
        for (int which = 0; which < 2; which++) {
            const float fixed = which == OSCAR_K ? fix_k : fix_v;
            const float *const *Fw = which == OSCAR_K ? Fk : Fv;
            float *clip_out = which == OSCAR_K ? clip_k : clip_v;
            /* Per head: each head on its probes; per layer (clip_per_head 0): one fit over all (h -1). */
            const int per_head_clips = c->o.clip_per_head != 0;
            for (int hh = 0; hh < (per_head_clips ? c->hkv : 1); hh++) {
                const int h = per_head_clips ? hh : -1;
                float best_c = fixed > 0.0f ? fixed : 1.0f;
                int nch = 0;
                const double m0 = which == OSCAR_K ? probe_set_copy_mass(&ps, h, 0, &nch) : 0.0;
                const int constrain = nch > 0 && c->o.copy_head_mass <= 0.0f; /* copy heads: no bound */
                probe_set_quantize(&ps, which, h, best_c, lm, Fw, 0);
                /* err/num/den of grid point gi (gi 0: best_c, the fixed ratio or 1) for gi < ng. */
                double errs[CLIP_GRID_N], nums[CLIP_GRID_N], dens[CLIP_GRID_N];
                errs[0] = probe_set_error_nd(&ps, h, 1, which == OSCAR_V, &nums[0], &dens[0]);
                double best = errs[0], free_best = best;
                float free_c = best_c;
                int ng = 1;
                if (constrain) probe_set_quantize(&ps, which, h, best_c, lm, Fw, 1);
                for (int gi = 1; fixed <= 0.0f && gi < CLIP_GRID_N; gi++) {
                    probe_set_quantize(&ps, which, h, k_clip_grid[gi], lm, Fw, 0);
                    double err = probe_set_error_nd(&ps, h, 1, which == OSCAR_V, &nums[gi], &dens[gi]);
                    if (err < free_best) {
                        free_best = err;
                        free_c = k_clip_grid[gi];
                    }
                    if (err < best && constrain) { /* copies are quantized only for a clip that would win */
                        probe_set_quantize(&ps, which, h, k_clip_grid[gi], lm, Fw, 1);
                        /* The scan goes from mild to harsh: the first winning clip that breaks the
                         * bound ends it, so the bound never picks a clip harsher than the error alone. */
                        if (m0 - probe_set_copy_mass(&ps, h, 1, &nch) > (double)c->o.copy_mass_loss) break;
                    }
                    errs[gi] = err;
                    ng = gi + 1;
                    if (err < best) best = err;
                }
                /* The mildest ratio within clip_margin of the smallest error (margin 0: the smallest
                 * error, ties keeping the milder ratio). */
                int bi = 0;
                while (errs[bi] > best * (1.0 + (double)c->o.clip_margin) && bi + 1 < ng) bi++;
                if (bi > 0) best_c = k_clip_grid[bi];
                const double best_num = nums[bi], best_den = dens[bi];
                sum_num[which] += best_num;
                sum_den[which] += best_den;
                if (which == OSCAR_K && free_c > cr->clip_free) cr->clip_free = free_c;
                probe_set_quantize(&ps, which, h, best_c, lm, Fw, 0); /* K stays at c_K while V is fitted */
                if (constrain) probe_set_quantize(&ps, which, h, best_c, lm, Fw, 1);
                for (int g = 0; g < c->hkv; g++)
                    if (h < 0 || g == h) clip_out[g] = best_c;
            }
            /* Copy heads (copy_head_mass > 0): a head whose copy queries put at least that mean
             * weight on their source (exact keys) keeps its keys clipped no harsher than
             * copy_head_clip; its keys are requantized there before the values are fitted. */
            int floored = 0;
            for (int h = 0; which == OSCAR_K && c->o.copy_head_mass > 0.0f && fixed <= 0.0f && h < c->hkv; h++) {
                int nch = 0;
                const double m = probe_set_copy_mass(&ps, h, 0, &nch);
                if (nch == 0 || m < (double)c->o.copy_head_mass || clip_out[h] >= c->o.copy_head_clip) continue;
                clip_out[h] = c->o.copy_head_clip;
                probe_set_quantize(&ps, OSCAR_K, h, clip_out[h], lm, Fw, 0);
                floored = 1;
            }
            if (floored) /* the layer's K report at the heads' ratios (V exact) */
                (void)probe_set_error_nd(&ps, -1, 1, 0, &sum_num[0], &sum_den[0]);
        }
        /* The layer's report at the chosen ratios; copy mass at the mildest ratio tried. */
        rep->err_k[2] = sum_den[0] > 0.0 ? sum_num[0] / sum_den[0] : 0.0; /* K at c_K, V exact */
        rep->err_kv[2] = sum_den[1] > 0.0 ? sum_num[1] / sum_den[1] : 0.0; /* both at their ratios */
        rep->err_v[2] = probe_set_error(&ps, -1, 0, 1);
        oscar_calib_head_copy_report *hcr = c->head_copy + (size_t)layer * (size_t)c->hkv;
        memset(hcr, 0, (size_t)c->hkv * sizeof *hcr);
        if (ncq > 0) {
            for (int h = 0; h < c->hkv; h++) probe_set_quantize(&ps, OSCAR_K, h, clip_k[h], lm, Fk, 1);
            cr->mass[2] = probe_set_copy_mass(&ps, -1, 1, &ncq);
            for (int h = 0; h < c->hkv; h++) {
                int nch = 0;
                hcr[h].clip_k = clip_k[h];
                hcr[h].mass[0] = probe_set_copy_mass(&ps, h, 0, &nch);
                hcr[h].mass[2] = probe_set_copy_mass(&ps, h, 1, &nch);
                hcr[h].probes = nch / c->g;
                hcr[h].copy_head =
                    nch > 0 && c->o.copy_head_mass > 0.0f && hcr[h].mass[0] >= (double)c->o.copy_head_mass;
            }
            probe_set_quantize(&ps, OSCAR_K, -1, fix_k > 0.0f ? fix_k : 1.0f, lm, Fk, 1);
            cr->mass[1] = probe_set_copy_mass(&ps, -1, 1, &ncq);
            for (int h = 0; h < c->hkv; h++) {
                int nch = 0;
                hcr[h].mass[1] = probe_set_copy_mass(&ps, h, 1, &nch);
            }
        }
        /* Code widths (docs/eval/retrieval.md, ninth step): each head-tensor's share of the probe
         * error, alone (the other tensor exact), at 2 bits and its chosen ratio, then at 3 bits
         * unclipped. Absolute errors in the output metric, per query evaluation, so that layers
         * compare. Last: the copies' quantized rows are not read after this. */
        if (!lm && !quick)
            for (int h = 0; h < c->hkv; h++) {
                const int nqh = probe_set_queries(&ps, h);
                for (int which = 0; which < 2; which++) {
                    width_report *wr = c->width + ((size_t)layer * (size_t)c->hkv + (size_t)h) * 2 + (size_t)which;
                    const float *const *Fw = which == OSCAR_K ? Fk : Fv;
                    double num, den;
                    probe_set_quantize(&ps, which, h, which == OSCAR_K ? clip_k[h] : clip_v[h], 0, Fw, 0);
                    probe_set_error_nd(&ps, h, which == OSCAR_K, which == OSCAR_V, &num, &den);
                    wr->err2 = nqh ? num / nqh : 0.0;
                    wr->norm = nqh ? den / nqh : 0.0;
                    probe_set_quantize_bits(&ps, which, h, 3, 1.0f, 0, Fw, 0);
                    probe_set_error_nd(&ps, h, which == OSCAR_K, which == OSCAR_V, &num, &den);
                    wr->err3 = nqh ? num / nqh : 0.0;
                    probe_set_quantize(&ps, which, h, which == OSCAR_K ? clip_k[h] : clip_v[h], 0, Fw, 0);
                }
            }
    }
    probe_set_free(&ps);
    free(omb);
    free(mscr);
    free(omp);
    *fitted = 1;
    return 0;
}

/* The code-width rule (docs/eval/retrieval.md, ninth step): head-tensors ranked by what 3 bits
 * buy on the probes (err2 - err3, absolute, in the output metric), widened best first while the
 * bits per element they add, 1 / (2 L Hkv) each, stay within options.wide_bits; a widened
 * tensor is stored unclipped (the eighth step: at 3 bits the clip costs retrieval). */
static void choose_widths(oscar_calib *c, oscar_params *p) {
    const size_t n = (size_t)c->L * (size_t)c->hkv * 2;
    const double each = 1.0 / (double)n;
    int taken = 0;
    for (;;) {
        size_t best = n;
        double gain = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double g = c->width[i].err2 - c->width[i].err3;
            if (!c->width[i].wide && g > gain) {
                gain = g;
                best = i;
            }
        }
        if (best == n || (double)(taken + 1) * each > (double)c->o.wide_bits + 1e-9) break;
        const int l = (int)(best / 2 / (size_t)c->hkv), h = (int)(best / 2 % (size_t)c->hkv), w = (int)(best % 2);
        c->width[best].wide = 1;
        taken++;
        /* Both calls are valid by construction (oscar2 parameters, indices in range). */
        (void)oscar_params_set_code_bits(p, l, h, (oscar_kv)w, 3);
        *oscar_params_clip_ptr(p, l, h, w) = 1.0f;
    }
}

OSCAR_API oscar_status oscar_calib_width_report_get(const oscar_calib *c, int layer, int kv_head, oscar_kv which,
                                                    oscar_calib_width_report *out) {
    oscar_clear_error();
    if (!c || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_width_report_get: NULL argument");
    if (layer < 0 || layer >= c->L || kv_head < 0 || kv_head >= c->hkv || (which != OSCAR_K && which != OSCAR_V))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_calib_width_report_get: layer %d / kv_head %d / which %d out of range ([0, %d), "
                               "[0, %d), K or V)", layer, kv_head, (int)which, c->L, c->hkv);
    if (c->state != STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE, "the width report exists after oscar_calib_finalize: finalize first");
    *out = c->width[((size_t)layer * (size_t)c->hkv + (size_t)kv_head) * 2 + (size_t)which];
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_finalize(oscar_calib *c, oscar_params **out) {
    oscar_clear_error();
    if (!c || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_finalize: NULL argument");
    *out = NULL;
    if (c->state != STATE_PASS1)
        return oscar_set_error(OSCAR_ERR_STATE, c->state == STATE_FINAL
                                                    ? "oscar_calib_finalize was already called: parameters were returned then"
                                                    : "finalize needs both passes: begin pass 0, feed, begin pass 1, feed "
                                                      "the same tokens, then finalize");
    for (int l = 0; l < c->L; l++)
        if (c->n1[l] != c->n0[l])
            return oscar_set_error(OSCAR_ERR_STATE,
                                   "layer %d got %lld tokens in pass 0 but %lld in pass 1: feed the same windows in "
                                   "both passes",
                                   l, (long long)c->n0[l], (long long)c->n1[l]);
    const int d = c->d, L = c->L, nrot = c->o.per_head ? c->hkv : 1;
    const size_t dd = c->dd;
    oscar_params *p = NULL;
    oscar_status s = oscar_params_alloc(L, c->hq, c->hkv, d, c->o.per_head, &p);
    if (s) return s;
    p->method = c->o.method;
    p->identity = 0;
    p->group = c->o.group;
    p->sink = c->o.sink; /* the windows the clips are fitted for (recorded, not enforced: runtime/plan.c) */
    p->recent = c->o.recent;
    p->calib_tokens = c->n0[0] > INT32_MAX ? INT32_MAX : (int32_t)c->n0[0];
    memcpy(p->model_hash, c->model_hash, sizeof p->model_hash);
    snprintf(p->composition, sizeof p->composition, "U.H.P");
    p->eig = malloc((size_t)L * 2 * (size_t)nrot * (size_t)d * sizeof(double));
    /* Per layer and kind: targets, metrics and scratch for every rotation index. */
    double *C = malloc((size_t)nrot * dd * sizeof(double)), *A = malloc(dd * sizeof(double)),
           *U = malloc(dd * sizeof(double)), *lam = malloc((size_t)d * sizeof(double)),
           *Ct = malloc(6 * (size_t)nrot * dd * sizeof(double)), *Rd = malloc(dd * sizeof(double)),
           *tmp = malloc(dd * sizeof(double)), *e = malloc((size_t)256 * (size_t)d * sizeof(double)),
           *f = malloc((size_t)256 * (size_t)d * sizeof(double));
    float *H = malloc(dd * sizeof(float)), *fs = malloc(4 * (size_t)d * sizeof(float)),
          *rot_rows = malloc(2 * (size_t)c->cap * (size_t)d * sizeof(float));
    uint8_t *codes = malloc((size_t)d / 4);
    float *head_clips = malloc(2 * (size_t)c->hkv * sizeof(float)); /* one layer's fitted ratios */
    const float **Rp = malloc(6 * (size_t)nrot * sizeof(float *));
    const double **Cp = malloc(6 * (size_t)nrot * sizeof(double *));
    const float **Rpr = malloc(2 * (size_t)nrot * sizeof(float *)); /* probe rotation sets (K, V) */
    const float **Fp = calloc(2 * (size_t)nrot, sizeof(float *));   /* feedback weights (K, V), NULL: nearest */
    double *Mv = malloc(dd * sizeof(double));
    /* Without windows (sink 0, recent 0) and feedback_damp 0 (default) the ridge of each (layer, K/V)
     * is chosen on the probes from damp_grid (docs/EVAL.md, "s0w0, issue 16, seventeenth session");
     * the metrics are kept so the weights can be recomputed at each ridge. */
    const int damp_auto = c->o.feedback_damp == 0.0f && c->o.sink == 0 && c->o.recent == 0 && c->o.rounding &&
                          c->o.clip_objective == 0;
    double *Mfs = damp_auto ? malloc(2 * (size_t)nrot * dd * sizeof(double)) : NULL;
    if (c->o.rounding) p->fb = calloc((size_t)L * 2 * (size_t)nrot * dd, sizeof(float));
    if (!p->eig || !C || !A || !U || !lam || !Ct || !Rd || !tmp || !e || !f || !H || !fs || !rot_rows || !codes || !Rp ||
        !head_clips || !Cp || !Rpr || !Fp || !Mv || (c->o.rounding && !p->fb) || (damp_auto && !Mfs)) {
        s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory finalizing the calibration");
        goto done;
    }
    oscar_ref_hadamard(d, H);
    const double fb_damp = c->o.feedback_damp > 0.0f ? (double)c->o.feedback_damp : FB_DAMP;
    for (int l = 0; l < L; l++) {
        if (c->o.progress) c->o.progress(c->o.progress_user, "eigendecomposition", l, L);
        for (int which = 0; which < 2; which++) {
            for (int r = 0; r < nrot; r++) {
                double *Cr = C + (size_t)r * dd;
                target(c, l, which, r, Cr);
                memcpy(A, Cr, dd * sizeof(double));
                lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', d, A, d, lam);
                if (info != 0) {
                    s = oscar_set_error(OSCAR_ERR_INTERNAL,
                                        "eigendecomposition of layer %d %c target failed (LAPACK info %d)", l,
                                        which ? 'V' : 'K', (int)info);
                    goto done;
                }
                /* LAPACK sorts ascending; rank 0 must be the largest. */
                double *ev = oscar_params_eig_ptr(p, l, which, r);
                for (int k = 0; k < d; k++) {
                    ev[k] = lam[d - 1 - k];
                    for (int i = 0; i < d; i++) U[i * d + k] = A[i * d + (d - 1 - k)];
                }
                float *R = oscar_params_rot_ptr(p, l, which, r);
                if (c->o.permutation == 0) oscar_ref_compose_rotation(d, U, R); /* published */
                else oscar_ref_compose_rotation_perm(d, U, c->o.permutation, R);
                double oe = oscar_ref_orthogonality_error(d, R, INFINITY);
                if (!(oe <= 1e-4)) {
                    s = oscar_set_error(OSCAR_ERR_INTERNAL,
                                        "rotation of layer %d %c is not orthogonal after fp32 storage (max |R R^T - I| "
                                        "= %g): report this with the calibration data",
                                        l, which ? 'V' : 'K', oe);
                    goto done;
                }
                /* Metrics: [0] none, [1] Hadamard, [2] OSCAR, per kind. */
                double *Ctw = Ct + (size_t)which * 3 * (size_t)nrot * dd;
                const float **Rpw = Rp + (size_t)which * 3 * (size_t)nrot;
                const double **Cpw = Cp + (size_t)which * 3 * (size_t)nrot;
                rotate_metric(d, Cr, NULL, Rd, tmp, Ctw + (size_t)(0 * nrot + r) * dd);
                rotate_metric(d, Cr, H, Rd, tmp, Ctw + (size_t)(1 * nrot + r) * dd);
                rotate_metric(d, Cr, R, Rd, tmp, Ctw + (size_t)(2 * nrot + r) * dd);
                Rpw[0 * nrot + r] = NULL;
                Rpw[1 * nrot + r] = H;
                Rpw[2 * nrot + r] = R;
                for (int v = 0; v < 3; v++) Cpw[v * nrot + r] = Ctw + (size_t)(v * nrot + r) * dd;
                /* Feedback metric: keys the OSCAR metric R^T C_K R; values R^T M R of the
                 * caller's value metric (none: nearest). */
                if (!p->fb) continue;
                const double *Mf = NULL;
                if (which == OSCAR_K) {
                    Mf = Ctw + (size_t)(2 * nrot + r) * dd;
                } else if (value_metric(c, l, r, tmp)) {
                    rotate_metric(d, tmp, R, Rd, A, Mv);
                    Mf = Mv;
                }
                float *F = oscar_params_fb_ptr(p, l, which, r);
                if (Mf && feedback_weights(d, Mf, fb_damp, A, F)) {
                    s = oscar_set_error(OSCAR_ERR_INTERNAL,
                                        "Cholesky factor of layer %d %c feedback metric failed: report this with the "
                                        "calibration data",
                                        l, which ? 'V' : 'K');
                    goto done;
                }
                Fp[(size_t)which * (size_t)nrot + (size_t)r] = Mf ? F : NULL;
                if (Mfs && Mf) memcpy(Mfs + ((size_t)which * (size_t)nrot + (size_t)r) * dd, Mf, dd * sizeof(double));
            }
        }
        /* Held-back rows: errors of none / Hadamard, and the row objective's
         * clip (it decides under clip_objective 1 or for a layer without probes). */
        eval_ctx xs[2];
        double rel[2], row_best[2] = {0.0, 0.0};
        float row_c[2] = {1.0f, 1.0f};
        for (int which = 0; which < 2; which++) {
            const float **Rpw = Rp + (size_t)which * 3 * (size_t)nrot;
            const double **Cpw = Cp + (size_t)which * 3 * (size_t)nrot;
            if (c->o.progress) c->o.progress(c->o.progress_user, "clip fitting", 2 * l + which, 2 * L);
            /* Each kind rotates into its own half of rot_rows: the chosen clip is re-evaluated below. */
            eval_ctx x = {.c = c, .layer = l, .which = which, .nrot = nrot, .lloyd_max = 0, .e = e, .f = f,
                          .xr = fs, .xq = fs + d, .deq = fs + 2 * d, .codes = codes, .meta = fs + 3 * d,
                          .rot_rows = rot_rows + (size_t)which * (size_t)c->cap * (size_t)d, .rotated = 0};
            double wsum, scale;
            x.R = Rpw + 0;
            x.Ct = Cpw + 0;
            scale = eval_error(&x, -1.0f, &wsum);
            rel[which] = scale > 0.0 ? 1.0 / scale : 0.0;
            double err_none = eval_error(&x, 1.0f, &wsum) * rel[which];
            x.R = Rpw + nrot;
            x.Ct = Cpw + nrot;
            x.rotated = 0;
            double err_had = eval_error(&x, 1.0f, &wsum) * rel[which];
            x.R = Rpw + 2 * nrot;
            x.Ct = Cpw + 2 * nrot;
            x.rotated = 0;
            x.lloyd_max = c->o.method == OSCAR_METHOD_OSCAR2_LM;
            x.F = p->fb ? Fp + (size_t)which * (size_t)nrot : NULL;
            /* Under the probe objective the row grid is only the fallback of a layer without probes. */
            if (c->o.clip_objective == 1) row_grid(&x, which == OSCAR_K ? c->o.clip_k : c->o.clip_v, &row_c[which],
                                                   &row_best[which]);
            xs[which] = x;
            double *rep = which == OSCAR_K ? c->report[l].err_k : c->report[l].err_v;
            rep[0] = err_none;
            rep[1] = err_had;
        }
        /* Attention probes decide the clips (objective 0), or only report the
         * attention error at the row objective's clips (objective 1). */
        const int by_probes = c->o.clip_objective == 0;
        float *hc = head_clips; /* [2][hkv]: K then V ratios of each KV head */
        int fitted = 0;
        if (Mfs && p->fb && by_probes) {
            /* The ridge per (layer, K/V): the grid value whose weights give the smallest probe error at
             * the clip fitted with them (K with V exact, V with K exact); then the full fit with those. */
            double best_err[2] = {INFINITY, INFINITY}, best_damp[2] = {FB_DAMP, FB_DAMP};
            for (int gi = 0; gi < DAMP_GRID_N; gi++) {
                if ((s = layer_feedback(d, nrot, l, p, Mfs, Fp, k_damp_grid[gi], k_damp_grid[gi], A))) goto done;
                if (probe_fit_layer(c, p, l, H, Rpr, Rpr + nrot, Fp, Fp + nrot, c->o.clip_k, c->o.clip_v, hc,
                                    hc + c->hkv, 1, &fitted)) {
                    s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY,
                                        "out of memory evaluating the attention probes of layer %d: feed shorter "
                                        "windows", l);
                    goto done;
                }
                if (!fitted) break; /* no probes: the default ridge */
                const double ek = c->attn[l].err_k[2], ev = c->attn[l].err_v[2];
                if (ek < best_err[0]) best_err[0] = ek, best_damp[0] = k_damp_grid[gi];
                if (ev < best_err[1]) best_err[1] = ev, best_damp[1] = k_damp_grid[gi];
            }
            if ((s = layer_feedback(d, nrot, l, p, Mfs, Fp, best_damp[0], best_damp[1], A))) goto done;
            fitted = 0;
        }
        if (probe_fit_layer(c, p, l, H, Rpr, Rpr + nrot, p->fb ? Fp : NULL, p->fb ? Fp + nrot : NULL,
                            by_probes ? c->o.clip_k : row_c[0], by_probes ? c->o.clip_v : row_c[1], hc, hc + c->hkv,
                            0, &fitted)) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY,
                                "out of memory evaluating the attention probes of layer %d: feed shorter windows",
                                l);
            goto done;
        }
        for (int which = 0; which < 2; which++) {
            float *cw = hc + (size_t)which * (size_t)c->hkv, mild = 0.0f;
            if (by_probes && !fitted)
                row_grid(&xs[which], which == OSCAR_K ? c->o.clip_k : c->o.clip_v, &row_c[which], &row_best[which]);
            int same = !by_probes || !fitted; /* row_best holds the error at the chosen ratio */
            for (int h = 0; h < c->hkv; h++) {
                if (!by_probes || !fitted) cw[h] = row_c[which]; /* the row objective: one ratio per layer */
                mild = cw[h] > mild ? cw[h] : mild;
                *oscar_params_clip_ptr(p, l, h, which) = cw[h];
            }
            double wsum, best = same ? row_best[which] : 0.0;
            if (!same) {
                xs[which].clips = cw;
                best = eval_error(&xs[which], 1.0f, &wsum);
            }
            double *rep = which == OSCAR_K ? c->report[l].err_k : c->report[l].err_v;
            rep[2] = best * rel[which];
            *(which == OSCAR_K ? &c->report[l].clip_k : &c->report[l].clip_v) = mild; /* the layer's mildest */
        }
    }
    choose_widths(c, p);
    if (c->o.progress) c->o.progress(c->o.progress_user, "done", L, L);
    c->state = STATE_FINAL;
    *out = p;
    p = NULL;
done:
    oscar_params_destroy(p);
    free(C);
    free(A);
    free(U);
    free(lam);
    free(Ct);
    free(Rd);
    free(tmp);
    free(e);
    free(f);
    free(H);
    free(fs);
    free(rot_rows);
    free(codes);
    free(head_clips);
    free(Rp);
    free(Cp);
    free(Rpr);
    free(Fp);
    free(Mv);
    free(Mfs);
    return s;
}

OSCAR_API oscar_status oscar_calib_layer_attn_report_get(const oscar_calib *c, int layer,
                                                         oscar_calib_attn_report *out) {
    oscar_clear_error();
    if (!c || !out)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_layer_attn_report_get: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)", layer, c->L);
    if (c->state != STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE,
                               "the attention report exists after oscar_calib_finalize: finalize first");
    *out = c->attn[layer];
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_layer_copy_report_get(const oscar_calib *c, int layer,
                                                         oscar_calib_copy_report *out) {
    oscar_clear_error();
    if (!c || !out)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_layer_copy_report_get: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)", layer, c->L);
    if (c->state != STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE, "the copy report exists after oscar_calib_finalize: finalize first");
    *out = c->copy[layer];
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_head_copy_report_get(const oscar_calib *c, int layer, int kv_head,
                                                        oscar_calib_head_copy_report *out) {
    oscar_clear_error();
    if (!c || !out)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_head_copy_report_get: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)", layer, c->L);
    if (kv_head < 0 || kv_head >= c->hkv)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "kv_head %d out of range [0, %d)", kv_head, c->hkv);
    if (c->state != STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE, "the copy report exists after oscar_calib_finalize: finalize first");
    *out = c->head_copy[(size_t)layer * (size_t)c->hkv + (size_t)kv_head];
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_layer_report_get(const oscar_calib *c, int layer, oscar_calib_layer_report *out) {
    oscar_clear_error();
    if (!c || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_calib_layer_report_get: NULL argument");
    if (layer < 0 || layer >= c->L)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layer %d out of range [0, %d)", layer, c->L);
    if (c->state != STATE_FINAL)
        return oscar_set_error(OSCAR_ERR_STATE, "the layer report exists after oscar_calib_finalize: finalize first");
    *out = c->report[layer];
    return OSCAR_OK;
}
