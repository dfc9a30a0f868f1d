/* oscar-calibrate: OSCAR rotations and clips for a Hugging Face checkpoint,
 * computed with the reference engine over independent windows of a token
 * file (GUIDE §1; docs/CALIBRATION.md). Exit codes: 0 ok, 1 runtime failure,
 * 2 bad input (arguments, model directory, token file, unsupported shape). */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "oscar_calibrate.h"
#include "tool_params.h"
#include "tool_args.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The code-width ranking (oscar_calib_width_report_get): every head-tensor's probe error alone at 2 bits
 * and at 3 bits unclipped, its share of the sum at 2 bits, best gain first. */
static void print_widths(const oscar_calib *calib, const oscar_params *params, const oe_config *cf) {
    const int n = cf->num_layers * cf->num_kv_heads * 2;
    oscar_calib_width_report *w = calloc((size_t)n, sizeof *w);
    int *ord = calloc((size_t)n, sizeof *ord);
    double total = 0.0;
    int ok = w && ord;
    for (int i = 0; ok && i < n; i++) {
        ok = oscar_calib_width_report_get(calib, i / 2 / cf->num_kv_heads, i / 2 % cf->num_kv_heads,
                                          (oscar_kv)(i % 2), &w[i]) == OSCAR_OK;
        total += ok ? w[i].err2 : 0.0;
        ord[i] = i;
    }
    if (ok && total > 0.0) {
        for (int i = 1; i < n; i++) /* insertion sort by gain, largest first */
            for (int j = i; j > 0 && w[ord[j]].err2 - w[ord[j]].err3 > w[ord[j - 1]].err2 - w[ord[j - 1]].err3; j--) {
                int t = ord[j];
                ord[j] = ord[j - 1];
                ord[j - 1] = t;
            }
        printf("\ncode widths: each head-tensor's attention-output error on probes alone (output metric, per query\n"
               "position), at 2 bits (chosen clip) and 3 bits (clip 1); share = its part of the sum at 2 bits\n");
        printf("rank | layer head K/V |   err 2-bit   err 3-bit        gain | share | relative 2-bit | width\n");
        for (int r = 0; r < n && r < 12; r++) {
            const int i = ord[r];
            int b = 2;
            oscar_params_code_bits(params, i / 2 / cf->num_kv_heads, i / 2 % cf->num_kv_heads, (oscar_kv)(i % 2), &b);
            printf("%4d | %5d %4d   %c | %11.4e %11.4e %11.4e | %4.1f%% | %14.5f | %d\n", r + 1,
                   i / 2 / cf->num_kv_heads, i / 2 % cf->num_kv_heads, i % 2 ? 'V' : 'K', w[i].err2, w[i].err3,
                   w[i].err2 - w[i].err3, 100.0 * w[i].err2 / total, w[i].norm > 0.0 ? w[i].err2 / w[i].norm : 0.0,
                   b);
        }
        if (n > 12) printf("(%d more head-tensors below)\n", n - 12);
    }
    free(w);
    free(ord);
}

static void usage(FILE *fp) {
    fprintf(fp,
            "usage: oscar-calibrate MODEL_DIR --tokens FILE --out PARAMS.safetensors [options]\n"
            "  MODEL_DIR        Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint (config.json + safetensors)\n"
            "  --tokens FILE    uint32 little-endian token ids\n"
            "  --out FILE       parameter file to write (docs/FORMAT.md)\n"
            "  --max-tokens N   use the first N tokens (default 65536), as floor(N / window) windows\n"
            "  --window N       tokens per independent window (default 2048)\n"
            "  --group N        quant group used when fitting clips (default: head_dim up to 128, else half of it)\n"
            "  --per-head       one rotation per KV head (the default)\n"
            "  --per-layer      one rotation per layer, shared by its KV heads (a file num_kv_heads\n"
            "                   times smaller)\n"
            "  --lloyd-max      fit for Lloyd-Max 2-bit levels (method OSCAR2_LM)\n"
            "  --clip-k C       fixed key clip ratio in (0, 1] (default: fitted)\n"
            "  --clip-v C       fixed value clip ratio in (0, 1] (default: fitted)\n"
            "  --clip-per-head  one clip ratio per KV head, each fitted on its head's probes (format_version 3)\n"
            "  --clip-per-layer one clip ratio per layer for K and V, every head gets it (default)\n"
            "  --clip-objective probes|rows  what the fitted clips minimise: attention-output error on\n"
            "                   probes (default) or the score error of held-back rows\n"
            "  --permutation bitrev|random|spread  placement of the eigen-directions in R = U.H.P\n"
            "                   (default spread, the m-sequence order; bitrev is the published one;\n"
            "                   docs/eval/permutation.md)\n"
            "  --rounding feedback|nearest  write-path rounding the parameters ask for (default\n"
            "                   feedback: rounding errors carried along the row in the attention\n"
            "                   metric, docs/eval/feedback.md; nearest is the published rule)\n"
            "  --copy-windows N copy windows (a span of calibration text fed twice) whose probes join\n"
            "                   the clip objective, so retrieval from the 2-bit region counts (0..64,\n"
            "                   default 0; docs/eval/retrieval.md)\n"
            "  --probe-queries N  query positions per attention probe of the clip fit (1..64; default 16\n"
            "                   with --sink 0 --recent 0, else 1; each window's probe keeps its keys\n"
            "                   once and reads them from N positions)\n"
            "  --probe-span half|all  probe query positions from the window's second half (default)\n"
            "                   or from every position that reads a 2-bit region\n"
            "  --clip-margin X  take the mildest clip whose probe error is within (1 + X) of the\n"
            "                   smallest (X in [0, 1], default 0)\n"
            "  --feedback-damp X  ridge on the error-feedback metric, a share in (0, 1] of its mean\n"
            "                   eigenvalue (default 0.001; with --sink 0 --recent 0 the default picks\n"
            "                   0.001, 0.01 or 0.1 per layer and K/V on the probes; docs/EVAL.md)\n"
            "  --wide-bits X    code widths: store the head-tensors whose probe error 3-bit codes cut\n"
            "                   most in 3 bits (unclipped; format_version 4), while the bits per element\n"
            "                   they add stay <= X (each adds 1 / (2 layers KV heads)); default 0.05\n"
            "                   (tiny-qwen3: one of 32, 2.281 bits/elt), 0 with --lloyd-max or\n"
            "                   --clip-objective rows; --wide-bits 0: 2 bits everywhere\n"
            "                   (docs/CALIBRATION.md \"Code widths\")\n"
            "  --copy-mass-loss X  how much source attention weight a key clip may cost the copy\n"
            "                   probes (default 0.002)\n"
            "  --copy-heads M   name copy heads on copy probes (a span of calibration text fed twice;\n"
            "                   --copy-windows defaults to 8 with it): a KV head whose copy queries put\n"
            "                   a mean attention weight >= M (in (0, 1]) on the copied token's source is\n"
            "                   one, and its key clip is at least --copy-head-clip; the other heads\n"
            "                   are fitted as without copy probes (opt-in; format_version 3 when a\n"
            "                   copy head's ratio differs from its layer's; docs/EVAL.md, twenty-\n"
            "                   fourth session)\n"
            "  --copy-head-clip C  the copy heads' key clip floor in (0, 1] (default 0.97; needs\n"
            "                   --copy-heads)\n"
            "  --key-attn-weight X  share in [0, 1] of the attention-weighted query covariance in the\n"
            "                   key target (queries weighted by their squared attention on the 2-bit\n"
            "                   region; default 1; 0: E[q q^T], published; docs/EVAL.md)\n"
            "  --sink N         cache sink the clips are fitted for (default 64)\n"
            "  --recent N       cache recent window the clips are fitted for (default 256; --sink 0\n"
            "                   --recent 0: no windows, every key and value in 2 bits, s0w0)\n"
            "  --clip-search N  refine the clips per layer by the end-to-end KL of the next-token\n"
            "                   distribution on N held-out windows of the token file, right after the\n"
            "                   calibration windows (default 0: keep the probe-fitted clips; docs/eval\n"
            "                   uses 4: ~250 s more for tiny-qwen3 on 2 cores, a CPU forward of the\n"
            "                   model per candidate clip, so it grows with the model)\n"
            "  --clip-search-sweeps N  passes over the layers (default 1)\n"
            "  --threads N      engine threads and finalize's clip-fitting workers (default: all cores)\n"
            "  --recompute      run the forward again in pass 1 instead of caching pass 0's K/V\n");
}

static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    return tool_parse_int("oscar-calibrate", flag, s, lo, hi, out);
}

static int parse_clip(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    /* the ratio is stored as a float: 1e-46 is positive as a double and 0 as a float, where 0 asks
     * for a fitted clip (--clip-k) or the default (--copy-head-clip) */
    if (errno || end == s || *end || isspace((unsigned char)*s) || !(v > 0.0 && v <= 1.0) || !((float)v > 0.0f)) {
        fprintf(stderr, "oscar-calibrate: %s wants a clip ratio in (0, 1], got '%s'\n", flag, s);
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* A number in [0, 1] (a share or a loss of attention weight). */
static int parse_share(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isspace((unsigned char)*s) || !(v >= 0.0 && v <= 1.0)) {
        fprintf(stderr, "oscar-calibrate: %s wants a number in [0, 1], got '%s'\n", flag, s);
        return 0;
    }
    *out = (float)v;
    return 1;
}

/* One of n keywords; *out gets its index. The message lists them: 'a' or 'b', 'a', 'b' or 'c'. */
static int parse_choice(const char *flag, const char *s, const char *const *names, int n, int *out) {
    for (int k = 0; k < n; k++)
        if (!strcmp(s, names[k])) {
            *out = k;
            return 1;
        }
    fprintf(stderr, "oscar-calibrate: %s wants ", flag);
    for (int k = 0; k < n; k++) fprintf(stderr, "%s'%s'", k == 0 ? "" : (k == n - 1 ? " or " : ", "), names[k]);
    fprintf(stderr, ", got '%s'\n", s);
    return 0;
}

int main(int argc, char **argv) {
    tool_watch_stdout("oscar-calibrate");
    const char *model_dir = NULL, *tok_path = NULL, *out_path = NULL;
    ocal_options o;
    ocal_options_default(&o);
    o.progress = stderr;
    int64_t v = 0, threads = 0, search_windows = 0, search_sweeps = 1;
    tool_seen seen = {.n = 0};
    static const char *const same[] = {"--per-head --per-layer", "--clip-per-head --clip-per-layer", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!tool_args_once(&seen, "oscar-calibrate", a, NULL, same)) return 2;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokens") && has) tok_path = argv[++i];
        else if (!strcmp(a, "--out") && has) out_path = argv[++i];
        else if (!strcmp(a, "--max-tokens") && has) {
            if (!parse_int(a, argv[++i], 1, INT64_MAX, &o.max_tokens)) return 2;
        } else if (!strcmp(a, "--window") && has) {
            if (!parse_int(a, argv[++i], 1, 1 << 20, &v)) return 2;
            o.window = (int)v;
        } else if (!strcmp(a, "--group") && has) {
            if (!parse_int(a, argv[++i], 1, 1 << 16, &v)) return 2;
            o.group = (int)v;
        } else if (!strcmp(a, "--threads") && has) {
            if (!parse_int(a, argv[++i], 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--clip-k") && has) {
            if (!parse_clip(a, argv[++i], &o.clip_k)) return 2;
        } else if (!strcmp(a, "--clip-v") && has) {
            if (!parse_clip(a, argv[++i], &o.clip_v)) return 2;
        } else if (!strcmp(a, "--clip-search") && has) {
            if (!parse_int(a, argv[++i], 0, 1 << 20, &search_windows)) return 2;
        } else if (!strcmp(a, "--clip-search-sweeps") && has) {
            if (!parse_int(a, argv[++i], 1, 100, &search_sweeps)) return 2;
        } else if (!strcmp(a, "--clip-objective") && has) {
            static const char *const names[] = {"probes", "rows"};
            if (!parse_choice(a, argv[++i], names, 2, &o.clip_objective)) return 2;
        } else if (!strcmp(a, "--permutation") && has) {
            static const char *const names[] = {"bitrev", "random", "spread"};
            if (!parse_choice(a, argv[++i], names, 3, &o.permutation)) return 2;
        } else if (!strcmp(a, "--rounding") && has) {
            static const char *const names[] = {"nearest", "feedback"};
            if (!parse_choice(a, argv[++i], names, 2, &o.rounding)) return 2;
        } else if (!strcmp(a, "--sink") && has) {
            if (!parse_int(a, argv[++i], 0, 1 << 24, &v)) return 2;
            o.sink = (int)v;
            if (o.sink == 0) o.sink = -1; /* explicit 0: no sink (0 in ocal_options means default) */
        } else if (!strcmp(a, "--recent") && has) {
            if (!parse_int(a, argv[++i], 0, 1 << 24, &v)) return 2;
            o.recent = (int)v;
            if (o.recent == 0) o.recent = -1; /* explicit 0: no recent window (the s0w0 layout) */
        } else if (!strcmp(a, "--copy-windows") && has) {
            if (!parse_int(a, argv[++i], 0, 64, &v)) return 2;
            o.copy_windows = (int)v;
        } else if (!strcmp(a, "--probe-queries") && has) {
            if (!parse_int(a, argv[++i], 1, 64, &v)) return 2;
            o.probe_queries = (int)v;
        } else if (!strcmp(a, "--probe-span") && has) {
            static const char *const names[] = {"half", "all"};
            if (!parse_choice(a, argv[++i], names, 2, &o.probe_span)) return 2;
        } else if (!strcmp(a, "--clip-margin") && has) {
            if (!parse_share(a, argv[++i], &o.clip_margin)) return 2;
        } else if (!strcmp(a, "--feedback-damp") && has) {
            if (!parse_share(a, argv[++i], &o.feedback_damp)) return 2;
            if (!(o.feedback_damp > 0.0f)) {
                fprintf(stderr, "oscar-calibrate: --feedback-damp must be in (0, 1], got 0\n");
                return 2;
            }
        } else if (!strcmp(a, "--wide-bits") && has) {
            if (!parse_share(a, argv[++i], &o.wide_bits)) return 2;
        } else if (!strcmp(a, "--copy-heads") && has) {
            if (!parse_share(a, argv[++i], &o.copy_head_mass)) return 2;
            if (!(o.copy_head_mass > 0.0f)) {
                fprintf(stderr, "oscar-calibrate: --copy-heads must be in (0, 1] (a source attention weight), "
                                "got 0\n");
                return 2;
            }
        } else if (!strcmp(a, "--copy-head-clip") && has) {
            if (!parse_clip(a, argv[++i], &o.copy_head_clip)) return 2;
        } else if (!strcmp(a, "--copy-mass-loss") && has) {
            if (!parse_share(a, argv[++i], &o.copy_mass_loss)) return 2;
        } else if (!strcmp(a, "--key-attn-weight") && has) {
            if (!parse_share(a, argv[++i], &o.key_attn_weight)) return 2;
        } else if (!strcmp(a, "--per-head")) o.per_head = 1;
        else if (!strcmp(a, "--per-layer")) o.per_head = 0;
        else if (!strcmp(a, "--clip-per-layer")) o.clip_per_head = 0;
        else if (!strcmp(a, "--clip-per-head")) o.clip_per_head = 1;
        else if (!strcmp(a, "--lloyd-max")) o.lloyd_max = 1;
        else if (!strcmp(a, "--recompute")) o.pass1 = OCAL_PASS1_RECOMPUTE;
        else if (a[0] != '-' && !model_dir) model_dir = a;
        else {
            fprintf(stderr, "oscar-calibrate: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir || !tok_path || !out_path) {
        fprintf(stderr, "oscar-calibrate: MODEL_DIR, --tokens and --out are required\n");
        usage(stderr);
        return 2;
    }
    if (o.copy_head_clip > 0.0f && !(o.copy_head_mass > 0.0f)) {
        fprintf(stderr, "oscar-calibrate: --copy-head-clip needs --copy-heads M (which heads get the floor)\n");
        return 2;
    }
    if (o.copy_head_mass > 0.0f && o.copy_windows == 0) {
        fprintf(stderr, "oscar-calibrate: --copy-heads names copy heads on copy windows: drop --copy-windows 0 "
                        "or give N > 0\n");
        return 2;
    }
    if (o.copy_head_mass > 0.0f && o.clip_objective != 0) {
        fprintf(stderr, "oscar-calibrate: --copy-heads works on the attention probes: drop --clip-objective rows\n");
        return 2;
    }
    if (o.wide_bits > 0.0f && (o.lloyd_max || o.clip_objective != 0)) {
        fprintf(stderr, "oscar-calibrate: --wide-bits %g with %s: %s; drop one of the two (without --wide-bits, "
                        "%s calibrates 2 bits everywhere)\n",
                (double)o.wide_bits, o.lloyd_max ? "--lloyd-max" : "--clip-objective rows",
                o.lloyd_max ? "3-bit head-tensors have uniform levels (oscar2), no Lloyd-Max set"
                            : "the code-width rule ranks head-tensors on the attention probes",
                o.lloyd_max ? "--lloyd-max" : "--clip-objective rows");
        return 2;
    }
    /* Options that would be ignored without a word: the run then was not the one asked for. */
    if (search_windows > 0 && o.clip_k > 0.0f && o.clip_v > 0.0f) {
        fprintf(stderr, "oscar-calibrate: --clip-search %" PRId64 " has no clip to search: --clip-k and --clip-v fix "
                "both; drop --clip-search or one of the fixed clips\n", search_windows);
        return 2;
    }
    if (o.feedback_damp > 0.0f && o.rounding == 0) {
        fprintf(stderr, "oscar-calibrate: --feedback-damp is the ridge of error-feedback rounding, which --rounding "
                "nearest turns off; drop one of the two\n");
        return 2;
    }
    if (o.max_tokens < o.window) {
        fprintf(stderr,
                "oscar-calibrate: --max-tokens %" PRId64 " is smaller than one window of %d tokens: raise "
                "--max-tokens or lower --window\n",
                o.max_tokens, o.window);
        return 2;
    }
    {
        char why[512];
        if (ocal_check_copy_windows(&o, why, sizeof why) != OSCAR_OK) {
            fprintf(stderr, "oscar-calibrate: %s\n", why);
            return 2;
        }
    }
    /* The output is written last, after minutes of work: check now that it
     * can be (its folder exists and is writable, it is not a folder). */
    {
        char why[4400];
        if (!tool_output_ok(out_path, why, sizeof why)) {
            fprintf(stderr, "oscar-calibrate: --out %s; choose another --out\n", why);
            return 2;
        }
        if (tool_same_file(out_path, tok_path)) { /* the parameters would replace the tokens */
            fprintf(stderr, "oscar-calibrate: --out and --tokens name the same file (%s); choose another --out\n",
                    out_path);
            return 2;
        }
        char which[256];
        if (oe_model_reads(model_dir, out_path, which, sizeof which)) { /* the parameters would replace the model */
            fprintf(stderr, "oscar-calibrate: --out %s is the model's %s (an input); choose another --out\n",
                    out_path, which);
            return 2;
        }
    }
    /* The engine reads OE_THREADS when its context is created. */
    if (threads > 0) {
        o.threads = (int)threads > 64 ? 64 : (int)threads;
        char buf[16];
        snprintf(buf, sizeof buf, "%d", (int)threads);
        setenv("OE_THREADS", buf, 1);
    }
    int nthreads;
    if (oe_threads(&nthreads) != OSCAR_OK) { /* before the model load, as any bad input */
        fprintf(stderr, "oscar-calibrate: %s\n", oe_last_error());
        return 2;
    }

    /* Check the shape on config.json before loading any weight. */
    struct stat sb;
    if (stat(model_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "oscar-calibrate: model directory '%s' does not exist or is not a directory\n", model_dir);
        return 2;
    }
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_dir);
    oe_config cfg;
    if (oe_config_load(cfg_path, &cfg) != OSCAR_OK) {
        fprintf(stderr, "oscar-calibrate: %s\n", oe_last_error());
        return 2;
    }
    int group = o.group > 0 ? o.group : 0; /* 0: the default of the head_dim */
    {
        char why[400];
        if (ocal_check_shape(cfg.head_dim, &group, why, sizeof why) != OSCAR_OK) {
            fprintf(stderr, "oscar-calibrate: %s (head_dim from %s, group %s)\n", why, cfg_path,
                    o.group > 0 ? "from --group" : "the default");
            return 2;
        }
        o.group = group; /* the calibration and the clip search use the same group */
    }
    if (cfg.max_position > 0 && o.window > cfg.max_position) { /* as oscar-eval and oscar-ppl's --context */
        fprintf(stderr, "oscar-calibrate: --window %d exceeds the model's max_position_embeddings %d; use at most %d\n",
                o.window, cfg.max_position, cfg.max_position);
        return 2;
    }
    if (cfg.sliding_window > 0 && o.window > cfg.sliding_window) { /* the engine refused it after the load: exit 1 */
        fprintf(stderr, "oscar-calibrate: --window %d exceeds the model's sliding_window %d (the engine runs full "
                "causal attention); use at most %d\n", o.window, cfg.sliding_window, cfg.sliding_window);
        return 2;
    }
    { /* after the model's limits on --window (a window past them is refused as such first) */
        char why[512];
        if (ocal_check_probe_window(&o, why, sizeof why) != OSCAR_OK) {
            fprintf(stderr, "oscar-calibrate: %s\n", why);
            return 2;
        }
    }

    double t_start = now_s();
    uint32_t *tok = NULL;
    int64_t ntok = 0;
    if (oe_tokens_load(tok_path, cfg.vocab, &tok, &ntok) != OSCAR_OK) {
        fprintf(stderr, "oscar-calibrate: %s\n", oe_last_error());
        return 2;
    }
    if (ocal_window_count(&o, ntok) < 1) {
        fprintf(stderr, "oscar-calibrate: %s holds %" PRId64 " tokens, fewer than one window of %d\n", tok_path, ntok,
                o.window);
        free(tok);
        return 2;
    }
    oe_model *m = NULL;
    oscar_status ls = oe_model_load(model_dir, &m);
    if (ls != OSCAR_OK) { /* the model is the input: a bad one is bad input */
        fprintf(stderr, "oscar-calibrate: %s\n", oe_last_error());
        free(tok);
        return ls == OSCAR_ERR_OUT_OF_MEMORY ? 1 : 2;
    }
    double t_load = now_s() - t_start;
    char hash[17];
    ocal_model_hash(&cfg, hash);
    printf("model %s: %s, %d layers, hidden %d, heads %d/%d, head_dim %d, vocab %d, fingerprint %s (loaded in "
           "%.2f s)\n",
           model_dir, cfg.model_type, cfg.num_layers, cfg.hidden, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim,
           cfg.vocab, hash, t_load);
    printf("tokens %s: %" PRId64 " available, %d windows of %d (%" PRId64 " tokens)\n", tok_path, ntok,
           ocal_window_count(&o, ntok), o.window, (int64_t)ocal_window_count(&o, ntok) * o.window);
    fflush(stdout);

    oscar_calib *calib = NULL;
    oscar_params *params = NULL;
    ocal_stats st;
    char err[1024];
    oscar_status s = ocal_run(m, tok, ntok, &o, &calib, &params, &st, err, sizeof err);
    if (s != OSCAR_OK) {
        free(tok);
        oe_model_free(m);
        fprintf(stderr, "oscar-calibrate: %s\n", err);
        /* NONFINITE: the model's weights give NaN/Inf keys or values (bad input, as oscar-ppl and oscar-eval) */
        return s == OSCAR_ERR_UNSUPPORTED_HEAD_DIM || s == OSCAR_ERR_UNSUPPORTED_GROUP || s == OSCAR_ERR_NONFINITE
                   ? 2
                   : 1;
    }
    /* Held-out windows for the clip search: the tokens right after the
     * calibration windows (never the ones the covariances came from). */
    ocal_search_options so;
    ocal_search_options_default(&so);
    so.window = o.window;
    so.sink = o.sink < 0 ? 0 : o.sink > 0 ? o.sink : 64;
    so.recent = o.recent < 0 ? 0 : o.recent > 0 ? o.recent : 256;
    so.group = o.group;
    so.method = o.lloyd_max ? OSCAR_METHOD_OSCAR2_LM : OSCAR_METHOD_OSCAR2;
    so.sweeps = (int)search_sweeps;
    so.fix_k = o.clip_k > 0.0f;
    so.fix_v = o.clip_v > 0.0f;
    so.progress = stderr;
    int64_t h0 = st.tokens, avail = (ntok - h0) / o.window;
    so.windows = (int)(search_windows < avail ? search_windows : avail);
    ocal_search_stats ss;
    memset(&ss, 0, sizeof ss);
    float *clip0 = calloc((size_t)cfg.num_layers * 2, sizeof(float));
    int searched = 0;
    if (!clip0) s = OSCAR_ERR_OUT_OF_MEMORY;
    for (int l = 0; clip0 && l < cfg.num_layers; l++) {
        oscar_params_clip(params, l, OSCAR_K, &clip0[2 * l]);
        oscar_params_clip(params, l, OSCAR_V, &clip0[2 * l + 1]);
    }
    if (s == OSCAR_OK && search_windows > 0 && !(so.fix_k && so.fix_v)) {
        if (so.windows < 1)
            fprintf(stderr, "oscar-calibrate: no clip search: %s has no full window of %d tokens after the %" PRId64
                    " calibration tokens\n", tok_path, o.window, h0);
        else if (so.window <= so.sink + so.recent + 1)
            fprintf(stderr, "oscar-calibrate: no clip search: windows of %d have no query reading a 2-bit key "
                    "(sink %d + recent %d)\n", so.window, so.sink, so.recent);
        else {
            s = ocal_clip_search(m, tok + h0, ntok - h0, params, &so, &ss, err, sizeof err);
            searched = s == OSCAR_OK;
        }
    }
    free(tok);
    oe_model_free(m);
    if (s != OSCAR_OK) {
        fprintf(stderr, "oscar-calibrate: clip search: %s\n", err);
        free(clip0);
        oscar_params_destroy(params);
        oscar_calib_destroy(calib);
        return s == OSCAR_ERR_NONFINITE ? 2 : 1; /* NaN/Inf logits: the model's weights (bad input) */
    }
    if (oscar_params_save(params, out_path) != OSCAR_OK) {
        fprintf(stderr, "oscar-calibrate: %s\n", oscar_last_error());
        free(clip0);
        oscar_params_destroy(params);
        oscar_calib_destroy(calib);
        return 1;
    }

    printf("\nattention-aware relative 2-bit error on held-back rows (lower is better)\n");
    printf("layer |   K none  K Hadamard    K OSCAR  clip_k |   V none  V Hadamard    V OSCAR  clip_v\n");
    printf("------+--------------------------------------------+------------------------------------------\n");
    for (int l = 0; l < cfg.num_layers; l++) {
        oscar_calib_layer_report r;
        if (oscar_calib_layer_report_get(calib, l, &r) != OSCAR_OK) {
            fprintf(stderr, "oscar-calibrate: %s\n", oscar_last_error());
            break;
        }
        printf("%5d | %8.4f  %10.4f  %9.4f  %6.2f | %8.4f  %10.4f  %9.4f  %6.2f\n", l, r.err_k[0], r.err_k[1],
               r.err_k[2], (double)r.clip_k, r.err_v[0], r.err_v[1], r.err_v[2], (double)r.clip_v);
    }
    printf("(clip_k, clip_v: the layer's mildest over its KV heads)\nclip ratios per KV head, K / V:\n");
    for (int l = 0; l < cfg.num_layers; l++) {
        printf("%5d |", l);
        for (int h = 0; h < cfg.num_kv_heads; h++) {
            float ck = 1.0f, cv = 1.0f;
            oscar_params_clip_head(params, l, h, OSCAR_K, &ck);
            oscar_params_clip_head(params, l, h, OSCAR_V, &cv);
            printf(" h%d %.2f / %.2f", h, (double)ck, (double)cv);
        }
        printf("\n");
    }
    if (o.rounding != 0) /* the value metric was passed: outputs are compared as W_O sees them */
        printf("\nrelative attention-output error on probes as the output projection sees it,\n"
               "sum e^T M e / sum o^T M o with M = W_O^T W_O of the head's queries (lower is better;\n"
               "none/Hadamard at clip 1, OSCAR at the chosen clips and error-feedback rounding;\n"
               "K: V exact, V: K exact, KV: both)\n");
    else
        printf("\nrelative attention-output error on probes, sum |o^-o|^2 / sum |o|^2 (lower is better;\n"
               "none/Hadamard at clip 1, OSCAR at the chosen clips; K: V exact, V: K exact, KV: both)\n");
    printf("layer | probes |   K none   K Had  K OSCAR |   V none   V Had  V OSCAR |  KV none  KV Had KV OSCAR\n");
    int no_probes = 0;
    for (int l = 0; l < cfg.num_layers; l++) {
        oscar_calib_attn_report r;
        if (oscar_calib_layer_attn_report_get(calib, l, &r) != OSCAR_OK) {
            fprintf(stderr, "oscar-calibrate: %s\n", oscar_last_error());
            break;
        }
        printf("%5d | %6d | %8.5f %7.5f %8.5f | %8.5f %7.5f %8.5f | %8.5f %7.5f %8.5f\n", l, (int)r.probes,
               r.err_k[0], r.err_k[1], r.err_k[2], r.err_v[0], r.err_v[1], r.err_v[2], r.err_kv[0], r.err_kv[1],
               r.err_kv[2]);
        no_probes += r.probes == 0;
    }
    oscar_calib_copy_report cr0;
    oscar_calib_options cmo;
    oscar_calib_options_default(&cmo, 1, 1, 1, 128);
    if (oscar_calib_layer_copy_report_get(calib, 0, &cr0) == OSCAR_OK && cr0.probes > 0) {
        printf("\ncopy probes (a span of calibration text repeated): mean attention weight of the second copy's\n"
               "queries on their source key, exact / 2-bit keys at clip 1 / at the chosen clip_k; ");
        if (o.copy_head_mass > 0.0f)
            printf("no bound on the key clip\n(copy heads below; clip_k: the layer's mildest, the attention error's "
                   "own choice in brackets)\n");
        else
            printf("a key clip may\ncost at most %.4f of it (clip_k the attention error alone would pick in brackets)\n",
                   (double)(o.copy_mass_loss >= 0.0f ? o.copy_mass_loss : cmo.copy_mass_loss));
        printf("layer | probes |  mass bf16  clip 1  chosen | clip_k (free)\n");
        for (int l = 0; l < cfg.num_layers; l++) {
            oscar_calib_copy_report cr;
            float ck;
            if (oscar_calib_layer_copy_report_get(calib, l, &cr) != OSCAR_OK) break;
            oscar_params_clip(params, l, OSCAR_K, &ck);
            printf("%5d | %6d | %10.5f %7.5f %7.5f | %4.2f (%4.2f)\n", l, (int)cr.probes, cr.mass[0], cr.mass[1],
                   cr.mass[2], (double)ck, (double)cr.clip_free);
        }
    }
    if (o.copy_head_mass > 0.0f) {
        printf("\ncopy heads (--copy-heads %.3f, key clip floor %.2f): per KV head, mean attention weight of the\n"
               "second copy's queries on their source key, exact / 2-bit keys at clip 1 / at its clip_k\n",
               (double)o.copy_head_mass, (double)(o.copy_head_clip > 0.0f ? o.copy_head_clip : cmo.copy_head_clip));
        printf("layer  head | probes |  mass bf16  clip 1  chosen | clip_k | copy head\n");
        int named = 0;
        for (int l = 0; l < cfg.num_layers; l++)
            for (int h = 0; h < cfg.num_kv_heads; h++) {
                oscar_calib_head_copy_report hr;
                if (oscar_calib_head_copy_report_get(calib, l, h, &hr) != OSCAR_OK) break;
                printf("%5d %5d | %6d | %10.5f %7.5f %7.5f |   %4.2f | %s\n", l, h, (int)hr.probes, hr.mass[0],
                       hr.mass[1], hr.mass[2], (double)hr.clip_k, hr.copy_head ? "yes" : "-");
                named += hr.copy_head;
            }
        printf("%d copy head(s) named\n", named);
    }
    print_widths(calib, params, &cfg);
    {
        int n = 0;
        const int nwide = tool_params_wide_count(params, &n);
        if (o.wide_bits < 0.0f && (o.lloyd_max || o.clip_objective != 0))
            printf("code widths: 2 bits everywhere (the default budget, %.2f bits per element of 3-bit head-tensors, "
                   "applies to oscar2 with the probe objective; this run has %s)\n",
                   (double)OSCAR_CALIB_WIDE_BITS_DEFAULT, o.lloyd_max ? "--lloyd-max" : "--clip-objective rows");
        else
            printf("code widths: %d of %d head-tensors in 3 bits (+%.4f bits per element; budget %.4g%s)\n", nwide, n,
                   (double)nwide / (double)n,
                   (double)(o.wide_bits < 0.0f ? OSCAR_CALIB_WIDE_BITS_DEFAULT : o.wide_bits),
                   o.wide_bits < 0.0f ? ", the default; --wide-bits 0: 2 bits everywhere" : "");
    }
    if (no_probes)
        printf("%d layer(s) without probes (windows shorter than sink + recent + 33 tokens): their clips come "
               "from the held-back rows\n",
               no_probes);
    if (searched) {
        printf("\nclip search: mean KL(p_bf16 || p_oscar2) per scored token on %d held-out windows of %d "
               "(tokens [%" PRId64 ", %" PRId64 "), rows %d..%d of each; sink %d, recent %d)\n",
               so.windows, so.window, h0, h0 + (int64_t)so.windows * so.window, so.sink + so.recent, so.window - 2,
               so.sink, so.recent);
        printf("layer | fitted clip_k clip_v | searched clip_k clip_v\n");
        for (int l = 0; l < cfg.num_layers; l++) {
            float ck, cv;
            oscar_params_clip(params, l, OSCAR_K, &ck);
            oscar_params_clip(params, l, OSCAR_V, &cv);
            printf("%5d |          %4.2f   %4.2f |            %4.2f   %4.2f\n", l, (double)clip0[2 * l],
                   (double)clip0[2 * l + 1], (double)ck, (double)cv);
        }
        printf("held-out KL %.5f -> %.5f, delta NLL %+.5f -> %+.5f (%" PRId64 " scored tokens); %d evaluations, "
               "%.1f forward-equivalents per window, %.1f s\n",
               ss.kl_start, ss.kl_final, ss.dnll_start, ss.dnll_final, ss.scored, ss.evals, ss.forward_equiv,
               ss.seconds);
    }
    free(clip0);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double wall = now_s() - t_start;
    printf("\npass 0: %.1f s (%.0f tokens/s; forward, calib feed %.1f s)\n", st.t_pass[0],
           (double)st.tokens / st.t_pass[0], st.t_feed[0]);
    printf("pass 1: %.1f s (%.0f tokens/s; %s, calib feed %.1f s)\n", st.t_pass[1],
           (double)st.tokens / st.t_pass[1], st.cached ? "from the pass-0 K/V cache, no forward" : "forward again",
           st.t_feed[1]);
    if (st.cached) printf("K/V cache: %.0f MiB\n", (double)st.cache_bytes / (1024.0 * 1024.0));
    printf("finalize: %.1f s (eigendecompositions, clip fitting)\n", st.t_finalize);
    printf("CPU time per phase: pass 0 %.1f s, pass 1 %.1f s, finalize %.1f s (process, all threads)\n",
           st.c_pass[0], st.c_pass[1], st.c_finalize);
    printf("wall time %.1f s (model load %.1f s), CPU time %.1f s, peak memory %.0f MiB (ru_maxrss)\n", wall,
           t_load, (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
               (double)ru.ru_stime.tv_usec * 1e-6,
           (double)ru.ru_maxrss / 1024.0);
    printf("wrote %s (%d layers, %s, %" PRId64 " calibration tokens)\n", out_path, cfg.num_layers,
           o.lloyd_max ? "OSCAR2_LM" : "OSCAR2", st.tokens);
    oscar_params_destroy(params);
    oscar_calib_destroy(calib);
    return 0;
}
