// Small kernels of the GPU engine: embedding, norms, RoPE, SwiGLU, argmax,
// random weights, and an exact causal prefill attention over the prompt's
// contiguous bf16 K/V. The elementwise rounding steps that the CPU engine
// does in fp32 use __fmul_rn etc. so the compiler cannot contract them
// into FMAs (the fp32 check mode compares against the CPU engine).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "ge_kernels.h"
#include "ge_launch.cuh"

static inline unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 1048576 ? 1048576 : (b ? b : 1));
}

__device__ __forceinline__ void store_act(void *out, int f32, size_t i, float x) {
    if (f32) ((float *)out)[i] = x;
    else ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(x);
}

// ------------------------------------------------------------ random fill
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__global__ void k_fill_random(void *dst, int is_f32, size_t n, uint64_t seed, float scale, float offset) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); // [0, 1)
        float x = offset + scale * (2.0f * u - 1.0f);
        if (is_f32) ((float *)dst)[i] = x;
        else ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x);
    }
}

extern "C" int ge_k_fill_random(void *dst, int is_f32, size_t n, uint64_t seed, float scale, float offset,
                                ge_stream st) {
    k_fill_random<<<blocks_for(n, 256), 256, 0, st>>>(dst, is_f32, n, seed, scale, offset);
    return launch_rc();
}

__global__ void k_convert(void *dst, int f32, const float *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        store_act(dst, f32, i, src[i]);
}

extern "C" int ge_k_convert(void *dst, int dst_f32, const float *src, size_t n, ge_stream st) {
    k_convert<<<blocks_for(n, 256), 256, 0, st>>>(dst, dst_f32, src, n);
    return launch_rc();
}

__global__ void k_bf16_to_f32(float *dst, const __nv_bfloat16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

extern "C" int ge_k_bf16_to_f32(float *dst, const void *src, size_t n, ge_stream st) {
    k_bf16_to_f32<<<blocks_for(n, 256), 256, 0, st>>>(dst, (const __nv_bfloat16 *)src, n);
    return launch_rc();
}

// ------------------------------------------------------------------ RoPE
__global__ void k_rope_table(float *c, float *s, const float *inv, float scale, int max_pos, int h2) {
    size_t n = (size_t)max_pos * h2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(i / h2), j = (int)(i % h2);
        float ang = __fmul_rn((float)p, inv[j]); // fp32 angle, as the CPU engine and transformers
        c[i] = __fmul_rn((float)cos((double)ang), scale); // scale: YaRN's attention factor, else 1
        s[i] = __fmul_rn((float)sin((double)ang), scale);
    }
}

extern "C" int ge_k_rope_table(float *cos_t, float *sin_t, const float *inv_freq, float scale, int max_pos, int d,
                               ge_stream st) {
    k_rope_table<<<blocks_for((size_t)max_pos * (d / 2), 256), 256, 0, st>>>(cos_t, sin_t, inv_freq, scale, max_pos,
                                                                            d / 2);
    return launch_rc();
}

// ------------------------------------------------------------- embedding
__global__ void k_embed(float *x, const void *embed, int f32, const int32_t *ids, int H) {
    int t = blockIdx.x;
    size_t row = (size_t)ids[t] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        x[(size_t)t * H + i] = f32 ? ((const float *)embed)[row + i]
                                   : __bfloat162float(((const __nv_bfloat16 *)embed)[row + i]);
}

extern "C" int ge_k_embed(float *x, const void *embed, int embed_f32, const int32_t *ids, int T, int H, ge_stream st) {
    if (T <= 0) return 0;
    k_embed<<<T, 256, 0, st>>>(x, embed, embed_f32, ids, H);
    return launch_rc();
}

// --------------------------------------------------------------- RMSNorm
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One block per row. A row's loads are issued together (float4, unrolled): with one block
// per row at batch 1 a plain strided loop waited out one L2 round trip per element group
// (H200, Qwen3-8B: 13.5 us a call, perf/e2e/RESULTS.md step breakdown).
__global__ void __launch_bounds__(1024) k_rmsnorm(void *out, int f32, const float *x, const float *w, int H, float eps) {
    __shared__ double part[32];
    ge_pdl_wait();
    ge_pdl_trigger();
    const float *xr = x + (size_t)blockIdx.x * H;
    const bool v4 = (H & 3) == 0;
    double ss = 0.0;
    if (v4) {
        const float4 *x4 = (const float4 *)xr;
#pragma unroll 4
        for (int i = threadIdx.x; i < H / 4; i += blockDim.x) {
            const float4 a = x4[i];
            ss += (double)a.x * a.x + (double)a.y * a.y + (double)a.z * a.z + (double)a.w * a.w;
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < H; i += blockDim.x) ss += (double)xr[i] * xr[i];
    }
    ss = warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
        v = warp_sum_d(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float inv = (float)(1.0 / sqrt(part[0] / H + (double)eps));
    const size_t o = (size_t)blockIdx.x * H;
    if (v4) {
        const float4 *x4 = (const float4 *)xr, *w4 = (const float4 *)w;
#pragma unroll 4
        for (int i = threadIdx.x; i < H / 4; i += blockDim.x) {
            const float4 a = x4[i], b = w4[i];
            store_act(out, f32, o + 4 * (size_t)i, __fmul_rn(b.x, __fmul_rn(a.x, inv)));
            store_act(out, f32, o + 4 * (size_t)i + 1, __fmul_rn(b.y, __fmul_rn(a.y, inv)));
            store_act(out, f32, o + 4 * (size_t)i + 2, __fmul_rn(b.z, __fmul_rn(a.z, inv)));
            store_act(out, f32, o + 4 * (size_t)i + 3, __fmul_rn(b.w, __fmul_rn(a.w, inv)));
        }
    } else {
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            store_act(out, f32, o + i, __fmul_rn(w[i], __fmul_rn(xr[i], inv)));
    }
}

extern "C" int ge_k_rmsnorm(void *out, int out_f32, const float *x, const float *w, int rows, int H, float eps,
                            int pdl, ge_stream st) {
    if (rows <= 0) return 0;
    /* a float4 per thread where the row allows (up to 1024 threads), in whole warps */
    int threads = ((H + 3) / 4 + 31) / 32 * 32;
    threads = threads < 128 ? 128 : threads > 1024 ? 1024 : threads;
    return launch_pdl(k_rmsnorm, (unsigned)rows, (unsigned)threads, pdl, st, out, out_f32, x, w, H, eps);
}

// ------------------------------------------- q/k/v: bias, q/k-norm, RoPE
// One warp per (token, head); E = d / 32 values per lane: lane + 32 e.
template <int E>
__global__ void k_qkv_post(const float *qkv, const float *bias, const float *qn, const float *kn, const float *cs,
                           const float *sn, const int32_t *pos, int T, int Hq, int Hkv, float eps, float *q32,
                           __nv_bfloat16 *q16, __nv_bfloat16 *k16, __nv_bfloat16 *v16) {
    const int d = 32 * E, lane = threadIdx.x & 31;
    const int nh = Hq + 2 * Hkv;
    ge_pdl_wait();
    ge_pdl_trigger();
    long gw = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (gw >= (long)T * nh) return;
    int t = (int)(gw / nh), h = (int)(gw % nh);
    const float *src = qkv + (size_t)t * nh * d + (size_t)h * d;
    float x[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        x[e] = src[lane + 32 * e];
        if (bias) x[e] = __fadd_rn(x[e], bias[(size_t)h * d + lane + 32 * e]);
    }
    int is_q = h < Hq, is_k = !is_q && h < Hq + Hkv;
    if (is_q || is_k) {
        const float *w = is_q ? qn : kn;
        if (w) {
            double ss = 0.0;
#pragma unroll
            for (int e = 0; e < E; e++) ss += (double)x[e] * x[e];
            ss = warp_sum_d(ss);
            float inv = (float)(1.0 / sqrt(ss / d + (double)eps));
#pragma unroll
            for (int e = 0; e < E; e++) x[e] = __fmul_rn(w[lane + 32 * e], __fmul_rn(x[e], inv));
        }
        // Rotate-half RoPE: value i pairs with i + d/2, i.e. e with e + E/2.
        const int h2 = d / 2;
        const float *c = cs + (size_t)pos[t] * h2, *s = sn + (size_t)pos[t] * h2;
#pragma unroll
        for (int e = 0; e < E / 2; e++) {
            int i = lane + 32 * e;
            float a = x[e], b = x[e + E / 2];
            x[e] = __fsub_rn(__fmul_rn(a, c[i]), __fmul_rn(b, s[i]));
            x[e + E / 2] = __fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, s[i]));
        }
    }
    if (is_q) {
        size_t o = ((size_t)t * Hq + h) * d;
#pragma unroll
        for (int e = 0; e < E; e++) {
            q32[o + lane + 32 * e] = x[e];
            q16[o + lane + 32 * e] = __float2bfloat16_rn(x[e]);
        }
    } else {
        int kh = is_k ? h - Hq : h - Hq - Hkv;
        __nv_bfloat16 *dst = (is_k ? k16 : v16) + ((size_t)t * Hkv + kh) * d;
#pragma unroll
        for (int e = 0; e < E; e++) dst[lane + 32 * e] = __float2bfloat16_rn(x[e]);
    }
}

extern "C" int ge_k_qkv_post(const float *qkv, const float *bias, const float *q_norm, const float *k_norm,
                             const float *cos_t, const float *sin_t, const int32_t *pos, int T, int Hq, int Hkv,
                             int d, float eps, float *q_f32, void *q_bf16, void *k_bf16, void *v_bf16,
                             int pdl, ge_stream st) {
    if (T <= 0) return 0;
    long warps = (long)T * (Hq + 2 * Hkv);
    unsigned blocks = (unsigned)((warps + 3) / 4);
    __nv_bfloat16 *q16 = (__nv_bfloat16 *)q_bf16, *k16 = (__nv_bfloat16 *)k_bf16, *v16 = (__nv_bfloat16 *)v_bf16;
#define QKV_CASE(E)                                                                                       \
    launch_pdl(k_qkv_post<E>, blocks, 128, pdl, st, qkv, bias, q_norm, k_norm, cos_t, sin_t, pos, T, Hq, Hkv, eps, \
               q_f32, q16, k16, v16)
    switch (d) {
    case 64: return QKV_CASE(2);
    case 128: return QKV_CASE(4);
    case 256: return QKV_CASE(8);
    default: return (int)cudaErrorInvalidValue;
    }
#undef QKV_CASE
}

// ---------------------------------------------------------------- SwiGLU
// One rounding rule for both forms (the CPU engine's order: g / (1 + e^-g), then * u).
__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}
// Rows on grid y, columns on grid x: no 64-bit division per element (the flat form divided the
// flat index by FF for every value, which made the kernel ~3x its bytes' time at 172 rows).
__global__ void k_swiglu(void *act, int f32, const float *gu, int rows, int FF) {
    ge_pdl_wait();
    ge_pdl_trigger();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= FF) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *g = gu + (size_t)r * 2 * FF;
        store_act(act, f32, (size_t)r * FF + j, silu_mul(g[j], g[FF + j]));
    }
}
// Four columns per thread, 16-byte loads (FF a multiple of 4, gu and act 16-byte aligned).
__global__ void k_swiglu4(void *act, int f32, const float *gu, int rows, int FF) {
    ge_pdl_wait();
    ge_pdl_trigger();
    const int j = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (j >= FF) return;
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *g = gu + (size_t)r * 2 * FF;
        const float4 a = *(const float4 *)(g + j), b = *(const float4 *)(g + FF + j);
        const float4 y = make_float4(silu_mul(a.x, b.x), silu_mul(a.y, b.y), silu_mul(a.z, b.z), silu_mul(a.w, b.w));
        const size_t o = (size_t)r * FF + j;
        if (f32) {
            *(float4 *)((float *)act + o) = y;
        } else {
            __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y), hi = __floats2bfloat162_rn(y.z, y.w);
            uint2 w;
            w.x = *(const uint32_t *)&lo;
            w.y = *(const uint32_t *)&hi;
            *(uint2 *)((__nv_bfloat16 *)act + o) = w;
        }
    }
}

extern "C" int ge_k_swiglu(void *act, int act_f32, const float *gu, int rows, int FF, int pdl, ge_stream st) {
    if (rows <= 0 || FF <= 0) return 0;
    const unsigned gy = rows < 65535 ? (unsigned)rows : 65535u;
    if (FF % 4 == 0 && ((uintptr_t)gu & 15) == 0 && ((uintptr_t)act & 15) == 0)
        return launch_pdl_smem(k_swiglu4, dim3((unsigned)((FF / 4 + 255) / 256), gy), 256, 0, pdl, st, act, act_f32,
                               gu, rows, FF);
    return launch_pdl_smem(k_swiglu, dim3((unsigned)((FF + 255) / 256), gy), 256, 0, pdl, st, act, act_f32, gu, rows,
                           FF);
}

__global__ void k_add_bias(float *y, const float *b, int rows, int N) {
    size_t n = (size_t)rows * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], b[i % N]);
}

extern "C" int ge_k_add_bias(float *y, const float *b, int rows, int N, ge_stream st) {
    if (rows <= 0) return 0;
    k_add_bias<<<blocks_for((size_t)rows * N, 256), 256, 0, st>>>(y, b, rows, N);
    return launch_rc();
}

__global__ void k_gather_rows(float *dst, const float *src, const int32_t *rows, int H) {
    const float *s = src + (size_t)rows[blockIdx.x] * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[(size_t)blockIdx.x * H + i] = s[i];
}

extern "C" int ge_k_gather_rows(float *dst, const float *src, const int32_t *rows, int n, int H, ge_stream st) {
    if (n <= 0) return 0;
    k_gather_rows<<<n, 256, 0, st>>>(dst, src, rows, H);
    return launch_rc();
}

// ---------------------------------------------------------------- argmax
// One block per row; each thread scans its elements in index order with 4 loads in flight
// (a strided loop of single loads waited out an L2 round trip per element: 56 us a call for a
// 151936-entry vocabulary on the H200). Ties go to the lowest index.
__global__ void k_argmax(int32_t *out, const float *logits, int V) {
    const float *l = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    const int step = blockDim.x;
    int i = threadIdx.x;
    for (; i + 3 * step < V; i += 4 * step) {
        const float x0 = l[i], x1 = l[i + step], x2 = l[i + 2 * step], x3 = l[i + 3 * step];
        if (x0 > best) { best = x0; bi = i; }
        if (x1 > best) { best = x1; bi = i + step; }
        if (x2 > best) { best = x2; bi = i + 2 * step; }
        if (x3 > best) { best = x3; bi = i + 3 * step; }
    }
    for (; i < V; i += step) {
        const float x = l[i];
        if (x > best) { best = x; bi = i; }
    }
    __shared__ float sb[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ob > best || (ob == best && oi < bi)) { best = ob; bi = oi; }
    }
    if ((threadIdx.x & 31) == 0) { sb[threadIdx.x >> 5] = best; si[threadIdx.x >> 5] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (sb[w] > best || (sb[w] == best && si[w] < bi)) { best = sb[w]; bi = si[w]; }
        if (sb[0] > best || (sb[0] == best && si[0] < bi)) { best = sb[0]; bi = si[0]; }
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi; // all NaN: token 0 (the check tools catch it)
    }
}

extern "C" int ge_k_argmax(int32_t *out, const float *logits, int rows, int V, ge_stream st) {
    if (rows <= 0) return 0;
    k_argmax<<<rows, 1024, 0, st>>>(out, logits, V);
    return launch_rc();
}

// ------------------------------------------------- GEMV (decode steps)
// y[m][n] = beta y[m][n] + sum_k W[n][k] x[m][k] for M <= 4 rows: W and x bf16 with K
// contiguous (K % 8 == 0, 16-byte aligned rows), y fp32, fp32 sums. Warps of a block share
// an output column's K (below), four 16-byte weight loads in flight per lane, read past L1
// (each weight is read once). cuBLAS ran the M = 1 products of a decode step at 45-70 % of the copy bandwidth
// (H200, Qwen3-8B, perf/e2e/RESULTS.md).
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b, float acc) {
    const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc = fmaf(__uint_as_float(av[j] << 16), __uint_as_float(bv[j] << 16), acc);
        acc = fmaf(__uint_as_float(av[j] & 0xffff0000u), __uint_as_float(bv[j] & 0xffff0000u), acc);
    }
    return acc;
}
// A column's K is cut into S slices (S = 1, 2, 4 or 8 warps of one block, chosen so a
// lane holds about 4-6 loads of its slice): one warp per column left each warp ~16
// dependent rounds of loads at K = 4096 when the columns fill only half a wave (QKV, O
// and down ran at 53-77 % of the copy bandwidth, gate-up 88 %, H200, 15th session).
template <int M>
__global__ void __launch_bounds__(256) k_gemv_bf16(float *y, const uint4 *W, const uint4 *x, int N, int K8, int S,
                                                   int acc_y) {
    __shared__ float red[8][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cpb = 8 / S;
    const int n = blockIdx.x * cpb + warp / S, s = warp % S;
    const int len = (K8 + S - 1) / S, lo = s * len, hi = lo + len < K8 ? lo + len : K8;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    const uint4 *w = W + (size_t)(n < N ? n : 0) * K8;
    /* the first round of weights before the wait (weights are never written by a step) */
    uint4 a[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = lo + lane + 32 * u;
        a[u] = n < N && i < hi ? ld_stream(w + i) : make_uint4(0, 0, 0, 0);
    }
    ge_pdl_wait();
    ge_pdl_trigger();
    if (n < N) {
        for (int i = lo + lane; i < hi; i += 128) {
            if (i != lo + lane)
#pragma unroll
                for (int u = 0; u < 4; u++) a[u] = i + 32 * u < hi ? ld_stream(w + i + 32 * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (i + 32 * u < hi)
#pragma unroll
                    for (int m = 0; m < M; m++) acc[m] = dot8_bf16(a[u], __ldg(x + (size_t)m * K8 + i + 32 * u), acc[m]);
        }
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
        if (lane == 0) red[warp][m] = acc[m];
    }
    __syncthreads();
    if (n < N && s == 0 && lane < M) {
        float t = 0.0f;
        for (int j = 0; j < S; j++) t += red[warp + j][lane];
        float *yp = y + (size_t)lane * N + n;
        *yp = acc_y ? *yp + t : t;
    }
}

extern "C" int ge_k_gemv_bf16(float *y, const void *W, const void *x, int M, int N, int K, int acc_y, int pdl,
                              ge_stream st) {
    if (M < 1 || M > 4 || K % 8 || N < 1 || ((uintptr_t)W | (uintptr_t)x) % 16) return (int)cudaErrorInvalidValue;
    const int K8 = K / 8;
    int S = 1; /* slices per column: up to 8, until a lane's share is <= 6 loads (192 uint4 a warp) */
    while (S < 8 && (K8 + S - 1) / S > 192) S *= 2;
    const unsigned blocks = (unsigned)((N + 8 / S - 1) / (8 / S));
    const uint4 *w4 = (const uint4 *)W, *x4 = (const uint4 *)x;
    switch (M) {
    case 1: return launch_pdl(k_gemv_bf16<1>, blocks, 256, pdl, st, y, w4, x4, N, K8, S, acc_y);
    case 2: return launch_pdl(k_gemv_bf16<2>, blocks, 256, pdl, st, y, w4, x4, N, K8, S, acc_y);
    case 3: return launch_pdl(k_gemv_bf16<3>, blocks, 256, pdl, st, y, w4, x4, N, K8, S, acc_y);
    default: return launch_pdl(k_gemv_bf16<4>, blocks, 256, pdl, st, y, w4, x4, N, K8, S, acc_y);
    }
}

// ------------------------------------------------------- profiling gate
__device__ __forceinline__ uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void k_gate(const volatile int *flag, int *timed_out, uint64_t max_ns) {
    const uint64_t t0 = global_ns();
    while (*flag == 0) {
        if (global_ns() - t0 > max_ns) {
            *(volatile int *)timed_out = 1;
            break;
        }
        __nanosleep(1000);
    }
}

extern "C" int ge_k_gate(const volatile int *flag, int *timed_out, uint64_t max_ns, ge_stream st) {
    k_gate<<<1, 1, 0, st>>>(flag, timed_out, max_ns);
    return launch_rc();
}

// ------------------------------------------------- prefill attention
// Block: BQ = 64 query rows of one (prompt, query head); each query row is
// held by TPQ = D/64 threads, each owning 16 float4 chunks of the row
// (chunk c4 = part + TPQ*i, so lanes read neighbouring 16-byte words).
// K/V tiles of BK = 64 keys go through shared memory as fp32; online
// softmax in chunks of 8 keys (one rescale per chunk).
#define GE_BQ 64
#define GE_BK 64

template <int D>
__global__ void __launch_bounds__(64 * (D / 64)) k_prefill_attn(void *out, int out_f32, const float *q,
                                                                 const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                                                 const int32_t *cu, int Hq, int Hkv, float scale) {
    constexpr int TPQ = D / 64, NT = 64 * TPQ, C4 = 16; // float4 chunks per thread
    extern __shared__ float4 smem[];
    float4 *Ks = smem, *Vs = smem + GE_BK * (D / 4);
    const int seq = blockIdx.z, h = blockIdx.y, g = h / (Hq / Hkv);
    const int s0 = cu[seq], s1 = cu[seq + 1];
    const int q0 = s0 + blockIdx.x * GE_BQ;
    if (q0 >= s1) return; // uniform over the block
    const int part = threadIdx.x % TPQ, qi = q0 + threadIdx.x / TPQ;
    const bool valid = qi < s1;
    float4 qr[C4], acc[C4];
#pragma unroll
    for (int i = 0; i < C4; i++) {
        int c4 = part + TPQ * i;
        qr[i] = valid ? ((const float4 *)(q + ((size_t)qi * Hq + h) * D))[c4] : make_float4(0, 0, 0, 0);
        acc[i] = make_float4(0, 0, 0, 0);
    }
    float m = -INFINITY, l = 0.0f;
    const int kend = min(s1, q0 + GE_BQ); // keys this block needs (causal)
    for (int kt = s0; kt < kend; kt += GE_BK) {
        const int nk = min(GE_BK, kend - kt);
        __syncthreads();
        // Load K/V rows kt..kt+nk-1 (bf16, 8 per 16-byte load) into fp32 shared memory.
        for (int idx = threadIdx.x; idx < nk * (D / 8); idx += NT) {
            int r = idx / (D / 8), c8 = idx % (D / 8);
            size_t off = ((size_t)(kt + r) * Hkv + g) * D + c8 * 8;
            uint4 kr = *(const uint4 *)(k + off), vr = *(const uint4 *)(v + off);
            const __nv_bfloat162 *kb = (const __nv_bfloat162 *)&kr, *vb = (const __nv_bfloat162 *)&vr;
            float2 k0 = __bfloat1622float2(kb[0]), k1 = __bfloat1622float2(kb[1]), k2 = __bfloat1622float2(kb[2]),
                   k3 = __bfloat1622float2(kb[3]);
            float2 v0 = __bfloat1622float2(vb[0]), v1 = __bfloat1622float2(vb[1]), v2 = __bfloat1622float2(vb[2]),
                   v3 = __bfloat1622float2(vb[3]);
            Ks[r * (D / 4) + c8 * 2] = make_float4(k0.x, k0.y, k1.x, k1.y);
            Ks[r * (D / 4) + c8 * 2 + 1] = make_float4(k2.x, k2.y, k3.x, k3.y);
            Vs[r * (D / 4) + c8 * 2] = make_float4(v0.x, v0.y, v1.x, v1.y);
            Vs[r * (D / 4) + c8 * 2 + 1] = make_float4(v2.x, v2.y, v3.x, v3.y);
        }
        __syncthreads();
        for (int j0 = 0; j0 < nk; j0 += 8) {
            float s[8];
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                const float4 *kr = Ks + (j0 + jj) * (D / 4);
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < C4; i++) {
                    float4 kv = kr[part + TPQ * i];
                    dot += qr[i].x * kv.x + qr[i].y * kv.y + qr[i].z * kv.z + qr[i].w * kv.w;
                }
#pragma unroll
                for (int o = 1; o < TPQ; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                int key = kt + j0 + jj;
                s[jj] = (j0 + jj < nk && key <= qi) ? dot * scale : -INFINITY;
            }
            float cmax = s[0];
#pragma unroll
            for (int jj = 1; jj < 8; jj++) cmax = fmaxf(cmax, s[jj]);
            float mn = fmaxf(m, cmax);
            if (!valid || mn == -INFINITY) continue; // no visible key yet in this chunk
            float corr = __expf(m - mn); // m == -inf: 0
            l *= corr;
#pragma unroll
            for (int i = 0; i < C4; i++) {
                acc[i].x *= corr; acc[i].y *= corr; acc[i].z *= corr; acc[i].w *= corr;
            }
            m = mn;
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                float p = __expf(s[jj] - m);
                if (s[jj] == -INFINITY) continue;
                l += p;
                const float4 *vr = Vs + (j0 + jj) * (D / 4);
#pragma unroll
                for (int i = 0; i < C4; i++) {
                    float4 vv = vr[part + TPQ * i];
                    acc[i].x += p * vv.x; acc[i].y += p * vv.y; acc[i].z += p * vv.z; acc[i].w += p * vv.w;
                }
            }
        }
    }
    if (!valid) return;
    float inv = 1.0f / l;
    size_t o = ((size_t)qi * Hq + h) * D;
#pragma unroll
    for (int i = 0; i < C4; i++) {
        int c = 4 * (part + TPQ * i);
        store_act(out, out_f32, o + c, acc[i].x * inv);
        store_act(out, out_f32, o + c + 1, acc[i].y * inv);
        store_act(out, out_f32, o + c + 2, acc[i].z * inv);
        store_act(out, out_f32, o + c + 3, acc[i].w * inv);
    }
}

template <int D>
static int launch_prefill(void *out, int out_f32, const float *q, const void *k, const void *v, const int32_t *cu,
                          int S, int max_len, int Hq, int Hkv, float scale, ge_stream st) {
    size_t smem = 2 * GE_BK * D * sizeof(float);
    static int attr_done;
    if (!attr_done) {
        cudaError_t e = cudaFuncSetAttribute(k_prefill_attn<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        attr_done = 1;
    }
    dim3 grid((unsigned)((max_len + GE_BQ - 1) / GE_BQ), (unsigned)Hq, (unsigned)S);
    k_prefill_attn<D><<<grid, 64 * (D / 64), smem, st>>>(out, out_f32, q, (const __nv_bfloat16 *)k,
                                                          (const __nv_bfloat16 *)v, cu, Hq, Hkv, scale);
    return launch_rc();
}

extern "C" int ge_k_prefill_attention(void *out, int out_f32, const float *q, const void *k, const void *v,
                                      const int32_t *cu_seqlens, int S, int max_len, int Hq, int Hkv, int d,
                                      float scale, ge_stream st) {
    if (S <= 0 || max_len <= 0) return 0;
    if (!out_f32 && (d == 64 || d == 128))
        return ge_k_prefill_attention_tc(out, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, d, scale, st);
    switch (d) {
    case 64: return launch_prefill<64>(out, out_f32, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, scale, st);
    case 128: return launch_prefill<128>(out, out_f32, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, scale, st);
    case 256: return launch_prefill<256>(out, out_f32, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, scale, st);
    default: return (int)cudaErrorInvalidValue;
    }
}
