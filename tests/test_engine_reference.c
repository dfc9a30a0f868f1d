/* Reference engine vs transformers (fp32): logits and per-layer post-RoPE
 * q/k/v of the 64 reference tokens of tiny-qwen3. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <stdint.h>

#include "engine.h"
#include "oscar_format.h" /* oscar_f32_to_bf16, oscar_f32_to_f16: the checkpoints' 16-bit weights */
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

/* ------------------------------------------------------------------------------------------------
 * Tiny Llama / Mistral / Qwen2 / Qwen3 checkpoints beside tiny-qwen3 (tests/reference/
 * hf_tiny_models.json, written by make_hf_tiny_models.py with transformers in fp32): GQA 3 and 5,
 * head_dim other than hidden / heads and absent, untied and tied output layers, q/k/v(/o) biases,
 * llama3, YaRN (mscale, betas, truncate false) and linear scaling, rope_theta in rope_parameters,
 * at the top level and in rope_scaling, BF16 / F16 / F32 weights. The weights are a formula of
 * (tensor index, element index), so the checkpoints are rebuilt here without torch. */

/* make_hf_tiny_models.py's uniform(): u in [-1, 1), 24 bits of a 32-bit hash of (tensor, element). */
static float ref_uniform(uint32_t tensor_index, uint32_t i)
{
    uint32_t h = ((tensor_index + 1u) * 0x9E3779B1u) ^ (i * 0x85EBCA77u);
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    return (float)(h >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* make_hf_tiny_models.py's value(): scales by powers of two, exact. */
static float ref_value(const char *name, float u)
{
    if (strstr(name, "norm")) return 1.0f + 0.25f * u;
    size_t len = strlen(name);
    if (len >= 4 && !strcmp(name + len - 4, "bias")) return 0.0625f * u;
    if (strstr(name, "embed_tokens")) return 0.5f * u;
    return 0.125f * u;
}

/* config.json and model.safetensors of one case in dir. */
static void write_case(const char *dir, json_t *cs)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(json_dump_file(json_object_get(cs, "config"), path, 0), 0);
    const char *dtype = json_string_value(json_object_get(cs, "dtype"));
    cr_assert(dtype);
    const size_t es = strcmp(dtype, "F32") ? 2 : 4;
    json_t *tensors = json_object_get(cs, "tensors"), *hdr = json_object();
    json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0, i;
    json_t *t;
    json_array_foreach(tensors, i, t)
    {
        json_t *shape = json_array_get(t, 1);
        size_t n = 1, j;
        json_t *dim;
        json_array_foreach(shape, j, dim) n *= (size_t)json_integer_value(dim);
        json_object_set_new(hdr, json_string_value(json_array_get(t, 0)),
                            json_pack("{s:s,s:O,s:[I,I]}", "dtype", dtype, "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + n * es)));
        off += n * es;
    }
    char *h = json_dumps(hdr, JSON_COMPACT);
    cr_assert(h);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    const uint64_t hl = strlen(h);
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)(hl >> (8 * b));
    fwrite(len8, 1, 8, f);
    fwrite(h, 1, hl, f);
    json_array_foreach(tensors, i, t)
    {
        const char *name = json_string_value(json_array_get(t, 0));
        size_t n = 1, j;
        json_t *dim;
        json_array_foreach(json_array_get(t, 1), j, dim) n *= (size_t)json_integer_value(dim);
        for (size_t e = 0; e < n; e++) {
            const float v = ref_value(name, ref_uniform((uint32_t)i, (uint32_t)e));
            if (es == 4) {
                fwrite(&v, 4, 1, f);
            } else {
                const uint16_t b = !strcmp(dtype, "BF16") ? oscar_f32_to_bf16(v) : oscar_f32_to_f16(v);
                fwrite(&b, 2, 1, f);
            }
        }
    }
    cr_assert_eq(fclose(f), 0);
    free(h);
    json_decref(hdr);
}

Test(engine_reference, tiny_models_of_each_architecture_match_transformers)
{
    const char *ref_path = OSCAR_SOURCE_DIR "/tests/reference/hf_tiny_models.json";
    json_error_t jerr;
    json_t *root = json_load_file(ref_path, 0, &jerr);
    cr_assert(root, "%s: %s", ref_path, jerr.text);
    json_t *cases = json_object_get(root, "cases");
    cr_assert(json_array_size(cases) >= 6);
    size_t c;
    json_t *cs;
    json_array_foreach(cases, c, cs)
    {
        const char *name = json_string_value(json_object_get(cs, "name"));
        char dir[] = "/tmp/oscar_hf_tiny_XXXXXX";
        cr_assert(mkdtemp(dir));
        write_case(dir, cs);
        oe_model *m = NULL;
        cr_assert_eq(oe_model_load(dir, &m), OSCAR_OK, "%s: %s", name, oe_last_error());
        const int V = oe_model_config(m)->vocab;
        json_t *ids_j = json_object_get(cs, "input_ids"), *lg_j = json_object_get(cs, "logits");
        const int n = (int)json_array_size(ids_j);
        cr_assert(n > 0 && json_array_size(lg_j) == (size_t)n * (size_t)V, "%s: reference of another shape", name);
        uint32_t *ids = malloc((size_t)n * sizeof *ids);
        float *got = malloc((size_t)n * V * sizeof *got), *want = malloc((size_t)n * V * sizeof *want);
        cr_assert(ids && got && want);
        for (int i = 0; i < n; i++) ids[i] = (uint32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
        for (int i = 0; i < n * V; i++) want[i] = (float)json_number_value(json_array_get(lg_j, (size_t)i));
        oe_ctx *ctx = NULL;
        cr_assert_eq(oe_ctx_create(m, n, &ctx), OSCAR_OK, "%s", oe_last_error());
        cr_assert_eq(oe_forward(ctx, ids, n, NULL, got), OSCAR_OK, "%s: %s", name, oe_last_error());
        double worst = 0.0, amax = 0.0;
        for (int i = 0; i < n * V; i++) {
            worst = fmax(worst, fabs((double)got[i] - want[i]));
            amax = fmax(amax, fabs((double)want[i]));
        }
        const double e = rel_err(got, want, (size_t)n * V);
        printf("%s: logits relative error %.3g, largest difference %.3g of |logit| <= %.3g\n", name, e, worst, amax);
        /* fp32 noise measured 4e-7 .. 1.2e-6 relative; a wrong RoPE, bias or head is 1e-2 or more */
        cr_expect(e < 1e-5 && worst < 1e-4 * amax, "%s: engine logits off transformers' (relative %.3g, largest "
                  "difference %.3g)", name, e, worst);
        oe_ctx_free(ctx);
        oe_model_free(m);
        free(ids);
        free(got);
        free(want);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        cr_assert_eq(system(cmd), 0);
    }
    json_decref(root);
}
