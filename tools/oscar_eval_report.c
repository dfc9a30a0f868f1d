/* oscar-eval reports: report.json (jansson), a Markdown table and a gnuplot
 * PNG of bits per element against KL. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#include "oscar_eval.h"
#include "tool_params.h"

void ev_totals(const ev_run *R, int v, ev_total *out)
{
    memset(out, 0, sizeof *out);
    int src = R->vars[v].same_as >= 0 ? R->vars[v].same_as : v;
    int64_t top1 = 0, rc = 0, tc[EV_TASK_CTX] = {0}, tf[EV_TASK_CTX] = {0};
    for (int j = 0; j < R->njobs; j++) {
        const ev_stats *s = &R->stats[(size_t)j * R->nvar + src];
        if (R->jobs[j].task) {
            tc[R->jobs[j].task_ctx] += s->task_correct;
            tf[R->jobs[j].task_ctx] += s->task_first;
            out->task_total[R->jobs[j].task_ctx] += s->task_total;
        }
        out->nll += s->nll;
        out->kl += s->kl;
        top1 += s->top1;
        out->scored += s->scored;
        rc += s->ret_correct;
        out->ret_total += s->ret_total;
        out->seconds += s->seconds;
        out->hook_seconds += s->hook_seconds;
        out->kept += s->kept;
    }
    if (out->scored > 0) {
        out->ppl = exp(out->nll / (double)out->scored);
        out->kl /= (double)out->scored;
        out->top1 = (double)top1 / (double)out->scored;
        out->nll /= (double)out->scored;
    }
    out->retrieval = out->ret_total > 0 ? (double)rc / (double)out->ret_total : NAN;
    for (int c = 0; c < EV_TASK_CTX; c++) {
        out->task_acc[c] = out->task_total[c] > 0 ? (double)tc[c] / (double)out->task_total[c] : NAN;
        out->task_first[c] = out->task_total[c] > 0 ? (double)tf[c] / (double)out->task_total[c] : NAN;
    }
}

/* BF16's accuracy on the first copy, where nothing can be retrieved: what
 * the retrieval figures would be without the copy. */
static double ret_base(const ev_run *R)
{
    int64_t bc = 0, bt = 0;
    for (int j = 0; j < R->njobs; j++) {
        bc += R->stats[(size_t)j * R->nvar + R->ref_index].base_correct;
        bt += R->stats[(size_t)j * R->nvar + R->ref_index].base_total;
    }
    return bt > 0 ? (double)bc / (double)bt : NAN;
}

static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* A measured number: JSON (and jansson's json_real, whose NULL made json_object_set_new drop the key
 * without a word) has none for Inf and NaN, so those are the strings "inf", "-inf" and "nan", the key
 * kept (docs/EVAL.md); null (num_or_null) says "not measured". */
static json_t *num(double x)
{
    if (isfinite(x)) return json_real(x);
    return json_string(isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
}

/* Retrieval per trial (correct predictions of each copy window, in trial order) and the paired
 * standard error of this variant's retrieval minus the reference's over the trials: the spread
 * that says whether a difference of a few predictions is noise (sd of the per-trial differences
 * / sqrt(trials); null below two trials). */
static void retrieval_trials_json(const ev_run *R, int v, json_t *o)
{
    const int src = R->vars[v].same_as >= 0 ? R->vars[v].same_as : v, ref = R->ref_index;
    json_t *pt = json_array();
    double sum = 0.0, sum2 = 0.0;
    int n = 0;
    for (int j = 0; j < R->njobs; j++) {
        if (!R->jobs[j].retrieval) continue;
        const ev_stats *s = &R->stats[(size_t)j * R->nvar + src], *r = &R->stats[(size_t)j * R->nvar + ref];
        json_array_append_new(pt, json_integer(s->ret_correct));
        if (s->ret_total > 0) {
            const double d = (double)(s->ret_correct - r->ret_correct) / (double)s->ret_total;
            sum += d, sum2 += d * d, n++;
        }
    }
    json_object_set_new(o, "retrieval_correct_per_trial", pt);
    double se = NAN;
    if (n >= 2) {
        const double mean = sum / n, var = (sum2 - n * mean * mean) / (n - 1);
        se = sqrt(var > 0.0 ? var : 0.0) / sqrt((double)n);
    }
    json_object_set_new(o, "retrieval_minus_reference_se", num_or_null(se));
}

static json_t *variant_json(const ev_run *R, int v, double ref_ppl)
{
    const ev_variant *var = &R->vars[v];
    ev_total t;
    ev_totals(R, v, &t);
    json_t *o = json_object();
    json_object_set_new(o, "ppl", num(t.ppl));
    json_object_set_new(o, "delta_ppl", num(t.ppl - ref_ppl));
    json_object_set_new(o, "kl", num(t.kl));
    json_object_set_new(o, "top1", num(t.top1));
    json_object_set_new(o, "retrieval", num_or_null(t.retrieval));
    json_object_set_new(o, "bits_per_element", num(var->bits));
    json_object_set_new(o, "bits_whole_sequence", num(var->bits_seq));
    json_object_set_new(o, "method", json_string(oscar_method_name(var->method)));
    if (var->method == OSCAR_METHOD_OSCAR2 && !var->storage) { /* code widths of the parameters as run */
        int total = 0;
        json_object_set_new(o, "three_bit_head_tensors", json_integer(tool_params_wide_count(var->params, &total)));
        json_object_set_new(o, "head_tensors", json_integer(total));
    }
    json_object_set_new(o, "sink", json_integer(var->sink));
    json_object_set_new(o, "recent", json_integer(var->recent));
    json_object_set_new(o, "group", json_integer(var->group));
    json_object_set_new(o, "mean_nll", num(t.nll));
    json_object_set_new(o, "scored_tokens", json_integer(t.scored));
    json_object_set_new(o, "retrieval_predictions", json_integer(t.ret_total));
    if (t.task_total[0] + t.task_total[1] > 0) {
        json_t *ta = json_array(), *tf = json_array();
        for (int c = 0; c < EV_TASK_CTX; c++) {
            json_array_append_new(ta, num_or_null(t.task_acc[c]));
            json_array_append_new(tf, num_or_null(t.task_first[c]));
        }
        json_object_set_new(o, "kv_lookup_accuracy", ta); /* per settings.kv_lookup.contexts */
        json_object_set_new(o, "kv_lookup_first_digit", tf);
    }
    json_object_set_new(o, "seconds", num(t.seconds));
    json_object_set_new(o, "hook_seconds", num(t.hook_seconds));
    if (var->storage) {
        json_object_set_new(o, "storage", json_string(var->storage->spec));
        json_object_set_new(o, "storage_rows_kept_bf16", json_integer(t.kept));
    }
    if (var->same_as >= 0) json_object_set_new(o, "same_run_as", json_string(R->vars[var->same_as].name));
    json_object_set_new(o, "note", json_string(var->note));
    if (t.ret_total > 0) retrieval_trials_json(R, v, o);
    return o;
}

int ev_write_json(const ev_run *R, const ev_settings *S)
{
    ev_total ref;
    ev_totals(R, R->ref_index, &ref);
    json_t *root = json_object(), *st = json_object(), *ms = json_object(), *ab = json_object(),
           *pl = json_object();
    json_object_set_new(st, "model", json_string(S->model_dir));
    json_object_set_new(st, "params", S->params_path ? json_string(S->params_path) : json_null());
    json_object_set_new(st, "params_lm", S->params_lm_path ? json_string(S->params_lm_path) : json_null());
    json_object_set_new(st, "tokens", json_string(S->tokens_path));
    json_object_set_new(st, "tokens_in_file", json_integer(S->tokens_in_file));
    json_object_set_new(st, "context", json_integer(S->ctx));
    json_object_set_new(st, "windows", json_integer(S->windows));
    json_object_set_new(st, "evaluated_tokens", json_integer(S->eval_tokens));
    json_object_set_new(st, "sink", json_integer(S->sink));
    json_object_set_new(st, "recent", json_integer(S->recent));
    json_object_set_new(st, "group", json_integer(S->group));
    json_object_set_new(st, "meta_dtype", json_string("f16"));
    json_object_set_new(st, "library_version", json_string(oscar_version(NULL, NULL, NULL)));
    json_object_set_new(st, "reference", json_string("bf16: K/V rounded to bf16 everywhere, no 2-bit region"));
    json_object_set_new(st, "chunk", json_integer(S->chunk));
    json_object_set_new(st, "region_rule",
                        json_string(S->chunk > 0 ? "key p is read quantized by query t iff sink <= p <= e - 1 - recent, "
                                                   "e = min(end of t's chunk of `chunk` tokens, context)"
                                                 : "key p is read quantized by query t iff sink <= p <= t - recent"));
    json_object_set_new(st, "started_utc", json_string(S->started));
    json_t *rt = json_object();
    json_object_set_new(rt, "trials", json_integer(S->ret_trials));
    json_object_set_new(rt, "source", json_string(S->ret_source));
    json_object_set_new(rt, "bf16_first_copy_top1", num_or_null(ret_base(R)));
    json_object_set_new(rt, "copy_length", json_integer(S->ret_len));
    json_object_set_new(rt, "first_copy_start", json_integer(S->ret_first));
    json_object_set_new(rt, "second_copy_start", json_integer(S->ret_second));
    json_object_set_new(rt, "seed", json_integer((json_int_t)S->seed));
    json_object_set_new(rt, "scored_per_trial", json_integer(S->ret_len - 1));
    json_object_set_new(st, "retrieval", rt);
    if (S->task_docs > 0) {
        json_t *tk = json_object(), *cs = json_array();
        for (int c = 0; c < EV_TASK_CTX; c++) json_array_append_new(cs, json_integer(S->task_ctx[c]));
        json_object_set_new(tk, "contexts", cs);
        json_object_set_new(tk, "documents_per_context", json_integer(S->task_docs));
        json_object_set_new(tk, "facts_per_document", json_integer(EV_TASK_FACTS));
        json_object_set_new(tk, "template", json_string("The code of X D1 D2 D3. (X a single-token name absent "
                                                        "from the document's text; queried at the end, all 3 "
                                                        "digits must be the argmax)"));
        json_object_set_new(tk, "chance_uniform", num(1.0 / 900.0));
        json_object_set_new(tk, "chance_first_digit", num(1.0 / 9.0));
        json_object_set_new(tk, "chance_other_fact", num(1.0 / EV_TASK_FACTS));
        json_object_set_new(st, "kv_lookup", tk);
    }
    json_t *tm = json_object();
    json_object_set_new(tm, "wall_seconds", num(S->wall_s));
    json_object_set_new(tm, "cpu_seconds", num(S->cpu_s));
    json_object_set_new(tm, "workers", json_integer(S->workers));
    json_object_set_new(tm, "engine_threads", json_integer(S->engine_threads));
    json_object_set_new(st, "timing", tm);
    json_object_set_new(root, "settings", st);
    for (int v = 0; v < R->nvar; v++) {
        if (R->vars[v].ablation < 0) continue;
        json_t *dst = R->vars[v].ablation == 2 ? pl : R->vars[v].ablation ? ab : ms;
        json_object_set_new(dst, R->vars[v].name, variant_json(R, v, ref.ppl));
    }
    json_object_set_new(root, "methods", ms);
    if (json_object_size(ab) > 0) json_object_set_new(root, "ablations", ab);
    else json_decref(ab);
    if (json_object_size(pl) > 0) json_object_set_new(root, "per_layer", pl);
    else json_decref(pl);
    json_object_set_new(root, "reference_ppl", num(ref.ppl));
    errno = 0;
    int rc = json_dump_file(root, S->out_json, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    const int e = errno;
    json_decref(root);
    if (rc != 0) {
        /* the cause (a full disk is not a missing folder) */
        fprintf(stderr, "oscar-eval: cannot write %s (%s)\n", S->out_json, e ? strerror(e) : "write error");
        return 1;
    }
    return 0;
}

static void md_row(FILE *f, const ev_run *R, int v, double ref_ppl)
{
    const ev_variant *var = &R->vars[v];
    ev_total t;
    ev_totals(R, v, &t);
    char ret[32];
    if (isfinite(t.retrieval)) snprintf(ret, sizeof ret, "%.3f", t.retrieval);
    else snprintf(ret, sizeof ret, "-");
    fprintf(f, "| %s | %d/%d | %.3f | %.3f | %.4f | %+.4f | %.5f | %.4f | %s |\n", var->name, var->sink,
            var->recent, var->bits, var->bits_seq, t.ppl, t.ppl - ref_ppl, t.kl, t.top1, ret);
}

int ev_write_md(const ev_run *R, const ev_settings *S)
{
    FILE *f = fopen(S->out_md, "w");
    if (!f) {
        fprintf(stderr, "oscar-eval: cannot write %s (%s)\n", S->out_md, strerror(errno));
        return 1;
    }
    ev_total ref;
    ev_totals(R, R->ref_index, &ref);
    fprintf(f, "Model `%s`, tokens `%s`, context %d, %d windows (%lld evaluated tokens per method), group %d, "
               "fp16 metadata, liboscar %s. KL is KL(p_bf16 || p_method) per token (nats); top-1 is agreement "
               "with BF16's argmax; retrieval is top-1 accuracy on the second copy of a %d-token sequence (%s, "
               "%d trials) whose first copy lies in the quantized region (BF16 on the first copy, with nothing to "
               "retrieve: %.3f). Bits: of the quantized region / of the whole sequence at context %d with the "
               "16-bit windows.",
            S->model_dir, S->tokens_path, S->ctx, S->windows, (long long)S->eval_tokens, S->group,
            oscar_version(NULL, NULL, NULL), S->ret_len, S->ret_source, S->ret_trials, ret_base(R), S->ctx);
    /* The parameters' code widths (FORMAT.md §2.7), so that "2-bit" is never read into a 2/3-bit file. */
    for (int v = 0; v < R->nvar; v++) {
        int total = 0;
        const int n3 = R->vars[v].method == OSCAR_METHOD_OSCAR2 && !R->vars[v].storage
                           ? tool_params_wide_count(R->vars[v].params, &total) : 0;
        if (n3) {
            fprintf(f, " The oscar2 parameters store %d of %d head-tensors in 3 bits (one 1-bit plane each: %+.3f bits "
                       "per element, counted in every row that quantizes with them).",
                    n3, total, (double)n3 / total);
            break;
        }
    }
    fputs("\n\n", f);
    if (S->chunk > 0)
        fprintf(f, "Chunked-prefill schedule: the cache is filled %d tokens at a time and each chunk's queries see "
                   "the 2-bit region of the chunk's end (append, then oscar_extend; docs/FORMAT.md §5.1).\n\n",
                S->chunk);
    const char *hdr = "| method | S0/W | bits/elt | bits/elt (seq) | ppl | delta ppl | KL | top-1 | retrieval |\n"
                      "|---|---|---|---|---|---|---|---|---|\n";
    fputs(hdr, f);
    for (int v = 0; v < R->nvar; v++)
        if (R->vars[v].ablation == 0) md_row(f, R, v, ref.ppl);
    int any = 0;
    for (int v = 0; v < R->nvar; v++)
        if (R->vars[v].ablation == 1) {
            if (!any) fprintf(f, "\nAblations (`@sS0wW`: windows; s0w0 = every key and value quantized):\n\n%s", hdr);
            any = 1;
            md_row(f, R, v, ref.ppl);
        }
    any = 0;
    for (int v = 0; v < R->nvar; v++)
        if (R->vars[v].ablation == 2) {
            if (!any) fprintf(f, "\nPer layer (`METHOD#Ln`: only layer n quantized, the others bf16):\n\n%s", hdr);
            any = 1;
            md_row(f, R, v, ref.ppl);
        }
    if (S->task_docs > 0) {
        fprintf(f, "\nKey-value lookup (`--tasks`): %d documents per context of text with %d facts \"The code of X "
                   "D1 D2 D3.\" (X a name absent from the document's text) in the 2-bit region, each queried once at "
                   "the end; a query is right when all three digits are the argmax (first digit only in brackets). "
                   "Chance: 1/900 (1/9) guessing, 1/%d copying another fact's number.\n\n"
                   "| method | bits/elt | accuracy @%d (first digit) | accuracy @%d (first digit) |\n|---|---|---|---|\n",
                S->task_docs, EV_TASK_FACTS, EV_TASK_FACTS, S->task_ctx[0], S->task_ctx[1]);
        for (int v = 0; v < R->nvar; v++) {
            if (R->vars[v].ablation != 0 && v != R->ref_index) continue;
            ev_total t;
            ev_totals(R, v, &t);
            fprintf(f, "| %s | %.3f | %.3f (%.3f) | %.3f (%.3f) |\n", R->vars[v].name, R->vars[v].bits, t.task_acc[0],
                    t.task_first[0], t.task_acc[1], t.task_first[1]);
        }
    }
    fprintf(f, "\nRun: %.0f s wall, %.0f s CPU (%d worker(s) x %d engine thread(s)).\n", S->wall_s, S->cpu_s,
            S->workers, S->engine_threads);
    int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        fprintf(stderr, "oscar-eval: error writing %s (%s)\n", S->out_md, strerror(errno));
        return 1;
    }
    return 0;
}

/* Plot: one labelled point per (non-ablation) method; BF16 has KL 0 and
 * cannot sit on a log axis, so it is left out (said in the title). */
/* s as a gnuplot single-quoted string (a quote inside is doubled): a file
 * name is data in the script, never syntax. */
static void gp_string(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* Runs gnuplot on script without a shell (the path is an argument, not
 * command text), with the gnuplot variable oscar_png set to png; 0 when it
 * exited with status 0. */
static int run_gnuplot(const char *script, const char *png)
{
    size_t n = 2 * strlen(png) + 16;
    char *set = malloc(n);
    if (!set) return -1;
    size_t k = (size_t)snprintf(set, n, "oscar_png='");
    for (const char *c = png; *c; c++) { /* a quote doubled, as gp_string */
        if (*c == '\'') set[k++] = '\'';
        set[k++] = *c;
    }
    set[k++] = '\'';
    set[k] = '\0';
    char *argv[] = {(char *)"gnuplot", (char *)"-e", set, (char *)script, NULL};
    pid_t pid;
    int sp = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    free(set);
    if (sp != 0) return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* fopen(path, "w") that never blocks, with the message on failure: a FIFO put in
 * place of the plot's data or script after the start-up check waited for a
 * reader forever, and a device took the script (/dev/null: gnuplot drew nothing
 * and exited 0, an empty PNG). */
static FILE *plot_open(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
    struct stat sb;
    /* ENXIO: a FIFO without a reader */
    if ((fd < 0 && errno == ENXIO) || (fd >= 0 && fstat(fd, &sb) == 0 && !S_ISREG(sb.st_mode))) {
        if (fd >= 0) close(fd);
        fprintf(stderr, "oscar-eval: %s is a FIFO, socket or device, not a regular file; the plot was not written\n",
                path);
        return NULL;
    }
    int fl = fd < 0 ? -1 : fcntl(fd, F_GETFL);
    FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ? NULL : fdopen(fd, "w");
    if (!f) {
        int e = errno;
        if (fd >= 0) close(fd);
        fprintf(stderr, "oscar-eval: cannot write %s (%s); the plot was not written\n", path, strerror(e));
    }
    return f;
}

int ev_write_plot(const ev_run *R, const ev_settings *S)
{
    if (system("command -v gnuplot > /dev/null 2>&1") != 0) {
        fprintf(stderr, "oscar-eval: warning: gnuplot not found; %s not written (apt install gnuplot-nox)\n",
                S->out_plot);
        return 0;
    }
    size_t len = strlen(S->out_plot) + 8;
    char *dat = malloc(len), *gp = malloc(len), *png = malloc(len);
    if (!dat || !gp || !png) {
        free(dat), free(gp), free(png);
        return 1;
    }
    png[0] = '\0';
    snprintf(dat, len, "%s.dat", S->out_plot);
    snprintf(gp, len, "%s.gp", S->out_plot);
    FILE *f = plot_open(dat);
    int rc = 1;
    if (!f) goto out;
    /* Methods share bits (every 2-bit method is at 2.25), so points are
     * told apart by colour and shape in the key rather than by labels. */
    fprintf(f, "# method bits_per_element kl\n");
    char names[1024] = "";
    size_t nl = 0;
    for (int v = 0; v < R->nvar; v++) {
        ev_total t;
        ev_totals(R, v, &t);
        if (R->vars[v].ablation != 0 || !(t.kl > 0.0)) continue;
        fprintf(f, "%s %.4f %.6g\n", R->vars[v].name, R->vars[v].bits, t.kl);
        int w = snprintf(names + nl, sizeof names - nl, "%s%s", nl ? " " : "", R->vars[v].name);
        if (w > 0 && (size_t)w < sizeof names - nl) nl += (size_t)w;
    }
    /* A full disk shows in ferror or at fclose's flush: gnuplot would draw the truncated file. */
    int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        fprintf(stderr, "oscar-eval: error writing %s (%s); the plot was not written\n", dat, strerror(errno));
        goto out;
    }
    /* pngcairo where built in, else the libgd png terminal. */
    const char *term = system("gnuplot -e 'set terminal pngcairo' > /dev/null 2>&1") == 0 ? "pngcairo" : "png";
    /* gnuplot draws into a temporary of this run's own (oscar_png; PLOT.gp run by hand draws PLOT),
     * renamed over PLOT when it succeeds: it creates its output at 'set output', and a failed plot
     * left an empty PLOT (or truncated an earlier one) */
    snprintf(png, len, "%s.XXXXXX", S->out_plot);
    int pfd = mkstemp(png);
    if (pfd < 0) {
        fprintf(stderr, "oscar-eval: cannot create a temporary beside %s (%s); the plot was not written\n",
                S->out_plot, strerror(errno));
        png[0] = '\0';
        goto out;
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(pfd, 0666 & ~um) != 0) { /* not fatal: mkstemp's 0600 */ }
    close(pfd);
    f = plot_open(gp);
    if (!f) goto out;
    fprintf(f, "set terminal %s size 900,600\nset output (exists(\"oscar_png\") ? oscar_png : ", term);
    gp_string(f, S->out_plot);
    fputc(')', f);
    fprintf(f,
            "\nset title \"KL(p_bf16 || p_method) per token vs bits per element\\ncontext %d, sink %d, recent %d "
            "(bf16: 16 bits, KL 0, not shown)\" noenhanced\n"
            "set xlabel 'bits per element (quantized region, metadata counted)'\n"
            "set ylabel 'mean KL per token (nats), log scale'\n"
            "set logscale y\n"
            "set grid\n"
            "set key outside right top noenhanced\n"
            "set xrange [1.5:*]\n"
            "names = \"%s\"\n"
            "pts = \"5 7 9 11 13 15 4 6 8 10 12 14\"\n"
            "cols = \"#1b9e77 #d95f02 #7570b3 #e7298a #66a61e #a6761d #000000 #666666 #1f78b4 #b2df8a #fb9a99 "
            "#cab2d6\"\n"
            "plot for [i=1:words(names)] ",
            S->ctx, S->sink, S->recent, names);
    gp_string(f, dat);
    fprintf(f, " every ::(i-1)::(i-1) using 2:3 with points pt int(word(pts, (i - 1) %% 12 + 1)) ps 2 lc rgb "
               "word(cols, (i - 1) %% 12 + 1) title word(names, i)\n");
    werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        fprintf(stderr, "oscar-eval: error writing %s (%s); the plot was not written\n", gp, strerror(errno));
        goto out;
    }
    if (run_gnuplot(gp, png) != 0) {
        fprintf(stderr, "oscar-eval: gnuplot failed on %s; the plot was not written\n", gp);
        goto out;
    }
    if (rename(png, S->out_plot) != 0) {
        fprintf(stderr, "oscar-eval: cannot rename %s to %s (%s); the plot was not written\n", png, S->out_plot,
                strerror(errno));
        goto out;
    }
    png[0] = '\0';
    rc = 0;
out:
    if (png[0]) unlink(png);
    free(dat);
    free(gp);
    free(png);
    return rc;
}
