/* ABI growth (docs/API.md, "ABI stability"): versioned structs of any size
 * from their first version up, the runtime outliving its caller's handle
 * while plans hold it. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"
#include "oscar_internal.h"

/* A caller built against the first header: its struct is exactly the first
 * version's bytes, on the heap so ASan sees any read past them. */
Test(abi, first_version_layout_on_the_heap_is_read_within_its_bytes) {
    oscar_layout_desc def;
    oscar_layout_default(&def);
    def.num_q_heads = 8;
    def.num_kv_heads = 2;
    def.method = OSCAR_METHOD_INT2;
    size_t n = OSCAR_LAYOUT_DESC_SIZE_V1;
    oscar_layout_desc *old = malloc(n);
    cr_assert(old);
    memcpy(old, &def, n);
    uint32_t sz = (uint32_t)n;
    memcpy(old, &sz, sizeof sz);
    cr_assert_eq(oscar_layout_validate(old), OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_sizes a, b;
    cr_assert_eq(oscar_layout_sizes_get(old, &a), OSCAR_OK);
    cr_assert_eq(oscar_layout_sizes_get(&def, &b), OSCAR_OK);
    cr_expect_eq(a.page_bytes, b.page_bytes);
    cr_expect_eq(a.window_slot_bytes, b.window_slot_bytes);
    int64_t pages;
    cr_assert_eq(oscar_layout_pages_for(old, 1000, &pages), OSCAR_OK);
    double bits;
    cr_assert_eq(oscar_layout_bits_per_element(old, 1000, &bits), OSCAR_OK);
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK);
    oscar_plan *plan;
    cr_assert_eq(oscar_plan_create(rt, old, NULL, &plan), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(plan);
    oscar_runtime_destroy(rt);
    free(old);
}

/* A caller built against the header before wide_per_layer (struct ending at wide_tensors): the
 * field reads as 0 (uniform pages), whatever lies past its struct_size. */
Test(abi, layout_before_wide_per_layer_reads_it_as_zero) {
    const size_t n = offsetof(oscar_layout_desc, wide_per_layer);
    cr_assert_eq(n, offsetof(oscar_layout_desc, wide_tensors) + sizeof(int32_t), "wide_per_layer is appended");
    oscar_layout_desc *old = malloc(sizeof *old);
    cr_assert(old);
    oscar_layout_default(old);
    old->num_q_heads = 8, old->num_kv_heads = 2, old->wide_tensors = 2;
    old->struct_size = (uint32_t)n;
    old->wide_per_layer = 7; /* past struct_size: never read */
    cr_assert_eq(oscar_layout_validate(old), OSCAR_OK, "%s", oscar_last_error());
    oscar_layout_desc cur = *old;
    cur.struct_size = sizeof cur;
    cur.wide_per_layer = 0;
    oscar_layout_sizes a, b;
    cr_assert_eq(oscar_layout_sizes_get(old, &a), OSCAR_OK);
    cr_assert_eq(oscar_layout_sizes_get(&cur, &b), OSCAR_OK);
    cr_expect(a.page_bytes == b.page_bytes && a.bits_per_element == b.bits_per_element);
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 2, 8, 2, 128, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 1, 0, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK);
    oscar_plan *plan;
    cr_assert_eq(oscar_plan_create(rt, old, p, &plan), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_layer_sizes(plan, 0, &a), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_eq(a.page_bytes, b.page_bytes, "layer 0 of uniform pages: %zu, not %zu", a.page_bytes, b.page_bytes);
    oscar_plan_destroy(plan);
    oscar_runtime_destroy(rt);
    oscar_params_destroy(p);
    free(old);
}

Test(abi, first_version_runtime_options_on_the_heap) {
    size_t n = OSCAR_RUNTIME_OPTIONS_SIZE_V1;
    oscar_runtime_options def;
    oscar_runtime_options_default(&def);
    def.backend = "cpu";
    oscar_runtime_options *old = malloc(n);
    cr_assert(old);
    memcpy(old, &def, n);
    uint32_t sz = (uint32_t)n;
    memcpy(old, &sz, sizeof sz);
    oscar_runtime *rt;
    cr_assert_eq(oscar_runtime_create(old, &rt), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_str_eq(oscar_runtime_backend(rt), "cpu");
    oscar_runtime_destroy(rt);
    free(old);
}

/* A caller built against a newer header that leaves the new fields zero is
 * served; one that sets a field this library does not know is refused with
 * a message saying so; a struct smaller than the first version is refused. */
Test(abi, newer_struct_with_zero_tail_accepted_set_tail_refused) {
    struct {
        oscar_layout_desc l;
        int32_t future[4];
    } newer;
    memset(&newer, 0, sizeof newer);
    oscar_layout_default(&newer.l);
    newer.l.struct_size = sizeof newer;
    cr_expect_eq(oscar_layout_validate(&newer.l), OSCAR_OK, "%s", oscar_last_error());
    newer.future[2] = 7;
    cr_expect_eq(oscar_layout_validate(&newer.l), OSCAR_ERR_VERSION);
    cr_expect(strstr(oscar_last_error(), "newer header"), "message: %s", oscar_last_error());
    newer.l.struct_size = 8;
    cr_expect_eq(oscar_layout_validate(&newer.l), OSCAR_ERR_VERSION);
    cr_expect(strstr(oscar_last_error(), "oscar_layout_default"), "message: %s", oscar_last_error());

    struct {
        oscar_runtime_options o;
        void *future;
    } ro;
    memset(&ro, 0, sizeof ro);
    oscar_runtime_options_default(&ro.o);
    ro.o.backend = "cpu";
    ro.o.struct_size = sizeof ro;
    oscar_runtime *rt = NULL;
    cr_expect_eq(oscar_runtime_create(&ro.o, &rt), OSCAR_OK, "%s", oscar_last_error());
    oscar_runtime_destroy(rt);
    ro.future = &ro;
    cr_expect_eq(oscar_runtime_create(&ro.o, &rt), OSCAR_ERR_VERSION);
    ro.future = NULL;
    ro.o.struct_size = 4;
    cr_expect_eq(oscar_runtime_create(&ro.o, &rt), OSCAR_ERR_VERSION);
}

/* The mechanism itself on a struct that grew: version 1 had a and b, version
 * 2 added c (zero = the old behaviour). */
typedef struct grown {
    uint32_t struct_size;
    int32_t a, b;
    int32_t c; /* added in version 2 */
} grown;
Test(abi, older_struct_gets_new_fields_zeroed) {
    const size_t v1 = offsetof(grown, b) + sizeof(int32_t);
    unsigned char *buf = malloc(v1); /* exactly what the old caller owns */
    cr_assert(buf);
    grown old = {.struct_size = (uint32_t)v1, .a = 3, .b = 4};
    memcpy(buf, &old, v1);
    grown g;
    memset(&g, 0x5a, sizeof g);
    cr_assert_eq(oscar_struct_import(&g, sizeof g, buf, v1, "grown", "grown_default"), OSCAR_OK);
    cr_expect_eq(g.struct_size, sizeof g);
    cr_expect_eq(g.a, 3);
    cr_expect_eq(g.b, 4);
    cr_expect_eq(g.c, 0, "field added after the caller's version must be zero, got %d", g.c);
    free(buf);
}

/* Destroying the runtime before its plan: the plan keeps working and its
 * destroy frees the runtime (was a use-after-free). */
Test(abi, runtime_destroyed_before_its_plan) {
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt;
    cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK);
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.num_q_heads = 8;
    l.num_kv_heads = 2;
    l.method = OSCAR_METHOD_INT2;
    oscar_plan *p1, *p2;
    cr_assert_eq(oscar_plan_create(rt, &l, NULL, &p1), OSCAR_OK);
    cr_assert_eq(oscar_plan_create(rt, &l, NULL, &p2), OSCAR_OK);
    oscar_runtime_destroy(rt);
    size_t ws = 0;
    cr_expect_eq(oscar_plan_workspace_bytes(p1, 4, 1024, &ws), OSCAR_OK, "%s", oscar_last_error());
    cr_expect_gt(ws, 0);
    oscar_plan_destroy(p1);
    cr_expect_eq(oscar_plan_workspace_bytes(p2, 4, 1024, &ws), OSCAR_OK, "%s", oscar_last_error());
    oscar_plan_destroy(p2); /* the last holder: frees the runtime (LeakSanitizer checks) */
}

/* A struct never filled by its *_default() holds garbage in struct_size. A
 * huge one made the library scan that many bytes past the caller's struct
 * for a set "newer field" (ASan: heap-buffer-overflow; without ASan a fault
 * or a message telling the caller to update liboscar). Sizes beyond any
 * version's are refused at once, saying to fill the struct first. */
Test(abi, garbage_struct_size_is_refused_without_reading_past_the_struct) {
    const uint32_t garbage[] = {0x7fffffffu, 0xffffffffu, 1u << 20};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        oscar_layout_desc *l = malloc(sizeof *l);
        cr_assert(l);
        oscar_layout_default(l);
        l->struct_size = garbage[i];
        cr_expect_eq(oscar_layout_validate(l), OSCAR_ERR_VERSION, "struct_size %u", garbage[i]);
        cr_expect(strstr(oscar_last_error(), "oscar_layout_default"), "message: %s", oscar_last_error());
        free(l);
        oscar_runtime_options *o = malloc(sizeof *o);
        cr_assert(o);
        oscar_runtime_options_default(o);
        o->struct_size = garbage[i];
        oscar_runtime *rt = NULL;
        cr_expect_eq(oscar_runtime_create(o, &rt), OSCAR_ERR_VERSION, "struct_size %u", garbage[i]);
        cr_expect(strstr(oscar_last_error(), "oscar_runtime_options_default"), "message: %s", oscar_last_error());
        free(o);
        oscar_attn_args *a = malloc(sizeof *a);
        cr_assert(a);
        oscar_attn_args_default(a);
        a->struct_size = garbage[i];
        cr_expect_eq(oscar_extend(NULL, 0, NULL, NULL, a), OSCAR_ERR_VERSION, "struct_size %u", garbage[i]);
        free(a);
    }
}
