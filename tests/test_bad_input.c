/* Bad input through the public API gets the same refusal on every backend
 * (issue 12, part 3): non-finite calibration rows in either pass, NaN in q,
 * rotations that overflow kv_dtype, zero-length sequences with and without
 * host validation, parameters made for another method or group. CPU always;
 * OpenCL, CUDA and HIP when their plugin runs here (required when named in
 * OSCAR_REQUIRE_BACKENDS). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"

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
    cr_expect_eq(oscar_calib_feed(c, 0, N, q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(c);
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

static int required(const char *name) {
    const char *r = getenv("OSCAR_REQUIRE_BACKENDS");
    return r && strstr(r, name);
}

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

/* Returns 0 (test skipped) when the backend is absent and not required. */
static int rig_open(rig *r, const char *backend, oscar_method m, oscar_dtype kvt, int validate) {
    memset(r, 0, sizeof *r);
    r->backend = backend;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = backend;
    ro.validate = validate;
    if (oscar_runtime_create(&ro, &r->rt) != OSCAR_OK) {
        cr_assert(!required(backend), "%s is required but: %s", backend, oscar_last_error());
        return 0;
    }
    oscar_layout_default(&r->l);
    r->l.head_dim = 64;
    r->l.group = 64;
    r->l.num_q_heads = 2;
    r->l.num_kv_heads = 1;
    r->l.page_size = 16;
    r->l.sink = 8;
    r->l.recent = 16;
    r->l.max_seq_len = LEN;
    r->l.kv_dtype = kvt;
    r->l.method = m;
    cr_assert_eq(oscar_plan_create(r->rt, &r->l, NULL, &r->plan), OSCAR_OK, "%s", oscar_last_error());
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
    r->windows = dev(r, NULL, sz.window_slot_bytes * SEQ + 64);
    cr_assert_eq(oscar_plan_workspace_bytes(r->plan, SEQ, LEN, &r->ws_bytes), OSCAR_OK);
    r->ws = dev(r, NULL, r->ws_bytes);
    cr_assert_eq(oscar_plan_workspace_init(r->plan, r->ws, NULL), OSCAR_OK);
    r->lens = dev(r, lens, sizeof lens);
    r->slots = dev(r, slots, sizeof slots);
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

static void rig_fill(rig *r, void *buf, size_t n, float scale) {
    uint16_t *h = malloc(n * 2);
    cr_assert(h);
    for (size_t i = 0; i < n; i++) h[i] = to16(r->l.kv_dtype, scale * ((float)((i * 2654435761u) % 1000) / 1000.0f));
    cr_assert_eq(oscar_buffer_write(r->rt, buf, 0, h, n * 2, NULL), OSCAR_OK);
    free(h);
}

static oscar_cache rig_cache(const rig *r) { return (oscar_cache){r->pages, SEQ * r->pps, r->windows, SEQ}; }
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
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) oscar_buffer_free(r->rt, b[i]);
    oscar_plan_destroy(r->plan);
    oscar_runtime_destroy(r->rt);
}

/* NaN in q: refused on every backend (CPU at the call, GPUs through the
 * device flag oscar_plan_check reports), never OK with NaN or zero output. */
static void nan_q_case(const char *backend) {
    rig r;
    if (!rig_open(&r, backend, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, 0)) cr_skip_test("%s not available", backend);
    rig_fill(&r, r.k, r.kv_elems, 1.0f);
    rig_fill(&r, r.v, r.kv_elems, 1.0f);
    cr_assert_eq(rig_append(&r), OSCAR_OK, "%s", oscar_last_error());
    rig_fill(&r, r.q, r.q_elems, 1.0f);
    cr_assert_eq(rig_decode(&r), OSCAR_OK, "%s", oscar_last_error());
    uint16_t nan16 = r.l.kv_dtype == OSCAR_DTYPE_BF16 ? 0x7fc0u : 0x7e00u;
    cr_assert_eq(oscar_buffer_write(r.rt, r.q, 2 * (64 + 3), &nan16, 2, NULL), OSCAR_OK);
    cr_expect_eq(rig_decode(&r), OSCAR_ERR_NONFINITE, "%s: NaN in q not refused", backend);
    rig_close(&r);
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

/* ------------------------------------------------------------- parameters */
Test(bad_input, plan_refuses_params_of_another_method_or_group, .timeout = 120) {
    oscar_runtime *rt;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK);
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = 64;
    l.group = 64;
    l.num_q_heads = 2;
    l.num_kv_heads = 1;
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
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    free(q);
    free(k);
    free(v);
    oscar_runtime_destroy(rt);
}
