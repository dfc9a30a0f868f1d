/* oscar-copy-probe: where a 2-bit cache (with a file's 3-bit head-tensors, if any) loses retrieval
 * (docs/eval/retrieval.md).
 *
 * Builds copy windows as oscar-eval's retrieval task does (S0 real tokens, a
 * chunk of R = (ctx - S0) / 2 tokens of the token file, the same chunk
 * again), runs the BF16 forward once per window and, for every layer and
 * query head, measures the attention mass that the queries of the second
 * copy (row i predicts token i + 1) put on their source, the key at
 * i + 1 - R (the token after the earlier occurrence, R - 1 >= W keys back:
 * always in the 2-bit region): with the keys as the cache reads them (bf16
 * rows; rows S0 <= p <= t - W quantize-dequantized by oscar_fakequant with
 * the parameters), at the parameters' fitted K clips and at K clip 1. For
 * the values it gives the relative error of the head's output at those
 * queries with exact attention weights and quantized values, at the fitted
 * V clips and at clip 1. Induction heads are the ones with a large BF16
 * mass. Exit status 0 ok, 2 bad input, 1 failure. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "oscar_calibrate.h" /* ocal_model_hash */
#include "oscar/oscar.h"
#include "tool_args.h"
#include "tool_params.h"


typedef struct cap {
    int L, hq, hkv, d, n;
    float *q, *k, *v; /* [L][n][H][d] */
    int bad;          /* a non-finite q/k/v: its layer + 1 (0: none) */
    const char *bad_what;
} cap;

static oscar_status observe(void *user, int layer, int n, const float *q, const float *k, const float *v) {
    cap *c = user;
    size_t nq = (size_t)n * (size_t)c->hq * (size_t)c->d, nk = (size_t)n * (size_t)c->hkv * (size_t)c->d;
    /* NaN/Inf weights: the masses printed as nan (a NaN query) or the fake-quant failed as a tool
     * error (exit 1) naming "the input rows"; the model is the input (exit 2) */
    for (size_t i = 0; i < nq && !c->bad; i++)
        if (!isfinite(q[i])) c->bad = layer + 1, c->bad_what = "queries";
    for (size_t i = 0; i < nk && !c->bad; i++)
        if (!isfinite(k[i]) || !isfinite(v[i])) c->bad = layer + 1, c->bad_what = "keys or values";
    if (c->bad) return OSCAR_ERR_NONFINITE;
    memcpy(c->q + (size_t)layer * nq, q, nq * sizeof(float));
    for (size_t i = 0; i < nk; i++) {
        c->k[(size_t)layer * nk + i] = oe_round_bf16(k[i]);
        c->v[(size_t)layer * nk + i] = oe_round_bf16(v[i]);
    }
    return OSCAR_OK;
}

static void usage(FILE *f) {
    fprintf(f, "usage: oscar-copy-probe MODEL_DIR --tokens FILE --params P.safetensors [options]\n"
               "  --trials N      copy windows (default 4), chunks taken from the start of FILE\n"
               "  --offset N      first token of the chunks (default 0)\n"
               "  --context N     window length (default 2048)\n"
               "  --sink N / --recent N  cache layout (default 64 / 256)\n"
               "  --group G       quant group along head_dim, the one the parameters' clips were fitted for\n"
               "                  (default: head_dim up to 128, else half of it)\n"
               "  --heads         one line per (layer, query head) besides the per-layer lines\n"
               "  --allow-other-model  use --params calibrated on another model of the same shape\n");
}

/* Per (layer, query head) sums over the probed queries. */
typedef struct acc {
    double mass[3];   /* source attention mass: bf16, K fitted clip, K clip 1 */
    double top1[3];   /* source is the argmax key */
    double verr[2];   /* sum |o_q - o|^2 with V quantized at fitted / clip 1 (exact weights) */
    double vden;      /* sum |o|^2 */
    double kerr[2];   /* sum |o_q - o|^2 with K quantized (exact V): fitted / clip 1 */
    long n;
} acc;

int main(int argc, char **argv) {
    tool_watch_stdout("oscar-copy-probe");
    const char *model_dir = NULL, *tok_path = NULL, *params_path = NULL;
    long trials = 4, offset = 0, ctx = 2048, sink = 64, recent = 256, group = 0;
    int heads_out = 0, allow_other_model = 0;
    tool_seen seen = {.n = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!tool_args_once(&seen, "oscar-copy-probe", a, NULL, NULL)) return 2;
        long *iv = !strcmp(a, "--trials")    ? &trials
                   : !strcmp(a, "--offset")  ? &offset
                   : !strcmp(a, "--context") ? &ctx
                   : !strcmp(a, "--sink")    ? &sink
                   : !strcmp(a, "--recent")  ? &recent
                   : !strcmp(a, "--group")   ? &group
                                             : NULL;
        if (iv && has) {
            char *end;
            errno = 0;
            *iv = strtol(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || isspace((unsigned char)*argv[i]) || *iv < 0 || *iv > (1L << 30)) {
                fprintf(stderr, "oscar-copy-probe: %s wants an integer in [0, 2^30], got '%s'\n", a, argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--tokens") && has) tok_path = argv[++i];
        else if (!strcmp(a, "--params") && has) params_path = argv[++i];
        else if (!strcmp(a, "--heads")) heads_out = 1;
        else if (!strcmp(a, "--allow-other-model")) allow_other_model = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] != '-' && !model_dir) model_dir = a;
        else {
            fprintf(stderr, "oscar-copy-probe: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_dir || !tok_path || !params_path) {
        fprintf(stderr, "oscar-copy-probe: MODEL_DIR, --tokens and --params are required\n");
        usage(stderr);
        return 2;
    }
    /* The window is one forward of the engine (at most 2^20 tokens), and the sink must leave room
     * for the two copies: --sink 2^30 printed copies of -536870612 tokens. */
    if (ctx < 1 || ctx > (1L << 20) || sink >= ctx) {
        fprintf(stderr, "oscar-copy-probe: --context %ld must be in [1, 2^20] and above --sink %ld\n", ctx, sink);
        return 2;
    }
    const long R = (ctx - sink) / 2;
    if (trials < 1 || R <= recent + 1) {
        fprintf(stderr, "oscar-copy-probe: need trials >= 1 and copies (%ld) longer than the recent window %ld\n", R,
                recent);
        return 2;
    }
    int nthreads;
    if (oe_threads(&nthreads) != OSCAR_OK) { /* before the model load, as any bad input */
        fprintf(stderr, "oscar-copy-probe: %s\n", oe_last_error());
        return 2;
    }
    /* Every exit after this point frees what it took (bad input too: under LeakSanitizer a leak
     * turned exit 2 into 1, and a whole run's buffers made a good run exit 1). */
    int rc = 2;
    oe_model *m = NULL;
    oscar_params *P[2] = {NULL, NULL};
    uint32_t *tok = NULL, *tw = NULL;
    cap c = {0};
    float *kq[2] = {NULL, NULL}, *vq[2] = {NULL, NULL}, *Kh[3] = {NULL, NULL, NULL}, *Vh[3] = {NULL, NULL, NULL};
    float *Qh = NULL, *S = NULL, *W = NULL, *O = NULL, *Oq = NULL, *Se = NULL, *Wm = NULL, *Vd = NULL;
    acc *A = NULL;
    oe_ctx *ctxe = NULL;
    if (oe_model_load(model_dir, &m)) {
        fprintf(stderr, "oscar-copy-probe: %s\n", oe_last_error());
        goto out;
    }
    const oe_config *cf = oe_model_config(m);
    const int L = cf->num_layers, hq = cf->num_q_heads, hkv = cf->num_kv_heads, d = cf->head_dim, g = hq / hkv;
    if (cf->max_position > 0 && ctx > cf->max_position) { /* as oscar-eval's --context: ran on unseen positions */
        fprintf(stderr, "oscar-copy-probe: --context %ld exceeds the model's max_position_embeddings %d; use at most "
                "%d\n", ctx, cf->max_position, cf->max_position);
        goto out;
    }
    if (cf->sliding_window > 0 && sink + 2 * R > cf->sliding_window) { /* the engine refused it later: exit 1 */
        fprintf(stderr, "oscar-copy-probe: windows of %ld tokens (--context %ld) exceed the model's sliding_window %d "
                "(the engine runs full causal attention); use --context %d or less\n", sink + 2 * R, ctx,
                cf->sliding_window, cf->sliding_window);
        goto out;
    }
    /* The 2-bit rows are quantized at the group a cache of this layout stores (and its bits reported
     * for that group): group 0 (the whole head) gave head_dim 192/256 another group's rows and clips
     * than the cache and the printed bits. */
    const int G = group ? (int)group : oscar_layout_default_group(d);
    {
        oscar_layout_desc ld;
        oscar_layout_default(&ld);
        ld.head_dim = d, ld.group = G;
        if (oscar_layout_validate(&ld)) {
            fprintf(stderr, "oscar-copy-probe: --group %d: %s\n", G, oscar_last_error());
            goto out;
        }
    }
    /* the parameters' model fingerprint, as oscar-eval: another model's of the same shape measured
     * its clips on this one without a word */
    char hash[17];
    ocal_model_hash(cf, hash);
    for (int r = 0; r < 2; r++)
        if (oscar_params_load(params_path, &P[r]) ||
            oscar_params_check_shape(P[r], L, hq, hkv, d, allow_other_model ? NULL : hash)) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", oscar_last_error());
            const int same_shape = P[r] && oscar_params_check_shape(P[r], L, hq, hkv, d, NULL) == OSCAR_OK;
            fprintf(stderr, "oscar-copy-probe: --params %s: %s%s\n", params_path, msg,
                    same_shape ? " (--allow-other-model uses it anyway)" : "");
            goto out;
        }
    char why[1024] = "";
    if (tool_params_serve_group(P[0], d, G, why, sizeof why)) {
        fprintf(stderr, "oscar-copy-probe: --params %s does not serve group %d: %s (pass that group as --group)\n",
                params_path, G, why);
        goto out;
    }
    for (int l = 0; l < L; l++) {
        oscar_params_set_clip(P[1], l, OSCAR_K, 1.0f);
        oscar_params_set_clip(P[1], l, OSCAR_V, 1.0f);
    }
    int64_t ntok = 0;
    if (oe_tokens_load(tok_path, cf->vocab, &tok, &ntok)) {
        fprintf(stderr, "oscar-copy-probe: %s\n", oe_last_error());
        goto out;
    }
    const long span = sink + R, n = sink + 2 * R;
    if (offset + trials * span > ntok) {
        fprintf(stderr, "oscar-copy-probe: %s has %lld tokens, the trials need %ld from %ld; lower --trials or "
                "--offset, or give a longer token file\n", tok_path, (long long)ntok, trials * span, offset);
        goto out;
    }
    rc = 1; /* from here on a failure is the tool's, not the input's */
    c = (cap){.L = L, .hq = hq, .hkv = hkv, .d = d, .n = (int)n};
    size_t nq = (size_t)n * hq * d, nk = (size_t)n * hkv * d;
    c.q = malloc((size_t)L * nq * sizeof(float));
    c.k = malloc((size_t)L * nk * sizeof(float));
    c.v = malloc((size_t)L * nk * sizeof(float));
    for (int r = 0; r < 2; r++) {
        kq[r] = malloc(nk * sizeof(float));
        vq[r] = malloc(nk * sizeof(float));
    }
    Qh = malloc((size_t)R * d * sizeof(float));
    S = malloc((size_t)R * n * sizeof(float));
    for (int r = 0; r < 3; r++) {
        Kh[r] = malloc((size_t)n * d * sizeof(float));
        Vh[r] = malloc((size_t)n * d * sizeof(float));
    }
    W = malloc((size_t)R * n * sizeof(float));
    O = malloc((size_t)R * d * sizeof(float));
    Oq = malloc((size_t)R * d * sizeof(float));
    Se = malloc((size_t)R * n * sizeof(float));
    Wm = malloc((size_t)R * n * sizeof(float));
    Vd = malloc((size_t)n * d * sizeof(float));
    tw = malloc((size_t)n * sizeof *tw);
    A = calloc((size_t)L * hq, sizeof *A);
    int bufs_ok = c.q && c.k && c.v && Qh && S && W && O && Oq && Se && Wm && Vd && tw && A;
    for (int r = 0; r < 3; r++) bufs_ok = bufs_ok && Kh[r] && Vh[r] && (r == 2 || (kq[r] && vq[r]));
    if (!bufs_ok) {
        fprintf(stderr, "oscar-copy-probe: out of memory for windows of %ld tokens; use a shorter --context\n", n);
        goto out;
    }
    if (oe_ctx_create(m, (int)n, &ctxe)) {
        fprintf(stderr, "oscar-copy-probe: %s\n", oe_last_error());
        goto out;
    }
    oe_forward_options fo;
    oe_forward_options_default(&fo);
    fo.skip_lm_head = 1;
    fo.observer = observe;
    fo.observer_user = &c;
    const float scale = (float)(1.0 / sqrt((double)d));
    const long q0 = sink + R, q1 = n - 1; /* queries q0..q1-1 predict a copied token */
    const long nqr = q1 - q0;
    for (long t = 0; t < trials; t++) {
        const uint32_t *src = tok + offset + t * span;
        for (long i = 0; i < span; i++) tw[i] = src[i];
        for (long i = 0; i < R; i++) tw[span + i] = src[sink + i];
        if (oe_forward(ctxe, tw, (int)n, &fo, NULL)) {
            if (c.bad) {
                fprintf(stderr, "oscar-copy-probe: %s: layer %d's %s are not finite (NaN or Inf) on trial %ld: the "
                        "model's weights are broken; check the checkpoint\n", model_dir, c.bad - 1, c.bad_what, t);
                rc = 2;
            } else
                fprintf(stderr, "oscar-copy-probe: forward: %s\n", oe_last_error());
            goto out;
        }
        for (int l = 0; l < L; l++) {
            const float *K = c.k + (size_t)l * nk, *V = c.v + (size_t)l * nk;
            for (int r = 0; r < 2; r++) {
                memcpy(kq[r], K, nk * sizeof(float));
                memcpy(vq[r], V, nk * sizeof(float));
                if (oscar_fakequant(P[r], OSCAR_METHOD_OSCAR2, l, OSCAR_K, G, (int)n, hkv, d, kq[r]) ||
                    oscar_fakequant(P[r], OSCAR_METHOD_OSCAR2, l, OSCAR_V, G, (int)n, hkv, d, vq[r])) {
                    fprintf(stderr, "oscar-copy-probe: %s\n", oscar_last_error());
                    goto out;
                }
            }
            for (int j = 0; j < hq; j++) {
                const int h = j / g;
                for (long p = 0; p < n; p++)
                    for (int i = 0; i < d; i++) {
                        size_t s = ((size_t)p * hkv + h) * d + i;
                        Kh[0][p * d + i] = K[s];
                        Kh[1][p * d + i] = kq[0][s];
                        Kh[2][p * d + i] = kq[1][s];
                        Vh[0][p * d + i] = V[s];
                        Vh[1][p * d + i] = vq[0][s];
                        Vh[2][p * d + i] = vq[1][s];
                    }
                for (long r = 0; r < nqr; r++)
                    memcpy(Qh + r * d, c.q + (size_t)l * nq + ((size_t)(q0 + r) * hq + j) * d, d * sizeof(float));
                acc *a = A + (size_t)l * hq + j;
                /* Exact scores (bf16 keys) into Se; a quantized variant reads the 2-bit copy only where the
                 * cache does (S0 <= p <= t - W) and the exact score elsewhere. */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nqr, (int)n, d, scale, Qh, d, Kh[0], d,
                            0.0f, Se, (int)n);
                for (int var = 0; var < 3; var++) {
                    if (var > 0)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nqr, (int)n, d, scale, Qh, d,
                                    Kh[var], d, 0.0f, S, (int)n);
                    for (long r = 0; r < nqr; r++) {
                        long tq = q0 + r, srcp = tq + 1 - R;
                        float *s = (var == 0 ? Se : S) + r * n, *w = (var == 0 ? W : S) + r * n;
                        if (var > 0)
                            for (long p = 0; p <= tq; p++)
                                if (!(p >= sink && p <= tq - recent)) s[p] = Se[r * n + p];
                        float mx = s[0];
                        long am = 0;
                        for (long p = 1; p <= tq; p++)
                            if (s[p] > mx) mx = s[p], am = p;
                        double z = 0.0;
                        for (long p = 0; p <= tq; p++) z += exp((double)s[p] - mx);
                        a->mass[var] += exp((double)s[srcp] - mx) / z;
                        a->top1[var] += am == srcp;
                        for (long p = 0; p < n; p++) w[p] = p <= tq ? (float)(exp((double)s[p] - mx) / z) : 0.0f;
                    }
                    if (var == 0) {
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nqr, d, (int)n, 1.0f, W, (int)n,
                                    Vh[0], d, 0.0f, O, d);
                        for (long e = 0; e < nqr * d; e++) a->vden += (double)O[e] * O[e];
                        /* V read quantized where the cache does: O_q = O + (W masked to the 2-bit region)(Vq - V). */
                        for (long r = 0; r < nqr; r++)
                            for (long p = 0; p < n; p++)
                                Wm[r * n + p] = p >= sink && p <= q0 + r - recent ? W[r * n + p] : 0.0f;
                        for (int vv = 1; vv < 3; vv++) {
                            for (long e = 0; e < n * d; e++) Vd[e] = Vh[vv][e] - Vh[0][e];
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nqr, d, (int)n, 1.0f, Wm,
                                        (int)n, Vd, d, 0.0f, Oq, d);
                            for (long e = 0; e < nqr * d; e++) a->verr[vv - 1] += (double)Oq[e] * Oq[e];
                        }
                    } else {
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nqr, d, (int)n, 1.0f, S, (int)n,
                                    Vh[0], d, 0.0f, Oq, d);
                        for (long e = 0; e < nqr * d; e++) {
                            double df = (double)Oq[e] - O[e];
                            a->kerr[var - 1] += df * df;
                        }
                    }
                }
                a->n += nqr;
            }
        }
        fprintf(stderr, "oscar-copy-probe: trial %ld/%ld done\n", t + 1, trials);
    }
    char widths[96];
    tool_params_width_label(P[0], widths, sizeof widths);
    printf("copy probe: %s, %ld windows of %ld (copies of %ld tokens at [%ld, %ld) and [%ld, %ld)), %ld queries per "
           "head and window, S0 %ld, W %ld, params %s (oscar2 %s, group %d, %.3f bits/elt in the quantized region)\n",
           tok_path, trials, n, R, sink, sink + R, sink + R, n, nqr, sink, recent, params_path, widths, G,
           tool_params_bits(P[0], OSCAR_METHOD_OSCAR2, d, G));
    printf("mass: mean softmax weight on the copied token's source key; top1: it is the argmax key;\n"
           "K err / V err: relative output error of the head at those queries with only K / only V quantized\n");
    printf("layer  head | clipK clipV | mass bf16  K fit  K clip1 | top1 bf16  K fit  K clip1 | K err fit  clip1 | "
           "V err fit  clip1\n");
    for (int l = 0; l < L; l++) {
        float ck, cv;
        oscar_params_clip(P[0], l, OSCAR_K, &ck);
        oscar_params_clip(P[0], l, OSCAR_V, &cv);
        acc sum = {0};
        for (int j = 0; j < hq; j++) {
            acc *a = A + (size_t)l * hq + j;
            for (int i = 0; i < 3; i++) sum.mass[i] += a->mass[i], sum.top1[i] += a->top1[i];
            for (int i = 0; i < 2; i++) sum.verr[i] += a->verr[i], sum.kerr[i] += a->kerr[i];
            sum.vden += a->vden;
            sum.n += a->n;
            if (heads_out)
                printf("%5d  %4d | %5.2f %5.2f | %9.4f %6.4f %8.4f | %9.4f %6.4f %8.4f | %9.5f %6.5f | %9.5f %6.5f\n",
                       l, j, ck, cv, a->mass[0] / a->n, a->mass[1] / a->n, a->mass[2] / a->n, a->top1[0] / a->n,
                       a->top1[1] / a->n, a->top1[2] / a->n, a->kerr[0] / a->vden, a->kerr[1] / a->vden,
                       a->verr[0] / a->vden, a->verr[1] / a->vden);
        }
        printf("%5d   all | %5.2f %5.2f | %9.4f %6.4f %8.4f | %9.4f %6.4f %8.4f | %9.5f %6.5f | %9.5f %6.5f\n", l, ck,
               cv, sum.mass[0] / sum.n, sum.mass[1] / sum.n, sum.mass[2] / sum.n, sum.top1[0] / sum.n,
               sum.top1[1] / sum.n, sum.top1[2] / sum.n, sum.kerr[0] / sum.vden, sum.kerr[1] / sum.vden,
               sum.verr[0] / sum.vden, sum.verr[1] / sum.vden);
    }
    rc = 0;
out:
    oe_ctx_free(ctxe);
    free(A);
    free(tw);
    float *fl[] = {c.q, c.k, c.v, kq[0], kq[1], vq[0], vq[1], Kh[0], Kh[1], Kh[2], Vh[0], Vh[1], Vh[2],
                   Qh, S, W, O, Oq, Se, Wm, Vd};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(tok);
    oscar_params_destroy(P[0]);
    oscar_params_destroy(P[1]);
    oe_model_free(m);
    return rc;
}
