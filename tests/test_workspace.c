/* One workspace for every batch (docs/API.md): a workspace sized by
 * oscar_plan_workspace_bytes(max_seqs, max_len) must serve each smaller
 * batch and length, and give the same attention (up to the rounding of a
 * different split count) as a workspace sized for that batch alone. The
 * split plan wants more parts for short or small batches than for the
 * largest one; the runtime used to refuse those calls (seen from Python on
 * CUDA: "1064192 needed for 16 sequences of up to 225 tokens" with a
 * workspace sized for longer sequences). Runs on cpu, opencl and cuda where
 * they load (required when OSCAR_REQUIRE_BACKENDS names them). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"
#include "runtime_or_skip.h"

#define MAXS 16
#define MAXL 2048
#define OK(x) cr_assert_eq((x), OSCAR_OK, "%s: %s", #x, oscar_last_error())

static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float f_of_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void fill(uint16_t *x, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        x[i] = bf16_of((float)((double)(*s >> 11) / 9007199254740992.0) * 2.0f - 1.0f);
    }
}
static void *up(oscar_runtime *rt, const void *src, size_t n) {
    void *b = NULL;
    OK(oscar_buffer_alloc(rt, n, &b));
    OK(oscar_buffer_write(rt, b, 0, src, n, NULL));
    return b;
}

static void run(const char *backend) {
    oscar_runtime *rt = rc_runtime_or_skip(backend);
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.num_q_heads = 8;
    l.num_kv_heads = 2;
    l.page_size = 32;
    l.sink = 16;
    l.recent = 64;
    l.max_seq_len = MAXL;
    oscar_params *prm;
    OK(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 1, l.num_q_heads, l.num_kv_heads, l.head_dim, &prm));
    l.method = OSCAR_METHOD_QUAROT2;
    oscar_plan *plan;
    OK(oscar_plan_create(rt, &l, prm, &plan));
    oscar_layout_sizes sz;
    OK(oscar_layout_sizes_get(&l, &sz));
    int64_t pps;
    OK(oscar_layout_pages_for(&l, MAXL, &pps));
    size_t big;
    OK(oscar_plan_workspace_bytes(plan, MAXS, MAXL, &big));
    void *ws_big;
    OK(oscar_buffer_alloc(rt, big, &ws_big));
    OK(oscar_plan_workspace_init(plan, ws_big, NULL));
    /* (sequences, length): short, small and full batches */
    /* the last four want more split partials than the full batch on CUDA's
     * tensor-core plan (resident CTAs 2-4 per SM) */
    static const int cases[][2] = {{1, 1},     {1, 40},     {3, 81},     {16, 225},   {2, 999},
                                   {16, MAXL}, {13, 2003}, {12, 1814}, {10, 1653}, {6, 946}};
    uint64_t seed = 0x1234567u;
    const int H = l.num_kv_heads, D = l.head_dim, Hq = l.num_q_heads;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n = cases[ci][0], L = cases[ci][1];
        int32_t lens[MAXS], slots[MAXS], cu[MAXS + 1];
        int32_t *bt = malloc(sizeof(int32_t) * (size_t)(n * pps));
        cr_assert(bt);
        cu[0] = 0;
        for (int i = 0; i < n; i++) {
            lens[i] = i == 0 ? L : L - (i * 7) % (L < 8 ? 1 : 8); /* mixed lengths, the longest L */
            slots[i] = i;
            cu[i + 1] = cu[i] + lens[i];
            for (int j = 0; j < pps; j++) bt[i * pps + j] = i * (int32_t)pps + j;
        }
        size_t kvn = (size_t)cu[n] * H * D, qn = (size_t)n * Hq * D;
        uint16_t *k = malloc(kvn * 2), *v = malloc(kvn * 2), *q = malloc(qn * 2), *o1 = malloc(qn * 2),
                 *o2 = malloc(qn * 2);
        cr_assert(k && v && q && o1 && o2);
        fill(k, kvn, &seed);
        fill(v, kvn, &seed);
        fill(q, qn, &seed);
        void *pages, *wins, *dk = up(rt, k, kvn * 2), *dv = up(rt, v, kvn * 2), *dq = up(rt, q, qn * 2),
                           *dl = up(rt, lens, sizeof(int32_t) * n), *ds = up(rt, slots, sizeof(int32_t) * n),
                           *dbt = up(rt, bt, sizeof(int32_t) * (size_t)(n * pps)),
                           *dcu = up(rt, cu, sizeof(int32_t) * (n + 1)), *dout;
        OK(oscar_buffer_alloc(rt, sz.page_bytes * (size_t)(n * pps), &pages));
        OK(oscar_buffer_alloc(rt, sz.window_slot_bytes * (size_t)n, &wins));
        OK(oscar_buffer_alloc(rt, qn * 2, &dout));
        size_t own;
        OK(oscar_plan_workspace_bytes(plan, n, L, &own));
        void *ws_own;
        OK(oscar_buffer_alloc(rt, own, &ws_own));
        OK(oscar_plan_workspace_init(plan, ws_own, NULL));
        oscar_cache c = {pages, n * (int32_t)pps, wins, n};
        oscar_batch b = {n, dl, ds, dbt, (int32_t)pps, L};
        OK(oscar_append(plan, 0, &c, &b, dcu, cu[n], dk, dv, 0, ws_big, big, NULL));
        oscar_status s1 = oscar_decode(plan, 0, &c, &b, dq, 0, dout, 0, 0.0f, 0, ws_big, big, NULL);
        cr_assert_eq(s1, OSCAR_OK, "%s, %d sequences of up to %d tokens with the workspace for %d x %d: %s", backend, n,
                     L, MAXS, MAXL, oscar_last_error());
        OK(oscar_buffer_read(rt, o1, dout, 0, qn * 2, NULL));
        OK(oscar_decode(plan, 0, &c, &b, dq, 0, dout, 0, 0.0f, 0, ws_own, own, NULL));
        OK(oscar_buffer_read(rt, o2, dout, 0, qn * 2, NULL));
        OK(oscar_plan_check(plan, ws_big, NULL));
        float mx = 0, worst = 0;
        for (size_t i = 0; i < qn; i++) {
            float a = f_of_bf16(o1[i]), bb = f_of_bf16(o2[i]);
            cr_assert(isfinite(a), "%s case %zu: non-finite output", backend, ci);
            mx = fmaxf(mx, fabsf(bb));
            worst = fmaxf(worst, fabsf(a - bb));
        }
        /* two split plans: the same attention up to bf16 output rounding */
        cr_assert_leq(worst, 1e-2f * mx + 1e-6f, "%s, %d x %d: outputs differ by %g (max |out| %g)", backend, n, L,
                      (double)worst, (double)mx);
        void *bufs[] = {pages, wins, dk, dv, dq, dl, ds, dbt, dcu, dout, ws_own};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) oscar_buffer_free(rt, bufs[i]);
        free(bt);
        free(k);
        free(v);
        free(q);
        free(o1);
        free(o2);
    }
    oscar_buffer_free(rt, ws_big);
    oscar_plan_destroy(plan);
    oscar_params_destroy(prm);
    oscar_runtime_destroy(rt);
}

Test(workspace, cpu_one_workspace_serves_every_batch, .timeout = 300) { run("cpu"); }
Test(workspace, opencl_one_workspace_serves_every_batch, .timeout = 300) { run("opencl"); }
Test(workspace, cuda_one_workspace_serves_every_batch, .timeout = 300) { run("cuda"); }
