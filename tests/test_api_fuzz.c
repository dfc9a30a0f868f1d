/* Randomized stress of the serving API on the CPU backend: plausible and
 * implausible layouts (head_dim, group, GQA ratio 1..16, KV heads, page
 * size, sink/recent windows including 0, dtypes, methods, code widths),
 * parameters that fit the layout or not, and a long run of append / decode /
 * extend calls over ragged batches (lengths 0, 1, at page and window
 * boundaries, past max_seq_len), each call given at most one hostile change
 * (block table entries and window slots out of range or shared, cu_new /
 * cu_q not monotone or not ending at the total, NaN/Inf in k/v/q, short
 * strides, buffers sizes, bad scales, a lying max_seq_len, ...).
 *
 * Every call runs twice, on a runtime with validate = 0 and one with
 * validate = 1, over two copies of the cache. What is checked:
 *  - the status is OK or a documented refusal (never INTERNAL or BACKEND),
 *    the same with and without validation, also where the call's length
 *    faults add to the change (except a page or slot shared by two
 *    sequences, which only validation sees), with a message;
 *  - a call that must be refused is, and a clean call is not;
 *  - a refused call leaves the cache, out and lse byte for byte as they were;
 *    decode and extend never write the cache, nor the gaps between strided
 *    output rows;
 *  - an accepted decode/extend gives finite outputs (inputs are finite and
 *    moderate), the same bytes with and without validation; extend with one
 *    query per sequence is decode bit for bit, and an extend's last query of
 *    a sequence is the decode of that query.
 * A second test runs the same calls on OpenCL beside the CPU: clean calls
 * pass and store the CPU's bytes, calls the CPU must refuse are refused (at
 * the call or through oscar_plan_check), accepted decodes and extends agree
 * with the CPU's.
 * Seeds are fixed: a failure names its seed and call, and reproduces
 * (FUZZ_TRACE=1 prints each call; OSCAR_API_FUZZ_SEEDS=FIRST:COUNT explores). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"

#define MAXS 4   /* sequences of one cache */
#define POISON 0xA5

/* ------------------------------------------------------------------ random */
typedef struct {
    uint64_t s;
} rng_t;
static uint64_t rnext(rng_t *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int ri(rng_t *r, int lo, int hi) { return lo + (int)(rnext(r) % (uint64_t)((int64_t)hi - lo + 1)); }
static int chance(rng_t *r, int pct) { return ri(r, 0, 99) < pct; }
static float rf(rng_t *r) { return (float)((double)(rnext(r) >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f; }
#define PICK(r, arr) (arr)[ri((r), 0, (int)(sizeof(arr) / sizeof((arr)[0])) - 1)]

/* ------------------------------------------------------------------ 16-bit */
static uint16_t to16(oscar_dtype t, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t == OSCAR_DTYPE_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    uint32_t s = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
    int ee = (int)e - 127 + 15;
    if (e == 0 || ee <= 0) return (uint16_t)s;
    if (ee >= 31) return (uint16_t)(s | 0x7c00u);
    return (uint16_t)(s | ((uint32_t)ee << 10) | (m >> 13));
}
static int finite16(oscar_dtype t, uint16_t h) {
    uint16_t mask = t == OSCAR_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    return (h & mask) != mask;
}

/* ------------------------------------------------------------------ state */
typedef struct {
    uint64_t seed;
    int call;
    rng_t r;
    oscar_runtime *rt[2]; /* validate 0, validate 1 */
    oscar_layout_desc l;
    oscar_layout_sizes sz;
    oscar_plan *plan[2];
    int layers;           /* layers of the parameters (any index >= 0 when shared) */
    int shared;           /* built-in parameters made by the plan */
    int64_t pps;          /* pages per sequence at max_seq_len */
    int32_t num_pages, num_slots;
    int windowed;         /* the layout keeps 16-bit rows in window slots */
    uint8_t *pages[2], *windows[2], *snap_pages, *snap_windows;
    size_t pages_bytes, windows_bytes;
    int32_t *bt;          /* [MAXS][pps] the pages each sequence owns */
    int32_t len[MAXS];    /* tokens in the cache per sequence */
    void *ws[2];
    size_t ws_bytes;
    size_t es;
    int64_t qrow, kvrow;  /* elements of one token's q / k rows */
    /* The OpenCL lane (NULL runtime: none): the same calls on device buffers,
     * errors at the call or through oscar_plan_check; its pools are reset to
     * the CPU's after every append, so decodes read the same bytes. */
    oscar_runtime *rtcl;
    oscar_plan *pcl;
    void *cl_pages, *cl_windows, *cl_ws;
    size_t cl_ws_bytes;
    long cl_byte_diffs, cl_appends; /* pool bytes that differ from the CPU's after clean appends */
} fz;

static void fail_at(const fz *f, const char *what) {
    char m[4400];
    snprintf(m, sizeof m, "seed %llu call %d (%s d%d g%d hq%d hkv%d p%d s%d w%d max%d %s meta %s): %s",
             (unsigned long long)f->seed, f->call, oscar_method_name(f->l.method), f->l.head_dim, f->l.group,
             f->l.num_q_heads, f->l.num_kv_heads, f->l.page_size, f->l.sink, f->l.recent, f->l.max_seq_len,
             f->l.kv_dtype == OSCAR_DTYPE_BF16 ? "bf16" : "f16", f->l.meta_dtype == OSCAR_DTYPE_F32 ? "f32" : "f16",
             what);
    cr_assert_fail("%s", m);
}
#define CHECK(f, cond, ...)                                                                                            \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            char m_[4096];                                                                                             \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                                      \
            fail_at((f), m_);                                                                                          \
        }                                                                                                              \
    } while (0)

/* A refusal the header documents for a bad argument (CPU backend: nothing
 * about a device or the library's own failure). */
static int documented_refusal(oscar_status s) {
    switch (s) {
    case OSCAR_ERR_INVALID_ARGUMENT:
    case OSCAR_ERR_UNSUPPORTED_HEAD_DIM:
    case OSCAR_ERR_UNSUPPORTED_GROUP:
    case OSCAR_ERR_UNSUPPORTED:
    case OSCAR_ERR_SHAPE_MISMATCH:
    case OSCAR_ERR_NONFINITE:
    case OSCAR_ERR_EMPTY:
    case OSCAR_ERR_TOO_LONG:
    case OSCAR_ERR_BLOCK_TABLE:
    case OSCAR_ERR_WORKSPACE:
    case OSCAR_ERR_VERSION: return 1;
    default: return 0;
    }
}

static void check_status(fz *f, const char *fn, oscar_status s) {
    if (s == OSCAR_OK) return;
    CHECK(f, documented_refusal(s), "%s: status %d (%s) is not a documented refusal: %s", fn, (int)s,
          oscar_status_string(s), oscar_last_error());
    CHECK(f, oscar_last_error()[0] != '\0', "%s: status %d without a message", fn, (int)s);
}

/* ------------------------------------------------------------------ layout */
typedef struct {
    int valid; /* what the layout rules say (docs/FORMAT.md, oscar.h) */
} layout_expect;

static void random_layout(fz *f, layout_expect *x) {
    rng_t *r = &f->r;
    oscar_layout_desc *l = &f->l;
    oscar_layout_default(l);
    static const int hd[] = {64, 64, 128, 128, 256}, grp[] = {32, 64, 128}, pg[] = {16, 16, 32, 64, 128};
    static const int sinks[] = {0, 0, 1, 3, 16, 64}, recents[] = {0, 0, 1, 5, 16, 32, 64};
    static const oscar_method meth[] = {OSCAR_METHOD_OSCAR2, OSCAR_METHOD_OSCAR2_LM, OSCAR_METHOD_INT2,
                                        OSCAR_METHOD_QUAROT2, OSCAR_METHOD_BF16};
    int valid = 1;
    l->head_dim = PICK(r, hd);
    l->group = PICK(r, grp);
    if (l->group > l->head_dim) valid = 0;
    int hkv = ri(r, 1, 3), ratio = chance(r, 50) ? ri(r, 1, 4) : ri(r, 5, 16);
    if (l->head_dim == 256 && hkv * ratio > 16) ratio = 16 / hkv; /* keep the run short */
    l->num_kv_heads = hkv;
    l->num_q_heads = hkv * ratio;
    l->page_size = PICK(r, pg);
    l->sink = PICK(r, sinks);
    l->recent = PICK(r, recents);
    l->max_seq_len = chance(r, 20) ? ri(r, 1, 8) : ri(r, 9, l->head_dim == 256 ? 160 : 260);
    l->kv_dtype = chance(r, 50) ? OSCAR_DTYPE_BF16 : OSCAR_DTYPE_F16;
    l->meta_dtype = chance(r, 70) ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_F32;
    l->method = PICK(r, meth);
    if (chance(r, 12)) { /* one implausible field */
        valid = 0;
        switch (ri(r, 0, 13)) {
        case 0: l->head_dim = PICK(r, ((const int[]){0, -64, 24, 100, 512, INT32_MAX})); break; /* 32, 96: valid */
        case 1: l->group = PICK(r, ((const int[]){0, 16, 48, 272, -32})); break; /* 256: valid at d 256 */
        case 2: l->num_kv_heads = PICK(r, ((const int[]){0, -1, INT32_MIN})); break;
        case 3: l->num_kv_heads = l->num_q_heads + 1; break;
        case 4: l->num_q_heads = PICK(r, ((const int[]){0, -8, 1025, INT32_MAX})); break;
        case 5: l->page_size = PICK(r, ((const int[]){0, 8, 48, 256, -16})); break;
        case 6: l->sink = PICK(r, ((const int[]){-1, 65537, INT32_MAX, INT32_MIN})); break;
        case 7: l->recent = PICK(r, ((const int[]){-1, 65537, INT32_MAX})); break;
        case 8: l->max_seq_len = PICK(r, ((const int[]){0, -1, INT32_MIN})); break;
        case 9: l->kv_dtype = PICK(r, ((const oscar_dtype[]){OSCAR_DTYPE_F32, (oscar_dtype)3, (oscar_dtype)-1})); break;
        case 10: l->meta_dtype = PICK(r, ((const oscar_dtype[]){OSCAR_DTYPE_BF16, (oscar_dtype)9})); break;
        case 11:
            l->method = PICK(r, ((const oscar_method[]){OSCAR_METHOD_INT4, OSCAR_METHOD_INT8, OSCAR_METHOD_KIVI2,
                                                         OSCAR_METHOD_COUNT_, (oscar_method)-1}));
            break;
        case 12:
            if (chance(r, 50))
                l->wide_tensors = PICK(r, ((const int[]){-1, 2 * hkv + 1}));
            else
                l->wide_per_layer = PICK(r, ((const int[]){-1, 2, INT32_MAX, INT32_MIN}));
            break;
        default: l->struct_size = PICK(r, ((const uint32_t[]){0, 4, 4097, UINT32_MAX})); break;
        }
    } else if (l->method == OSCAR_METHOD_OSCAR2 && chance(r, 25)) {
        l->wide_tensors = ri(r, 1, 2 * hkv);
        /* per-layer page sizes; the pools here are of the largest page, which every layer fits */
        l->wide_per_layer = chance(r, 50);
    } else if (l->method != OSCAR_METHOD_OSCAR2 && chance(r, 3)) {
        if (chance(r, 50))
            l->wide_tensors = 1; /* only oscar2 stores 3-bit head-tensors */
        else
            l->wide_per_layer = 1;
        valid = 0;
    }
    x->valid = valid;
}

/* Parameters for the layout: NULL (built in), fitting ones, or a misfit.
 * *expect_ok: whether oscar_plan_create must accept them with a valid layout. */
static oscar_params *random_params(fz *f, int *expect_ok, int *wide_fit) {
    rng_t *r = &f->r;
    const oscar_layout_desc *l = &f->l;
    *expect_ok = 1;
    *wide_fit = 1;
    const int calibrated = l->method == OSCAR_METHOD_OSCAR2 || l->method == OSCAR_METHOD_OSCAR2_LM;
    if (!calibrated && chance(r, 60)) {
        f->shared = 1;
        f->layers = 1;
        return NULL;
    }
    f->shared = 0;
    f->layers = ri(r, 1, 3);
    int hq = l->num_q_heads, hkv = l->num_kv_heads, d = l->head_dim;
    oscar_method pm = l->method;
    if (chance(r, 8)) { /* shape of another model */
        switch (ri(r, 0, 2)) {
        case 0: d = d == 128 ? 64 : 128; break;
        case 1: hq = hkv * (hq / hkv + 1); break;
        default: hkv = hkv == 1 ? 2 : 1, hq = 2 * hkv; break;
        }
        *expect_ok = 0;
    } else if (calibrated && chance(r, 8)) { /* baseline parameters for a calibrated method */
        pm = OSCAR_METHOD_INT2;
        *expect_ok = 0;
    }
    oscar_params *p = NULL;
    oscar_status s = oscar_params_create_builtin(pm, f->layers, hq, hkv, d, &p);
    if (s != OSCAR_OK) {
        CHECK(f, 0, "oscar_params_create_builtin(%d, %d, %d, %d, %d): %s", (int)pm, f->layers, hq, hkv, d,
              oscar_last_error());
        return NULL;
    }
    if (pm == OSCAR_METHOD_OSCAR2 || pm == OSCAR_METHOD_OSCAR2_LM) {
        for (int ly = 0; ly < f->layers; ly++)
            for (int h = 0; h < hkv; h++)
                for (int kv = 0; kv < 2; kv++) {
                    float c = 0.5f + 0.5f * fabsf(rf(r));
                    cr_assert_eq(oscar_params_set_clip_head(p, ly, h, (oscar_kv)kv, c > 1.0f ? 1.0f : c), OSCAR_OK,
                                 "%s", oscar_last_error());
                }
        if (chance(r, 40)) { /* error-feedback weights */
            float *F = calloc((size_t)d * (size_t)d, sizeof *F);
            cr_assert(F);
            for (int i = 0; i < d; i++)
                for (int j = i + 1; j < d; j++) F[i * d + j] = 0.3f * rf(r) / (float)(j - i);
            for (int ly = 0; ly < f->layers; ly++)
                for (int kv = 0; kv < 2; kv++)
                    cr_assert_eq(oscar_params_set_feedback(p, ly, 0, (oscar_kv)kv, F), OSCAR_OK, "%s",
                                 oscar_last_error());
            free(F);
        }
        if (pm == OSCAR_METHOD_OSCAR2 && l->wide_tensors > 0 && chance(r, 70)) { /* 3-bit head-tensors */
            int most = 0;
            for (int ly = 0; ly < f->layers; ly++) {
                int n = 0;
                for (int h = 0; h < hkv; h++)
                    for (int kv = 0; kv < 2; kv++)
                        if (chance(r, 30)) {
                            cr_assert_eq(oscar_params_set_code_bits(p, ly, h, (oscar_kv)kv, 3), OSCAR_OK, "%s",
                                         oscar_last_error());
                            n++;
                        }
                most = n > most ? n : most;
            }
            *wide_fit = most <= l->wide_tensors;
        }
    }
    return p;
}

enum { M_NONE, M_SOFT, M_HARD }; /* no change; may be accepted; must be refused */

/* ------------------------------------------------------------------ OpenCL lane */
static void *dev_put(fz *f, const void *src, size_t bytes) {
    void *b = NULL;
    cr_assert_eq(oscar_buffer_alloc(f->rtcl, bytes ? bytes : 4, &b), OSCAR_OK, "%s", oscar_last_error());
    if (src && bytes) cr_assert_eq(oscar_buffer_write(f->rtcl, b, 0, src, bytes, NULL), OSCAR_OK, "%s", oscar_last_error());
    return b;
}
static void dev_get(fz *f, void *dst, const void *b, size_t bytes) {
    cr_assert_eq(oscar_buffer_read(f->rtcl, dst, b, 0, bytes, NULL), OSCAR_OK, "%s", oscar_last_error());
}
static void dev_free(fz *f, void *b) {
    if (b) oscar_buffer_free(f->rtcl, b);
}
/* The OpenCL twin of a call's batch: its lengths, slots and block table uploaded, the cache on the
 * OpenCL pools (the three buffers are the caller's to dev_free). */
typedef struct {
    void *lens, *slots, *bt;
    oscar_cache cache;
    oscar_batch batch;
} cl_twin;
static cl_twin cl_twin_of(fz *f, oscar_cache hc, oscar_batch hb, const int32_t *lens, const int32_t *slots,
                          const int32_t *bt, int n, int bt_stride) {
    cl_twin t;
    t.lens = dev_put(f, lens, sizeof(int32_t) * (size_t)n);
    t.slots = dev_put(f, slots, sizeof(int32_t) * (size_t)n);
    t.bt = dev_put(f, bt, sizeof(int32_t) * (size_t)n * (size_t)bt_stride);
    t.cache = hc;
    t.cache.pages = f->cl_pages;
    t.cache.windows = hc.windows ? f->cl_windows : NULL;
    t.batch = hb;
    t.batch.seq_lens = t.lens;
    t.batch.window_slots = hb.window_slots ? t.slots : NULL;
    t.batch.block_table = t.bt;
    return t;
}
/* The OpenCL pools become the CPU's (lane 0). */
static void cl_reset_pools(fz *f) {
    cr_assert_eq(oscar_buffer_write(f->rtcl, f->cl_pages, 0, f->pages[0], f->pages_bytes, NULL), OSCAR_OK);
    if (f->windows_bytes)
        cr_assert_eq(oscar_buffer_write(f->rtcl, f->cl_windows, 0, f->windows[0], f->windows_bytes, NULL), OSCAR_OK);
}
/* A call's status on OpenCL: the call's, else what the kernels flagged. */
static oscar_status cl_status(fz *f, oscar_status s, char *msg, size_t n) {
    if (s == OSCAR_OK) s = oscar_plan_check(f->pcl, f->cl_ws, NULL);
    snprintf(msg, n, "%s", oscar_last_error());
    return s;
}
/* The OpenCL status against the CPU's verdict: clean calls pass, calls that
 * must be refused are (at the call or by the flag). */
static void cl_expect(fz *f, const char *fn, const char *what, oscar_status s, const char *msg, int mut,
                      oscar_status base_expect) {
    if (s != OSCAR_OK) {
        CHECK(f, documented_refusal(s), "opencl %s (%s): status %d is not a documented refusal: %s", fn, what, s, msg);
        CHECK(f, msg[0] != '\0', "opencl %s (%s): status %d without a message", fn, what, s);
    }
    if (mut == M_NONE && base_expect == OSCAR_OK) CHECK(f, s == OSCAR_OK, "opencl %s (clean) refused: %d %s", fn, s, msg);
    if (mut == M_NONE && base_expect != OSCAR_OK)
        CHECK(f, s != OSCAR_OK, "opencl %s accepted what the CPU refuses with %d", fn, base_expect);
    if (mut == M_HARD && base_expect == OSCAR_OK) CHECK(f, s != OSCAR_OK, "opencl %s with %s accepted", fn, what);
}
/* Relative Frobenius distance of two rows sets of 16-bit values (stride apart). */
static double out_distance(fz *f, const uint16_t *a, const uint16_t *b, int64_t rows, int64_t stride) {
    double num = 0.0, den = 0.0;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < f->qrow; j++) {
            uint16_t ha = a[t * stride + j], hb = b[t * stride + j];
            float x, y;
            uint32_t ua, ub;
            if (f->l.kv_dtype == OSCAR_DTYPE_BF16) {
                ua = (uint32_t)ha << 16, ub = (uint32_t)hb << 16;
                memcpy(&x, &ua, 4), memcpy(&y, &ub, 4);
            } else {
                x = (float)((ha & 0x3ffu) | (((ha >> 10) & 0x1fu) ? 0x400u : 0u)) *
                    ldexpf(1.0f, ((ha >> 10) & 0x1f) ? (int)((ha >> 10) & 0x1f) - 25 : -24) * ((ha & 0x8000u) ? -1.0f : 1.0f);
                y = (float)((hb & 0x3ffu) | (((hb >> 10) & 0x1fu) ? 0x400u : 0u)) *
                    ldexpf(1.0f, ((hb >> 10) & 0x1f) ? (int)((hb >> 10) & 0x1f) - 25 : -24) * ((hb & 0x8000u) ? -1.0f : 1.0f);
            }
            num += ((double)x - y) * ((double)x - y);
            den += (double)y * y;
        }
    return sqrt(num) / (sqrt(den) > 1e-3 ? sqrt(den) : 1e-3);
}

/* ------------------------------------------------------------------ caches */
static void pools_free(fz *f) {
    for (int v = 0; v < 2; v++) {
        free(f->pages[v]);
        free(f->windows[v]);
        free(f->ws[v]);
        f->pages[v] = f->windows[v] = NULL;
        f->ws[v] = NULL;
        oscar_plan_destroy(f->plan[v]);
        f->plan[v] = NULL;
    }
    if (f->rtcl) {
        dev_free(f, f->cl_pages);
        dev_free(f, f->cl_windows);
        dev_free(f, f->cl_ws);
        f->cl_pages = f->cl_windows = f->cl_ws = NULL;
        oscar_plan_destroy(f->pcl);
        f->pcl = NULL;
    }
    free(f->snap_pages);
    free(f->snap_windows);
    free(f->bt);
    f->snap_pages = f->snap_windows = NULL;
    f->bt = NULL;
}

static void pools_make(fz *f) {
    rng_t *r = &f->r;
    cr_assert_eq(oscar_layout_sizes_get(&f->l, &f->sz), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_layout_pages_for(&f->l, f->l.max_seq_len, &f->pps), OSCAR_OK, "%s", oscar_last_error());
    f->windowed = f->l.method != OSCAR_METHOD_BF16 && f->l.sink + f->l.recent > 0;
    CHECK(f, (f->sz.window_slot_bytes > 0) == f->windowed, "window_slot_bytes %zu for a layout %s windows",
          f->sz.window_slot_bytes, f->windowed ? "with" : "without");
    f->num_pages = (int32_t)(MAXS * f->pps + ri(r, 1, 3));
    f->num_slots = MAXS + ri(r, 0, 1);
    f->pages_bytes = (size_t)f->num_pages * f->sz.page_bytes;
    f->windows_bytes = (size_t)f->num_slots * f->sz.window_slot_bytes;
    for (int v = 0; v < 2; v++) {
        f->pages[v] = calloc(1, f->pages_bytes);
        f->windows[v] = f->windows_bytes ? calloc(1, f->windows_bytes) : NULL;
        cr_assert(f->pages[v] && (!f->windows_bytes || f->windows[v]));
        cr_assert_eq(oscar_plan_workspace_bytes(f->plan[v], MAXS * 40, f->l.max_seq_len, &f->ws_bytes), OSCAR_OK,
                     "%s", oscar_last_error());
        f->ws[v] = calloc(1, f->ws_bytes);
        cr_assert(f->ws[v]);
        cr_assert_eq(oscar_plan_workspace_init(f->plan[v], f->ws[v], NULL), OSCAR_OK);
    }
    f->snap_pages = malloc(f->pages_bytes);
    f->snap_windows = f->windows_bytes ? malloc(f->windows_bytes) : NULL;
    cr_assert(f->snap_pages);
    /* Each sequence owns pps distinct pages, in a shuffled order. */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)f->num_pages);
    f->bt = malloc(sizeof(int32_t) * (size_t)(MAXS * f->pps + 1));
    cr_assert(perm && f->bt);
    for (int32_t i = 0; i < f->num_pages; i++) perm[i] = i;
    for (int32_t i = f->num_pages - 1; i > 0; i--) {
        int j = ri(r, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(f->bt, perm, sizeof(int32_t) * (size_t)(MAXS * f->pps));
    free(perm);
    memset(f->len, 0, sizeof f->len);
    if (f->rtcl) {
        f->cl_pages = dev_put(f, f->pages[0], f->pages_bytes);
        f->cl_windows = f->windows_bytes ? dev_put(f, f->windows[0], f->windows_bytes) : NULL;
        cr_assert_eq(oscar_plan_workspace_bytes(f->pcl, MAXS * 40, f->l.max_seq_len, &f->cl_ws_bytes), OSCAR_OK, "%s",
                     oscar_last_error());
        f->cl_ws = dev_put(f, NULL, f->cl_ws_bytes);
        cr_assert_eq(oscar_plan_workspace_init(f->pcl, f->cl_ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    }
    f->es = 2;
    f->qrow = (int64_t)f->l.num_q_heads * f->l.head_dim;
    f->kvrow = (int64_t)f->l.num_kv_heads * f->l.head_dim;
}

static void snapshot(fz *f) {
    memcpy(f->snap_pages, f->pages[0], f->pages_bytes);
    if (f->windows_bytes) memcpy(f->snap_windows, f->windows[0], f->windows_bytes);
}
/* Both caches as they were at the snapshot. */
static int cache_unchanged(const fz *f, int v) {
    return !memcmp(f->snap_pages, f->pages[v], f->pages_bytes) &&
           (!f->windows_bytes || !memcmp(f->snap_windows, f->windows[v], f->windows_bytes));
}
static int caches_equal(const fz *f) {
    return !memcmp(f->pages[0], f->pages[1], f->pages_bytes) &&
           (!f->windows_bytes || !memcmp(f->windows[0], f->windows[1], f->windows_bytes));
}
static void caches_sync(fz *f) {
    memcpy(f->pages[1], f->pages[0], f->pages_bytes);
    if (f->windows_bytes) memcpy(f->windows[1], f->windows[0], f->windows_bytes);
}

static oscar_cache cache_of(const fz *f, int v) {
    return (oscar_cache){f->pages[v], f->num_pages, f->windowed ? f->windows[v] : NULL,
                         f->windowed ? f->num_slots : 0};
}

/* A batch of nseq distinct sequences in random order. */
static int choose(fz *f, int32_t *ids) {
    int all[MAXS] = {0, 1, 2, 3};
    for (int i = MAXS - 1; i > 0; i--) {
        int j = ri(&f->r, 0, i), t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    int n = ri(&f->r, 1, MAXS);
    for (int i = 0; i < n; i++) ids[i] = all[i];
    return n;
}

/* Block table [n][stride] of the chosen sequences; columns past pps hold
 * junk no call may read. */
static int32_t *table_of(fz *f, const int32_t *ids, int n, int32_t stride) {
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(n * (stride > 0 ? stride : 1)));
    cr_assert(bt);
    for (int i = 0; i < n; i++)
        for (int32_t j = 0; j < stride; j++)
            bt[i * stride + j] = j < f->pps ? f->bt[ids[i] * f->pps + j] : PICK(&f->r, ((const int32_t[]){-1, INT32_MAX, 0}));
    return bt;
}

static void fill_rows(fz *f, uint16_t *buf, int64_t rows, int64_t stride, int64_t row, float scale) {
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < stride; j++)
            buf[t * stride + j] = j < row ? to16(f->l.kv_dtype, scale * rf(&f->r)) : to16(f->l.kv_dtype, NAN);
}

static uint16_t nonfinite16(fz *f) {
    const int bf = f->l.kv_dtype == OSCAR_DTYPE_BF16;
    switch (ri(&f->r, 0, 3)) {
    case 0: return bf ? 0x7fc0u : 0x7e00u; /* NaN */
    case 1: return bf ? 0x7f80u : 0x7c00u; /* +Inf */
    case 2: return bf ? 0xff80u : 0xfc00u; /* -Inf */
    default: return bf ? 0xff81u : 0xfc01u; /* signalling NaN, negative */
    }
}

/* The layer a call names. The harness keeps one pool for every layer, which holds while the layers'
 * pages are the same: with wide_per_layer 1 they differ in size (FORMAT.md §3.3, one pool per layer),
 * and a sequence written through layer 0's geometry and read through layer 2's read bytes of other
 * rows (seed 201393: NaN metadata, a NaN output). Those layouts keep to layer 0. */
static int one_pool_layer(const fz *f, int drawn) { return f->l.wide_per_layer ? 0 : drawn; }

/* ------------------------------------------------------------------ append */
static void do_append(fz *f) {
    rng_t *r = &f->r;
    int32_t ids[MAXS];
    const int n = choose(f, ids);
    int32_t lens[MAXS], cu[MAXS + 1], slots[MAXS];
    oscar_status base_expect = OSCAR_OK;
    const int P = f->l.page_size, S0 = f->l.sink, W = f->l.recent;
    int32_t bmax = 0;
    cu[0] = 0;
    for (int i = 0; i < n; i++) {
        int32_t L0 = f->len[ids[i]], room = f->l.max_seq_len - L0, add;
        switch (ri(r, 0, 9)) {
        case 0: add = 0; break;
        case 1: add = 1; break;
        case 2: { /* up to the end of a page of the 2-bit region (or of the BF16 pages) */
            int32_t base = f->l.method == OSCAR_METHOD_BF16 ? 0 : S0 + W, t = L0 < base ? base : L0;
            t = base + ((t - base) / P + 1) * P;
            add = t - L0;
            break;
        }
        case 3: add = S0 + W > L0 ? S0 + W - L0 : 1; break; /* exactly the windows */
        case 4: add = room; break;                         /* up to max_seq_len */
        case 5: add = room + 1; break;                     /* one past it */
        default: add = ri(r, 0, room < 24 ? (room > 0 ? room : 1) : 24); break;
        }
        if (add < 0) add = 0;
        lens[i] = L0 + add;
        cu[i + 1] = cu[i] + add;
        slots[i] = ids[i];
        if (base_expect == OSCAR_OK) /* the first sequence at fault names the code */
            base_expect = lens[i] > f->l.max_seq_len ? OSCAR_ERR_TOO_LONG : lens[i] < 1 ? OSCAR_ERR_EMPTY : OSCAR_OK;
        bmax = lens[i] > bmax ? lens[i] : bmax;
    }
    int32_t total = cu[n];
    if (total == 0) base_expect = OSCAR_ERR_EMPTY; /* refused before any sequence is looked at */
    if (bmax > f->l.max_seq_len) bmax = f->l.max_seq_len; /* the batch bound is honest; the lengths are not */
    if (bmax < 1) bmax = 1;
    int32_t batch_max = bmax + (chance(r, 30) ? ri(r, 0, f->l.max_seq_len - bmax) : 0);
    int64_t need;
    oscar_layout_pages_for(&f->l, batch_max, &need);
    int32_t stride = (int32_t)f->pps + ri(r, 0, 2);
    int64_t kv_stride = chance(r, 70) ? 0 : f->kvrow + ri(r, 0, 9);
    const int64_t ks = kv_stride ? kv_stride : f->kvrow, rows = total > 0 ? total : 1;
    uint16_t *k = malloc(sizeof(uint16_t) * (size_t)(rows * ks)), *v = malloc(sizeof(uint16_t) * (size_t)(rows * ks));
    cr_assert(k && v);
    fill_rows(f, k, rows, ks, f->kvrow, 4.0f);
    fill_rows(f, v, rows, ks, f->kvrow, 4.0f);
    int32_t *bt = table_of(f, ids, n, stride);
    const int32_t bt_stride = stride; /* as allocated */
    int layer = one_pool_layer(f, f->shared ? ri(r, 0, 5) : ri(r, 0, f->layers - 1));
    int32_t total_arg = total, nseq = n;
    oscar_cache c[2] = {cache_of(f, 0), cache_of(f, 1)};
    void *ws[2] = {f->ws[0], f->ws[1]};
    size_t wsb = f->ws_bytes;
    int mut = M_NONE, dup = 0, expect = -1;
    const char *what = "clean";
    if (chance(r, 45)) {
        mut = M_HARD;
        int i = ri(r, 0, n - 1);
        switch (ri(r, 0, 19)) {
        case 0: what = "cu_new[0] != 0"; cu[0] = PICK(r, ((const int32_t[]){1, -1, INT32_MIN})); break;
        case 1: what = "cu_new end != total_new"; total_arg = total + PICK(r, ((const int32_t[]){1, -1, 7})); break;
        case 2:
            what = "cu_new not monotone";
            if (n < 2 || total < 1) { mut = M_NONE; break; }
            cu[1 + ri(r, 0, n - 2)] = PICK(r, ((const int32_t[]){-3, INT32_MAX, INT32_MIN}));
            break;
        case 3:
            what = "seq_lens below the new tokens";
            if (cu[i + 1] - cu[i] < 1) { mut = M_NONE; break; }
            lens[i] = cu[i + 1] - cu[i] - 1;
            break;
        case 4:
            what = "block table entry out of range";
            if (f->l.method != OSCAR_METHOD_BF16 && lens[i] <= S0 + W) { mut = M_NONE; break; }
            {
                int64_t np;
                oscar_layout_pages_for(&f->l, lens[i], &np);
                if (np < 1 || lens[i] > f->l.max_seq_len) { mut = M_NONE; break; }
                bt[i * stride + ri(r, 0, (int)np - 1)] = PICK(r, ((const int32_t[]){-1, INT32_MIN}));
                bt[i * stride] = chance(r, 50) ? f->num_pages : bt[i * stride];
                expect = OSCAR_ERR_BLOCK_TABLE;
            }
            break;
        case 5:
            what = "window slot out of range";
            if (!f->windowed) { mut = M_NONE; break; }
            slots[i] = PICK(r, ((const int32_t[]){-1, INT32_MIN, INT32_MAX}));
            slots[i] = slots[i] == INT32_MAX ? f->num_slots : slots[i];
            expect = OSCAR_ERR_BLOCK_TABLE;
            break;
        case 6: {
            what = "NaN/Inf in k or v";
            if (total < 1) { mut = M_NONE; break; }
            uint16_t *t = chance(r, 50) ? k : v;
            t[(int64_t)ri(r, 0, total - 1) * ks + ri(r, 0, (int)f->kvrow - 1)] = nonfinite16(f);
            expect = OSCAR_ERR_NONFINITE;
            break;
        }
        case 7: what = "batch max_seq_len past the layout's"; batch_max = f->l.max_seq_len + ri(r, 1, 3); expect = OSCAR_ERR_TOO_LONG; break;
        case 8:
            what = "batch max_seq_len below a length";
            if (bmax < 2 || lens[i] > f->l.max_seq_len) { mut = M_NONE; break; }
            batch_max = ri(r, 1, bmax - 1);
            break;
        case 9:
            what = "block_table_stride too small";
            stride = (int32_t)need - 1;
            if (stride < 0 || need == 0) { mut = M_NONE; stride = (int32_t)f->pps; break; }
            break;
        case 10: what = "negative block_table_stride"; stride = -1; break;
        case 11: what = "kv_stride below a row"; kv_stride = ri(r, 1, (int)f->kvrow - 1); break;
        case 12: /* one row never steps by its stride: accepted */
            what = "kv_stride huge";
            kv_stride = INT64_MAX / ri(r, 1, 2); /* rows spanning more than PTRDIFF_MAX bytes */
            if (total < 2) mut = M_SOFT;
            break;
        case 13: what = "layer out of range"; layer = f->shared ? -1 : (chance(r, 50) ? -1 : f->layers); break;
        case 14: what = "workspace too small"; wsb = chance(r, 50) ? 0 : 3; expect = OSCAR_ERR_WORKSPACE; break;
        case 15:
            what = "no window pool";
            if (!f->windowed) { mut = M_NONE; break; }
            c[0].num_window_slots = c[1].num_window_slots = 0;
            break;
        case 16: what = "no page pool"; c[0].num_pages = c[1].num_pages = 0; break;
        case 17: what = "num_seqs 0"; nseq = chance(r, 50) ? 0 : -1; break;
        case 18: {
            what = "a page or slot shared by two sequences";
            if (n < 2) { mut = M_NONE; break; }
            mut = M_SOFT;
            dup = 1;
            if (f->windowed && chance(r, 50)) slots[1] = slots[0];
            else bt[stride] = bt[0];
            break;
        }
        default:
            what = "seq_lens 0 or negative";
            lens[i] = PICK(r, ((const int32_t[]){0, -1, INT32_MIN}));
            break;
        }
    }
    if (mut == M_NONE) what = "clean";
    oscar_batch b = {nseq, lens, f->windowed || chance(r, 50) ? slots : NULL, bt, stride, batch_max};
    if (getenv("FUZZ_TRACE")) {
        fprintf(stderr, "seed %llu call %d append %s total %d/%d lens", (unsigned long long)f->seed, f->call, what,
                total, total_arg);
        for (int i = 0; i < n; i++) fprintf(stderr, " %d(+%lld)", lens[i], (long long)cu[i + 1] - cu[i]);
        fprintf(stderr, "\n");
    }
    snapshot(f);
    oscar_status s[2];
    char msg0[1024];
    for (int vv = 0; vv < 2; vv++) {
        s[vv] = oscar_append(f->plan[vv], layer, &c[vv], &b, cu, total_arg, k, v, kv_stride, ws[vv], wsb, NULL);
        check_status(f, "oscar_append", s[vv]);
        if (vv == 0) snprintf(msg0, sizeof msg0, "%s", oscar_last_error());
    }
    /* With several faults too: both paths name the first in docs/API.md's order. */
    if (!dup)
        CHECK(f, s[0] == s[1], "append (%s): validate 0 gives %d (%s), validate 1 gives %d (%s)", what, s[0], msg0,
              s[1], oscar_last_error());
    if (mut == M_NONE && base_expect == OSCAR_OK)
        CHECK(f, s[0] == OSCAR_OK, "clean append refused: %d %s", s[0], msg0);
    if (mut == M_NONE && base_expect != OSCAR_OK)
        CHECK(f, s[0] == base_expect, "append expected %d, got %d (%s)", base_expect, s[0], msg0);
    if (mut == M_HARD && base_expect == OSCAR_OK)
        CHECK(f, s[0] != OSCAR_OK, "append with %s accepted", what);
    if (mut == M_HARD && base_expect == OSCAR_OK && expect >= 0)
        CHECK(f, s[0] == (oscar_status)expect, "append with %s: expected %d, got %d (%s)", what, expect, s[0], msg0);
    /* (validate 1 refuses a shared page or slot only where both sequences write it) */
    for (int vv = 0; vv < 2; vv++)
        if (s[vv] != OSCAR_OK)
            CHECK(f, cache_unchanged(f, vv), "refused append (%s, status %d) changed the cache (validate %d)", what,
                  s[vv], vv);
    if (s[0] == OSCAR_OK) {
        if (s[1] == OSCAR_OK) CHECK(f, caches_equal(f), "append (%s): caches differ between validate 0 and 1", what);
        for (int i = 0; i < n; i++) f->len[ids[i]] = lens[i];
        if (dup) { /* the shared page or slot holds garbage now: start those sequences over */
            for (int i = 0; i < n; i++) f->len[ids[i]] = 0;
            memset(f->pages[0], 0, f->pages_bytes);
            if (f->windows_bytes) memset(f->windows[0], 0, f->windows_bytes);
            memset(f->len, 0, sizeof f->len);
        }
    }
    if ((s[0] == OSCAR_OK) != (s[1] == OSCAR_OK) || dup) caches_sync(f);
    if (f->rtcl) {
        cl_twin tw = cl_twin_of(f, c[0], b, lens, slots, bt, n, bt_stride);
        void *dc = dev_put(f, cu, sizeof(int32_t) * (size_t)(n + 1)), *dk = dev_put(f, k, 2 * (size_t)(rows * ks)),
             *dv = dev_put(f, v, 2 * (size_t)(rows * ks));
        oscar_cache cc = tw.cache;
        oscar_batch cb = tw.batch;
        char msg[1024];
        oscar_status cs = cl_status(f,
                                    oscar_append(f->pcl, layer, &cc, &cb, dc, total_arg, dk, dv, kv_stride,
                                                 f->cl_ws, wsb == f->ws_bytes ? f->cl_ws_bytes : wsb, NULL),
                                    msg, sizeof msg);
        cl_expect(f, "oscar_append", what, cs, msg, mut, base_expect);
        if (cs == OSCAR_OK && s[0] == OSCAR_OK && mut == M_NONE) { /* the storage contract: the CPU's bytes */
            uint8_t *hp = malloc(f->pages_bytes), *hw = f->windows_bytes ? malloc(f->windows_bytes) : NULL;
            cr_assert(hp && (!f->windows_bytes || hw));
            dev_get(f, hp, f->cl_pages, f->pages_bytes);
            for (size_t i = 0; i < f->pages_bytes; i++) f->cl_byte_diffs += hp[i] != f->pages[0][i];
            if (hw) {
                dev_get(f, hw, f->cl_windows, f->windows_bytes);
                for (size_t i = 0; i < f->windows_bytes; i++) f->cl_byte_diffs += hw[i] != f->windows[0][i];
            }
            f->cl_appends++;
            free(hp);
            free(hw);
        }
        cl_reset_pools(f);
        void *bufs[] = {tw.lens, tw.slots, tw.bt, dc, dk, dv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(f, bufs[i]);
    }
    free(k);
    free(v);
    free(bt);
}

/* ------------------------------------------------------------------ decode / extend */
/* out rows: every value finite, the gaps between rows untouched. */
/* The statuses of one attention call under validate 0 and 1 (s[0], s[1]; msg0: validate 0's
 * message): the same code both ways, the expected one for a clean call, a refusal (the
 * expected code where known) for a call that must be refused. */
static void check_verdict(fz *f, const char *fn, const char *what, const oscar_status s[2], const char *msg0, int mut,
                          oscar_status base_expect, int expect) {
    CHECK(f, s[0] == s[1], "%s (%s): validate 0 gives %d (%s), validate 1 gives %d (%s)", fn, what, s[0], msg0, s[1],
          oscar_last_error());
    if (mut == M_NONE) CHECK(f, s[0] == base_expect, "%s (clean) expected %d, got %d (%s)", fn, base_expect, s[0], msg0);
    if (mut == M_HARD && base_expect == OSCAR_OK) CHECK(f, s[0] != OSCAR_OK, "%s with %s accepted", fn, what);
    if (mut == M_HARD && base_expect == OSCAR_OK && expect >= 0)
        CHECK(f, s[0] == (oscar_status)expect, "%s with %s: expected %d, got %d (%s)", fn, what, expect, s[0], msg0);
}

static void check_out(fz *f, const char *fn, const uint16_t *out, int64_t rows, int64_t stride) {
    const uint8_t *b = (const uint8_t *)out;
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t j = 0; j < f->qrow; j++)
            if (!finite16(f->l.kv_dtype, out[t * stride + j])) {
                CHECK(f, 0, "%s: output row %lld element %lld is not finite (0x%04x)", fn, (long long)t, (long long)j,
                      out[t * stride + j]);
                return;
            }
        if (t + 1 < rows)
            for (int64_t j = f->qrow * 2; j < stride * 2; j++)
                if (b[t * stride * 2 + j] != POISON) {
                    CHECK(f, 0, "%s: wrote into the gap after output row %lld", fn, (long long)t);
                    return;
                }
    }
}

/* A decode of query rows q (one per sequence in ids) over the cache v; out dense. */
static oscar_status plain_decode(fz *f, int vv, const int32_t *ids, int n, const uint16_t *q, uint16_t *out,
                                 float scale, int rot, int layer) {
    int32_t lens[MAXS], slots[MAXS], bmax = 1;
    for (int i = 0; i < n; i++) {
        lens[i] = f->len[ids[i]];
        slots[i] = ids[i];
        bmax = lens[i] > bmax ? lens[i] : bmax;
    }
    int32_t *bt = table_of(f, ids, n, (int32_t)f->pps);
    oscar_cache c = cache_of(f, vv);
    oscar_batch b = {n, lens, f->windowed ? slots : NULL, bt, (int32_t)f->pps, bmax};
    oscar_status s = oscar_decode(f->plan[vv], layer, &c, &b, q, 0, out, 0, scale, rot, f->ws[vv], f->ws_bytes, NULL);
    free(bt);
    return s;
}

static void do_decode(fz *f) {
    rng_t *r = &f->r;
    int32_t ids[MAXS];
    const int n = choose(f, ids);
    int32_t lens[MAXS], slots[MAXS], bmax = 1;
    oscar_status base_expect = OSCAR_OK;
    for (int i = 0; i < n; i++) {
        lens[i] = f->len[ids[i]];
        slots[i] = ids[i];
        if (lens[i] < 1) base_expect = OSCAR_ERR_EMPTY;
        bmax = lens[i] > bmax ? lens[i] : bmax;
    }
    int32_t stride = (int32_t)f->pps + ri(r, 0, 2);
    int32_t *bt = table_of(f, ids, n, stride);
    const int32_t bt_stride = stride; /* as allocated */
    int64_t qs = chance(r, 70) ? 0 : f->qrow + ri(r, 1, 9), os = chance(r, 70) ? 0 : f->qrow + ri(r, 1, 9);
    const int64_t qse = qs ? qs : f->qrow, ose = os ? os : f->qrow;
    uint16_t *q = malloc(2 * (size_t)(n * qse)), *out[2], *ref = malloc(2 * (size_t)(n * ose));
    out[0] = malloc(2 * (size_t)(n * ose));
    out[1] = malloc(2 * (size_t)(n * ose));
    cr_assert(q && out[0] && out[1] && ref);
    fill_rows(f, q, n, qse, f->qrow, 2.0f);
    memset(ref, POISON, 2 * (size_t)(n * ose));
    float scale = chance(r, 60) ? 0.0f : 0.01f + fabsf(rf(r));
    int rot = ri(r, 0, 1), layer = one_pool_layer(f, f->shared ? ri(r, 0, 5) : ri(r, 0, f->layers - 1));
    int32_t nseq = n, batch_max = bmax;
    void *ws[2] = {f->ws[0], f->ws[1]};
    size_t wsb = f->ws_bytes;
    oscar_cache c[2] = {cache_of(f, 0), cache_of(f, 1)};
    int mut = M_NONE, expect = -1;
    const char *what = "clean";
    if (chance(r, 40)) {
        mut = M_HARD;
        int i = ri(r, 0, n - 1);
        switch (ri(r, 0, 11)) {
        case 0:
            what = "NaN/Inf in q";
            q[(int64_t)i * qse + ri(r, 0, (int)f->qrow - 1)] = nonfinite16(f);
            expect = OSCAR_ERR_NONFINITE;
            break;
        case 1: what = "bad sm_scale"; scale = PICK(r, ((const float[]){NAN, -1.0f, INFINITY, -INFINITY, -0.0f - 1e-30f})); break;
        case 2:
            what = "block table entry out of range";
            {
                int64_t np;
                oscar_layout_pages_for(&f->l, lens[i], &np);
                if (np < 1 || lens[i] < 1) { mut = M_NONE; break; }
                bt[i * stride + ri(r, 0, (int)np - 1)] = chance(r, 50) ? -1 : f->num_pages;
                expect = OSCAR_ERR_BLOCK_TABLE;
            }
            break;
        case 3:
            what = "window slot out of range";
            if (!f->windowed || lens[i] < 1) { mut = M_NONE; break; }
            slots[i] = chance(r, 50) ? -1 : f->num_slots;
            expect = OSCAR_ERR_BLOCK_TABLE;
            break;
        case 4: what = "q_stride below a row"; qs = ri(r, 1, (int)f->qrow - 1); break;
        case 5: what = "out_stride below a row"; os = ri(r, 1, (int)f->qrow - 1); break;
        case 6: what = "out_stride huge"; os = INT64_MAX / ri(r, 1, 2); if (n < 2) { mut = M_NONE; os = 0; } break;
        case 7:
            what = "seq_len past max_seq_len";
            lens[i] = f->l.max_seq_len + 1;
            expect = OSCAR_ERR_TOO_LONG;
            break;
        case 8: what = "batch max_seq_len 0"; batch_max = 0; break;
        case 9: what = "workspace NULL"; ws[0] = ws[1] = NULL; expect = OSCAR_ERR_WORKSPACE; break;
        case 10: what = "num_seqs negative"; nseq = -1; break;
        default: what = "layer out of range"; layer = f->shared ? -1 : f->layers + ri(r, 0, 100); break;
        }
    }
    if (mut == M_NONE) what = "clean";
    if (getenv("FUZZ_TRACE")) fprintf(stderr, "seed %llu call %d decode n %d %s qs %lld os %lld\n", (unsigned long long)f->seed, f->call, n, what, (long long)qs, (long long)os);
    oscar_batch b = {nseq, lens, f->windowed ? slots : NULL, bt, stride, batch_max};
    snapshot(f);
    oscar_status s[2];
    char msg0[1024];
    for (int vv = 0; vv < 2; vv++) {
        memset(out[vv], POISON, 2 * (size_t)(n * ose));
        s[vv] = oscar_decode(f->plan[vv], layer, &c[vv], &b, q, qs, out[vv], os, scale, rot, ws[vv], wsb, NULL);
        check_status(f, "oscar_decode", s[vv]);
        if (vv == 0) snprintf(msg0, sizeof msg0, "%s", oscar_last_error());
        CHECK(f, cache_unchanged(f, vv), "decode (%s) changed the cache", what);
        if (s[vv] != OSCAR_OK)
            CHECK(f, !memcmp(out[vv], ref, 2 * (size_t)(n * ose)), "refused decode (%s, %d) wrote to out", what,
                  s[vv]);
    }
    check_verdict(f, "decode", what, s, msg0, mut, base_expect, expect);
    if (s[0] == OSCAR_OK && s[1] == OSCAR_OK) {
        CHECK(f, !memcmp(out[0], out[1], 2 * (size_t)(n * ose)), "decode outputs differ between validate 0 and 1");
        check_out(f, "oscar_decode", out[0], n, ose);
        /* Extend with one query per sequence: the same bytes, plus a finite LSE. */
        oscar_attn_args a;
        oscar_attn_args_default(&a);
        a.total_q = n;
        a.max_q_len = 1;
        a.q = q;
        a.q_stride = qs;
        uint16_t *eo = malloc(2 * (size_t)(n * ose));
        float *lse = malloc(sizeof(float) * (size_t)n * (size_t)f->l.num_q_heads);
        cr_assert(eo && lse);
        memset(eo, POISON, 2 * (size_t)(n * ose));
        a.out = eo;
        a.out_stride = os;
        a.out_bytes = 2 * (size_t)(n * ose);
        a.lse = lse;
        a.lse_bytes = sizeof(float) * (size_t)n * (size_t)f->l.num_q_heads;
        a.sm_scale = scale;
        a.rotated_output = rot;
        a.workspace = f->ws[0];
        a.workspace_bytes = f->ws_bytes;
        oscar_status es = oscar_extend(f->plan[0], layer, &c[0], &b, &a);
        CHECK(f, es == OSCAR_OK, "extend (cu_q NULL) after an accepted decode: %d %s", es, oscar_last_error());
        if (es == OSCAR_OK) {
            CHECK(f, !memcmp(eo, out[0], 2 * (size_t)(n * ose)), "extend with cu_q NULL differs from decode");
            for (size_t j = 0; j < (size_t)n * (size_t)f->l.num_q_heads; j++)
                if (!isfinite(lse[j])) {
                    CHECK(f, 0, "lse[%zu] = %g", j, (double)lse[j]);
                    break;
                }
        }
        free(eo);
        free(lse);
    }
    if (f->rtcl) {
        cl_twin tw = cl_twin_of(f, c[0], b, lens, slots, bt, n, bt_stride);
        void *dq = dev_put(f, q, 2 * (size_t)(n * qse)),
             *dout = dev_put(f, ref, 2 * (size_t)(n * ose));
        oscar_cache cc = tw.cache;
        oscar_batch cb = tw.batch;
        char msg[1024];
        oscar_status cs = cl_status(f,
                                    oscar_decode(f->pcl, layer, &cc, &cb, dq, qs, dout, os, scale, rot,
                                                 ws[0] ? f->cl_ws : NULL, f->cl_ws_bytes, NULL),
                                    msg, sizeof msg);
        cl_expect(f, "oscar_decode", what, cs, msg, mut, base_expect);
        if (cs == OSCAR_OK && s[0] == OSCAR_OK) {
            uint16_t *h = malloc(2 * (size_t)(n * ose));
            cr_assert(h);
            dev_get(f, h, dout, 2 * (size_t)(n * ose));
            check_out(f, "opencl oscar_decode", h, n, ose);
            double dist = out_distance(f, h, out[0], n, ose);
            CHECK(f, dist < 2e-2, "opencl decode differs from the CPU's by %g (relative)", dist);
            free(h);
        }
        void *bufs[] = {tw.lens, tw.slots, tw.bt, dq, dout};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(f, bufs[i]);
    }
    free(q);
    free(out[0]);
    free(out[1]);
    free(ref);
    free(bt);
}

static void do_extend(fz *f) {
    rng_t *r = &f->r;
    int32_t ids[MAXS];
    const int n = choose(f, ids);
    int32_t lens[MAXS], slots[MAXS], cu[MAXS + 1], bmax = 1, mq = 1;
    oscar_status base_expect = OSCAR_OK;
    cu[0] = 0;
    for (int i = 0; i < n; i++) {
        lens[i] = f->len[ids[i]];
        slots[i] = ids[i];
        int32_t q = lens[i] < 1 ? 1 : ri(r, 1, lens[i] < 6 ? lens[i] : 6);
        if (lens[i] >= 1 && chance(r, 10)) q = lens[i] < 40 ? lens[i] : 40; /* the whole sequence */
        if (lens[i] < 1 && base_expect == OSCAR_OK) base_expect = OSCAR_ERR_EMPTY;
        cu[i + 1] = cu[i] + q;
        mq = q > mq ? q : mq;
        bmax = lens[i] > bmax ? lens[i] : bmax;
    }
    int32_t total = cu[n], max_q = mq;
    if (mq > bmax) max_q = bmax; /* lens 0: a query that cannot be */
    int32_t stride = (int32_t)f->pps + ri(r, 0, 2);
    int32_t *bt = table_of(f, ids, n, stride);
    const int32_t bt_stride = stride; /* as allocated */
    int64_t qs = chance(r, 70) ? 0 : f->qrow + ri(r, 1, 9), os = chance(r, 70) ? 0 : f->qrow + ri(r, 1, 9);
    const int64_t qse = qs ? qs : f->qrow, ose = os ? os : f->qrow;
    const size_t out_bytes = 2 * (size_t)((total - 1) * ose + f->qrow);
    const size_t lse_n = (size_t)total * (size_t)f->l.num_q_heads;
    uint16_t *q = malloc(2 * (size_t)(total * qse)), *out[2], *ref = malloc(out_bytes);
    float *lse[2] = {malloc(sizeof(float) * lse_n), malloc(sizeof(float) * lse_n)}, *lref = malloc(sizeof(float) * lse_n);
    out[0] = malloc(out_bytes);
    out[1] = malloc(out_bytes);
    cr_assert(q && out[0] && out[1] && ref && lse[0] && lse[1] && lref);
    fill_rows(f, q, total, qse, f->qrow, 2.0f);
    memset(ref, POISON, out_bytes);
    memset(lref, POISON, sizeof(float) * lse_n);
    oscar_attn_args a;
    oscar_attn_args_default(&a);
    a.cu_q = cu;
    a.total_q = total;
    a.max_q_len = max_q + (chance(r, 20) ? ri(r, 0, 3) : 0);
    if (a.max_q_len > total) a.max_q_len = total;
    if (a.max_q_len > bmax) a.max_q_len = bmax;
    a.q = q;
    a.q_stride = qs;
    a.out_stride = os;
    a.out_bytes = out_bytes;
    int with_lse = chance(r, 60);
    a.lse_bytes = with_lse ? sizeof(float) * lse_n : 0;
    a.sm_scale = chance(r, 60) ? 0.0f : 0.05f + fabsf(rf(r));
    a.rotated_output = ri(r, 0, 1);
    a.workspace_bytes = f->ws_bytes;
    int layer = one_pool_layer(f, f->shared ? ri(r, 0, 5) : ri(r, 0, f->layers - 1));
    int32_t nseq = n, batch_max = bmax;
    int mut = M_NONE, expect = -1, null_args = 0;
    const char *what = "clean";
    if (chance(r, 45)) {
        mut = M_HARD;
        int i = ri(r, 0, n - 1);
        switch (ri(r, 0, 14)) {
        case 0: what = "cu_q[0] != 0"; cu[0] = PICK(r, ((const int32_t[]){1, -1, INT32_MIN})); break;
        case 1: what = "cu_q end != total_q"; cu[n] += PICK(r, ((const int32_t[]){1, -1})); break;
        case 2:
            what = "cu_q not monotone";
            if (n < 2) { mut = M_NONE; break; }
            cu[1 + ri(r, 0, n - 2)] = PICK(r, ((const int32_t[]){-5, INT32_MAX, INT32_MIN}));
            break;
        case 3:
            what = "n_i past seq_len";
            lens[i] = cu[i + 1] - cu[i] - 1;
            if (lens[i] < 1) { mut = M_NONE; lens[i] = f->len[ids[i]]; break; }
            break;
        case 4:
            what = "max_q_len below an n_i";
            if (mq < 2) { mut = M_NONE; break; }
            a.max_q_len = mq - 1;
            break;
        case 5: what = "out_bytes one short"; a.out_bytes = out_bytes - 1; break;
        case 6: what = "lse_bytes one short"; with_lse = 1; a.lse_bytes = sizeof(float) * lse_n - 1; break;
        case 7:
            what = "NaN/Inf in q";
            q[(int64_t)ri(r, 0, total - 1) * qse + ri(r, 0, (int)f->qrow - 1)] = nonfinite16(f);
            expect = OSCAR_ERR_NONFINITE;
            break;
        case 8: what = "struct_size"; a.struct_size = PICK(r, ((const uint32_t[]){0, 8, 4097, UINT32_MAX})); break;
        case 9: what = "total_q 0 or negative"; a.total_q = PICK(r, ((const int32_t[]){0, -1, INT32_MIN})); break;
        case 10: what = "bad sm_scale"; a.sm_scale = PICK(r, ((const float[]){NAN, -2.0f, INFINITY})); break;
        case 11:
            what = "block table entry out of range";
            {
                int64_t np;
                oscar_layout_pages_for(&f->l, lens[i], &np);
                if (np < 1 || lens[i] < 1) { mut = M_NONE; break; }
                bt[i * stride + ri(r, 0, (int)np - 1)] = chance(r, 50) ? INT32_MIN : f->num_pages + 5;
                expect = OSCAR_ERR_BLOCK_TABLE;
            }
            break;
        case 12: what = "args NULL"; null_args = 1; break;
        case 13: what = "cu_q NULL with several queries"; if (total == n) { mut = M_NONE; break; } a.cu_q = NULL; break;
        default: what = "q_stride huge"; a.q_stride = INT64_MAX / 2; if (total < 2) { mut = M_NONE; a.q_stride = qs; } break;
        }
    }
    if (mut == M_NONE) what = "clean";
    oscar_batch b = {nseq, lens, f->windowed ? slots : NULL, bt, stride, batch_max};
    snapshot(f);
    oscar_status s[2];
    char msg0[1024];
    for (int vv = 0; vv < 2; vv++) {
        memset(out[vv], POISON, out_bytes);
        memset(lse[vv], POISON, sizeof(float) * lse_n);
        oscar_cache c = cache_of(f, vv);
        a.out = out[vv];
        a.lse = with_lse ? lse[vv] : NULL;
        a.workspace = f->ws[vv];
        s[vv] = oscar_extend(f->plan[vv], layer, &c, &b, null_args ? NULL : &a);
        check_status(f, "oscar_extend", s[vv]);
        if (vv == 0) snprintf(msg0, sizeof msg0, "%s", oscar_last_error());
        CHECK(f, cache_unchanged(f, vv), "extend (%s) changed the cache", what);
        if (s[vv] != OSCAR_OK) {
            CHECK(f, !memcmp(out[vv], ref, out_bytes), "refused extend (%s, %d: %s) wrote to out", what, s[vv],
                  oscar_last_error());
            CHECK(f, !memcmp(lse[vv], lref, sizeof(float) * lse_n), "refused extend (%s, %d) wrote to lse", what,
                  s[vv]);
        }
    }
    check_verdict(f, "extend", what, s, msg0, mut, base_expect, expect);
    if (s[0] == OSCAR_OK && s[1] == OSCAR_OK) {
        CHECK(f, !memcmp(out[0], out[1], out_bytes), "extend outputs differ between validate 0 and 1");
        check_out(f, "oscar_extend", out[0], a.total_q, ose);
        if (with_lse) {
            CHECK(f, !memcmp(lse[0], lse[1], sizeof(float) * lse_n), "extend LSE differs between validate 0 and 1");
            for (size_t j = 0; j < lse_n; j++)
                if (!isfinite(lse[0][j])) {
                    CHECK(f, 0, "extend lse[%zu] = %g", j, (double)lse[0][j]);
                    break;
                }
        }
        /* Each sequence's last query is the decode of that query. */
        if (a.cu_q && mut == M_NONE) {
            uint16_t *dq = malloc(2 * (size_t)(n * f->qrow)), *dout = malloc(2 * (size_t)(n * f->qrow));
            cr_assert(dq && dout);
            for (int i = 0; i < n; i++)
                memcpy(dq + (size_t)i * (size_t)f->qrow, q + (size_t)(cu[i + 1] - 1) * (size_t)qse,
                       2 * (size_t)f->qrow);
            oscar_status ds = plain_decode(f, 0, ids, n, dq, dout, a.sm_scale, a.rotated_output, layer);
            CHECK(f, ds == OSCAR_OK, "decode of the extend's last queries: %d %s", ds, oscar_last_error());
            for (int i = 0; ds == OSCAR_OK && i < n; i++)
                CHECK(f, !memcmp(dout + (size_t)i * (size_t)f->qrow, out[0] + (size_t)(cu[i + 1] - 1) * (size_t)ose,
                                 2 * (size_t)f->qrow),
                      "extend's last query of sequence %d differs from its decode", i);
            free(dq);
            free(dout);
        }
    }
    if (f->rtcl) {
        cl_twin tw = cl_twin_of(f, cache_of(f, 0), b, lens, slots, bt, n, bt_stride);
        void *dc = dev_put(f, cu, sizeof(int32_t) * (size_t)(n + 1)), *dq = dev_put(f, q, 2 * (size_t)(total * qse)),
             *dout = dev_put(f, ref, out_bytes), *dlse = dev_put(f, lref, sizeof(float) * lse_n);
        oscar_cache cc = tw.cache;
        oscar_batch cb = tw.batch;
        oscar_attn_args ca = a;
        ca.cu_q = a.cu_q ? dc : NULL;
        ca.q = dq;
        ca.out = dout;
        ca.lse = with_lse ? dlse : NULL;
        ca.workspace = f->cl_ws;
        ca.workspace_bytes = f->cl_ws_bytes;
        char msg[1024];
        oscar_status cs = cl_status(f, oscar_extend(f->pcl, layer, &cc, &cb, null_args ? NULL : &ca), msg, sizeof msg);
        cl_expect(f, "oscar_extend", what, cs, msg, mut, base_expect);
        if (cs == OSCAR_OK && s[0] == OSCAR_OK) {
            uint16_t *h = malloc(out_bytes);
            float *hl = malloc(sizeof(float) * lse_n);
            cr_assert(h && hl);
            dev_get(f, h, dout, out_bytes);
            check_out(f, "opencl oscar_extend", h, a.total_q, ose);
            double dist = out_distance(f, h, out[0], a.total_q, ose);
            CHECK(f, dist < 2e-2, "opencl extend differs from the CPU's by %g (relative)", dist);
            if (with_lse) {
                dev_get(f, hl, dlse, sizeof(float) * lse_n);
                for (size_t j = 0; j < lse_n; j++)
                    if (!(fabsf(hl[j] - lse[0][j]) <= 1e-3f * (1.0f + fabsf(lse[0][j])))) {
                        CHECK(f, 0, "opencl extend lse[%zu] = %g, the CPU's %g", j, (double)hl[j], (double)lse[0][j]);
                        break;
                    }
            }
            free(h);
            free(hl);
        }
        void *bufs[] = {tw.lens, tw.slots, tw.bt, dc, dq, dout, dlse};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(f, bufs[i]);
    }
    free(q);
    free(out[0]);
    free(out[1]);
    free(ref);
    free(lse[0]);
    free(lse[1]);
    free(lref);
    free(bt);
}

/* ------------------------------------------------------------------ driver */
static void run_seed(oscar_runtime *rt0, oscar_runtime *rt1, oscar_runtime *rtcl, uint64_t seed, int calls,
                     long *byte_diffs, long *appends) {
    fz f;
    memset(&f, 0, sizeof f);
    f.seed = seed;
    f.rtcl = rtcl;
    f.r.s = seed * 0x2545f4914f6cdd1dull + 1;
    f.rt[0] = rt0;
    f.rt[1] = rt1;
    layout_expect x;
    random_layout(&f, &x);
    int params_ok, wide_fit;
    oscar_params *p = x.valid ? random_params(&f, &params_ok, &wide_fit) : NULL;
    if (!x.valid) {
        params_ok = wide_fit = 1;
        f.shared = 1;
        f.layers = 1;
    }
    oscar_status v = oscar_layout_validate(&f.l);
    CHECK(&f, (v == OSCAR_OK) == x.valid, "oscar_layout_validate gives %d (%s) for a layout that is %s", v,
          oscar_last_error(), x.valid ? "valid" : "not valid");
    if (v != OSCAR_OK) check_status(&f, "oscar_layout_validate", v);
    const int calibrated = f.l.method == OSCAR_METHOD_OSCAR2 || f.l.method == OSCAR_METHOD_OSCAR2_LM;
    const int expect_ok = x.valid && params_ok && wide_fit && !(calibrated && !p);
    oscar_status s[2];
    for (int vv = 0; vv < 2; vv++) {
        s[vv] = oscar_plan_create(vv ? rt1 : rt0, &f.l, p, &f.plan[vv]);
        check_status(&f, "oscar_plan_create", s[vv]);
        if (s[vv] != OSCAR_OK) CHECK(&f, f.plan[vv] == NULL, "refused plan_create left a plan");
    }
    if (rtcl) {
        oscar_status cs = oscar_plan_create(rtcl, &f.l, p, &f.pcl);
        CHECK(&f, cs == s[0], "opencl plan_create gives %d (%s), the CPU's %d", cs, oscar_last_error(), s[0]);
    }
    oscar_params_destroy(p);
    CHECK(&f, s[0] == s[1], "plan_create: %d vs %d", s[0], s[1]);
    CHECK(&f, (s[0] == OSCAR_OK) == expect_ok, "oscar_plan_create gives %d (%s); expected %s", s[0],
          oscar_last_error(), expect_ok ? "OK" : "a refusal");
    if (s[0] != OSCAR_OK || s[1] != OSCAR_OK) {
        oscar_plan_destroy(f.plan[0]);
        oscar_plan_destroy(f.plan[1]);
        oscar_plan_destroy(f.pcl);
        return;
    }
    pools_make(&f);
    for (f.call = 0; f.call < calls; f.call++) {
        int op = ri(&f.r, 0, 9);
        if (op < 4) do_append(&f);
        else if (op < 7) do_decode(&f);
        else do_extend(&f);
    }
    *byte_diffs += f.cl_byte_diffs;
    *appends += f.cl_appends;
    pools_free(&f);
}

static void runtimes(oscar_runtime **rt0, oscar_runtime **rt1) {
    for (int vv = 0; vv < 2; vv++) {
        oscar_runtime_options o;
        oscar_runtime_options_default(&o);
        o.backend = "cpu";
        o.validate = vv;
        cr_assert_eq(oscar_runtime_create(&o, vv ? rt1 : rt0), OSCAR_OK, "%s", oscar_last_error());
    }
}

static void seeds(unsigned long long *first, unsigned long long *count) {
    /* OSCAR_API_FUZZ_SEEDS=FIRST:COUNT explores other seeds (not in CI). */
    const char *e = getenv("OSCAR_API_FUZZ_SEEDS");
    if (e && sscanf(e, "%llu:%llu", first, count) != 2) cr_assert_fail("OSCAR_API_FUZZ_SEEDS wants FIRST:COUNT");
}

/* 240 layouts (about one in eight implausible) with 24 calls each. */
Test(api_fuzz, cpu_random_layouts_and_batches, .timeout = 600) {
    oscar_runtime *rt0, *rt1;
    runtimes(&rt0, &rt1);
    unsigned long long first = 1, count = 240;
    seeds(&first, &count);
    long diffs = 0, appends = 0;
    for (uint64_t seed = first; seed < first + count; seed++) run_seed(rt0, rt1, NULL, seed, 24, &diffs, &appends);
    oscar_runtime_destroy(rt0);
    oscar_runtime_destroy(rt1);
}

/* The same calls on OpenCL beside the CPU (fewer layouts: each new shape
 * builds its programs). Skipped without OpenCL unless OSCAR_REQUIRE_BACKENDS
 * names it. */
Test(api_fuzz, opencl_random_layouts_and_batches, .timeout = 900) {
    oscar_runtime_options o;
    oscar_runtime_options_default(&o);
    o.backend = "opencl";
    oscar_runtime *rtcl;
    if (oscar_runtime_create(&o, &rtcl) != OSCAR_OK) {
        const char *req = getenv("OSCAR_REQUIRE_BACKENDS");
        cr_assert(!(req && strstr(req, "opencl")), "opencl is required but: %s", oscar_last_error());
        cr_skip_test("opencl not available: %s", oscar_last_error());
    }
    oscar_runtime *rt0, *rt1;
    runtimes(&rt0, &rt1);
    unsigned long long first = 5001, count = 16;
    seeds(&first, &count);
    long diffs = 0, appends = 0;
    for (uint64_t seed = first; seed < first + count; seed++) run_seed(rt0, rt1, rtcl, seed, 12, &diffs, &appends);
    cr_log_info("opencl: %ld clean appends, %ld pool bytes differ from the CPU's", appends, diffs);
    oscar_runtime_destroy(rt0);
    oscar_runtime_destroy(rt1);
    oscar_runtime_destroy(rtcl);
}
