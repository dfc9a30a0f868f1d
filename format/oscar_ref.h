/* The reference codec: the plain-C definition of every operation of
 * docs/FORMAT.md on one row (rotation, clipping, quantization, error
 * feedback, the int-b baselines). Float32 math, deterministic. The CPU
 * backend, the calibration core and the tests use it; every GPU backend is
 * tested against it. Internal (not part of the ABI). Buffers are the
 * caller's: no function here allocates or keeps a pointer. */
#ifndef OSCAR_REF_H
#define OSCAR_REF_H

#include <stddef.h>
#include <stdint.h>

#include "oscar_format.h"

/* ----------------------------------------------------------- rotations */
/* The spreading matrix H of R = U . H . P (FORMAT.md §1), one home for calibration, the built-in
 * QUAROT2 rotation and the tests: d x d row-major, every entry +-1/sqrt(d), orthogonal. A power of
 * two gets the normalised Walsh-Hadamard matrix H[i][j] = (-1)^popcount(i&j) / sqrt(d); another d
 * = m 2^k gets A (x) S / sqrt(d), A a Paley Hadamard matrix of order m (the smallest that exists:
 * 12 for 48, 96, 192; 20 for 80, 160; 28 for 112, 224; 36 for 144; 44 for 176; 104 for 208; 60
 * for 240) with a first row of +1, S the Walsh-Hadamard matrix of order 2^k. Every supported
 * head_dim has one. Returns 0, or -1 (H untouched) for a d without a construction. */
int oscar_ref_hadamard(int d, float *H);
/* The factorisation behind it: returns m (1 for a power of two), *sylvester = 2^k (may be NULL);
 * 0 when d has no construction. */
int oscar_ref_hadamard_order(int d, int *sylvester);
/* Bit-reversal of x over `bits` bits. */
int oscar_ref_bitrev(int x, int bits);
/* R = U . H . P (FORMAT.md §1) with the published placement (BITREV below). U: d x d row-major,
 * column r = eigenvector of rank r (largest eigenvalue first). R: d x d row-major fp32 out. */
void oscar_ref_compose_rotation(int d, const double *U, float *R);
/* Placement P of the eigen-directions in R = U . H . P (docs/eval/permutation.md):
 * BITREV is the published one (oscar_ref_compose_rotation); RANDOM a fixed
 * pseudo-random permutation; SPREAD the m-sequence order x^(r-1) in GF(2^bits),
 * whose top positions are not XOR-closed. Rank 0 keeps row 0 in all three. For d = m 2^k
 * with m > 1 (H = A (x) S above), BITREV and SPREAD put rank r = t m + a at row a 2^k + p(t),
 * p their placement over the k bits of S; RANDOM is the same Fisher-Yates rule for every d. */
enum { OSCAR_REF_PERM_BITREV = 0, OSCAR_REF_PERM_RANDOM = 1, OSCAR_REF_PERM_SPREAD = 2 };
/* pos[r] = row of H of eigen-direction r (d entries, d <= 256 with a spreading
 * matrix). Returns 0, or -1 for an unknown permutation or bad d. */
int oscar_ref_rotation_positions(int d, int permutation, int *pos);
/* R = U . H . P with the given placement; BITREV gives exactly
 * oscar_ref_compose_rotation. Returns 0, or -1 as above. */
int oscar_ref_compose_rotation_perm(int d, const double *U, int permutation, float *R);
/* max |R R^T - I| of a d x d row-major fp32 matrix, in fp64; returns as soon
 * as the error exceeds stop_above (pass INFINITY for the exact maximum). */
double oscar_ref_orthogonality_error(int d, const float *R, double stop_above);
/* y[i] = fmaf(a, x[i], y[i]) for i < n: the write path's fused term (the rotation's
 * products, the error feedback's updates; FORMAT.md §1, §2.3), rounded once. x and y
 * may not overlap. */
void oscar_ref_fused_axpy(int n, float a, const float *x, float *y);
/* out = x R (R row-major d x d; NULL means identity), out[j] accumulated over i
 * ascending with oscar_ref_fused_axpy's term. out may not alias x. */
void oscar_ref_rotate(int d, const float *x, const float *R, float *out);
/* out = y R^T (inverse rotation), out[i] accumulated over j ascending with fused terms:
 * oscar_ref_rotate(y, R^T) bit for bit. out may not alias y. */
void oscar_ref_unrotate(int d, const float *y, const float *R, float *out);

/* 1 when a row can be stored (FORMAT.md §4): x R (x itself when R is NULL)
 * rounded to kv_dtype is finite and, with F16 metadata (meta16), within f16's
 * range, where a group's scale and min cannot saturate; else 0. y receives
 * the rotated row when it was computed (rows with |x|_2 below the limit skip
 * the product: |(x R)_j| <= |x|_2 for orthogonal R). The one check of the CPU
 * backend's append and of fake-quant. */
int oscar_ref_row_storable(int d, const float *x, const float *R, oscar_dtype kv_dtype, int meta16, float *y);

/* ----------------------------------------------------------- one row */
/* Clip threshold tau of a row for clip ratio c (FORMAT.md §2.1); c >= 1
 * returns max |x|. */
float oscar_ref_clip_tau(int d, const float *x, float c);
/* tau[r] = oscar_ref_clip_tau(d, x, c[r]) for n ratios, bit for bit, with one selection for all. */
void oscar_ref_clip_taus(int d, const float *x, int n, const float *c, float *tau);
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
/* Code widths (FORMAT.md §2.7): a head-tensor at 3 bits keeps the 2-bit plane above (the low two
 * bits of each code) and adds a 1-bit plane of d/8 bytes (bit j of the plane = bit 2 of value j's
 * code), uniform levels only: a = (max - min) / 7, code 0..7. bits 2 is exactly the functions
 * above (hi unused, may be NULL). */
static inline int oscar_ref_code3_at(const uint8_t *codes, const uint8_t *hi, int j) {
    return oscar_ref_code_at(codes, j) | (((hi[j >> 3] >> (j & 7)) & 1) << 2);
}
/* oscar_ref_quantize_row_fb with 2^bits uniform levels (bits 2 or 3; 3 only without lloyd_max):
 * codes d/4 bytes, hi d/8 bytes (bits 3). */
void oscar_ref_quantize_row_wide(int d, int group, int bits, int lloyd_max, float c, oscar_dtype meta_dtype,
                                 const float *x, const float *fb, uint8_t *codes, uint8_t *hi, float *meta);
void oscar_ref_dequantize_row_wide(int d, int group, int bits, int lloyd_max, const uint8_t *codes,
                                   const uint8_t *hi, const float *meta, float *out);
/* n rows (row-major, d floats each) coded exactly as n calls of oscar_ref_quantize_row_wide would code
 * them, bit for bit, several rows at a time (faster with error feedback). tau: each row's clip threshold
 * (INFINITY: no clip; what oscar_ref_clip_tau gives for its ratio) or NULL: from the ratio c.
 * codes: n x d/4 bytes, hi: n x d/8 (bits 3; else unused, may be NULL), meta: n x 2 d/group floats. */
void oscar_ref_quantize_rows_wide(int n, int d, int group, int bits, int lloyd_max, float c, const float *tau,
                                  oscar_dtype meta_dtype, const float *x, const float *fb, uint8_t *codes,
                                  uint8_t *hi, float *meta);

/* Per-token asymmetric b-bit quantize-dequantize in place (int2/int4/int8
 * baselines, groups of `group` along the row; fp16 metadata): a = (max-min) /
 * (2^b - 1), b = min, both rounded to fp16 first, code = clamp(floor(t + 0.5)).
 * bits = 2 gives exactly oscar_ref_quantize_row's uniform rule with c = 1. */
void oscar_ref_fakequant_uniform(int d, int group, int bits, float *x);

/* Quantize-dequantize rows [n_tokens][num_kv_heads][head_dim] in place as
 * the cache stores them (FORMAT.md §2.6) with method m on K (is_k) or V
 * rows. OSCAR2/OSCAR2-LM: rot is [num_rot][d][d] (NULL: identity), fb the
 * error-feedback weights of the same shape or NULL, num_rot = num_kv_heads
 * when per_head, else 1; clip[h * clip_stride] the clip ratio of KV head h
 * (NULL: 1), bits[h * clip_stride] its code width (2 or 3, NULL: 2; 3 only for
 * OSCAR2). Other methods ignore rot, fb, clip and bits. Arguments must be valid (oscar_fakequant checks them) and the
 * rows finite. Returns 0, or -1 when out of memory (rows then unchanged for
 * the rotating methods). */
int oscar_ref_fakequant_rows(oscar_method m, int is_k, int group, const float *clip, int clip_stride,
                             const uint8_t *bits, const float *rot, const float *fb, int per_head, int n_tokens,
                             int num_kv_heads, int head_dim, float *rows);

#endif /* OSCAR_REF_H */
