/* Error returns of the GPU engine's host code: each checks one CUDA, kernel
 * launch, cuBLAS or liboscar call and returns its failure as an oscar_status
 * with the call and place in ge_last_error(). */
#ifndef OSCAR_GE_CHECK_H
#define OSCAR_GE_CHECK_H

#include <cuda_runtime_api.h>

#include "ge_sched.h" /* ge_set_error */

#define CU(call)                                                                                          \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess)                                                                            \
            return ge_set_error(OSCAR_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,    \
                                cudaGetErrorString(e_));                                                  \
    } while (0)
#define KL(call)                                                                                          \
    do {                                                                                                  \
        int e_ = (call);                                                                                  \
        if (e_ != 0)                                                                                      \
            return ge_set_error(OSCAR_ERR_BACKEND, "%s:%d: kernel %s failed: %s", __FILE__, __LINE__,    \
                                #call, cudaGetErrorString((cudaError_t)e_));                              \
    } while (0)
#define OS(call)                                                                                          \
    do {                                                                                                  \
        oscar_status s_ = (call);                                                                         \
        if (s_ != OSCAR_OK)                                                                               \
            return ge_set_error(s_, "%s:%d: %s: %s", __FILE__, __LINE__, #call, oscar_last_error());    \
    } while (0)
#define GE(call)                                                                                          \
    do {                                                                                                  \
        oscar_status s_ = (call);                                                                         \
        if (s_ != OSCAR_OK) return s_;                                                                    \
    } while (0)
#define BL(call)                                                                                          \
    do {                                                                                                  \
        cublasStatus_t b_ = (call);                                                                       \
        if (b_ != CUBLAS_STATUS_SUCCESS)                                                                  \
            return ge_set_error(OSCAR_ERR_BACKEND, "%s:%d: %s failed: cuBLAS status %d", __FILE__,       \
                                __LINE__, #call, (int)b_);                                                \
    } while (0)

#endif
