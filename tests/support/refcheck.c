/* Shared test helpers (see refcheck.h). Built from the cpu_ref primitives
 * only, never from the backend code under test. */
#include "refcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- random */
uint64_t rc_fresh_seed(void) {
    /* OSCAR_TEST_SEED replays a failure: every scenario then uses that seed. */
    const char *env = getenv("OSCAR_TEST_SEED");
    if (env && *env) return strtoull(env, NULL, 10);
    static uint64_t counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    uint64_t s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (++counter * 0x9e3779b97f4a7c15ull);
    return s ? s : 1;
}
void rc_rng_seed(rc_rng *r, uint64_t seed) { r->s = seed ? seed : 0x1234567ull; }
uint64_t rc_next(rc_rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
double rc_uniform(rc_rng *r) { return (double)(rc_next(r) >> 11) * 0x1p-53; }
double rc_normal(rc_rng *r) {
    double u = rc_uniform(r), v = rc_uniform(r);
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}
int rc_randint(rc_rng *r, int lo, int hi) { return lo + (int)(rc_next(r) % (uint64_t)(hi - lo + 1)); }
void rc_shuffle_i32(rc_rng *r, int32_t *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = rc_randint(r, 0, i);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ------------------------------------------------------------ activations */
void rc_gen_kv(rc_rng *r, int n_tokens, int H, int d, int n_outliers, oscar_dtype kv_dtype, float *out) {
    float *mag = malloc((size_t)H * d * sizeof *mag), *off = malloc((size_t)H * d * sizeof *off);
    for (int i = 0; i < H * d; i++) {
        mag[i] = 1.0f;
        off[i] = (float)(0.3 * rc_normal(r));
    }
    /* Outlier channels as in real keys: a large signed offset that barely
     * changes from token to token, plus noise at a third of that magnitude. */
    for (int h = 0; h < H; h++)
        for (int o = 0; o < n_outliers; o++) {
            int c = rc_randint(r, 0, d - 1);
            double m = 10.0 + 40.0 * rc_uniform(r);
            mag[h * d + c] = (float)(0.3 * m);
            off[h * d + c] = (float)(rc_uniform(r) < 0.5 ? -m : m);
        }
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < H * d; i++)
            out[(size_t)t * H * d + i] = oscar_round_to(kv_dtype, (float)(off[i] + mag[i] * rc_normal(r)));
    free(mag);
    free(off);
}
void rc_to_dtype(oscar_dtype t, const float *src, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) oscar_store(t, dst, i, src[i]);
}
void rc_from_dtype(oscar_dtype t, const void *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = oscar_load(t, src, i);
}
void rc_random_rotation(rc_rng *r, int d, float *R) {
    double *U = malloc((size_t)d * d * sizeof *U); /* columns orthonormalised */
    for (int i = 0; i < d * d; i++) U[i] = rc_normal(r);
    for (int c = 0; c < d; c++) {
        for (int pass = 0; pass < 2; pass++) /* re-orthogonalise for fp64 accuracy */
            for (int k = 0; k < c; k++) {
                double dp = 0;
                for (int i = 0; i < d; i++) dp += U[i * d + c] * U[i * d + k];
                for (int i = 0; i < d; i++) U[i * d + c] -= dp * U[i * d + k];
            }
        double n = 0;
        for (int i = 0; i < d; i++) n += U[i * d + c] * U[i * d + c];
        n = 1.0 / sqrt(n);
        for (int i = 0; i < d; i++) U[i * d + c] *= n;
    }
    oscar_ref_compose_rotation(d, U, R);
    free(U);
}
double rc_orthogonality_error(int d, const float *R) { return oscar_ref_orthogonality_error(d, R, INFINITY); }
void rc_poison(void *p, size_t bytes) { memset(p, 0xff, bytes); }

/* ------------------------------------------------------- expected cache */
int rc_region(const oscar_layout_desc *l, int p, int L) {
    if (l->method == OSCAR_METHOD_BF16) return RC_PAGED16;
    if (p < l->sink) return RC_SINK;
    if (p < L - l->recent) return RC_2BIT;
    return RC_RECENT;
}

/* Feedback weights of kv head h, or NULL. */
static const float *rc_row_fb(const rc_seq_ref *s, int kv, int h) {
    return s->fb[kv] ? s->fb[kv] + (size_t)(s->num_rot == 1 ? 0 : h) * (size_t)s->d * (size_t)s->d : NULL;
}

int rc_seq_ref_build(const oscar_layout_desc *l, const float *rot_k, const float *rot_v, int num_rot,
                     const float *clip_k, const float *clip_v, int Lmax, const float *k, const float *v,
                     rc_seq_ref *s) {
    return rc_seq_ref_build_fb(l, rot_k, rot_v, NULL, NULL, num_rot, clip_k, clip_v, Lmax, k, v, s);
}

int rc_seq_ref_build_fb(const oscar_layout_desc *l, const float *rot_k, const float *rot_v, const float *fb_k,
                        const float *fb_v, int num_rot, const float *clip_k, const float *clip_v, int Lmax,
                        const float *k, const float *v, rc_seq_ref *s) {
    memset(s, 0, sizeof *s);
    s->l = *l;
    s->num_rot = num_rot;
    s->Lmax = Lmax;
    s->H = l->num_kv_heads;
    s->d = l->head_dim;
    s->ng = l->head_dim / l->group;
    int clips = l->method == OSCAR_METHOD_OSCAR2 || l->method == OSCAR_METHOD_OSCAR2_LM;
    if (s->H > RC_MAX_KV_HEADS) return -1;
    for (int h = 0; h < s->H; h++) {
        s->clip[0][h] = clips ? clip_k[h] : 1.0f;
        s->clip[1][h] = clips ? clip_v[h] : 1.0f;
    }
    int lm = l->method == OSCAR_METHOD_OSCAR2_LM, d = s->d, H = s->H;
    size_t rows = (size_t)(Lmax > 0 ? Lmax : 1) * H;
    for (int kv = 0; kv < 2; kv++) {
        s->rot[kv] = malloc(rows * d * sizeof(float));
        s->deq[kv] = malloc(rows * d * sizeof(float));
        s->codes[kv] = calloc(rows * d / 4, 1);
        s->meta[kv] = calloc(rows * s->ng * 2, sizeof(float));
        if (!s->rot[kv] || !s->deq[kv] || !s->codes[kv] || !s->meta[kv]) return -1;
        const float *F0 = kv ? fb_v : fb_k;
        if (F0) {
            size_t n = (size_t)num_rot * (size_t)l->head_dim * (size_t)l->head_dim;
            if (!(s->fb[kv] = malloc(n * sizeof(float)))) return -1;
            memcpy(s->fb[kv], F0, n * sizeof(float));
        }
        const float *src = kv ? v : k, *R0 = kv ? rot_v : rot_k;
        for (size_t row = 0; row < rows; row++) {
            int p = (int)(row / H), h = (int)(row % H);
            const float *R = R0 ? R0 + (size_t)(num_rot == 1 ? 0 : h) * d * d : NULL;
            float *xr = s->rot[kv] + row * d;
            oscar_ref_rotate(d, src + row * d, R, xr);
            for (int j = 0; j < d; j++) xr[j] = oscar_round_to(l->kv_dtype, xr[j]);
            if (l->method != OSCAR_METHOD_BF16 && p >= l->sink) {
                oscar_ref_quantize_row_fb(d, l->group, lm, s->clip[kv][h], l->meta_dtype, xr, rc_row_fb(s, kv, h),
                                          s->codes[kv] + row * d / 4, s->meta[kv] + row * s->ng * 2);
                oscar_ref_dequantize_row(d, l->group, lm, s->codes[kv] + row * d / 4, s->meta[kv] + row * s->ng * 2,
                                         s->deq[kv] + row * d);
            } else {
                memcpy(s->deq[kv] + row * d, xr, (size_t)d * sizeof(float));
            }
        }
    }
    return 0;
}
void rc_seq_ref_free(rc_seq_ref *s) {
    for (int kv = 0; kv < 2; kv++) {
        free(s->rot[kv]);
        free(s->deq[kv]);
        free(s->codes[kv]);
        free(s->meta[kv]);
        free(s->fb[kv]);
    }
    memset(s, 0, sizeof *s);
}
const float *rc_stored_row(const rc_seq_ref *s, int kv, int p, int h, int L) {
    size_t row = ((size_t)p * s->H + h) * s->d;
    return rc_region(&s->l, p, L) == RC_2BIT ? s->deq[kv] + row : s->rot[kv] + row;
}

/* Is the reference code choice of value j within 1e-4 of a boundary? Under
 * error feedback, t is that of value j after the feedback of the values
 * before it (replayed from the reference's codes and metadata). */
static int near_boundary(const rc_seq_ref *s, int kv, size_t row, int j) {
    const float *x = s->rot[kv] + row * s->d;
    const float c = s->clip[kv][row % (size_t)s->H];
    float tau = c < 1.0f ? oscar_ref_clip_tau(s->d, x, c) : INFINITY;
    float xv = fminf(fmaxf(x[j], -tau), tau);
    const float *F = rc_row_fb(s, kv, (int)(row % (size_t)s->H));
    if (F) {
        static const float lv[4] = {-OSCAR_LM_L0, -OSCAR_LM_L1, OSCAR_LM_L1, OSCAR_LM_L0};
        const int lmq = s->l.method == OSCAR_METHOD_OSCAR2_LM, d = s->d;
        float v[256];
        for (int i = 0; i <= j; i++) v[i] = x[i]; /* feedback starts unclipped (FORMAT.md §2.3) */
        for (int i = 0; i < j; i++) {
            const float *mi = s->meta[kv] + row * s->ng * 2 + (size_t)(i / s->l.group) * 2;
            int c = oscar_ref_code_at(s->codes[kv] + row * d / 4, i);
            float e = v[i] - (mi[1] + mi[0] * (lmq ? lv[c] : (float)c));
            if (e == 0.0f) continue;
            for (int k = i + 1; k <= j; k++) v[k] = fmaf(-e, F[(size_t)i * d + k], v[k]);
        }
        xv = v[j];
    }
    const float *m = s->meta[kv] + row * s->ng * 2 + (size_t)(j / s->l.group) * 2;
    if (m[0] == 0.0f) return 0;
    float t = (xv - m[1]) / m[0];
    static const float uni[3] = {0.5f, 1.5f, 2.5f}, lm[3] = {-OSCAR_LM_T, 0.0f, OSCAR_LM_T};
    const float *bd = s->l.method == OSCAR_METHOD_OSCAR2_LM ? lm : uni;
    for (int i = 0; i < 3; i++)
        if (fabsf(t - bd[i]) < 1e-4f) return 1;
    return 0;
}

int rc_compare_seq(const rc_seq_ref *s, int L, const void *pages, const void *windows, const int32_t *bt_row,
                   int32_t slot, int allow_boundary, char *msg, size_t msg_len) {
    const oscar_layout_desc *l = &s->l;
    oscar_page_geom g;
    oscar_page_geom_init(l, &g);
    int d = s->d, H = s->H, S0 = l->sink, W = l->recent, bad = 0;
    size_t es = oscar_dtype_size(l->kv_dtype), ms = oscar_dtype_size(l->meta_dtype);
    size_t slot_bytes = 2 * (size_t)H * (size_t)(S0 + W) * d * es;
    uint16_t want16[256];
    static const char *names[] = {"sink", "2-bit", "recent", "paged16"};
    if (msg && msg_len) msg[0] = 0;
    for (int p = 0; p < L; p++) {
        int reg = rc_region(l, p, L);
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < H; h++) {
                size_t row = (size_t)p * H + h;
                int ok = 1;
                if (reg == RC_2BIT) {
                    int j2 = p - S0, r = j2 % g.P;
                    const char *page = (const char *)pages + (size_t)bt_row[j2 / g.P] * g.page_bytes;
                    size_t prow = (size_t)h * g.P + r;
                    const uint8_t *codes = (const uint8_t *)page + (kv ? g.v_codes : g.k_codes) + prow * g.codes_row_bytes;
                    const char *meta = page + (kv ? g.v_meta : g.k_meta) + prow * g.meta_row_bytes;
                    const uint8_t *wc = s->codes[kv] + row * d / 4;
                    const float *wm = s->meta[kv] + row * s->ng * 2;
                    for (int i = 0; i < 2 * s->ng && ok; i++) {
                        float got = oscar_load(l->meta_dtype, meta, (size_t)i);
                        if (oscar_f32_to_bits(got) == oscar_f32_to_bits(wm[i])) continue;
                        if (allow_boundary && fabsf(got - wm[i]) <= fabsf(wm[i]) * (ms == 2 ? 1e-3f : 1e-6f)) continue;
                        ok = 0;
                    }
                    for (int j = 0; j < d && ok; j++) {
                        if (oscar_ref_code_at(codes, j) == oscar_ref_code_at(wc, j)) continue;
                        if (!(allow_boundary && abs(oscar_ref_code_at(codes, j) - oscar_ref_code_at(wc, j)) == 1 &&
                              near_boundary(s, kv, row, j)))
                            ok = 0;
                        else if (s->fb[kv])
                            break; /* later values saw another error: not comparable */
                    }
                } else {
                    const char *src;
                    if (reg == RC_PAGED16) {
                        int r = p % g.P;
                        src = (const char *)pages + (size_t)bt_row[p / g.P] * g.page_bytes +
                              (kv ? g.v_codes : g.k_codes) + ((size_t)h * g.P + r) * g.codes_row_bytes;
                    } else {
                        int wr = p < S0 ? p : S0 + (p - S0) % W;
                        src = (const char *)windows + (size_t)slot * slot_bytes +
                              (((size_t)kv * H + h) * (size_t)(S0 + W) + (size_t)wr) * d * es;
                    }
                    rc_to_dtype(l->kv_dtype, s->rot[kv] + row * d, want16, (size_t)d);
                    ok = memcmp(src, want16, (size_t)d * es) == 0;
                }
                if (!ok) {
                    if (!bad && msg && msg_len)
                        snprintf(msg, msg_len, "L=%d: %s row of position %d (%s region), kv head %d differs", L,
                                 kv ? "V" : "K", p, names[reg], h);
                    bad++;
                }
            }
    }
    return bad;
}

void rc_attention_f64(const rc_seq_ref *s, int L, int Hq, const float *q, const float *rot_k, const float *rot_v,
                      int num_rot, double sm_scale, int rotated_output, double *out) {
    rc_attention_f64_at(s, L, L - 1, Hq, q, rot_k, rot_v, num_rot, sm_scale, rotated_output, out, NULL, NULL);
}

/* q~ as the CUDA tensor-core kernels meet the 2-bit codes with it (FORMAT.md §5),
 * from the device's own q~ (fp32, scaled by sm_scale log2(e)): qmx the power of two
 * >= max|q~|, element j scaled by 127 / qmx / 4^(j mod 4) and split into two int8
 * limbs l0 + l1 / 254, bit for bit as the kernel does; returned in q's units. */
/* The power of two >= max|q~| of a head the tensor-core kernels scale q~ by (exact). */
static float head_qmx(const float *qt, int d) {
    float mx = 0.0f;
    for (int j = 0; j < d; j++) mx = fmaxf(mx, fabsf(qt[j]));
    return mx > 0.0f && mx < 1e30f ? exp2f(ceilf(log2f(mx))) : 1.0f;
}

void rc_q_limbs2(const float *qt, int d, double sm_scale, double *q2) {
    const float qmx = head_qmx(qt, d);
    const double sc = (double)(float)(sm_scale * 1.4426950408889634);
    for (int j = 0; j < d; j++) {
        const float f = (127.0f / qmx) * (1.0f / (float)(1 << (2 * (j & 3))));
        const float y = qt[j] * f, r0 = rintf(y), r1 = rintf((y - r0) * 254.0f);
        q2[j] = ((double)r0 + (double)r1 / 254.0) / (double)f / sc;
    }
}

void rc_tf_attention(int T, int hq, int hkv, int d, int S0, int W, const float *q, const float *k, const float *v,
                     const float *kq, const float *vq, int t, int shift, int sink_shift, int chunk, double *out) {
    const int e = chunk > 0 ? ((t / chunk + 1) * chunk < T ? (t / chunk + 1) * chunk : T) : t + 1;
    double *s = malloc((size_t)(t + 1) * sizeof *s);
    const double scale = 1.0 / sqrt((double)d);
    for (int h = 0; h < hq; h++) {
        int g = h / (hq / hkv);
        const float *qh = q + ((size_t)t * hq + h) * d;
        double mx = -INFINITY;
        for (int p = 0; p <= t; p++) {
            int quant = p >= S0 + sink_shift && p <= e - 1 - W + shift;
            const float *kr = (quant ? kq : k) + ((size_t)p * hkv + g) * d;
            double acc = 0.0;
            for (int j = 0; j < d; j++) acc += (double)qh[j] * (double)kr[j];
            s[p] = acc * scale;
            mx = fmax(mx, s[p]);
        }
        double sum = 0.0;
        for (int p = 0; p <= t; p++) sum += s[p] = exp(s[p] - mx);
        double *o = out + (size_t)h * d;
        for (int j = 0; j < d; j++) o[j] = 0.0;
        for (int p = 0; p <= t; p++) {
            int quant = p >= S0 + sink_shift && p <= e - 1 - W + shift;
            const float *vr = (quant ? vq : v) + ((size_t)p * hkv + g) * d;
            for (int j = 0; j < d; j++) o[j] += s[p] / sum * (double)vr[j];
        }
    }
    free(s);
}

void rc_rotate_q(const float *q, const float *R, int d, double *qr) {
    for (int j = 0; j < d; j++) {
        double a = 0;
        if (R)
            for (int i = 0; i < d; i++) a += (double)q[i] * R[i * d + j];
        else
            a = q[j];
        qr[j] = a;
    }
}

void rc_attention_f64_at(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                         const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                         double *lse, double *abs_score) {
    rc_attention_f64_q(s, L, t, Hq, q, rot_k, rot_v, num_rot, sm_scale, rotated_output, out, lse, abs_score, NULL);
}

double rc_fa_value(float v) {
    return oscar_f16_to_f32(oscar_f32_to_f16(fminf(fmaxf(v, -65504.0f), 65504.0f)));
}

void rc_q_fa(const float *qt, int d, double sm_scale, double *q2) {
    const float qmx = head_qmx(qt, d);
    const double sc = (double)(float)(sm_scale * 1.4426950408889634);
    for (int j = 0; j < d; j++) {
        const int k = j & 7;
        const float w = k < 4 ? (float)(1 << (2 * k)) : k == 4 ? 256.0f : (float)(1 << (2 * (k - 5)));
        const float f = 32768.0f / w / qmx; /* powers of two: exact */
        q2[j] = (double)oscar_f16_to_f32(oscar_f32_to_f16(qt[j] * f)) / (double)f / sc;
    }
}

static void attention_f64(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                          const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                          double *lse, double *abs_score, const float *qt_dev, int fa);

void rc_attention_f64_q(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                        const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                        double *lse, double *abs_score, const float *qt_dev) {
    attention_f64(s, L, t, Hq, q, rot_k, rot_v, num_rot, sm_scale, rotated_output, out, lse, abs_score, qt_dev, 0);
}

void rc_attention_f64_fa(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                         const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                         double *lse, const float *qt_dev) {
    attention_f64(s, L, t, Hq, q, rot_k, rot_v, num_rot, sm_scale, rotated_output, out, lse, NULL, qt_dev, 1);
}

static void attention_f64(const rc_seq_ref *s, int L, int t, int Hq, const float *q, const float *rot_k,
                          const float *rot_v, int num_rot, double sm_scale, int rotated_output, double *out,
                          double *lse, double *abs_score, const float *qt_dev, int fa) {
    int d = s->d, H = s->H, gq = Hq / H, vis = t + 1;
    double *sc = malloc((size_t)vis * sizeof *sc), qr[256], q2[256], o[256];
    for (int hq = 0; hq < Hq; hq++) {
        int h = hq / gq;
        const float *RK = rot_k ? rot_k + (size_t)(num_rot == 1 ? 0 : h) * d * d : NULL;
        const float *RV = rot_v ? rot_v + (size_t)(num_rot == 1 ? 0 : h) * d * d : NULL;
        rc_rotate_q(q + (size_t)hq * d, RK, d, qr);
        if (qt_dev) (fa ? rc_q_fa : rc_q_limbs2)(qt_dev + (size_t)hq * d, d, sm_scale, q2);
        double mx = -INFINITY, amx = 0;
        for (int p = 0; p < vis; p++) {
            const float *k = rc_stored_row(s, 0, p, h, L);
            /* the kernels meet the codes (x~ - b) with q', the bias b of each group with q~ */
            const float *mb = qt_dev && rc_region(&s->l, p, L) == RC_2BIT
                                  ? s->meta[0] + ((size_t)p * H + h) * (size_t)s->ng * 2 : NULL;
            double a = 0, aa = 0;
            for (int j = 0; j < d; j++) {
                const double b = mb ? mb[(j / s->l.group) * 2 + 1] : 0.0;
                a += mb ? q2[j] * (k[j] - b) + qr[j] * b : qr[j] * k[j];
                aa += fabs(qr[j] * k[j]);
            }
            sc[p] = a * sm_scale;
            if (sc[p] > mx) mx = sc[p];
            if (aa > amx) amx = aa;
        }
        if (abs_score) abs_score[hq] = amx * fabs(sm_scale);
        double sum = 0;
        for (int j = 0; j < d; j++) o[j] = 0;
        for (int p = 0; p < vis; p++) {
            double w = exp(sc[p] - mx);
            sum += w;
            const float *v = rc_stored_row(s, 1, p, h, L);
            if (fa && rc_region(&s->l, p, L) == RC_2BIT)
                for (int j = 0; j < d; j++)
                    o[j] += w * rc_fa_value(v[j]);
            else
                for (int j = 0; j < d; j++) o[j] += w * v[j];
        }
        for (int j = 0; j < d; j++) o[j] /= sum;
        if (lse) lse[hq] = mx + log(sum);
        for (int i = 0; i < d; i++) {
            double a = 0;
            if (RV && !rotated_output)
                for (int j = 0; j < d; j++) a += o[j] * RV[i * d + j];
            else
                a = o[i];
            out[hq * d + i] = a;
        }
    }
    free(sc);
}

int rc_check_output(oscar_dtype t, const void *out, const double *ref, size_t n, char *msg, size_t msg_len) {
    return rc_check_output_abs(t, out, ref, n, 2e-4, msg, msg_len);
}

static double rc_worst;
double rc_worst_take(void) {
    const double w = rc_worst;
    rc_worst = 0.0;
    return w;
}
int rc_check_output_abs(oscar_dtype t, const void *out, const double *ref, size_t n, double abs_frac, char *msg,
                        size_t msg_len) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    double rel = t == OSCAR_DTYPE_BF16 ? 0x1p-8 : 0x1p-10;
    int bad = 0;
    if (msg && msg_len) msg[0] = 0;
    for (size_t i = 0; i < n; i++) {
        double got = oscar_load(t, out, i);
        double tol = rel * fabs(ref[i]) + abs_frac * mx + 1e-6;
        if (fabs(got - ref[i]) / tol > rc_worst) rc_worst = fabs(got - ref[i]) / tol;
        if (!(fabs(got - ref[i]) <= tol)) {
            if (!bad && msg && msg_len)
                snprintf(msg, msg_len, "output %zu: got %.7g, float64 reference %.7g (tol %.3g)", i, got, ref[i], tol);
            bad++;
        }
    }
    return bad;
}

/* ----------------------------------------------------------- paged batch */
int rc_pages_for(const oscar_layout_desc *l, int L) {
    int n = l->method == OSCAR_METHOD_BF16 ? L : L - l->sink - l->recent;
    return n <= 0 ? 0 : (n + l->page_size - 1) / l->page_size;
}

int rc_paged_init(rc_rng *r, const oscar_layout_desc *l, int num_seqs, const int32_t *max_lens, int spare_pages,
                  rc_paged *b) {
    memset(b, 0, sizeof *b);
    b->l = *l;
    oscar_page_geom_init(l, &b->g);
    b->num_seqs = num_seqs;
    b->page_bytes = b->g.page_bytes;
    b->slot_bytes = l->method == OSCAR_METHOD_BF16
                        ? 0
                        : 2 * (size_t)l->num_kv_heads * (size_t)(l->sink + l->recent) * l->head_dim *
                              oscar_dtype_size(l->kv_dtype);
    int total = 0, stride = 1;
    for (int i = 0; i < num_seqs; i++) {
        int np = rc_pages_for(l, max_lens[i]);
        total += np;
        if (np + 1 > stride) stride = np + 1; /* one unused column, left at -1 */
    }
    b->stride = stride;
    b->num_pages = total + spare_pages;
    b->num_slots = num_seqs + 1;
    b->seq_lens = calloc((size_t)num_seqs, sizeof(int32_t));
    b->window_slots = malloc((size_t)b->num_slots * sizeof(int32_t));
    b->block_table = malloc((size_t)num_seqs * stride * sizeof(int32_t));
    int32_t *ids = malloc((size_t)(b->num_pages > 0 ? b->num_pages : 1) * sizeof(int32_t));
    b->pages = malloc(b->page_bytes * (size_t)(b->num_pages > 0 ? b->num_pages : 1));
    b->windows = malloc(b->slot_bytes * (size_t)b->num_slots + 1);
    if (!b->seq_lens || !b->window_slots || !b->block_table || !ids || !b->pages || !b->windows) {
        free(ids);
        return -1;
    }
    for (int i = 0; i < b->num_pages; i++) ids[i] = i;
    rc_shuffle_i32(r, ids, b->num_pages);
    for (int i = 0; i < b->num_slots; i++) b->window_slots[i] = i;
    rc_shuffle_i32(r, b->window_slots, b->num_slots);
    int next = 0;
    for (int i = 0; i < num_seqs; i++) {
        int np = rc_pages_for(l, max_lens[i]);
        for (int c = 0; c < stride; c++) b->block_table[(size_t)i * stride + c] = c < np ? ids[next++] : -1;
    }
    free(ids);
    rc_poison(b->pages, b->page_bytes * (size_t)(b->num_pages > 0 ? b->num_pages : 1));
    rc_poison(b->windows, b->slot_bytes * (size_t)b->num_slots + 1);
    return 0;
}
void rc_paged_free(rc_paged *b) {
    free(b->seq_lens);
    free(b->window_slots);
    free(b->block_table);
    free(b->pages);
    free(b->windows);
    memset(b, 0, sizeof *b);
}

const rc_cfg rc_other_dim_shapes[RC_OTHER_DIM_SHAPES] = {
    {96, 96, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1},
    {80, 80, 32, 3, 5, 4, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0},
    {96, 32, 16, 2, 9, 8, 2, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
    {96, 48, 16, 0, 0, 4, 4, OSCAR_METHOD_INT2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0},
    {80, 80, 16, 0, 0, 4, 1, OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
    {112, 112, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1},
    {160, 80, 32, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
    {192, 96, 16, 4, 8, 8, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1},
    {48, 48, 16, 4, 8, 4, 2, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0},
    {32, 32, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
    {240, 80, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
    {208, 208, 16, 4, 8, 4, 2, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0},
};

void rc_plan_setup(const rc_cfg *c, int layers, rc_rng *r, oscar_layout_desc *l, int *num_rot, int *identity,
                   float **rot_k, float **rot_v, float *clip_k, float *clip_v) {
    memset(l, 0, sizeof *l);
    l->struct_size = sizeof *l;
    l->head_dim = c->d;
    l->group = c->G;
    l->num_q_heads = c->Hq;
    l->num_kv_heads = c->H;
    l->page_size = c->P;
    l->sink = c->S0;
    l->recent = c->W;
    l->max_seq_len = 100000;
    l->kv_dtype = c->kv;
    l->meta_dtype = c->meta;
    l->method = c->method;
    *num_rot = c->per_head ? c->H : 1;
    *identity = c->method == OSCAR_METHOD_INT2 || c->method == OSCAR_METHOD_BF16;
    *rot_k = *rot_v = NULL;
    size_t dd = (size_t)c->d * c->d, n = (size_t)layers * (size_t)*num_rot;
    if (!*identity) {
        *rot_k = malloc(n * dd * sizeof(float));
        *rot_v = malloc(n * dd * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            if (c->method == OSCAR_METHOD_QUAROT2) {
                oscar_ref_hadamard(c->d, *rot_k + i * dd);
                oscar_ref_hadamard(c->d, *rot_v + i * dd);
            } else {
                rc_random_rotation(r, c->d, *rot_k + i * dd);
                rc_random_rotation(r, c->d, *rot_v + i * dd);
            }
        }
    }
    for (int i = 0; i < layers * c->H; i++) {
        clip_k[i] = (float)(0.9 + 0.1 * rc_uniform(r));
        clip_v[i] = rc_uniform(r) < 0.2 ? 1.0f : (float)(0.85 + 0.1 * rc_uniform(r));
    }
}

/* ------------------------------------------------ error-feedback weights */
void rc_random_metric(rc_rng *r, int d, double spread, double *C) {
    float *Q = malloc((size_t)d * d * sizeof *Q);
    double *lam = malloc((size_t)d * sizeof *lam);
    rc_random_rotation(r, d, Q);
    for (int i = 0; i < d; i++) lam[i] = pow(spread, rc_uniform(r));
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = 0.0;
            for (int k = 0; k < d; k++) a += (double)Q[i * d + k] * lam[k] * (double)Q[j * d + k];
            C[(size_t)i * d + j] = a;
        }
    /* exactly symmetric */
    for (int i = 0; i < d; i++)
        for (int j = 0; j < i; j++) C[(size_t)i * d + j] = C[(size_t)j * d + i];
    free(Q);
    free(lam);
}

/* In-place lower Cholesky factor of the SPD n x n matrix A (A = L L^T; the
 * upper triangle is zeroed). Returns -1 if A is not positive definite. */
static int chol_lower(int n, double *A) {
    for (int j = 0; j < n; j++) {
        double s = A[(size_t)j * n + j];
        for (int k = 0; k < j; k++) s -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
        if (!(s > 0.0)) return -1;
        double ljj = sqrt(s);
        A[(size_t)j * n + j] = ljj;
        for (int i = j + 1; i < n; i++) {
            double t = A[(size_t)i * n + j];
            for (int k = 0; k < j; k++) t -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
            A[(size_t)i * n + j] = t / ljj;
        }
        for (int i = 0; i < j; i++) A[(size_t)i * n + j] = 0.0;
    }
    return 0;
}

double rc_feedback_weights(int d, const double *C, double damp, float *F) {
    size_t dd = (size_t)d * d;
    double *L = malloc(dd * sizeof *L), *Li = calloc(dd, sizeof *Li), *B = malloc(dd * sizeof *B);
    double tr = 0.0, mx = -1.0;
    for (int i = 0; i < d; i++) tr += C[(size_t)i * d + i];
    memcpy(L, C, dd * sizeof *L);
    for (int i = 0; i < d; i++) L[(size_t)i * d + i] += damp * tr / d;
    memset(F, 0, dd * sizeof *F);
    if (chol_lower(d, L)) goto out;
    /* Li = L^-1 (lower), column by column by forward substitution. */
    for (int c = 0; c < d; c++)
        for (int i = c; i < d; i++) {
            double t = i == c ? 1.0 : 0.0;
            for (int k = c; k < i; k++) t -= L[(size_t)i * d + k] * Li[(size_t)k * d + c];
            Li[(size_t)i * d + c] = t / L[(size_t)i * d + i];
        }
    /* B = A^-1 = Li^T Li. */
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double t = 0.0;
            for (int k = i > j ? i : j; k < d; k++) t += Li[(size_t)k * d + i] * Li[(size_t)k * d + j];
            B[(size_t)i * d + j] = t;
        }
    if (chol_lower(d, B)) goto out; /* B = L2 L2^T; U = L2^T: U^T U = A^-1 */
    mx = 0.0;
    for (int j = 0; j < d; j++)
        for (int k = j + 1; k < d; k++) {
            double f = B[(size_t)k * d + j] / B[(size_t)j * d + j];
            F[(size_t)j * d + k] = (float)f;
            mx = fabs(f) > mx ? fabs(f) : mx;
        }
out:
    free(L);
    free(Li);
    free(B);
    return mx;
}
