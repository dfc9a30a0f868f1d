/* oscar-gpu-selftest: the GPU engine's own kernels against host references
 * on fresh random inputs (seed printed): prefill attention (fp64 reference,
 * several prompts of awkward lengths, GQA, each head_dim), q/k norm + RoPE,
 * RMSNorm, SwiGLU, argmax, the decode steps' GEMV, the warpgroup GEMM, the tuned weight products (ge_gemm.h). Exit status 0
 * only if all pass. Localizes a
 * failure of the end-to-end check (perf/e2e/run.sh runs it first). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ge_gemm.h"
#include "ge_kernels.h"
#include "ge_sched.h" /* ge_last_error */

static uint64_t g_s;
static float frand(void)
{
    g_s = g_s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static uint16_t bf16_bits(float x)
{
    x = bf16_round(x);
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static float bits_f(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static int g_fail;
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (cudaError_t)(x);                                                         \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void report(const char *what, double err, double tol)
{
    int ok = err <= tol;
    printf("%-44s max error %.3g (tolerance %.3g): %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok) g_fail = 1;
}

static void *dup_dev(const void *h, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void test_attention(int d, int Hq, int Hkv, int f32out)
{
    const int S = 4;
    int lens[4] = {1, 63, 130, 257};
    int cu[5] = {0};
    for (int i = 0; i < S; i++) cu[i + 1] = cu[i] + lens[i];
    int T = cu[S];
    size_t nq = (size_t)T * Hq * d, nk = (size_t)T * Hkv * d;
    float *q = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4);
    uint16_t *kb = malloc(nk * 2), *vb = malloc(nk * 2);
    for (size_t i = 0; i < nq; i++) q[i] = 2.0f * frand();
    for (size_t i = 0; i < nk; i++) {
        kb[i] = bf16_bits(2.0f * frand());
        vb[i] = bf16_bits(frand());
        kf[i] = bits_f(kb[i]);
        vf[i] = bits_f(vb[i]);
    }
    float *dq = dup_dev(q, nq * 4);
    void *dk = dup_dev(kb, nk * 2), *dv = dup_dev(vb, nk * 2), *dcu = dup_dev(cu, sizeof cu), *dout;
    CK(cudaMalloc(&dout, nq * 4));
    CK(cudaMemset(dout, 0xff, nq * 4)); /* poison: NaN */
    float scale = 1.0f / sqrtf((float)d);
    CK(ge_k_prefill_attention(dout, f32out, dq, dk, dv, dcu, S, 257, Hq, Hkv, d, scale, NULL));
    CK(cudaDeviceSynchronize());
    float *o = malloc(nq * 4);
    if (f32out) CK(cudaMemcpy(o, dout, nq * 4, cudaMemcpyDeviceToHost));
    else {
        uint16_t *ob = malloc(nq * 2);
        CK(cudaMemcpy(ob, dout, nq * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nq; i++) o[i] = bits_f(ob[i]);
        free(ob);
    }
    double worst = 0;
    double *sc = malloc(300 * sizeof *sc);
    for (int s = 0; s < S; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++)
            for (int h = 0; h < Hq; h++) {
                int g = h / (Hq / Hkv);
                const float *qr = q + ((size_t)t * Hq + h) * d;
                double mx = -1e300, sum = 0;
                for (int p = cu[s]; p <= t; p++) {
                    double dot = 0;
                    for (int i = 0; i < d; i++) dot += (double)qr[i] * kf[((size_t)p * Hkv + g) * d + i];
                    sc[p - cu[s]] = dot * scale;
                    if (sc[p - cu[s]] > mx) mx = sc[p - cu[s]];
                }
                for (int p = cu[s]; p <= t; p++) sum += sc[p - cu[s]] = exp(sc[p - cu[s]] - mx);
                for (int i = 0; i < d; i++) {
                    double acc = 0;
                    for (int p = cu[s]; p <= t; p++) acc += sc[p - cu[s]] * vf[((size_t)p * Hkv + g) * d + i];
                    double ref = acc / sum, got = o[((size_t)t * Hq + h) * d + i];
                    double err = fabs(got - ref);
                    if (!(err <= worst)) worst = err; /* NaN (an unwritten output) fails */
                }
            }
    char name[96];
    snprintf(name, sizeof name, "prefill attention d%d Hq%d Hkv%d %s", d, Hq, Hkv, f32out ? "fp32" : "bf16");
    report(name, worst, f32out ? 2e-4 : 1e-2);
    free(q); free(kf); free(vf); free(kb); free(vb); free(o); free(sc);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dcu); cudaFree(dout);
}

static void test_qkv_post(void)
{
    const int T = 37, Hq = 8, Hkv = 2, d = 128, h2 = d / 2, nh = Hq + 2 * Hkv, maxp = 5000;
    size_t n = (size_t)T * nh * d;
    float *qkv = malloc(n * 4), *qn = malloc(d * 4), *kn = malloc(d * 4), *inv = malloc(h2 * 4);
    int32_t pos[37];
    for (size_t i = 0; i < n; i++) qkv[i] = 3.0f * frand();
    for (int i = 0; i < d; i++) { qn[i] = 1.0f + 0.5f * frand(); kn[i] = 1.0f + 0.5f * frand(); }
    for (int i = 0; i < h2; i++) inv[i] = (float)(1.0 / pow(1e6, 2.0 * i / d));
    for (int t = 0; t < T; t++) pos[t] = (int32_t)((t * 131) % maxp);
    float *dqkv = dup_dev(qkv, n * 4), *dqn = dup_dev(qn, d * 4), *dkn = dup_dev(kn, d * 4), *dinv = dup_dev(inv, h2 * 4);
    int32_t *dpos = dup_dev(pos, sizeof pos);
    float *dc, *ds, *dq32;
    void *dq16, *dk16, *dv16;
    CK(cudaMalloc((void **)&dc, (size_t)maxp * h2 * 4));
    CK(cudaMalloc((void **)&ds, (size_t)maxp * h2 * 4));
    CK(cudaMalloc((void **)&dq32, (size_t)T * Hq * d * 4));
    CK(cudaMalloc(&dq16, (size_t)T * Hq * d * 2));
    CK(cudaMalloc(&dk16, (size_t)T * Hkv * d * 2));
    CK(cudaMalloc(&dv16, (size_t)T * Hkv * d * 2));
    CK(ge_k_rope_table(dc, ds, dinv, 1.0f, maxp, d, NULL));
    CK(ge_k_qkv_post(dqkv, NULL, dqn, dkn, dc, ds, dpos, T, Hq, Hkv, d, 1e-6f, dq32, dq16, dk16, dv16, 0, NULL));
    CK(cudaDeviceSynchronize());
    float *q32 = malloc((size_t)T * Hq * d * 4);
    uint16_t *k16 = malloc((size_t)T * Hkv * d * 2), *v16 = malloc((size_t)T * Hkv * d * 2);
    CK(cudaMemcpy(q32, dq32, (size_t)T * Hq * d * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(k16, dk16, (size_t)T * Hkv * d * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(v16, dv16, (size_t)T * Hkv * d * 2, cudaMemcpyDeviceToHost));
    double wq = 0, wk = 0, wv = 0;
    float x[128];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *src = qkv + ((size_t)t * nh + h) * d;
            memcpy(x, src, sizeof x);
            if (h < Hq + Hkv) {
                const float *w = h < Hq ? qn : kn;
                double ss = 0;
                for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
                float iv = (float)(1.0 / sqrt(ss / d + 1e-6));
                for (int i = 0; i < d; i++) x[i] = w[i] * (x[i] * iv);
                for (int i = 0; i < h2; i++) {
                    float ang = (float)pos[t] * inv[i];
                    float c = (float)cos((double)ang), s = (float)sin((double)ang), a = x[i], b = x[i + h2];
                    x[i] = a * c - b * s;
                    x[i + h2] = b * c + a * s;
                }
            }
            for (int i = 0; i < d; i++) {
                if (h < Hq) {
                    double e = fabs(q32[((size_t)t * Hq + h) * d + i] - x[i]);
                    if (!(e <= wq)) wq = e;
                } else if (h < Hq + Hkv) {
                    double e = fabs(bits_f(k16[((size_t)t * Hkv + h - Hq) * d + i]) - bf16_round(x[i]));
                    if (!(e <= wk)) wk = e;
                } else {
                    double e = fabs(bits_f(v16[((size_t)t * Hkv + h - Hq - Hkv) * d + i]) - bf16_round(x[i]));
                    if (!(e <= wv)) wv = e;
                }
            }
        }
    report("q/k norm + RoPE: q fp32", wq, 1e-5);
    report("q/k norm + RoPE: k bf16 (vs rounded reference)", wk, 0.04); /* one bf16 ulp at 4 */
    report("v passthrough bf16", wv, 0.0);
    free(qkv); free(qn); free(kn); free(inv); free(q32); free(k16); free(v16);
    cudaFree(dqkv); cudaFree(dqn); cudaFree(dkn); cudaFree(dinv); cudaFree(dpos); cudaFree(dc); cudaFree(ds);
    cudaFree(dq32); cudaFree(dq16); cudaFree(dk16); cudaFree(dv16);
}

static void test_small(void)
{
    const int R = 5, H = 1000, FF = 333, V = 70001;
    float *x = malloc((size_t)R * H * 4), *w = malloc(H * 4), *gu = malloc((size_t)R * 2 * FF * 4);
    float *lg = malloc((size_t)R * V * 4);
    for (int i = 0; i < R * H; i++) x[i] = 4.0f * frand();
    for (int i = 0; i < H; i++) w[i] = frand();
    for (int i = 0; i < R * 2 * FF; i++) gu[i] = 6.0f * frand();
    for (int i = 0; i < R * V; i++) lg[i] = frand();
    int want[5] = {0, V - 1, 12345, 777, 777};
    for (int r = 0; r < R; r++) lg[(size_t)r * V + want[r]] = 2.0f;
    lg[(size_t)4 * V + 9999] = 2.0f; /* a tie: the lowest index wins */
    lg[(size_t)4 * V + 777] = 2.0f;
    want[4] = 777;
    float *dx = dup_dev(x, (size_t)R * H * 4), *dw = dup_dev(w, H * 4), *dgu = dup_dev(gu, (size_t)R * 2 * FF * 4),
          *dlg = dup_dev(lg, (size_t)R * V * 4), *dn, *da;
    int32_t *dam;
    CK(cudaMalloc((void **)&dn, (size_t)R * H * 4));
    CK(cudaMalloc((void **)&da, (size_t)R * FF * 4));
    CK(cudaMalloc((void **)&dam, R * 4));
    CK(ge_k_rmsnorm(dn, 1, dx, dw, R, H, 1e-6f, 0, NULL));
    CK(ge_k_swiglu(da, 1, dgu, R, FF, 0, NULL));
    CK(ge_k_argmax(dam, dlg, R, V, NULL));
    CK(cudaDeviceSynchronize());
    float *n = malloc((size_t)R * H * 4), *a = malloc((size_t)R * FF * 4);
    int32_t am[5];
    CK(cudaMemcpy(n, dn, (size_t)R * H * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(a, da, (size_t)R * FF * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(am, dam, sizeof am, cudaMemcpyDeviceToHost));
    double wn = 0, wa = 0;
    for (int r = 0; r < R; r++) {
        double ss = 0;
        for (int i = 0; i < H; i++) ss += (double)x[r * H + i] * x[r * H + i];
        float iv = (float)(1.0 / sqrt(ss / H + 1e-6));
        for (int i = 0; i < H; i++) {
            double e = fabs(n[r * H + i] - w[i] * (x[r * H + i] * iv));
            if (!(e <= wn)) wn = e;
        }
        for (int i = 0; i < FF; i++) {
            float g = gu[r * 2 * FF + i], u = gu[r * 2 * FF + FF + i];
            double e = fabs(a[r * FF + i] - g / (1.0f + expf(-g)) * u);
            if (!(e <= wa)) wa = e;
        }
    }
    report("RMSNorm fp32", wn, 1e-5);
    report("SwiGLU fp32", wa, 1e-5);
    int bad = 0;
    for (int r = 0; r < R; r++) bad += am[r] != want[r];
    report("argmax (rows of 70001, a tie)", bad, 0);
    free(x); free(w); free(gu); free(lg); free(n); free(a);
    cudaFree(dx); cudaFree(dw); cudaFree(dgu); cudaFree(dlg); cudaFree(dn); cudaFree(da); cudaFree(dam);
}

/* SwiGLU's two forms (16-byte loads where FF % 4 == 0 and the buffers are aligned, else one value
 * per thread) on the same values: against the host formula (fp32 within 1e-5; bf16 within one bf16
 * step of the rounded value), the two forms bit for bit, and nothing written past rows x FF (the
 * output buffer poisoned with 0xff bytes beyond it). Unaligned: gu one float off 16 bytes. */
static void test_swiglu_paths(void)
{
    const int R = 7, FF = 336, PAD = 64;
    const size_t ngu = (size_t)R * 2 * FF, nout = (size_t)R * FF;
    float *gu = malloc((ngu + 4) * 4);
    for (size_t i = 0; i < ngu + 4; i++) gu[i] = 6.0f * frand();
    float *dgu = dup_dev(gu, (ngu + 4) * 4);
    unsigned char *dout;
    CK(cudaMalloc((void **)&dout, nout * 4 + PAD));
    unsigned char *out[2] = {malloc(nout * 4 + PAD), malloc(nout * 4 + PAD)};
    for (int f32 = 1; f32 >= 0; f32--) {
        const size_t esz = f32 ? 4 : 2;
        for (int form = 0; form < 2; form++) { /* 0: 16-byte form (aligned), 1: unaligned (gu + 1) */
            CK(cudaMemset(dout, 0xff, nout * 4 + PAD));
            if (form) CK(cudaMemcpy(dgu + 1, gu, ngu * 4, cudaMemcpyHostToDevice));
            else CK(cudaMemcpy(dgu, gu, ngu * 4, cudaMemcpyHostToDevice));
            CK(ge_k_swiglu(dout, f32, dgu + form, R, FF, 0, NULL));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(out[form], dout, nout * 4 + PAD, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (size_t i = 0; i < nout; i++) {
                const size_t r = i / FF, j = i % FF;
                const float g = gu[r * 2 * FF + j], u = gu[r * 2 * FF + FF + j];
                const float want = g / (1.0f + expf(-g)) * u;
                double got, tol;
                if (f32) {
                    float v;
                    memcpy(&v, out[form] + 4 * i, 4);
                    got = v;
                    tol = 1e-5;
                } else {
                    uint16_t b;
                    memcpy(&b, out[form] + 2 * i, 2);
                    got = bits_f(b);
                    tol = fabs(bf16_round(want)) * 0x1p-7 + 1e-6; /* one bf16 step */
                }
                const double e = fabs(got - (f32 ? want : bf16_round(want))) / tol;
                if (!(e <= worst)) worst = e;
            }
            for (size_t i = nout * esz; i < nout * 4 + PAD; i++)
                if (out[form][i] != 0xff) worst = 1e9; /* written past the rows */
            char what[64];
            snprintf(what, sizeof what, "SwiGLU %s, %s (x tolerance)", f32 ? "fp32" : "bf16",
                     form ? "one value per thread" : "16-byte form");
            report(what, worst, 1.0);
        }
        report(f32 ? "SwiGLU fp32: the two forms bit for bit" : "SwiGLU bf16: the two forms bit for bit",
               memcmp(out[0], out[1], nout * esz) != 0, 0);
    }
    free(gu); free(out[0]); free(out[1]);
    cudaFree(dgu); cudaFree(dout);
}

/* float64 x W^T (M rows, W [N][K] and x bf16) into ref [M][N], and sum |w x| into mag. */
static void product_ref(const uint16_t *w, const uint16_t *x, int M, int N, int K, double *ref, double *mag)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double r = 0.0, a = 0.0;
            for (int k = 0; k < K; k++) {
                double p = (double)bits_f(w[(size_t)n * K + k]) * bits_f(x[(size_t)m * K + k]);
                r += p;
                a += fabs(p);
            }
            ref[(size_t)m * N + n] = r;
            mag[(size_t)m * N + n] = a;
        }
}

/* Largest error of y = (acc ? y0 : 0) + x W^T against ref / mag (product_ref, rows >= M), relative
 * to sum |w x| (+ |y0|); 1.0 if a value of y past the M rows (up to total values) differs from y0. */
static double ref_error(const double *ref, const double *mag, const float *y0, const float *y, int M, int N, int acc,
                        size_t total)
{
    double worst = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        const double r = ref[i] + (acc ? y0[i] : 0.0), a = mag[i] + (acc ? fabs(y0[i]) : 0.0);
        const double e = fabs(y[i] - r) / (a + 1e-30);
        if (!(e <= worst)) worst = e;
    }
    for (size_t i = (size_t)M * N; i < total; i++)
        if (y[i] != y0[i]) worst = 1.0;
    return worst;
}

/* ref_error of one product, its reference computed here. */
static double product_error(const uint16_t *w, const uint16_t *x, const float *y0, const float *y, int M, int N,
                            int K, int acc, size_t total)
{
    double *ref = malloc((size_t)M * N * sizeof(double)), *mag = malloc((size_t)M * N * sizeof(double));
    if (!ref || !mag) {
        fprintf(stderr, "oscar-gpu-selftest: out of host memory\n");
        exit(1);
    }
    product_ref(w, x, M, N, K, ref, mag);
    const double e = ref_error(ref, mag, y0, y, M, N, acc, total);
    free(ref);
    free(mag);
    return e;
}

/* The decode steps' GEMV (M = 1..4 rows, bf16 weights and activations, fp32 sums; with and
 * without accumulating into y) against a float64 product; error relative to sum |w x|. */
static void test_gemv_k(int K)
{
    const int N = 777;
    uint16_t *w = malloc((size_t)N * K * 2), *x = malloc((size_t)4 * K * 2);
    float *y0 = malloc((size_t)4 * N * 4), *y = malloc((size_t)4 * N * 4);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = bf16_bits(frand());
    for (int i = 0; i < 4 * K; i++) x[i] = bf16_bits(3.0f * frand());
    for (int i = 0; i < 4 * N; i++) y0[i] = frand();
    void *dw = dup_dev(w, (size_t)N * K * 2), *dx = dup_dev(x, (size_t)4 * K * 2);
    float *dy;
    CK(cudaMalloc((void **)&dy, (size_t)4 * N * 4));
    double worst = 0;
    for (int M = 1; M <= 4; M++)
        for (int acc = 0; acc < 2; acc++) {
            CK(cudaMemcpy(dy, y0, (size_t)4 * N * 4, cudaMemcpyHostToDevice));
            CK(ge_k_gemv_bf16(dy, dw, dx, M, N, K, acc, 0, NULL));
            CK(cudaMemcpy(y, dy, (size_t)4 * N * 4, cudaMemcpyDeviceToHost));
            double e = product_error(w, x, y0, y, M, N, K, acc, (size_t)4 * N);
            if (!(e <= worst)) worst = e;
        }
    char what[96];
    snprintf(what, sizeof what, "GEMV bf16, M 1..4, K %d (vs sum |w x|)", K);
    report(what, worst, 1e-5);
    free(w); free(x); free(y0); free(y);
    cudaFree(dw); cudaFree(dx); cudaFree(dy);
}

/* K slices per column 1, 2, 4, 8 (K / 8 = 9, 257, 513, 1537: slices of unequal length, loops
 * that end inside a group of four loads). */
static void test_gemv(void)
{
    const int ks[] = {72, 2056, 4104, 12296};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) test_gemv_k(ks[i]);
}

/* The weight products of 5..1024 rows after tuning (ge_gemm_tune picks a cuBLASLt algorithm or
 * keeps the default; 40 rows take the choice timed at 37), and without tuning, against a float64 product, with beta 0 and 1; rows of
 * y past M untouched. N 777: an output row stride that is not a multiple of 16 bytes. */
static void test_gemm_tuned(void)
{
    const int K = 1032, Ns[] = {776, 777}, Ms[] = {5, 37, 40, 172}, MX = 172; /* 40: 37's bucket's choice */
    void *ws;
    CK(cudaMalloc(&ws, (size_t)32 << 20));
    for (int ni = 0; ni < 2; ni++) {
        const int N = Ns[ni];
        uint16_t *w = malloc((size_t)N * K * 2), *x = malloc((size_t)MX * K * 2);
        float *y0 = malloc((size_t)(MX + 1) * N * 4), *y = malloc((size_t)(MX + 1) * N * 4);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = bf16_bits(frand());
        for (int i = 0; i < MX * K; i++) x[i] = bf16_bits(3.0f * frand());
        for (int i = 0; i < (MX + 1) * N; i++) y0[i] = frand();
        void *dw = dup_dev(w, (size_t)N * K * 2), *dx = dup_dev(x, (size_t)MX * K * 2);
        float *dy;
        CK(cudaMalloc((void **)&dy, (size_t)(MX + 1) * N * 4));
        for (int tune = 0; tune < 2; tune++) {
            ge_gemm *g = NULL;
            if (ge_gemm_create(NULL, ws, (size_t)32 << 20, 0, tune, &g) != OSCAR_OK) {
                printf("ge_gemm_create failed: %s\n", ge_last_error());
                g_fail = 1;
                ge_gemm_destroy(g);
                break;
            }
            double worst = 0;
            for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
                for (int acc = 0; acc < 2; acc++) {
                    const int M = Ms[mi];
                    const void *wl = dw;
                    oscar_status s = ge_gemm_tune(g, M, N, K, &wl, 1, dx, dy, (float)acc);
                    CK(cudaMemcpy(dy, y0, (size_t)(MX + 1) * N * 4, cudaMemcpyHostToDevice));
                    if (s == OSCAR_OK) s = ge_gemm_run(g, M, N, K, dw, dx, dy, (float)acc, 0);
                    if (s != OSCAR_OK) {
                        printf("ge_gemm M %d N %d: %s\n", M, N, ge_last_error());
                        worst = 1.0;
                        continue;
                    }
                    CK(cudaMemcpy(y, dy, (size_t)(MX + 1) * N * 4, cudaMemcpyDeviceToHost));
                    double e = product_error(w, x, y0, y, M, N, K, acc, (size_t)(MX + 1) * N);
                    if (!(e <= worst)) worst = e;
                }
            char what[96];
            snprintf(what, sizeof what, "GEMM bf16 %s, M 5/37/40/172, N %d, K %d", tune ? "tuned" : "default", N, K);
            report(what, worst, 1e-5);
            if (tune) ge_gemm_report(g, stdout);
            ge_gemm_destroy(g);
        }
        free(w); free(x); free(y0); free(y);
        cudaFree(dw); cudaFree(dx); cudaFree(dy);
    }
    cudaFree(ws);
}

/* The warpgroup GEMM (ge_k_wgemm_bf16, compute capability 9.0) directly: rows 5..256 across the
 * 64-row warpgroup edges, both column tiles, K splits 1 and 3 (K 72: a second K tile of 8 values),
 * N 777 (a partial column tile, rows of y not 16-byte aligned), beta 0 and 1, against float64
 * relative to sum |w x| (+ |y0|); rows past M untouched; a split call repeated gives the same bits. */
static void test_wgemm(void)
{
    if (!ge_k_wgemm_supported()) {
        printf("skip  warpgroup GEMM (not compute capability 9.0)\n");
        return;
    }
    const int N = 777, MX = 256, Ks[] = {72, 1032}, Ms[] = {5, 64, 65, 172, 192, 193, 256};
    const size_t part_bytes = (size_t)32 << 20;
    float *part;
    int *cnt;
    CK(cudaMalloc((void **)&part, part_bytes));
    CK(cudaMalloc((void **)&cnt, 64 * sizeof(int)));
    CK(cudaMemset(cnt, 0, 64 * sizeof(int)));
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        const int K = Ks[ki];
        uint16_t *w = malloc((size_t)N * K * 2), *x = malloc((size_t)MX * K * 2);
        float *y0 = malloc((size_t)(MX + 1) * N * 4), *y = malloc((size_t)(MX + 1) * N * 4),
              *y2 = malloc((size_t)(MX + 1) * N * 4);
        double *ref = malloc((size_t)MX * N * sizeof(double)), *mag = malloc((size_t)MX * N * sizeof(double));
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = bf16_bits(frand());
        for (int i = 0; i < MX * K; i++) x[i] = bf16_bits(3.0f * frand());
        for (int i = 0; i < (MX + 1) * N; i++) y0[i] = frand();
        product_ref(w, x, MX, N, K, ref, mag);
        void *dw = dup_dev(w, (size_t)N * K * 2), *dx = dup_dev(x, (size_t)MX * K * 2);
        float *dy;
        CK(cudaMalloc((void **)&dy, (size_t)(MX + 1) * N * 4));
        double worst = 0;
        int repeat_differs = 0, runs = 0;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int bn = 128; bn <= 192; bn += 64)
                for (int sp = 1; sp <= 3; sp += 2)
                    for (int acc = 0; acc < 2; acc++) {
                        const int M = Ms[mi], split = sp < (K + 63) / 64 ? sp : (K + 63) / 64;
                        if (bn == 192 && M > 192) continue;
                        for (int rep = 0; rep < (split > 1 ? 2 : 1); rep++) {
                            CK(cudaMemcpy(dy, y0, (size_t)(MX + 1) * N * 4, cudaMemcpyHostToDevice));
                            CK(ge_k_wgemm_bf16(dy, dw, dx, M, N, K, acc, bn, split, part, part_bytes, cnt, 64, 0,
                                               NULL));
                            CK(cudaMemcpy(rep ? y2 : y, dy, (size_t)(MX + 1) * N * 4, cudaMemcpyDeviceToHost));
                        }
                        if (split > 1) repeat_differs += memcmp(y, y2, (size_t)(MX + 1) * N * 4) != 0;
                        runs++;
                        const double e = ref_error(ref, mag, y0, y, M, N, acc, (size_t)(MX + 1) * N);
                        if (!(e <= worst)) worst = e;
                    }
        char what[128];
        snprintf(what, sizeof what, "warpgroup GEMM, %d calls, M 5..256, N %d, K %d, split 1/3", runs, N, K);
        report(what, worst, 1e-5);
        snprintf(what, sizeof what, "warpgroup GEMM split-K repeated bit for bit, K %d", K);
        report(what, repeat_differs, 0);
        free(w); free(x); free(y0); free(y); free(y2); free(ref); free(mag);
        cudaFree(dw); cudaFree(dx); cudaFree(dy);
    }
    cudaFree(part);
    cudaFree(cnt);
}

int main(void)
{
    unsigned seed = (unsigned)time(NULL);
    g_s = seed;
    printf("oscar-gpu-selftest: seed %u\n", seed);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "oscar-gpu-selftest: no CUDA device\n");
        return 1;
    }
    test_attention(128, 8, 2, 1);
    test_attention(128, 32, 8, 0);
    test_attention(64, 4, 4, 1);
    test_attention(256, 8, 1, 1);
    test_attention(64, 8, 2, 0);  /* tensor-core kernel, d 64 */
    test_attention(256, 8, 4, 0); /* bf16 out at d 256: the fp32 kernel */
    test_qkv_post();
    test_small();
    test_swiglu_paths();
    test_gemv();
    test_wgemm();
    test_gemm_tuned();
    printf("oscar-gpu-selftest: %s\n", g_fail ? "FAIL" : "all passed");
    return g_fail ? 3 : 0;
}
