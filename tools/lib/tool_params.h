/* Whether a parameter set serves a cache at a quant group: the tools that
 * quantize with parameters (oscar-eval, oscar-copy-probe) ask it before their
 * work, so that clips fitted for one group are never used, or reported, as
 * another's. Header-only, over the public API. */
#ifndef OSCAR_TOOL_PARAMS_H
#define OSCAR_TOOL_PARAMS_H

#include <stdio.h>

#include "oscar/oscar.h"

/* oscar_plan_create's rule (its home), asked of a CPU plan of a head_dim x group layout with the
 * parameters' heads: OSCAR_OK, or its status with its message in why (OSCAR_ERR_SHAPE_MISMATCH: the
 * clips were fitted for another group). */
static inline oscar_status tool_params_serve_group(const oscar_params *p, int head_dim, int group, char *why,
                                                   size_t n) {
    oscar_params_info info;
    oscar_status s = oscar_params_get_info(p, &info);
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cpu";
    oscar_runtime *rt = NULL;
    oscar_plan *plan = NULL;
    if (s == OSCAR_OK) s = oscar_runtime_create(&ro, &rt);
    if (s == OSCAR_OK) {
        oscar_layout_desc l;
        oscar_layout_default(&l);
        l.head_dim = head_dim;
        l.group = group;
        l.num_q_heads = info.num_q_heads;
        l.num_kv_heads = info.num_kv_heads;
        l.wide_tensors = 2 * info.num_kv_heads; /* room for any code widths the file has */
        s = oscar_plan_create(rt, &l, p, &plan);
    }
    if (s != OSCAR_OK && snprintf(why, n, "%s", oscar_last_error()) < 0 && n > 0) why[0] = '\0';
    oscar_plan_destroy(plan);
    oscar_runtime_destroy(rt);
    return s;
}

/* Code width of one head-tensor as a cache (and oscar_fakequant) stores it with these parameters:
 * 3 for the file's 3-bit head-tensors (FORMAT.md §2.7; oscar2 parameters only), else 2; 2 without
 * parameters. */
static inline int tool_params_code_bits(const oscar_params *p, int layer, int kv_head, oscar_kv which) {
    int b = 2;
    if (!p || oscar_params_code_bits(p, layer, kv_head, which, &b) != OSCAR_OK) return 2;
    return b;
}

/* 3-bit head-tensors (code_bits 3, FORMAT.md §2.7) of a parameter set, of *total = 2 L Hkv head-tensors
 * (oscar-eval's bits per element, oscar-calibrate's summary); 0 without parameters. */
static inline int tool_params_wide_count(const oscar_params *p, int *total) {
    oscar_params_info in;
    *total = 0;
    if (!p || oscar_params_get_info(p, &in) != OSCAR_OK) return 0;
    int n3 = 0;
    for (int l = 0; l < in.num_layers; l++)
        for (int h = 0; h < in.num_kv_heads; h++)
            for (int w = 0; w < 2; w++) n3 += tool_params_code_bits(p, l, h, (oscar_kv)w) == 3;
    *total = 2 * in.num_layers * in.num_kv_heads;
    return n3;
}

/* Bits per element of the quantized region that method m stores with these parameters at a head_dim
 * and group (fp16 metadata): oscar_method_bits, plus for oscar2 the 1-bit plane of each 3-bit
 * head-tensor averaged over all head-tensors (2.25 + 1/32 for one of tiny-qwen3's 32). */
static inline double tool_params_bits(const oscar_params *p, oscar_method m, int head_dim, int group) {
    int n = 0;
    const int n3 = m == OSCAR_METHOD_OSCAR2 ? tool_params_wide_count(p, &n) : 0;
    return oscar_method_bits(m, head_dim, group, OSCAR_DTYPE_F16) + (n ? (double)n3 / n : 0.0);
}

/* What the tools print for the code widths of oscar2 with these parameters: "2-bit", or "2/3-bit"
 * with how many head-tensors are 3-bit ("2/3-bit: 1 of 32 head-tensors in 3 bits"). */
static inline void tool_params_width_label(const oscar_params *p, char *buf, size_t n) {
    int total = 0;
    const int n3 = tool_params_wide_count(p, &total);
    int r = n3 ? snprintf(buf, n, "2/3-bit: %d of %d head-tensors in 3 bits", n3, total) : snprintf(buf, n, "2-bit");
    if (r < 0 && n > 0) buf[0] = '\0';
}

#endif
