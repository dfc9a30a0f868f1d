/* Cache layout: the public entry points. The caller's struct is read through
 * oscar_layout_import (struct_size of any version, runtime/abi.c); the checks
 * and sizes themselves are the format's (format/layout.c). */
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

int32_t oscar_layout_default_group(int32_t head_dim) { return oscar_group_default(head_dim); }

oscar_status oscar_layout_validate(const oscar_layout_desc *d) {
    oscar_clear_error();
    oscar_layout_desc l;
    return oscar_layout_import(d, &l);
}

oscar_status oscar_layout_sizes_get(const oscar_layout_desc *in, oscar_layout_sizes *out) {
    oscar_clear_error();
    oscar_layout_desc l, *d = &l; /* the caller's struct may be an older, smaller one */
    oscar_status s = oscar_layout_import(in, &l);
    if (s != OSCAR_OK) return s;
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_layout_sizes_get: NULL output");
    /* the largest page: wide_tensors planes, which every layer's pages fit (§3.3) */
    oscar_layout_sizes_fill(d, NULL, -1, out);
    return OSCAR_OK;
}

void oscar_layout_sizes_fill(const oscar_layout_desc *d, const uint8_t *code_bits, int layer, oscar_layout_sizes *out) {
    memset(out, 0, sizeof *out);
    oscar_page_geom g;
    oscar_page_geom_init(d, &g);
    const int planes = oscar_format_layer_planes(d, code_bits, layer);
    out->k_codes_offset = g.k_codes;
    out->v_codes_offset = g.v_codes;
    out->k_meta_offset = g.k_meta;
    out->v_meta_offset = g.v_meta;
    out->page_bytes = oscar_format_layer_page_bytes(d, code_bits, layer);
    out->window_slot_bytes = g.window_slot_bytes;
    out->bits_per_element = d->method == OSCAR_METHOD_BF16
                                ? 8.0 * (double)oscar_dtype_size(d->kv_dtype)
                                : oscar_method_bits(d->method, d->head_dim, d->group, d->meta_dtype) +
                                      (double)planes / (2.0 * (double)g.H); /* 1-bit planes (§2.7) */
}

oscar_status oscar_layout_pages_for(const oscar_layout_desc *in, int64_t seq_len, int64_t *pages) {
    oscar_clear_error();
    oscar_layout_desc l, *d = &l;
    oscar_status s = oscar_layout_import(in, &l);
    if (s != OSCAR_OK) return s;
    if (!pages || seq_len < 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_layout_pages_for: NULL output or negative length");
    *pages = oscar_pages_for(d, seq_len);
    return OSCAR_OK;
}

oscar_status oscar_layout_bits_per_element(const oscar_layout_desc *in, int64_t seq_len, double *bits) {
    oscar_layout_sizes sz;
    oscar_status s = oscar_layout_sizes_get(in, &sz);
    if (s != OSCAR_OK) return s;
    oscar_layout_desc l, *d = &l;
    oscar_layout_import(in, &l); /* passed just above */
    if (!bits || seq_len <= 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_layout_bits_per_element: NULL output or non-positive length");
    int64_t q = oscar_paged_tokens(d, seq_len);
    int64_t w = seq_len - q; /* tokens in 16-bit windows */
    double kvbits = 8.0 * (double)oscar_dtype_size(d->kv_dtype);
    *bits = ((double)q * sz.bits_per_element + (double)w * kvbits) / (double)seq_len;
    return OSCAR_OK;
}
