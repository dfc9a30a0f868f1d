/* Launch helpers shared by the engine's CUDA sources (ge_kernels.cu, ge_wgemm.cu). */
#ifndef OSCAR_GE_LAUNCH_CUH
#define OSCAR_GE_LAUNCH_CUH

#include <cuda_runtime.h>

#include "ge_kernels.h"

static inline int launch_rc() { return (int)cudaGetLastError(); }

// Programmatic dependent launch (sm_90; pdl 0 or older GPUs: a plain launch). A kernel launched
// with it may start while the stream's previous kernel still runs: before ge_pdl_wait() it may only
// read what no kernel of the step writes (the weights), so a GEMV streams its first weights while
// the small kernel before it runs instead of after (the ramp of every decode-step GEMV at batch 1).
// After the wait everything the previous kernels wrote is visible; the trigger lets the next
// kernel launch (it waits in turn), so the chain stays ordered.
__device__ __forceinline__ void ge_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ge_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
template <typename... P, typename... A>
static int launch_pdl_smem(void (*k)(P...), dim3 grid, unsigned block, size_t smem, int pdl, ge_stream st,
                           A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return (int)cudaLaunchKernelEx(&cfg, k, ((P)args)...);
}

template <typename... P, typename... A>
static int launch_pdl(void (*k)(P...), unsigned grid, unsigned block, int pdl, ge_stream st, A... args) {
    return launch_pdl_smem(k, dim3(grid), block, 0, pdl, st, args...);
}

#endif
