/* Per-layer page sizes (layout.wide_per_layer 1, docs/FORMAT.md §3.3) on every backend that runs here,
 * through the public API: three layers whose parameters hold 0, 2 and 1 3-bit head-tensors, so their
 * pages hold 0, 2 and 1 1-bit planes. Each layer's page pool is exactly num_pages *
 * oscar_plan_layer_sizes().page_bytes (OpenCL checks a cl_mem's size, so a wrong size is refused there;
 * on the CPU an address past it is a heap overflow, which the sanitizer build reports), poisoned.
 * Every step's decode / extend output is held to the float64 teacher-forced attention over the
 * oscar_fakequant'd rows (the same rule as test_eval_equivalence), and at the end every page a layer
 * wrote equals, byte for byte, the first page_bytes of the same page under the uniform layout
 * (wide_per_layer 0, wide_tensors 2, pools of the largest page) that ran the same calls beside it,
 * whose bytes past the layer's planes are untouched poison; pages no sequence owns stay poison.
 * OSCAR_REQUIRE_BACKENDS=opencl turns a missing OpenCL into a failure. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refcheck.h"
#include "runtime_or_skip.h"

enum { D = 128, HQ = 4, HKV = 2, T = 100, S0 = 4, W = 16, PAGE = 16, NL = 3, SPARE = 2 };

/* The layers' 3-bit head-tensors: (layer, KV head, K/V); layer 0 has none. */
static const int k_wide[][3] = {{1, 1, OSCAR_K}, {1, 0, OSCAR_V}, {2, 1, OSCAR_V}};
static const int k_planes[NL] = {0, 2, 1};

/* A buffer of `bytes` holding `init` (device memory on a plugin, host memory on the CPU). */
static void *pool(oscar_runtime *rt, int dev, const void *init, size_t bytes) {
    void *b = NULL;
    if (!dev) {
        cr_assert((b = malloc(bytes)));
        memcpy(b, init, bytes);
        return b;
    }
    cr_assert_eq(oscar_buffer_alloc(rt, bytes, &b), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_buffer_write(rt, b, 0, init, bytes, NULL), OSCAR_OK, "%s", oscar_last_error());
    return b;
}
static void pool_read(oscar_runtime *rt, int dev, void *dst, const void *src, size_t bytes) {
    if (!dev) {
        memcpy(dst, src, bytes);
        return;
    }
    cr_assert_eq(oscar_buffer_read(rt, dst, src, 0, bytes, NULL), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_synchronize(rt, NULL), OSCAR_OK, "%s", oscar_last_error());
}
static void pool_free(oscar_runtime *rt, int dev, void *b) {
    if (dev)
        oscar_buffer_free(rt, b);
    else
        free(b);
}

/* chunk 0: append + decode one token at a time; chunk N: append N, extend with their N queries. */
static void run_per_layer(const char *backend, int chunk) {
    oscar_runtime *rt = rc_runtime_or_skip(backend);
    const int dev = strcmp(backend, "cpu") != 0;
    const uint64_t seed = rc_fresh_seed();
    rc_rng rng;
    rc_rng_seed(&rng, seed);

    /* Parameters: a random rotation and clips per layer and K/V, the widths above. */
    oscar_params *prm = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, NL, HQ, HKV, D, &prm), OSCAR_OK, "%s",
                 oscar_last_error());
    for (int l = 0; l < NL; l++)
        for (int kv = 0; kv < 2; kv++) {
            rc_random_rotation(&rng, D, oscar_params_rot_ptr(prm, l, kv, 0));
            cr_assert_eq(oscar_params_set_clip(prm, l, (oscar_kv)kv, (float)(0.85 + 0.12 * rc_uniform(&rng))),
                         OSCAR_OK);
        }
    prm->identity = 0;
    for (size_t i = 0; i < sizeof k_wide / sizeof k_wide[0]; i++)
        cr_assert_eq(oscar_params_set_code_bits(prm, k_wide[i][0], k_wide[i][1], (oscar_kv)k_wide[i][2], 3), OSCAR_OK,
                     "%s", oscar_last_error());

    /* Each layer's rows, what its 2-bit region reads (oscar_fakequant) and its windows (the rotated
     * row rounded to bf16, unrotated). */
    const size_t kvn = (size_t)T * HKV * D, qn = (size_t)T * HQ * D, off = (size_t)S0 * HKV * D;
    float *k[NL], *v[NL], *q[NL], *kq[NL], *vq[NL], *kw[NL], *vw[NL];
    for (int l = 0; l < NL; l++) {
        k[l] = malloc(kvn * sizeof(float)), v[l] = malloc(kvn * sizeof(float)), q[l] = malloc(qn * sizeof(float));
        kq[l] = malloc(kvn * sizeof(float)), vq[l] = malloc(kvn * sizeof(float));
        kw[l] = malloc(kvn * sizeof(float)), vw[l] = malloc(kvn * sizeof(float));
        cr_assert(k[l] && v[l] && q[l] && kq[l] && vq[l] && kw[l] && vw[l]);
        rc_gen_kv(&rng, T, HKV, D, 4, OSCAR_DTYPE_BF16, k[l]);
        rc_gen_kv(&rng, T, HKV, D, 2, OSCAR_DTYPE_BF16, v[l]);
        /* q without outlier channels: moderate scores, where the CUDA tensor-core kernels' q~ limbs
         * (FORMAT.md §5) stay within the floor of exact attention (outliers of 10-50 in q moved
         * outputs by up to ~2 %; test_backend_conformance checks those kernels with their own q~) */
        rc_gen_kv(&rng, T, HQ, D, 0, OSCAR_DTYPE_BF16, q[l]);
        memcpy(kq[l], k[l], kvn * sizeof(float));
        memcpy(vq[l], v[l], kvn * sizeof(float));
        cr_assert_eq(oscar_fakequant(prm, OSCAR_METHOD_OSCAR2, l, OSCAR_K, D, T - S0, HKV, D, kq[l] + off), OSCAR_OK,
                     "%s", oscar_last_error());
        cr_assert_eq(oscar_fakequant(prm, OSCAR_METHOD_OSCAR2, l, OSCAR_V, D, T - S0, HKV, D, vq[l] + off), OSCAR_OK,
                     "%s", oscar_last_error());
        for (int which = 0; which < 2; which++) {
            const float *R = NULL;
            cr_assert_eq(oscar_params_rotation(prm, l, 0, (oscar_kv)which, &R), OSCAR_OK, "%s", oscar_last_error());
            const float *src = which ? v[l] : k[l];
            float *dst = which ? vw[l] : kw[l], xr[D];
            for (size_t r = 0; r < (size_t)T * HKV; r++) {
                oscar_ref_rotate(D, src + r * D, R, xr);
                for (int j = 0; j < D; j++) xr[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
                oscar_ref_unrotate(D, xr, R, dst + r * D);
            }
        }
    }

    /* Two plans over the same parameters: per-layer pages (u 0) and the uniform layout (u 1). */
    oscar_layout_desc lay[2];
    oscar_plan *plan[2] = {NULL, NULL};
    for (int u = 0; u < 2; u++) {
        oscar_layout_default(&lay[u]);
        lay[u].head_dim = D, lay[u].group = D, lay[u].num_q_heads = HQ, lay[u].num_kv_heads = HKV;
        lay[u].page_size = PAGE, lay[u].sink = S0, lay[u].recent = W, lay[u].max_seq_len = T;
        lay[u].wide_tensors = 2;
        lay[u].wide_per_layer = u ? 0 : 1;
        cr_assert_eq(oscar_plan_create(rt, &lay[u], prm, &plan[u]), OSCAR_OK, "%s", oscar_last_error());
    }
    oscar_layout_sizes big, ls[2][NL];
    cr_assert_eq(oscar_layout_sizes_get(&lay[0], &big), OSCAR_OK, "%s", oscar_last_error());
    const size_t meta = (size_t)2 * HKV * PAGE * (D / D) * 2 * 2, codes = (size_t)2 * HKV * PAGE * D / 4;
    cr_assert_eq(big.page_bytes, codes + meta + 2 * (size_t)PAGE * D / 8, "largest page: %zu", big.page_bytes);
    for (int u = 0; u < 2; u++)
        for (int l = 0; l < NL; l++) {
            cr_assert_eq(oscar_plan_layer_sizes(plan[u], l, &ls[u][l]), OSCAR_OK, "%s", oscar_last_error());
            const int planes = u ? 2 : k_planes[l];
            cr_assert_eq(ls[u][l].page_bytes, codes + meta + (size_t)planes * PAGE * D / 8,
                         "%s layer %d: page_bytes %zu", u ? "uniform" : "per-layer", l, ls[u][l].page_bytes);
            cr_assert_float_eq(ls[u][l].bits_per_element, 2.25 + planes / (2.0 * HKV), 1e-12, "layer %d: %g bits", l,
                               ls[u][l].bits_per_element);
            cr_assert(ls[u][l].k_meta_offset == big.k_meta_offset && ls[u][l].v_meta_offset == big.v_meta_offset &&
                      ls[u][l].window_slot_bytes == big.window_slot_bytes);
        }

    /* Pools: NP pages per layer, logical page j of the sequence at physical page NP - 1 - j, the
     * SPARE lowest pages owned by no one. */
    int64_t need = 0;
    cr_assert_eq(oscar_layout_pages_for(&lay[0], T, &need), OSCAR_OK);
    const int NP = (int)need + SPARE;
    int32_t bt[64], lens = 0, slot = 0;
    cr_assert(need <= 64);
    for (int j = 0; j < (int)need; j++) bt[j] = NP - 1 - j;
    const size_t slot_bytes = big.window_slot_bytes, pmax = (size_t)NP * big.page_bytes;
    /* the poison source covers the window slots too (a slot can outgrow a layer's pool) */
    const size_t pz = pmax > slot_bytes ? pmax : slot_bytes;
    unsigned char *poison = malloc(pz), *host = malloc(pmax), *uhost = malloc(pmax);
    cr_assert(poison && host && uhost);
    rc_poison(poison, pz);
    void *pages[2][NL], *wins[2][NL];
    for (int u = 0; u < 2; u++)
        for (int l = 0; l < NL; l++) {
            pages[u][l] = pool(rt, dev, poison, (size_t)NP * ls[u][l].page_bytes); /* exactly the layer's pool */
            wins[u][l] = pool(rt, dev, poison, slot_bytes);
        }
    void *dbt = dev ? pool(rt, dev, bt, sizeof bt) : bt, *dslot = dev ? pool(rt, dev, &slot, 4) : &slot,
         *dlens = dev ? pool(rt, dev, &lens, 4) : &lens;
    size_t wsb = 0, w1 = 0;
    const int step = chunk > 0 ? chunk : 1;
    cr_assert_eq(oscar_plan_workspace_bytes(plan[0], step, T, &wsb), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_plan_workspace_bytes(plan[1], step, T, &w1), OSCAR_OK, "%s", oscar_last_error());
    if (w1 > wsb) wsb = w1; /* one workspace for both plans, their calls in order */
    void *ws = NULL;
    if (dev)
        cr_assert_eq(oscar_buffer_alloc(rt, wsb, &ws), OSCAR_OK, "%s", oscar_last_error());
    else
        cr_assert((ws = malloc(wsb)));
    cr_assert_eq(oscar_plan_workspace_init(plan[0], ws, NULL), OSCAR_OK, "%s", oscar_last_error());

    enum { NMAX = 8 };
    cr_assert(step <= NMAX);
    uint16_t kb[NMAX * HKV * D], vb[NMAX * HKV * D], qb[NMAX * HQ * D], obuf[NMAX * HQ * D], first[NMAX * HQ * D];
    void *dk = kb, *dv = vb, *dq = qb, *dout = obuf, *dcu = NULL;
    if (dev) {
        dk = pool(rt, dev, kb, sizeof kb), dv = pool(rt, dev, vb, sizeof vb), dq = pool(rt, dev, qb, sizeof qb);
        dout = pool(rt, dev, obuf, sizeof obuf), dcu = pool(rt, dev, poison, 8);
    }
    oscar_batch b = {1, dlens, dslot, dbt, (int32_t)need, T};
    double ref[HQ * D];
    char msg[256];
    for (int t0 = 0; t0 < T; t0 += step) {
        const int n = T - t0 < step ? T - t0 : step;
        int32_t cu[2] = {0, n};
        lens = t0 + n;
        if (dev) {
            cr_assert_eq(oscar_buffer_write(rt, dcu, 0, cu, sizeof cu, NULL), OSCAR_OK, "%s", oscar_last_error());
            cr_assert_eq(oscar_buffer_write(rt, dlens, 0, &lens, 4, NULL), OSCAR_OK, "%s", oscar_last_error());
        }
        const int32_t *ucu = dev ? (const int32_t *)dcu : cu;
        for (int l = 0; l < NL; l++) {
            rc_to_dtype(OSCAR_DTYPE_BF16, k[l] + (size_t)t0 * HKV * D, kb, (size_t)n * HKV * D);
            rc_to_dtype(OSCAR_DTYPE_BF16, v[l] + (size_t)t0 * HKV * D, vb, (size_t)n * HKV * D);
            rc_to_dtype(OSCAR_DTYPE_BF16, q[l] + (size_t)t0 * HQ * D, qb, (size_t)n * HQ * D);
            if (dev) {
                cr_assert_eq(oscar_buffer_write(rt, dk, 0, kb, sizeof kb, NULL), OSCAR_OK, "%s", oscar_last_error());
                cr_assert_eq(oscar_buffer_write(rt, dv, 0, vb, sizeof vb, NULL), OSCAR_OK, "%s", oscar_last_error());
                cr_assert_eq(oscar_buffer_write(rt, dq, 0, qb, sizeof qb, NULL), OSCAR_OK, "%s", oscar_last_error());
            }
            for (int u = 0; u < 2; u++) {
                oscar_cache c = {pages[u][l], NP, wins[u][l], 1};
                rc_poison(obuf, sizeof obuf);
                if (dev)
                    cr_assert_eq(oscar_buffer_write(rt, dout, 0, obuf, sizeof obuf, NULL), OSCAR_OK, "%s",
                                 oscar_last_error());
                cr_assert_eq(oscar_append(plan[u], l, &c, &b, ucu, n, dk, dv, 0, ws, wsb, NULL), OSCAR_OK,
                             "%s layer %d step %d: %s (seed %llu)", backend, l, t0, oscar_last_error(),
                             (unsigned long long)seed);
                if (chunk == 0) {
                    cr_assert_eq(oscar_decode(plan[u], l, &c, &b, dq, 0, dout, 0, 0.0f, 0, ws, wsb, NULL), OSCAR_OK,
                                 "%s layer %d step %d: %s", backend, l, t0, oscar_last_error());
                } else {
                    oscar_attn_args a;
                    oscar_attn_args_default(&a);
                    a.cu_q = ucu, a.total_q = n, a.max_q_len = n, a.q = dq, a.out = dout, a.out_bytes = sizeof obuf;
                    a.workspace = ws, a.workspace_bytes = wsb;
                    cr_assert_eq(oscar_extend(plan[u], l, &c, &b, &a), OSCAR_OK, "%s layer %d chunk at %d: %s",
                                 backend, l, t0, oscar_last_error());
                }
                if (dev) {
                    pool_read(rt, dev, obuf, dout, sizeof obuf);
                    cr_assert_eq(oscar_plan_check(plan[u], ws, NULL), OSCAR_OK, "%s layer %d step %d: %s", backend,
                                 l, t0, oscar_last_error());
                }
                /* Both layouts run the same kernels on the same values (only the page stride differs,
                 * which may change the split of the history): within float reassociation and one
                 * output rounding of each other. */
                if (u == 0) memcpy(first, obuf, sizeof first);
                for (size_t i = 0; u == 1 && i < (size_t)n * HQ * D; i++) {
                    const double a = oscar_load(OSCAR_DTYPE_BF16, first, i), c = oscar_load(OSCAR_DTYPE_BF16, obuf, i);
                    cr_assert_leq(fabs(a - c), 0x1p-7 * fmax(fabs(a), fabs(c)) + 1e-4, "%s layer %d step %d output %zu: "
                                  "per-layer pages %g, uniform %g (seed %llu)", backend, l, t0, i, a, c,
                                  (unsigned long long)seed);
                }
                for (int t = t0; t < t0 + n; t++) {
                    const uint16_t *ob = obuf + (size_t)(t - t0) * HQ * D;
                    rc_tf_attention(T, HQ, HKV, D, S0, W, q[l], kw[l], vw[l], kq[l], vq[l], t, 0, 0, chunk, ref);
                    /* CUDA: the tensor-core kernels score the 2-bit rows with q~ in two int8 limbs
                     * (FORMAT.md §5), which against exact attention moves outputs where a key's outlier
                     * channels meet them (seen: 2.7e-3 of the largest output with these keys); their own
                     * floor (2^-10) is checked against a q~-aware reference in test_backend_conformance.
                     * Here the layout is the subject, and the comparison above is the tight one. */
                    const double fl = !strcmp(backend, "cuda") ? 0x1p-7 : 2e-4;
                    int nbad = dev ? rc_check_output_abs(OSCAR_DTYPE_BF16, ob, ref, HQ * D, fl, msg, sizeof msg)
                                   : rc_check_output(OSCAR_DTYPE_BF16, ob, ref, HQ * D, msg, sizeof msg);
                    cr_assert_eq(nbad, 0, "%s %s layer %d (%d planes) query %d: %d outputs off the float64 "
                                 "reference, %s (seed %llu)",
                                 backend, u ? "uniform" : "per-layer", l, k_planes[l], t, nbad, msg,
                                 (unsigned long long)seed);
                }
            }
        }
    }

    /* The write path: each layer's page equals the uniform page's first page_bytes; the uniform page's
     * planes past the layer's are untouched; the pages no one owns are poison. */
    for (int l = 0; l < NL; l++) {
        const size_t pb = ls[0][l].page_bytes, ub = ls[1][l].page_bytes;
        pool_read(rt, dev, host, pages[0][l], (size_t)NP * pb);
        pool_read(rt, dev, uhost, pages[1][l], (size_t)NP * ub);
        for (int p = 0; p < NP; p++) {
            cr_assert(memcmp(host + (size_t)p * pb, uhost + (size_t)p * ub, pb) == 0,
                      "%s layer %d page %d: the per-layer page differs from the uniform page's first %zu bytes "
                      "(seed %llu)",
                      backend, l, p, pb, (unsigned long long)seed);
            cr_assert(memcmp(uhost + (size_t)p * ub + pb, poison, ub - pb) == 0,
                      "%s layer %d page %d: the uniform page's unused planes were written", backend, l, p);
            if (p < SPARE)
                cr_assert(memcmp(host + (size_t)p * pb, poison, pb) == 0,
                          "%s layer %d: page %d, owned by no sequence, was written", backend, l, p);
            else
                cr_assert(memcmp(host + (size_t)p * pb, poison, pb) != 0, "%s layer %d: page %d was not written",
                          backend, l, p);
        }
    }

    for (int u = 0; u < 2; u++)
        for (int l = 0; l < NL; l++) {
            pool_free(rt, dev, pages[u][l]);
            pool_free(rt, dev, wins[u][l]);
        }
    pool_free(rt, dev, ws);
    if (dev) {
        void *bufs[] = {dbt, dslot, dlens, dk, dv, dq, dout, dcu};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) oscar_buffer_free(rt, bufs[i]);
    }
    for (int u = 0; u < 2; u++) oscar_plan_destroy(plan[u]);
    oscar_runtime_destroy(rt);
    oscar_params_destroy(prm);
    for (int l = 0; l < NL; l++) free(k[l]), free(v[l]), free(q[l]), free(kq[l]), free(vq[l]), free(kw[l]), free(vw[l]);
    free(poison), free(host), free(uhost);
}

Test(per_layer_pages, cpu_decode) { run_per_layer("cpu", 0); }
Test(per_layer_pages, cpu_chunked_7) { run_per_layer("cpu", 7); }
Test(per_layer_pages, opencl_decode, .timeout = 900) { run_per_layer("opencl", 0); }
Test(per_layer_pages, opencl_chunked_7, .timeout = 900) { run_per_layer("opencl", 7); }
Test(per_layer_pages, cuda_decode, .timeout = 900) { run_per_layer("cuda", 0); }
Test(per_layer_pages, cuda_chunked_7, .timeout = 900) { run_per_layer("cuda", 7); }
