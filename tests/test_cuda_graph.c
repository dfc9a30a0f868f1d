/* CUDA-graph capture of a decode step (docs/API.md, CUDA graphs): one
 * oscar_append of one token per sequence and one oscar_decode, captured once
 * on a stream for a batch bucket (num_seqs, max_seq_len fixed), then replayed
 * while the lengths in device memory grow across page boundaries and into
 * the demotions of the recent window. Every replay must give the same output
 * bytes, and the same cache bytes, as uncaptured calls on a second cache fed
 * the same inputs. Skipped without a CUDA device (required when
 * OSCAR_REQUIRE_BACKENDS names cuda). */
#include <criterion/criterion.h>
#ifdef OSCAR_NO_CUDA_TEST
Test(cuda_graph, needs_the_cuda_toolkit) { cr_skip_test("built without the CUDA toolkit"); }
#else
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"

#define SEQ 5
#define STEPS 120
#define BUCKET 1024

#define CU(x) cr_assert_eq((x), cudaSuccess, "%s: %s", #x, cudaGetErrorString(x))
#define OK(x) cr_assert_eq((x), OSCAR_OK, "%s: %s", #x, oscar_last_error())

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static void random_bf16(uint16_t *x, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        float f = (float)((double)(rng_next(s) >> 11) / 9007199254740992.0) * 4.0f - 2.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        x[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* One cache with its own lengths, workspace and output. */
typedef struct side {
    void *pages, *windows, *ws, *lens, *out;
    size_t ws_bytes;
} side;

static void *dalloc(size_t n) {
    void *p = NULL;
    CU(cudaMalloc(&p, n));
    CU(cudaMemset(p, 0, n));
    return p;
}

static int required(void) {
    const char *r = getenv("OSCAR_REQUIRE_BACKENDS");
    return r && strstr(r, "cuda");
}

static void run(oscar_method method) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        cr_assert(!required(), "cuda is required but no CUDA device is visible");
        cr_skip_test("no CUDA device");
    }
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cuda";
    oscar_runtime *rt;
    if (oscar_runtime_create(&ro, &rt) != OSCAR_OK) {
        cr_assert(!required(), "cuda is required but: %s", oscar_last_error());
        cr_skip_test("cuda backend not available: %s", oscar_last_error());
    }
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.num_q_heads = 8;
    l.num_kv_heads = 2;
    l.max_seq_len = 2048;
    l.method = method;
    const int H = l.num_kv_heads, Hq = l.num_q_heads, D = l.head_dim;
    oscar_params *prm;
    OK(oscar_params_create_builtin(method, 1, Hq, H, D, &prm));
    oscar_plan *plan;
    OK(oscar_plan_create(rt, &l, prm, &plan));
    oscar_layout_sizes sz;
    OK(oscar_layout_sizes_get(&l, &sz));
    const int pps = BUCKET / l.page_size;
    /* Lengths before the first step: below, at and past S0 + W and page edges. */
    int32_t lens[SEQ] = {63, 200, 319, 321, 447}, slots[SEQ], bt[SEQ * (BUCKET / 16)], cu1[SEQ + 1], cup[SEQ + 1];
    cr_assert(pps <= BUCKET / 16);
    for (int i = 0; i < SEQ; i++) {
        slots[i] = SEQ - 1 - i;
        for (int j = 0; j < pps; j++) bt[i * pps + j] = (j * SEQ + (i * 7 + j) % SEQ); /* interleaved pages */
        cu1[i] = i;
    }
    cu1[SEQ] = SEQ;
    cup[0] = 0;
    for (int i = 0; i < SEQ; i++) cup[i + 1] = cup[i] + lens[i];
    const int num_pages = SEQ * pps;
    const size_t pool = sz.page_bytes * (size_t)num_pages, wpool = sz.window_slot_bytes * SEQ + 16;
    side s[2];
    for (int k = 0; k < 2; k++) {
        s[k].pages = dalloc(pool);
        s[k].windows = dalloc(wpool);
        OK(oscar_plan_workspace_bytes(plan, SEQ, BUCKET, &s[k].ws_bytes));
        s[k].ws = dalloc(s[k].ws_bytes);
        OK(oscar_plan_workspace_init(plan, s[k].ws, NULL));
        s[k].lens = dalloc(sizeof lens);
        s[k].out = dalloc((size_t)SEQ * Hq * D * 2);
    }
    void *dbt = dalloc(sizeof bt), *dslots = dalloc(sizeof slots), *dcu1 = dalloc(sizeof cu1),
         *dcup = dalloc(sizeof cup);
    CU(cudaMemcpy(dbt, bt, sizeof bt, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dslots, slots, sizeof slots, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcu1, cu1, sizeof cu1, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dcup, cup, sizeof cup, cudaMemcpyHostToDevice));
    const size_t kvn = (size_t)cup[SEQ] * H * D, qn = (size_t)SEQ * Hq * D, stepn = (size_t)SEQ * H * D;
    uint64_t seed = 0x243f6a8885a308d3ull;
    uint16_t *hk = malloc(kvn * 2), *hv = malloc(kvn * 2), *hq = malloc(qn * 2);
    cr_assert(hk && hv && hq);
    random_bf16(hk, kvn, &seed);
    random_bf16(hv, kvn, &seed);
    void *dk = dalloc(kvn * 2), *dv = dalloc(kvn * 2), *dq = dalloc(qn * 2);
    CU(cudaMemcpy(dk, hk, kvn * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dv, hv, kvn * 2, cudaMemcpyHostToDevice));
    /* The prompts, uncaptured, into both caches. */
    for (int k = 0; k < 2; k++) {
        CU(cudaMemcpy(s[k].lens, lens, sizeof lens, cudaMemcpyHostToDevice));
        oscar_cache c = {s[k].pages, num_pages, s[k].windows, SEQ};
        oscar_batch b = {SEQ, s[k].lens, dslots, dbt, pps, BUCKET};
        OK(oscar_append(plan, 0, &c, &b, dcup, cup[SEQ], dk, dv, 0, s[k].ws, s[k].ws_bytes, NULL));
    }
    CU(cudaDeviceSynchronize());
    /* Capture one step on side 0 for the bucket; the lengths it reads live in
     * device memory and change between replays. */
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    oscar_cache c0 = {s[0].pages, num_pages, s[0].windows, SEQ}, c1 = {s[1].pages, num_pages, s[1].windows, SEQ};
    oscar_batch b0 = {SEQ, s[0].lens, dslots, dbt, pps, BUCKET}, b1 = {SEQ, s[1].lens, dslots, dbt, pps, BUCKET};
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    oscar_status as = oscar_append(plan, 0, &c0, &b0, dcu1, SEQ, dk, dv, 0, s[0].ws, s[0].ws_bytes, st);
    oscar_status ds = oscar_decode(plan, 0, &c0, &b0, dq, 0, s[0].out, 0, 0.0f, 0, s[0].ws, s[0].ws_bytes, st);
    CU(cudaStreamEndCapture(st, &graph));
    OK(as);
    OK(ds);
    CU(cudaGraphInstantiate(&exec, graph, 0));
    size_t nodes = 0;
    CU(cudaGraphGetNodes(graph, NULL, &nodes));
    cr_assert_gt(nodes, 1, "the captured step holds %zu nodes", nodes);
    const size_t outb = qn * 2;
    unsigned char *o0 = malloc(outb), *o1 = malloc(outb), *p0 = malloc(pool), *p1 = malloc(pool), *w0 = malloc(wpool),
                  *w1 = malloc(wpool);
    cr_assert(o0 && o1 && p0 && p1 && w0 && w1);
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < SEQ; i++) lens[i]++;
        /* New inputs at the addresses the graph was captured with. */
        random_bf16(hk, stepn, &seed);
        random_bf16(hv, stepn, &seed);
        random_bf16(hq, qn, &seed);
        CU(cudaMemcpy(dk, hk, stepn * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dv, hv, stepn * 2, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dq, hq, qn * 2, cudaMemcpyHostToDevice));
        for (int k = 0; k < 2; k++) {
            CU(cudaMemcpy(s[k].lens, lens, sizeof lens, cudaMemcpyHostToDevice));
            CU(cudaMemset(s[k].out, 0xff, outb)); /* a replay that writes nothing cannot pass */
        }
        CU(cudaGraphLaunch(exec, st));
        CU(cudaStreamSynchronize(st));
        OK(oscar_append(plan, 0, &c1, &b1, dcu1, SEQ, dk, dv, 0, s[1].ws, s[1].ws_bytes, NULL));
        OK(oscar_decode(plan, 0, &c1, &b1, dq, 0, s[1].out, 0, 0.0f, 0, s[1].ws, s[1].ws_bytes, NULL));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(o0, s[0].out, outb, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(o1, s[1].out, outb, cudaMemcpyDeviceToHost));
        cr_assert(!memcmp(o0, o1, outb), "step %d (lengths %d..%d): the replayed decode differs from the uncaptured one",
                  step, lens[0], lens[SEQ - 1]);
        if (step % 15 == 14 || step == STEPS - 1) {
            CU(cudaMemcpy(p0, s[0].pages, pool, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(p1, s[1].pages, pool, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(w0, s[0].windows, wpool, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(w1, s[1].windows, wpool, cudaMemcpyDeviceToHost));
            cr_assert(!memcmp(p0, p1, pool), "step %d: pages written by the replayed append differ", step);
            cr_assert(!memcmp(w0, w1, wpool), "step %d: windows written by the replayed append differ", step);
        }
    }
    OK(oscar_plan_check(plan, s[0].ws, NULL));
    OK(oscar_plan_check(plan, s[1].ws, NULL));
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    CU(cudaStreamDestroy(st));
    void *bufs[] = {dbt, dslots, dcu1, dcup, dk, dv, dq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    for (int k = 0; k < 2; k++) {
        cudaFree(s[k].pages);
        cudaFree(s[k].windows);
        cudaFree(s[k].ws);
        cudaFree(s[k].lens);
        cudaFree(s[k].out);
    }
    free(hk);
    free(hv);
    free(hq);
    free(o0);
    free(o1);
    free(p0);
    free(p1);
    free(w0);
    free(w1);
    oscar_plan_destroy(plan);
    oscar_params_destroy(prm);
    oscar_runtime_destroy(rt);
}

Test(cuda_graph, oscar2_step_replays_bit_exact, .timeout = 300) { run(OSCAR_METHOD_OSCAR2); }
Test(cuda_graph, bf16_step_replays_bit_exact, .timeout = 300) { run(OSCAR_METHOD_BF16); }
#endif
