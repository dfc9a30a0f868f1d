/* Cache layout: validation and the sizes of docs/FORMAT.md §3. */
#include "oscar_internal.h"

void oscar_layout_default(oscar_layout_desc *d) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->head_dim = 128;
    d->group = 128;
    d->num_q_heads = 32;
    d->num_kv_heads = 8;
    d->page_size = 64;
    d->sink = 64;
    d->recent = 256;
    d->max_seq_len = 131072;
    d->kv_dtype = OSCAR_DTYPE_BF16;
    d->meta_dtype = OSCAR_DTYPE_F16;
    d->method = OSCAR_METHOD_OSCAR2;
}

oscar_status oscar_layout_validate(const oscar_layout_desc *d) {
    oscar_clear_error();
    if (!d) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: NULL descriptor");
    if (d->struct_size != sizeof *d)
        return oscar_set_error(OSCAR_ERR_VERSION,
                               "layout: struct_size %u but this library expects %zu; start from "
                               "oscar_layout_default() and rebuild against this header",
                               d->struct_size, sizeof *d);
    if (!oscar_head_dim_supported(d->head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM,
                               "layout: head_dim %d is not supported; use 64, 128 or 256 (a new head_dim needs a "
                               "generated kernel variant, see docs/CODEGEN.md)",
                               d->head_dim);
    if (!oscar_group_supported(d->group, d->head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_GROUP,
                               "layout: group %d is not supported for head_dim %d; use 32, 64 or 128 dividing "
                               "head_dim",
                               d->group, d->head_dim);
    if (d->num_q_heads <= 0 || d->num_kv_heads <= 0 || d->num_q_heads % d->num_kv_heads != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "layout: num_q_heads %d must be a positive multiple of num_kv_heads %d",
                               d->num_q_heads, d->num_kv_heads);
    if (d->num_q_heads > 1024)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: num_q_heads %d exceeds 1024", d->num_q_heads);
    if (d->page_size != 16 && d->page_size != 32 && d->page_size != 64 && d->page_size != 128)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: page_size %d must be 16, 32, 64 or 128",
                               d->page_size);
    if (d->sink < 0 || d->recent < 0 || d->sink > 65536 || d->recent > 65536)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "layout: sink %d and recent %d must be in [0, 65536]", d->sink, d->recent);
    if (d->max_seq_len <= 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: max_seq_len %d must be positive",
                               d->max_seq_len);
    if (d->kv_dtype != OSCAR_DTYPE_BF16 && d->kv_dtype != OSCAR_DTYPE_F16)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: kv_dtype must be OSCAR_DTYPE_BF16 or F16");
    if (d->meta_dtype != OSCAR_DTYPE_F16 && d->meta_dtype != OSCAR_DTYPE_F32)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: meta_dtype must be OSCAR_DTYPE_F16 or F32");
    switch (d->method) {
    case OSCAR_METHOD_OSCAR2:
    case OSCAR_METHOD_OSCAR2_LM:
    case OSCAR_METHOD_INT2:
    case OSCAR_METHOD_QUAROT2:
    case OSCAR_METHOD_BF16: break;
    default:
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED,
                               "layout: method %s is evaluation-only (oscar_fakequant); a paged cache supports "
                               "oscar2, oscar2-lm, int2, quarot2 and bf16",
                               oscar_method_name(d->method));
    }
    return OSCAR_OK;
}

oscar_status oscar_layout_sizes_get(const oscar_layout_desc *d, oscar_layout_sizes *out) {
    oscar_status s = oscar_layout_validate(d);
    if (s != OSCAR_OK) return s;
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_layout_sizes_get: NULL output");
    memset(out, 0, sizeof *out);
    size_t H = (size_t)d->num_kv_heads, P = (size_t)d->page_size, D = (size_t)d->head_dim;
    size_t kvs = oscar_dtype_size(d->kv_dtype);
    if (d->method == OSCAR_METHOD_BF16) {
        out->k_codes_offset = 0;
        out->v_codes_offset = H * P * D * kvs;
        out->k_meta_offset = out->v_meta_offset = 2 * H * P * D * kvs;
        out->page_bytes = 2 * H * P * D * kvs;
        out->window_slot_bytes = 0;
        out->bits_per_element = 8.0 * (double)kvs;
        return OSCAR_OK;
    }
    size_t ng = D / (size_t)d->group, ms = oscar_dtype_size(d->meta_dtype);
    size_t codes = H * P * D / 4, meta = H * P * ng * 2 * ms;
    out->k_codes_offset = 0;
    out->v_codes_offset = codes;
    out->k_meta_offset = 2 * codes;
    out->v_meta_offset = 2 * codes + meta;
    out->page_bytes = 2 * codes + 2 * meta;
    out->window_slot_bytes = 2 * H * (size_t)(d->sink + d->recent) * D * kvs;
    out->bits_per_element = oscar_method_bits(d->method, d->head_dim, d->group, d->meta_dtype);
    return OSCAR_OK;
}

/* Tokens of a sequence of L that live in the paged pool. */
static int64_t paged_tokens(const oscar_layout_desc *d, int64_t L) {
    if (d->method == OSCAR_METHOD_BF16) return L;
    int64_t q = L - d->sink - d->recent;
    return q > 0 ? q : 0;
}

oscar_status oscar_layout_pages_for(const oscar_layout_desc *d, int64_t seq_len, int64_t *pages) {
    oscar_status s = oscar_layout_validate(d);
    if (s != OSCAR_OK) return s;
    if (!pages || seq_len < 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_layout_pages_for: NULL output or negative length");
    *pages = (paged_tokens(d, seq_len) + d->page_size - 1) / d->page_size;
    return OSCAR_OK;
}

oscar_status oscar_layout_bits_per_element(const oscar_layout_desc *d, int64_t seq_len, double *bits) {
    oscar_layout_sizes sz;
    oscar_status s = oscar_layout_sizes_get(d, &sz);
    if (s != OSCAR_OK) return s;
    if (!bits || seq_len <= 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_layout_bits_per_element: NULL output or non-positive length");
    int64_t q = paged_tokens(d, seq_len);
    int64_t w = seq_len - q; /* tokens in 16-bit windows */
    double kvbits = 8.0 * (double)oscar_dtype_size(d->kv_dtype);
    *bits = ((double)q * sz.bits_per_element + (double)w * kvbits) / (double)seq_len;
    return OSCAR_OK;
}
