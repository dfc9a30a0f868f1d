/* HIP backend plugin (liboscar_backend_hip.so): the CUDA host code with the
 * HIP runtime API (same calls, hip prefix), over kernels generated from the
 * same templates with the HIP prelude. Built for AMD targets; not run here. */
#ifndef OSCAR_HIP
#define OSCAR_HIP 1
#endif
#include "../cuda/cuda_backend.c"
