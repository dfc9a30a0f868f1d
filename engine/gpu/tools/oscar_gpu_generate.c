/* oscar-gpu-generate: greedy generation with the GPU engine on a Hugging
 * Face checkpoint, and (--check) its agreement with the CPU engine.
 *
 *   oscar-gpu-generate MODEL_DIR --prompt-tokens FILE --n N [--method bf16|oscar2|int2|...]
 *       [--params P] [--prompt-len L] [--offset O] [--fp32] [--stepwise] [--chunk C]
 *       [--shared-prefix PL R B] [--check [--min-agree A] [--max-logit-diff D] [--first K]]
 *
 * --chunk C: chunked prefill (oscar_append of C tokens, then oscar_extend of
 * their queries over the whole cache; the engine clamps C to the recent
 * window for 2-bit methods and says so). --check then runs the CPU engine
 * with the same schedule (oe_forward_options.chunk_tokens C, chunk_limit
 * the prompt length: chunks up to the prompt's end, token by token after).
 *
 * --shared-prefix PL R B (with --chunk): R requests whose prompts share
 * their first PL tokens (the prompt at --offset) and continue with
 * different text (consecutive stretches of the file after it), through an
 * engine of B slots: the prefix is prefilled once, its full 2-bit pages are
 * referenced by every request's block table, its window copied; each
 * request prefills its own suffix in chunks, then decodes. --check compares
 * every request with the CPU engine as above (PL must be a multiple of the
 * chunk so that the CPU's chunk boundaries are the GPU's); the RESULT line
 * sums over the requests.
 *
 * --check runs the CPU engine (fp32, K/V rounded to bf16 like the cache;
 * for 2-bit methods its KV hook quantizes the region S0 <= p <= t - W with
 * oscar_fakequant, liboscar's CPU reference) over prompt + generated tokens
 * in one causal pass (teacher forcing with the GPU's tokens). At each step
 * it compares the GPU's greedy token with the CPU's argmax and the two
 * logit rows. If every step agrees, the CPU engine run greedily would
 * produce exactly the GPU's tokens. A disagreement counts as a near tie
 * (tolerated) when the CPU's own margin between its top token and the
 * GPU's token is at most --tie-margin (default 0.1 with --fp32, 0.5 with
 * bf16 weights) and at most twice that step's largest logit difference; a
 * relative rule alone would forgive everything once the logits are far off.
 * Pass: agreement rate (near ties counted as agreeing) >= A and the largest
 * logit difference over the first K steps <= D. Exit status 3 on failure.
 *
 * --batch-check R B: R requests (prompts of awkward, different lengths from
 * consecutive stretches of the token file) through an engine of B slots
 * (batched prefill with cu_seqlens, batched decode, FIFO admission as
 * sequences finish, pages reused), each compared with the same request
 * run alone. Pass: up to each request's first divergence the logits differ
 * by at most --max-logit-diff, and every divergence is a near tie.
 *
 * --debug-layers: one exact prefill of the prompt (BF16 K/V), the device
 * weights compared with the host's, then every stage (embedding, q/k/v of
 * each layer after q/k-norm and RoPE) compared with the CPU engine's
 * observer; prints the first wrong stage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "ge.h"
#include "tool_args.h"

static void usage(void)
{
    fprintf(stderr, "usage: oscar-gpu-generate MODEL_DIR --prompt-tokens FILE --n N [--method M] [--params P]\n"
                    "       [--prompt-len L] [--offset O] [--fp32] [--stepwise] [--sink S] [--recent W] [--chunk C]\n"
                    "       [--check [--min-agree A] [--max-logit-diff D] [--first K]] [--batch-check R B]\n"
                    "       [--shared-prefix PL R B]\n"
                    "       [--tie-margin M] [--debug-layers]\n");
}

typedef struct hook_ctx {
    const oscar_params *p;
    oscar_method m;
    int Hkv, d, group;
    oscar_status st;
} hook_ctx;

static oscar_status kv_hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq)
{
    hook_ctx *h = user;
    size_t bytes = (size_t)n * h->Hkv * h->d * sizeof(float);
    memcpy(kq, k, bytes);
    memcpy(vq, v, bytes);
    oscar_status s = oscar_fakequant(h->p, h->m, layer, OSCAR_K, h->group, n, h->Hkv, h->d, kq);
    if (s == OSCAR_OK) s = oscar_fakequant(h->p, h->m, layer, OSCAR_V, h->group, n, h->Hkv, h->d, vq);
    if (s != OSCAR_OK) fprintf(stderr, "fakequant: %s\n", oscar_last_error());
    return s;
}

/* --debug-layers: the CPU engine's post-RoPE q/k/v of every layer for the
 * prompt, compared with the GPU's prefill stage by stage. */
typedef struct dbg_ctx {
    const oe_model *m;
    const uint32_t *toks;
    int n, L, qd, kvd;
    float *q, *k, *v;      /* CPU [L][n][qd|kvd] */
    const float *clast;    /* CPU logits of the last prompt row */
    double tol;            /* relative error above which a stage is wrong */
    int first_bad_layer;
    char first_bad[64];
} dbg_ctx;

static oscar_status dbg_observer(void *user, int layer, int n, const float *q, const float *k, const float *v)
{
    dbg_ctx *d = user;
    memcpy(d->q + (size_t)layer * n * d->qd, q, (size_t)n * d->qd * sizeof *q);
    memcpy(d->k + (size_t)layer * n * d->kvd, k, (size_t)n * d->kvd * sizeof *k);
    memcpy(d->v + (size_t)layer * n * d->kvd, v, (size_t)n * d->kvd * sizeof *v);
    return OSCAR_OK;
}

static void dbg_compare(dbg_ctx *d, int layer, const char *what, const float *g, const float *ref, size_t rows,
                        size_t cols)
{
    double md = 0, mr = 0;
    size_t at = 0;
    for (size_t i = 0; i < rows * cols; i++) {
        double dd = fabs((double)g[i] - ref[i]);
        if (!(dd <= md)) {
            md = dd;
            at = i;
        }
        if (fabs((double)ref[i]) > mr) mr = fabs((double)ref[i]);
    }
    double rel = mr > 0 ? md / mr : md;
    int bad = !(rel <= d->tol);
    printf("debug: layer %2d %-6s max |gpu - cpu| %.4g (max |cpu| %.4g, rel %.3g) at token %zu col %zu%s\n", layer,
           what, md, mr, rel, at / cols, at % cols, bad ? "  <-- WRONG" : "");
    if (bad && d->first_bad_layer == -2) {
        d->first_bad_layer = layer;
        snprintf(d->first_bad, sizeof d->first_bad, "%s", what);
    }
}

static void dbg_gpu(void *user, int layer, const char *what, const float *data, size_t rows, size_t cols)
{
    dbg_ctx *d = user;
    const oe_config *c = oe_model_config(d->m);
    if (!strcmp(what, "embed")) {
        float *ref = malloc(rows * cols * sizeof *ref);
        if (!ref) return;
        for (size_t t = 0; t < rows; t++)
            memcpy(ref + t * cols, d->m->embed + (size_t)d->toks[t] * c->hidden, cols * sizeof *ref);
        dbg_compare(d, layer, what, data, ref, rows, cols);
        free(ref);
    } else if (!strcmp(what, "q")) {
        dbg_compare(d, layer, what, data, d->q + (size_t)layer * rows * cols, rows, cols);
    } else if (!strcmp(what, "k")) {
        dbg_compare(d, layer, what, data, d->k + (size_t)layer * rows * cols, rows, cols);
    } else if (!strcmp(what, "v")) {
        dbg_compare(d, layer, what, data, d->v + (size_t)layer * rows * cols, rows, cols);
    } else {
        /* No CPU copy of these: their size, to see a blow-up. */
        double ss = 0, mx = 0;
        for (size_t i = 0; i < rows * cols; i++) {
            ss += (double)data[i] * data[i];
            if (fabs((double)data[i]) > mx || data[i] != data[i]) mx = fabs((double)data[i]);
        }
        printf("debug: layer %2d %-6s rms %.4g, max |.| %.4g (gpu only)\n", layer, what, sqrt(ss / (double)(rows * cols)),
               mx);
    }
}

/* A --wide-bits file: each layer's pages hold its own 1-bit planes (FORMAT.md §3.3); says so
 * (perf/e2e/run.sh's wide-pages checks look for this line). */
static void print_layer_pages(const ge_engine *e, const oe_config *c)
{
    const oscar_layout_desc *el = ge_engine_layout(e);
    if (!el->wide_per_layer) return;
    const size_t *pb = ge_engine_layer_page_bytes(e);
    const double elems = 2.0 * el->num_kv_heads * el->page_size * el->head_dim;
    oscar_layout_desc plain = *el;
    plain.wide_tensors = plain.wide_per_layer = 0;
    oscar_layout_sizes psz = {0};
    oscar_layout_sizes_get(&plain, &psz);
    double sum = 0.0;
    printf("kv: per-layer pages (3-bit head-tensors, at most %d in a layer), page bytes per layer:", el->wide_tensors);
    for (int i = 0; i < c->num_layers; i++) {
        printf(" %zu", pb[i]);
        sum += (double)pb[i];
    }
    printf("; paged bits per element %.4f on average (2-bit pages: %.4f), %d pages per layer\n",
           8.0 * sum / c->num_layers / elems, 8.0 * (double)psz.page_bytes / elems, ge_engine_kv(e)->num_pages);
}

/* The engine for slots sequences of up to max_len tokens; its KV layout in *lout when not NULL. */
static ge_engine *make_engine(const oe_model *m, oscar_method method, const char *params, int fp32, int sink,
                              int recent, int chunk, int slots, int max_len, int max_prefill, oscar_layout_desc *lout)
{
    const oe_config *c = oe_model_config(m);
    ge_options o;
    ge_options_default(&o);
    o.method = method;
    o.params_path = params;
    o.max_batch = slots;
    o.max_seq_len = max_len;
    o.max_prefill_tokens = max_prefill;
    o.act_f32 = fp32;
    o.sink = sink;
    o.recent = recent;
    if (chunk > 0) { /* --chunk: every prompt in chunks, as the CPU check's schedule */
        o.prefill_chunk = chunk;
        o.chunk_every_prompt = 1;
    }
    o.check_every = 1;
    /* The layout with what the parameter file asks (3-bit head-tensors: per-layer pages), so the
     * budget holds each layer's own page size. */
    oscar_layout_desc l;
    size_t need, *pb = calloc((size_t)c->num_layers, sizeof *pb);
    if (!pb || ge_kv_layout(c, &o, &l, pb, NULL) != OSCAR_OK ||
        ge_kv_seq_bytes(&l, c->num_layers, pb, max_len, &need) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", pb ? ge_last_error() : "out of memory");
        free(pb);
        return NULL;
    }
    if (lout) *lout = l;
    size_t page_all = 0;
    for (int i = 0; i < c->num_layers; i++) page_all += pb[i];
    free(pb);
    o.kv_budget = (size_t)slots * need + page_all + (size_t)c->num_layers * 4096;
    ge_engine *e = NULL;
    if (ge_create_from_model(m, &o, &e) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", ge_last_error());
        return NULL;
    }
    if (chunk > 0 && *ge_engine_notes(e)) printf("note: %s\n", ge_engine_notes(e));
    print_layer_pages(e, c);
    return e;
}

static int batch_check(const oe_model *m, const uint32_t *all, int64_t count, long offset, int plen, int n_gen,
                       oscar_method method, const char *params, int fp32, int sink, int recent, int R, int B,
                       double max_diff, double tie_margin)
{
    const oe_config *c = oe_model_config(m);
    const size_t V = (size_t)c->vocab;
    if (B <= 0 || R <= 0) return 2;
    int32_t **pr = calloc((size_t)R, sizeof *pr), *lens = malloc((size_t)R * 4);
    int32_t *ob = malloc((size_t)R * n_gen * 4), *os = malloc((size_t)R * n_gen * 4);
    float *lb = malloc((size_t)R * n_gen * V * 4), *ls = malloc((size_t)R * n_gen * V * 4);
    if (!pr || !lens || !ob || !os || !lb || !ls) return 1;
    long at = offset;
    for (int r = 0; r < R; r++) {
        lens[r] = plen - (int)((r * 37) % (plen > 1 ? plen - 1 : 1)); /* awkward, different lengths */
        if (at + lens[r] > count) at = 0;
        pr[r] = malloc((size_t)lens[r] * 4);
        if (!pr[r]) return 1;
        for (int j = 0; j < lens[r]; j++) pr[r][j] = (int32_t)all[at + j];
        at += lens[r];
    }
    ge_engine *eb = make_engine(m, method, params, fp32, sink, recent, 0, B, plen + n_gen, plen * B, NULL);
    if (!eb) return 1;
    ge_gen_stats gs;
    if (ge_generate(eb, R, (const int32_t *const *)pr, lens, n_gen, 0, 0, ob, lb, &gs) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: batched: %s\n", ge_last_error());
        return 1;
    }
    printf("batched: %d requests through %d slots, at most %d decoding together, %lld decode steps\n", R, B,
           gs.max_running, (long long)gs.steps);
    ge_destroy(eb);
    ge_engine *es = make_engine(m, method, params, fp32, sink, recent, 0, 1, plen + n_gen, plen, NULL);
    if (!es) return 1;
    for (int r = 0; r < R; r++) {
        const int32_t *p = pr[r];
        if (ge_generate(es, 1, &p, &lens[r], n_gen, 0, 0, os + (size_t)r * n_gen, ls + (size_t)r * n_gen * V, NULL) !=
            OSCAR_OK) {
            fprintf(stderr, "oscar-gpu-generate: alone: %s\n", ge_last_error());
            return 1;
        }
    }
    ge_destroy(es);
    int pass = 1, same = 0;
    double worst = 0;
    for (int r = 0; r < R; r++) {
        int i = 0;
        for (; i < n_gen; i++) {
            const float *a = lb + ((size_t)r * n_gen + i) * V, *b = ls + ((size_t)r * n_gen + i) * V;
            double md = 0;
            for (size_t j = 0; j < V; j++) {
                double d = fabs((double)a[j] - b[j]);
                if (!(d <= md)) md = d;
            }
            if (!(md <= worst)) worst = md;
            int ta = ob[(size_t)r * n_gen + i], tb = os[(size_t)r * n_gen + i];
            if (ta != tb) {
                double margin = fabs((double)b[tb] - b[ta]);
                int tie = margin <= tie_margin && margin <= 2.0 * md;
                printf("request %d (prompt %d): batched and alone diverge at step %d (%d vs %d, margin %.4f, logit "
                       "diff %.4f)%s\n", r, lens[r], i, ta, tb, margin, md, tie ? " near tie" : "");
                if (!tie) pass = 0;
                break;
            }
        }
        same += i == n_gen;
    }
    if (!(worst <= max_diff)) pass = 0;
    printf("batch check: %d/%d requests identical to their run alone; max logit diff before divergence %.5f (need <= "
           "%.4f): %s\n", same, R, worst, max_diff, pass ? "PASS" : "FAIL");
    printf("RESULT|%s|%s|batched %dx%d|%d/%d|-|%.4f|%.5f|%.5f|%s\n", oscar_method_name(method), fp32 ? "fp32" : "bf16",
           R, B, same, R, (double)same / R, worst, worst, pass ? "PASS" : "FAIL");
    for (int r = 0; r < R; r++) free(pr[r]);
    free(pr);
    free(lens);
    free(ob);
    free(os);
    free(lb);
    free(ls);
    return pass ? 0 : 3;
}

/* Prefill of the prompt on the GPU (bf16 K/V method, exact prefill), each
 * stage compared with the CPU engine; also the device weights against the
 * host's. Exit 3 when something is off. */
static int debug_layers(const oe_model *m, const int32_t *prompt, int plen, int fp32, int sink, int recent)
{
    const oe_config *c = oe_model_config(m);
    dbg_ctx d = {0};
    d.m = m;
    d.n = plen;
    d.L = c->num_layers;
    d.qd = c->num_q_heads * c->head_dim;
    d.kvd = c->num_kv_heads * c->head_dim;
    /* fp32: only summation order differs (and bf16 rounding of k/v, 2^-9);
     * bf16 weights/activations: a few bf16 roundings deep. */
    d.tol = fp32 ? 1e-2 : 6e-2;
    d.first_bad_layer = -2;
    uint32_t *toks = malloc((size_t)plen * 4);
    float *clog = malloc((size_t)plen * c->vocab * 4), *glog = malloc((size_t)c->vocab * 4);
    d.q = malloc((size_t)d.L * plen * d.qd * 4);
    d.k = malloc((size_t)d.L * plen * d.kvd * 4);
    d.v = malloc((size_t)d.L * plen * d.kvd * 4);
    if (!toks || !clog || !glog || !d.q || !d.k || !d.v) return 1;
    for (int i = 0; i < plen; i++) toks[i] = (uint32_t)prompt[i];
    d.toks = toks;
    oe_ctx *ctx;
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.kv_bf16 = 1;
    fo.observer = dbg_observer;
    fo.observer_user = &d;
    if (oe_ctx_create(m, plen, &ctx) != OSCAR_OK || oe_forward(ctx, toks, plen, &fo, clog) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: CPU reference: %s\n", oe_last_error());
        return 1;
    }
    oe_ctx_free(ctx);
    d.clast = clog + (size_t)(plen - 1) * c->vocab;
    ge_engine *e = make_engine(m, OSCAR_METHOD_BF16, NULL, fp32, sink, recent, 0, 1, plen + 1, plen, NULL);
    if (!e) return 1;
    double wrel = 0;
    if (ge_debug_weights(e, m, stdout, &wrel) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", ge_last_error());
        return 1;
    }
    int w_ok = wrel <= (fp32 ? 0.0 : 4e-3);
    printf("debug: device weights vs host: worst max|diff|/max|host| %.3g: %s\n", wrel, w_ok ? "ok" : "MISMATCH");
    ge_set_debug(e, dbg_gpu, &d);
    int32_t next;
    const int32_t *pp = prompt;
    if (ge_generate(e, 1, &pp, &plen, 1, 0, 0, &next, glog, NULL) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", ge_last_error());
        return 1;
    }
    ge_destroy(e);
    double md = 0;
    int top = 0;
    for (int j = 0; j < c->vocab; j++) {
        double dd = fabs((double)glog[j] - d.clast[j]);
        if (!(dd <= md)) md = dd;
        if (d.clast[j] > d.clast[top]) top = j;
    }
    printf("debug: last prompt row logits: max |gpu - cpu| %.5g; GPU token %d, CPU token %d\n", md, next, top);
    if (d.first_bad_layer != -2)
        printf("debug: first wrong stage: layer %d %s\n", d.first_bad_layer, d.first_bad);
    else
        printf("debug: every compared stage within %.3g relative\n", d.tol);
    int ok = w_ok && d.first_bad_layer == -2;
    printf("RESULT|debug-layers|%s|prefill %d|-|-|-|%.5f|%.5f|%s\n", fp32 ? "fp32" : "bf16", plen, md, md,
           ok ? "PASS" : "FAIL");
    free(toks);
    free(clog);
    free(glog);
    free(d.q);
    free(d.k);
    free(d.v);
    return ok ? 0 : 3;
}

/* Teacher-forced agreement of one request with the CPU engine, added to *cs. */
typedef struct check_stats {
    int agree, ties, steps, first_miss;
    double worst, worst_first, sum;
} check_stats;

typedef struct check_cfg {
    const oe_model *m;
    oscar_method method;
    const oscar_params *prm; /* NULL for BF16 */
    int group, sink, recent;
    int chunk;               /* the engine's prefill chunk (0: none) */
    int first;
    double tie_margin;
} check_cfg;

/* CPU reference over prompt + generated[0..n-2]: logits at positions
 * plen-1 .. plen+n-2, compared with the GPU's tokens out and logits glog.
 * 0, or 1 when the CPU engine failed. */
static int cpu_check(const check_cfg *k, const int32_t *prompt, int plen, const int32_t *out, const float *glog,
                     int n_gen, const char *who, check_stats *cs)
{
    const oe_config *c = oe_model_config(k->m);
    int W = plen + n_gen - 1;
    uint32_t *win = malloc((size_t)W * 4);
    float *clog = malloc((size_t)W * c->vocab * 4);
    if (!win || !clog) return 1;
    for (int i = 0; i < plen; i++) win[i] = (uint32_t)prompt[i];
    for (int i = 0; i + 1 < n_gen; i++) win[plen + i] = (uint32_t)out[i];
    oe_ctx *ctx;
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.kv_bf16 = 1;
    fo.sink_tokens = k->sink;
    fo.recent_tokens = k->recent;
    fo.chunk_tokens = k->chunk;
    fo.chunk_limit = k->chunk > 0 ? plen : 0;
    hook_ctx hk = {k->prm, k->method, c->num_kv_heads, c->head_dim, k->group, OSCAR_OK};
    if (k->prm) {
        fo.kv_quant = kv_hook;
        fo.kv_quant_user = &hk;
    }
    if (oe_ctx_create(k->m, W, &ctx) != OSCAR_OK || oe_forward(ctx, win, W, &fo, clog) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: CPU reference: %s\n", oe_last_error());
        return 1;
    }
    for (int i = 0; i < n_gen; i++) {
        const float *cr = clog + (size_t)(plen - 1 + i) * c->vocab, *gr = glog + (size_t)i * c->vocab;
        int top = 0;
        double md = 0.0;
        for (int j = 0; j < c->vocab; j++) {
            if (cr[j] > cr[top]) top = j;
            double dd = fabs((double)cr[j] - gr[j]);
            if (!(dd <= md)) md = dd; /* NaN propagates as a failure */
        }
        cs->sum += md;
        if (!(md <= cs->worst)) cs->worst = md;
        if (i < k->first && !(md <= cs->worst_first)) cs->worst_first = md;
        if (top == out[i]) cs->agree++;
        else {
            double margin = (double)cr[top] - cr[out[i]];
            int tie = margin <= k->tie_margin && margin <= 2.0 * md;
            cs->ties += tie;
            if (cs->first_miss < 0) cs->first_miss = cs->steps + i;
            printf("%sstep %d: GPU %d, CPU %d (CPU margin %.4f, max logit diff %.4f)%s\n", who, i, out[i], top, margin,
                   md, tie ? " near tie" : "");
        }
    }
    cs->steps += n_gen;
    oe_ctx_free(ctx);
    free(win);
    free(clog);
    return 0;
}

/* The check line and the RESULT line of one or more requests; exit status. */
static int report(const check_cfg *k, int fp32, const char *prefill, const check_stats *cs, double min_agree,
                  double max_diff)
{
    double rate = (double)(cs->agree + cs->ties) / cs->steps;
    int pass = rate >= min_agree && cs->worst_first <= max_diff;
    printf("check: %s vs CPU engine%s, prefill %s: %d/%d steps agree exactly, %d near ties, rate %.4f (need >= %.4f); "
           "max logit diff %.5f over the first %d steps (need <= %.4f), %.5f over all, mean %.5f; first "
           "disagreement %d: %s\n",
           oscar_method_name(k->method), k->method == OSCAR_METHOD_BF16 ? " (bf16 K/V)" : " + fakequant hook", prefill,
           cs->agree, cs->steps, cs->ties, rate, min_agree, cs->worst_first, k->first, max_diff, cs->worst,
           cs->sum / cs->steps, cs->first_miss, pass ? "PASS" : "FAIL");
    printf("RESULT|%s|%s|%s|%d/%d|%d|%.4f|%.5f|%.5f|%s\n", oscar_method_name(k->method), fp32 ? "fp32" : "bf16",
           prefill, cs->agree, cs->steps, cs->ties, rate, cs->worst_first, cs->worst, pass ? "PASS" : "FAIL");
    return pass ? 0 : 3;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

int main(int argc, char **argv)
{
    tool_watch_stdout("oscar-gpu-generate");
    if (argc < 2 || argv[1][0] == '-') {
        usage();
        return 2;
    }
    const char *dir = argv[1], *tok_path = NULL, *params = NULL, *method_name = "bf16";
    int n_gen = 64, plen = 512, fp32 = 0, stepwise = 0, check = 0, first = 16, sink = 64, recent = 256;
    int breq = 0, bslots = 0, debug = 0, chunk = 0, pfx = 0, preq = 0, pslots = 0;
    double tie_margin = -1.0;
    long offset = 0;
    double min_agree = 1.0, max_diff = 1e30;
    tool_seen seen = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!tool_args_once(&seen, "oscar-gpu-generate", a, NULL, NULL)) return 2;
        int more = i + 1 < argc, ok = 1;
        if (!strcmp(a, "--prompt-tokens") && more) tok_path = argv[++i];
        else if (!strcmp(a, "--n") && more) n_gen = atoi(argv[++i]);
        else if (!strcmp(a, "--method") && more) method_name = argv[++i];
        else if (!strcmp(a, "--params") && more) params = argv[++i];
        else if (!strcmp(a, "--prompt-len") && more) plen = atoi(argv[++i]);
        else if (!strcmp(a, "--offset") && more) offset = atol(argv[++i]);
        else if (!strcmp(a, "--sink") && more) sink = atoi(argv[++i]);
        else if (!strcmp(a, "--recent") && more) recent = atoi(argv[++i]);
        else if (!strcmp(a, "--chunk") && more) ok = parse_int(argv[++i], 1, 1 << 20, &chunk);
        else if (!strcmp(a, "--fp32")) fp32 = 1;
        else if (!strcmp(a, "--stepwise")) stepwise = 1;
        else if (!strcmp(a, "--check")) check = 1;
        else if (!strcmp(a, "--debug-layers")) debug = 1;
        else if (!strcmp(a, "--tie-margin") && more) tie_margin = atof(argv[++i]);
        else if (!strcmp(a, "--batch-check") && i + 2 < argc) {
            breq = atoi(argv[++i]);
            bslots = atoi(argv[++i]);
        } else if (!strcmp(a, "--shared-prefix") && i + 3 < argc) {
            ok = parse_int(argv[i + 1], 1, 1 << 20, &pfx) && parse_int(argv[i + 2], 1, 1024, &preq) &&
                 parse_int(argv[i + 3], 2, 1025, &pslots);
            i += 3;
        }
        else if (!strcmp(a, "--min-agree") && more) min_agree = atof(argv[++i]);
        else if (!strcmp(a, "--max-logit-diff") && more) max_diff = atof(argv[++i]);
        else if (!strcmp(a, "--first") && more) first = atoi(argv[++i]);
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "oscar-gpu-generate: unknown, incomplete or out-of-range option '%s' (--chunk takes a "
                            "size >= 1; --shared-prefix PL R B: PL >= 1 tokens, R >= 1 requests, B >= 2 slots)\n", a);
            usage();
            return 2;
        }
    }
    oscar_method method;
    if (!tok_path || n_gen <= 0 || plen <= 0 || offset < 0) {
        usage();
        return 2;
    }
    if (oscar_method_from_name(method_name, &method) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", oscar_last_error());
        return 2;
    }
    if (pfx && (!chunk || stepwise || breq || debug)) {
        fprintf(stderr, "oscar-gpu-generate: --shared-prefix needs --chunk (the requests' own tokens attend over "
                        "the shared cache) and goes without --stepwise, --batch-check and --debug-layers\n");
        return 2;
    }
    if (pfx >= plen) {
        fprintf(stderr, "oscar-gpu-generate: the shared prefix of %d tokens is not shorter than the prompt of %d; "
                        "each request needs tokens of its own\n", pfx, plen);
        return 2;
    }
    oe_model *m = NULL;
    if (oe_model_load(dir, &m) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", oe_last_error());
        return 1;
    }
    const oe_config *c = oe_model_config(m);
    uint32_t *all = NULL;
    int64_t count = 0;
    if (oe_tokens_load(tok_path, c->vocab, &all, &count) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", oe_last_error());
        return 1;
    }
    /* Shared prefix: the prompt at offset, then R suffixes one after the other. */
    const int n_req = pfx ? preq : 1;
    const int64_t need_tok = offset + (int64_t)plen + (int64_t)(n_req - 1) * (plen - pfx);
    if (need_tok > count) {
        fprintf(stderr, "oscar-gpu-generate: %s holds %lld tokens, fewer than the %lld the prompts need (offset %ld)\n",
                tok_path, (long long)count, (long long)need_tok, offset);
        return 1;
    }
    /* Near tie: the CPU's margin between its top token and the GPU's is
     * below this absolute bound (and within twice the step's logit
     * difference). fp32 weights/activations: numeric noise is ~1e-3, so
     * 0.1; bf16 weights/activations move logits by tenths, so 0.5. */
    if (tie_margin < 0) tie_margin = fp32 ? 0.1 : 0.5;
    if (breq > 0) return batch_check(m, all, count, offset, plen, n_gen, method, params, fp32, sink, recent, breq,
                                     bslots, max_diff, tie_margin);
    int32_t **prompts = calloc((size_t)n_req, sizeof *prompts), *lens = malloc((size_t)n_req * 4);
    int32_t *out = malloc((size_t)n_req * n_gen * 4);
    float *glog = malloc((size_t)n_req * n_gen * c->vocab * 4);
    if (!prompts || !lens || !out || !glog) return 1;
    for (int r = 0; r < n_req; r++) {
        lens[r] = plen;
        if (!(prompts[r] = malloc((size_t)plen * 4))) return 1;
        const uint32_t *suffix = all + offset + pfx + (size_t)r * (plen - pfx);
        for (int i = 0; i < plen; i++) prompts[r][i] = (int32_t)(i < pfx ? all[offset + i] : suffix[i - pfx]);
    }
    if (debug) return debug_layers(m, prompts[0], plen, fp32, sink, recent);

    oscar_layout_desc l;
    ge_engine *e = make_engine(m, method, params, fp32, sink, recent, chunk, pfx ? pslots : 1, plen + n_gen, plen, &l);
    if (!e) return 1;
    /* Stepwise prefill is token by token whatever the chunk. */
    const int echunk = stepwise ? 0 : ge_engine_chunk(e);
    if (pfx && pfx % echunk) {
        fprintf(stderr, "oscar-gpu-generate: the shared prefix of %d tokens is not a multiple of the chunk %d: the "
                        "CPU engine's chunks would not end where the GPU's do\n", pfx, echunk);
        return 2;
    }
    char prefill[64];
    if (pfx) snprintf(prefill, sizeof prefill, "shared %d+%d x%d, chunk %d", pfx, plen - pfx, n_req, echunk);
    else if (echunk) snprintf(prefill, sizeof prefill, "chunked %d", echunk);
    else snprintf(prefill, sizeof prefill, "%s", stepwise ? "stepwise" : "exact");
    printf("device: %s\nvariant: %s\nmethod: %s, %s weights/activations, prefill %s, prompt %d tokens at offset %ld\n",
           ge_engine_device(e), ge_engine_variant(e), oscar_method_name(method), fp32 ? "fp32" : "bf16",
           stepwise ? "stepwise (decode path per prompt token)"
           : echunk ? prefill
                    : "exact (prompt attention on its bf16 K/V)",
           plen, offset);
    if (pfx)
        printf("shared prefix: %d tokens, %d full pages per layer stored once and referenced by %d requests through "
               "%d slots (one holds the prefix until every request is in)\n", pfx, ge_shared_pages(&l, pfx), n_req,
               pslots);
    ge_gen_stats gs;
    if (ge_generate(e, n_req, (const int32_t *const *)prompts, lens, n_gen, stepwise, pfx, out, glog, &gs) != OSCAR_OK) {
        fprintf(stderr, "oscar-gpu-generate: %s\n", ge_last_error());
        return 1;
    }
    for (int r = 0; r < n_req; r++) {
        printf("tokens:");
        if (n_req > 1) printf(" [request %d]", r);
        for (int i = 0; i < n_gen; i++) printf(" %d", out[(size_t)r * n_gen + i]);
        printf("\n");
    }
    printf("prefill %.3f s (%lld tokens), decode %.3f s (%lld steps)\n", gs.prefill_s, (long long)gs.prefill_tokens,
           gs.decode_s, (long long)gs.steps);
    ge_destroy(e);
    int rc = 0;
    if (check) {
        oscar_params *prm = NULL;
        if (method != OSCAR_METHOD_BF16) {
            oscar_status s = params ? oscar_params_load(params, &prm)
                                    : oscar_params_create_builtin(method, c->num_layers, c->num_q_heads,
                                                                  c->num_kv_heads, c->head_dim, &prm);
            if (s != OSCAR_OK) {
                fprintf(stderr, "oscar-gpu-generate: %s\n", oscar_last_error());
                return 1;
            }
        }
        check_cfg k = {m, method, prm, l.group, sink, recent, echunk, first, tie_margin};
        check_stats cs = {.first_miss = -1};
        for (int r = 0; r < n_req; r++) {
            char who[32] = "";
            if (n_req > 1) snprintf(who, sizeof who, "request %d ", r);
            if (cpu_check(&k, prompts[r], plen, out + (size_t)r * n_gen, glog + (size_t)r * n_gen * c->vocab, n_gen,
                          who, &cs))
                return 1;
        }
        rc = report(&k, fp32, prefill, &cs, min_agree, max_diff);
        oscar_params_destroy(prm);
    }
    for (int r = 0; r < n_req; r++) free(prompts[r]);
    free(prompts);
    free(lens);
    free(out);
    free(glog);
    free(all);
    oe_model_free(m);
    return rc;
}
