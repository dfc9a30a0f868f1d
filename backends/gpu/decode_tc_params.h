/* Arguments of the tensor-core decode family (templates/decode_tc.jinja), one
 * struct passed by value, shared by the host (gpu_core.c) and the generated
 * kernels so the compiler checks both sides (no positional argument lists).
 * Plain C, fixed-width fields only: the layout is the same in C and CUDA C++. */
#ifndef OSCAR_DECODE_TC_PARAMS_H
#define OSCAR_DECODE_TC_PARAMS_H

#include <stdint.h>

/* Query rows of one head per block of the long-chunk path's q rotation and merge
 * (extend_fa.jinja oscar_rotate_rows / oscar_merge_rows), each rotation entry read once
 * for all of them. 32 rows were slower than 8 (H100, 512-token chunk at batch 1: rotation
 * 58 us, merge 130 us; the merge walks its rows one after another, a chain of dependent
 * loads per row, in a grid 4x smaller). */
#define OSCAR_FA_ROWS 8

/* 64-token sub-tiles per pipeline stage of the long-chunk kernel at head_dim d (extend_fa.jinja; the
 * host cuts the history in whole stages): two at d <= 64, where a tile's fixed costs weigh as much as
 * at d 128 against half the work; one above, where shared memory would cap residency. */
#define OSCAR_FA_SUB_OF(d) ((d) <= 64 ? 2 : 1)

typedef struct oscar_tc_decode_params {
    const unsigned char *pages;   /* page pool (2-bit pages, or 16-bit pages for the BF16 method) */
    const unsigned char *windows; /* window pool (16-bit sink + recent rows); NULL for BF16 */
    const int32_t *bt, *lens, *slots;
    unsigned char *ws;            /* workspace: error word, q~ (fp32), split partials */
    int64_t qt_off, part_off;     /* byte offsets of q~ and of the partials in ws */
    int64_t page_bytes, slot_bytes, kc_off, vc_off, km_off, vm_off;
    int32_t num_pages, num_slots, bt_stride;
    int32_t H, Hq, gq;            /* KV heads, query heads, query heads per KV head */
    int32_t hchunks;              /* CTAs per KV head along the query heads (gq > capacity) */
    int32_t lp, S0, W, max_len;   /* log2(page size), sink, recent window, plan's max length */
    int32_t ns2, chunk2;          /* splits over the 2-bit history, tokens per split (multiple of 32) */
    int32_t chunk16;              /* 16-bit rows per later split (multiple of 16) */
    int32_t nsplit;               /* ns2 + splits over the 16-bit rows */
    /* Extend (the oscar_extend_tc kernels): cu_q [num_seqs+1] gives sequence s the
     * query rows cu_q[s] .. cu_q[s+1]-1; the MMA columns of a KV head are then (query
     * row, query head) pairs, hchunks CTAs of up to 8 * n_tiles columns each. The
     * oscar_decode kernels: one query row per sequence, these fields unused. */
    const int32_t *cu_q;
    int32_t max_q;                /* the call's max_q_len (a longer sequence is flagged) */
    int32_t total_q, nseq;        /* extend: query rows, sequences (cu_q's checks) */
    /* The BF16 method (no rotation): the caller's q
     * (kv_dtype, q_stride elements per row) read by the kernel and scaled by qscale
     * (sm_scale log2 e), no rotation kernel; NULL: q~ from the workspace. */
    const uint16_t *q;
    int64_t q_stride;
    float qscale;
    /* The W3 kernels (layers with 3-bit head-tensors, FORMAT.md §2.7): planes [layers][H][2]
     * (K, V) gives each head-tensor's 1-bit plane or -1, this layer's row at plane_off; the
     * first plane at hi_off in a page. Unused (may be NULL) by the other kernels. */
    const int32_t *planes;
    int32_t plane_off;
    int64_t hi_off;
    int32_t lp_decode;            /* W3 decode: the plan's 2-bit decode is the limb-packed one */
    int32_t chunk2w;              /* W3: 2-bit tokens per split of a KV head with a plane (0: chunk2) */
    /* W3: a head with a plane has ns2 + ns2x 2-bit splits of chunk2w; the last ns2x run in the grid
     * rows past H x hchunks (hchunks rows per such head, heads ascending) and write partials
     * nsplit .. nsplit + ns2x - 1. pstride: partials per (row, query head), nsplit + ns2x. */
    int32_t ns2x, pstride;
} oscar_tc_decode_params;

/* Arguments of the matching merge kernel (log-sum-exp over all nsplit partials,
 * R_V^T, rounding to kv_dtype). */
typedef struct oscar_tc_merge_params {
    const unsigned char *ws;
    int64_t part_off;
    const int32_t *lens;
    const float *rot_t;           /* transposed V rotations, or NULL with identity */
    int64_t rot_off;
    unsigned char *out;
    int64_t out_stride;
    float *lse;                   /* optional [rows][Hq] natural-log LSE, NULL: not written */
    int32_t nsplit, max_len, num_rot, identity, rotated_output, Hq, H;
    /* W3 layers: the heads with a plane (planes [..][H][2] at plane_off, as the decode's) have
     * ns2x more partials after their nsplit; pstride = nsplit + ns2x (planes NULL: ns2x 0) */
    const int32_t *planes;
    int32_t plane_off, ns2x, pstride;
    /* extend: one block per query row; the row's sequence is found in cu_q [nseq+1] */
    const int32_t *cu_q;
    int32_t ext, nseq, total_q, max_q;
} oscar_tc_merge_params;

#endif
