// Hopper wgmma layout probe (device machine; sm_90a): one warpgroup computes D = A B for A 64x16 fp16
// in registers (each warp's 16 rows in the mma.m16n8k16 A-fragment order) and B 16x64 fp16 in shared
// memory without swizzle, read through a matrix descriptor, for several (LBO, SBO, transpose) readings
// of the canonical layout; prints each one's largest error against the host's product. The
// long-chunk extend on wgmma (perf/RESULTS-attention.md, thirtieth session) needs the key tile
// K-major (tokens x dims, dims contiguous) and the value tile MN-major (tokens x dims read as K x N):
// this says which descriptor each takes before a kernel is built on them.
//   nvcc -gencode arch=compute_90a,code=sm_90a -O2 -o /tmp/wgmma_probe perf/gpu/wgmma_probe.cu && /tmp/wgmma_probe
#include <cuda_fp16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>

// Shared-memory matrix descriptor: start address, leading and stride byte offsets (all >> 4), no swizzle.
__device__ uint64_t desc_of(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr >> 4) & 0x3fff) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3fff) << 32);
}

// B's element (k, n) of the 16 x 64 operand lies at byte offset b_offset(k, n) of the tile: core matrices
// of 8 rows x 16 bytes (128 contiguous bytes; K-major: rows are n, 8 k-halves a row; MN-major: rows are
// k, 8 n-halves a row), core (k / 8, n / 8) at ks (k / 8) + ns (n / 8); the descriptor gets (lbo, sbo):
// which pairing of the strides with LBO and SBO reads the tile back is what the probe finds out.
struct Case { const char *name; int kmajor, ks, ns, lbo, sbo; };

__device__ int b_offset(const Case &cs, int k, int n) {
    const int core = (k / 8) * cs.ks + (n / 8) * cs.ns;
    return cs.kmajor ? core + (n % 8) * 16 + (k % 8) * 2 : core + (k % 8) * 16 + (n % 8) * 2;
}

#define W(i) "+f"(d[i])
// d += A B, m64n64k16, A from registers, B through desc; TNSP: B stored N-contiguous (MN-major)
template <int TNSP> __device__ void mma64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"
                 : W(0), W(1), W(2), W(3), W(4), W(5), W(6), W(7), W(8), W(9), W(10), W(11), W(12), W(13), W(14), W(15),
                   W(16), W(17), W(18), W(19), W(20), W(21), W(22), W(23), W(24), W(25), W(26), W(27), W(28), W(29), W(30),
                   W(31)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "n"(TNSP));
}
#undef W

__global__ void probe(const __half *A, const __half *B, float *D, Case cs) {
    __shared__ __align__(128) __half bs[16 * 64 * 4];  // room for sparse placements
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    for (int i = tid; i < 16 * 64 * 4; i += 128) bs[i] = __float2half(0.0f);
    __syncthreads();
    for (int i = tid; i < 16 * 64; i += 128) {
        const int k = i / 64, n = i % 64;
        bs[b_offset(cs, k, n) / 2] = B[k * 64 + n];
    }
    // generic-proxy writes -> async proxy (the tensor core's reads)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    // A fragment of this warp's 16 rows (mma.m16n8k16 order)
    auto a2 = [&](int r, int k) {
        __half2 h = __halves2half2(A[r * 16 + k], A[r * 16 + k + 1]);
        return *(uint32_t *)&h;
    };
    const int r0 = 16 * warp + g;
    uint32_t a0 = a2(r0, 2 * c), a1 = a2(r0 + 8, 2 * c), a2_ = a2(r0, 2 * c + 8), a3 = a2(r0 + 8, 2 * c + 8);
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.0f;
    const uint64_t db = desc_of((uint32_t)__cvta_generic_to_shared(bs), cs.lbo, cs.sbo);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (cs.kmajor)
        mma64<0>(d, a0, a1, a2_, a3, db);
    else
        mma64<1>(d, a0, a1, a2_, a3, db); /* imm-trans-b 1: B read MN-major */
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory"); // no read of d before the wait
    // D fragment: n-tile i (columns 8 i ..): d[4 i], d[4 i + 1] row g cols 2c, 2c + 1; d[4 i + 2, 3] row g + 8
    for (int i = 0; i < 8; i++) {
        D[r0 * 64 + 8 * i + 2 * c] = d[4 * i];
        D[r0 * 64 + 8 * i + 2 * c + 1] = d[4 * i + 1];
        D[(r0 + 8) * 64 + 8 * i + 2 * c] = d[4 * i + 2];
        D[(r0 + 8) * 64 + 8 * i + 2 * c + 1] = d[4 * i + 3];
    }
}

int main() {
    __half hA[64 * 16], hB[16 * 64];
    float fA[64 * 16], fB[16 * 64], ref[64 * 64], out[64 * 64];
    __half *dA, *dB;
    float *dD;
    cudaMalloc(&dA, sizeof hA);
    cudaMalloc(&dB, sizeof hB);
    cudaMalloc(&dD, sizeof out);
    // 2 core matrices along k, 8 along n: packed with k-blocks adjacent (ks 128, ns 256) or n-blocks
    // adjacent (ks 1024, ns 128); each read with LBO = the k stride or LBO = the n stride.
    const Case cases[] = {
        {"K-major,  k adjacent, LBO = k stride 128, SBO = n stride 256", 1, 128, 256, 128, 256},
        {"K-major,  k adjacent, LBO = n stride 256, SBO = k stride 128", 1, 128, 256, 256, 128},
        {"K-major,  n adjacent, LBO = k stride 1024, SBO = n stride 128", 1, 1024, 128, 1024, 128},
        {"K-major,  n adjacent, LBO = n stride 128, SBO = k stride 1024", 1, 1024, 128, 128, 1024},
        {"MN-major, k adjacent, LBO = k stride 128, SBO = n stride 256", 0, 128, 256, 128, 256},
        {"MN-major, k adjacent, LBO = n stride 256, SBO = k stride 128", 0, 128, 256, 256, 128},
        {"MN-major, n adjacent, LBO = k stride 1024, SBO = n stride 128", 0, 1024, 128, 1024, 128},
        {"MN-major, n adjacent, LBO = n stride 128, SBO = k stride 1024", 0, 1024, 128, 128, 1024},
    };
    // data 0: small normal values; data 1: B as 2-bit codes left in place (fp16 subnormals c 4^j 2^-24,
    // as the long-chunk kernel's keys) and A scaled by 2^15 (its q''): the products must stay exact
    for (int sub = 0; sub < 2; sub++) {
        srand(7 + sub);
        for (int i = 0; i < 64 * 16; i++) {
            fA[i] = (float)(rand() % 17 - 8) / 8.0f * (sub ? 32768.0f : 1.0f);
            hA[i] = __float2half(fA[i]);
        }
        for (int i = 0; i < 16 * 64; i++) {
            fB[i] = sub ? (float)(rand() % 4) * ldexpf(1.0f, 2 * (rand() % 4) - 24) : (float)(rand() % 17 - 8) / 8.0f;
            hB[i] = __float2half(fB[i]);
        }
        double scale = 0.0;
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 64; n++) {
                double acc = 0.0;
                for (int k = 0; k < 16; k++) acc += (double)fA[m * 16 + k] * fB[k * 64 + n];
                ref[m * 64 + n] = (float)acc;
                scale = fmax(scale, fabs(acc));
            }
        cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
        printf("%s (largest |D| %.3g)\n", sub ? "B subnormal codes, A x 2^15" : "B and A small normals", scale);
        for (const Case &cs : cases) {
            cudaMemset(dD, 0xff, sizeof out);
            probe<<<1, 128>>>(dA, dB, dD, cs);
            cudaError_t e = cudaDeviceSynchronize();
            cudaMemcpy(out, dD, sizeof out, cudaMemcpyDeviceToHost);
            double worst = 0.0;
            for (int i = 0; i < 64 * 64; i++) worst = fmax(worst, fabs((double)out[i] - ref[i]));
            printf("  %-64s %s  max |err| %.3g\n", cs.name, e == cudaSuccess ? "ran" : cudaGetErrorString(e), worst);
        }
    }
    return 0;
}
