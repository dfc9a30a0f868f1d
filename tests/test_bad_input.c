/* Bad input through the public API gets the same refusal on every backend
 * (issue 12, part 3): non-finite calibration rows in either pass, NaN in q,
 * rotations that overflow kv_dtype, zero-length sequences with and without
 * host validation, parameters made for another method or group. CPU always;
 * OpenCL, CUDA and HIP when their plugin runs here (required when named in
 * OSCAR_REQUIRE_BACKENDS). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oscar/oscar.h"
#include "runtime_or_skip.h"

/* ------------------------------------------------------------ calibration */
Test(bad_input, calib_feed_refuses_nonfinite_k_and_v_in_pass_0) {
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, 2, 1, 64);
    oscar_calib *c;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    enum { N = 8 };
    float q[N * 2 * 64], k[N * 64], v[N * 64];
    for (int i = 0; i < N * 2 * 64; i++) q[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < N * 64; i++) k[i] = v[i] = (float)((i * 11) % 13) / 13.0f - 0.5f;
    k[3 * 64 + 5] = NAN;
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, k, v, OSCAR_DTYPE_F32), OSCAR_ERR_NONFINITE, "NaN key accepted");
    cr_expect(strstr(oscar_last_error(), "key"), "message: %s", oscar_last_error());
    k[3 * 64 + 5] = 0.0f;
    v[7 * 64] = INFINITY;
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, k, v, OSCAR_DTYPE_F32), OSCAR_ERR_NONFINITE, "Inf value accepted");
    cr_expect(strstr(oscar_last_error(), "value"), "message: %s", oscar_last_error());
    v[7 * 64] = 0.0f;
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, k, v, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, k, NULL, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    /* The default attention-weighted key target needs the keys in pass 0; the published one does not. */
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(oscar_last_error(), "key_attn_weight"), "message: %s", oscar_last_error());
    oscar_calib_destroy(c);
    o.key_attn_weight = 0.0f;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(c);
}

/* Two calibrations that ended in finalize's internal error ("Cholesky factor of layer 0 V/K feedback
 * metric failed: report this with the calibration data") after all their work: a value metric that
 * is symmetric with a non-negative diagonal but indefinite (accepted by oscar_calib_set_value_metric),
 * and a feedback_damp in (0, 1] as small as 1e-30 over fewer rows than head_dim (a singular key
 * metric at a ridge lost to rounding). The metric is refused at once, naming it (and so is one whose
 * entries make its fp64 sums overflow); the ridge grows until the factorization holds. */
static oscar_status calib_small(float feedback_damp, const double *M, int set_ok) {
    enum { N = 8, D = 64 };
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, 4, 2, D);
    o.sink = 0, o.recent = 0, o.feedback_damp = feedback_damp;
    oscar_calib *c;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    for (int h = 0; h < 2; h++) {
        oscar_status s = oscar_calib_set_value_metric(c, 0, h, M);
        if (!set_ok) {
            oscar_calib_destroy(c);
            return s;
        }
        cr_assert_eq(s, OSCAR_OK, "%s", oscar_last_error());
    }
    static float q[N * 4 * D], k[N * 2 * D], v[N * 2 * D];
    for (int i = 0; i < N * 4 * D; i++) q[i] = sinf(0.37f * (float)i);
    for (int i = 0; i < N * 2 * D; i++) k[i] = cosf(1.3f * (float)i), v[i] = sinf(0.7f * (float)i);
    oscar_params *p = NULL;
    oscar_status s = OSCAR_OK;
    for (int pass = 0; pass < 2 && !s; pass++)
        if (!(s = oscar_calib_begin_pass(c, pass))) s = oscar_calib_feed(c, 0, N, q, k, v, OSCAR_DTYPE_F32);
    if (!s) s = oscar_calib_finalize(c, &p);
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    return s;
}

Test(bad_input, calib_value_metric_must_be_psd_and_tiny_ridges_grow) {
    enum { D = 64 };
    double *M = calloc((size_t)D * D, sizeof *M);
    cr_assert(M);
    for (int i = 0; i < D; i++) M[i * (D + 1)] = 1.0;
    cr_expect_eq(calib_small(0.0f, M, 1), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(calib_small(1e-30f, M, 1), OSCAR_OK, "feedback_damp 1e-30: %s", oscar_last_error());
    M[1] = M[D] = 3.0; /* eigenvalues -2 and 4 in the first two coordinates */
    cr_expect_eq(calib_small(0.0f, M, 0), OSCAR_ERR_INVALID_ARGUMENT, "an indefinite metric was accepted");
    cr_expect(strstr(oscar_last_error(), "not positive semi-definite") && strstr(oscar_last_error(), "-2"),
              "message: %s", oscar_last_error());
    M[1] = M[D] = 1.0; /* [[1, 1], [1, 1]]: PSD and singular */
    cr_expect_eq(calib_small(0.0f, M, 1), OSCAR_OK, "a singular PSD metric: %s", oscar_last_error());
    M[1] = M[D] = 0.0;
    M[0] = 1e300;
    cr_expect_eq(calib_small(0.0f, M, 0), OSCAR_ERR_INVALID_ARGUMENT, "a metric entry of 1e300 was accepted");
    cr_expect(strstr(oscar_last_error(), "scale M down"), "message: %s", oscar_last_error());
    free(M);
}

/* ------------------------------------------------------- a small cache */
#define SEQ 2
#define LEN 100

typedef struct rig {
    const char *backend;
    oscar_runtime *rt;
    oscar_plan *plan;
    oscar_layout_desc l;
    void *pages, *windows, *ws, *lens, *slots, *bt, *cu, *k, *v, *q, *out;
    size_t ws_bytes, kv_elems, q_elems;
    int32_t pps;
} rig;

static oscar_dtype g_meta = OSCAR_DTYPE_F16; /* the rig's metadata dtype */
static int g_recent = 16;                     /* the rig's recent window (with windows) */
/* 1: a GPU backend's build without the rig's variant (default sets compile F16 metadata
 * only) makes rig_open return 0 instead of failing; the caller says so. */
static int g_allow_unplanned = 0;

static void *dev(rig *r, const void *src, size_t n) {
    void *b = NULL;
    cr_assert_eq(oscar_buffer_alloc(r->rt, n, &b), OSCAR_OK, "%s", oscar_last_error());
    if (src) cr_assert_eq(oscar_buffer_write(r->rt, b, 0, src, n, NULL), OSCAR_OK, "%s", oscar_last_error());
    return b;
}

static uint16_t to16(oscar_dtype t, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (t == OSCAR_DTYPE_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    /* f16 for the small integers-ish values used here: via the exponent */
    uint32_t s = (u >> 16) & 0x8000u, e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
    if (e == 0) return (uint16_t)s;
    int ee = (int)e - 127 + 15;
    if (ee >= 31) return (uint16_t)(s | 0x7c00u);
    if (ee <= 0) return (uint16_t)s;
    return (uint16_t)(s | ((uint32_t)ee << 10) | (m >> 13));
}

static float to_f32(uint16_t h) { /* bf16 */
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A runtime on the CPU backend (always built in: failing to make one fails the test). */
static oscar_runtime *cpu_runtime(void) {
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt = NULL;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK, "%s", oscar_last_error());
    return rt;
}

/* The small layout the tests below share: head_dim 64 in one group, 2 query heads on 1 KV head. */
static void small_layout(oscar_layout_desc *l) {
    oscar_layout_default(l);
    l->head_dim = 64;
    l->group = 64;
    l->num_q_heads = 2;
    l->num_kv_heads = 1;
}

/* Returns 0 (test skipped) when the backend is absent and not required.
 * windows 0: sink 0 and recent 0, and then no window pool nor slots at all. */
static int rig_open_w(rig *r, const char *backend, oscar_method m, oscar_dtype kvt, int validate, int windows) {
    memset(r, 0, sizeof *r);
    r->backend = backend;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = backend;
    ro.validate = validate;
    if (!(r->rt = rc_runtime_or_null(&ro))) return 0;
    small_layout(&r->l);
    r->l.page_size = 16;
    r->l.sink = windows ? 8 : 0;
    r->l.recent = windows ? g_recent : 0;
    r->l.max_seq_len = LEN;
    r->l.kv_dtype = kvt;
    r->l.method = m;
    r->l.meta_dtype = g_meta;
    oscar_status ps = oscar_plan_create(r->rt, &r->l, NULL, &r->plan);
    if (ps == OSCAR_ERR_UNSUPPORTED && g_allow_unplanned && strcmp(backend, "cpu")) {
        cr_log_info("%s: %s", backend, oscar_last_error());
        oscar_runtime_destroy(r->rt);
        return 0;
    }
    cr_assert_eq(ps, OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(&r->l, &sz), OSCAR_OK);
    int64_t pps;
    cr_assert_eq(oscar_layout_pages_for(&r->l, LEN, &pps), OSCAR_OK);
    r->pps = (int32_t)pps;
    int32_t lens[SEQ], slots[SEQ], cu[SEQ + 1], bt[SEQ * 8];
    for (int i = 0; i < SEQ; i++) {
        lens[i] = LEN;
        slots[i] = i;
        cu[i] = i * LEN;
        for (int j = 0; j < pps; j++) bt[i * pps + j] = i * (int32_t)pps + j;
    }
    cu[SEQ] = SEQ * LEN;
    r->pages = dev(r, NULL, sz.page_bytes * (size_t)(SEQ * pps) + 64);
    r->windows = windows ? dev(r, NULL, sz.window_slot_bytes * SEQ + 64) : NULL;
    cr_assert_eq(oscar_plan_workspace_bytes(r->plan, SEQ, LEN, &r->ws_bytes), OSCAR_OK);
    r->ws = dev(r, NULL, r->ws_bytes);
    cr_assert_eq(oscar_plan_workspace_init(r->plan, r->ws, NULL), OSCAR_OK);
    r->lens = dev(r, lens, sizeof lens);
    r->slots = windows ? dev(r, slots, sizeof slots) : NULL;
    r->bt = dev(r, bt, sizeof(int32_t) * (size_t)(SEQ * pps));
    r->cu = dev(r, cu, sizeof cu);
    r->kv_elems = (size_t)SEQ * LEN * 64;
    r->q_elems = (size_t)SEQ * 2 * 64;
    r->k = dev(r, NULL, r->kv_elems * 2);
    r->v = dev(r, NULL, r->kv_elems * 2);
    r->q = dev(r, NULL, r->q_elems * 2);
    r->out = dev(r, NULL, r->q_elems * 2);
    return 1;
}

static int rig_open(rig *r, const char *backend, oscar_method m, oscar_dtype kvt, int validate) {
    return rig_open_w(r, backend, m, kvt, validate, 1);
}

static void rig_fill(rig *r, void *buf, size_t n, float scale) {
    uint16_t *h = malloc(n * 2);
    cr_assert(h);
    for (size_t i = 0; i < n; i++) h[i] = to16(r->l.kv_dtype, scale * ((float)((i * 2654435761u) % 1000) / 1000.0f));
    cr_assert_eq(oscar_buffer_write(r->rt, buf, 0, h, n * 2, NULL), OSCAR_OK);
    free(h);
}

static oscar_cache rig_cache(const rig *r) { return (oscar_cache){r->pages, SEQ * r->pps, r->windows, r->windows ? SEQ : 0}; }
static oscar_batch rig_batch(const rig *r) { return (oscar_batch){SEQ, r->lens, r->slots, r->bt, r->pps, LEN}; }

static oscar_status rig_append(rig *r) {
    oscar_cache c = rig_cache(r);
    oscar_batch b = rig_batch(r);
    oscar_status s = oscar_append(r->plan, 0, &c, &b, r->cu, SEQ * LEN, r->k, r->v, 0, r->ws, r->ws_bytes, NULL);
    return s != OSCAR_OK ? s : oscar_plan_check(r->plan, r->ws, NULL);
}
static oscar_status rig_decode(rig *r) {
    oscar_cache c = rig_cache(r);
    oscar_batch b = rig_batch(r);
    oscar_status s = oscar_decode(r->plan, 0, &c, &b, r->q, 0, r->out, 0, 0.0f, 0, r->ws, r->ws_bytes, NULL);
    return s != OSCAR_OK ? s : oscar_plan_check(r->plan, r->ws, NULL);
}

static void rig_close(rig *r) {
    void *b[] = {r->pages, r->windows, r->ws, r->lens, r->slots, r->bt, r->cu, r->k, r->v, r->q, r->out};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i]) oscar_buffer_free(r->rt, b[i]);
    oscar_plan_destroy(r->plan);
    oscar_runtime_destroy(r->rt);
}

/* NaN in q: refused on every backend (CPU at the call, GPUs through the
 * device flag oscar_plan_check reports), never OK with NaN or zero output.
 * Methods without a rotation (BF16, INT2) too: the BF16 method's CUDA attention
 * kernel reads q itself, without the rotation kernel. */
/* A rig of method m with every sequence appended and q filled; skips the test
 * when the backend is absent. */
static void rig_ready_m(rig *r, const char *backend, oscar_method m) {
    if (!rig_open_w(r, backend, m, OSCAR_DTYPE_BF16, 0, m != OSCAR_METHOD_BF16))
        cr_skip_test("%s not available", backend);
    rig_fill(r, r->k, r->kv_elems, 1.0f);
    rig_fill(r, r->v, r->kv_elems, 1.0f);
    cr_assert_eq(rig_append(r), OSCAR_OK, "%s", oscar_last_error());
    rig_fill(r, r->q, r->q_elems, 1.0f);
}
static void rig_ready(rig *r, const char *backend) { rig_ready_m(r, backend, OSCAR_METHOD_QUAROT2); }

static void nan_q_method(const char *backend, oscar_method m) {
    rig r;
    rig_ready_m(&r, backend, m);
    cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s", oscar_last_error());
    uint16_t nan16 = r.l.kv_dtype == OSCAR_DTYPE_BF16 ? 0x7fc0u : 0x7e00u;
    cr_assert_eq(oscar_buffer_write(r.rt, r.q, 2 * (64 + 3), &nan16, 2, NULL), OSCAR_OK);
    cr_expect_eq(rig_decode(&r), OSCAR_ERR_NONFINITE, "%s method %d: NaN in q not refused", backend, (int)m);
    /* the message names the query (GPU kernels' flag said "a K/V row") */
    cr_expect(strstr(oscar_last_error(), "query"), "%s method %d: %s", backend, (int)m, oscar_last_error());
    rig_close(&r);
}
static void nan_q_case(const char *backend) {
    nan_q_method(backend, OSCAR_METHOD_QUAROT2);
    nan_q_method(backend, OSCAR_METHOD_BF16);
    nan_q_method(backend, OSCAR_METHOD_INT2);
}
Test(bad_input, nan_q_refused_cpu) { nan_q_case("cpu"); }
Test(bad_input, nan_q_refused_opencl, .timeout = 300) { nan_q_case("opencl"); }
Test(bad_input, nan_q_refused_cuda, .timeout = 300) { nan_q_case("cuda"); }
Test(bad_input, nan_q_refused_hip, .timeout = 300) { nan_q_case("hip"); }

/* Finite rows whose rotation overflows kv_dtype (bf16 near 3e38; f16 rows
 * near 6e4 rotate past 65504): refused like a NaN row, not stored as Inf. */
static void overflow_case(const char *backend, oscar_dtype kvt, float big) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_QUAROT2, kvt, 0)) cr_skip_test("%s not available", backend);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    uint16_t *h = malloc(r.kv_elems * 2);
    cr_assert(h);
    for (size_t i = 0; i < r.kv_elems; i++) h[i] = to16(kvt, (i % 64) < 32 ? big : 1.0f);
    cr_assert(h[0] != 0x7f80u && h[0] != 0x7c00u, "the test row must be finite");
    cr_assert_eq(oscar_buffer_write(r.rt, r.k, 0, h, r.kv_elems * 2, NULL), OSCAR_OK);
    free(h);
    cr_expect_eq(rig_append(&r), OSCAR_ERR_NONFINITE, "%s: rotation overflow (%g) accepted", backend, (double)big);
    rig_close(&r);
}
Test(bad_input, rotation_overflow_refused_cpu) {
    overflow_case("cpu", OSCAR_DTYPE_BF16, 3e38f);
    overflow_case("cpu", OSCAR_DTYPE_F16, 60000.0f);
}
Test(bad_input, rotation_overflow_refused_opencl, .timeout = 300) {
    overflow_case("opencl", OSCAR_DTYPE_BF16, 3e38f);
    overflow_case("opencl", OSCAR_DTYPE_F16, 60000.0f);
}
Test(bad_input, rotation_overflow_refused_cuda, .timeout = 300) {
    overflow_case("cuda", OSCAR_DTYPE_BF16, 3e38f);
    overflow_case("cuda", OSCAR_DTYPE_F16, 60000.0f);
}
Test(bad_input, rotation_overflow_refused_hip, .timeout = 300) {
    overflow_case("hip", OSCAR_DTYPE_BF16, 3e38f);
    overflow_case("hip", OSCAR_DTYPE_F16, 60000.0f);
}

/* Finite bf16 rows past f16's range with F16 metadata: a group's scale and
 * min saturated at 65504 and the cache held a clamped row without a word.
 * Refused like a rotation overflow (with and without a rotation: INT2 stores
 * the row as is); with F32 metadata the same rows are stored. */
static void meta_overflow_case(const char *backend, oscar_method m, oscar_dtype meta, float big, int refused) {
    rig r;
    g_meta = meta;
    g_allow_unplanned = meta == OSCAR_DTYPE_F32;
    int open = rig_open(&r, backend, m, OSCAR_DTYPE_BF16, 0);
    g_meta = OSCAR_DTYPE_F16;
    g_allow_unplanned = 0;
    if (!open && meta == OSCAR_DTYPE_F32) return; /* no F32-metadata kernel in this build: logged */
    if (!open) cr_skip_test("%s not available", backend);
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    uint16_t *h = malloc(r.kv_elems * 2);
    cr_assert(h);
    for (size_t i = 0; i < r.kv_elems; i++) h[i] = to16(OSCAR_DTYPE_BF16, (i % 64) < 32 ? big : -big);
    cr_assert_eq(oscar_buffer_write(r.rt, r.v, 0, h, r.kv_elems * 2, NULL), OSCAR_OK);
    free(h);
    oscar_status s = rig_append(&r);
    if (refused) {
        cr_expect_eq(s, OSCAR_ERR_NONFINITE, "%s method %d meta %d: |v| %g: status %d", backend, (int)m,
                     (int)meta, (double)big, (int)s);
        if (!strcmp(backend, "cpu"))
            cr_expect(strstr(oscar_last_error(), "F16 metadata") && strstr(oscar_last_error(), "F32"), "message: %s",
                      oscar_last_error());
    } else {
        cr_expect_eq(s, OSCAR_OK, "%s method %d meta %d: |v| %g: %s", backend, (int)m, (int)meta, (double)big,
                     oscar_last_error());
    }
    rig_close(&r);
}
static void meta_overflow_all(const char *backend) {
    meta_overflow_case(backend, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_F16, 3e4f, 1); /* rotated: ~2.4e5 */
    meta_overflow_case(backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_F16, 1e5f, 1);
    meta_overflow_case(backend, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_F32, 3e4f, 0);
    meta_overflow_case(backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_F32, 1e5f, 0);
    meta_overflow_case(backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_F16, 6e4f, 0); /* within f16: stored */
}
Test(bad_input, f16_metadata_overflow_refused_cpu) { meta_overflow_all("cpu"); }
Test(bad_input, f16_metadata_overflow_refused_opencl, .timeout = 300) { meta_overflow_all("opencl"); }
Test(bad_input, f16_metadata_overflow_refused_cuda, .timeout = 300) { meta_overflow_all("cuda"); }
Test(bad_input, f16_metadata_overflow_refused_hip, .timeout = 300) { meta_overflow_all("hip"); }

/* oscar_fakequant stores rows "as the cache would": it returned rows past
 * f16's range clamped (the F16 scale and min saturated) and a finite row past
 * bf16's range as Inf/NaN. Refused as the cache's append refuses them, rows
 * untouched. */
static void fq_case(oscar_method m, float big, oscar_status want) {
    enum { T = 32, D = 64 };
    float rows[T * D], copy[T * D];
    for (int i = 0; i < T * D; i++) rows[i] = (i % D) < 32 ? big : -big * 0.5f;
    memcpy(copy, rows, sizeof rows);
    oscar_status s = oscar_fakequant(NULL, m, 0, OSCAR_K, 0, T, 1, D, rows);
    cr_expect_eq(s, want, "method %s, |x| %g: status %d (%s)", oscar_method_name(m), (double)big, (int)s,
                 oscar_last_error());
    if (want != OSCAR_OK) {
        cr_expect(!memcmp(rows, copy, sizeof rows), "method %s: rows changed by a refused call", oscar_method_name(m));
        cr_expect(strstr(oscar_last_error(), "token 0"), "message: %s", oscar_last_error());
    } else {
        for (int i = 0; i < T * D; i++) cr_assert(isfinite(rows[i]), "method %s: row value %d not finite",
                                                  oscar_method_name(m), i);
    }
}
Test(bad_input, fakequant_refuses_rows_the_cache_refuses) {
    fq_case(OSCAR_METHOD_INT2, 1e5f, OSCAR_ERR_NONFINITE);
    fq_case(OSCAR_METHOD_INT4, 1e5f, OSCAR_ERR_NONFINITE);
    fq_case(OSCAR_METHOD_KIVI2, 1e5f, OSCAR_ERR_NONFINITE);
    fq_case(OSCAR_METHOD_QUAROT2, 3e4f, OSCAR_ERR_NONFINITE); /* rotated: past 65504 */
    fq_case(OSCAR_METHOD_BF16, 3.4e38f, OSCAR_ERR_NONFINITE);  /* rounds to bf16 Inf */
    fq_case(OSCAR_METHOD_INT2, 6e4f, OSCAR_OK);
    fq_case(OSCAR_METHOD_QUAROT2, 1e3f, OSCAR_OK);
    fq_case(OSCAR_METHOD_BF16, 1e5f, OSCAR_OK);
}

/* seq_lens 0: the same refusal with and without host-side validation. */
Test(bad_input, zero_length_sequence_same_code_with_validate_0_and_1) {
    oscar_status got[2][2];
    for (int val = 0; val < 2; val++) {
        rig r;
        cr_assert(rig_open(&r, "cpu", OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, val));
        rig_fill(&r, r.k, r.kv_elems, 1.0f);
        rig_fill(&r, r.v, r.kv_elems, 1.0f);
        int32_t zero[SEQ] = {0, LEN}, cu[SEQ + 1] = {0, 0, LEN};
        cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, zero, sizeof zero, NULL), OSCAR_OK);
        cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu, sizeof cu, NULL), OSCAR_OK);
        oscar_cache c = rig_cache(&r);
        oscar_batch b = rig_batch(&r);
        got[val][0] = oscar_append(r.plan, 0, &c, &b, r.cu, LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
        got[val][1] = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
        rig_close(&r);
    }
    cr_expect_eq(got[0][0], got[1][0], "append: validate 0 gives %d, validate 1 gives %d", got[0][0], got[1][0]);
    cr_expect_eq(got[0][1], got[1][1], "decode: validate 0 gives %d, validate 1 gives %d", got[0][1], got[1][1]);
    cr_expect_eq(got[0][0], OSCAR_ERR_EMPTY);
}

/* Hostile cu_new entries are refused without a signed overflow in the
 * checks (UBSan aborts on one): the host validation (validate = 1) and the
 * CPU backend's own. Three sequences, the third reusing the second's pages
 * and slot (refused before anything is written). */
Test(bad_input, hostile_cu_new_refused_without_overflow) {
    for (int val = 0; val < 2; val++) {
        rig r;
        cr_assert(rig_open(&r, "cpu", OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, val));
        rig_fill(&r, r.k, r.kv_elems, 1.0f);
        rig_fill(&r, r.v, r.kv_elems, 1.0f);
        int32_t lens[3] = {LEN, LEN, LEN}, slots[3] = {0, 1, 1}, cu[4] = {0, 1, INT32_MIN, SEQ * LEN};
        int32_t *bt = malloc(sizeof(int32_t) * 3 * (size_t)r.pps);
        cr_assert(bt);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < r.pps; j++) bt[i * r.pps + j] = (i < 2 ? i : 1) * r.pps + j;
        oscar_cache c = rig_cache(&r);
        oscar_batch b = {3, lens, slots, bt, r.pps, LEN};
        oscar_status s = oscar_append(r.plan, 0, &c, &b, cu, SEQ * LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: status %d (%s)", val, s, oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "cu_new"), "validate %d: message: %s", val, oscar_last_error());
        free(bt);
        rig_close(&r);
    }
}

/* Strides whose byte offsets wrap around (or run past any buffer's
 * possible size): q_stride / out_stride of a decode, kv_stride of an append,
 * q_stride of an extend, and out_stride with out_bytes = SIZE_MAX. They
 * were accepted and the CPU backend read or wrote just before the buffer
 * (ASan: heap-buffer-overflow). Refused at the call naming the stride, with
 * nothing written. */
Test(bad_input, hostile_strides_refused_before_any_access) {
    for (int val = 0; val < 2; val++) {
        rig r;
        cr_assert(rig_open(&r, "cpu", OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, val));
        rig_fill(&r, r.k, r.kv_elems, 1.0f);
        rig_fill(&r, r.v, r.kv_elems, 1.0f);
        rig_fill(&r, r.q, r.q_elems, 1.0f);
        cr_assert_eq(rig_append(&r), OSCAR_OK, "%s", oscar_last_error());
        oscar_cache c = rig_cache(&r);
        oscar_batch b = rig_batch(&r);
        const int64_t bad[] = {INT64_MAX, INT64_MAX / 2 + 1, (int64_t)1 << 62};
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            oscar_status s = oscar_decode(r.plan, 0, &c, &b, r.q, bad[k], r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
            cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: decode q_stride %lld: %d (%s)", val,
                         (long long)bad[k], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "q_stride"), "message: %s", oscar_last_error());
            s = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.out, bad[k], 0.0f, 0, r.ws, r.ws_bytes, NULL);
            cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: decode out_stride %lld: %d (%s)", val,
                         (long long)bad[k], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "out_stride"), "message: %s", oscar_last_error());
            s = oscar_append(r.plan, 0, &c, &b, r.cu, SEQ * LEN, r.k, r.v, bad[k], r.ws, r.ws_bytes, NULL);
            cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: append kv_stride %lld: %d (%s)", val,
                         (long long)bad[k], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "kv_stride"), "message: %s", oscar_last_error());
            oscar_attn_args a;
            oscar_attn_args_default(&a);
            a.total_q = SEQ;
            a.max_q_len = 1;
            a.q = r.q;
            a.q_stride = bad[k];
            a.out = r.out;
            a.out_bytes = r.q_elems * 2;
            a.workspace = r.ws;
            a.workspace_bytes = r.ws_bytes;
            s = oscar_extend(r.plan, 0, &c, &b, &a);
            cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: extend q_stride %lld: %d (%s)", val,
                         (long long)bad[k], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "q_stride"), "message: %s", oscar_last_error());
            a.q_stride = 0;
            a.out_stride = bad[k];
            a.out_bytes = SIZE_MAX; /* a size no buffer has: the stride is still refused */
            s = oscar_extend(r.plan, 0, &c, &b, &a);
            cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "validate %d: extend out_stride %lld: %d (%s)", val,
                         (long long)bad[k], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "out_stride"), "message: %s", oscar_last_error());
        }
        rig_close(&r);
    }
}

/* A layout without 16-bit windows (sink 0, recent 0) has window_slot_bytes
 * 0: no window pool nor slots are needed, and leaving them out is not a bad
 * input (the runtime refused it, the CPU backend wanted window_slots it
 * never reads). Every backend, with validate 0 and 1, appends and decodes
 * without them and agrees with the CPU backend within bf16 rounding. */
static void no_window_pool_case(const char *backend, uint16_t *ref, int have_ref) {
    for (int val = 0; val < 2; val++) {
        rig r;
        if (!rig_open_w(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, val, 0)) return;
        rig_fill(&r, r.k, r.kv_elems, 1.0f);
        rig_fill(&r, r.v, r.kv_elems, -2.0f);
        rig_fill(&r, r.q, r.q_elems, 0.5f);
        cr_assert_eq(rig_append(&r), OSCAR_OK, "%s validate %d: %s", backend, val, oscar_last_error());
        cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s validate %d: %s", backend, val, oscar_last_error());
        uint16_t got[SEQ * 2 * 64];
        cr_assert_eq(oscar_buffer_read(r.rt, got, r.out, 0, sizeof got, NULL), OSCAR_OK);
        cr_assert_eq(oscar_synchronize(r.rt, NULL), OSCAR_OK);
        if (!have_ref && !val) memcpy(ref, got, sizeof got);
        double mx = 0.0;
        for (int i = 0; i < SEQ * 2 * 64; i++) mx = fmax(mx, fabs(to_f32(ref[i])));
        for (int i = 0; i < SEQ * 2 * 64; i++) {
            double a = to_f32(ref[i]), g = to_f32(got[i]);
            cr_assert(fabs(a - g) <= 0x1p-7 * fabs(a) + 1e-3 * mx, "%s validate %d: out[%d] = %g, cpu %g", backend,
                      val, i, g, a);
        }
        rig_close(&r);
    }
}
Test(bad_input, no_window_pool_without_windows, .timeout = 300) {
    uint16_t ref[SEQ * 2 * 64];
    no_window_pool_case("cpu", ref, 0);
    no_window_pool_case("opencl", ref, 1);
    no_window_pool_case("cuda", ref, 1);
    no_window_pool_case("hip", ref, 1);
}

/* An extend whose batch has no sequences (0, negative, INT32_MIN) with a cu_q:
 * the runtime sized its checks by max(num_seqs, total_q) and so let the count
 * through; with validate = 1 the host check then allocated num_seqs entries
 * (out of memory for a negative count, an abort under ASan) and for 0 blamed
 * cu_q. Now every backend and both validate settings say OSCAR_ERR_EMPTY,
 * naming num_seqs. */
static void extend_no_sequences_case(const char *backend) {
    for (int val = 0; val < 2; val++) {
        rig r;
        if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, val)) cr_skip_test("%s not available", backend);
        static const int32_t counts[] = {0, -3, INT32_MIN};
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
            oscar_cache c = rig_cache(&r);
            oscar_batch b = rig_batch(&r);
            b.num_seqs = counts[i];
            oscar_attn_args a;
            oscar_attn_args_default(&a);
            a.cu_q = r.cu, a.total_q = 1, a.max_q_len = 1, a.q = r.q, a.out = r.out, a.out_bytes = r.q_elems * 2;
            a.workspace = r.ws, a.workspace_bytes = r.ws_bytes;
            oscar_status s = oscar_extend(r.plan, 0, &c, &b, &a);
            cr_expect_eq(s, OSCAR_ERR_EMPTY, "%s validate %d num_seqs %d: %d (%s)", backend, val, counts[i], s,
                         oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "num_seqs"), "%s: message: %s", backend, oscar_last_error());
        }
        rig_close(&r);
    }
}
Test(bad_input, extend_without_sequences_cpu) { extend_no_sequences_case("cpu"); }
Test(bad_input, extend_without_sequences_opencl, .timeout = 300) { extend_no_sequences_case("opencl"); }

/* A block table row pitch far wider than the columns used (block_table_stride
 * INT32_MAX, one sequence): with validate = 1 the host check copied
 * num_seqs x stride entries, an 8 GiB allocation and a read past the table.
 * Now it copies the columns max_seq_len needs, and the call runs (OpenCL:
 * refused by the backend's own buffer-size check, naming block_table). */
static void wide_block_table_stride_case(const char *backend) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, 1)) cr_skip_test("%s not available", backend);
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    cr_assert_eq(rig_append(&r), OSCAR_OK, "%s", oscar_last_error());
    rig_fill(&r, r.q, r.q_elems, 1.0f);
    oscar_cache c = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    b.num_seqs = 1; /* row 0 only: a second row would lie INT32_MAX entries on */
    b.block_table_stride = INT32_MAX;
    oscar_status s = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    if (s == OSCAR_OK) s = oscar_plan_check(r.plan, r.ws, NULL);
    if (strcmp(backend, "opencl"))
        cr_expect_eq(s, OSCAR_OK, "%s: decode with block_table_stride INT32_MAX: %d (%s)", backend, s,
                     oscar_last_error());
    else /* OpenCL knows its buffers' sizes and refuses a table shorter than num_seqs x stride, naming it */
        cr_expect(s == OSCAR_ERR_INVALID_ARGUMENT && strstr(oscar_last_error(), "block_table"),
                  "%s: decode with block_table_stride INT32_MAX: %d (%s)", backend, s, oscar_last_error());
    rig_close(&r);
}
Test(bad_input, wide_block_table_stride_validated_cpu) { wide_block_table_stride_case("cpu"); }
Test(bad_input, wide_block_table_stride_validated_opencl, .timeout = 300) { wide_block_table_stride_case("opencl"); }

/* oscar_buffer_write/read past a buffer's end: OpenCL said only
 * "clEnqueueWriteBuffer failed with error -30" (OSCAR_ERR_BACKEND), naming
 * neither the buffer's size nor the fix; an offset + bytes that wraps size_t
 * reached the backends (a wrapped host pointer on the CPU). */
static void buffer_copy_case(const char *backend) {
    oscar_runtime *rt = rc_runtime_or_skip(backend);
    void *buf = NULL;
    cr_assert_eq(oscar_buffer_alloc(rt, 64, &buf), OSCAR_OK, "%s", oscar_last_error());
    unsigned char h[64] = {0};
    oscar_status s = oscar_buffer_write(rt, buf, SIZE_MAX - 8, h, 16, NULL);
    cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s: wrapping write: %d (%s)", backend, s, oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "SIZE_MAX"), "%s: %s", backend, oscar_last_error());
    s = oscar_buffer_read(rt, h, buf, SIZE_MAX, 1, NULL);
    cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s: wrapping read: %d (%s)", backend, s, oscar_last_error());
    if (strcmp(backend, "cpu") != 0) { /* a device buffer knows its size */
        s = oscar_buffer_write(rt, buf, 60, h, 16, NULL);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s: write past the end: %d (%s)", backend, s, oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "16 bytes at offset 60 run past the end of the 64-byte buffer"), "%s: %s",
                  backend, oscar_last_error());
        s = oscar_buffer_read(rt, h, buf, 65, 1, NULL);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s: read past the end: %d (%s)", backend, s, oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "64-byte buffer"), "%s: %s", backend, oscar_last_error());
    }
    cr_expect_eq(oscar_buffer_write(rt, buf, 48, h, 16, NULL), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    cr_expect_eq(oscar_buffer_read(rt, h, buf, 0, 64, NULL), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    oscar_buffer_free(rt, buf);
    oscar_runtime_destroy(rt);
}
Test(bad_input, buffer_copies_past_the_end_cpu) { buffer_copy_case("cpu"); }
Test(bad_input, buffer_copies_past_the_end_opencl, .timeout = 120) { buffer_copy_case("opencl"); }

/* Host memory past the machine's on the CPU backend (1 TiB, 2^50 bytes, SIZE_MAX - 1): refused,
 * naming the size and the fix. aligned_alloc was asked: NULL at best, an abort under ASan. */
Test(bad_input, cpu_alloc_past_the_machines_memory_names_it) {
    oscar_runtime *rt = cpu_runtime();
    const size_t sizes[] = {(size_t)1 << 40, (size_t)1 << 50, SIZE_MAX - 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *b = (void *)1;
        cr_expect_eq(oscar_buffer_alloc(rt, sizes[i], &b), OSCAR_ERR_OUT_OF_MEMORY, "%zu bytes: %s", sizes[i],
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "GiB") && strstr(oscar_last_error(), "allocate less"), "%s",
                  oscar_last_error());
    }
    void *b = NULL;
    cr_expect_eq(oscar_buffer_alloc(rt, 4096, &b), OSCAR_OK, "%s", oscar_last_error());
    oscar_buffer_free(rt, b);
    oscar_runtime_destroy(rt);
}

/* ----------------------------------------------------------------- extend */
#define TQ 7 /* query tokens of the extend cases: 3 for sequence 0, 4 for sequence 1 */

typedef struct ext_rig {
    void *ws, *out, *lse, *cu, *q;
    size_t ws_bytes, out_bytes, lse_bytes;
} ext_rig;

static void ext_poison(rig *r, ext_rig *x) {
    unsigned char *ff = malloc(x->out_bytes);
    memset(ff, 0xff, x->out_bytes);
    cr_assert_eq(oscar_buffer_write(r->rt, x->out, 0, ff, x->out_bytes, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r->rt, x->lse, 0, ff, x->lse_bytes, NULL), OSCAR_OK);
    free(ff);
}
/* 1 when out and lse still hold nothing but the 0xFF pattern. */
static int ext_untouched(rig *r, ext_rig *x) {
    unsigned char *h = malloc(x->out_bytes + x->lse_bytes);
    cr_assert_eq(oscar_buffer_read(r->rt, h, x->out, 0, x->out_bytes, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_read(r->rt, h + x->out_bytes, x->lse, 0, x->lse_bytes, NULL), OSCAR_OK);
    cr_assert_eq(oscar_synchronize(r->rt, NULL), OSCAR_OK);
    int ok = 1;
    for (size_t i = 0; i < x->out_bytes + x->lse_bytes; i++) ok &= h[i] == 0xff;
    free(h);
    return ok;
}
static oscar_attn_args ext_args(const ext_rig *x, int total_q, int max_q) {
    oscar_attn_args a;
    oscar_attn_args_default(&a);
    a.cu_q = x->cu;
    a.total_q = total_q;
    a.max_q_len = max_q;
    a.q = x->q;
    a.out = x->out;
    a.out_bytes = x->out_bytes;
    a.lse = x->lse;
    a.lse_bytes = x->lse_bytes;
    a.workspace = x->ws;
    a.workspace_bytes = x->ws_bytes;
    return a;
}
/* The call's status, or the device flag's when the call itself passed. */
static oscar_status ext_run(rig *r, ext_rig *x, const oscar_attn_args *a) {
    oscar_cache c = rig_cache(r);
    oscar_batch b = rig_batch(r);
    oscar_status s = oscar_extend(r->plan, 0, &c, &b, a);
    return s != OSCAR_OK ? s : oscar_plan_check(r->plan, x->ws, NULL);
}

/* Bad query counts, buffers too small and a wrong struct_size: a clear
 * status naming the field, and nothing written to out or lse. The CPU
 * backend (and any backend with validate = 1) refuses at the call with the
 * specific code; GPU kernels without validation raise the length flag
 * (OSCAR_ERR_TOO_LONG from oscar_plan_check). */
static void extend_bad_case(const char *backend, int validate) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, validate))
        cr_skip_test("%s not available", backend);
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    cr_assert_eq(rig_append(&r), OSCAR_OK, "%s", oscar_last_error());
    ext_rig x;
    size_t qe = (size_t)TQ * 2 * 64;
    cr_assert_eq(oscar_plan_workspace_bytes(r.plan, TQ, LEN, &x.ws_bytes), OSCAR_OK);
    x.ws = dev(&r, NULL, x.ws_bytes);
    cr_assert_eq(oscar_plan_workspace_init(r.plan, x.ws, NULL), OSCAR_OK);
    x.out_bytes = qe * 2;
    x.lse_bytes = (size_t)TQ * 2 * sizeof(float);
    x.out = dev(&r, NULL, x.out_bytes);
    x.lse = dev(&r, NULL, x.lse_bytes);
    x.q = dev(&r, NULL, qe * 2);
    rig_fill(&r, x.q, qe, 1.0f);
    int32_t good[SEQ + 1] = {0, 3, TQ};
    x.cu = dev(&r, good, sizeof good);
    oscar_attn_args a = ext_args(&x, TQ, 4);
    cr_assert_eq(ext_run(&r, &x, &a), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    const int gpu_flag = strcmp(backend, "cpu") && !validate; /* device-side detection */
    struct {
        int32_t cu[SEQ + 1];
        int total_q, max_q;
        oscar_status cpu; /* the code at the call (CPU, validate = 1) */
        const char *field;
    } cases[] = {
        {{0, 0, TQ}, TQ, TQ, OSCAR_ERR_EMPTY, "n_i >= 1"},                /* n_0 = 0 */
        {{0, 3, TQ}, TQ, 3, OSCAR_ERR_TOO_LONG, "max_q_len"},             /* n_1 = 4 > max_q_len */
        {{0, 3, TQ}, TQ - 1, 4, OSCAR_ERR_INVALID_ARGUMENT, "total_q"},   /* cu_q ends at 7, total_q 6 */
        {{1, 3, TQ}, TQ, 4, OSCAR_ERR_INVALID_ARGUMENT, "cu_q"},          /* cu_q[0] != 0 */
        {{0, 2, 1}, 1, 1, OSCAR_ERR_TOO_LONG, "max_q_len"},               /* decreasing: n_0 2, n_1 -1 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ext_poison(&r, &x);
        cr_assert_eq(oscar_buffer_write(r.rt, x.cu, 0, cases[k].cu, sizeof cases[k].cu, NULL), OSCAR_OK);
        oscar_attn_args b = ext_args(&x, cases[k].total_q, cases[k].max_q);
        oscar_status s = ext_run(&r, &x, &b);
        oscar_status want = gpu_flag ? OSCAR_ERR_TOO_LONG : cases[k].cpu;
        cr_expect_eq(s, want, "%s (validate %d) case %zu: status %d, want %d (%s)", backend, validate, k, s, want,
                     oscar_last_error());
        /* the device flag's message names the query table too (it named seq_lens and cu_new only) */
        const char *field = gpu_flag ? "cu_q" : cases[k].field;
        cr_expect(strstr(oscar_last_error(), field), "%s (validate %d) case %zu: message does not name %s: %s",
                  backend, validate, k, field, oscar_last_error());
        cr_expect(ext_untouched(&r, &x), "%s (validate %d) case %zu: out or lse written", backend, validate, k);
    }
    /* n_0 > seq_lens[0]: a 2-token sequence asked for 3 queries. */
    ext_poison(&r, &x);
    int32_t lens[SEQ] = {2, LEN};
    cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens, sizeof lens, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r.rt, x.cu, 0, good, sizeof good, NULL), OSCAR_OK);
    cr_expect_eq(ext_run(&r, &x, &a), OSCAR_ERR_TOO_LONG, "%s: n_i > seq_len: %s", backend, oscar_last_error());
    if (!gpu_flag) cr_expect(strstr(oscar_last_error(), "seq_lens"), "message: %s", oscar_last_error());
    cr_expect(ext_untouched(&r, &x), "%s: n_i > seq_len wrote output", backend);
    lens[0] = LEN;
    cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens, sizeof lens, NULL), OSCAR_OK);
    /* Host-side refusals, the same on every backend. */
    struct {
        oscar_attn_args a;
        oscar_status want;
        const char *field;
    } host[12];
    int nh = 0;
    host[nh].a = a, host[nh].a.lse_bytes = x.lse_bytes - 1, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT,
    host[nh++].field = "lse_bytes";
    host[nh].a = a, host[nh].a.out_bytes = x.out_bytes - 2, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT,
    host[nh++].field = "out_bytes";
    host[nh].a = a, host[nh].a.out_stride = 2 * 64 + 8, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT,
    host[nh++].field = "out_bytes"; /* a padded stride no longer fits the buffer */
    host[nh].a = a, host[nh].a.out_stride = INT64_MAX, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT,
    host[nh++].field = "out_stride"; /* its byte count wraps around: no buffer's stride */
    host[nh].a = a, host[nh].a.total_q = 0, host[nh].want = OSCAR_ERR_EMPTY, host[nh++].field = "total_q";
    host[nh].a = a, host[nh].a.max_q_len = 0, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT,
    host[nh++].field = "max_q_len";
    host[nh].a = a, host[nh].a.cu_q = NULL, host[nh].want = OSCAR_ERR_INVALID_ARGUMENT, host[nh++].field = "cu_q";
    host[nh].a = a, host[nh].a.struct_size = 8, host[nh].want = OSCAR_ERR_VERSION, host[nh++].field = "struct_size";
    host[nh].a = a, host[nh].a.workspace_bytes = 100, host[nh].want = OSCAR_ERR_WORKSPACE,
    host[nh++].field = "workspace";
    for (int k = 0; k < nh; k++) {
        ext_poison(&r, &x);
        oscar_status s = ext_run(&r, &x, &host[k].a);
        cr_expect_eq(s, host[k].want, "%s host case %d: status %d, want %d (%s)", backend, k, s, host[k].want,
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), host[k].field), "%s host case %d: message does not name %s: %s",
                  backend, k, host[k].field, oscar_last_error());
        cr_expect(ext_untouched(&r, &x), "%s host case %d: out or lse written", backend, k);
    }
    /* A newer caller's larger struct with a field set beyond this library's. */
    union {
        oscar_attn_args a;
        unsigned char b[sizeof(oscar_attn_args) + 8];
    } big;
    memset(&big, 0, sizeof big);
    big.a = a;
    big.a.struct_size = sizeof big;
    big.b[sizeof a + 3] = 1;
    oscar_cache c = rig_cache(&r);
    oscar_batch bb = rig_batch(&r);
    cr_expect_eq(oscar_extend(r.plan, 0, &c, &bb, &big.a), OSCAR_ERR_VERSION);
    big.b[sizeof a + 3] = 0;
    cr_expect_eq(oscar_extend(r.plan, 0, &c, &bb, &big.a), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(oscar_plan_check(r.plan, x.ws, NULL), OSCAR_OK);
    void *b2[] = {x.ws, x.out, x.lse, x.cu, x.q};
    for (size_t i = 0; i < sizeof b2 / sizeof b2[0]; i++) oscar_buffer_free(r.rt, b2[i]);
    rig_close(&r);
}
Test(bad_input, extend_refusals_cpu) { extend_bad_case("cpu", 0); }
Test(bad_input, extend_refusals_opencl, .timeout = 300) {
    extend_bad_case("opencl", 0);
    extend_bad_case("opencl", 1);
}
Test(bad_input, extend_refusals_cuda, .timeout = 300) {
    extend_bad_case("cuda", 0);
    extend_bad_case("cuda", 1);
    /* the long-chunk kernel and its many-row merge on every extend call (docs/API.md) */
    cr_assert_eq(setenv("OSCAR_EXTEND_FA", "1", 1), 0);
    extend_bad_case("cuda", 0);
    cr_assert_eq(unsetenv("OSCAR_EXTEND_FA"), 0);
}
Test(bad_input, extend_refusals_hip, .timeout = 300) {
    extend_bad_case("hip", 0);
    extend_bad_case("hip", 1);
}

/* OpenCL buffers are cl_mem handles whose sizes the plugin can ask for: a
 * call whose counts need more than a buffer holds (out of 16 bytes for 2
 * query rows, a page pool smaller than num_pages pages, a workspace smaller
 * than workspace_bytes, ...) ran the kernels past the buffer: heap
 * corruption on PoCL ("free(): invalid pointer"), or reads of whatever lay
 * behind it. Refused before any launch, naming the buffer and both sizes. */
static void opencl_small_buffers(int validate) {
    rig r;
    if (!rig_open(&r, "opencl", OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, validate)) cr_skip_test("opencl not available");
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    rig_fill(&r, r.q, r.q_elems, 1.0f);
    cr_assert_eq(rig_append(&r), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s", oscar_last_error());
    void *small = dev(&r, NULL, 16), *tiny = dev(&r, NULL, 4); /* tiny: less than SEQ int32 */
    for (int k = 0; k < 11; k++) {
        oscar_cache c = rig_cache(&r);
        oscar_batch b = rig_batch(&r);
        void *q = r.q, *out = r.out, *kk = r.k, *cu = r.cu;
        size_t wsb = r.ws_bytes;
        const char *name = "";
        int append = 0;
        oscar_status want = OSCAR_ERR_INVALID_ARGUMENT;
        switch (k) {
        case 0: out = small, name = "out"; break;
        case 1: q = small, name = "q"; break;
        case 2: c.pages = small, name = "pages"; break;
        case 3: c.pages = small, name = "pages", append = 1; break;
        case 4: c.windows = small, name = "windows"; break;
        case 5: b.block_table = small, name = "block_table"; break;
        case 6: b.seq_lens = tiny, name = "seq_lens"; break;
        case 7: b.window_slots = tiny, name = "window_slots", append = 1; break;
        case 8: kk = small, name = "k", append = 1; break;
        case 9: cu = tiny, name = "cu_new", append = 1; break;
        case 10: wsb = r.ws_bytes + 4096, name = "workspace", want = OSCAR_ERR_WORKSPACE; break;
        }
        oscar_status s = append ? oscar_append(r.plan, 0, &c, &b, cu, SEQ * LEN, kk, r.v, 0, r.ws, wsb, NULL)
                                : oscar_decode(r.plan, 0, &c, &b, q, 0, out, 0, 0.0f, 0, r.ws, wsb, NULL);
        cr_expect_eq(s, want, "case %d (%s): status %d (%s)", k, name, s, oscar_last_error());
        cr_expect(strstr(oscar_last_error(), name), "case %d: message does not name %s: %s", k, name,
                  oscar_last_error());
        cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "case %d: a kernel ran: %s", k,
                     oscar_last_error());
    }
    /* extend: lse and the cu_q of a call are checked the same way */
    oscar_attn_args a;
    oscar_attn_args_default(&a);
    a.total_q = SEQ, a.max_q_len = 1, a.q = r.q, a.out = r.out, a.out_bytes = r.q_elems * 2, a.lse = tiny,
    a.lse_bytes = 4096, a.workspace = r.ws, a.workspace_bytes = r.ws_bytes;
    oscar_cache c = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    cr_expect_eq(oscar_extend(r.plan, 0, &c, &b, &a), OSCAR_ERR_INVALID_ARGUMENT, "%s", oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "lse"), "message: %s", oscar_last_error());
    a.lse = NULL, a.lse_bytes = 0, a.cu_q = tiny;
    cr_expect_eq(oscar_extend(r.plan, 0, &c, &b, &a), OSCAR_ERR_INVALID_ARGUMENT, "%s", oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "cu_q"), "message: %s", oscar_last_error());
    cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s", oscar_last_error());
    oscar_buffer_free(r.rt, small);
    oscar_buffer_free(r.rt, tiny);
    rig_close(&r);
}
Test(bad_input, opencl_buffers_smaller_than_the_call_says_are_refused, .timeout = 300) { opencl_small_buffers(0); }
/* validate = 1 copies the index arrays to the host first: a short one was refused by that copy, whose
 * message named neither the call nor the array ("opencl read: 60 bytes at offset 64 run past the end
 * of the 64-byte buffer"), about a read the caller never asked for. */
Test(bad_input, opencl_buffers_smaller_than_the_call_says_are_named_with_validate, .timeout = 300) {
    opencl_small_buffers(1);
}

/* ------------------------------------------------------------- parameters */
/* A quarot2 plan took its rotation from whatever parameters it was given: int2 (identity) parameters
 * made it an int2 cache, calibrated oscar2 ones an unclipped OSCAR rotation, both named quarot2 and
 * without a word (int2 and bf16 plans force their identity whatever the parameters hold). Refused
 * like a calibrated layout given baseline parameters; quarot2 parameters and NULL still serve. */
Test(bad_input, quarot2_plan_refuses_params_of_another_method) {
    oscar_runtime *rt = cpu_runtime();
    oscar_layout_desc l;
    small_layout(&l);
    l.method = OSCAR_METHOD_QUAROT2;
    const oscar_method others[] = {OSCAR_METHOD_INT2, OSCAR_METHOD_OSCAR2, OSCAR_METHOD_OSCAR2_LM, OSCAR_METHOD_BF16};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        oscar_params *p = NULL;
        oscar_plan *plan = NULL;
        cr_assert_eq(oscar_params_create_builtin(others[i], 1, 2, 1, 64, &p), OSCAR_OK);
        cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_SHAPE_MISMATCH, "%s parameters served quarot2",
                     oscar_method_name(others[i]));
        cr_expect(strstr(oscar_last_error(), oscar_method_name(others[i])) && strstr(oscar_last_error(), "quarot2"),
                  "message: %s", oscar_last_error());
        oscar_plan_destroy(plan);
        oscar_params_destroy(p);
    }
    oscar_params *p = NULL;
    oscar_plan *plan = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 1, 2, 1, 64, &p), OSCAR_OK);
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    cr_expect_eq(oscar_plan_create(rt, &l, NULL, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(plan);
    oscar_params_destroy(p);
    oscar_runtime_destroy(rt);
}

Test(bad_input, plan_refuses_params_of_another_method_or_group, .timeout = 120) {
    oscar_runtime *rt = cpu_runtime();
    oscar_layout_desc l;
    small_layout(&l);
    oscar_params *p;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 1, 2, 1, 64, &p), OSCAR_OK);
    oscar_plan *plan = NULL;
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_SHAPE_MISMATCH, "int2 parameters served oscar2");
    cr_expect(strstr(oscar_last_error(), "int2"), "message: %s", oscar_last_error());
    oscar_plan_destroy(plan);
    oscar_params_destroy(p);
    /* Calibrated parameters (group 64, d 64) against a layout of group 32. */
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, 2, 1, 64);
    oscar_calib *c;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    enum { N = 512 };
    float *q = malloc(sizeof(float) * N * 2 * 64), *k = malloc(sizeof(float) * N * 64),
          *v = malloc(sizeof(float) * N * 64);
    cr_assert(q && k && v);
    uint64_t s = 88172645463325252ull;
    for (int pass = 0; pass < 2; pass++) {
        s = 88172645463325252ull;
        for (int i = 0; i < N * 2 * 64; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            q[i] = (float)(s >> 40) / 16777216.0f - 0.5f;
        }
        for (int i = 0; i < N * 64; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            k[i] = (float)(s >> 40) / 16777216.0f - 0.5f;
            v[i] = (float)((s >> 20) & 0xffff) / 65536.0f - 0.5f;
        }
        cr_assert_eq(oscar_calib_begin_pass(c, pass), OSCAR_OK);
        cr_assert_eq(oscar_calib_feed(c, 0, N, q, k, v, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    }
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    l.group = 32;
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_SHAPE_MISMATCH, "group-64 clips served group 32");
    cr_expect(strstr(oscar_last_error(), "group"), "message: %s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    /* Clips fitted for sink 64, recent 256 (recorded by the calibration) under other windows: a valid,
     * less accurate cache, accepted (runtime/plan.c says why). */
    l.group = 64;
    l.sink = 8;
    l.recent = 0;
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    free(q);
    free(k);
    free(v);
    oscar_runtime_destroy(rt);
}

/* ------------------------------------------------------- code widths */
/* 3-bit head-tensors (FORMAT.md §2.7) are opt-in: the backends whose caps hold
 * OSCAR_BACKEND_CAP_WIDE_CODES (all four built here) plan them when the layout has room
 * (layout.wide_tensors); a backend without it (capless: a plugin that runs but has no kernels,
 * tests/fake_plugin) refuses such parameters and layouts with OSCAR_ERR_UNSUPPORTED and a message
 * naming the field, never a plan that would read 2-bit codes. */
static void wide_codes_case(const char *backend, const char *plugin_dir) {
    oscar_runtime *rt = NULL;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = backend;
    ro.plugin_dir = plugin_dir;
    if (oscar_runtime_create(&ro, &rt) != OSCAR_OK) {
        /* the capless plugin is built beside this test; a binary carried to another machine lacks it */
        char path[4096];
        snprintf(path, sizeof path, "%s/liboscar_backend_%s.so", plugin_dir ? plugin_dir : "", backend);
        cr_assert(!rc_backend_required(backend) && (!plugin_dir || access(path, R_OK) != 0), "%s is required but: %s", backend,
                  oscar_last_error());
        cr_skip_test("%s not available", backend);
    }
    const int cpu = !plugin_dir; /* the real backends store them */
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 2, 4, 2, 64, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 1, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = 64;
    l.group = 64;
    l.num_q_heads = 4;
    l.num_kv_heads = 2;
    l.max_seq_len = LEN;
    l.wide_tensors = 1;
    oscar_plan *plan = NULL;
    oscar_status s = oscar_plan_create(rt, &l, p, &plan);
    if (cpu) {
        cr_expect_eq(s, OSCAR_OK, "%s", oscar_last_error());
        cr_expect(strstr(oscar_plan_variant(plan), "_w3") != NULL, "variant %s", oscar_plan_variant(plan));
    } else {
        cr_expect_eq(s, OSCAR_ERR_UNSUPPORTED, "%s planned 3-bit head-tensors: %s", backend, oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "code_bits") != NULL, "message: %s", oscar_last_error());
    }
    oscar_plan_destroy(plan);
    plan = NULL;
    /* A layout with room for them but 2-bit parameters: refused where the pages are not understood. */
    oscar_params *p2 = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 2, 4, 2, 64, &p2), OSCAR_OK);
    s = oscar_plan_create(rt, &l, p2, &plan);
    cr_expect_eq(s, cpu ? OSCAR_OK : OSCAR_ERR_UNSUPPORTED, "%s: %s", backend, oscar_last_error());
    if (!cpu) cr_expect(strstr(oscar_last_error(), "wide_tensors") != NULL, "message: %s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    oscar_params_destroy(p2);
    if (cpu) {
        /* No room in the pages for the parameters' 3-bit head-tensor. */
        l.wide_tensors = 0;
        cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_SHAPE_MISMATCH);
        cr_expect(strstr(oscar_last_error(), "wide_tensors") != NULL, "message: %s", oscar_last_error());
        /* Lloyd-Max layouts have no 3-bit codes, with or without room asked for. */
        l.method = OSCAR_METHOD_OSCAR2_LM;
        cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_UNSUPPORTED);
        cr_expect(strstr(oscar_last_error(), "code_bits") != NULL, "message: %s", oscar_last_error());
        l.wide_tensors = 1;
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_UNSUPPORTED);
        cr_expect(strstr(oscar_last_error(), "wide_tensors") != NULL, "message: %s", oscar_last_error());
        l.method = OSCAR_METHOD_OSCAR2;
        l.wide_tensors = 5; /* more than 2 num_kv_heads */
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_INVALID_ARGUMENT);
        cr_expect(strstr(oscar_last_error(), "wide_tensors") != NULL, "message: %s", oscar_last_error());
        l.wide_tensors = -1;
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_INVALID_ARGUMENT);
        /* Page geometry: one 1-bit plane of P x d/8 bytes per head-tensor of room. */
        oscar_layout_sizes a, b;
        l.wide_tensors = 0;
        cr_assert_eq(oscar_layout_sizes_get(&l, &a), OSCAR_OK);
        l.wide_tensors = 3;
        cr_assert_eq(oscar_layout_sizes_get(&l, &b), OSCAR_OK);
        cr_expect_eq(b.page_bytes - a.page_bytes, (size_t)3 * (size_t)l.page_size * 64 / 8, "%zu -> %zu",
                     a.page_bytes, b.page_bytes);
        cr_expect(fabs(b.bits_per_element - a.bits_per_element - 3.0 / 4.0) < 1e-12, "bits %g -> %g",
                  a.bits_per_element, b.bits_per_element);
    }
    oscar_params_destroy(p);
    oscar_runtime_destroy(rt);
}
Test(bad_input, wide_codes_cpu) { wide_codes_case("cpu", NULL); }
Test(bad_input, wide_codes_opencl, .timeout = 300) { wide_codes_case("opencl", NULL); }
Test(bad_input, wide_codes_cuda, .timeout = 300) { wide_codes_case("cuda", NULL); }
Test(bad_input, wide_codes_hip, .timeout = 300) { wide_codes_case("hip", NULL); }
Test(bad_input, wide_codes_refused_capless) { wide_codes_case("hip", OSCAR_CAPLESS_PLUGIN_DIR); }
/* Per-layer page sizes (layout.wide_per_layer, FORMAT.md §3.3): the field takes 0 or 1 and 1 only with
 * oscar2; oscar_plan_layer_sizes refuses NULLs and layers outside the parameters, naming itself, and
 * gives each layer's pages exactly its planes while oscar_layout_sizes_get keeps the largest page. */
Test(bad_input, wide_per_layer_field_and_layer_sizes) {
    oscar_runtime *rt = cpu_runtime();
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = 64, l.group = 64, l.num_q_heads = 4, l.num_kv_heads = 2, l.max_seq_len = LEN;
    l.wide_tensors = 2;
    const int bad[] = {-1, 2, 7, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l.wide_per_layer = bad[i];
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_INVALID_ARGUMENT, "wide_per_layer %d", bad[i]);
        cr_expect(strstr(oscar_last_error(), "wide_per_layer") != NULL, "message: %s", oscar_last_error());
        oscar_layout_sizes z;
        cr_expect_eq(oscar_layout_sizes_get(&l, &z), OSCAR_ERR_INVALID_ARGUMENT);
    }
    l.wide_per_layer = 1;
    l.wide_tensors = 0;
    const oscar_method others[] = {OSCAR_METHOD_OSCAR2_LM, OSCAR_METHOD_INT2, OSCAR_METHOD_QUAROT2, OSCAR_METHOD_BF16};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        l.method = others[i];
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_UNSUPPORTED, "%s", oscar_method_name(others[i]));
        cr_expect(strstr(oscar_last_error(), "wide_per_layer") != NULL, "message: %s", oscar_last_error());
    }
    l.method = OSCAR_METHOD_OSCAR2;
    l.wide_tensors = 2;
    cr_expect_eq(oscar_layout_validate(&l), OSCAR_OK, "%s", oscar_last_error());

    /* Layers with 1, 0 and 2 3-bit head-tensors. */
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 3, 4, 2, 64, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 0, 1, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 0, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan *plan = NULL;
    cr_assert_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_sizes big, s;
    cr_assert_eq(oscar_layout_sizes_get(&l, &big), OSCAR_OK);
    const size_t plane = (size_t)l.page_size * 64 / 8;
    const int planes[3] = {1, 0, 2};
    for (int layer = 0; layer < 3; layer++) {
        memset(&s, 0xA5, sizeof s);
        cr_assert_eq(oscar_plan_layer_sizes(plan, layer, &s), OSCAR_OK, "%s", oscar_last_error());
        cr_expect_eq(s.page_bytes, big.page_bytes - (size_t)(2 - planes[layer]) * plane, "layer %d: %zu of %zu",
                     layer, s.page_bytes, big.page_bytes);
        /* group 64: 2.5 bits before the planes */
        cr_expect(fabs(s.bits_per_element - (2.5 + planes[layer] / 4.0)) < 1e-12, "layer %d: %g bits", layer,
                  s.bits_per_element);
        cr_expect(s.k_codes_offset == big.k_codes_offset && s.v_codes_offset == big.v_codes_offset &&
                  s.k_meta_offset == big.k_meta_offset && s.v_meta_offset == big.v_meta_offset &&
                  s.window_slot_bytes == big.window_slot_bytes);
    }
    cr_expect(fabs(big.bits_per_element - 3.0) < 1e-12, "largest page: %g bits", big.bits_per_element);
    const int layers[] = {-1, 3, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        cr_expect_eq(oscar_plan_layer_sizes(plan, layers[i], &s), OSCAR_ERR_INVALID_ARGUMENT, "layer %d", layers[i]);
        cr_expect(strstr(oscar_last_error(), "oscar_plan_layer_sizes") && strstr(oscar_last_error(), "layer"),
                  "message: %s", oscar_last_error());
    }
    cr_expect_eq(oscar_plan_layer_sizes(plan, 0, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(oscar_last_error(), "oscar_plan_layer_sizes: NULL output") != NULL, "message: %s",
              oscar_last_error());
    cr_expect_eq(oscar_plan_layer_sizes(NULL, 0, &s), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(oscar_last_error(), "NULL plan") != NULL, "message: %s", oscar_last_error());
    oscar_plan_destroy(plan);
    plan = NULL;
    /* wide_tensors stays the bound per layer: layer 2's two planes do not fit one. */
    l.wide_tensors = 1;
    cr_expect_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_ERR_SHAPE_MISMATCH);
    cr_expect(strstr(oscar_last_error(), "wide_tensors") != NULL, "message: %s", oscar_last_error());
    /* 2-bit parameters: every layer's pages plain 2-bit, whatever the room. */
    oscar_params *p2 = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 3, 4, 2, 64, &p2), OSCAR_OK);
    l.wide_tensors = 2;
    cr_assert_eq(oscar_plan_create(rt, &l, p2, &plan), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_layer_sizes(plan, 1, &s), OSCAR_OK);
    cr_expect_eq(s.page_bytes, big.page_bytes - 2 * plane);
    oscar_plan_destroy(plan);
    plan = NULL;
    /* Uniform pages (wide_per_layer 0): every layer reports oscar_layout_sizes_get's page; a plan of
     * built-in parameters takes any layer >= 0, as oscar_append does. */
    l.wide_per_layer = 0;
    cr_assert_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_layer_sizes(plan, 1, &s), OSCAR_OK);
    cr_expect_eq(s.page_bytes, big.page_bytes);
    oscar_plan_destroy(plan);
    plan = NULL;
    oscar_layout_default(&l);
    l.method = OSCAR_METHOD_INT2;
    cr_assert_eq(oscar_plan_create(rt, &l, NULL, &plan), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_layout_sizes_get(&l, &big), OSCAR_OK);
    cr_assert_eq(oscar_plan_layer_sizes(plan, 1000, &s), OSCAR_OK, "%s", oscar_last_error());
    cr_expect(s.page_bytes == big.page_bytes && s.bits_per_element == big.bits_per_element);
    oscar_plan_destroy(plan);
    oscar_params_destroy(p2);
    oscar_params_destroy(p);
    oscar_runtime_destroy(rt);
}


/* ----------------------------------------------------------------- layout */
/* oscar_layout_pages_for takes any int64 length: INT64_MAX overflowed the
 * ceiling division's n + P - 1 (signed overflow, UBSan aborts; the result
 * was negative). Every length gives ceil(paged tokens / P), exactly. */
Test(bad_input, pages_for_huge_lengths_without_overflow) {
    oscar_layout_desc l;
    oscar_layout_default(&l);
    for (int m = 0; m < 2; m++) {
        l.method = m ? OSCAR_METHOD_BF16 : OSCAR_METHOD_INT2;
        const int64_t paged_off = m ? 0 : l.sink + l.recent;
        const int64_t lens[] = {INT64_MAX, INT64_MAX - 1, INT64_MAX - 63, (int64_t)1 << 62, 1000, 0};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            int64_t pages = -1;
            cr_assert_eq(oscar_layout_pages_for(&l, lens[i], &pages), OSCAR_OK, "%s", oscar_last_error());
            int64_t n = lens[i] > paged_off ? lens[i] - paged_off : 0;
            cr_expect_eq(pages, n / 64 + (n % 64 != 0), "method %d length %lld: %lld pages", m, (long long)lens[i],
                         (long long)pages);
        }
        double bits = 0.0;
        cr_expect_eq(oscar_layout_bits_per_element(&l, INT64_MAX, &bits), OSCAR_OK);
        cr_expect(bits > 0.0 && bits <= 16.0, "bits %g", bits);
    }
}

/* A finite bf16 row whose group spread overflows fp32 (values near +-3.4e38)
 * with F32 metadata: the CPU reference saturates the scale to +-65504 like
 * F16 metadata (finite metadata, FORMAT.md 2.2), the generated write path kept
 * Inf, so OpenCL stored other bytes than the CPU and its decode returned NaN
 * (every output, from finite input) where the CPU's was finite. */
static void extreme_spread_pages(const char *backend, unsigned char **pages, size_t *n, uint16_t *out) {
    rig r;
    g_meta = OSCAR_DTYPE_F32;
    int ok = rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, 0);
    g_meta = OSCAR_DTYPE_F16;
    if (!ok) {
        *pages = NULL;
        return;
    }
    uint16_t *h = malloc(r.kv_elems * 2);
    cr_assert(h);
    for (size_t i = 0; i < r.kv_elems; i++) h[i] = 0x3f80; /* 1.0 */
    for (int j = 0; j < 64; j++) h[20 * 64 + j] = (j & 1) ? 0x7f7f : 0xff7f; /* token 20 (2-bit): +-3.39e38 */
    cr_assert_eq(oscar_buffer_write(r.rt, r.v, 0, h, r.kv_elems * 2, NULL), OSCAR_OK);
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    memset(h, 0, r.q_elems * 2); /* q = 0: every score 0, the output the mean of V */
    cr_assert_eq(oscar_buffer_write(r.rt, r.q, 0, h, r.q_elems * 2, NULL), OSCAR_OK);
    free(h);
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(&r.l, &sz), OSCAR_OK);
    *n = sz.page_bytes * (size_t)(SEQ * r.pps);
    unsigned char *zero = calloc(1, *n); /* rows no append writes compare equal too */
    cr_assert(zero);
    cr_assert_eq(oscar_buffer_write(r.rt, r.pages, 0, zero, *n, NULL), OSCAR_OK);
    free(zero);
    cr_assert_eq(rig_append(&r), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    *pages = malloc(*n);
    cr_assert(*pages);
    cr_assert_eq(oscar_buffer_read(r.rt, *pages, r.pages, 0, *n, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_read(r.rt, out, r.out, 0, r.q_elems * 2, NULL), OSCAR_OK);
    cr_assert_eq(oscar_synchronize(r.rt, NULL), OSCAR_OK);
    rig_close(&r);
}
Test(bad_input, extreme_rows_with_f32_metadata_store_the_same_bytes, .timeout = 300) {
    unsigned char *cpu, *ocl;
    size_t n_cpu = 0, n_ocl = 0;
    uint16_t out_cpu[SEQ * 2 * 64], out_ocl[SEQ * 2 * 64];
    extreme_spread_pages("cpu", &cpu, &n_cpu, out_cpu);
    cr_assert(cpu);
    for (int i = 0; i < SEQ * 2 * 64; i++) cr_expect(isfinite(to_f32(out_cpu[i])), "cpu out[%d] not finite", i);
    extreme_spread_pages("opencl", &ocl, &n_ocl, out_ocl);
    if (!ocl) {
        free(cpu);
        cr_skip_test("opencl not available");
    }
    cr_assert_eq(n_cpu, n_ocl);
    size_t first = n_cpu;
    for (size_t i = 0; i < n_cpu && first == n_cpu; i++)
        if (cpu[i] != ocl[i]) first = i;
    cr_expect_eq(first, n_cpu, "opencl pages differ from the cpu's from byte %zu", first);
    for (int i = 0; i < SEQ * 2 * 64; i++)
        cr_expect(isfinite(to_f32(out_ocl[i])), "opencl out[%d] = %g from finite input", i, (double)to_f32(out_ocl[i]));
    free(cpu);
    free(ocl);
}

/* cu_new ending past total_new ({0, 50, 150} with total_new 100): sequence
 * 1 claims 100 new rows of which only 50 are given. The CPU backend refuses
 * it; GPU kernels without validation stored the 100 rows they had, flagged
 * nothing and left sequence 1's last 50 positions stale (status OK, check
 * OK: a silently wrong cache), and validate = 1 let it through too. Now the
 * kernels flag it (oscar_plan_check: OSCAR_ERR_TOO_LONG) and validate = 1
 * refuses it at the call with the CPU's code. */
static void cu_new_past_total_case(const char *backend, int validate) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, validate)) return;
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    int32_t lens[SEQ] = {50, LEN}, cu[SEQ + 1] = {0, 50, 150};
    cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens, sizeof lens, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu, sizeof cu, NULL), OSCAR_OK);
    oscar_cache c = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    const int gpu_flag = strcmp(backend, "cpu") && !validate;
    oscar_status s = oscar_append(r.plan, 0, &c, &b, r.cu, 100, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    if (gpu_flag) {
        cr_expect_eq(s, OSCAR_OK, "%s: %s", backend, oscar_last_error());
        s = oscar_plan_check(r.plan, r.ws, NULL);
        cr_expect_eq(s, OSCAR_ERR_TOO_LONG, "%s validate 0: check gave %d (%s)", backend, s, oscar_last_error());
    } else {
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s validate %d: %d (%s)", backend, validate, s,
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "end at total_new"), "%s validate %d: %s", backend, validate,
                  oscar_last_error());
        cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK);
    }
    rig_close(&r);
}
Test(bad_input, cu_new_ending_past_total_new_is_not_silent, .timeout = 300) {
    const char *b[] = {"cpu", "opencl", "cuda", "hip"};
    for (int i = 0; i < 4; i++)
        for (int val = 0; val < 2; val++) cu_new_past_total_case(b[i], val);
}

/* cu_new that GPU kernels without validation took silently (status OK,
 * check OK), each refused by the CPU backend and by validate = 1: a start
 * below 0 ({-1, 1, 2}: sequence 0 claims two new tokens for one row; the
 * two-launch demote then re-read a ring row that already held a newer token
 * into sequence 0's pages), a decreasing entry ({0, INT32_MIN, 2}: sequence
 * 0 gets a negative count, sequence 1 every row, and its demotions were
 * skipped), and a sequence with no new token and seq_len 0 (no kernel looked
 * at it). A block sees only its own token's sequence; the first token's block
 * now checks all of cu_new and the lengths of sequences without new tokens,
 * and oscar_plan_check returns OSCAR_ERR_TOO_LONG. (Found by
 * tests/test_api_fuzz.c.) */
static void cu_new_hostile_case(const char *backend, int validate) {
    static const struct {
        int32_t cu[SEQ + 1], lens[SEQ];
        oscar_status cpu;
        const char *cpu_msg, *what;
    } cases[] = {
        {{-1, 1, 2}, {LEN, LEN}, OSCAR_ERR_INVALID_ARGUMENT, "start at 0", "cu_new[0] = -1"},
        {{0, INT32_MIN, 2}, {LEN, LEN}, OSCAR_ERR_INVALID_ARGUMENT, "non-decreasing", "cu_new[1] = INT32_MIN"},
        {{0, 0, 1}, {0, LEN}, OSCAR_ERR_EMPTY, "needs >= 1 token", "seq_len 0 without new tokens"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rig r;
        if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, validate)) return;
        rig_fill(&r, r.k, r.kv_elems, 1.0f);
        rig_fill(&r, r.v, r.kv_elems, 1.0f);
        oscar_cache ca = rig_cache(&r);
        oscar_batch b = rig_batch(&r);
        int32_t lens[SEQ] = {LEN - 1, LEN - 1}, cu[SEQ + 1] = {0, LEN - 1, 2 * (LEN - 1)};
        cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens, sizeof lens, NULL), OSCAR_OK);
        cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu, sizeof cu, NULL), OSCAR_OK);
        cr_assert_eq(oscar_append(r.plan, 0, &ca, &b, r.cu, 2 * (LEN - 1), r.k, r.v, 0, r.ws, r.ws_bytes, NULL),
                     OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, cases[c].lens, sizeof cases[c].lens, NULL), OSCAR_OK);
        cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cases[c].cu, sizeof cases[c].cu, NULL), OSCAR_OK);
        const int32_t total = cases[c].cu[SEQ];
        oscar_status s = oscar_append(r.plan, 0, &ca, &b, r.cu, total, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
        if (strcmp(backend, "cpu") && !validate) {
            cr_expect_eq(s, OSCAR_OK, "%s %s: %s", backend, cases[c].what, oscar_last_error());
            s = oscar_plan_check(r.plan, r.ws, NULL);
            cr_expect_eq(s, OSCAR_ERR_TOO_LONG, "%s validate 0, %s: check gave %d (%s)", backend, cases[c].what, s,
                         oscar_last_error());
            cr_expect(oscar_last_error()[0] != '\0', "%s %s: no message", backend, cases[c].what);
        } else {
            cr_expect_eq(s, cases[c].cpu, "%s validate %d, %s: %d (%s)", backend, validate, cases[c].what, s,
                         oscar_last_error());
            cr_expect(strstr(oscar_last_error(), cases[c].cpu_msg), "%s validate %d, %s: %s", backend, validate,
                      cases[c].what, oscar_last_error());
            cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK);
        }
        rig_close(&r);
    }
}
Test(bad_input, hostile_cu_new_is_never_silent, .timeout = 300) {
    const char *b[] = {"cpu", "opencl", "cuda", "hip"};
    for (int i = 0; i < 4; i++)
        for (int val = 0; val < 2; val++) cu_new_hostile_case(b[i], val);
}

/* A window slot out of range that no new row of the append uses: sequence 1
 * appends nothing (recent 16), or its one new token lies past the sink with
 * recent 0 (stored straight into a page). The CPU backend and validate = 1
 * refuse both with OSCAR_ERR_BLOCK_TABLE; the GPU write kernels read a slot
 * only where a new row is stored or demoted, so they flagged neither (status
 * OK, check OK). The blocks that check cu_new now check every sequence's slot,
 * and oscar_plan_check returns OSCAR_ERR_BLOCK_TABLE. */
static void unused_slot_case(const char *backend, int validate, int recent) {
    g_recent = recent;
    rig r;
    int open = rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, validate);
    g_recent = 16;
    if (!open) return;
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    oscar_cache ca = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    int32_t lens[SEQ] = {LEN - 1, LEN - 1}, cu[SEQ + 1] = {0, LEN - 1, 2 * (LEN - 1)}, slots[SEQ] = {0, 1};
    cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens, sizeof lens, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu, sizeof cu, NULL), OSCAR_OK);
    cr_assert_eq(oscar_append(r.plan, 0, &ca, &b, r.cu, 2 * (LEN - 1), r.k, r.v, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK,
                 "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    /* recent 16: sequence 1 appends nothing; recent 0: one token each, past the sink */
    int32_t lens2[SEQ] = {LEN, recent ? LEN - 1 : LEN}, cu2[SEQ + 1] = {0, 1, recent ? 1 : 2};
    const int32_t bad_slots[] = {SEQ, -1};
    for (int c = 0; c < 2; c++) {
        slots[1] = bad_slots[c];
        cr_assert_eq(oscar_buffer_write(r.rt, r.lens, 0, lens2, sizeof lens2, NULL), OSCAR_OK);
        cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu2, sizeof cu2, NULL), OSCAR_OK);
        cr_assert_eq(oscar_buffer_write(r.rt, r.slots, 0, slots, sizeof slots, NULL), OSCAR_OK);
        oscar_status s = oscar_append(r.plan, 0, &ca, &b, r.cu, cu2[SEQ], r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
        if (strcmp(backend, "cpu") && !validate) {
            cr_expect_eq(s, OSCAR_OK, "%s: %s", backend, oscar_last_error());
            s = oscar_plan_check(r.plan, r.ws, NULL);
            cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s validate 0, recent %d, slot %d: check gave %d (%s)", backend,
                         recent, slots[1], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "window slot"), "%s: %s", backend, oscar_last_error());
        } else {
            cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s validate %d, recent %d, slot %d: %d (%s)", backend, validate,
                         recent, slots[1], s, oscar_last_error());
            cr_expect(strstr(oscar_last_error(), "window_slots[1]"), "%s: %s", backend, oscar_last_error());
            cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK);
        }
    }
    rig_close(&r);
}
Test(bad_input, window_slot_no_new_row_uses_is_flagged, .timeout = 300) {
    const char *b[] = {"cpu", "opencl", "cuda", "hip"};
    for (int i = 0; i < 4; i++)
        for (int val = 0; val < 2; val++) {
            unused_slot_case(b[i], val, 16);
            unused_slot_case(b[i], val, 0);
        }
}

/* An OpenCL allocation past the device's limit said only "clCreateBuffer(N
 * bytes) failed (-61)"; the message now names the limit and what to change. */
Test(bad_input, opencl_alloc_past_the_device_limit_names_it, .timeout = 120) {
    oscar_runtime *rt = rc_runtime_or_skip("opencl");
    void *b = NULL;
    cr_expect_eq(oscar_buffer_alloc(rt, (size_t)1 << 62, &b), OSCAR_ERR_OUT_OF_MEMORY);
    cr_expect(strstr(oscar_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE"), "message: %s", oscar_last_error());
    oscar_runtime_destroy(rt);
}

/* OSCAR_OPENCL_OPTIONS longer than the build string holds was cut silently, so the kernels were built
 * with other options than asked (or a half -D flag); the plan is now refused naming the variable. */
Test(bad_input, over_long_opencl_options_are_refused, .timeout = 120) {
    oscar_runtime *rt = rc_runtime_or_skip("opencl");
    char extra[401];
    for (int i = 0; i < 400; i += 8) memcpy(extra + i, " -DXY=1 ", 8);
    extra[400] = 0;
    cr_assert_eq(setenv("OSCAR_OPENCL_OPTIONS", extra, 1), 0);
    oscar_layout_desc l;
    small_layout(&l);
    l.page_size = 16;
    l.method = OSCAR_METHOD_INT2;
    oscar_plan *plan = NULL;
    const oscar_status st = oscar_plan_create(rt, &l, NULL, &plan);
    unsetenv("OSCAR_OPENCL_OPTIONS");
    cr_expect_eq(st, OSCAR_ERR_INVALID_ARGUMENT, "status %d: %s", (int)st, oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "OSCAR_OPENCL_OPTIONS"), "message: %s", oscar_last_error());
    cr_expect_null(plan);
    if (plan) oscar_plan_destroy(plan);
    oscar_runtime_destroy(rt);
}

/* OSCAR_OPENCL_OPTIONS was pasted onto the library's last option with no space: "-cl-fast-relaxed-math"
 * became "-DOSCAR_VB=8-cl-fast-relaxed-math" and every kernel failed to build (OSCAR_ERR_BACKEND). It
 * is now a separate option; one that sets the library's own OSCAR_* macros (a later -D wins: kernels
 * of another shape than the plan's buffers) is refused, and a build the variable breaks names it. */
Test(bad_input, opencl_options_are_separate_and_cannot_redefine_the_shape, .timeout = 300) {
    oscar_runtime *rt = rc_runtime_or_skip("opencl");
    oscar_layout_desc l;
    small_layout(&l);
    l.page_size = 16;
    l.method = OSCAR_METHOD_INT2;
    const struct {
        const char *opts, *named;
        oscar_status want;
    } cases[] = {{"-cl-fast-relaxed-math", NULL, OSCAR_OK},
                 {"-DOSCAR_D=128", "OSCAR_ macro", OSCAR_ERR_INVALID_ARGUMENT},
                 {"-cl-no-such-option", "OSCAR_OPENCL_OPTIONS '-cl-no-such-option'", OSCAR_ERR_INVALID_ARGUMENT}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(setenv("OSCAR_OPENCL_OPTIONS", cases[i].opts, 1), 0);
        oscar_plan *plan = NULL;
        const oscar_status st = oscar_plan_create(rt, &l, NULL, &plan);
        unsetenv("OSCAR_OPENCL_OPTIONS");
        cr_expect_eq(st, cases[i].want, "%s: status %d: %s", cases[i].opts, (int)st, oscar_last_error());
        if (cases[i].named)
            cr_expect(strstr(oscar_last_error(), cases[i].named), "%s: message: %s", cases[i].opts,
                      oscar_last_error());
        oscar_plan_destroy(plan);
    }
    oscar_runtime_destroy(rt);
}

/* Two sequences of one append writing the same window slot or the same page
 * (an engine's allocator bug): every backend wrote both, one over the other,
 * status OK, even with validate = 1. validate = 1 now refuses it with
 * OSCAR_ERR_BLOCK_TABLE naming the slot or page and both sequences, before
 * anything is written. A sequence with no new tokens writes nothing, so it
 * may share (a prefix's pages, a slot being handed over). */
static void aliasing_case(const char *backend) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, 1)) return;
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    oscar_cache c = rig_cache(&r);
    int32_t lens[SEQ] = {LEN, LEN}, cu[SEQ + 1] = {0, LEN, 2 * LEN}, slots[SEQ] = {0, 1};
    int32_t *bt = malloc(sizeof(int32_t) * SEQ * (size_t)r.pps);
    cr_assert(bt);
    for (int i = 0; i < SEQ * r.pps; i++) bt[i] = i;
    void *d_bt = dev(&r, bt, sizeof(int32_t) * SEQ * (size_t)r.pps), *d_slots = dev(&r, slots, sizeof slots);
    void *d_lens = dev(&r, lens, sizeof lens), *d_cu = dev(&r, cu, sizeof cu);
    oscar_batch b = {SEQ, d_lens, d_slots, d_bt, r.pps, LEN};
    /* 1: both sequences in window slot 0 */
    slots[1] = 0;
    cr_assert_eq(oscar_buffer_write(r.rt, d_slots, 0, slots, sizeof slots, NULL), OSCAR_OK);
    oscar_status s = oscar_append(r.plan, 0, &c, &b, d_cu, SEQ * LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s shared slot: %d (%s)", backend, s, oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "window slot 0"), "%s: %s", backend, oscar_last_error());
    slots[1] = 1;
    cr_assert_eq(oscar_buffer_write(r.rt, d_slots, 0, slots, sizeof slots, NULL), OSCAR_OK);
    /* 2: sequence 1's second page is sequence 0's second page */
    bt[r.pps + 1] = 1;
    cr_assert_eq(oscar_buffer_write(r.rt, d_bt, 0, bt, sizeof(int32_t) * SEQ * (size_t)r.pps, NULL), OSCAR_OK);
    s = oscar_append(r.plan, 0, &c, &b, d_cu, SEQ * LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s shared page: %d (%s)", backend, s, oscar_last_error());
    cr_expect(strstr(oscar_last_error(), "page 1"), "%s: %s", backend, oscar_last_error());
    /* 3: the same table, sequence 1 appending nothing: allowed */
    int32_t lens3[SEQ] = {LEN, LEN}, cu3[SEQ + 1] = {0, LEN, LEN};
    cr_assert_eq(oscar_buffer_write(r.rt, d_lens, 0, lens3, sizeof lens3, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r.rt, d_cu, 0, cu3, sizeof cu3, NULL), OSCAR_OK);
    s = oscar_append(r.plan, 0, &c, &b, d_cu, LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    cr_expect_eq(s, OSCAR_OK, "%s: a sequence without new tokens shares: %s", backend, oscar_last_error());
    cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    void *bufs[] = {d_bt, d_slots, d_lens, d_cu};
    for (int i = 0; i < 4; i++) oscar_buffer_free(r.rt, bufs[i]);
    free(bt);
    rig_close(&r);
}
Test(bad_input, validate_refuses_two_sequences_writing_one_slot_or_page, .timeout = 300) {
    aliasing_case("cpu");
    aliasing_case("opencl");
}

/* ------------------------------------------------------ hostile batches */
/* Decode calls whose batch contradicts the cache: an empty or negative batch,
 * block table entries and window slots out of range, a stride too small for
 * the lengths, lengths past the batch's or the layout's bound, an empty page
 * pool. Each is refused (at the call, or through the device flag) with a
 * message, and the output rows keep what they held (no half-written output
 * on the CPU backend, which refuses before computing; GPUs skip the bad
 * sequences only, so there only the status is checked). */
/* Writes a batch's block table, lengths and window slots to the rig's buffers. */
static void rig_batch_write(rig *r, const int32_t *bt, const int32_t *lens, const int32_t *slots) {
    cr_assert_eq(oscar_buffer_write(r->rt, r->bt, 0, bt, sizeof(int32_t) * (size_t)(SEQ * r->pps), NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r->rt, r->lens, 0, lens, sizeof(int32_t) * SEQ, NULL), OSCAR_OK);
    cr_assert_eq(oscar_buffer_write(r->rt, r->slots, 0, slots, sizeof(int32_t) * SEQ, NULL), OSCAR_OK);
}

static void hostile_batch_case(const char *backend) {
    rig r;
    rig_ready(&r, backend);
    int cpu = strcmp(backend, "cpu") == 0;
    for (int c = 0; c < 10; c++) {
        uint16_t *sent = malloc(r.q_elems * 2), *got = malloc(r.q_elems * 2);
        memset(sent, 0x5a, r.q_elems * 2);
        cr_assert_eq(oscar_buffer_write(r.rt, r.out, 0, sent, r.q_elems * 2, NULL), OSCAR_OK);
        oscar_cache ca = rig_cache(&r);
        oscar_batch b = rig_batch(&r);
        int32_t bt[SEQ * 8], lens[SEQ] = {LEN, LEN}, slots[SEQ] = {0, 1};
        for (int i = 0; i < SEQ * r.pps; i++) bt[i] = i;
        const char *what = "";
        switch (c) {
        case 0: b.num_seqs = 0, what = "num_seqs 0"; break;
        case 1: b.num_seqs = -3, what = "num_seqs -3"; break;
        case 2: bt[SEQ * r.pps - 1] = SEQ * r.pps, what = "block table entry = num_pages"; break;
        case 3: bt[1] = -1, what = "block table entry -1"; break;
        case 4: slots[1] = SEQ, what = "window slot = num_window_slots"; break;
        case 5: b.block_table_stride = 1, what = "block_table_stride 1 for 7 pages"; break;
        case 6: lens[0] = LEN + 1, what = "seq_len past max_seq_len"; break;
        case 7: b.max_seq_len = 0, what = "batch max_seq_len 0"; break;
        case 8: ca.num_pages = 0, what = "num_pages 0"; break;
        case 9: lens[1] = INT32_MAX, b.max_seq_len = INT32_MAX, what = "seq_len INT32_MAX"; break;
        }
        rig_batch_write(&r, bt, lens, slots);
        oscar_status s = oscar_decode(r.plan, 0, &ca, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", oscar_last_error());
        if (s == OSCAR_OK) s = oscar_plan_check(r.plan, r.ws, NULL), snprintf(msg, sizeof msg, "%s", oscar_last_error());
        cr_expect_neq(s, OSCAR_OK, "%s: %s accepted", backend, what);
        cr_expect(msg[0] != '\0', "%s: %s refused (%d) without a message", backend, what, s);
        cr_assert_eq(oscar_buffer_read(r.rt, got, r.out, 0, r.q_elems * 2, NULL), OSCAR_OK);
        if (cpu) cr_expect(memcmp(got, sent, r.q_elems * 2) == 0, "%s: %s wrote output before refusing", backend, what);
        free(sent);
        free(got);
    }
    /* and a good call still works after all that */
    int32_t bt[SEQ * 8], lens[SEQ] = {LEN, LEN}, slots[SEQ] = {0, 1};
    for (int i = 0; i < SEQ * r.pps; i++) bt[i] = i;
    rig_batch_write(&r, bt, lens, slots);
    cr_expect_eq(rig_decode(&r), OSCAR_OK, "%s: %s", backend, oscar_last_error());
    rig_close(&r);
}
Test(bad_input, hostile_batches_cpu) { hostile_batch_case("cpu"); }
Test(bad_input, hostile_batches_opencl, .timeout = 300) { hostile_batch_case("opencl"); }
Test(bad_input, hostile_batches_cuda, .timeout = 300) { hostile_batch_case("cuda"); }
Test(bad_input, hostile_batches_hip, .timeout = 300) { hostile_batch_case("hip"); }

/* Calls with two faults: validate = 1 checked cu_new's ends before the lengths,
 * each sequence's cu_new count before the next sequence's length, block table
 * and slot, and a sequence's slot before its block table; the CPU backend the
 * other way round. So the same call got OSCAR_ERR_INVALID_ARGUMENT with
 * validate = 1 and OSCAR_ERR_EMPTY or OSCAR_ERR_BLOCK_TABLE from the CPU
 * backend, or the same code naming another fault. Both now run one check
 * (oscar_check_batch_arrays) and name the first fault of docs/API.md's order. */
static oscar_status two_fault_call(const char *backend, int validate, int c, char *msg, size_t msg_len) {
    static const struct {
        int32_t cu[SEQ + 1], lens[SEQ], slots[SEQ], bt0;
    } cases[] = {
        {{1, 2, 3}, {LEN, 0}, {0, 1}, 0},       /* cu_new[0] = 1 and seq_lens[1] = 0 */
        {{0, 2, 3}, {1, LEN}, {0, SEQ}, 0},     /* sequence 0 gets 2 tokens of 1, slot of sequence 1 out of range */
        {{0, 1, 2}, {LEN, LEN}, {-1, 1}, -1},   /* sequence 0: block table entry and slot out of range */
    };
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, validate)) return (oscar_status)-1;
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    int32_t bt[SEQ * 8];
    for (int i = 0; i < SEQ * r.pps; i++) bt[i] = i;
    bt[0] = cases[c].bt0;
    rig_batch_write(&r, bt, cases[c].lens, cases[c].slots);
    cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cases[c].cu, sizeof cases[c].cu, NULL), OSCAR_OK);
    oscar_cache ca = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    oscar_status s = oscar_append(r.plan, 0, &ca, &b, r.cu, cases[c].cu[SEQ], r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    snprintf(msg, msg_len, "%s", oscar_last_error());
    rig_close(&r);
    return s;
}
Test(bad_input, two_faults_get_one_code_with_validate_0_and_1, .timeout = 300) {
    static const oscar_status want[] = {OSCAR_ERR_EMPTY, OSCAR_ERR_BLOCK_TABLE, OSCAR_ERR_BLOCK_TABLE};
    static const char *names[] = {"seq_lens[1] = 0", "window_slots[1] = 2", "block_table[0][0] = -1"};
    for (int c = 0; c < 3; c++) {
        char m0[512], m1[512], mcl[512];
        oscar_status s0 = two_fault_call("cpu", 0, c, m0, sizeof m0), s1 = two_fault_call("cpu", 1, c, m1, sizeof m1);
        cr_expect_eq(s0, want[c], "case %d, cpu validate 0: %d (%s)", c, s0, m0);
        cr_expect_eq(s1, want[c], "case %d, cpu validate 1: %d (%s)", c, s1, m1);
        cr_expect(strstr(m0, names[c]) && !strcmp(m0, m1), "case %d: messages differ:\n  %s\n  %s", c, m0, m1);
        oscar_status scl = two_fault_call("opencl", 1, c, mcl, sizeof mcl);
        if (scl != (oscar_status)-1)
            cr_expect(scl == want[c] && !strcmp(mcl, m0), "case %d, opencl validate 1: %d (%s)", c, scl, mcl);
    }
}

/* A bad block-table entry of a page the append does not write (page 0 of a
 * sequence growing from 60 to 61 tokens: the append demotes position 44, page
 * 2). The CPU backend and validate = 1 refuse the append; a GPU append without
 * validation checks only the pages it writes, and the decode that follows,
 * which reads every page, raises the flag: the entry never goes unreported
 * (docs/API.md). */
static void old_page_case(const char *backend, int validate) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, validate)) return;
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    rig_fill(&r, r.q, r.q_elems, 1.0f);
    int32_t bt[SEQ * 8], lens[SEQ] = {60, 60}, slots[SEQ] = {0, 1}, cu[SEQ + 1] = {0, 60, 120};
    for (int i = 0; i < SEQ * r.pps; i++) bt[i] = i;
    rig_batch_write(&r, bt, lens, slots);
    cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu, sizeof cu, NULL), OSCAR_OK);
    oscar_cache ca = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    cr_assert_eq(oscar_append(r.plan, 0, &ca, &b, r.cu, 120, r.k, r.v, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK, "%s",
                 oscar_last_error());
    cr_assert_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    bt[0] = SEQ * r.pps + 5; /* sequence 0, page 0 */
    lens[0] = lens[1] = 61;
    int32_t cu1[SEQ + 1] = {0, 1, 2};
    rig_batch_write(&r, bt, lens, slots);
    cr_assert_eq(oscar_buffer_write(r.rt, r.cu, 0, cu1, sizeof cu1, NULL), OSCAR_OK);
    oscar_status s = oscar_append(r.plan, 0, &ca, &b, r.cu, 2, r.k, r.v, 0, r.ws, r.ws_bytes, NULL);
    if (s == OSCAR_OK) s = oscar_plan_check(r.plan, r.ws, NULL);
    const int gpu_flag = strcmp(backend, "cpu") && !validate;
    if (!gpu_flag) {
        cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s validate %d: append: %d (%s)", backend, validate, s,
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "block_table[0][0]"), "message: %s", oscar_last_error());
    } else {
        cr_expect_eq(s, OSCAR_OK, "%s: append without validation: %d (%s)", backend, s, oscar_last_error());
        s = oscar_decode(r.plan, 0, &ca, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
        if (s == OSCAR_OK) s = oscar_plan_check(r.plan, r.ws, NULL);
        cr_expect_eq(s, OSCAR_ERR_BLOCK_TABLE, "%s: decode after it: %d (%s)", backend, s, oscar_last_error());
    }
    rig_close(&r);
}
Test(bad_input, old_page_entry_reported_by_every_backend, .timeout = 300) {
    const char *backends[] = {"cpu", "opencl", "cuda", "hip"};
    for (int i = 0; i < 4; i++)
        for (int val = 0; val < 2; val++) old_page_case(backends[i], val);
}

/* Head counts an engine may pass by mistake: the message names the field and
 * the fix (the divisors that would do, or sharding), never only "must be a
 * positive multiple of num_kv_heads -8". */
Test(bad_input, layout_head_counts_name_the_field_and_the_fix) {
    static const struct { int hq, hkv; const char *needle; } cases[] = {
        {40, 6, "num_kv_heads 6 must be >= 1 and divide num_q_heads 40 (one of 1, 2, 4, 5, 8, 10, 20, 40)"},
        {40, -8, "num_kv_heads -8 must be >= 1"},
        {40, 0, "num_kv_heads 0 must be >= 1"},
        {0, 8, "num_q_heads 0 must be >= 1"},
        {-40, 8, "num_q_heads -40 must be >= 1"},
        {4096, 8, "exceeds 1024; give each tensor-parallel shard"},
        {7, 3, "one of 1, 7)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        oscar_layout_desc l;
        oscar_layout_default(&l);
        l.num_q_heads = cases[i].hq, l.num_kv_heads = cases[i].hkv;
        cr_expect_eq(oscar_layout_validate(&l), OSCAR_ERR_INVALID_ARGUMENT, "%d/%d", cases[i].hq, cases[i].hkv);
        cr_expect(strstr(oscar_last_error(), cases[i].needle), "%d/%d: \"%s\" lacks \"%s\"", cases[i].hq,
                  cases[i].hkv, oscar_last_error(), cases[i].needle);
    }
}

/* oscar_fakequant's element count n_tokens x num_kv_heads x head_dim wrapped
 * size_t: 2^30 x 2^30 x 64 is 2^66, i.e. 0, and the call returned OSCAR_OK
 * having done nothing (other products read far past the rows). */
/* The group rule of the message is the format's: "use 32, 64 or 128 dividing head_dim" named no
 * valid group at head_dim 80 (whose only group is 80) and hid 48 at head_dim 96. */
Test(bad_input, fakequant_group_message_names_the_rule) {
    float rows[80] = {0};
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 40, 1, 1, 80, rows), OSCAR_ERR_UNSUPPORTED_GROUP);
    cr_expect(strstr(oscar_last_error(), "multiple of 16") && strstr(oscar_last_error(), "default is 80"), "%s",
              oscar_last_error());
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 80, 1, 1, 80, rows), OSCAR_OK, "%s",
                 oscar_last_error());
}

Test(bad_input, fakequant_count_overflow_refused) {
    float rows[64] = {0};
    static const int cases[][2] = {{1 << 30, 1 << 30}, {INT32_MAX, INT32_MAX}, {1 << 30, 1 << 26}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        oscar_status s = oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 0, cases[i][0], cases[i][1], 64, rows);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%d x %d: %d (%s)", cases[i][0], cases[i][1], s,
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "PTRDIFF_MAX"), "%s", oscar_last_error());
    }
}

/* oscar_method_bits of a meta_dtype no layout takes (BF16, or no dtype at all)
 * counted its scale and bias as 16 bits and gave a plausible 2.25; 0 is the
 * documented answer for what no cache stores. */
Test(bad_input, method_bits_of_an_unstorable_meta_dtype_is_zero) {
    cr_expect_eq(oscar_method_bits(OSCAR_METHOD_OSCAR2, 128, 128, OSCAR_DTYPE_BF16), 0.0);
    cr_expect_eq(oscar_method_bits(OSCAR_METHOD_INT2, 128, 128, (oscar_dtype)7), 0.0);
    cr_expect_eq(oscar_method_bits(OSCAR_METHOD_INT2, 100, 20, OSCAR_DTYPE_F16), 0.0); /* 96 is a head_dim now */
    cr_expect_eq(oscar_method_bits((oscar_method)-1, 128, 128, OSCAR_DTYPE_F16), 0.0);
    cr_expect_eq(oscar_method_bits(OSCAR_METHOD_INT2, 128, 128, OSCAR_DTYPE_F32), 2.5);
}

/* OSCAR_VALIDATE read only its first character: "true", "yes" or "on" left
 * validation off without a word (and "1abc" turned it on). The runtime now
 * takes 1 or 0 (unset or empty: 0) and refuses anything else by name, as it
 * refuses an unknown OSCAR_BACKEND. */
Test(bad_input, oscar_validate_other_than_0_or_1_is_refused) {
    oscar_runtime_options o;
    oscar_runtime_options_default(&o);
    o.backend = "cpu";
    const char *bad[] = {"true", "yes", "1abc", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("OSCAR_VALIDATE", bad[i], 1);
        oscar_runtime *rt = NULL;
        oscar_status s = oscar_runtime_create(&o, &rt);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "OSCAR_VALIDATE='%s': %d", bad[i], s);
        cr_expect(strstr(oscar_last_error(), "OSCAR_VALIDATE"), "OSCAR_VALIDATE='%s': %s", bad[i], oscar_last_error());
        cr_expect_null(rt);
        oscar_runtime_destroy(rt);
    }
    const char *good[] = {"1", "0", ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        setenv("OSCAR_VALIDATE", good[i], 1);
        oscar_runtime *rt = NULL;
        cr_expect_eq(oscar_runtime_create(&o, &rt), OSCAR_OK, "OSCAR_VALIDATE='%s': %s", good[i], oscar_last_error());
        oscar_runtime_destroy(rt);
    }
    unsetenv("OSCAR_VALIDATE");
}

/* A workspace never passed to oscar_plan_workspace_init (fresh device memory holds anything) was
 * reported by oscar_plan_check as what the kernels raise: 0xFFFFFFFF as an out-of-range block table
 * entry, NaN/Inf and a bad length at once (OSCAR_ERR_BLOCK_TABLE), a word with only other bits as
 * OSCAR_ERR_TOO_LONG naming no cause at all. The kernels set only the OSCAR_DEVERR_* bits, so any
 * other bit is a workspace that was not initialised: OSCAR_ERR_WORKSPACE naming the fix, and the
 * word cleared. */
static void uninitialised_workspace_case(const char *backend) {
    rig r;
    rig_ready(&r, backend);
    const uint32_t junk[] = {0xffffffffu, 0xa5a5a5a0u};
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        cr_assert_eq(oscar_buffer_write(r.rt, r.ws, 0, &junk[i], sizeof junk[i], NULL), OSCAR_OK);
        oscar_status s = rig_decode(&r);
        cr_expect_eq(s, OSCAR_ERR_WORKSPACE, "%s, word 0x%08x: status %d (%s)", backend, junk[i], s,
                     oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "oscar_plan_workspace_init"), "%s, word 0x%08x: %s", backend, junk[i],
                  oscar_last_error());
        cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s: the word was not cleared: %s", backend,
                     oscar_last_error());
    }
    rig_close(&r);
}
Test(bad_input, uninitialised_workspace_is_named_opencl, .timeout = 300) { uninitialised_workspace_case("opencl"); }
Test(bad_input, uninitialised_workspace_is_named_cuda, .timeout = 300) { uninitialised_workspace_case("cuda"); }
Test(bad_input, uninitialised_workspace_is_named_hip, .timeout = 300) { uninitialised_workspace_case("hip"); }

/* The GPU plugins' tuning variables (docs/API.md) read through a parser that took anything not a count
 * as unset: OSCAR_EXTEND_FA=yes, OSCAR_APPEND_WK=8x or OSCAR_EXTEND_FA_SPLITS=-1 ran the default rule
 * without a word, so an A/B or a test forcing a kernel measured the other one. A plan is now refused
 * by name; a count (or 0 / 1 for OSCAR_EXTEND_FA) is taken. */
static void tuning_env_case(const char *backend) {
    oscar_runtime *rt = rc_runtime_or_skip(backend);
    oscar_layout_desc l;
    small_layout(&l);
    l.page_size = 16;
    l.sink = 8;
    l.recent = g_recent;
    l.max_seq_len = LEN;
    l.kv_dtype = OSCAR_DTYPE_BF16;
    l.method = OSCAR_METHOD_QUAROT2;
    l.meta_dtype = g_meta;
    /* {variable, a value refused, a value taken}; the CUDA plugin's A/B switches (they parsed with atoi
     * or "anything but 0") are read by CUDA and HIP only, so they are set on those backends alone */
    const char *bad[][3] = {{"OSCAR_EXTEND_FA", "yes", "1"},       {"OSCAR_EXTEND_FA", "5", "1"},
                            {"OSCAR_APPEND_WK", "8x", "1"},        {"OSCAR_EXTEND_FA_SPLITS", "-1", "1"},
                            {"OSCAR_DECODE_O3_CTAS", "lots", "1"}, {"OSCAR_APPEND_TILE_CTAS", "1e3", "1"},
                            {"OSCAR_DECODE_LP", "off", "0"},       {"OSCAR_DECODE_W3", "2", "0"},
                            {"OSCAR_DECODE_CAP", "-8", "8"}};
    const size_t nb = sizeof bad / sizeof bad[0] - (strcmp(backend, "opencl") ? 0 : 3);
    for (size_t i = 0; i < nb; i++) {
        cr_assert_eq(setenv(bad[i][0], bad[i][1], 1), 0);
        oscar_plan *p = NULL;
        oscar_status s = oscar_plan_create(rt, &l, NULL, &p);
        cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s %s='%s': status %d", backend, bad[i][0], bad[i][1], s);
        cr_expect(strstr(oscar_last_error(), bad[i][0]), "%s %s='%s': %s", backend, bad[i][0], bad[i][1],
                  oscar_last_error());
        cr_expect_null(p);
        oscar_plan_destroy(p);
        /* a value of its range is taken */
        cr_assert_eq(setenv(bad[i][0], bad[i][2], 1), 0);
        s = oscar_plan_create(rt, &l, NULL, &p);
        cr_expect_eq(s, OSCAR_OK, "%s %s=%s: %s", backend, bad[i][0], bad[i][2], oscar_last_error());
        oscar_plan_destroy(p);
        cr_assert_eq(unsetenv(bad[i][0]), 0);
    }
    oscar_runtime_destroy(rt);
    if (!strcmp(backend, "cuda")) {
        /* read when the runtime opens the device */
        oscar_runtime_options ro;
        oscar_runtime_options_default(&ro);
        ro.backend = backend;
        cr_assert_eq(setenv("OSCAR_NO_PDL", "yes", 1), 0);
        oscar_runtime *r2 = NULL;
        cr_expect_neq(oscar_runtime_create(&ro, &r2), OSCAR_OK, "cuda OSCAR_NO_PDL=yes was taken");
        cr_expect(strstr(oscar_last_error(), "OSCAR_NO_PDL"), "%s", oscar_last_error());
        oscar_runtime_destroy(r2);
        r2 = NULL;
        cr_assert_eq(setenv("OSCAR_NO_PDL", "1", 1), 0);
        cr_expect_eq(oscar_runtime_create(&ro, &r2), OSCAR_OK, "cuda OSCAR_NO_PDL=1: %s", oscar_last_error());
        oscar_runtime_destroy(r2);
        cr_assert_eq(unsetenv("OSCAR_NO_PDL"), 0);
    }
}
Test(bad_input, malformed_tuning_variable_is_named_opencl, .timeout = 300) { tuning_env_case("opencl"); }
Test(bad_input, malformed_tuning_variable_is_named_cuda, .timeout = 300) { tuning_env_case("cuda"); }
Test(bad_input, malformed_tuning_variable_is_named_hip, .timeout = 300) { tuning_env_case("hip"); }

/* A batch whose max_seq_len is below its sequences' lengths, on a GPU backend without validation:
 * the kernels flag the length and skip the rows, and oscar_plan_check said "seq_len, new-token count
 * or extend query table out of range", naming neither the batch's max_seq_len nor telling the caller
 * to raise it. */
static void batch_max_len_case(const char *backend) {
    rig r;
    rig_ready(&r, backend);
    oscar_cache c = rig_cache(&r);
    oscar_batch b = rig_batch(&r);
    b.max_seq_len = LEN - 1;
    oscar_status s = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    if (s == OSCAR_OK) s = oscar_plan_check(r.plan, r.ws, NULL);
    cr_expect_neq(s, OSCAR_OK, "%s: a batch max_seq_len below the lengths was taken", backend);
    cr_expect(strstr(oscar_last_error(), "max_seq_len"), "%s: %s", backend, oscar_last_error());
    rig_close(&r);
}
Test(bad_input, batch_max_seq_len_below_lengths_is_named_opencl, .timeout = 300) { batch_max_len_case("opencl"); }
Test(bad_input, batch_max_seq_len_below_lengths_is_named_cuda, .timeout = 300) { batch_max_len_case("cuda"); }
Test(bad_input, batch_max_seq_len_below_lengths_is_named_hip, .timeout = 300) { batch_max_len_case("hip"); }
