/* Engine hooks on tiny-qwen3: the KV quantization hook's 2-bit region
 * (S0 <= p <= t - W; chunked: p <= chunk end - 1 - W), the bf16 option,
 * stopping early, and the observer. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "shared_dir.h"


static oe_model *g_m;
static uint32_t *g_tok;
static int64_t g_ntok;
static unsigned g_seed;

static void setup(void)
{
    char sh[4096], path[4200];
    if (!rc_shared_dir(sh, sizeof sh)) cr_skip_test("shared folder %s absent", sh);
    snprintf(path, sizeof path, "%s/models/tiny-qwen3", sh);
    cr_assert_eq(oe_model_load(path, &g_m), OSCAR_OK, "%s", oe_last_error());
    snprintf(path, sizeof path, "%s/data/tiny-qwen3/eval.tokens", sh);
    cr_assert_eq(oe_tokens_load(path, oe_model_config(g_m)->vocab, &g_tok, &g_ntok), OSCAR_OK, "%s",
                 oe_last_error());
    g_seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    const char *env = getenv("OSCAR_TEST_SEED"); /* replays a printed seed */
    if (env && *env) g_seed = (unsigned)strtoul(env, NULL, 10);
    printf("seed %u\n", g_seed);
}

static void teardown(void)
{
    oe_model_free(g_m);
    free(g_tok);
    g_m = NULL;
    g_tok = NULL;
}

/* Quantization stand-ins: copy, or copy with keys/values >= from_pos
 * replaced by large finite garbage (so any read of them shows). */
typedef struct hook_state {
    int hkv, d;
    int garbage_from, garbage_to; /* positions [from, to) get garbage */
    int calls, last_layer_seen;
    unsigned seed;
} hook_state;

static oscar_status hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq)
{
    hook_state *h = user;
    if (layer != h->last_layer_seen + 1) return OSCAR_ERR_STATE; /* layers in order */
    h->last_layer_seen = layer;
    h->calls++;
    size_t row = (size_t)h->hkv * h->d;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < row; i++) {
            int bad = p >= h->garbage_from && p < h->garbage_to;
            kq[p * row + i] = bad ? 30.0f * ((float)rand_r(&h->seed) / RAND_MAX - 0.5f) : k[p * row + i];
            vq[p * row + i] = bad ? 30.0f * ((float)rand_r(&h->seed) / RAND_MAX - 0.5f) : v[p * row + i];
        }
    return OSCAR_OK;
}

static double row_diff(const float *a, const float *b, int vocab, int row)
{
    double m = 0;
    for (int i = 0; i < vocab; i++) {
        double e = fabs((double)a[(size_t)row * vocab + i] - b[(size_t)row * vocab + i]);
        if (e > m) m = e;
    }
    return m;
}

TestSuite(engine_hooks, .init = setup, .fini = teardown, .timeout = 300);

Test(engine_hooks, quantized_region_is_exactly_s0_to_t_minus_w)
{
    const oe_config *c = oe_model_config(g_m);
    const int n = 150 + (int)(rand_r(&g_seed) % 60);
    const int64_t start = (int64_t)(rand_r(&g_seed) % (unsigned)(g_ntok - n));
    const uint32_t *tok = g_tok + start;
    const int S0 = (int)(rand_r(&g_seed) % 40), W = 1 + (int)(rand_r(&g_seed) % 60);
    printf("n %d start %lld S0 %d W %d\n", n, (long long)start, S0, W);
    size_t ln = (size_t)n * c->vocab;
    float *base = malloc(ln * sizeof(float)), *got = malloc(ln * sizeof(float));
    oe_ctx *ctx = NULL;
    cr_assert_eq(oe_ctx_create(g_m, n, &ctx), OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(oe_forward(ctx, tok, n, NULL, base), OSCAR_OK, "%s", oe_last_error());
    oe_forward_options o;
    oe_forward_options_default(&o);
    o.sink_tokens = S0;
    o.recent_tokens = W;
    o.kv_quant = hook;
    hook_state hs = {.hkv = c->num_kv_heads, .d = c->head_dim, .last_layer_seen = -1, .seed = g_seed};
    o.kv_quant_user = &hs;

    /* 1. Identity hook: same logits up to rounding of the split P V. */
    hs.garbage_from = hs.garbage_to = 0;
    for (size_t i = 0; i < ln; i++) got[i] = NAN;
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(hs.calls, c->num_layers);
    double worst = 0;
    for (int t = 0; t < n; t++) worst = fmax(worst, row_diff(base, got, c->vocab, t));
    cr_expect(worst < 1e-3, "identity hook moved logits by %g", worst);

    /* 2. Garbage only in the sink (p < S0): never read from the quantized copy. */
    hs.garbage_from = 0;
    hs.garbage_to = S0;
    hs.last_layer_seen = -1;
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    worst = 0;
    for (int t = 0; t < n; t++) worst = fmax(worst, row_diff(base, got, c->vocab, t));
    cr_expect(worst < 1e-3, "quantized sink keys were read (logits moved by %g)", worst);

    /* 3. Garbage everywhere: query t reads quantized keys only once t - W >= S0. */
    hs.garbage_from = 0;
    hs.garbage_to = n;
    hs.last_layer_seen = -1;
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    int first = S0 + W; /* first query with a key in the 2-bit region */
    for (int t = 0; t < n && t < first; t++)
        cr_expect(row_diff(base, got, c->vocab, t) < 1e-3, "row %d (< S0 + W = %d) read a quantized key: %g", t,
                  first, row_diff(base, got, c->vocab, t));
    if (first < n)
        cr_expect(row_diff(base, got, c->vocab, first) > 1e-2, "row %d = S0 + W did not read key S0 quantized",
                  first);

    /* 4. Garbage only on the newest W - 1 keys seen by the last query: they
     * lie in its recent window, so the last row cannot change through its
     * own attention in layer 0; garbage on key n - W (oldest of the window)
     * is inside the 2-bit region for the last query. */
    if (n - 1 - W >= S0) {
        hs.garbage_from = n - W; /* keys p > t - W for t = n - 1 */
        hs.garbage_to = n;
        hs.last_layer_seen = -1;
        cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
        /* Rows before n - W cannot see those keys at all; later rows only
         * through their full-precision window, so everything stays. */
        worst = 0;
        for (int t = 0; t < n; t++) worst = fmax(worst, row_diff(base, got, c->vocab, t));
        cr_expect(worst < 1e-3, "recent-window keys were read from the quantized copy (%g)", worst);
        hs.garbage_from = n - 1 - W; /* exactly t - W for the last query */
        hs.garbage_to = n - W;
        hs.last_layer_seen = -1;
        cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
        cr_expect(row_diff(base, got, c->vocab, n - 1) > 1e-2, "key t - W was not read from the quantized copy");
        for (int t = 0; t < n - 1; t++)
            cr_expect(row_diff(base, got, c->vocab, t) < 1e-3, "row %d read key %d quantized", t, n - 1 - W);
    }

    /* 5. Chunked schedule (chunk_tokens N, oscar-eval --chunk): query t sees
     * the 2-bit region of its chunk's end e, so with garbage everywhere the
     * first row to move is the first of the first chunk with e >= S0 + W + 1,
     * and every row of earlier chunks stays. */
    {
        const int N = 1 + (int)(rand_r(&g_seed) % 40);
        o.chunk_tokens = N;
        hs.garbage_from = 0;
        hs.garbage_to = n;
        hs.last_layer_seen = -1;
        cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
        int c0 = (S0 + W + 1 + N - 1) / N - 1; /* first chunk whose end reaches S0 + W + 1 */
        int firstc = c0 * N;
        printf("chunk %d: first row reading a quantized key %d\n", N, firstc);
        for (int t = 0; t < n && t < firstc; t++)
            cr_expect(row_diff(base, got, c->vocab, t) < 1e-3, "chunk %d: row %d (chunk end <= S0 + W) read a "
                      "quantized key: %g", N, t, row_diff(base, got, c->vocab, t));
        /* Rows of that chunk before S0 see only sink keys (causal): the first to move is max(firstc, S0). */
        const int moved = firstc > S0 ? firstc : S0;
        if (moved < n && moved < firstc + N && (firstc + N < n ? firstc + N : n) >= S0 + W + 1)
            cr_expect(row_diff(base, got, c->vocab, moved) > 1e-2, "chunk %d: row %d did not read key S0 quantized",
                      N, moved);
        for (int t = firstc; t < moved && t < n; t++)
            cr_expect(row_diff(base, got, c->vocab, t) < 1e-3, "chunk %d: row %d (before S0) read a quantized key: %g",
                      N, t, row_diff(base, got, c->vocab, t));
        o.chunk_tokens = -1;
        cr_expect_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_ERR_INVALID_ARGUMENT);
        o.chunk_tokens = 0;
    }

    /* 5b. A chunked prompt, then decoding (chunk_limit Lc, oscar-gpu-generate
     * --chunk): one chunk of the whole window would make every row read the
     * garbage; with Lc <= S0 + W no chunk end passes S0 + W and the rows from
     * Lc on are token by token, so exactly the rows of case 3 move. */
    {
        const int Lc = 1 + (int)(rand_r(&g_seed) % (unsigned)(S0 + W));
        o.chunk_tokens = n;
        o.chunk_limit = Lc;
        hs.garbage_from = 0;
        hs.garbage_to = n;
        hs.last_layer_seen = -1;
        cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
        printf("chunk %d up to %d, then token by token\n", n, Lc);
        for (int t = 0; t < n && t < first; t++)
            cr_expect(row_diff(base, got, c->vocab, t) < 1e-3, "chunk limit %d: row %d read a quantized key: %g", Lc,
                      t, row_diff(base, got, c->vocab, t));
        if (first < n)
            cr_expect(row_diff(base, got, c->vocab, first) > 1e-2, "chunk limit %d: row %d did not read key S0 "
                      "quantized", Lc, first);
        o.chunk_limit = -1;
        cr_expect_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_ERR_INVALID_ARGUMENT);
        o.chunk_limit = 0;
        o.chunk_tokens = 0;
    }

    /* 6. A failing hook aborts the forward with its status. */
    hs.last_layer_seen = 5;
    cr_expect_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_ERR_STATE);
    cr_expect(strstr(oe_last_error(), "hook"), "message: %s", oe_last_error());
    free(base);
    free(got);
    oe_ctx_free(ctx);
}

typedef struct obs_state {
    int calls, max_layer;
    double k_bf16_dist; /* distance of k from its bf16 rounding: > 0 means unrounded */
} obs_state;

static oscar_status observer(void *user, int layer, int n, const float *q, const float *k, const float *v)
{
    obs_state *s = user;
    (void)q;
    (void)v;
    s->calls++;
    if (layer > s->max_layer) s->max_layer = layer;
    for (int i = 0; i < n * 2 * 128; i++) s->k_bf16_dist += fabs((double)k[i] - oe_round_bf16(k[i]));
    return OSCAR_OK;
}

Test(engine_hooks, bf16_kv_stop_early_and_skip_lm_head)
{
    const oe_config *c = oe_model_config(g_m);
    cr_assert_eq(c->num_kv_heads * c->head_dim, 256);
    const int n = 96 + (int)(rand_r(&g_seed) % 64);
    const uint32_t *tok = g_tok + rand_r(&g_seed) % (unsigned)(g_ntok - n);
    size_t ln = (size_t)n * c->vocab;
    float *base = malloc(ln * sizeof(float)), *got = malloc(ln * sizeof(float));
    oe_ctx *ctx = NULL;
    cr_assert_eq(oe_ctx_create(g_m, 256, &ctx), OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(oe_forward(ctx, tok, n, NULL, base), OSCAR_OK, "%s", oe_last_error());

    oe_forward_options o;
    oe_forward_options_default(&o);
    obs_state os = {0, -1, 0};
    o.observer = observer;
    o.observer_user = &os;
    o.kv_bf16 = 1;
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(os.calls, c->num_layers);
    cr_expect(os.k_bf16_dist > 0, "observer saw bf16-rounded keys; it must see the fp32 ones");
    double num = 0, den = 0;
    for (size_t i = 0; i < ln; i++) {
        num += ((double)got[i] - base[i]) * ((double)got[i] - base[i]);
        den += (double)base[i] * base[i];
    }
    double rel = sqrt(num / den);
    printf("bf16 K/V: logits relative change %.3g\n", rel);
    cr_expect(rel > 1e-6 && rel < 2e-2, "bf16 K/V changed logits by %g (expected small but nonzero)", rel);

    /* Stop after layer 2 without logits: the observer sees layers 0..2, the
     * logits buffer is left alone. */
    for (size_t i = 0; i < ln; i++) got[i] = NAN;
    os = (obs_state){0, -1, 0};
    o.kv_bf16 = 0;
    o.last_layer = 2;
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(os.calls, 3);
    cr_expect_eq(os.max_layer, 2);
    for (size_t i = 0; i < ln; i++) cr_assert(isnan(got[i]), "logits written although the forward stopped early");
    o.last_layer = -1;
    o.skip_lm_head = 1;
    os = (obs_state){0, -1, 0};
    cr_assert_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(os.calls, c->num_layers);
    for (size_t i = 0; i < ln; i++) cr_assert(isnan(got[i]), "logits written with skip_lm_head");
    o.last_layer = c->num_layers;
    cr_expect_eq(oe_forward(ctx, tok, n, &o, got), OSCAR_ERR_INVALID_ARGUMENT);
    free(base);
    free(got);
    oe_ctx_free(ctx);
}
