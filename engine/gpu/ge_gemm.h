/* The GPU engine's weight products Y[M][N] (+)= X[M][K] W[N][K]^T (W and X in
 * the weight dtype, Y fp32), one home for the choice of kernel:
 *  - M <= 4 (bf16): the engine's GEMV (ge_kernels.h);
 *  - 5 <= M <= GE_GEMM_TUNE_MAX_M (bf16, tuning on): the kernel that was
 *    fastest (by 3 % or more against cuBLAS's default) for this (N, K, beta)
 *    and M's bucket of 16 row counts when ge_gemm_tune timed, on the real
 *    weights, cuBLASLt's heuristic candidates, the default and, on compute
 *    capability 9.0 up to 256 rows, the engine's warpgroup GEMM
 *    (ge_k_wgemm_bf16: tiles of 128 or 192 columns, K split 1..8 ways);
 *  - otherwise, or before a shape is tuned: cublasGemmEx's default.
 * Why: at decode batches of tens to hundreds of rows the default picks tiles
 * that leave SMs idle and reads the weights at 40-60 % of the copy bandwidth.
 * The choice is per engine (no global state) and fixed once made, so a CUDA
 * graph captured after tuning replays the tuned kernels. Results may differ
 * in the last bits between algorithms (another summation order), never in
 * what is computed. */
#ifndef OSCAR_GE_GEMM_H
#define OSCAR_GE_GEMM_H

#include <stdio.h>

#include <cuda_runtime_api.h>

#include "oscar/oscar.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GE_GEMM_TUNE_MAX_M 1024

typedef struct ge_gemm ge_gemm;

/* ws: device workspace of ws_bytes, owned by the caller, outliving the
 * ge_gemm (cuBLAS and cuBLASLt allocate nothing while a step is captured).
 * With tuning on a compute-capability-9.0 device the ge_gemm allocates its
 * own 32 MiB for the warpgroup GEMM's split-K partials (freed by destroy).
 * f32: fp32 weights and activations (never tuned). tune: 0 keeps cuBLAS's
 * default for every M > 4. */
oscar_status ge_gemm_create(cudaStream_t st, void *ws, size_t ws_bytes, int f32, int tune, ge_gemm **out);
void ge_gemm_destroy(ge_gemm *g);

/* Times the candidates for (M, N, K, beta) once, if M is in the tuned range
 * and the first of its bucket (else takes the bucket's choice, untimed); a
 * no-op for a known M, outside the range, or while st is being captured.
 * W: nW weight matrices of this shape (e.g. every layer's), used in turn so
 * the timing reads them from memory as a step does, not from the L2. X and Y
 * are the call's buffers; Y is overwritten (beta 0) or accumulated into
 * (beta 1) many times: only for buffers whose contents are dead. */
oscar_status ge_gemm_tune(ge_gemm *g, int M, int N, int K, const void *const *W, int nW, const void *X, float *Y,
                          float beta);

/* Y = X W^T + beta Y, beta 0 or 1 (the engine's two uses); pdl: the GEMV and the warpgroup GEMM may
 * start under the previous kernel (ge_kernels.h). */
oscar_status ge_gemm_run(ge_gemm *g, int M, int N, int K, const void *W, const void *X, float *Y, float beta,
                         int pdl);

/* One line per tuned shape (M N K beta, cuBLAS default us, chosen us, which
 * algorithm) to f, for reports. */
void ge_gemm_report(const ge_gemm *g, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
