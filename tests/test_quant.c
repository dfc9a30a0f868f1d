/* CPU reference primitives: 16-bit conversions, rotations, clipping, 2-bit
 * row quantization (FORMAT.md §1-§2), fakequant and the int-b baselines.
 * Fresh random inputs every run; the seed is printed in every failure. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "refcheck.h"

static const int k_dims[3] = {64, 128, 256};
static const int k_groups[3] = {32, 64, 128};

/* ------------------------------------------------------------ f16 */
Test(f16, exhaustive_round_trip) {
    for (uint32_t h = 0; h < 65536u; h++) {
        float f = oscar_f16_to_f32((uint16_t)h);
        uint16_t back = oscar_f32_to_f16(f);
        int is_nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
        if (is_nan) {
            cr_assert(isnan(f), "half 0x%04x should be NaN", h);
            cr_assert((back & 0x7c00u) == 0x7c00u && (back & 0x3ffu), "NaN 0x%04x lost: 0x%04x", h, back);
            cr_assert((back & 0x8000u) == (h & 0x8000u), "NaN sign lost for 0x%04x", h);
        } else {
            cr_assert_eq(back, h, "half 0x%04x -> %g -> 0x%04x", h, (double)f, back);
        }
        /* Neighbouring halves are ordered and the value is exact (fp64 check). */
        if (!is_nan && (h & 0x7c00u) != 0x7c00u) {
            int e = (h >> 10) & 31, m = h & 0x3ff;
            double want = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
            if (h & 0x8000u) want = -want;
            cr_assert_eq((double)f, want, "half 0x%04x decodes to %.10g, want %.10g", h, (double)f, want);
        }
    }
}

Test(f16, known_values) {
    struct { float f; uint16_t h; } kv[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {0.0f, 0x0000}, {-0.0f, 0x8000}, {65504.0f, 0x7bff},
        {65519.99f, 0x7bff}, {65520.0f, 0x7c00}, {1e9f, 0x7c00}, {-1e9f, 0xfc00}, {INFINITY, 0x7c00},
        {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, {0x1.8p-25f, 0x0001}, {0x1.8p-24f, 0x0002}, /* tie -> even */
        {0x1p-14f, 0x0400}, {0x1.ff8p-15f, 0x03ff}, {0x1.ffcp-15f, 0x0400}, /* tie: largest subnormal rounds up to normal */
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x3p-11f, 0x3c02}, {1.0f + 0x1p-10f, 0x3c01}, {0.1f, 0x2e66},
        {3.14159265f, 0x4248}, {-65504.0f, 0xfbff}, {1e-8f, 0x0000},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        cr_assert_eq(oscar_f32_to_f16(kv[i].f), kv[i].h, "f32 %a -> 0x%04x, want 0x%04x", (double)kv[i].f,
                     oscar_f32_to_f16(kv[i].f), kv[i].h);
    cr_assert(isnan(oscar_f16_to_f32(oscar_f32_to_f16(NAN))));
    cr_assert(isinf(oscar_f16_to_f32(0x7c00)) && oscar_f16_to_f32(0xfc00) < 0);
}

#ifdef __FLT16_MAX__
/* Compiler's own conversion (IEEE, RNE) as an independent oracle. */
Test(f16, random_floats_match_compiler) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rc_next(&r);
        if (i & 1) u = (u & 0x8fffffffu) | 0x30000000u; /* concentrate on the half range */
        float f = oscar_bits_to_f32(u);
        if (isnan(f)) continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, 2);
        cr_assert_eq(oscar_f32_to_f16(f), want, "seed %llu: %a -> 0x%04x, compiler 0x%04x",
                     (unsigned long long)seed, (double)f, oscar_f32_to_f16(f), want);
    }
}
#endif

/* ------------------------------------------------------------ rotations */
Test(rotation, hadamard_and_composed_are_orthogonal) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    const int dims[] = {64, 128, 256, 80, 96, 112, 160, 192, 208};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int d = dims[di];
        float *H = malloc((size_t)d * d * sizeof *H), *R = malloc((size_t)d * d * sizeof *R);
        oscar_ref_hadamard(d, H);
        cr_assert_lt(rc_orthogonality_error(d, H), 1e-5, "Hadamard d=%d", d);
        rc_random_rotation(&r, d, R);
        double e = rc_orthogonality_error(d, R);
        cr_assert_lt(e, 1e-5, "seed %llu: composed rotation d=%d: max |R R^T - I| = %g", (unsigned long long)seed,
                     d, e);
        free(H);
        free(R);
    }
}

/* The spreading matrix of every supported head_dim (FORMAT.md §1): orthogonal, every entry exactly
 * +-1/sqrt(d) (a row's energy is spread evenly over the d columns, so over every quant group: an
 * outlier channel's share of each group of G columns is exactly G/d), first row constant; the
 * Walsh-Hadamard matrix for powers of two, A (x) S with a Paley core otherwise; QUAROT2's built-in
 * rotation is that matrix; none outside the supported set. */
Test(rotation, spreading_matrix_every_head_dim) {
    int n = 0;
    for (int d = 1; d <= 272; d++) {
        float *H = malloc((size_t)d * d * sizeof *H);
        const int ok = oscar_ref_hadamard(d, H) == 0;
        if (!oscar_head_dim_supported(d)) {
            if (d > 256) cr_assert(!ok, "d %d: past the largest head_dim", d);
            free(H);
            continue;
        }
        n++;
        cr_assert(ok, "supported head_dim %d has no spreading matrix", d);
        int syl = 0, m = oscar_ref_hadamard_order(d, &syl);
        cr_assert_eq(m * syl, d, "d %d = %d x %d", d, m, syl);
        cr_assert((d & (d - 1)) ? m > 2 : m == 1, "d %d: core order %d", d, m);
        const float s = 1.0f / sqrtf((float)d);
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) {
                const float h = H[(size_t)i * d + j];
                cr_assert(h == s || h == -s, "d %d: H[%d][%d] = %g, not +-1/sqrt(d)", d, i, j, (double)h);
                if (i == 0) cr_assert(h == s, "d %d: first row not constant at %d", d, j);
                if (m == 1) cr_assert_eq(h < 0, __builtin_popcount((unsigned)(i & j)) & 1, "d %d: not Walsh", d);
            }
        const double oe = rc_orthogonality_error(d, H);
        cr_assert_lt(oe, 1e-6, "d %d: max |H H^T - I| = %g", d, oe);
        if (d == 96 || d == 80 || d == 160) cr_log_info("d %d = %d x %d: max |H H^T - I| %.2e", d, m, syl, oe);
        oscar_params *p = NULL;
        cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 1, 2, 1, d, &p), OSCAR_OK, "%s",
                     oscar_last_error());
        const float *R;
        cr_assert_eq(oscar_params_rotation(p, 0, 0, OSCAR_K, &R), OSCAR_OK);
        cr_assert_eq(memcmp(R, H, (size_t)d * d * sizeof *H), 0, "d %d: QUAROT2's rotation is not H", d);
        oscar_params_destroy(p);
        free(H);
    }
    cr_assert_eq(n, 15, "multiples of 16 from 32 to 256");
}

/* R = U . Pm . H with Pm[r][bitrev(r)] = 1, checked by brute-force products. */
Test(rotation, composition_index_formula) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int d = 64, bits = 6;
    double *U = malloc((size_t)d * d * sizeof *U), *UP = malloc((size_t)d * d * sizeof *UP);
    float *H = malloc((size_t)d * d * sizeof *H), *R = malloc((size_t)d * d * sizeof *R);
    for (int i = 0; i < d * d; i++) U[i] = rc_normal(&r); /* composition is linear: any U will do */
    oscar_ref_hadamard(d, H);
    /* (U Pm)[i][k] = sum_r U[i][r] Pm[r][k] */
    for (int i = 0; i < d; i++)
        for (int k = 0; k < d; k++) {
            double s = 0;
            for (int rr = 0; rr < d; rr++) s += U[i * d + rr] * (oscar_ref_bitrev(rr, bits) == k ? 1.0 : 0.0);
            UP[i * d + k] = s;
        }
    oscar_ref_compose_rotation(d, U, R);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += UP[i * d + k] * H[k * d + j];
            cr_assert_float_eq(R[i * d + j], s, 1e-5, "R[%d][%d] = %g, U.P.H = %g", i, j, (double)R[i * d + j], s);
        }
    /* Eigen-direction 0 (first column of U = e0 when U = I) spreads over all columns. */
    cr_assert_eq(oscar_ref_bitrev(1, 3), 4);
    cr_assert_eq(oscar_ref_bitrev(6, 3), 3);
    cr_assert_eq(oscar_ref_bitrev(1, 7), 64);
    free(U);
    free(UP);
    free(H);
    free(R);
}

Test(rotation, rotate_unrotate_inverse) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int d = 128;
    float *R = malloc((size_t)d * d * sizeof *R), x[128], y[128], z[128];
    rc_random_rotation(&r, d, R);
    rc_gen_kv(&r, 1, 1, d, 3, OSCAR_DTYPE_F32, x);
    oscar_ref_rotate(d, x, R, y);
    oscar_ref_unrotate(d, y, R, z);
    for (int j = 0; j < d; j++) cr_assert_float_eq(z[j], x[j], 1e-3, "seed %llu j %d", (unsigned long long)seed, j);
    free(R);
}

/* FORMAT.md §1: out[j] = sum_i x[i] R[i][j] over i ascending, each term one fused multiply-add. The
 * plain fmaf loop is the definition, for rotate and unrotate alike; the same loop with a separate
 * multiply and add (the rule before the twenty-fifth session) must differ somewhere in the sample,
 * or this test could not tell the two rules apart. */
Test(rotation, terms_are_fused_multiply_adds) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    static const int dims[] = {48, 64, 128, 256};
    float *R = malloc(256 * 256 * sizeof *R), x[256], y[256], z[256];
    cr_assert(R);
    int unfused_differs = 0;
    for (int it = 0; it < 16; it++) {
        const int d = dims[it % 4];
        rc_random_rotation(&r, d, R);
        rc_gen_kv(&r, 1, 1, d, 3, OSCAR_DTYPE_F32, x);
        oscar_ref_rotate(d, x, R, y);
        oscar_ref_unrotate(d, y, R, z);
        for (int j = 0; j < d; j++) {
            float acc = 0.0f, two = 0.0f, back = 0.0f;
            for (int i = 0; i < d; i++) {
                acc = fmaf(x[i], R[(size_t)i * d + j], acc);
                const float p = x[i] * R[(size_t)i * d + j];
                two = two + p;
                back = fmaf(y[i], R[(size_t)j * d + i], back);
            }
            cr_assert(memcmp(&acc, &y[j], sizeof acc) == 0, "seed %llu d %d: rotate[%d] %.9g, fused sum %.9g",
                      (unsigned long long)seed, d, j, (double)y[j], (double)acc);
            cr_assert(memcmp(&back, &z[j], sizeof back) == 0, "seed %llu d %d: unrotate[%d] %.9g, fused sum %.9g",
                      (unsigned long long)seed, d, j, (double)z[j], (double)back);
            unfused_differs += two != acc;
        }
    }
    cr_assert_gt(unfused_differs, 0, "seed %llu: the two-rounding sums equal the fused ones everywhere",
                 (unsigned long long)seed);
    free(R);
}

/* ------------------------------------------------------------ clipping */
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

Test(clip, tau_matches_brute_force_quantile) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    float x[256], s[256];
    for (int it = 0; it < 3000; it++) {
        int d = k_dims[it % 3];
        float c = it % 7 == 0 ? 1.0f : (float)(0.5 + 0.5 * rc_uniform(&r));
        if (it % 11 == 0) c = 0.96f;
        rc_gen_kv(&r, 1, 1, d, it % 4, OSCAR_DTYPE_BF16, x); /* bf16: many exact ties */
        for (int j = 0; j < d; j++) s[j] = fabsf(x[j]);
        qsort(s, (size_t)d, sizeof(float), cmp_float);
        float pos = c * (float)(d - 1);
        int i = (int)floorf(pos);
        float f = pos - (float)i;
        float want = s[i] + f * (s[i + 1 < d ? i + 1 : d - 1] - s[i]);
        float got = oscar_ref_clip_tau(d, x, c);
        cr_assert_eq(got, want, "seed %llu it %d d %d c %.9g: tau %.9g, brute force %.9g", (unsigned long long)seed,
                     it, d, (double)c, (double)got, (double)want);
    }
}

/* oscar_ref_clip_taus gives, for several ratios at once, exactly what oscar_ref_clip_tau gives for
 * each (the calibration caches a row's grid thresholds with it). */
Test(clip, taus_equal_tau_bit_for_bit) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    static const float grid[12] = {1.0f, 0.99f, 0.98f, 0.97f, 0.96f, 0.95f, 0.94f, 0.92f, 0.90f, 0.88f, 0.85f, 0.80f};
    float x[256], c[16], tau[16];
    for (int it = 0; it < 3000; it++) {
        int d = k_dims[it % 3], n;
        if (it % 2) { /* the calibration's grid, in its order */
            n = 12;
            memcpy(c, grid, sizeof grid);
        } else { /* any ratios in any order, some >= 1, some far below the grid */
            n = rc_randint(&r, 1, 16);
            for (int i = 0; i < n; i++) c[i] = (float)(1.2 * rc_uniform(&r));
            if (it % 6 == 0) c[0] = 0.0f;
        }
        rc_gen_kv(&r, 1, 1, d, it % 4, OSCAR_DTYPE_BF16, x); /* bf16: many exact ties */
        if (it % 5 == 0)
            for (int j = 0; j < d; j += 3) x[j] = 0.0f;
        oscar_ref_clip_taus(d, x, n, c, tau);
        for (int i = 0; i < n; i++) {
            float want = oscar_ref_clip_tau(d, x, c[i]);
            cr_assert(memcmp(&tau[i], &want, sizeof want) == 0,
                      "seed %llu it %d d %d ratio %d = %.9g: taus %.9g, clip_tau %.9g", (unsigned long long)seed, it, d,
                      i, (double)c[i], (double)tau[i], (double)want);
        }
    }
}

/* ------------------------------------------------------------ rows */
Test(row, bit_order_pack_unpack) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    for (int di = 0; di < 3; di++) {
        int d = k_dims[di];
        /* A row whose codes we know: group values exactly b + a*c with a = 1. */
        float x[256], meta[16], out[256];
        uint8_t codes[64];
        int want[256];
        for (int j = 0; j < d; j++) {
            want[j] = rc_randint(&r, 0, 3);
            x[j] = (float)want[j];
        }
        for (int g = 0; g < d / 32; g++) { /* make sure every group spans 0..3 */
            x[g * 32] = 0.0f;
            want[g * 32] = 0;
            x[g * 32 + 1] = 3.0f;
            want[g * 32 + 1] = 3;
        }
        oscar_ref_quantize_row(d, 32, 0, 1.0f, OSCAR_DTYPE_F16, x, codes, meta);
        for (int j = 0; j < d; j++) {
            int manual = (codes[j / 4] >> (2 * (j % 4))) & 3;
            cr_assert_eq(manual, want[j], "d %d value %d: byte %d bits %d..%d hold %d, want %d", d, j, j / 4,
                         2 * (j % 4), 2 * (j % 4) + 1, manual, want[j]);
            cr_assert_eq(oscar_ref_code_at(codes, j), want[j]);
        }
        oscar_ref_dequantize_row(d, 32, 0, codes, meta, out);
        for (int j = 0; j < d; j++) cr_assert_eq(out[j], x[j]);
        /* value 0 in the two least significant bits */
        cr_assert_eq(codes[0] & 3, want[0]);
    }
}

Test(row, uniform_error_within_half_step) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    float x[256], out[256], meta[16];
    uint8_t codes[64];
    for (int it = 0; it < 2000; it++) {
        int d = k_dims[it % 3], G = k_groups[(it / 3) % 3];
        if (G > d) G = d;
        oscar_dtype md = it & 1 ? OSCAR_DTYPE_F32 : OSCAR_DTYPE_F16;
        rc_gen_kv(&r, 1, 1, d, rc_randint(&r, 0, 4), OSCAR_DTYPE_BF16, x);
        oscar_ref_quantize_row(d, G, 0, 1.0f, md, x, codes, meta);
        oscar_ref_dequantize_row(d, G, 0, codes, meta, out);
        for (int g = 0; g < d / G; g++) {
            float mn = x[g * G], mx = x[g * G];
            for (int j = 0; j < G; j++) {
                mn = fminf(mn, x[g * G + j]);
                mx = fmaxf(mx, x[g * G + j]);
            }
            float a = meta[2 * g], b = meta[2 * g + 1];
            cr_assert(isfinite(a) && isfinite(b) && a >= 0);
            /* slack: the rounding of a and b to meta_dtype */
            double slack = (md == OSCAR_DTYPE_F16 ? 0x1p-11 : 0x1p-23) * (fabs(mn) + 3.0 * (mx - mn)) * 1.01 + 1e-7;
            for (int j = 0; j < G; j++) {
                double e = fabs((double)out[g * G + j] - x[g * G + j]);
                cr_assert_leq(e, a / 2.0 + slack, "seed %llu it %d d %d G %d value %d: |err| %g > a/2 %g",
                              (unsigned long long)seed, it, d, G, g * G + j, e, a / 2.0);
            }
        }
    }
}

/* 3-bit codes (FORMAT.md §2.7): a = (max - min) / 7, nearest codes within a/2 (+ metadata rounding), every
 * level reachable, the low two bits in the 2-bit plane and bit 2 in the 1-bit plane; 2 bits through the
 * wide entry is the 2-bit function byte for byte. */
Test(row, three_bit_codes) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    float x[256], out[256], meta[16], meta2[16];
    uint8_t codes[64], hi[32], codes2[64];
    int seen[8] = {0};
    for (int it = 0; it < 1000; it++) {
        int d = k_dims[it % 3], G = k_groups[(it / 3) % 3];
        if (G > d) G = d;
        oscar_dtype md = it & 1 ? OSCAR_DTYPE_F32 : OSCAR_DTYPE_F16;
        rc_gen_kv(&r, 1, 1, d, rc_randint(&r, 0, 4), OSCAR_DTYPE_BF16, x);
        oscar_ref_quantize_row_wide(d, G, 3, 0, 1.0f, md, x, NULL, codes, hi, meta);
        oscar_ref_dequantize_row_wide(d, G, 3, 0, codes, hi, meta, out);
        for (int g = 0; g < d / G; g++) {
            float mn = x[g * G], mx = x[g * G];
            for (int j = 0; j < G; j++) {
                mn = fminf(mn, x[g * G + j]);
                mx = fmaxf(mx, x[g * G + j]);
            }
            float a = meta[2 * g], b = meta[2 * g + 1];
            cr_assert(isfinite(a) && isfinite(b) && a >= 0);
            cr_assert_leq(fabs((double)a - (mx - mn) / 7.0), (md == OSCAR_DTYPE_F16 ? 0x1p-10 : 0x1p-22) * (mx - mn) + 1e-30,
                          "seed %llu it %d: scale %g for range %g", (unsigned long long)seed, it, (double)a,
                          (double)(mx - mn));
            double slack = (md == OSCAR_DTYPE_F16 ? 0x1p-11 : 0x1p-23) * (fabs(mn) + 7.0 * (mx - mn)) * 1.01 + 1e-7;
            for (int j = 0; j < G; j++) {
                const int c = oscar_ref_code3_at(codes, hi, g * G + j);
                cr_assert(c >= 0 && c <= 7);
                seen[c]++;
                cr_assert_eq(out[g * G + j], b + a * (float)c);
                double e = fabs((double)out[g * G + j] - x[g * G + j]);
                cr_assert_leq(e, a / 2.0 + slack, "seed %llu it %d d %d G %d value %d: |err| %g > a/2 %g",
                              (unsigned long long)seed, it, d, G, g * G + j, e, a / 2.0);
            }
        }
        oscar_ref_quantize_row_wide(d, G, 2, 0, 1.0f, md, x, NULL, codes, NULL, meta);
        oscar_ref_quantize_row(d, G, 0, 1.0f, md, x, codes2, meta2);
        cr_assert_eq(memcmp(codes, codes2, (size_t)d / 4), 0);
        cr_assert_eq(memcmp(meta, meta2, (size_t)(2 * d / G) * sizeof(float)), 0);
    }
    for (int c = 0; c < 8; c++) cr_assert_gt(seen[c], 0, "3-bit level %d never used (seed %llu)", c, (unsigned long long)seed);
}

Test(row, uniform_idempotent) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    float x[256], y[256], y2[256], m1[16], m2[16];
    uint8_t c1[64], c2[64];
    for (int it = 0; it < 2000; it++) {
        int d = k_dims[it % 3], G = k_groups[(it / 3) % 3];
        if (G > d) G = d;
        rc_gen_kv(&r, 1, 1, d, rc_randint(&r, 0, 4), OSCAR_DTYPE_BF16, x);
        float c = it % 2 ? 1.0f : 0.92f;
        oscar_ref_quantize_row(d, G, 0, c, OSCAR_DTYPE_F16, x, c1, m1);
        oscar_ref_dequantize_row(d, G, 0, c1, m1, y);
        oscar_ref_quantize_row(d, G, 0, 1.0f, OSCAR_DTYPE_F16, y, c2, m2);
        oscar_ref_dequantize_row(d, G, 0, c2, m2, y2);
        cr_assert(memcmp(c1, c2, (size_t)d / 4) == 0, "seed %llu it %d: codes changed on re-quantization",
                  (unsigned long long)seed, it);
        for (int j = 0; j < d; j++)
            cr_assert_eq(y[j], y2[j], "seed %llu it %d value %d: %g -> %g", (unsigned long long)seed, it, j,
                         (double)y[j], (double)y2[j]);
    }
}

Test(row, lloyd_max_beats_uniform_on_gaussian) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int d = 128;
    float x[128], out[128], meta[16];
    uint8_t codes[32];
    double eu = 0, el = 0;
    for (int it = 0; it < 500; it++) {
        for (int j = 0; j < d; j++) x[j] = oscar_round_to(OSCAR_DTYPE_BF16, (float)rc_normal(&r));
        for (int lm = 0; lm < 2; lm++) {
            oscar_ref_quantize_row(d, 128, lm, 1.0f, OSCAR_DTYPE_F16, x, codes, meta);
            oscar_ref_dequantize_row(d, 128, lm, codes, meta, out);
            for (int j = 0; j < d; j++) *(lm ? &el : &eu) += (out[j] - x[j]) * (double)(out[j] - x[j]);
        }
    }
    cr_assert_lt(el, 0.8 * eu, "seed %llu: Lloyd-Max MSE %g not below uniform %g", (unsigned long long)seed,
                 el / (500.0 * d), eu / (500.0 * d));
    /* ~0.1175 is the Gaussian-optimal 4-level MSE; per-row std estimates add a little */
    cr_assert_lt(el / (500.0 * d), 0.14);
}

Test(row, lloyd_max_codes_and_degenerate_groups) {
    float x[64], out[64], meta[4];
    uint8_t codes[16];
    for (int j = 0; j < 64; j++) x[j] = 2.5f;
    for (int lm = 0; lm < 2; lm++) {
        oscar_ref_quantize_row(64, 32, lm, 1.0f, OSCAR_DTYPE_F16, x, codes, meta);
        oscar_ref_dequantize_row(64, 32, lm, codes, meta, out);
        cr_assert_eq(meta[0], 0.0f);
        for (int j = 0; j < 64; j++) {
            cr_assert_eq(oscar_ref_code_at(codes, j), lm ? 2 : 0, "constant row, a == 0: code rule");
            cr_assert_eq(out[j], 2.5f);
        }
    }
}

Test(row, degenerate_rows_have_finite_metadata) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    float x[128], out[128], meta[16];
    uint8_t codes[32];
    const float scales[] = {0.0f, 1e-30f, 1e-8f, 1e-5f, 1e4f, 1e6f, 1e30f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
        for (int kind = 0; kind < 3; kind++)
            for (int md = 0; md < 2; md++)
                for (int lm = 0; lm < 2; lm++) {
                    for (int j = 0; j < 128; j++) {
                        float v = kind == 0 ? 1.0f : (kind == 1 ? (float)rc_normal(&r) : (j == 5 ? 40.0f : 0.01f));
                        x[j] = oscar_round_to(OSCAR_DTYPE_BF16, v * scales[si]);
                    }
                    oscar_dtype mdt = md ? OSCAR_DTYPE_F32 : OSCAR_DTYPE_F16;
                    oscar_ref_quantize_row(128, 64, lm, lm ? 0.92f : 1.0f, mdt, x, codes, meta);
                    oscar_ref_dequantize_row(128, 64, lm, codes, meta, out);
                    for (int i = 0; i < 4; i++)
                        cr_assert(isfinite(meta[i]), "scale %g kind %d meta %s lm %d: meta[%d] = %g",
                                  (double)scales[si], kind, md ? "f32" : "f16", lm, i, (double)meta[i]);
                    for (int j = 0; j < 128; j++) cr_assert(isfinite(out[j]));
                }
}

/* --------------------------------------------------- error feedback */
/* fb NULL and fb all zero are nearest rounding, bit for bit (codes and metadata). */
Test(row_fb, null_and_zero_weights_are_nearest) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    static float zero[256 * 256];
    float x[256], m0[16], m1[16], m2[16];
    uint8_t c0[64], c1[64], c2[64];
    for (int it = 0; it < 600; it++) {
        int d = k_dims[it % 3], G = k_groups[(it / 3) % 3], lm = (it / 9) & 1;
        if (G > d) G = d;
        oscar_dtype md = (it / 18) & 1 ? OSCAR_DTYPE_F32 : OSCAR_DTYPE_F16;
        float c = it % 4 ? 1.0f : 0.92f;
        rc_gen_kv(&r, 1, 1, d, rc_randint(&r, 0, 4), OSCAR_DTYPE_BF16, x);
        oscar_ref_quantize_row(d, G, lm, c, md, x, c0, m0);
        oscar_ref_quantize_row_fb(d, G, lm, c, md, x, NULL, c1, m1);
        oscar_ref_quantize_row_fb(d, G, lm, c, md, x, zero, c2, m2);
        cr_assert(memcmp(c0, c1, (size_t)d / 4) == 0 && memcmp(c0, c2, (size_t)d / 4) == 0,
                  "seed %llu it %d (d %d G %d lm %d): codes differ from nearest", (unsigned long long)seed, it, d, G,
                  lm);
        cr_assert(memcmp(m0, m1, (size_t)(2 * d / G) * sizeof(float)) == 0 &&
                      memcmp(m0, m2, (size_t)(2 * d / G) * sizeof(float)) == 0,
                  "seed %llu it %d: metadata differs from nearest", (unsigned long long)seed, it);
    }
}

/* oscar_ref_quantize_rows_wide codes n rows as n calls of oscar_ref_quantize_row_wide do: codes, 1-bit
 * planes and metadata byte for byte, with and without feedback, both level sets, 2 and 3 bits, every
 * group, given thresholds or ratios, row counts around its lane width, degenerate (constant) groups,
 * and weights far above the calibration's (errors carried far). */
Test(row_fb, rows_wide_equals_row_at_a_time) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    enum { NMAX = 37 };
    double *C = malloc(256 * 256 * sizeof *C);
    /* Weights per head_dim: [0] a metric's (spread 1e3), [1] a harsher metric's (1e6), [2] wild, [3] zero. */
    float *Fs[3][4], *x = malloc(NMAX * 256 * sizeof *x), tau[NMAX];
    for (int di = 0; di < 3; di++) {
        const int d = k_dims[di];
        for (int k = 0; k < 4; k++) Fs[di][k] = calloc((size_t)d * (size_t)d, sizeof(float));
        for (int k = 0; k < 2; k++) {
            rc_random_metric(&r, d, k ? 1e6 : 1e3, C);
            rc_feedback_weights(d, C, 1e-3, Fs[di][k]);
        }
        for (int j = 0; j < d; j++)
            for (int k = j + 1; k < d; k++) Fs[di][2][j * d + k] = (float)(4.0 * (rc_uniform(&r) - 0.5));
    }
    uint8_t *c0 = malloc(NMAX * 64), *c1 = malloc(NMAX * 64), *h0 = malloc(NMAX * 32), *h1 = malloc(NMAX * 32);
    float *m0 = malloc(NMAX * 16 * sizeof *m0), *m1 = malloc(NMAX * 16 * sizeof *m1);
    int rows_changed = 0, rows_total = 0;
    for (int it = 0; it < 240; it++) {
        const int d = k_dims[it % 3], lm = (it / 3) % 4 == 3, bits = lm ? 2 : 2 + (it / 3) % 2;
        int G = k_groups[(it / 12) % 3];
        if (G > d) G = d;
        /* feedback 0: none, 1-2: a metric's weights, 3: wild weights, 4: zero weights on rows whose values
         * lie on the levels and half-way between them (ties of the rounding, with the feedback path) */
        const int n = rc_randint(&r, 0, NMAX), ng = d / G, fbk = (it / 36) % 5;
        const oscar_dtype md = it % 7 == 0 ? OSCAR_DTYPE_F32 : OSCAR_DTYPE_F16;
        const float cl = it % 4 == 0 ? 1.0f : (float)(0.8 + 0.2 * rc_uniform(&r));
        const float *fb = fbk ? Fs[it % 3][fbk - 1] : NULL;
        rc_gen_kv(&r, n, 1, d, rc_randint(&r, 0, 4), OSCAR_DTYPE_BF16, x);
        if (fbk == 4) {
            const int top = (1 << bits) - 1;
            for (int i = 0; i < n; i++)
                for (int g = 0; g < ng; g++) {
                    float *xg = x + (size_t)i * d + (size_t)g * G;
                    const float s = ldexpf(1.0f, rc_randint(&r, -3, 3)), b = (float)rc_randint(&r, -8, 8) * s;
                    for (int j = 0; j < G; j++) xg[j] = b + s * 0.5f * (float)rc_randint(&r, 0, 2 * top);
                    xg[0] = b; /* min and max: a = s exactly (uniform levels) */
                    xg[1] = b + s * (float)top;
                }
        }
        for (int i = 0; i < n; i++) {
            float *xi = x + (size_t)i * d;
            if (rc_randint(&r, 0, 5) == 0) /* a constant group: a = 0 */
                for (int j = 0; j < G; j++) xi[j] = xi[0];
            if (rc_randint(&r, 0, 9) == 0) memset(xi, 0, (size_t)d * sizeof *xi);
            tau[i] = cl < 1.0f ? oscar_ref_clip_tau(d, xi, cl) : INFINITY;
        }
        rc_poison(c0, NMAX * 64);
        rc_poison(c1, NMAX * 64);
        rc_poison(h0, NMAX * 32);
        rc_poison(h1, NMAX * 32);
        for (int i = 0; i < n; i++)
            oscar_ref_quantize_row_wide(d, G, bits, lm, cl, md, x + (size_t)i * d, fb, c0 + (size_t)i * d / 4,
                                        h0 + (size_t)i * d / 8, m0 + (size_t)i * 2 * ng);
        oscar_ref_quantize_rows_wide(n, d, G, bits, lm, cl, it % 2 ? tau : NULL, md, x, fb, c1, h1, m1);
        const char *what = memcmp(c0, c1, (size_t)n * d / 4) ? "codes"
                           : bits == 3 && memcmp(h0, h1, (size_t)n * d / 8) ? "1-bit plane"
                           : memcmp(m0, m1, (size_t)n * 2 * ng * sizeof *m0) ? "metadata"
                                                                               : NULL;
        cr_assert(!what, "seed %llu it %d (n %d d %d G %d bits %d lm %d feedback %d clip %.3f): %s differ",
                  (unsigned long long)seed, it, n, d, G, bits, lm, fbk, (double)cl, what);
        if (fb && fbk != 4) { /* the feedback must have been exercised: codes other than nearest rounding's */
            uint8_t cn[64], hn[32];
            float mn[16];
            for (int i = 0; i < n; i++, rows_total++) {
                oscar_ref_quantize_row_wide(d, G, bits, lm, cl, md, x + (size_t)i * d, NULL, cn, hn, mn);
                rows_changed += memcmp(cn, c1 + (size_t)i * d / 4, (size_t)d / 4) != 0;
            }
        }
    }
    fprintf(stderr, "rows_wide: %d of %d rows with feedback coded differently from nearest rounding\n", rows_changed,
            rows_total);
    cr_assert_gt(rows_changed, rows_total / 2, "seed %llu: feedback barely changed any code", (unsigned long long)seed);
    free(C);
    for (int di = 0; di < 3; di++)
        for (int k = 0; k < 4; k++) free(Fs[di][k]);
    free(x);
    free(c0);
    free(c1);
    free(h0);
    free(h1);
    free(m0);
    free(m1);
}

/* FORMAT.md §2.3 written out as plainly as possible (uniform levels, no clip, F16 metadata from the
 * library): value j's code from its fed-back value, e = v_j - (b + a code), then v_k = fmaf(-e, F[j][k],
 * v_k) for k > j. fused 0: v_k - e * F[j][k] in two roundings (the rule before the twenty-fifth session). */
static void feedback_codes_by_definition(int d, int G, const float *x, const float *F, const float *meta, int fused,
                                         uint8_t *codes) {
    float v[256];
    memcpy(v, x, (size_t)d * sizeof *v);
    memset(codes, 0, (size_t)d / 4);
    for (int j = 0; j < d; j++) {
        const float a = meta[2 * (j / G)], b = meta[2 * (j / G) + 1];
        int c = 0;
        if (a != 0.0f) {
            const float t = floorf((v[j] - b) / a + 0.5f);
            c = !(t >= 0.0f) ? 0 : t > 3.0f ? 3 : (int)t;
        }
        codes[j / 4] |= (uint8_t)(c << (2 * (j % 4)));
        const float e = v[j] - (b + a * (float)c);
        if (e == 0.0f) continue;
        for (int k = j + 1; k < d; k++) {
            if (fused) {
                v[k] = fmaf(-e, F[(size_t)j * d + k], v[k]);
            } else {
                const float p = e * F[(size_t)j * d + k];
                v[k] = v[k] - p;
            }
        }
    }
}

/* The row and the many-row coders (AVX2+FMA copies on x86 where the CPU has them, fmaf otherwise) give the
 * definition's codes on random rows. (On such rows the two rules almost never pick other codes: 0 of 1200
 * rows differed; the next test puts values on a rounding boundary, where they do.) */
Test(row_fb, updates_are_fused_multiply_adds) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    enum { N = 40 };
    const int dims[3] = {64, 128, 256};
    double *C = malloc(256 * 256 * sizeof *C);
    float *F = malloc(256 * 256 * sizeof *F), *x = malloc((size_t)N * 256 * sizeof *x), meta[N * 8];
    uint8_t c1[N * 64], c2[N * 64], want[64];
    cr_assert(C && F && x);
    for (int di = 0; di < 3; di++) {
        const int d = dims[di], G = di == 0 ? 32 : 128, ng = d / G;
        rc_random_metric(&r, d, 100.0, C);
        rc_feedback_weights(d, C, 1e-3, F);
        rc_gen_kv(&r, N, 1, d, 3, OSCAR_DTYPE_BF16, x);
        oscar_ref_quantize_rows_wide(N, d, G, 2, 0, 1.0f, NULL, OSCAR_DTYPE_F16, x, F, c2, NULL, meta);
        for (int i = 0; i < N; i++) {
            const float *xi = x + (size_t)i * d, *mi = meta + (size_t)i * 2 * ng;
            float m1[8];
            oscar_ref_quantize_row_fb(d, G, 0, 1.0f, OSCAR_DTYPE_F16, xi, F, c1 + (size_t)i * d / 4, m1);
            cr_assert(memcmp(m1, mi, (size_t)2 * ng * sizeof *m1) == 0, "seed %llu d %d row %d: metadata differ",
                      (unsigned long long)seed, d, i);
            feedback_codes_by_definition(d, G, xi, F, mi, 1, want);
            cr_assert(memcmp(want, c1 + (size_t)i * d / 4, (size_t)d / 4) == 0,
                      "seed %llu d %d row %d: oscar_ref_quantize_row_fb's codes are not the definition's",
                      (unsigned long long)seed, d, i);
            cr_assert(memcmp(want, c2 + (size_t)i * d / 4, (size_t)d / 4) == 0,
                      "seed %llu d %d row %d: oscar_ref_quantize_rows_wide's codes are not the definition's",
                      (unsigned long long)seed, d, i);
        }
    }
    free(C);
    free(F);
    free(x);
}

/* Rows built so that value 1, after the one feedback term F[0][1], lands near the boundary between codes
 * 1 and 2 while the term itself is ~1000 (value 1 is clipped to 2.625 for the metadata, but feedback starts
 * from the unclipped row): the product's rounding, ~1e-5, is then far above the spacing of floats at the
 * boundary, and the fused update and the two-rounding one often fall on either side of it. The
 * coders must give the fused definition's code every time (row and many-row paths), and the two rules
 * must disagree on some rows, or this test could not tell them apart. */
Test(row_fb, updates_are_fused_at_a_boundary) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    enum { D = 64, N = 8 };
    float *F = calloc(D * D, sizeof *F), x[N * D], meta[N * 2], m1[2];
    uint8_t c1[D / 4], c2[N * D / 4], want[D / 4], two[D / 4];
    cr_assert(F);
    int disagree = 0;
    for (int it = 0; it < 300; it++) {
        /* min -0.375 and clip 2.625 (two values there, clip ratio 0.98 of 64: tau is the second largest
         * |x|; f16-exact): a = 1, b = -0.375, levels -0.375, 0.625, 1.625, 2.625; x0 = 0.2 codes 1 with
         * error e0 = -0.425; v1 = x1 - e0 F[0][1] near the 1 | 2 boundary 1.125, x1 ~ 850-1300 */
        const float f = (float)(-2000.0 - 1000.0 * rc_uniform(&r));
        F[1] = f;
        for (int i = 0; i < N; i++) {
            float *xi = x + (size_t)i * D;
            for (int j = 0; j < D; j++) xi[j] = 0.0f;
            xi[0] = 0.2f;
            xi[2] = -0.375f;
            xi[D - 2] = xi[D - 1] = 2.625f;
            const float e0 = 0.2f - 0.625f;
            float x1 = (float)(1.125 + (double)e0 * (double)f); /* v1 = x1 - e0 f = 1.125 */
            for (int k = 0; k < i; k++) x1 = nextafterf(x1, i % 2 ? 2e4f : 0.0f); /* a few ulps either way */
            xi[1] = x1;
        }
        oscar_ref_quantize_rows_wide(N, D, D, 2, 0, 0.98f, NULL, OSCAR_DTYPE_F16, x, F, c2, NULL, meta);
        for (int i = 0; i < N; i++) {
            const float *xi = x + (size_t)i * D;
            cr_assert(meta[2 * i] == 1.0f && meta[2 * i + 1] == -0.375f, "the row's metadata is not (1, -0.375)");
            oscar_ref_quantize_row_fb(D, D, 0, 0.98f, OSCAR_DTYPE_F16, xi, F, c1, m1);
            feedback_codes_by_definition(D, D, xi, F, meta + 2 * i, 1, want);
            feedback_codes_by_definition(D, D, xi, F, meta + 2 * i, 0, two);
            cr_assert(memcmp(want, c1, D / 4) == 0 && memcmp(want, c2 + (size_t)i * D / 4, D / 4) == 0,
                      "seed %llu it %d row %d (F[0][1] %.9g, x1 %.9g): codes %d (row) / %d (rows), the fused "
                      "definition's %d",
                      (unsigned long long)seed, it, i, (double)f, (double)xi[1], (c1[0] >> 2) & 3,
                      (c2[(size_t)i * D / 4] >> 2) & 3, (want[0] >> 2) & 3);
            disagree += memcmp(want, two, D / 4) != 0;
        }
    }
    cr_assert_gt(disagree, 0, "seed %llu: the two rules never picked different codes", (unsigned long long)seed);
    free(F);
}

/* e^T C e of e = x - x^ (fp64). */
static double metric_err(int d, const double *C, const float *x, const float *q) {
    double e[256], s = 0.0;
    for (int i = 0; i < d; i++) e[i] = (double)x[i] - q[i];
    for (int i = 0; i < d; i++) {
        double t = 0.0;
        for (int j = 0; j < d; j++) t += C[(size_t)i * d + j] * e[j];
        s += e[i] * t;
    }
    return s;
}

/* With the weights of an anisotropic metric C (normalised upper Cholesky
 * factor of C^-1), the row error measured in C is clearly below nearest
 * rounding's, for every group size and both level sets; the metadata is
 * unchanged and the weights have the format's shape. */
Test(row_fb, metric_weights_lower_metric_error) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    const int dims[2] = {64, 128}, rows = 300;
    double *C = malloc(128 * 128 * sizeof *C);
    float *F = malloc(128 * 128 * sizeof *F), x[128], q[128], mn[16], mf[16];
    uint8_t cn[32], cf[32];
    for (int di = 0; di < 2; di++) {
        int d = dims[di];
        rc_random_metric(&r, d, 1e3, C);
        double fmax = rc_feedback_weights(d, C, 1e-3, F);
        cr_assert(fmax > 0.0 && fmax <= 16.0, "seed %llu d %d: max |F| %g", (unsigned long long)seed, d, fmax);
        for (int j = 0; j < d; j++)
            for (int k = 0; k <= j; k++) cr_assert_eq(F[j * d + k], 0.0f);
        for (int G = 32; G <= d && G <= 128; G *= 2)
            for (int lm = 0; lm < 2; lm++) {
                double en = 0.0, ef = 0.0;
                int changed = 0;
                for (int it = 0; it < rows; it++) {
                    rc_gen_kv(&r, 1, 1, d, 0, OSCAR_DTYPE_BF16, x);
                    oscar_ref_quantize_row_fb(d, G, lm, 1.0f, OSCAR_DTYPE_F16, x, NULL, cn, mn);
                    oscar_ref_dequantize_row(d, G, lm, cn, mn, q);
                    en += metric_err(d, C, x, q);
                    oscar_ref_quantize_row_fb(d, G, lm, 1.0f, OSCAR_DTYPE_F16, x, F, cf, mf);
                    cr_assert(memcmp(mn, mf, (size_t)(2 * d / G) * sizeof(float)) == 0,
                              "seed %llu: feedback changed the metadata", (unsigned long long)seed);
                    oscar_ref_dequantize_row(d, G, lm, cf, mf, q);
                    ef += metric_err(d, C, x, q);
                    changed += memcmp(cn, cf, (size_t)d / 4) != 0;
                }
                fprintf(stderr, "row_fb: d %d G %d %s: max |F| %.3f, metric error feedback/nearest %.3f, %d/%d rows "
                        "changed\n", d, G, lm ? "lloyd-max" : "uniform", fmax, ef / en, changed, rows);
                /* Measured: ratio 0.31-0.47 over 60 (seed, shape) draws; 0.7 leaves room. */
                cr_assert_lt(ef, 0.7 * en,
                             "seed %llu d %d G %d lm %d: feedback metric error %g not 30%% below nearest %g",
                             (unsigned long long)seed, d, G, lm, ef / rows, en / rows);
            }
    }
    free(C);
    free(F);
}

/* ------------------------------------------------------------ fakequant */
static double fq_mse(oscar_method m, const float *x, int n, int H, int d, int G) {
    size_t cnt = (size_t)n * H * d;
    float *y = malloc(cnt * sizeof *y);
    memcpy(y, x, cnt * sizeof *y);
    oscar_status s = oscar_fakequant(NULL, m, 0, OSCAR_V, G, n, H, d, y);
    cr_assert_eq(s, OSCAR_OK, "%s: %s", oscar_method_name(m), oscar_last_error());
    double e = 0;
    for (size_t i = 0; i < cnt; i++) e += (y[i] - x[i]) * (double)(y[i] - x[i]);
    free(y);
    return e / (double)cnt;
}

Test(fakequant, int8_much_better_than_int4_than_int2) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int n = 64, H = 2, d = 128;
    float *x = malloc((size_t)n * H * d * sizeof *x);
    rc_gen_kv(&r, n, H, d, 4, OSCAR_DTYPE_F32, x);
    for (int gi = 0; gi < 3; gi++) {
        int G = k_groups[gi];
        double e2 = fq_mse(OSCAR_METHOD_INT2, x, n, H, d, G), e4 = fq_mse(OSCAR_METHOD_INT4, x, n, H, d, G);
        double e8 = fq_mse(OSCAR_METHOD_INT8, x, n, H, d, G), eb = fq_mse(OSCAR_METHOD_BF16, x, n, H, d, G);
        cr_assert_lt(e4, e2 / 4, "seed %llu G %d: int4 %g int2 %g", (unsigned long long)seed, G, e4, e2);
        cr_assert_lt(e8, e4 / 10, "seed %llu G %d: int8 %g int4 %g", (unsigned long long)seed, G, e8, e4);
        cr_assert_lt(eb, e2 / 100);
        double eq = fq_mse(OSCAR_METHOD_QUAROT2, x, n, H, d, G);
        /* With one group per head an outlier sets every value's step: Hadamard
         * spreads it. (Small groups already isolate outliers: no claim.) */
        if (G == 128) cr_assert_lt(eq, e2, "seed %llu G %d: Hadamard should help with outliers (quarot2 %g int2 %g)",
                     (unsigned long long)seed, G, eq, e2);
    }
    free(x);
}

/* INT2 fakequant equals bf16 rounding + the 2-bit uniform row quantizer, and
 * QUAROT2 equals Hadamard + the same + inverse Hadamard. */
Test(fakequant, int2_and_quarot2_match_reference_pipeline) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int n = 5, H = 3, d = 64, G = 32;
    float x[5 * 3 * 64], y[5 * 3 * 64], Hm[64 * 64], xr[64], q[64], meta[4];
    uint8_t codes[16];
    oscar_ref_hadamard(d, Hm);
    rc_gen_kv(&r, n, H, d, 2, OSCAR_DTYPE_F32, x);
    for (int m = 0; m < 2; m++) {
        memcpy(y, x, sizeof x);
        cr_assert_eq(oscar_fakequant(NULL, m ? OSCAR_METHOD_QUAROT2 : OSCAR_METHOD_INT2, 0, OSCAR_K, G, n, H, d, y),
                     OSCAR_OK);
        for (int row = 0; row < n * H; row++) {
            float b[64], want[64];
            oscar_ref_rotate(d, x + row * d, m ? Hm : NULL, xr);
            for (int j = 0; j < d; j++) b[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
            oscar_ref_quantize_row(d, G, 0, 1.0f, OSCAR_DTYPE_F16, b, codes, meta);
            oscar_ref_dequantize_row(d, G, 0, codes, meta, q);
            oscar_ref_unrotate(d, q, m ? Hm : NULL, want);
            for (int j = 0; j < d; j++)
                cr_assert_eq(y[row * d + j], want[j], "seed %llu method %d row %d j %d", (unsigned long long)seed, m,
                             row, j);
        }
    }
    /* 2-bit fakequant_uniform is the uniform row rule with F16 metadata. */
    for (int it = 0; it < 200; it++) {
        float a[128], b2[128], m2[8];
        uint8_t c2[32];
        rc_gen_kv(&r, 1, 1, 128, 3, OSCAR_DTYPE_BF16, a);
        oscar_ref_quantize_row(128, 64, 0, 1.0f, OSCAR_DTYPE_F16, a, c2, m2);
        oscar_ref_dequantize_row(128, 64, 0, c2, m2, b2);
        oscar_ref_fakequant_uniform(128, 64, 2, a);
        for (int j = 0; j < 128; j++) cr_assert_eq(a[j], b2[j]);
    }
}

Test(fakequant, oscar2_with_params_matches_pipeline) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int n = 7, H = 2, d = 128, G = 64, layers = 2;
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, layers, 4, H, d, &p), OSCAR_OK);
    /* a random calibrated-looking rotation for layer 1, K */
    rc_random_rotation(&r, d, oscar_params_rot_ptr(p, 1, OSCAR_K, 0));
    p->identity = 0;
    float *x = malloc((size_t)n * H * d * sizeof *x), *y = malloc((size_t)n * H * d * sizeof *y);
    rc_gen_kv(&r, n, H, d, 3, OSCAR_DTYPE_F32, x);
    for (int lm = 0; lm < 2; lm++) {
        memcpy(y, x, (size_t)n * H * d * sizeof *y);
        oscar_method m = lm ? OSCAR_METHOD_OSCAR2_LM : OSCAR_METHOD_OSCAR2;
        cr_assert_eq(oscar_fakequant(p, m, 1, OSCAR_K, G, n, H, d, y), OSCAR_OK, "%s", oscar_last_error());
        const float *R = oscar_params_rot_ptr(p, 1, OSCAR_K, 0);
        for (int row = 0; row < n * H; row++) {
            float xr[128], q[128], want[128], meta[4];
            uint8_t codes[32];
            oscar_ref_rotate(d, x + row * d, R, xr);
            for (int j = 0; j < d; j++) xr[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
            oscar_ref_quantize_row(d, G, lm, 0.96f, OSCAR_DTYPE_F16, xr, codes, meta);
            oscar_ref_dequantize_row(d, G, lm, codes, meta, q);
            oscar_ref_unrotate(d, q, R, want);
            for (int j = 0; j < d; j++) cr_assert_eq(y[row * d + j], want[j], "seed %llu", (unsigned long long)seed);
        }
    }
    free(x);
    free(y);
    oscar_params_destroy(p);
}

/* oscar_ref_fakequant_rows with per-head rotations, feedback weights, clips and code widths equals the
 * row-at-a-time pipeline (rotate, bf16, oscar_ref_quantize_row_wide, dequantize, unrotate) bit for bit,
 * for token counts around its block of rows (it codes a head's rows side by side). */
Test(fakequant, oscar2_feedback_rows_match_row_pipeline) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    enum { H = 3 };
    const int counts[4] = {1, 8, 45, 70};
    for (int it = 0; it < 8; it++) {
        const int d = it % 2 ? 128 : 64, G = it % 4 < 2 ? d : 32, n = counts[it / 2], lm = it == 5;
        const size_t dd = (size_t)d * (size_t)d;
        float *rot = malloc(H * dd * sizeof *rot), *fb = malloc(H * dd * sizeof *fb);
        double *C = malloc(dd * sizeof *C);
        float *x = malloc((size_t)n * H * d * sizeof *x), *y = malloc((size_t)n * H * d * sizeof *y);
        cr_assert(rot && fb && C && x && y);
        float clip[H];
        uint8_t bits[H];
        for (int h = 0; h < H; h++) {
            rc_random_rotation(&r, d, rot + h * dd);
            rc_random_metric(&r, d, 100.0, C);
            rc_feedback_weights(d, C, 1e-3, fb + h * dd);
            clip[h] = h == 1 ? 1.0f : (float)(0.85 + 0.14 * rc_uniform(&r));
            bits[h] = (uint8_t)(!lm && h == 2 ? 3 : 2);
        }
        rc_gen_kv(&r, n, H, d, 3, OSCAR_DTYPE_F32, x);
        memcpy(y, x, (size_t)n * H * d * sizeof *y);
        cr_assert_eq(oscar_ref_fakequant_rows(lm ? OSCAR_METHOD_OSCAR2_LM : OSCAR_METHOD_OSCAR2, 1, G, clip, 1, bits,
                                              rot, fb, 1, n, H, d, y),
                     0);
        for (int row = 0; row < n * H; row++) {
            const int h = row % H;
            float xr[128], q[128], want[128], meta[8];
            uint8_t codes[32], hi[16];
            oscar_ref_rotate(d, x + (size_t)row * d, rot + h * dd, xr);
            for (int j = 0; j < d; j++) xr[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
            oscar_ref_quantize_row_wide(d, G, bits[h], lm, clip[h], OSCAR_DTYPE_F16, xr, fb + h * dd, codes, hi, meta);
            oscar_ref_dequantize_row_wide(d, G, bits[h], lm, codes, hi, meta, q);
            oscar_ref_unrotate(d, q, rot + h * dd, want);
            cr_assert(memcmp(y + (size_t)row * d, want, (size_t)d * sizeof *want) == 0,
                      "seed %llu it %d (n %d d %d G %d lm %d): token %d head %d differs from the row pipeline",
                      (unsigned long long)seed, it, n, d, G, lm, row / H, h);
        }
        free(rot);
        free(fb);
        free(C);
        free(x);
        free(y);
    }
}

Test(fakequant, kivi2_shapes_and_axes) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int n = 64, H = 2, d = 128, G = 32;
    float *x = malloc((size_t)n * H * d * sizeof *x), *y = malloc((size_t)n * H * d * sizeof *y);
    rc_gen_kv(&r, n, H, d, 4, OSCAR_DTYPE_F32, x);
    memcpy(y, x, (size_t)n * H * d * sizeof *y);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_KIVI2, 0, OSCAR_K, G, n, H, d, y), OSCAR_OK);
    /* keys: each (32-token group, head, channel) column takes at most 4 values */
    for (int t0 = 0; t0 < n; t0 += 32)
        for (int c = 0; c < H * d; c++) {
            float vals[4];
            int nv = 0;
            for (int t = t0; t < t0 + 32; t++) {
                float v = y[(size_t)t * H * d + c];
                int k = 0;
                while (k < nv && vals[k] != v) k++;
                if (k == nv) {
                    cr_assert_lt(nv, 4, "seed %llu: key column %d has > 4 levels", (unsigned long long)seed, c);
                    vals[nv++] = v;
                }
            }
        }
    /* per-channel over tokens handles channel outliers: error far below per-token int2 */
    double ek = 0, ei = 0;
    float *z = malloc((size_t)n * H * d * sizeof *z);
    memcpy(z, x, (size_t)n * H * d * sizeof *z);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, G, n, H, d, z), OSCAR_OK);
    for (int i = 0; i < n * H * d; i++) {
        ek += (y[i] - x[i]) * (double)(y[i] - x[i]);
        ei += (z[i] - x[i]) * (double)(z[i] - x[i]);
    }
    cr_assert_lt(ek, ei, "seed %llu: kivi2 K error %g not below int2 %g", (unsigned long long)seed, ek, ei);
    /* values: per token over groups of G channels, same as INT2 */
    memcpy(y, x, (size_t)n * H * d * sizeof *y);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_KIVI2, 0, OSCAR_V, G, n, H, d, y), OSCAR_OK);
    memcpy(z, x, (size_t)n * H * d * sizeof *z);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_V, G, n, H, d, z), OSCAR_OK);
    cr_assert(memcmp(y, z, (size_t)n * H * d * sizeof *y) == 0);
    /* keys need whole groups of 32 tokens; values do not */
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_KIVI2, 0, OSCAR_K, G, 33, H, d, y), OSCAR_ERR_SHAPE_MISMATCH);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_KIVI2, 0, OSCAR_V, G, 33, H, d, y), OSCAR_OK);
    free(x);
    free(y);
    free(z);
}

Test(fakequant, bad_inputs_return_their_codes) {
    float x[2 * 128];
    for (int i = 0; i < 256; i++) x[i] = (float)i * 0.01f;
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 0, 1, 1, 128, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 0, 1, 1, 100, x), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 48, 1, 1, 128, x), OSCAR_ERR_UNSUPPORTED_GROUP);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 128, 1, 1, 64, x), OSCAR_ERR_UNSUPPORTED_GROUP);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 0, 0, 1, 128, x), OSCAR_ERR_EMPTY);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT2, 0, OSCAR_K, 0, -3, 1, 128, x), OSCAR_ERR_EMPTY);
    cr_assert_eq(oscar_fakequant(NULL, (oscar_method)99, 0, OSCAR_K, 0, 1, 1, 128, x), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_OSCAR2, 0, OSCAR_K, 0, 1, 1, 128, x), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_neq(oscar_last_error()[0], 0, "every failure leaves a message");
    float keep[256];
    memcpy(keep, x, sizeof x);
    x[77] = NAN;
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_INT4, 0, OSCAR_K, 0, 2, 1, 128, x), OSCAR_ERR_NONFINITE);
    x[77] = keep[77];
    x[200] = -INFINITY;
    cr_assert_eq(oscar_fakequant(NULL, OSCAR_METHOD_QUAROT2, 0, OSCAR_K, 0, 2, 1, 128, x), OSCAR_ERR_NONFINITE);
    x[200] = keep[200];
    cr_assert(memcmp(x, keep, sizeof x) == 0, "refused calls leave the rows untouched");
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 2, 4, 2, 128, &p), OSCAR_OK);
    cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, 0, OSCAR_K, 0, 1, 1, 128, x), OSCAR_ERR_SHAPE_MISMATCH);
    cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, -1, OSCAR_K, 0, 1, 2, 128, x), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, 0, OSCAR_K, 0, 2, 2, 64, x), OSCAR_ERR_SHAPE_MISMATCH);
    cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, 5, OSCAR_K, 0, 1, 2, 128, x), OSCAR_ERR_SHAPE_MISMATCH);
    cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, 1, OSCAR_V, 0, 1, 2, 128, x), OSCAR_OK);
    oscar_params_destroy(p);
}

Test(fakequant, method_bits) {
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_OSCAR2, 128, 128, OSCAR_DTYPE_F16), 2.25, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_INT2, 128, 64, OSCAR_DTYPE_F16), 2.5, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_QUAROT2, 128, 32, OSCAR_DTYPE_F16), 3.0, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_OSCAR2_LM, 128, 0, OSCAR_DTYPE_F16), 2.25, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_INT4, 128, 128, OSCAR_DTYPE_F16), 4.25, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_INT8, 64, 32, OSCAR_DTYPE_F16), 9.0, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_KIVI2, 128, 128, OSCAR_DTYPE_F16), (3.0 + 2.25) / 2, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_BF16, 128, 128, OSCAR_DTYPE_F16), 16.0, 1e-12);
    cr_assert_float_eq(oscar_method_bits(OSCAR_METHOD_OSCAR2, 128, 128, OSCAR_DTYPE_F32), 2.5, 1e-12);
}
