/* Internal helpers shared by the runtime, the CPU reference backend and the
 * calibration core. Not installed; not part of the ABI. */
#ifndef OSCAR_INTERNAL_H
#define OSCAR_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "oscar/oscar.h"
#include "oscar_backend.h"

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
float oscar_f16_to_f32(uint16_t h);
uint16_t oscar_f32_to_f16(float f); /* round to nearest even, overflow to Inf */
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
    float *clip;           /* [num_layers][2] */
    float *fb;             /* [num_layers][2][num_rot][d][d] error-feedback weights (strictly upper
                              triangular; FORMAT.md §2.3), or NULL: nearest rounding */
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
/* Error-feedback weights of (layer, kind, rotation index), or NULL when the
 * parameters round to nearest. */
static inline float *oscar_params_fb_ptr(const oscar_params *p, int layer, int kv, int r) {
    if (!p->fb) return NULL;
    size_t d = (size_t)p->head_dim;
    return p->fb + (((size_t)layer * 2 + (size_t)kv) * (size_t)p->num_rot + (size_t)r) * d * d;
}
static inline double *oscar_params_eig_ptr(const oscar_params *p, int layer, int kv, int r) {
    if (!p->eig) return NULL;
    size_t d = (size_t)p->head_dim;
    return p->eig + (((size_t)layer * 2 + (size_t)kv) * (size_t)p->num_rot + (size_t)r) * d;
}

/* Parses a parameter file held in memory (the body of oscar_params_load;
 * the fuzz harness calls it directly). Same checks and errors as the file. */
oscar_status oscar_params_load_memory(const void *data, size_t size, oscar_params **out);

/* Supported shapes (one place). */
static inline int oscar_head_dim_supported(int d) { return d == 64 || d == 128 || d == 256; }
static inline int oscar_group_supported(int g, int d) { return (g == 32 || g == 64 || g == 128) && g <= d && d % g == 0; }

#endif /* OSCAR_INTERNAL_H */
