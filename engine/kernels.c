/* Generic kernels and the run-time choice. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"

static float softmax_exp_generic(float *s, int len)
{
    float mx = -INFINITY;
    for (int i = 0; i < len; i++)
        if (s[i] > mx) mx = s[i];
    double sum = 0.0;
    for (int i = 0; i < len; i++) {
        s[i] = expf(s[i] - mx);
        sum += s[i];
    }
    return (float)sum;
}

static void scale_generic(float *s, int len, float a)
{
    for (int i = 0; i < len; i++) s[i] *= a;
}

static void swiglu_generic(float *gate, const float *up, long len)
{
    for (long i = 0; i < len; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

static const oe_kernels k_generic = {softmax_exp_generic, scale_generic, swiglu_generic};

const oe_kernels *oe_kernels_generic(void) { return &k_generic; }

const oe_kernels *oe_kernels_get(void)
{
    /* OE_GENERIC=1 forces the libm path (to compare the two). */
    if (getenv("OE_GENERIC")) return &k_generic;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && oe_kernels_avx2())
        return oe_kernels_avx2();
#endif
    return &k_generic;
}
