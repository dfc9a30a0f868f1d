/* Fake-quant: quantize-dequantize rows on the host exactly as the cache
 * stores them, for evaluating every method (including the evaluation-only
 * INT4/INT8/KIVI2 baselines), and oscar_method_bits. The public
 * oscar_fakequant (runtime/fakequant.c) validates its arguments and the
 * parameters, then calls oscar_ref_fakequant_rows. */
#include <math.h>
#include <stdlib.h>

#include "oscar_ref.h"

static int method_valid(oscar_method m) { return (int)m >= 0 && m < OSCAR_METHOD_COUNT_; }

double oscar_method_bits(oscar_method m, int head_dim, int group, oscar_dtype meta_dtype) {
    if (!method_valid(m) || !oscar_head_dim_supported(head_dim)) return 0.0;
    if (group == 0) group = head_dim;
    if (!oscar_group_supported(group, head_dim)) return 0.0;
    /* Scale and bias are F16 or F32 (oscar_layout_desc.meta_dtype); any other value
     * was counted as 16 bits, a plausible figure for a layout no backend accepts. */
    if (meta_dtype != OSCAR_DTYPE_F16 && meta_dtype != OSCAR_DTYPE_F32) return 0.0;
    double meta_bits = 2.0 * 8.0 * (double)oscar_dtype_size(meta_dtype); /* scale + bias */
    switch (m) {
    case OSCAR_METHOD_BF16: return 16.0;
    case OSCAR_METHOD_INT4: return 4.0 + meta_bits / group;
    case OSCAR_METHOD_INT8: return 8.0 + meta_bits / group;
    /* K per channel over 32 tokens, V per token over `group` channels. */
    case OSCAR_METHOD_KIVI2: return 0.5 * ((2.0 + meta_bits / 32.0) + (2.0 + meta_bits / group));
    default: return 2.0 + meta_bits / group;
    }
}

/* KIVI keys: per channel over consecutive groups of 32 tokens, asymmetric
 * 2-bit, fp16 scale/bias per (channel, token group). */
static void kivi_keys(int n_tokens, int H, int d, float *rows) {
    float col[32];
    size_t tstride = (size_t)H * d;
    for (int t0 = 0; t0 < n_tokens; t0 += 32)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < d; j++) {
                float *base = rows + (size_t)t0 * tstride + (size_t)h * d + j;
                for (int t = 0; t < 32; t++) col[t] = base[(size_t)t * tstride];
                oscar_ref_fakequant_uniform(32, 32, 2, col);
                for (int t = 0; t < 32; t++) base[(size_t)t * tstride] = col[t];
            }
}

int oscar_ref_fakequant_rows(oscar_method m, int is_k, int group, const float *clip, int clip_stride,
                             const uint8_t *bits, const float *rot, const float *fb, int per_head, int n_tokens,
                             int num_kv_heads, int head_dim, float *rows) {
    size_t n = (size_t)n_tokens * (size_t)num_kv_heads * (size_t)head_dim;
    /* The cache stores rows in kv_dtype: every method starts from the bf16 row
     * (the rotated row for rotating methods). */
    int d = head_dim;
    if (m == OSCAR_METHOD_BF16 || m == OSCAR_METHOD_INT2 || m == OSCAR_METHOD_INT4 || m == OSCAR_METHOD_INT8 ||
        m == OSCAR_METHOD_KIVI2) {
        for (size_t i = 0; i < n; i++) rows[i] = oscar_round_to(OSCAR_DTYPE_BF16, rows[i]);
        if (m == OSCAR_METHOD_BF16) return 0;
        if (m == OSCAR_METHOD_KIVI2 && is_k) {
            kivi_keys(n_tokens, num_kv_heads, d, rows);
            return 0;
        }
        int bits = m == OSCAR_METHOD_INT4 ? 4 : (m == OSCAR_METHOD_INT8 ? 8 : 2);
        for (size_t r = 0; r < n / (size_t)d; r++) oscar_ref_fakequant_uniform(d, group, bits, rows + r * d);
        return 0;
    }

    /* Rotating 2-bit methods: OSCAR2, OSCAR2_LM (rot/fb given), QUAROT2 (Hadamard). */
    int calibrated = m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM;
    float *H = NULL;
    if (m == OSCAR_METHOD_QUAROT2) {
        H = malloc((size_t)d * d * sizeof *H);
        if (!H) return -1;
        oscar_ref_hadamard(d, H);
    }
    int lm = m == OSCAR_METHOD_OSCAR2_LM;
    size_t dd = (size_t)d * (size_t)d;
    /* A head's rows FQ_BLOCK tokens at a time, so oscar_ref_quantize_rows_wide codes them side by
     * side (the same codes as one row at a time, bit for bit; faster with error feedback). */
    enum { FQ_BLOCK = 32 };
    float *xr = malloc((size_t)FQ_BLOCK * (size_t)d * sizeof *xr), deq[256], meta[FQ_BLOCK * 16];
    /* R^T: oscar_ref_rotate(y, R^T) sums y[j] R[i][j] in j order for every i, exactly what
     * oscar_ref_unrotate(y, R) sums, but over eight outputs at a time. */
    float *Rt = malloc(dd * sizeof *Rt);
    uint8_t codes[FQ_BLOCK * 64], hi[FQ_BLOCK * 32];
    if (!xr || !Rt) {
        free(xr);
        free(Rt);
        free(H);
        return -1;
    }
    const size_t mb = 2 * (size_t)(d / group);
    for (int h = 0; h < num_kv_heads; h++) {
        size_t r = per_head ? (size_t)h : 0;
        const float *R = calibrated ? (rot ? rot + r * dd : NULL) : H;
        const float *F = calibrated && fb ? fb + r * dd : NULL;
        const float c = calibrated && clip ? clip[(size_t)h * (size_t)clip_stride] : 1.0f;
        const int b = calibrated && bits ? bits[(size_t)h * (size_t)clip_stride] : 2;
        if (R)
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++) Rt[(size_t)j * d + i] = R[(size_t)i * d + j];
        for (int t0 = 0; t0 < n_tokens; t0 += FQ_BLOCK) {
            const int nb = n_tokens - t0 < FQ_BLOCK ? n_tokens - t0 : FQ_BLOCK;
            for (int i = 0; i < nb; i++) {
                float *x = xr + (size_t)i * (size_t)d;
                oscar_ref_rotate(d, rows + ((size_t)(t0 + i) * num_kv_heads + h) * d, R, x);
                for (int j = 0; j < d; j++) x[j] = oscar_round_to(OSCAR_DTYPE_BF16, x[j]);
            }
            oscar_ref_quantize_rows_wide(nb, d, group, b, lm, c, NULL, OSCAR_DTYPE_F16, xr, F, codes, hi, meta);
            for (int i = 0; i < nb; i++) {
                oscar_ref_dequantize_row_wide(d, group, b, lm, codes + (size_t)i * (size_t)d / 4,
                                              hi + (size_t)i * (size_t)d / 8, meta + (size_t)i * mb, deq);
                oscar_ref_rotate(d, deq, R ? Rt : NULL, rows + ((size_t)(t0 + i) * num_kv_heads + h) * d);
            }
        }
    }
    free(xr);
    free(Rt);
    free(H);
    return 0;
}
