/* fp32 causal forward over one window. Projections and attention are
 * sgemm calls on buffers owned by the context, so a window costs no
 * allocation. Attention runs per (query head, block of query rows): the
 * block only looks at keys up to its last row, which halves the work of a
 * causal window; blocks are shared out over a few pthreads, each calling a
 * single-threaded sgemm. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_internal.h"
#include "kernels.h"

#define OE_QBLOCK 64
#define OE_MAX_THREADS 16

typedef struct attn_thread {
    float *s, *sq;  /* scores [QBLOCK][max_n], full and quantized keys */
    float inv_sum[OE_QBLOCK]; /* 1 / softmax denominator per query row */
} attn_thread;

struct oe_ctx {
    const oe_model *m;
    int max_n;
    int nthreads;
    float *x, *h;            /* [n][hidden] */
    float *q, *k, *v;        /* [n][Hq d], [n][Hkv d] */
    float *kq, *vq;          /* quantized copies from the hook */
    float *attn;             /* [n][Hq d] */
    float *gate, *up;        /* [n][inter] */
    float *rope_cos, *rope_sin; /* [max_n][d/2] */
    attn_thread th[OE_MAX_THREADS];
    const oe_kernels *kern;
    int profile;             /* OE_PROFILE=1: per-phase times on stderr at free */
    double t_phase[6];
};

static const char *k_phase[6] = {"qkv+norm+rope", "attention", "o_proj", "mlp", "lm_head", "other"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void oe_forward_options_default(oe_forward_options *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->sink_tokens = 64;
    o->recent_tokens = 256;
    o->last_layer = -1;
}

void oe_ctx_free(oe_ctx *c)
{
    if (!c) return;
    if (c->profile)
        for (int i = 0; i < 6; i++) fprintf(stderr, "oe profile: %-14s %8.3f s\n", k_phase[i], c->t_phase[i]);
    float *bufs[] = {c->x, c->h, c->q, c->k, c->v, c->kq, c->vq, c->attn, c->gate, c->up, c->rope_cos,
                     c->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    for (int t = 0; t < OE_MAX_THREADS; t++) {
        free(c->th[t].s);
        free(c->th[t].sq);
    }
    free(c);
}

static float *alloc_f(size_t n, int *fail)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) *fail = 1;
    return p;
}

oscar_status oe_threads(int *n)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *n = ncpu < 1 ? 1 : ncpu > OE_MAX_THREADS ? OE_MAX_THREADS : (int)ncpu;
    /* A value that is not a whole number >= 1 ("abc", "-2", "4x") was ignored without a word (all
     * cores), and oscar-eval reported atoi's reading of it (0, -2) as the threads it ran with. */
    const char *env = getenv("OE_THREADS");
    if (!env || !env[0]) return OSCAR_OK;
    char *end;
    errno = 0;
    const long v = strtol(env, &end, 10);
    if (errno == ERANGE && v > 0) return *n = OE_MAX_THREADS, OSCAR_OK; /* a huge count: the cap */
    if (errno || end == env || *end || v < 1)
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                            "OE_THREADS='%.40s' is not a whole number >= 1: set the engine's threads (at most %d are "
                            "used) or unset it for one per core",
                            env, OE_MAX_THREADS);
    *n = v > OE_MAX_THREADS ? OE_MAX_THREADS : (int)v;
    return OSCAR_OK;
}

oscar_status oe_ctx_create(const oe_model *m, int max_tokens, oe_ctx **out)
{
    if (!m || !out) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_ctx_create: NULL argument");
    *out = NULL;
    if (max_tokens <= 0 || max_tokens > (1 << 20))
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_ctx_create: max_tokens %d must be in 1..%d",
                            max_tokens, 1 << 20);
    const oe_config *cf = &m->cfg;
    if (cf->sliding_window > 0 && max_tokens > cf->sliding_window)
        return oe_set_error(OSCAR_ERR_UNSUPPORTED, "oe_ctx_create: windows of %d tokens exceed the model's "
                            "sliding_window %d; the engine runs full causal attention: use windows of at most %d",
                            max_tokens, cf->sliding_window, cf->sliding_window);
    oe_ctx *c = calloc(1, sizeof *c);
    if (!c) return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_ctx_create: out of memory");
    c->m = m;
    c->max_n = max_tokens;
    c->kern = oe_kernels_get();
    c->profile = getenv("OE_PROFILE") != NULL;
    oscar_status ts = oe_threads(&c->nthreads);
    if (ts != OSCAR_OK) {
        free(c);
        return ts;
    }
    size_t n = (size_t)max_tokens, d = (size_t)cf->head_dim, qd = (size_t)cf->num_q_heads * d,
           kvd = (size_t)cf->num_kv_heads * d;
    int fail = 0;
    c->x = alloc_f(n * (size_t)cf->hidden, &fail);
    c->h = alloc_f(n * (size_t)cf->hidden, &fail);
    c->q = alloc_f(n * qd, &fail);
    c->k = alloc_f(n * kvd, &fail);
    c->v = alloc_f(n * kvd, &fail);
    c->kq = alloc_f(n * kvd, &fail);
    c->vq = alloc_f(n * kvd, &fail);
    c->attn = alloc_f(n * qd, &fail);
    c->gate = alloc_f(n * (size_t)cf->intermediate, &fail);
    c->up = alloc_f(n * (size_t)cf->intermediate, &fail);
    c->rope_cos = alloc_f(n * d / 2, &fail);
    c->rope_sin = alloc_f(n * d / 2, &fail);
    size_t blk = n < OE_QBLOCK ? n : OE_QBLOCK;
    for (int t = 0; t < c->nthreads; t++) {
        c->th[t].s = alloc_f(blk * n, &fail);
        c->th[t].sq = alloc_f(blk * n, &fail);
    }
    if (fail) {
        oe_ctx_free(c);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_ctx_create: out of memory for a %d-token window; use "
                            "a shorter window", max_tokens);
    }
    /* Same recipe as transformers: inv_freq in fp32, angle = pos * inv_freq
     * in fp32, cos/sin of that fp32 angle. */
    float *inv = malloc(d / 2 * sizeof *inv), af = 1.0f;
    if (!inv) {
        oe_ctx_free(c);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_ctx_create: out of memory");
    }
    oe_rope_inv_freq(cf, inv, &af); /* RoPE scaling (llama3, yarn, ...) included; af: YaRN's cos/sin factor */
    for (size_t i = 0; i < d / 2; i++) {
        for (size_t p = 0; p < n; p++) {
            float ang = (float)p * inv[i];
            c->rope_cos[p * (d / 2) + i] = (float)cos((double)ang) * af;
            c->rope_sin[p * (d / 2) + i] = (float)sin((double)ang) * af;
        }
    }
    free(inv);
    *out = c;
    return OSCAR_OK;
}

/* out[i][:] = x[i][:] * rsqrt(mean(x^2) + eps) * w; rows of length len, stride ld. */
static void rmsnorm_rows(float *out, const float *x, const float *w, int rows, int len, int ld, double eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ld;
        float *orow = out + (size_t)r * ld;
        double ss = 0.0;
        for (int i = 0; i < len; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / len + eps));
        for (int i = 0; i < len; i++) orow[i] = w[i] * (xr[i] * inv);
    }
}

/* Runs fn(arg, part, parts) for part = 0..parts-1 on parts threads (the
 * caller is part 0). OpenBLAS is kept single-threaded during the forward,
 * so the engine's own threads own the cores (no spinning BLAS workers). */
typedef void (*par_fn)(void *arg, int part, int parts);
typedef struct par_arg {
    par_fn fn;
    void *arg;
    int part, parts;
} par_arg;

static void *par_main(void *p)
{
    par_arg *a = p;
    a->fn(a->arg, a->part, a->parts);
    return NULL;
}

static void par_run(int parts, par_fn fn, void *arg)
{
    pthread_t tid[OE_MAX_THREADS];
    par_arg a[OE_MAX_THREADS];
    int started[OE_MAX_THREADS] = {0};
    for (int t = 1; t < parts; t++) {
        a[t] = (par_arg){fn, arg, t, parts};
        started[t] = pthread_create(&tid[t], NULL, par_main, &a[t]) == 0;
        if (!started[t]) fn(arg, t, parts); /* no thread: do that part here */
    }
    fn(arg, 0, parts);
    for (int t = 1; t < parts; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}

typedef struct linear_job {
    float *y;
    const float *x, *w, *b;
    int n, in, outd;
    float beta;
} linear_job;

static void linear_part(void *p, int part, int parts)
{
    linear_job *j = p;
    int r0 = (int)((int64_t)j->n * part / parts), r1 = (int)((int64_t)j->n * (part + 1) / parts);
    if (r1 <= r0) return;
    float *y = j->y + (size_t)r0 * j->outd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, j->outd, j->in, 1.0f,
                j->x + (size_t)r0 * j->in, j->in, j->w, j->in, j->beta, y, j->outd);
    if (j->b)
        for (int i = 0; i < r1 - r0; i++)
            for (int c = 0; c < j->outd; c++) y[(size_t)i * j->outd + c] += j->b[c];
}

/* Y[n][out] = X[n][in] W^T (+ b) (+ Y when accumulate), rows split over threads. */
static void linear_acc(const oe_ctx *c, float *y, const float *x, const float *w, const float *b, int n, int in,
                       int outd, int accumulate)
{
    linear_job j = {y, x, w, b, n, in, outd, accumulate ? 1.0f : 0.0f};
    int parts = n >= 2 * c->nthreads ? c->nthreads : 1;
    par_run(parts, linear_part, &j);
}

static void linear(const oe_ctx *c, float *y, const float *x, const float *w, const float *b, int n, int in,
                   int outd)
{
    linear_acc(c, y, x, w, b, n, in, outd, 0);
}

/* Rotate-half RoPE on [n][heads][d] in place. */
static void rope(const oe_ctx *c, float *x, int n, int heads, int d)
{
    int h2 = d / 2;
    for (int p = 0; p < n; p++) {
        const float *cs = c->rope_cos + (size_t)p * h2, *sn = c->rope_sin + (size_t)p * h2;
        for (int hh = 0; hh < heads; hh++) {
            float *v = x + ((size_t)p * heads + hh) * d;
            for (int i = 0; i < h2; i++) {
                float a = v[i], b = v[i + h2];
                v[i] = a * cs[i] - b * sn[i];
                v[i + h2] = b * cs[i] + a * sn[i];
            }
        }
    }
}

typedef struct attn_job {
    oe_ctx *c;
    int n, Hq, Hkv, d;
    int use_q;          /* quantized copies present */
    int S0, W;
    int chunk; /* > 0: chunked schedule (oe_forward_options.chunk_tokens) */
    int chunk_limit; /* positions >= this are token by token (n: the whole window chunked) */
    int nblocks;
    atomic_int next;
} attn_job;

/* One (head, query block) task. */
static void attn_task(attn_job *j, attn_thread *th, int task)
{
    oe_ctx *c = j->c;
    const int d = j->d, Hq = j->Hq, Hkv = j->Hkv, n = j->n;
    /* Largest blocks first so the tail of the schedule is short. */
    int blk = j->nblocks - 1 - task / Hq, h = task % Hq;
    int g = h / (Hq / Hkv);
    int r0 = blk * OE_QBLOCK, r1 = r0 + OE_QBLOCK < n ? r0 + OE_QBLOCK : n, nb = r1 - r0, nk = r1;
    const int ldq = Hq * d, ldk = Hkv * d;
    const float scale = (float)(1.0 / sqrt((double)d));
    const float *Q = c->q + (size_t)r0 * ldq + (size_t)h * d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, d, scale, Q, ldq, c->k + (size_t)g * d, ldk,
                0.0f, th->s, nk);
    if (j->use_q)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, d, scale, Q, ldq, c->kq + (size_t)g * d,
                    ldk, 0.0f, th->sq, nk);
    const oe_kernels *kn = c->kern;
    for (int i = 0; i < nb; i++) {
        const int t = r0 + i;
        float *s = th->s + (size_t)i * nk, *sq = th->sq + (size_t)i * nk;
        /* Keys in [qlo, qhi] read the quantized copy (the 2-bit region):
         * merge their scores into s, softmax once, then split the
         * probabilities back so P V + Pq Vq reads each key from one copy. */
        int e = t + 1; /* the cache length query t sees: its own, or its chunk's end */
        if (j->chunk > 0 && t < j->chunk_limit) {
            e = (t / j->chunk + 1) * j->chunk;
            if (e > j->chunk_limit) e = j->chunk_limit;
        }
        int qlo = j->S0, qhi = e - 1 - j->W;
        if (qhi > t) qhi = t;
        int has_q = j->use_q && qlo <= qhi;
        if (has_q) memcpy(s + qlo, sq + qlo, (size_t)(qhi - qlo + 1) * sizeof *s);
        /* Rows stay unnormalized; the output row is scaled after P V. */
        th->inv_sum[i] = 1.0f / kn->softmax_exp(s, t + 1);
        memset(s + t + 1, 0, (size_t)(nk - t - 1) * sizeof *s);
        if (j->use_q) {
            memset(sq, 0, (size_t)nk * sizeof *sq);
            if (has_q) {
                memcpy(sq + qlo, s + qlo, (size_t)(qhi - qlo + 1) * sizeof *s);
                memset(s + qlo, 0, (size_t)(qhi - qlo + 1) * sizeof *s);
            }
        }
    }
    float *O = c->attn + (size_t)r0 * ldq + (size_t)h * d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, d, nk, 1.0f, th->s, nk, c->v + (size_t)g * d, ldk,
                0.0f, O, ldq);
    if (j->use_q)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, d, nk, 1.0f, th->sq, nk,
                    c->vq + (size_t)g * d, ldk, 1.0f, O, ldq);
    for (int i = 0; i < nb; i++) kn->scale(O + (size_t)i * ldq, d, th->inv_sum[i]);
}

typedef struct attn_worker {
    attn_job *j;
    attn_thread *th;
} attn_worker;

static void *attn_worker_main(void *arg)
{
    attn_worker *w = arg;
    int total = w->j->nblocks * w->j->Hq;
    for (;;) {
        int t = atomic_fetch_add(&w->j->next, 1);
        if (t >= total) break;
        attn_task(w->j, w->th, t);
    }
    return NULL;
}

static oscar_status attention(oe_ctx *c, int n, int use_q, int S0, int W, int chunk, int chunk_limit)
{
    const oe_config *cf = &c->m->cfg;
    attn_job j = {.c = c, .n = n, .Hq = cf->num_q_heads, .Hkv = cf->num_kv_heads, .d = cf->head_dim,
                  .use_q = use_q, .S0 = S0, .W = W, .chunk = chunk,
                  .chunk_limit = chunk_limit > 0 && chunk_limit < n ? chunk_limit : n,
                  .nblocks = (n + OE_QBLOCK - 1) / OE_QBLOCK};
    atomic_init(&j.next, 0);
    int nt = c->nthreads;
    if (nt > j.nblocks * j.Hq) nt = j.nblocks * j.Hq;
    attn_worker w[OE_MAX_THREADS];
    pthread_t tid[OE_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        w[t] = (attn_worker){&j, &c->th[t]};
        if (pthread_create(&tid[t], NULL, attn_worker_main, &w[t]) != 0) break;
        started++;
    }
    w[0] = (attn_worker){&j, &c->th[0]};
    attn_worker_main(&w[0]);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    return OSCAR_OK;
}

static void round_bf16_buf(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = oe_round_bf16(x[i]);
}

static oscar_status forward_impl(oe_ctx *c, const uint32_t *tokens, int n, const oe_forward_options *opt,
                                 float *logits)
{
    if (!c || !tokens) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: NULL context or tokens");
    if (n <= 0) return oe_set_error(OSCAR_ERR_EMPTY, "oe_forward: the window holds no tokens");
    if (n > c->max_n)
        return oe_set_error(OSCAR_ERR_TOO_LONG, "oe_forward: %d tokens exceed the context's max_tokens %d; "
                            "create the context with a larger window", n, c->max_n);
    oe_forward_options def;
    if (!opt) {
        oe_forward_options_default(&def);
        opt = &def;
    }
    const oe_model *m = c->m;
    const oe_config *cf = &m->cfg;
    if (opt->last_layer < -1 || opt->last_layer >= cf->num_layers)
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: last_layer %d must be -1 or in 0..%d",
                            opt->last_layer, cf->num_layers - 1);
    if (opt->chunk_tokens < 0 || opt->chunk_limit < 0)
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: chunk_tokens %d and chunk_limit %d must be >= 0 "
                            "(0: token by token; whole window chunked)", opt->chunk_tokens, opt->chunk_limit);
    if (opt->kv_quant && (opt->sink_tokens < 0 || opt->recent_tokens < 0))
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: sink_tokens %d and recent_tokens %d must "
                            "be >= 0", opt->sink_tokens, opt->recent_tokens);
    const int H = cf->hidden, d = cf->head_dim, Hq = cf->num_q_heads, Hkv = cf->num_kv_heads,
              FF = cf->intermediate, qd = Hq * d, kvd = Hkv * d;
    const int last = opt->last_layer < 0 ? cf->num_layers - 1 : opt->last_layer;
    const int want_logits = logits && !opt->skip_lm_head && last == cf->num_layers - 1;
    if (opt->first_layer < 0 || opt->first_layer > last || (opt->first_layer > 0 && !opt->x_in))
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: first_layer %d must be in 0..%d, with x_in "
                            "when > 0", opt->first_layer, last);
    if (opt->x_save && (opt->save_layer < opt->first_layer || opt->save_layer > last))
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: save_layer %d must be in %d..%d",
                            opt->save_layer, opt->first_layer, last);
    for (int i = 0; i < n; i++) {
        if (tokens[i] >= (uint32_t)cf->vocab)
            return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_forward: token %d is id %u, outside the "
                                "vocabulary of %d; the token file does not belong to this model", i,
                                tokens[i], cf->vocab);
        if (opt->first_layer == 0)
            memcpy(c->x + (size_t)i * H, m->embed + (size_t)tokens[i] * H, (size_t)H * sizeof(float));
    }
    if (opt->first_layer > 0) memcpy(c->x, opt->x_in, (size_t)n * (size_t)H * sizeof(float));
    double t = c->profile ? now_s() : 0;
#define PHASE(i)                                                                                   \
    do {                                                                                           \
        if (c->profile) {                                                                          \
            double t1 = now_s();                                                                   \
            c->t_phase[i] += t1 - t;                                                               \
            t = t1;                                                                                \
        }                                                                                          \
    } while (0)
    for (int L = opt->first_layer; L <= last; L++) {
        const oe_layer *l = &m->layers[L];
        if (opt->x_save && L == opt->save_layer) memcpy(opt->x_save, c->x, (size_t)n * (size_t)H * sizeof(float));
        rmsnorm_rows(c->h, c->x, l->attn_norm, n, H, H, cf->rms_eps);
        linear(c, c->q, c->h, l->wq, l->bq, n, H, qd);
        linear(c, c->k, c->h, l->wk, l->bk, n, H, kvd);
        linear(c, c->v, c->h, l->wv, l->bv, n, H, kvd);
        if (l->q_norm) {
            rmsnorm_rows(c->q, c->q, l->q_norm, n * Hq, d, d, cf->rms_eps);
            rmsnorm_rows(c->k, c->k, l->k_norm, n * Hkv, d, d, cf->rms_eps);
        }
        rope(c, c->q, n, Hq, d);
        rope(c, c->k, n, Hkv, d);
        PHASE(0);
        if (opt->observer) {
            oscar_status s = opt->observer(opt->observer_user, L, n, c->q, c->k, c->v);
            if (s != OSCAR_OK)
                return oe_set_error(s, "oe_forward: the observer stopped the forward at layer %d (status %d)",
                                    L, (int)s);
        }
        /* Nothing reads the rest of the last layer when no logits are wanted. */
        if (L == last && !want_logits) break;
        int use_q = 0;
        if (opt->kv_quant) {
            oscar_status s = opt->kv_quant(opt->kv_quant_user, L, n, c->k, c->v, c->kq, c->vq);
            if (s != OSCAR_OK)
                return oe_set_error(s, "oe_forward: the KV quantization hook failed at layer %d (status %d)",
                                    L, (int)s);
            use_q = 1;
        }
        if (opt->kv_bf16) {
            round_bf16_buf(c->k, (size_t)n * kvd);
            round_bf16_buf(c->v, (size_t)n * kvd);
        }
        PHASE(5);
        attention(c, n, use_q, opt->sink_tokens, opt->recent_tokens, opt->chunk_tokens, opt->chunk_limit);
        PHASE(1);
        /* x += attn Wo^T: accumulate straight into the residual. */
        linear_acc(c, c->x, c->attn, l->wo, l->bo, n, qd, H, 1);
        PHASE(2);
        rmsnorm_rows(c->h, c->x, l->mlp_norm, n, H, H, cf->rms_eps);
        linear(c, c->gate, c->h, l->w_gate, NULL, n, H, FF);
        linear(c, c->up, c->h, l->w_up, NULL, n, H, FF);
        c->kern->swiglu(c->gate, c->up, (long)n * FF);
        linear_acc(c, c->x, c->gate, l->w_down, NULL, n, FF, H, 1);
        PHASE(3);
    }
    if (want_logits) {
        rmsnorm_rows(c->h, c->x, m->final_norm, n, H, H, cf->rms_eps);
        linear(c, logits, c->h, m->lm_head, NULL, n, H, cf->vocab);
        PHASE(4);
        /* A NaN weight (or a NaN that grew on the way) must not turn into a
         * perplexity of nan or a KL of 0 downstream: refuse it here. */
        size_t nl = (size_t)n * (size_t)cf->vocab;
        for (size_t i = 0; i < nl; i++)
            if (!isfinite(logits[i]))
                return oe_set_error(OSCAR_ERR_NONFINITE,
                                    "oe_forward: logit %zu of token %zu is %s: the model's weights or config "
                                    "produce non-finite values (check the checkpoint for NaN/Inf weights)",
                                    i % (size_t)cf->vocab, i / (size_t)cf->vocab, isnan(logits[i]) ? "NaN" : "Inf");
    }
#undef PHASE
    return OSCAR_OK;
}

oscar_status oe_forward(oe_ctx *c, const uint32_t *tokens, int n, const oe_forward_options *opt, float *logits)
{
    /* The engine splits work over its own threads; a multi-threaded BLAS
     * under them would only spin against them. Restored on return. */
    int blas_threads = openblas_get_num_threads();
    if (blas_threads != 1) openblas_set_num_threads(1);
    oscar_status s = forward_impl(c, tokens, n, opt, logits);
    if (blas_threads != 1) openblas_set_num_threads(blas_threads);
    return s;
}
