// Weight products of the decode steps' skinny batches on Hopper (sm_90a):
// Y[M][N] (+)= X[M][K] W[N][K]^T for 5..256 rows, bf16 in, fp32 out (ge_kernels.h).
// Why: at 16-256 rows cuBLAS(Lt) reads the weights at 40-80 % of the copy bandwidth
// (perf/e2e/RESULTS.md); these products are bound by that read, so the kernel is
// built to stream W: one CTA per tile of BN output columns (W rows) and a K range,
// every row of X in the same CTA (so each weight byte is read once), a producer
// warpgroup filling a ring of shared-memory stages by cp.async (zero-filled past M,
// N and K) and signalling mbarriers, and MT consumer warpgroups, one per 64 rows of
// X, running wgmma m64nBNk16 from shared memory (128-byte swizzle, K-major both).
// Split-K (grid.y) for the narrow products: each split writes its partial tile to
// a workspace; the last split to arrive (a per-tile counter) adds the partials in
// split order, so the result does not depend on which split finished first.
// The weights of the first stages are requested before griddepcontrol.wait
// (programmatic dependent launch): they stream while the previous kernel ends.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ge_kernels.h"
#include "ge_launch.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GE_WG_ON 1
#endif

namespace {

constexpr int WG_BK = 64;          // K per stage: one 128-byte swizzle row of bf16
constexpr int WG_SMEM = 200 << 10; // ring budget (sm_90 allows 227 KB a block)

template <int MT, int BN> struct wg_cfg {
    static constexpr int XB = MT * 64 * 128; // X stage bytes (64 rows per consumer warpgroup)
    static constexpr int WB = BN * 128;      // W stage bytes
    static constexpr int SB = XB + WB;
    static constexpr int ST = WG_SMEM / SB > 8 ? 8 : WG_SMEM / SB;
    static constexpr int SMEM = ST * SB + 1024 + 2 * ST * 8; // + 1024-byte alignment slack + mbarriers
    static constexpr int THREADS = (MT + 1) * 128;
    static_assert(SB % 1024 == 0, "stages keep the swizzle atom's 1024-byte alignment");
};

#ifdef GE_WG_ON
__device__ __forceinline__ uint32_t wg_saddr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// 16 bytes global -> shared; ok 0: 16 zero bytes, nothing read
__device__ __forceinline__ void wg_cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
// arrives on bar once every cp.async this thread issued so far has landed
__device__ __forceinline__ void wg_cp_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// the producer's cp.async writes (generic proxy) made visible to wgmma's reads (async proxy)
__device__ __forceinline__ void wg_fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// K-major operand, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
template <int BN> __device__ void wg_mma(float (&d)[BN / 2], uint64_t da, uint64_t db);
template <> __device__ __forceinline__ void wg_mma<128>(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
}
template <> __device__ __forceinline__ void wg_mma<192>(float (&d)[96], uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
                 : "l"(da), "l"(db));
}
// the accumulators as operands of an empty volatile asm after the last wait: their reads stay after it
template <int N> __device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

template <int MT, int BN>
__global__ void __launch_bounds__((MT + 1) * 128, 1)
    k_wgemm(float *Y, const __nv_bfloat16 *W, const __nv_bfloat16 *X, int M, int N, int K, int acc_y, int S,
            float *part, int *cnt) {
#ifdef GE_WG_ON
    using C = wg_cfg<MT, BN>;
    extern __shared__ uint8_t wg_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)wg_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(sm + C::ST * C::SB), *empty = full + C::ST;
    __shared__ int last_split;
    const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
    const int tile = blockIdx.x, split = blockIdx.y, n0 = tile * BN;
    const int KT = (K + WG_BK - 1) / WG_BK;
    const int kb = (int)((long long)KT * split / S), nk = (int)((long long)KT * (split + 1) / S) - kb;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::ST; s++) {
            mbar_init(wg_saddr(full + s), 128);      // the producer's 128 threads' cp.async arrivals
            mbar_init(wg_saddr(empty + s), MT * 4); // one arrival per consumer warp
        }
    }
    __syncthreads();
    const uint32_t base = wg_saddr(sm);
    if (wg == MT) {
        // producer: thread t copies 16-byte chunk c = t % 8 of rows t / 8 + 16 i (swizzled: chunk c ^ row % 8)
        const int c = t & 7, r0 = t >> 3;
        auto load_w = [&](int it) {
            const int k0 = (kb + it) * WG_BK + c * 8;
            const uint32_t ws = base + (it % C::ST) * C::SB + C::XB;
#pragma unroll
            for (int i = 0; i < BN / 16; i++) {
                const int r = r0 + 16 * i, n = n0 + r;
                const bool ok = n < N && k0 < K;
                wg_cp16(ws + r * 128 + ((c ^ (r & 7)) << 4), ok ? W + (size_t)n * K + k0 : W, ok);
            }
        };
        auto load_x = [&](int it) {
            const int k0 = (kb + it) * WG_BK + c * 8;
            const uint32_t xs = base + (it % C::ST) * C::SB;
#pragma unroll
            for (int i = 0; i < MT * 4; i++) {
                const int r = r0 + 16 * i;
                const bool ok = r < M && k0 < K;
                wg_cp16(xs + r * 128 + ((c ^ (r & 7)) << 4), ok ? X + (size_t)r * K + k0 : X, ok);
            }
        };
        // the first stages' weights before the wait (no kernel of the step writes them)
        const int pre = nk < C::ST ? nk : C::ST;
        for (int it = 0; it < pre; it++) load_w(it);
        ge_pdl_wait();
        ge_pdl_trigger();
        for (int it = 0; it < nk; it++) {
            const int s = it % C::ST;
            if (it >= C::ST) {
                mbar_wait(wg_saddr(empty + s), ((it / C::ST) + 1) & 1); // the consumers are done with it - ST
                load_w(it);
            }
            load_x(it);
            wg_cp_arrive(wg_saddr(full + s));
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory"); // nothing of the thread's in flight at its exit
        return;
    }
    // consumer warpgroup wg: rows [64 wg, 64 wg + 64) of X against the BN columns
    ge_pdl_wait(); // Y is read and written after the previous kernel
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    const int warp = t >> 5, lane = t & 31;
    for (int it = 0; it < nk; it++) {
        const int s = it % C::ST;
        mbar_wait(wg_saddr(full + s), (it / C::ST) & 1);
        __syncwarp();
        wg_fence_async();
        wg_fence();
        const uint32_t xs = base + s * C::SB + wg * 8192, ws = base + s * C::SB + C::XB;
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) wg_mma<BN>(d, wg_desc(xs + 32 * kk), wg_desc(ws + 32 * kk));
        wg_commit();
        wg_wait<1>();
        if (it > 0 && lane == 0) mbar_arrive(wg_saddr(empty + (it - 1) % C::ST)); // its MMAs are done
    }
    wg_wait<0>();
    wg_pin(d);
    // d[i]: row 16 warp + lane / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2 of the tile
    const int rb = wg * 64 + 16 * warp + (lane >> 2), cb = 2 * (lane & 3);
    if (S > 1) {
        float *p = part + (size_t)(tile * S + split) * (MT * 64) * BN;
#pragma unroll
        for (int i = 0; i < BN / 2; i += 2) {
            const int r = rb + 8 * ((i >> 1) & 1), cc = 8 * (i >> 2) + cb;
            __stcg((float2 *)(p + (size_t)r * BN + cc), make_float2(d[i], d[i + 1]));
        }
        __threadfence();
        asm volatile("bar.sync 1, %0;\n" ::"n"(MT * 128) : "memory");
        if (threadIdx.x == 0) last_split = atomicAdd(cnt + tile, 1) == S - 1;
        asm volatile("bar.sync 1, %0;\n" ::"n"(MT * 128) : "memory");
        if (!last_split) return;
        __threadfence();
        // the last split: every split's partial in split order (its own included, from memory)
        const float *p0 = part + (size_t)tile * S * (MT * 64) * BN;
#pragma unroll
        for (int i = 0; i < BN / 2; i += 2) {
            const int r = rb + 8 * ((i >> 1) & 1), cc = 8 * (i >> 2) + cb;
            float2 v = __ldcg((const float2 *)(p0 + (size_t)r * BN + cc));
            for (int q = 1; q < S; q++) {
                const float2 u = __ldcg((const float2 *)(p0 + ((size_t)q * (MT * 64) + r) * BN + cc));
                v.x += u.x;
                v.y += u.y;
            }
            d[i] = v.x;
            d[i + 1] = v.y;
        }
        if (threadIdx.x == 0) cnt[tile] = 0; // ready for the next call (the stream orders it)
    }
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
        const int r = rb + 8 * ((i >> 1) & 1), cc = n0 + 8 * (i >> 2) + cb;
        if (r < M) {
            float *y = Y + (size_t)r * N + cc;
            if (cc < N) y[0] = acc_y ? y[0] + d[i] : d[i];
            if (cc + 1 < N) y[1] = acc_y ? y[1] + d[i + 1] : d[i + 1];
        }
    }
#else
    __trap(); // built without sm_90a: ge_k_wgemm_supported() is 0 and no caller gets here
#endif
}

template <int MT, int BN>
int wg_launch(float *y, const void *W, const void *x, int M, int N, int K, int acc_y, int S, float *part, int *cnt,
              int pdl, ge_stream st) {
    using C = wg_cfg<MT, BN>;
    cudaError_t e = cudaFuncSetAttribute(k_wgemm<MT, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (e != cudaSuccess) return (int)e;
    return launch_pdl_smem(k_wgemm<MT, BN>, dim3((unsigned)((N + BN - 1) / BN), (unsigned)S), C::THREADS,
                           (size_t)C::SMEM, pdl, st, y, (const __nv_bfloat16 *)W, (const __nv_bfloat16 *)x, M, N,
                           K, acc_y, S, part, cnt);
}

} // namespace

extern "C" int ge_k_wgemm_supported(void) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return 0;
    return major == 9 && minor == 0; /* the sm_90a cubin runs on exactly these */
}

extern "C" size_t ge_k_wgemm_part_bytes(int M, int N, int bn, int split) {
    if (split <= 1) return 0;
    const size_t mt = (size_t)(M + 63) / 64;
    return (size_t)((N + bn - 1) / bn) * (size_t)split * mt * 64 * (size_t)bn * sizeof(float);
}

extern "C" int ge_k_wgemm_bf16(float *y, const void *W, const void *x, int M, int N, int K, int acc_y, int bn,
                               int split, float *part, size_t part_bytes, int *cnt, int cnt_n, int pdl,
                               ge_stream st) {
    const int KT = (K + WG_BK - 1) / WG_BK, tiles = bn > 0 ? (N + bn - 1) / bn : 0;
    if (M < 1 || M > 256 || N < 1 || K < 8 || K % 8 || (bn != 128 && bn != 192) || (bn == 192 && M > 192) ||
        split < 1 || split > KT || ((uintptr_t)W | (uintptr_t)x) % 16 ||
        (split > 1 && (!part || !cnt || cnt_n < tiles || part_bytes < ge_k_wgemm_part_bytes(M, N, bn, split))))
        return (int)cudaErrorInvalidValue;
    const int mt = (M + 63) / 64;
#define GE_WG_CASE(MT_, BN_)                                                                                         \
    if (mt == MT_ && bn == BN_) return wg_launch<MT_, BN_>(y, W, x, M, N, K, acc_y, split, part, cnt, pdl, st);
    GE_WG_CASE(1, 128) GE_WG_CASE(2, 128) GE_WG_CASE(3, 128) GE_WG_CASE(4, 128)
    GE_WG_CASE(1, 192) GE_WG_CASE(2, 192) GE_WG_CASE(3, 192)
#undef GE_WG_CASE
    return (int)cudaErrorInvalidValue;
}
