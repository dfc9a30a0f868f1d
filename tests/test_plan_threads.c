/* Several threads on one plan (docs/API.md, Threads): each thread decodes
 * its own cache with its own workspace, and every output must equal the one
 * the same thread's data gives when run alone. Run on every backend this
 * build can reach (cpu always; opencl when the plugin runs here, required
 * when OSCAR_REQUIRE_BACKENDS names it). The OpenCL plugin's kernels are
 * shared by the plan: without its launch lock two threads' clSetKernelArg
 * calls interleave and a launch runs with the other thread's arguments. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"
#include "runtime_or_skip.h"

#define SEQ 3
#define LEN 300
#define ITERS 150

typedef struct worker {
    oscar_plan *plan;
    oscar_runtime *rt;
    oscar_layout_desc l;
    void *pages, *windows, *ws, *q, *out, *lens, *slots, *bt, *cu, *k, *v;
    size_t ws_bytes, out_bytes;
    int32_t pages_per_seq;
    unsigned char *want;
    int mismatches;
    oscar_status st;
} worker;

/* The threads' layout: d 64, 4 q heads on 2 KV heads, page 16, sink 16, recent 32. */
static oscar_layout_desc small_layout(int group, oscar_method method) {
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = 64;
    l.group = group;
    l.num_q_heads = 4;
    l.num_kv_heads = 2;
    l.page_size = 16;
    l.sink = 16;
    l.recent = 32;
    l.max_seq_len = LEN;
    l.method = method;
    return l;
}

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void *upload(oscar_runtime *rt, const void *src, size_t n) {
    void *b = NULL;
    cr_assert_eq(oscar_buffer_alloc(rt, n, &b), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_buffer_write(rt, b, 0, src, n, NULL), OSCAR_OK, "%s", oscar_last_error());
    return b;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static uint16_t *random_bf16(size_t n, uint64_t *s) {
    uint16_t *x = malloc(n * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++) x[i] = bf16_of((float)((double)(rng_next(s) >> 11) / 9007199254740992.0) * 2.0f - 1.0f);
    return x;
}

/* One worker's cache: SEQ sequences of LEN tokens written by one append. */
static void worker_init(worker *w, oscar_runtime *rt, oscar_plan *plan, const oscar_layout_desc *l, uint64_t seed) {
    memset(w, 0, sizeof *w);
    w->rt = rt;
    w->plan = plan;
    w->l = *l;
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(l, &sz), OSCAR_OK);
    int64_t pps;
    cr_assert_eq(oscar_layout_pages_for(l, LEN, &pps), OSCAR_OK);
    w->pages_per_seq = (int32_t)pps;
    int32_t lens[SEQ], slots[SEQ], cu[SEQ + 1], bt[SEQ * 16];
    cr_assert(pps <= 16);
    for (int i = 0; i < SEQ; i++) {
        lens[i] = LEN;
        slots[i] = i;
        cu[i] = i * LEN;
        for (int j = 0; j < pps; j++) bt[i * pps + j] = i * (int32_t)pps + j;
    }
    cu[SEQ] = SEQ * LEN;
    cr_assert_eq(oscar_buffer_alloc(rt, sz.page_bytes * (size_t)(SEQ * pps + 1), &w->pages), OSCAR_OK);
    cr_assert_eq(oscar_buffer_alloc(rt, sz.window_slot_bytes * SEQ + 16, &w->windows), OSCAR_OK);
    cr_assert_eq(oscar_plan_workspace_bytes(plan, SEQ, LEN, &w->ws_bytes), OSCAR_OK);
    cr_assert_eq(oscar_buffer_alloc(rt, w->ws_bytes, &w->ws), OSCAR_OK);
    cr_assert_eq(oscar_plan_workspace_init(plan, w->ws, NULL), OSCAR_OK);
    w->lens = upload(rt, lens, sizeof lens);
    w->slots = upload(rt, slots, sizeof slots);
    w->bt = upload(rt, bt, sizeof(int32_t) * (size_t)(SEQ * pps));
    w->cu = upload(rt, cu, sizeof cu);
    size_t kvn = (size_t)SEQ * LEN * (size_t)l->num_kv_heads * (size_t)l->head_dim;
    size_t qn = (size_t)SEQ * (size_t)l->num_q_heads * (size_t)l->head_dim;
    uint16_t *k = random_bf16(kvn, &seed), *v = random_bf16(kvn, &seed), *q = random_bf16(qn, &seed);
    w->k = upload(rt, k, kvn * 2);
    w->v = upload(rt, v, kvn * 2);
    w->q = upload(rt, q, qn * 2);
    free(k);
    free(v);
    free(q);
    w->out_bytes = qn * 2;
    cr_assert_eq(oscar_buffer_alloc(rt, w->out_bytes, &w->out), OSCAR_OK);
    w->want = malloc(w->out_bytes);
    cr_assert(w->want);
    oscar_cache c = {w->pages, SEQ * (int32_t)pps + 1, w->windows, SEQ};
    oscar_batch b = {SEQ, w->lens, w->slots, w->bt, (int32_t)pps, LEN};
    cr_assert_eq(oscar_append(plan, 0, &c, &b, w->cu, SEQ * LEN, w->k, w->v, 0, w->ws, w->ws_bytes, NULL), OSCAR_OK,
                 "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_check(plan, w->ws, NULL), OSCAR_OK, "%s", oscar_last_error());
}

/* Zeroes the output and the workspace first: a launch that ran with another
 * thread's arguments must not hide behind the previous iteration's results. */
static oscar_status decode_once(worker *w, void *dst, const void *zeros) {
    oscar_status z = oscar_buffer_write(w->rt, w->out, 0, zeros, w->out_bytes, NULL);
    if (z == OSCAR_OK) z = oscar_buffer_write(w->rt, w->ws, 0, zeros, w->ws_bytes, NULL);
    if (z != OSCAR_OK) return z;
    oscar_cache c = {w->pages, SEQ * w->pages_per_seq + 1, w->windows, SEQ};
    oscar_batch b = {SEQ, w->lens, w->slots, w->bt, w->pages_per_seq, LEN};
    oscar_status s = oscar_decode(w->plan, 0, &c, &b, w->q, 0, w->out, 0, 0.0f, 0, w->ws, w->ws_bytes, NULL);
    if (s == OSCAR_OK) s = oscar_buffer_read(w->rt, dst, w->out, 0, w->out_bytes, NULL);
    return s;
}

static void *worker_run(void *arg) {
    worker *w = arg;
    unsigned char *got = malloc(w->out_bytes);
    void *zeros = calloc(1, w->ws_bytes > w->out_bytes ? w->ws_bytes : w->out_bytes);
    for (int it = 0; got && zeros && it < ITERS && w->st == OSCAR_OK; it++) {
        w->st = decode_once(w, got, zeros);
        if (w->st == OSCAR_OK && memcmp(got, w->want, w->out_bytes)) w->mismatches++;
    }
    free(got);
    free(zeros);
    return NULL;
}

static void worker_free(worker *w) {
    void *bufs[] = {w->pages, w->windows, w->ws, w->q, w->out, w->lens, w->slots, w->bt, w->cu, w->k, w->v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) oscar_buffer_free(w->rt, bufs[i]);
    free(w->want);
}

static void run_threads(const char *backend) {
    oscar_runtime *rt = rc_runtime_or_skip(backend);
    oscar_layout_desc l = small_layout(64, OSCAR_METHOD_QUAROT2);
    oscar_plan *plan;
    cr_assert_eq(oscar_plan_create(rt, &l, NULL, &plan), OSCAR_OK, "%s", oscar_last_error());
    enum { NT = 4 };
    worker w[NT];
    for (int t = 0; t < NT; t++) {
        worker_init(&w[t], rt, plan, &l, 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1));
        void *zeros = calloc(1, w[t].ws_bytes > w[t].out_bytes ? w[t].ws_bytes : w[t].out_bytes);
        cr_assert(zeros);
        cr_assert_eq(decode_once(&w[t], w[t].want, zeros), OSCAR_OK, "%s", oscar_last_error()); /* alone */
        free(zeros);
    }
    pthread_t th[NT];
    for (int t = 0; t < NT; t++) cr_assert_eq(pthread_create(&th[t], NULL, worker_run, &w[t]), 0);
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < NT; t++) {
        cr_expect_eq(w[t].st, OSCAR_OK, "%s thread %d: status %d", backend, t, (int)w[t].st);
        cr_expect_eq(w[t].mismatches, 0, "%s thread %d: %d of %d concurrent decodes differ from the same decode run "
                     "alone", backend, t, w[t].mismatches, ITERS);
        worker_free(&w[t]);
    }
    oscar_plan_destroy(plan);
    oscar_runtime_destroy(rt);
}

Test(plan_threads, cpu_threads_share_a_plan, .timeout = 300) { run_threads("cpu"); }
Test(plan_threads, opencl_threads_share_a_plan, .timeout = 300) { run_threads("opencl"); }
Test(plan_threads, cuda_threads_share_a_plan, .timeout = 300) { run_threads("cuda"); }

/* Threads that share nothing but the library: each creates its own runtime
 * (CPU and OpenCL side by side), parameters and plan, appends and decodes,
 * and meanwhile makes a call that fails with a message naming a value of its
 * own. Every thread's output must equal the one its data gives alone, and
 * oscar_last_error() must be this thread's message, never a neighbour's.
 * Criterion's asserts are main-thread only: the workers count what failed. */
typedef struct own_worker {
    pthread_barrier_t *start; /* all threads create their runtimes at once */
    oscar_runtime *shared_rt; /* set: use this runtime (its plans, buffers), not one of the thread's own */
    const char *backend;
    int id, rounds, bad_msgs, mismatches, skipped;
    oscar_status st;
    char why[512];
    unsigned char *want; /* the first round's output: later rounds must match it */
} own_worker;

#define OWN_FAIL(w, s)                                                                                 \
    do {                                                                                               \
        (w)->st = (s);                                                                                 \
        snprintf((w)->why, sizeof (w)->why, "%s line %d: %s", (w)->backend, __LINE__, oscar_last_error()); \
        goto out;                                                                                      \
    } while (0)
#define OWN_TRY(w, call)                                                                               \
    do {                                                                                               \
        oscar_status s_ = (call);                                                                      \
        if (s_ != OSCAR_OK) OWN_FAIL(w, s_);                                                           \
    } while (0)

/* A call that must fail with a message naming this thread's head_dim
 * (98 + 4 id: 2 more than a multiple of 4, never of 16) and leave that
 * message in place. */
static int own_error_is_mine(oscar_runtime *rt, int id) {
    oscar_layout_desc bad;
    oscar_layout_default(&bad);
    bad.head_dim = 98 + 4 * id;
    bad.group = bad.head_dim;
    oscar_plan *p = NULL;
    if (oscar_plan_create(rt, &bad, NULL, &p) == OSCAR_OK) {
        oscar_plan_destroy(p);
        return 0;
    }
    char want[32];
    snprintf(want, sizeof want, "head_dim %d", bad.head_dim);
    for (int spin = 0; spin < 200; spin++) /* neighbours fail meanwhile: the message must stay ours */
        if (!strstr(oscar_last_error(), want)) return 0;
    return 1;
}

static void *own_worker_run(void *arg) {
    own_worker *w = arg;
    oscar_runtime *rt = NULL;
    oscar_params *params = NULL;
    oscar_plan *plan = NULL;
    void *bufs[11] = {NULL};
    unsigned char *got = NULL;
    uint16_t *k = NULL, *v = NULL, *q = NULL;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = w->backend;
    pthread_barrier_wait(w->start);
    oscar_status s0 = w->shared_rt ? OSCAR_OK : oscar_runtime_create(&ro, &rt);
    if (w->shared_rt) rt = w->shared_rt;
    if (s0 != OSCAR_OK) {
        w->skipped = 1;
        snprintf(w->why, sizeof w->why, "%s", oscar_last_error());
        return NULL;
    }
    oscar_layout_desc l = small_layout(32, OSCAR_METHOD_OSCAR2);
    uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
    size_t kvn = (size_t)SEQ * LEN * (size_t)l.num_kv_heads * (size_t)l.head_dim;
    size_t qn = (size_t)SEQ * (size_t)l.num_q_heads * (size_t)l.head_dim, out_bytes = qn * 2;
    k = malloc(kvn * 2), v = malloc(kvn * 2), q = malloc(qn * 2); /* random_bf16 asserts: main thread only */
    got = malloc(out_bytes);
    w->want = malloc(out_bytes);
    if (!k || !v || !q || !got || !w->want) OWN_FAIL(w, OSCAR_ERR_OUT_OF_MEMORY);
    uint16_t *fill[3] = {k, v, q};
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < (a < 2 ? kvn : qn); i++)
            fill[a][i] = bf16_of((float)((double)(rng_next(&seed) >> 11) / 9007199254740992.0) * 2.0f - 1.0f);
    for (int round = 0; round < w->rounds; round++) { /* create, use and destroy everything each round */
        if (!own_error_is_mine(rt, w->id)) w->bad_msgs++;
        OWN_TRY(w, oscar_params_create_builtin(l.method, 1, l.num_q_heads, l.num_kv_heads, l.head_dim, &params));
        OWN_TRY(w, oscar_plan_create(rt, &l, params, &plan));
        oscar_layout_sizes sz;
        int64_t pps;
        size_t ws_bytes;
        OWN_TRY(w, oscar_layout_sizes_get(&l, &sz));
        OWN_TRY(w, oscar_layout_pages_for(&l, LEN, &pps));
        int32_t lens[SEQ], slots[SEQ], cu[SEQ + 1], bt[SEQ * 16];
        for (int i = 0; i < SEQ; i++) {
            lens[i] = LEN, slots[i] = i, cu[i] = i * LEN;
            for (int j = 0; j < pps; j++) bt[i * pps + j] = i * (int32_t)pps + j;
        }
        cu[SEQ] = SEQ * LEN;
        OWN_TRY(w, oscar_plan_workspace_bytes(plan, SEQ, LEN, &ws_bytes));
        const size_t sizes[11] = {sz.page_bytes * (size_t)(SEQ * pps + 1), sz.window_slot_bytes * SEQ + 16, ws_bytes,
                                  sizeof lens, sizeof slots, sizeof(int32_t) * (size_t)(SEQ * pps), sizeof cu,
                                  kvn * 2, kvn * 2, qn * 2, out_bytes};
        const void *src[11] = {NULL, NULL, NULL, lens, slots, bt, cu, k, v, q, NULL};
        for (int i = 0; i < 11; i++) {
            OWN_TRY(w, oscar_buffer_alloc(rt, sizes[i], &bufs[i]));
            if (src[i]) OWN_TRY(w, oscar_buffer_write(rt, bufs[i], 0, src[i], sizes[i], NULL));
        }
        OWN_TRY(w, oscar_plan_workspace_init(plan, bufs[2], NULL));
        oscar_cache c = {bufs[0], SEQ * (int32_t)pps + 1, bufs[1], SEQ};
        oscar_batch b = {SEQ, bufs[3], bufs[4], bufs[5], (int32_t)pps, LEN};
        OWN_TRY(w, oscar_append(plan, 0, &c, &b, bufs[6], SEQ * LEN, bufs[7], bufs[8], 0, bufs[2], ws_bytes, NULL));
        if (!own_error_is_mine(rt, w->id)) w->bad_msgs++;
        OWN_TRY(w, oscar_decode(plan, 0, &c, &b, bufs[9], 0, bufs[10], 0, 0.0f, 0, bufs[2], ws_bytes, NULL));
        OWN_TRY(w, oscar_buffer_read(rt, round ? got : w->want, bufs[10], 0, out_bytes, NULL));
        OWN_TRY(w, oscar_plan_check(plan, bufs[2], NULL));
        if (round && memcmp(got, w->want, out_bytes)) w->mismatches++;
        for (int i = 0; i < 11; i++) oscar_buffer_free(rt, bufs[i]), bufs[i] = NULL;
        oscar_plan_destroy(plan), plan = NULL;
        oscar_params_destroy(params), params = NULL;
    }
out:
    for (int i = 0; i < 11; i++) oscar_buffer_free(rt, bufs[i]);
    oscar_plan_destroy(plan);
    oscar_params_destroy(params);
    if (!w->shared_rt) oscar_runtime_destroy(rt);
    free(k), free(v), free(q), free(got);
    return NULL;
}

/* A worker's outcome: its calls succeeded, its errors left its own messages, its rounds decoded alike. */
static void expect_worker(own_worker *w, int t) {
    cr_expect_eq(w->st, OSCAR_OK, "thread %d: status %d at %s", t, (int)w->st, w->why);
    cr_expect_eq(w->bad_msgs, 0, "thread %d (%s): %d of its errors left another message than its own", t, w->backend,
                 w->bad_msgs);
    cr_expect_eq(w->mismatches, 0, "thread %d (%s): %d rounds decoded differently from its first", t, w->backend,
                 w->mismatches);
    free(w->want);
}

Test(plan_threads, threads_with_their_own_runtimes_and_errors, .timeout = 600) {
    enum { NT = 8 };
    own_worker w[NT];
    pthread_t th[NT];
    pthread_barrier_t start;
    cr_assert_eq(pthread_barrier_init(&start, NULL, NT), 0);
    for (int t = 0; t < NT; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].start = &start;
        w[t].backend = t % 4 ? "opencl" : "cpu"; /* OpenCL's first use in the process is the racy one */
        w[t].id = t;
        w[t].rounds = 4;
        cr_assert_eq(pthread_create(&th[t], NULL, own_worker_run, &w[t]), 0);
    }
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (int t = 0; t < NT; t++) {
        if (w[t].skipped)
            cr_expect(!rc_backend_required(w[t].backend), "%s is required but: %s", w[t].backend, w[t].why);
        expect_worker(&w[t], t);
    }
}

/* The same on one runtime per backend: plans created, used and destroyed by
 * several threads at once on one OpenCL context (its program cache and
 * launch lock) and on the CPU backend. */
Test(plan_threads, threads_share_a_runtime_with_their_own_plans, .timeout = 600) {
    enum { NT = 6 };
    oscar_runtime *rts[2] = {NULL, NULL};
    const char *names[2] = {"cpu", "opencl"};
    for (int b = 0; b < 2; b++) {
        oscar_runtime_options ro;
        oscar_runtime_options_default(&ro);
        ro.backend = names[b];
        if (oscar_runtime_create(&ro, &rts[b]) != OSCAR_OK) {
            cr_expect(!rc_backend_required(names[b]), "%s is required but: %s", names[b], oscar_last_error());
            rts[b] = NULL;
        }
    }
    own_worker w[NT];
    pthread_t th[NT];
    pthread_barrier_t start;
    cr_assert_eq(pthread_barrier_init(&start, NULL, NT), 0);
    int started[NT] = {0};
    for (int t = 0; t < NT; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].start = &start;
        w[t].backend = names[t % 2];
        w[t].shared_rt = rts[t % 2];
        w[t].id = t;
        w[t].rounds = 4;
        if (!w[t].shared_rt) w[t].shared_rt = rts[0]; /* OpenCL absent (and not required): CPU in its place */
        started[t] = pthread_create(&th[t], NULL, own_worker_run, &w[t]) == 0;
        cr_assert(started[t]);
    }
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (int t = 0; t < NT; t++) {
        expect_worker(&w[t], t);
    }
    for (int b = 0; b < 2; b++) oscar_runtime_destroy(rts[b]);
}
