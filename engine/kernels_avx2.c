/* AVX2+FMA kernels; this file alone is compiled with -mavx2 -mfma and only
 * called after a CPU check. exp: Cody-Waite reduction to |r| <= ln2/2 and a
 * degree-6 polynomial (relative error ~2e-7, far below what softmax needs). */
#include <math.h>
#include <stddef.h>

#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 exp256(__m256 x)
{
    const __m256 magic = _mm256_set1_ps(12582912.0f); /* 1.5 * 2^23: rounds to an integer */
    /* the bound first: max/min return their second operand when either is NaN, so a NaN score stays
     * NaN (clamped, it became a zero softmax weight and NaN activations gave finite, wrong logits) */
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504089f), magic);
    __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static float hsum(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

static float hmax(__m256 v)
{
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

static float softmax_exp_avx2(float *s, int len)
{
    int i = 0;
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= len; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + i));
    float mx = hmax(vm);
    for (; i < len; i++)
        if (s[i] > mx) mx = s[i];
    __m256 vmx = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    for (i = 0; i + 8 <= len; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmx));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    if (i < len) { /* tail through the same exp, padded with -inf -> 0 */
        float tmp[8];
        for (int j = 0; j < 8; j++) tmp[j] = i + j < len ? s[i + j] - mx : -INFINITY;
        _mm256_storeu_ps(tmp, exp256(_mm256_loadu_ps(tmp)));
        for (int j = 0; i + j < len; j++) {
            s[i + j] = tmp[j];
            sum += tmp[j];
        }
    }
    return sum;
}

static void scale_avx2(float *s, int len, float a)
{
    int i = 0;
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), va));
    for (; i < len; i++) s[i] *= a;
}

static void swiglu_avx2(float *gate, const float *up, long len)
{
    long i = 0;
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= len; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
    }
    for (; i < len; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static const oe_kernels k_avx2 = {softmax_exp_avx2, scale_avx2, swiglu_avx2};

const oe_kernels *oe_kernels_avx2(void) { return &k_avx2; }
#else
const oe_kernels *oe_kernels_avx2(void) { return NULL; }
#endif
