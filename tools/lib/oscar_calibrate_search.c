/* End-to-end clip search on held-out calibration windows (see
 * oscar_calibrate.h). Why: the per-layer attention objectives of the
 * calibration core rank clip ratios differently from what the model's
 * next-token distribution feels (docs/eval/clip-objective.md); the KL of that
 * distribution is what the evaluation measures, so the clips are refined on
 * it, on calibration text only.
 *
 * Scored rows: t in [S0 + W, n - 1) of every window (row t predicts token
 * t + 1 of the window). Rows t < S0 + W read no 2-bit key, so their logits
 * equal the reference's and contribute nothing. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oscar_calibrate.h"


static double srch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static oscar_status srch_fail(oscar_status s, char *err, size_t len, const char *fmt, ...) {
    if (len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return s;
}

void ocal_search_options_default(ocal_search_options *o) {
    memset(o, 0, sizeof *o);
    o->windows = 4;
    o->window = 2048;
    o->sink = 64;
    o->recent = 256;
    o->method = OSCAR_METHOD_OSCAR2;
    o->sweeps = 1;
}

oscar_status ocal_kv_quant_hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq) {
    ocal_kv_quant *h = user;
    size_t row = (size_t)h->hkv * (size_t)h->d, all = (size_t)n * row;
    memcpy(kq, k, all * sizeof *kq);
    memcpy(vq, v, all * sizeof *vq);
    int lo = h->sink, hi = n - h->recent;
    if (hi <= lo) return OSCAR_OK;
    for (size_t i = (size_t)lo * row; i < (size_t)hi * row; i++) {
        kq[i] = oe_round_bf16(kq[i]);
        vq[i] = oe_round_bf16(vq[i]);
    }
    oscar_status s = oscar_fakequant(h->p, h->method, layer, OSCAR_K, h->group, hi - lo, h->hkv, h->d,
                                     kq + (size_t)lo * row);
    if (s == OSCAR_OK)
        s = oscar_fakequant(h->p, h->method, layer, OSCAR_V, h->group, hi - lo, h->hkv, h->d, vq + (size_t)lo * row);
    if (s != OSCAR_OK) {
        h->st = s;
        snprintf(h->msg, sizeof h->msg, "layer %d: %s", layer, oscar_last_error());
    }
    return s;
}

typedef struct srch {
    const oe_model *m;
    const oe_config *cf;
    const uint32_t *tokens;
    int nw, n, r0, r1, vocab, hidden;
    oe_ctx *ctx;
    float *logits;          /* [n][vocab] */
    float *ref_p;           /* [nw][r1 - r0][vocab] reference probabilities */
    double *ref_negent;     /* [nw][r1 - r0] sum p log p */
    double ref_nll;         /* sum over windows and rows */
    float **x_cur, **x_cand, **x_best; /* [nw][n * hidden] residual entering the current / next layer */
    ocal_kv_quant hook;
    oe_forward_options fo;
    int evals;
    double layer_fw;
} srch;

static void srch_free(srch *S) {
    oe_ctx_free(S->ctx);
    free(S->logits);
    free(S->ref_p);
    free(S->ref_negent);
    for (int w = 0; S->x_cur && w < S->nw; w++) {
        free(S->x_cur[w]);
        free(S->x_cand[w]);
        free(S->x_best[w]);
    }
    free(S->x_cur);
    free(S->x_cand);
    free(S->x_best);
}

/* Reference logits (bf16 K/V, no 2-bit region) of every window. */
static oscar_status srch_init(srch *S, const oe_model *m, const uint32_t *tokens, int64_t n_tokens,
                              const oscar_params *p, const ocal_search_options *o, int need_resid, char *err,
                              size_t err_len) {
    memset(S, 0, sizeof *S);
    S->m = m;
    S->cf = oe_model_config(m);
    S->tokens = tokens;
    S->nw = o->windows;
    S->n = o->window;
    S->r0 = o->sink + o->recent;
    S->r1 = o->window - 1;
    S->vocab = S->cf->vocab;
    S->hidden = S->cf->hidden;
    if (o->windows < 1 || o->window < 2 || o->sink < 0 || o->recent < 0)
        return srch_fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                         "clip search: windows %d, window %d, sink %d, recent %d: need >= 1 window of >= 2 tokens",
                         o->windows, o->window, o->sink, o->recent);
    if (S->r1 <= S->r0)
        return srch_fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                         "clip search: a window of %d tokens has no query reading a 2-bit key (sink %d + recent %d): "
                         "use longer windows",
                         o->window, o->sink, o->recent);
    if ((int64_t)o->windows * o->window > n_tokens)
        return srch_fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                         "clip search: %d held-out windows of %d need %" PRId64 " tokens, %" PRId64 " given",
                         o->windows, o->window, (int64_t)o->windows * o->window, n_tokens);
    size_t rows = (size_t)(S->r1 - S->r0), V = (size_t)S->vocab, resid = (size_t)S->n * (size_t)S->hidden;
    S->logits = malloc((size_t)S->n * V * sizeof(float));
    S->ref_p = malloc((size_t)S->nw * rows * V * sizeof(float));
    S->ref_negent = malloc((size_t)S->nw * rows * sizeof(double));
    int oom = !S->logits || !S->ref_p || !S->ref_negent;
    if (need_resid && !oom) {
        S->x_cur = calloc((size_t)S->nw, sizeof(float *));
        S->x_cand = calloc((size_t)S->nw, sizeof(float *));
        S->x_best = calloc((size_t)S->nw, sizeof(float *));
        oom = !S->x_cur || !S->x_cand || !S->x_best;
        for (int w = 0; !oom && w < S->nw; w++) {
            S->x_cur[w] = malloc(resid * sizeof(float));
            S->x_cand[w] = malloc(resid * sizeof(float));
            S->x_best[w] = malloc(resid * sizeof(float));
            oom = !S->x_cur[w] || !S->x_cand[w] || !S->x_best[w];
        }
    }
    if (oom) return srch_fail(OSCAR_ERR_OUT_OF_MEMORY, err, err_len, "clip search: out of memory");
    if (oe_ctx_create(m, S->n, &S->ctx) != OSCAR_OK)
        return srch_fail(OSCAR_ERR_OUT_OF_MEMORY, err, err_len, "clip search: %s", oe_last_error());
    oe_forward_options_default(&S->fo);
    S->fo.kv_bf16 = 1;
    for (int w = 0; w < S->nw; w++) {
        const uint32_t *tw = tokens + (size_t)w * (size_t)S->n;
        oscar_status s = oe_forward(S->ctx, tw, S->n, &S->fo, S->logits);
        if (s != OSCAR_OK) return srch_fail(s, err, err_len, "clip search, reference window %d: %s", w, oe_last_error());
        for (int t = S->r0; t < S->r1; t++) {
            const float *l = S->logits + (size_t)t * V;
            float *pr = S->ref_p + ((size_t)w * rows + (size_t)(t - S->r0)) * V;
            double lse = oe_logsumexp(l, S->vocab, NULL), ne = 0.0;
            for (size_t j = 0; j < V; j++) {
                double lp = (double)l[j] - lse;
                pr[j] = (float)exp(lp);
                ne += (double)pr[j] * lp;
            }
            S->ref_negent[(size_t)w * rows + (size_t)(t - S->r0)] = ne;
            S->ref_nll += lse - (double)l[tw[t + 1]];
        }
    }
    int g = o->group > 0 ? o->group : S->cf->head_dim;
    S->hook = (ocal_kv_quant){.p = p, .method = o->method, .group = g, .sink = o->sink, .recent = o->recent,
                          .hkv = S->cf->num_kv_heads, .d = S->cf->head_dim};
    S->fo.kv_quant = ocal_kv_quant_hook;
    S->fo.kv_quant_user = &S->hook;
    S->fo.sink_tokens = o->sink;
    S->fo.recent_tokens = o->recent;
    return OSCAR_OK;
}

/* Runs layers `layer`.. of every window with the hook's parameters; sums
 * KL and NLL over the scored rows. With residuals, the input of `layer` is
 * x_cur and the residual entering layer + 1 is saved into x_cand. */
static oscar_status srch_eval(srch *S, int layer, double *kl_out, double *dnll_out, char *err, size_t err_len) {
    const size_t rows = (size_t)(S->r1 - S->r0), V = (size_t)S->vocab;
    const int L = S->cf->num_layers;
    double kl = 0.0, nll = 0.0;
    for (int w = 0; w < S->nw; w++) {
        const uint32_t *tw = S->tokens + (size_t)w * (size_t)S->n;
        oe_forward_options fo = S->fo;
        if (S->x_cur) {
            fo.first_layer = layer;
            fo.x_in = layer > 0 ? S->x_cur[w] : NULL;
            if (layer + 1 < L) {
                fo.save_layer = layer + 1;
                fo.x_save = S->x_cand[w];
            }
        }
        S->hook.st = OSCAR_OK;
        oscar_status s = oe_forward(S->ctx, tw, S->n, &fo, S->logits);
        if (s != OSCAR_OK)
            return srch_fail(s, err, err_len, "clip search, window %d: %s", w,
                             S->hook.st ? S->hook.msg : oe_last_error());
        S->layer_fw += (double)(L - fo.first_layer) / (double)L;
        for (int t = S->r0; t < S->r1; t++) {
            const float *l = S->logits + (size_t)t * V;
            const float *pr = S->ref_p + ((size_t)w * rows + (size_t)(t - S->r0)) * V;
            double lse = oe_logsumexp(l, S->vocab, NULL), dot = 0.0;
            for (size_t j = 0; j < V; j++) dot += (double)pr[j] * (double)l[j];
            double k = S->ref_negent[(size_t)w * rows + (size_t)(t - S->r0)] - dot + lse;
            kl += k > 0.0 ? k : 0.0; /* rounding can leave -1e-9 */
            nll += lse - (double)l[tw[t + 1]];
        }
    }
    double cnt = (double)S->nw * (double)rows;
    *kl_out = kl / cnt;
    if (dnll_out) *dnll_out = (nll - S->ref_nll) / cnt;
    S->evals++;
    return OSCAR_OK;
}

oscar_status ocal_heldout_kl(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, const oscar_params *p,
                             const ocal_search_options *o, double *kl, double *dnll, char *err, size_t err_len) {
    srch S;
    oscar_status s = srch_init(&S, m, tokens, n_tokens, p, o, 0, err, err_len);
    if (s == OSCAR_OK) s = srch_eval(&S, 0, kl, dnll, err, err_len);
    srch_free(&S);
    return s;
}

static void swap_best(srch *S) {
    for (int w = 0; S->x_cur && w < S->nw; w++) {
        float *t = S->x_best[w];
        S->x_best[w] = S->x_cand[w];
        S->x_cand[w] = t;
    }
}

/* Index of the grid value nearest c. */
static int grid_index(const float *k_grid, int GRID_N, float c) {
    int best = 0;
    for (int i = 1; i < GRID_N; i++)
        if (fabsf(k_grid[i] - c) < fabsf(k_grid[best] - c)) best = i;
    return best;
}

/* The clip of (layer, which) the search moves: the mildest of its 2-bit head-tensors' ratios (as
 * oscar_params_clip over every head). A 3-bit head-tensor (code_bits, docs/FORMAT.md §2.7) stays
 * unclipped, as the code-width rule stored it: oscar_params_clip would read its 1 and
 * oscar_params_set_clip would clip it. Returns 0 when every head-tensor of (layer, which) is 3-bit. */
static int search_clip(const oscar_params *p, int hkv, int layer, oscar_kv which, float *c) {
    int any = 0;
    *c = 0.0f;
    for (int h = 0; h < hkv; h++) {
        int b = 2;
        float x = 1.0f;
        oscar_params_code_bits(p, layer, h, which, &b);
        if (b != 2) continue;
        oscar_params_clip_head(p, layer, h, which, &x);
        *c = x > *c ? x : *c;
        any = 1;
    }
    if (!any) *c = 1.0f;
    return any;
}

static void search_set_clip(oscar_params *p, int hkv, int layer, oscar_kv which, float c) {
    for (int h = 0; h < hkv; h++) {
        int b = 2;
        oscar_params_code_bits(p, layer, h, which, &b);
        if (b == 2) oscar_params_set_clip_head(p, layer, h, which, c);
    }
}

/* One coordinate (layer, which): from the current clip, step along the grid
 * (milder first, then harder) while the KL falls strictly. *best_kl is the
 * KL at the current clips on entry and at the chosen ones on return. */
static oscar_status srch_coord(srch *S, oscar_params *p, int layer, oscar_kv which, double *best_kl,
                               double *best_dnll, char *err, size_t err_len) {
    const int hkv = S->cf->num_kv_heads;
    float cur;
    if (!search_clip(p, hkv, layer, which, &cur)) return OSCAR_OK; /* every head-tensor 3-bit: nothing to move */
    float best_c = cur;
    int GRID_N;
    const float *k_grid = oscar_calib_clip_grid(&GRID_N); /* the calibration core's fit grid */
    int i0 = grid_index(k_grid, GRID_N, cur);
    for (int dir = -1; dir <= 1; dir += 2) {
        int moved = 0;
        /* From an off-grid start, the nearest grid value in this direction. */
        int i = i0;
        if ((dir < 0 && k_grid[i0] <= cur) || (dir > 0 && k_grid[i0] >= cur)) i = i0 + dir;
        for (; i >= 0 && i < GRID_N; i += dir) {
            if (k_grid[i] == best_c) continue;
            search_set_clip(p, hkv, layer, which, k_grid[i]);
            double kl, dn;
            oscar_status s = srch_eval(S, layer, &kl, &dn, err, err_len);
            if (s != OSCAR_OK) return s;
            if (kl < *best_kl) {
                *best_kl = kl;
                *best_dnll = dn;
                best_c = k_grid[i];
                swap_best(S);
                moved = 1;
            } else break;
        }
        search_set_clip(p, hkv, layer, which, best_c);
        if (moved) break; /* the milder side improved: the harder side starts from worse */
    }
    return OSCAR_OK;
}

oscar_status ocal_clip_search(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, oscar_params *p,
                              const ocal_search_options *o, ocal_search_stats *st, char *err, size_t err_len) {
    memset(st, 0, sizeof *st);
    if (err_len) err[0] = '\0';
    double t0 = srch_now();
    srch S;
    oscar_status s = srch_init(&S, m, tokens, n_tokens, p, o, 1, err, err_len);
    const int L = S.cf ? S.cf->num_layers : 0;
    double kl = 0.0, dn = 0.0;
    if (s == OSCAR_OK) s = srch_eval(&S, 0, &kl, &dn, err, err_len);
    st->kl_start = kl;
    st->dnll_start = dn;
    int sweeps = o->sweeps > 0 ? o->sweeps : 1;
    for (int sw = 0; s == OSCAR_OK && sw < sweeps; sw++) {
        for (int l = 0; s == OSCAR_OK && l < L; l++) {
            float ck0, cv0, ck, cv;
            search_clip(p, S.cf->num_kv_heads, l, OSCAR_K, &ck0);
            search_clip(p, S.cf->num_kv_heads, l, OSCAR_V, &cv0);
            /* KL at the current clips with this layer's input residual; it
             * also provides the residual entering l + 1 for the unchanged
             * clips (layer 0 of the first sweep: the start evaluation). */
            if (!(sw == 0 && l == 0)) s = srch_eval(&S, l, &kl, &dn, err, err_len);
            if (s != OSCAR_OK) break;
            swap_best(&S);
            if (!o->fix_k) s = srch_coord(&S, p, l, OSCAR_K, &kl, &dn, err, err_len);
            if (s == OSCAR_OK && !o->fix_v) s = srch_coord(&S, p, l, OSCAR_V, &kl, &dn, err, err_len);
            if (s != OSCAR_OK) break;
            for (int w = 0; w < S.nw; w++) { /* x_best enters l + 1 */
                float *t = S.x_cur[w];
                S.x_cur[w] = S.x_best[w];
                S.x_best[w] = t;
            }
            search_clip(p, S.cf->num_kv_heads, l, OSCAR_K, &ck);
            search_clip(p, S.cf->num_kv_heads, l, OSCAR_V, &cv);
            if (o->progress) {
                double el = srch_now() - t0, done = (double)(sw * L + l + 1), all = (double)(sweeps * L);
                fprintf(o->progress,
                        "clip search sweep %d layer %d/%d: K %.2f -> %.2f, V %.2f -> %.2f, held-out KL %.5f "
                        "(%d evals, %.0f s, ETA %.0f s)\n",
                        sw + 1, l + 1, L, (double)ck0, (double)ck, (double)cv0, (double)cv, kl, S.evals, el,
                        el / done * (all - done));
                fflush(o->progress);
            }
        }
    }
    st->kl_final = kl;
    st->dnll_final = dn;
    st->scored = (int64_t)S.nw * (S.r1 - S.r0);
    st->evals = S.evals;
    st->forward_equiv = S.nw ? S.layer_fw / S.nw : 0.0;
    st->seconds = srch_now() - t0;
    srch_free(&S);
    return s;
}
