/* oscar-eval: perplexity, KL to BF16, top-1 agreement, retrieval and bits
 * per element of every KV-cache method on a real model (docs/EVAL.md).
 * Exit status: 0 done, 1 run failed, 2 bad input (the message says which). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "oscar_calibrate.h" /* ocal_model_hash: the fingerprint parameter files carry */
#include "tool_args.h"
#include "tool_params.h"
#include "oscar_eval.h"

#define EXIT_BAD_INPUT 2

static void usage(FILE *f)
{
    fprintf(f,
            "usage: oscar-eval MODEL_DIR --tokens eval.tokens --out report.json [options]\n"
            "  MODEL_DIR           Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint\n"
            "  --tokens FILE       uint32 little-endian token ids\n"
            "  --params P          OSCAR parameters (oscar-calibrate); needed by oscar2, oscar2-lm\n"
            "  --allow-other-model use --params calibrated on another model of the same shape\n"
            "                      (refused by default: the file's model fingerprint must match)\n"
            "  --params-lm P       parameters calibrated for Lloyd-Max levels (oscar-calibrate --lloyd-max)\n"
            "                      for oscar2-lm; default: --params\n"
            "  --methods LIST      comma-separated, default bf16,int4,int2,quarot2,kivi2,oscar2,oscar2-lm\n"
            "                      (bf16 = the reference; also int8)\n"
            "  --context N         window length (default 2048)\n"
            "  --max-tokens N      evaluated tokens per method: floor(N/context) windows (default 32768)\n"
            "  --sink S0           first tokens kept in 16 bits (default 64)\n"
            "  --recent W          last tokens kept in 16 bits (default 256)\n"
            "  --chunk N           chunked-prefill schedule: each window's cache is filled N tokens at a\n"
            "                      time (append, then attend with those queries: oscar_extend), so a\n"
            "                      query sees the 2-bit region of its chunk's end (default 0: token\n"
            "                      by token, as decoding sees it)\n"
            "  --group G           quant group along head_dim (default: head_dim up to 128, else half of it)\n"
            "  --ablations         also run the ablations (fixed clips, Hadamard+clip, no clip,\n"
            "                      Lloyd-Max), with windows and without\n"
            "  --per-layer LIST    also run each listed method with one layer quantized at a time\n"
            "                      (diagnosis: which layers cost the most)\n"
            "  --storage SPEC      also run oscar2 with a storage change, by fake-quant (an ablation: the\n"
            "                      library's format is not changed); repeatable, at most 16. SPEC: comma-\n"
            "                      separated out=K (K rows per page of 64 and KV head kept bf16, 6-bit\n"
            "                      index each), by=err|norm (which rows: largest 2-bit error or norm;\n"
            "                      default err), group=G (quant group of those heads: a multiple of 16,\n"
            "                      >= 32, dividing head_dim), clip=C (clip ratio of those heads instead\n"
            "                      of the file's),\n"
            "                      vgroup=G, vclip=C (the values' group / clip where they differ);\n"
            "                      bits=B, vbits=B (2, 3, 4: code width of those heads / their values,\n"
            "                      2^B uniform levels; a format that does not exist, not with out=);\n"
            "                      clauses joined by '/' set heads apart (the last naming a head wins);\n"
            "                      kv=k|v|kv (default kv), heads=all|L:H+L:H... (default all); bits\n"
            "                      counted over every layer, KV head and K/V (docs/eval/retrieval.md)\n"
            "  --retrieval-trials N  random repeated-sequence trials (default 4; 0 = none)\n"
            "  --retrieval-source text|random  the repeated sequence: a chunk of the token file\n"
            "                      (default) or random ids from the vocabulary\n"
            "  --seed N            seed of the retrieval sequences (default 1234)\n"
            "  --tasks             also run the key-value lookup task: documents of context/2 and context\n"
            "                      tokens (1024, 2048 by default) of the token file's text with 8 facts \"The code\n"
            "                      of X D1 D2 D3.\" in the 2-bit region, queried at the end (needs\n"
            "                      MODEL_DIR/tokenizer.json)\n"
            "  --task-docs N       lookup documents per context (default 16)\n"
            "  --threads N         windows evaluated in parallel, one engine context each (default 1;\n"
            "                      the engine then splits each forward over the cores)\n"
            "  --out FILE          report.json\n"
            "  --md FILE           Markdown table\n"
            "  --plot FILE         PNG: bits per element vs KL (needs gnuplot)\n");
}

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "oscar-eval: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    return EXIT_BAD_INPUT;
}

/* 0 when parameters p (loaded from path, given by flag) serve the model of
 * cfg; else the message and EXIT_BAD_INPUT. Another shape cannot serve it at
 * all; another model of the same shape (fingerprint) can with
 * --allow-other-model, whose model_hash is then NULL. */
static int params_for_model(const char *flag, const char *path, const oscar_params *p, const oe_config *cfg,
                            const char *model_hash, int group)
{
    char what[4200];
    snprintf(what, sizeof what, "%s %s", flag, path);
    if (oscar_params_check_shape(p, cfg->num_layers, cfg->num_q_heads, cfg->num_kv_heads, cfg->head_dim, NULL) !=
        OSCAR_OK)
        return bad("%s does not fit this model: %s", what, oscar_last_error());
    if (oscar_params_check_shape(p, cfg->num_layers, cfg->num_q_heads, cfg->num_kv_heads, cfg->head_dim,
                                 model_hash) != OSCAR_OK)
        return bad("%s does not belong to this model: %s (--allow-other-model uses it anyway)", what,
                   oscar_last_error());
    /* Clips are fitted for one quant group: a cache refuses them at another (oscar_plan_create, the rule's
     * home), and an evaluation at --group G would report the clips of one group as oscar2 at another.
     * (--storage group= stays an explicit ablation.) */
    char why[1024] = "";
    oscar_status s = tool_params_serve_group(p, cfg->head_dim, group, why, sizeof why);
    if (s == OSCAR_ERR_SHAPE_MISMATCH)
        return bad("%s does not serve this evaluation's group: %s (oscar-eval: pass that group as --group)", what, why);
    return 0;
}

/* 1 (with the message) when the comma list of flag has an empty item ("int2,,int4"). */
static int list_has_empty_item(const char *flag, const char *list, const char *what)
{
    const int k = tool_list_empty_item(list, ',');
    if (k == 0) return 0;
    fprintf(stderr, "oscar-eval: %s: item %d of '%s' is empty (a doubled, leading or trailing comma); separate the "
                    "%s by single commas\n", flag, k, list, what);
    return 1;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || isspace((unsigned char)*s) || v < lo || v > hi) return 0; /* strtol skips " " */
    *out = v;
    return 1;
}

/* Whole-sequence bits per element at the context: the sink and recent
 * windows in 16 bits, the rest at the method's figure. */
static double bits_whole(double bits, int ctx, int sink, int recent)
{
    int w16 = sink + recent < ctx ? sink + recent : ctx;
    return (16.0 * w16 + bits * (double)(ctx - w16)) / (double)ctx;
}

static int add_variant(ev_run *R, const char *name, const char *note, oscar_method m, const oscar_params *p,
                       int sink, int recent, int group, int ablation)
{
    if (R->nvar >= EV_MAX_VARIANTS) return 0;
    ev_variant *v = &R->vars[R->nvar++];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    if (m == OSCAR_METHOD_OSCAR2) { /* its code widths: "2-bit", or how many head-tensors are 3-bit */
        char widths[96];
        tool_params_width_label(p, widths, sizeof widths);
        snprintf(v->note, sizeof v->note, "%s; %s", note, widths);
    } else snprintf(v->note, sizeof v->note, "%s", note);
    v->method = m;
    v->params = p;
    v->sink = m == OSCAR_METHOD_BF16 ? 0 : sink;
    v->recent = m == OSCAR_METHOD_BF16 ? 0 : recent;
    v->group = group;
    v->ablation = ablation;
    v->same_as = -1;
    v->only_layer = -1;
    for (int i = 0; i + 1 < R->nvar; i++) {
        const ev_variant *u = &R->vars[i];
        if (u->same_as < 0 && !u->storage && u->method == m && u->params == p && u->sink == v->sink && u->recent == v->recent &&
            u->group == group)
            v->same_as = i;
    }
    v->bits = tool_params_bits(p, m, R->d, group);
    v->bits_seq = m == OSCAR_METHOD_BF16 ? 16.0 : bits_whole(v->bits, R->ctx, v->sink, v->recent);
    return 1;
}

/* A private copy of the parameters (the ablations change clips). */
static oscar_params *load_copy(const char *path)
{
    oscar_params *p = NULL;
    if (oscar_params_load(path, &p) != OSCAR_OK) {
        fprintf(stderr, "oscar-eval: %s\n", oscar_last_error());
        return NULL;
    }
    return p;
}

/* An empty file of this process's own beside target (PATH.XXXXXX), for
 * writing and renaming over target. 0 on success; on failure a message and
 * out left empty. */
static int ev_unique_temp(char *out, size_t n, const char *target) {
    if (snprintf(out, n, "%s.XXXXXX", target) >= (int)n) {
        out[0] = '\0';
        fprintf(stderr, "oscar-eval: output path %s is too long\n", target);
        return 1;
    }
    int fd = mkstemp(out);
    if (fd < 0) {
        fprintf(stderr, "oscar-eval: cannot create a temporary file beside %s: %s\n", target, strerror(errno));
        out[0] = '\0';
        return 1;
    }
    /* mkstemp makes it 0600; a report is not a secret (umask still applies) */
    mode_t um = umask(0);
    umask(um);
    if (fchmod(fd, 0666 & ~um) != 0) { /* not fatal: the report is still written */ }
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    tool_watch_stdout("oscar-eval");
    ev_settings S;
    memset(&S, 0, sizeof S);
    S.ret_source = "text";
    const char *methods = "bf16,int4,int2,quarot2,kivi2,oscar2,oscar2-lm";
    long ctx = 2048, max_tokens = 32768, sink = 64, recent = 256, group = 0, threads = 1, trials = 4, chunk = 0;
    long long seed = 1234;
    int ablations = 0, allow_other_model = 0, tasks = 0;
    long task_docs = 16;
    const char *per_layer = NULL;
    const char *storage_specs[16];
    int nstorage = 0;
    /* --storage specs, parsed once (after the model's shape is known); freed at done */
    static ev_storage storages[16];
    static oscar_params *storage_params[16];
    int nstorage_made = 0;
    tool_seen seen = {.n = 0};
    static const char *const repeatable[] = {"--storage", NULL}; /* one layout each */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long v;
        if (!tool_args_once(&seen, "oscar-eval", a, repeatable, NULL)) return EXIT_BAD_INPUT;
#define NEED_VAL                                                                                   \
    do {                                                                                           \
        if (!val) return bad("%s needs a value (see --help)", a, "");                              \
        i++;                                                                                       \
    } while (0)
#define INT_OPT(flag, lo, hi, dst)                                                                 \
    else if (!strcmp(a, flag)) {                                                                   \
        NEED_VAL;                                                                                  \
        if (!parse_int(val, lo, hi, &v)) return bad("%s: '%s' is not an integer in range", a, val); \
        dst = v;                                                                                   \
    }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokens")) {
            NEED_VAL;
            S.tokens_path = val;
        } else if (!strcmp(a, "--params")) {
            NEED_VAL;
            S.params_path = val;
        } else if (!strcmp(a, "--per-layer")) {
            NEED_VAL;
            if (strlen(val) >= 256) { /* its copy below holds 255 bytes: cut, "oscar2-lm" would run as "oscar2" */
                char n[24];
                snprintf(n, sizeof n, "%zu", strlen(val));
                return bad("--per-layer: the list is too long (%s bytes, at most 255); name each method once, "
                           "separated by single commas%s", n, "");
            }
            per_layer = val;
        } else if (!strcmp(a, "--storage")) {
            NEED_VAL;
            if (nstorage >= 16) return bad("--storage: at most 16 (got '%s' as the 17th)%s", val, "");
            for (int j = 0; j < nstorage; j++) /* the same layout twice: run twice, one row in the JSON */
                if (!strcmp(storage_specs[j], val)) return bad("--storage: '%s' given twice%s", val, "");
            storage_specs[nstorage++] = val;
        } else if (!strcmp(a, "--params-lm")) {
            NEED_VAL;
            S.params_lm_path = val;
        } else if (!strcmp(a, "--methods")) {
            NEED_VAL;
            methods = val;
        } else if (!strcmp(a, "--out")) {
            NEED_VAL;
            S.out_json = val;
        } else if (!strcmp(a, "--md")) {
            NEED_VAL;
            S.out_md = val;
        } else if (!strcmp(a, "--plot")) {
            NEED_VAL;
            if (strpbrk(val, "\n\r")) return bad("--plot: the path holds a line break, which gnuplot cannot take%s%s", "", "");
            S.out_plot = val;
        } else if (!strcmp(a, "--retrieval-source")) {
            NEED_VAL;
            if (strcmp(val, "text") && strcmp(val, "random"))
                return bad("--retrieval-source: '%s' is not text or random%s", val, "");
            S.ret_source = val;
        } else if (!strcmp(a, "--ablations")) {
            ablations = 1;
        } else if (!strcmp(a, "--allow-other-model")) {
            allow_other_model = 1;
        } else if (!strcmp(a, "--tasks")) {
            tasks = 1;
        }
        INT_OPT("--task-docs", 1, 1000, task_docs)
        INT_OPT("--context", 1, 1 << 20, ctx)
        INT_OPT("--max-tokens", 1, 1L << 40, max_tokens)
        INT_OPT("--sink", 0, 1 << 20, sink)
        INT_OPT("--recent", 0, 1 << 20, recent)
        INT_OPT("--chunk", 0, 1 << 20, chunk)
        INT_OPT("--group", 0, 256, group)
        INT_OPT("--threads", 1, EV_MAX_THREADS, threads)
        INT_OPT("--retrieval-trials", 0, 1000, trials)
        else if (!strcmp(a, "--seed")) {
            NEED_VAL;
            if (!parse_int(val, 0, 2147483647L, &v)) return bad("%s: '%s' is not a non-negative integer", a, val);
            seed = v;
        } else if (a[0] != '-' && !S.model_dir) {
            S.model_dir = a;
        } else {
            usage(stderr);
            return bad("unknown argument '%s'%s", a, "");
        }
#undef INT_OPT
#undef NEED_VAL
    }
    if (!S.model_dir) return bad("no MODEL_DIR given (see --help)%s%s", "", "");
    if (!*S.model_dir) /* "" + "/config.json" is the root folder's file */
        return bad("MODEL_DIR is an empty path; give the checkpoint's folder%s%s", "", "");
    if (!S.tokens_path) return bad("--tokens FILE is required (uint32 token ids)%s%s", "", "");
    if (!S.out_json) return bad("--out report.json is required%s%s", "", "");
    /* Outputs are written after the whole evaluation: check now that they can be. */
    {
        const char *outs[3] = {S.out_json, S.out_md, S.out_plot}, *flags[3] = {"--out", "--md", "--plot"};
        for (int i = 0; i < 3; i++) {
            if (!outs[i]) continue;
            char why[4400];
            if (!tool_output_ok(outs[i], why, sizeof why)) return bad("%s %s", flags[i], why);
        }
        /* --plot P also writes P.dat and P.gp in place: through a link, or into a
         * FIFO or socket, where the open waited for a reader forever after the whole
         * evaluation; into a device (/dev/null at P.gp: gnuplot ran an empty script,
         * exit 0 with an empty PNG) or a folder (a failure after the whole run).
         * Write errors on a regular file are reported when the plot is written. */
        for (int i = 0; S.out_plot && i < 2; i++) {
            char side[4200], why[4400];
            snprintf(side, sizeof side, "%s%s", S.out_plot, i ? ".gp" : ".dat");
            if (tool_dangling_link(side, why, sizeof why)) return bad("%s %s", "--plot", why);
            struct stat ss;
            if (stat(side, &ss) == 0 && !S_ISREG(ss.st_mode))
                return bad("--plot writes %s, which is %s, not a regular file; remove it or choose another --plot",
                           side, S_ISFIFO(ss.st_mode)  ? "a FIFO"
                                 : S_ISSOCK(ss.st_mode) ? "a socket"
                                 : S_ISDIR(ss.st_mode)  ? "a directory"
                                                        : "a device");
        }
        /* Written after the whole evaluation: over an input it would destroy it,
         * over another output neither would survive. */
        const char *ins[3] = {S.tokens_path, S.params_path, S.params_lm_path},
                   *inflags[3] = {"--tokens", "--params", "--params-lm"};
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                char what[64];
                snprintf(what, sizeof what, "%s and %s", flags[i], inflags[j]);
                if (outs[i] && tool_same_file(outs[i], ins[j]))
                    return bad("%s name the same file (%s): the report would overwrite the input; choose "
                               "another output path",
                               what, outs[i]);
                if (j > i && outs[i] && tool_same_file(outs[i], outs[j])) {
                    snprintf(what, sizeof what, "%s and %s", flags[i], flags[j]);
                    return bad("%s name the same file (%s): give each output its own path", what, outs[i]);
                }
            }
        /* nor over the checkpoint the evaluation reads */
        for (int i = 0; i < 3; i++) {
            char which[256];
            if (outs[i] && oe_model_reads(S.model_dir, outs[i], which, sizeof which)) {
                char what[4200];
                snprintf(what, sizeof what, "%s %s", flags[i], outs[i]);
                return bad("%s is the model's %s (an input); choose another output path", what, which);
            }
        }
        /* --plot P writes P.dat and P.gp as well: --tokens t.dat with --plot t had the token file replaced
         * by the plot's data, --md q.gp with --plot q the report by the gnuplot script */
        const char *in_flags[3] = {"--tokens", "--params", "--params-lm"};
        for (int i = 0; S.out_plot && i < 2; i++) {
            char side[4200], what[4400], other[4300] = "", which[256];
            snprintf(side, sizeof side, "%s%s", S.out_plot, i ? ".gp" : ".dat");
            for (int j = 0; j < 3 && !other[0]; j++)
                if (tool_same_file(side, ins[j])) snprintf(other, sizeof other, "%s %s", in_flags[j], ins[j]);
            for (int j = 0; j < 2 && !other[0]; j++)
                if (tool_same_file(side, outs[j])) snprintf(other, sizeof other, "%s %s", flags[j], outs[j]);
            if (!other[0] && oe_model_reads(S.model_dir, side, which, sizeof which))
                snprintf(other, sizeof other, "the model's %s", which);
            if (other[0]) {
                snprintf(what, sizeof what, "--plot %s writes %s", S.out_plot, side);
                return bad("%s, which is %s; choose another --plot", what, other);
            }
        }
    }

    /* Methods first: a typo should not cost a model load. */
    oscar_method mlist[EV_MAX_VARIANTS];
    char mnames[EV_MAX_VARIANTS][32];
    int nm = 0, need_params = 0, has_ref = 0;
    {
        char buf[512];
        if (strlen(methods) >= sizeof buf) { /* cut, a name at the end would run as another ("oscar2-lm" as "oscar2") */
            char n[24];
            snprintf(n, sizeof n, "%zu", strlen(methods));
            return bad("--methods: the list is too long (%s bytes, at most 511); name each method once, separated by "
                       "single commas%s", n, "");
        }
        snprintf(buf, sizeof buf, "%s", methods);
        if (list_has_empty_item("--methods", methods, "methods")) return EXIT_BAD_INPUT;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (nm >= 16) return bad("--methods: too many methods (at most 16)%s%s", "", "");
            if (oscar_method_from_name(tok, &mlist[nm]) != OSCAR_OK)
                return bad("--methods: unknown method '%s': %s", tok, oscar_last_error());
            for (int j = 0; j < nm; j++)
                if (mlist[j] == mlist[nm]) return bad("--methods: '%s' given twice%s", tok, "");
            snprintf(mnames[nm], sizeof mnames[nm], "%s", tok);
            need_params |= mlist[nm] == OSCAR_METHOD_OSCAR2 || mlist[nm] == OSCAR_METHOD_OSCAR2_LM;
            has_ref |= mlist[nm] == OSCAR_METHOD_BF16;
            nm++;
        }
    }
    if (nm == 0) return bad("--methods is empty%s%s", "", "");
    /* the plot draws the methods' KL (ablations and --storage/--per-layer variants are left out): bf16
     * alone gave gnuplot no point, which failed ('x range is invalid') after the whole evaluation */
    if (S.out_plot && nm == 1 && has_ref)
        return bad("--plot draws the KL of the quantized methods and --methods names only bf16; add a method "
                   "or drop --plot%s%s", "", "");
    if ((need_params || ablations || nstorage) && !S.params_path)
        return bad("oscar2, oscar2-lm, --ablations and --storage need --params P (make P with oscar-calibrate)%s%s",
                   "", "");
    if (per_layer) { /* as --methods: checked before the model load, each method once */
        char buf[256]; /* --per-layer is at most 255 bytes (checked with the arguments) */
        oscar_method seen_m[OSCAR_METHOD_COUNT_];
        int ns = 0;
        snprintf(buf, sizeof buf, "%s", per_layer);
        if (list_has_empty_item("--per-layer", per_layer, "methods")) return EXIT_BAD_INPUT;
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            oscar_method m;
            if (oscar_method_from_name(t, &m) != OSCAR_OK || m == OSCAR_METHOD_BF16)
                return bad("--per-layer: '%s' is not a quantized method%s", t, "");
            for (int j = 0; j < ns; j++)
                if (seen_m[j] == m) return bad("--per-layer: '%s' given twice%s", t, "");
            if ((m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM) && !S.params_path)
                return bad("--per-layer %s needs --params%s", t, "");
            seen_m[ns++] = m;
        }
    }

    double t_start = ev_now(), cpu_start = ev_cpu_seconds();
    time_t now = time(NULL);
    strftime(S.started, sizeof S.started, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));

    /* Engine threads: with several windows in parallel, split the cores. */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    int engine_threads = (int)(ncpu / threads > 0 ? ncpu / threads : 1);
    if (!getenv("OE_THREADS")) {
        char tb[16];
        snprintf(tb, sizeof tb, "%d", engine_threads);
        setenv("OE_THREADS", tb, 1);
    } else if (oe_threads(&engine_threads) != OSCAR_OK) {
        return bad("%s%s", oe_last_error(), "");
    }

    oe_config cfg;
    {
        char cpath[4096];
        snprintf(cpath, sizeof cpath, "%s/config.json", S.model_dir);
        if (oe_config_load(cpath, &cfg) != OSCAR_OK) return bad("%s%s", oe_last_error(), "");
    }
    if (cfg.max_position > 0 && ctx > cfg.max_position) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%ld", ctx);
        snprintf(b, sizeof b, "%d", cfg.max_position);
        return bad("--context %s exceeds the model's max_position_embeddings %s; use a shorter context", a, b);
    }
    if (cfg.sliding_window > 0 && ctx > cfg.sliding_window) { /* the engine refused it mid-run: exit 1 */
        char a[32], b[32];
        snprintf(a, sizeof a, "%ld", ctx);
        snprintf(b, sizeof b, "%d", cfg.sliding_window);
        return bad("--context %s exceeds the model's sliding_window %s (the engine runs full causal attention); use "
                   "a shorter context", a, b);
    }
    int d = cfg.head_dim;
    {
        /* the format's rule through the public API; group 0: the default of the head_dim */
        int g = (int)group; /* --group is in [0, 256] */
        char why[400];
        if (ocal_check_shape(d, &g, why, sizeof why) != OSCAR_OK) return bad("%s (--group %s)", why, group ? "given" : "default");
        group = g;
    }
    for (int j = 0; j < nm; j++)
        if (mlist[j] == OSCAR_METHOD_KIVI2 && recent < 31)
            fprintf(stderr, "oscar-eval: warning: kivi2 with --recent %ld < 31: a key group of 32 tokens then "
                            "includes keys after the query (see docs/EVAL.md)\n", recent);

    /* --tasks: the tokenizer's words before the (slow) model load */
    ev_task_vocab tv;
    if (tasks) {
        char terr[600];
        if (ev_task_vocab_load(S.model_dir, cfg.vocab, &tv, terr, sizeof terr) != 0) return bad("%s%s", terr, "");
        for (int c = 0; c < 2; c++) /* documents of context / 2 and context tokens (the jobs below) */
            if (!ev_task_fits(c ? (int)ctx : (int)ctx / 2, (int)sink, (int)recent)) {
                snprintf(terr, sizeof terr, "--tasks: a %d-token lookup document (--context%s) cannot keep its facts "
                         "outside the windows (sink %ld, recent %ld); use a longer --context or a smaller --sink / "
                         "--recent", c ? (int)ctx : (int)ctx / 2, c ? "" : " / 2", sink, recent);
                return bad("%s%s", terr, "");
            }
    }

    /* Parameters before the (slow) model load: wrong shape is bad input. */
    oscar_params *P = NULL, *P_lm = NULL, *P_fixed = NULL, *P_noclip = NULL, *P_hclip = NULL, *P_near = NULL,
                 *P_pub = NULL;
    /* Parameters carry the fingerprint of the model they were calibrated on
     * (oscar-calibrate): another model of the same shape is refused unless
     * --allow-other-model says it is meant. */
    char hash_buf[17];
    ocal_model_hash(&cfg, hash_buf);
    const char *model_hash = allow_other_model ? NULL : hash_buf;
    if (S.params_path) {
        if (oscar_params_load(S.params_path, &P) != OSCAR_OK)
            return bad("--params %s: %s", S.params_path, oscar_last_error());
        int rc = params_for_model("--params", S.params_path, P, &cfg, model_hash, (int)group);
        if (rc) {
            oscar_params_destroy(P);
            return rc;
        }
    }
    if (S.params_lm_path) {
        int rc = 0;
        if (oscar_params_load(S.params_lm_path, &P_lm) != OSCAR_OK)
            rc = bad("--params-lm %s: %s", S.params_lm_path, oscar_last_error());
        else
            rc = params_for_model("--params-lm", S.params_lm_path, P_lm, &cfg, model_hash, (int)group);
        if (rc) {
            oscar_params_destroy(P);
            oscar_params_destroy(P_lm);
            return rc;
        }
    }
    const oscar_params *PL = P_lm ? P_lm : P;
    /* --storage specs parsed now, before the model load (the variants are made from them below);
     * after the parameters, whose shape check bounds the config's: a config.json claiming 2^30
     * heads had the spec's head table (layers x KV heads bytes, 8 GiB) allocated and filled first. */
    for (int i = 0; i < nstorage; i++) {
        char serr[400];
        int src = 0;
        if (ev_storage_parse(storage_specs[i], cfg.num_layers, cfg.num_kv_heads, d, &storages[i], serr,
                             sizeof serr) != 0)
            src = bad("%s%s", serr, "");
        else
            nstorage_made = i + 1;
        if (!src && ev_storage_has_outliers(&storages[i]) && recent < EV_PAGE) {
            char a[32];
            snprintf(a, sizeof a, "%ld", recent);
            src = bad("--storage %s: out= needs --recent >= 64 (a page), got %s: a page's outliers are chosen "
                      "once the whole page is written, before its first row leaves the recent window",
                      storage_specs[i], a);
        }
        if (src) {
            oscar_params_destroy(P);
            oscar_params_destroy(P_lm);
            return src;
        }
    }

    oe_model *model = NULL;
    if (oe_model_load(S.model_dir, &model) != OSCAR_OK) {
        oscar_params_destroy(P);
        oscar_params_destroy(P_lm);
        return bad("%s%s", oe_last_error(), "");
    }
    uint32_t *tok = NULL;
    int64_t ntok = 0;
    if (oe_tokens_load(S.tokens_path, cfg.vocab, &tok, &ntok) != OSCAR_OK) {
        oe_model_free(model);
        oscar_params_destroy(P);
        oscar_params_destroy(P_lm);
        return bad("%s%s", oe_last_error(), "");
    }
    int64_t windows = max_tokens / ctx;
    if ((ntok - 1) / ctx < windows) windows = (ntok - 1) / ctx;
    if (windows < 1) {
        char a[32], b[32];
        snprintf(a, sizeof a, "%lld", (long long)ntok);
        snprintf(b, sizeof b, "%ld", ctx + 1 > max_tokens + 1 ? ctx + 1 : ctx + 1);
        free(tok);
        oe_model_free(model);
        oscar_params_destroy(P);
        oscar_params_destroy(P_lm);
        if (max_tokens < ctx) return bad("--max-tokens is below one window of --context tokens%s%s", "", "");
        return bad("the token file holds %s tokens; one window needs %s (context + 1)", a, b);
    }

    static ev_run R;
    memset(&R, 0, sizeof R);
    R.model = model;
    R.ctx = (int)ctx;
    R.chunk = (int)chunk;
    R.vocab = cfg.vocab;
    R.Hkv = cfg.num_kv_heads;
    R.d = d;
    R.ref_index = -1;
    pthread_mutex_init(&R.log_mu, NULL);
    int rc = 0;
    uint32_t *ret_tok = NULL, *task_tok = NULL;
    /* The reference always runs (KL and top-1 need it); it is reported only
     * when asked for. */
    add_variant(&R, "bf16", "K/V rounded to bf16 everywhere, no 2-bit region (the reference)",
                OSCAR_METHOD_BF16, NULL, 0, 0, (int)group, has_ref ? 0 : -1);
    R.ref_index = 0;
    for (int j = 0; j < nm; j++) {
        if (mlist[j] == OSCAR_METHOD_BF16) continue;
        const char *note = "";
        switch (mlist[j]) {
        case OSCAR_METHOD_INT4: note = "per-token asymmetric 4-bit, no rotation"; break;
        case OSCAR_METHOD_INT8: note = "per-token asymmetric 8-bit, no rotation"; break;
        case OSCAR_METHOD_INT2: note = "per-token asymmetric 2-bit, no rotation, no clip"; break;
        case OSCAR_METHOD_QUAROT2: note = "Hadamard rotation, per-token asymmetric 2-bit, no clip"; break;
        case OSCAR_METHOD_KIVI2:
            note = "K per channel over groups of 32 tokens from S0 (tail < 32 kept bf16), V per token"; break;
        case OSCAR_METHOD_OSCAR2: note = "calibrated rotation + fitted clips, uniform levels"; break;
        case OSCAR_METHOD_OSCAR2_LM: note = "calibrated rotation + fitted clips, Lloyd-Max 2-bit levels"; break;
        default: break;
        }
        int calibrated = mlist[j] == OSCAR_METHOD_OSCAR2 || mlist[j] == OSCAR_METHOD_OSCAR2_LM;
        add_variant(&R, mnames[j], note, mlist[j],
                    calibrated ? (mlist[j] == OSCAR_METHOD_OSCAR2_LM ? PL : P) : NULL, (int)sink, (int)recent, (int)group, 0);
    }
    for (int i = 0; i < nstorage; i++) {
        char nm4[176];
        snprintf(nm4, sizeof nm4, "oscar2[%s]", storage_specs[i]);
        if (!add_variant(&R, nm4, "oscar2 with a storage change (--storage, fake-quant only)", OSCAR_METHOD_OSCAR2, P,
                         (int)sink, (int)recent, (int)group, 1)) {
            fprintf(stderr, "oscar-eval: too many variants (at most %d)\n", EV_MAX_VARIANTS);
            rc = EXIT_BAD_INPUT;
            goto done;
        }
        ev_variant *sv = &R.vars[R.nvar - 1];
        int clips = 0;
        for (int l = 0; l < cfg.num_layers; l++)
            for (int hh = 0; hh < cfg.num_kv_heads; hh++)
                for (int kv = 0; kv < 2; kv++) clips |= ev_storage_clip_of(&storages[i], l, hh, (oscar_kv)kv) > 0.0f;
        if (clips) {
            /* A private copy of the parameters with those heads' clips. */
            if (!(storage_params[i] = load_copy(S.params_path))) {
                rc = 1;
                goto done;
            }
            for (int l = 0; l < cfg.num_layers; l++)
                for (int hh = 0; hh < cfg.num_kv_heads; hh++)
                    for (int kv = 0; kv < 2; kv++) {
                        const float c = ev_storage_clip_of(&storages[i], l, hh, (oscar_kv)kv);
                        if (c > 0.0f) oscar_params_set_clip_head(storage_params[i], l, hh, (oscar_kv)kv, c);
                    }
            sv->params = storage_params[i];
        }
        sv->storage = &storages[i];
        sv->same_as = -1;
        sv->bits = ev_storage_bits(&storages[i], (int)group, P);
        sv->bits_seq = bits_whole(sv->bits, R.ctx, sv->sink, sv->recent);
    }
    if (ablations) {
        int L = cfg.num_layers;
        P_fixed = load_copy(S.params_path);
        P_noclip = load_copy(S.params_path);
        P_near = load_copy(S.params_path);
        P_pub = load_copy(S.params_path);
        if (!P_fixed || !P_noclip || !P_near || !P_pub ||
            oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, L, cfg.num_q_heads, cfg.num_kv_heads, d, &P_hclip) !=
                OSCAR_OK) {
            if (!P_hclip && P_fixed && P_noclip && P_near && P_pub) fprintf(stderr, "oscar-eval: %s\n", oscar_last_error());
            rc = 1;
            goto done;
        }
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                oscar_params_set_clip(P_fixed, l, (oscar_kv)kv, kv == OSCAR_K ? 0.96f : 0.92f);
                oscar_params_set_clip(P_noclip, l, (oscar_kv)kv, 1.0f);
                oscar_params_set_clip(P_pub, l, (oscar_kv)kv, kv == OSCAR_K ? 0.96f : 0.92f);
                /* QUAROT2 built-ins hold the Hadamard rotation; with method
                 * OSCAR2, oscar_fakequant rotates by it and clips by these (each KV head's). */
                for (int h = 0; h < cfg.num_kv_heads; h++) {
                    float c = 1.0f;
                    oscar_params_clip_head(P, l, h, (oscar_kv)kv, &c);
                    oscar_params_set_clip_head(P_hclip, l, h, (oscar_kv)kv, c);
                }
            }
        /* Nearest rounding (the published write path): the same parameters without feedback weights. */
        oscar_params_clear_feedback(P_near);
        oscar_params_clear_feedback(P_pub);
        const float *fb0 = NULL;
        oscar_params_feedback(P, 0, 0, OSCAR_K, &fb0);
        int wins[2][2] = {{(int)sink, (int)recent}, {0, 0}};
        for (int wi = 0; wi < 2; wi++) {
            int s0 = wins[wi][0], w = wins[wi][1];
            char suf[24], nm2[96];
#define ABL(base, note, m, p)                                                                      \
    do {                                                                                           \
        snprintf(nm2, sizeof nm2, "%s%s", base, suf);                                             \
        add_variant(&R, nm2, note, m, p, s0, w, (int)group, 1);                                   \
    } while (0)
            snprintf(suf, sizeof suf, "@s%dw%d", s0, w);
            ABL("oscar2-fitted-clip", "OSCAR rotation, clips fitted on calibration data", OSCAR_METHOD_OSCAR2, P);
            ABL("oscar2-fixed-clip", "OSCAR rotation, published clips 0.96 K / 0.92 V", OSCAR_METHOD_OSCAR2,
                P_fixed);
            ABL("hadamard-clip", "Hadamard rotation (QuaRot) with OSCAR's fitted clips", OSCAR_METHOD_OSCAR2,
                P_hclip);
            ABL("oscar2-no-clip", "OSCAR rotation, no clipping (c = 1)", OSCAR_METHOD_OSCAR2, P_noclip);
            if (fb0) {
                ABL("oscar2-nearest", "OSCAR rotation + fitted clips, nearest rounding (no error feedback)",
                    OSCAR_METHOD_OSCAR2, P_near);
                ABL("oscar2-published", "OSCAR rotation, clips 0.96 K / 0.92 V, nearest rounding (the paper's write "
                    "path)", OSCAR_METHOD_OSCAR2, P_pub);
            }
            ABL("oscar2-lm", "OSCAR rotation + fitted clips, Lloyd-Max levels", OSCAR_METHOD_OSCAR2_LM, PL);
            if (wi == 1) {
                ABL("int2", "no rotation, no clip", OSCAR_METHOD_INT2, NULL);
                ABL("quarot2", "Hadamard rotation, no clip", OSCAR_METHOD_QUAROT2, NULL);
            }
#undef ABL
        }
    }

    if (per_layer) {
        char buf[256]; /* --per-layer is at most 255 bytes (checked with the arguments) */
        snprintf(buf, sizeof buf, "%s", per_layer);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            oscar_method m = OSCAR_METHOD_INT2;
            (void)oscar_method_from_name(t, &m); /* each name checked before the model load */
            int calibrated = m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM;
            for (int l = 0; l < cfg.num_layers; l++) {
                char nm3[64];
                snprintf(nm3, sizeof nm3, "%s#L%d", t, l);
                if (!add_variant(&R, nm3, "only this layer quantized, the others bf16", m,
                                 calibrated ? (m == OSCAR_METHOD_OSCAR2_LM ? PL : P) : NULL, (int)sink, (int)recent,
                                 (int)group, 2)) {
                    fprintf(stderr, "oscar-eval: too many variants (at most %d)\n", EV_MAX_VARIANTS);
                    rc = EXIT_BAD_INPUT;
                    goto done;
                }
                R.vars[R.nvar - 1].only_layer = l;
                R.vars[R.nvar - 1].same_as = -1;
            }
        }
    }

    /* Jobs: eval windows, then retrieval trials. */
    int R_len = (int)((ctx - sink) / 2);
    int do_ret = trials > 0;
    if (do_ret && (R_len < recent + 1 || R_len < 8)) {
        fprintf(stderr, "oscar-eval: warning: context %ld leaves copies of %d tokens after the sink of %ld; "
                        "retrieval needs copies longer than the recent window %ld: retrieval skipped\n",
                ctx, R_len, sink, recent);
        do_ret = 0;
    }
    /* Lookup documents of half the context and the context (1024 and 2048 by default). */
    const int task_ctx[EV_TASK_CTX] = {(int)ctx / 2, (int)ctx};
    const int ntask = tasks ? EV_TASK_CTX * (int)task_docs : 0;
    int njobs = (int)windows + (do_ret ? (int)trials : 0) + ntask;
    R.jobs = calloc((size_t)njobs, sizeof *R.jobs);
    R.stats = calloc((size_t)njobs * (size_t)R.nvar, sizeof *R.stats);
    ret_tok = do_ret ? malloc((size_t)trials * (size_t)ctx * sizeof *ret_tok) : NULL;
    task_tok = ntask ? malloc((size_t)ntask * (size_t)task_ctx[EV_TASK_CTX - 1] * sizeof *task_tok) : NULL;
    if (!R.jobs || !R.stats || (do_ret && !ret_tok) || (ntask && !task_tok)) {
        fprintf(stderr, "oscar-eval: out of memory for %d jobs\n", njobs);
        rc = 1;
        goto done;
    }
    for (int w = 0; w < windows; w++)
        R.jobs[w] = (ev_job){.tokens = tok + (size_t)w * ctx, .n = (int)ctx, .r0 = 0, .r1 = (int)ctx, .index = w};
    for (int t = 0; do_ret && t < trials; t++) {
        /* Prefix of S0 real tokens (a natural sink), then a sequence of R
         * tokens twice: first copy [S0, S0+R), second [S0+R, S0+2R). Row i of
         * the second copy predicts token i+1, whose earlier occurrence (row
         * i+1-R) lies R-1 >= W keys behind: in the 2-bit region. The
         * sequence is a chunk of the token file after the evaluated windows
         * (text) or random ids (random). */
        uint32_t *tt = ret_tok + (size_t)t * ctx;
        uint64_t st = (uint64_t)seed * 0x9E3779B97F4A7C15ull + (uint64_t)t + 1;
        for (int i = 0; i < 4; i++) ev_xorshift(&st);
        int64_t span = (int64_t)sink + R_len, avail = ntok - span;
        int64_t off = windows * ctx + (int64_t)t * span;
        if (off > avail) off = avail > 0 ? (int64_t)(ev_xorshift(&st) % (uint64_t)avail) : 0;
        for (int i = 0; i < span; i++) tt[i] = tok[off + i];
        for (int i = 0; i < R_len; i++) {
            if (!strcmp(S.ret_source, "random")) tt[sink + i] = (uint32_t)(ev_xorshift(&st) % (uint64_t)cfg.vocab);
            tt[sink + R_len + i] = tt[sink + i];
        }
        int n = (int)sink + 2 * R_len;
        R.jobs[windows + t] = (ev_job){.tokens = tt, .n = n, .r0 = (int)sink + R_len, .r1 = n - 1,
                                       .b0 = (int)sink, .b1 = (int)sink + R_len - 1, .retrieval = 1, .index = t};
    }
    for (int k = 0; k < ntask; k++) {
        const int c = k / (int)task_docs, doc = k % (int)task_docs, n = task_ctx[c];
        uint32_t *tt = task_tok + (size_t)k * (size_t)task_ctx[EV_TASK_CTX - 1];
        int arows[EV_TASK_FACTS];
        if (ev_task_build(&tv, tok, ntok, n, (int)sink, (int)recent, (uint64_t)seed * 1000003u + (uint64_t)k, tt,
                          arows) != 0) {
            fprintf(stderr, "oscar-eval: --tasks: a %d-token lookup document cannot keep its facts outside the "
                            "windows (sink %ld, recent %ld), or the token file holds fewer than %d tokens\n",
                    n, sink, recent, n);
            rc = EXIT_BAD_INPUT;
            goto done;
        }
        ev_job *J = &R.jobs[(int)windows + (do_ret ? (int)trials : 0) + k];
        *J = (ev_job){.tokens = tt, .n = n, .task = 1, .task_ctx = c, .index = doc};
        memcpy(J->answer_rows, arows, sizeof arows);
    }
    S.task_docs = ntask ? (int)task_docs : 0;
    for (int c = 0; c < EV_TASK_CTX; c++) S.task_ctx[c] = task_ctx[c];
    R.njobs = njobs;
    R.t_start = t_start;
    S.ctx = (int)ctx;
    S.windows = (int)windows;
    S.eval_tokens = windows * ctx;
    S.tokens_in_file = ntok;
    S.sink = (int)sink;
    S.recent = (int)recent;
    S.chunk = (int)chunk;
    S.group = (int)group;
    S.workers = (int)threads;
    S.engine_threads = engine_threads;
    S.ret_trials = do_ret ? (int)trials : 0;
    S.ret_len = R_len;
    S.ret_first = (int)sink;
    S.ret_second = (int)sink + R_len;
    S.seed = (uint64_t)seed;
    fprintf(stderr, "oscar-eval: %s, %d windows of %ld tokens (%lld evaluated), %d retrieval trials, %d variants, "
                    "%ld worker(s) x %d engine thread(s)\n",
            S.model_dir, (int)windows, ctx, (long long)S.eval_tokens, S.ret_trials, R.nvar, threads, engine_threads);
    {
        char err[700] = "";
        int hook_threads = engine_threads;
        oscar_status es = ev_execute(&R, (int)threads, hook_threads, err, sizeof err);
        if (es != OSCAR_OK) {
            fprintf(stderr, "oscar-eval: evaluation failed: %s\n", err);
            /* NONFINITE: the model's weights produce NaN/Inf logits: bad input, no KL of 0 */
            rc = es == OSCAR_ERR_NONFINITE ? EXIT_BAD_INPUT : 1;
            goto done;
        }
    }
    S.wall_s = ev_now() - t_start;
    S.cpu_s = ev_cpu_seconds() - cpu_start;
    {
        /* The report and the table are written to temporaries of this run's
         * own next to them (mkstemp: two runs, or a stale PATH.tmp, never
         * share one) and renamed only when both are complete: a failed write
         * leaves neither. A failed --md rename after the --out one leaves the
         * new report (complete) in place and says so: removing it, as before,
         * lost the earlier report that the rename had replaced. */
        const char *fj = S.out_json, *fm = S.out_md;
        char jt[4200] = "", mt[4200] = "";
        int wrc = ev_unique_temp(jt, sizeof jt, fj) != 0 || (fm && ev_unique_temp(mt, sizeof mt, fm) != 0);
        S.out_json = jt;
        S.out_md = fm ? mt : NULL;
        wrc = wrc || ev_write_json(&R, &S) != 0 || (fm && ev_write_md(&R, &S) != 0);
        S.out_json = fj;
        S.out_md = fm;
        if (!wrc && rename(jt, fj) != 0) {
            fprintf(stderr, "oscar-eval: cannot rename %s to %s: %s\n", jt, fj, strerror(errno));
            wrc = 1;
        } else if (!wrc && fm && rename(mt, fm) != 0) {
            fprintf(stderr, "oscar-eval: cannot rename %s to %s: %s; the report %s is written, the table (--md %s) "
                            "is not written\n", mt, fm, strerror(errno), fj, fm);
            unlink(mt);
            rc = 1;
        }
        if (wrc) {
            if (jt[0]) unlink(jt);
            if (fm && mt[0]) unlink(mt);
            fprintf(stderr, "oscar-eval: no report written (--out %s%s%s)\n", fj, fm ? ", --md " : "", fm ? fm : "");
            rc = 1;
        }
    }
    if (S.out_plot && ev_write_plot(&R, &S) != 0) rc = 1;
    fprintf(stderr, "oscar-eval: done in %.1f s wall, %.1f s CPU\n", S.wall_s, S.cpu_s);

done:
    for (int i = 0; i < nstorage_made; i++) {
        ev_storage_free(&storages[i]);
        oscar_params_destroy(storage_params[i]);
    }
    free(R.jobs);
    free(R.stats);
    free(ret_tok);
    free(task_tok);
    pthread_mutex_destroy(&R.log_mu);
    free(tok);
    oe_model_free(model);
    oscar_params_destroy(P);
    oscar_params_destroy(P_lm);
    oscar_params_destroy(P_fixed);
    oscar_params_destroy(P_noclip);
    oscar_params_destroy(P_near);
    oscar_params_destroy(P_pub);
    oscar_params_destroy(P_hclip);
    return rc;
}
