/* The CPU backend through its vtable (no runtime): paged append against an
 * expected cache built directly from the FORMAT.md §3.1 regions with the
 * cpu_ref primitives, decode against a float64 naive attention over that
 * expected cache, and every refused input leaving the cache byte-identical.
 * Fresh random inputs each run; the seed is in every failure message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "refcheck.h"

#define LAYERS 2
#define LAYER 1 /* not layer 0: catches a wrong per-layer offset */

typedef rc_cfg cfg;

typedef struct env {
    const oscar_backend_api *api;
    void *ctx, *plan;
    oscar_layout_desc l;
    int num_rot, identity;
    float *rot_k, *rot_v; /* [LAYERS][num_rot][d][d] or NULL */
    float clip_k[LAYERS * RC_MAX_KV_HEADS], clip_v[LAYERS * RC_MAX_KV_HEADS]; /* [layer][kv head] */
    uint64_t ws[OSCAR_WORKSPACE_HEADER / 8];
} env;

static void env_init(env *e, const cfg *c, rc_rng *r, uint64_t seed) {
    memset(e, 0, sizeof *e);
    e->api = oscar_cpu_backend();
    cr_assert_eq(e->api->abi_version, OSCAR_BACKEND_ABI_VERSION);
    rc_plan_setup(c, LAYERS, r, &e->l, &e->num_rot, &e->identity, &e->rot_k, &e->rot_v, e->clip_k, e->clip_v);
    oscar_errbuf err = {{0}};
    cr_assert_eq(e->api->init(0, &e->ctx, &err), OSCAR_OK);
    oscar_backend_plan_desc pd = {.layout = e->l, .num_layers = LAYERS, .num_rot = e->num_rot,
                                  .identity_rotation = e->identity, .rot_k = e->rot_k, .rot_v = e->rot_v,
                                  .clip_k = e->clip_k, .clip_v = e->clip_v};
    char variant[64];
    cr_assert_eq(e->api->plan_create(e->ctx, &pd, &e->plan, variant, sizeof variant, &err), OSCAR_OK,
                 "seed %llu: plan_create: %s", (unsigned long long)seed, err.msg);
    cr_assert(strncmp(variant, "cpu:", 4) == 0);
    size_t wb = 0;
    cr_assert_eq(e->api->workspace_bytes(e->ctx, e->plan, 8, 4096, &wb, &err), OSCAR_OK);
    cr_assert_leq(wb, sizeof e->ws);
    cr_assert_eq(e->api->workspace_init(e->ctx, e->plan, e->ws, NULL, &err), OSCAR_OK);
}
static void env_free(env *e) {
    e->api->plan_destroy(e->ctx, e->plan);
    e->api->shutdown(e->ctx);
    free(e->rot_k);
    free(e->rot_v);
}
static const float *layer_rot(const env *e, int kv) {
    const float *b = kv ? e->rot_v : e->rot_k;
    return b ? b + (size_t)LAYER * e->num_rot * e->l.head_dim * e->l.head_dim : NULL;
}

static oscar_batch batch_of(const rc_paged *b) {
    oscar_batch bt = {.num_seqs = b->num_seqs, .seq_lens = b->seq_lens, .window_slots = b->window_slots,
                      .block_table = b->block_table, .block_table_stride = b->stride, .max_seq_len = 0};
    for (int i = 0; i < b->num_seqs; i++)
        if (b->seq_lens[i] > bt.max_seq_len) bt.max_seq_len = b->seq_lens[i];
    return bt;
}
static oscar_cache cache_of(const rc_paged *b) {
    oscar_cache c = {.pages = b->pages, .num_pages = b->num_pages, .windows = b->windows,
                     .num_window_slots = b->num_slots};
    return c;
}

/* Appends n[i] new tokens to every sequence (rows taken from the full K/V). */
static oscar_status do_append(env *e, rc_paged *b, float *const *K, float *const *V, const int *n, int pad,
                              oscar_errbuf *err) {
    int H = e->l.num_kv_heads, d = e->l.head_dim, total = 0;
    int32_t *cu = malloc((size_t)(b->num_seqs + 1) * sizeof *cu);
    cu[0] = 0;
    for (int i = 0; i < b->num_seqs; i++) cu[i + 1] = cu[i] + n[i];
    total = cu[b->num_seqs];
    int64_t stride = (int64_t)H * d + pad;
    size_t es = oscar_dtype_size(e->l.kv_dtype);
    char *kb = malloc((size_t)(total ? total : 1) * stride * es), *vb = malloc((size_t)(total ? total : 1) * stride * es);
    rc_poison(kb, (size_t)(total ? total : 1) * stride * es); /* padding must never be read */
    rc_poison(vb, (size_t)(total ? total : 1) * stride * es);
    for (int i = 0; i < b->num_seqs; i++) {
        int L0 = b->seq_lens[i];
        for (int t = 0; t < n[i]; t++) {
            size_t src = (size_t)(L0 + t) * H * d, dst = (size_t)(cu[i] + t) * stride * es;
            rc_to_dtype(e->l.kv_dtype, K[i] + src, kb + dst, (size_t)H * d);
            rc_to_dtype(e->l.kv_dtype, V[i] + src, vb + dst, (size_t)H * d);
        }
        b->seq_lens[i] = L0 + n[i];
    }
    oscar_backend_append_args a = {.layer = LAYER, .cache = cache_of(b), .batch = batch_of(b), .cu_new = cu,
                                   .total_new = total, .k = kb, .v = vb, .kv_stride = stride,
                                   .workspace = e->ws, .workspace_bytes = sizeof e->ws};
    oscar_status s = e->api->append(e->ctx, e->plan, &a, err);
    free(cu);
    free(kb);
    free(vb);
    return s;
}

static void check_cache(const rc_paged *b, rc_seq_ref *refs, uint64_t seed, const char *what) {
    char msg[256];
    for (int i = 0; i < b->num_seqs; i++) {
        int bad = rc_compare_seq(&refs[i], b->seq_lens[i], b->pages, b->windows,
                                 b->block_table + (size_t)i * b->stride, b->window_slots[i], 0, msg, sizeof msg);
        cr_assert_eq(bad, 0, "seed %llu (%s), sequence %d: %d rows differ; first: %s", (unsigned long long)seed,
                     what, i, bad, msg);
    }
}

static void check_decode(env *e, rc_paged *b, rc_seq_ref *refs, rc_rng *r, int rotated_output, uint64_t seed) {
    int Hq = e->l.num_q_heads, d = e->l.head_dim, qpad = rc_randint(r, 0, 3) * 8, opad = rc_randint(r, 0, 2) * 8;
    size_t es = oscar_dtype_size(e->l.kv_dtype);
    int64_t qs = (int64_t)Hq * d + qpad, os = (int64_t)Hq * d + opad;
    float *q = malloc((size_t)b->num_seqs * Hq * d * sizeof *q);
    char *qb = malloc((size_t)b->num_seqs * qs * es), *ob = malloc((size_t)b->num_seqs * os * es);
    double *ref = malloc((size_t)Hq * d * sizeof *ref);
    rc_gen_kv(r, b->num_seqs, Hq, d, 2, e->l.kv_dtype, q);
    rc_poison(qb, (size_t)b->num_seqs * qs * es);
    rc_poison(ob, (size_t)b->num_seqs * os * es);
    for (int i = 0; i < b->num_seqs; i++)
        rc_to_dtype(e->l.kv_dtype, q + (size_t)i * Hq * d, qb + (size_t)i * qs * es, (size_t)Hq * d);
    /* A sharper softmax than 1/sqrt(d) now and then: the 2-bit error then matters. */
    float sm = (float)(rc_uniform(r) < 0.5 ? 1.0 / sqrt(d) : 0.3 / sqrt(d));
    oscar_backend_decode_args a = {.layer = LAYER, .cache = cache_of(b), .batch = batch_of(b), .q = qb,
                                   .q_stride = qs, .out = ob, .out_stride = os, .sm_scale = sm,
                                   .rotated_output = rotated_output, .workspace = e->ws,
                                   .workspace_bytes = sizeof e->ws};
    oscar_errbuf err = {{0}};
    cr_assert_eq(e->api->decode(e->ctx, e->plan, &a, &err), OSCAR_OK, "seed %llu: decode: %s",
                 (unsigned long long)seed, err.msg);
    char msg[256];
    for (int i = 0; i < b->num_seqs; i++) {
        rc_attention_f64(&refs[i], b->seq_lens[i], Hq, q + (size_t)i * Hq * d, layer_rot(e, 0), layer_rot(e, 1),
                         e->num_rot, sm, rotated_output, ref);
        const char *o = ob + (size_t)i * os * es;
        int bad = rc_check_output(e->l.kv_dtype, o, ref, (size_t)Hq * d, msg, sizeof msg);
        cr_assert_eq(bad, 0, "seed %llu: decode of sequence %d (L=%d, rotated_output %d): %d outputs off; %s",
                     (unsigned long long)seed, i, b->seq_lens[i], rotated_output, bad, msg);
        for (size_t j = (size_t)Hq * d * es; j < (size_t)os * es; j++)
            cr_assert_eq((unsigned char)o[j], 0xff, "seed %llu: decode wrote into the output stride padding",
                         (unsigned long long)seed);
    }
    free(q);
    free(qb);
    free(ob);
    free(ref);
}

enum { TOKENS = 0, CHUNKS = 1, PREFILL = 2 };

/* Grows every sequence to its final length with the given append schedule,
 * checking the whole cache after every append and decoding now and then. */
static void run_scenario(const cfg *c, int nseq, const int *final_lens, int mode) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    env e;
    env_init(&e, c, &r, seed);
    int H = c->H, d = c->d;
    float **K = malloc((size_t)nseq * sizeof *K), **V = malloc((size_t)nseq * sizeof *V);
    rc_seq_ref *refs = calloc((size_t)nseq, sizeof *refs);
    int32_t *maxl = malloc((size_t)nseq * sizeof *maxl);
    for (int i = 0; i < nseq; i++) {
        maxl[i] = final_lens[i];
        K[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        V[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        rc_gen_kv(&r, final_lens[i], H, d, 3, c->kv, K[i]);
        rc_gen_kv(&r, final_lens[i], H, d, 2, c->kv, V[i]);
        cr_assert_eq(rc_seq_ref_build(&e.l, layer_rot(&e, 0), layer_rot(&e, 1), e.num_rot, e.clip_k + LAYER * e.l.num_kv_heads,
                                      e.clip_v + LAYER * e.l.num_kv_heads, final_lens[i], K[i], V[i], &refs[i]),
                     0);
    }
    rc_paged b;
    cr_assert_eq(rc_paged_init(&r, &e.l, nseq, maxl, 3, &b), 0);
    int *n = malloc((size_t)nseq * sizeof *n), steps = 0;
    for (;;) {
        int any = 0;
        for (int i = 0; i < nseq; i++) {
            int rem = final_lens[i] - b.seq_lens[i];
            if (mode == TOKENS) n[i] = rem > 0;
            else if (mode == PREFILL) n[i] = rem;
            else n[i] = rem > 0 ? rc_randint(&r, 0, rem < c->P + c->W + 5 ? rem : c->P + c->W + 5) : 0;
            if (b.seq_lens[i] == 0 && n[i] == 0) n[i] = 1; /* a sequence in the batch holds >= 1 token */
            any |= n[i] > 0;
        }
        if (!any) break;
        oscar_errbuf err = {{0}};
        oscar_status s = do_append(&e, &b, K, V, n, rc_randint(&r, 0, 1) * 16, &err);
        cr_assert_eq(s, OSCAR_OK, "seed %llu: append step %d: %s", (unsigned long long)seed, steps, err.msg);
        check_cache(&b, refs, seed, mode == TOKENS ? "token by token" : mode == CHUNKS ? "chunks" : "prefill");
        if (mode != TOKENS || steps % 16 == 0) check_decode(&e, &b, refs, &r, 0, seed);
        steps++;
    }
    check_decode(&e, &b, refs, &r, 0, seed);
    check_decode(&e, &b, refs, &r, 1, seed);
    for (int i = 0; i < nseq; i++) {
        free(K[i]);
        free(V[i]);
        rc_seq_ref_free(&refs[i]);
    }
    free(K);
    free(V);
    free(refs);
    free(maxl);
    free(n);
    rc_paged_free(&b);
    env_free(&e);
}

/* Lengths around the region and page boundaries of a config. */
static int boundary_lens(const cfg *c, int *out) {
    int S = c->S0 + c->W, P = c->P, n = 0;
    int cand[] = {1, c->S0 - 1, c->S0, c->S0 + 1, S - 1, S, S + 1, S + P - 1, S + P, S + P + 1, S + 2 * P - 1,
                  S + 2 * P + 1, S + 3 * P};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
        if (cand[i] >= 1) out[n++] = cand[i];
    return n;
}

static void run_boundaries(const cfg *c) {
    int lens[16];
    int n = boundary_lens(c, lens);
    run_scenario(c, n, lens, TOKENS); /* mixed lengths in one batch */
    run_scenario(c, n, lens, CHUNKS);
    run_scenario(c, n, lens, PREFILL);
}

Test(cpu_backend, oscar2_small_windows_all_schedules) {
    cfg c = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c);
}
Test(cpu_backend, oscar2_lm_per_head_f16_window_f32_meta) {
    cfg c = {128, 64, 16, 3, 5, 4, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0};
    run_boundaries(&c);
    cfg c2 = {64, 64, 16, 2, 6, 8, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    run_boundaries(&c2);
}
Test(cpu_backend, no_recent_window) {
    cfg c = {64, 32, 16, 5, 0, 4, 4, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c);
}
Test(cpu_backend, no_sink) {
    cfg c = {128, 128, 16, 0, 7, 8, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c);
}
Test(cpu_backend, no_windows_at_all) {
    cfg c = {64, 64, 16, 0, 0, 2, 2, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c);
}
Test(cpu_backend, quarot2_and_int2) {
    cfg c = {128, 32, 16, 2, 9, 8, 2, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c);
    cfg c2 = {64, 32, 16, 2, 9, 4, 1, OSCAR_METHOD_INT2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    run_boundaries(&c2);
}
Test(cpu_backend, bf16_method_paged16) {
    cfg c = {128, 128, 16, 64, 256, 8, 2, OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    int lens[] = {1, 15, 16, 17, 47, 48, 49};
    run_scenario(&c, 7, lens, TOKENS);
    run_scenario(&c, 7, lens, CHUNKS);
    run_scenario(&c, 7, lens, PREFILL);
}
/* Default-like shapes: d 256, page 64, big windows, GQA 8. */
Test(cpu_backend, large_shapes_chunks_and_prefill) {
    cfg c = {256, 128, 64, 64, 256, 16, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    int lens[] = {1, 63, 319, 320, 321, 383, 385, 449};
    run_scenario(&c, 8, lens, CHUNKS);
    run_scenario(&c, 8, lens, PREFILL);
    cfg c2 = {128, 64, 64, 16, 64, 32, 4, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    int lens2[] = {79, 80, 81, 143, 144, 145, 207, 300};
    run_scenario(&c2, 8, lens2, TOKENS);
    /* GQA 16: more query heads per KV head than the decode processes at once */
    cfg c3 = {64, 32, 16, 8, 16, 32, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    int lens3[] = {1, 23, 24, 25, 57};
    run_scenario(&c3, 5, lens3, CHUNKS);
}

/* Head dims that are not powers of two (FORMAT.md 3.5, refcheck.h rc_other_dim_shapes) against the
 * reference codec (random rotations through the A (x) S spreading matrix; QUAROT2 with it as R). */
Test(cpu_backend, head_dims_not_powers_of_two) {
    run_boundaries(&rc_other_dim_shapes[0]); /* mixed lengths below, at and past sink + recent, pages not full */
    run_boundaries(&rc_other_dim_shapes[1]);
    for (int i = 2; i < RC_OTHER_DIM_SHAPES; i++) {
        int lens[16];
        int n = boundary_lens(&rc_other_dim_shapes[i], lens);
        run_scenario(&rc_other_dim_shapes[i], n, lens, CHUNKS);
    }
}

/* ---------------------------------------------------------- bad inputs */
typedef struct bad_env {
    env e;
    rc_paged b;
    float *K[2], *V[2];
    void *pages_copy, *windows_copy;
    size_t pages_bytes, windows_bytes;
    uint64_t seed;
    rc_rng r;
} bad_env;

static void bad_setup(bad_env *t, oscar_method m) {
    t->seed = rc_fresh_seed();
    rc_rng_seed(&t->r, t->seed);
    cfg c = {64, 32, 16, 4, 8, 8, 2, m, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    env_init(&t->e, &c, &t->r, t->seed);
    t->e.l.max_seq_len = 100000;
    int32_t maxl[2] = {200, 200};
    cr_assert_eq(rc_paged_init(&t->r, &t->e.l, 2, maxl, 2, &t->b), 0);
    for (int i = 0; i < 2; i++) {
        t->K[i] = malloc(200 * 2 * 64 * sizeof(float));
        t->V[i] = malloc(200 * 2 * 64 * sizeof(float));
        rc_gen_kv(&t->r, 200, 2, 64, 2, OSCAR_DTYPE_BF16, t->K[i]);
        rc_gen_kv(&t->r, 200, 2, 64, 2, OSCAR_DTYPE_BF16, t->V[i]);
    }
    int n[2] = {40, 57};
    oscar_errbuf err;
    cr_assert_eq(do_append(&t->e, &t->b, t->K, t->V, n, 0, &err), OSCAR_OK);
    t->pages_bytes = t->b.page_bytes * (size_t)t->b.num_pages;
    t->windows_bytes = t->b.slot_bytes * (size_t)t->b.num_slots + 1;
    t->pages_copy = malloc(t->pages_bytes);
    t->windows_copy = malloc(t->windows_bytes);
    memcpy(t->pages_copy, t->b.pages, t->pages_bytes);
    memcpy(t->windows_copy, t->b.windows, t->windows_bytes);
}
static void bad_teardown(bad_env *t) {
    for (int i = 0; i < 2; i++) {
        free(t->K[i]);
        free(t->V[i]);
    }
    free(t->pages_copy);
    free(t->windows_copy);
    rc_paged_free(&t->b);
    env_free(&t->e);
}
static void expect_untouched(bad_env *t, const char *what) {
    cr_assert(memcmp(t->pages_copy, t->b.pages, t->pages_bytes) == 0, "seed %llu: %s modified the page pool",
              (unsigned long long)t->seed, what);
    cr_assert(memcmp(t->windows_copy, t->b.windows, t->windows_bytes) == 0, "seed %llu: %s modified the windows",
              (unsigned long long)t->seed, what);
}

/* A raw append of 5 tokens to each sequence with hooks to break inputs. */
static oscar_status raw_append(bad_env *t, oscar_batch *bt, oscar_cache *cc, int32_t *cu, int nan_at, float bad,
                               oscar_errbuf *err) {
    int total = cu[bt->num_seqs > 0 ? bt->num_seqs : 0];
    int HD = 2 * 64;
    uint16_t *kb = calloc((size_t)(total > 0 ? total : 1) * HD, 2), *vb = calloc((size_t)(total > 0 ? total : 1) * HD, 2);
    for (int i = 0; i < total * HD; i++) {
        kb[i] = oscar_f32_to_bf16(t->K[0][i % (200 * HD)]);
        vb[i] = oscar_f32_to_bf16(t->V[0][i % (200 * HD)]);
    }
    if (nan_at >= 0) (nan_at & 1 ? vb : kb)[nan_at / 2] = oscar_f32_to_bf16(bad);
    oscar_backend_append_args a = {.layer = LAYER, .cache = *cc, .batch = *bt, .cu_new = cu, .total_new = total,
                                   .k = kb, .v = vb, .kv_stride = HD, .workspace = t->e.ws,
                                   .workspace_bytes = sizeof t->e.ws};
    oscar_status s = t->e.api->append(t->e.ctx, t->e.plan, &a, err);
    free(kb);
    free(vb);
    return s;
}

static oscar_status raw_decode(bad_env *t, oscar_batch *bt, oscar_cache *cc) {
    uint16_t q[2 * 8 * 64], out[2 * 8 * 64];
    for (int i = 0; i < 2 * 8 * 64; i++) q[i] = oscar_f32_to_bf16((float)rc_normal(&t->r));
    oscar_backend_decode_args a = {.layer = LAYER, .cache = *cc, .batch = *bt, .q = q, .q_stride = 8 * 64,
                                   .out = out, .out_stride = 8 * 64, .sm_scale = 0.125f, .workspace = t->e.ws,
                                   .workspace_bytes = sizeof t->e.ws};
    oscar_errbuf err = {{0}};
    oscar_status s = t->e.api->decode(t->e.ctx, t->e.plan, &a, &err);
    if (s) cr_assert_neq(err.msg[0], 0, "a refused decode explains why");
    return s;
}

#define EXPECT(call, code, what)                                                                                     \
    do {                                                                                                             \
        oscar_errbuf err_ = {{0}};                                                                                   \
        (void)err_;                                                                                                  \
        oscar_status s_ = (call);                                                                                    \
        cr_assert_eq(s_, code, "seed %llu: %s returned %d, want %d", (unsigned long long)t.seed, what, (int)s_,      \
                     (int)code);                                                                                     \
        expect_untouched(&t, what);                                                                                  \
    } while (0)

static void bad_inputs_for(oscar_method m) {
    bad_env t;
    bad_setup(&t, m);
    int32_t lens[2] = {45, 62}, slots[2] = {t.b.window_slots[0], t.b.window_slots[1]};
    int32_t *bt_copy = malloc((size_t)2 * t.b.stride * sizeof(int32_t));
    memcpy(bt_copy, t.b.block_table, (size_t)2 * t.b.stride * sizeof(int32_t));
    int32_t cu[3] = {0, 5, 10};
    oscar_batch bt = {.num_seqs = 2, .seq_lens = lens, .window_slots = slots, .block_table = bt_copy,
                      .block_table_stride = t.b.stride, .max_seq_len = 62};
    oscar_cache cc = cache_of(&t.b);
    oscar_errbuf err = {{0}};
    int quantized = m != OSCAR_METHOD_BF16;
    /* the last needed page of sequence 1 is the one this append writes */
    int last = rc_pages_for(&t.e.l, 62) - 1;
    cr_assert_geq(last, 0);

    /* Each case breaks the valid call in one way; the final valid call must succeed. */
    int32_t keep = bt_copy[t.b.stride + last];
    bt_copy[t.b.stride + last] = t.b.num_pages;
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_BLOCK_TABLE, "append: page id = num_pages");
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_BLOCK_TABLE, "decode: page id = num_pages");
    bt_copy[t.b.stride + last] = -1;
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_BLOCK_TABLE, "append: page id -1");
    bt_copy[t.b.stride + last] = keep;
    if (quantized) {
        slots[0] = t.b.num_slots;
        EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_BLOCK_TABLE, "append: window slot out of range");
        EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_BLOCK_TABLE, "decode: window slot out of range");
        slots[0] = -1;
        EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_BLOCK_TABLE, "append: window slot -1");
        slots[0] = t.b.window_slots[0];
    }
    /* NaN / Inf in the LAST rows of the batch: a writer that validates late
     * would already have stored sequence 0. */
    EXPECT(raw_append(&t, &bt, &cc, cu, 2 * (9 * 128 + 100), NAN, &err), OSCAR_ERR_NONFINITE, "append: NaN K row");
    EXPECT(raw_append(&t, &bt, &cc, cu, 2 * (9 * 128 + 3) + 1, INFINITY, &err), OSCAR_ERR_NONFINITE,
           "append: Inf V row");
    EXPECT(raw_append(&t, &bt, &cc, cu, 2 * (9 * 128 + 5) + 1, -INFINITY, &err), OSCAR_ERR_NONFINITE,
           "append: -Inf V row");
    /* too long: over max_seq_len, and more pages than the block table has */
    lens[1] = 100001;
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_TOO_LONG, "append: seq_len > max_seq_len");
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_TOO_LONG, "decode: seq_len > max_seq_len");
    lens[1] = 62;
    bt.block_table_stride = last; /* one column short */
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_TOO_LONG, "append: block table too narrow");
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_TOO_LONG, "decode: block table too narrow");
    bt.block_table_stride = t.b.stride;
    bt.block_table = NULL; /* allowed only while no sequence needs pages */
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_INVALID_ARGUMENT, "append: NULL block table");
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_INVALID_ARGUMENT, "decode: NULL block table");
    bt.block_table = bt_copy;
    /* zero sequences, a zero-length sequence */
    bt.num_seqs = 0;
    EXPECT(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_ERR_EMPTY, "append: zero sequences");
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_EMPTY, "decode: zero sequences");
    bt.num_seqs = 2;
    lens[0] = 0;
    EXPECT(raw_decode(&t, &bt, &cc), OSCAR_ERR_EMPTY, "decode: seq_len 0");
    lens[0] = 45;
    /* cu_new not monotone; more new tokens than the sequence holds */
    int32_t cu_bad[3] = {0, 6, 5};
    EXPECT(raw_append(&t, &bt, &cc, cu_bad, -1, 0, &err), OSCAR_ERR_INVALID_ARGUMENT, "append: cu_new decreasing");
    int32_t cu_big[3] = {0, 46, 51};
    EXPECT(raw_append(&t, &bt, &cc, cu_big, -1, 0, &err), OSCAR_ERR_INVALID_ARGUMENT, "append: n_i > seq_len");
    cr_assert_neq(err.msg[0], 0, "a refused append explains why");
    cr_assert_eq(raw_append(&t, &bt, &cc, cu, -1, 0, &err), OSCAR_OK, "seed %llu: the repaired call: %s",
                 (unsigned long long)t.seed, err.msg);
    free(bt_copy);
    bad_teardown(&t);
}

Test(cpu_backend, bad_inputs_leave_cache_untouched) {
    bad_inputs_for(OSCAR_METHOD_OSCAR2);
    bad_inputs_for(OSCAR_METHOD_BF16);
}

/* A batch living entirely in the 16-bit windows needs no pages nor block table. */
Test(cpu_backend, windows_only_batch_without_page_pool) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    cfg c = {64, 64, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    env e;
    env_init(&e, &c, &r, seed);
    int32_t maxl[2] = {12, 5};
    rc_paged b;
    cr_assert_eq(rc_paged_init(&r, &e.l, 2, maxl, 0, &b), 0);
    float *K[2], *V[2];
    rc_seq_ref refs[2];
    for (int i = 0; i < 2; i++) {
        K[i] = malloc((size_t)maxl[i] * 2 * 64 * sizeof(float));
        V[i] = malloc((size_t)maxl[i] * 2 * 64 * sizeof(float));
        rc_gen_kv(&r, maxl[i], 2, 64, 2, c.kv, K[i]);
        rc_gen_kv(&r, maxl[i], 2, 64, 2, c.kv, V[i]);
        cr_assert_eq(rc_seq_ref_build(&e.l, layer_rot(&e, 0), layer_rot(&e, 1), e.num_rot, e.clip_k + LAYER * e.l.num_kv_heads,
                                      e.clip_v + LAYER * e.l.num_kv_heads, maxl[i], K[i], V[i], &refs[i]), 0);
    }
    free(b.block_table);
    b.block_table = NULL;
    free(b.pages);
    b.pages = NULL;
    b.num_pages = 0;
    int n[2] = {12, 5};
    oscar_errbuf err = {{0}};
    cr_assert_eq(do_append(&e, &b, K, V, n, 0, &err), OSCAR_OK, "seed %llu: %s", (unsigned long long)seed, err.msg);
    check_decode(&e, &b, refs, &r, 0, seed);
    for (int i = 0; i < 2; i++) {
        free(K[i]);
        free(V[i]);
        rc_seq_ref_free(&refs[i]);
    }
    rc_paged_free(&b);
    env_free(&e);
}

Test(cpu_backend, plan_refuses_bad_descriptors) {
    const oscar_backend_api *api = oscar_cpu_backend();
    oscar_backend_plan_desc pd = {0};
    oscar_layout_default(&pd.layout);
    pd.num_layers = 1;
    pd.num_rot = 1;
    pd.identity_rotation = 1;
    void *plan = NULL;
    oscar_errbuf err = {{0}};
    pd.layout.head_dim = 100; /* not a multiple of 16 */
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    pd.layout.head_dim = 272; /* past 256 */
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    pd.layout.head_dim = 96;
    pd.layout.group = 64; /* does not divide 96 */
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_GROUP);
    pd.layout.head_dim = 128;
    pd.layout.group = 48;
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_GROUP);
    pd.layout.group = 128;
    pd.layout.method = OSCAR_METHOD_KIVI2;
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED);
    pd.layout.method = OSCAR_METHOD_OSCAR2;
    pd.identity_rotation = 0;
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_neq(err.msg[0], 0);
    pd.identity_rotation = 1;
    cr_assert_eq(api->plan_create(NULL, &pd, &plan, NULL, 0, &err), OSCAR_OK, "%s", err.msg);
    api->plan_destroy(NULL, plan);
    /* host memory helpers */
    void *buf = NULL;
    cr_assert_eq(api->alloc(NULL, 1000, &buf, &err), OSCAR_OK);
    cr_assert_eq((uintptr_t)buf % 64, 0);
    char src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (char)i;
    cr_assert_eq(api->write(NULL, buf, 0, src, 1000, NULL, &err), OSCAR_OK);
    cr_assert_eq(api->read(NULL, dst, buf, 10, 990, NULL, &err), OSCAR_OK);
    cr_assert(memcmp(dst, src + 10, 990) == 0);
    api->free(NULL, buf);
    cr_assert_gt(api->probe(0, &err), 0);
}

/* The shared comparison helper must see a single flipped code, metadata
 * value or window byte, also in its tolerant (GPU) mode. */
Test(refcheck, compare_detects_corruption) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    cfg c = {64, 32, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    env e;
    env_init(&e, &c, &r, seed);
    int L = 60;
    float *K = malloc((size_t)L * 2 * 64 * sizeof(float)), *V = malloc((size_t)L * 2 * 64 * sizeof(float));
    rc_gen_kv(&r, L, 2, 64, 2, c.kv, K);
    rc_gen_kv(&r, L, 2, 64, 2, c.kv, V);
    rc_seq_ref ref;
    cr_assert_eq(rc_seq_ref_build(&e.l, layer_rot(&e, 0), layer_rot(&e, 1), e.num_rot, e.clip_k + LAYER * e.l.num_kv_heads,
                                  e.clip_v + LAYER * e.l.num_kv_heads, L, K, V, &ref), 0);
    rc_paged b;
    int32_t maxl = L;
    cr_assert_eq(rc_paged_init(&r, &e.l, 1, &maxl, 0, &b), 0);
    int n = L;
    oscar_errbuf err;
    cr_assert_eq(do_append(&e, &b, &K, &V, &n, 0, &err), OSCAR_OK);
    char msg[256];
    const int32_t *bt = b.block_table;
    cr_assert_eq(rc_compare_seq(&ref, L, b.pages, b.windows, bt, b.window_slots[0], 0, msg, sizeof msg), 0, "%s", msg);
    /* 2-bit position 20 (history index 16: page 1, row 0), V codes, head 1 */
    uint8_t *vc = (uint8_t *)b.pages + (size_t)bt[1] * b.page_bytes + b.g.v_codes + (size_t)(1 * 16 + 0) * 16;
    uint8_t keep = vc[3];
    vc[3] ^= 0x0c; /* value 13: code changes by 1, 2 or 3 levels */
    int tolerant = rc_compare_seq(&ref, L, b.pages, b.windows, bt, b.window_slots[0], 1, msg, sizeof msg);
    cr_assert_eq(rc_compare_seq(&ref, L, b.pages, b.windows, bt, b.window_slots[0], 0, msg, sizeof msg), 1, "%s", msg);
    cr_assert(strstr(msg, "position 20") && strstr(msg, "2-bit"), "%s", msg);
    cr_assert_leq(tolerant, 1); /* tolerant mode may forgive only a boundary case */
    vc[3] = keep;
    /* K metadata (scale of group 0) of position 5 (history row 1), head 0 */
    uint16_t *km = (uint16_t *)((char *)b.pages + (size_t)bt[0] * b.page_bytes + b.g.k_meta) + 1 * 2 + 2;
    uint16_t km0 = *km;
    *km ^= 0x0400; /* exponent bit: far more than one ulp */
    cr_assert_eq(rc_compare_seq(&ref, L, b.pages, b.windows, bt, b.window_slots[0], 1, msg, sizeof msg), 1, "%s", msg);
    *km = km0;
    /* recent window row of the last position, K head 0, one bf16 mantissa bit */
    size_t wrow = 4 + (size_t)((L - 1 - 4) % 8);
    uint16_t *w = (uint16_t *)((char *)b.windows + (size_t)b.window_slots[0] * b.slot_bytes) + wrow * 64 + 7;
    *w ^= 1;
    cr_assert_eq(rc_compare_seq(&ref, L, b.pages, b.windows, bt, b.window_slots[0], 1, msg, sizeof msg), 1, "%s", msg);
    cr_assert(strstr(msg, "recent"), "%s", msg);
    free(K);
    free(V);
    rc_seq_ref_free(&ref);
    rc_paged_free(&b);
    env_free(&e);
}
