/* oscar-eval: accuracy of every KV-cache method on a real model, with the
 * cache quantized the way decoding sees it (docs/EVAL.md).
 *
 * For every window of --context tokens the BF16 reference (K/V rounded to
 * bf16, no 2-bit region) runs first and its next-token distribution is kept;
 * each method then runs the same window through the engine's kv_quant hook
 * (oscar_fakequant on the rows of the 2-bit region S0 <= p <= t - W) and is
 * scored against it: perplexity, KL(p_bf16 || p_method), top-1 agreement.
 * Retrieval: a random token sequence repeated, the first copy deep in the
 * 2-bit region while the second is predicted. Only two windows of logits
 * are ever held per worker. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "oscar_eval.h"

static double now_s(void)
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

/* ------------------------------------------------------------ the hook */
typedef struct hook_part {
    const ev_variant *var;
    int layer, n, Hkv, d, lo, hi; /* rows [lo, hi) of this part */
    float *rows;                  /* whole [n][Hkv][d] buffer */
    oscar_kv which;
    oscar_status st;
    char err[512];
} hook_part;

static void *hook_part_main(void *arg)
{
    hook_part *p = arg;
    p->st = OSCAR_OK;
    if (p->hi <= p->lo) return NULL;
    size_t row = (size_t)p->Hkv * (size_t)p->d;
    p->st = oscar_fakequant(p->var->params, p->var->method, p->layer, p->which, p->var->group, p->hi - p->lo,
                            p->Hkv, p->d, p->rows + (size_t)p->lo * row);
    if (p->st != OSCAR_OK) snprintf(p->err, sizeof p->err, "%s", oscar_last_error());
    return NULL;
}

/* Quantizes rows [lo, hi) of buf over up to `threads` threads; chunk starts
 * stay multiples of `align` rows after lo (KIVI key groups of 32). */
static oscar_status fakequant_split(const ev_variant *var, int layer, oscar_kv which, int n, int Hkv, int d,
                                    int lo, int hi, int align, int threads, float *buf)
{
    hook_part parts[EV_MAX_THREADS];
    pthread_t tid[EV_MAX_THREADS];
    int started[EV_MAX_THREADS] = {0};
    int rows = hi - lo;
    if (threads < 1) threads = 1;
    if (threads > EV_MAX_THREADS) threads = EV_MAX_THREADS;
    int per = (rows + threads - 1) / threads;
    per = (per + align - 1) / align * align;
    if (per < align) per = align;
    int np = 0;
    for (int s = lo; s < hi && np < threads; s += per, np++)
        parts[np] = (hook_part){.var = var, .layer = layer, .n = n, .Hkv = Hkv, .d = d, .lo = s,
                                .hi = s + per < hi ? s + per : hi, .rows = buf, .which = which};
    for (int i = 1; i < np; i++) started[i] = pthread_create(&tid[i], NULL, hook_part_main, &parts[i]) == 0;
    if (np > 0) hook_part_main(&parts[0]);
    for (int i = 1; i < np; i++) {
        if (started[i]) pthread_join(tid[i], NULL);
        else hook_part_main(&parts[i]);
    }
    for (int i = 0; i < np; i++)
        if (parts[i].st != OSCAR_OK) {
            fprintf(stderr, "oscar-eval: %s, layer %d: %s\n", var->name, layer, parts[i].err);
            return parts[i].st;
        }
    return OSCAR_OK;
}

/* --storage (tools/oscar_eval_storage.h): the run's fake-quant of rows
 * [lo, hi), then the change on the heads it names. With out=K the rows up to
 * the end of hi's page (or n) are quantized too, so that each page's
 * outliers are chosen among all its rows, as a write path that demotes a
 * complete page would (those rows exist when the page's first row leaves
 * the recent window, W >= EV_PAGE; oscar-eval refuses out= otherwise).
 * The engine reads only rows <= t - W of the copy: the extra rows are never
 * read in 2 bits. */
static oscar_status storage_quant(ev_hook *h, int layer, int n, int lo, int hi, float *buf, oscar_kv which)
{
    const ev_variant *var = h->var;
    const ev_storage *st = var->storage;
    const size_t row = (size_t)h->Hkv * (size_t)h->d;
    /* the groups the heads of this layer and tensor use, and whether any keeps rows */
    int out = 0, need[EV_NGROUPS] = {0}, any = 0;
    for (int kv = 0; kv < h->Hkv; kv++) {
        const int o = ev_storage_outliers_of(st, layer, kv, which), gi = ev_group_index(ev_storage_group_of(st, layer, kv, which));
        const int b = ev_storage_bits_of(st, layer, kv, which);
        out |= o > 0;
        if (gi >= 0 && !b) need[gi] = 1; /* a bits= head is coded apart below */
        any |= o > 0 || gi >= 0 || b > 0; /* clip= only: the variant's parameters carry it */
    }
    if (out) {
        int end = (hi + EV_PAGE - 1) / EV_PAGE * EV_PAGE;
        if (end > n) end = n;
        for (size_t i = (size_t)hi * row; i < (size_t)end * row; i++) buf[i] = oe_round_bf16(buf[i]);
        hi = end;
    }
    float *orig = NULL, *qg[EV_NGROUPS] = {NULL};
    int oom = 0;
    if (any) {
        oom |= !(orig = malloc((size_t)n * row * sizeof *orig));
        for (int gi = 0; gi < EV_NGROUPS; gi++)
            if (need[gi]) oom |= !(qg[gi] = malloc((size_t)n * row * sizeof *qg[gi]));
        if (!oom) memcpy(orig + (size_t)lo * row, buf + (size_t)lo * row, (size_t)(hi - lo) * row * sizeof *orig);
    }
    oscar_status s = OSCAR_ERR_OUT_OF_MEMORY;
    if (oom) fprintf(stderr, "oscar-eval: %s: out of memory for the storage ablation's rows\n", var->name);
    else s = fakequant_split(var, layer, which, n, h->Hkv, h->d, lo, hi, 1, h->threads, buf);
    for (int gi = 0; gi < EV_NGROUPS && s == OSCAR_OK; gi++) {
        if (!qg[gi]) continue;
        ev_variant gv = *var;
        gv.group = 16 * (gi + 2); /* inverse of ev_group_index */
        memcpy(qg[gi] + (size_t)lo * row, orig + (size_t)lo * row, (size_t)(hi - lo) * row * sizeof *qg[gi]);
        s = fakequant_split(&gv, layer, which, n, h->Hkv, h->d, lo, hi, 1, h->threads, qg[gi]);
    }
    if (s == OSCAR_OK && any) ev_storage_apply(st, layer, which, lo, hi, orig, (const float *const *)qg, buf, &h->kept);
    /* bits=: those heads' rows coded again from the bf16 rows at their code width (out= is refused with it) */
    for (int kv = 0; kv < h->Hkv && s == OSCAR_OK; kv++) {
        const int b = ev_storage_bits_of(st, layer, kv, which);
        if (!b) continue;
        const int g0 = ev_storage_group_of(st, layer, kv, which), g = g0 ? g0 : (var->group ? var->group : h->d);
        for (int p = lo; p < hi; p++)
            memcpy(buf + (size_t)p * row + (size_t)kv * h->d, orig + (size_t)p * row + (size_t)kv * h->d,
                   (size_t)h->d * sizeof *buf);
        if (ev_fakequant_bits(var->params, layer, kv, which, b, g, h->Hkv, h->d, lo, hi, buf) != 0) {
            fprintf(stderr, "oscar-eval: %s, layer %d: the %d-bit fake-quant of KV head %d failed: %s\n", var->name,
                    layer, b, kv, oscar_last_error());
            s = OSCAR_ERR_INVALID_ARGUMENT;
        }
    }
    free(orig);
    for (int gi = 0; gi < EV_NGROUPS; gi++) free(qg[gi]);
    return s;
}

/* oe_kv_quant_fn: copies K/V (the engine reads the quantized copies only in
 * the 2-bit region, but multiplies whole buffers, so every row must be
 * finite), rounds the region to bf16 as the cache's input dtype does, and
 * quantize-dequantizes exactly the rows some query reads in 2 bits:
 * S0 <= p <= n - 1 - W. */
static oscar_status kv_hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq)
{
    ev_hook *h = user;
    const ev_variant *var = h->var;
    size_t row = (size_t)h->Hkv * (size_t)h->d, all = (size_t)n * row;
    double t0 = now_s();
    memcpy(kq, k, all * sizeof *kq);
    memcpy(vq, v, all * sizeof *vq);
    int lo = var->sink, hi = n - var->recent; /* exclusive */
    if (hi > lo) {
        for (size_t i = (size_t)lo * row; i < (size_t)hi * row; i++) {
            kq[i] = oe_round_bf16(kq[i]);
            vq[i] = oe_round_bf16(vq[i]);
        }
        if (var->only_layer >= 0 && layer != var->only_layer) {
            h->hook_s += now_s() - t0;
            return OSCAR_OK; /* this layer stays bf16 */
        }
        int hik = hi, align = 1;
        if (var->method == OSCAR_METHOD_KIVI2) {
            /* KIVI keys: groups of 32 tokens from S0; the tail of < 32 rows
             * stays bf16, like KIVI's full-precision residual. */
            hik = lo + (hi - lo) / 32 * 32;
            align = 32;
        }
        if (var->storage) {
            oscar_status s = storage_quant(h, layer, n, lo, hi, kq, OSCAR_K);
            if (s == OSCAR_OK) s = storage_quant(h, layer, n, lo, hi, vq, OSCAR_V);
            if (s != OSCAR_OK) return s;
            h->hook_s += now_s() - t0;
            return OSCAR_OK;
        }
        oscar_status s = fakequant_split(var, layer, OSCAR_K, n, h->Hkv, h->d, lo, hik, align, h->threads, kq);
        if (s == OSCAR_OK) s = fakequant_split(var, layer, OSCAR_V, n, h->Hkv, h->d, lo, hi, 1, h->threads, vq);
        if (s != OSCAR_OK) return s;
    }
    h->hook_s += now_s() - t0;
    return OSCAR_OK;
}

/* ------------------------------------------------------------ scoring */
/* Reference rows: p_bf16 (probabilities), -H(p_bf16), argmax, its NLL. */
typedef struct ref_rows {
    float *p;        /* [n][vocab] */
    double *neg_ent; /* sum p log p per row */
    int *argmax;
} ref_rows;

static void ref_prepare(ref_rows *r, const float *logits, int vocab, int r0, int r1, const uint32_t *tok,
                        ev_stats *st)
{
    for (int i = r0; i < r1; i++) {
        const float *l = logits + (size_t)i * vocab;
        float *p = r->p + (size_t)i * vocab;
        double lse = oe_logsumexp(l, vocab, &r->argmax[i]);
        double ne = 0.0;
        for (int j = 0; j < vocab; j++) {
            double lp = (double)l[j] - lse;
            p[j] = (float)exp(lp);
            ne += (double)p[j] * lp;
        }
        r->neg_ent[i] = ne;
        st->nll += lse - (double)l[tok[i + 1]];
        st->top1 += 1;
        st->scored += 1;
    }
}

/* KL(p_ref || p_m) = sum p_ref log p_ref - sum p_ref l_m + lse_m (sum p_ref = 1). */
static void score_rows(const ref_rows *r, const float *logits, int vocab, int r0, int r1, const uint32_t *tok,
                       ev_stats *st)
{
    for (int i = r0; i < r1; i++) {
        const float *l = logits + (size_t)i * vocab;
        const float *p = r->p + (size_t)i * vocab;
        int am;
        double lse = oe_logsumexp(l, vocab, &am);
        double dot = 0.0;
        for (int j = 0; j < vocab; j++) dot += (double)p[j] * (double)l[j];
        double kl = r->neg_ent[i] - dot + lse;
        st->kl += kl > 0.0 ? kl : 0.0; /* rounding can leave -1e-9 */
        st->nll += lse - (double)l[tok[i + 1]];
        st->top1 += am == r->argmax[i];
        st->scored += 1;
    }
}

/* Retrieval: the second copy's predictions are right when the argmax is the
 * next token of the copy. */
static void score_retrieval(const float *logits, int vocab, int r0, int r1, const uint32_t *tok, ev_stats *st)
{
    for (int i = r0; i < r1; i++) {
        int am;
        (void)oe_logsumexp(logits + (size_t)i * vocab, vocab, &am);
        st->ret_correct += (uint32_t)am == tok[i + 1];
        st->ret_total += 1;
    }
}

/* Key-value lookup: a query is right when the argmax predicts every digit of its answer. */
static void score_task(const float *logits, int vocab, const ev_job *J, ev_stats *st)
{
    for (int q = 0; q < EV_TASK_FACTS; q++) {
        int right = 1;
        for (int i = J->answer_rows[q]; i < J->answer_rows[q] + EV_TASK_ANSWER_LEN; i++) {
            int am;
            (void)oe_logsumexp(logits + (size_t)i * vocab, vocab, &am);
            right &= (uint32_t)am == J->tokens[i + 1];
            if (i == J->answer_rows[q]) st->task_first += right;
        }
        st->task_correct += right;
        st->task_total += 1;
    }
}

/* ------------------------------------------------------------ workers */
typedef struct worker {
    ev_run *run;
    oe_ctx *ctx;
    float *logits;
    ref_rows ref;
    ev_hook hook;
    oscar_status st;
    char err[600];
} worker;

static oscar_status run_job(worker *w, int job)
{
    ev_run *R = w->run;
    const ev_job *J = &R->jobs[job];
    const int vocab = R->vocab;
    double t0 = now_s();
    oe_forward_options o;
    oe_forward_options_default(&o);
    o.kv_bf16 = 1;
    oscar_status s = oe_forward(w->ctx, J->tokens, J->n, &o, w->logits);
    if (s != OSCAR_OK) return s;
    ev_stats *row = R->stats + (size_t)job * R->nvar;
    for (int v = 0; v < R->nvar; v++) memset(&row[v], 0, sizeof row[v]);
    int ref_v = R->ref_index;
    if (J->task) {
        score_task(w->logits, vocab, J, &row[ref_v]);
    } else if (J->retrieval) {
        score_retrieval(w->logits, vocab, J->r0, J->r1, J->tokens, &row[ref_v]);
        ev_stats base = {0};
        score_retrieval(w->logits, vocab, J->b0, J->b1, J->tokens, &base);
        row[ref_v].base_correct = base.ret_correct;
        row[ref_v].base_total = base.ret_total;
    } else ref_prepare(&w->ref, w->logits, vocab, J->r0, J->r1, J->tokens, &row[ref_v]);
    row[ref_v].seconds += now_s() - t0;
    for (int v = 0; v < R->nvar; v++) {
        const ev_variant *var = &R->vars[v];
        if (v == ref_v || var->same_as >= 0) continue;
        double t1 = now_s();
        w->hook.var = var;
        w->hook.hook_s = 0.0;
        w->hook.kept = 0;
        o.kv_quant = kv_hook;
        o.kv_quant_user = &w->hook;
        o.sink_tokens = var->sink;
        o.recent_tokens = var->recent;
        o.chunk_tokens = R->chunk;
        s = oe_forward(w->ctx, J->tokens, J->n, &o, w->logits);
        if (s != OSCAR_OK) return s;
        if (J->task) score_task(w->logits, vocab, J, &row[v]);
        else if (J->retrieval) score_retrieval(w->logits, vocab, J->r0, J->r1, J->tokens, &row[v]);
        else score_rows(&w->ref, w->logits, vocab, J->r0, J->r1, J->tokens, &row[v]);
        row[v].seconds += now_s() - t1;
        row[v].hook_seconds += w->hook.hook_s;
        row[v].kept += w->hook.kept;
    }
    return OSCAR_OK;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    ev_run *R = w->run;
    for (;;) {
        int job = atomic_fetch_add(&R->next_job, 1);
        if (job >= R->njobs || atomic_load(&R->failed)) break;
        double t0 = now_s();
        oscar_status s = run_job(w, job);
        if (s != OSCAR_OK) {
            w->st = s;
            snprintf(w->err, sizeof w->err, "%s", oe_last_error());
            atomic_store(&R->failed, 1);
            break;
        }
        int done = atomic_fetch_add(&R->done_jobs, 1) + 1;
        pthread_mutex_lock(&R->log_mu);
        fprintf(stderr, "oscar-eval: job %d/%d (%s %d) done in %.1f s, %.0f s elapsed\n", done, R->njobs,
                R->jobs[job].task ? "lookup document" : R->jobs[job].retrieval ? "retrieval trial" : "window",
                R->jobs[job].index, now_s() - t0,
                now_s() - R->t_start);
        pthread_mutex_unlock(&R->log_mu);
    }
    return NULL;
}

oscar_status ev_execute(ev_run *R, int workers, int hook_threads, char *err, size_t errlen)
{
    if (workers < 1) workers = 1;
    if (workers > R->njobs) workers = R->njobs;
    worker *w = calloc((size_t)workers, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory for %d workers", workers);
        return OSCAR_ERR_OUT_OF_MEMORY;
    }
    oscar_status s = OSCAR_OK;
    size_t cells = (size_t)R->ctx * (size_t)R->vocab;
    int made = 0;
    for (; made < workers; made++) {
        worker *x = &w[made];
        x->run = R;
        x->hook = (ev_hook){.Hkv = R->Hkv, .d = R->d, .threads = hook_threads};
        x->logits = malloc(cells * sizeof(float));
        x->ref.p = malloc(cells * sizeof(float));
        x->ref.neg_ent = malloc((size_t)R->ctx * sizeof(double));
        x->ref.argmax = malloc((size_t)R->ctx * sizeof(int));
        if (!x->logits || !x->ref.p || !x->ref.neg_ent || !x->ref.argmax) {
            snprintf(err, errlen, "out of memory for the logits of worker %d (2 x %zu floats)", made, cells);
            s = OSCAR_ERR_OUT_OF_MEMORY;
            made++;
            break;
        }
        if ((s = oe_ctx_create(R->model, R->ctx, &x->ctx)) != OSCAR_OK) {
            snprintf(err, errlen, "%s", oe_last_error());
            made++;
            break;
        }
    }
    if (s == OSCAR_OK) {
        pthread_t tid[EV_MAX_THREADS];
        int started[EV_MAX_THREADS] = {0};
        for (int i = 1; i < workers; i++) started[i] = pthread_create(&tid[i], NULL, worker_main, &w[i]) == 0;
        worker_main(&w[0]);
        for (int i = 1; i < workers; i++)
            if (started[i]) pthread_join(tid[i], NULL);
        for (int i = 0; i < workers; i++)
            if (w[i].st != OSCAR_OK) {
                s = w[i].st;
                snprintf(err, errlen, "%s", w[i].err);
                break;
            }
        if (s == OSCAR_OK && atomic_load(&R->done_jobs) != R->njobs) {
            s = OSCAR_ERR_INTERNAL;
            snprintf(err, errlen, "only %d of %d jobs ran (no worker thread could start?)",
                     atomic_load(&R->done_jobs), R->njobs);
        }
    }
    for (int i = 0; i < made; i++) {
        oe_ctx_free(w[i].ctx);
        free(w[i].logits);
        free(w[i].ref.p);
        free(w[i].ref.neg_ent);
        free(w[i].ref.argmax);
    }
    free(w);
    (void)cpu_s;
    return s;
}

double ev_cpu_seconds(void) { return cpu_s(); }
double ev_now(void) { return now_s(); }
