/* oscar-engine-bench: forward throughput of the reference engine, with and
 * without the lm_head (calibration runs without), wall and CPU time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "tool_args.h"

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --help prints on stdout (a write error there is the exit status), a misuse on stderr, as the other tools. */
static void usage(FILE *f)
{
    fprintf(f, "usage: oscar-engine-bench MODEL_DIR --tokens FILE [--windows 4] [--context 2048]\n"
               "  MODEL_DIR  Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint (config.json + safetensors)\n"
               "  --tokens   uint32 little-endian token ids\n"
               "  --windows  windows of --context tokens fed, each with and without the lm_head\n");
}

int main(int argc, char **argv)
{
    tool_watch_stdout("oscar-engine-bench");
    const char *dir = NULL, *tok_path = NULL;
    int windows = 4, ctx = 2048;
    int64_t v;
    tool_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        if (!tool_args_once(&seen, "oscar-engine-bench", argv[i], NULL, NULL)) return 2;
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tok_path = argv[++i];
        /* Strict, as the other tools: atoi ran "12abc" as 12 and sized the logits by an
         * unchecked context (2^30: a 32 TiB malloc, an abort under ASan). */
        else if (!strcmp(argv[i], "--windows") && i + 1 < argc) {
            if (!tool_parse_int("oscar-engine-bench", "--windows", argv[++i], 1, 1 << 20, &v)) return 2;
            windows = (int)v;
        } else if (!strcmp(argv[i], "--context") && i + 1 < argc) {
            if (!tool_parse_int("oscar-engine-bench", "--context", argv[++i], 1, 1 << 20, &v)) return 2;
            ctx = (int)v;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] != '-' && !dir) dir = argv[i];
        else { /* named: a bare usage did not say which argument (an option without its value at the end) */
            fprintf(stderr, "oscar-engine-bench: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir || !tok_path || windows < 1 || ctx < 1) {
        fprintf(stderr, "oscar-engine-bench: MODEL_DIR and --tokens FILE are required\n");
        usage(stderr);
        return 2;
    }
    int nthreads;
    if (oe_threads(&nthreads) != OSCAR_OK) { /* before the model load, as any bad input */
        fprintf(stderr, "oscar-engine-bench: %s\n", oe_last_error());
        return 2;
    }
    oe_model *m = NULL;
    uint32_t *tok = NULL;
    int64_t n = 0;
    oscar_status s = oe_model_load(dir, &m);
    if (s == OSCAR_OK) s = oe_tokens_load(tok_path, oe_model_config(m)->vocab, &tok, &n);
    if (s != OSCAR_OK) { /* bad input (2), as the other tools; out of memory stays a failure (1) */
        fprintf(stderr, "oscar-engine-bench: %s\n", oe_last_error());
        oe_model_free(m);
        return s == OSCAR_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    const oe_config *cf = oe_model_config(m);
    if (cf->max_position > 0 && ctx > cf->max_position) {
        fprintf(stderr, "oscar-engine-bench: --context %d exceeds the model's max_position_embeddings %d; use at "
                "most %d\n", ctx, cf->max_position, cf->max_position);
        free(tok);
        oe_model_free(m);
        return 2;
    }
    if (cf->sliding_window > 0 && ctx > cf->sliding_window) { /* oe_ctx_create refused it: exit 1 */
        fprintf(stderr, "oscar-engine-bench: --context %d exceeds the model's sliding_window %d (the engine runs full "
                "causal attention); use at most %d\n", ctx, cf->sliding_window, cf->sliding_window);
        free(tok);
        oe_model_free(m);
        return 2;
    }
    if (n < ctx) { /* no window: the tool printed a rate of 0 tokens over 0 s */
        fprintf(stderr, "oscar-engine-bench: %s holds %lld tokens, fewer than one window of --context %d; give a "
                "longer token file or a shorter context\n", tok_path, (long long)n, ctx);
        free(tok);
        oe_model_free(m);
        return 2;
    }
    if ((int64_t)windows * ctx > n) windows = (int)(n / ctx);
    oe_ctx *c = NULL;
    float *logits = malloc((size_t)ctx * oe_model_config(m)->vocab * sizeof(float));
    if (!logits || oe_ctx_create(m, ctx, &c) != OSCAR_OK) {
        if (!logits) /* not the engine's: its last message would be stale */
            fprintf(stderr, "oscar-engine-bench: out of memory for %d x %d logits; use a shorter --context\n", ctx,
                    oe_model_config(m)->vocab);
        else
            fprintf(stderr, "oscar-engine-bench: %s\n", oe_last_error());
        free(logits);
        free(tok);
        oe_model_free(m);
        return 1;
    }
    for (int mode = 0; mode < 2; mode++) {
        oe_forward_options o;
        oe_forward_options_default(&o);
        o.skip_lm_head = mode == 0;
        double w0 = wall_s(), c0 = cpu_s();
        for (int w = 0; w < windows; w++)
            if ((s = oe_forward(c, tok + (size_t)w * ctx, ctx, &o, logits)) != OSCAR_OK) {
                fprintf(stderr, "oscar-engine-bench: %s\n", oe_last_error());
                free(logits);
                free(tok);
                oe_ctx_free(c);
                oe_model_free(m);
                /* NaN/Inf logits: the model's weights (bad input, as oscar-ppl); exit 1 said the tool failed */
                return s == OSCAR_ERR_NONFINITE ? 2 : 1;
            }
        double wall = wall_s() - w0, cpu = cpu_s() - c0;
        printf("%-16s %d windows x %d: %.2f s wall (%.0f tokens/s), %.2f s CPU (%.0f tokens per CPU-second)\n",
               mode == 0 ? "no lm_head" : "with lm_head", windows, ctx, wall, windows * ctx / wall, cpu,
               windows * ctx / cpu);
    }
    free(logits);
    free(tok);
    oe_ctx_free(c);
    oe_model_free(m);
    return 0;
}
