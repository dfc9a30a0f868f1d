/* Split sizing of the GPU decode (backends/gpu/gpu_core.c, host code shared by
 * the CUDA, HIP and OpenCL plugins). Runs without a GPU. */
#include <criterion/criterion.h>
#include <string.h>

#include "gpu_core.h"

static void check_cover(int seqs, int heads, int len, int threads, int min_chunk, int resident, int max_splits) {
    int ns = 0, chunk = 0;
    gpu_choose_splits(seqs, heads, len, threads, min_chunk, 1056, resident, max_splits, &ns, &chunk);
    cr_assert(ns >= 1 && chunk >= threads && chunk % threads == 0, "seqs %d len %d: %d splits of %d", seqs, len, ns,
              chunk);
    cr_assert((long long)ns * chunk >= len, "seqs %d len %d: %d x %d does not cover the sequence", seqs, len, ns, chunk);
    cr_assert((long long)(ns - 1) * chunk < len, "seqs %d len %d: split %d would be empty", seqs, len, ns - 1);
    cr_assert(ns <= max_splits || ns == 1, "seqs %d len %d: %d splits above the workspace's %d", seqs, len, ns,
              max_splits);
}

Test(gpu_splits, every_choice_covers_the_sequence_without_empty_splits) {
    const int lens[] = {1, 100, 255, 256, 257, 4096, 9216, 32768, 131072, 1000003};
    const int seqs[] = {1, 3, 8, 32, 64, 172};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t j = 0; j < sizeof seqs / sizeof seqs[0]; j++)
            for (int resident = 0; resident <= 528; resident += 264) {
                check_cover(seqs[j], 8, lens[i], 128, 256, resident, 1 << 20);
                check_cover(seqs[j], 8, lens[i], 128, 256, resident, 3);
            }
}

/* The wave rule (resident CTAs known): H200-like device, 132 SMs x 4 CTAs.
 * Measured on the H200 (perf/RESULTS-attention.md, run 3): without a fixed
 * cost per CTA the rule chose 128 splits of 256 tokens at batch 64 x 32K and
 * the decode ran 2x slower; these are the choices that ran well. */
Test(gpu_splits, wave_rule_keeps_chunks_long_and_fills_one_wave) {
    int ns, chunk;
    gpu_choose_splits(64, 8, 32768, 128, 256, 1056, 528, 1 << 20, &ns, &chunk);
    cr_assert_eq(ns, 1, "batch 64 x 32K: %d splits of %d tokens", ns, chunk);
    gpu_choose_splits(32, 8, 32768, 128, 256, 1056, 528, 1 << 20, &ns, &chunk);
    cr_assert_eq(ns, 2, "batch 32 x 32K: %d splits of %d tokens", ns, chunk);
    gpu_choose_splits(1, 8, 131072, 128, 256, 1056, 528, 1 << 20, &ns, &chunk);
    cr_assert(ns * 8 <= 528 && ns * 8 > 264, "batch 1 x 128K: %d splits should fill one wave of 528 CTAs", ns);
    cr_assert_eq(chunk, 2048);
}

/* Without an occupancy figure the older rule aims at target_blocks CTAs. */
Test(gpu_splits, target_rule_without_occupancy) {
    int ns, chunk;
    gpu_choose_splits(32, 8, 32768, 128, 256, 1056, 0, 1 << 20, &ns, &chunk);
    cr_assert_eq(ns, 5, "%d splits", ns);
    cr_assert_eq(chunk, 6656);
}

/* Tensor-core decode (gpu_tc_choose): the 2-bit splits cover the longest
 * history and the 16-bit splits the window rows (or every row of the BF16
 * method), chunks on the 32-token / 16-row tile grid, no split empty at the
 * batch's longest length, the workspace's split bound kept, head chunks cover
 * the GQA ratio. force_n > 0 ($OSCAR_DECODE_SPLITS): the same, and at most one split more than
 * forced (the carve gives the 16-bit rows one of their own). */
static void check_tc(int seqs, int gqa, int cap, int len, int S0, int W, int bf16m, int d, int resident,
                     int max_splits, int force_n) {
    gpu_tc_splits t;
    gpu_tc_choose(seqs, 8, gqa, cap, len, S0, W, bf16m, d, d / 2 + 8, resident, max_splits, 0, 1024, 1, force_n, &t);
    cr_assert(force_n <= 0 || t.nsplit <= force_n + 1, "len %d seqs %d: %d splits, %d forced", len, seqs, t.nsplit,
              force_n);
    int lh = bf16m ? 0 : (len > S0 + W ? len - S0 - W : 0);
    int nwin = bf16m ? len : (len < S0 + W ? len : S0 + W);
    int nsw = t.nsplit - t.ns2;
    cr_assert(t.hchunks * cap >= gqa && (t.hchunks - 1) * cap < gqa, "gqa %d cap %d: %d head chunks", gqa, cap,
              t.hchunks);
    cr_assert(t.chunk2 % 32 == 0 && t.chunk16 % 16 == 0 && t.chunk2 > 0 && t.chunk16 > 0);
    cr_assert((long long)t.ns2 * t.chunk2 >= lh && (t.ns2 == 0 || (long long)(t.ns2 - 1) * t.chunk2 < lh),
              "len %d seqs %d: %d 2-bit splits of %d for %d history tokens", len, seqs, t.ns2, t.chunk2, lh);
    cr_assert((long long)nsw * t.chunk16 >= nwin && (nsw == 0 || (long long)(nsw - 1) * t.chunk16 < nwin),
              "len %d seqs %d: %d 16-bit splits of %d for %d rows", len, seqs, nsw, t.chunk16, nwin);
    cr_assert(t.nsplit <= max_splits || t.nsplit <= 2, "len %d seqs %d: %d splits above the workspace's %d", len,
              seqs, t.nsplit, max_splits);
}

/* W3 layers: the heads with a plane split their history twice as fine where the 2-bit chunk
 * reaches heavy_chunk, the further splits past ns2 (grid rows of their own, x < ns2x <= ns2) and
 * their partials after the nsplit others. */
static void check_heavy(int seqs, int len, int heavy, int resident, int max_splits) {
    gpu_tc_splits t;
    gpu_tc_choose(seqs, 8, 4, 8, len, 64, 256, 0, 128, 72, resident, max_splits, heavy, 1024, 1, 0, &t);
    int lh = len > 320 ? len - 320 : 0;
    cr_assert_eq(t.pstride, t.nsplit + t.ns2x);
    cr_assert(t.pstride <= max_splits || t.nsplit <= 2, "len %d seqs %d: %d partials above %d", len, seqs,
              t.pstride, max_splits);
    const int in_row = 4 * heavy > 8, from = in_row ? 2048 : 1024;
    if (t.chunk2w == 0) {
        cr_assert_eq(t.ns2x, 0);
        cr_assert(heavy == 0 || t.chunk2 < from || t.ns2 == 0 || t.nsplit + t.ns2 > max_splits,
                  "len %d seqs %d heavy %d: chunk %d not split finer", len, seqs, heavy, t.chunk2);
        return;
    }
    cr_assert(heavy > 0 && t.chunk2 >= from && t.chunk2w % 32 == 0 && t.chunk2w < t.chunk2);
    if (in_row) { /* the heavy heads' splits all in their own rows: ns2 counts them, the others' end early */
        cr_assert(t.ns2x == 0 && ((long long)t.ns2 - 1) * t.chunk2 >= lh, "%d splits of %d", t.ns2, t.chunk2);
    } else {
        cr_assert(t.ns2x >= 1 && t.ns2x <= t.ns2, "%d further splits of %d", t.ns2x, t.ns2);
    }
    int nw = t.ns2 + t.ns2x;
    cr_assert((long long)nw * t.chunk2w >= lh && (long long)(nw - 1) * t.chunk2w < lh,
              "len %d seqs %d: %d splits of %d for %d history tokens", len, seqs, nw, t.chunk2w, lh);
}

Test(gpu_splits, heavy_heads_split_finer) {
    const int lens[] = {1, 321, 4096, 32768, 131072, 1000003};
    const int seqs[] = {1, 8, 32, 64, 172};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t j = 0; j < sizeof seqs / sizeof seqs[0]; j++)
            for (int heavy = 0; heavy <= 8; heavy++) {
                check_heavy(seqs[j], lens[i], heavy, 528, 1 << 20);
                check_heavy(seqs[j], lens[i], heavy, 528, 9);
                check_heavy(seqs[j], lens[i], heavy, 0, 1 << 20);
            }
    /* rows past the heads that would not fit a grid's y dimension (65535): the heavy heads' splits stay
     * in their own rows (an extend of 4096 query rows x GQA 8 in 16-column CTAs: 2048 head chunks) */
    {
        gpu_tc_splits t;
        gpu_tc_choose(1, 30, 4096 * 8, 16, 131072, 64, 256, 0, 128, 72, 528, 1 << 20, 2, 1024, 2, 0, &t);
        cr_assert(t.hchunks == 2048 && 30 * t.hchunks <= 65535 && t.ns2x == 0, "%d head chunks, %d further splits",
                  t.hchunks, t.ns2x);
    }
    /* in their own rows (heavy_rows 0), the splits are the 2-bit layer's; the heavy heads only add theirs */
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        gpu_tc_splits t0, t1;
        gpu_tc_choose(32, 8, 4, 8, lens[i], 64, 256, 0, 128, 72, 528, 1 << 20, 0, 1024, 1, 0, &t0);
        gpu_tc_choose(32, 8, 4, 8, lens[i], 64, 256, 0, 128, 72, 528, 1 << 20, 2, 1024, 0, 0, &t1);
        const int nx = t1.chunk2w > 0 ? (lens[i] - 320 + t1.chunk2w - 1) / t1.chunk2w - t0.ns2 : 0;
        cr_assert(t0.ns2 + nx == t1.ns2 && t0.chunk2 == t1.chunk2 && t0.nsplit + nx == t1.nsplit && t1.ns2x == 0,
                  "len %d: %d x %d / %d x %d", lens[i], t0.ns2, t0.chunk2, t1.ns2, t1.chunk2);
    }
    /* in rows of their own: at batch 32 x 32K (8 heads, one with a plane, 528 resident) the 2-bit CTAs
     * no longer spill a thin last wave (in their own rows: 512 + 64, the twenty-eighth session's H100
     * case) */
    for (int w = 0; w < 2; w++) {
        gpu_tc_splits t;
        gpu_tc_choose(32, 8, 4, 8, 32768, 64, 256, 0, 128, 72, 528, 1 << 20, 1, 1024, w, 0, &t);
        const long long own = w ? t.ns2 : (32448 + t.chunk2 - 1) / t.chunk2; /* 2-bit splits of a 2-bit head */
        const long long ctas = 32LL * 7 * own + 32LL * (t.ns2 + t.ns2x), last = ctas % 528;
        cr_assert(w == 0 ? t.ns2x == 0 && t.chunk2w > 0 : t.ns2x > 0, "rows %d: no further splits", w);
        cr_assert(w == (last == 0 || last >= 528 / 4), "rows %d: %d + %d splits, %lld 2-bit CTAs", w, t.ns2, t.ns2x,
                  ctas);
    }
}

Test(gpu_splits, tensor_core_splits_cover_history_and_windows) {
    const int lens[] = {1, 63, 64, 319, 320, 321, 4096, 32768, 131072, 1000003};
    const int seqs[] = {1, 3, 8, 32, 64, 172};
    const int gqas[] = {1, 4, 7, 12, 16, 20};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t j = 0; j < sizeof seqs / sizeof seqs[0]; j++)
            for (size_t k = 0; k < sizeof gqas / sizeof gqas[0]; k++)
                for (int resident = 0; resident <= 528; resident += 528) {
                    int cap = gqas[k] <= 8 ? 8 : 16;
                    check_tc(seqs[j], gqas[k], cap, lens[i], 64, 256, 0, 128, resident, 1 << 20, 0);
                    check_tc(seqs[j], gqas[k], cap, lens[i], 64, 256, 0, 128, resident, 3, 0);
                    check_tc(seqs[j], gqas[k], cap, lens[i], 0, 0, 0, 64, resident, 1 << 20, 0);
                    check_tc(seqs[j], gqas[k], cap, lens[i], 0, 0, 1, 256, resident, 5, 0);
                    for (int n = 1; n <= 300; n = n < 3 ? n + 1 : 10 * n) {
                        check_tc(seqs[j], gqas[k], cap, lens[i], 64, 256, 0, 128, resident, 1 << 20, n);
                        check_tc(seqs[j], gqas[k], cap, lens[i], 0, 0, 1, 256, resident, 1 << 20, n);
                        check_tc(seqs[j], gqas[k], cap, lens[i], 64, 256, 0, 128, resident, 3, n);
                    }
                }
}

/* CUDA/HIP plans for a shape the format allows but the plugin's variant set lacks: refused with the
 * missing field's code, naming what is compiled, the backends that run it and where to add it. The
 * table is the default set's kind: every family at 64, 128, 256, the default group elsewhere. */
Test(gpu_shapes, uncompiled_head_dim_and_group_are_refused_by_name) {
    const int pairs[][2] = {{64, 32}, {64, 64}, {128, 128}, {128, 32}, {256, 128}, {96, 96}, {160, 80}, {160, 160}};
    const int n = (int)(sizeof pairs / sizeof pairs[0]);
    oscar_errbuf err = {{0}};
    cr_assert_eq(gpu_check_compiled_shape("cuda", 128, 32, pairs, n, &err), OSCAR_OK);
    cr_assert_eq(gpu_check_compiled_shape("cuda", 96, 96, pairs, n, &err), OSCAR_OK);
    cr_assert_eq(gpu_check_compiled_shape("cuda", 144, 144, pairs, n, &err), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    cr_assert(strstr(err.msg, "cuda plan: head_dim 144 is not compiled") &&
                  strstr(err.msg, "64, 128, 256, 96, 160") && strstr(err.msg, "cpu and opencl") &&
                  strstr(err.msg, "gen/variants.json"),
              "%s", err.msg);
    cr_assert_eq(gpu_check_compiled_shape("hip", 128, 64, pairs, n, &err), OSCAR_ERR_UNSUPPORTED_GROUP);
    cr_assert(strstr(err.msg, "hip plan: group 64") && strstr(err.msg, "group 128, 32"), "%s", err.msg);
    cr_assert_eq(gpu_check_compiled_shape("cuda", 96, 32, pairs, n, &err), OSCAR_ERR_UNSUPPORTED_GROUP);
    cr_assert(strstr(err.msg, "group 32 is not compiled for head_dim 96") && strstr(err.msg, "(it has group 96)") &&
                  strstr(err.msg, "cuda kernels for it need the group in gen/variants.json"),
              "%s", err.msg);
    cr_assert_eq(gpu_check_compiled_shape("hip", 80, 80, pairs, 0, &err), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    cr_assert(strstr(err.msg, "head_dim none"), "%s", err.msg);
}
