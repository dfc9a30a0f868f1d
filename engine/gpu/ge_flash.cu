// Exact causal prefill attention on the tensor cores (bf16 mode of the GPU
// engine): FlashAttention-2 tiling with mma.sync m16n8k16 bf16 -> fp32.
// A CTA of 4 warps takes 64 query rows of one (prompt, query head), 16 rows
// per warp; K/V tiles of 64 keys go through shared memory (cp.async, two
// stages, 16-byte chunks swizzled by row so ldmatrix is conflict-free);
// S = Q K^T and O += P V stay in registers (P's C fragments are the A
// operand of the next MMA), online softmax in base 2. q is the engine's fp32
// q, rounded to bf16 with the scale folded in; P is rounded to bf16 as
// FlashAttention does. The fp32 check mode keeps the exact fp32 kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ge_kernels.h"

namespace {

constexpr int BQ = 64, BK = 64;
constexpr float NEG_BIG = -1e30f;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
__device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm4(uint32_t *r, const void *p, bool trans) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void cp16(void *smem, const void *gmem, bool ok) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Byte offset of 16-byte chunk c of row r in a [BK][D] bf16 tile: the chunk
// index is XORed with r % 8 so the 8 rows an ldmatrix phase reads hit
// distinct banks.
template <int D> __device__ __forceinline__ int swz(int r, int c) { return r * (2 * D) + ((c ^ (r & 7)) << 4); }

template <int D>
__global__ void __launch_bounds__(128, 2) k_flash_prefill(__nv_bfloat16 *out, const float *q, const __nv_bfloat16 *k,
                                                          const __nv_bfloat16 *v, const int32_t *cu, int Hq, int Hkv,
                                                          float scale_log2) {
    constexpr int KS = D / 16, NO = D / 8, CH = D / 8; // k-steps over dims, output n-tiles, chunks per row
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *Ks = smem, *Vs = smem + 2 * BK * 2 * D; // [2 stages][BK][D] each
    const int seq = blockIdx.z, h = blockIdx.y, gk = h / (Hq / Hkv);
    const int s0 = cu[seq], s1 = cu[seq + 1];
    const int q0 = s0 + blockIdx.x * BQ;
    if (q0 >= s1) return; // uniform over the block
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    const int r0 = q0 + 16 * warp + g, r1 = r0 + 8; // this thread's two query rows
    // Q as A fragments, scaled by sm_scale * log2(e), rounded to bf16.
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        const int d0 = 16 * ks + 2 * c;
        float2 x00 = make_float2(0.f, 0.f), x10 = x00, x01 = x00, x11 = x00;
        if (r0 < s1) {
            const float *qr = q + ((size_t)r0 * Hq + h) * D;
            x00 = *(const float2 *)(qr + d0);
            x01 = *(const float2 *)(qr + d0 + 8);
        }
        if (r1 < s1) {
            const float *qr = q + ((size_t)r1 * Hq + h) * D;
            x10 = *(const float2 *)(qr + d0);
            x11 = *(const float2 *)(qr + d0 + 8);
        }
        qa[ks][0] = pack_bf16(x00.x * scale_log2, x00.y * scale_log2);
        qa[ks][1] = pack_bf16(x10.x * scale_log2, x10.y * scale_log2);
        qa[ks][2] = pack_bf16(x01.x * scale_log2, x01.y * scale_log2);
        qa[ks][3] = pack_bf16(x11.x * scale_log2, x11.y * scale_log2);
    }
    float o[NO][4], m[2] = {NEG_BIG, NEG_BIG}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < NO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    const int kend = min(s1, q0 + BQ); // the last key any row of this block sees, + 1
    const int ntile = (kend - s0 + BK - 1) / BK;
    const size_t rs = (size_t)Hkv * D; // elements between tokens
    auto load = [&](int t, int st) {
        const int kt = s0 + t * BK;
        for (int i = tid; i < BK * CH; i += 128) {
            const int r = i / CH, ch = i % CH, key = kt + r;
            const bool ok = key < kend;
            const size_t off = ok ? (size_t)key * rs + (size_t)gk * D + 8 * ch : 0;
            cp16(Ks + st * BK * 2 * D + swz<D>(r, ch), k + off, ok);
            cp16(Vs + st * BK * 2 * D + swz<D>(r, ch), v + off, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    load(0, 0);
    for (int t = 0; t < ntile; t++) {
        if (t + 1 < ntile) {
            load(t + 1, (t + 1) & 1);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();
        const unsigned char *kb = Ks + (t & 1) * BK * 2 * D, *vb = Vs + (t & 1) * BK * 2 * D;
        const int kt = s0 + t * BK;
        // S = Q K^T: 8 n-tiles of 8 keys; ldmatrix x4 = two k-steps of one n-tile.
        float s[BK / 8][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2) {
                uint32_t b[4];
                ldsm4(b, kb + swz<D>(8 * nt + (lane & 7), 2 * ks + (lane >> 3)), false);
                mma_bf16(s[nt], qa[ks], b[0], b[1]);
                mma_bf16(s[nt], qa[ks + 1], b[2], b[3]);
            }
        }
        // causal mask and keys past the prompt (only the tiles that reach them)
        if (kt + BK > q0 + 16 * warp || kt + BK > s1) {
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt + 8 * nt + 2 * c + (e & 1), row = e < 2 ? r0 : r1;
                    if (key > row || key >= s1) s[nt][e] = NEG_BIG;
                }
        }
        // online softmax (base 2) on rows r0 (e = 0, 1) and r1 (e = 2, 3)
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
        const float a0 = ex2(m[0] - mx[0]), a1 = ex2(m[1] - mx[1]);
        m[0] = mx[0];
        m[1] = mx[1];
        l[0] *= a0;
        l[1] *= a1;
#pragma unroll
        for (int j = 0; j < NO; j++) {
            o[j][0] *= a0;
            o[j][1] *= a0;
            o[j][2] *= a1;
            o[j][3] *= a1;
        }
        uint32_t pa[BK / 16][4];
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            const float p0 = ex2(s[nt][0] - m[0]), p1 = ex2(s[nt][1] - m[0]);
            const float p2 = ex2(s[nt][2] - m[1]), p3 = ex2(s[nt][3] - m[1]);
            l[0] += p0 + p1;
            l[1] += p2 + p3;
            // P's C fragments of n-tiles 2kk, 2kk + 1 are the A fragment of key step kk
            pa[nt / 2][(nt & 1) * 2] = pack_bf16(p0, p1);
            pa[nt / 2][(nt & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
        // O += P V: ldmatrix x4 .trans = (two 8-key halves) x (two 8-dim n-tiles)
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int j = 0; j < NO; j += 2) {
                uint32_t b[4];
                ldsm4(b, vb + swz<D>(16 * kk + (lane & 7) + 8 * ((lane >> 3) & 1), j + (lane >> 4)), true);
                mma_bf16(o[j], pa[kk], b[0], b[1]);
                mma_bf16(o[j + 1], pa[kk], b[2], b[3]);
            }
        __syncthreads(); // this stage is refilled by the next iteration's load
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const float i0 = l[0] > 0.f ? 1.f / l[0] : 0.f, i1 = l[1] > 0.f ? 1.f / l[1] : 0.f;
#pragma unroll
    for (int j = 0; j < NO; j++) {
        const int d0 = 8 * j + 2 * c;
        if (r0 < s1)
            *(__nv_bfloat162 *)(out + ((size_t)r0 * Hq + h) * D + d0) = __floats2bfloat162_rn(o[j][0] * i0, o[j][1] * i0);
        if (r1 < s1)
            *(__nv_bfloat162 *)(out + ((size_t)r1 * Hq + h) * D + d0) = __floats2bfloat162_rn(o[j][2] * i1, o[j][3] * i1);
    }
}

template <int D>
int launch_flash(void *out, const float *q, const void *k, const void *v, const int32_t *cu, int S, int max_len,
                 int Hq, int Hkv, float scale, cudaStream_t st) {
    const int smem = 2 * 2 * BK * 2 * D; // K and V, two stages
    static int attr_done;
    if (!attr_done) {
        cudaError_t e = cudaFuncSetAttribute(k_flash_prefill<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return (int)e;
        attr_done = 1;
    }
    dim3 grid((unsigned)((max_len + BQ - 1) / BQ), (unsigned)Hq, (unsigned)S);
    k_flash_prefill<D><<<grid, 128, smem, st>>>((__nv_bfloat16 *)out, q, (const __nv_bfloat16 *)k,
                                                (const __nv_bfloat16 *)v, cu, Hq, Hkv, scale * 1.4426950408889634f);
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int ge_k_prefill_attention_tc(void *out, const float *q, const void *k, const void *v,
                                         const int32_t *cu_seqlens, int S, int max_len, int Hq, int Hkv, int d,
                                         float scale, ge_stream st) {
    if (S <= 0 || max_len <= 0) return 0;
    switch (d) {
    case 64: return launch_flash<64>(out, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, scale, (cudaStream_t)st);
    case 128: return launch_flash<128>(out, q, k, v, cu_seqlens, S, max_len, Hq, Hkv, scale, (cudaStream_t)st);
    default: return (int)cudaErrorInvalidValue;
    }
}
