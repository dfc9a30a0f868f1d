/* Alternative placements P of the eigen-directions in R = U . H . P
 * (oscar_calib_options.permutation, docs/eval/permutation.md): each is a
 * permutation, deterministic, orthogonal after composition, the default stays
 * the published bit-reversal bit for bit, and the m-sequence order's top
 * positions are not XOR-closed. Fresh random inputs; the seed is printed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "oscar_ref.h"
#include "oscar/oscar.h"
#include "refcheck.h"

static const int k_dims[3] = {64, 128, 256};

/* Random orthogonal d x d (fp64, modified Gram-Schmidt on Gaussian columns). */
static void random_orthogonal(rc_rng *r, int d, double *U) {
    for (int i = 0; i < d * d; i++) U[i] = rc_normal(r);
    for (int c = 0; c < d; c++) {
        for (int p = 0; p < c; p++) {
            double dot = 0;
            for (int i = 0; i < d; i++) dot += U[i * d + c] * U[i * d + p];
            for (int i = 0; i < d; i++) U[i * d + c] -= dot * U[i * d + p];
        }
        double n = 0;
        for (int i = 0; i < d; i++) n += U[i * d + c] * U[i * d + c];
        n = sqrt(n);
        for (int i = 0; i < d; i++) U[i * d + c] /= n;
    }
}

/* 1 when {pos[0..k-1]} is closed under XOR (a subgroup of GF(2)^bits). */
static int xor_closed(const int *pos, int k, int d) {
    char *in = calloc((size_t)d, 1);
    for (int i = 0; i < k; i++) in[pos[i]] = 1;
    int closed = 1;
    for (int a = 0; a < k && closed; a++)
        for (int b = 0; b < k; b++)
            if (!in[pos[a] ^ pos[b]]) {
                closed = 0;
                break;
            }
    free(in);
    return closed;
}

Test(permutation, positions_are_permutations_and_deterministic) {
    for (int di = 0; di < 3; di++) {
        int d = k_dims[di];
        for (int pm = 0; pm <= 2; pm++) {
            int a[256], b[256], seen[256] = {0};
            cr_assert_eq(oscar_ref_rotation_positions(d, pm, a), 0);
            cr_assert_eq(oscar_ref_rotation_positions(d, pm, b), 0);
            cr_assert_eq(memcmp(a, b, sizeof(int) * (size_t)d), 0, "d %d permutation %d not deterministic", d, pm);
            for (int r = 0; r < d; r++) {
                cr_assert(a[r] >= 0 && a[r] < d);
                cr_assert_eq(seen[a[r]], 0, "d %d permutation %d: position %d used twice", d, pm, a[r]);
                seen[a[r]] = 1;
            }
            cr_assert_eq(a[0], 0, "rank 0 keeps the constant Walsh function");
            int differ = 0, bits = 0;
            while ((1 << bits) < d) bits++;
            for (int r = 0; r < d; r++) differ += a[r] != oscar_ref_bitrev(r, bits);
            if (pm == 0) cr_assert_eq(differ, 0);
            else cr_assert_gt(differ, d / 2, "d %d permutation %d: only %d positions differ from bit-reversal", d, pm,
                              differ);
        }
        int p[256];
        cr_assert_eq(oscar_ref_rotation_positions(d, 3, p), -1);
        cr_assert_eq(oscar_ref_rotation_positions(d, -1, p), -1);
    }
    int p[512];
    cr_assert_eq(oscar_ref_rotation_positions(100, 0, p), -1); /* no spreading matrix: not a supported head_dim */
    cr_assert_eq(oscar_ref_rotation_positions(512, 0, p), -1);
}

/* Bit-reversal's top 2^m positions form a subgroup (the problem this option
 * probes); the m-sequence order's top k are never XOR-closed for 2 < k < d. */
Test(permutation, spread_top_positions_not_xor_closed) {
    for (int di = 0; di < 3; di++) {
        int d = k_dims[di];
        int br[256], sp[256];
        oscar_ref_rotation_positions(d, OSCAR_REF_PERM_BITREV, br);
        oscar_ref_rotation_positions(d, OSCAR_REF_PERM_SPREAD, sp);
        cr_assert(xor_closed(br, 16, d), "d %d: bit-reversal top 16 expected XOR-closed", d);
        cr_assert_not(xor_closed(sp, 16, d), "d %d: m-sequence top 16 is XOR-closed", d);
        for (int k = 3; k < d; k++) cr_assert_not(xor_closed(sp, k, d), "d %d: m-sequence top %d XOR-closed", d, k);
    }
}

/* Head dims that are not powers of two, d = m 2^k with a Paley core of order m (H = A (x) S). */
static const int k_other_dims[11] = {48, 80, 96, 112, 144, 160, 176, 192, 208, 224, 240};

/* R orthogonal, = U.H.P for the placement, and BITREV bit-identical to the
 * published oscar_ref_compose_rotation; powers of two and the other head dims. */
Test(permutation, composed_rotation_orthogonal_and_exact) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    for (int di = 0; di < 3 + 11; di++) {
        int d = di < 3 ? k_dims[di] : k_other_dims[di - 3];
        size_t dd = (size_t)d * d;
        double *U = malloc(dd * sizeof *U);
        float *R = malloc(dd * sizeof *R), *R0 = malloc(dd * sizeof *R0), *R2 = malloc(dd * sizeof *R2);
        float *H = malloc(dd * sizeof *H);
        random_orthogonal(&r, d, U);
        oscar_ref_hadamard(d, H);
        oscar_ref_compose_rotation(d, U, R0);
        cr_assert_eq(oscar_ref_compose_rotation_perm(d, U, OSCAR_REF_PERM_BITREV, R), 0);
        cr_assert_eq(memcmp(R, R0, dd * sizeof *R), 0, "seed %llu d %d: BITREV differs from the published path",
                     (unsigned long long)seed, d);
        for (int pm = 1; pm <= 2; pm++) {
            cr_assert_eq(oscar_ref_compose_rotation_perm(d, U, pm, R), 0);
            cr_assert_eq(oscar_ref_compose_rotation_perm(d, U, pm, R2), 0);
            cr_assert_eq(memcmp(R, R2, dd * sizeof *R), 0, "not deterministic");
            double oe = oscar_ref_orthogonality_error(d, R, INFINITY);
            cr_assert_lt(oe, 1e-5, "seed %llu d %d perm %d: max |R R^T - I| = %g", (unsigned long long)seed, d, pm,
                         oe);
            int pos[256];
            oscar_ref_rotation_positions(d, pm, pos);
            /* R[i][j] = sum_r U[i][r] H[pos[r]][j], spot-checked on a few rows. */
            double worst = 0;
            for (int i = 0; i < d; i += d / 8)
                for (int j = 0; j < d; j++) {
                    double s = 0;
                    for (int rr = 0; rr < d; rr++) s += U[i * d + rr] * H[(size_t)pos[rr] * d + j];
                    worst = fmax(worst, fabs(s - R[(size_t)i * d + j]));
                }
            cr_assert_lt(worst, 1e-5, "seed %llu d %d perm %d: R != U.H.P (%g)", (unsigned long long)seed, d, pm,
                         worst);
            double diff = 0;
            for (size_t i = 0; i < dd; i++) diff = fmax(diff, fabs((double)R[i] - R0[i]));
            int br[256], same = 1;
            oscar_ref_rotation_positions(d, OSCAR_REF_PERM_BITREV, br);
            for (int rr = 0; rr < d; rr++) same &= br[rr] == pos[rr];
            /* d 208 = 104 x 2: over one Walsh bit the m-sequence order is the bit-reversal */
            if (!same) cr_assert_gt(diff, 1e-3, "d %d perm %d gives the bit-reversal rotation", d, pm);
            else cr_assert(d == 208 && pm == OSCAR_REF_PERM_SPREAD, "d %d perm %d: bit-reversal positions", d, pm);
        }
        free(U);
        free(R);
        free(R0);
        free(R2);
        free(H);
    }
}

Test(permutation, calib_option_default_and_validation) {
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, 2, 1, 64);
    cr_assert_eq(o.permutation, 2); /* m-sequence default (docs/eval/permutation.md) */
    oscar_calib *c = NULL;
    o.permutation = 3;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_null(c);
    o.permutation = -1;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    o.permutation = 2;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(c);
}

/* Through the calibration core: the stored R undoes to eigenvectors of the
 * target with the chosen placement, and differs from the default's R. */
Test(permutation, calibration_uses_the_placement) {
    uint64_t seed = rc_fresh_seed();
    rc_rng rg;
    rc_rng_seed(&rg, seed);
    const int d = 64, hq = 2, hkv = 1, n = 512;
    float *q = malloc(sizeof(float) * (size_t)n * hq * d), *k = malloc(sizeof(float) * (size_t)n * hkv * d);
    float *v = malloc(sizeof(float) * (size_t)n * hkv * d);
    /* Anisotropic data so that the eigenvalues are distinct. */
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < hq * d; i++) q[(size_t)t * hq * d + i] = (float)(rc_normal(&rg) * (1.0 + 4.0 / (1 + i % d)));
        for (int i = 0; i < hkv * d; i++) {
            k[(size_t)t * hkv * d + i] = (float)(rc_normal(&rg) * (1.0 + 3.0 / (1 + i % d)));
            v[(size_t)t * hkv * d + i] = (float)(rc_normal(&rg) * (1.0 + 2.0 / (1 + i % d)));
        }
    }
    const float *Rs[3];
    oscar_params *ps[3];
    oscar_calib *cs[3];
    float *H = malloc(sizeof(float) * (size_t)d * d);
    double *C = malloc(sizeof(double) * (size_t)d * d);
    oscar_ref_hadamard(d, H);
    for (int pm = 0; pm <= 2; pm++) {
        oscar_calib_options o;
        oscar_calib_options_default(&o, 1, hq, hkv, d);
        o.permutation = pm;
        o.clip_k = 0.96f; /* fixed clips: this test is about the rotation */
        o.clip_v = 0.92f;
        cr_assert_eq(oscar_calib_create(&o, &cs[pm]), OSCAR_OK, "%s", oscar_last_error());
        for (int pass = 0; pass < 2; pass++) {
            cr_assert_eq(oscar_calib_begin_pass(cs[pm], pass), OSCAR_OK);
            cr_assert_eq(oscar_calib_feed(cs[pm], 0, n, q, k, v, OSCAR_DTYPE_F32), OSCAR_OK, "%s",
                         oscar_last_error());
        }
        cr_assert_eq(oscar_calib_finalize(cs[pm], &ps[pm]), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(oscar_params_rotation(ps[pm], 0, 0, OSCAR_K, &Rs[pm]), OSCAR_OK);
        const double *lam;
        cr_assert_eq(oscar_params_eigenvalues(ps[pm], 0, 0, OSCAR_K, &lam), OSCAR_OK);
        cr_assert_eq(oscar_calib_target(cs[pm], 0, 0, OSCAR_K, C), OSCAR_OK);
        int pos[64];
        oscar_ref_rotation_positions(d, pm, pos);
        /* U[:, r] = R H[pos[r]]^T must be an eigenvector of C with eigenvalue lam[r]. */
        for (int rr = 0; rr < d; rr++) {
            double u[64], res = 0;
            for (int i = 0; i < d; i++) {
                double s = 0;
                for (int j = 0; j < d; j++) s += (double)Rs[pm][i * d + j] * H[pos[rr] * d + j];
                u[i] = s;
            }
            for (int i = 0; i < d; i++) {
                double cu = 0;
                for (int j = 0; j < d; j++) cu += C[i * d + j] * u[j];
                res = fmax(res, fabs(cu - lam[rr] * u[i]));
            }
            cr_assert_lt(res, 1e-4 * lam[0], "seed %llu perm %d: direction %d is not an eigenvector (res %g)",
                         (unsigned long long)seed, pm, rr, res);
        }
    }
    for (int pm = 1; pm <= 2; pm++) {
        double diff = 0;
        for (int i = 0; i < d * d; i++) diff = fmax(diff, fabs((double)Rs[pm][i] - Rs[0][i]));
        cr_assert_gt(diff, 1e-3, "permutation %d stored the bit-reversal rotation", pm);
    }
    for (int pm = 0; pm <= 2; pm++) {
        oscar_params_destroy(ps[pm]);
        oscar_calib_destroy(cs[pm]);
    }
    free(q);
    free(k);
    free(v);
    free(H);
    free(C);
}

/* The other head dims: every placement is a permutation with rank 0 on the constant row; BITREV and
 * SPREAD put rank t m + a on row a 2^k + p(t), p their placement over the k bits of S (the rotations
 * themselves: composed_rotation_orthogonal_and_exact). */
Test(permutation, head_dims_not_powers_of_two) {
    for (size_t di = 0; di < sizeof k_other_dims / sizeof k_other_dims[0]; di++) {
        const int d = k_other_dims[di];
        int syl = 0;
        const int m = oscar_ref_hadamard_order(d, &syl);
        cr_assert(m > 2 && m * syl == d, "d %d: %d x %d", d, m, syl);
        int k = 0;
        while ((1 << k) < syl) k++;
        for (int pm = 0; pm <= 2; pm++) {
            int a[256], seen[256] = {0};
            cr_assert_eq(oscar_ref_rotation_positions(d, pm, a), 0, "d %d permutation %d", d, pm);
            for (int rr = 0; rr < d; rr++) {
                cr_assert(a[rr] >= 0 && a[rr] < d && !seen[a[rr]], "d %d permutation %d: not a permutation", d, pm);
                seen[a[rr]] = 1;
            }
            cr_assert_eq(a[0], 0, "rank 0 keeps the constant row");
            if (pm == OSCAR_REF_PERM_RANDOM) continue;
            int p[256];
            for (int t = 0; t < syl; t++) p[t] = a[t * m] % syl; /* rank t m: row p(t) of S, core row 0 */
            for (int rr = 0; rr < d; rr++)
                cr_assert_eq(a[rr], (rr % m) * syl + p[rr / m], "d %d permutation %d rank %d", d, pm, rr);
            if (pm == OSCAR_REF_PERM_BITREV)
                for (int t = 0; t < syl; t++) cr_assert_eq(p[t], oscar_ref_bitrev(t, k), "d %d: bit-reversal", d);
        }
    }
}
