/* The GPU engine's request loop (engine/gpu/ge_loop.c) driven on the CPU by
 * a fake model: FIFO admission as sequences finish (the batch stays full),
 * whole-prompt, chunked and stepwise prefill, a shared prefix (prefilled
 * once, its pages referenced by every request, its state forked into each),
 * decode of every running sequence, each request's tokens and logits routed
 * back to it, no page leaks, the scheduler consistent at every step. The
 * fake model's state per slot is a hash of every token it was fed at its
 * position, so a token fed twice, skipped or out of order, or a fork from
 * the wrong slot, changes the generated tokens. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/gpu/ge_loop.c"
#include "../engine/gpu/ge_sched.c"

#define VOCAB 53

/* The fake model's state after feeding tok at position pos. */
static uint32_t feed(uint32_t h, int tok, int pos) { return (h * 2654435761u) ^ (uint32_t)(31 * tok + 7 * pos + 1); }
static int token_of(uint32_t h) { return (int)((h >> 7) % VOCAB); }

#define MAX_SLOTS 8

typedef struct fake {
    ge_sched *s;
    int check_full;  /* a queued request that fits must not wait while a slot is free */
    int chunk;       /* > 0: no prefill step brings more tokens of a sequence, except a whole
                        prompt that fits one step (cap) when not every prompt is chunked */
    int every, cap;
    int steps, prefill_steps, max_running, forks;
    uint32_t h[MAX_SLOTS];
    unsigned seed;
} fake;

static oscar_status fake_fork(void *user, int32_t src, int32_t dst, int32_t src_page, int32_t dst_page)
{
    fake *f = user;
    const ge_sched *s = f->s;
    const ge_slot *q = &s->slots[dst];
    if (q->fork_src != src || s->slots[src].state == GE_SLOT_FREE || q->len != s->slots[src].len)
        cr_assert_fail("seed %u: fork from slot %d into %d (length %d, source length %d)", f->seed, src, dst, q->len,
                       s->slots[src].len);
    const int32_t *sr = s->block_table + (size_t)src * s->stride, *dr = s->block_table + (size_t)dst * s->stride;
    int64_t need;
    oscar_layout_pages_for(&s->layout, q->len, &need);
    if (q->n_shared != ge_shared_pages(&s->layout, q->len) || memcmp(sr, dr, (size_t)q->n_shared * 4))
        cr_assert_fail("seed %u: slot %d does not share its prefix's %d full pages", f->seed, dst, q->n_shared);
    if (need > q->n_shared) {
        /* the partly written last page is copied into a page of its own */
        if (src_page != sr[q->n_shared] || dst_page != dr[q->n_shared] || src_page == dst_page)
            cr_assert_fail("seed %u: partial page copy %d -> %d", f->seed, src_page, dst_page);
    } else if (src_page != -1 || dst_page != -1) {
        cr_assert_fail("seed %u: page copy without a partial page", f->seed);
    }
    f->h[dst] = f->h[src];
    f->forks++;
    return OSCAR_OK;
}

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
        const ge_slot *q = &s->slots[slots[i]];
        if (!decode && !f->chunk && q->len != 0)
            cr_assert_fail("seed %u: whole-prompt prefill of a started sequence", f->seed);
        int whole = q->len == 0 && n_new[i] == s->reqs[q->req].prompt_len && n_new[i] <= f->cap;
        if (!decode && f->chunk && n_new[i] > f->chunk && (f->every || !whole))
            cr_assert_fail("seed %u: %d tokens of a prompt of %d at %d, chunk %d (every %d, cap %d)", f->seed, n_new[i],
                           s->reqs[q->req].prompt_len, q->len, f->chunk, f->every, f->cap);
        if (!decode && f->chunk && n_new[i] < s->reqs[q->req].prompt_len - q->len && n_new[i] != f->chunk)
            cr_assert_fail("seed %u: a chunk of %d, not %d", f->seed, n_new[i], f->chunk);
        if (!decode && f->chunk && !f->every && q->len == 0 && s->reqs[q->req].prompt_len <= f->cap && !whole)
            cr_assert_fail("seed %u: a prompt of %d that fits one step (%d) went in chunks", f->seed,
                           s->reqs[q->req].prompt_len, f->cap);
        if (s->slots[slots[i]].len == 0) f->h[slots[i]] = 12345u;
        for (int j = cu[i]; j < cu[i + 1]; j++) {
            if (tokens[j] < 0 || tokens[j] >= VOCAB) cr_assert_fail("seed %u: token %d", f->seed, tokens[j]);
            f->h[slots[i]] = feed(f->h[slots[i]], tokens[j], lens[i] - (cu[i + 1] - j));
        }
        next[i] = token_of(f->h[slots[i]]);
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

/* mode 0: whole prompts, 1: stepwise, 2: every prompt chunked, 3: a shared prefix,
 * 4: chunks only for prompts longer than one step (cap). */
static void run_case(unsigned seed, int mode, int cap)
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
    int prefix = 0, chunk = mode >= 2 ? 1 + (int)(RND() % 70) : 0, every = mode == 2 || (mode == 3 && RND() % 2);
    if (mode == 3) {
        slots = 2 + (int)(RND() % 4); /* the prefix holds one until every request is in */
        prefix = 1 + (int)(RND() % 200);
    }
    int64_t mp;
    oscar_layout_pages_for(&l, l.max_seq_len, &mp);
    /* + 1 with a prefix: its partly written last page stays while a request needs a whole pool's worth */
    int32_t pages = (int32_t)(mp + (mode == 3) + RND() % (uint32_t)(3 * mp + 1));
    ge_sched s;
    cr_assert_eq(ge_sched_init(&s, &l, pages, slots), OSCAR_OK);
    int32_t **pr = malloc((size_t)n_req * sizeof *pr), *lens = malloc((size_t)n_req * 4);
    for (int r = 0; r < n_req; r++) {
        lens[r] = prefix + 1 + (int)(RND() % (uint32_t)(l.max_seq_len - max_new - prefix));
        pr[r] = malloc((size_t)lens[r] * 4);
        for (int j = 0; j < lens[r]; j++) pr[r][j] = j < prefix && r > 0 ? pr[0][j] : (int32_t)(RND() % VOCAB);
    }
    int32_t *out = malloc((size_t)n_req * max_new * 4);
    float *lg = malloc((size_t)n_req * max_new * VOCAB * 4);
    for (size_t i = 0; i < (size_t)n_req * max_new; i++) out[i] = -1;
    fake f = {.s = &s, .check_full = cap >= 1 << 20 && mode != 3, .chunk = mode == 1 ? 1 : chunk,
              .every = mode == 1 || every, .cap = cap, .seed = seed};
    ge_run_opts o = {.step = fake_step, .fork = fake_fork, .user = &f, .vocab = VOCAB, .max_prefill_tokens = cap,
                     .stepwise = mode == 1, .chunk = chunk, .chunk_every_prompt = every, .prefix_len = prefix};
    ge_gen_stats gs;
    oscar_status rc = ge_run_requests(&s, &o, n_req, (const int32_t *const *)pr, lens, max_new, out, lg, &gs);
    cr_assert_eq(rc, OSCAR_OK, "seed %u: %s", seed, ge_last_error());
    for (int r = 0; r < n_req; r++) {
        uint32_t h = 12345u;
        for (int j = 0; j < lens[r]; j++) h = feed(h, pr[r][j], j);
        int tok = token_of(h);
        for (int i = 0; i < max_new; i++) {
            if (out[(size_t)r * max_new + i] != tok)
                cr_assert_fail("seed %u: request %d token %d is %d, expected %d", seed, r, i, out[(size_t)r * max_new + i], tok);
            const float *row = lg + ((size_t)r * max_new + i) * VOCAB;
            if (row[tok] != 1.0f) cr_assert_fail("seed %u: logits of request %d step %d misrouted", seed, r, i);
            h = feed(h, tok, lens[r] + i);
            tok = token_of(h);
        }
    }
    cr_assert_eq(s.pages.n_free, pages, "seed %u: pages leaked", seed);
    cr_assert_eq(s.running, 0);
    char msg[256];
    cr_assert_eq(ge_sched_check(&s, msg, sizeof msg), OSCAR_OK, "seed %u: %s", seed, msg);
    cr_assert_leq(f.max_running, slots);
    cr_assert_eq(f.forks, mode == 3 ? n_req : 0, "seed %u: %d forks", seed, f.forks);
    int64_t prompt_tokens = prefix;
    for (int r = 0; r < n_req; r++) prompt_tokens += lens[r] - prefix;
    cr_assert_eq(gs.prefill_tokens, prompt_tokens, "seed %u: %lld tokens prefilled, prompts hold %lld (prefix once)",
                 seed, (long long)gs.prefill_tokens, (long long)prompt_tokens);
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

Test(e2e_loop, random_requests_chunked_prefill)
{
    unsigned base = (unsigned)time(NULL) ^ 0x2545f491u;
    for (unsigned i = 0; i < 60; i++) run_case(base * 29u + i, 2, i % 2 ? 1 << 30 : 1 + (int)(i * 37 % 500));
}

Test(e2e_loop, random_requests_chunks_for_long_prompts)
{
    unsigned base = (unsigned)time(NULL) ^ 0x3c6ef372u;
    for (unsigned i = 0; i < 60; i++) run_case(base * 53u + i, 4, 1 + (int)(i * 37 % 300));
}

Test(e2e_loop, random_requests_shared_prefix)
{
    unsigned base = (unsigned)time(NULL) ^ 0x68e31da4u;
    for (unsigned i = 0; i < 60; i++) run_case(base * 43u + i, 3, i % 2 ? 1 << 30 : 1 + (int)(i * 37 % 500));
}

Test(e2e_loop, refuses_bad_arguments)
{
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.max_seq_len = 100;
    ge_sched s;
    cr_assert_eq(ge_sched_init(&s, &l, 4, 2), OSCAR_OK);
    int32_t p[3] = {1, 2, 3}, q[3] = {1, 5, 3}, len = 3, lens2[2] = {3, 3}, out[8];
    const int32_t *pp = p, *two[2] = {p, q};
    fake f = {.s = &s};
    ge_run_opts o = {.step = NULL, .fork = fake_fork, .user = &f, .vocab = VOCAB, .max_prefill_tokens = 100};
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    o.step = fake_step;
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 0, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    o.chunk = -1;
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    /* a shared prefix: needs chunked prefill, shorter than every prompt, the same in every prompt */
    o.chunk = 0;
    o.prefix_len = 2;
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    o.chunk = 2;
    o.prefix_len = 3;
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(ge_last_error(), "not shorter"), "%s", ge_last_error());
    o.prefix_len = 2;
    cr_assert_eq(ge_run_requests(&s, &o, 2, two, lens2, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(ge_last_error(), "does not start with"), "%s", ge_last_error());
    o.fork = NULL;
    o.prefix_len = 1;
    cr_assert_eq(ge_run_requests(&s, &o, 2, two, lens2, 4, out, NULL, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(s.n_reqs, 0, "a refused call queues nothing");
    o.prefix_len = 0;
    o.chunk = 0;
    len = 99; /* 99 + 4 > max_seq_len */
    cr_assert_eq(ge_run_requests(&s, &o, 1, &pp, &len, 4, out, NULL, NULL), OSCAR_ERR_TOO_LONG);
    ge_sched_release(&s);
}
