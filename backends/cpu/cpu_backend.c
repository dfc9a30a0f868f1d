/* The built-in CPU backend: the plugin vtable (runtime/oscar_backend.h) over
 * host memory. Append and decode follow docs/FORMAT.md §3-§5 literally; every
 * input is validated synchronously before anything is written, so a refused
 * call leaves the cache byte-identical. Single-threaded and deterministic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h> /* sysconf: the machine's memory, for cpu_alloc */

#include "oscar_internal.h" /* oscar_check_batch_arrays */
#include "oscar_ref.h"

#define CPU_ALIGN 64u
#define Q_CHUNK 8  /* query heads of one GQA group processed together */
#define POS_BLOCK 32 /* positions per online-softmax block */

typedef struct cpu_plan {
    oscar_layout_desc l;
    oscar_page_geom g;
    int num_layers, num_rot, identity;
    int quantized; /* 2-bit methods: windows + 2-bit pages; 0: BF16 method */
    int lm;        /* Lloyd-Max levels */
    int S0, W;
    size_t slot_bytes, esize, msize;
    float *rot_k, *rot_v; /* [layers][num_rot][d][d], NULL when identity */
    float *fb_k, *fb_v;   /* [layers][num_rot][d][d] error-feedback weights, NULL: nearest rounding */
    float *clip_k, *clip_v; /* [layers][kv heads], 1 for methods that never clip */
    int32_t *plane;         /* [layers][kv heads][2]: 1-bit plane of a 3-bit head-tensor (FORMAT.md §2.7),
                               -1 for 2 bits; NULL: 2 bits everywhere */
    size_t *page_bytes;     /* [layers]: page size of each layer (format/layout.c; they differ only with
                               layout.wide_per_layer 1, FORMAT.md §3.3) */
    float lut[256][4];      /* byte of 4 codes -> 4 levels */
} cpu_plan;

/* ------------------------------------------------------------- memory */
static int cpu_probe(int device_index, oscar_errbuf *why) {
    (void)device_index;
    (void)why;
    return 1;
}
static oscar_status cpu_init(int device_index, void **ctx, oscar_errbuf *err) {
    (void)device_index;
    (void)err;
    *ctx = NULL; /* stateless */
    return OSCAR_OK;
}
static void cpu_shutdown(void *ctx) { (void)ctx; }
static const char *cpu_device_name(void *ctx) {
    (void)ctx;
    return "CPU reference (host memory, single thread)";
}
static oscar_status cpu_alloc(void *ctx, size_t bytes, void **buf, oscar_errbuf *err) {
    (void)ctx;
    if (!buf) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu alloc: buf is NULL");
    size_t n = bytes ? (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN : CPU_ALIGN;
    /* Host memory is the machine's: a request past it is refused naming both sizes (malloc was asked:
     * NULL at best, an abort under ASan for 1 TiB and more). */
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    const double have = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0.0;
    if (n < bytes || (have > 0.0 && (double)n > have))
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY,
                                "cpu alloc: %zu bytes (%.3g GiB) is more than this machine's %.3g GiB of memory; "
                                "allocate less (fewer pages or sequences, a shorter max_seq_len)",
                                bytes, (double)bytes / 1073741824.0, have / 1073741824.0);
    *buf = aligned_alloc(CPU_ALIGN, n);
    if (!*buf)
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY,
                                "cpu alloc: cannot allocate %zu bytes of host memory; allocate less or free some",
                                bytes);
    return OSCAR_OK;
}
static void cpu_free(void *ctx, void *buf) {
    (void)ctx;
    free(buf);
}
static oscar_status cpu_write(void *ctx, void *dst, size_t offset, const void *src, size_t bytes, void *stream,
                              oscar_errbuf *err) {
    (void)ctx;
    (void)stream;
    if (bytes && (!dst || !src)) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu write: NULL buffer");
    if (bytes) memcpy((char *)dst + offset, src, bytes);
    return OSCAR_OK;
}
static oscar_status cpu_read(void *ctx, void *dst, const void *src, size_t offset, size_t bytes, void *stream,
                             oscar_errbuf *err) {
    (void)ctx;
    (void)stream;
    if (bytes && (!dst || !src)) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu read: NULL buffer");
    if (bytes) memcpy(dst, (const char *)src + offset, bytes);
    return OSCAR_OK;
}
static oscar_status cpu_sync(void *ctx, void *stream, oscar_errbuf *err) {
    (void)ctx;
    (void)stream;
    (void)err;
    return OSCAR_OK;
}

/* --------------------------------------------------------------- plan */
static void cpu_plan_free(cpu_plan *p) {
    if (!p) return;
    free(p->rot_k);
    free(p->rot_v);
    free(p->fb_k);
    free(p->fb_v);
    free(p->clip_k);
    free(p->clip_v);
    free(p->plane);
    free(p->page_bytes);
    free(p);
}

static oscar_status cpu_plan_create(void *ctx, const oscar_backend_plan_desc *desc, void **bplan, char *variant,
                                    size_t variant_len, oscar_errbuf *err) {
    (void)ctx;
    if (!desc || !bplan) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu plan: NULL descriptor");
    const oscar_layout_desc *l = &desc->layout;
    char why[256];
    oscar_status st = oscar_format_check_layout(l, why, sizeof why);
    if (st != OSCAR_OK) return oscar_errbuf_set(err, st, "cpu plan: %s", why);
    if (desc->num_layers < 1 || (desc->num_rot != 1 && desc->num_rot != l->num_kv_heads))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "cpu plan: %d layers with %d rotations per layer; need >= 1 layer and 1 or "
                                "num_kv_heads (%d) rotations",
                                desc->num_layers, desc->num_rot, l->num_kv_heads);
    if (!desc->identity_rotation && (!desc->rot_k || !desc->rot_v))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu plan: rotations missing (rot_k/rot_v NULL)");

    cpu_plan *p = calloc(1, sizeof *p);
    if (!p) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "cpu plan: out of host memory");
    p->l = *l;
    oscar_page_geom_init(l, &p->g);
    p->num_layers = desc->num_layers;
    p->num_rot = desc->num_rot;
    p->identity = desc->identity_rotation;
    p->quantized = l->method != OSCAR_METHOD_BF16;
    p->lm = l->method == OSCAR_METHOD_OSCAR2_LM;
    p->S0 = p->quantized ? l->sink : 0;
    p->W = p->quantized ? l->recent : 0;
    p->esize = oscar_dtype_size(l->kv_dtype);
    p->msize = oscar_dtype_size(l->meta_dtype);
    p->slot_bytes = p->g.window_slot_bytes;
    size_t nl = (size_t)desc->num_layers, d = (size_t)l->head_dim;
    size_t rot_elems = nl * (size_t)desc->num_rot * d * d;
    const size_t nclip = nl * (size_t)l->num_kv_heads;
    p->clip_k = malloc(nclip * sizeof(float));
    p->clip_v = malloc(nclip * sizeof(float));
    if (!p->identity) {
        p->rot_k = malloc(rot_elems * sizeof(float));
        p->rot_v = malloc(rot_elems * sizeof(float));
    }
    if (!p->clip_k || !p->clip_v || (!p->identity && (!p->rot_k || !p->rot_v))) {
        cpu_plan_free(p);
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "cpu plan: out of host memory for rotations");
    }
    if (!p->identity) {
        memcpy(p->rot_k, desc->rot_k, rot_elems * sizeof(float));
        memcpy(p->rot_v, desc->rot_v, rot_elems * sizeof(float));
    }
    if (desc->fb_k && desc->fb_v) {
        p->fb_k = malloc(rot_elems * sizeof(float));
        p->fb_v = malloc(rot_elems * sizeof(float));
        if (!p->fb_k || !p->fb_v) {
            cpu_plan_free(p);
            return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "cpu plan: out of host memory for feedback weights");
        }
        memcpy(p->fb_k, desc->fb_k, rot_elems * sizeof(float));
        memcpy(p->fb_v, desc->fb_v, rot_elems * sizeof(float));
    }
    int clips = l->method == OSCAR_METHOD_OSCAR2 || l->method == OSCAR_METHOD_OSCAR2_LM;
    for (size_t i = 0; i < nclip; i++) {
        float ck = clips && desc->clip_k ? desc->clip_k[i] : 1.0f;
        float cv = clips && desc->clip_v ? desc->clip_v[i] : 1.0f;
        if (!(ck > 0.0f && ck <= 1.0f) || !(cv > 0.0f && cv <= 1.0f)) {
            cpu_plan_free(p);
            return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                    "cpu plan: clip ratio of layer %zu KV head %zu outside (0, 1] (K %g, V %g)",
                                    i / (size_t)l->num_kv_heads, i % (size_t)l->num_kv_heads, (double)ck, (double)cv);
        }
        p->clip_k[i] = ck;
        p->clip_v[i] = cv;
    }
    if (desc->code_bits) { /* the plane of each head-tensor (format/layout.c) */
        p->plane = malloc(nclip * 2 * sizeof *p->plane);
        if (!p->plane) {
            cpu_plan_free(p);
            return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "cpu plan: out of host memory");
        }
        char why[256];
        oscar_status ps = oscar_format_planes(l, (int)nl, desc->code_bits, p->plane, why, sizeof why);
        if (ps != OSCAR_OK) {
            cpu_plan_free(p);
            return oscar_errbuf_set(err, ps, "cpu plan: %s", why);
        }
    }
    if (!(p->page_bytes = malloc(nl * sizeof *p->page_bytes))) {
        cpu_plan_free(p);
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "cpu plan: out of host memory");
    }
    for (size_t i = 0; i < nl; i++) p->page_bytes[i] = oscar_format_layer_page_bytes(l, desc->code_bits, (int)i);
    static const float uni[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    static const float lmv[4] = {-OSCAR_LM_L0, -OSCAR_LM_L1, OSCAR_LM_L1, OSCAR_LM_L0};
    for (int b = 0; b < 256; b++)
        for (int k = 0; k < 4; k++) p->lut[b][k] = (p->lm ? lmv : uni)[(b >> (2 * k)) & 3];
    if (variant && variant_len)
        snprintf(variant, variant_len, "cpu:d%d_g%d_p%d_q%d_%s%s", l->head_dim, l->group, l->page_size,
                 l->num_q_heads / l->num_kv_heads, l->kv_dtype == OSCAR_DTYPE_BF16 ? "bf16" : "f16",
                 p->plane ? "_w3" : "");
    *bplan = p;
    return OSCAR_OK;
}

static void cpu_plan_destroy(void *ctx, void *bplan) {
    (void)ctx;
    cpu_plan_free(bplan);
}

static oscar_status cpu_workspace_bytes(void *ctx, void *bplan, int max_seqs, int max_seq_len, size_t *bytes,
                                        oscar_errbuf *err) {
    (void)ctx;
    (void)bplan;
    (void)max_seqs;
    (void)max_seq_len;
    if (!bytes) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "cpu workspace_bytes: bytes is NULL");
    *bytes = OSCAR_WORKSPACE_HEADER; /* only the error word: scratch lives on the stack */
    return OSCAR_OK;
}
static oscar_status cpu_workspace_init(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    (void)ctx;
    (void)bplan;
    (void)stream;
    (void)err;
    if (workspace) memset(workspace, 0, sizeof(uint32_t));
    return OSCAR_OK;
}
static oscar_status cpu_check(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    (void)ctx;
    (void)bplan;
    (void)workspace;
    (void)stream;
    (void)err;
    return OSCAR_OK; /* errors are returned by each call */
}

/* ----------------------------------------------------------- addressing */
/* The d x d matrix of (layer, head) in a [layers][num_rot][d][d] array
 * (rotations, feedback weights); NULL base gives NULL. */
static const float *head_matrix(const cpu_plan *p, const float *base, int layer, int h) {
    if (!base) return NULL;
    size_t d = (size_t)p->l.head_dim;
    return base + ((size_t)layer * (size_t)p->num_rot + (size_t)(p->num_rot == 1 ? 0 : h)) * d * d;
}
static const float *rot_of(const cpu_plan *p, const float *base, int layer, int h) {
    return p->identity ? NULL : head_matrix(p, base, layer, h);
}
/* 16-bit window row of position p (quantized methods). */
static char *window_row(const cpu_plan *p, void *windows, int32_t slot, int kv, int h, int64_t pos) {
    int64_t row = pos < p->S0 ? pos : p->S0 + (pos - p->S0) % p->W;
    size_t rows_per_head = (size_t)(p->S0 + p->W);
    return (char *)windows + (size_t)slot * p->slot_bytes +
           (((size_t)kv * (size_t)p->g.H + (size_t)h) * rows_per_head + (size_t)row) * (size_t)p->g.d * p->esize;
}
/* Page and row of paged index j (2-bit history index, or position for BF16). */
static char *page_base(const cpu_plan *p, int layer, void *pages, const int32_t *bt_row, int64_t j, int *r) {
    *r = (int)(j % p->g.P);
    return (char *)pages + (size_t)bt_row[j / p->g.P] * p->page_bytes[layer];
}

/* ----------------------------------------------------------- validation */
/* The call's counts and pointers, then its index arrays (oscar_check_batch_arrays: the rules and
 * their order shared with validate = 1); cu_new: an append's, else NULL. */
static oscar_status check_batch(const cpu_plan *p, int layer, const oscar_cache *c, const oscar_batch *b,
                                const int32_t *cu_new, int32_t total_new, const char *fn, oscar_errbuf *err) {
    if (layer < 0 || layer >= p->num_layers)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s: layer %d outside [0, %d)", fn, layer,
                                p->num_layers);
    if (b->num_seqs < 1)
        return oscar_errbuf_set(err, OSCAR_ERR_EMPTY, "%s: num_seqs is %d; pass at least one sequence", fn,
                                b->num_seqs);
    int need_windows = p->quantized && p->S0 + p->W > 0; /* sink 0 and recent 0: no slot is read */
    if (!b->seq_lens || (need_windows && !b->window_slots))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s: seq_lens%s must not be NULL", fn,
                                need_windows ? " and window_slots" : "");
    if (b->block_table_stride < 0)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s: block_table_stride %d is negative", fn,
                                b->block_table_stride);
    if (need_windows && !c->windows)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s: cache.windows is NULL; allocate num_window_slots * window_slot_bytes", fn);
    return oscar_check_batch_arrays(&p->l, c, b, b->seq_lens, b->window_slots, c->pages ? b->block_table : NULL,
                                    cu_new, total_new, fn, err);
}

/* ------------------------------------------------------------ aliasing */
/* The CPU backend's buffers are host memory, so one that the call writes and that overlaps another of
 * its buffers is seen here and refused before anything runs: the write changed what the rest of the call
 * read (an out row over seq_lens or the block table sent later sequences past the page pool, a crash;
 * one over q or the pools gave a wrong result, silently). Its pools and index arrays
 * (oscar_batch_spans), the block-table entries exactly those the call reads (oscar_check_batch_arrays
 * checked them): row i's first pages_for(L_i). */
static int batch_spans(const cpu_plan *p, int layer, const oscar_cache *c, const oscar_batch *b, oscar_span *s,
                       int *npools) {
    size_t used = 0;
    for (size_t i = 0; c->pages && i < (size_t)b->num_seqs; i++) {
        const size_t r = oscar_sat_mul(i, (size_t)b->block_table_stride),
                     pg = (size_t)oscar_pages_for(&p->l, b->seq_lens[i]);
        const size_t e = r > SIZE_MAX - pg ? SIZE_MAX : r + pg;
        used = e > used ? e : used;
    }
    return oscar_batch_spans(c, b, p->page_bytes[layer], p->slot_bytes, p->quantized && p->S0 + p->W > 0, used, s,
                             npools);
}

static int row_finite(oscar_dtype t, const void *src, size_t n) {
    const uint16_t *h = src;
    /* 16-bit formats: all-ones exponent = Inf/NaN. */
    uint16_t mask = t == OSCAR_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    for (size_t i = 0; i < n; i++)
        if ((h[i] & mask) == mask) return 0;
    return 1;
}

/* ------------------------------------------------------------- append */
static void load_row(const cpu_plan *p, const void *src, float *out) {
    const uint16_t *h = src;
    if (p->l.kv_dtype == OSCAR_DTYPE_BF16)
        for (int j = 0; j < p->g.d; j++) out[j] = oscar_bf16_to_f32(h[j]);
    else
        for (int j = 0; j < p->g.d; j++) out[j] = oscar_f16_to_f32(h[j]);
}
static void store_row(const cpu_plan *p, const float *x, void *dst) {
    uint16_t *h = dst;
    if (p->l.kv_dtype == OSCAR_DTYPE_BF16)
        for (int j = 0; j < p->g.d; j++) h[j] = oscar_f32_to_bf16(x[j]);
    else
        for (int j = 0; j < p->g.d; j++) h[j] = oscar_f32_to_f16(x[j]);
}
/* The 1-bit plane index of (layer, head, kind), -1 when it is stored in 2 bits. */
static int plane_of(const cpu_plan *p, int layer, int h, int kv) {
    return p->plane ? p->plane[((size_t)layer * (size_t)p->g.H + (size_t)h) * 2 + (size_t)kv] : -1;
}
/* Quantizes a rotated kv_dtype-rounded row into page row (h, r): its codes and metadata, and the 1-bit
 * plane's row when (layer, h, kv) is a 3-bit head-tensor (FORMAT.md §2.7). */
static void store_2bit(const cpu_plan *p, char *page, int layer, int kv, int h, int r, float clip, const float *x) {
    uint8_t codes[64], hi[32];
    float meta[16];
    const float *fb = head_matrix(p, kv ? p->fb_v : p->fb_k, layer, h);
    const int pl = plane_of(p, layer, h, kv);
    oscar_ref_quantize_row_wide(p->g.d, p->g.group, pl >= 0 ? 3 : 2, p->lm, clip, p->l.meta_dtype, x, fb, codes, hi,
                                meta);
    if (pl >= 0)
        memcpy(page + p->g.hi + ((size_t)pl * (size_t)p->g.P + (size_t)r) * p->g.hi_row_bytes, hi, p->g.hi_row_bytes);
    size_t row = (size_t)h * (size_t)p->g.P + (size_t)r;
    memcpy(page + (kv ? p->g.v_codes : p->g.k_codes) + row * p->g.codes_row_bytes, codes, p->g.codes_row_bytes);
    void *m = page + (kv ? p->g.v_meta : p->g.k_meta) + row * p->g.meta_row_bytes;
    for (int i = 0; i < 2 * p->g.ng; i++) oscar_store(p->l.meta_dtype, m, (size_t)i, meta[i]);
}

/* 1 when the rows of this plan are stored with F16 metadata: a group's scale
 * and min, bounded by the row's largest |value|, then fit f16 whenever the
 * row does; a larger row would saturate them (FORMAT.md §2.2), silently. */
static int meta_caps_row(const cpu_plan *p) { return p->quantized && p->l.meta_dtype == OSCAR_DTYPE_F16; }

static oscar_status cpu_append(void *ctx, void *bplan, const oscar_backend_append_args *a, oscar_errbuf *err) {
    (void)ctx;
    const cpu_plan *p = bplan;
    const oscar_batch *b = &a->batch;
    if (!a->cu_new) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "oscar_append: cu_new is NULL");
    oscar_status st = check_batch(p, a->layer, &a->cache, b, a->cu_new, a->total_new, "oscar_append", err);
    if (st) return st;
    int H = p->g.H, d = p->g.d;
    if (a->total_new == 0) return OSCAR_OK;
    if (!a->k || !a->v) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "oscar_append: k or v is NULL");
    if (a->kv_stride < (int64_t)H * d)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "oscar_append: kv_stride %lld smaller than num_kv_heads * head_dim = %d",
                                (long long)a->kv_stride, H * d);
    {
        oscar_span sp[8];
        int nw = 0; /* written: the pools */
        int n = batch_spans(p, a->layer, &a->cache, b, sp, &nw);
        const size_t kv_bytes = oscar_rows_span(a->total_new, a->kv_stride, (int64_t)H * d, p->esize);
        sp[n++] = oscar_span_of(a->cu_new, oscar_sat_mul((size_t)b->num_seqs + 1, 4), "cu_new");
        sp[n++] = oscar_span_of(a->k, kv_bytes, "k");
        sp[n++] = oscar_span_of(a->v, kv_bytes, "v");
        if ((st = oscar_refuse_overlap(sp, nw, n, "oscar_append", err))) return st;
    }
    /* Every new row must be finite before anything is written. */
    for (int32_t t = 0; t < a->total_new; t++)
        for (int kv = 0; kv < 2; kv++) {
            const char *src = (const char *)(kv ? a->v : a->k) + (size_t)t * (size_t)a->kv_stride * p->esize;
            if (!row_finite(p->l.kv_dtype, src, (size_t)H * d))
                return oscar_errbuf_set(err, OSCAR_ERR_NONFINITE,
                                        "oscar_append: new %s row %d contains NaN or Inf; the cache was not modified",
                                        kv ? "V" : "K", t);
        }
    /* ... and so must its rotated row once rounded to kv_dtype (finite values
     * near the dtype's maximum can overflow in x R), and within f16 when the
     * metadata is F16: refused like a NaN row. */
    if (!p->identity || meta_caps_row(p))
        for (int32_t t = 0; t < a->total_new; t++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < H; h++) {
                    float xv[256], yv[256];
                    load_row(p, (const char *)(kv ? a->v : a->k) + ((size_t)t * (size_t)a->kv_stride + (size_t)h * d) *
                                                                       p->esize,
                             xv);
                    if (oscar_ref_row_storable(d, xv, rot_of(p, kv ? p->rot_v : p->rot_k, a->layer, h), p->l.kv_dtype,
                                               meta_caps_row(p), yv))
                        continue;
                    if (meta_caps_row(p) && p->l.kv_dtype == OSCAR_DTYPE_BF16)
                        return oscar_errbuf_set(err, OSCAR_ERR_NONFINITE,
                                                "oscar_append: new %s row %d, KV head %d is finite but exceeds "
                                                "65504 (rotated, where the method rotates), the range of its F16 "
                                                "metadata (a group's scale and min would saturate); the cache was not modified (create the "
                                                "layout with meta_dtype F32, or scale the activations down)",
                                                kv ? "V" : "K", t, h);
                    return oscar_errbuf_set(err, OSCAR_ERR_NONFINITE,
                                            "oscar_append: new %s row %d, KV head %d is finite but its rotated "
                                            "row overflows %s; the cache was not modified (scale the "
                                            "activations down)",
                                            kv ? "V" : "K", t, h, p->l.kv_dtype == OSCAR_DTYPE_BF16 ? "bf16" : "f16");
                }

    float x[256], xr[256];
    const float *clip[2] = {p->clip_k + (size_t)a->layer * H, p->clip_v + (size_t)a->layer * H}; /* [kv][h] */
    /* Step 1 for every sequence: demote ring rows that leave the recent window. */
    if (p->quantized && p->W > 0)
        for (int i = 0; i < b->num_seqs; i++) {
            int64_t L = b->seq_lens[i], L0 = L - (a->cu_new[i + 1] - a->cu_new[i]);
            int64_t lo = L0 - p->W > p->S0 ? L0 - p->W : p->S0, hi = L0 < L - p->W ? L0 : L - p->W;
            const int32_t *bt = b->block_table ? b->block_table + (size_t)i * (size_t)b->block_table_stride : NULL;
            for (int64_t pos = lo; pos < hi; pos++) {
                int r;
                char *page = page_base(p, a->layer, a->cache.pages, bt, pos - p->S0, &r);
                for (int kv = 0; kv < 2; kv++)
                    for (int h = 0; h < H; h++) {
                        load_row(p, window_row(p, a->cache.windows, b->window_slots[i], kv, h, pos), x);
                        store_2bit(p, page, a->layer, kv, h, r, clip[kv][h], x);
                    }
            }
        }
    /* Step 2: store the new tokens (rotated, rounded; 2-bit or window row). */
    for (int i = 0; i < b->num_seqs; i++) {
        int64_t L = b->seq_lens[i], n = a->cu_new[i + 1] - a->cu_new[i], L0 = L - n;
        const int32_t *bt = b->block_table ? b->block_table + (size_t)i * (size_t)b->block_table_stride : NULL;
        for (int64_t t = 0; t < n; t++) {
            int64_t pos = L0 + t;
            size_t tok = (size_t)(a->cu_new[i] + t);
            for (int kv = 0; kv < 2; kv++) {
                const float *rbase = kv ? p->rot_v : p->rot_k;
                for (int h = 0; h < H; h++) {
                    const char *src = (const char *)(kv ? a->v : a->k) +
                                      (tok * (size_t)a->kv_stride + (size_t)h * d) * p->esize;
                    load_row(p, src, x);
                    const float *R = rot_of(p, rbase, a->layer, h);
                    if (R) {
                        oscar_ref_rotate(d, x, R, xr);
                        for (int j = 0; j < d; j++) xr[j] = oscar_round_to(p->l.kv_dtype, xr[j]);
                    } else {
                        memcpy(xr, x, (size_t)d * sizeof *xr);
                    }
                    int r;
                    if (!p->quantized) {
                        char *page = page_base(p, a->layer, a->cache.pages, bt, pos, &r);
                        store_row(p, xr,
                                  page + (kv ? p->g.v_codes : p->g.k_codes) +
                                      ((size_t)h * (size_t)p->g.P + (size_t)r) * p->g.codes_row_bytes);
                    } else if (pos >= p->S0 && pos < L - p->W) {
                        char *page = page_base(p, a->layer, a->cache.pages, bt, pos - p->S0, &r);
                        store_2bit(p, page, a->layer, kv, h, r, clip[kv][h], xr);
                    } else {
                        store_row(p, xr, window_row(p, a->cache.windows, b->window_slots[i], kv, h, pos));
                    }
                }
            }
        }
    }
    return OSCAR_OK;
}

/* ------------------------------------------------------------- decode */
/* 0 when some q row of the batch has a NaN or Inf (refused before any output
 * is written; GPU backends raise the device flag instead). */
static int q_finite(const cpu_plan *p, const void *q, int64_t q_stride, int rows, int *tok, int *head) {
    int Hq = p->l.num_q_heads, d = p->g.d;
    for (int i = 0; i < rows; i++)
        for (int hq = 0; hq < Hq; hq++)
            if (!row_finite(p->l.kv_dtype, (const char *)q + ((size_t)i * q_stride + (size_t)hq * d) * p->esize,
                            (size_t)d)) {
                *tok = i;
                *head = hq;
                return 0;
            }
    return 1;
}

/* Stored row of position pos (K: kv 0, V: kv 1) as fp32, rotated space. */
static void read_stored(const cpu_plan *p, const oscar_cache *c, const int32_t *bt, int32_t slot, int layer, int kv,
                        int h, int64_t pos, int64_t L, float *out) {
    int r;
    if (!p->quantized) {
        char *page = page_base(p, layer, c->pages, bt, pos, &r);
        load_row(p, page + (kv ? p->g.v_codes : p->g.k_codes) + ((size_t)h * p->g.P + r) * p->g.codes_row_bytes,
                 out);
        return;
    }
    if (pos < p->S0 || pos >= L - p->W) {
        load_row(p, window_row(p, c->windows, slot, kv, h, pos), out);
        return;
    }
    char *page = page_base(p, layer, c->pages, bt, pos - p->S0, &r);
    size_t row = (size_t)h * p->g.P + (size_t)r;
    const uint8_t *codes = (const uint8_t *)page + (kv ? p->g.v_codes : p->g.k_codes) + row * p->g.codes_row_bytes;
    const char *meta = page + (kv ? p->g.v_meta : p->g.k_meta) + row * p->g.meta_row_bytes;
    const int pl = plane_of(p, layer, h, kv);
    const uint8_t *hi =
        pl >= 0 ? (const uint8_t *)page + p->g.hi + ((size_t)pl * (size_t)p->g.P + (size_t)r) * p->g.hi_row_bytes : NULL;
    int G = p->g.group;
    for (int g = 0; g < p->g.ng; g++) {
        float sa, sb;
        if (p->l.meta_dtype == OSCAR_DTYPE_F32) {
            memcpy(&sa, meta + (size_t)(2 * g) * 4, 4);
            memcpy(&sb, meta + (size_t)(2 * g + 1) * 4, 4);
        } else {
            uint16_t ha, hb;
            memcpy(&ha, meta + (size_t)(2 * g) * 2, 2);
            memcpy(&hb, meta + (size_t)(2 * g + 1) * 2, 2);
            sa = oscar_f16_to_f32(ha);
            sb = oscar_f16_to_f32(hb);
        }
        const uint8_t *cg = codes + (size_t)g * G / 4;
        float *og = out + (size_t)g * G;
        if (hi) { /* 3 bits: code = 2-bit code + 4 * plane bit */
            for (int j = 0; j < G; j++)
                og[j] = sb + sa * (float)oscar_ref_code3_at(codes, hi, g * G + j);
            continue;
        }
        for (int k = 0; k < G / 4; k++) {
            const float *lv = p->lut[cg[k]];
            og[4 * k + 0] = sb + sa * lv[0];
            og[4 * k + 1] = sb + sa * lv[1];
            og[4 * k + 2] = sb + sa * lv[2];
            og[4 * k + 3] = sb + sa * lv[3];
        }
    }
}

static float dot(int d, const float *a, const float *b) {
    float s[8] = {0};
    for (int j = 0; j < d; j += 8)
        for (int k = 0; k < 8; k++) s[k] += a[j + k] * b[j + k];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* Attention of one query token: position t of a sequence whose cache is
 * stored at length L (t < L); it sees rows 0..t as they are stored at L
 * (FORMAT.md §5.1). q_row/out_row: [Hq][d] kv_dtype; lse_row: [Hq] or NULL. */
static void attend_token(const cpu_plan *p, int layer, const oscar_cache *c, const int32_t *bt, int32_t slot,
                         int64_t L, int64_t t, const char *q_row, char *out_row, float *lse_row, float sm_scale,
                         int rotated_output) {
    int H = p->g.H, d = p->g.d, Hq = p->l.num_q_heads, gq = Hq / H;
    float qr[Q_CHUNK][256], acc[Q_CHUNK][256], s[Q_CHUNK][POS_BLOCK], m[Q_CHUNK], l[Q_CHUNK];
    float row[256], tmp[256];
    const int64_t vis = t + 1;
    for (int h = 0; h < H; h++) {
        const float *RK = rot_of(p, p->rot_k, layer, h), *RV = rot_of(p, p->rot_v, layer, h);
        for (int hq0 = h * gq; hq0 < (h + 1) * gq; hq0 += Q_CHUNK) {
            int nq = (h + 1) * gq - hq0 < Q_CHUNK ? (h + 1) * gq - hq0 : Q_CHUNK;
            for (int qi = 0; qi < nq; qi++) {
                load_row(p, q_row + (size_t)(hq0 + qi) * d * p->esize, tmp);
                oscar_ref_rotate(d, tmp, RK, qr[qi]); /* q~ = q R_K in fp32, not rounded */
                m[qi] = -INFINITY;
                l[qi] = 0.0f;
                memset(acc[qi], 0, (size_t)d * sizeof(float));
            }
            for (int64_t p0 = 0; p0 < vis; p0 += POS_BLOCK) {
                int nb = vis - p0 < POS_BLOCK ? (int)(vis - p0) : POS_BLOCK;
                for (int k = 0; k < nb; k++) {
                    read_stored(p, c, bt, slot, layer, 0, h, p0 + k, L, row);
                    for (int qi = 0; qi < nq; qi++) s[qi][k] = sm_scale * dot(d, qr[qi], row);
                }
                /* Online softmax: rescale the running sums to the new max. */
                for (int qi = 0; qi < nq; qi++) {
                    float bm = m[qi];
                    for (int k = 0; k < nb; k++) bm = fmaxf(bm, s[qi][k]);
                    float sc = expf(m[qi] - bm);
                    l[qi] *= sc;
                    for (int j = 0; j < d; j++) acc[qi][j] *= sc;
                    for (int k = 0; k < nb; k++) {
                        s[qi][k] = expf(s[qi][k] - bm);
                        l[qi] += s[qi][k];
                    }
                    m[qi] = bm;
                }
                for (int k = 0; k < nb; k++) {
                    read_stored(p, c, bt, slot, layer, 1, h, p0 + k, L, row);
                    for (int qi = 0; qi < nq; qi++) {
                        float w = s[qi][k];
                        float *ac = acc[qi];
                        for (int j = 0; j < d; j += 8) /* d is a multiple of 64 */
                            for (int k = 0; k < 8; k++) ac[j + k] += w * row[j + k];
                    }
                }
            }
            for (int qi = 0; qi < nq; qi++) {
                float inv = 1.0f / l[qi];
                for (int j = 0; j < d; j++) tmp[j] = acc[qi][j] * inv;
                const float *o = tmp;
                if (!rotated_output && RV) {
                    oscar_ref_unrotate(d, tmp, RV, row);
                    o = row;
                }
                store_row(p, o, out_row + (size_t)(hq0 + qi) * d * p->esize);
                /* natural log of sum_p exp(s_p): the running max plus log of the sum */
                if (lse_row) lse_row[hq0 + qi] = m[qi] + logf(l[qi]);
            }
        }
    }
}

/* Checks shared by decode and extend: q/out present, strides, no written buffer (out, lse) over
 * another buffer of the call, finite q. cu_q and lse: extend's, else NULL. */
static oscar_status check_q_out(const cpu_plan *p, int layer, const oscar_cache *c, const oscar_batch *b,
                                const int32_t *cu_q, const void *q, int64_t q_stride, const void *out,
                                int64_t out_stride, const float *lse, int rows, const char *fn, oscar_errbuf *err) {
    int d = p->g.d, Hq = p->l.num_q_heads;
    if (!q || !out) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "%s: q or out is NULL", fn);
    if (q_stride < (int64_t)Hq * d || out_stride < (int64_t)Hq * d)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s: q_stride %lld / out_stride %lld smaller than num_q_heads * head_dim = %d", fn,
                                (long long)q_stride, (long long)out_stride, Hq * d);
    oscar_span sp[9];
    int n = 0, npools;
    sp[n++] = oscar_span_of(out, oscar_rows_span(rows, out_stride, (int64_t)Hq * d, p->esize), "out");
    sp[n++] = oscar_span_of(lse, oscar_sat_mul((size_t)rows, (size_t)Hq * sizeof(float)), "lse");
    sp[n++] = oscar_span_of(q, oscar_rows_span(rows, q_stride, (int64_t)Hq * d, p->esize), "q");
    sp[n++] = oscar_span_of(cu_q, oscar_sat_mul((size_t)b->num_seqs + 1, 4), "cu_q");
    n += batch_spans(p, layer, c, b, sp + n, &npools);
    oscar_status st = oscar_refuse_overlap(sp, 2, n, fn, err);
    if (st) return st;
    int bad_tok, bad_head;
    if (!q_finite(p, q, q_stride, rows, &bad_tok, &bad_head))
        return oscar_errbuf_set(err, OSCAR_ERR_NONFINITE,
                                "%s: q of query token %d, query head %d contains NaN or Inf; nothing was written to "
                                "out",
                                fn, bad_tok, bad_head);
    return OSCAR_OK;
}

static const int32_t *bt_row_of(const oscar_batch *b, int i) {
    return b->block_table ? b->block_table + (size_t)i * (size_t)b->block_table_stride : NULL;
}
static int32_t slot_of(const cpu_plan *p, const oscar_batch *b, int i) {
    return p->quantized && p->S0 + p->W > 0 ? b->window_slots[i] : 0;
}

static oscar_status cpu_decode(void *ctx, void *bplan, const oscar_backend_decode_args *a, oscar_errbuf *err) {
    (void)ctx;
    const cpu_plan *p = bplan;
    const oscar_batch *b = &a->batch;
    oscar_status st = check_batch(p, a->layer, &a->cache, b, NULL, 0, "oscar_decode", err);
    if (!st)
        st = check_q_out(p, a->layer, &a->cache, b, NULL, a->q, a->q_stride, a->out, a->out_stride, NULL, b->num_seqs,
                         "oscar_decode", err);
    if (st) return st;
    for (int i = 0; i < b->num_seqs; i++)
        attend_token(p, a->layer, &a->cache, bt_row_of(b, i), slot_of(p, b, i), b->seq_lens[i], b->seq_lens[i] - 1,
                     (const char *)a->q + (size_t)i * a->q_stride * p->esize,
                     (char *)a->out + (size_t)i * a->out_stride * p->esize, NULL, a->sm_scale, a->rotated_output);
    return OSCAR_OK;
}

static oscar_status cpu_extend(void *ctx, void *bplan, const oscar_backend_extend_args *a, oscar_errbuf *err) {
    (void)ctx;
    const cpu_plan *p = bplan;
    const oscar_batch *b = &a->batch;
    const char *fn = "oscar_extend";
    oscar_status st = check_batch(p, a->layer, &a->cache, b, NULL, 0, fn, err);
    if (st) return st;
    if (!a->cu_q && a->total_q != b->num_seqs)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s: cu_q is NULL (one query per sequence) but total_q %d != num_seqs %d", fn,
                                a->total_q, b->num_seqs);
    if (a->cu_q && (st = oscar_check_cu_q(a->cu_q, b->seq_lens, b->num_seqs, a->total_q, a->max_q_len, fn, err)))
        return st;
    if ((st = check_q_out(p, a->layer, &a->cache, b, a->cu_q, a->q, a->q_stride, a->out, a->out_stride, a->lse,
                          a->total_q, fn, err)))
        return st;
    for (int i = 0; i < b->num_seqs; i++) {
        int64_t L = b->seq_lens[i];
        int32_t c0 = a->cu_q ? a->cu_q[i] : i, n = a->cu_q ? a->cu_q[i + 1] - c0 : 1;
        for (int32_t k = 0; k < n; k++) {
            size_t tok = (size_t)c0 + (size_t)k;
            attend_token(p, a->layer, &a->cache, bt_row_of(b, i), slot_of(p, b, i), L, L - n + k,
                         (const char *)a->q + tok * (size_t)a->q_stride * p->esize,
                         (char *)a->out + tok * (size_t)a->out_stride * p->esize,
                         a->lse ? a->lse + tok * (size_t)p->l.num_q_heads : NULL, a->sm_scale, a->rotated_output);
        }
    }
    return OSCAR_OK;
}

static const oscar_backend_api k_cpu_api = {
    .abi_version = OSCAR_BACKEND_ABI_VERSION,
    .name = "cpu",
    .probe = cpu_probe,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .device_name = cpu_device_name,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .write = cpu_write,
    .read = cpu_read,
    .sync = cpu_sync,
    .plan_create = cpu_plan_create,
    .plan_destroy = cpu_plan_destroy,
    .workspace_bytes = cpu_workspace_bytes,
    .workspace_init = cpu_workspace_init,
    .check = cpu_check,
    .append = cpu_append,
    .decode = cpu_decode,
    .extend = cpu_extend,
    .caps = OSCAR_BACKEND_CAP_WIDE_CODES,
};

const oscar_backend_api *oscar_cpu_backend(void) { return &k_cpu_api; }
