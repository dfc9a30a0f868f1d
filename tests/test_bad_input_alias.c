/* A buffer a call writes that shares memory with another buffer of the same call is refused before
 * anything runs, on the CPU backend (host ranges), on OpenCL (one cl_mem, or overlapping
 * sub-buffers) and on CUDA and HIP (device address ranges): out over the block table or seq_lens (the CPU decode then read later sequences'
 * pages through the out rows it had just written: past the pool, a crash under ASan), out over q,
 * lse over out, the page pool over k. The refused call writes nothing; the same call with buffers of
 * their own runs. Values are random (seed logged). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oscar/oscar.h"
#include "runtime_or_skip.h"

#define NS 3     /* sequences */
#define LEN 80   /* tokens each */
#define HQ 4     /* query heads */
#define D 64     /* head_dim */

typedef struct al {
    oscar_runtime *rt;
    oscar_plan *plan;
    oscar_layout_desc l;
    void *pages, *windows, *ws, *lens, *slots, *bt, *cu, *k, *v, *q, *out, *lse, *arena;
    size_t ws_bytes, page_bytes, arena_bytes, kv_bytes, q_bytes;
    int32_t pps, num_pages;
    int32_t bt_host[NS * 8];
    unsigned seed;
} al;

static void *dev(al *r, const void *src, size_t n) {
    void *b = NULL;
    cr_assert_eq(oscar_buffer_alloc(r->rt, n, &b), OSCAR_OK, "%s", oscar_last_error());
    if (src) cr_assert_eq(oscar_buffer_write(r->rt, b, 0, src, n, NULL), OSCAR_OK, "%s", oscar_last_error());
    return b;
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void *random_rows(al *r, size_t elems) {
    uint16_t *h = malloc(elems * 2);
    cr_assert(h);
    for (size_t i = 0; i < elems; i++) h[i] = bf16((float)rand_r(&r->seed) / (float)RAND_MAX * 4.0f - 2.0f);
    void *b = dev(r, h, elems * 2);
    free(h);
    return b;
}

/* 0: the backend is absent (and not required). */
static int al_open(al *r, const char *backend, unsigned seed) {
    memset(r, 0, sizeof *r);
    r->seed = seed;
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = backend;
    if (!(r->rt = rc_runtime_or_null(&ro))) return 0;
    oscar_layout_default(&r->l);
    r->l.head_dim = D, r->l.group = D, r->l.num_q_heads = HQ, r->l.num_kv_heads = 2, r->l.page_size = 16;
    r->l.sink = 4, r->l.recent = 16, r->l.max_seq_len = LEN, r->l.method = OSCAR_METHOD_QUAROT2;
    cr_assert_eq(oscar_plan_create(r->rt, &r->l, NULL, &r->plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(&r->l, &sz), OSCAR_OK);
    int64_t pps;
    cr_assert_eq(oscar_layout_pages_for(&r->l, LEN, &pps), OSCAR_OK);
    r->pps = (int32_t)pps, r->num_pages = NS * r->pps, r->page_bytes = sz.page_bytes;
    int32_t lens[NS], slots[NS], cu[NS + 1];
    /* pages in a random order: a page belongs to one sequence */
    int32_t perm[NS * 8];
    for (int i = 0; i < r->num_pages; i++) perm[i] = i;
    for (int i = r->num_pages - 1; i > 0; i--) {
        int j = (int)(rand_r(&r->seed) % (unsigned)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < NS; i++) {
        lens[i] = LEN, slots[i] = NS - 1 - i, cu[i] = i * LEN;
        for (int j = 0; j < r->pps; j++) r->bt_host[i * r->pps + j] = perm[i * r->pps + j];
    }
    cu[NS] = NS * LEN;
    r->pages = dev(r, NULL, sz.page_bytes * (size_t)r->num_pages);
    r->windows = dev(r, NULL, sz.window_slot_bytes * NS);
    cr_assert_eq(oscar_plan_workspace_bytes(r->plan, NS, LEN, &r->ws_bytes), OSCAR_OK);
    r->ws = dev(r, NULL, r->ws_bytes);
    cr_assert_eq(oscar_plan_workspace_init(r->plan, r->ws, NULL), OSCAR_OK);
    r->lens = dev(r, lens, sizeof lens);
    r->slots = dev(r, slots, sizeof slots);
    r->bt = dev(r, r->bt_host, sizeof(int32_t) * (size_t)r->num_pages);
    r->cu = dev(r, cu, sizeof cu);
    r->kv_bytes = (size_t)NS * LEN * 2 * D * 2;
    r->q_bytes = (size_t)NS * HQ * D * 2;
    r->k = random_rows(r, r->kv_bytes / 2);
    r->v = random_rows(r, r->kv_bytes / 2);
    r->q = random_rows(r, r->q_bytes / 2);
    r->out = dev(r, NULL, r->q_bytes);
    r->lse = dev(r, NULL, (size_t)NS * HQ * 4);
    /* One buffer large enough to stand in for any of the others. */
    r->arena_bytes = r->kv_bytes + sz.page_bytes * (size_t)r->num_pages + r->q_bytes + 4096;
    r->arena = dev(r, NULL, r->arena_bytes);
    return 1;
}

static void al_close(al *r) {
    void *b[] = {r->pages, r->windows, r->ws, r->lens, r->slots, r->bt, r->cu,
                 r->k,     r->v,       r->q,  r->out,  r->lse,   r->arena};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i]) oscar_buffer_free(r->rt, b[i]);
    oscar_plan_destroy(r->plan);
    oscar_runtime_destroy(r->rt);
}

static oscar_cache cache_of(const al *r) { return (oscar_cache){r->pages, r->num_pages, r->windows, NS}; }
static oscar_batch batch_of(const al *r) { return (oscar_batch){NS, r->lens, r->slots, r->bt, r->pps, LEN}; }

static uint8_t *snapshot(al *r, const void *buf, size_t n) {
    uint8_t *h = malloc(n);
    cr_assert(h);
    cr_assert_eq(oscar_buffer_read(r->rt, h, buf, 0, n, NULL), OSCAR_OK, "%s", oscar_last_error());
    return h;
}

static void expect_refused(al *r, oscar_status s, const char *what, const char *a, const char *b, const void *buf,
                           const uint8_t *before, size_t n) {
    cr_expect_eq(s, OSCAR_ERR_INVALID_ARGUMENT, "%s: %s (seed %u)", what, s ? oscar_last_error() : "accepted",
                 r->seed);
    const char *m = oscar_last_error();
    cr_expect(strstr(m, a) && strstr(m, b), "%s: the message names neither %s nor %s: %s", what, a, b, m);
    uint8_t *after = snapshot(r, buf, n);
    cr_expect(!memcmp(before, after, n), "%s: the refused call wrote (seed %u)", what, r->seed);
    free(after);
}

static void overlap_case(const char *backend) {
    const unsigned seed = (unsigned)time(NULL) ^ (unsigned)clock();
    al r;
    if (!al_open(&r, backend, seed)) cr_skip_test("%s not available", backend);
    cr_log_info("seed %u", seed);
    oscar_cache c = cache_of(&r);
    oscar_batch b = batch_of(&r);
    cr_assert_eq(oscar_append(r.plan, 0, &c, &b, r.cu, NS * LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK, "%s",
                 oscar_last_error());
    cr_assert_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    const size_t pool = r.page_bytes * (size_t)r.num_pages;
    uint8_t *pages0 = snapshot(&r, r.pages, pool);

    /* decode: out over the block table (the arena holds the table) */
    cr_assert_eq(oscar_buffer_write(r.rt, r.arena, 0, r.bt_host, sizeof(int32_t) * (size_t)r.num_pages, NULL),
                 OSCAR_OK);
    uint8_t *arena0 = snapshot(&r, r.arena, r.arena_bytes);
    oscar_batch ba = b;
    ba.block_table = r.arena;
    oscar_status s = oscar_decode(r.plan, 0, &c, &ba, r.q, 0, r.arena, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out over block_table", "out", "block_table", r.arena, arena0, r.arena_bytes);
    /* ... over seq_lens */
    const int32_t lens[NS] = {LEN, LEN, LEN};
    cr_assert_eq(oscar_buffer_write(r.rt, r.arena, 0, lens, sizeof lens, NULL), OSCAR_OK);
    free(arena0);
    arena0 = snapshot(&r, r.arena, r.arena_bytes);
    ba = b;
    ba.seq_lens = r.arena;
    s = oscar_decode(r.plan, 0, &c, &ba, r.q, 0, r.arena, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out over seq_lens", "out", "seq_lens", r.arena, arena0, r.arena_bytes);
    /* ... in place over q */
    uint8_t *q0 = snapshot(&r, r.q, r.q_bytes);
    s = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.q, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out over q", "out", "q", r.q, q0, r.q_bytes);
    /* ... over the page pool */
    s = oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.pages, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out over the pages", "out", "pages", r.pages, pages0, pool);

    /* extend: lse over out */
    oscar_attn_args a;
    oscar_attn_args_default(&a);
    a.total_q = NS, a.max_q_len = 1, a.q = r.q, a.out = r.out, a.out_bytes = r.q_bytes;
    a.lse = r.out, a.lse_bytes = r.q_bytes, a.workspace = r.ws, a.workspace_bytes = r.ws_bytes;
    uint8_t *out0 = snapshot(&r, r.out, r.q_bytes);
    s = oscar_extend(r.plan, 0, &c, &b, &a);
    expect_refused(&r, s, "extend, lse over out", "out", "lse", r.out, out0, r.q_bytes);

    /* append: the page pool over k (the arena holds k's rows) */
    uint8_t *kh = snapshot(&r, r.k, r.kv_bytes);
    cr_assert_eq(oscar_buffer_write(r.rt, r.arena, 0, kh, r.kv_bytes, NULL), OSCAR_OK);
    free(arena0);
    arena0 = snapshot(&r, r.arena, r.arena_bytes);
    oscar_cache ca = c;
    ca.pages = r.arena;
    s = oscar_append(r.plan, 0, &ca, &b, r.cu, NS * LEN, r.arena, r.v, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "append, pages over k", "pages", "k", r.arena, arena0, r.arena_bytes);
    /* ... the window pool over v */
    uint8_t *vh = snapshot(&r, r.v, r.kv_bytes);
    cr_assert_eq(oscar_buffer_write(r.rt, r.arena, 0, vh, r.kv_bytes, NULL), OSCAR_OK);
    free(arena0);
    arena0 = snapshot(&r, r.arena, r.arena_bytes);
    ca = c;
    ca.windows = r.arena;
    s = oscar_append(r.plan, 0, &ca, &b, r.cu, NS * LEN, r.k, r.arena, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "append, windows over v", "windows", "v", r.arena, arena0, r.arena_bytes);

    /* Buffers of their own: the same calls run. */
    cr_expect_eq(oscar_decode(r.plan, 0, &c, &b, r.q, 0, r.out, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK, "%s",
                 oscar_last_error());
    a.lse = r.lse, a.lse_bytes = (size_t)NS * HQ * 4;
    cr_expect_eq(oscar_extend(r.plan, 0, &c, &b, &a), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(oscar_plan_check(r.plan, r.ws, NULL), OSCAR_OK, "%s", oscar_last_error());
    free(pages0), free(arena0), free(q0), free(out0), free(kh), free(vh);
    al_close(&r);
}

Test(bad_input_alias, written_buffer_over_another_is_refused_cpu) { overlap_case("cpu"); }
Test(bad_input_alias, written_buffer_over_another_is_refused_opencl, .timeout = 300) { overlap_case("opencl"); }
/* CUDA and HIP (device pointers, one address space): checked by address in the GPU core */
Test(bad_input_alias, written_buffer_over_another_is_refused_cuda, .timeout = 300) { overlap_case("cuda"); }
Test(bad_input_alias, written_buffer_over_another_is_refused_hip, .timeout = 300) { overlap_case("hip"); }

/* CPU host memory can overlap in part: an out buffer one row past q (decode wrote sequence i's
 * output over sequence i+1's query before reading it) or sharing its last bytes with seq_lens. */
Test(bad_input_alias, partial_host_overlaps_are_refused_cpu) {
    const unsigned seed = (unsigned)time(NULL) ^ (unsigned)clock();
    al r;
    cr_assert(al_open(&r, "cpu", seed));
    cr_log_info("seed %u", seed);
    oscar_cache c = cache_of(&r);
    oscar_batch b = batch_of(&r);
    cr_assert_eq(oscar_append(r.plan, 0, &c, &b, r.cu, NS * LEN, r.k, r.v, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK, "%s",
                 oscar_last_error());
    /* q and out in one host buffer, out a random number of rows (1 .. NS-1) after q */
    const size_t row = (size_t)HQ * D * 2, shift = 1 + (size_t)(rand_r(&r.seed) % (NS - 1));
    uint8_t *both = r.arena;
    uint8_t *qh = snapshot(&r, r.q, r.q_bytes);
    memcpy(both, qh, r.q_bytes);
    uint8_t *before = snapshot(&r, both, r.q_bytes + shift * row);
    oscar_status s = oscar_decode(r.plan, 0, &c, &b, both, 0, both + shift * row, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out rows after q", "out", "q", both, before, r.q_bytes + shift * row);
    /* out's last 4 bytes are seq_lens' first */
    int32_t *lens = (int32_t *)(both + r.q_bytes - 4);
    for (int i = 0; i < NS; i++) lens[i] = LEN;
    free(before);
    before = snapshot(&r, both, r.q_bytes + 64);
    oscar_batch bl = b;
    bl.seq_lens = lens;
    s = oscar_decode(r.plan, 0, &c, &bl, r.q, 0, both, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL);
    expect_refused(&r, s, "decode, out ending in seq_lens", "out", "seq_lens", both, before, r.q_bytes + 64);
    /* seq_lens right after out (adjacent, not overlapping): the call runs */
    lens = (int32_t *)(both + r.q_bytes);
    for (int i = 0; i < NS; i++) lens[i] = LEN;
    bl.seq_lens = lens;
    cr_expect_eq(oscar_decode(r.plan, 0, &c, &bl, r.q, 0, both, 0, 0.0f, 0, r.ws, r.ws_bytes, NULL), OSCAR_OK, "%s",
                 oscar_last_error());
    /* one sequence whose block table row has a pitch of INT32_MAX entries, out right after the entries it
     * uses: the call runs (the table's extent was num_seqs x pitch, gigabytes that covered any buffer
     * after it: refused by chance of where the allocator put out) */
    int32_t *bt1 = (int32_t *)both;
    memcpy(bt1, r.bt_host, sizeof(int32_t) * (size_t)r.pps);
    oscar_batch bw = b;
    bw.num_seqs = 1, bw.block_table = bt1, bw.block_table_stride = INT32_MAX;
    cr_expect_eq(oscar_decode(r.plan, 0, &c, &bw, r.q, 0, both + sizeof(int32_t) * (size_t)r.pps, 0, 0.0f, 0, r.ws,
                              r.ws_bytes, NULL),
                 OSCAR_OK, "a wide pitch's unused entries are not the table's: %s", oscar_last_error());
    free(qh), free(before);
    al_close(&r);
}
