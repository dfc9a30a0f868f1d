/* GPU engine host bookkeeping (engine/gpu/ge_sched.c), tested on the CPU:
 * KV sizing against the storage format's arithmetic, largest batch for a
 * budget against brute force, the page allocator (all or nothing, double
 * frees refused), page reference counts, shared-prefix admission (full
 * pages referenced, the partly written last page and the window left to the
 * engine's copy, pages back only when their last holder finishes) and the
 * FIFO scheduler under random request streams (no page leaks, no page owned
 * twice, FIFO order, budget respected). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../engine/gpu/ge_sched.c"

static unsigned seed_now(void)
{
    static unsigned counter;
    return (unsigned)time(NULL) * 2654435761u + ++counter * 40503u;
}

static uint32_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static oscar_layout_desc qwen3_8b(oscar_method m)
{
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.num_q_heads = 32;
    l.num_kv_heads = 8;
    l.method = m;
    l.max_seq_len = 131072;
    return l;
}

/* Qwen3-8B's layout with a random method, page size, windows and KV head count. */
static oscar_layout_desc random_layout(uint64_t *s)
{
    const oscar_method ms[] = {OSCAR_METHOD_OSCAR2, OSCAR_METHOD_INT2, OSCAR_METHOD_BF16, OSCAR_METHOD_OSCAR2_LM};
    oscar_layout_desc l = qwen3_8b(ms[rnd(s) % 4]);
    l.page_size = 16 << (rnd(s) % 4);
    l.sink = (int)(rnd(s) % 130);
    l.recent = (int)(rnd(s) % 300);
    l.num_kv_heads = 1 << (rnd(s) % 4);
    return l;
}

Test(e2e_sizing, qwen3_8b_bytes_match_the_format)
{
    /* FORMAT.md 3.3/3.4: d 128, G 128, P 64, H 8, F16 meta: 36864-byte 2-bit
     * pages; BF16 pages K [8][64][128] + V of bf16 = 262144; windows
     * 2 * 8 * (64 + 256) * 128 * 2 = 1310720 bytes. */
    oscar_layout_desc o = qwen3_8b(OSCAR_METHOD_OSCAR2), b = qwen3_8b(OSCAR_METHOD_BF16);
    size_t by;
    cr_assert_eq(ge_kv_seq_bytes(&o, 36, NULL, 8192 + 1024, &by), OSCAR_OK);
    int64_t pages = (8192 + 1024 - 64 - 256 + 63) / 64;
    cr_assert_eq(by, (size_t)36 * ((size_t)pages * 36864 + 1310720), "oscar2 bytes %zu", by);
    cr_assert_eq(ge_kv_seq_bytes(&b, 36, NULL, 8192 + 1024, &by), OSCAR_OK);
    cr_assert_eq(by, (size_t)36 * (size_t)((8192 + 1024) / 64) * 262144, "bf16 bytes %zu", by);
    double bpt;
    cr_assert_eq(ge_kv_bytes_per_token(&b, 36, NULL, &bpt), OSCAR_OK);
    cr_assert_float_eq(bpt, 36.0 * 8 * 128 * 2 * 2, 1e-9);
    cr_assert_eq(ge_kv_bytes_per_token(&o, 36, NULL, &bpt), OSCAR_OK);
    cr_assert_float_eq(bpt, 36.0 * 36864 / 64, 1e-9);
    /* Short sequences live in the windows only: no pages. */
    cr_assert_eq(ge_kv_seq_bytes(&o, 36, NULL, 320, &by), OSCAR_OK);
    cr_assert_eq(by, (size_t)36 * 1310720);
    cr_assert_neq(ge_kv_seq_bytes(&o, 0, NULL, 320, &by), OSCAR_OK);
    cr_assert_neq(ge_kv_seq_bytes(&o, 36, NULL, -1, &by), OSCAR_OK);
    oscar_layout_desc bad = o;
    bad.head_dim = 96;
    cr_assert_neq(ge_kv_seq_bytes(&bad, 36, NULL, 10, &by), OSCAR_OK);
    cr_assert(strlen(ge_last_error()) > 0);
}

/* Brute force: does a batch of b sequences of len tokens fit the budget? */
static int fits(const oscar_layout_desc *l, int layers, size_t budget, int64_t len, int b)
{
    oscar_layout_sizes sz;
    oscar_layout_sizes_get(l, &sz);
    int64_t pages;
    oscar_layout_pages_for(l, len, &pages);
    size_t wb = l->method == OSCAR_METHOD_BF16 ? 0 : sz.window_slot_bytes;
    size_t per_layer = budget / (size_t)layers;
    if ((size_t)b * wb > per_layer) return 0;
    return (int64_t)((per_layer - (size_t)b * wb) / sz.page_bytes) >= (int64_t)b * pages;
}

Test(e2e_sizing, largest_batch_is_largest)
{
    unsigned seed = seed_now();
    uint64_t s = seed;
    for (int it = 0; it < 300; it++) {
        oscar_layout_desc l = random_layout(&s);
        l.group = 32 << (rnd(&s) % 3);
        int layers = 1 + (int)(rnd(&s) % 40);
        int64_t len = 1 + rnd(&s) % 140000;
        size_t budget = (size_t)(rnd(&s) % 60000) * (1u << 20) + rnd(&s) % 4096;
        int b = -1;
        ge_kv_plan p;
        cr_assert_eq(ge_max_batch(&l, layers, NULL, budget, len, &b, &p), OSCAR_OK, "seed %u: %s", seed, ge_last_error());
        cr_assert(b >= 0);
        if (b > 0) {
            cr_assert(fits(&l, layers, budget, len, b), "seed %u it %d: batch %d reported but does not fit", seed, it, b);
            cr_assert_leq(p.total_bytes, budget, "seed %u: plan %zu over budget %zu", seed, p.total_bytes, budget);
            cr_assert_eq(p.num_slots, b);
            int64_t pages;
            oscar_layout_pages_for(&l, len, &pages);
            cr_assert_geq((int64_t)p.num_pages, pages * b, "seed %u", seed);
        }
        cr_assert_not(fits(&l, layers, budget, len, b + 1), "seed %u it %d: batch %d fits too (len %lld, budget %zu)",
                      seed, it, b + 1, (long long)len, budget);
    }
}

Test(e2e_sizing, plan_refuses_slots_over_budget)
{
    oscar_layout_desc o = qwen3_8b(OSCAR_METHOD_OSCAR2);
    ge_kv_plan p;
    cr_assert_eq(ge_kv_plan_for(&o, 36, NULL, 36u * 1310720u * 3u, 4, &p), OSCAR_ERR_OUT_OF_MEMORY);
    cr_assert_eq(ge_kv_plan_for(&o, 36, NULL, 36u * (1310720u * 3u + 36864u * 5u + 7u), 3, &p), OSCAR_OK);
    cr_assert_eq(p.num_pages, 5);
    cr_assert_eq(p.num_slots, 3);
}

/* Without per-layer pages (layer_page_bytes NULL, or every layer the layout's page), the sizing is
 * the one before per-layer pages: per layer budget / num_layers, num_layers x one page size. */
Test(e2e_sizing, one_page_size_as_before)
{
    unsigned seed = seed_now();
    uint64_t s = seed;
    for (int it = 0; it < 300; it++) {
        oscar_layout_desc l = random_layout(&s);
        int layers = 1 + (int)(rnd(&s) % 40), slots = 1 + (int)(rnd(&s) % 64);
        int64_t len = rnd(&s) % 140000;
        size_t budget = (size_t)(rnd(&s) % 60000) * (1u << 20) + rnd(&s) % 4096;
        oscar_layout_sizes sz;
        cr_assert_eq(oscar_layout_sizes_get(&l, &sz), OSCAR_OK);
        size_t *pb = malloc((size_t)layers * sizeof *pb);
        for (int i = 0; i < layers; i++) pb[i] = sz.page_bytes;
        size_t wb = l.method == OSCAR_METHOD_BF16 ? 0 : sz.window_slot_bytes;
        int64_t pages;
        oscar_layout_pages_for(&l, len, &pages);
        for (int v = 0; v < 2; v++) {
            const size_t *arr = v ? pb : NULL;
            size_t by;
            cr_assert_eq(ge_kv_seq_bytes(&l, layers, arr, len, &by), OSCAR_OK, "%s", ge_last_error());
            cr_assert_eq(by, (size_t)layers * ((size_t)pages * sz.page_bytes + wb), "seed %u it %d", seed, it);
            double bpt;
            cr_assert_eq(ge_kv_bytes_per_token(&l, layers, arr, &bpt), OSCAR_OK);
            cr_assert_eq(bpt, (double)layers * (double)sz.page_bytes / (double)l.page_size, "seed %u it %d", seed, it);
            ge_kv_plan p;
            size_t per_layer = budget / (size_t)layers;
            oscar_status st = ge_kv_plan_for(&l, layers, arr, budget, slots, &p);
            if ((size_t)slots * wb > per_layer) {
                cr_assert_eq(st, OSCAR_ERR_OUT_OF_MEMORY, "seed %u it %d", seed, it);
                continue;
            }
            cr_assert_eq(st, OSCAR_OK, "seed %u it %d: %s", seed, it, ge_last_error());
            size_t np = (per_layer - (size_t)slots * wb) / sz.page_bytes;
            if (np > INT32_MAX) np = INT32_MAX;
            cr_assert_eq(p.num_pages, (int32_t)np, "seed %u it %d: %d pages, before %zu", seed, it, p.num_pages, np);
            cr_assert_eq(p.page_bytes, sz.page_bytes);
            cr_assert_eq(p.pool_bytes_per_layer, np * sz.page_bytes);
            cr_assert_eq(p.window_bytes_per_layer, (size_t)slots * wb);
            cr_assert_eq(p.total_bytes, (size_t)layers * (np * sz.page_bytes + (size_t)slots * wb));
            cr_assert_eq(p.page_bytes_all_layers, (size_t)layers * sz.page_bytes);
            cr_assert_eq(p.pool_bytes, (size_t)layers * np * sz.page_bytes);
        }
        free(pb);
    }
}

/* tiny-qwen3's shape (8 layers, 16/2 heads, d 128) with 3-bit head-tensors in layers 2 (one) and 5 (two). */
static oscar_params *wide_params(void)
{
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 8, 16, 2, 128, &p), OSCAR_OK, "%s",
                 oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 1, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 5, 0, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 5, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    return p;
}

static oscar_layout_desc tiny_qwen3(oscar_method m)
{
    oscar_layout_desc l = qwen3_8b(m);
    l.num_q_heads = 16;
    l.num_kv_heads = 2;
    l.max_seq_len = 4096;
    return l;
}

/* Per-layer pages (FORMAT.md §3.3, wide_per_layer 1): the layout and page sizes the engine derives
 * from the parameters are the library's (oscar_plan_layer_sizes of a CPU plan), and the sizing
 * counts each layer's own page: a page id costs the sum of the layers' pages. */
Test(e2e_sizing, per_layer_pages_of_wide_params)
{
    oscar_params *p = wide_params();
    oscar_layout_desc l = tiny_qwen3(OSCAR_METHOD_OSCAR2);
    size_t pb[8];
    int most = -1;
    cr_assert_eq(ge_kv_wide_layout(p, 8, &l, pb, &most), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(most, 2);
    cr_assert_eq(l.wide_tensors, 2);
    cr_assert_eq(l.wide_per_layer, 1);
    /* 2-bit page 2 * 2 * 64 * 32 + 2 * 2 * 64 * 2 * 2 = 9216 bytes (FORMAT.md: 10240 with one plane of 1024). */
    const size_t want[8] = {9216, 9216, 10240, 9216, 9216, 11264, 9216, 9216};
    size_t sum = 0;
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(pb[i], want[i], "layer %d: %zu", i, pb[i]);
        sum += pb[i];
    }
    cr_assert_eq(sum, 8 * 9216 + 3 * 1024);
    /* The same as the library says for a plan of these parameters. */
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt = NULL;
    oscar_plan *plan = NULL;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_create(rt, &l, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    for (int i = 0; i < 8; i++) {
        oscar_layout_sizes lsz;
        cr_assert_eq(oscar_plan_layer_sizes(plan, i, &lsz), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(lsz.page_bytes, pb[i], "layer %d: library %zu, engine %zu", i, lsz.page_bytes, pb[i]);
    }
    oscar_plan_destroy(plan);
    /* Without these planes the plan is refused (the layout has to be the widened one). */
    oscar_layout_desc plain = tiny_qwen3(OSCAR_METHOD_OSCAR2);
    cr_assert_eq(oscar_plan_create(rt, &plain, p, &plan), OSCAR_ERR_SHAPE_MISMATCH);
    oscar_runtime_destroy(rt);

    /* Sizing: a sequence's pages cost the sum of the layers' pages. */
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(&l, &sz), OSCAR_OK);
    cr_assert_eq(sz.page_bytes, 11264, "the layout's page is the largest");
    const size_t wb = sz.window_slot_bytes; /* 2 * 2 * 320 * 128 * 2 */
    cr_assert_eq(wb, 327680);
    size_t by;
    int64_t pages;
    oscar_layout_pages_for(&l, 4096, &pages);
    cr_assert_eq(ge_kv_seq_bytes(&l, 8, pb, 4096, &by), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(by, (size_t)pages * sum + 8 * wb);
    double bpt;
    cr_assert_eq(ge_kv_bytes_per_token(&l, 8, pb, &bpt), OSCAR_OK);
    cr_assert_float_eq(bpt, (double)sum / 64.0, 1e-12);
    /* One page size for all (the largest, NULL) costs more than per-layer pages. */
    size_t by_one;
    cr_assert_eq(ge_kv_seq_bytes(&l, 8, NULL, 4096, &by_one), OSCAR_OK);
    cr_assert_eq(by_one, (size_t)pages * 8 * 11264 + 8 * wb);
    cr_assert_lt(by, by_one);
    ge_kv_plan kp;
    const size_t budget = 8 * 4 * wb + 1000 * sum + 777;
    cr_assert_eq(ge_kv_plan_for(&l, 8, pb, budget, 4, &kp), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(kp.num_pages, 1000);
    cr_assert_eq(kp.page_bytes_all_layers, sum);
    cr_assert_eq(kp.pool_bytes, 1000 * sum);
    cr_assert_eq(kp.page_bytes, 11264);
    cr_assert_eq(kp.total_bytes, 1000 * sum + 8 * 4 * wb);
    cr_assert_leq(kp.total_bytes, budget);
    cr_assert_eq(ge_kv_plan_for(&l, 8, NULL, budget, 4, &kp), OSCAR_OK);
    cr_assert_eq(kp.num_pages, (int32_t)((1000 * sum + 777) / (8 * 11264)));
    /* Bits per element: the average of the layers' (2.25 + n / 4 paged). */
    double bits, b_one, b_plain;
    cr_assert_eq(ge_kv_bits_per_element(&l, 8, pb, 4096, &bits), OSCAR_OK, "%s", ge_last_error());
    oscar_layout_desc one = l;
    one.wide_per_layer = 0;
    one.wide_tensors = 0;
    oscar_layout_bits_per_element(&one, 4096, &b_plain);
    one.wide_tensors = 1;
    oscar_layout_bits_per_element(&one, 4096, &b_one);
    const double paged = (double)(4096 - 64 - 256) / 4096.0;
    cr_assert_float_eq(b_one - b_plain, paged * 0.25, 1e-9);
    cr_assert_float_eq(bits, b_plain + paged * 0.25 * 3.0 / 8.0, 1e-9, "bits %.6f", bits);
    cr_assert_eq(ge_kv_bits_per_element(&l, 8, NULL, 4096, &bits), OSCAR_OK);
    cr_assert_float_eq(bits, b_plain + paged * 0.5, 1e-9, "the layout's own figure: every layer two planes");

    /* Arrays that are not pages of this layout are refused. */
    size_t bad[8];
    memcpy(bad, pb, sizeof bad);
    bad[3] = 9216 - 16;
    cr_assert_eq(ge_kv_seq_bytes(&l, 8, bad, 4096, &by), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(ge_last_error(), "layer 3") != NULL, "%s", ge_last_error());
    bad[3] = 11264 + 1024;
    cr_assert_eq(ge_kv_plan_for(&l, 8, bad, budget, 4, &kp), OSCAR_ERR_INVALID_ARGUMENT);
    bad[3] = 9216 + 8;
    cr_assert_eq(ge_kv_bytes_per_token(&l, 8, bad, &bpt), OSCAR_ERR_INVALID_ARGUMENT);
    bad[3] = 9216 + 512; /* a multiple of 16 but half a plane */
    cr_assert_eq(ge_kv_bits_per_element(&l, 8, bad, 4096, &bits), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_params_destroy(p);
}

/* Parameters without 3-bit head-tensors, and methods other than oscar2, leave the layout alone. */
Test(e2e_sizing, wide_layout_only_for_wide_oscar2)
{
    oscar_params *b = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 8, 16, 2, 128, &b), OSCAR_OK);
    const oscar_method ms[] = {OSCAR_METHOD_OSCAR2, OSCAR_METHOD_OSCAR2_LM, OSCAR_METHOD_INT2, OSCAR_METHOD_BF16};
    oscar_params *w = wide_params();
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 3; v++) {
            const oscar_params *p = v == 0 ? NULL : v == 1 ? b : w;
            if (v == 2 && k == 0) continue; /* the widened case above */
            oscar_layout_desc l = tiny_qwen3(ms[k]), before = l;
            size_t pb[8];
            int most = -1;
            cr_assert_eq(ge_kv_wide_layout(p, 8, &l, pb, &most), OSCAR_OK, "%s", ge_last_error());
            cr_assert_eq(most, 0);
            cr_assert_eq(memcmp(&l, &before, sizeof l), 0, "method %d params %d: layout changed", k, v);
            oscar_layout_sizes sz;
            oscar_layout_sizes_get(&l, &sz);
            for (int i = 0; i < 8; i++) cr_assert_eq(pb[i], sz.page_bytes);
        }
    /* Parameters of another model are refused. */
    oscar_layout_desc l = tiny_qwen3(OSCAR_METHOD_OSCAR2);
    size_t pb[9];
    cr_assert_eq(ge_kv_wide_layout(w, 9, &l, pb, NULL), OSCAR_ERR_SHAPE_MISMATCH);
    l.num_kv_heads = 4;
    cr_assert_eq(ge_kv_wide_layout(w, 8, &l, pb, NULL), OSCAR_ERR_SHAPE_MISMATCH);
    oscar_params_destroy(w);
    oscar_params_destroy(b);
}

/* Brute force with per-layer pages: every layer num_pages pages of its own size. */
static int fits_layers(const oscar_layout_desc *l, int layers, const size_t *pb, size_t budget, int64_t len, int b)
{
    oscar_layout_sizes sz;
    oscar_layout_sizes_get(l, &sz);
    int64_t pages;
    oscar_layout_pages_for(l, len, &pages);
    size_t bytes = (size_t)layers * (size_t)b * sz.window_slot_bytes;
    for (int i = 0; i < layers; i++) bytes += (size_t)b * (size_t)pages * pb[i];
    return bytes <= budget;
}

Test(e2e_sizing, largest_batch_with_per_layer_pages)
{
    unsigned seed = seed_now();
    uint64_t s = seed;
    for (int it = 0; it < 300; it++) {
        oscar_layout_desc l = random_layout(&s);
        l.method = OSCAR_METHOD_OSCAR2;
        l.group = 32 << (rnd(&s) % 3);
        l.wide_tensors = 1 + (int)(rnd(&s) % (2 * l.num_kv_heads));
        l.wide_per_layer = 1;
        int layers = 1 + (int)(rnd(&s) % 40);
        oscar_layout_desc plain = l;
        plain.wide_tensors = plain.wide_per_layer = 0;
        oscar_layout_sizes psz;
        cr_assert_eq(oscar_layout_sizes_get(&plain, &psz), OSCAR_OK);
        size_t pb[40];
        for (int i = 0; i < layers; i++)
            pb[i] = psz.page_bytes + (size_t)(rnd(&s) % (l.wide_tensors + 1)) * (size_t)l.page_size * 128 / 8;
        int64_t len = 1 + rnd(&s) % 140000;
        size_t budget = (size_t)(rnd(&s) % 60000) * (1u << 20) + rnd(&s) % 4096;
        int b = -1;
        ge_kv_plan p;
        cr_assert_eq(ge_max_batch(&l, layers, pb, budget, len, &b, &p), OSCAR_OK, "seed %u: %s", seed, ge_last_error());
        cr_assert(b >= 0);
        if (b > 0) {
            cr_assert(fits_layers(&l, layers, pb, budget, len, b), "seed %u it %d: batch %d does not fit", seed, it, b);
            cr_assert_leq(p.total_bytes, budget, "seed %u", seed);
            int64_t pages;
            oscar_layout_pages_for(&l, len, &pages);
            cr_assert_geq((int64_t)p.num_pages, pages * b, "seed %u", seed);
        }
        cr_assert_not(fits_layers(&l, layers, pb, budget, len, b + 1), "seed %u it %d: batch %d fits too", seed, it,
                      b + 1);
        /* Never fewer sequences than with every layer at the largest page. */
        int b_one = -1;
        cr_assert_eq(ge_max_batch(&l, layers, NULL, budget, len, &b_one, NULL), OSCAR_OK);
        cr_assert_geq(b, b_one, "seed %u it %d", seed, it);
    }
}

/* oscar2, sink 4, recent 8, pages of 16: hand-checkable page counts. */
static oscar_layout_desc small_layout(int max_seq_len)
{
    oscar_layout_desc l = qwen3_8b(OSCAR_METHOD_OSCAR2);
    l.sink = 4;
    l.recent = 8;
    l.page_size = 16;
    l.max_seq_len = max_seq_len;
    return l;
}

Test(e2e_pages, alloc_free_all_or_nothing)
{
    unsigned seed = seed_now();
    uint64_t s = seed;
    ge_pages a;
    int32_t cap = 1 + (int32_t)(rnd(&s) % 500);
    cr_assert_eq(ge_pages_init(&a, cap), OSCAR_OK);
    int32_t *held = malloc((size_t)cap * sizeof *held), n_held = 0;
    int32_t *buf = malloc(((size_t)cap + 10) * sizeof *buf);
    for (int it = 0; it < 5000; it++) {
        if (rnd(&s) % 2) {
            int32_t n = (int32_t)(rnd(&s) % (uint32_t)(cap / 4 + 2));
            for (int32_t i = 0; i < n; i++) buf[i] = -7;
            oscar_status st = ge_pages_alloc(&a, n, buf);
            if (n > cap - n_held) {
                cr_assert_eq(st, OSCAR_ERR_OUT_OF_MEMORY, "seed %u", seed);
                for (int32_t i = 0; i < n; i++) cr_assert_eq(buf[i], -7, "seed %u: failed alloc wrote ids", seed);
                cr_assert_eq(a.n_free, cap - n_held);
            } else {
                cr_assert_eq(st, OSCAR_OK, "seed %u", seed);
                for (int32_t i = 0; i < n; i++) {
                    cr_assert(buf[i] >= 0 && buf[i] < cap);
                    for (int32_t j = 0; j < n_held; j++) cr_assert_neq(buf[i], held[j], "seed %u: page handed out twice", seed);
                    held[n_held++] = buf[i];
                }
            }
        } else if (n_held) {
            int32_t n = 1 + (int32_t)(rnd(&s) % (uint32_t)n_held);
            /* free a random subset: the last n after a shuffle */
            for (int32_t i = n_held - 1; i > 0; i--) {
                int32_t j = (int32_t)(rnd(&s) % (uint32_t)(i + 1)), t = held[i];
                held[i] = held[j];
                held[j] = t;
            }
            cr_assert_eq(ge_pages_free(&a, n, held + n_held - n), OSCAR_OK, "seed %u", seed);
            /* a double free is refused and changes nothing */
            int32_t nf = a.n_free;
            cr_assert_eq(ge_pages_free(&a, 1, held + n_held - 1), OSCAR_ERR_BLOCK_TABLE, "seed %u", seed);
            cr_assert_eq(a.n_free, nf);
            n_held -= n;
        }
        cr_assert_eq(a.n_free + n_held, cap, "seed %u: leak", seed);
    }
    int32_t oob = cap;
    cr_assert_eq(ge_pages_free(&a, 1, &oob), OSCAR_ERR_BLOCK_TABLE);
    free(held);
    free(buf);
    ge_pages_release(&a);
}

Test(e2e_sched, random_streams_fifo_no_leaks)
{
    unsigned seed = seed_now();
    uint64_t s = seed;
    char msg[256];
    for (int round = 0; round < 20; round++) {
        oscar_layout_desc l = qwen3_8b(rnd(&s) % 2 ? OSCAR_METHOD_BF16 : OSCAR_METHOD_OSCAR2);
        l.page_size = 16 << (rnd(&s) % 3);
        l.sink = (int)(rnd(&s) % 40);
        l.recent = (int)(rnd(&s) % 80);
        l.max_seq_len = 200 + (int)(rnd(&s) % 2000);
        int32_t slots = 1 + (int32_t)(rnd(&s) % 12);
        int64_t max_pages;
        oscar_layout_pages_for(&l, l.max_seq_len, &max_pages);
        int32_t pages = (int32_t)(max_pages / 2 + rnd(&s) % (uint32_t)(3 * max_pages + 1));
        ge_sched sc;
        cr_assert_eq(ge_sched_init(&sc, &l, pages, slots), OSCAR_OK, "%s", ge_last_error());
        int32_t nreq = 10 + (int32_t)(rnd(&s) % 60), accepted = 0;
        int32_t *order = malloc(((size_t)nreq + 1) * sizeof *order);
        for (int32_t r = 0; r < nreq; r++) {
            int32_t pl = 1 + (int32_t)(rnd(&s) % (uint32_t)l.max_seq_len), mn = (int32_t)(rnd(&s) % 300), id;
            oscar_status st = ge_sched_submit(&sc, pl, mn, &id);
            int64_t need;
            oscar_layout_pages_for(&l, (int64_t)pl + mn, &need);
            if ((int64_t)pl + mn > l.max_seq_len) cr_assert_eq(st, OSCAR_ERR_TOO_LONG, "seed %u", seed);
            else if (need > pages) cr_assert_eq(st, OSCAR_ERR_OUT_OF_MEMORY, "seed %u", seed);
            else {
                cr_assert_eq(st, OSCAR_OK, "seed %u: %s", seed, ge_last_error());
                cr_assert_eq(id, accepted, "seed %u: ids are dense", seed);
                accepted++;
            }
        }
        int32_t admitted_total = 0, finished = 0, guard = 0;
        int32_t *out = malloc((size_t)slots * sizeof *out);
        while (finished < accepted) {
            cr_assert(++guard < 100000, "seed %u: scheduler stalled", seed);
            int32_t n = -1;
            int32_t max_tok = 1 + (int32_t)(rnd(&s) % 3000);
            cr_assert_eq(ge_sched_admit(&sc, max_tok, out, &n), OSCAR_OK);
            int32_t tok = 0;
            for (int32_t i = 0; i < n; i++) {
                int32_t req = sc.slots[out[i]].req;
                cr_assert_eq(req, admitted_total, "seed %u: admission out of FIFO order", seed);
                cr_assert_eq(sc.reqs[req].slot, out[i]);
                order[admitted_total++] = req;
                tok += sc.reqs[req].prompt_len;
            }
            if (n > 1) cr_assert_leq(tok, max_tok, "seed %u: prefill token cap exceeded", seed);
            /* Nothing admitted while nothing runs would be a stall: the head must fit an empty pool. */
            if (sc.running == 0) cr_assert_eq(sc.head, sc.n_reqs, "seed %u: head does not fit an empty cache", seed);
            cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "seed %u: %s", seed, msg);
            /* Advance every running sequence: prompt first, then one token at a time; some finish. */
            for (int32_t sl = 0; sl < slots; sl++) {
                ge_slot *q = &sc.slots[sl];
                if (q->state == GE_SLOT_FREE) continue;
                int32_t step = q->state == GE_SEQ_PREFILL ? sc.reqs[q->req].prompt_len : 1;
                if (q->len + step <= q->target && rnd(&s) % 4) {
                    int32_t sl_lens = -1, ws = -1, cu[2] = {0, 0}, ml = 0; /* set by ge_sched_batch */
                    int32_t *bt = malloc((size_t)sc.stride * sizeof *bt);
                    cr_assert_eq(ge_sched_batch(&sc, 1, &sl, &step, &sl_lens, &ws, bt, cu, &ml), OSCAR_OK);
                    cr_assert_eq(sl_lens, q->len + step);
                    cr_assert_eq(ws, sl);
                    cr_assert_eq(cu[1], step);
                    int64_t need;
                    oscar_layout_pages_for(&l, sl_lens, &need);
                    for (int64_t j = 0; j < need; j++) cr_assert(bt[j] >= 0 && bt[j] < pages, "seed %u", seed);
                    free(bt);
                    cr_assert_eq(ge_sched_advance(&sc, sl, step), OSCAR_OK);
                }
                if (q->len >= q->target || rnd(&s) % 16 == 0) {
                    cr_assert_eq(ge_sched_finish(&sc, sl), OSCAR_OK);
                    finished++;
                }
            }
            cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "seed %u: %s", seed, msg);
            cr_assert_leq(sc.running, slots);
        }
        cr_assert_eq(admitted_total, accepted);
        cr_assert_eq(sc.pages.n_free, pages, "seed %u: pages leaked", seed);
        cr_assert_eq(ge_sched_finish(&sc, 0), OSCAR_ERR_INVALID_ARGUMENT);
        free(out);
        free(order);
        ge_sched_release(&sc);
    }
}

Test(e2e_sched, batch_arrays_and_refusals)
{
    oscar_layout_desc l = small_layout(100);
    ge_sched sc;
    cr_assert_eq(ge_sched_init(&sc, &l, 12, 3), OSCAR_OK);
    cr_assert_eq(sc.stride, 6); /* ceil((100 - 12) / 16) */
    cr_assert_eq(ge_sched_submit(&sc, 60, 40, NULL), OSCAR_OK);  /* 6 pages */
    cr_assert_eq(ge_sched_submit(&sc, 10, 2, NULL), OSCAR_OK);   /* 0 pages */
    cr_assert_eq(ge_sched_submit(&sc, 50, 10, NULL), OSCAR_OK);  /* 3 pages */
    cr_assert_eq(ge_sched_submit(&sc, 90, 0, NULL), OSCAR_OK);   /* 5 pages: waits */
    cr_assert_eq(ge_sched_submit(&sc, 90, 11, NULL), OSCAR_ERR_TOO_LONG);
    int32_t out[3], n;
    cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(sc.pages.n_free, 3);
    int32_t slots[3] = {out[0], out[1], out[2]}, nt[3] = {60, 10, 50};
    int32_t lens[3], ws[3], cu[4], ml, bt[18];
    memset(bt, 0x7f, sizeof bt);
    cr_assert_eq(ge_sched_batch(&sc, 3, slots, nt, lens, ws, bt, cu, &ml), OSCAR_OK);
    cr_assert_eq(cu[3], 120);
    cr_assert_eq(ml, 60);
    cr_assert_eq(bt[6 * 1 + 0], -1); /* the short one holds no pages */
    for (int j = 0; j < 6; j++) cr_assert(bt[j] >= 0 && bt[j] < 12);
    /* the fourth waits until pages free up, then is admitted */
    cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(ge_sched_finish(&sc, slots[0]), OSCAR_OK);
    cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
    cr_assert_eq(n, 1);
    int32_t bad = 13; /* slot 1 reserved 12 tokens */
    cr_assert_eq(ge_sched_batch(&sc, 1, &slots[1], &bad, lens, ws, bt, cu, &ml), OSCAR_ERR_TOO_LONG);
    char msg[200];
    cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
    /* corrupt the table: the check must notice */
    sc.block_table[(size_t)out[0] * sc.stride] = sc.block_table[(size_t)slots[2] * sc.stride];
    cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_ERR_INTERNAL);
    ge_sched_release(&sc);
}

Test(e2e_pages, reference_counts)
{
    ge_pages a;
    cr_assert_eq(ge_pages_init(&a, 6), OSCAR_OK);
    int32_t ids[3];
    cr_assert_eq(ge_pages_alloc(&a, 3, ids), OSCAR_OK);
    cr_assert_eq(ge_pages_ref(&a, 2, ids), OSCAR_OK);
    cr_assert_eq(ge_pages_ref(&a, 1, ids), OSCAR_OK);
    cr_assert_eq(a.refs[ids[0]], 3);
    cr_assert_eq(a.refs[ids[1]], 2);
    /* refused as a whole: a free page, one out of range, one listed twice */
    int32_t bad1[2] = {ids[2], 5}, bad2[2] = {ids[1], 7}, dup[2] = {ids[0], ids[0]};
    cr_assert_eq(ge_pages_ref(&a, 2, bad1), OSCAR_ERR_BLOCK_TABLE);
    cr_assert_eq(ge_pages_ref(&a, 2, bad2), OSCAR_ERR_BLOCK_TABLE);
    cr_assert_eq(ge_pages_ref(&a, 2, dup), OSCAR_ERR_BLOCK_TABLE);
    cr_assert_eq(ge_pages_free(&a, 2, dup), OSCAR_ERR_BLOCK_TABLE);
    cr_assert_eq(a.refs[ids[2]], 1, "a refused call changes nothing");
    cr_assert_eq(a.refs[ids[0]], 3);
    /* a page goes back with its last holder only */
    cr_assert_eq(ge_pages_free(&a, 3, ids), OSCAR_OK);
    cr_assert_eq(a.n_free, 4);
    cr_assert_eq(ge_pages_free(&a, 2, ids), OSCAR_OK);
    cr_assert_eq(a.n_free, 5);
    cr_assert_eq(ge_pages_free(&a, 1, ids), OSCAR_OK);
    cr_assert_eq(a.n_free, 6);
    cr_assert_eq(ge_pages_free(&a, 1, ids), OSCAR_ERR_BLOCK_TABLE, "double free");
    ge_pages_release(&a);
}

Test(e2e_sched, shared_prefix_pages)
{
    oscar_layout_desc l = small_layout(200);
    /* A prefix of 60 tokens: 2-bit rows 4..51 (48 rows): 3 full pages, none partial. */
    cr_assert_eq(ge_shared_pages(&l, 60), 3);
    cr_assert_eq(ge_shared_pages(&l, 12), 0);
    cr_assert_eq(ge_shared_pages(&l, 70), 3); /* 58 rows: 3 full + a partial one */
    oscar_layout_desc lb = l;
    lb.method = OSCAR_METHOD_BF16;
    cr_assert_eq(ge_shared_pages(&lb, 70), 4); /* BF16: every position paged */
    char msg[256];
    for (int partial = 0; partial < 2; partial++) {
        const int32_t pl = partial ? 70 : 60;
        ge_sched sc;
        cr_assert_eq(ge_sched_init(&sc, &l, 24, 3), OSCAR_OK);
        int32_t pfx, r1, r2, r3;
        cr_assert_eq(ge_sched_submit(&sc, pl, 0, &pfx), OSCAR_OK);
        /* bad input: not a prefix request, a prefix not shorter than the prompt */
        cr_assert_eq(ge_sched_submit_shared(&sc, pfx, pl, 5, NULL), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(ge_last_error(), "not shorter"), "%s", ge_last_error());
        cr_assert_eq(ge_sched_submit_shared(&sc, 7, 100, 5, NULL), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert_eq(ge_sched_submit_shared(&sc, -1, 100, 5, NULL), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert_eq(ge_sched_submit_shared(&sc, pfx, 100, 20, &r1), OSCAR_OK); /* 120 tokens: 7 pages */
        cr_assert_eq(ge_sched_submit_shared(&sc, r1, 130, 5, NULL), OSCAR_ERR_INVALID_ARGUMENT, "r1 is no prefix");
        cr_assert_eq(ge_sched_submit_shared(&sc, pfx, 90, 30, &r2), OSCAR_OK);
        cr_assert_eq(ge_sched_submit_shared(&sc, pfx, 80, 40, &r3), OSCAR_OK);
        int32_t out[3], n;
        /* the prefix first; its sharers wait until it is in the cache */
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
        cr_assert_eq(n, 1);
        int32_t ps = out[0];
        int32_t ll[1], ws[1], cu[2], ml, bt[16];
        int32_t np = pl;
        cr_assert_eq(ge_sched_batch(&sc, 1, &ps, &np, ll, ws, bt, cu, &ml), OSCAR_OK);
        cr_assert_eq(ge_sched_advance(&sc, ps, pl), OSCAR_OK);
        int32_t held_by_prefix = sc.slots[ps].n_pages, free0 = sc.pages.n_free;
        cr_assert_eq(held_by_prefix, partial ? 4 : 3);
        /* two slots left: r1 and r2 come in, sharing the prefix's 3 full pages */
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
        cr_assert_eq(n, 2);
        for (int i = 0; i < 2; i++) {
            const ge_slot *q = &sc.slots[out[i]];
            cr_assert_eq(q->len, pl, "a shared request starts at the prefix's length");
            cr_assert_eq(q->n_shared, 3);
            cr_assert_eq(q->n_pages, 7);
            cr_assert_eq(q->fork_src, ps);
            cr_assert_eq(q->fork_page, partial ? 3 : -1);
            const int32_t *row = sc.block_table + (size_t)out[i] * sc.stride, *prow = sc.block_table + (size_t)ps * sc.stride;
            cr_assert_eq(memcmp(row, prow, 3 * sizeof *row), 0);
            if (partial) cr_assert_neq(row[3], prow[3], "the partial page is a copy of its own");
        }
        cr_assert_eq(free0 - sc.pages.n_free, 2 * 4, "each took 7 - 3 new pages");
        cr_assert_eq(sc.pages.refs[sc.block_table[(size_t)ps * sc.stride]], 3);
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        /* a refcount gone wrong is noticed */
        sc.pages.refs[sc.block_table[(size_t)ps * sc.stride]]--;
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_ERR_INTERNAL);
        cr_assert(strstr(msg, "reference count"), "%s", msg);
        sc.pages.refs[sc.block_table[(size_t)ps * sc.stride]]++;
        /* the batch arrays of a suffix step name the shared pages */
        int32_t two[2] = {out[0], out[1]}, nt[2] = {40, 30}, l2[2], w2[2], c2[3], bt2[2 * 16];
        cr_assert_eq(ge_sched_batch(&sc, 2, two, nt, l2, w2, bt2, c2, &ml), OSCAR_OK);
        cr_assert_eq(l2[0], pl + 40);
        cr_assert_eq(ml, pl + 40);
        /* r1 finishes: its own pages go back, the shared ones stay */
        int32_t r1slot = out[0], r2slot = out[1];
        cr_assert_eq(ge_sched_finish(&sc, r1slot), OSCAR_OK);
        cr_assert_eq(sc.pages.refs[sc.block_table[(size_t)ps * sc.stride]], 2);
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        /* r3 takes the freed slot; then the prefix can leave */
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
        cr_assert_eq(n, 1);
        int32_t r3slot = out[0];
        cr_assert_eq(sc.slots[r3slot].req, r3);
        int32_t shared_id = sc.block_table[(size_t)ps * sc.stride];
        cr_assert_eq(ge_sched_finish(&sc, ps), OSCAR_OK);
        cr_assert_eq(sc.pages.refs[shared_id], 2, "the sharers keep the prefix's pages");
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        cr_assert_eq(ge_sched_finish(&sc, r2slot), OSCAR_OK);
        cr_assert_eq(ge_sched_finish(&sc, r3slot), OSCAR_OK);
        cr_assert_eq(sc.pages.n_free, 24, "every page back");
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        /* a sharer queued after its prefix finished cannot be admitted */
        cr_assert_eq(ge_sched_submit_shared(&sc, pfx, 100, 1, NULL), OSCAR_OK);
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(ge_last_error(), "finished"), "%s", ge_last_error());
        (void)r2;
        ge_sched_release(&sc);
    }
}

/* ------------------------------------------------------------------------
 * The shared-prefix rule against the real format, on the CPU backend: a
 * request that takes its prefix's full pages by reference (ge_sched_admit)
 * and gets a copy of the prefix's window slot and partly written last page
 * (what the GPU engine's fork does) ends with the same cache bytes and the
 * same extend outputs, chunk by chunk, as a request that prefilled its
 * whole prompt itself. */
#include "refcheck.h"

typedef struct cpu_rig {
    oscar_plan *plan;
    oscar_cache cache;
    size_t page_bytes, slot_bytes, ws_bytes, qrow, kvrow; /* bytes of one token's q / k row */
    void *ws;
    ge_sched *sc;
    int chunk;
} cpu_rig;

/* Appends positions from..to of slot's prompt chunk by chunk, each chunk's
 * queries attending with oscar_extend; outputs at out + position rows. */
static void feed_chunks(cpu_rig *g, int32_t slot, int from, int to, const uint8_t *k, const uint8_t *v,
                        const uint8_t *q, uint8_t *out)
{
    int32_t len = 0, wslot = 0, cu[2] = {0, 0}, ml = 0, *bt = malloc((size_t)g->sc->stride * sizeof *bt);
    for (int at = from; at < to;) {
        int32_t take = to - at < g->chunk ? to - at : g->chunk;
        cr_assert_eq(g->sc->slots[slot].len, at);
        cr_assert_eq(ge_sched_batch(g->sc, 1, &slot, &take, &len, &wslot, bt, cu, &ml), OSCAR_OK, "%s", ge_last_error());
        oscar_batch b = {1, &len, &wslot, bt, g->sc->stride, ml};
        cr_assert_eq(oscar_append(g->plan, 0, &g->cache, &b, cu, take, k + (size_t)at * g->kvrow, v + (size_t)at * g->kvrow,
                                  0, g->ws, g->ws_bytes, NULL), OSCAR_OK, "%s", oscar_last_error());
        oscar_attn_args a;
        oscar_attn_args_default(&a);
        a.cu_q = cu;
        a.total_q = take;
        a.max_q_len = take;
        a.q = q + (size_t)at * g->qrow;
        a.out = out + (size_t)at * g->qrow;
        a.out_bytes = (size_t)take * g->qrow;
        a.workspace = g->ws;
        a.workspace_bytes = g->ws_bytes;
        cr_assert_eq(oscar_extend(g->plan, 0, &g->cache, &b, &a), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(ge_sched_advance(g->sc, slot, take), OSCAR_OK);
        at += take;
    }
    free(bt);
}

Test(e2e_sched, shared_prefix_on_the_cpu_backend)
{
    const oscar_method methods[] = {OSCAR_METHOD_OSCAR2, OSCAR_METHOD_BF16};
    rc_rng rng;
    uint64_t seed = rc_fresh_seed();
    rc_rng_seed(&rng, seed);
    for (size_t mi = 0; mi < 2; mi++) {
        const int d = 64, Hq = 4, Hkv = 2, P = 70, S[2] = {30, 45}, n_tok = P + S[0] + S[1];
        oscar_layout_desc l = small_layout(160);
        l.head_dim = l.group = d;
        l.num_q_heads = Hq;
        l.num_kv_heads = Hkv;
        l.method = methods[mi];
        oscar_runtime_options ro;
        oscar_runtime_options_default(&ro);
        ro.backend = "cpu";
        oscar_runtime *rt;
        oscar_params *prm;
        cpu_rig g = {0};
        cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(oscar_params_create_builtin(l.method, 1, Hq, Hkv, d, &prm), OSCAR_OK);
        if (l.method == OSCAR_METHOD_OSCAR2) { /* the write path with error feedback, as calibrated files have */
            float *F = calloc((size_t)d * d, sizeof *F);
            double *C = malloc((size_t)d * d * sizeof *C);
            for (int kv = 0; kv < 2; kv++) {
                rc_random_metric(&rng, d, 30.0, C);
                cr_assert_gt(rc_feedback_weights(d, C, 1e-3, F), 0.0);
                cr_assert_eq(oscar_params_set_feedback(prm, 0, 0, (oscar_kv)kv, F), OSCAR_OK, "%s", oscar_last_error());
            }
            free(F);
            free(C);
        }
        cr_assert_eq(oscar_plan_create(rt, &l, prm, &g.plan), OSCAR_OK, "%s", oscar_last_error());
        oscar_layout_sizes sz;
        cr_assert_eq(oscar_layout_sizes_get(&l, &sz), OSCAR_OK);
        const int npages = 40, nslots = 5;
        g.page_bytes = sz.page_bytes;
        g.slot_bytes = l.method == OSCAR_METHOD_BF16 ? 0 : sz.window_slot_bytes;
        g.cache = (oscar_cache){calloc((size_t)npages, g.page_bytes), npages,
                                g.slot_bytes ? calloc((size_t)nslots, g.slot_bytes) : NULL, nslots};
        cr_assert_eq(oscar_plan_workspace_bytes(g.plan, 16, l.max_seq_len, &g.ws_bytes), OSCAR_OK);
        g.ws = malloc(g.ws_bytes);
        cr_assert_eq(oscar_plan_workspace_init(g.plan, g.ws, NULL), OSCAR_OK);
        g.qrow = (size_t)Hq * d * 2;
        g.kvrow = (size_t)Hkv * d * 2;
        g.chunk = 7; /* divides the prefix: both runs chunk alike */
        ge_sched sc;
        cr_assert_eq(ge_sched_init(&sc, &l, npages, nslots), OSCAR_OK);
        g.sc = &sc;
        /* Token rows: the prefix, then request 0's suffix, then request 1's. */
        float *f = malloc((size_t)n_tok * Hq * d * sizeof *f);
        uint8_t *k = malloc((size_t)n_tok * g.kvrow), *v = malloc((size_t)n_tok * g.kvrow),
                *q = malloc((size_t)n_tok * g.qrow);
        rc_gen_kv(&rng, n_tok, Hkv, d, 2, OSCAR_DTYPE_BF16, f);
        rc_to_dtype(OSCAR_DTYPE_BF16, f, k, (size_t)n_tok * Hkv * d);
        rc_gen_kv(&rng, n_tok, Hkv, d, 0, OSCAR_DTYPE_BF16, f);
        rc_to_dtype(OSCAR_DTYPE_BF16, f, v, (size_t)n_tok * Hkv * d);
        rc_gen_kv(&rng, n_tok, Hq, d, 0, OSCAR_DTYPE_BF16, f);
        rc_to_dtype(OSCAR_DTYPE_BF16, f, q, (size_t)n_tok * Hq * d);
        /* Each request's prompt rows contiguous: prefix + own suffix. */
        uint8_t *pk[2], *pv[2], *pq[2], *ref[2], *got[2];
        for (int r = 0; r < 2; r++) {
            const int len = P + S[r], off = P + (r ? S[0] : 0);
            const uint8_t *src[3] = {k, v, q};
            uint8_t **dst[3] = {&pk[r], &pv[r], &pq[r]};
            for (int a = 0; a < 3; a++) {
                const size_t row = a < 2 ? g.kvrow : g.qrow;
                *dst[a] = malloc((size_t)len * row);
                memcpy(*dst[a], src[a], (size_t)P * row);
                memcpy(*dst[a] + (size_t)P * row, src[a] + (size_t)off * row, (size_t)S[r] * row);
            }
            ref[r] = calloc((size_t)len, g.qrow);
            got[r] = calloc((size_t)len, g.qrow);
        }
        /* Each request alone: its whole prompt, chunk by chunk. */
        int32_t alone[2], shared[2], out[5], n;
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(ge_sched_submit(&sc, P + S[r], 0, NULL), OSCAR_OK);
            cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
            cr_assert_eq(n, 1);
            alone[r] = out[0];
            feed_chunks(&g, alone[r], 0, P + S[r], pk[r], pv[r], pq[r], ref[r]);
        }
        /* The prefix once, then both requests from it. */
        int32_t pfx;
        cr_assert_eq(ge_sched_submit(&sc, P, 0, &pfx), OSCAR_OK);
        for (int r = 0; r < 2; r++) cr_assert_eq(ge_sched_submit_shared(&sc, pfx, P + S[r], 0, NULL), OSCAR_OK);
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
        cr_assert_eq(n, 1);
        int32_t ps = out[0];
        feed_chunks(&g, ps, 0, P, pk[0], pv[0], pq[0], got[0]);
        cr_assert_eq(ge_sched_admit(&sc, 1000, out, &n), OSCAR_OK);
        cr_assert_eq(n, 2);
        const int32_t want_shared = ge_shared_pages(&l, P);
        cr_assert_eq(want_shared, l.method == OSCAR_METHOD_BF16 ? 4 : 3); /* both with a partly written page */
        for (int r = 0; r < 2; r++) {
            shared[r] = out[r];
            const ge_slot *s = &sc.slots[shared[r]];
            cr_assert_eq(s->n_shared, want_shared);
            cr_assert_eq(s->fork_page, want_shared);
            const int32_t *srow = sc.block_table + (size_t)ps * sc.stride, *drow = sc.block_table + (size_t)shared[r] * sc.stride;
            /* the engine's fork: window slot and the partial page */
            if (g.slot_bytes)
                memcpy((char *)g.cache.windows + (size_t)shared[r] * g.slot_bytes,
                       (char *)g.cache.windows + (size_t)ps * g.slot_bytes, g.slot_bytes);
            memcpy((char *)g.cache.pages + (size_t)drow[s->fork_page] * g.page_bytes,
                   (char *)g.cache.pages + (size_t)srow[s->fork_page] * g.page_bytes, g.page_bytes);
        }
        /* The prefix may leave now: its full pages stay with the requests. */
        cr_assert_eq(ge_sched_finish(&sc, ps), OSCAR_OK);
        char msg[256];
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        for (int r = 0; r < 2; r++) {
            feed_chunks(&g, shared[r], P, P + S[r], pk[r], pv[r], pq[r], got[r]);
            for (int t = P; t < P + S[r]; t++)
                cr_assert_eq(memcmp(got[r] + (size_t)t * g.qrow, ref[r] + (size_t)t * g.qrow, g.qrow), 0,
                             "%s, seed %llu: request %d's output at position %d differs from its run alone",
                             oscar_method_name(l.method), (unsigned long long)seed, r, t);
            int64_t np;
            oscar_layout_pages_for(&l, P + S[r], &np);
            const int32_t *a = sc.block_table + (size_t)alone[r] * sc.stride, *b = sc.block_table + (size_t)shared[r] * sc.stride;
            for (int j = 0; j < np; j++)
                cr_assert_eq(memcmp((char *)g.cache.pages + (size_t)a[j] * g.page_bytes,
                                    (char *)g.cache.pages + (size_t)b[j] * g.page_bytes, g.page_bytes), 0,
                             "%s: request %d's page %d differs from its run alone", oscar_method_name(l.method), r, j);
            if (g.slot_bytes)
                cr_assert_eq(memcmp((char *)g.cache.windows + (size_t)alone[r] * g.slot_bytes,
                                    (char *)g.cache.windows + (size_t)shared[r] * g.slot_bytes, g.slot_bytes), 0,
                             "request %d's window differs from its run alone", r);
        }
        for (int r = 0; r < 2; r++) {
            cr_assert_eq(ge_sched_finish(&sc, alone[r]), OSCAR_OK);
            cr_assert_eq(ge_sched_finish(&sc, shared[r]), OSCAR_OK);
            free(pk[r]), free(pv[r]), free(pq[r]), free(ref[r]), free(got[r]);
        }
        cr_assert_eq(sc.pages.n_free, npages);
        cr_assert_eq(ge_sched_check(&sc, msg, sizeof msg), OSCAR_OK, "%s", msg);
        ge_sched_release(&sc);
        free(f), free(k), free(v), free(q), free(g.ws), free(g.cache.pages), free(g.cache.windows);
        oscar_plan_destroy(g.plan);
        oscar_params_destroy(prm);
        oscar_runtime_destroy(rt);
    }
}

/* ------------------------------------------------------------------------
 * Per-layer pages on the CPU backend, pooled as the GPU engine pools them: a
 * parameter file with 3-bit head-tensors in some layers (ge_kv_wide_layout:
 * wide_per_layer 1), one allocation of num_pages x the sum of the layers'
 * pages (ge_kv_plan_for), layer l's pool at the end of layer l - 1's, one
 * block table for every layer. Each layer's extend outputs and page bytes
 * equal those of a cache whose every layer has pages of the largest size
 * (wide_per_layer 0, separate pools), and nothing is written past the
 * pools. */
Test(e2e_sched, per_layer_pools_on_the_cpu_backend)
{
    const int L = 3, d = 64, Hq = 4, Hkv = 2, nslots = 3, lens[2] = {61, 45};
    rc_rng rng;
    uint64_t seed = rc_fresh_seed();
    rc_rng_seed(&rng, seed);
    oscar_layout_desc l = small_layout(160);
    l.head_dim = l.group = d;
    l.num_q_heads = Hq;
    l.num_kv_heads = Hkv;
    oscar_params *prm;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, L, Hq, Hkv, d, &prm), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(prm, 1, 0, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(prm, 1, 1, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(prm, 2, 0, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    size_t pb[3];
    int most;
    cr_assert_eq(ge_kv_wide_layout(prm, L, &l, pb, &most), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(most, 2);
    const size_t plane = (size_t)l.page_size * d / 8;
    cr_assert_eq(pb[1], pb[0] + 2 * plane);
    cr_assert_eq(pb[2], pb[0] + plane);
    oscar_layout_desc one = l; /* the reference: every layer the largest page */
    one.wide_per_layer = 0;
    oscar_layout_sizes sz;
    cr_assert_eq(oscar_layout_sizes_get(&one, &sz), OSCAR_OK);
    cr_assert_eq(sz.page_bytes, pb[1]);

    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt;
    oscar_plan *pa, *pr;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_create(rt, &l, prm, &pa), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_create(rt, &one, prm, &pr), OSCAR_OK, "%s", oscar_last_error());
    /* The engine's pools: a budget for 12 pages and the slots' windows. */
    ge_kv_plan kv;
    const size_t budget = 12 * (pb[0] + pb[1] + pb[2]) + (size_t)L * nslots * sz.window_slot_bytes + 100;
    cr_assert_eq(ge_kv_plan_for(&l, L, pb, budget, nslots, &kv), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(kv.num_pages, 12);
    cr_assert_eq(kv.pool_bytes, 12 * (pb[0] + pb[1] + pb[2]));
    const size_t guard = 4096;
    unsigned char *pool = calloc(kv.pool_bytes + guard, 1); /* zeros, as the reference's (unwritten rows compare) */
    memset(pool + kv.pool_bytes, 0xa5, guard);
    char *win = calloc((size_t)L * nslots, sz.window_slot_bytes), *wref = calloc((size_t)L * nslots, sz.window_slot_bytes);
    oscar_cache ca[3], cref[3];
    size_t off = 0;
    for (int i = 0; i < L; i++) {
        ca[i] = (oscar_cache){pool + off, kv.num_pages, win + (size_t)i * nslots * sz.window_slot_bytes, nslots};
        off += (size_t)kv.num_pages * pb[i];
        cref[i] = (oscar_cache){calloc((size_t)kv.num_pages, sz.page_bytes), kv.num_pages,
                                wref + (size_t)i * nslots * sz.window_slot_bytes, nslots};
    }
    cr_assert_eq(off, kv.pool_bytes);
    size_t wsa, wsr;
    cr_assert_eq(oscar_plan_workspace_bytes(pa, 16, l.max_seq_len, &wsa), OSCAR_OK);
    cr_assert_eq(oscar_plan_workspace_bytes(pr, 16, l.max_seq_len, &wsr), OSCAR_OK);
    const size_t wsb = wsa > wsr ? wsa : wsr;
    void *ws = malloc(wsb);
    cr_assert_eq(oscar_plan_workspace_init(pa, ws, NULL), OSCAR_OK);
    ge_sched sc;
    cr_assert_eq(ge_sched_init(&sc, &l, kv.num_pages, nslots), OSCAR_OK, "%s", ge_last_error());
    const size_t qrow = (size_t)Hq * d * 2, kvrow = (size_t)Hkv * d * 2;
    const int n_tok = lens[0] + lens[1];
    float *f = malloc((size_t)n_tok * Hq * d * sizeof *f);
    uint8_t *k = malloc((size_t)n_tok * kvrow), *v = malloc((size_t)n_tok * kvrow), *q = malloc((size_t)n_tok * qrow);
    rc_gen_kv(&rng, n_tok, Hkv, d, 2, OSCAR_DTYPE_BF16, f);
    rc_to_dtype(OSCAR_DTYPE_BF16, f, k, (size_t)n_tok * Hkv * d);
    rc_gen_kv(&rng, n_tok, Hkv, d, 0, OSCAR_DTYPE_BF16, f);
    rc_to_dtype(OSCAR_DTYPE_BF16, f, v, (size_t)n_tok * Hkv * d);
    rc_gen_kv(&rng, n_tok, Hq, d, 0, OSCAR_DTYPE_BF16, f);
    rc_to_dtype(OSCAR_DTYPE_BF16, f, q, (size_t)n_tok * Hq * d);
    int32_t slots[2], n;
    for (int r = 0; r < 2; r++) cr_assert_eq(ge_sched_submit(&sc, lens[r], 0, NULL), OSCAR_OK, "%s", ge_last_error());
    cr_assert_eq(ge_sched_admit(&sc, 1000, slots, &n), OSCAR_OK);
    cr_assert_eq(n, 2);
    /* Both sequences together, 7 tokens a step each (interleaved pages), every layer the same block table. */
    const int chunk = 7;
    int32_t *bt = malloc((size_t)2 * sc.stride * sizeof *bt), seq_lens[2], wslots[2], cu[3], take[2], ml = 0;
    uint8_t *ka = malloc((size_t)2 * chunk * kvrow), *va = malloc((size_t)2 * chunk * kvrow),
            *qa = malloc((size_t)2 * chunk * qrow), *oa = malloc((size_t)2 * chunk * qrow),
            *orf = malloc((size_t)2 * chunk * qrow);
    for (int at = 0; at < lens[0]; at += chunk) {
        int m = 0, ids[2];
        for (int r = 0; r < 2; r++)
            if (at < lens[r]) {
                ids[m] = r;
                take[m] = lens[r] - at < chunk ? lens[r] - at : chunk;
                m++;
            }
        int32_t sl[2] = {slots[ids[0]], m > 1 ? slots[ids[1]] : 0};
        cr_assert_eq(ge_sched_batch(&sc, m, sl, take, seq_lens, wslots, bt, cu, &ml), OSCAR_OK, "%s", ge_last_error());
        for (int i = 0; i < m; i++) { /* request ids[i]'s rows at positions at.. */
            const size_t src = (size_t)(ids[i] ? lens[0] : 0) + (size_t)at;
            memcpy(ka + (size_t)cu[i] * kvrow, k + src * kvrow, (size_t)take[i] * kvrow);
            memcpy(va + (size_t)cu[i] * kvrow, v + src * kvrow, (size_t)take[i] * kvrow);
            memcpy(qa + (size_t)cu[i] * qrow, q + src * qrow, (size_t)take[i] * qrow);
        }
        oscar_batch b = {m, seq_lens, wslots, bt, sc.stride, ml};
        for (int li = 0; li < L; li++) {
            for (int w = 0; w < 2; w++) {
                oscar_plan *p = w ? pr : pa;
                oscar_cache *c = w ? &cref[li] : &ca[li];
                cr_assert_eq(oscar_append(p, li, c, &b, cu, cu[m], ka, va, 0, ws, wsb, NULL), OSCAR_OK, "%s",
                             oscar_last_error());
                oscar_attn_args a;
                oscar_attn_args_default(&a);
                a.cu_q = cu;
                a.total_q = cu[m];
                a.max_q_len = take[0] > take[m - 1] ? take[0] : take[m - 1];
                a.q = qa;
                a.out = w ? orf : oa;
                a.out_bytes = (size_t)cu[m] * qrow;
                a.workspace = ws;
                a.workspace_bytes = wsb;
                cr_assert_eq(oscar_extend(p, li, c, &b, &a), OSCAR_OK, "%s", oscar_last_error());
            }
            cr_assert_eq(memcmp(oa, orf, (size_t)cu[m] * qrow), 0,
                         "seed %llu: layer %d's extend output at position %d differs from the one-size cache",
                         (unsigned long long)seed, li, at);
        }
        for (int i = 0; i < m; i++) cr_assert_eq(ge_sched_advance(&sc, sl[i], take[i]), OSCAR_OK);
    }
    /* Every used page holds the same bytes as the one-size cache's (whose planes past the layer's own
     * are unused); the windows too; nothing written past the pools. */
    for (int r = 0; r < 2; r++) {
        int64_t np;
        oscar_layout_pages_for(&l, lens[r], &np);
        cr_assert_gt(np, 1);
        const int32_t *row = sc.block_table + (size_t)slots[r] * sc.stride;
        for (int li = 0; li < L; li++)
            for (int j = 0; j < np; j++)
                cr_assert_eq(memcmp((char *)ca[li].pages + (size_t)row[j] * pb[li],
                                    (char *)cref[li].pages + (size_t)row[j] * sz.page_bytes, pb[li]), 0,
                             "seed %llu: layer %d, request %d's page %d differs", (unsigned long long)seed, li, r, j);
    }
    cr_assert_eq(memcmp(win, wref, (size_t)L * nslots * sz.window_slot_bytes), 0);
    for (size_t i = 0; i < guard; i++) cr_assert_eq(pool[kv.pool_bytes + i], 0xa5, "byte %zu past the pools written", i);
    for (int r = 0; r < 2; r++) cr_assert_eq(ge_sched_finish(&sc, slots[r]), OSCAR_OK);
    ge_sched_release(&sc);
    for (int i = 0; i < L; i++) free(cref[i].pages);
    free(pool), free(win), free(wref), free(ws), free(bt), free(f), free(k), free(v), free(q);
    free(ka), free(va), free(qa), free(oa), free(orf);
    oscar_plan_destroy(pa);
    oscar_plan_destroy(pr);
    oscar_params_destroy(prm);
    oscar_runtime_destroy(rt);
}
