/* Shared test helpers: random inputs with realistic outliers, the expected
 * contents of a paged OSCAR cache built straight from the cpu_ref primitives
 * (FORMAT.md §3.1 regions, no paging logic), a float64 naive attention over
 * that expected cache, and a random paged batch with shuffled page ids.
 * Used by the CPU backend tests and the GPU conformance tests: everything
 * works on HOST copies of the caches (GPU tests read the pools back first). */
#ifndef OSCAR_REFCHECK_H
#define OSCAR_REFCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "oscar_internal.h"
#include "oscar_ref.h"

/* ---------------------------------------------------------------- random */
typedef struct rc_rng {
    uint64_t s;
} rc_rng;
/* A fresh seed for every call: time, pid-free counter mix. Print it on failure. */
uint64_t rc_fresh_seed(void);
void rc_rng_seed(rc_rng *r, uint64_t seed);
uint64_t rc_next(rc_rng *r);
double rc_uniform(rc_rng *r);              /* [0, 1) */
double rc_normal(rc_rng *r);               /* N(0, 1) */
int rc_randint(rc_rng *r, int lo, int hi); /* uniform in [lo, hi] */
void rc_shuffle_i32(rc_rng *r, int32_t *a, int n);

/* ------------------------------------------------------------ activations */
/* n_tokens x H x d rows of N(0, 1) values plus a small per-channel offset
 * where, per KV head, n_outliers channels (chosen at random once per call)
 * carry a 10-50x larger magnitude: a fixed signed offset of that size plus
 * noise at 0.3x of it (like real key outlier channels). Values are
 * rounded through kv_dtype (F32 = no rounding) so they are exactly
 * representable as the cache input. */
void rc_gen_kv(rc_rng *r, int n_tokens, int H, int d, int n_outliers, oscar_dtype kv_dtype, float *out);
/* fp32 <-> 16-bit arrays (round to nearest even). */
void rc_to_dtype(oscar_dtype t, const float *src, void *dst, size_t n);
void rc_from_dtype(oscar_dtype t, const void *src, float *dst, size_t n);
/* Random orthogonal d x d rotation built through oscar_ref_compose_rotation
 * from a random orthonormal U (Gram-Schmidt in fp64). */
void rc_random_rotation(rc_rng *r, int d, float *R);
/* max |R R^T - I|. */
double rc_orthogonality_error(int d, const float *R);
/* Fills with 0xFF bytes: NaN in bf16, f16 and f32, and an invalid code pattern. */
void rc_poison(void *p, size_t bytes);

/* ------------------------------------------------------- expected cache */
/* The expected cache of one sequence, for every position up to Lmax. What a
 * position holds depends only on its row, so one build serves every length
 * L <= Lmax: rc_region() picks sink / 2-bit / recent for a given L. */
#define RC_MAX_KV_HEADS 64 /* the largest KV head count a test shape has */
typedef struct rc_seq_ref {
    oscar_layout_desc l;
    int Lmax, H, d, ng;
    float clip[2][RC_MAX_KV_HEADS]; /* clip ratio per KV head applied (1 for methods that never clip) */
    float *rot[2];     /* [Lmax][H][d] rotated rows rounded to kv_dtype (K, V) */
    float *deq[2];     /* [Lmax][H][d] dequantized 2-bit rows (positions >= S0; quantized methods) */
    uint8_t *codes[2]; /* [Lmax][H][d/4] packed codes */
    float *meta[2];    /* [Lmax][H][ng*2] (a, b) already rounded to meta_dtype */
    int num_rot;
    float *fb[2];      /* [num_rot][d][d] error-feedback weights (copies), NULL: nearest */
} rc_seq_ref;

enum { RC_SINK = 0, RC_2BIT = 1, RC_RECENT = 2, RC_PAGED16 = 3 /* BF16 method */ };
/* Region of position p in a sequence of L tokens (FORMAT.md §3.1). */
int rc_region(const oscar_layout_desc *l, int p, int L);

/* k, v: [Lmax][H][d] original (unrotated) rows, representable in kv_dtype.
 * rot_k, rot_v: [num_rot][d][d] rotations or NULL for the identity; num_rot 1
 * or H. clip_k/clip_v: [H] ratios of the KV heads, used only for OSCAR2/OSCAR2_LM.
 * Returns 0 on success. */
int rc_seq_ref_build(const oscar_layout_desc *l, const float *rot_k, const float *rot_v, int num_rot,
                     const float *clip_k, const float *clip_v, int Lmax, const float *k, const float *v,
                     rc_seq_ref *out);
/* The same with error-feedback rounding (oscar_ref_quantize_row_fb): fb_k,
 * fb_v are the layer's [num_rot][d][d] weights (copied), NULL for nearest. */
int rc_seq_ref_build_fb(const oscar_layout_desc *l, const float *rot_k, const float *rot_v, const float *fb_k,
                        const float *fb_v, int num_rot, const float *clip_k, const float *clip_v, int Lmax,
                        const float *k, const float *v, rc_seq_ref *out);
void rc_seq_ref_free(rc_seq_ref *s);
/* The stored row (rotated space, fp32) decode must read for position p of a
 * length-L sequence: window/paged 16-bit row or the dequantized 2-bit row. */
const float *rc_stored_row(const rc_seq_ref *s, int kv, int p, int h, int L);

/* Compares one sequence's cache (host copies of the page pool and window
 * pool) at length L with the expected cache, region by region: sink and
 * recent window rows byte for byte, 2-bit codes and metadata, BF16 pages.
 * bt_row: the sequence's block table row; slot: its window slot.
 * allow_boundary: accept a code one level off where the reference t lies
 * within 1e-4 of a rounding boundary and metadata within 1 f16 ulp
 * (FORMAT.md §2.4, for GPU backends); 0 = bit exact. Under error feedback a
 * value's code moves the later values, so a row is accepted when its first
 * differing code is such a boundary case and the rest is not compared.
 * Returns the number of mismatching rows and describes the first in msg. */
int rc_compare_seq(const rc_seq_ref *s, int L, const void *pages, const void *windows, const int32_t *bt_row,
                   int32_t slot, int allow_boundary, char *msg, size_t msg_len);

/* Float64 naive decode attention of one sequence at length L over the
 * expected cache: q [Hq][d] (original space, fp32 values), out [Hq][d]
 * (original space, or rotated V space if rotated_output). */
void rc_attention_f64(const rc_seq_ref *s, int L, int Hq, const float *q, const float *rot_k, const float *rot_v,
                      int num_rot, double sm_scale, int rotated_output, double *out);
/* The same for a query at position t < L (extend, FORMAT.md §5.1): it sees
 * rows 0..t as stored at length L; lse: [Hq] natural-log LSE, or NULL;
 * abs_score: [Hq] the largest sum_j |q~_j k~_pj| * |sm_scale| over the rows seen
 * (what bounds a score's error from q's representation), or NULL. */
void rc_attention_f64_at(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                         const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                         double *lse, double *abs_score);
/* The same; qt_dev: [Hq][d] or NULL, the q~ of this query that a CUDA tensor-core
 * kernel held (fp32, scaled by sm_scale log2(e), read back from its workspace): the
 * 2-bit rows are then scored as those kernels do, with q~ in two int8 limbs
 * (FORMAT.md §5) derived bit for bit from it; NULL: exact. */
/* qr = q R (q: [d] one head's query, original space; R: [d][d] row-major or NULL for the identity), in
 * float64: the query as the rotated rows meet it. */
void rc_rotate_q(const float *q, const float *R, int d, double *qr);
/* Float64 attention of query t (rows [T][hq][d] of q, [T][hkv][d] of k, v and of their stored 2-bit
 * values kq, vq) under the teacher-forced rule: the 2-bit region S0 + sink_shift <= p <= e - 1 - W +
 * shift (both 0: the real rule; the others are a power check's misplaced boundaries), e the cache length
 * the query sees: t + 1 token by token, the end of t's chunk in a chunked prefill of `chunk` tokens
 * (FORMAT.md §5.1). sm_scale 1 / sqrt(d); out [hq][d]. */
void rc_tf_attention(int T, int hq, int hkv, int d, int S0, int W, const float *q, const float *k, const float *v,
                     const float *kq, const float *vq, int t, int shift, int sink_shift, int chunk, double *out);
/* q~ (fp32, scaled by sm_scale log2(e)) of one head as the tensor-core kernels hold it for the 2-bit rows:
 * two int8 limbs (FORMAT.md §5), returned in q's units (q2 [d]). */
void rc_q_limbs2(const float *qt, int d, double sm_scale, double *q2);
void rc_attention_f64_q(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                        const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                        double *lse, double *abs_score, const float *qt_dev);
/* q~ of one head as the CUDA long-chunk extend holds it for the 2-bit rows (templates/extend_fa.jinja,
 * FORMAT.md §5.1): fp16 of q~ / qmx 2^15 / w_j, w_j the power of four its code position carries
 * (4^k, k = j mod 8 < 4; 256 at k = 4; 4^(k - 5) above), in q's units. */
void rc_q_fa(const float *qt, int d, double sm_scale, double *q2);
/* A 2-bit value row's element as the long-chunk extend's P.V operand holds it: fp16 of it, clamped
 * to +-65504 (FORMAT.md §5.1). */
double rc_fa_value(float v);
/* rc_attention_f64_q as the long-chunk extend computes it: q' from rc_q_fa, and the 2-bit value
 * rows rounded to fp16 (clamped to +-65504), as it dequantizes them. */
void rc_attention_f64_fa(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                         const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                         double *lse, const float *qt_dev);
/* Compares n outputs stored in kv_dtype against the float64 reference within
 * the output rounding (2^-8 relative for bf16, 2^-10 for f16) plus a small
 * absolute slack scaled by the largest |ref|. Returns mismatches, first in msg. */
int rc_check_output(oscar_dtype t, const void *out, const double *ref, size_t n, char *msg, size_t msg_len);
/* The same with the absolute floor abs_frac * max|ref| instead of 2e-4 * max|ref|
 * (the GPU tensor-core decodes: P in fp16/bf16 with a remainder, see docs/FORMAT.md §5). */
int rc_check_output_abs(oscar_dtype t, const void *out, const double *ref, size_t n, double abs_frac, char *msg,
                        size_t msg_len);
/* The largest |out - ref| / tolerance rc_check_output_abs has seen since the last call (how close a
 * kernel runs to its floor; test_backend_conformance prints it under OSCAR_TEST_WORST=1). Resets it. */
double rc_worst_take(void);

/* ----------------------------------------------------------- paged batch */
/* Host-side paged batch: block table with shuffled physical page ids (some
 * spare pages never used; unused table entries -1), shuffled window slots
 * (one spare slot), pools poisoned with 0xFF so reading unwritten memory
 * shows up as NaN. seq_lens start at 0: the caller sets them per append. */
typedef struct rc_paged {
    oscar_layout_desc l;
    oscar_page_geom g;
    int num_seqs, stride, num_pages, num_slots;
    size_t page_bytes, slot_bytes;
    int32_t *seq_lens, *window_slots, *block_table;
    void *pages, *windows;
} rc_paged;
int rc_paged_init(rc_rng *r, const oscar_layout_desc *l, int num_seqs, const int32_t *max_lens, int spare_pages,
                  rc_paged *out);
void rc_paged_free(rc_paged *b);
/* Pages a sequence of L tokens needs (FORMAT.md §3.3/§3.4). */
int rc_pages_for(const oscar_layout_desc *l, int L);


/* ------------------------------------------------------- plan setup */
/* One test shape. */
typedef struct rc_cfg {
    int d, G, P, S0, W, Hq, H;
    oscar_method method;
    oscar_dtype kv, meta;
    int per_head;
} rc_cfg;
/* Shapes at head dims that are not powers of two (FORMAT.md §3.5; Phi-3 / GPT-NeoX-20B 96, Phi-2 /
 * Pythia 80, 112, 160, 192 and the ends), run by the CPU backend and conformance tests: [0] (d 96,
 * per-head rotations) and [1] (d 80, Lloyd-Max, F16 windows, F32 metadata) at every schedule, the
 * others (every method, groups below the head) in chunks. */
#define RC_OTHER_DIM_SHAPES 12
extern const rc_cfg rc_other_dim_shapes[RC_OTHER_DIM_SHAPES];
/* Fills the layout of c (max_seq_len 100000) and what a plan needs for
 * `layers` layers: rotations (Hadamard for QUAROT2, random orthogonal for the
 * OSCAR methods, none = NULL for INT2/BF16; malloc'ed [layers][num_rot][d][d],
 * the caller frees) and random clip ratios clip_k, clip_v [layers][H], drawn
 * per KV head (K in [0.9, 1], V 1 or [0.85, 0.95]). */
void rc_plan_setup(const rc_cfg *c, int layers, rc_rng *r, oscar_layout_desc *l, int *num_rot, int *identity,
                   float **rot_k, float **rot_v, float *clip_k, float *clip_v);

/* ------------------------------------------------ error-feedback weights */
/* A random anisotropic SPD metric C = Q diag(lambda) Q^T (Q random
 * orthogonal, lambda log-uniform over [1, spread], fp64, row-major d x d). */
void rc_random_metric(rc_rng *r, int d, double spread, double *C);
/* Error-feedback weights for metric C as the calibration defines them:
 * U upper triangular with U^T U = (C + damp * tr(C) / d * I)^-1,
 * F[j][k] = U[j][k] / U[j][j] for k > j, 0 on and below the diagonal.
 * Plain C Cholesky in fp64. Returns max |F|, or -1 if C is not SPD. */
double rc_feedback_weights(int d, const double *C, double damp, float *F);

#endif /* OSCAR_REFCHECK_H */
