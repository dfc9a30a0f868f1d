/* The storage format of docs/FORMAT.md in one home: level constants, 16-bit
 * conversions, supported shapes, page geometry and layout validation.
 *
 * Layering: format/ includes only the public header (include/oscar/oscar.h)
 * and its own files. The runtime, every backend, calib, the tests and the
 * generator build on it; none of it may include backends/ (ci/check_layers.py
 * fails the build's tests on a wrong-way include). The GPU plugins link the
 * oscar_format archive statically (hidden symbols), so they still use no
 * liboscar symbol. Internal: not installed, not part of the ABI. */
#ifndef OSCAR_FORMAT_H
#define OSCAR_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "oscar/oscar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------ level constants */
/* Lloyd-Max levels of a unit Gaussian, 4 levels (+-L0, +-L1), and the
 * midpoint threshold between L1 and L0 (FORMAT.md §2.2-§2.3). The generator
 * (gen/oscar_gen.py, format_constants()) reads these three lines: keep the
 * form `#define OSCAR_LM_<NAME> <decimal>f`. */
#define OSCAR_LM_L0 1.5104f
#define OSCAR_LM_L1 0.4528f
#define OSCAR_LM_T 0.9816f

/* Supported shapes (FORMAT.md symbols d, G, P; §3.5). head_dim: every multiple of 16 from 32 to 256
 * (rows of d/4 code bytes stay 4-byte aligned, d/8 plane bytes 2-byte aligned; the spreading matrix of
 * §1 exists for each). Group: a multiple of 16, at least 32, dividing d (16-value code words). The
 * CPU backend and the OpenCL plugin run every such shape; the CUDA and HIP plugins run the shapes
 * their generated variant set holds (gen/variants.json; the default: every head_dim, groups 32, 64,
 * 128 at 64, 128, 256 and the default group below elsewhere) and refuse the others at plan creation. The two rules below are also spelled as text (messages). */
#define OSCAR_HEAD_DIM_RULE "a multiple of 16 from 32 to 256"
#define OSCAR_GROUP_RULE "a multiple of 16, at least 32, dividing head_dim"
static inline int oscar_head_dim_supported(int d) { return d >= 32 && d <= 256 && d % 16 == 0; }
static inline int oscar_group_supported(int g, int d) {
    return oscar_head_dim_supported(d) && g >= 32 && g % 16 == 0 && d % g == 0;
}
/* Default group of a head_dim (calibration, parameter files without one, tools): the whole head up to
 * 128 (one scale and bias per row), else half the head when that is a group (256 -> 128, 160 -> 80,
 * 192 -> 96, 224 -> 112), else the whole head (144, 176, 208, 240). 0 for an unsupported d. */
static inline int oscar_group_default(int d) {
    if (!oscar_head_dim_supported(d)) return 0;
    if (d <= 128) return d;
    return oscar_group_supported(d / 2, d) ? d / 2 : d;
}
static inline int oscar_page_size_supported(int p) { return p == 16 || p == 32 || p == 64 || p == 128; }
/* Methods with a paged cache (the others are evaluation-only, oscar_fakequant). */
static inline int oscar_method_paged(oscar_method m) {
    return m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM || m == OSCAR_METHOD_INT2 ||
           m == OSCAR_METHOD_QUAROT2 || m == OSCAR_METHOD_BF16;
}
/* Name of a method as the parameter files and tools spell it ("oscar2",
 * "oscar2-lm", "int2", "quarot2", "bf16", "int4", "int8", "kivi2"), or
 * "unknown" (the table behind oscar_method_name). */
const char *oscar_format_method_name(oscar_method m);
/* Largest sink and recent window a layout may ask for. */
#define OSCAR_WINDOW_MAX 65536
/* Largest num_q_heads a layout may ask for. */
#define OSCAR_Q_HEADS_MAX 1024

/* ------------------------------------------------------- 16-bit floats */
static inline float oscar_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t oscar_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float oscar_bf16_to_f32(uint16_t h) { return oscar_bits_to_f32((uint32_t)h << 16); }
/* Round to nearest, ties to even; NaN stays a (quiet) NaN. */
static inline uint16_t oscar_f32_to_bf16(float f) {
    uint32_t u = oscar_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* IEEE half -> fp32, exact, inline so the decode inner loops avoid a call per
 * element. NaN stays a quiet NaN. */
static inline float oscar_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    if (e == 31) return oscar_bits_to_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    return oscar_bits_to_f32(sign | ((e + 112u) << 23) | (m << 13));
}
/* fp32 -> IEEE half, round to nearest even, overflow to Inf (format/f16.c). */
uint16_t oscar_f32_to_f16(float f);
/* Rounds f through the given 16-bit type (identity for F32). */
static inline float oscar_round_to(oscar_dtype t, float f) {
    if (t == OSCAR_DTYPE_BF16) return oscar_bf16_to_f32(oscar_f32_to_bf16(f));
    if (t == OSCAR_DTYPE_F16) return oscar_f16_to_f32(oscar_f32_to_f16(f));
    return f;
}
static inline size_t oscar_dtype_size(oscar_dtype t) { return t == OSCAR_DTYPE_F32 ? 4u : 2u; }
/* Loads element i of an array of dtype t as fp32. */
static inline float oscar_load(oscar_dtype t, const void *p, size_t i) {
    if (t == OSCAR_DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == OSCAR_DTYPE_BF16 ? oscar_bf16_to_f32(h) : oscar_f16_to_f32(h);
}
static inline void oscar_store(oscar_dtype t, void *p, size_t i, float f) {
    if (t == OSCAR_DTYPE_F32)
        ((float *)p)[i] = f;
    else
        ((uint16_t *)p)[i] = t == OSCAR_DTYPE_BF16 ? oscar_f32_to_bf16(f) : oscar_f32_to_f16(f);
}

/* ----------------------------------------------------- layout and pages */
/* Checks the shape fields of a layout against what the format defines
 * (head_dim, group, heads, page size, windows, dtypes, method with a paged
 * cache). struct_size is the ABI's business (runtime/layout.c), not checked
 * here. Returns OSCAR_OK, or the error with a message naming the problem and
 * the fix written to msg (msg_len bytes, may be 0). */
oscar_status oscar_format_check_layout(const oscar_layout_desc *l, char *msg, size_t msg_len);

/* Byte geometry of one page (FORMAT.md §3.3) and one window slot (§3.2) of a
 * layout that passed oscar_format_check_layout. For the BF16 method (§3.4)
 * k_codes / v_codes are the K and V [H][P][d] 16-bit arrays,
 * codes_row_bytes = d * sizeof(kv_dtype), there is no metadata, ng = 1
 * (the whole row) and no window slot. */
typedef struct oscar_page_geom {
    int d, group, ng, H, P;
    size_t codes_row_bytes; /* d/4 */
    size_t meta_row_bytes;  /* ng * 2 * sizeof(meta) */
    size_t k_codes, v_codes, k_meta, v_meta, page_bytes;
    /* Code widths (§2.7): wide 1-bit planes of P rows x hi_row_bytes (d/8) each, the first at hi
     * (the end of the V metadata); plane j at hi + j * P * hi_row_bytes. wide 0: none. */
    int wide;
    size_t hi, hi_row_bytes;
    size_t window_slot_bytes; /* 2 * H * (S0 + W) * d * sizeof(kv_dtype); 0 for BF16 */
} oscar_page_geom;
void oscar_page_geom_init(const oscar_layout_desc *l, oscar_page_geom *g);

/* The 1-bit plane of every head-tensor (§2.7), one home for every backend: code_bits is
 * [num_layers][H][2] (K, V) of 2 or 3; out (caller's, same shape) gets, for each 3, its plane index
 * within its layer in (KV head, K/V) order, and -1 for each 2. Returns OSCAR_OK, or with a message in msg
 * (msg_len bytes, may be 0): OSCAR_ERR_UNSUPPORTED for a method other than oscar2,
 * OSCAR_ERR_INVALID_ARGUMENT for a width other than 2 or 3, OSCAR_ERR_SHAPE_MISMATCH for a layer with more
 * 3s than l->wide_tensors. */
oscar_status oscar_format_planes(const oscar_layout_desc *l, int num_layers, const uint8_t *code_bits, int32_t *out,
                                 char *msg, size_t msg_len);

/* 1-bit planes in the pages of `layer` (§3.3), the one rule every backend and the runtime use:
 * l->wide_tensors when wide_per_layer is 0 (one page size for all layers) or layer < 0 (the largest
 * page any layer may have); with wide_per_layer 1 the count of 3s in the layer's row of code_bits
 * ([num_layers][H][2], as oscar_format_planes; NULL: no 3s, 0). 0 for methods other than oscar2. The
 * caller checks layer < num_layers. */
int oscar_format_layer_planes(const oscar_layout_desc *l, const uint8_t *code_bits, int layer);
/* page_bytes of `layer`: the 2-bit page (oscar_page_geom.hi) plus its planes' P * d/8 bytes each;
 * oscar_page_geom.page_bytes for other methods. The offsets inside a page are the same for all layers. */
size_t oscar_format_layer_page_bytes(const oscar_layout_desc *l, const uint8_t *code_bits, int layer);

/* Tokens of a sequence of L that live in the page pool (FORMAT.md §3.1, §3.4). */
static inline int64_t oscar_paged_tokens(const oscar_layout_desc *l, int64_t L) {
    if (l->method == OSCAR_METHOD_BF16) return L;
    int64_t q = L - l->sink - l->recent;
    return q > 0 ? q : 0;
}
/* Pages a sequence of L tokens needs: ceil(paged tokens / P). */
static inline int64_t oscar_pages_for(const oscar_layout_desc *l, int64_t L) {
    const int64_t n = oscar_paged_tokens(l, L); /* no n + P - 1: L may be INT64_MAX (public API) */
    return n / l->page_size + (n % l->page_size != 0);
}

#ifdef __cplusplus
}
#endif
#endif /* OSCAR_FORMAT_H */
