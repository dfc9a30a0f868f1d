/*
 * liboscar: 2-bit KV cache with OSCAR (offline spectral covariance-aware
 * rotation and clipping). Public C ABI.
 *
 * Conventions (they hold for every function below):
 *  - Every function returns oscar_status; OSCAR_OK is 0. On failure a message
 *    naming the problem and the fix is available from oscar_last_error() on
 *    the calling thread until that thread's next liboscar call.
 *  - Handles (oscar_runtime, oscar_params, oscar_calib, oscar_plan) are opaque.
 *    The caller owns each handle it creates and releases it with the matching
 *    *_destroy; destroy(NULL) is a no-op. A handle used after its destroy is
 *    undefined behaviour the library cannot detect (docs/API.md "Lifetimes").
 *  - "Device memory" means: a CUDA/HIP device pointer on those backends, a
 *    cl_mem handle cast to void* on OpenCL, plain host memory on the CPU
 *    backend. The caller owns all device memory passed in (KV pools, block
 *    tables, activations, workspace). The library allocates only in calls
 *    that make or grow a host object (*_create, oscar_params_load,
 *    oscar_calib_finalize, oscar_buffer_alloc, the first
 *    oscar_params_set_feedback / _set_code_bits of a parameter set), never on
 *    the hot path (oscar_append, oscar_decode, oscar_extend; with validate = 1
 *    their host checks copy the index arrays). Counts and
 *    strides passed with a buffer must describe it: only OpenCL can check
 *    (a cl_mem knows its size; a smaller one is refused, naming it).
 *  - `stream` is the backend's native queue (cudaStream_t, hipStream_t,
 *    cl_command_queue) or NULL for the backend's default queue; the CPU backend
 *    ignores it and runs synchronously. Device calls are asynchronous with
 *    respect to the host on GPU backends.
 *  - Thread safety: handles are immutable after creation, except oscar_calib
 *    and parameters changed with oscar_params_set_* / _clear_feedback (not
 *    while another thread reads them; plans keep their own copy).
 *    Different threads may call oscar_append/oscar_decode on one plan at once
 *    provided they use different workspaces and do not write the same cache
 *    pages. An oscar_calib must be fed from one thread at a time.
 *  - Structs passed in carry `struct_size` (set it to sizeof the struct) so
 *    fields can be added without breaking the ABI.
 *  - ABI: liboscar.so.MAJOR (SONAME) with every function of this header under
 *    the symbol version OSCAR_MAJOR, except the calibration functions
 *    (oscar_calib_*), which liboscar_calib.so.MAJOR exports under
 *    OSCAR_CALIB_MAJOR. Within a major version releases only add
 *    (functions, struct fields appended under the struct_size rule, enum
 *    values, status codes): a program built against an older header runs on a
 *    newer library of the same major version. A program built against a newer
 *    header that calls a function an older library lacks is stopped by the
 *    dynamic loader naming the symbol (at load, or at the first call under lazy
 *    binding), and gets OSCAR_ERR_VERSION if it sets a field the older one does
 *    not know (docs/API.md "ABI stability"). oscar_version() is the library's
 *    version at run time, OSCAR_VERSION_* the header's.
 *  - Storage format: docs/FORMAT.md. API walk-through: docs/API.md.
 */
#ifndef OSCAR_OSCAR_H
#define OSCAR_OSCAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define OSCAR_API __declspec(dllexport)
#else
#define OSCAR_API __attribute__((visibility("default")))
#endif

#define OSCAR_VERSION_MAJOR 0
#define OSCAR_VERSION_MINOR 1
#define OSCAR_VERSION_PATCH 0
/* Version of the backend plugin ABI (runtime/oscar_backend.h). */
#define OSCAR_BACKEND_ABI_VERSION 5 /* 2: plan descriptor carries error-feedback weights; 3: extend entry,
                                       clips per KV head; 4: capability word (3-bit head-tensors); 5: the
                                       descriptor's layout grows (wide_per_layer: page size per layer) */
/* Version of the parameter file format (docs/FORMAT.md section 6). */
#define OSCAR_PARAMS_FORMAT_VERSION 4 /* 2: error-feedback weights; 3: clip ratios per KV head; 4: code
                                         widths per head-tensor (files are written with the lowest
                                         version that holds them) */

/* Returns "MAJOR.MINOR.PATCH"; *major etc. may be NULL. Static string. */
OSCAR_API const char *oscar_version(int *major, int *minor, int *patch);

/* ------------------------------------------------------------------ status */
typedef enum oscar_status {
    OSCAR_OK = 0,
    OSCAR_ERR_INVALID_ARGUMENT = 1,   /* NULL pointer, negative count, bad enum */
    OSCAR_ERR_UNSUPPORTED_HEAD_DIM = 2, /* head_dim not a multiple of 16 in 32..256, or (CUDA/HIP plan)
                                         not compiled into the plugin */
    OSCAR_ERR_UNSUPPORTED_GROUP = 3,  /* group not a multiple of 16 >= 32 dividing head_dim, or (CUDA/HIP
                                         plan) not compiled into the plugin */
    OSCAR_ERR_UNSUPPORTED = 4,        /* valid request this backend/method cannot do */
    OSCAR_ERR_SHAPE_MISMATCH = 5,     /* parameters vs layout/model shape disagree */
    OSCAR_ERR_NONFINITE = 6,          /* NaN or Inf in activations */
    OSCAR_ERR_EMPTY = 7,              /* zero tokens / zero sequences where some are needed */
    OSCAR_ERR_TOO_LONG = 8,           /* sequence longer than max_seq_len or the block table */
    OSCAR_ERR_BLOCK_TABLE = 9,        /* block table entry or window slot out of range */
    OSCAR_ERR_OUT_OF_MEMORY = 10,
    OSCAR_ERR_IO = 11,                /* file cannot be opened/read/written */
    OSCAR_ERR_CORRUPT_FILE = 12,      /* truncated, malformed, oversized or hostile file */
    OSCAR_ERR_VERSION = 13,           /* file or plugin from an incompatible version */
    OSCAR_ERR_NO_BACKEND = 14,        /* requested backend not found or cannot run here */
    OSCAR_ERR_BACKEND = 15,           /* the vendor runtime reported an error */
    OSCAR_ERR_WORKSPACE = 16,         /* workspace missing or too small */
    OSCAR_ERR_STATE = 17,             /* call out of order (e.g. calibration pass) */
    OSCAR_ERR_INTERNAL = 18
} oscar_status;

/* Short fixed description of a status code. Static string, never NULL. */
OSCAR_API const char *oscar_status_string(oscar_status s);
/* Detailed message of the calling thread's last failed call ("" if none).
 * Thread-local storage owned by the library; valid until the next call. */
OSCAR_API const char *oscar_last_error(void);

/* ------------------------------------------------------------------- enums */
typedef enum oscar_dtype {
    OSCAR_DTYPE_BF16 = 0,
    OSCAR_DTYPE_F16 = 1,
    OSCAR_DTYPE_F32 = 2
} oscar_dtype;

/* Quantization methods. Paged cache (oscar_plan) supports the first five;
 * all of them are available to oscar_fakequant for evaluation. */
typedef enum oscar_method {
    OSCAR_METHOD_OSCAR2 = 0,    /* calibrated rotation + clip, uniform 2-bit levels */
    OSCAR_METHOD_OSCAR2_LM = 1, /* calibrated rotation + clip, Lloyd-Max levels */
    OSCAR_METHOD_INT2 = 2,      /* no rotation, no clip, uniform 2-bit per token */
    OSCAR_METHOD_QUAROT2 = 3,   /* Hadamard rotation, no clip, uniform 2-bit */
    OSCAR_METHOD_BF16 = 4,      /* no quantization: paged 16-bit cache (yardstick) */
    OSCAR_METHOD_INT4 = 5,      /* per-token asymmetric 4-bit (evaluation only) */
    OSCAR_METHOD_INT8 = 6,      /* per-token asymmetric 8-bit (evaluation only) */
    OSCAR_METHOD_KIVI2 = 7,     /* KIVI: K per channel over 32 tokens, V per token (eval only) */
    OSCAR_METHOD_COUNT_ = 8
} oscar_method;

/* "oscar2", "oscar2-lm", "int2", "quarot2", "bf16", "int4", "int8", "kivi2". */
OSCAR_API const char *oscar_method_name(oscar_method m);
/* Parses a name above; OSCAR_ERR_INVALID_ARGUMENT listing the valid names otherwise. */
OSCAR_API oscar_status oscar_method_from_name(const char *name, oscar_method *out);

typedef enum oscar_kv { OSCAR_K = 0, OSCAR_V = 1 } oscar_kv;

/* ------------------------------------------------------------------ layout */
/* Shape of one layer's paged cache. See docs/FORMAT.md. */
typedef struct oscar_layout_desc {
    uint32_t struct_size;   /* sizeof(oscar_layout_desc) */
    int32_t head_dim;       /* any multiple of 16 from 32 to 256 (e.g. 64, 80, 96, 112, 128, 160, 192,
                               256): CPU and OpenCL backends; the CUDA/HIP plugins run 64, 128 and 256
                               (their generated variant set) and refuse others at plan creation */
    int32_t group;          /* quant group along head_dim: a multiple of 16, >= 32, dividing head_dim
                               (96 -> 32, 48 or 96); CUDA/HIP: 32, 64 or 128. Bits per element
                               2 + 32 / group with F16 metadata (group 96: 2.33) */
    int32_t num_q_heads;
    int32_t num_kv_heads;   /* divides num_q_heads */
    int32_t page_size;      /* tokens per page: 16, 32, 64 or 128 */
    int32_t sink;           /* S0: first tokens kept in 16 bits (>= 0) */
    int32_t recent;         /* W: last tokens kept in 16 bits (>= 0) */
    int32_t max_seq_len;    /* upper bound on tokens per sequence */
    oscar_dtype kv_dtype;   /* BF16 or F16: window storage and all activations */
    oscar_dtype meta_dtype; /* F16 or F32: per-group scale and bias */
    oscar_method method;    /* OSCAR2, OSCAR2_LM, INT2, QUAROT2 or BF16 */
    /* Added after the first release (struct_size tells them apart). */
    int32_t wide_tensors;   /* OSCAR2 code widths (docs/FORMAT.md §2.7): room in every page for this
                               many 3-bit head-tensors (KV head, K/V) per layer, a 1-bit plane of P x
                               head_dim/8 bytes each after the metadata; 0 (default): 2 bits everywhere.
                               At least the largest count of 3-bit head-tensors in one layer of the
                               parameters (oscar_params_code_bits); at most 2 num_kv_heads. Backends that
                               cannot store them (third-party plugins; the CPU, OpenCL, CUDA and HIP
                               backends can) refuse such layouts and parameters with
                               OSCAR_ERR_UNSUPPORTED. With wide_per_layer 1: the most planes any layer's
                               pages may hold */
    int32_t wide_per_layer; /* 0 (default): every layer's pages hold wide_tensors planes (one page size).
                               1 (OSCAR2 only): layer l's pages hold exactly the planes of layer l's 3-bit
                               head-tensors in the plan's parameters, so layers differ in page size: size
                               each layer's pool with oscar_plan_layer_sizes (oscar_layout_sizes_get
                               still reports the largest page, wide_tensors planes, which fits every
                               layer). docs/FORMAT.md §3.3 */
} oscar_layout_desc;

/* Fills the defaults: head_dim 128, group 128, 32 q heads, 8 kv heads,
 * page 64, sink 64, recent 256, max_seq_len 131072, BF16 windows, F16
 * metadata, OSCAR2. */
OSCAR_API void oscar_layout_default(oscar_layout_desc *d);
/* The quant group a head_dim gets by default, the one calibration fits its
 * clips for (docs/FORMAT.md §3.5): the whole head up to 128, else half the
 * head when that is a valid group (256 -> 128, 192 -> 96), else the whole
 * head. 0 when head_dim is not supported. Set d.group to it after changing
 * d.head_dim. */
OSCAR_API int32_t oscar_layout_default_group(int32_t head_dim);
/* Checks a layout; the error says which field is wrong and what is allowed. */
OSCAR_API oscar_status oscar_layout_validate(const oscar_layout_desc *d);

typedef struct oscar_layout_sizes {
    size_t page_bytes;        /* one page of the paged pool (2-bit or BF16 pages; with wide_per_layer 1
                                 the largest, a layer's own from oscar_plan_layer_sizes) */
    size_t window_slot_bytes; /* one sequence's 16-bit sink+recent window (0 for BF16 method) */
    size_t k_codes_offset, v_codes_offset, k_meta_offset, v_meta_offset; /* within a page */
    double bits_per_element;  /* of the paged part (2 + meta bits / group), 16 for BF16 */
} oscar_layout_sizes;
OSCAR_API oscar_status oscar_layout_sizes_get(const oscar_layout_desc *d, oscar_layout_sizes *out);
/* Pages a sequence of seq_len tokens needs in the paged pool. */
OSCAR_API oscar_status oscar_layout_pages_for(const oscar_layout_desc *d, int64_t seq_len, int64_t *pages);
/* Average stored bits per K/V element of a whole sequence of seq_len tokens,
 * counting 16-bit windows, codes and metadata. */
OSCAR_API oscar_status oscar_layout_bits_per_element(const oscar_layout_desc *d, int64_t seq_len,
                                                     double *bits);

/* -------------------------------------------------------------- parameters */
/* Rotations and clip ratios per layer, produced by calibration (oscar_calib)
 * or built in (identity for INT2, Hadamard for QUAROT2). Host object. */
typedef struct oscar_params oscar_params;

typedef struct oscar_params_info {
    int32_t num_layers, num_q_heads, num_kv_heads, head_dim;
    int32_t per_head;          /* 1: one rotation per KV head; 0: one per layer */
    oscar_method method;       /* method the parameters were made for */
    int32_t calib_tokens;      /* tokens seen in calibration (0 if built in) */
    char model_hash[65];       /* opaque model fingerprint given at calibration, or "" */
} oscar_params_info;

/* Built-in parameters: INT2 / BF16 (identity rotation), QUAROT2 (normalised
 * Hadamard), OSCAR2/OSCAR2_LM with identity rotation and the published clips
 * (0.96 K, 0.92 V), useful as a start. Caller destroys. */
OSCAR_API oscar_status oscar_params_create_builtin(oscar_method method, int num_layers, int num_q_heads,
                                                   int num_kv_heads, int head_dim, oscar_params **out);
/* Loads a parameter file (safetensors + JSON metadata, docs/FORMAT.md §6).
 * Truncated, corrupt, oversized or inconsistent files are refused with
 * OSCAR_ERR_CORRUPT_FILE / OSCAR_ERR_VERSION. Caller destroys. */
OSCAR_API oscar_status oscar_params_load(const char *path, oscar_params **out);
/* Writes atomically (a temporary file of its own beside path, then rename):
 * readers, and other saves to the same path, see one whole file. */
OSCAR_API oscar_status oscar_params_save(const oscar_params *p, const char *path);
OSCAR_API void oscar_params_destroy(oscar_params *p);
OSCAR_API oscar_status oscar_params_get_info(const oscar_params *p, oscar_params_info *out);
/* Borrowed pointer to the row-major head_dim x head_dim fp32 rotation R
 * (a stored row is x R). kv_head is ignored unless per_head. Valid while p lives. */
OSCAR_API oscar_status oscar_params_rotation(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                             const float **R);
/* max |R R^T - I| of one rotation: a health check (about 1e-7 for a good file). */
OSCAR_API oscar_status oscar_params_orthogonality_error(const oscar_params *p, int layer, int kv_head,
                                                        oscar_kv which, double *err);
/* Borrowed pointer to head_dim eigenvalues (largest first) of the layer's
 * target covariance, or NULL for built-in parameters. */
OSCAR_API oscar_status oscar_params_eigenvalues(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                const double **lambda);
/* Borrowed pointer to the row-major head_dim x head_dim error-feedback weights
 * F of the write path (strictly upper triangular: value j's rounding error e
 * is carried into later values k as x_k = fma(-e, F[j][k], x_k), so a row's error is
 * small in the metric attention feels; docs/FORMAT.md §2.3), or NULL when the
 * parameters round to nearest (built-in parameters, or calibrated with
 * rounding = 0). Valid while p lives and until oscar_params_clear_feedback(p),
 * which frees the weights (oscar_params_set_feedback writes through it). */
OSCAR_API oscar_status oscar_params_feedback(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                             const float **F);
/* Sets the error-feedback weights of one (layer, KV head, K/V): F is a
 * row-major head_dim x head_dim fp32 matrix, strictly upper triangular,
 * finite, |F| <= 16 (what a parameter file may hold). Parameters without
 * weights get them, zero (nearest rounding) everywhere else. For engines
 * that compute their own weights, and for benchmarks that want the
 * write-path cost of calibrated parameters without a calibration. oscar2
 * and oscar2-lm parameters only; kv_head is ignored unless per_head. Plans
 * made before keep what they copied. */
OSCAR_API oscar_status oscar_params_set_feedback(oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                 const float *F);
/* Drops the error-feedback weights: the write path then rounds to nearest
 * (an ablation, or for an engine whose write path cannot afford the sequential
 * pass). Plans made before keep what they copied. No-op without weights. */
OSCAR_API oscar_status oscar_params_clear_feedback(oscar_params *p);
/* Clip ratio c in (0, 1]: per stored row, values are clipped to +-tau, tau the
 * c-quantile of the row's absolute values. 1 means no clipping. One ratio per
 * (layer, KV head, K/V), whatever per_head says (files of format versions 1-2
 * hold one per layer: every head gets it). */
OSCAR_API oscar_status oscar_params_clip_head(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                              float *c);
OSCAR_API oscar_status oscar_params_set_clip_head(oscar_params *p, int layer, int kv_head, oscar_kv which, float c);
/* Per-layer view: oscar_params_clip gives the layer's mildest (largest) ratio
 * over its KV heads, which is the layer's ratio when the heads share one;
 * oscar_params_set_clip sets every KV head of the layer. */
OSCAR_API oscar_status oscar_params_clip(const oscar_params *p, int layer, oscar_kv which, float *c);
OSCAR_API oscar_status oscar_params_set_clip(oscar_params *p, int layer, oscar_kv which, float c);
/* Code width of one (layer, KV head, K/V) head-tensor's 2-bit region (docs/FORMAT.md §2.7): 2 (every
 * head-tensor of a file of format versions 1-3, and most of any file) or 3 (eight uniform levels: the
 * 2-bit plane plus a 1-bit plane of head_dim/8 bytes per row; oscar2 parameters only; format_version
 * 4; written by the calibration's default code-width budget, oscar_calib_options.wide_bits, where it
 * widens a head-tensor). A layout's pages then need room for the planes (oscar_layout_desc.wide_tensors, sizes
 * from oscar_layout_sizes_get), and a backend that cannot store
 * 3-bit head-tensors refuses such parameters at oscar_plan_create with OSCAR_ERR_UNSUPPORTED. */
OSCAR_API oscar_status oscar_params_code_bits(const oscar_params *p, int layer, int kv_head, oscar_kv which,
                                              int *bits);
OSCAR_API oscar_status oscar_params_set_code_bits(oscar_params *p, int layer, int kv_head, oscar_kv which,
                                                  int bits);
/* Refuses parameters whose shape disagrees with the model's (OSCAR_ERR_SHAPE_MISMATCH
 * with both shapes in the message). model_hash may be NULL to skip that check. */
OSCAR_API oscar_status oscar_params_check_shape(const oscar_params *p, int num_layers, int num_q_heads,
                                                int num_kv_heads, int head_dim, const char *model_hash);

/* -------------------------------------------------------------- calibration */
typedef struct oscar_calib oscar_calib;

typedef void (*oscar_progress_fn)(void *user, const char *stage, int64_t done, int64_t total);

typedef struct oscar_calib_options {
    uint32_t struct_size;       /* sizeof(oscar_calib_options) */
    int32_t num_layers, num_q_heads, num_kv_heads, head_dim;
    int32_t group;              /* quant group used when fitting clips (default: head_dim up to 128, else
                                   head_dim / 2 when that is a group, else head_dim) */
    int32_t per_head;           /* 1 (default): one rotation (and feedback weights) per KV head;
                                   0: one per layer (a parameter file num_kv_heads times smaller) */
    oscar_method method;        /* OSCAR2 (default) or OSCAR2_LM */
    float clip_k, clip_v;       /* > 0: fixed clip ratio; 0: fit (default; see clip_objective) */
    int32_t holdout_rows;       /* rows per layer kept for clip fitting (default 4096) */
    const char *model_hash;     /* opaque fingerprint (<= 64 chars) of the model fields that
                                   matter, computed by the engine; stored and compared verbatim */
    oscar_progress_fn progress; /* may be NULL */
    void *progress_user;
    /* Added after the first release (struct_size tells them apart). */
    int32_t sink, recent;       /* cache layout the clips are fitted for: positions < sink and the
                                   last `recent` positions stay full precision (default 64, 256;
                                   recent 0: every key from sink on, the query's own, in 2 bits) */
    int32_t clip_objective;     /* 0 (default): attention-output error on probes (one query
                                   position of a fed window and its keys/values, per layer and KV
                                   head, bounded count); falls back to 1 for a layer without probes.
                                   1: mean attention-aware squared score error e^T C e of
                                   held-back rows */
    int32_t permutation;        /* placement P of the eigen-directions in R = U.H.P:
                                   0: bit-reversal (published); 1: a fixed pseudo-random
                                   permutation; 2 (default): m-sequence order, whose top
                                   positions are not XOR-closed (docs/eval/permutation.md).
                                   The file format is the same for all. */
    int32_t rounding;           /* write-path rounding the parameters ask for: 1 (default): error
                                   feedback, each value's rounding error carried into later values
                                   so the row's error is small in the metric attention feels
                                   (keys: R^T C_K R; values: R^T M R with M from
                                   oscar_calib_set_value_metric, else nearest); clips are fitted
                                   for it. 0: nearest (published). docs/FORMAT.md §2.3 */
    int32_t copy_probes;        /* copy probes per (layer, KV head) kept from oscar_calib_feed_copy
                                   for the probe objective (0..64, default 0: none); they weigh
                                   retrieval from the 2-bit region into the clip choice */
    float copy_mass_loss;       /* with copy probes: a key clip is taken only if the copy queries
                                   keep their attention weight on the copied token's source within
                                   this much of exact (mean over query heads; default 0.002) */
    int32_t clip_per_head;      /* 0 (default): one clip ratio per (layer, K/V), fitted on all the layer's
                                   probes, given to every KV head; 1: one per (layer, KV head, K/V), each
                                   head's fitted on its own probes (parameter file format_version 3;
                                   docs/eval/retrieval.md: it did not win on both calibration texts) */
    float key_attn_weight;      /* share in [0, 1] of the attention-weighted query covariance in the key
                                   target C_K (default 1; 0: C_K = E[q q^T], published): each query weighted
                                   by the sum of its squared softmax weights on the keys of its 2-bit region
                                   (sink <= p <= t - recent), the first-order output error a key error
                                   causes; > 0 needs the keys in pass 0 (docs/CALIBRATION.md) */
    int32_t threads;            /* worker threads of finalize's clip fitting (default 0: the online CPUs,
                                   at most 64); the result does not depend on it */
    int32_t probe_queries;      /* query positions per attention probe, 1..64, or 0 (default): 16 for the
                                   layout without windows (sink 0, recent 0), else 1. A window's probe
                                   keeps its keys and values once and that many query positions, one
                                   drawn in each equal part of its span (probe_span), each reading the
                                   2-bit region of its own position (docs/CALIBRATION.md) */
    float clip_margin;          /* probe objective: the mildest clip ratio whose probe error is within
                                   (1 + clip_margin) of the grid's smallest is taken (default 0: the
                                   smallest, ties keeping the milder); in [0, 1] */
    int32_t probe_span;         /* where a window's probe query positions are drawn: 0 (default) its
                                   second half; 1 every position from sink + recent + 32 on (the
                                   positions oscar-eval scores that read a 2-bit region) */
    float feedback_damp;        /* error-feedback weights: ridge added to the metric before its Cholesky
                                   factor, as a share of the metric's mean eigenvalue (trace / head_dim),
                                   grown tenfold while a weight would exceed 16 or the factor fails; in
                                   (0, 1], or 0 (default): 0.001 with windows (docs/eval/retrieval.md,
                                   seventh step); without windows (sink 0, recent 0) chosen per (layer,
                                   K/V) from 0.001 / 0.01 / 0.1 on the probes (docs/EVAL.md, "s0w0, seventeenth session") */
    float wide_bits;            /* code widths: bits per element of the 2-bit region the rule may add by
                                   storing head-tensors in 3 bits, in [0, 1], or OSCAR_CALIB_WIDE_BITS_AUTO
                                   (-1, the default): OSCAR_CALIB_WIDE_BITS_DEFAULT (0.05) where the method
                                   is OSCAR2 and clip_objective 0, else 0 (OSCAR2_LM and the row objective
                                   calibrate as before, without an error). 0: every head-tensor at 2 bits.
                                   An explicit value > 0 needs OSCAR2 and clip_objective 0. Each widened
                                   (layer, KV head, K/V) adds 1 / (2 num_layers num_kv_heads) and is stored
                                   unclipped; they are taken in the order of what 3 bits buy on the probes
                                   (oscar_calib_width_report_get). A file with a 3-bit head-tensor has
                                   format_version 4 and needs oscar_layout_desc.wide_tensors
                                   (docs/eval/retrieval.md, ninth and fourteenth steps) */
    float copy_head_mass;       /* copy heads (opt-in; needs copy probes, probe objective): a KV head whose copy
                                   probes' queries put at least this mean attention weight (exact keys) on the
                                   copied token's source is a copy head, and its key clip is at least
                                   copy_head_clip (the other heads' ratios as without copy probes: the
                                   copy_mass_loss bound is not applied; a fixed clip_k is kept as it is).
                                   In [0, 1]; 0 (default): off. A file
                                   with a copy head whose key ratio differs from its layer's has per-head
                                   ratios (format_version 3). oscar_calib_head_copy_report_get names them
                                   (docs/EVAL.md, twenty-fourth session) */
    float copy_head_clip;       /* the copy heads' key clip floor, in (0, 1] (default 0.97) */
} oscar_calib_options;

/* oscar_calib_options.wide_bits: the default (AUTO) resolves to DEFAULT bits per element for OSCAR2 with
 * the probe objective and to 0 otherwise. A budget in bits per element scales with the model: 0.05 widens
 * at most floor(2 L Hkv / 20) head-tensors (none below 20 head-tensors, one of tiny-qwen3's 32, 28 of
 * the 576 of a 36-layer, 8-KV-head model), 2.25 + 0.05 = 2.3 bits per element at group 128. */
#define OSCAR_CALIB_WIDE_BITS_AUTO (-1.0f)
#define OSCAR_CALIB_WIDE_BITS_DEFAULT 0.05f

/* Fills defaults for the given shape. */
OSCAR_API void oscar_calib_options_default(oscar_calib_options *o, int num_layers, int num_q_heads,
                                           int num_kv_heads, int head_dim);
OSCAR_API oscar_status oscar_calib_create(const oscar_calib_options *o, oscar_calib **out);
OSCAR_API void oscar_calib_destroy(oscar_calib *c);
/* Calibration runs two passes over the same tokens: pass 0 accumulates the
 * query covariances and the key target C_K; pass 1 the score-weighted value
 * target C_V (its weights need pass 0's final query covariance). Call
 * oscar_calib_begin_pass(c, 0), feed every window, oscar_calib_begin_pass(c, 1),
 * feed the same windows again, then finalize. A pass-1 feed whose length differs
 * from pass 0's feed of the same per-layer index, where that window holds an
 * attention probe still waiting for its keys and values, is refused
 * (OSCAR_ERR_INVALID_ARGUMENT, nothing accumulated): its probe would be lost. */
OSCAR_API oscar_status oscar_calib_begin_pass(oscar_calib *c, int pass);
/* Feeds n_tokens rows of one layer, post-RoPE (and post q/k-norm):
 * q [n_tokens][num_q_heads][head_dim], k and v [n_tokens][num_kv_heads][head_dim],
 * host memory, dtype F32, BF16 or F16. Accumulates in fp64; memory does not
 * grow with the number of tokens. Non-finite rows are refused.
 * One feed is taken to be one causal window (positions 0..n_tokens-1, each
 * attending to the earlier ones): feeds of at least sink + recent + 33 tokens
 * give attention probes for clip fitting (queries kept in pass 0; the keys and
 * values up to the probe position from pass 0 when given there, else from the
 * feed with the same per-layer index in pass 1). Pass 0 needs q, and k as well
 * while key_attn_weight > 0 (the default: the queries' attention weights);
 * pass 1 needs k and v. */
OSCAR_API oscar_status oscar_calib_feed(oscar_calib *c, int layer, int n_tokens, const void *q, const void *k,
                                        const void *v, oscar_dtype dtype);
/* Copy probes (pass 0, optional): one causal window whose token at position p
 * >= first_query repeats the one at p - period (e.g. a span of calibration text
 * fed twice), q/k/v laid out as oscar_calib_feed's; the query at t then copies
 * from the key at t + 1 - period (an induction match), which must lie in the
 * 2-bit region (period > recent). Each call gives one probe per KV head, query
 * position drawn from [max(first_query, sink + recent + 32, sink + period - 1),
 * n_tokens - 2], to a reservoir of options.copy_probes. The probes do not enter
 * the attention error; they bound the key clip (options.copy_mass_loss).
 * Accumulates nothing into the targets. */
OSCAR_API oscar_status oscar_calib_feed_copy(oscar_calib *c, int layer, int n_tokens, int first_query, int period,
                                             const void *q, const void *k, const void *v, oscar_dtype dtype);
/* Optional metric of value errors for error-feedback rounding: a head_dim x
 * head_dim symmetric PSD matrix M (row-major, doubles, copied) such that a
 * value error e (original space) costs e^T M e downstream, e.g. the sum over
 * the query heads reading KV head kv_head of W_O,q^T W_O,q (W_O,q: the
 * output projection's columns of query head q). Without it values round to
 * nearest. Call any time before finalize; with per_head == 0 the heads'
 * metrics are averaged (give all heads of a layer or none). A matrix that is
 * not finite, not symmetric, not PSD (to rounding: an eigenvalue below -1e-6
 * times the largest) or has an entry above 1e100 is refused with
 * OSCAR_ERR_INVALID_ARGUMENT. */
OSCAR_API oscar_status oscar_calib_set_value_metric(oscar_calib *c, int layer, int kv_head, const double *M);
/* The targets of one layer (averaged over KV heads; per_head==1: of kv_head)
 * after the passes that define them: C_K after pass 0 ((1 - w) C_Q + w C_W with
 * w = key_attn_weight, C_W scaled to C_Q's trace), C_V after pass 1.
 * out is head_dim*head_dim doubles, row-major, caller-owned. */
OSCAR_API oscar_status oscar_calib_target(const oscar_calib *c, int layer, int kv_head, oscar_kv which,
                                          double *out);
/* The clip ratios the fit tries, mildest (1) first; *count receives their
 * number. The array is the library's (static, read-only); tools that refine
 * clips step along the same grid. */
OSCAR_API const float *oscar_calib_clip_grid(int *count);
/* Eigen-decomposes the targets, builds R = U.H.P, fits the clip ratios and
 * returns new parameters (caller destroys). */
OSCAR_API oscar_status oscar_calib_finalize(oscar_calib *c, oscar_params **out);

/* Per-layer diagnostic after finalize: attention-aware error of the held-back
 * rows under no rotation, Hadamard only, and the final OSCAR choice. */
typedef struct oscar_calib_layer_report {
    double err_k[3], err_v[3]; /* [0] none, [1] Hadamard, [2] OSCAR (relative) */
    float clip_k, clip_v;      /* the fitted ratios, which the layer's 2-bit head-tensors keep (a head-tensor
                                  the code-width rule stored in 3 bits has ratio 1) */
} oscar_calib_layer_report;
OSCAR_API oscar_status oscar_calib_layer_report_get(const oscar_calib *c, int layer, oscar_calib_layer_report *out);
/* Per-layer probe diagnostic after finalize: relative attention-output error
 * sum ||o^ - o||^2 / sum ||o||^2 over the layer's probes and query heads, with
 * only K quantized (V exact), only V quantized (K exact) and both; [0] none
 * and [1] Hadamard at clip 1, [2] OSCAR at the chosen clips. probes == 0
 * (all feeds shorter than sink + recent + 33) leaves the errors 0. */
typedef struct oscar_calib_attn_report {
    double err_k[3], err_v[3], err_kv[3];
    int32_t probes;
} oscar_calib_attn_report;
OSCAR_API oscar_status oscar_calib_layer_attn_report_get(const oscar_calib *c, int layer,
                                                         oscar_calib_attn_report *out);

/* Copy-probe diagnostic after finalize: mean attention weight of the copy
 * probes' queries on their source key, mass[0] exact (bf16 keys), [1] keys in 2
 * bits at the mildest clip tried (1, or the fixed one), [2] at the chosen clip;
 * clip_free is the key clip the attention error alone would pick. probes == 0:
 * none fed (the rest is 0). */
typedef struct oscar_calib_copy_report {
    int32_t probes;
    double mass[3];
    float clip_free;
} oscar_calib_copy_report;
OSCAR_API oscar_status oscar_calib_layer_copy_report_get(const oscar_calib *c, int layer,
                                                         oscar_calib_copy_report *out);
/* The same per KV head after finalize, and whether copy_head_mass named it a copy head: mass[0]
 * exact, [1] keys in 2 bits at clip 1, [2] at its key clip clip_k (the floor applied). probes: the
 * head's copy probes (0: none fed; the rest is 0). */
typedef struct oscar_calib_head_copy_report {
    int32_t probes;
    int32_t copy_head;
    double mass[3];
    float clip_k;
} oscar_calib_head_copy_report;
OSCAR_API oscar_status oscar_calib_head_copy_report_get(const oscar_calib *c, int layer, int kv_head,
                                                        oscar_calib_head_copy_report *out);

/* Code-width diagnostic after finalize (OSCAR2; zeros for OSCAR2_LM or a layer without probes): the
 * attention-output error of one (layer, KV head, K/V) head-tensor alone (the other exact), summed
 * over its text probes' query heads in the output metric (oscar_calib_set_value_metric) and divided
 * by the probes' query positions: err2 at 2 bits and the chosen clip, err3 at 3 bits unclipped;
 * norm the same mean of the exact outputs' squared norm. err2 - err3 ranks the head-tensors for
 * wide_bits; wide is 1 where the rule widened it. */
typedef struct oscar_calib_width_report {
    double err2, err3, norm;
    int32_t wide;
} oscar_calib_width_report;
OSCAR_API oscar_status oscar_calib_width_report_get(const oscar_calib *c, int layer, int kv_head, oscar_kv which,
                                                    oscar_calib_width_report *out);

/* ------------------------------------------------------------- fake quant */
/* Quantize-dequantize rows on the host exactly as the cache would store them
 * (rotation, clip, 2-bit codes, fp16 metadata), returning them in the
 * ORIGINAL (unrotated) space. For evaluation of every method, including
 * INT4/INT8/KIVI2. rows: [n_tokens][num_kv_heads][head_dim] float, in/out.
 * KIVI2 keys are quantized per channel over consecutive groups of 32 tokens:
 * n_tokens must then be a multiple of 32. group: quant group along head_dim
 * (0 = head_dim). params may be NULL for methods without rotation. Rows the
 * cache refuses (NaN/Inf; a stored value past bf16, or past 65504 where the
 * fp16 metadata would saturate) give OSCAR_ERR_NONFINITE, rows untouched. */
OSCAR_API oscar_status oscar_fakequant(const oscar_params *p, oscar_method m, int layer, oscar_kv which,
                                       int group, int n_tokens, int num_kv_heads, int head_dim, float *rows);
/* Bits per stored element of a method's quantized region (metadata counted;
 * group 0 = head_dim). 0 for what no cache stores: an unknown method, a
 * head_dim or group that is not supported, a meta_dtype other than F16/F32. */
OSCAR_API double oscar_method_bits(oscar_method m, int head_dim, int group, oscar_dtype meta_dtype);

/* ----------------------------------------------------------------- runtime */
typedef struct oscar_runtime oscar_runtime;

typedef void (*oscar_log_fn)(void *user, const char *line);

typedef struct oscar_runtime_options {
    uint32_t struct_size;   /* sizeof(oscar_runtime_options) */
    const char *backend;    /* "cpu", "cuda", "hip", "opencl" or NULL: the
                               OSCAR_BACKEND environment variable, else the
                               best-scoring backend that can run here */
    const char *plugin_dir; /* extra folder searched first for plugins, or NULL */
    int32_t device_index;   /* GPU ordinal (default 0; negative: OSCAR_ERR_INVALID_ARGUMENT) */
    int32_t validate;       /* 1: check block tables and lengths on the host
                               before every device call, and that no page or
                               window slot is written twice by one append
                               (slow, for debugging; OSCAR_VALIDATE=1 in the
                               environment turns it on as well) */
    oscar_log_fn log;       /* discovery log, or NULL */
    void *log_user;
    /* Added after the first release (struct_size tells them apart). */
    void *native_context;   /* OpenCL: the caller's cl_context, given with native_queue.
                               The backend's programs and kernels then live in it, so
                               the caller's cl_mem buffers and in-order queues of that
                               context on native_queue's device can be passed as device
                               memory and streams (a queue of another device is refused).
                               Retained by the runtime, released by
                               oscar_runtime_destroy. Implies backend "opencl" (another
                               requested backend is refused). NULL: the backend makes
                               its own context on device_index. */
    void *native_queue;     /* OpenCL: an in-order cl_command_queue of native_context,
                               the default queue (stream NULL); the device is its device */
} oscar_runtime_options;

OSCAR_API void oscar_runtime_options_default(oscar_runtime_options *o);
/* Discovers backends: the CPU backend is built in; plugins
 * liboscar_backend_{cuda,hip,opencl}.so are searched in plugin_dir,
 * $OSCAR_PLUGIN_PATH (colon-separated), the folder of liboscar itself and its
 * oscar/ subfolder (where `cmake --install` puts them), the executable's
 * folder and ../lib beside it. When a backend is requested (options->backend
 * or $OSCAR_BACKEND) only that plugin is opened. Caller destroys. */
OSCAR_API oscar_status oscar_runtime_create(const oscar_runtime_options *o, oscar_runtime **out);
/* Releases the caller's runtime. Plans hold their runtime: destroying it
 * while plans live is allowed, the backend then stays up until the last of
 * them is destroyed (no other call may take rt after this one; the plans
 * keep working). Buffers from oscar_buffer_alloc must be freed before. */
OSCAR_API void oscar_runtime_destroy(oscar_runtime *rt);
/* Name of the chosen backend ("cpu", "cuda", ...). Valid while rt lives. */
OSCAR_API const char *oscar_runtime_backend(const oscar_runtime *rt);
/* Human-readable device name of the chosen backend. Valid while rt lives. */
OSCAR_API const char *oscar_runtime_device(const oscar_runtime *rt);
/* Multi-line report of every backend considered: found/skipped and why.
 * Valid while rt lives. */
OSCAR_API const char *oscar_runtime_report(const oscar_runtime *rt);

/* Convenience device-memory helpers for tools, tests and simple engines
 * (engines may use their own allocator instead). Not for the hot path.
 * write/read copy `bytes` at byte `offset` of the device buffer; an offset +
 * bytes past SIZE_MAX is refused everywhere, and past the buffer's end on
 * OpenCL (a cl_mem knows its size; elsewhere it is the caller's word), with
 * OSCAR_ERR_INVALID_ARGUMENT and nothing copied. */
OSCAR_API oscar_status oscar_buffer_alloc(oscar_runtime *rt, size_t bytes, void **buf);
OSCAR_API void oscar_buffer_free(oscar_runtime *rt, void *buf);
OSCAR_API oscar_status oscar_buffer_write(oscar_runtime *rt, void *dst, size_t offset, const void *src,
                                          size_t bytes, void *stream);
OSCAR_API oscar_status oscar_buffer_read(oscar_runtime *rt, void *dst, const void *src, size_t offset,
                                         size_t bytes, void *stream);
/* Blocks until the stream's work is done. */
OSCAR_API oscar_status oscar_synchronize(oscar_runtime *rt, void *stream);

/* -------------------------------------------------------------------- plan */
/* A plan binds a runtime, a layout and parameters; it selects the generated
 * kernel variant for the shape and uploads the rotations to the device (the
 * only allocation, made here). Plan once, append/decode many times. */
typedef struct oscar_plan oscar_plan;

/* The plan copies what it needs from layout and params: both may be changed or
 * destroyed after this call (a plan keeps the parameters it was made with).
 * params NULL: the built-in parameters of the layout's method (int2, quarot2,
 * bf16; the same for every layer, so any layer index >= 0 is accepted);
 * oscar2/oscar2-lm need calibrated ones, quarot2 refuses parameters of another
 * method (OSCAR_ERR_SHAPE_MISMATCH). Caller destroys the plan. */
OSCAR_API oscar_status oscar_plan_create(oscar_runtime *rt, const oscar_layout_desc *layout,
                                         const oscar_params *params, oscar_plan **out);
/* Frees the plan and drops its hold on the runtime (see oscar_runtime_destroy). */
OSCAR_API void oscar_plan_destroy(oscar_plan *plan);
/* Name of the kernel variant chosen, e.g. "cuda:d128_g128_p64_q4_bf16". */
OSCAR_API const char *oscar_plan_variant(const oscar_plan *plan);
/* Workspace (device memory, caller-owned) that append and decode need for a
 * batch of up to max_seqs sequences of up to max_seq_len tokens. Includes a
 * device error word; see oscar_plan_check. One workspace of this size serves
 * every smaller batch and length (a call checks only its minimum; the decode
 * splits a batch into as many parts as the workspace holds). Several plans
 * of one runtime (e.g. layers of different layouts) may share one workspace,
 * sized for the largest of them, when their calls are ordered (one stream, or
 * synchronized): the error word is the same for all, so oscar_plan_check with
 * any of the plans reports and clears what any of them raised. Calls that may
 * run at the same time need workspaces of their own. */
OSCAR_API oscar_status oscar_plan_workspace_bytes(const oscar_plan *plan, int max_seqs, int max_seq_len,
                                                  size_t *bytes);
/* Page geometry of one layer of the plan's cache (docs/FORMAT.md §3.3): with layout.wide_per_layer 1,
 * page_bytes and bits_per_element count exactly that layer's 1-bit planes (its 3-bit head-tensors in the
 * plan's parameters); otherwise the same as oscar_layout_sizes_get of the plan's layout. The offsets are
 * the same for every layer. layer: [0, num_layers) of the parameters (any layer >= 0 for a plan made
 * with the built-in parameters); *out is the caller's and is fully written on success. */
OSCAR_API oscar_status oscar_plan_layer_sizes(const oscar_plan *plan, int layer, oscar_layout_sizes *out);
/* Zeroes the workspace's error word; call once after allocating workspace (on GPUs oscar_plan_check
 * refuses a word with bits no kernel sets, OSCAR_ERR_WORKSPACE: a workspace never initialised). */
OSCAR_API oscar_status oscar_plan_workspace_init(oscar_plan *plan, void *workspace, void *stream);
/* Synchronizes the stream and reports errors the device kernels raised since
 * the last check (out-of-range block table entries or window slots,
 * non-finite K/V rows); clears them. CPU backend errors are returned directly
 * by each call instead. */
OSCAR_API oscar_status oscar_plan_check(oscar_plan *plan, void *workspace, void *stream);

/* Buffer sizes. A CUDA or HIP device pointer (and a host pointer on the CPU
 * backend) carries no size: the counts and strides of a call (num_pages,
 * num_window_slots, num_seqs, block_table_stride, total_new / total_q, the
 * strides, workspace_bytes, out_bytes / lse_bytes) are the caller's word
 * that every buffer holds what they imply, and a buffer smaller than that is
 * undefined behaviour the library cannot see (out-of-range block table
 * entries and window slots are caught; a short pool is not). Only OpenCL,
 * whose cl_mem knows its size, checks every buffer before a call runs.
 * Sizes for the other buffers would come additively, as appended fields of
 * the versioned oscar_attn_args (zero: "not given", as today) and of the
 * planned oscar_append_args / oscar_decode_args (docs/API.md "Growing
 * oscar_cache and oscar_batch"); oscar_cache and oscar_batch themselves stay
 * as they are, since a new field there would break every caller's binary. */
/* One layer's cache: both pools are caller-owned device memory. */
typedef struct oscar_cache {
    void *pages;               /* paged pool: num_pages * page_bytes */
    int32_t num_pages;
    void *windows;             /* window pool: num_window_slots * window_slot_bytes
                                  (unused, may be NULL, for the BF16 method and for
                                  sink 0 with recent 0: window_slot_bytes is then 0) */
    int32_t num_window_slots;
} oscar_cache;

/* A batch of sequences. All pointers are device memory. */
typedef struct oscar_batch {
    int32_t num_seqs;            /* >= 1; GPU backends take at most 65535 per call */
    const int32_t *seq_lens;     /* [num_seqs] tokens in the cache after this call's append (>= 1) */
    const int32_t *window_slots; /* [num_seqs] window pool slot of each sequence (NULL where the
                                    window pool is unused, see oscar_cache.windows) */
    const int32_t *block_table;  /* [num_seqs][block_table_stride] physical page ids, logical order */
    int32_t block_table_stride;  /* columns of block_table (max pages per sequence) */
    int32_t max_seq_len;         /* host-side bound on seq_lens in this batch (grid sizing) */
} oscar_batch;

/* Appends new tokens to each sequence: rotates, rounds to kv_dtype, stores
 * 16-bit window rows, clips/quantizes/packs rows that fall in the 2-bit
 * region and demotes rows leaving the recent window (docs/FORMAT.md §4).
 * cu_new [num_seqs+1] (device): prefix sums of new tokens per sequence;
 * sequence i's new tokens are rows cu_new[i]..cu_new[i+1]-1 of k and v and
 * take positions seq_lens[i]-n_i .. seq_lens[i]-1. k, v: [total_new][num_kv_heads][head_dim]
 * in kv_dtype, token stride kv_stride elements (0 = dense). */
OSCAR_API oscar_status oscar_append(oscar_plan *plan, int layer, const oscar_cache *cache,
                                    const oscar_batch *batch, const int32_t *cu_new, int32_t total_new,
                                    const void *k, const void *v, int64_t kv_stride, void *workspace,
                                    size_t workspace_bytes, void *stream);

/* Decode attention: one query token per sequence, at position seq_lens[i]-1.
 * q, out: [num_seqs][num_q_heads][head_dim] in kv_dtype, token strides in
 * elements (0 = dense). sm_scale 0 means 1/sqrt(head_dim). Exact softmax over
 * sink, 2-bit history and recent window; the output is in the original
 * space unless rotated_output is 1 (then it is o R_V, for folding R_V^T into
 * the output projection). Scores are fp32: finite rows so large that
 * |q~ . k~| * sm_scale passes ~3.4e38 (values near the bf16 limit, never a
 * real model's) make that sequence's output NaN on every backend, unflagged
 * (docs/API.md); an engine that cannot rule such rows out checks its output.
 * out shares memory with no other buffer of the call, q included (the CPU and
 * OpenCL backends refuse it: OSCAR_ERR_INVALID_ARGUMENT). */
OSCAR_API oscar_status oscar_decode(oscar_plan *plan, int layer, const oscar_cache *cache,
                                    const oscar_batch *batch, const void *q, int64_t q_stride, void *out,
                                    int64_t out_stride, float sm_scale, int rotated_output, void *workspace,
                                    size_t workspace_bytes, void *stream);

/* Arguments of oscar_extend (versioned: fill with oscar_attn_args_default,
 * then set the fields; docs/API.md "ABI stability"). All pointers are device
 * memory owned by the caller; the library only reads cu_q and q and writes
 * out and lse. */
typedef struct oscar_attn_args {
    uint32_t struct_size;   /* sizeof(oscar_attn_args) */
    const int32_t *cu_q;    /* [num_seqs+1] prefix sums of query tokens per sequence (cu_q[0] = 0,
                               cu_q[num_seqs] = total_q, every n_i = cu_q[i+1]-cu_q[i] in
                               [1, min(seq_lens[i], max_q_len)]); NULL: one query per sequence
                               (decode: total_q = num_seqs, max_q_len = 1) */
    int32_t total_q;        /* query tokens in the batch (host value, >= 1) */
    int32_t max_q_len;      /* host bound on every n_i (>= 1) */
    const void *q;          /* [total_q][num_q_heads][head_dim] kv_dtype, token stride q_stride */
    int64_t q_stride;       /* elements between query tokens (0 = dense) */
    void *out;              /* [total_q][num_q_heads][head_dim] kv_dtype, token stride out_stride */
    int64_t out_stride;     /* elements (0 = dense) */
    size_t out_bytes;       /* size of out in bytes; must hold (total_q-1)*out_stride + Hq*d elements */
    float *lse;             /* [total_q][num_q_heads] fp32 natural-log sum of exp(scores), or NULL */
    size_t lse_bytes;       /* size of lse in bytes when given: >= total_q * num_q_heads * 4 */
    float sm_scale;         /* 0: 1/sqrt(head_dim) */
    int32_t rotated_output; /* 1: out = o R_V (fold R_V^T into the output projection) */
    void *workspace;        /* oscar_plan_workspace_bytes(plan, max(num_seqs, total_q), max_seq_len) */
    size_t workspace_bytes;
    void *stream;           /* native stream/queue or NULL */
} oscar_attn_args;

/* Zeroes *a and sets struct_size (cu_q NULL, strides dense, sm_scale default). */
OSCAR_API void oscar_attn_args_default(oscar_attn_args *a);

/* Extend attention: several query tokens per sequence over the mixed paged
 * cache, causal, with optional log-sum-exp. Sequence i's query tokens are
 * rows cu_q[i] .. cu_q[i+1]-1 of q and out, at positions
 * seq_lens[i]-n_i .. seq_lens[i]-1; the cache has already been appended up
 * to seq_lens[i] (append, then attend), and every query reads the rows as
 * they are stored at seq_lens[i] (sink and last W rows 16-bit, the rest
 * 2-bit; docs/FORMAT.md §5.1); the query at position t sees rows 0..t.
 * n_i = 1 for every sequence (or cu_q NULL) gives exactly oscar_decode's
 * output, plus the LSE. Bad n_i / cu_q: the CPU backend refuses before
 * writing anything (n_i = 0: OSCAR_ERR_EMPTY; n_i > seq_lens[i] or
 * max_q_len: OSCAR_ERR_TOO_LONG; cu_q not from 0 to total_q:
 * OSCAR_ERR_INVALID_ARGUMENT); GPU kernels write nothing for the bad rows,
 * raise the device flag and oscar_plan_check returns OSCAR_ERR_TOO_LONG
 * (validate = 1 checks cu_q on the host first, with the CPU's codes). */
OSCAR_API oscar_status oscar_extend(oscar_plan *plan, int layer, const oscar_cache *cache, const oscar_batch *batch,
                                    const oscar_attn_args *args);

#ifdef __cplusplus
}
#endif
#endif /* OSCAR_OSCAR_H */
