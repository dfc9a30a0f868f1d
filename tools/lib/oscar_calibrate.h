/* Calibration drivers (library oscar_calibrate_drv, tools/lib/), called by
 * oscar-calibrate and its tests: runs
 * the reference engine over independent windows of a token file and feeds
 * the calibration core (two passes), then finalizes. */
#ifndef OSCAR_CALIBRATE_H
#define OSCAR_CALIBRATE_H

#include <stdint.h>
#include <stdio.h>

#include "engine.h"
#include "oscar/oscar.h"

/* How pass 1 gets its keys and values. */
typedef enum ocal_pass1 {
    OCAL_PASS1_AUTO = 0,      /* cache when it fits under cache_limit_bytes, else recompute */
    OCAL_PASS1_CACHE = 1,     /* keep pass 0's fp32 K/V of every window: pass 1 runs no forward */
    OCAL_PASS1_RECOMPUTE = 2  /* run the forward again */
} ocal_pass1;

typedef struct ocal_options {
    int window;              /* tokens per independent window (default 2048) */
    int64_t max_tokens;      /* use floor(min(max_tokens, tokens) / window) windows (default 65536) */
    int group;               /* quant group for clip fitting (0: head_dim) */
    int per_head;            /* 1: one rotation per KV head, 0: per layer; -1 (default): the library's (per head) */
    int lloyd_max;           /* OSCAR2_LM instead of OSCAR2 */
    float clip_k, clip_v;    /* 0: fit */
    int sink, recent;        /* cache layout the clips are fitted for (0: the core's defaults 64, 256; < 0: none) */
    int clip_objective;      /* 0: attention probes (default), 1: held-back rows */
    int permutation;         /* oscar_calib_options.permutation; -1 (default): the library's (m-sequence) */
    int rounding;            /* oscar_calib_options.rounding; -1 (default): the library's (error feedback) */
    int copy_windows;        /* copy windows for copy probes (oscar_calib_feed_copy); -1 (default): ocal's
                                default, 0: none. Window w of the calibration windows gives its first
                                sink tokens, then its next (window - sink) / 2 tokens twice */
    float copy_mass_loss;    /* oscar_calib_options.copy_mass_loss; < 0 (default): the library's */
    int clip_per_head;       /* oscar_calib_options.clip_per_head; -1 (default): the library's */
    float key_attn_weight;   /* oscar_calib_options.key_attn_weight; < 0 (default): the library's */
    int threads;             /* oscar_calib_options.threads (finalize's workers); 0 (default): the library's */
    int probe_queries;       /* oscar_calib_options.probe_queries; 0 (default): the library's */
    float clip_margin;       /* oscar_calib_options.clip_margin; < 0 (default): the library's */
    int probe_span;          /* oscar_calib_options.probe_span; -1 (default): the library's */
    float feedback_damp;     /* oscar_calib_options.feedback_damp; <= 0 (default): the library's */
    float wide_bits;         /* oscar_calib_options.wide_bits; < 0 (default, ocal_options_default): the
                                library's (OSCAR_CALIB_WIDE_BITS_AUTO: 0.05 for OSCAR2 with the probe
                                objective, else 0); 0: every head-tensor at 2 bits */
    float copy_head_mass;    /* oscar_calib_options.copy_head_mass; <= 0 (default): off. On, copy_windows -1
                                means OCAL_COPY_HEAD_WINDOWS copy windows */
    float copy_head_clip;    /* oscar_calib_options.copy_head_clip; <= 0 (default): the library's (0.97) */
    ocal_pass1 pass1;
    int64_t cache_limit_bytes; /* AUTO: largest K/V cache allowed (0: half the physical memory) */
    FILE *progress;          /* progress lines (pass, window i/n, tokens/s, ETA); NULL: silent */
} ocal_options;

typedef struct ocal_stats {
    int windows;
    int64_t tokens;           /* tokens per pass */
    int cached;               /* 1 when pass 1 came from the K/V cache */
    int64_t cache_bytes;
    double t_pass[2];         /* seconds of pass 0 / pass 1 (forwards + feeding) */
    double t_feed[2];         /* of which inside oscar_calib_feed */
    double t_finalize;
    double c_pass[2], c_finalize; /* process CPU seconds of those phases (all threads): comparable on a shared machine */
} ocal_stats;

void ocal_options_default(ocal_options *o);

/* Stable fingerprint of the config fields the parameters depend on:
 * FNV-1a 64 over "arch=..;layers=..;hidden=..;heads=..;kv_heads=..;head_dim=..;
 * rope_theta=..;qk_norm=..;vocab=..", as 16 lowercase hex digits (out >= 17 bytes). */
void ocal_model_hash(const oe_config *cf, char *out);

/* head_dim and quant group of a model checked against the storage format through the public API
 * (the rule lives in format/oscar_format.h): *group 0 becomes the calibration default of head_dim.
 * Returns OSCAR_OK, or OSCAR_ERR_UNSUPPORTED_HEAD_DIM / _GROUP with the library's message in err. */
oscar_status ocal_check_shape(int head_dim, int *group, char *err, size_t err_len);

/* Number of windows the options give over n_tokens tokens (0: not even one). */
int ocal_window_count(const ocal_options *o, int64_t n_tokens);
/* OSCAR_OK when o asks no copy windows or its windows hold them (oscar_calib_feed_copy's rule for the
 * repeated span feed_copy_windows makes of each --window); else INVALID_ARGUMENT and the message, naming the
 * smallest --window that does. ocal_run checks it first; a tool checks it before loading the model. */
oscar_status ocal_check_copy_windows(const ocal_options *o, char *err, size_t err_len);
/* OSCAR_OK, or OSCAR_ERR_INVALID_ARGUMENT with the smallest --window in err when the probe objective
 * is asked for (clip_objective 0) and a window is shorter than sink + recent + 33, which gives no
 * attention probe (every layer would fall back to the held-back rows). */
oscar_status ocal_check_probe_window(const ocal_options *o, char *err, size_t err_len);

/* Runs both passes and finalizes. On success *calib (finalized, for targets
 * and the layer report) and *params belong to the caller. On failure returns
 * the status and writes a message naming the problem into err. */
oscar_status ocal_run(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, const ocal_options *o,
                      oscar_calib **calib, oscar_params **params, ocal_stats *stats, char *err, size_t err_len);

/* ------------------------------------------------------------------------
 * End-to-end clip search (tools/lib/oscar_calibrate_search.c). After finalize the
 * clips are refined per layer by the mean KL(p_bf16 || p_quantized) of the
 * next-token distributions on held-out windows of the calibration text (not
 * the windows the covariances came from), with the cache quantized exactly as
 * oscar-eval does it (bf16 rows, 2-bit region S0 <= p <= t - W). Greedy
 * coordinate descent over the layers in order: at layer l the residual stream
 * entering l (earlier layers at their chosen clips) is kept per window, so a
 * candidate reruns layers l.. only; c_K then c_V move one grid step at a
 * time from their current value while the KL falls. */
typedef struct ocal_search_options {
    int windows;            /* held-out windows (0: no search) */
    int window;             /* tokens per window */
    int sink, recent;       /* cache layout (the eval's S0, W) */
    int group;              /* quant group (0: head_dim) */
    oscar_method method;    /* OSCAR2 or OSCAR2_LM */
    int sweeps;             /* passes over all layers (default 1) */
    int fix_k, fix_v;       /* 1: leave that clip as it is */
    FILE *progress;         /* one line per layer; NULL: silent */
} ocal_search_options;

typedef struct ocal_search_stats {
    double kl_start, kl_final;     /* mean KL per scored row (nats) at the start / chosen clips */
    double dnll_start, dnll_final; /* mean NLL minus the bf16 reference's, per scored row */
    int64_t scored;                /* rows scored per evaluation (all windows) */
    int evals;                     /* candidate clip settings evaluated */
    double forward_equiv;          /* layer forwards run / num_layers, per window */
    double seconds;
} ocal_search_stats;

void ocal_search_options_default(ocal_search_options *o);

/* The forward's kv_quant hook the search runs (and its tests check): the
 * cache as oscar-eval's hook stores it, every row copied, the rows some query
 * reads in 2 bits (S0 <= p <= n - 1 - W) rounded to bf16 (the cache's input
 * dtype) and quantize-dequantized with p. user: an ocal_kv_quant; on failure
 * its st/msg say why. */
typedef struct ocal_kv_quant {
    const oscar_params *p;
    oscar_method method;
    int group, sink, recent, hkv, d;
    oscar_status st;
    char msg[400];
} ocal_kv_quant;
oscar_status ocal_kv_quant_hook(void *user, int layer, int n, const float *k, const float *v, float *kq, float *vq);

/* Tokens needed: windows * window. p's clips are updated in place. */
oscar_status ocal_clip_search(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, oscar_params *p,
                              const ocal_search_options *o, ocal_search_stats *st, char *err, size_t err_len);

/* Mean KL and delta NLL per scored row of p on the same held-out windows,
 * without changing anything (what the search minimises). */
oscar_status ocal_heldout_kl(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, const oscar_params *p,
                             const ocal_search_options *o, double *kl, double *dnll, char *err, size_t err_len);

#endif
