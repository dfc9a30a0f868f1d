/* oscar_fakequant / oscar_method_bits: quantize-dequantize rows on the host
 * exactly as the cache stores them, for evaluating every method (including
 * the evaluation-only INT4/INT8/KIVI2 baselines). */
#include <math.h>
#include <stdlib.h>

#include "cpu_ref.h"

static int method_valid(oscar_method m) { return (int)m >= 0 && m < OSCAR_METHOD_COUNT_; }

double oscar_method_bits(oscar_method m, int head_dim, int group, oscar_dtype meta_dtype) {
    if (!method_valid(m) || !oscar_head_dim_supported(head_dim)) return 0.0;
    if (group == 0) group = head_dim;
    if (!oscar_group_supported(group, head_dim)) return 0.0;
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

oscar_status oscar_fakequant(const oscar_params *p, oscar_method m, int layer, oscar_kv which, int group,
                             int n_tokens, int num_kv_heads, int head_dim, float *rows) {
    oscar_clear_error();
    if (!method_valid(m))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_fakequant: unknown method %d; use an oscar_method value",
                               (int)m);
    if (which != OSCAR_K && which != OSCAR_V)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_fakequant: which must be OSCAR_K or OSCAR_V");
    if (!rows) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_fakequant: rows is NULL; pass the rows to quantize");
    if (!oscar_head_dim_supported(head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM, "oscar_fakequant: head_dim %d unsupported; use 64, 128 or 256",
                               head_dim);
    if (group == 0) group = head_dim;
    if (!oscar_group_supported(group, head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_GROUP,
                               "oscar_fakequant: group %d unsupported for head_dim %d; use 32, 64 or 128 dividing "
                               "head_dim (0 = head_dim)",
                               group, head_dim);
    if (n_tokens <= 0)
        return oscar_set_error(OSCAR_ERR_EMPTY, "oscar_fakequant: n_tokens is %d; pass at least one token", n_tokens);
    if (num_kv_heads <= 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_fakequant: num_kv_heads is %d; must be >= 1",
                               num_kv_heads);
    if (m == OSCAR_METHOD_KIVI2 && which == OSCAR_K && n_tokens % 32 != 0)
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "oscar_fakequant: KIVI2 keys are quantized over groups of 32 tokens; n_tokens %d is "
                               "not a multiple of 32 (pad or trim the rows)",
                               n_tokens);
    int calibrated = m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM;
    if (calibrated) {
        if (!p)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                   "oscar_fakequant: %s needs parameters (rotation and clip); pass an oscar_params",
                                   m == OSCAR_METHOD_OSCAR2 ? "oscar2" : "oscar2-lm");
        if (layer < 0)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_fakequant: layer %d is negative", layer);
        if (layer >= p->num_layers || p->head_dim != head_dim || p->num_kv_heads != num_kv_heads)
            return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                                   "oscar_fakequant: parameters are for %d layers, %d KV heads, head_dim %d; the call "
                                   "asks layer %d, %d KV heads, head_dim %d (use parameters calibrated for this model)",
                                   p->num_layers, p->num_kv_heads, p->head_dim, layer, num_kv_heads, head_dim);
    }
    size_t n = (size_t)n_tokens * (size_t)num_kv_heads * (size_t)head_dim;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(rows[i]))
            return oscar_set_error(OSCAR_ERR_NONFINITE,
                                   "oscar_fakequant: value %zu (token %zu, kv head %zu) is NaN or Inf; clean the input "
                                   "rows",
                                   i, i / ((size_t)num_kv_heads * head_dim), (i / head_dim) % (size_t)num_kv_heads);

    /* The cache stores rows in kv_dtype: every method starts from the bf16 row
     * (the rotated row for rotating methods). */
    int d = head_dim;
    if (m == OSCAR_METHOD_BF16 || m == OSCAR_METHOD_INT2 || m == OSCAR_METHOD_INT4 || m == OSCAR_METHOD_INT8 ||
        m == OSCAR_METHOD_KIVI2) {
        for (size_t i = 0; i < n; i++) rows[i] = oscar_round_to(OSCAR_DTYPE_BF16, rows[i]);
        if (m == OSCAR_METHOD_BF16) return OSCAR_OK;
        if (m == OSCAR_METHOD_KIVI2 && which == OSCAR_K) {
            kivi_keys(n_tokens, num_kv_heads, d, rows);
            return OSCAR_OK;
        }
        int bits = m == OSCAR_METHOD_INT4 ? 4 : (m == OSCAR_METHOD_INT8 ? 8 : 2);
        for (size_t r = 0; r < n / (size_t)d; r++) oscar_ref_fakequant_uniform(d, group, bits, rows + r * d);
        return OSCAR_OK;
    }

    /* Rotating 2-bit methods: OSCAR2, OSCAR2_LM (params), QUAROT2 (Hadamard). */
    float *H = NULL;
    if (m == OSCAR_METHOD_QUAROT2) {
        H = malloc((size_t)d * d * sizeof *H);
        if (!H) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_fakequant: cannot allocate the Hadamard matrix");
        oscar_ref_hadamard(d, H);
    }
    float c = calibrated ? p->clip[(size_t)layer * 2 + (size_t)which] : 1.0f;
    int lm = m == OSCAR_METHOD_OSCAR2_LM;
    float xr[256], deq[256], meta[16];
    uint8_t codes[64];
    for (int t = 0; t < n_tokens; t++)
        for (int h = 0; h < num_kv_heads; h++) {
            float *row = rows + ((size_t)t * num_kv_heads + h) * d;
            const float *R = H;
            if (calibrated) R = p->identity ? NULL : oscar_params_rot_ptr(p, layer, (int)which, p->per_head ? h : 0);
            oscar_ref_rotate(d, row, R, xr);
            for (int j = 0; j < d; j++) xr[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
            const float *fb = calibrated ? oscar_params_fb_ptr(p, layer, (int)which, p->per_head ? h : 0) : NULL;
            oscar_ref_quantize_row_fb(d, group, lm, c, OSCAR_DTYPE_F16, xr, fb, codes, meta);
            oscar_ref_dequantize_row(d, group, lm, codes, meta, deq);
            oscar_ref_unrotate(d, deq, R, row);
        }
    free(H);
    return OSCAR_OK;
}
