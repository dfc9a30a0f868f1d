/* Reference codec of FORMAT.md §1-§2: rotations, clipping, 2-bit row
 * quantization and the int-b baselines. Float32 math, sequential sums, no
 * threads: the definition every backend is checked against. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oscar_ref.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* x86's baseline ISA has no FMA: the fused loops get an AVX2+FMA copy, chosen at run time (the same bits:
 * fmaf is exact by definition, so every copy agrees with every other and with the GPU's FFMA). */
#define HAVE_X86_FMA 1
static int cpu_has_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

/* ------------------------------------------------------- fused terms */
static void fused_axpy_base(int n, float a, const float *x, float *y) {
    for (int i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
#ifdef HAVE_X86_FMA
__attribute__((target("avx2,fma"))) static void fused_axpy_fma(int n, float a, const float *x, float *y) {
    const __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(x[i]), _mm_set_ss(y[i])));
}
#endif
/* sum_i x[i] y[i], i ascending, each term fused (a sequential chain either way) */
static float fused_dot_base(int n, const float *x, const float *y) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s = fmaf(x[i], y[i], s);
    return s;
}
#ifdef HAVE_X86_FMA
__attribute__((target("avx2,fma"))) static float fused_dot_fma(int n, const float *x, const float *y) {
    __m128 s = _mm_setzero_ps();
    for (int i = 0; i < n; i++) s = _mm_fmadd_ss(_mm_set_ss(x[i]), _mm_set_ss(y[i]), s);
    return _mm_cvtss_f32(s);
}
#endif
static float fused_dot(int n, const float *x, const float *y) {
#ifdef HAVE_X86_FMA
    if (cpu_has_fma()) return fused_dot_fma(n, x, y);
#endif
    return fused_dot_base(n, x, y);
}
void oscar_ref_fused_axpy(int n, float a, const float *x, float *y) {
#ifdef HAVE_X86_FMA
    if (cpu_has_fma()) {
        fused_axpy_fma(n, a, x, y);
        return;
    }
#endif
    fused_axpy_base(n, a, x, y);
}

/* ----------------------------------------------------------- rotations */
/* The spreading matrix H of R = U . H . P (FORMAT.md §1): H = A (x) S / sqrt(d), S the Sylvester
 * (Walsh) matrix of order 2^k, S[s][u] = (-1)^popcount(s & u), A a Hadamard core of order m = d / 2^k
 * with its first row all +1; m is the smallest order with a construction below (1 for a power of two,
 * where H is the plain Walsh-Hadamard matrix). Row a 2^k + s, column b 2^k + u:
 * H = A[a][b] S[s][u] / sqrt(d). Every entry is +-1/sqrt(d): each row spreads its energy evenly over
 * all d columns, so over every quant group. */
#define CORE_MAX 128 /* largest core order used: 104 (d 208); 12, 20, 28, 36, 44, 60 for the others */

static int is_prime(int q) {
    if (q < 2) return 0;
    for (int f = 2; f * f <= q; f++)
        if (q % f == 0) return 0;
    return 1;
}

/* Quadratic character of x modulo the odd prime q: 0, +1 (a non-zero square) or -1. */
static int qchar(int x, int q) {
    x %= q;
    if (x < 0) x += q;
    if (x == 0) return 0;
    for (int y = 1; y <= q / 2; y++)
        if (y * y % q == x) return 1;
    return -1;
}

/* A (m x m, +-1, row-major) Hadamard matrix of order m whose first row is all +1: m 1 or 2
 * (Sylvester), Paley I (m = q + 1, q prime = 3 mod 4: A = I + [[0, 1^T], [-1, Q]]) or Paley II
 * (m = 2 (q + 1), q prime = 1 mod 4: A = C (x) [[1, 1], [1, -1]] + I (x) [[1, -1], [-1, -1]],
 * C = [[0, 1^T], [1, Q]]), Q[i][j] = chi(j - i) the Jacobsthal matrix; columns then negated where
 * the first row is -1 (still Hadamard). Returns 0, or -1 when m has none of these. */
static int hadamard_core(int m, signed char *A) {
    if (m < 1 || m > CORE_MAX) return -1;
    if (m <= 2) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) A[i * m + j] = (signed char)(i & j ? -1 : 1);
        return 0;
    }
    int q = m - 1;
    if (q % 4 == 3 && is_prime(q)) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) {
                int c = i == 0 ? (j != 0) : (j == 0 ? -1 : qchar(j - i, q));
                A[i * m + j] = (signed char)(c + (i == j));
            }
    } else if (m % 2 == 0 && (q = m / 2 - 1) % 4 == 1 && is_prime(q)) {
        const int n = q + 1;
        for (int a = 0; a < n; a++)
            for (int b = 0; b < n; b++) {
                int c = a == 0 ? (b != 0) : (b == 0 ? 1 : qchar(b - a, q));
                for (int x = 0; x < 2; x++)
                    for (int y = 0; y < 2; y++)
                        A[(2 * a + x) * m + 2 * b + y] =
                            (signed char)(c != 0 ? (x & y ? -c : c) : (x | y ? -1 : 1));
            }
    } else {
        return -1;
    }
    for (int j = 0; j < m; j++)
        if (A[j] < 0)
            for (int i = 0; i < m; i++) A[i * m + j] = (signed char)-A[i * m + j];
    return 0;
}

/* d = m 2^k as above: fills A (m x m) and returns k, or -1 (no construction, d outside 1..256). */
static int spread_factor(int d, signed char *A, int *m) {
    if (d < 1 || d > 256) return -1;
    int k = 0;
    while (d % (2 << k) == 0) k++;
    for (; k >= 0; k--)
        if (hadamard_core(d >> k, A) == 0) {
            *m = d >> k;
            return k;
        }
    return -1;
}

int oscar_ref_hadamard_order(int d, int *sylvester) {
    signed char A[CORE_MAX * CORE_MAX];
    int m = 0, k = spread_factor(d, A, &m);
    if (k < 0) return 0;
    if (sylvester) *sylvester = 1 << k;
    return m;
}

int oscar_ref_hadamard(int d, float *H) {
    signed char A[CORE_MAX * CORE_MAX];
    int m = 0, k = spread_factor(d, A, &m);
    if (k < 0) return -1;
    float s = 1.0f / sqrtf((float)d);
    const int mask = (1 << k) - 1;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            int neg = (__builtin_popcount((unsigned)(i & j & mask)) & 1) ^ (A[(i >> k) * m + (j >> k)] < 0);
            H[(size_t)i * d + j] = neg ? -s : s;
        }
    return 0;
}

int oscar_ref_bitrev(int x, int bits) {
    int r = 0;
    for (int b = 0; b < bits; b++) r |= ((x >> b) & 1) << (bits - 1 - b);
    return r;
}

/* In-place unnormalised fast Walsh-Hadamard transform of a length-d vector:
 * v <- v Hu with Hu[i][j] = (-1)^popcount(i&j) (Hu is symmetric). */
static void fwht_f64(int d, double *v) {
    for (int len = 1; len < d; len <<= 1)
        for (int i = 0; i < d; i += len << 1)
            for (int j = i; j < i + len; j++) {
                double a = v[j], b = v[j + len];
                v[j] = a + b;
                v[j + len] = a - b;
            }
}

/* Row i of R: out = v H (unnormalised, then times 1/sqrt(d)) in fp64, rounded once to fp32. With
 * m = 1 this is the fast transform alone (the published rotation, bit for bit as before); otherwise
 * v, read as m rows of 2^k, is transformed row by row, then mixed by A: out[b 2^k + u] =
 * sum_a A[a][b] (v_a S)[u]. */
static void spread_row(int d, int m, int k, const signed char *A, double *v, float *out) {
    const double s = 1.0 / sqrt((double)d);
    const int n = 1 << k;
    for (int a = 0; a < m; a++) fwht_f64(n, v + a * n);
    if (m == 1) {
        for (int j = 0; j < d; j++) out[j] = (float)(v[j] * s);
        return;
    }
    for (int b = 0; b < m; b++)
        for (int u = 0; u < n; u++) {
            double acc = 0.0;
            for (int a = 0; a < m; a++) acc += A[a * m + b] * v[a * n + u];
            out[b * n + u] = (float)(acc * s);
        }
}

/* R = U . Pm . H where Pm is the d x d permutation matrix with
 * Pm[r][pos(r)] = 1: the coordinate of eigen-direction r (x U)[r] is moved
 * to position pos(r) before H mixes positions (pos = bitrev for a power of two,
 * an involution). Hence
 *     (U Pm)[i][k] = U[i][inv(k)]
 *     R[i][j]      = sum_k U[i][inv(k)] * H[k][j]
 *                  = sum_r U[i][r] * H[pos(r)][j].
 * Row i of R is the H transform of row i of U Pm, computed in fp64 and
 * rounded once to fp32. R is orthogonal because U, Pm and H are. */
void oscar_ref_compose_rotation(int d, const double *U, float *R) {
    (void)oscar_ref_compose_rotation_perm(d, U, OSCAR_REF_PERM_BITREV, R);
}

/* Alternative placements of the eigen-directions (docs/eval/permutation.md).
 * pos[r] is the row of H (a Walsh function for a power of two) that eigen-direction r goes to;
 * rank 0 (the largest) always keeps row 0, the constant row, as under
 * bit-reversal, so the variants differ only in where ranks 1..d-1 go. With d = m 2^k, m > 1
 * (H = A (x) S), BITREV and SPREAD place rank r = t m + a at row a 2^k + p(t), p the placement
 * over the k bits of the Sylvester factor: consecutive ranks go to the m core rows first. */

/* Primitive polynomials over GF(2) of degree 1..8 (bit b = coefficient of x^b):
 * the powers of x then run through every non-zero element. */
static const unsigned prim_poly[9] = {0, 0x3, 0x7, 0xB, 0x13, 0x25, 0x43, 0x83, 0x11D};

/* Placement over k bits (n = 2^k rows): bit-reversal, or the m-sequence order x^(t-1) in GF(2^k). */
static void place_pow2(int k, int permutation, int *p) {
    const int n = 1 << k;
    if (permutation == OSCAR_REF_PERM_BITREV) {
        for (int t = 0; t < n; t++) p[t] = oscar_ref_bitrev(t, k);
        return;
    }
    /* SPREAD: pos[r] = x^(r-1) in GF(2^bits) for r >= 1 (an m-sequence order). The
     * first `bits` of them are the unit vectors (Rademacher functions), so
     * any top-k set with 2 < k <= d/2 spans more than log2(k) dimensions and
     * is not XOR-closed, unlike bit-reversal, whose top 2^m positions are the
     * multiples of d/2^m (Walsh functions constant over blocks of d/2^m). */
    p[0] = 0;
    unsigned a = 1;
    for (int t = 1; t < n; t++) {
        p[t] = (int)a;
        a <<= 1;
        if (a & (unsigned)n) a ^= prim_poly[k];
    }
}

int oscar_ref_rotation_positions(int d, int permutation, int *pos) {
    signed char A[CORE_MAX * CORE_MAX];
    int m = 0, k = spread_factor(d, A, &m);
    if (k < 0) return -1;
    switch (permutation) {
    case OSCAR_REF_PERM_BITREV:
    case OSCAR_REF_PERM_SPREAD: {
        int p[256] = {0};
        place_pow2(k, permutation, p);
        for (int r = 0; r < d; r++) pos[r] = (r % m) * (1 << k) + p[r / m];
        return 0;
    }
    case OSCAR_REF_PERM_RANDOM: {
        /* Fisher-Yates over ranks 1..d-1 with a fixed-seed 64-bit LCG (Knuth's
         * MMIX constants), high bits used: the same permutation on every run. */
        uint64_t st = 0x0123456789ABCDEFull;
        for (int r = 0; r < d; r++) pos[r] = r;
        for (int i = d - 1; i >= 2; i--) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            int j = 1 + (int)((st >> 33) % (uint64_t)i); /* in [1, i] */
            int t = pos[i];
            pos[i] = pos[j];
            pos[j] = t;
        }
        return 0;
    }
    default:
        return -1;
    }
}

/* R[i][j] = sum_r U[i][r] * H[pos[r]][j] (see oscar_ref_compose_rotation). */
int oscar_ref_compose_rotation_perm(int d, const double *U, int permutation, float *R) {
    signed char A[CORE_MAX * CORE_MAX];
    int pos[256], inv[256], m = 0, k = spread_factor(d, A, &m);
    if (k < 0 || oscar_ref_rotation_positions(d, permutation, pos) != 0) return -1;
    for (int r = 0; r < d; r++) inv[pos[r]] = r;
    double v[256];
    for (int i = 0; i < d; i++) {
        for (int c = 0; c < d; c++) v[c] = U[(size_t)i * d + inv[c]];
        spread_row(d, m, k, A, v, R + (size_t)i * d);
    }
    return 0;
}

void oscar_ref_rotate(int d, const float *restrict x, const float *restrict R, float *restrict out) {
    if (!R) {
        memcpy(out, x, (size_t)d * sizeof *out);
        return;
    }
    for (int j = 0; j < d; j++) out[j] = 0.0f;
    /* out[j] = sum_i x[i] R[i][j], accumulated in i order for every j, each
     * term fused: out[j] = fmaf(x[i], R[i][j], out[j]) (FORMAT.md §1). */
    for (int i = 0; i < d; i++) oscar_ref_fused_axpy(d, x[i], R + (size_t)i * d, out);
}

void oscar_ref_unrotate(int d, const float *y, const float *R, float *out) {
    if (!R) {
        memcpy(out, y, (size_t)d * sizeof *out);
        return;
    }
    /* out[i] = sum_j y[j] R[i][j], j ascending, each term fused as oscar_ref_rotate's (so
     * oscar_ref_rotate(y, R^T) gives the same bits) */
    for (int i = 0; i < d; i++) out[i] = fused_dot(d, y, R + (size_t)i * d);
}

/* ----------------------------------------------------------- clipping */
/* k-th smallest of v[0..n-1] (v is reordered). Iterative quickselect with a
 * median-of-three pivot; the value returned does not depend on the method. */
static float select_kth(float *v, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        float a = v[lo], b = v[mid], c = v[hi];
        float pivot = (a < b) ? ((b < c) ? b : (a < c ? c : a)) : ((a < c) ? a : (b < c ? c : b));
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot) i++;
            while (v[j] > pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

float oscar_ref_clip_tau(int d, const float *x, float c) {
    float s[256] = {0}; /* d <= 256; zeroed so no compiler sees an uninitialized tail */
    float mx = 0.0f;
    for (int j = 0; j < d; j++) {
        s[j] = fabsf(x[j]);
        if (s[j] > mx) mx = s[j];
    }
    if (!(c < 1.0f)) return mx;
    float pos = c * (float)(d - 1);
    int i = (int)floorf(pos);
    if (i < 0) i = 0;
    if (i > d - 1) i = d - 1;
    float f = pos - (float)i;
    float si = select_kth(s, d, i);
    /* After selection every element right of i is >= s[i]: the next order
     * statistic is their minimum. */
    float sn = si;
    if (i + 1 < d) {
        sn = s[i + 1];
        for (int j = i + 2; j < d; j++)
            if (s[j] < sn) sn = s[j];
    }
    return si + f * (sn - si);
}

void oscar_ref_clip_taus(int d, const float *x, int n, const float *c, float *tau) {
    float s[256] = {0};
    float mx = 0.0f;
    for (int j = 0; j < d; j++) {
        s[j] = fabsf(x[j]);
        if (s[j] > mx) mx = s[j];
    }
    /* One selection at the lowest order statistic any ratio needs, then the
     * elements right of it (all >= it) sorted: s[i] is then the i-th smallest
     * for every i from there on, the value oscar_ref_clip_tau selects. */
    int lo = d;
    for (int r = 0; r < n; r++) {
        if (!(c[r] < 1.0f)) continue;
        int i = (int)floorf(c[r] * (float)(d - 1));
        if (i < 0) i = 0;
        if (i > d - 1) i = d - 1;
        if (i < lo) lo = i;
    }
    if (lo < d) {
        select_kth(s, d, lo);
        for (int a = lo + 2; a < d; a++) { /* insertion sort of s[lo + 1 ..] */
            float t = s[a];
            int b = a - 1;
            while (b > lo && s[b] > t) {
                s[b + 1] = s[b];
                b--;
            }
            s[b + 1] = t;
        }
    }
    for (int r = 0; r < n; r++) {
        if (!(c[r] < 1.0f)) {
            tau[r] = mx;
            continue;
        }
        float pos = c[r] * (float)(d - 1);
        int i = (int)floorf(pos);
        if (i < 0) i = 0;
        if (i > d - 1) i = d - 1;
        float f = pos - (float)i;
        float si = s[i], sn = i + 1 < d ? s[i + 1] : si;
        tau[r] = si + f * (sn - si);
    }
}

int oscar_ref_row_storable(int d, const float *x, const float *R, oscar_dtype kv_dtype, int meta16, float *y) {
    const int f16 = kv_dtype == OSCAR_DTYPE_F16 || meta16;
    double n2 = 0.0;
    for (int j = 0; j < d; j++) n2 += (double)x[j] * (double)x[j];
    if (sqrt(n2) * 1.01 < (f16 ? 65504.0 : 3.3895313892515355e38)) return 1; /* R is orthogonal to 1e-3 */
    if (R)
        oscar_ref_rotate(d, x, R, y);
    else
        memcpy(y, x, (size_t)d * sizeof *y);
    for (int j = 0; j < d; j++) {
        float r = oscar_round_to(kv_dtype, y[j]);
        if (!isfinite(r) || (f16 && !isfinite(oscar_round_to(OSCAR_DTYPE_F16, r)))) return 0;
    }
    return 1;
}

/* ----------------------------------------------------------- one row */
/* Rounds a metadata value to meta_dtype. F16 overflow saturates to +-65504 so
 * metadata stays finite on extreme rows (the reconstruction is then clamped,
 * but never Inf/NaN). */
static float meta_round(oscar_dtype meta, float v) {
    float r = oscar_round_to(meta, v);
    if (isinf(r)) r = copysignf(65504.0f, v);
    return r;
}

static const float k_lm_levels[4] = {-OSCAR_LM_L0, -OSCAR_LM_L1, OSCAR_LM_L1, OSCAR_LM_L0};

/* Code of value t = (x - b) / a on the level grid of 2^bits uniform levels
 * (or the 4 Lloyd-Max levels). NaN (only from absurd rows under error
 * feedback) maps to a valid code instead of a cast of NaN. */
static int level_code(int lloyd_max, int top, float t) {
    if (!lloyd_max) {
        float r = floorf(t + 0.5f);
        return !(r >= 0.0f) ? 0 : (r > (float)top ? top : (int)r);
    }
    return t < -OSCAR_LM_T ? 0 : (t < 0.0f ? 1 : (t < OSCAR_LM_T ? 2 : 3));
}

/* Per-group metadata (a, b) of the clipped row v, rounded to meta_dtype. */
static void row_meta(int d, int group, int top, int lloyd_max, oscar_dtype meta_dtype, const float *v, float *meta) {
    for (int g = 0; g < d / group; g++) {
        const float *gv = v + (size_t)g * group;
        float a, b;
        if (!lloyd_max) {
            float mn = gv[0], mx = gv[0];
            for (int j = 1; j < group; j++) {
                mn = gv[j] < mn ? gv[j] : mn;
                mx = gv[j] > mx ? gv[j] : mx;
            }
            /* A zero extreme is +0 (FORMAT.md §2.2): which of -0 and +0 a min/max returns differs between
             * this loop and the kernels' fminf/fmaxf, and the sign reached the stored bias's bits. */
            mn += 0.0f;
            mx += 0.0f;
            a = (mx - mn) / (float)top;
            b = mn;
        } else {
            float sum = 0.0f;
            for (int j = 0; j < group; j++) sum += gv[j];
            float mean = sum / (float)group;
            float ss = 0.0f;
            for (int j = 0; j < group; j++) {
                float e = gv[j] - mean;
                ss += e * e;
            }
            a = sqrtf(ss / (float)group);
            b = mean;
        }
        meta[2 * g] = meta_round(meta_dtype, a);
        meta[2 * g + 1] = meta_round(meta_dtype, b);
    }
}

/* The row clipped to +-tau (tau INFINITY: unclipped). */
static void clip_row(int d, const float *x, float tau, float *v) {
    for (int j = 0; j < d; j++) v[j] = x[j] < -tau ? -tau : (x[j] > tau ? tau : x[j]);
}

/* oscar_ref_quantize_row_wide with the clip threshold given (INFINITY: no clip). */
static void quantize_row_tau(int d, int group, int bits, int lloyd_max, float tau, oscar_dtype meta_dtype,
                             const float *x, const float *fb, uint8_t *codes, uint8_t *hi, float *meta) {
    const int top = (1 << bits) - 1; /* 3 (2-bit) or 7 (3-bit) */
    float v[256] = {0}; /* d <= 256; zeroed so no compiler sees an uninitialized tail */
    clip_row(d, x, tau, v);
    memset(codes, 0, (size_t)d / 4);
    if (bits == 3) memset(hi, 0, (size_t)d / 8);
    /* Metadata from the clipped row, before any feedback. */
    row_meta(d, group, top, lloyd_max, meta_dtype, v, meta);
    /* Values in order; with feedback, value j's rounding error e is carried
     * into the later values (v[k] = fmaf(-e, fb[j][k], v[k])) so the row's error is small
     * in the attention metric, not per value (FORMAT.md §2.3). */
    /* Feedback starts from the unclipped row: a clipped value's whole error
     * (clipping included) is carried on; nearest codes are the same either way
     * (a clipped value codes to the end level). */
    if (fb) memcpy(v, x, (size_t)d * sizeof(float));
    for (int j = 0; j < d; j++) {
        int g = j / group;
        float a = meta[2 * g], b = meta[2 * g + 1];
        int code = a == 0.0f ? (lloyd_max ? 2 : 0) : level_code(lloyd_max, top, (v[j] - b) / a);
        codes[j >> 2] |= (uint8_t)((code & 3) << (2 * (j & 3)));
        if (bits == 3) hi[j >> 3] |= (uint8_t)((code >> 2) << (j & 7));
        if (!fb) continue;
        float e = v[j] - (b + a * (lloyd_max ? k_lm_levels[code] : (float)code));
        if (e == 0.0f) continue;
        /* From the multiple of 4 at or below j + 1 (aligned vectors): F is 0 on and below the diagonal
         * (the loader refuses anything else) and the values up to j are coded already, so the extra ones
         * change nothing that is read; d is a multiple of 4. */
        const int k0 = (j + 1) & ~3;
        oscar_ref_fused_axpy(d - k0, -e, fb + (size_t)j * (size_t)d + k0, v + k0);
    }
}

void oscar_ref_quantize_row_wide(int d, int group, int bits, int lloyd_max, float c, oscar_dtype meta_dtype,
                                 const float *x, const float *fb, uint8_t *codes, uint8_t *hi, float *meta) {
    float tau = (c < 1.0f) ? oscar_ref_clip_tau(d, x, c) : INFINITY;
    quantize_row_tau(d, group, bits, lloyd_max, tau, meta_dtype, x, fb, codes, hi, meta);
}

/* ----------------------------------------------------------- many rows */
/* Error feedback is a chain per row: value j's code needs every earlier
 * value's error, so one row runs at the latency of that chain (a division,
 * a rounding and the update of value j + 1, per value). Rows are
 * independent, so oscar_ref_quantize_rows_wide codes ROWS_LANES rows side by
 * side, one lane each: every lane performs exactly the operations
 * quantize_row_tau performs on its row, in the same order (the feedback
 * update fused as there, nothing else contracted: the library is compiled as
 * ISO C, -ffp-contract=off), so the codes and
 * metadata are those of the row-at-a-time definition bit for bit, while the
 * lanes' chains overlap and the updates run as vectors over rows. Two
 * differences change nothing that is output: the code is computed by counting
 * the levels at or below t + 1/2 (uniform; = level_code's clamped floor, NaN
 * -> 0) or the thresholds above t (Lloyd-Max, NaN -> 3), and an error of zero
 * is carried on like any other (it adds a signed zero: no code changes). */
#define ROWS_LANES 8

#if defined(__GNUC__)
/* Eight rows side by side as GNU vectors: element-wise IEEE operations, the
 * same ones the scalar code performs (vector and scalar operands mix, the
 * scalar taking every lane; comparisons give -1 / 0 per lane). */
typedef float lanes_f __attribute__((vector_size(4 * ROWS_LANES)));
typedef int32_t lanes_i __attribute__((vector_size(4 * ROWS_LANES)));

/* The body of quantize_lanes, compiled twice below (baseline and AVX2+FMA: the
 * same operations, AVX2 only runs eight lanes per instruction). LANES_FNMA(v,
 * e, f): v = fmaf(-e, f, v) per lane, the one fused operation (FORMAT.md §2.3);
 * nothing else is contracted (-ffp-contract=off). */
#define QUANTIZE_LANES_BODY                                                                                      \
    const int top = (1 << bits) - 1, ng = d / group;                                                             \
    const size_t cb = (size_t)d / 4, hb = (size_t)d / 8, mb = 2 * (size_t)ng;                                     \
    lanes_f V[256]; /* value j of every lane */                                                                  \
    lanes_f lev[8]; /* b + a * level(c) of the current group, per lane */                                        \
    for (int l = 0; l < ROWS_LANES; l++) {                                                                       \
        float v[256] = {0};                                                                                      \
        const float *xl = x + (size_t)l * (size_t)d;                                                             \
        clip_row(d, xl, tau[l], v);                                                                              \
        row_meta(d, group, top, lloyd_max, meta_dtype, v, meta + (size_t)l * mb);                                \
        for (int j = 0; j < d; j++) V[j][l] = xl[j]; /* feedback starts from the unclipped row */                \
        memset(codes + (size_t)l * cb, 0, cb);                                                                   \
        if (bits == 3) memset(hi + (size_t)l * hb, 0, hb);                                                       \
    }                                                                                                            \
    for (int g = 0; g < ng; g++) {                                                                               \
        lanes_f A, B;                                                                                            \
        for (int l = 0; l < ROWS_LANES; l++) {                                                                   \
            A[l] = meta[(size_t)l * mb + 2 * (size_t)g];                                                         \
            B[l] = meta[(size_t)l * mb + 2 * (size_t)g + 1];                                                     \
        }                                                                                                        \
        for (int c = 0; c <= top; c++) lev[c] = B + A * (lloyd_max ? k_lm_levels[c] : (float)c);                 \
        const lanes_i zero = A == 0.0f; /* the code is fixed there; divide by 1 instead of 0 */                 \
        const lanes_f one = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};                                    \
        A = (lanes_f)(((lanes_i)A & ~zero) | ((lanes_i)one & zero));                                             \
        for (int j = g * group; j < (g + 1) * group; j++) {                                                      \
            const lanes_f t = (V[j] - B) / A;                                                                    \
            lanes_i code;                                                                                        \
            if (!lloyd_max) {                                                                                    \
                const lanes_f u = t + 0.5f;                                                                      \
                code = (lanes_i){0};                                                                             \
                for (int c = 1; c <= top; c++) code -= u >= (float)c;                                           \
                code &= ~zero;                                                                                   \
            } else {                                                                                             \
                code = 3 + (t < -OSCAR_LM_T) + (t < 0.0f) + (t < OSCAR_LM_T);                                    \
                code = (code & ~zero) | (2 & zero);                                                              \
            }                                                                                                    \
            lanes_i lv = (lanes_i)lev[0];                                                                        \
            for (int c = 1; c <= top; c++) {                                                                     \
                const lanes_i m = code >= c;                                                                     \
                lv = (lv & ~m) | ((lanes_i)lev[c] & m);                                                          \
            }                                                                                                    \
            const lanes_f E = V[j] - (lanes_f)lv;                                                                \
            for (int l = 0; l < ROWS_LANES; l++) {                                                               \
                codes[(size_t)l * cb + (size_t)(j >> 2)] |= (uint8_t)((code[l] & 3) << (2 * (j & 3)));           \
                if (bits == 3) hi[(size_t)l * hb + (size_t)(j >> 3)] |= (uint8_t)((code[l] >> 2) << (j & 7));   \
            }                                                                                                    \
            const float *row = fb + (size_t)j * (size_t)d;                                                       \
            for (int k = j + 1; k < d; k++) LANES_FNMA(V[k], E, row[k]);                                         \
        }                                                                                                        \
    }

#define LANES_FNMA(v, e, f)                                                                                      \
    for (int l_ = 0; l_ < ROWS_LANES; l_++) (v)[l_] = fmaf(-(e)[l_], (f), (v)[l_])
static void quantize_lanes_base(int d, int group, int bits, int lloyd_max, const float *tau, oscar_dtype meta_dtype,
                                const float *x, const float *fb, uint8_t *codes, uint8_t *hi, float *meta) {
    QUANTIZE_LANES_BODY
}
#undef LANES_FNMA
#ifdef HAVE_X86_FMA
#define HAVE_LANES_AVX2 1
/* -(e f) + v rounded once (vfnmadd) = fmaf(-e, f, v) */
#define LANES_FNMA(v, e, f) (v) = (lanes_f)_mm256_fnmadd_ps((__m256)(e), _mm256_set1_ps(f), (__m256)(v))
__attribute__((target("avx2,fma"))) static void quantize_lanes_avx2(int d, int group, int bits, int lloyd_max,
                                                                const float *tau, oscar_dtype meta_dtype,
                                                                const float *x, const float *fb, uint8_t *codes,
                                                                uint8_t *hi, float *meta) {
    QUANTIZE_LANES_BODY
}
#undef LANES_FNMA
#endif
#undef QUANTIZE_LANES_BODY

static void quantize_lanes(int d, int group, int bits, int lloyd_max, const float *tau, oscar_dtype meta_dtype,
                           const float *x, const float *fb, uint8_t *codes, uint8_t *hi, float *meta) {
#ifdef HAVE_LANES_AVX2
    if (cpu_has_fma()) {
        quantize_lanes_avx2(d, group, bits, lloyd_max, tau, meta_dtype, x, fb, codes, hi, meta);
        return;
    }
#endif
    quantize_lanes_base(d, group, bits, lloyd_max, tau, meta_dtype, x, fb, codes, hi, meta);
}
#define HAVE_LANES 1
#endif /* __GNUC__ */

void oscar_ref_quantize_rows_wide(int n, int d, int group, int bits, int lloyd_max, float c, const float *tau,
                                  oscar_dtype meta_dtype, const float *x, const float *fb, uint8_t *codes,
                                  uint8_t *hi, float *meta) {
    const size_t cb = (size_t)d / 4, hb = (size_t)d / 8, mb = 2 * (size_t)(d / group);
    float t[ROWS_LANES];
    int i = 0;
#ifdef HAVE_LANES
    for (; fb && i + ROWS_LANES <= n; i += ROWS_LANES) {
        for (int l = 0; l < ROWS_LANES; l++)
            t[l] = tau ? tau[i + l] : c < 1.0f ? oscar_ref_clip_tau(d, x + (size_t)(i + l) * (size_t)d, c) : INFINITY;
        quantize_lanes(d, group, bits, lloyd_max, t, meta_dtype, x + (size_t)i * (size_t)d, fb, codes + (size_t)i * cb,
                       bits == 3 ? hi + (size_t)i * hb : NULL, meta + (size_t)i * mb);
    }
#else
    (void)t;
#endif
    for (; i < n; i++) {
        const float *xi = x + (size_t)i * (size_t)d;
        const float ti = tau ? tau[i] : c < 1.0f ? oscar_ref_clip_tau(d, xi, c) : INFINITY;
        quantize_row_tau(d, group, bits, lloyd_max, ti, meta_dtype, xi, fb, codes + (size_t)i * cb,
                         bits == 3 ? hi + (size_t)i * hb : NULL, meta + (size_t)i * mb);
    }
}

void oscar_ref_quantize_row_fb(int d, int group, int lloyd_max, float c, oscar_dtype meta_dtype, const float *x,
                               const float *fb, uint8_t *codes, float *meta) {
    oscar_ref_quantize_row_wide(d, group, 2, lloyd_max, c, meta_dtype, x, fb, codes, NULL, meta);
}

void oscar_ref_quantize_row(int d, int group, int lloyd_max, float c, oscar_dtype meta_dtype, const float *x,
                            uint8_t *codes, float *meta) {
    oscar_ref_quantize_row_fb(d, group, lloyd_max, c, meta_dtype, x, NULL, codes, meta);
}

void oscar_ref_dequantize_row_wide(int d, int group, int bits, int lloyd_max, const uint8_t *codes,
                                   const uint8_t *hi, const float *meta, float *out) {
    static const float uni[8] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f};
    const float *lev = lloyd_max ? k_lm_levels : uni;
    for (int g = 0; g < d / group; g++) {
        const float a = meta[2 * g], b = meta[2 * g + 1];
        float *o = out + (size_t)g * group;
        const int j0 = g * group;
        if (bits == 3)
            for (int j = 0; j < group; j++) o[j] = b + a * uni[oscar_ref_code3_at(codes, hi, j0 + j)];
        else
            for (int j = 0; j < group; j++) o[j] = b + a * lev[oscar_ref_code_at(codes, j0 + j)];
    }
}

void oscar_ref_dequantize_row(int d, int group, int lloyd_max, const uint8_t *codes, const float *meta,
                              float *out) {
    oscar_ref_dequantize_row_wide(d, group, 2, lloyd_max, codes, NULL, meta, out);
}

void oscar_ref_fakequant_uniform(int d, int group, int bits, float *x) {
    float steps = (float)((1 << bits) - 1);
    for (int g = 0; g < d / group; g++) {
        float *gv = x + (size_t)g * group;
        float mn = gv[0], mx = gv[0];
        for (int j = 1; j < group; j++) {
            mn = fminf(mn, gv[j]);
            mx = fmaxf(mx, gv[j]);
        }
        float a = meta_round(OSCAR_DTYPE_F16, (mx - mn) / steps);
        float b = meta_round(OSCAR_DTYPE_F16, mn);
        for (int j = 0; j < group; j++) {
            float q = 0.0f;
            if (a != 0.0f) {
                q = floorf((gv[j] - b) / a + 0.5f);
                q = q < 0.0f ? 0.0f : (q > steps ? steps : q);
            }
            gv[j] = b + a * q;
        }
    }
}

double oscar_ref_orthogonality_error(int d, const float *R, double stop_above) {
    double worst = 0.0;
    for (int i = 0; i < d; i++)
        for (int j = i; j < d; j++) { /* R R^T is symmetric: upper triangle */
            double s = 0.0;
            for (int k = 0; k < d; k++) s += (double)R[i * d + k] * (double)R[j * d + k];
            double e = fabs(s - (i == j ? 1.0 : 0.0));
            if (e > worst) worst = e;
            if (worst > stop_above) return worst;
        }
    return worst;
}
