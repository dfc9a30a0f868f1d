/* oscar-eval internals shared by its source files (tools/oscar_eval*.c). */
#ifndef OSCAR_EVAL_H
#define OSCAR_EVAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "oscar/oscar.h"

#define EV_MAX_THREADS 64
#define EV_MAX_VARIANTS 64

/* One evaluated configuration: a method, its parameters and windows. */
typedef struct ev_variant {
    char name[64];                /* key in report.json */
    char note[200];               /* what it is, for the report */
    oscar_method method;          /* BF16: the reference (no 2-bit region) */
    const oscar_params *params;   /* NULL for methods without rotation/clip */
    int sink, recent, group;
    int ablation;                 /* 1: "ablations"; 2: "per_layer"; -1: reference not asked for */
    int only_layer;               /* >= 0: quantize this layer only (per-layer diagnosis) */
    int same_as;                  /* >= 0: identical to that variant, not run again */
    double bits;                  /* bits per element of the 2-bit (quantized) region */
    double bits_seq;              /* whole sequence at the context, 16-bit windows counted */
} ev_variant;

/* One forward unit: an eval window or a retrieval trial. Rows [r0, r1) are
 * scored; row i predicts tokens[i + 1]. */
typedef struct ev_job {
    const uint32_t *tokens;
    int n, r0, r1;
    int b0, b1; /* retrieval: rows of the first copy, scored for the reference only */
    int retrieval, index;
} ev_job;

/* Sums over the scored rows of one job for one variant. */
typedef struct ev_stats {
    double nll, kl;
    int64_t top1, scored;
    int64_t ret_correct, ret_total;
    int64_t base_correct, base_total; /* reference only: first copy (nothing to retrieve) */
    double seconds, hook_seconds;
} ev_stats;

typedef struct ev_hook {
    const ev_variant *var;
    int Hkv, d, threads;
    double hook_s;
} ev_hook;

typedef struct ev_run {
    const oe_model *model;
    int ctx, vocab, Hkv, d;
    int chunk; /* > 0: chunked-prefill schedule of chunk tokens (--chunk); 0: token by token */
    ev_variant vars[EV_MAX_VARIANTS];
    int nvar, ref_index;
    ev_job *jobs;
    int njobs;
    ev_stats *stats; /* [njobs][nvar] */
    atomic_int next_job, done_jobs, failed;
    pthread_mutex_t log_mu;
    double t_start;
} ev_run;

/* Runs every job on `workers` threads (one engine context each); the KV hook
 * splits its rows over hook_threads threads. */
oscar_status ev_execute(ev_run *R, int workers, int hook_threads, char *err, size_t errlen);
double ev_now(void);
double ev_cpu_seconds(void);

/* Totals of one variant over all jobs (sums in job order: deterministic). */
typedef struct ev_total {
    double ppl, nll, kl, top1, retrieval;
    int64_t scored, ret_total;
    double seconds, hook_seconds;
} ev_total;
void ev_totals(const ev_run *R, int v, ev_total *out);

typedef struct ev_settings {
    const char *model_dir, *params_path, *params_lm_path, *tokens_path, *out_json, *out_md, *out_plot;
    int ctx, windows, sink, recent, group, threads, workers, engine_threads, chunk;
    int64_t eval_tokens, tokens_in_file;
    int ret_trials, ret_len, ret_first, ret_second;
    const char *ret_source;
    double ret_base;
    uint64_t seed;
    double wall_s, cpu_s;
    char started[32];
} ev_settings;

/* report.json, report.md and the plot; returns 0 or prints why not. */
int ev_write_json(const ev_run *R, const ev_settings *S);
int ev_write_md(const ev_run *R, const ev_settings *S);
int ev_write_plot(const ev_run *R, const ev_settings *S);

#endif
