/* liboscar reference engine: a small fp32 CPU runner for Hugging Face
 * Llama / Qwen2 / Qwen3 checkpoints, written the way an inference-engine
 * vendor embeds liboscar. It only needs liboscar's public types
 * (include/oscar/oscar.h); the KV quantization hook is a plain callback, so
 * the engine does not care how the caller quantizes.
 *
 * Every call that can fail returns oscar_status; the message naming the
 * problem and the fix is then available from oe_last_error() (per thread).
 */
#ifndef OSCAR_ENGINE_H
#define OSCAR_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "oscar/oscar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Message of the last failing engine call in this thread ("" if none). */
const char *oe_last_error(void);

/* OSCAR_OK when path is a regular file; else OSCAR_ERR_IO naming what it is
 * (missing, a FIFO, a directory, ...). Opens without blocking, so a FIFO
 * given as a model or token file is refused instead of waiting forever for
 * a writer. `what` names the file in the message ("token file"). The engine's
 * loaders check their files with it; tools check the other files they read. */
oscar_status oe_check_regular(const char *path, const char *what);

/* ------------------------------------------------------------ safetensors */
typedef enum oe_dtype {
    OE_F64, OE_F32, OE_F16, OE_BF16, OE_I64, OE_I32, OE_I16, OE_I8, OE_U8, OE_BOOL
} oe_dtype;

#define OE_ST_MAX_DIMS 8

typedef struct oe_tensor {
    const char *name;
    oe_dtype dtype;
    int ndim;
    int64_t shape[OE_ST_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    const void *data; /* inside the read-only mapping; may be unaligned */
} oe_tensor;

typedef struct oe_safetensors oe_safetensors;

/* Maps the file read-only and validates the header: length, JSON, dtypes,
 * shapes, offsets inside the data area, sizes matching shapes. */
oscar_status oe_st_open(const char *path, oe_safetensors **out);
void oe_st_close(oe_safetensors *st);
int oe_st_count(const oe_safetensors *st);
const oe_tensor *oe_st_at(const oe_safetensors *st, int i);
/* NULL when absent (no error set). */
const oe_tensor *oe_st_find(const oe_safetensors *st, const char *name);
/* Converts F64/F32/F16/BF16/I32/I64 to fp32; n must equal t->numel. */
oscar_status oe_tensor_to_f32(const oe_tensor *t, float *out, int64_t n);
size_t oe_dtype_size(oe_dtype d);
const char *oe_dtype_name(oe_dtype d);

/* ------------------------------------------------------------------ model */
typedef enum oe_arch { OE_ARCH_LLAMA, OE_ARCH_QWEN2, OE_ARCH_QWEN3 } oe_arch;

/* RoPE scaling (config.json's rope_scaling or rope_parameters rope_type): transformers' "default",
 * "linear", "llama3" (Llama 3.1+) and "yarn" (Qwen2.5/Qwen3 long context); others are refused. */
typedef enum oe_rope_type { OE_ROPE_DEFAULT, OE_ROPE_LINEAR, OE_ROPE_LLAMA3, OE_ROPE_YARN } oe_rope_type;

typedef struct oe_rope {
    oe_rope_type type;
    double factor;                  /* linear, llama3, yarn */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double beta_fast, beta_slow;    /* yarn (32 and 1 when absent) */
    double attention_factor;        /* yarn: cos and sin are scaled by it (0: from factor, mscale) */
    double mscale, mscale_all_dim;  /* yarn (0 when absent) */
    int original_max_position;      /* llama3, yarn */
    int truncate;                   /* yarn: correction range rounded outwards (default 1) */
} oe_rope;

typedef struct oe_config {
    oe_arch arch;
    char model_type[32];
    int num_layers;
    int hidden;
    int num_q_heads;
    int num_kv_heads;
    int head_dim;
    int intermediate;
    int vocab;
    int max_position;   /* 0 when the config does not say */
    double rms_eps;
    double rope_theta;
    oe_rope rope;       /* scaling of the frequencies (oe_rope_inv_freq) */
    int tie_word_embeddings;
    int qk_norm;        /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int qkv_bias;       /* q/k/v projections carry biases (Qwen2) */
    int sliding_window; /* Mistral's attention span, 0 when none: windows longer than it are refused */
    int no_biases;      /* Mistral: no projection biases, whatever attention_bias says (as transformers) */
} oe_config;

typedef struct oe_model oe_model;

/* Loads config.json and model.safetensors (or the shards listed by
 * model.safetensors.index.json) from dir; weights are converted to fp32. */
oscar_status oe_model_load(const char *dir, oe_model **out);
/* 1 when path names (by device and inode: a link, another spelling) a file the model in dir is read from
 * (config.json, model.safetensors or model.safetensors.index.json and the shards it names, tokenizer.json),
 * with that file's name in which: a tool refuses such an output before any work, since writing it would
 * replace the checkpoint it reads. 0 when path does not exist or is none of them. */
int oe_model_reads(const char *dir, const char *path, char *which, size_t n);
/* The RoPE of config c as transformers computes it: inv_freq [head_dim / 2] (fp32) and the factor
 * its cos and sin are multiplied by (*attention_factor: 1 but for YaRN). */
void oe_rope_inv_freq(const oe_config *c, float *inv_freq, float *attention_factor);
/* Parses only config.json (no weights). */
oscar_status oe_config_load(const char *config_path, oe_config *out);
void oe_model_free(oe_model *m);
const oe_config *oe_model_config(const oe_model *m);
/* The value-error metric of KV head h of a layer for error-feedback rounding:
 * M = sum over the query heads q reading h of W_O,q^T W_O,q (W_O,q: the
 * o_proj columns of head q), head_dim x head_dim doubles into M (caller's). */
oscar_status oe_model_value_metric(const oe_model *m, int layer, int kv_head, double *M);

/* ---------------------------------------------------------------- forward */
/* Observer: post-RoPE (post q/k-norm) q [n][Hq][d], k [n][Hkv][d],
 * v [n][Hkv][d] of one layer, before any bf16 rounding. Return OSCAR_OK to
 * continue; any other status aborts the forward with that status. */
typedef oscar_status (*oe_observer_fn)(void *user, int layer, int n_tokens, const float *q,
                                       const float *k, const float *v);

/* KV quantization hook: given k, v [n][Hkv][d] (post-RoPE, fp32), write
 * quantized copies into k_q, v_q (same shape, fp32). Attention for query t
 * uses the quantized copy at key p when S0 <= p <= t - W and the
 * full-precision copy otherwise. */
typedef oscar_status (*oe_kv_quant_fn)(void *user, int layer, int n_tokens, const float *k,
                                       const float *v, float *k_q, float *v_q);

typedef struct oe_forward_options {
    oe_observer_fn observer;
    void *observer_user;
    oe_kv_quant_fn kv_quant;
    void *kv_quant_user;
    int sink_tokens;    /* S0: keys p < S0 stay full precision (default 64) */
    int recent_tokens;  /* W: keys p > t - W stay full precision (default 256) */
    int kv_bf16;        /* round the full-precision K/V to bf16 (the cache's 16-bit windows) */
    int skip_lm_head;   /* no final norm / logits (calibration) */
    int last_layer;     /* stop after this layer (0-based); -1 = all layers */
    /* Residual-stream snapshot and resume, so a caller that changes only
     * layer l's KV quantization reruns layers l.. alone (clip search in
     * tools/lib/oscar_calibrate_search.c). The result is bit-identical to a
     * full forward with the same hooks. */
    int first_layer;    /* > 0: start at this layer from x_in instead of the embeddings */
    const float *x_in;  /* [n][hidden] residual entering first_layer (required when > 0) */
    int save_layer;     /* with x_save: copy the residual entering this layer */
    float *x_save;      /* [n][hidden] or NULL */
    /* > 0: the chunked-prefill schedule (oscar_append of chunk_tokens tokens,
     * then oscar_extend with their queries; docs/FORMAT.md §5.1): query t
     * reads key p quantized when S0 <= p <= e - 1 - W, e = min(end of t's
     * chunk, n). 0: token by token (e = t + 1). */
    int chunk_tokens;
    /* With chunk_tokens > 0: > 0 ends the chunked part at this position, as
     * an engine that prefills a prompt of chunk_limit tokens in chunks and
     * then decodes: e = min(end of t's chunk, chunk_limit) for t <
     * chunk_limit, e = t + 1 after. 0: the whole window is chunked. */
    int chunk_limit;
} oe_forward_options;

void oe_forward_options_default(oe_forward_options *o);

/* The threads a context runs (oe_ctx_create reads this): $OE_THREADS (a whole number >= 1, at most
 * 16 used), else one per online core up to 16. INVALID_ARGUMENT, with the message, for another value. */
oscar_status oe_threads(int *n);

/* Reusable buffers for windows of up to max_tokens tokens. Not thread-safe:
 * one context per thread; the threads of oe_threads. */
typedef struct oe_ctx oe_ctx;
oscar_status oe_ctx_create(const oe_model *m, int max_tokens, oe_ctx **out);
void oe_ctx_free(oe_ctx *c);

/* Causal forward over one window: positions 0..n-1. logits [n][vocab] is
 * written when non-NULL, all layers run and skip_lm_head is 0. o may be
 * NULL (defaults). */
oscar_status oe_forward(oe_ctx *c, const uint32_t *tokens, int n, const oe_forward_options *o,
                        float *logits);

/* ----------------------------------------------------------------- tokens */
/* Reads uint32 little-endian ids; refuses ids >= vocab (vocab <= 0: no check).
 * *out is malloc'ed; free() it. */
oscar_status oe_tokens_load(const char *path, int vocab, uint32_t **out, int64_t *count);

/* ------------------------------------------------------------- perplexity */
typedef void (*oe_progress_fn)(void *user, int64_t window, int64_t windows, double nll_sum,
                               int64_t scored);

typedef struct oe_ppl_result {
    double nll_sum;
    int64_t scored;  /* number of predicted tokens */
    int64_t windows;
    double ppl;      /* exp(nll_sum / scored) */
} oe_ppl_result;

/* Perplexity over non-overlapping windows: window s (s = 0, ctx, 2 ctx, ...)
 * feeds tokens [s, s+ctx) and scores the predictions of [s+1, s+ctx+1);
 * only windows whose ctx+1 tokens all lie in the first n tokens are used.
 * o (may be NULL) carries the KV hooks for quantized evaluation. */
oscar_status oe_perplexity(const oe_model *m, const uint32_t *tokens, int64_t n, int ctx,
                           const oe_forward_options *o, oe_progress_fn progress, void *user,
                           oe_ppl_result *out);

/* log(sum_i exp(l[i])) of a row of n >= 1 logits: exp in fp32 around the
 * row's maximum, summed in fp64 (the one softmax normaliser of perplexity,
 * KL and the clip search). *argmax, if not NULL, gets the index of the first
 * maximum. A NaN in the row gives NaN. */
double oe_logsumexp(const float *l, int n, int *argmax);

/* Round-to-nearest-even fp32 -> bf16 -> fp32, NaN kept. */
float oe_round_bf16(float x);

#ifdef __cplusplus
}
#endif
#endif
