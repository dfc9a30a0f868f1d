/* Internal helpers of the runtime, shared with the CPU backend and the
 * calibration core (error reporting, parameter objects). The storage format
 * itself lives in format/oscar_format.h. Not installed; not part of the ABI. */
#ifndef OSCAR_INTERNAL_H
#define OSCAR_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "oscar/oscar.h"
#include "oscar_backend.h"
#include "oscar_format.h" /* 16-bit conversions, supported shapes, page geometry */

/* Records the calling thread's detailed error message and returns s.
 * Every public function that fails goes through this (or oscar_set_errbuf). */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
oscar_status oscar_set_error(oscar_status s, const char *fmt, ...);
/* Copies a backend's errbuf message into the thread-local error. */
oscar_status oscar_set_errbuf(oscar_status s, const oscar_errbuf *e);
/* Clears the thread-local message at the start of a public call. */
void oscar_clear_error(void);

/* ------------------------------------------------------ versioned structs */
/* Sizes of the first published version of each versioned struct: a caller's
 * struct_size may be anything from there up (docs/API.md). Written as the
 * end of the last field of version 1, so they stay right as fields are
 * appended. */
#define OSCAR_LAYOUT_DESC_SIZE_V1 (offsetof(oscar_layout_desc, method) + sizeof(oscar_method))
#define OSCAR_RUNTIME_OPTIONS_SIZE_V1 (offsetof(oscar_runtime_options, log_user) + sizeof(void *))
/* Copies the caller's struct src (first field uint32_t struct_size) into
 * dst of full_size bytes: struct_size in [min_size, full_size] is accepted
 * and the fields past it are zero; a larger struct_size (newer header) is
 * accepted when its extra bytes are all zero. dst->struct_size becomes
 * full_size. Reads only struct_size bytes of src. OSCAR_ERR_VERSION with a
 * message naming `what` and the `fill_with` function otherwise. */
oscar_status oscar_struct_import(void *dst, size_t full_size, const void *src, size_t min_size, const char *what,
                                 const char *fill_with);
/* oscar_struct_import of a layout, then the format's check of its fields. */
oscar_status oscar_layout_import(const oscar_layout_desc *in, oscar_layout_desc *out);
/* oscar_layout_sizes of a checked layout's pages of `layer` (oscar_format_layer_planes: layer -1, the
 * largest page; code_bits [num_layers][H][2] or NULL). Writes all of *out. */
void oscar_layout_sizes_fill(const oscar_layout_desc *d, const uint8_t *code_bits, int layer, oscar_layout_sizes *out);

/* ------------------------------------------------------- batch checks */
/* The index arrays of an append, decode or extend on the host (the CPU
 * backend's own, or validate = 1's copies of a device batch) checked against
 * layout l, cache c and batch b's counts: one home for the CPU backend and
 * validate = 1, so both refuse a call with the same status and message, and a
 * call with several faults with the first of this order (docs/API.md): per
 * sequence in order, seq_lens (EMPTY below 1, TOO_LONG past a bound or the
 * block table's width), its block table entries, then its window slot
 * (BLOCK_TABLE; slots are read only where the layout has windows); then, for an
 * append (cu_new not NULL), cu_new's ends and each sequence's new-token count
 * (INVALID_ARGUMENT). bt NULL: refused for a sequence that needs pages. */
oscar_status oscar_check_batch_arrays(const oscar_layout_desc *l, const oscar_cache *c, const oscar_batch *b,
                                      const int32_t *lens, const int32_t *slots, const int32_t *bt,
                                      const int32_t *cu_new, int32_t total_new, const char *fn, oscar_errbuf *err);

/* ------------------------------------------------------------- params */
/* Layout of the arrays: index (layer, kv, rot) with kv 0 = K, 1 = V. */
struct oscar_params {
    int32_t num_layers, num_q_heads, num_kv_heads, head_dim;
    int32_t per_head;      /* 0/1 */
    int32_t num_rot;       /* 1 or num_kv_heads */
    int32_t identity;      /* 1 if every rotation is the identity */
    oscar_method method;
    int32_t group, sink, recent; /* recorded at calibration (informational) */
    int32_t calib_tokens;
    char model_hash[65];
    char composition[16];  /* "U.H.P", "H", "I" */
    float *rot;            /* [num_layers][2][num_rot][d][d] */
    double *eig;           /* [num_layers][2][num_rot][d], or NULL */
    float *clip;           /* [num_layers][num_kv_heads][2] (K, V) */
    float *fb;             /* [num_layers][2][num_rot][d][d] error-feedback weights (strictly upper
                              triangular; FORMAT.md §2.3), or NULL: nearest rounding */
    uint8_t *bits;         /* [num_layers][num_kv_heads][2] (K, V) code width, 2 or 3 (FORMAT.md §2.7,
                              format_version 4), or NULL: 2 everywhere */
};

/* Allocates parameters with identity rotations, no eigenvalues and clip 1.
 * Validates the shape (head_dim etc.) and sets the error on failure. */
oscar_status oscar_params_alloc(int num_layers, int num_q_heads, int num_kv_heads, int head_dim, int per_head,
                                oscar_params **out);
static inline float *oscar_params_rot_ptr(const oscar_params *p, int layer, int kv, int r) {
    size_t d = (size_t)p->head_dim;
    return p->rot + (((size_t)layer * 2 + (size_t)kv) * (size_t)p->num_rot + (size_t)r) * d * d;
}
/* Largest |error-feedback weight| a parameter file may hold (calibration's
 * weights stay <= 1 after damping; the bound keeps hostile files harmless). */
#define OSCAR_FB_MAX 16.0f
/* The rule for feedback weights (files and oscar_params_set_feedback):
 * strictly upper triangular, finite, |F| <= OSCAR_FB_MAX. 0 when F[*bad]
 * breaks it, else 1. */
int oscar_params_fb_valid(const float *F, int d, size_t *bad);
/* Error-feedback weights of (layer, kind, rotation index), or NULL when the
 * parameters round to nearest. */
static inline float *oscar_params_fb_ptr(const oscar_params *p, int layer, int kv, int r) {
    if (!p->fb) return NULL;
    size_t d = (size_t)p->head_dim;
    return p->fb + (((size_t)layer * 2 + (size_t)kv) * (size_t)p->num_rot + (size_t)r) * d * d;
}
/* Clip ratio of (layer, KV head, kind): one per head since format version 3. */
static inline float *oscar_params_clip_ptr(const oscar_params *p, int layer, int kv_head, int kv) {
    return p->clip + ((size_t)layer * (size_t)p->num_kv_heads + (size_t)kv_head) * 2 + (size_t)kv;
}
/* Code width of (layer, KV head, kind) as a pointer into the bits array (stride 2 between heads),
 * or NULL when every head-tensor is at 2 bits. */
static inline uint8_t *oscar_params_bits_ptr(const oscar_params *p, int layer, int kv_head, int kv) {
    if (!p->bits) return NULL;
    return p->bits + ((size_t)layer * (size_t)p->num_kv_heads + (size_t)kv_head) * 2 + (size_t)kv;
}
/* Code width of (layer, KV head, kind): 2 or 3. */
static inline int oscar_params_bits_of(const oscar_params *p, int layer, int kv_head, int kv) {
    const uint8_t *b = oscar_params_bits_ptr(p, layer, kv_head, kv);
    return b ? *b : 2;
}
/* 1 when some head-tensor has a code width other than 2 (the file is then format_version 4). */
int oscar_params_has_wide(const oscar_params *p);
/* Number of head-tensors (KV head, K/V) of `layer` at 3 bits. */
int oscar_params_wide_in_layer(const oscar_params *p, int layer);
/* 1 when every KV head of every layer shares its layer's clip ratios (the
 * file then keeps the per-layer clip tensor of format versions 1-2). */
int oscar_params_clips_per_layer(const oscar_params *p);
static inline double *oscar_params_eig_ptr(const oscar_params *p, int layer, int kv, int r) {
    if (!p->eig) return NULL;
    size_t d = (size_t)p->head_dim;
    return p->eig + (((size_t)layer * 2 + (size_t)kv) * (size_t)p->num_rot + (size_t)r) * d;
}

/* Parses a parameter file held in memory (the body of oscar_params_load;
 * the fuzz harness calls it directly). Same checks and errors as the file. */
oscar_status oscar_params_load_memory(const void *data, size_t size, oscar_params **out);
/* The same from an open regular file of size bytes, read with pread (no mmap:
 * a truncated file is an error, not a SIGBUS); disk_bytes: what its blocks
 * hold (st_blocks * 512), to refuse sparse files. The fd stays the caller's. */
oscar_status oscar_params_load_fd(int fd, size_t size, uint64_t disk_bytes, oscar_params **out);

#endif /* OSCAR_INTERNAL_H */
