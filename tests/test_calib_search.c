/* End-to-end clip search (tools/lib/oscar_calibrate_search.c) and the engine's
 * residual snapshot/resume it relies on, on tiny-qwen3 with short windows
 * (skipped when OSCAR_SHARED_DIR/models/tiny-qwen3 is absent).
 *  - resuming a forward at layer l from the saved residual gives logits
 *    bit-identical to the full forward (with the KV hook on);
 *  - the held-out KL equals an independent computation from the definition
 *    (bf16 reference, hook written here, rows S0 + W .. n - 2);
 *  - from deliberately harsh clips the search lowers the KL, keeps the fixed
 *    side untouched, ends on grid values, and its reported KL is the KL of
 *    the clips it returns. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "oscar_calibrate.h"

static char g_model[4096], g_tokens[4096];

static int shared_paths(void) {
    const char *dir = getenv("OSCAR_SHARED_DIR");
    if (!dir || !*dir) return 0;
    snprintf(g_model, sizeof g_model, "%s/models/tiny-qwen3", dir);
    snprintf(g_tokens, sizeof g_tokens, "%s/data/tiny-qwen3/calib.tokens", dir);
    struct stat sb;
    return stat(g_model, &sb) == 0 && stat(g_tokens, &sb) == 0;
}

enum { N = 384, S0 = 16, W = 64 };

static void load(oe_model **m, uint32_t **tok, int64_t *n, oscar_params **p) {
    cr_assert_eq(oe_model_load(g_model, m), OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(oe_tokens_load(g_tokens, oe_model_config(*m)->vocab, tok, n), OSCAR_OK, "%s", oe_last_error());
    cr_assert_geq(*n, 8 * N);
    const oe_config *cf = oe_model_config(*m);
    /* Identity rotation with the published clips; the test sets its own clips. */
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, cf->num_layers, cf->num_q_heads,
                                             cf->num_kv_heads, cf->head_dim, p),
                 OSCAR_OK);
}

static void opts(ocal_search_options *o, int windows) {
    ocal_search_options_default(o);
    o->windows = windows;
    o->window = N;
    o->sink = S0;
    o->recent = W;
}

Test(calib_search, resume_from_saved_residual_is_bit_identical, .timeout = 600) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 is absent");
    oe_model *m;
    uint32_t *tok;
    int64_t ntok;
    oscar_params *p;
    load(&m, &tok, &ntok, &p);
    const oe_config *cf = oe_model_config(m);
    const size_t V = (size_t)cf->vocab, H = (size_t)cf->hidden;
    oe_ctx *c;
    cr_assert_eq(oe_ctx_create(m, N, &c), OSCAR_OK);
    float *a = malloc(N * V * sizeof(float)), *b = malloc(N * V * sizeof(float));
    float *x = malloc(N * H * sizeof(float));
    cr_assert(a && b && x);
    ocal_kv_quant h = {.p = p, .method = OSCAR_METHOD_OSCAR2, .group = cf->head_dim, .sink = S0, .recent = W,
                   .hkv = cf->num_kv_heads, .d = cf->head_dim};
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.kv_bf16 = 1;
    fo.kv_quant = ocal_kv_quant_hook;
    fo.kv_quant_user = &h;
    fo.sink_tokens = S0;
    fo.recent_tokens = W;
    for (int l = 1; l < cf->num_layers; l += 3) {
        fo.first_layer = 0;
        fo.x_in = NULL;
        fo.save_layer = l;
        fo.x_save = x;
        cr_assert_eq(oe_forward(c, tok, N, &fo, a), OSCAR_OK, "%s", oe_last_error());
        fo.first_layer = l;
        fo.x_in = x;
        fo.x_save = NULL;
        cr_assert_eq(oe_forward(c, tok, N, &fo, b), OSCAR_OK, "%s", oe_last_error());
        cr_expect_eq(memcmp(a, b, N * V * sizeof(float)), 0, "logits resumed at layer %d differ", l);
    }
    /* Bad resume requests are refused. */
    fo.first_layer = 2;
    fo.x_in = NULL;
    cr_expect_eq(oe_forward(c, tok, N, &fo, b), OSCAR_ERR_INVALID_ARGUMENT);
    fo.first_layer = cf->num_layers;
    fo.x_in = x;
    cr_expect_eq(oe_forward(c, tok, N, &fo, b), OSCAR_ERR_INVALID_ARGUMENT);
    fo.first_layer = 3;
    fo.save_layer = 1;
    fo.x_save = x;
    cr_expect_eq(oe_forward(c, tok, N, &fo, b), OSCAR_ERR_INVALID_ARGUMENT);
    free(a);
    free(b);
    free(x);
    oe_ctx_free(c);
    oscar_params_destroy(p);
    free(tok);
    oe_model_free(m);
}

/* The hook from the definition (docs/EVAL.md), written independently. */
static oscar_status test_hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq) {
    const oscar_params *p = user;
    const int hkv = 2, d = 128;
    size_t row = (size_t)hkv * d;
    for (size_t i = 0; i < (size_t)n * row; i++) {
        kq[i] = k[i];
        vq[i] = v[i];
    }
    for (int t = S0; t <= n - 1 - W; t++)
        for (size_t i = 0; i < row; i++) {
            kq[(size_t)t * row + i] = oe_round_bf16(kq[(size_t)t * row + i]);
            vq[(size_t)t * row + i] = oe_round_bf16(vq[(size_t)t * row + i]);
        }
    oscar_status s = oscar_fakequant(p, OSCAR_METHOD_OSCAR2, layer, OSCAR_K, 0, n - W - S0, hkv, d, kq + S0 * row);
    return s ? s : oscar_fakequant(p, OSCAR_METHOD_OSCAR2, layer, OSCAR_V, 0, n - W - S0, hkv, d, vq + S0 * row);
}

Test(calib_search, heldout_kl_matches_the_definition, .timeout = 600) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 is absent");
    oe_model *m;
    uint32_t *tok;
    int64_t ntok;
    oscar_params *p;
    load(&m, &tok, &ntok, &p);
    const oe_config *cf = oe_model_config(m);
    cr_assert_eq(cf->num_kv_heads, 2);
    cr_assert_eq(cf->head_dim, 128);
    const size_t V = (size_t)cf->vocab;
    ocal_search_options o;
    opts(&o, 2);
    double kl = -1, dnll = 0;
    char err[512];
    cr_assert_eq(ocal_heldout_kl(m, tok, ntok, p, &o, &kl, &dnll, err, sizeof err), OSCAR_OK, "%s", err);

    oe_ctx *c;
    cr_assert_eq(oe_ctx_create(m, N, &c), OSCAR_OK);
    float *ref = malloc(N * V * sizeof(float)), *q = malloc(N * V * sizeof(float));
    cr_assert(ref && q);
    double sum_kl = 0, sum_dnll = 0;
    int64_t cnt = 0;
    for (int w = 0; w < 2; w++) {
        const uint32_t *tw = tok + (size_t)w * N;
        oe_forward_options fo;
        oe_forward_options_default(&fo);
        fo.kv_bf16 = 1;
        cr_assert_eq(oe_forward(c, tw, N, &fo, ref), OSCAR_OK);
        fo.kv_quant = test_hook;
        fo.kv_quant_user = p;
        fo.sink_tokens = S0;
        fo.recent_tokens = W;
        cr_assert_eq(oe_forward(c, tw, N, &fo, q), OSCAR_OK);
        for (int t = 0; t < N - 1; t++) {
            const float *lr = ref + (size_t)t * V, *lq = q + (size_t)t * V;
            double mr = lr[0], mq = lq[0], zr = 0, zq = 0;
            for (size_t j = 1; j < V; j++) {
                mr = fmax(mr, lr[j]);
                mq = fmax(mq, lq[j]);
            }
            for (size_t j = 0; j < V; j++) {
                zr += exp(lr[j] - mr);
                zq += exp(lq[j] - mq);
            }
            double lser = mr + log(zr), lseq = mq + log(zq), k = 0;
            for (size_t j = 0; j < V; j++) {
                double pr = exp(lr[j] - lser);
                k += pr * ((lr[j] - lser) - (lq[j] - lseq));
            }
            if (t < S0 + W) {
                /* No 2-bit key read yet: same distribution as the reference. */
                cr_expect(fabs(k) < 1e-6, "row %d reads no 2-bit key but KL %g", t, k);
                continue;
            }
            sum_kl += k;
            sum_dnll += (lseq - lq[tw[t + 1]]) - (lser - lr[tw[t + 1]]);
            cnt++;
        }
    }
    double want = sum_kl / (double)cnt, want_dn = sum_dnll / (double)cnt;
    cr_expect_gt(want, 1e-4, "2-bit keys and values should cost some KL (%g)", want);
    cr_expect(fabs(kl - want) <= 1e-4 * want, "held-out KL %.9g, from the definition %.9g", kl, want);
    cr_expect(fabs(dnll - want_dn) <= 1e-4 * fabs(want_dn) + 1e-7, "delta NLL %.9g vs %.9g", dnll, want_dn);
    free(ref);
    free(q);
    oe_ctx_free(c);
    oscar_params_destroy(p);
    free(tok);
    oe_model_free(m);
}

Test(calib_search, lowers_kl_from_harsh_clips_and_respects_fixed_side, .timeout = 1200) {
    if (!shared_paths()) cr_skip_test("OSCAR_SHARED_DIR/models/tiny-qwen3 is absent");
    oe_model *m;
    uint32_t *tok;
    int64_t ntok;
    oscar_params *p;
    load(&m, &tok, &ntok, &p);
    const int L = oe_model_config(m)->num_layers;
    for (int l = 0; l < L; l++) {
        oscar_params_set_clip(p, l, OSCAR_K, 0.85f);
        oscar_params_set_clip(p, l, OSCAR_V, 0.93f); /* off the grid */
    }
    /* A 3-bit head-tensor, unclipped as the code-width rule (the calibration's default) stores it: the
     * search moves its layer's 2-bit heads only. Before the fix it read the layer's clip as 1 (the mildest
     * head's) and clipped the 3-bit keys with the rest. */
    const int WL = 4, WH = 1;
    cr_assert_eq(oscar_params_set_code_bits(p, WL, WH, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_clip_head(p, WL, WH, OSCAR_K, 1.0f), OSCAR_OK, "%s", oscar_last_error());
    ocal_search_options o;
    opts(&o, 1);
    o.fix_v = 1;
    ocal_search_stats st;
    char err[512];
    const uint32_t *held = tok + 4 * N; /* any slice; not the one checked below */
    cr_assert_eq(ocal_clip_search(m, held, ntok - 4 * N, p, &o, &st, err, sizeof err), OSCAR_OK, "%s", err);
    cr_expect_lt(st.kl_final, st.kl_start, "KL %g -> %g", st.kl_start, st.kl_final);
    cr_expect_gt(st.evals, 2 * L);
    cr_expect_lt(st.forward_equiv, (double)st.evals, "resume should save forwards");
    int moved = 0;
    for (int l = 0; l < L; l++) {
        float ck, cv;
        oscar_params_clip_head(p, l, l == WL ? 1 - WH : 0, OSCAR_K, &ck); /* a 2-bit head's */
        oscar_params_clip(p, l, OSCAR_V, &cv);
        cr_expect_eq(cv, 0.93f, "layer %d: fixed V clip moved to %g", l, (double)cv);
        int on_grid = 0, grid_n;
        const float *grid = oscar_calib_clip_grid(&grid_n);
        for (int i = 0; i < grid_n; i++) on_grid |= ck == grid[i];
        cr_expect(on_grid, "layer %d: K clip %g is not a grid value", l, (double)ck);
        moved += ck != 0.85f;
    }
    cr_expect_gt(moved, 0, "no K clip moved off 0.85");
    float cw;
    int bw = 0;
    oscar_params_clip_head(p, WL, WH, OSCAR_K, &cw);
    oscar_params_code_bits(p, WL, WH, OSCAR_K, &bw);
    cr_expect(cw == 1.0f && bw == 3, "the 3-bit head-tensor %d:%d K: clip %g, %d bits (want 1, 3)", WL, WH, (double)cw,
              bw);
    /* The reported final KL is the KL of the returned clips. */
    double kl, dn;
    cr_assert_eq(ocal_heldout_kl(m, held, ntok - 4 * N, p, &o, &kl, &dn, err, sizeof err), OSCAR_OK, "%s", err);
    cr_expect(fabs(kl - st.kl_final) <= 1e-9 * kl, "final KL %.12g, re-evaluated %.12g", st.kl_final, kl);
    /* Bad options are refused with a message. */
    opts(&o, 1);
    o.window = S0 + W;
    cr_expect_eq(ocal_heldout_kl(m, held, ntok, p, &o, &kl, &dn, err, sizeof err), OSCAR_ERR_INVALID_ARGUMENT);
    opts(&o, 1 << 20);
    cr_expect_eq(ocal_heldout_kl(m, held, ntok, p, &o, &kl, &dn, err, sizeof err), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(err, "held-out windows") != NULL, "%s", err);
    oscar_params_destroy(p);
    free(tok);
    oe_model_free(m);
}
