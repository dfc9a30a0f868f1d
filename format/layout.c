/* Layout validation and page geometry of docs/FORMAT.md §3: the one place
 * that says which layouts exist and where each array of a page lives. The
 * runtime (oscar_layout_validate, oscar_layout_sizes_get), the CPU backend
 * and the GPU plugins' plan creation all call these. */
#include <stdarg.h>
#include <stdio.h>

#include "oscar_format.h"

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static oscar_status fail(oscar_status s, char *msg, size_t n, const char *fmt, ...) {
    if (msg && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, n, fmt, ap);
        va_end(ap);
    }
    return s;
}

static const char *const method_names[OSCAR_METHOD_COUNT_] = {
    [OSCAR_METHOD_OSCAR2] = "oscar2", [OSCAR_METHOD_OSCAR2_LM] = "oscar2-lm", [OSCAR_METHOD_INT2] = "int2",
    [OSCAR_METHOD_QUAROT2] = "quarot2", [OSCAR_METHOD_BF16] = "bf16",        [OSCAR_METHOD_INT4] = "int4",
    [OSCAR_METHOD_INT8] = "int8",       [OSCAR_METHOD_KIVI2] = "kivi2",
};

const char *oscar_format_method_name(oscar_method m) {
    if ((int)m < 0 || m >= OSCAR_METHOD_COUNT_) return "unknown";
    return method_names[m];
}

oscar_status oscar_format_check_layout(const oscar_layout_desc *d, char *msg, size_t n) {
    if (msg && n) msg[0] = '\0';
    if (!d) return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: NULL descriptor");
    if (!oscar_head_dim_supported(d->head_dim))
        return fail(OSCAR_ERR_UNSUPPORTED_HEAD_DIM, msg, n,
                    "layout: head_dim %d is not supported; use " OSCAR_HEAD_DIM_RULE " (docs/FORMAT.md 3.5)",
                    d->head_dim);
    if (!oscar_group_supported(d->group, d->head_dim))
        return fail(OSCAR_ERR_UNSUPPORTED_GROUP, msg, n,
                    "layout: group %d is not supported for head_dim %d; use " OSCAR_GROUP_RULE " (default %d)",
                    d->group, d->head_dim, oscar_group_default(d->head_dim));
    if (d->num_q_heads <= 0)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: num_q_heads %d must be >= 1", d->num_q_heads);
    if (d->num_q_heads > OSCAR_Q_HEADS_MAX)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n,
                    "layout: num_q_heads %d exceeds %d; give each tensor-parallel shard (or group of KV heads) "
                    "its own plan", d->num_q_heads, OSCAR_Q_HEADS_MAX);
    if (d->num_kv_heads <= 0 || d->num_q_heads % d->num_kv_heads != 0) {
        /* The fix is a divisor: name the ones near what was asked. */
        char div[160] = "";
        size_t used = 0;
        for (int k = 1; k <= d->num_q_heads && used + 16 < sizeof div; k++)
            if (d->num_q_heads % k == 0) used += (size_t)snprintf(div + used, sizeof div - used, "%s%d", used ? ", " : "", k);
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n,
                    "layout: num_kv_heads %d must be >= 1 and divide num_q_heads %d (one of %s)", d->num_kv_heads,
                    d->num_q_heads, div);
    }
    if (!oscar_page_size_supported(d->page_size))
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: page_size %d must be 16, 32, 64 or 128",
                    d->page_size);
    if (d->sink < 0 || d->recent < 0 || d->sink > OSCAR_WINDOW_MAX || d->recent > OSCAR_WINDOW_MAX)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: sink %d and recent %d must be in [0, %d]", d->sink,
                    d->recent, OSCAR_WINDOW_MAX);
    if (d->max_seq_len <= 0)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: max_seq_len %d must be positive", d->max_seq_len);
    if (d->kv_dtype != OSCAR_DTYPE_BF16 && d->kv_dtype != OSCAR_DTYPE_F16)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: kv_dtype must be OSCAR_DTYPE_BF16 or F16");
    if (d->meta_dtype != OSCAR_DTYPE_F16 && d->meta_dtype != OSCAR_DTYPE_F32)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n, "layout: meta_dtype must be OSCAR_DTYPE_F16 or F32");
    if (d->wide_tensors < 0 || d->wide_tensors > 2 * d->num_kv_heads)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n,
                    "layout: wide_tensors %d must be in [0, 2 num_kv_heads = %d] (3-bit head-tensors per layer)",
                    d->wide_tensors, 2 * d->num_kv_heads);
    if (d->wide_tensors > 0 && d->method != OSCAR_METHOD_OSCAR2)
        return fail(OSCAR_ERR_UNSUPPORTED, msg, n,
                    "layout: wide_tensors %d needs method oscar2 (3-bit codes have uniform levels); use 0 for %s",
                    d->wide_tensors, oscar_format_method_name(d->method));
    if (d->wide_per_layer != 0 && d->wide_per_layer != 1)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, msg, n,
                    "layout: wide_per_layer %d must be 0 (one page size for every layer) or 1 (each layer's pages "
                    "hold its own 1-bit planes)",
                    d->wide_per_layer);
    if (d->wide_per_layer && d->method != OSCAR_METHOD_OSCAR2)
        return fail(OSCAR_ERR_UNSUPPORTED, msg, n,
                    "layout: wide_per_layer 1 needs method oscar2 (only it stores 3-bit head-tensors); use 0 for %s",
                    oscar_format_method_name(d->method));
    if (!oscar_method_paged(d->method))
        return fail(OSCAR_ERR_UNSUPPORTED, msg, n,
                    "layout: method %s is evaluation-only (oscar_fakequant); a paged cache supports oscar2, "
                    "oscar2-lm, int2, quarot2 and bf16",
                    oscar_format_method_name(d->method));
    return OSCAR_OK;
}

void oscar_page_geom_init(const oscar_layout_desc *l, oscar_page_geom *g) {
    memset(g, 0, sizeof *g);
    g->d = l->head_dim;
    g->H = l->num_kv_heads;
    g->P = l->page_size;
    size_t rows = (size_t)g->H * (size_t)g->P, kvs = oscar_dtype_size(l->kv_dtype);
    if (l->method == OSCAR_METHOD_BF16) {
        g->group = l->head_dim;
        g->ng = 1;
        g->codes_row_bytes = (size_t)g->d * kvs;
        g->meta_row_bytes = 0;
        g->k_codes = 0;
        g->v_codes = rows * g->codes_row_bytes;
        g->k_meta = g->v_meta = g->page_bytes = 2 * rows * g->codes_row_bytes;
        g->window_slot_bytes = 0;
        return;
    }
    g->group = l->group;
    g->ng = l->head_dim / l->group;
    g->codes_row_bytes = (size_t)g->d / 4;
    g->meta_row_bytes = (size_t)g->ng * 2 * oscar_dtype_size(l->meta_dtype);
    g->k_codes = 0;
    g->v_codes = rows * g->codes_row_bytes;
    g->k_meta = 2 * rows * g->codes_row_bytes;
    g->v_meta = g->k_meta + rows * g->meta_row_bytes;
    g->hi = g->v_meta + rows * g->meta_row_bytes;
    g->hi_row_bytes = (size_t)g->d / 8;
    g->wide = l->wide_tensors > 0 ? l->wide_tensors : 0;
    g->page_bytes = g->hi + (size_t)g->wide * (size_t)g->P * g->hi_row_bytes;
    g->window_slot_bytes = 2 * (size_t)g->H * (size_t)(l->sink + l->recent) * (size_t)g->d * kvs;
}

oscar_status oscar_format_planes(const oscar_layout_desc *l, int num_layers, const uint8_t *code_bits, int32_t *out,
                                 char *msg, size_t n) {
    if (l->method != OSCAR_METHOD_OSCAR2) {
        if (msg && n) snprintf(msg, n, "3-bit code widths need method oscar2 (the layout has %s)",
                               oscar_format_method_name(l->method));
        return OSCAR_ERR_UNSUPPORTED;
    }
    const size_t per = 2 * (size_t)l->num_kv_heads;
    for (size_t layer = 0; layer < (size_t)num_layers; layer++) {
        int next = 0;
        for (size_t i = layer * per; i < (layer + 1) * per; i++) {
            const uint8_t b = code_bits[i];
            if ((b != 2 && b != 3) || (b == 3 && next >= l->wide_tensors)) {
                if (msg && n)
                    snprintf(msg, n, "code width %d of layer %zu KV head %zu %c: %s", (int)b, layer,
                             i / 2 % (size_t)l->num_kv_heads, i % 2 ? 'V' : 'K',
                             b == 3 ? "more 3-bit head-tensors than layout.wide_tensors" : "must be 2 or 3");
                return b == 3 ? OSCAR_ERR_SHAPE_MISMATCH : OSCAR_ERR_INVALID_ARGUMENT;
            }
            out[i] = b == 3 ? next++ : -1;
        }
    }
    return OSCAR_OK;
}

int oscar_format_layer_planes(const oscar_layout_desc *l, const uint8_t *code_bits, int layer) {
    if (l->method != OSCAR_METHOD_OSCAR2) return 0;
    if (!l->wide_per_layer || layer < 0) return l->wide_tensors > 0 ? l->wide_tensors : 0;
    if (!code_bits) return 0;
    const size_t per = 2 * (size_t)l->num_kv_heads;
    int n = 0;
    for (size_t i = (size_t)layer * per; i < ((size_t)layer + 1) * per; i++) n += code_bits[i] == 3;
    return n;
}

size_t oscar_format_layer_page_bytes(const oscar_layout_desc *l, const uint8_t *code_bits, int layer) {
    oscar_page_geom g;
    oscar_page_geom_init(l, &g);
    if (l->method != OSCAR_METHOD_OSCAR2) return g.page_bytes;
    return g.hi + (size_t)oscar_format_layer_planes(l, code_bits, layer) * (size_t)g.P * g.hi_row_bytes;
}
