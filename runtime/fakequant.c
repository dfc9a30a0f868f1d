/* oscar_fakequant: the public entry of fake-quant. Validates the call and the
 * parameters (runtime objects), then runs the format's reference codec
 * (format/fakequant.c). */
#include <stdlib.h>

#include "oscar_internal.h"
#include "oscar_ref.h"

static int method_valid(oscar_method m) { return (int)m >= 0 && m < OSCAR_METHOD_COUNT_; }

/* Fake-quant claims to store rows as the cache does: it refuses, before any
 * row is changed, the rows the cache's append refuses (bf16 overflow; with
 * its F16 metadata, values past 65504: oscar_ref_row_storable) instead of
 * returning clamped ones. R: the calibrated rotation (per head or shared). */
static oscar_status rows_fit(oscar_method m, const float *R, int per_head, int n_tokens, int H, int d,
                             const float *rows) {
    float *had = NULL, y[256];
    if (m == OSCAR_METHOD_QUAROT2 &&
        (!(had = malloc((size_t)d * (size_t)d * sizeof *had)) || oscar_ref_hadamard(d, had))) {
        free(had);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_fakequant: cannot allocate the Hadamard matrix");
    }
    const int calibrated = m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM;
    oscar_status s = OSCAR_OK;
    for (size_t r = 0; r < (size_t)n_tokens * (size_t)H; r++) {
        const size_t head = per_head ? r % (size_t)H : 0;
        const float *Rh = had ? had : (calibrated && R ? R + head * (size_t)d * (size_t)d : NULL);
        if (oscar_ref_row_storable(d, rows + r * (size_t)d, Rh, OSCAR_DTYPE_BF16, m != OSCAR_METHOD_BF16, y))
            continue;
        s = oscar_set_error(OSCAR_ERR_NONFINITE,
                            "oscar_fakequant: token %zu, kv head %zu: %s %s; the cache refuses such a row "
                            "(oscar_append), so no row was quantized: scale the rows down",
                            r / (size_t)H, r % (size_t)H, Rh ? "the rotated row" : "the row",
                            m != OSCAR_METHOD_BF16 ? "exceeds 65504, the range of the F16 scale and min"
                                                   : "overflows bf16");
        break;
    }
    free(had);
    return s;
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
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM, "oscar_fakequant: head_dim %d unsupported; use " OSCAR_HEAD_DIM_RULE,
                               head_dim);
    if (group == 0) group = head_dim;
    if (!oscar_group_supported(group, head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_GROUP,
                               "oscar_fakequant: group %d unsupported for head_dim %d; use " OSCAR_GROUP_RULE
                               " (0 = head_dim; the default is %d)",
                               group, head_dim, oscar_group_default(head_dim));
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
    /* The count must fit a pointer difference: INT_MAX tokens x INT_MAX heads
     * wrapped size_t and indexed a few floats of a huge, unasked range. */
    if ((uint64_t)n_tokens * (uint64_t)num_kv_heads > (uint64_t)PTRDIFF_MAX / sizeof(float) / (uint64_t)head_dim)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_fakequant: n_tokens %d x num_kv_heads %d x head_dim %d floats span more than "
                               "PTRDIFF_MAX bytes; pass fewer tokens per call", n_tokens, num_kv_heads, head_dim);
    size_t n = (size_t)n_tokens * (size_t)num_kv_heads * (size_t)head_dim;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(rows[i]))
            return oscar_set_error(OSCAR_ERR_NONFINITE,
                                   "oscar_fakequant: value %zu (token %zu, kv head %zu) is NaN or Inf; clean the input "
                                   "rows",
                                   i, i / ((size_t)num_kv_heads * head_dim), (i / head_dim) % (size_t)num_kv_heads);

    const float *rot = NULL, *fb = NULL;
    const float *clip = NULL; /* [kv head] with stride 2 (K and V interleaved) */
    const uint8_t *bits = NULL; /* the same layout; NULL: 2 bits everywhere */
    if (calibrated) {
        int r0 = 0;
        rot = p->identity ? NULL : oscar_params_rot_ptr(p, layer, (int)which, r0);
        fb = oscar_params_fb_ptr(p, layer, (int)which, r0);
        clip = oscar_params_clip_ptr(p, layer, 0, (int)which);
        bits = oscar_params_bits_ptr(p, layer, 0, (int)which);
    }
    oscar_status fit = rows_fit(m, rot, calibrated && p->per_head, n_tokens, num_kv_heads, head_dim, rows);
    if (fit != OSCAR_OK) return fit;
    if (oscar_ref_fakequant_rows(m, which == OSCAR_K, group, clip, 2, bits, rot, fb, calibrated && p->per_head, n_tokens,
                                 num_kv_heads, head_dim, rows) != 0)
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_fakequant: cannot allocate the Hadamard matrix");
    return OSCAR_OK;
}
