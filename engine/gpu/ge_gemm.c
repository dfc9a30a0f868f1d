/* The engine's weight products (ge_gemm.h): GEMV, tuned cuBLASLt, cuBLAS. */
#include "ge_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ge_check.h"
#include "ge_kernels.h"

/* Heuristic candidates timed per shape, besides cuBLAS's default. */
#define GE_GEMM_CANDIDATES 8
/* Timed calls per candidate: up to 16 of the nW weights in turn (beyond the L2), or 4 calls on
 * a single weight (the LM head's, far larger than the L2). About 50 ms per timed row count for a
 * Qwen3-8B step at 172 rows (an estimate: 9 algorithms x 17 calls at the per-call times measured
 * on the H100, plus the LM head's 9 x 5). */
#define GE_GEMM_MAX_REPS 16
#define GE_GEMM_SINGLE_REPS 4
/* A candidate replaces cuBLAS's default only if at least this much faster in the timing: closer
 * wins are within the timing's noise, and one (the gate-up product at 172 rows, 1.009x in the
 * timing) was 2.6 % slower inside the step (H100, perf/e2e/RESULTS.md, thirty-eighth session). */
#define GE_GEMM_MIN_GAIN 1.03f
/* The tuned algorithms assume 16-byte aligned operands (asked of the
 * heuristic); a call with less alignment takes cuBLAS's default. */
#define GE_GEMM_ALIGN 16

/* The engine's own Hopper kernel (ge_k_wgemm_bf16) is timed beside cuBLASLt's candidates for
 * up to this many rows, with 128 or 192 columns per CTA and K split 1..GE_WGEMM_MAX_SPLIT ways;
 * its split-K partials live in a workspace of GE_WGEMM_PART_BYTES (ge_gemm's own). */
#define GE_WGEMM_MAX_M 256
#define GE_WGEMM_MAX_SPLIT 8
#define GE_WGEMM_PART_BYTES ((size_t)32 << 20)
#define GE_WGEMM_COUNTERS 4096

typedef struct tuned {
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int use_default; /* cuBLAS's default stays (no candidate GE_GEMM_MIN_GAIN faster) */
    int pick;        /* index among the heuristic's candidates, -1: default, GE_PICK_WGEMM: ours */
    int wg_bn, wg_split; /* ours: columns per CTA and K splits (pick == GE_PICK_WGEMM) */
    int fastest;     /* the fastest candidate (-1: none ran), chosen or not */
    int timed_at;    /* the row count whose timing made the choice (this one, or its bucket's first) */
    float default_us, best_us, fastest_us;
    float wg_us[2];    /* ours: fastest split's time for 128 and 192 columns a CTA (0: not timed) */
    int wg_sp[2];      /* and that split */
} tuned;

/* Row counts are timed by buckets of 16 (5-16, 17-32, ...): the first count of a bucket that a
 * step brings is timed, the others take its choice (checked by cuBLASLt for their own count).
 * A serving engine's decode batch takes many sizes; timing each (~50 ms, estimated above) would cost more than
 * the choice wins. */
#define GE_GEMM_BUCKET 16
#define GE_PICK_WGEMM 1000

/* Shapes of one (N, K, beta): the tuned entry for each M (NULL: not tuned). */
typedef struct shape_class {
    int N, K;
    float beta;
    tuned *by_m[GE_GEMM_TUNE_MAX_M + 1];
    const tuned *timed[GE_GEMM_TUNE_MAX_M / GE_GEMM_BUCKET + 1]; /* each bucket's timed entry (in by_m) */
} shape_class;

#define GE_GEMM_MAX_CLASSES 16

struct ge_gemm {
    cudaStream_t st;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulPreference_t pref;
    cudaEvent_t ev[2];
    void *ws;
    size_t ws_bytes;
    int f32, tune;
    int wgemm;    /* ge_k_wgemm_bf16 is a candidate (compute capability 9.0, bf16, tuning on) */
    int sms;      /* multiprocessors: bounds the split counts tried */
    float *part;  /* its split-K partials (GE_WGEMM_PART_BYTES) and per-tile counters, owned here */
    int *cnt;
    shape_class *cls[GE_GEMM_MAX_CLASSES];
    int n_cls;
};

oscar_status ge_gemm_create(cudaStream_t st, void *ws, size_t ws_bytes, int f32, int tune, ge_gemm **out)
{
    *out = NULL;
    ge_gemm *g = calloc(1, sizeof *g);
    if (!g) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    g->st = st;
    g->ws = ws;
    g->ws_bytes = ws_bytes;
    g->f32 = f32;
    g->tune = tune && !f32;
    *out = g; /* ge_gemm_destroy releases whatever was made if a step below fails */
    BL(cublasCreate(&g->blas));
    BL(cublasSetStream(g->blas, st));
    BL(cublasSetWorkspace(g->blas, ws, ws_bytes));
    if (!g->tune) return OSCAR_OK;
    BL(cublasLtCreate(&g->lt));
    BL(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T;
    BL(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BL(cublasLtMatmulPreferenceCreate(&g->pref));
    const uint64_t wsb = ws_bytes;
    const uint32_t al = GE_GEMM_ALIGN;
    BL(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    BL(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    BL(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    BL(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    BL(cublasLtMatmulPreferenceSetAttribute(g->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    CU(cudaEventCreate(&g->ev[0]));
    CU(cudaEventCreate(&g->ev[1]));
    if (ge_k_wgemm_supported()) {
        int dev = 0;
        CU(cudaGetDevice(&dev));
        CU(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));
        CU(cudaMalloc((void **)&g->part, GE_WGEMM_PART_BYTES));
        CU(cudaMalloc((void **)&g->cnt, GE_WGEMM_COUNTERS * sizeof(int)));
        CU(cudaMemset(g->cnt, 0, GE_WGEMM_COUNTERS * sizeof(int))); /* each call leaves them zero */
        g->wgemm = 1;
    }
    return OSCAR_OK;
}

static void tuned_free(tuned *t)
{
    if (!t) return;
    if (t->a) cublasLtMatrixLayoutDestroy(t->a);
    if (t->b) cublasLtMatrixLayoutDestroy(t->b);
    if (t->c) cublasLtMatrixLayoutDestroy(t->c);
    free(t);
}

void ge_gemm_destroy(ge_gemm *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_cls; i++) {
        for (int m = 0; m <= GE_GEMM_TUNE_MAX_M; m++) tuned_free(g->cls[i]->by_m[m]);
        free(g->cls[i]);
    }
    if (g->part) cudaFree(g->part);
    if (g->cnt) cudaFree(g->cnt);
    if (g->ev[0]) cudaEventDestroy(g->ev[0]);
    if (g->ev[1]) cudaEventDestroy(g->ev[1]);
    if (g->pref) cublasLtMatmulPreferenceDestroy(g->pref);
    if (g->desc) cublasLtMatmulDescDestroy(g->desc);
    if (g->lt) cublasLtDestroy(g->lt);
    if (g->blas) cublasDestroy(g->blas);
    free(g);
}

static shape_class *find_class(const ge_gemm *g, int N, int K, float beta)
{
    for (int i = 0; i < g->n_cls; i++)
        if (g->cls[i]->N == N && g->cls[i]->K == K && g->cls[i]->beta == beta) return g->cls[i];
    return NULL;
}

static int aligned(const void *p) { return (uintptr_t)p % GE_GEMM_ALIGN == 0; }

static cublasStatus_t run_default(const ge_gemm *g, int M, int N, int K, const void *W, const void *X, float *Y,
                                  float beta)
{
    const float alpha = 1.0f;
    const cudaDataType_t t = g->f32 ? CUDA_R_32F : CUDA_R_16BF;
    /* Column-major: Y is C (N x M), W is A (K x N, transposed), X is B (K x M). */
    return cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, W, t, K, X, t, K, &beta, Y, CUDA_R_32F,
                        N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static cublasStatus_t run_lt(const ge_gemm *g, const tuned *t, const cublasLtMatmulAlgo_t *algo, const void *W,
                             const void *X, float *Y, float beta)
{
    const float alpha = 1.0f;
    return cublasLtMatmul(g->lt, g->desc, &alpha, W, t->a, X, t->b, &beta, Y, t->c, Y, t->c, algo, g->ws,
                          g->ws_bytes, g->st);
}

static oscar_status run_wgemm(const ge_gemm *g, int bn, int split, int M, int N, int K, const void *W, const void *X,
                              float *Y, float beta, int pdl)
{
    int err = ge_k_wgemm_bf16(Y, W, X, M, N, K, beta == 1.0f, bn, split, g->part, GE_WGEMM_PART_BYTES, g->cnt,
                              GE_WGEMM_COUNTERS, pdl, g->st);
    if (err != 0)
        return ge_set_error(OSCAR_ERR_BACKEND, "ge_gemm_run: warpgroup GEMM launch failed (M %d N %d K %d): %s", M, N,
                            K, cudaGetErrorString((cudaError_t)err));
    return OSCAR_OK;
}

/* Mean time of one candidate's calls (algo NULL and bn 0: cuBLAS's default; bn > 0: ours), us. */
static oscar_status time_candidate(ge_gemm *g, const tuned *t, const cublasLtMatmulAlgo_t *algo, int bn, int split,
                                   int M, int N, int K, const void *const *W, int nW, const void *X, float *Y,
                                   float beta, float *us)
{
    const int reps = nW == 1 ? GE_GEMM_SINGLE_REPS : nW < GE_GEMM_MAX_REPS ? nW : GE_GEMM_MAX_REPS;
    for (int r = -1; r < reps; r++) { /* r = -1: a warm-up call, untimed */
        if (r == 0) CU(cudaEventRecord(g->ev[0], g->st));
        const void *w = W[(r < 0 ? 0 : r) % nW];
        if (bn > 0) {
            oscar_status s = run_wgemm(g, bn, split, M, N, K, w, X, Y, beta, 0);
            if (s != OSCAR_OK) return s;
        } else {
            BL(algo ? run_lt(g, t, algo, w, X, Y, beta) : run_default(g, M, N, K, w, X, Y, beta));
        }
    }
    CU(cudaEventRecord(g->ev[1], g->st));
    CU(cudaEventSynchronize(g->ev[1]));
    float ms = 0.0f;
    CU(cudaEventElapsedTime(&ms, g->ev[0], g->ev[1]));
    *us = 1000.0f * ms / (float)reps;
    return OSCAR_OK;
}

static oscar_status make_layouts(tuned *t, int M, int N, int K)
{
    BL(cublasLtMatrixLayoutCreate(&t->a, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K));
    BL(cublasLtMatrixLayoutCreate(&t->b, CUDA_R_16BF, (uint64_t)K, (uint64_t)M, K));
    BL(cublasLtMatrixLayoutCreate(&t->c, CUDA_R_32F, (uint64_t)N, (uint64_t)M, N));
    return OSCAR_OK;
}

/* Another row count of a timed bucket: its choice, if cuBLASLt accepts it for this count. */
static oscar_status take_bucket_choice(ge_gemm *g, tuned *t, const tuned *lead, int M, int N, int K)
{
    oscar_status s = make_layouts(t, M, N, K);
    if (s != OSCAR_OK) return s;
    const tuned own = *t;
    *t = *lead;
    t->a = own.a;
    t->b = own.b;
    t->c = own.c;
    cublasLtMatmulHeuristicResult_t r;
    /* ours takes any count up to GE_WGEMM_MAX_M (a bucket never straddles it); cuBLASLt's choice is checked */
    if (!t->use_default && t->pick != GE_PICK_WGEMM &&
        (cublasLtMatmulAlgoCheck(g->lt, g->desc, t->a, t->b, t->c, t->c, &t->algo, &r) != CUBLAS_STATUS_SUCCESS ||
         r.workspaceSize > g->ws_bytes)) {
        t->use_default = 1;
        t->pick = -1;
    }
    return OSCAR_OK;
}

static oscar_status tune_shape(ge_gemm *g, tuned *t, int M, int N, int K, const void *const *W, int nW,
                               const void *X, float *Y, float beta)
{
    oscar_status s = make_layouts(t, M, N, K);
    if (s != OSCAR_OK) return s;
    t->timed_at = M;
    cublasLtMatmulHeuristicResult_t res[GE_GEMM_CANDIDATES];
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(g->lt, g->desc, t->a, t->b, t->c, t->c, g->pref, GE_GEMM_CANDIDATES, res,
                                       &found) != CUBLAS_STATUS_SUCCESS)
        found = 0; /* no candidate: the default stays */
    float best = 0.0f;
    s = time_candidate(g, t, NULL, 0, 0, M, N, K, W, nW, X, Y, beta, &best);
    if (s != OSCAR_OK) return s;
    t->default_us = best;
    t->use_default = 1;
    t->pick = -1;
    for (int i = 0; i < found; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
        float us = 0.0f;
        /* A candidate cuBLASLt refuses at run time is passed over; the default stays possible. */
        if (time_candidate(g, t, &res[i].algo, 0, 0, M, N, K, W, nW, X, Y, beta, &us) != OSCAR_OK) continue;
        if (us < best) {
            best = us;
            t->algo = res[i].algo;
            t->use_default = 0;
            t->pick = i;
        }
    }
    /* ours: each column tile and split count whose grid stays within two waves (split 1 always) */
    if (g->wgemm && M <= GE_WGEMM_MAX_M && K % 8 == 0 && (beta == 0.0f || beta == 1.0f)) {
        const int bns[2] = {128, 192}, KT = (K + 63) / 64;
        for (int b = 0; b < 2; b++) {
            const int bn = bns[b], tiles = (N + bn - 1) / bn;
            if (bn == 192 && M > 192) continue;
            for (int sp = 1; sp <= GE_WGEMM_MAX_SPLIT && sp * 2 <= KT + 1; sp++) {
                if (sp > 1 && ((long)tiles * sp > 2L * g->sms || tiles > GE_WGEMM_COUNTERS ||
                               ge_k_wgemm_part_bytes(M, N, bn, sp) > GE_WGEMM_PART_BYTES))
                    break;
                float us = 0.0f;
                s = time_candidate(g, t, NULL, bn, sp, M, N, K, W, nW, X, Y, beta, &us);
                if (s != OSCAR_OK) return s; /* a launch this engine validated failed: say so */
                if (t->wg_us[b] == 0.0f || us < t->wg_us[b]) {
                    t->wg_us[b] = us;
                    t->wg_sp[b] = sp;
                }
                if (us < best) {
                    best = us;
                    t->use_default = 0;
                    t->pick = GE_PICK_WGEMM;
                    t->wg_bn = bn;
                    t->wg_split = sp;
                }
            }
        }
    }
    t->fastest = t->pick;
    t->fastest_us = best;
    if (!t->use_default && best * GE_GEMM_MIN_GAIN > t->default_us) {
        t->use_default = 1;
        t->pick = -1;
        best = t->default_us;
    }
    t->best_us = best;
    return OSCAR_OK;
}

oscar_status ge_gemm_tune(ge_gemm *g, int M, int N, int K, const void *const *W, int nW, const void *X, float *Y,
                          float beta)
{
    if (!g->tune || M <= 4 || M > GE_GEMM_TUNE_MAX_M || nW < 1) return OSCAR_OK;
    /* Known shapes first: the engine asks before every decode step. */
    shape_class *c = find_class(g, N, K, beta);
    if (c && c->by_m[M]) return OSCAR_OK;
    if (!aligned(X) || !aligned(Y)) return OSCAR_OK;
    for (int i = 0; i < nW; i++)
        if (!aligned(W[i])) return OSCAR_OK;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU(cudaStreamIsCapturing(g->st, &cs));
    if (cs != cudaStreamCaptureStatusNone) return OSCAR_OK; /* no timing inside a capture */
    if (!c) {
        if (g->n_cls == GE_GEMM_MAX_CLASSES) return OSCAR_OK; /* the default serves further shapes */
        c = calloc(1, sizeof *c);
        if (!c) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
        c->N = N;
        c->K = K;
        c->beta = beta;
        g->cls[g->n_cls++] = c;
    }
    tuned *t = calloc(1, sizeof *t);
    if (!t) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    const int bucket = (M - 1) / GE_GEMM_BUCKET;
    oscar_status s = c->timed[bucket] ? take_bucket_choice(g, t, c->timed[bucket], M, N, K)
                                      : tune_shape(g, t, M, N, K, W, nW, X, Y, beta);
    if (s != OSCAR_OK) {
        tuned_free(t);
        return s;
    }
    c->by_m[M] = t;
    if (!c->timed[bucket]) c->timed[bucket] = t;
    return OSCAR_OK;
}

oscar_status ge_gemm_run(ge_gemm *g, int M, int N, int K, const void *W, const void *X, float *Y, float beta,
                         int pdl)
{
    if (M <= 0) return OSCAR_OK;
    if (!g->f32 && M <= 4 && K % 8 == 0 && aligned(W) && aligned(X) && (beta == 0.0f || beta == 1.0f)) {
        int err = ge_k_gemv_bf16(Y, W, X, M, N, K, beta == 1.0f, pdl, g->st);
        if (err != 0)
            return ge_set_error(OSCAR_ERR_BACKEND, "ge_gemm_run: GEMV launch failed: %s",
                                cudaGetErrorString((cudaError_t)err));
        return OSCAR_OK;
    }
    shape_class *c = g->tune && M <= GE_GEMM_TUNE_MAX_M ? find_class(g, N, K, beta) : NULL;
    tuned *t = c ? c->by_m[M] : NULL;
    if (t && !t->use_default && t->pick == GE_PICK_WGEMM && aligned(W) && aligned(X))
        return run_wgemm(g, t->wg_bn, t->wg_split, M, N, K, W, X, Y, beta, pdl);
    if (t && !t->use_default && aligned(W) && aligned(X) && aligned(Y)) {
        /* cuBLASLt checks a call before it queues anything: a refused one (a bucket's choice at a
         * count it was not timed at, say) falls back to the default, now and from then on. */
        if (run_lt(g, t, &t->algo, W, X, Y, beta) == CUBLAS_STATUS_SUCCESS) return OSCAR_OK;
        t->use_default = 1;
        t->pick = -1;
    }
    BL(run_default(g, M, N, K, W, X, Y, beta));
    return OSCAR_OK;
}

void ge_gemm_report(const ge_gemm *g, FILE *f)
{
    for (int i = 0; i < g->n_cls; i++)
        for (int m = 0; m <= GE_GEMM_TUNE_MAX_M; m++) {
            const tuned *t = g->cls[i]->by_m[m];
            if (!t) continue;
            if (t->timed_at != m) {
                fprintf(f, "gemm M %d N %d K %d beta %g: as M %d (%s)\n", m, g->cls[i]->N, g->cls[i]->K,
                        (double)g->cls[i]->beta, t->timed_at, t->use_default ? "the default" : "its candidate");
                continue;
            }
            char which[96] = "the default";
            if (!t->use_default && t->pick == GE_PICK_WGEMM)
                snprintf(which, sizeof which, "warpgroup GEMM, %d columns a CTA, split %d", t->wg_bn, t->wg_split);
            else if (!t->use_default) snprintf(which, sizeof which, "cuBLASLt candidate %d", t->pick);
            else if (t->fastest >= 0)
                snprintf(which, sizeof which, "the default; %s %d took %.1f us, less than 3 %% faster",
                         t->fastest == GE_PICK_WGEMM ? "warpgroup GEMM split" : "candidate",
                         t->fastest == GE_PICK_WGEMM ? t->wg_split : t->fastest, (double)t->fastest_us);
            char ours[96] = "";
            for (int b = 0; b < 2; b++)
                if (t->wg_us[b] > 0.0f) {
                    const size_t l = strlen(ours);
                    snprintf(ours + l, sizeof ours - l, "%s%d cols split %d: %.1f us", l ? ", " : "; warpgroup GEMM ",
                             128 + 64 * b, t->wg_sp[b], (double)t->wg_us[b]);
                }
            fprintf(f, "gemm M %d N %d K %d beta %g: cuBLAS default %.1f us, chosen %.1f us (%s), %.3fx%s\n", m,
                    g->cls[i]->N, g->cls[i]->K, (double)g->cls[i]->beta, (double)t->default_us,
                    (double)t->best_us, which, t->best_us > 0.0f ? (double)(t->default_us / t->best_us) : 0.0, ours);
        }
}
