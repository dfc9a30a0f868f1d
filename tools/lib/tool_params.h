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

/* 3-bit head-tensors (code_bits 3, FORMAT.md §2.7) of a parameter set, of *total = 2 L Hkv head-tensors
 * (oscar-eval's bits per element, oscar-calibrate's summary); 0 without parameters. */
static inline int tool_params_wide_count(const oscar_params *p, int *total) {
    oscar_params_info in;
    *total = 0;
    if (!p || oscar_params_get_info(p, &in) != OSCAR_OK) return 0;
    int n3 = 0;
    for (int l = 0; l < in.num_layers; l++)
        for (int h = 0; h < in.num_kv_heads; h++)
            for (int w = 0; w < 2; w++) {
                int b = 2;
                if (oscar_params_code_bits(p, l, h, (oscar_kv)w, &b) == OSCAR_OK && b == 3) n3++;
            }
    *total = 2 * in.num_layers * in.num_kv_heads;
    return n3;
}

#endif
