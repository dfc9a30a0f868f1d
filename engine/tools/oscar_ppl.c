/* oscar-ppl: fp32 perplexity of a Hugging Face checkpoint over a token file,
 * with windows of --context tokens (window s feeds [s, s+ctx) and scores
 * [s+1, s+ctx+1)). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "tool_args.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct progress_state {
    double t0;
    int ctx;
} progress_state;

static void progress(void *user, int64_t w, int64_t windows, double nll, int64_t scored)
{
    progress_state *ps = user;
    double el = now_s() - ps->t0;
    fprintf(stderr, "window %" PRId64 "/%" PRId64 "  running ppl %.4f  %.0f tokens/s\n", w, windows,
            exp(nll / (double)scored), (double)(w * ps->ctx) / el);
}

/* --help prints on stdout (a write error there is the exit status), a misuse on stderr, as the other tools. */
static void usage(FILE *f)
{
    fprintf(f, "usage: oscar-ppl MODEL_DIR --tokens FILE [--max-tokens N] [--context 2048]\n"
                    "  MODEL_DIR  Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint (config.json + safetensors)\n"
                    "  --tokens   uint32 little-endian token ids\n"
                    "  --max-tokens  feed only the first N tokens (floor(N/context) windows; window s\n"
                    "                feeds [s, s+context) and scores tokens [s+1, s+context+1))\n");
}

int main(int argc, char **argv)
{
    tool_watch_stdout("oscar-ppl");
    const char *model_dir = NULL, *tok_path = NULL;
    int64_t max_tokens = -1, v;
    int ctx = 2048;
    tool_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        if (!tool_args_once(&seen, "oscar-ppl", argv[i], NULL, NULL)) return 2;
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc) {
            if (!tool_parse_int("oscar-ppl", "--max-tokens", argv[++i], 1, INT64_MAX, &max_tokens)) return 2;
        } else if (!strcmp(argv[i], "--context") && i + 1 < argc) {
            if (!tool_parse_int("oscar-ppl", "--context", argv[++i], 1, 1 << 20, &v)) return 2;
            ctx = (int)v;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && !model_dir) model_dir = argv[i];
        else { /* named: a bare usage did not say which argument (an option without its value at the end) */
            fprintf(stderr, "oscar-ppl: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir || !tok_path || ctx <= 0) {
        fprintf(stderr, "oscar-ppl: MODEL_DIR and --tokens FILE are required\n");
        usage(stderr);
        return 2;
    }
    if (max_tokens > 0 && max_tokens < ctx) { /* no window: refused after the model load as "N tokens do not fill" */
        fprintf(stderr, "oscar-ppl: --max-tokens %" PRId64 " is below one window of --context %d; raise --max-tokens "
                "or lower --context\n", max_tokens, ctx);
        return 2;
    }
    int nthreads;
    if (oe_threads(&nthreads) != OSCAR_OK) { /* before the model load, as any bad input */
        fprintf(stderr, "oscar-ppl: %s\n", oe_last_error());
        return 2;
    }
    double t0 = now_s();
    oe_model *m = NULL;
    oscar_status ls = oe_model_load(model_dir, &m);
    if (ls != OSCAR_OK) { /* the model is the input: a bad one is bad input */
        fprintf(stderr, "oscar-ppl: %s\n", oe_last_error());
        return ls == OSCAR_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    const oe_config *c = oe_model_config(m);
    if (c->max_position > 0 && ctx > c->max_position) {
        fprintf(stderr, "oscar-ppl: --context %d exceeds the model's max_position_embeddings %d; use at most %d\n",
                ctx, c->max_position, c->max_position);
        oe_model_free(m);
        return 2;
    }
    if (c->sliding_window > 0 && ctx > c->sliding_window) { /* oe_ctx_create refused it in the run: exit 1 */
        fprintf(stderr, "oscar-ppl: --context %d exceeds the model's sliding_window %d (the engine runs full causal "
                "attention); use at most %d\n", ctx, c->sliding_window, c->sliding_window);
        oe_model_free(m);
        return 2;
    }
    printf("model %s: %s, %d layers, hidden %d, heads %d/%d, head_dim %d, vocab %d (loaded in %.2f s)\n",
           model_dir, c->model_type, c->num_layers, c->hidden, c->num_q_heads, c->num_kv_heads, c->head_dim,
           c->vocab, now_s() - t0);
    uint32_t *tok = NULL;
    int64_t n = 0;
    if ((ls = oe_tokens_load(tok_path, c->vocab, &tok, &n)) != OSCAR_OK) {
        fprintf(stderr, "oscar-ppl: %s\n", oe_last_error());
        oe_model_free(m);
        return ls == OSCAR_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    /* --max-tokens N feeds the first N tokens; the last window's last target
     * is token N itself (reference.json's ppl_fp32_first_65536 is 32 windows
     * feeding tokens [0, 65536) and scoring tokens [1, 65537)). */
    /* compared as max_tokens < n - 1: max_tokens + 1 overflowed at --max-tokens 2^63 - 1 (n became INT64_MIN) */
    if (max_tokens > 0 && max_tokens < n - 1) n = max_tokens + 1;
    if (n < (int64_t)ctx + 1) { /* the message named neither the file nor what to change */
        fprintf(stderr, "oscar-ppl: %s holds %" PRId64 " tokens, fewer than one window of --context %d plus its "
                "last target; give a longer token file or a shorter --context\n", tok_path, n, ctx);
        free(tok);
        oe_model_free(m);
        return 2;
    }
    printf("tokens %s: %" PRId64 " tokens available to windows of %d (+1 target)\n", tok_path, n, ctx);
    fflush(stdout);
    progress_state ps = {now_s(), ctx};
    oe_ppl_result r;
    oscar_status s = oe_perplexity(m, tok, n, ctx, NULL, progress, &ps, &r);
    double el = now_s() - ps.t0;
    free(tok);
    oe_model_free(m);
    if (s != OSCAR_OK) { /* NONFINITE: the model's weights produce NaN/Inf logits (bad input) */
        fprintf(stderr, "oscar-ppl: %s\n", oe_last_error());
        return s == OSCAR_ERR_NONFINITE || s == OSCAR_ERR_EMPTY ? 2 : 1;
    }
    printf("windows %" PRId64 ", scored tokens %" PRId64 ", mean NLL %.6f\n", r.windows, r.scored,
           r.nll_sum / (double)r.scored);
    printf("perplexity %.4f\n", r.ppl);
    printf("time %.1f s, %.0f tokens/s (forward + lm_head)\n", el, (double)(r.windows * ctx) / el);
    return 0;
}
