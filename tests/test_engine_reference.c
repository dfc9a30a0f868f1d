/* Reference engine vs transformers (fp32): logits and per-layer post-RoPE
 * q/k/v of the 64 reference tokens of tiny-qwen3. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine.h"
#include "shared_dir.h"


#define MAXL 64

typedef struct capture {
    int layers, hq, hkv, d, n;
    float *q[MAXL], *k[MAXL], *v[MAXL];
} capture;

static oscar_status observe(void *user, int layer, int n, const float *q, const float *k, const float *v)
{
    capture *c = user;
    if (layer < 0 || layer >= c->layers || n != c->n) return OSCAR_ERR_INTERNAL;
    memcpy(c->q[layer], q, (size_t)n * c->hq * c->d * sizeof(float));
    memcpy(c->k[layer], k, (size_t)n * c->hkv * c->d * sizeof(float));
    memcpy(c->v[layer], v, (size_t)n * c->hkv * c->d * sizeof(float));
    return OSCAR_OK;
}

/* ||a - ref||_F / ||ref||_F */
static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static float *ref_tensor(const oe_safetensors *st, const char *name, int64_t expect)
{
    const oe_tensor *t = oe_st_find(st, name);
    cr_assert(t, "reference tensor %s missing", name);
    cr_assert_eq(t->numel, expect, "reference tensor %s has %lld elements, expected %lld", name,
                 (long long)t->numel, (long long)expect);
    float *p = malloc((size_t)expect * sizeof *p);
    cr_assert(p);
    cr_assert_eq(oe_tensor_to_f32(t, p, expect), OSCAR_OK, "%s", oe_last_error());
    return p;
}

Test(engine_reference, logits_and_qkv_match_transformers, .timeout = 300)
{
    char sh[4096], path[4200];
    if (!rc_shared_dir(sh, sizeof sh)) cr_skip_test("shared folder %s absent", sh);
    snprintf(path, sizeof path, "%s/models/tiny-qwen3", sh);
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(path, &m), OSCAR_OK, "%s", oe_last_error());
    const oe_config *cf = oe_model_config(m);
    cr_assert_eq(cf->arch, OE_ARCH_QWEN3);
    cr_assert(cf->num_layers <= MAXL);
    snprintf(path, sizeof path, "%s/data/tiny-qwen3/reference.safetensors", sh);
    oe_safetensors *st = NULL;
    cr_assert_eq(oe_st_open(path, &st), OSCAR_OK, "%s", oe_last_error());
    const oe_tensor *ids_t = oe_st_find(st, "input_ids");
    cr_assert(ids_t && ids_t->dtype == OE_I32 && ids_t->ndim == 1);
    const int n = (int)ids_t->numel;
    uint32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, (const char *)ids_t->data + 4 * i, 4);
        cr_assert(v >= 0 && v < cf->vocab);
        ids[i] = (uint32_t)v;
    }
    capture cap = {.layers = cf->num_layers, .hq = cf->num_q_heads, .hkv = cf->num_kv_heads, .d = cf->head_dim,
                   .n = n};
    const size_t qn = (size_t)n * cap.hq * cap.d, kn = (size_t)n * cap.hkv * cap.d;
    for (int L = 0; L < cap.layers; L++) {
        cap.q[L] = malloc(qn * sizeof(float));
        cap.k[L] = malloc(kn * sizeof(float));
        cap.v[L] = malloc(kn * sizeof(float));
        /* Poison: a layer the observer never sees fails the comparison. */
        for (size_t i = 0; i < qn; i++) cap.q[L][i] = NAN;
        for (size_t i = 0; i < kn; i++) cap.k[L][i] = cap.v[L][i] = NAN;
    }
    size_t ln = (size_t)n * cf->vocab;
    float *logits = malloc(ln * sizeof *logits);
    for (size_t i = 0; i < ln; i++) logits[i] = NAN;
    oe_ctx *ctx = NULL;
    /* A context larger than the window: the engine must not depend on n == max. */
    cr_assert_eq(oe_ctx_create(m, n + 37, &ctx), OSCAR_OK, "%s", oe_last_error());
    oe_forward_options o;
    oe_forward_options_default(&o);
    o.observer = observe;
    o.observer_user = &cap;
    cr_assert_eq(oe_forward(ctx, ids, n, &o, logits), OSCAR_OK, "%s", oe_last_error());

    float *ref = ref_tensor(st, "logits", (int64_t)ln);
    double e = rel_err(logits, ref, ln);
    printf("logits: relative error %.3g\n", e);
    cr_expect(e < 1e-4, "logits relative error %.3g >= 1e-4", e);
    free(ref);
    double worst = 0;
    for (int L = 0; L < cap.layers; L++) {
        const char *which[3] = {"q", "k", "v"};
        float *got[3] = {cap.q[L], cap.k[L], cap.v[L]};
        size_t cnt[3] = {qn, kn, kn};
        for (int w = 0; w < 3; w++) {
            char nm[64];
            snprintf(nm, sizeof nm, "layers.%d.%s", L, which[w]);
            float *r = ref_tensor(st, nm, (int64_t)cnt[w]);
            double el = rel_err(got[w], r, cnt[w]);
            if (el > worst) worst = el;
            cr_expect(el < 1e-4, "%s relative error %.3g >= 1e-4", nm, el);
            free(r);
        }
    }
    printf("per-layer q/k/v: worst relative error %.3g\n", worst);

    /* Same window again in the same context (buffers reused): identical logits. */
    float *again = malloc(ln * sizeof *again);
    o.observer = NULL;
    cr_assert_eq(oe_forward(ctx, ids, n, &o, again), OSCAR_OK, "%s", oe_last_error());
    cr_expect(memcmp(again, logits, ln * sizeof *again) == 0, "second forward differs from the first");
    free(again);

    for (int L = 0; L < cap.layers; L++) {
        free(cap.q[L]);
        free(cap.k[L]);
        free(cap.v[L]);
    }
    free(logits);
    free(ids);
    oe_ctx_free(ctx);
    oe_st_close(st);
    oe_model_free(m);
}
