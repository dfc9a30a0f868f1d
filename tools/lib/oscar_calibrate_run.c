/* Calibration driver: engine forwards over independent windows feeding the
 * calibration core (see oscar_calibrate.h).
 *
 * Pass 1 needs only the post-RoPE keys and values (oscar_calib_feed ignores
 * q in pass 1), so by default pass 0 keeps every window's fp32 K/V of every
 * layer and pass 1 feeds them back without a forward. The feed sequence
 * (window by window, layer 0..L-1, same fp32 data, same single-threaded
 * BLAS as inside oe_forward) is the one a recomputing pass 1 makes, so the
 * result is bit-identical; OCAL_PASS1_RECOMPUTE exists to check that. The
 * cache grows with the tokens (windows * layers * window * 2 Hkv * d * 4 bytes);
 * the calibration core's own memory does not. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "oscar_calibrate.h"

/* OpenBLAS thread control (libopenblas is linked through the engine). The
 * engine runs its forward with one BLAS thread; feeding from the cache does
 * the same so both pass-1 paths run the same dsyrk/dsymm code. */
int openblas_get_num_threads(void);
void openblas_set_num_threads(int num_threads);

static double ocal_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (every thread). */
static double ocal_cpu(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ocal_options_default(ocal_options *o) {
    memset(o, 0, sizeof *o);
    o->window = 2048;
    o->max_tokens = 65536;
    o->pass1 = OCAL_PASS1_AUTO;
    o->permutation = -1;
    o->rounding = -1;
    o->copy_windows = -1;
    o->copy_mass_loss = -1.0f;
    o->clip_per_head = -1;
    o->key_attn_weight = -1.0f;
    o->per_head = -1;
    o->clip_margin = -1.0f;
    o->probe_span = -1;
    o->wide_bits = -1.0f; /* the library's: its code-width budget where it applies */
}

/* Copy windows when ocal_options.copy_windows is -1, and copy probes (query
 * positions) each window offers per KV head. */
#define OCAL_COPY_WINDOWS_DEFAULT 0
#define OCAL_COPY_PROBES_PER_WINDOW 4
/* Copy windows when copy heads are named (copy_head_mass > 0) and copy_windows is -1: 8 windows, 32
 * probes per KV head (docs/EVAL.md, twenty-fourth session). */
#define OCAL_COPY_HEAD_WINDOWS 8

void ocal_model_hash(const oe_config *cf, char *out) {
    char buf[512];
    /* model_type, not the engine's layout: liboscar.hf.model_fingerprint writes the same for any model. */
    snprintf(buf, sizeof buf,
             "arch=%s;layers=%d;hidden=%d;heads=%d;kv_heads=%d;head_dim=%d;rope_theta=%.17g;qk_norm=%d;vocab=%d",
             cf->model_type, cf->num_layers, cf->hidden, cf->num_q_heads,
             cf->num_kv_heads, cf->head_dim, cf->rope_theta, cf->qk_norm, cf->vocab);
    /* RoPE scaling changes every layer's keys and queries: named when not the default (the default's hash
     * stays what files calibrated before it carry) */
    static const char *const rope_names[] = {"default", "linear", "llama3", "yarn"};
    if (cf->rope.type != OE_ROPE_DEFAULT)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), ";rope_type=%s", rope_names[cf->rope.type]);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)buf; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    snprintf(out, 17, "%016" PRIx64, h);
}

oscar_status ocal_check_shape(int head_dim, int *group, char *err, size_t err_len) {
    if (*group == 0) {
        oscar_calib_options co;
        oscar_calib_options_default(&co, 1, 1, 1, head_dim);
        *group = co.group;
    }
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = head_dim;
    l.group = *group;
    oscar_status s = oscar_layout_validate(&l);
    if (s != OSCAR_OK) snprintf(err, err_len, "%s", oscar_last_error());
    return s;
}

int ocal_window_count(const ocal_options *o, int64_t n_tokens) {
    if (o->window <= 0) return 0;
    int64_t n = o->max_tokens > 0 && o->max_tokens < n_tokens ? o->max_tokens : n_tokens;
    int64_t w = n / o->window;
    return w > INT32_MAX ? INT32_MAX : (int)w;
}

typedef struct feed_state {
    oscar_calib *calib;
    int L, hkv, d, n;
    float *cache;     /* [windows][L][2][n][hkv][d] or NULL */
    int window;       /* current window index */
    oscar_status status;
    double t_feed;    /* seconds inside oscar_calib_feed */
} feed_state;

static float *cache_slot(const feed_state *f, int window, int layer, int which) {
    size_t per = (size_t)f->n * (size_t)f->hkv * (size_t)f->d;
    return f->cache + (((size_t)window * (size_t)f->L + (size_t)layer) * 2 + (size_t)which) * per;
}

/* Pass 0 observer: q/k/v -> C_Q, and K/V into the cache. */
static oscar_status observe_pass0(void *user, int layer, int n, const float *q, const float *k, const float *v) {
    feed_state *f = user;
    double t0 = ocal_now();
    oscar_status s = oscar_calib_feed(f->calib, layer, n, q, k, v, OSCAR_DTYPE_F32);
    f->t_feed += ocal_now() - t0;
    if (s) return f->status = s;
    if (f->cache) {
        size_t bytes = (size_t)n * (size_t)f->hkv * (size_t)f->d * sizeof(float);
        memcpy(cache_slot(f, f->window, layer, 0), k, bytes);
        memcpy(cache_slot(f, f->window, layer, 1), v, bytes);
    }
    return OSCAR_OK;
}

/* Pass 1 observer (recompute path): k/v -> C_V. */
static oscar_status observe_pass1(void *user, int layer, int n, const float *q, const float *k, const float *v) {
    feed_state *f = user;
    (void)q;
    double t0 = ocal_now();
    oscar_status s = oscar_calib_feed(f->calib, layer, n, NULL, k, v, OSCAR_DTYPE_F32);
    f->t_feed += ocal_now() - t0;
    if (s) f->status = s;
    return s;
}

static void progress_line(FILE *fp, int pass, int w, int nw, int64_t window, double t0) {
    if (!fp) return;
    double el = ocal_now() - t0, tps = el > 0 ? (double)((int64_t)w * window) / el : 0.0;
    double eta = w > 0 ? el / w * (nw - w) : 0.0;
    fprintf(fp, "pass %d  window %d/%d  %.0f tokens/s  ETA %.1f s\n", pass, w, nw, tps, eta);
    fflush(fp);
}

static oscar_status fail(oscar_status s, char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return s;
}

/* oscar_calib_feed_copy's margin (oscar.h): a copy probe's query sits at least this many positions past
 * sink + recent. */
#define OCAL_COPY_MARGIN 32

/* The sink S and recent window W ocal_run gives the calibration (0: the core's default, < 0: none). */
static void ocal_windows(const ocal_options *o, int64_t *S, int64_t *W) {
    oscar_calib_options co;
    oscar_calib_options_default(&co, 1, 1, 1, 64);
    *S = o->sink ? (o->sink < 0 ? 0 : o->sink) : co.sink;
    *W = o->recent ? (o->recent < 0 ? 0 : o->recent) : co.recent;
}

oscar_status ocal_check_copy_windows(const ocal_options *o, char *err, size_t err_len) {
    if (o->copy_windows <= 0) return OSCAR_OK;
    int64_t S, W;
    ocal_windows(o, &S, &W);
    /* feed_copy_windows: period R = (window - S) / 2, queries from S + R to S + 2R - 2 */
    const int64_t R = ((int64_t)o->window - S) / 2, lo = S + W + OCAL_COPY_MARGIN > S + R ? S + W + OCAL_COPY_MARGIN : S + R;
    if (R > W && lo <= S + 2 * R - 2) return OSCAR_OK;
    int64_t rmin = W + 1; /* R > W, 2R - 2 >= W + OCAL_COPY_MARGIN, R >= 2 */
    if ((W + OCAL_COPY_MARGIN + 3) / 2 > rmin) rmin = (W + OCAL_COPY_MARGIN + 3) / 2;
    if (rmin < 2) rmin = 2;
    return fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                "--copy-windows %d: a window of %d tokens repeats %" PRId64 " tokens after the sink of %" PRId64
                "; the copy must be longer than the recent window (%" PRId64 ") and reach %d positions past "
                "sink + recent (oscar_calib_feed_copy): use --window %" PRId64 " or more, or a smaller --sink / "
                "--recent",
                o->copy_windows, o->window, R < 0 ? 0 : R, S, W, OCAL_COPY_MARGIN, S + 2 * rmin);
}

/* The core's probe margin (calib.c PROBE_MARGIN, docs/CALIBRATION.md): a window of n tokens gives an
 * attention probe only when n >= sink + recent + OCAL_PROBE_MARGIN + 1. */
#define OCAL_PROBE_MARGIN 32

oscar_status ocal_check_probe_window(const ocal_options *o, char *err, size_t err_len) {
    if (o->clip_objective != 0) return OSCAR_OK; /* the rows objective fits without probes */
    int64_t S, W;
    ocal_windows(o, &S, &W);
    const int64_t nmin = S + W + OCAL_PROBE_MARGIN + 1;
    if ((int64_t)o->window >= nmin) return OSCAR_OK;
    return fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                "--window %d gives no attention probe: a window needs sink %" PRId64 " + recent %" PRId64
                " + %d tokens, and without probes the clip objective (probes, the default) falls back to the "
                "held-back rows in every layer; use --window %" PRId64 " or more, a smaller --sink / --recent, or "
                "--clip-objective rows",
                o->window, S, W, OCAL_PROBE_MARGIN + 1, nmin);
}

/* Copy-window observer: q/k/v of a repeated span -> copy probes only. */
typedef struct copy_state {
    oscar_calib *calib;
    int first_query, period;
    oscar_status status;
} copy_state;

static oscar_status observe_copy(void *user, int layer, int n, const float *q, const float *k, const float *v) {
    copy_state *cs = user;
    oscar_status s = OSCAR_OK;
    for (int i = 0; i < OCAL_COPY_PROBES_PER_WINDOW && !s; i++)
        s = oscar_calib_feed_copy(cs->calib, layer, n, cs->first_query, cs->period, q, k, v, OSCAR_DTYPE_F32);
    if (s) cs->status = s;
    return s;
}

/* Pass 0's copy windows (after the covariance windows): window j copies
 * calibration window floor(j * nw / ncopy): its first `sink` tokens, then
 * the next R = (n - sink) / 2 tokens twice; queries of the second copy
 * (from sink + R on) find their token R - 1 positions back. */
static oscar_status feed_copy_windows(oe_ctx *ctx, oscar_calib *calib, const uint32_t *tokens, int nw, int n,
                                      int ncopy, int sink, char *err, size_t err_len) {
    int R = (n - sink) / 2;
    uint32_t *tw = malloc((size_t)n * sizeof *tw);
    if (!tw) return fail(OSCAR_ERR_OUT_OF_MEMORY, err, err_len, "out of memory for a copy window");
    copy_state cs = {.calib = calib, .first_query = sink + R, .period = R};
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.skip_lm_head = 1;
    fo.observer_user = &cs;
    fo.observer = observe_copy;
    oscar_status s = OSCAR_OK;
    for (int j = 0; j < ncopy && !s; j++) {
        const uint32_t *src = tokens + (size_t)((int64_t)j * nw / ncopy) * (size_t)n;
        for (int i = 0; i < sink + R; i++) tw[i] = src[i];
        for (int i = 0; i < R; i++) tw[sink + R + i] = src[sink + i];
        cs.status = OSCAR_OK;
        if ((s = oe_forward(ctx, tw, sink + 2 * R, &fo, NULL)) != OSCAR_OK)
            fail(s, err, err_len, "copy window %d: %s", j, cs.status ? oscar_last_error() : oe_last_error());
    }
    free(tw);
    return s;
}

oscar_status ocal_run(const oe_model *m, const uint32_t *tokens, int64_t n_tokens, const ocal_options *o,
                      oscar_calib **calib_out, oscar_params **params_out, ocal_stats *st, char *err,
                      size_t err_len) {
    const oe_config *cf = oe_model_config(m);
    *calib_out = NULL;
    *params_out = NULL;
    memset(st, 0, sizeof *st);
    if (err_len) err[0] = '\0';
    const int nw = ocal_window_count(o, n_tokens), n = o->window;
    if (nw < 1)
        return fail(OSCAR_ERR_INVALID_ARGUMENT, err, err_len,
                    "%" PRId64 " tokens (max-tokens %" PRId64 ") do not fill one window of %d: give more tokens or a "
                    "smaller --window",
                    n_tokens, o->max_tokens, o->window);

    oscar_status cs = ocal_check_copy_windows(o, err, err_len);
    if (cs != OSCAR_OK) return cs;

    char hash[17];
    ocal_model_hash(cf, hash);
    oscar_calib_options co;
    oscar_calib_options_default(&co, cf->num_layers, cf->num_q_heads, cf->num_kv_heads, cf->head_dim);
    if (o->group > 0) co.group = o->group;
    if (o->per_head >= 0) co.per_head = o->per_head;
    co.method = o->lloyd_max ? OSCAR_METHOD_OSCAR2_LM : OSCAR_METHOD_OSCAR2;
    co.clip_k = o->clip_k;
    co.clip_v = o->clip_v;
    if (o->sink != 0) co.sink = o->sink < 0 ? 0 : o->sink;
    if (o->recent != 0) co.recent = o->recent < 0 ? 0 : o->recent;
    co.clip_objective = o->clip_objective;
    if (o->permutation >= 0) co.permutation = o->permutation;
    if (o->rounding >= 0) co.rounding = o->rounding;
    const int ncopy = o->copy_windows >= 0    ? o->copy_windows
                      : o->copy_head_mass > 0.0f ? OCAL_COPY_HEAD_WINDOWS
                                                 : OCAL_COPY_WINDOWS_DEFAULT;
    co.copy_probes = ncopy * OCAL_COPY_PROBES_PER_WINDOW > 64 ? 64 : ncopy * OCAL_COPY_PROBES_PER_WINDOW;
    if (o->copy_mass_loss >= 0.0f) co.copy_mass_loss = o->copy_mass_loss;
    if (o->clip_per_head >= 0) co.clip_per_head = o->clip_per_head;
    if (o->key_attn_weight >= 0.0f) co.key_attn_weight = o->key_attn_weight;
    if (o->threads > 0) co.threads = o->threads;
    if (o->probe_queries > 0) co.probe_queries = o->probe_queries;
    if (o->clip_margin >= 0.0f) co.clip_margin = o->clip_margin;
    if (o->probe_span >= 0) co.probe_span = o->probe_span;
    if (o->feedback_damp > 0.0f) co.feedback_damp = o->feedback_damp;
    if (o->wide_bits >= 0.0f) co.wide_bits = o->wide_bits; /* else the library's default (AUTO) */
    if (o->copy_head_mass > 0.0f) co.copy_head_mass = o->copy_head_mass;
    if (o->copy_head_clip > 0.0f) co.copy_head_clip = o->copy_head_clip;
    co.model_hash = hash;
    oscar_calib *calib = NULL;
    oscar_status s = oscar_calib_create(&co, &calib);
    if (s) return fail(s, err, err_len, "%s", oscar_last_error());
    if (co.rounding) {
        /* Value errors are weighed by what the output projection makes of them. */
        double *M = malloc((size_t)cf->head_dim * (size_t)cf->head_dim * sizeof(double));
        const char *why = M ? NULL : "out of memory";
        for (int l = 0; !why && l < cf->num_layers; l++)
            for (int h = 0; !why && h < cf->num_kv_heads; h++) {
                if ((s = oe_model_value_metric(m, l, h, M))) why = oe_last_error();
                else if ((s = oscar_calib_set_value_metric(calib, l, h, M))) why = oscar_last_error();
            }
        free(M);
        if (why) {
            oscar_calib_destroy(calib);
            return fail(s ? s : OSCAR_ERR_OUT_OF_MEMORY, err, err_len, "value metric: %s", why);
        }
    }

    feed_state f = {.calib = calib, .L = cf->num_layers, .hkv = cf->num_kv_heads, .d = cf->head_dim, .n = n};
    size_t cache_bytes = (size_t)nw * (size_t)cf->num_layers * 2 * (size_t)n * (size_t)cf->num_kv_heads *
                         (size_t)cf->head_dim * sizeof(float);
    int use_cache = o->pass1 == OCAL_PASS1_CACHE;
    if (o->pass1 == OCAL_PASS1_AUTO) {
        int64_t limit = o->cache_limit_bytes;
        if (limit <= 0) {
            long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            limit = pages > 0 && psz > 0 ? (int64_t)pages * psz / 2 : (int64_t)1 << 30;
        }
        use_cache = (int64_t)cache_bytes <= limit;
    }
    if (use_cache) {
        f.cache = malloc(cache_bytes);
        if (!f.cache) {
            if (o->pass1 == OCAL_PASS1_CACHE) {
                oscar_calib_destroy(calib);
                return fail(OSCAR_ERR_OUT_OF_MEMORY, err, err_len,
                            "out of memory for the pass-1 K/V cache (%zu MiB): use fewer tokens or recompute",
                            cache_bytes >> 20);
            }
            use_cache = 0; /* AUTO: fall back to a second forward */
        }
    }
    st->windows = nw;
    st->tokens = (int64_t)nw * n;
    st->cached = use_cache;
    st->cache_bytes = use_cache ? (int64_t)cache_bytes : 0;

    oe_ctx *ctx = NULL;
    if (oe_ctx_create(m, n, &ctx) != OSCAR_OK) {
        s = fail(OSCAR_ERR_OUT_OF_MEMORY, err, err_len, "%s", oe_last_error());
        goto out;
    }
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.skip_lm_head = 1;
    fo.observer_user = &f;

    for (int pass = 0; pass < 2; pass++) {
        double t0 = ocal_now(), c0 = ocal_cpu();
        if ((s = oscar_calib_begin_pass(calib, pass)) != OSCAR_OK) {
            fail(s, err, err_len, "%s", oscar_last_error());
            goto out;
        }
        fo.observer = pass == 0 ? observe_pass0 : observe_pass1;
        f.t_feed = 0.0;
        for (int w = 0; w < nw; w++) {
            const uint32_t *tw = tokens + (size_t)w * (size_t)n;
            f.window = w;
            f.status = OSCAR_OK;
            if (pass == 1 && use_cache) {
                int bt = openblas_get_num_threads();
                if (bt != 1) openblas_set_num_threads(1);
                double tf = ocal_now();
                for (int l = 0; l < f.L && s == OSCAR_OK; l++)
                    s = oscar_calib_feed(calib, l, n, NULL, cache_slot(&f, w, l, 0), cache_slot(&f, w, l, 1),
                                         OSCAR_DTYPE_F32);
                f.t_feed += ocal_now() - tf;
                if (bt != 1) openblas_set_num_threads(bt);
                if (s) {
                    fail(s, err, err_len, "pass 1, window %d: %s", w, oscar_last_error());
                    goto out;
                }
            } else if ((s = oe_forward(ctx, tw, n, &fo, NULL)) != OSCAR_OK) {
                /* The observer's calib status names the real problem. */
                fail(s, err, err_len, "pass %d, window %d: %s", pass, w,
                     f.status ? oscar_last_error() : oe_last_error());
                goto out;
            }
            progress_line(o->progress, pass, w + 1, nw, n, t0);
        }
        if (pass == 0 && ncopy > 0 &&
            (s = feed_copy_windows(ctx, calib, tokens, nw, n, ncopy, co.sink, err, err_len)) != OSCAR_OK)
            goto out;
        st->t_pass[pass] = ocal_now() - t0;
        st->c_pass[pass] = ocal_cpu() - c0;
        st->t_feed[pass] = f.t_feed;
    }
    free(f.cache); /* before finalize: peak memory is the cache or finalize, not both */
    f.cache = NULL;
    double t0 = ocal_now(), c0 = ocal_cpu();
    /* Finalize's BLAS calls are small (d x d, and g x t attention products on
     * the probes): split over threads they spend more time waking them than
     * computing (16K-token run: 22.5 s wall with 2 threads, 9.7 s with 1). */
    int bt = openblas_get_num_threads();
    if (bt != 1) openblas_set_num_threads(1);
    s = oscar_calib_finalize(calib, params_out);
    if (bt != 1) openblas_set_num_threads(bt);
    if (s != OSCAR_OK) {
        fail(s, err, err_len, "%s", oscar_last_error());
        goto out;
    }
    st->t_finalize = ocal_now() - t0;
    st->c_finalize = ocal_cpu() - c0;
out:
    oe_ctx_free(ctx);
    free(f.cache);
    if (s) {
        oscar_calib_destroy(calib);
        return s;
    }
    *calib_out = calib;
    return OSCAR_OK;
}
