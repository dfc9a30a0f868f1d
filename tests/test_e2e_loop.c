/* The GPU engine's request loop (engine/gpu/ge_loop.c) driven on the CPU by
 * a fake model: FIFO admission as sequences finish (the batch stays full),
 * whole-prompt and stepwise prefill, decode of every running sequence, each
 * request's tokens and logits routed back to it, no page leaks, the
 * scheduler consistent at every step. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/gpu/ge_loop.c"
#include "../engine/gpu/ge_sched.c"

#define VOCAB 53

static int next_token(int tok, int pos) { return (31 * tok + 7 * pos + 1) % VOCAB; }

typedef struct fake {
    ge_sched *s;
    int check_full;  /* a queued request that fits must not wait while a slot is free */
    int steps, prefill_steps, max_running;
    unsigned seed;
} fake;

static oscar_status fake_step(void *user, int n, const int32_t *slots, const int32_t *n_new, const int32_t *tokens,
                              int32_t *next, float *logits)
{
    fake *f = user;
    ge_sched *s = f->s;
    char msg[256];
    if (ge_sched_check(s, msg, sizeof msg) != OSCAR_OK) cr_assert_fail("seed %u: %s", f->seed, msg);
    int decode = 1;
    for (int i = 0; i < n; i++) decode &= n_new[i] == 1;
    int32_t *lens = malloc((size_t)n * 4), *ws = malloc((size_t)n * 4), *cu = malloc(((size_t)n + 1) * 4),
            *bt = malloc((size_t)n * s->stride * 4), ml;
    if (ge_sched_batch(s, n, slots, n_new, lens, ws, bt, cu, &ml) != OSCAR_OK)
        cr_assert_fail("seed %u: %s", f->seed, ge_last_error());
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (slots[i] == slots[j]) cr_assert_fail("seed %u: slot twice in a step", f->seed);
        if (!decode && s->slots[slots[i]].len != 0) cr_assert_fail("seed %u: prefill of a started sequence", f->seed);
        int last = tokens[cu[i + 1] - 1];
        if (last < 0 || last >= VOCAB) cr_assert_fail("seed %u: token %d", f->seed, last);
        next[i] = next_token(last, lens[i] - 1);
        if (logits)
            for (int v = 0; v < VOCAB; v++) logits[(size_t)i * VOCAB + v] = v == next[i] ? 1.0f : (float)slots[i];
        if (ge_sched_advance(s, slots[i], n_new[i]) != OSCAR_OK) cr_assert_fail("seed %u: %s", f->seed, ge_last_error());
    }
    if (decode && f->check_full && s->head < s->n_reqs && s->running < s->num_slots) {
        int64_t need;
        const ge_request *h = &s->reqs[s->head];
        oscar_layout_pages_for(&s->layout, (int64_t)h->prompt_len + h->max_new, &need);
        if (need <= s->pages.n_free) cr_assert_fail("seed %u: a slot is free and the queue head fits, yet it waits", f->seed);
    }
    if (n > f->max_running) f->max_running = n;
    f->steps++;
    f->prefill_steps += !decode;
    free(lens);
    free(ws);
    free(cu);
    free(bt);
    return OSCAR_OK;
}

static void run_case(unsigned seed, int stepwise, int cap)
{
    uint64_t st = seed;
#define RND() (st = st * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(st >> 33))
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.num_q_heads = 8;
    l.num_kv_heads = 2;
    l.page_size = 16;
    l.sink = (int)(RND() % 20);
    l.recent = (int)(RND() % 40);
    l.method = RND() % 2 ? OSCAR_METHOD_BF16 : OSCAR_METHOD_OSCAR2;
    l.max_seq_len = 400;
    int slots = 1 + (int)(RND() % 5), n_req = 1 + (int)(RND() % 14), max_new = 1 + (int)(RND() % 30);
    int64_t mp;
    oscar_layout_pages_for(&l, l.max_seq_len, &mp);
    int32_t pages = (int32_t)(mp + RND() % (uint32_t)(3 * mp + 1));
    ge_sched s;
    cr_assert_eq(ge_sched_init(&s, &l, pages, slots), OSCAR_OK);
    int32_t **pr = malloc((size_t)n_req * sizeof *pr), *lens = malloc((size_t)n_req * 4);
    for (int r = 0; r < n_req; r++) {
        lens[r] = 1 + (int)(RND() % (uint32_t)(l.max_seq_len - max_new));
        pr[r] = malloc((size_t)lens[r] * 4);
        for (int j = 0; j < lens[r]; j++) pr[r][j] = (int32_t)(RND() % VOCAB);
    }
    int32_t *out = malloc((size_t)n_req * max_new * 4);
    float *lg = malloc((size_t)n_req * max_new * VOCAB * 4);
    for (size_t i = 0; i < (size_t)n_req * max_new; i++) out[i] = -1;
    fake f = {&s, cap >= 1 << 20, 0, 0, 0, seed};
    ge_gen_stats gs;
    oscar_status rc = ge_run_requests(&s, fake_step, &f, VOCAB, cap, n_req, (const int32_t *const *)pr, lens, max_new,
                                      stepwise, out, lg, &gs);
    cr_assert_eq(rc, OSCAR_OK, "seed %u: %s", seed, ge_last_error());
    for (int r = 0; r < n_req; r++) {
        int tok = next_token(pr[r][lens[r] - 1], lens[r] - 1);
        for (int i = 0; i < max_new; i++) {
            if (out[(size_t)r * max_new + i] != tok)
                cr_assert_fail("seed %u: request %d token %d is %d, expected %d", seed, r, i, out[(size_t)r * max_new + i], tok);
            const float *row = lg + ((size_t)r * max_new + i) * VOCAB;
            if (row[tok] != 1.0f) cr_assert_fail("seed %u: logits of request %d step %d misrouted", seed, r, i);
            tok = next_token(tok, lens[r] + i);
        }
    }
    cr_assert_eq(s.pages.n_free, pages, "seed %u: pages leaked", seed);
    cr_assert_eq(s.running, 0);
    char msg[256];
    cr_assert_eq(ge_sched_check(&s, msg, sizeof msg), OSCAR_OK, "seed %u: %s", seed, msg);
    cr_assert_leq(f.max_running, slots);
    cr_assert_eq(gs.decode_tokens, (int64_t)n_req * (max_new - 1), "seed %u: %lld decode tokens", seed,
                 (long long)gs.decode_tokens);
    for (int r = 0; r < n_req; r++) free(pr[r]);
    free(pr);
    free(lens);
    free(out);
    free(lg);
    ge_sched_release(&s);
#undef RND
}

Test(e2e_loop, random_requests_whole_prompt_prefill)
{
    unsigned base = (unsigned)time(NULL);
    for (unsigned i = 0; i < 60; i++) run_case(base * 977u + i, 0, 1 << 30);
}

Test(e2e_loop, random_requests_prefill_token_cap)
{
    unsigned base = (unsigned)time(NULL) ^ 0x5bd1e995u;
    for (unsigned i = 0; i < 60; i++) run_case(base * 131u + i, 0, 1 + (int)(i * 37 % 500));
}

Test(e2e_loop, random_requests_stepwise_prefill)
{
    unsigned base = (unsigned)time(NULL) ^ 0x1234567u;
    for (unsigned i = 0; i < 20; i++) run_case(base * 17u + i, 1, 1 << 30);
}

Test(e2e_loop, refuses_bad_arguments)
{
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.max_seq_len = 100;
    ge_sched s;
    cr_assert_eq(ge_sched_init(&s, &l, 4, 2), OSCAR_OK);
    int32_t p[3] = {1, 2, 3}, len = 3, out[4];
    const int32_t *pp = p;
    fake f = {&s, 0, 0, 0, 0, 0};
    cr_assert_eq(ge_run_requests(&s, NULL, &f, VOCAB, 100, 1, &pp, &len, 4, 0, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(ge_run_requests(&s, fake_step, &f, VOCAB, 100, 1, &pp, &len, 0, 0, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    len = 99; /* 99 + 4 > max_seq_len */
    cr_assert_eq(ge_run_requests(&s, fake_step, &f, VOCAB, 100, 1, &pp, &len, 4, 0, out, NULL, NULL), OSCAR_ERR_TOO_LONG);
    ge_sched_release(&s);
}
