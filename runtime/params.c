/* The parameter object: rotations, eigenvalues and clip ratios per layer
 * (docs/FORMAT.md §1, §2.1). Built-in parameters for the baselines, accessors,
 * and the shape check engines run before planning. Files: params_file.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar_ref.h"
#include "oscar_internal.h"

/* Bounds on shapes we accept anywhere (files included): large enough for any
 * real model, small enough that a hostile shape cannot ask for terabytes. */
#define OSCAR_MAX_LAYERS 1024
#define OSCAR_MAX_HEADS 4096

oscar_status oscar_params_alloc(int num_layers, int num_q_heads, int num_kv_heads, int head_dim, int per_head,
                                oscar_params **out) {
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_alloc: out is NULL");
    *out = NULL;
    if (!oscar_head_dim_supported(head_dim))
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM,
                               "head_dim %d is not supported: use " OSCAR_HEAD_DIM_RULE, head_dim);
    if (num_layers <= 0 || num_layers > OSCAR_MAX_LAYERS)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "num_layers %d must be in [1, %d]", num_layers,
                               OSCAR_MAX_LAYERS);
    if (num_q_heads <= 0 || num_kv_heads <= 0 || num_q_heads > OSCAR_MAX_HEADS || num_kv_heads > OSCAR_MAX_HEADS)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "head counts must be in [1, %d] (got %d query heads, %d KV heads)", OSCAR_MAX_HEADS,
                               num_q_heads, num_kv_heads);
    if (num_q_heads % num_kv_heads != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "num_kv_heads %d does not divide num_q_heads %d: check the model config", num_kv_heads,
                               num_q_heads);
    if (per_head != 0 && per_head != 1)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "per_head must be 0 or 1 (got %d)", per_head);

    oscar_params *p = calloc(1, sizeof *p);
    if (!p) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory allocating parameters");
    p->num_layers = num_layers;
    p->num_q_heads = num_q_heads;
    p->num_kv_heads = num_kv_heads;
    p->head_dim = head_dim;
    p->per_head = per_head;
    p->num_rot = per_head ? num_kv_heads : 1;
    p->identity = 1;
    p->method = OSCAR_METHOD_INT2;
    p->group = oscar_group_default(head_dim);
    p->sink = 64;
    p->recent = 256;
    p->calib_tokens = 0;
    snprintf(p->composition, sizeof p->composition, "I");
    size_t d = (size_t)head_dim;
    size_t nrot = (size_t)num_layers * 2 * (size_t)p->num_rot;
    p->rot = calloc(nrot * d * d, sizeof(float));
    const size_t nclip = (size_t)num_layers * (size_t)num_kv_heads * 2;
    p->clip = malloc(nclip * sizeof(float));
    if (!p->rot || !p->clip) {
        free(p->rot);
        free(p->clip);
        free(p);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY,
                               "out of memory allocating %zu rotations of %zu x %zu: reduce the model shape", nrot, d,
                               d);
    }
    for (size_t r = 0; r < nrot; r++)
        for (size_t i = 0; i < d; i++) p->rot[r * d * d + i * d + i] = 1.0f;
    for (size_t i = 0; i < nclip; i++) p->clip[i] = 1.0f;
    *out = p;
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_create_builtin(oscar_method method, int num_layers, int num_q_heads,
                                                   int num_kv_heads, int head_dim, oscar_params **out) {
    oscar_clear_error();
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_create_builtin: out is NULL");
    *out = NULL;
    if ((int)method < 0 || method >= OSCAR_METHOD_COUNT_)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "unknown method %d: use one of the oscar_method values", (int)method);
    oscar_params *p = NULL;
    oscar_status s = oscar_params_alloc(num_layers, num_q_heads, num_kv_heads, head_dim, 0, &p);
    if (s != OSCAR_OK) return s;
    p->method = method;
    if (method == OSCAR_METHOD_QUAROT2) {
        size_t dd = (size_t)head_dim * (size_t)head_dim;
        oscar_ref_hadamard(head_dim, p->rot);
        for (size_t r = 1; r < (size_t)num_layers * 2 * (size_t)p->num_rot; r++)
            memcpy(p->rot + r * dd, p->rot, dd * sizeof(float));
        p->identity = 0;
        snprintf(p->composition, sizeof p->composition, "H");
    } else if (method == OSCAR_METHOD_OSCAR2 || method == OSCAR_METHOD_OSCAR2_LM) {
        /* Published defaults (GUIDE §1): a start before calibration. */
        for (int l = 0; l < num_layers; l++)
            for (int h = 0; h < num_kv_heads; h++) {
                *oscar_params_clip_ptr(p, l, h, OSCAR_K) = 0.96f;
                *oscar_params_clip_ptr(p, l, h, OSCAR_V) = 0.92f;
            }
    }
    *out = p;
    return OSCAR_OK;
}

OSCAR_API void oscar_params_destroy(oscar_params *p) {
    if (!p) return;
    free(p->rot);
    free(p->eig);
    free(p->clip);
    free(p->fb);
    free(p->bits);
    free(p);
}

OSCAR_API oscar_status oscar_params_get_info(const oscar_params *p, oscar_params_info *out) {
    oscar_clear_error();
    if (!p || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_get_info: NULL argument");
    memset(out, 0, sizeof *out);
    out->num_layers = p->num_layers;
    out->num_q_heads = p->num_q_heads;
    out->num_kv_heads = p->num_kv_heads;
    out->head_dim = p->head_dim;
    out->per_head = p->per_head;
    out->method = p->method;
    out->calib_tokens = p->calib_tokens;
    memcpy(out->model_hash, p->model_hash, sizeof out->model_hash);
    out->model_hash[sizeof out->model_hash - 1] = '\0';
    return OSCAR_OK;
}

/* Shared argument check of the per-layer accessors; returns the rotation index. */
static oscar_status check_index(const oscar_params *p, const char *fn, int layer, int kv_head, oscar_kv which,
                                int *r) {
    if (!p) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    if (layer < 0 || layer >= p->num_layers)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: layer %d out of range [0, %d)", fn, layer,
                               p->num_layers);
    if (which != OSCAR_K && which != OSCAR_V)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: which must be OSCAR_K or OSCAR_V (got %d)", fn,
                               (int)which);
    *r = 0;
    if (p->per_head) {
        if (kv_head < 0 || kv_head >= p->num_kv_heads)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                   "%s: kv_head %d out of range [0, %d) for per-head parameters", fn, kv_head,
                                   p->num_kv_heads);
        *r = kv_head;
    }
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_rotation(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                             const float **R) {
    oscar_clear_error();
    if (!R) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_rotation: R is NULL");
    int r;
    oscar_status s = check_index(p, "oscar_params_rotation", layer, kv_head, which, &r);
    if (s != OSCAR_OK) return s;
    *R = oscar_params_rot_ptr(p, layer, (int)which, r);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_eigenvalues(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                const double **lambda) {
    oscar_clear_error();
    if (!lambda) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_eigenvalues: lambda is NULL");
    int r;
    oscar_status s = check_index(p, "oscar_params_eigenvalues", layer, kv_head, which, &r);
    if (s != OSCAR_OK) return s;
    *lambda = oscar_params_eig_ptr(p, layer, (int)which, r);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_feedback(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                             const float **F) {
    oscar_clear_error();
    if (!F) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_feedback: F is NULL");
    int r;
    oscar_status s = check_index(p, "oscar_params_feedback", layer, kv_head, which, &r);
    if (s != OSCAR_OK) return s;
    *F = oscar_params_fb_ptr(p, layer, (int)which, r);
    return OSCAR_OK;
}

int oscar_params_fb_valid(const float *F, int d, size_t *bad) {
    size_t dd = (size_t)d * (size_t)d;
    for (size_t i = 0; i < dd; i++) {
        /* Strictly upper triangular and bounded: the write path then cannot overflow
         * on sane rows, and a hostile file cannot make it read a weight twice. */
        int upper = i % (size_t)d > i / (size_t)d;
        if (!isfinite(F[i]) || (!upper && F[i] != 0.0f) || fabsf(F[i]) > OSCAR_FB_MAX) {
            *bad = i;
            return 0;
        }
    }
    return 1;
}

OSCAR_API oscar_status oscar_params_set_feedback(oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                 const float *F) {
    oscar_clear_error();
    const char *fn = "oscar_params_set_feedback";
    int r;
    oscar_status s = check_index(p, fn, layer, kv_head, which, &r);
    if (s != OSCAR_OK) return s;
    if (!F) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: F is NULL", fn);
    if (p->method != OSCAR_METHOD_OSCAR2 && p->method != OSCAR_METHOD_OSCAR2_LM)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: parameters for %s; only oscar2 and oscar2-lm round "
                               "with error feedback", fn, oscar_method_name(p->method));
    const int d = p->head_dim;
    size_t bad;
    if (!oscar_params_fb_valid(F, d, &bad))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: entry (%zu, %zu) = %g: weights must be finite, "
                               "|F| <= 16 and 0 on and below the diagonal", fn, bad / (size_t)d, bad % (size_t)d,
                               (double)F[bad]);
    if (!p->fb) {
        p->fb = calloc((size_t)p->num_layers * 2 * (size_t)p->num_rot * (size_t)d * (size_t)d, sizeof *p->fb);
        if (!p->fb) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    memcpy(oscar_params_fb_ptr(p, layer, (int)which, r), F, (size_t)d * (size_t)d * sizeof *F);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_clear_feedback(oscar_params *p) {
    oscar_clear_error();
    if (!p) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_clear_feedback: params is NULL");
    free(p->fb);
    p->fb = NULL;
    return OSCAR_OK;
}

int oscar_params_clips_per_layer(const oscar_params *p) {
    for (int l = 0; l < p->num_layers; l++)
        for (int h = 1; h < p->num_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++)
                if (*oscar_params_clip_ptr(p, l, h, kv) != *oscar_params_clip_ptr(p, l, 0, kv)) return 0;
    return 1;
}

/* Argument check of the clip accessors: (layer, which) as check_index, and a
 * KV head in range whatever per_head says (clips are per head in any file). */
static oscar_status check_clip_index(const oscar_params *p, const char *fn, int layer, int kv_head, oscar_kv which) {
    int r;
    oscar_status s = check_index(p, fn, layer, 0, which, &r);
    if (s != OSCAR_OK) return s;
    if (kv_head < 0 || kv_head >= p->num_kv_heads)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: kv_head %d out of range [0, %d)", fn, kv_head,
                               p->num_kv_heads);
    return OSCAR_OK;
}

static oscar_status check_clip_ratio(float c) {
    if (!(c > 0.0f && c <= 1.0f)) /* also refuses NaN */
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "clip ratio %g must be in (0, 1]: 1 means no clipping, 0.9 clips at the 90%% quantile",
                               (double)c);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_clip_head(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                              float *c) {
    oscar_clear_error();
    if (!c) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_clip_head: c is NULL");
    oscar_status s = check_clip_index(p, "oscar_params_clip_head", layer, kv_head, which);
    if (s != OSCAR_OK) return s;
    *c = *oscar_params_clip_ptr(p, layer, kv_head, (int)which);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_set_clip_head(oscar_params *p, int layer, int kv_head, oscar_kv which, float c) {
    oscar_clear_error();
    oscar_status s = check_clip_index(p, "oscar_params_set_clip_head", layer, kv_head, which);
    if (s == OSCAR_OK) s = check_clip_ratio(c);
    if (s != OSCAR_OK) return s;
    *oscar_params_clip_ptr(p, layer, kv_head, (int)which) = c;
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_clip(const oscar_params *p, int layer, oscar_kv which, float *c) {
    oscar_clear_error();
    if (!c) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_clip: c is NULL");
    oscar_status s = check_clip_index(p, "oscar_params_clip", layer, 0, which);
    if (s != OSCAR_OK) return s;
    float m = 0.0f; /* the layer's mildest (largest) ratio: its own when the heads share it */
    for (int h = 0; h < p->num_kv_heads; h++) {
        float x = *oscar_params_clip_ptr(p, layer, h, (int)which);
        m = x > m ? x : m;
    }
    *c = m;
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_set_clip(oscar_params *p, int layer, oscar_kv which, float c) {
    oscar_clear_error();
    oscar_status s = check_clip_index(p, "oscar_params_set_clip", layer, 0, which);
    if (s == OSCAR_OK) s = check_clip_ratio(c);
    if (s != OSCAR_OK) return s;
    for (int h = 0; h < p->num_kv_heads; h++) *oscar_params_clip_ptr(p, layer, h, (int)which) = c;
    return OSCAR_OK;
}

int oscar_params_has_wide(const oscar_params *p) {
    if (!p->bits) return 0;
    for (size_t i = 0; i < (size_t)p->num_layers * (size_t)p->num_kv_heads * 2; i++)
        if (p->bits[i] != 2) return 1;
    return 0;
}

int oscar_params_wide_in_layer(const oscar_params *p, int layer) {
    int n = 0;
    for (int h = 0; h < p->num_kv_heads; h++)
        for (int kv = 0; kv < 2; kv++) n += oscar_params_bits_of(p, layer, h, kv) == 3;
    return n;
}

OSCAR_API oscar_status oscar_params_code_bits(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                              int *bits) {
    oscar_clear_error();
    if (!bits) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_code_bits: bits is NULL");
    oscar_status s = check_clip_index(p, "oscar_params_code_bits", layer, kv_head, which);
    if (s != OSCAR_OK) return s;
    *bits = oscar_params_bits_of(p, layer, kv_head, (int)which);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_set_code_bits(oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                  int bits) {
    oscar_clear_error();
    const char *fn = "oscar_params_set_code_bits";
    oscar_status s = check_clip_index(p, fn, layer, kv_head, which);
    if (s != OSCAR_OK) return s;
    if (bits != 2 && bits != 3)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: code width %d is not supported: use 2 or 3", fn, bits);
    if (bits == 3 && p->method != OSCAR_METHOD_OSCAR2)
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED, "%s: 3-bit codes need oscar2 parameters (uniform levels); these "
                               "are for %s", fn, oscar_method_name(p->method));
    if (!p->bits) {
        if (bits == 2) return OSCAR_OK;
        const size_t n = (size_t)p->num_layers * (size_t)p->num_kv_heads * 2;
        p->bits = malloc(n);
        if (!p->bits) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        memset(p->bits, 2, n);
    }
    *oscar_params_bits_ptr(p, layer, kv_head, (int)which) = (uint8_t)bits;
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_params_check_shape(const oscar_params *p, int num_layers, int num_q_heads,
                                                int num_kv_heads, int head_dim, const char *model_hash) {
    oscar_clear_error();
    if (!p) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_check_shape: params is NULL");
    if (p->num_layers != num_layers || p->num_q_heads != num_q_heads || p->num_kv_heads != num_kv_heads ||
        p->head_dim != head_dim)
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "parameters are for %d layers, %d query heads, %d KV heads, head_dim %d but the model "
                               "has %d layers, %d query heads, %d KV heads, head_dim %d: recalibrate with "
                               "oscar-calibrate for this model",
                               p->num_layers, p->num_q_heads, p->num_kv_heads, p->head_dim, num_layers, num_q_heads,
                               num_kv_heads, head_dim);
    if (model_hash && p->model_hash[0] && strcmp(model_hash, p->model_hash) != 0)
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "parameters were calibrated for model hash \"%s\" but the model's hash is \"%s\": "
                               "recalibrate with oscar-calibrate for this model",
                               p->model_hash, model_hash);
    return OSCAR_OK;
}

oscar_status oscar_params_orthogonality_error(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                              double *err) {
    const float *R;
    oscar_status s = oscar_params_rotation(p, layer, kv_head, which, &R); /* validates and sets the error */
    if (s != OSCAR_OK) return s;
    if (!err) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_orthogonality_error: NULL output");
    *err = oscar_ref_orthogonality_error(p->head_dim, R, INFINITY);
    return OSCAR_OK;
}
