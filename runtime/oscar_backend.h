/*
 * Backend plugin ABI (version OSCAR_BACKEND_ABI_VERSION).
 *
 * A backend is a shared object (liboscar_backend_NAME.so) exporting
 *     const oscar_backend_api *oscar_backend_entry_v1(void);
 * The runtime dlopen()s it, checks abi_version, asks probe() whether it can
 * run on this machine and with what score, and calls through the table.
 * The CPU reference backend implements the same table and is built in.
 *
 * A plugin must not depend on liboscar's symbols: everything it needs is in
 * this header (inline helpers only). All pointers named "device" follow the
 * conventions of include/oscar/oscar.h. Errors: return a status and write a
 * message naming the problem and the fix into *err.
 */
#ifndef OSCAR_BACKEND_H
#define OSCAR_BACKEND_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "oscar/oscar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct oscar_errbuf {
    char msg[512];
} oscar_errbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline oscar_status oscar_errbuf_set(oscar_errbuf *e, oscar_status s, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return s;
}

/* Everything a backend needs to build a plan; host memory, valid only during
 * plan_create (copy what you keep). */
typedef struct oscar_backend_plan_desc {
    oscar_layout_desc layout;
    int32_t num_layers;
    int32_t num_rot;          /* rotations per layer and K/V: 1, or num_kv_heads if per_head */
    int32_t identity_rotation;/* 1: every R is the identity (INT2, BF16): skip the matmuls */
    const float *rot_k;       /* [num_layers][num_rot][head_dim][head_dim] row-major */
    const float *rot_v;       /* same */
    const float *clip_k;      /* [num_layers][num_kv_heads] clip ratio, 1 = none */
    const float *clip_v;      /* [num_layers][num_kv_heads] */
    /* Error-feedback weights, same layout as rot_k / rot_v (strictly upper
     * triangular, FORMAT.md §2.3), or NULL: round to nearest. */
    const float *fb_k, *fb_v;
    /* Code widths (FORMAT.md §2.7): [num_layers][num_kv_heads][2] (K, V), 2 or 3, or NULL: 2
     * everywhere; layout.wide_tensors is at least each layer's count of 3s. Given only to backends
     * whose caps hold OSCAR_BACKEND_CAP_WIDE_CODES: the runtime refuses such parameters, and layouts
     * with wide_tensors > 0, on every other backend (OSCAR_ERR_UNSUPPORTED). A backend with the
     * capability may still refuse a plan whose kernels cannot read the planes, with
     * OSCAR_ERR_UNSUPPORTED and a message (CUDA: a tensor-core shape built without its generic
     * extend kernels, which its layers with a 3-bit head-tensor run on). With layout.wide_per_layer 1,
     * layer l's pages are oscar_format_layer_page_bytes(&layout, code_bits, l) bytes (format/layout.c):
     * address every call's pool with its layer's. */
    const uint8_t *code_bits;
} oscar_backend_plan_desc;

typedef struct oscar_backend_append_args {
    int32_t layer;
    oscar_cache cache;
    oscar_batch batch;
    const int32_t *cu_new;    /* device [num_seqs+1] */
    int32_t total_new;
    const void *k, *v;        /* device [total_new][num_kv_heads][head_dim] kv_dtype */
    int64_t kv_stride;        /* elements between tokens (already resolved: never 0) */
    void *workspace;
    size_t workspace_bytes;
    void *stream;
} oscar_backend_append_args;

typedef struct oscar_backend_decode_args {
    int32_t layer;
    oscar_cache cache;
    oscar_batch batch;
    const void *q;            /* device [num_seqs][num_q_heads][head_dim] kv_dtype */
    int64_t q_stride;         /* resolved, never 0 */
    void *out;
    int64_t out_stride;       /* resolved, never 0 */
    float sm_scale;           /* resolved, never 0 */
    int32_t rotated_output;
    void *workspace;
    size_t workspace_bytes;
    void *stream;
} oscar_backend_decode_args;

/* Extend attention (oscar_extend; runtime checks done, strides and sm_scale
 * resolved). cu_q NULL: one query per sequence at seq_lens[i]-1 (decode,
 * total_q = num_seqs). */
typedef struct oscar_backend_extend_args {
    int32_t layer;
    oscar_cache cache;
    oscar_batch batch;
    const int32_t *cu_q;      /* device [num_seqs+1] or NULL */
    int32_t total_q, max_q_len;
    const void *q;            /* device [total_q][num_q_heads][head_dim] kv_dtype */
    int64_t q_stride;         /* resolved, never 0 */
    void *out;
    int64_t out_stride;       /* resolved, never 0 */
    float *lse;               /* device [total_q][num_q_heads] fp32 or NULL */
    float sm_scale;           /* resolved, never 0 */
    int32_t rotated_output;
    void *workspace;
    size_t workspace_bytes;
    void *stream;
} oscar_backend_extend_args;

/* A buffer of a call as bytes [a, e) of the allocation root it lives in (the CPU backend: host
 * addresses, root NULL; OpenCL: offsets in a cl_mem or the parent of a sub-buffer). */
typedef struct oscar_span {
    const void *root;
    uintptr_t a, e;
    const char *name;
} oscar_span;
/* Spans of plain addresses (root NULL): the CPU backend's host memory, and CUDA's and HIP's device
 * pointers (one virtual address space). Sizes saturate: no buffer is SIZE_MAX bytes. */
static inline size_t oscar_sat_mul(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }
static inline oscar_span oscar_span_of(const void *ptr, size_t bytes, const char *name) {
    const uintptr_t a = (uintptr_t)ptr; /* integers: the buffers are separate objects, or one arena */
    return (oscar_span){NULL, a, !ptr ? a : bytes > UINTPTR_MAX - a ? UINTPTR_MAX : a + (uintptr_t)bytes, name};
}
/* Bytes of rows tokens stride elements apart, the last one row wide (strides are checked >= row). */
static inline size_t oscar_rows_span(int64_t rows, int64_t stride, int64_t row, size_t es) {
    if (rows < 1) return 0;
    const size_t n = oscar_sat_mul((size_t)(rows - 1), (size_t)stride);
    return n > SIZE_MAX - (size_t)row ? SIZE_MAX : oscar_sat_mul(n + (size_t)row, es);
}
/* The pools and index arrays every call reads, the pools first (*npools of them: an append writes
 * them): the layer's pages (page_bytes each), the windows where the layout has them (windowed), the
 * batch's seq_lens, window_slots and the bt_entries block-table entries it reads from the table's start
 * (the caller's bound: num_seqs x stride was an overlap of gigabytes for a wide pitch). */
static inline int oscar_batch_spans(const oscar_cache *c, const oscar_batch *b, size_t page_bytes, size_t slot_bytes,
                                    int windowed, size_t bt_entries, oscar_span *s, int *npools) {
    const size_t n = b->num_seqs > 0 ? (size_t)b->num_seqs : 0;
    int k = 0;
    if (windowed)
        s[k++] = oscar_span_of(c->windows, oscar_sat_mul((size_t)c->num_window_slots, slot_bytes), "cache.windows");
    if (c->pages) s[k++] = oscar_span_of(c->pages, oscar_sat_mul((size_t)c->num_pages, page_bytes), "cache.pages");
    *npools = k;
    s[k++] = oscar_span_of(b->seq_lens, oscar_sat_mul(n, 4), "seq_lens");
    if (windowed) s[k++] = oscar_span_of(b->window_slots, oscar_sat_mul(n, 4), "window_slots");
    if (c->pages) s[k++] = oscar_span_of(b->block_table, oscar_sat_mul(bt_entries, 4), "block_table");
    return k;
}

/* Of a call's buffers s[0..n) whose first nw the call writes: the first written one that shares bytes
 * with another (its index; *other that one's), or -1. One home for the backends' aliasing checks, which
 * word the refusal. */
static inline int oscar_span_overlap(const oscar_span *s, int nw, int n, int *other) {
    for (int i = 0; i < nw; i++)
        for (int j = 0; j < n; j++)
            if (j != i && (j > i || j >= nw) && s[i].root == s[j].root && s[i].a < s[i].e && s[j].a < s[j].e &&
                s[i].a < s[j].e && s[j].a < s[i].e) {
                *other = j;
                return i;
            }
    return -1;
}
/* The refusal for plain-address spans (who: the call's name as the message starts, e.g. "oscar_decode"
 * or "cuda oscar_decode"). */
static inline oscar_status oscar_refuse_overlap(const oscar_span *s, int nw, int n, const char *who,
                                                oscar_errbuf *err) {
    int j = 0;
    const int i = oscar_span_overlap(s, nw, n, &j);
    if (i < 0) return OSCAR_OK;
    return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                            "%s: %s and %s overlap in memory, and the call writes %s: it would change what it "
                            "reads; nothing was written (give every buffer of a call memory of its own)",
                            who, s[i].name, s[j].name, s[i].name);
}

/* The rules of cu_q (oscar_extend) on host copies of cu_q [nseq+1] and
 * seq_lens [nseq]: one home for the CPU backend and the runtime's validate
 * mode, so both refuse with the same status and message. */
static inline oscar_status oscar_check_cu_q(const int32_t *cu, const int32_t *lens, int nseq, int32_t total_q,
                                            int32_t max_q_len, const char *fn, oscar_errbuf *err) {
    if (cu[0] != 0 || cu[nseq] != total_q)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s: cu_q must start at 0 and end at total_q = %d (got %d .. %d); nothing was written",
                                fn, total_q, cu[0], cu[nseq]);
    for (int i = 0; i < nseq; i++) {
        int64_t n = (int64_t)cu[i + 1] - cu[i];
        if (n < 1)
            return oscar_errbuf_set(err, OSCAR_ERR_EMPTY,
                                    "%s: sequence %d has %lld query tokens (cu_q[%d] = %d, cu_q[%d] = %d); every "
                                    "sequence needs n_i >= 1 (leave it out of the batch otherwise); nothing was written",
                                    fn, i, (long long)n, i, cu[i], i + 1, cu[i + 1]);
        if (n > lens[i] || n > max_q_len)
            return oscar_errbuf_set(err, OSCAR_ERR_TOO_LONG,
                                    "%s: sequence %d has %lld query tokens but seq_lens is %d and max_q_len %d; queries "
                                    "sit at positions seq_lens-n_i .. seq_lens-1, so append them first and keep "
                                    "n_i <= seq_lens[i], max_q_len; nothing was written",
                                    fn, i, (long long)n, lens[i], max_q_len);
    }
    return OSCAR_OK;
}

typedef struct oscar_backend_api {
    uint32_t abi_version; /* OSCAR_BACKEND_ABI_VERSION */
    const char *name;     /* "cpu", "cuda", "hip", "opencl" */
    /* > 0: can run here, higher is preferred (cpu 1, GPUs 100);
     * 0: cannot, with the reason in *why. Must be cheap and side-effect free. */
    int (*probe)(int device_index, oscar_errbuf *why);
    oscar_status (*init)(int device_index, void **ctx, oscar_errbuf *err);
    void (*shutdown)(void *ctx);
    const char *(*device_name)(void *ctx);

    oscar_status (*alloc)(void *ctx, size_t bytes, void **buf, oscar_errbuf *err);
    void (*free)(void *ctx, void *buf);
    oscar_status (*write)(void *ctx, void *dst, size_t offset, const void *src, size_t bytes, void *stream,
                          oscar_errbuf *err);
    oscar_status (*read)(void *ctx, void *dst, const void *src, size_t offset, size_t bytes, void *stream,
                         oscar_errbuf *err);
    oscar_status (*sync)(void *ctx, void *stream, oscar_errbuf *err);

    /* variant: receives a short name of the generated kernel chosen. */
    oscar_status (*plan_create)(void *ctx, const oscar_backend_plan_desc *desc, void **bplan, char *variant,
                                size_t variant_len, oscar_errbuf *err);
    void (*plan_destroy)(void *ctx, void *bplan);
    oscar_status (*workspace_bytes)(void *ctx, void *bplan, int max_seqs, int max_seq_len, size_t *bytes,
                                    oscar_errbuf *err);
    oscar_status (*workspace_init)(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err);
    oscar_status (*check)(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err);
    oscar_status (*append)(void *ctx, void *bplan, const oscar_backend_append_args *a, oscar_errbuf *err);
    oscar_status (*decode)(void *ctx, void *bplan, const oscar_backend_decode_args *a, oscar_errbuf *err);
    /* ABI 3. Workspace: workspace_bytes(max(num_seqs, total_q), max_seq_len). */
    oscar_status (*extend)(void *ctx, void *bplan, const oscar_backend_extend_args *a, oscar_errbuf *err);
    /* ABI 4. What the backend stores beyond the 2-bit format (OSCAR_BACKEND_CAP_*); 0: nothing, and
     * the runtime refuses layouts and parameters that need more (OSCAR_ERR_UNSUPPORTED). */
    uint32_t caps;
} oscar_backend_api;

/* caps: 3-bit head-tensors (layout.wide_tensors > 0, plan descriptor code_bits; FORMAT.md §2.7). */
#define OSCAR_BACKEND_CAP_WIDE_CODES 0x1u

typedef const oscar_backend_api *(*oscar_backend_entry_fn)(void);

/* The built-in CPU backend's table (backends/cpu/cpu_backend.c, linked into
 * liboscar only; plugins do not have it). Declared here so the registry
 * reaches it without including backends/. */
const oscar_backend_api *oscar_cpu_backend(void);
#define OSCAR_BACKEND_ENTRY_SYMBOL "oscar_backend_entry_v1"

/* Device error word flags (first 4 bytes of the workspace, uint32). */
#define OSCAR_DEVERR_BLOCK_TABLE 0x1u /* page id or window slot out of range */
#define OSCAR_DEVERR_NONFINITE 0x2u   /* NaN/Inf in a K/V row (row stored as zeros) */
#define OSCAR_DEVERR_LENGTH 0x4u      /* seq_len, new-token count or extend query table out of range */
/* Workspace bytes reserved at the start for the error word (alignment). */
#define OSCAR_WORKSPACE_HEADER 256u

#ifdef __cplusplus
}
#endif
#endif /* OSCAR_BACKEND_H */
