/* Split sizing of the GPU decode (backends/gpu/gpu_core.c, host code shared by
 * the CUDA, HIP and OpenCL plugins). Runs without a GPU. */
#include <criterion/criterion.h>

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
