/* Elementwise hot loops of the forward (softmax rows, SwiGLU), with an
 * AVX2+FMA version chosen at run time; the generic one uses libm. */
#ifndef OSCAR_ENGINE_KERNELS_H
#define OSCAR_ENGINE_KERNELS_H

typedef struct oe_kernels {
    /* s[i] = exp(s[i] - max(s)) for i < len; returns the sum. */
    float (*softmax_exp)(float *s, int len);
    /* s[i] *= a for i < len */
    void (*scale)(float *s, int len, float a);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(float *gate, const float *up, long len);
} oe_kernels;

const oe_kernels *oe_kernels_get(void);
const oe_kernels *oe_kernels_generic(void);
/* NULL when not built for x86-64. */
const oe_kernels *oe_kernels_avx2(void);

#endif
