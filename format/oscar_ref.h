/* CPU reference: the plain-C definition of every operation in docs/FORMAT.md.
 * Float32 math, deterministic. Every GPU backend is tested against these.
 * Internal (not part of the ABI); tests and the calibration core use it. */
#ifndef OSCAR_CPU_REF_H
#define OSCAR_CPU_REF_H

#include <stddef.h>
#include <stdint.h>

#include "oscar_internal.h"

/* Lloyd-Max levels for a unit Gaussian, 4 levels, and their midpoints. */
#define OSCAR_LM_L0 1.5104f
#define OSCAR_LM_L1 0.4528f
#define OSCAR_LM_T 0.9816f

/* ----------------------------------------------------------- 16-bit floats */
/* IEEE half -> fp32, exact, inline so the decode inner loops avoid a call per
 * element (oscar_f16_to_f32 in f16.c is this function). NaN stays a quiet NaN. */
static inline float oscar_ref_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31) return oscar_bits_to_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    return oscar_bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ----------------------------------------------------------- rotations */
/* Normalised Walsh-Hadamard matrix, d x d row-major, d a power of two:
 * H[i][j] = (-1)^popcount(i&j) / sqrt(d). */
void oscar_ref_hadamard(int d, float *H);
/* Bit-reversal of x over `bits` bits. */
int oscar_ref_bitrev(int x, int bits);
/* R = U . H . P (FORMAT.md §1). U: d x d row-major, column r = eigenvector of
 * rank r (largest eigenvalue first). R: d x d row-major fp32 out. */
void oscar_ref_compose_rotation(int d, const double *U, float *R);
/* Placement P of the eigen-directions in R = U . H . P (docs/eval/permutation.md):
 * BITREV is the published one (oscar_ref_compose_rotation); RANDOM a fixed
 * pseudo-random permutation; SPREAD the m-sequence order x^(r-1) in GF(2^bits),
 * whose top positions are not XOR-closed. Rank 0 keeps row 0 in all three. */
enum { OSCAR_REF_PERM_BITREV = 0, OSCAR_REF_PERM_RANDOM = 1, OSCAR_REF_PERM_SPREAD = 2 };
/* pos[r] = Hadamard row of eigen-direction r (d entries, d a power of two
 * <= 256). Returns 0, or -1 for an unknown permutation or bad d. */
int oscar_ref_rotation_positions(int d, int permutation, int *pos);
/* R = U . H . P with the given placement; BITREV gives exactly
 * oscar_ref_compose_rotation. Returns 0, or -1 as above. */
int oscar_ref_compose_rotation_perm(int d, const double *U, int permutation, float *R);
/* max |R R^T - I| of a d x d row-major fp32 matrix, in fp64; returns as soon
 * as the error exceeds stop_above (pass INFINITY for the exact maximum). */
double oscar_ref_orthogonality_error(int d, const float *R, double stop_above);
/* out = x R (R row-major d x d; NULL means identity). out may not alias x. */
void oscar_ref_rotate(int d, const float *x, const float *R, float *out);
/* out = y R^T (inverse rotation). out may not alias y. */
void oscar_ref_unrotate(int d, const float *y, const float *R, float *out);

/* ----------------------------------------------------------- one row */
/* Clip threshold tau of a row for clip ratio c (FORMAT.md §2.1); c >= 1
 * returns max |x|. */
float oscar_ref_clip_tau(int d, const float *x, float c);
/* Quantizes one rotated, kv_dtype-rounded row: clip with ratio c (>= 1: none),
 * per-group metadata (a, b) rounded to meta_dtype, codes packed four per byte.
 * codes: d/4 bytes; meta: ng*2 floats (already rounded values).
 * Metadata beyond the F16 range saturates to +-65504 instead of becoming Inf
 * (rows that large cannot be represented anyway; the reconstruction stays
 * finite). Rows must be finite. */
void oscar_ref_quantize_row(int d, int group, int lloyd_max, float c, oscar_dtype meta_dtype, const float *x,
                            uint8_t *codes, float *meta);
/* The same with error-feedback rounding (FORMAT.md §2.3): fb is the
 * strictly upper-triangular d x d matrix of the parameters (row j: weights
 * of value j's rounding error on the values after it), NULL = nearest.
 * Metadata is that of oscar_ref_quantize_row; codes may differ. */
void oscar_ref_quantize_row_fb(int d, int group, int lloyd_max, float c, oscar_dtype meta_dtype, const float *x,
                               const float *fb, uint8_t *codes, float *meta);
/* x^ = b + a * level[code] for every value. */
void oscar_ref_dequantize_row(int d, int group, int lloyd_max, const uint8_t *codes, const float *meta,
                              float *out);
/* Code of value j in a packed row. */
static inline int oscar_ref_code_at(const uint8_t *codes, int j) { return (codes[j >> 2] >> (2 * (j & 3))) & 3; }

/* Per-token asymmetric b-bit quantize-dequantize in place (int2/int4/int8
 * baselines, groups of `group` along the row; fp16 metadata): a = (max-min) /
 * (2^b - 1), b = min, both rounded to fp16 first, code = clamp(floor(t + 0.5)).
 * bits = 2 gives exactly oscar_ref_quantize_row's uniform rule with c = 1. */
void oscar_ref_fakequant_uniform(int d, int group, int bits, float *x);

/* ----------------------------------------------------------- paged cache */
/* Byte offset of row (kv_head, row) arrays inside a page, per FORMAT.md §3.3.
 * For the BF16 method (§3.4) k_codes/v_codes are the K and V [H][P][d] 16-bit
 * arrays, codes_row_bytes = d * sizeof(kv_dtype) and there is no metadata. */
typedef struct oscar_ref_page_geom {
    int d, group, ng, H, P;
    size_t codes_row_bytes;   /* d/4 */
    size_t meta_row_bytes;    /* ng * 2 * sizeof(meta) */
    size_t k_codes, v_codes, k_meta, v_meta, page_bytes;
} oscar_ref_page_geom;
void oscar_ref_page_geom_init(const oscar_layout_desc *l, oscar_ref_page_geom *g);

/* The CPU backend: the same vtable plugins export (runtime/oscar_backend.h),
 * operating on host memory, validating every input synchronously. */
const oscar_backend_api *oscar_cpu_backend(void);

#endif /* OSCAR_CPU_REF_H */
