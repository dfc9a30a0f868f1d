/* oscar-eval internals shared by its source files (tools/oscar_eval*.c). */
#ifndef OSCAR_EVAL_H
#define OSCAR_EVAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "oscar/oscar.h"
#include "oscar_eval_storage.h"

#define EV_MAX_THREADS 64
#define EV_MAX_VARIANTS 64
/* --tasks: key-value lookup documents (tools/oscar_eval_tasks.c). */
#define EV_TASK_FACTS 8       /* facts per document, each queried once at its end */
#define EV_TASK_FACT_LEN 8    /* "The code of X D1 D2 D3 ." */
#define EV_TASK_ANSWER_LEN 3  /* digit tokens scored per query */
#define EV_TASK_MAX_NAMES 64
#define EV_TASK_CTX 2         /* contexts evaluated: 1024 and 2048 */

/* One evaluated configuration: a method, its parameters and windows. */
typedef struct ev_variant {
    char name[176];               /* key in report.json ("oscar2[" SPEC "]": SPEC up to 159) */
    char note[200];               /* what it is, for the report */
    oscar_method method;          /* BF16: the reference (no 2-bit region) */
    const oscar_params *params;   /* NULL for methods without rotation/clip */
    int sink, recent, group;
    int ablation;                 /* 1: "ablations"; 2: "per_layer"; -1: reference not asked for */
    int only_layer;               /* >= 0: quantize this layer only (per-layer diagnosis) */
    int same_as;                  /* >= 0: identical to that variant, not run again */
    const ev_storage *storage;    /* --storage: a storage-format ablation of oscar2 (NULL: none) */
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
    int task;   /* 1: key-value lookup document; task_ctx indexes the task contexts */
    int task_ctx;
    int answer_rows[EV_TASK_FACTS]; /* task: row predicting each query's first answer digit */
} ev_job;

/* Sums over the scored rows of one job for one variant. */
typedef struct ev_stats {
    double nll, kl;
    int64_t top1, scored;
    int64_t ret_correct, ret_total;
    int64_t base_correct, base_total; /* reference only: first copy (nothing to retrieve) */
    int64_t task_correct, task_first, task_total; /* key-value lookup: queries with all answer digits right,
                                                      with the first digit right, queries */
    double seconds, hook_seconds;
    int64_t kept; /* --storage out=: rows (per KV head, K or V) kept bf16 by the hook */
} ev_stats;

typedef struct ev_hook {
    const ev_variant *var;
    int Hkv, d, threads;
    double hook_s;
    long long kept; /* --storage out=: rows kept bf16 (a check that the ablation ran) */
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
    double task_acc[EV_TASK_CTX];   /* key-value lookup accuracy per task context (NaN: not run) */
    double task_first[EV_TASK_CTX]; /* the same counting the first digit only */
    int64_t task_total[EV_TASK_CTX];
    double seconds, hook_seconds;
    int64_t kept;
} ev_total;
void ev_totals(const ev_run *R, int v, ev_total *out);

typedef struct ev_settings {
    const char *model_dir, *params_path, *params_lm_path, *tokens_path, *out_json, *out_md, *out_plot;
    int ctx, windows, sink, recent, group, threads, workers, engine_threads, chunk;
    int64_t eval_tokens, tokens_in_file;
    int ret_trials, ret_len, ret_first, ret_second;
    const char *ret_source;
    double ret_base;
    int task_docs, task_ctx[EV_TASK_CTX]; /* --tasks: documents per context (0: off), contexts */
    uint64_t seed;
    double wall_s, cpu_s;
    char started[32];
} ev_settings;

/* The tools' pseudo-random generator (xorshift64): retrieval sequences, lookup documents. */
static inline uint64_t ev_xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Token ids the lookup documents are made of, from the model's tokenizer.json. */
typedef struct ev_task_vocab {
    int the, code, of, period;
    int digit_sp[10], digit[10]; /* " 7" (word start) and "7" */
    int names[EV_TASK_MAX_NAMES], nnames;
} ev_task_vocab;
/* 0, or -1 with a message (no tokenizer.json, or words without a single token). */
int ev_task_vocab_load(const char *model_dir, int vocab, ev_task_vocab *tv, char *err, size_t errlen);
/* One document of ctx tokens into doc from the text tokens (facts in the
 * 2-bit region of a cache with these windows, queries at the end);
 * answer_rows[q]: the row predicting query q's first digit. 0, or -1 when ctx
 * is too short for the facts to lie outside the windows (or text too short). */
int ev_task_build(const ev_task_vocab *tv, const uint32_t *text, int64_t ntext, int ctx, int sink, int recent,
                  uint64_t seed, uint32_t *doc, int *answer_rows);
/* 1 when a document of ctx tokens can keep its facts outside the windows (ev_task_build's rule
 * without the text): checked before the model load. */
int ev_task_fits(int ctx, int sink, int recent);

/* report.json, report.md and the plot; returns 0 or prints why not. */
int ev_write_json(const ev_run *R, const ev_settings *S);
int ev_write_md(const ev_run *R, const ev_settings *S);
int ev_write_plot(const ev_run *R, const ev_settings *S);

#endif
