/* Small CUDA kernels of the GPU engine (ge_kernels.cu), callable from C.
 * Activations that feed a GEMM ("act") are bf16 or fp32 (act_f32 flag);
 * the residual stream, GEMM outputs and norms are fp32. Every launcher
 * returns the cudaError_t of its launch as an int (0 = success).
 * pdl 1 (the decode step's kernels, sm_90): programmatic dependent launch, the kernel may start
 * while the stream's previous kernel runs and waits for it on the device (a GEMV streams its first
 * weights meanwhile); the results are the same as with pdl 0. */
#ifndef OSCAR_GE_KERNELS_H
#define OSCAR_GE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *ge_stream;

/* Deterministic hash-based uniform values in [-scale, scale] (+ offset). */
int ge_k_fill_random(void *dst, int is_f32, size_t n, uint64_t seed, float scale, float offset, ge_stream st);
/* fp32 -> bf16 or fp32 copy (dst_f32) of n values, device to device. */
int ge_k_convert(void *dst, int dst_f32, const float *src, size_t n, ge_stream st);
/* bf16 -> fp32. */
int ge_k_bf16_to_f32(float *dst, const void *src, size_t n, ge_stream st);
/* cos/sin tables [max_pos][d/2] from inv_freq [d/2] (fp32 angle p * inv, as transformers). */
int ge_k_rope_table(float *cos_t, float *sin_t, const float *inv_freq, float scale, int max_pos, int d, ge_stream st);
/* x[t][:] = embed[ids[t]][:] (embed bf16 or fp32). */
int ge_k_embed(float *x, const void *embed, int embed_f32, const int32_t *ids, int T, int H, ge_stream st);
/* out[r][:] = x[r][:] * rsqrt(mean(x^2) + eps) * w, out in act dtype. */
int ge_k_rmsnorm(void *out, int out_f32, const float *x, const float *w, int rows, int H, float eps, int pdl,
                 ge_stream st);
/* qkv [T][(Hq+2Hkv)d] fp32 -> bias (optional), per-head q/k RMSNorm (optional),
 * RoPE at positions pos[t]; writes q fp32 and bf16 [T][Hq][d], k, v bf16 [T][Hkv][d]. */
int ge_k_qkv_post(const float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                  const float *cos_t, const float *sin_t, const int32_t *pos, int T, int Hq, int Hkv, int d,
                  float eps, float *q_f32, void *q_bf16, void *k_bf16, void *v_bf16, int pdl, ge_stream st);
/* act[r][i] = silu(gu[r][i]) * gu[r][FF + i]. */
int ge_k_swiglu(void *act, int act_f32, const float *gu, int rows, int FF, int pdl, ge_stream st);
/* y[r][:] += b[:]. */
int ge_k_add_bias(float *y, const float *b, int rows, int N, ge_stream st);
/* dst[i][:] = src[rows[i]][:]. */
int ge_k_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int H, ge_stream st);
/* y[m][n] = (acc_y ? y[m][n] : 0) + sum_k W[n][k] x[m][k], m < M <= 4: W [N][K] and x [M][K]
 * bf16, K % 8 == 0 and both 16-byte aligned (else cudaErrorInvalidValue), y [M][N] fp32. The
 * decode steps' weight products (few rows: a GEMV reads the weights near the copy bandwidth). */
int ge_k_gemv_bf16(float *y, const void *W, const void *x, int M, int N, int K, int acc_y, int pdl, ge_stream st);
/* Y = (acc_y ? Y : 0) + X W^T on Hopper's warpgroup MMAs (ge_wgemm.cu), for the decode steps'
 * 5..256 rows: W [N][K] and X [M][K] bf16, 16-byte aligned, K % 8 == 0; Y [M][N] fp32. bn: output
 * columns per CTA, 128 or 192 (192: M <= 192); split: K ranges per column tile (1..ceil(K / 64)); split > 1
 * needs part (ge_k_wgemm_part_bytes(M, N, bn, split) bytes, device) and cnt (ceil(N / bn) ints, device,
 * zero before the first call; each call leaves them zero), both owned by the caller and used by one
 * stream at a time. Results do not depend on timing (the partials are added in split order). Else
 * cudaErrorInvalidValue. Only where ge_k_wgemm_supported() (compute capability 9.0, the sm_90a code). */
int ge_k_wgemm_supported(void);
size_t ge_k_wgemm_part_bytes(int M, int N, int bn, int split);
int ge_k_wgemm_bf16(float *y, const void *W, const void *x, int M, int N, int K, int acc_y, int bn, int split,
                    float *part, size_t part_bytes, int *cnt, int cnt_n, int pdl, ge_stream st);
/* out[r] = argmax_j logits[r][j] (lowest index on ties). */
int ge_k_argmax(int32_t *out, const float *logits, int rows, int V, ge_stream st);
/* Exact causal attention of prompts concatenated by cu_seqlens [S+1]: each
 * token attends to the earlier tokens of its own prompt. q fp32 [T][Hq][d],
 * k, v bf16 [T][Hkv][d]; out in act dtype [T][Hq][d]. d in {64, 128, 256}. */
int ge_k_prefill_attention(void *out, int out_f32, const float *q, const void *k, const void *v,
                           const int32_t *cu_seqlens, int S, int max_len, int Hq, int Hkv, int d, float scale,
                           ge_stream st);
/* The same on the tensor cores (ge_flash.cu; bf16 out, d 64 or 128): q and P
 * rounded to bf16. ge_k_prefill_attention takes it for bf16 outputs of those
 * head dims; the fp32 check mode and d 256 keep the fp32 kernel. */
int ge_k_prefill_attention_tc(void *out, const float *q, const void *k, const void *v, const int32_t *cu_seqlens,
                              int S, int max_len, int Hq, int Hkv, int d, float scale, ge_stream st);
/* Profiling gate (ge_profile_step): one thread spins until *flag (host
 * memory mapped into the device) is nonzero or max_ns have passed by the
 * GPU's global timer; on the time limit it sets *timed_out = 1. Work queued
 * behind it on the stream starts when the host has queued all of it. */
int ge_k_gate(const volatile int *flag, int *timed_out, uint64_t max_ns, ge_stream st);

#ifdef __cplusplus
}
#endif
#endif
