/* oscar-e2e-bench: end-to-end decode speed of a Qwen3-8B- (or Qwen3-32B-)
 * shaped model with random bf16 weights (generated on the device) under one
 * KV memory budget.
 *
 *   oscar-e2e-bench [--method bf16|oscar2|int2|...] [--shape qwen3-8b|qwen3-32b] [--budget-gb G]
 *       [--prompt P] [--gen N] [--batch B] [--max-batch-cap C] [--real-prefill R] [--time-limit S]
 *       [--long 32768,131072] [--long-steps K] [--layers L] [--no-graphs] [--no-pdl] [--md FILE]
 *       [--chunk C] [--feedback] [--shared-prefix P --requests N --suffix S] [--no-throughput]
 *       [--breakdown [--breakdown-steps K] [--breakdown-warmup W]]
 *
 * --chunk C: the real prefill goes in chunks of C tokens (oscar_append,
 * then oscar_extend over the whole cache; clamped to the recent window for
 * 2-bit methods), so its prefill tok/s is that of chunked prefill.
 * --feedback: oscar2 / oscar2-lm with synthetic error-feedback weights
 * (ge_options.synth_feedback), the write path of calibrated parameters; the
 * default rounds to nearest (the built-in parameters have no weights).
 * --shared-prefix P: instead of the runs above, N requests (--requests,
 * default 16) whose prompts share P random tokens and continue with S own
 * ones (--suffix, default 512), through N + 1 slots, --gen tokens each,
 * chunked prefill (--chunk, default 512): once with the prefix stored once
 * and referenced by every request, once with each request prefilling its
 * whole prompt. Rows: effective prefill tok/s (all prompt tokens served /
 * prefill time) and the requests' KV bytes.
 *
 * --breakdown: instead of timing whole runs, a per-phase breakdown of one
 * decode step (ge_profile_step) for the throughput case (--batch B or the
 * largest batch, context --prompt) and each --long context at batch 1:
 * synthetic caches (no real prefill), W warm-up steps (default 3), then K
 * rounds (default 10) of five steps each: the normal step (ge_step, host
 * wall clock), its CUDA graph replay timed by events, the step with host
 * launches and an event after every phase (pre-queued behind a gate kernel,
 * and fed by the host as it launches), and the host-launched step with
 * events only around it. Medians over the K rounds, one Markdown table per
 * case. --no-throughput: skip the throughput case (also in normal runs).
 *
 * Decode steps are replayed from CUDA graphs unless --no-graphs. --no-pdl: the engine's kernels
 * launched plainly (ge_options.no_pdl; the row says "no PDL"), for an A/B. --no-gemm-tune: cuBLAS's
 * default algorithm for every weight product (ge_options.no_gemm_tune; the row says so), for an A/B;
 * --gemm-report: the tuned products (default and chosen times, ge_gemm.h) to stderr after each run. Each row
 * also gives the roofline step: the bytes a step must read (weights but the
 * embedding table, plus every sequence's cache at its mean length) over the
 * device-to-device copy bandwidth measured at start.
 *
 * Throughput run: the largest batch whose pages and window slots fit G GB
 * for sequences of P + N tokens (or --batch B). R of them (default 1) are
 * prefilled for real through the model (timed: prefill tokens/s); the rest
 * get a synthetic cache of P random K/V rows written through oscar_append
 * (the same write path; decode speed does not depend on the values). Then
 * every sequence decodes N tokens together (greedy), each step timed:
 * generated tokens/s = batch * steps / decode time, time per output token =
 * median step time. --time-limit stops decoding early (reported).
 * Long-context runs: batch 1, synthetic cache of C tokens, K decode steps.
 * Peak device memory is read from cudaMemGetInfo after each run. One
 * Markdown row per run goes to stdout and to --md. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ge.h"
#include "tool_args.h"

/* Submits batch requests of len + gen tokens and admits them all into slots; 0 (said on
 * stderr) if one is refused. */
static int admit_batch(ge_sched *s, int batch, int len, int gen, int32_t *slots) {
    for (int i = 0; i < batch; i++)
        if (ge_sched_submit(s, len, gen, NULL) != OSCAR_OK) {
            fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
            return 0;
        }
    int32_t n = 0;
    if (ge_sched_admit(s, 1 << 30, slots, &n) != OSCAR_OK || n != batch) {
        fprintf(stderr, "oscar-e2e-bench: admitted %d of %d sequences (%s)\n", n, batch, ge_last_error());
        return 0;
    }
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static oe_config qwen3_8b(int layers)
{
    oe_config c;
    memset(&c, 0, sizeof c);
    c.arch = OE_ARCH_QWEN3;
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    c.num_layers = layers;
    c.hidden = 4096;
    c.num_q_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 12288;
    c.vocab = 151936;
    c.max_position = 131072;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = 0;
    c.qk_norm = 1;
    return c;
}

static oe_config qwen3_32b(int layers)
{
    oe_config c = qwen3_8b(layers);
    c.hidden = 5120;
    c.num_q_heads = 64;
    c.intermediate = 25600;
    return c;
}

typedef struct run_result {
    int batch, steps, real_prefill;
    double tok_s, tpot_ms, prefill_tok_s, fill_s, peak_gib, kv_gib, bits;
    double roofline_ms; /* bytes a decode step must read (weights + KV at the mean length) / copy bandwidth */
    int truncated;
    int chunk;          /* prefill chunk in use (0: exact whole-prompt prefill) */
} run_result;

/* Device-to-device copy bandwidth (bytes read + written per second), the
 * roofline of a memory-bound step; measured before any engine exists. */
static double copy_bandwidth(void)
{
    size_t n = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    double bw = 0;
    if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        float best = 1e30f;
        for (int i = 0; i < 8; i++) {
            cudaEventRecord(e0, 0);
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i >= 2 && ms < best) best = ms;
        }
        bw = 2.0 * (double)n / (best * 1e-3);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    cudaFree(a);
    cudaFree(b);
    return bw;
}
static double g_copy_bw;

static int g_gemm_report; /* --gemm-report: the engine's tuned weight products after each run */
static FILE *g_md;

/* The end of a run's engine: its tuned products reported (--gemm-report), then destroyed. */
static void finish_engine(ge_engine *e)
{
    if (g_gemm_report) ge_engine_gemm_report(e, stderr);
    ge_destroy(e);
}

static void md_line(const char *line)
{
    fputs(line, stdout);
    if (g_md) {
        fputs(line, g_md);
        fflush(g_md);
    }
}

static void md(const char *method, const char *run, run_result *r, int context)
{
    char pf[32] = "-";
    if (r->real_prefill) snprintf(pf, sizeof pf, "%.0f", r->prefill_tok_s);
    char line[512];
    snprintf(line, sizeof line, "| %s | %s%s | %d | %d | %.3f | %.1f | %.2f | %.2f | %.2f | %s | %.1f | %.1f |\n",
             method, run, r->truncated ? " (decode stopped early)" : "", context, r->batch, r->bits, r->tok_s,
             r->tpot_ms, r->roofline_ms, r->roofline_ms > 0 ? r->tpot_ms / r->roofline_ms : 0.0, pf, r->kv_gib,
             r->peak_gib);
    md_line(line);
}

/* The engine's warm-up before anything is timed (a serving engine tunes at start, not in its first
 * steps of each batch size); 1 on success. */
static int tune_decode(ge_engine *e, int max_batch)
{
    const double t0 = now_s();
    if (ge_tune_decode(e, max_batch) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        return 0;
    }
    fprintf(stderr, "decode weight products tuned for 1..%d sequences in %.2f s (not timed)\n", max_batch,
            now_s() - t0);
    return 1;
}

/* One engine, `batch` sequences of prompt + gen tokens. */
static int run(const oe_config *c, ge_options o, int batch, int prompt, int gen, int real_prefill, double time_limit,
               uint64_t seed, run_result *r)
{
    /* Prefill chunk in use (the engine may clamp the option). */
    int chunk = 0;
    memset(r, 0, sizeof *r);
    o.max_batch = batch;
    o.max_seq_len = prompt + gen;
    ge_engine *e = NULL;
    double t0 = now_s();
    if (ge_create_random(c, seed, &o, &e) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        return 1;
    }
    size_t mw, mk, mws, ma;
    ge_engine_memory(e, &mw, &mk, &mws, &ma);
    fprintf(stderr, "engine up in %.1f s: weights %.2f GiB, KV %.2f GiB (%d pages/layer, %d slots), workspace %.2f "
                    "GiB, activations %.2f GiB; variant %s\n",
            now_s() - t0, mw / 1073741824.0, mk / 1073741824.0, ge_engine_kv(e)->num_pages,
            ge_engine_kv(e)->num_slots, mws / 1073741824.0, ma / 1073741824.0, ge_engine_variant(e));
    if (o.chunk_every_prompt && *ge_engine_notes(e)) fprintf(stderr, "note: %s\n", ge_engine_notes(e));
    if (!tune_decode(e, batch)) {
        finish_engine(e);
        return 1;
    }
    /* The real prefill goes in chunks with --chunk, or when it does not fit one step. */
    chunk = o.chunk_every_prompt || prompt > o.max_prefill_tokens ? ge_engine_chunk(e) : 0;
    r->chunk = chunk;
    r->kv_gib = mk / 1073741824.0;
    /* The engine's layout and page sizes (per layer for a --wide-bits parameter file). */
    const oscar_layout_desc l = *ge_engine_layout(e);
    const size_t *lpb = ge_engine_layer_page_bytes(e);
    {
        /* A step reads every weight but the embedding table (B rows of it)
         * and each sequence's cache at its length (mean over the decode). */
        size_t seq_bytes = 0;
        ge_kv_seq_bytes(&l, c->num_layers, lpb, prompt + gen / 2, &seq_bytes);
        double embed = c->tie_word_embeddings ? 0.0 : (double)c->vocab * c->hidden * (o.act_f32 ? 4 : 2);
        double bytes = (double)mw - embed + (double)batch * (double)seq_bytes;
        r->roofline_ms = g_copy_bw > 0 ? 1e3 * bytes / g_copy_bw : 0.0;
    }
    ge_kv_bits_per_element(&l, c->num_layers, lpb, prompt + gen, &r->bits);
    ge_sched *s = ge_engine_sched(e);
    int32_t *slots = malloc((size_t)batch * 4), *nn = malloc((size_t)batch * 4), *nx = malloc((size_t)batch * 4);
    int32_t *tok = malloc(((size_t)prompt > (size_t)batch ? (size_t)prompt : (size_t)batch) * 4);
    double *dt = malloc(((size_t)gen + 1) * sizeof *dt);
    int rc = 1;
    if (!slots || !nn || !nx || !tok || !dt) goto out;
    if (!admit_batch(s, batch, prompt, gen, slots)) goto out;
    uint64_t st = seed * 7919u + 1;
    if (real_prefill > batch) real_prefill = batch;
    double tp = now_s();
    for (int i = 0; i < real_prefill; i++) {
        for (int j = 0; j < prompt; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            tok[j] = (int32_t)((st >> 33) % (uint64_t)c->vocab);
        }
        /* Whole, or chunk by chunk, each attending over the cache so far. */
        for (int at = 0; at < prompt;) {
            int take = chunk > 0 && prompt - at > chunk ? chunk : prompt - at;
            if (ge_step(e, 1, &slots[i], &take, tok + at, nx, NULL) != OSCAR_OK) {
                fprintf(stderr, "oscar-e2e-bench: real prefill: %s\n", ge_last_error());
                goto out;
            }
            at += take;
        }
    }
    if (real_prefill) {
        r->real_prefill = real_prefill;
        r->prefill_tok_s = (double)real_prefill * prompt / (now_s() - tp);
        fprintf(stderr, "real prefill: %d x %d tokens%s, %.0f tokens/s\n", real_prefill, prompt,
                chunk ? " in chunks" : "", r->prefill_tok_s);
    }
    tp = now_s();
    for (int i = real_prefill; i < batch; i++)
        if (ge_fill_synthetic(e, slots[i], prompt, seed + (uint64_t)i) != OSCAR_OK) {
            fprintf(stderr, "oscar-e2e-bench: synthetic fill: %s\n", ge_last_error());
            goto out;
        }
    r->fill_s = now_s() - tp;
    fprintf(stderr, "synthetic cache fill: %d x %d tokens in %.1f s\n", batch - real_prefill, prompt, r->fill_s);
    for (int i = 0; i < batch; i++) {
        nn[i] = 1;
        tok[i] = (int32_t)(i % c->vocab);
    }
    /* gen decode steps take every sequence from prompt to prompt + gen tokens. */
    double td = now_s(), total = 0;
    int steps = 0;
    for (; steps < gen; steps++) {
        double a = now_s();
        if (ge_step(e, batch, slots, nn, tok, nx, NULL) != OSCAR_OK) {
            fprintf(stderr, "oscar-e2e-bench: decode step %d: %s\n", steps, ge_last_error());
            goto out;
        }
        dt[steps] = now_s() - a;
        total += dt[steps];
        memcpy(tok, nx, (size_t)batch * 4);
        if (steps == 0) fprintf(stderr, "first decode step: %.2f ms\n", dt[0] * 1e3);
        if (time_limit > 0 && now_s() - td > time_limit && steps + 1 < gen) {
            r->truncated = 1;
            steps++;
            break;
        }
    }
    if (ge_sync_check(e) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        goto out;
    }
    /* The first step pays one-off costs (cuBLAS heuristics): leave it out when there are others. */
    int skip = steps > 1 ? 1 : 0;
    double sum = 0;
    for (int i = skip; i < steps; i++) sum += dt[i];
    qsort(dt + skip, (size_t)(steps - skip), sizeof *dt, cmp_d);
    r->steps = steps;
    r->batch = batch;
    r->tok_s = (double)batch * (steps - skip) / sum;
    r->tpot_ms = 1e3 * dt[skip + (steps - skip) / 2];
    size_t fr = 0, totm = 0;
    cudaMemGetInfo(&fr, &totm);
    r->peak_gib = (double)(totm - fr) / 1073741824.0;
    fprintf(stderr, "decode: %d steps in %.2f s, %.1f tokens/s, median step %.2f ms\n", steps, total, r->tok_s,
            r->tpot_ms);
    rc = 0;
out:
    free(slots);
    free(nn);
    free(nx);
    free(tok);
    free(dt);
    finish_engine(e);
    return rc;
}

/* Median of n values (sorted in place); 0 for none. */
static double median(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Breakdown sample kinds: smp[kind][round]; phase times ph[fed by the host][phase][round]. */
enum { BD_WALL, BD_GRAPH, BD_PHASED_Q, BD_HOST, BD_PHASED_H, BD_N };

/* Per-phase breakdown of a decode step of `batch` sequences at `context`
 * tokens (synthetic caches); one Markdown table. */
static int breakdown(const oe_config *c, ge_options o, int batch, int context, int warmup, int rounds, uint64_t seed,
                     const char *label)
{
    const int graphs = !o.no_graphs;
    const int steps_needed = warmup + 2 + BD_N * rounds;
    o.max_batch = batch;
    o.max_seq_len = context + steps_needed + 8;
    ge_engine *e = NULL;
    double t0 = now_s();
    if (ge_create_random(c, seed, &o, &e) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        return 1;
    }
    size_t mw, mk;
    ge_engine_memory(e, &mw, &mk, NULL, NULL);
    fprintf(stderr, "breakdown %s: engine up in %.1f s, variant %s\n", label, now_s() - t0, ge_engine_variant(e));
    const oscar_layout_desc l = *ge_engine_layout(e);
    /* KV bytes the attention reads per step (every sequence at context + 1),
     * and the roofline step as run() computes it. */
    size_t seq_bytes = 0;
    ge_kv_seq_bytes(&l, c->num_layers, ge_engine_layer_page_bytes(e), context + 1, &seq_bytes);
    const double kv_bytes = (double)batch * (double)seq_bytes;
    const double embed = c->tie_word_embeddings ? 0.0 : (double)c->vocab * c->hidden * (o.act_f32 ? 4 : 2);
    const double roof_us = g_copy_bw > 0 ? 1e6 * ((double)mw - embed + kv_bytes) / g_copy_bw : 0.0;

    ge_sched *s = ge_engine_sched(e);
    int32_t *slots = malloc((size_t)batch * 4), *nn = malloc((size_t)batch * 4), *nx = malloc((size_t)batch * 4),
            *tok = malloc((size_t)batch * 4);
    double *smp = malloc((size_t)rounds * BD_N * sizeof *smp);
    double *ph = malloc((size_t)rounds * 2 * GE_PHASE_COUNT * sizeof *ph); /* [2][phase][round] */
    double *tmp = malloc((size_t)rounds * sizeof *tmp);
    ge_profile pr;
    memset(&pr, 0, sizeof pr);
    int rc = 1, timeouts = 0, events = 0;
    if (!slots || !nn || !nx || !tok || !smp || !ph || !tmp) {
        fprintf(stderr, "oscar-e2e-bench: out of host memory\n");
        goto out;
    }
    if (!admit_batch(s, batch, context, steps_needed, slots)) goto out;
    t0 = now_s();
    for (int i = 0; i < batch; i++)
        if (ge_fill_synthetic(e, slots[i], context, seed + (uint64_t)i) != OSCAR_OK) {
            fprintf(stderr, "oscar-e2e-bench: synthetic fill: %s\n", ge_last_error());
            goto out;
        }
    fprintf(stderr, "synthetic cache fill: %d x %d tokens in %.1f s\n", batch, context, now_s() - t0);
    for (int i = 0; i < batch; i++) {
        nn[i] = 1;
        tok[i] = (int32_t)(i % c->vocab);
    }
#define BD_STEP(call)                                                                                      \
    do {                                                                                                   \
        if ((call) != OSCAR_OK) {                                                                          \
            fprintf(stderr, "oscar-e2e-bench: breakdown step: %s\n", ge_last_error());                      \
            goto out;                                                                                      \
        }                                                                                                  \
        memcpy(tok, nx, (size_t)batch * 4);                                                                \
    } while (0)
    /* Warm-up: the graph captured, cuBLAS heuristics and the host path run once. */
    for (int w = 0; w < warmup; w++) BD_STEP(ge_step(e, batch, slots, nn, tok, nx, NULL));
    BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_PHASES, 1, nx, &pr));
    BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_HOST, 0, nx, &pr));
    for (int r = 0; r < rounds; r++) {
        double a = now_s();
        BD_STEP(ge_step(e, batch, slots, nn, tok, nx, NULL));
        smp[BD_WALL * rounds + r] = 1e6 * (now_s() - a);
        smp[BD_GRAPH * rounds + r] = 0.0;
        if (graphs) {
            BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_GRAPH, 1, nx, &pr));
            smp[BD_GRAPH * rounds + r] = pr.step_us;
            timeouts += pr.gate_timed_out;
        }
        BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_PHASES, 1, nx, &pr));
        smp[BD_PHASED_Q * rounds + r] = pr.step_us;
        timeouts += pr.gate_timed_out;
        events = pr.events;
        for (int p = 0; p < GE_PHASE_COUNT; p++) ph[((size_t)0 * GE_PHASE_COUNT + p) * rounds + r] = pr.phase_us[p];
        BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_HOST, 0, nx, &pr));
        smp[BD_HOST * rounds + r] = pr.step_us;
        BD_STEP(ge_profile_step(e, batch, slots, tok, GE_PROFILE_PHASES, 0, nx, &pr));
        smp[BD_PHASED_H * rounds + r] = pr.step_us;
        for (int p = 0; p < GE_PHASE_COUNT; p++) ph[((size_t)1 * GE_PHASE_COUNT + p) * rounds + r] = pr.phase_us[p];
    }
#undef BD_STEP
    if (ge_sync_check(e) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        goto out;
    }
    double med[BD_N], pq[GE_PHASE_COUNT], phs[GE_PHASE_COUNT], sum_q = 0, sum_h = 0;
    for (int k = 0; k < BD_N; k++) med[k] = median(smp + (size_t)k * rounds, rounds);
    for (int p = 0; p < GE_PHASE_COUNT; p++) {
        memcpy(tmp, ph + ((size_t)0 * GE_PHASE_COUNT + p) * rounds, (size_t)rounds * sizeof *tmp);
        pq[p] = median(tmp, rounds);
        memcpy(tmp, ph + ((size_t)1 * GE_PHASE_COUNT + p) * rounds, (size_t)rounds * sizeof *tmp);
        phs[p] = median(tmp, rounds);
        sum_q += pq[p];
        sum_h += phs[p];
    }
    char line[1536];
    snprintf(line, sizeof line, "\n#### Decode step breakdown: %s, %s\n\n", oscar_method_name(o.method), label);
    md_line(line);
    md_line("| phase | us per step | us per layer | share of step | bytes read per step (MB) | GB/s | of copy BW | "
            "us per step, fed by the host |\n|---|---|---|---|---|---|---|---|\n");
    for (int p = 0; p < GE_PHASE_COUNT; p++) {
        char per_layer[32] = "-", mb[32] = "-", gbs[32] = "-", frac[32] = "-";
        if (ge_phase_per_layer((ge_phase)p)) snprintf(per_layer, sizeof per_layer, "%.1f", pq[p] / c->num_layers);
        double bytes = pr.weight_bytes[p];
        const char *what = "";
        if (p == GE_PHASE_ATTENTION) {
            bytes = kv_bytes;
            what = " (KV)";
        } else if (bytes > 0) {
            what = " (weights)";
        }
        if (bytes > 0) {
            snprintf(mb, sizeof mb, "%.1f%s", bytes / 1e6, what);
            if (pq[p] > 0) {
                snprintf(gbs, sizeof gbs, "%.0f", bytes / (pq[p] * 1e-6) / 1e9);
                if (g_copy_bw > 0) snprintf(frac, sizeof frac, "%.0f %%", 100.0 * bytes / (pq[p] * 1e-6) / g_copy_bw);
            }
        }
        snprintf(line, sizeof line, "| %s | %.1f | %s | %.1f %% | %s | %s | %s | %.1f |\n", ge_phase_name((ge_phase)p),
                 pq[p], per_layer, sum_q > 0 ? 100.0 * pq[p] / sum_q : 0.0, mb, gbs, frac, phs[p]);
        md_line(line);
    }
    double layer_q = 0;
    for (int p = 0; p < GE_PHASE_COUNT; p++)
        if (ge_phase_per_layer((ge_phase)p)) layer_q += pq[p];
    snprintf(line, sizeof line, "| **sum of phases** (host launches, an event after each phase) | %.1f | %.1f (layer "
             "phases) | 100 %% | - | - | - | %.1f |\n", sum_q, layer_q / c->num_layers, sum_h);
    md_line(line);
    md_line("\n");
    if (graphs) {
        snprintf(line, sizeof line, "- CUDA graph replay of the same step (the normal path), events around it: "
                 "**%.1f us**; the phases' sum is %.1f us more (%+.1f %%).\n", med[BD_GRAPH], sum_q - med[BD_GRAPH],
                 med[BD_GRAPH] > 0 ? 100.0 * (sum_q - med[BD_GRAPH]) / med[BD_GRAPH] : 0.0);
        md_line(line);
    }
    snprintf(line, sizeof line, "- Host launches, events only around the step, fed by the host as it launches: %.1f us; "
             "with an event after each phase, pre-queued: %.1f us (first to last event), fed by the host: %.1f us.\n",
             med[BD_HOST], med[BD_PHASED_Q], med[BD_PHASED_H]);
    md_line(line);
    snprintf(line, sizeof line, "- Normal step (ge_step: %s, input upload, token download, host sync), host wall clock: "
             "%.1f us; roofline step (weights but the embedding + KV at context, over the %.0f GB/s copy bandwidth): "
             "%.1f us.\n", graphs ? "graph replay" : "host launches", med[BD_WALL], g_copy_bw / 1e9, roof_us);
    md_line(line);
    char tmo[256] = "";
    if (timeouts)
        snprintf(tmo, sizeof tmo, " In %d of %d pre-queued steps the stream's launch queue (about a thousand entries) "
                 "filled first and the gate opened on its time limit: the GPU then started with a full queue that the "
                 "host refilled.", timeouts, rounds * (graphs ? 2 : 1));
    snprintf(line, sizeof line, "- Medians of %d rounds after %d warm-up steps; %d events per phased step. Every event "
             "recorded between phases adds a small gap of its own on the GPU, so the phase times and their sum "
             "over-state the graph step a little; \"pre-queued\": a gate kernel holds the stream until the host has "
             "queued the whole step (no launch latency in the times); \"fed by the host\": launches as they come "
             "(launch gaps land in the phase that waits for them).%s\n", rounds, warmup, events, tmo);
    md_line(line);
    rc = 0;
out:
    free(slots);
    free(nn);
    free(nx);
    free(tok);
    free(smp);
    free(ph);
    free(tmp);
    finish_engine(e);
    return rc;
}

/* N requests of prefix + suffix random tokens, gen tokens each, through
 * N + 1 slots with chunked prefill; share: the prefix prefilled once and
 * its pages referenced (ge_generate's prefix_len), else every request
 * prefills its whole prompt. One row. */
static int run_shared(const oe_config *c, ge_options o, int prefix, int suffix, int n_req, int gen, int share,
                      const char *label)
{
    o.max_batch = n_req + 1;
    o.max_seq_len = prefix + suffix + gen;
    o.chunk_every_prompt = 1; /* shared or not, every prompt in chunks */
    ge_engine *e = NULL;
    if (ge_create_random(c, 3, &o, &e) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        return 1;
    }
    if (*ge_engine_notes(e)) fprintf(stderr, "note: %s\n", ge_engine_notes(e));
    if (!tune_decode(e, o.max_batch)) {
        finish_engine(e);
        return 1;
    }
    char run_label[256];
    snprintf(run_label, sizeof run_label, "%s, prefill in chunks of %d", label, ge_engine_chunk(e));
    label = run_label;
    const int plen = prefix + suffix;
    int32_t **pr = calloc((size_t)n_req, sizeof *pr), *lens = malloc((size_t)n_req * 4);
    int32_t *out = malloc((size_t)n_req * gen * 4);
    int rc = 1;
    if (!pr || !lens || !out) goto out;
    uint64_t st = 977;
    for (int r = 0; r < n_req; r++) {
        lens[r] = plen;
        if (!(pr[r] = malloc((size_t)plen * 4))) goto out;
        for (int j = 0; j < plen; j++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            pr[r][j] = j < prefix && r > 0 ? pr[0][j] : (int32_t)((st >> 33) % (uint64_t)c->vocab);
        }
    }
    ge_gen_stats gs;
    if (ge_generate(e, n_req, (const int32_t *const *)pr, lens, gen, 0, share ? prefix : 0, out, NULL, &gs) !=
        OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", ge_last_error());
        goto out;
    }
    /* KV bytes the requests hold: their pages (the prefix's full pages once
     * when shared) and window slots, all layers. */
    const oscar_layout_desc l = *ge_engine_layout(e);
    int64_t pages_req, pages_pfx;
    oscar_layout_pages_for(&l, o.max_seq_len, &pages_req);
    oscar_layout_pages_for(&l, prefix, &pages_pfx);
    const ge_kv_plan *kv = ge_engine_kv(e);
    int64_t shared = share ? ge_shared_pages(&l, prefix) : 0;
    int64_t pages = share ? pages_pfx + (int64_t)n_req * (pages_req - shared) : (int64_t)n_req * pages_req;
    double kv_gib = ((double)pages * kv->page_bytes_all_layers +
                     (double)c->num_layers * (double)n_req * kv->window_slot_bytes) / 1073741824.0;
    double bits;
    ge_kv_bits_per_element(&l, c->num_layers, ge_engine_layer_page_bytes(e), o.max_seq_len, &bits);
    size_t fr = 0, totm = 0;
    cudaMemGetInfo(&fr, &totm);
    double pf = (double)n_req * plen / gs.prefill_s;
    fprintf(stderr, "%s: prefill %.2f s (%lld tokens computed for %lld served: %.0f tokens/s effective), decode "
                    "%.2f s, %lld steps\n", label, gs.prefill_s, (long long)gs.prefill_tokens, (long long)n_req * plen,
            pf, gs.decode_s, (long long)gs.steps);
    char line[512];
    snprintf(line, sizeof line, "| %s | %s | %d | %d | %.3f | %.1f | %.2f | - | - | %.0f | %.2f | %.1f |\n",
             oscar_method_name(o.method), label, plen, n_req, bits,
             gs.decode_s > 0 ? (double)gs.decode_tokens / gs.decode_s : 0.0,
             gs.steps ? 1e3 * gs.decode_s / (double)gs.steps : 0.0, pf, kv_gib, (double)(totm - fr) / 1073741824.0);
    md_line(line);
    rc = 0;
out:
    for (int r = 0; pr && r < n_req; r++) free(pr[r]);
    free(pr);
    free(lens);
    free(out);
    finish_engine(e);
    return rc;
}

/* A whole decimal integer in [0, 2^30], or -1. */
static int int_arg(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return end != s && !*end && v >= 0 && v <= 1 << 30 ? (int)v : -1;
}

int main(int argc, char **argv)
{
    tool_watch_stdout("oscar-e2e-bench");
    const char *method_name = "oscar2", *md_path = NULL, *longs = "32768,131072", *params = NULL;
    double budget_gb = 40.0, time_limit = 60.0;
    int prompt = 8192, gen = 1024, batch = 0, cap = 1024, real_prefill = 1, long_steps = 64, layers = 36;
    int max_prefill = 8192, no_graphs = 0, no_pdl = 0, no_gemm_tune = 0, layers_set = 0, chunk = 0, feedback = 0, prefix = 0, n_req = 16,
        suffix = 512, do_breakdown = 0, bd_rounds = 10, bd_warmup = 3, no_throughput = 0;
    const char *shape = "qwen3-8b";
    tool_seen seen = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!tool_args_once(&seen, "oscar-e2e-bench", a, NULL, NULL)) return 2;
        int more = i + 1 < argc;
        if (!strcmp(a, "--method") && more) method_name = argv[++i];
        else if (!strcmp(a, "--budget-gb") && more) budget_gb = atof(argv[++i]);
        else if (!strcmp(a, "--prompt") && more) prompt = atoi(argv[++i]);
        else if (!strcmp(a, "--gen") && more) gen = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && more) batch = atoi(argv[++i]);
        else if (!strcmp(a, "--max-batch-cap") && more) cap = atoi(argv[++i]);
        else if (!strcmp(a, "--real-prefill") && more) real_prefill = atoi(argv[++i]);
        else if (!strcmp(a, "--time-limit") && more) time_limit = atof(argv[++i]);
        else if (!strcmp(a, "--long") && more) longs = argv[++i];
        else if (!strcmp(a, "--long-steps") && more) long_steps = atoi(argv[++i]);
        else if (!strcmp(a, "--layers") && more) {
            layers = atoi(argv[++i]);
            layers_set = 1;
        }
        else if (!strcmp(a, "--max-prefill") && more) max_prefill = atoi(argv[++i]);
        else if (!strcmp(a, "--params") && more) params = argv[++i];
        else if (!strcmp(a, "--md") && more) md_path = argv[++i];
        else if (!strcmp(a, "--no-graphs")) no_graphs = 1;
        else if (!strcmp(a, "--no-pdl")) no_pdl = 1;
        else if (!strcmp(a, "--no-gemm-tune")) no_gemm_tune = 1;
        else if (!strcmp(a, "--gemm-report")) g_gemm_report = 1;
        else if (!strcmp(a, "--feedback")) feedback = 1;
        else if (!strcmp(a, "--chunk") && more) chunk = int_arg(argv[++i]);
        else if (!strcmp(a, "--shared-prefix") && more) prefix = int_arg(argv[++i]);
        else if (!strcmp(a, "--requests") && more) n_req = int_arg(argv[++i]);
        else if (!strcmp(a, "--suffix") && more) suffix = int_arg(argv[++i]);
        else if (!strcmp(a, "--shape") && more) shape = argv[++i];
        else if (!strcmp(a, "--breakdown")) do_breakdown = 1;
        else if (!strcmp(a, "--breakdown-steps") && more) bd_rounds = int_arg(argv[++i]);
        else if (!strcmp(a, "--breakdown-warmup") && more) bd_warmup = int_arg(argv[++i]);
        else if (!strcmp(a, "--no-throughput")) no_throughput = 1;
        else {
            fprintf(stderr, "oscar-e2e-bench: unknown or incomplete option '%s'\n", a);
            return 2;
        }
    }
    oscar_method method;
    if (oscar_method_from_name(method_name, &method) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", oscar_last_error());
        return 2;
    }
    if (prompt <= 0 || gen <= 0 || layers <= 0 || budget_gb <= 0) {
        fprintf(stderr, "oscar-e2e-bench: --prompt, --gen, --layers and --budget-gb must be positive\n");
        return 2;
    }
    if (chunk < 0 || prefix < 0 || n_req <= 0 || suffix <= 0) {
        fprintf(stderr, "oscar-e2e-bench: --chunk and --shared-prefix must be integers >= 0 (0: off), --requests and "
                        "--suffix positive integers\n");
        return 2;
    }
    if (chunk > (prompt < max_prefill ? prompt : max_prefill) && !prefix) {
        fprintf(stderr, "oscar-e2e-bench: --chunk %d is longer than the prompt (%d) or --max-prefill (%d)\n", chunk,
                prompt, max_prefill);
        return 2;
    }
    if (bd_rounds < 1 || bd_rounds > 1000 || bd_warmup < 0 || bd_warmup > 1000) {
        fprintf(stderr, "oscar-e2e-bench: --breakdown-steps takes 1..1000, --breakdown-warmup 0..1000\n");
        return 2;
    }
    if (do_breakdown && prefix) {
        fprintf(stderr, "oscar-e2e-bench: --breakdown times decode steps; it does not go with --shared-prefix\n");
        return 2;
    }
    if (feedback && method != OSCAR_METHOD_OSCAR2 && method != OSCAR_METHOD_OSCAR2_LM) {
        fprintf(stderr, "oscar-e2e-bench: --feedback goes with oscar2 or oscar2-lm (error-feedback rounding), not %s\n",
                oscar_method_name(method));
        return 2;
    }
    if (md_path && !(g_md = fopen(md_path, "a"))) {
        fprintf(stderr, "oscar-e2e-bench: cannot open %s\n", md_path);
        return 1;
    }
    int big = !strcmp(shape, "qwen3-32b");
    if (!big && strcmp(shape, "qwen3-8b")) {
        fprintf(stderr, "oscar-e2e-bench: --shape %s; known: qwen3-8b, qwen3-32b\n", shape);
        return 2;
    }
    oe_config c = big ? qwen3_32b(layers_set ? layers : 64) : qwen3_8b(layers);
    g_copy_bw = copy_bandwidth();
    fprintf(stderr, "%s shape, %d layers; copy roofline %.0f GB/s (read + written)\n", shape, c.num_layers,
            g_copy_bw / 1e9);
    ge_options o;
    ge_options_default(&o);
    o.method = method;
    o.no_graphs = no_graphs;
    o.no_pdl = no_pdl;
    o.no_gemm_tune = no_gemm_tune;
    o.params_path = params;
    o.kv_budget = (size_t)(budget_gb * 1e9);
    o.max_prefill_tokens = prompt < max_prefill ? prompt : max_prefill;
    o.check_every = 256;
    o.max_seq_len = prompt + gen;
    if (chunk > 0) {
        o.prefill_chunk = chunk;
        o.chunk_every_prompt = 1;
    }
    o.synth_feedback = feedback;
    /* Write-path rounding of the 2-bit rows, in every row's label. */
    const char *rnd = method == OSCAR_METHOD_BF16 || method == OSCAR_METHOD_INT2 || method == OSCAR_METHOD_QUAROT2
                          ? "" : params ? ", parameter file" : feedback ? ", feedback weights" : ", nearest rounding";
    if (prefix) {
        o.max_prefill_tokens = max_prefill;
        char lab[192];
        int rc = 0;
        for (int share = 1; share >= 0 && rc == 0; share--) {
            snprintf(lab, sizeof lab, "%s, %d requests x (%d shared + %d own) + %d, %s%s", shape, n_req, prefix,
                     suffix, gen, share ? "prefix stored once" : "no sharing (each prefills its whole prompt)", rnd);
            rc = run_shared(&c, o, prefix, suffix, n_req, gen, share, lab);
        }
        if (g_md) fclose(g_md);
        return rc;
    }
    /* The layout with what the parameter file asks (3-bit head-tensors: per-layer pages). */
    oscar_layout_desc l;
    size_t *lpb = calloc((size_t)c.num_layers, sizeof *lpb);
    int best = 0;
    if (!lpb || ge_kv_layout(&c, &o, &l, lpb, NULL) != OSCAR_OK ||
        ge_max_batch(&l, c.num_layers, lpb, o.kv_budget, prompt + gen, &best, NULL) != OSCAR_OK) {
        fprintf(stderr, "oscar-e2e-bench: %s\n", lpb ? ge_last_error() : "out of memory");
        free(lpb);
        return 1;
    }
    double bpt;
    size_t seq_bytes;
    ge_kv_bytes_per_token(&l, c.num_layers, lpb, &bpt);
    ge_kv_seq_bytes(&l, c.num_layers, lpb, prompt + gen, &seq_bytes);
    fprintf(stderr, "%s: %.1f KB KV per token (paged), %.1f MB per %d-token sequence; largest batch in %.1f GB: %d\n",
            oscar_method_name(method), bpt / 1e3, seq_bytes / 1e6, prompt + gen, budget_gb, best);
    int b = batch > 0 ? batch : best;
    if (b > cap) b = cap;
    if (b <= 0) {
        fprintf(stderr, "oscar-e2e-bench: not one sequence of %d tokens fits %.1f GB\n", prompt + gen, budget_gb);
        free(lpb);
        return 1;
    }
    char cfg[320], gl[96];
    snprintf(gl, sizeof gl, "%s%s%s", no_graphs ? "host launches" : "CUDA graphs", no_pdl ? ", no PDL" : "",
             no_gemm_tune ? ", cuBLAS default GEMMs" : "");
    int rc = 0;
    if (do_breakdown) {
        /* The throughput case's batch (largest for prompt + gen in the budget, or --batch) at the
         * prompt's context, then batch 1 at each --long context. */
        if (!no_throughput) {
            if (batch > 0)
                snprintf(cfg, sizeof cfg, "%s, %.0f GB, batch %d, context %d, %s%s", shape, budget_gb, b, prompt, gl, rnd);
            else
                snprintf(cfg, sizeof cfg, "%s, %.0f GB, largest batch %d (for %d+%d), context %d, %s%s", shape,
                         budget_gb, b, prompt, gen, prompt, gl, rnd);
            rc = breakdown(&c, o, b, prompt, bd_warmup, bd_rounds, 1, cfg);
        }
        for (const char *p = longs; rc == 0 && p && *p;) {
            int ctx = atoi(p);
            if (ctx > 0) {
                ge_options lo = o;
                lo.max_seq_len = ctx + bd_warmup + 2 + BD_N * bd_rounds + 8;
                oscar_layout_desc ll = l; /* lo's layout: only max_seq_len differs */
                ll.max_seq_len = lo.max_seq_len;
                size_t need;
                ge_kv_seq_bytes(&ll, c.num_layers, lpb, lo.max_seq_len, &need);
                lo.kv_budget = need + (size_t)c.num_layers * (1u << 20); /* > one page */
                snprintf(cfg, sizeof cfg, "%s, batch 1, context %d, %s%s", shape, ctx, gl, rnd);
                rc = breakdown(&c, lo, 1, ctx, bd_warmup, bd_rounds, 2, cfg);
            }
            p = strchr(p, ',');
            if (p) p++;
        }
        if (g_md) fclose(g_md);
        free(lpb);
        return rc;
    }
    if (!no_throughput) {
        run_result r;
        rc = run(&c, o, b, prompt, gen, real_prefill, time_limit, 1, &r);
        char pfl[48] = "";
        if (r.chunk > 0) snprintf(pfl, sizeof pfl, ", prefill in chunks of %d", r.chunk);
        if (batch > 0)
            snprintf(cfg, sizeof cfg, "%s, %.0f GB, %d+%d, batch %d, %s%s%s", shape, budget_gb, prompt, gen, b, gl, rnd,
                     pfl);
        else
            snprintf(cfg, sizeof cfg, "%s, %.0f GB, %d+%d, largest batch %d, %s%s%s", shape, budget_gb, prompt, gen,
                     best, gl, rnd, pfl);
        if (rc == 0) md(oscar_method_name(method), cfg, &r, prompt);
    }
    /* Batch 1 at long context. */
    for (const char *p = longs; rc == 0 && p && *p;) {
        int ctx = atoi(p);
        if (ctx > 0) {
            ge_options lo = o;
            lo.max_seq_len = ctx + long_steps;
            oscar_layout_desc ll = l; /* lo's layout: only max_seq_len differs */
            ll.max_seq_len = lo.max_seq_len;
            size_t need;
            ge_kv_seq_bytes(&ll, c.num_layers, lpb, ctx + long_steps, &need);
            lo.kv_budget = need + (size_t)c.num_layers * (1u << 20); /* > one page */
            run_result lr;
            if (run(&c, lo, 1, ctx, long_steps, 0, time_limit, 2, &lr) == 0) {
                snprintf(cfg, sizeof cfg, "%s, batch 1, %d context, %s%s", shape, ctx, gl, rnd);
                md(oscar_method_name(method), cfg, &lr, ctx);
            } else rc = 1;
        }
        p = strchr(p, ',');
        if (p) p++;
    }
    if (g_md) fclose(g_md);
    free(lpb);
    return rc;
}
