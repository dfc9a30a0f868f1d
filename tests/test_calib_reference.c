/* Calibration on the real tiny-qwen3 model against the fp32 transformers
 * reference (GUIDE §2): the targets C_K / C_V of every layer over the first
 * 65536 calibration tokens in independent windows of 2048 must match
 * reference.safetensors' layers.L.C_K / layers.L.C_V within 1e-4 relative
 * Frobenius error. Also: rotations orthogonal, parameters round-trip through
 * save/load, and oscar-calibrate's cached pass 1 equals a recomputed one.
 *
 * The driver is oscar-calibrate's own (tools/lib/oscar_calibrate_run.c, the
 * library the tool calls), so the tool's code path is what is checked. Needs the
 * shared folder (OSCAR_SHARED_DIR, set by ctest); skipped without it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "oscar_calibrate.h"
#include "refcheck.h"

static double ocal_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char g_model[4096], g_tokens[4096], g_ref[4096];

/* Paths under the shared folder; 0 when it is absent (test skipped). */
static int shared_paths(void) {
    const char *dir = getenv("OSCAR_SHARED_DIR");
    if (!dir || !*dir) return 0;
    snprintf(g_model, sizeof g_model, "%s/models/tiny-qwen3", dir);
    snprintf(g_tokens, sizeof g_tokens, "%s/data/tiny-qwen3/calib.tokens", dir);
    snprintf(g_ref, sizeof g_ref, "%s/data/tiny-qwen3/reference.safetensors", dir);
    struct stat sb;
    return stat(g_model, &sb) == 0 && stat(g_tokens, &sb) == 0 && stat(g_ref, &sb) == 0;
}

static double rel_frobenius(const double *a, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = a[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static void load_model_tokens(oe_model **m, uint32_t **tok, int64_t *n) {
    cr_assert_eq(oe_model_load(g_model, m), OSCAR_OK, "loading %s: %s", g_model, oe_last_error());
    cr_assert_eq(oe_tokens_load(g_tokens, oe_model_config(*m)->vocab, tok, n), OSCAR_OK, "%s", oe_last_error());
}

Test(calib_reference, targets_match_transformers_rotations_orthogonal_params_round_trip, .timeout = 1700) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 or its data is absent");
    oe_model *m = NULL;
    uint32_t *tok = NULL;
    int64_t ntok = 0;
    load_model_tokens(&m, &tok, &ntok);
    const oe_config *cf = oe_model_config(m);
    const int L = cf->num_layers, d = cf->head_dim;
    cr_assert_geq(ntok, 65536);

    ocal_options o;
    ocal_options_default(&o);
    o.window = 2048;
    o.max_tokens = 65536;
    o.key_attn_weight = 0.0f; /* the reference holds the published C_K = E[q q^T] */
    oscar_calib *calib = NULL;
    oscar_params *p = NULL;
    ocal_stats st;
    char err[1024];
    double t0 = ocal_now();
    oscar_status s = ocal_run(m, tok, ntok, &o, &calib, &p, &st, err, sizeof err);
    cr_assert_eq(s, OSCAR_OK, "ocal_run: %s", err);
    cr_assert_eq(st.windows, 32);
    cr_assert_eq(st.tokens, 65536);
    fprintf(stderr, "calibration of %d windows: %.1f s (pass 0 %.1f s, pass 1 %.1f s %s, finalize %.1f s)\n",
            st.windows, ocal_now() - t0, st.t_pass[0], st.t_pass[1], st.cached ? "cached" : "recomputed",
            st.t_finalize);

    /* Targets against the fp64 reference. */
    oe_safetensors *ref = NULL;
    cr_assert_eq(oe_st_open(g_ref, &ref), OSCAR_OK, "%s", oe_last_error());
    size_t dd = (size_t)d * (size_t)d;
    double *got = malloc(dd * sizeof(double)), *want = malloc(dd * sizeof(double)),
           *head = malloc(dd * sizeof(double));
    cr_assert(got && want && head);
    oscar_params_info pinfo;
    cr_assert_eq(oscar_params_get_info(p, &pinfo), OSCAR_OK);
    cr_assert_eq(pinfo.per_head, 1, "the default calibration has one rotation per KV head");
    double worst[2] = {0.0, 0.0};
    for (int l = 0; l < L; l++) {
        double rel[2];
        for (int which = 0; which < 2; which++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.%s", l, which ? "C_V" : "C_K");
            const oe_tensor *t = oe_st_find(ref, name);
            cr_assert_not_null(t, "%s missing from %s", name, g_ref);
            cr_assert_eq(t->dtype, OE_F64, "%s is %s, expected F64", name, oe_dtype_name(t->dtype));
            cr_assert_eq(t->numel, (int64_t)dd, "%s has %lld elements, expected %zu", name, (long long)t->numel, dd);
            memcpy(want, t->data, dd * sizeof(double)); /* mapping may be unaligned */
            /* The reference is the layer target, the mean over KV heads (calib.c's normalisation); with
             * one rotation per KV head (the default) the heads' targets are averaged here. */
            const int nh = pinfo.per_head ? cf->num_kv_heads : 1;
            for (size_t i = 0; i < dd; i++) got[i] = 0.0;
            for (int h = 0; h < nh; h++) {
                for (size_t i = 0; i < dd; i++) head[i] = NAN; /* poisoned: every element must be written */
                s = oscar_calib_target(calib, l, h, which ? OSCAR_V : OSCAR_K, head);
                cr_assert_eq(s, OSCAR_OK, "%s", oscar_last_error());
                for (size_t i = 0; i < dd; i++) cr_assert(isfinite(head[i]), "%s element %zu not written", name, i);
                for (size_t i = 0; i < dd; i++) got[i] += head[i] / nh;
            }
            rel[which] = rel_frobenius(got, want, dd);
            if (rel[which] > worst[which]) worst[which] = rel[which];
        }
        fprintf(stderr, "layer %d: rel Frobenius error C_K %.3e  C_V %.3e\n", l, rel[0], rel[1]);
        cr_expect_lt(rel[0], 1e-4, "layer %d C_K relative Frobenius error %.3e >= 1e-4", l, rel[0]);
        cr_expect_lt(rel[1], 1e-4, "layer %d C_V relative Frobenius error %.3e >= 1e-4", l, rel[1]);
    }
    fprintf(stderr, "max over layers: C_K %.3e  C_V %.3e\n", worst[0], worst[1]);
    oe_st_close(ref);

    /* Rotations orthogonal (fp32 storage) and eigenvalues largest first, every KV head's. */
    const int nrot = pinfo.per_head ? cf->num_kv_heads : 1;
    for (int l = 0; l < L; l++)
        for (int rw = 0; rw < 2 * nrot; rw++) {
            const int which = rw % 2, h = rw / 2;
            const float *R = NULL;
            const double *lam = NULL;
            cr_assert_eq(oscar_params_rotation(p, l, h, (oscar_kv)which, &R), OSCAR_OK, "%s", oscar_last_error());
            double oe = rc_orthogonality_error(d, R);
            cr_expect_lt(oe, 1e-5, "layer %d %c: max |R R^T - I| = %.3e", l, which ? 'V' : 'K', oe);
            cr_assert_eq(oscar_params_eigenvalues(p, l, h, (oscar_kv)which, &lam), OSCAR_OK, "%s",
                         oscar_last_error());
            cr_assert_not_null(lam);
            for (int i = 1; i < d; i++)
                cr_expect_geq(lam[i - 1], lam[i], "layer %d %c eigenvalues not sorted at %d", l, which ? 'V' : 'K', i);
            cr_expect_gt(lam[0], 0.0);
        }

    /* Save / load round trip: same rotations (bitwise), clips, eigenvalues, info. */
    char path[256];
    snprintf(path, sizeof path, "/tmp/oscar_calib_ref_%ld_%ld.safetensors", (long)getpid(), (long)time(NULL));
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
    oscar_params *q = NULL;
    s = oscar_params_load(path, &q);
    unlink(path);
    cr_assert_eq(s, OSCAR_OK, "%s", oscar_last_error());
    oscar_params_info a, b;
    cr_assert_eq(oscar_params_get_info(p, &a), OSCAR_OK);
    cr_assert_eq(oscar_params_get_info(q, &b), OSCAR_OK);
    char hash[17];
    ocal_model_hash(cf, hash);
    cr_expect_str_eq(b.model_hash, hash);
    cr_expect_eq(b.calib_tokens, 65536);
    cr_expect_eq(b.method, OSCAR_METHOD_OSCAR2);
    cr_expect_eq(b.num_layers, a.num_layers);
    cr_expect_eq(b.num_q_heads, a.num_q_heads);
    cr_expect_eq(b.num_kv_heads, a.num_kv_heads);
    cr_expect_eq(b.head_dim, a.head_dim);
    cr_expect_eq(b.per_head, a.per_head);
    cr_expect_eq(oscar_params_check_shape(q, L, cf->num_q_heads, cf->num_kv_heads, d, hash), OSCAR_OK, "%s",
                 oscar_last_error());
    for (int l = 0; l < L; l++)
        for (int which = 0; which < 2; which++) {
            const float *R1, *R2;
            const double *l1, *l2;
            float c1, c2;
            for (int h = 0; h < nrot; h++) {
                cr_assert_eq(oscar_params_rotation(p, l, h, (oscar_kv)which, &R1), OSCAR_OK);
                cr_assert_eq(oscar_params_rotation(q, l, h, (oscar_kv)which, &R2), OSCAR_OK);
                cr_expect_eq(memcmp(R1, R2, dd * sizeof(float)), 0, "layer %d head %d %c rotation changed by save/load",
                             l, h, which ? 'V' : 'K');
                cr_assert_eq(oscar_params_eigenvalues(p, l, h, (oscar_kv)which, &l1), OSCAR_OK);
                cr_assert_eq(oscar_params_eigenvalues(q, l, h, (oscar_kv)which, &l2), OSCAR_OK);
                cr_assert_not_null(l2);
                cr_expect_eq(memcmp(l1, l2, (size_t)d * sizeof(double)), 0, "layer %d head %d eigenvalues changed", l,
                             h);
            }
            cr_assert_eq(oscar_params_clip(p, l, (oscar_kv)which, &c1), OSCAR_OK);
            cr_assert_eq(oscar_params_clip(q, l, (oscar_kv)which, &c2), OSCAR_OK);
            cr_expect_eq(c1, c2, "layer %d clip changed by save/load", l);
            cr_expect(c1 > 0.0f && c1 <= 1.0f);
            oscar_calib_layer_report r;
            cr_assert_eq(oscar_calib_layer_report_get(calib, l, &r), OSCAR_OK);
            /* The report's clip is the layer's fitted ratio, which its 2-bit head-tensors keep; a head-tensor
             * the code-width rule (the default budget) stored in 3 bits is unclipped (its ratio 1, so
             * oscar_params_clip, the mildest head's, reads 1 in that layer). */
            for (int h = 0; h < cf->num_kv_heads; h++) {
                int bits = 0;
                float ch = 0.0f;
                cr_assert_eq(oscar_params_code_bits(p, l, h, (oscar_kv)which, &bits), OSCAR_OK);
                cr_assert_eq(oscar_params_clip_head(p, l, h, (oscar_kv)which, &ch), OSCAR_OK);
                cr_expect_eq(ch, bits == 3 ? 1.0f : (which ? r.clip_v : r.clip_k),
                             "layer %d head %d %c (%d bits): clip %g, report %g", l, h, which ? 'V' : 'K', bits,
                             (double)ch, (double)(which ? r.clip_v : r.clip_k));
            }
            /* The rotation must help on real data: OSCAR below no rotation. */
            const double *e = which ? r.err_v : r.err_k;
            cr_expect_lt(e[2], e[0], "layer %d %c: OSCAR error %.4f not below unrotated %.4f", l, which ? 'V' : 'K',
                         e[2], e[0]);
        }
    oscar_params_destroy(q);
    free(got);
    free(want);
    free(head);
    oscar_params_destroy(p);
    oscar_calib_destroy(calib);
    free(tok);
    oe_model_free(m);
}

/* Pass 1 from the cached K/V must equal pass 1 recomputed by a second
 * forward, bit for bit (targets, rotations, clips), on a random stretch of
 * the calibration tokens; per_head exercises every KV head's target. */
Test(calib_reference, cached_pass1_equals_recomputed, .timeout = 600) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 or its data is absent");
    oe_model *m = NULL;
    uint32_t *tok = NULL;
    int64_t ntok = 0;
    load_model_tokens(&m, &tok, &ntok);
    const oe_config *cf = oe_model_config(m);
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    srand(seed);
    const int window = 96 + 32 * (rand() % 4); /* awkward window lengths */
    int64_t start = (int64_t)(rand() % (int)(ntok - 4 * window));
    fprintf(stderr, "seed %u: window %d, start %lld\n", seed, window, (long long)start);

    oscar_calib *c[2] = {NULL, NULL};
    oscar_params *p[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        ocal_options o;
        ocal_options_default(&o);
        o.window = window;
        o.max_tokens = 3 * window + window / 2; /* 3 windows, the half window is dropped */
        o.per_head = 1;
        o.pass1 = i == 0 ? OCAL_PASS1_CACHE : OCAL_PASS1_RECOMPUTE;
        ocal_stats st;
        char err[1024];
        cr_assert_eq(ocal_run(m, tok + start, ntok - start, &o, &c[i], &p[i], &st, err, sizeof err), OSCAR_OK,
                     "seed %u: %s", seed, err);
        cr_assert_eq(st.windows, 3);
        cr_assert_eq(st.cached, i == 0);
    }
    size_t dd = (size_t)cf->head_dim * (size_t)cf->head_dim;
    double *t0 = malloc(dd * sizeof(double)), *t1 = malloc(dd * sizeof(double));
    cr_assert(t0 && t1);
    for (int l = 0; l < cf->num_layers; l++)
        for (int h = 0; h < cf->num_kv_heads; h++)
            for (int which = 0; which < 2; which++) {
                cr_assert_eq(oscar_calib_target(c[0], l, h, (oscar_kv)which, t0), OSCAR_OK);
                cr_assert_eq(oscar_calib_target(c[1], l, h, (oscar_kv)which, t1), OSCAR_OK);
                cr_expect_eq(memcmp(t0, t1, dd * sizeof(double)), 0, "seed %u: layer %d head %d %c target differs",
                             seed, l, h, which ? 'V' : 'K');
                const float *R0, *R1;
                cr_assert_eq(oscar_params_rotation(p[0], l, h, (oscar_kv)which, &R0), OSCAR_OK);
                cr_assert_eq(oscar_params_rotation(p[1], l, h, (oscar_kv)which, &R1), OSCAR_OK);
                cr_expect_eq(memcmp(R0, R1, dd * sizeof(float)), 0, "seed %u: layer %d head %d rotation differs",
                             seed, l, h);
            }
    for (int l = 0; l < cf->num_layers; l++)
        for (int which = 0; which < 2; which++) {
            float a, b;
            cr_assert_eq(oscar_params_clip(p[0], l, (oscar_kv)which, &a), OSCAR_OK);
            cr_assert_eq(oscar_params_clip(p[1], l, (oscar_kv)which, &b), OSCAR_OK);
            cr_expect_eq(a, b, "seed %u: layer %d clip differs", seed, l);
        }
    free(t0);
    free(t1);
    for (int i = 0; i < 2; i++) {
        oscar_params_destroy(p[i]);
        oscar_calib_destroy(c[i]);
    }
    free(tok);
    oe_model_free(m);
}

/* Too few tokens for one window: a clear error, nothing allocated. */
Test(calib_reference, fewer_tokens_than_a_window_is_refused) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 or its data is absent");
    oe_model *m = NULL;
    uint32_t *tok = NULL;
    int64_t ntok = 0;
    load_model_tokens(&m, &tok, &ntok);
    ocal_options o;
    ocal_options_default(&o);
    o.window = 2048;
    o.max_tokens = 2047;
    oscar_calib *c = (oscar_calib *)&o; /* poisoned: must be reset to NULL */
    oscar_params *p = (oscar_params *)&o;
    ocal_stats st;
    char err[1024];
    cr_expect_eq(ocal_run(m, tok, ntok, &o, &c, &p, &st, err, sizeof err), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect_null(c);
    cr_expect_null(p);
    cr_expect(strstr(err, "window") != NULL, "message should name the window: %s", err);
    free(tok);
    oe_model_free(m);
}
