/* Perplexity over independent non-overlapping windows. */
#include <math.h>
#include <stdlib.h>

#include "engine_internal.h"

double oe_logsumexp(const float *l, int n, int *argmax)
{
    float mx = l[0];
    int am = 0;
    for (int i = 1; i < n; i++) {
        if (l[i] > mx) {
            mx = l[i];
            am = i;
        }
    }
    if (argmax) *argmax = am;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)expf(l[i] - mx);
    return log(s) + (double)mx;
}

/* -log softmax(row)[target]. */
static double nll_row(const float *row, int vocab, uint32_t target)
{
    return oe_logsumexp(row, vocab, NULL) - (double)row[target];
}

oscar_status oe_perplexity(const oe_model *m, const uint32_t *tokens, int64_t n, int ctx,
                           const oe_forward_options *o, oe_progress_fn progress, void *user, oe_ppl_result *out)
{
    if (!m || !tokens || !out) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_perplexity: NULL argument");
    if (ctx <= 0) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_perplexity: context %d must be > 0", ctx);
    int64_t windows = n > ctx ? (n - 1) / ctx : 0;
    if (windows == 0)
        return oe_set_error(OSCAR_ERR_EMPTY, "oe_perplexity: %lld tokens do not fill one window of %d + 1",
                            (long long)n, ctx);
    const int vocab = m->cfg.vocab;
    float *logits = malloc((size_t)ctx * (size_t)vocab * sizeof *logits);
    if (!logits) return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_perplexity: out of memory for logits");
    oe_ctx *c = NULL;
    oscar_status s = oe_ctx_create(m, ctx, &c);
    if (s != OSCAR_OK) {
        free(logits);
        return s;
    }
    oe_forward_options opt;
    if (o) opt = *o;
    else oe_forward_options_default(&opt);
    opt.skip_lm_head = 0;
    opt.last_layer = -1;
    double nll = 0.0;
    int64_t scored = 0;
    for (int64_t w = 0; w < windows; w++) {
        const uint32_t *win = tokens + w * ctx;
        if ((s = oe_forward(c, win, ctx, &opt, logits)) != OSCAR_OK) break;
        for (int i = 0; i < ctx; i++) {
            if (win[i + 1] >= (uint32_t)vocab) {
                s = oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_perplexity: target id %u outside the "
                                 "vocabulary of %d", win[i + 1], vocab);
                break;
            }
            nll += nll_row(logits + (size_t)i * vocab, vocab, win[i + 1]);
        }
        if (s != OSCAR_OK) break;
        scored += ctx;
        if (progress) progress(user, w + 1, windows, nll, scored);
    }
    oe_ctx_free(c);
    free(logits);
    if (s != OSCAR_OK) return s;
    out->nll_sum = nll;
    out->scored = scored;
    out->windows = windows;
    out->ppl = exp(nll / (double)scored);
    return OSCAR_OK;
}
