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
    float xr[256], deq[256], meta[16];
    uint8_t codes[64], hi[32];
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < num_kv_heads; h++) {
            float *row = rows + ((size_t)t * num_kv_heads + h) * d;
            size_t r = per_head ? (size_t)h : 0;
            const float *R = calibrated ? (rot ? rot + r * dd : NULL) : H;
            oscar_ref_rotate(d, row, R, xr);
            for (int j = 0; j < d; j++) xr[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
            const float *F = calibrated && fb ? fb + r * dd : NULL;
            const float c = calibrated && clip ? clip[(size_t)h * (size_t)clip_stride] : 1.0f;
            const int b = calibrated && bits ? bits[(size_t)h * (size_t)clip_stride] : 2;
            oscar_ref_quantize_row_wide(d, group, b, lm, c, OSCAR_DTYPE_F16, xr, F, codes, hi, meta);
            oscar_ref_dequantize_row_wide(d, group, b, lm, codes, hi, meta, deq);
            oscar_ref_unrotate(d, deq, R, row);
        }
    free(H);
    return 0;
}
