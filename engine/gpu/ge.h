/* GPU engine: a CUDA runner for Llama / Qwen2 / Qwen3 models whose KV cache
 * is liboscar's paged cache in device buffers the engine owns, written and
 * read only through the public API (oscar_append, oscar_decode), so the
 * same code serves the BF16 method and the 2-bit methods.
 *
 * Weights live on the device in bf16 (or fp32 in the check mode act_f32),
 * GEMMs are cuBLAS / cuBLASLt, tuned per shape (ge_gemm.h; bf16 in, fp32 accumulate and output). Prefill: the
 * prompts of a step are concatenated (cu_seqlens); their K/V are appended
 * to the cache and the prompt attends to its own exact bf16 K/V through
 * ge_k_prefill_attention (as the published method does at prefill). A
 * prompt longer than one prefill step (or every prompt, with
 * chunk_every_prompt) goes in chunks of prefill_chunk tokens: each chunk is
 * appended and attends over the whole cache so far with oscar_extend (sink,
 * 2-bit history, recent window as docs/FORMAT.md §5.1 says), which also
 * serves a shared prefix (pages referenced, not copied; ge_sched.h).
 * Decode: oscar_append of one token per sequence, then oscar_decode. */
#ifndef OSCAR_GE_H
#define OSCAR_GE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "ge_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ge_options {
    oscar_method method;      /* BF16 (paged 16-bit) or a 2-bit method */
    const char *params_path;  /* parameter file, or NULL for built-in parameters */
    size_t kv_budget;         /* bytes for all layers' page and window pools */
    int max_batch;            /* window slots = most running sequences */
    int max_seq_len;          /* longest sequence (prompt + generated) */
    int max_prefill_tokens;   /* most prompt tokens in one prefill step */
    int mlp_chunk;            /* MLP rows per GEMM pass (bounds activation memory) */
    int act_f32;              /* 1: fp32 weights and activations (agreement checks) */
    int page_size, sink, recent;
    int device;
    const char *plugin_dir;   /* where liboscar_backend_cuda.so is, or NULL */
    int validate;             /* liboscar host-side validation of every call */
    int check_every;          /* oscar_plan_check every this many steps (0: only at the end) */
    int no_graphs;            /* 1: issue every decode step's launches from the host; 0 (default):
                                 capture a decode step once per (batch size, length bucket) into
                                 a CUDA graph and replay it (docs/API.md, CUDA graphs) */
    int no_pdl;               /* 1: launch the step's kernels plainly; 0 (default): on sm_90 the
                                 engine's norms, SwiGLU, RoPE and GEMVs by programmatic dependent
                                 launch (a GEMV streams its first weights while the kernel before
                                 it runs; same results) */
    int prefill_chunk;        /* chunked prefill through oscar_extend, at most this many tokens of a
                                 prompt per step (default 512; clamped to max_prefill_tokens, and
                                 for 2-bit methods to the recent window W: a longer chunk demotes
                                 its own first tokens before they are attended; ge_engine_notes).
                                 Prompts that fit one step (max_prefill_tokens) are prefilled
                                 whole with exact attention unless chunk_every_prompt. 0: no
                                 chunks (longer prompts are refused) */
    int chunk_every_prompt;   /* 1: every prompt in chunks, also those that fit one step */
    int synth_feedback;       /* 1: built-in oscar2 / oscar2-lm parameters plus synthetic
                                 error-feedback weights of calibrated magnitude (|F| <= 0.2), so a
                                 random-weight model pays the write path of calibrated parameters */
    int no_gemm_tune;         /* 1: cuBLAS's default algorithm for every weight product of more than
                                 4 rows; 0 (default): in decode steps of 5-1024 sequences, the
                                 cuBLASLt algorithm that was fastest (by 3 % or more) when timed
                                 before the first decode step of that batch size's bucket of 16
                                 sizes (5-16, 17-32, ...; ge_gemm.h; results
                                 may differ in the last bits); prefill and mixed steps keep cuBLAS's
                                 default */
} ge_options;

void ge_options_default(ge_options *o);

/* The per-layer cache layout the engine uses for a model and options
 * (group = min(head_dim, 128), F16 metadata, BF16 windows), before the
 * parameters are known: one page size for every layer. */
void ge_layout_make(const oe_config *c, const ge_options *o, oscar_layout_desc *l);
/* The layout the engine will use, parameters included: ge_layout_make, then
 * ge_kv_wide_layout with o->params_path's parameters (loaded here; built-in
 * parameters have no 3-bit head-tensors): a file calibrated with
 * oscar-calibrate --wide-bits serves oscar2 with per-layer pages.
 * layer_page_bytes [c->num_layers] (may be NULL) gets each layer's page size
 * and *max_wide (may be NULL) the most 3-bit head-tensors of a layer; for
 * the ge_kv_* sizing functions before the engine exists (a budget for a
 * batch). */
oscar_status ge_kv_layout(const oe_config *c, const ge_options *o, oscar_layout_desc *l, size_t *layer_page_bytes,
                          int *max_wide);

typedef struct ge_engine ge_engine;

/* Uploads a CPU-engine model (fp32 host weights) converted to bf16 (or fp32). */
oscar_status ge_create_from_model(const oe_model *m, const ge_options *o, ge_engine **out);
/* Random weights generated on the device (hash-based), no host copies. */
oscar_status ge_create_random(const oe_config *cfg, uint64_t seed, const ge_options *o, ge_engine **out);
void ge_destroy(ge_engine *e);

const oe_config *ge_config(const ge_engine *e);
ge_sched *ge_engine_sched(ge_engine *e);
const ge_kv_plan *ge_engine_kv(const ge_engine *e);
/* The cache layout in use (wide_tensors / wide_per_layer set for a file with
 * 3-bit head-tensors) and each layer's page size [num_layers] (all the same
 * without per-layer pages). */
const oscar_layout_desc *ge_engine_layout(const ge_engine *e);
const size_t *ge_engine_layer_page_bytes(const ge_engine *e);
const char *ge_engine_variant(const ge_engine *e);
/* Decode steps replayed from CUDA graphs so far (0 with no_graphs). */
int64_t ge_engine_graph_replays(const ge_engine *e);
/* The weight products tuned so far, one line each (ge_gemm_report). */
void ge_engine_gemm_report(const ge_engine *e, FILE *f);
const char *ge_engine_device(const ge_engine *e);
/* Prefill chunk in use (0: none), after clamping. */
int ge_engine_chunk(const ge_engine *e);
/* What the engine changed in its options and why ("" if nothing), e.g. a
 * chunk clamped to the recent window. */
const char *ge_engine_notes(const ge_engine *e);
/* Device memory the engine allocated: weights, KV pools, workspace, activations. */
void ge_engine_memory(const ge_engine *e, size_t *weights, size_t *kv, size_t *workspace, size_t *activations);

/* One forward step over the sequences in slots[0..n): sequence i brings
 * n_new[i] tokens (tokens concatenated). All n_new == 1: a decode step
 * (oscar_append + oscar_decode). Otherwise a prefill step: when every
 * sequence starts empty (and not chunk_every_prompt) its tokens attend
 * exactly among themselves; else (prefill_chunk > 0) sequences may hold
 * tokens already and the new ones attend over the cache (oscar_append +
 * oscar_extend; a first chunk of at most W tokens sees only 16-bit rows
 * either way). next[i] gets the greedy
 * token after each sequence's last new token; logits (host, [n][vocab],
 * may be NULL) their logits. Advances the scheduler. */
oscar_status ge_step(ge_engine *e, int n, const int32_t *slots, const int32_t *n_new, const int32_t *tokens,
                     int32_t *next, float *logits);
/* A serving engine's warm-up: times the weight products of decode steps of
 * up to max_batch sequences now, one row count per bucket of 16 (ge_gemm.h),
 * instead of in the first decode step of each size (an estimated ~50 ms or
 * more each: ge_gemm.c).
 * Between steps only (it overwrites the step's activation buffers). No-op
 * with no_gemm_tune or the fp32 mode. */
oscar_status ge_tune_decode(ge_engine *e, int max_batch);
/* Profiling of one decode step (opt-in: only ge_profile_step does it; the
 * normal ge_step path records nothing and pays nothing). The phases of the
 * forward step, in order; per-layer phases are summed over the layers. */
typedef enum ge_phase {
    GE_PHASE_EMBED,       /* embedding rows */
    GE_PHASE_ATTN_NORM,   /* RMSNorm before attention (per layer) */
    GE_PHASE_QKV_GEMM,    /* QKV projection (cuBLAS) */
    GE_PHASE_QKV_POST,    /* bias, q/k-norm, RoPE, bf16 q/k/v */
    GE_PHASE_APPEND,      /* oscar_append: liboscar's write path */
    GE_PHASE_ATTENTION,   /* oscar_decode (+ bf16 -> fp32 conversion in the check mode) */
    GE_PHASE_O_GEMM,      /* output projection (+ its bias, if any) */
    GE_PHASE_MLP_NORM,    /* RMSNorm before the MLP */
    GE_PHASE_GATE_UP_GEMM,
    GE_PHASE_SWIGLU,
    GE_PHASE_DOWN_GEMM,
    GE_PHASE_FINAL_NORM,  /* gather of the last rows + final RMSNorm */
    GE_PHASE_LM_HEAD,     /* LM head GEMM */
    GE_PHASE_ARGMAX,
    GE_PHASE_COUNT
} ge_phase;
const char *ge_phase_name(ge_phase p);
/* 1 for the phases that run once per layer. */
int ge_phase_per_layer(ge_phase p);

typedef enum ge_profile_mode {
    GE_PROFILE_PHASES, /* host launches, a CUDA event after every phase of forward() */
    GE_PROFILE_HOST,   /* host launches, events only before and after the step */
    GE_PROFILE_GRAPH   /* the step's CUDA graph replayed (the normal path), events before and after */
} ge_profile_mode;

typedef struct ge_profile {
    double step_us;                    /* first to last event of the step */
    double phase_us[GE_PHASE_COUNT];   /* GE_PROFILE_PHASES: time per phase, summed over layers (else 0) */
    double weight_bytes[GE_PHASE_COUNT]; /* weight bytes each GEMM phase reads per step (0 for the others) */
    int layers;
    int events;                        /* events recorded in the step */
    int gate_timed_out;                /* prequeue: the gate opened on its time limit, not on the host's
                                          signal: the stream's launch queue (about a thousand entries) filled
                                          before the whole step was queued; the GPU then started with a full
                                          queue that the host refills (launch latency only if it drains it) */
} ge_profile;

/* One decode step (n_new = 1 for each of the n sequences, tokens [n]) like
 * ge_step, timed by CUDA events on the engine's stream; advances the
 * scheduler as ge_step does. Events themselves add small gaps between the
 * phases (GE_PROFILE_PHASES). prequeue: hold the stream with a spin kernel
 * (at most 50 ms) until the host has queued every launch of the step, so
 * the times hold no host launch latency; 0 times the step as the host feeds
 * it. The host-launched modes run the step the graph replays (with graphs
 * on, oscar_decode planned for the graph's length bucket). GE_PROFILE_GRAPH
 * needs graphs on (not no_graphs / validate) and captures the step's graph
 * first if it has not been. Refused while ge_set_debug is on. Never inside
 * a graph capture; creates and destroys its own events (and, with
 * prequeue, a mapped host flag) per call. next [n]: the greedy tokens. */
oscar_status ge_profile_step(ge_engine *e, int n, const int32_t *slots, const int32_t *tokens, ge_profile_mode mode,
                             int prequeue, int32_t *next, ge_profile *out);

/* Fills slot's cache up to len tokens with random K/V through oscar_append
 * (layer by layer, chunks of max_prefill_tokens): a cache at a long context
 * for decode timing without running the prompt through the model. */
oscar_status ge_fill_synthetic(ge_engine *e, int32_t slot, int32_t len, uint64_t seed);
/* Synchronizes and reports device errors (CUDA and liboscar's error word). */
oscar_status ge_sync_check(ge_engine *e);

/* Greedy generation of n_req prompts with FIFO admission (ge_sched): out
 * [n_req][max_new] tokens; logits (may be NULL) [n_req][max_new][vocab].
 * stepwise: prompts go through decode steps one token at a time instead of
 * the prefill path (every query then reads the cache, as the CPU engine's
 * KV hook does). Prompts longer than max_prefill_tokens (all, with
 * chunk_every_prompt) go in chunks of prefill_chunk tokens.
 * prefix_len > 0: every prompt starts with the same prefix_len tokens,
 * which are prefilled once and shared (the suffixes go in chunks; the
 * prefix holds one slot until every request is admitted). */
oscar_status ge_generate(ge_engine *e, int n_req, const int32_t *const *prompts, const int32_t *prompt_lens,
                         int max_new, int stepwise, int prefix_len, int32_t *out, float *logits, ge_gen_stats *st);

/* Diagnostics (oscar-gpu-generate --debug-layers). While set, ge_step
 * synchronizes after each stage and hands a host fp32 copy of the device
 * activations to fn: layer -1 "embed" [T][H]; per layer "q" [T][Hq d]
 * (fp32, after q-norm and RoPE), "k", "v" [T][Hkv d] (the bf16 rows the
 * cache gets), "attn" (attention output), "x" (residual after the layer).
 * Slow; NULL turns it off. */
typedef void (*ge_debug_fn)(void *user, int layer, const char *what, const float *data, size_t rows,
                            size_t cols);
void ge_set_debug(ge_engine *e, ge_debug_fn fn, void *user);
/* Downloads every device weight and compares it with the model's host
 * weights; a line on f (may be NULL) per mismatching tensor and for the
 * first layer's; *worst_rel: the largest max|diff| / max|host| (0 in fp32
 * mode when the upload is right, <= 2^-8 or so in bf16). */
oscar_status ge_debug_weights(ge_engine *e, const oe_model *m, FILE *f, double *worst_rel);

#ifdef __cplusplus
}
#endif
#endif
