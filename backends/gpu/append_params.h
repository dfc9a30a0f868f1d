/* Arguments of the one-launch write path (templates/append.jinja,
 * oscar_append1*, CUDA and HIP), one struct passed by value and shared by the
 * host (gpu_core.c) and the generated kernels, as decode_tc_params.h does.
 * Plain C, fixed-width fields only: the layout is the same in C and C++. */
#ifndef OSCAR_APPEND_PARAMS_H
#define OSCAR_APPEND_PARAMS_H

#include <stdint.h>

typedef struct oscar_append1_params {
    const unsigned char *k, *v;   /* new rows [total_new][H][d], kv_dtype */
    unsigned char *pages, *windows;
    const int32_t *bt, *lens, *slots, *cu_new;
    unsigned char *ws;            /* workspace: the device error word */
    const float *rot_k, *rot_v;   /* rotations (unused with identity) */
    const float *fb_k, *fb_v;     /* error-feedback weights, NULL: nearest */
    int64_t kv_stride, rot_off, page_bytes, slot_bytes, kc_off, vc_off, km_off, vm_off;
    int32_t total_new, nseq, num_rot, identity, lm;
    const float *clip_k, *clip_v; /* device [layers][kv heads] clip ratios */
    int32_t clip_off;             /* the layer's row: layer * kv heads */
    int32_t num_pages, num_slots, bt_stride, H, lp, S0, W, max_len;
    /* 3-bit head-tensors (FORMAT.md §2.7; block-wide kernels only): planes[plane_off + 2 h + kv] is the
     * 1-bit plane index of (layer, KV head h, K/V) or -1, read only when wide; hi_off: the first
     * plane's offset in a page. */
    const int32_t *planes;
    int32_t plane_off, wide;
    int64_t hi_off;
} oscar_append1_params;

#endif
