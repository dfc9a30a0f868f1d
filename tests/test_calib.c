/* Calibration core: targets against brute-force fp64, rotations, clip
 * fitting, the layer report and the state machine. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "oscar_ref.h"
#include "oscar_internal.h"
#include "refcheck.h"

static uint64_t g_seed, g_state;
static void seed_init(void) {
    /* OSCAR_TEST_SEED replays a seed a failure printed (the tests' convention, as in support/refcheck.c). */
    const char *env = getenv("OSCAR_TEST_SEED");
    if (env && *env)
        g_seed = (uint64_t)strtoull(env, NULL, 10);
    else
        g_seed = ((uint64_t)time(NULL) * 2654435761u) ^ ((uint64_t)getpid() << 20) ^ 0x5eedull;
    g_state = g_seed | 1;
}
static uint64_t rnd(void) {
    g_state ^= g_state << 13;
    g_state ^= g_state >> 7;
    g_state ^= g_state << 17;
    return g_state;
}
static double urand(void) { return ((double)(rnd() >> 11) + 0.5) * 0x1p-53; }
static double nrand(void) { return sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()); }

TestSuite(calib, .init = seed_init);

/* Synthetic activations of one layer: anisotropic (per-channel scales decaying
 * geometrically), a few channel outliers, optionally heavy-tailed (a per-token
 * scale with a long tail), and a mean on one query channel. The queries' large
 * channels are shifted away from the keys' outliers: when a key row's energy
 * sits in the top eigen-directions of C_K, R = U.H.P maps them onto Walsh
 * functions of one XOR-closed index set (bit-reversed ranks 0..15 = multiples
 * of 8), the row becomes block-constant and its 2-bit error lands coherently
 * in the heaviest directions; plain Hadamard then beats U.H.P at c = 1 (see
 * the calibration report). That case is measured, not asserted, here. */
typedef struct synth {
    int n, hq, hkv, d;
    float *q, *k, *v;
} synth;

static void synth_make(synth *s, int n, int hq, int hkv, int d, int heavy) {
    s->n = n, s->hq = hq, s->hkv = hkv, s->d = d;
    s->q = malloc(sizeof(float) * (size_t)n * (size_t)hq * (size_t)d);
    s->k = malloc(sizeof(float) * (size_t)n * (size_t)hkv * (size_t)d);
    s->v = malloc(sizeof(float) * (size_t)n * (size_t)hkv * (size_t)d);
    float *scale = malloc(sizeof(float) * (size_t)d);
    for (int i = 0; i < d; i++) scale[i] = (float)exp(-3.0 * i / d);
    int outl[4] = {3, d / 3, d / 2 + 1, d - 5};
    for (int o = 0; o < 4; o++) scale[outl[o]] = 12.0f;
    /* Values: flatter spectrum, milder channel outliers. */
    float vscale[256];
    for (int i = 0; i < d; i++) vscale[i] = (float)(1.0 + 0.5 * cos(0.37 * i));
    for (int o = 0; o < 4; o++) vscale[(outl[o] + 9) % d] = 5.0f;
    for (int t = 0; t < n; t++) {
        double tok = heavy ? 1.0 / sqrt(-log(urand()) + 0.05) : 1.0; /* long-tailed per-token factor */
        if (tok > 6.0) tok = 6.0;
        for (int j = 0; j < hq; j++)
            for (int i = 0; i < d; i++)
                s->q[((size_t)t * (size_t)hq + (size_t)j) * (size_t)d + (size_t)i] =
                    (float)(nrand() * scale[(i + 7 * j + 11) % d] + (i == 1 ? 2.0 : 0.0));
        for (int h = 0; h < hkv; h++)
            for (int i = 0; i < d; i++) {
                double e = heavy ? nrand() * (urand() < 0.02 ? 8.0 : 1.0) : nrand();
                s->k[((size_t)t * (size_t)hkv + (size_t)h) * (size_t)d + (size_t)i] = (float)(tok * e * scale[i]);
                s->v[((size_t)t * (size_t)hkv + (size_t)h) * (size_t)d + (size_t)i] =
                    (float)(nrand() * vscale[(i + 13 * h) % d] * (heavy ? tok : 1.0));
            }
    }
    free(scale);
}
static void synth_free(synth *s) {
    free(s->q);
    free(s->k);
    free(s->v);
}

/* Brute-force fp64 targets per KV head (the documented normalisation). */
static void brute_targets(const synth *s, double *CQ, double *CV) {
    int d = s->d, g = s->hq / s->hkv;
    size_t dd = (size_t)d * (size_t)d;
    memset(CQ, 0, sizeof(double) * dd * (size_t)s->hkv);
    memset(CV, 0, sizeof(double) * dd * (size_t)s->hkv);
    for (int h = 0; h < s->hkv; h++) {
        double *C = CQ + (size_t)h * dd;
        for (int t = 0; t < s->n; t++)
            for (int j = h * g; j < (h + 1) * g; j++) {
                const float *q = s->q + ((size_t)t * (size_t)s->hq + (size_t)j) * (size_t)d;
                for (int a = 0; a < d; a++)
                    for (int b = 0; b < d; b++) C[a * d + b] += (double)q[a] * (double)q[b];
            }
        for (size_t i = 0; i < dd; i++) C[i] /= (double)s->n * g;
        double wsum = 0;
        double *V = CV + (size_t)h * dd;
        for (int t = 0; t < s->n; t++) {
            const float *k = s->k + ((size_t)t * (size_t)s->hkv + (size_t)h) * (size_t)d;
            const float *v = s->v + ((size_t)t * (size_t)s->hkv + (size_t)h) * (size_t)d;
            double w = 0;
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) w += (double)k[a] * C[a * d + b] * (double)k[b];
            wsum += w;
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) V[a * d + b] += w * (double)v[a] * (double)v[b];
        }
        for (size_t i = 0; i < dd; i++) V[i] /= wsum;
    }
}

static double rel_frob(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* Feeds a layer in windows of random sizes (crossing the internal chunking), the same windows in both
 * passes (oscar_calib_begin_pass's contract: a pass-1 window of another length than the pass-0 window that
 * holds a probe is refused); the keys in both passes (the default attention-weighted key target reads them
 * in pass 0), the values in pass 1. */
static void feed_pass(oscar_calib *c, int layer, const synth *s, int pass, oscar_dtype dt, const void *q, const void *k,
                      const void *v) {
    size_t es = oscar_dtype_size(dt);
    uint64_t ws = 0x9e3779b97f4a7c15ull * (uint64_t)(layer + 1) ^ (uint64_t)s->n; /* same sizes in both passes */
    int t = 0;
    while (t < s->n) {
        ws = ws * 6364136223846793005ull + 1442695040888963407ull;
        int w = 1 + (int)((ws >> 33) % 3000);
        if (w > s->n - t) w = s->n - t;
        const char *qp = (const char *)q + (size_t)t * (size_t)s->hq * (size_t)s->d * es;
        const char *kp = (const char *)k + (size_t)t * (size_t)s->hkv * (size_t)s->d * es;
        const char *vp = (const char *)v + (size_t)t * (size_t)s->hkv * (size_t)s->d * es;
        cr_assert_eq(oscar_calib_feed(c, layer, w, pass == 0 ? qp : NULL, kp, pass == 1 ? vp : NULL, dt),
                     OSCAR_OK, "%s", oscar_last_error());
        t += w;
    }
}

static oscar_calib *make(int L, int hq, int hkv, int d, int per_head, int holdout, float key_attn) {
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    o.per_head = per_head;
    o.key_attn_weight = key_attn;
    o.holdout_rows = holdout;
    oscar_calib *c = NULL;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    return c;
}

static void check_targets(int per_head) {
    const int d = 64, hq = 4, hkv = 2, n = 4500 + (int)(rnd() % 1000);
    synth s[2];
    for (int l = 0; l < 2; l++) synth_make(&s[l], n, hq, hkv, d, l);
    oscar_calib *c = make(2, hq, hkv, d, per_head, 512, 0.0f); /* C_K = E[q q^T]: the weighted one has its own test */
    size_t dd = (size_t)d * d;
    double *out = malloc(sizeof(double) * dd), *CQ = malloc(sizeof(double) * dd * hkv),
           *CV = malloc(sizeof(double) * dd * hkv), *want = malloc(sizeof(double) * dd);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    for (int l = 0; l < 2; l++) feed_pass(c, l, &s[l], 0, OSCAR_DTYPE_F32, s[l].q, s[l].k, s[l].v);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK);
    for (int l = 0; l < 2; l++) feed_pass(c, l, &s[l], 1, OSCAR_DTYPE_F32, s[l].q, s[l].k, s[l].v);
    for (int l = 0; l < 2; l++) {
        brute_targets(&s[l], CQ, CV);
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < (per_head ? hkv : 1); h++) {
                const double *src = which ? CV : CQ;
                if (per_head) {
                    memcpy(want, src + (size_t)h * dd, sizeof(double) * dd);
                } else {
                    for (size_t i = 0; i < dd; i++) want[i] = 0.5 * (src[i] + src[dd + i]);
                }
                for (size_t i = 0; i < dd; i++) out[i] = NAN;
                cr_assert_eq(oscar_calib_target(c, l, h, (oscar_kv)which, out), OSCAR_OK, "%s", oscar_last_error());
                double e = rel_frob(out, want, dd);
                cr_assert_lt(e, 1e-10, "layer %d %c head %d: rel err %g (seed %llu)", l, which ? 'V' : 'K', h, e,
                             (unsigned long long)g_seed);
                for (int a = 0; a < d; a++)
                    for (int b = 0; b < d; b++) cr_assert_eq(out[a * d + b], out[b * d + a], "not symmetric");
            }
    }
    free(out);
    free(CQ);
    free(CV);
    free(want);
    oscar_calib_destroy(c);
    for (int l = 0; l < 2; l++) synth_free(&s[l]);
}

Test(calib, targets_match_brute_force) { check_targets(0); }
Test(calib, targets_per_head) { check_targets(1); }

/* BF16 input is converted exactly: same targets as F32 input of the rounded rows. */
Test(calib, bf16_input) {
    const int d = 64, hq = 2, hkv = 1, n = 700;
    synth s;
    synth_make(&s, n, hq, hkv, d, 0);
    size_t nq = (size_t)n * hq * d, nk = (size_t)n * hkv * d;
    uint16_t *qb = malloc(2 * nq), *kb = malloc(2 * nk), *vb = malloc(2 * nk);
    for (size_t i = 0; i < nq; i++) {
        qb[i] = oscar_f32_to_bf16(s.q[i]);
        s.q[i] = oscar_bf16_to_f32(qb[i]);
    }
    for (size_t i = 0; i < nk; i++) {
        kb[i] = oscar_f32_to_bf16(s.k[i]);
        s.k[i] = oscar_bf16_to_f32(kb[i]);
        vb[i] = oscar_f32_to_bf16(s.v[i]);
        s.v[i] = oscar_bf16_to_f32(vb[i]);
    }
    oscar_calib *a = make(1, hq, hkv, d, 0, 64, 1.0f), *b = make(1, hq, hkv, d, 0, 64, 1.0f);
    cr_assert_eq(oscar_calib_begin_pass(a, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(b, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(a, 0, n, qb, kb, NULL, OSCAR_DTYPE_BF16), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(b, 0, n, s.q, s.k, NULL, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(a, 1), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(b, 1), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(a, 0, n, NULL, kb, vb, OSCAR_DTYPE_BF16), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(b, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_OK);
    double *x = malloc(sizeof(double) * d * d), *y = malloc(sizeof(double) * d * d);
    for (int w = 0; w < 2; w++) {
        cr_assert_eq(oscar_calib_target(a, 0, 0, (oscar_kv)w, x), OSCAR_OK);
        cr_assert_eq(oscar_calib_target(b, 0, 0, (oscar_kv)w, y), OSCAR_OK);
        cr_assert_eq(memcmp(x, y, sizeof(double) * d * d), 0);
    }
    free(x);
    free(y);
    free(qb);
    free(kb);
    free(vb);
    oscar_calib_destroy(a);
    oscar_calib_destroy(b);
    synth_free(&s);
}

static int g_progress_calls;
static char g_last_stage[64];
static void on_progress(void *user, const char *stage, int64_t done, int64_t total) {
    (void)done, (void)total;
    (*(int *)user)++;
    g_progress_calls++;
    snprintf(g_last_stage, sizeof g_last_stage, "%s", stage);
}

/* Runs a whole calibration of L layers of synthetic data; returns params. */
static oscar_params *calibrate(oscar_calib_options *o, synth *s, oscar_calib **cal) {
    oscar_calib *c = NULL;
    cr_assert_eq(oscar_calib_create(o, &c), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    for (int l = 0; l < o->num_layers; l++) feed_pass(c, l, &s[l], 0, OSCAR_DTYPE_F32, s[l].q, s[l].k, s[l].v);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK);
    for (int l = 0; l < o->num_layers; l++) feed_pass(c, l, &s[l], 1, OSCAR_DTYPE_F32, s[l].q, s[l].k, s[l].v);
    oscar_params *p = NULL;
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_OK, "%s", oscar_last_error());
    *cal = c;
    return p;
}

/* Calibrates a synthetic two-layer model of head_dim d with the given placement, then checks what
 * finalize made: orthogonal rotations, eigenvalues, R = U . H . P undone to eigenvectors of the target
 * (H the format's spreading matrix, P the placement's positions), the report's ordering, a file round
 * trip. */
static void check_finalize(int d, int permutation) {
    const int hq = 4, hkv = 2, n = 3000, L = 2;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], n, hq, hkv, d, 1);
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    o.permutation = permutation; /* the check below undoes it */
    /* The clip claims below (heavy-tailed keys: a clip under 1 wins) are the row objective's: since both
     * passes feed the same windows (048ee2b) the probes hold, and the probe objective kept clip 1 on these
     * keys for about 1 seed in 4 (large-norm keys carry the attention). Its claims have their own tests. */
    o.clip_objective = 1;
    o.holdout_rows = 4096;
    o.model_hash = "synthetic-model";
    int calls = 0;
    o.progress = on_progress;
    o.progress_user = &calls;
    oscar_calib *c;
    oscar_params *p = calibrate(&o, s, &c);
    cr_assert_gt(calls, 4 * L);
    cr_assert_str_eq(g_last_stage, "done");
    oscar_params_info info;
    cr_assert_eq(oscar_params_get_info(p, &info), OSCAR_OK);
    cr_assert_eq(info.method, OSCAR_METHOD_OSCAR2);
    cr_assert_eq(info.calib_tokens, n);
    cr_assert_str_eq(info.model_hash, "synthetic-model");
    cr_assert_str_eq(p->composition, "U.H.P");
    size_t dd = (size_t)d * d;
    double *C = malloc(sizeof(double) * dd), *U = malloc(sizeof(double) * dd);
    float *H = malloc(sizeof(float) * dd);
    oscar_ref_hadamard(d, H);
    double sum_osc = 0, sum_had = 0;
    for (int l = 0; l < L; l++) {
        for (int w = 0; w < 2; w++) {
            const float *R;
            const double *lam;
            cr_assert_eq(oscar_params_rotation(p, l, 0, (oscar_kv)w, &R), OSCAR_OK);
            cr_assert_eq(oscar_params_eigenvalues(p, l, 0, (oscar_kv)w, &lam), OSCAR_OK);
            cr_assert_not_null(lam);
            cr_assert_eq(oscar_calib_target(c, l, 0, (oscar_kv)w, C), OSCAR_OK);
            /* Orthogonal in fp32. */
            double worst = 0, tr = 0, sum = 0;
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++) {
                    double acc = 0;
                    for (int k = 0; k < d; k++) acc += (double)R[i * d + k] * R[j * d + k];
                    worst = fmax(worst, fabs(acc - (i == j)));
                }
            cr_assert_lt(worst, 1e-5, "d %d layer %d: max |R R^T - I| = %g", d, l, worst);
            /* Eigenvalues: descending, summing to the trace. */
            for (int i = 0; i < d; i++) {
                tr += C[i * d + i];
                sum += lam[i];
                if (i) cr_assert_geq(lam[i - 1], lam[i], "eigenvalues not descending at %d", i);
            }
            cr_assert_lt(fabs(tr - sum), 1e-9 * fabs(tr));
            /* Undo H.P: R = U Pm H with row pos[r] of H for direction r, so U[i][r] = sum_j R[i][j]
             * H[pos[r]][j]; each column must be an eigenvector of C. */
            int pos[256];
            cr_assert_eq(oscar_ref_rotation_positions(d, permutation, pos), 0);
            for (int i = 0; i < d; i++)
                for (int r = 0; r < d; r++) {
                    double acc = 0;
                    for (int k = 0; k < d; k++) acc += (double)R[i * d + k] * H[(size_t)pos[r] * d + k];
                    U[i * d + r] = acc;
                }
            for (int r = 0; r < d; r++) {
                double res = 0;
                for (int i = 0; i < d; i++) {
                    double cu = 0;
                    for (int k = 0; k < d; k++) cu += C[i * d + k] * U[k * d + r];
                    res = fmax(res, fabs(cu - lam[r] * U[i * d + r]));
                }
                cr_assert_lt(res, 1e-4 * lam[0], "layer %d %c: direction %d is not an eigenvector (res %g)", l,
                             w ? 'V' : 'K', r, res);
            }
        }
        oscar_calib_layer_report rep;
        cr_assert_eq(oscar_calib_layer_report_get(c, l, &rep), OSCAR_OK);
        float ck, cv;
        oscar_params_clip(p, l, OSCAR_K, &ck);
        oscar_params_clip(p, l, OSCAR_V, &cv);
        cr_assert_eq(rep.clip_k, ck);
        cr_assert_eq(rep.clip_v, cv);
        cr_log_info("layer %d K err none %.4f hadamard %.4f oscar %.4f (clip %.2f); V %.4f %.4f %.4f (clip %.2f)", l,
                    rep.err_k[0], rep.err_k[1], rep.err_k[2], (double)ck, rep.err_v[0], rep.err_v[1], rep.err_v[2],
                    (double)cv);
        /* Channel outliers: Hadamard beats no rotation; rotation + fitted clip
         * beats Hadamard alone; heavy tails: a clip below 1 wins. */
        cr_assert_lt(rep.err_k[1], rep.err_k[0], "K: Hadamard %g !< none %g (seed %llu)", rep.err_k[1], rep.err_k[0],
                     (unsigned long long)g_seed);
        sum_osc += rep.err_k[2] + rep.err_v[2];
        sum_had += rep.err_k[1] + rep.err_v[1];
        cr_assert_lt(rep.err_v[1], rep.err_v[0], "V: Hadamard !< none (seed %llu)", (unsigned long long)g_seed);
        cr_assert_lt(ck, 1.0f, "heavy-tailed K: clip fit kept 1 (seed %llu)", (unsigned long long)g_seed);
        cr_assert_gt(rep.err_k[2], 0.0);
    }
    cr_assert_lt(sum_osc, sum_had, "OSCAR (rotation + fitted clip) %g !< Hadamard alone %g (seed %llu)", sum_osc,
                 sum_had, (unsigned long long)g_seed);
    free(C);
    free(U);
    free(H);
    /* Finalized parameters survive a file round trip. */
    char path[] = "/tmp/oscar_test_calib_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
    oscar_params *q = NULL;
    cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(memcmp(p->rot, q->rot, sizeof(float) * dd * 2 * L), 0);
    cr_assert_eq(memcmp(p->eig, q->eig, sizeof(double) * d * 2 * L), 0);
    unlink(path);
    oscar_params_destroy(q);
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

Test(calib, finalize_rotations_and_report) { check_finalize(128, OSCAR_REF_PERM_BITREV); /* the published placement */ }
/* Phi-3 / GPT-NeoX-20B's head_dim: the spreading matrix is the Kronecker product of a Paley matrix of
 * order 12 and the Walsh-Hadamard matrix of order 8; the default placement (spread) and bit-reversal. */
Test(calib, finalize_head_dim_96) {
    check_finalize(96, OSCAR_REF_PERM_SPREAD);
    check_finalize(96, OSCAR_REF_PERM_BITREV);
}
/* Phi-2 / Pythia's head_dim 80 (Paley 20 x Walsh 4), random placement. */
Test(calib, finalize_head_dim_80) { check_finalize(80, OSCAR_REF_PERM_RANDOM); }

Test(calib, fixed_clips_lloyd_max_and_per_head) {
    const int d = 64, hq = 4, hkv = 2, n = 800;
    synth s;
    synth_make(&s, n, hq, hkv, d, 1);
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, hq, hkv, d);
    o.clip_k = 0.9f;
    o.clip_v = 0.85f;
    o.method = OSCAR_METHOD_OSCAR2_LM;
    o.per_head = 1;
    o.group = 32;
    o.holdout_rows = 300;
    oscar_calib *c;
    oscar_params *p = calibrate(&o, &s, &c);
    float ck, cv;
    oscar_params_clip(p, 0, OSCAR_K, &ck);
    oscar_params_clip(p, 0, OSCAR_V, &cv);
    cr_assert_eq(ck, 0.9f);
    cr_assert_eq(cv, 0.85f);
    cr_assert_eq(p->method, OSCAR_METHOD_OSCAR2_LM);
    cr_assert_eq(p->per_head, 1);
    cr_assert_eq(p->num_rot, hkv);
    const float *R0, *R1;
    cr_assert_eq(oscar_params_rotation(p, 0, 0, OSCAR_K, &R0), OSCAR_OK);
    cr_assert_eq(oscar_params_rotation(p, 0, 1, OSCAR_K, &R1), OSCAR_OK);
    cr_assert_neq(memcmp(R0, R1, sizeof(float) * d * d), 0, "per-head rotations are identical");
    oscar_calib_layer_report rep;
    cr_assert_eq(oscar_calib_layer_report_get(c, 0, &rep), OSCAR_OK);
    for (int i = 0; i < 3; i++) cr_assert(isfinite(rep.err_k[i]) && rep.err_k[i] > 0 && isfinite(rep.err_v[i]));
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    synth_free(&s);
}

Test(calib, state_machine_and_bad_input) {
    const int d = 64, hq = 2, hkv = 1, n = 50;
    synth s;
    synth_make(&s, n, hq, hkv, d, 0);
    oscar_calib *c = make(2, hq, hkv, d, 0, 16, 1.0f);
    double *out = malloc(sizeof(double) * d * d), *ref = malloc(sizeof(double) * d * d);
    oscar_params *p = NULL;
    oscar_calib_layer_report rep;
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_ERR_STATE);
    cr_assert(strstr(oscar_last_error(), "begin") != NULL);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_ERR_STATE);
    cr_assert_null(p);
    cr_assert_eq(oscar_calib_begin_pass(c, 2), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_target(c, 0, 0, OSCAR_K, out), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_feed(c, 2, n, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed(c, -1, n, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, NULL, NULL, (oscar_dtype)7), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed(c, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed(c, 0, 0, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_EMPTY);
    cr_assert_eq(oscar_calib_feed(c, 0, -3, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT); /* no keys */
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, s.k, NULL, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_ERR_STATE); /* layer 1 not fed */
    cr_assert(strstr(oscar_last_error(), "layer 1") != NULL, "%s", oscar_last_error());
    /* A non-finite row is refused and leaves no trace. */
    int bad_t = (int)(rnd() % n), bad_i = (int)(rnd() % (hq * d));
    float keep = s.q[(size_t)bad_t * hq * d + bad_i];
    s.q[(size_t)bad_t * hq * d + bad_i] = (rnd() & 1) ? NAN : -INFINITY;
    cr_assert_eq(oscar_calib_feed(c, 1, n, s.q, s.k, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_NONFINITE);
    cr_assert(strstr(oscar_last_error(), "not finite") != NULL);
    s.q[(size_t)bad_t * hq * d + bad_i] = keep;
    cr_assert_eq(oscar_calib_feed(c, 1, n, s.q, s.k, NULL, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK);
    cr_assert_eq(oscar_calib_target(c, 1, 0, OSCAR_K, out), OSCAR_OK);
    cr_assert_eq(oscar_calib_target(c, 0, 0, OSCAR_K, ref), OSCAR_OK);
    cr_assert_eq(memcmp(out, ref, sizeof(double) * d * d), 0, "the refused batch left a trace");
    cr_assert_eq(oscar_calib_target(c, 0, 0, OSCAR_V, out), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_layer_report_get(c, 0, &rep), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    s.v[5] = NAN;
    cr_assert_eq(oscar_calib_feed(c, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_ERR_NONFINITE);
    cr_assert(strstr(oscar_last_error(), "value") != NULL);
    s.v[5] = 0.5f;
    cr_assert_eq(oscar_calib_target(c, 0, 0, OSCAR_V, out), OSCAR_ERR_STATE); /* nothing accumulated */
    cr_assert_eq(oscar_calib_feed(c, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_target(c, 0, 0, OSCAR_V, out), OSCAR_OK);
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_ERR_STATE); /* layer 1 pass 1 missing */
    cr_assert(strstr(oscar_last_error(), "same windows") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_feed(c, 1, n - 1, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_ERR_STATE); /* n - 1 != n tokens */
    cr_assert_eq(oscar_calib_feed(c, 1, 1, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_OK);
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_OK, "%s", oscar_last_error());
    oscar_params *p2 = (oscar_params *)1;
    cr_assert_eq(oscar_calib_finalize(c, &p2), OSCAR_ERR_STATE);
    cr_assert_null(p2);
    cr_assert_eq(oscar_calib_feed(c, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_layer_report_get(c, 1, &rep), OSCAR_OK);
    cr_assert_eq(oscar_calib_layer_report_get(c, 2, &rep), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    oscar_calib_destroy(NULL);
    free(out);
    free(ref);
    synth_free(&s);
}

Test(calib, bad_options) {
    oscar_calib_options o;
    oscar_calib *c = (oscar_calib *)1;
    oscar_calib_options_default(&o, 2, 8, 2, 100);
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    cr_assert_null(c);
    oscar_calib_options_default(&o, 2, 8, 3, 128);
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.group = 48;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_UNSUPPORTED_GROUP);
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.method = OSCAR_METHOD_INT2;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.clip_v = 1.5f;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.clip_per_head = 2;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "clip_per_head") != NULL, "%s", oscar_last_error());
    for (int bad = 0; bad < 2; bad++) {
        oscar_calib_options_default(&o, 2, 8, 2, 128);
        o.probe_queries = bad ? 65 : -1;
        cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(oscar_last_error(), "probe_queries") != NULL, "%s", oscar_last_error());
    }
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.probe_span = 2;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "probe_span") != NULL, "%s", oscar_last_error());
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.holdout_rows = 0;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_calib_options_default(&o, 2, 8, 2, 128);
    o.struct_size = 8;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_calib_options_default(&o, 0, 8, 2, 128);
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
    /* head_dim 256: the default group (128) is valid. */
    oscar_calib_options_default(&o, 1, 2, 1, 256);
    cr_assert_eq(o.group, 128);
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(c);
}

/* A shape within the per-field bounds whose state no machine here holds (1024 layers x 4096 KV
 * heads x d 256: 2 TiB of accumulators): refused before allocating, naming the size and the fix.
 * malloc was asked for it: out of memory at best, an abort under ASan. */
Test(calib, shape_too_large_for_memory_is_refused_first) {
    oscar_calib_options o;
    oscar_calib *c = (oscar_calib *)1;
    oscar_calib_options_default(&o, 1024, 4096, 4096, 256);
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_OUT_OF_MEMORY, "%s", oscar_last_error());
    cr_assert_null(c);
    cr_expect(strstr(oscar_last_error(), "GiB") && strstr(oscar_last_error(), "holdout_rows"), "%s",
              oscar_last_error());
    oscar_calib_options_default(&o, 1, 1, 1, 32); /* the reservoir alone: 1024 layers x 2^20 rows x d 256 */
    o.num_layers = 1024;
    o.num_q_heads = o.num_kv_heads = 1;
    o.head_dim = 256;
    o.group = 128;
    o.holdout_rows = 1 << 20;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_OUT_OF_MEMORY, "%s", oscar_last_error());
    cr_assert_null(c);
}

/* A model hash the parameter file cannot hold (control or non-ASCII bytes) is refused at create:
 * it was kept, saved, and the file then refused by oscar_params_load, after the whole calibration. */
Test(calib, model_hash_must_be_printable_ascii) {
    oscar_calib_options o;
    oscar_calib *c = (oscar_calib *)1;
    const char *bad[] = {"caf\xc3\xa9", "a\x1b[31mb", "tab\there"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        oscar_calib_options_default(&o, 1, 2, 1, 32);
        o.model_hash = bad[i];
        cr_expect_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT, "%s", oscar_last_error());
        cr_expect(strstr(oscar_last_error(), "printable ASCII"), "%s", oscar_last_error());
        if (c != (oscar_calib *)1) oscar_calib_destroy(c), c = (oscar_calib *)1;
    }
    oscar_calib_options_default(&o, 1, 2, 1, 32);
    o.model_hash = "arch=qwen3;layers=8 ~!@#$%^&*()";
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(c);
}

/* Reservoir: bounded, deterministic for the same feed order. */
Test(calib, holdout_deterministic) {
    const int d = 64, n = 900;
    synth s;
    synth_make(&s, n, 2, 1, d, 1);
    oscar_params *p[2];
    oscar_calib *c[2];
    for (int r = 0; r < 2; r++) {
        oscar_calib_options o;
        oscar_calib_options_default(&o, 1, 2, 1, d);
        o.holdout_rows = 100;
        cr_assert_eq(oscar_calib_create(&o, &c[r]), OSCAR_OK);
        cr_assert_eq(oscar_calib_begin_pass(c[r], 0), OSCAR_OK);
        cr_assert_eq(oscar_calib_feed(c[r], 0, n, s.q, s.k, NULL, OSCAR_DTYPE_F32), OSCAR_OK);
        cr_assert_eq(oscar_calib_begin_pass(c[r], 1), OSCAR_OK);
        for (int t = 0; t < n; t += 100)
            cr_assert_eq(oscar_calib_feed(c[r], 0, 100, NULL, s.k + (size_t)t * d, s.v + (size_t)t * d, OSCAR_DTYPE_F32),
                         OSCAR_OK);
        cr_assert_eq(oscar_calib_finalize(c[r], &p[r]), OSCAR_OK);
    }
    oscar_calib_layer_report a, b;
    oscar_calib_layer_report_get(c[0], 0, &a);
    oscar_calib_layer_report_get(c[1], 0, &b);
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "same feed, different hold-out");
    for (int r = 0; r < 2; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    synth_free(&s);
}

/* Speed: rank-k accumulation of 8 layers x 8192 tokens x 8 query heads x d 128. */
Test(calib, accumulation_speed) {
    const int L = 8, hq = 8, hkv = 2, d = 128, n = 8192;
    size_t nq = (size_t)n * hq * d, nk = (size_t)n * hkv * d;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    for (size_t i = 0; i < nq; i++) q[i] = (float)(urand() - 0.5);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(urand() - 0.5), v[i] = (float)(urand() - 0.5);
    oscar_calib *c = make(L, hq, hkv, d, 0, 256, 1.0f); /* the default target: pass 0 scores the sampled queries */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    for (int l = 0; l < L; l++)
        for (int w = 0; w < n; w += 2048)
            cr_assert_eq(oscar_calib_feed(c, l, 2048, q + (size_t)w * hq * d, k + (size_t)w * hkv * d, NULL, OSCAR_DTYPE_F32),
                         OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK);
    for (int l = 0; l < L; l++)
        for (int w = 0; w < n; w += 2048)
            cr_assert_eq(oscar_calib_feed(c, l, 2048, NULL, k + (size_t)w * hkv * d, v + (size_t)w * hkv * d, OSCAR_DTYPE_F32),
                         OSCAR_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_log_info("accumulation: %d layers x %d tokens (hq %d, d %d), both passes: %.3f s", L, n, hq, d, sec);
    cr_assert_lt(sec, 20.0, "accumulation too slow: %.2f s", sec);
    oscar_calib_destroy(c);
    free(q);
    free(k);
    free(v);
}

/* ------------------------------------------------------------ attention probes */

/* Feeds L layers of s window by window (windows of `win` tokens, the last one
 * shorter), q/k/v in pass 0 when kv0, else q and k (the probes then take their
 * keys and values from pass 1); k/v in pass 1. */
static oscar_params *calibrate_windows(oscar_calib_options *o, synth *s, int win, int kv0, oscar_calib **cal) {
    oscar_calib *c = NULL;
    cr_assert_eq(oscar_calib_create(o, &c), OSCAR_OK, "%s", oscar_last_error());
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(oscar_calib_begin_pass(c, pass), OSCAR_OK, "%s", oscar_last_error());
        for (int l = 0; l < o->num_layers; l++)
            for (int t = 0; t < s[l].n; t += win) {
                int w = s[l].n - t < win ? s[l].n - t : win;
                const float *q = s[l].q + (size_t)t * (size_t)s[l].hq * (size_t)s[l].d;
                const float *k = s[l].k + (size_t)t * (size_t)s[l].hkv * (size_t)s[l].d;
                const float *v = s[l].v + (size_t)t * (size_t)s[l].hkv * (size_t)s[l].d;
                cr_assert_eq(oscar_calib_feed(c, l, w, pass == 0 ? q : NULL, k, pass == 1 || kv0 ? v : NULL,
                                              OSCAR_DTYPE_F32),
                             OSCAR_OK, "%s", oscar_last_error());
            }
    }
    oscar_params *p = NULL;
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_OK, "%s", oscar_last_error());
    *cal = c;
    return p;
}

/* Probes: at most 8 per (layer, KV head) whatever the number of windows, the
 * same for the same feeds (and whether k/v come in pass 0 or pass 1), none
 * from windows of at most sink + recent + 32 tokens (the rows objective decides then). */
Test(calib, probes_bounded_and_deterministic) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160, nwin = 12 + (int)(rnd() % 8);
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win + 37, hq, hkv, d, l);
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    cr_assert_eq(o.sink, 64);
    cr_assert_eq(o.recent, 256);
    cr_assert_eq(o.clip_objective, 0);
    o.sink = 8;
    o.recent = 32 + (int)(rnd() % 40);
    o.holdout_rows = 512;
    oscar_calib *c[3];
    oscar_params *p[3];
    p[0] = calibrate_windows(&o, s, win, 1, &c[0]);
    p[1] = calibrate_windows(&o, s, win, 1, &c[1]);
    p[2] = calibrate_windows(&o, s, win, 0, &c[2]);
    for (int l = 0; l < L; l++) {
        oscar_calib_attn_report a[3];
        for (int r = 0; r < 3; r++) {
            memset(&a[r], 0xff, sizeof a[r]); /* poisoned */
            cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &a[r]), OSCAR_OK);
        }
        cr_assert_eq(a[0].probes, 8 * hkv, "layer %d: %d probes from %d windows", l, a[0].probes, nwin);
        for (int i = 0; i < 3; i++) {
            /* Relative to |o|^2, which averaging many values makes small: may exceed 1. */
            cr_assert(isfinite(a[0].err_k[i]) && a[0].err_k[i] > 0, "err_k[%d] %g", i, a[0].err_k[i]);
            cr_assert(isfinite(a[0].err_v[i]) && a[0].err_v[i] > 0, "err_v[%d] %g", i, a[0].err_v[i]);
            cr_assert(isfinite(a[0].err_kv[i]) && a[0].err_kv[i] > 0, "err_kv[%d] %g", i, a[0].err_kv[i]);
        }
        cr_assert_eq(memcmp(&a[0], &a[1], sizeof a[0]), 0, "layer %d: same feeds, different probes", l);
        cr_assert_eq(memcmp(&a[0], &a[2], sizeof a[0]), 0, "layer %d: k/v in pass 1 gave other probes", l);
        for (int w = 0; w < 2; w++) {
            float x, y;
            oscar_params_clip(p[0], l, (oscar_kv)w, &x);
            oscar_params_clip(p[2], l, (oscar_kv)w, &y);
            cr_assert_eq(x, y);
        }
    }
    for (int r = 0; r < 3; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    /* Windows too short for a probe: the rows objective decides, as with clip_objective 1. */
    o.recent = win - o.sink - 32;
    p[0] = calibrate_windows(&o, s, win, 1, &c[0]);
    o.clip_objective = 1;
    p[1] = calibrate_windows(&o, s, win, 1, &c[1]);
    for (int l = 0; l < L; l++) {
        oscar_calib_attn_report a;
        cr_assert_eq(oscar_calib_layer_attn_report_get(c[0], l, &a), OSCAR_OK);
        cr_assert_eq(a.probes, 0);
        cr_assert_eq(a.err_kv[2], 0.0);
        for (int w = 0; w < 2; w++) {
            float x, y;
            oscar_params_clip(p[0], l, (oscar_kv)w, &x);
            oscar_params_clip(p[1], l, (oscar_kv)w, &y);
            cr_assert_eq(x, y, "layer %d: no probes but clips differ from the rows objective", l);
        }
    }
    oscar_calib_attn_report a;
    cr_assert_eq(oscar_calib_layer_attn_report_get(c[0], L, &a), OSCAR_ERR_INVALID_ARGUMENT);
    for (int r = 0; r < 2; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    o.clip_objective = 2;
    oscar_calib *bad = (oscar_calib *)1;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    o.clip_objective = 0;
    o.recent = -1;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    o.recent = 10;
    o.sink = -1;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* Copy probes (oscar_calib_feed_copy): bounded by options.copy_probes per
 * (layer, KV head), counted in the attention report, deterministic, and they
 * touch neither the targets nor the rotations; bad calls are refused. */
/* Per-head clip ratios: each KV head's c_K minimises its own probes' K error,
 * so the layer's K probe error is at most that of one ratio for the layer
 * (the per-layer fit); clip_per_head 0 gives every head the layer's ratio. */
/* Defaults for a small synthetic model whose 160-token windows give probes. */
static void small_window_options(oscar_calib_options *o, int L, int hq, int hkv, int d) {
    oscar_calib_options_default(o, L, hq, hkv, d);
    cr_assert_eq(o->copy_probes, 0);
    cr_assert_eq(o->clip_per_head, 0);
    o->sink = 8;
    o->recent = 32;
    o->holdout_rows = 512;
}

Test(calib, clip_per_head_vs_per_layer) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160, nwin = 12;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win + 37, hq, hkv, d, l);
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    oscar_calib *c[2];
    oscar_params *p[2];
    for (int r = 0; r < 2; r++) {
        o.clip_per_head = r == 0;
        p[r] = calibrate_windows(&o, s, win, 1, &c[r]);
    }
    int differ = 0;
    for (int l = 0; l < L; l++) {
        oscar_calib_attn_report a[2];
        for (int r = 0; r < 2; r++) cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &a[r]), OSCAR_OK);
        cr_assert_leq(a[0].err_k[2], a[1].err_k[2] * (1.0 + 1e-9), "layer %d: per-head K error %g > per-layer %g",
                      l, a[0].err_k[2], a[1].err_k[2]);
        for (int w = 0; w < 2; w++) {
            float c0, c1, lay;
            cr_assert_eq(oscar_params_clip_head(p[1], l, 0, (oscar_kv)w, &c0), OSCAR_OK);
            cr_assert_eq(oscar_params_clip_head(p[1], l, 1, (oscar_kv)w, &c1), OSCAR_OK);
            cr_assert_eq(c0, c1, "layer %d: clip_per_head 0 gave heads different ratios", l);
            float h0, h1;
            oscar_params_clip_head(p[0], l, 0, (oscar_kv)w, &h0);
            oscar_params_clip_head(p[0], l, 1, (oscar_kv)w, &h1);
            oscar_params_clip(p[0], l, (oscar_kv)w, &lay);
            cr_assert_eq(lay, h0 > h1 ? h0 : h1, "the per-layer view is the mildest head");
            differ += h0 != h1;
        }
    }
    cr_log_info("per-head ratios differ on %d of %d (layer, K/V)", differ, 2 * L);
    for (int r = 0; r < 2; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
}

/* Code widths (wide_bits, docs/eval/retrieval.md ninth step): the report ranks every head-tensor by what 3
 * bits buy on its probes; a budget of k / (2 L Hkv) widens exactly the k best, each stored unclipped in 3
 * bits; 0 widens none and gives the same parameters otherwise. */
Test(calib, wide_bits_rule) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160, nwin = 12;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win + 37, hq, hkv, d, 0); /* not heavy-tailed */
    /* Layer 0 KV head 1's values 10x larger: its outputs, and the output error of its keys and of its
     * values (no value metric here: the identity), 100x, so one of them must rank first. (On a heavy-tailed synth 3 bits unclipped can lose to 2 bits clipped:
     * a negative gain, never widened.) */
    for (int t = 0; t < s[0].n; t++)
        for (int i = 0; i < d; i++) s[0].v[((size_t)t * (size_t)hkv + 1) * (size_t)d + (size_t)i] *= 10.0f;
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    const int n = 2 * L * hkv;
    oscar_calib *c[3];
    oscar_params *p[3];
    const int take[3] = {0, 1, 3};
    for (int r = 0; r < 3; r++) {
        o.wide_bits = (float)take[r] / (float)n;
        p[r] = calibrate_windows(&o, s, win, 1, &c[r]);
    }
    oscar_calib_width_report w[8];
    int order[8];
    for (int i = 0; i < n; i++) {
        cr_assert_eq(oscar_calib_width_report_get(c[0], i / 2 / hkv, i / 2 % hkv, (oscar_kv)(i % 2), &w[i]), OSCAR_OK,
                     "%s", oscar_last_error());
        cr_assert(w[i].err2 > 0.0 && w[i].err3 > 0.0 && w[i].norm > 0.0, "head-tensor %d: %g %g %g", i, w[i].err2,
                  w[i].err3, w[i].norm);
        cr_assert_eq(w[i].wide, 0);
        order[i] = i;
    }
    for (int i = 1; i < n; i++) /* by gain, largest first */
        for (int j = i; j > 0 && w[order[j]].err2 - w[order[j]].err3 > w[order[j - 1]].err2 - w[order[j - 1]].err3; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    cr_assert(order[0] / 2 == 1, "layer 0 KV head 1 (scaled values) does not rank first: head-tensor %d does "
              "(seed %llu)", order[0], (unsigned long long)g_seed);
    for (int k = 0; k < 3; k++)
        cr_assert_gt(w[order[k]].err2, w[order[k]].err3, "rank %d (head-tensor %d) gains nothing: %g -> %g", k,
                     order[k], w[order[k]].err2, w[order[k]].err3);
    for (int r = 0; r < 3; r++) {
        int widened = 0;
        for (int i = 0; i < n; i++) {
            const int l = i / 2 / hkv, h = i / 2 % hkv;
            const oscar_kv kv = (oscar_kv)(i % 2);
            int b = 0, top = 0;
            float cl = 0.0f, cl0 = 0.0f;
            for (int k = 0; k < take[r]; k++) top |= order[k] == i;
            oscar_calib_width_report wr;
            cr_assert_eq(oscar_calib_width_report_get(c[r], l, h, kv, &wr), OSCAR_OK);
            cr_assert(wr.err2 == w[i].err2 && wr.err3 == w[i].err3, "the ranking depends on the budget");
            cr_assert_eq(oscar_params_code_bits(p[r], l, h, kv, &b), OSCAR_OK);
            cr_assert_eq(b, top ? 3 : 2, "budget %d: head-tensor %d has %d bits", take[r], i, b);
            cr_assert_eq(wr.wide, top, "budget %d: report says wide %d for head-tensor %d", take[r], wr.wide, i);
            oscar_params_clip_head(p[r], l, h, kv, &cl);
            oscar_params_clip_head(p[0], l, h, kv, &cl0);
            cr_assert_eq(cl, top ? 1.0f : cl0, "budget %d: head-tensor %d clip %g (without widths %g)", take[r], i,
                         (double)cl, (double)cl0);
            widened += top;
        }
        cr_assert_eq(widened, take[r]);
    }
    /* Bad budgets and a method without 3-bit codes. */
    oscar_calib *bad = NULL;
    const float wrong[] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        o.wide_bits = wrong[i];
        cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT, "wide_bits %g", (double)wrong[i]);
        cr_assert(strstr(oscar_last_error(), "wide_bits") != NULL, "%s", oscar_last_error());
    }
    o.wide_bits = 0.1f;
    o.method = OSCAR_METHOD_OSCAR2_LM;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_UNSUPPORTED);
    cr_assert(strstr(oscar_last_error(), "wide_bits") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_width_report_get(c[0], 2, 0, OSCAR_K, &w[0]), OSCAR_ERR_INVALID_ARGUMENT);
    for (int r = 0; r < 3; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* The code-width budget is the default (docs/eval/retrieval.md, fourteenth step): oscar_calib_options_default
 * gives OSCAR_CALIB_WIDE_BITS_AUTO, which is 0.05 bits per element for OSCAR2 with the probe objective (the
 * same file as an explicit 0.05: on 20 head-tensors exactly one is widened) and 0 where the rule does not
 * apply: OSCAR2_LM and the row objective calibrate with the defaults without an error, 2 bits everywhere.
 * An explicit budget there is still refused; 0 gives 2 bits everywhere. */
Test(calib, wide_bits_default) {
    const int d = 64, hq = 4, hkv = 2, L = 5, win = 160, nwin = 6;
    synth s[5];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win + 37, hq, hkv, d, 0);
    for (int t = 0; t < s[0].n; t++) /* one head-tensor worth widening (as in wide_bits_rule) */
        for (int i = 0; i < d; i++) s[0].v[((size_t)t * (size_t)hkv + 1) * (size_t)d + (size_t)i] *= 10.0f;
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    cr_assert_eq(o.wide_bits, OSCAR_CALIB_WIDE_BITS_AUTO);
    cr_assert_eq(OSCAR_CALIB_WIDE_BITS_DEFAULT, 0.05f);
    const int n = 2 * L * hkv; /* 20: 0.05 bits per element is one head-tensor */
    /* 0: default (AUTO), 1: explicit 0.05, 2: explicit 0, 3: OSCAR2_LM by default, 4: row objective by default */
    oscar_calib *c[5];
    oscar_params *p[5];
    int wide[5];
    for (int r = 0; r < 5; r++) {
        oscar_calib_options x = o;
        if (r == 1) x.wide_bits = 0.05f;
        if (r == 2) x.wide_bits = 0.0f;
        if (r == 3) x.method = OSCAR_METHOD_OSCAR2_LM;
        if (r == 4) x.clip_objective = 1;
        p[r] = calibrate_windows(&x, s, win, 1, &c[r]);
        wide[r] = 0;
        for (int i = 0; i < n; i++) {
            int b = 0;
            cr_assert_eq(oscar_params_code_bits(p[r], i / 2 / hkv, i / 2 % hkv, (oscar_kv)(i % 2), &b), OSCAR_OK);
            wide[r] += b == 3;
        }
    }
    cr_assert_eq(wide[0], 1, "the default widened %d head-tensors of %d (want 1)", wide[0], n);
    cr_assert_eq(wide[1], 1);
    cr_assert_eq(wide[2], 0, "wide_bits 0 widened %d", wide[2]);
    cr_assert_eq(wide[3], 0, "OSCAR2_LM by default widened %d", wide[3]);
    cr_assert_eq(wide[4], 0, "the row objective by default widened %d", wide[4]);
    for (int i = 0; i < n; i++) { /* the default is the explicit 0.05, head-tensor by head-tensor */
        const int l = i / 2 / hkv, h = i / 2 % hkv;
        const oscar_kv kv = (oscar_kv)(i % 2);
        int b0 = 0, b1 = 0, b2 = 0;
        float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f;
        oscar_params_code_bits(p[0], l, h, kv, &b0);
        oscar_params_code_bits(p[1], l, h, kv, &b1);
        oscar_params_code_bits(p[2], l, h, kv, &b2);
        oscar_params_clip_head(p[0], l, h, kv, &c0);
        oscar_params_clip_head(p[1], l, h, kv, &c1);
        oscar_params_clip_head(p[2], l, h, kv, &c2);
        cr_assert(b0 == b1 && c0 == c1, "head-tensor %d: default %d bits clip %g, explicit 0.05 %d bits clip %g", i,
                  b0, (double)c0, b1, (double)c1);
        cr_assert_eq(c0, b0 == 3 ? 1.0f : c2, "head-tensor %d: clip %g, 2-bit file's %g", i, (double)c0, (double)c2);
    }
    /* An explicit budget where the rule does not apply is refused; AUTO is the only negative accepted. */
    oscar_calib *bad = NULL;
    oscar_calib_options x = o;
    x.method = OSCAR_METHOD_OSCAR2_LM;
    x.wide_bits = 0.05f;
    cr_assert_eq(oscar_calib_create(&x, &bad), OSCAR_ERR_UNSUPPORTED);
    x = o;
    x.clip_objective = 1;
    x.wide_bits = 0.05f;
    cr_assert_eq(oscar_calib_create(&x, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    x = o;
    x.wide_bits = -0.5f;
    cr_assert_eq(oscar_calib_create(&x, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "OSCAR_CALIB_WIDE_BITS_AUTO") != NULL, "%s", oscar_last_error());
    for (int r = 0; r < 5; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* clip_margin: the mildest ratio within (1 + margin) of the smallest probe
 * error. Per layer, so the K error at the chosen key ratio is the scan's:
 * margin 0 is the default fit, a margin never gives a harsher ratio and its K
 * error stays within the margin of margin 0's. */
Test(calib, clip_margin) {
    /* 4 layers: on these heavy-tailed probes a layer's milder clips can all cost more than
     * twice the best error (margin 1 then moves nothing); with 2 layers that happened
     * for both at ~1 % of seeds (e.g. OSCAR_TEST_SEED=301477345, 80566943) */
    const int d = 64, hq = 4, hkv = 2, L = 4, win = 160, nwin = 12;
    synth s[4];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win + 37, hq, hkv, d, 1);
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    cr_assert_eq(o.clip_margin, 0.0f);
    const float margins[3] = {0.0f, 0.05f, 1.0f};
    oscar_calib *c[3];
    oscar_params *p[3];
    for (int r = 0; r < 3; r++) {
        o.clip_margin = margins[r];
        p[r] = calibrate_windows(&o, s, win, 1, &c[r]);
    }
    int milder = 0;
    for (int l = 0; l < L; l++) {
        oscar_calib_attn_report a[3];
        float ck[3];
        for (int r = 0; r < 3; r++) {
            cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &a[r]), OSCAR_OK);
            oscar_params_clip(p[r], l, OSCAR_K, &ck[r]);
        }
        for (int r = 1; r < 3; r++) {
            cr_assert_geq(ck[r], ck[r - 1], "layer %d: margin %g gave key clip %g, harsher than %g", l,
                          (double)margins[r], (double)ck[r], (double)ck[r - 1]);
            cr_assert_leq(a[r].err_k[2], a[0].err_k[2] * (1.0 + (double)margins[r]) * (1.0 + 1e-9),
                          "layer %d: margin %g: K error %g, margin 0 %g", l, (double)margins[r], a[r].err_k[2],
                          a[0].err_k[2]);
            milder += ck[r] > ck[0];
        }
    }
    cr_assert_gt(milder, 0, "seed %llu: a margin of 1 should make some key clip milder on these probes",
                 (unsigned long long)g_seed);
    for (int r = 0; r < 3; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    o.clip_margin = 1.5f;
    oscar_calib *bad = (oscar_calib *)1;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "clip_margin") != NULL, "%s", oscar_last_error());
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

Test(calib, copy_probes) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160, nwin = 6, ncopy = 5;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win, hq, hkv, d, l);
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    oscar_calib *c[3];
    oscar_params *p[3];
    for (int r = 0; r < 3; r++) {
        o.copy_probes = r == 0 ? 0 : 3;
        cr_assert_eq(oscar_calib_create(&o, &c[r]), OSCAR_OK, "%s", oscar_last_error());
        for (int pass = 0; pass < 2; pass++) {
            cr_assert_eq(oscar_calib_begin_pass(c[r], pass), OSCAR_OK);
            for (int l = 0; l < L; l++) {
                for (int w = 0; w < nwin; w++) {
                    size_t t = (size_t)w * win;
                    cr_assert_eq(oscar_calib_feed(c[r], l, win, s[l].q + t * hq * d, s[l].k + t * hkv * d,
                                                  s[l].v + t * hkv * d, OSCAR_DTYPE_F32),
                                 OSCAR_OK, "%s", oscar_last_error());
                }
                /* Copy windows: the first 2 windows' rows (any rows serve the bookkeeping). */
                for (int j = 0; pass == 0 && r > 0 && j < ncopy; j++) {
                    size_t t = (size_t)(j % 2) * win;
                    cr_assert_eq(oscar_calib_feed_copy(c[r], l, win, win / 2, 40, s[l].q + t * hq * d,
                                                       s[l].k + t * hkv * d, s[l].v + t * hkv * d, OSCAR_DTYPE_F32),
                                 OSCAR_OK, "%s", oscar_last_error());
                }
                if (pass == 1) /* copies belong to pass 0 */
                    cr_assert_eq(oscar_calib_feed_copy(c[r], l, win, win / 2, 40, s[l].q, s[l].k, s[l].v,
                                                       OSCAR_DTYPE_F32),
                                 OSCAR_ERR_STATE);
            }
        }
        cr_assert_eq(oscar_calib_finalize(c[r], &p[r]), OSCAR_OK, "%s", oscar_last_error());
    }
    for (int l = 0; l < L; l++) {
        oscar_calib_attn_report a[3];
        for (int r = 0; r < 3; r++) cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &a[r]), OSCAR_OK);
        cr_assert_eq(a[0].probes, nwin * hkv, "layer %d: %d text probes", l, a[0].probes);
        cr_assert_eq(a[1].probes, nwin * hkv + 3 * hkv, "layer %d: %d probes with copies", l, a[1].probes);
        cr_assert_eq(memcmp(&a[1], &a[2], sizeof a[1]), 0, "layer %d: same feeds, different copy probes", l);
        /* Copies do not enter the attention error; they are reported apart. */
        cr_assert_eq(a[0].err_k[0], a[1].err_k[0], "layer %d: copy probes changed the attention error", l);
        oscar_calib_copy_report cp[3];
        for (int r = 0; r < 3; r++) cr_assert_eq(oscar_calib_layer_copy_report_get(c[r], l, &cp[r]), OSCAR_OK);
        cr_assert_eq(cp[0].probes, 0);
        cr_assert_eq(cp[1].probes, 3 * hkv);
        cr_assert(cp[1].mass[0] > 0.0 && cp[1].mass[0] < 1.0, "layer %d: exact source mass %g", l, cp[1].mass[0]);
        float ck;
        oscar_params_clip(p[1], l, OSCAR_K, &ck);
        cr_assert(cp[1].mass[0] - cp[1].mass[2] <= (double)o.copy_mass_loss || ck == 1.0f,
                  "layer %d: clip_k %.2f costs %g of source mass", l, (double)ck, cp[1].mass[0] - cp[1].mass[2]);
        cr_assert_geq(ck, cp[1].clip_free, "layer %d: the bound made the clip harsher", l);
        for (int w = 0; w < 2; w++) {
            const float *R0, *R1;
            cr_assert_eq(oscar_params_rotation(p[0], l, 0, (oscar_kv)w, &R0), OSCAR_OK);
            cr_assert_eq(oscar_params_rotation(p[1], l, 0, (oscar_kv)w, &R1), OSCAR_OK);
            cr_assert_eq(memcmp(R0, R1, sizeof(float) * (size_t)d * d), 0, "layer %d: copies moved a rotation", l);
        }
    }
    for (int r = 0; r < 3; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    o.copy_probes = 2;
    oscar_calib *b = NULL;
    cr_assert_eq(oscar_calib_create(&o, &b), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed_copy(b, 0, win, win / 2, 40, s[0].q, s[0].k, s[0].v, OSCAR_DTYPE_F32), OSCAR_ERR_STATE);
    cr_assert_eq(oscar_calib_begin_pass(b, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed_copy(b, 0, win, win - 1, 40, s[0].q, s[0].k, s[0].v, OSCAR_DTYPE_F32),
                 OSCAR_ERR_INVALID_ARGUMENT); /* empty query range */
    cr_assert_eq(oscar_calib_feed_copy(b, 0, o.sink + o.recent + 33, 0, 40, s[0].q, s[0].k, s[0].v, OSCAR_DTYPE_F32),
                 OSCAR_ERR_INVALID_ARGUMENT); /* too short for the 2-bit region */
    cr_assert_eq(oscar_calib_feed_copy(b, 0, win, win / 2, 40, s[0].q, NULL, s[0].v, OSCAR_DTYPE_F32),
                 OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed_copy(b, L, win, win / 2, 40, s[0].q, s[0].k, s[0].v, OSCAR_DTYPE_F32),
                 OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_feed_copy(b, 0, win, win / 2, o.recent, s[0].q, s[0].k, s[0].v, OSCAR_DTYPE_F32),
                 OSCAR_ERR_INVALID_ARGUMENT); /* the source would sit in the recent window */
    float *bad = malloc(sizeof(float) * (size_t)win * hq * d);
    memcpy(bad, s[0].q, sizeof(float) * (size_t)win * hq * d);
    bad[5] = NAN;
    cr_assert_eq(oscar_calib_feed_copy(b, 0, win, win / 2, 40, bad, s[0].k, s[0].v, OSCAR_DTYPE_F32), OSCAR_ERR_NONFINITE);
    free(bad);
    oscar_calib_destroy(b);
    o.copy_probes = 65;
    cr_assert_eq(oscar_calib_create(&o, &b), OSCAR_ERR_INVALID_ARGUMENT);
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* One calibration of the copy_probes test's synthetic data: nwin text windows and ncopy copy windows
 * (the first 2 windows' rows, period 40) per layer in pass 0. */
static void copy_calibrate(const oscar_calib_options *o, synth *s, int L, int hq, int hkv, int d, int win, int nwin,
                           int ncopy, oscar_calib **c, oscar_params **p) {
    cr_assert_eq(oscar_calib_create(o, c), OSCAR_OK, "%s", oscar_last_error());
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(oscar_calib_begin_pass(*c, pass), OSCAR_OK);
        for (int l = 0; l < L; l++) {
            for (int w = 0; w < nwin; w++) {
                size_t t = (size_t)w * win;
                cr_assert_eq(oscar_calib_feed(*c, l, win, s[l].q + t * hq * d, s[l].k + t * hkv * d,
                                              s[l].v + t * hkv * d, OSCAR_DTYPE_F32),
                             OSCAR_OK, "%s", oscar_last_error());
            }
            for (int j = 0; pass == 0 && o->copy_probes > 0 && j < ncopy; j++) {
                size_t t = (size_t)(j % 2) * win;
                cr_assert_eq(oscar_calib_feed_copy(*c, l, win, win / 2, 40, s[l].q + t * hq * d, s[l].k + t * hkv * d,
                                                   s[l].v + t * hkv * d, OSCAR_DTYPE_F32),
                             OSCAR_OK, "%s", oscar_last_error());
            }
        }
    }
    cr_assert_eq(oscar_calib_finalize(*c, p), OSCAR_OK, "%s", oscar_last_error());
}

/* Copy heads (copy_head_mass): a KV head whose copy probes' source mass reaches the threshold gets
 * its key clip floored at copy_head_clip; every other ratio is what the calibration gives without
 * copy probes (the copy_mass_loss bound is off). */
Test(calib, copy_heads) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160, nwin = 6, ncopy = 5;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], nwin * win, hq, hkv, d, l);
    oscar_calib_options o;
    small_window_options(&o, L, hq, hkv, d);
    cr_assert_eq(o.copy_head_mass, 0.0f);
    cr_assert_eq(o.copy_head_clip, 0.97f);
    oscar_calib *c0, *ca, *cb, *cc;
    oscar_params *p0, *pa, *pb, *pc;
    copy_calibrate(&o, s, L, hq, hkv, d, win, nwin, ncopy, &c0, &p0); /* no copy probes */
    oscar_calib_head_copy_report hr;
    cr_assert_eq(oscar_calib_head_copy_report_get(c0, 0, 0, &hr), OSCAR_OK);
    cr_assert_eq(hr.probes, 0);
    cr_assert_eq(hr.copy_head, 0);
    o.copy_probes = 3;
    /* A: every head with copy probes is a copy head; floor 1: every key unclipped. */
    o.copy_head_mass = 1e-12f;
    o.copy_head_clip = 1.0f;
    copy_calibrate(&o, s, L, hq, hkv, d, win, nwin, ncopy, &ca, &pa);
    double top = 0.0; /* the largest source mass of layer 0 */
    for (int l = 0; l < L; l++)
        for (int h = 0; h < hkv; h++) {
            cr_assert_eq(oscar_calib_head_copy_report_get(ca, l, h, &hr), OSCAR_OK, "%s", oscar_last_error());
            cr_assert_eq(hr.probes, 3, "layer %d head %d: %d copy probes", l, h, hr.probes);
            cr_assert(hr.mass[0] > 0.0 && hr.mass[0] < 1.0, "layer %d head %d: source mass %g", l, h, hr.mass[0]);
            cr_assert_eq(hr.copy_head, 1, "layer %d head %d: mass %g not named at 1e-12", l, h, hr.mass[0]);
            cr_assert_eq(*oscar_params_clip_ptr(pa, l, h, OSCAR_K), 1.0f);
            cr_assert_eq(hr.clip_k, 1.0f);
            cr_assert_eq(hr.mass[1], hr.mass[2], "layer %d head %d: at clip 1 both masses agree", l, h);
            if (l == 0 && hr.mass[0] > top) top = hr.mass[0];
        }
    /* B: threshold 1 names none: the clips are those of the calibration without copy probes. */
    o.copy_head_mass = 1.0f;
    o.copy_head_clip = 0.97f;
    copy_calibrate(&o, s, L, hq, hkv, d, win, nwin, ncopy, &cb, &pb);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < hkv; h++)
            for (int w = 0; w < 2; w++) {
                cr_assert_eq(*oscar_params_clip_ptr(pb, l, h, w), *oscar_params_clip_ptr(p0, l, h, w),
                             "layer %d head %d %s: the copy probes moved a ratio with no copy head", l, h, w ? "V" : "K");
                cr_assert_eq(oscar_calib_head_copy_report_get(cb, l, h, &hr), OSCAR_OK);
                cr_assert_eq(hr.copy_head, 0);
            }
    /* C: the threshold at layer 0's largest mass names that head (and any at least as large),
     * with the floor 1 only its keys change. */
    /* the largest float at or below that mass: (float)top rounded up half the time (fresh seeds), and the
     * head compared as mass >= threshold was then not named (CI, twenty-fourth session) */
    o.copy_head_mass = (float)top;
    if ((double)o.copy_head_mass > top) o.copy_head_mass = nextafterf(o.copy_head_mass, 0.0f);
    o.copy_head_clip = 1.0f;
    copy_calibrate(&o, s, L, hq, hkv, d, win, nwin, ncopy, &cc, &pc);
    int named = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < hkv; h++) {
            cr_assert_eq(oscar_calib_head_copy_report_get(cc, l, h, &hr), OSCAR_OK);
            cr_assert_eq(hr.copy_head, hr.mass[0] >= (double)o.copy_head_mass, "layer %d head %d: mass %g, thr %g",
                         l, h, hr.mass[0], (double)o.copy_head_mass);
            const float ck = *oscar_params_clip_ptr(pc, l, h, OSCAR_K), ck0 = *oscar_params_clip_ptr(p0, l, h, OSCAR_K);
            if (hr.copy_head) cr_assert_eq(ck, 1.0f, "layer %d head %d: a copy head's key clip %.2f", l, h, (double)ck);
            else cr_assert_eq(ck, ck0, "layer %d head %d: key clip %.2f, %.2f without copy heads", l, h, (double)ck,
                              (double)ck0);
            named += hr.copy_head;
        }
    cr_assert_geq(named, 1, "the head of mass %g was not named", top);
    cr_assert_eq(oscar_calib_head_copy_report_get(cc, 0, hkv, &hr), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_head_copy_report_get(cc, L, 0, &hr), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_head_copy_report_get(cc, 0, 0, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_params_destroy(p0);
    oscar_params_destroy(pa);
    oscar_params_destroy(pb);
    oscar_params_destroy(pc);
    oscar_calib_destroy(c0);
    oscar_calib_destroy(ca);
    oscar_calib_destroy(cb);
    oscar_calib_destroy(cc);
    /* Before finalize there is no report; bad options are refused with a message naming them. */
    oscar_calib *b = NULL;
    o.copy_head_mass = 0.1f;
    o.copy_head_clip = 0.97f;
    cr_assert_eq(oscar_calib_create(&o, &b), OSCAR_OK);
    cr_assert_eq(oscar_calib_head_copy_report_get(b, 0, 0, &hr), OSCAR_ERR_STATE);
    oscar_calib_destroy(b);
    const struct {
        float mass, clip;
        int copy_probes, objective;
        const char *word;
    } bad[] = {{-0.1f, 0.97f, 3, 0, "copy_head_mass"}, {1.5f, 0.97f, 3, 0, "copy_head_mass"},
               {NAN, 0.97f, 3, 0, "copy_head_mass"},   {0.1f, 0.0f, 3, 0, "copy_head_clip"},
               {0.1f, 1.5f, 3, 0, "copy_head_clip"},   {0.1f, 0.97f, 0, 0, "copy_probes"},
               {0.1f, 0.97f, 3, 1, "clip_objective"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.copy_head_mass = bad[i].mass;
        o.copy_head_clip = bad[i].clip;
        o.copy_probes = bad[i].copy_probes;
        o.clip_objective = bad[i].objective;
        b = (oscar_calib *)1;
        cr_assert_eq(oscar_calib_create(&o, &b), OSCAR_ERR_INVALID_ARGUMENT, "case %zu", i);
        cr_assert(strstr(oscar_last_error(), bad[i].word) != NULL, "case %zu: %s", i, oscar_last_error());
    }
    o.copy_head_mass = 0.0f; /* off: the floor is not looked at */
    o.copy_head_clip = 0.0f;
    o.clip_objective = 0;
    cr_assert_eq(oscar_calib_create(&o, &b), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_destroy(b);
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* Attention error against a brute-force fp64 computation: one window of
 * sink + recent + 32 + nq tokens gives exactly one probe per KV head, whose nq
 * query positions are the window's last nq (the probe range [sink + recent +
 * 32, n - 1] has nq positions, one per stratum), each reading the 2-bit
 * region [sink, t_a - recent] of its own position. */
static void check_probe_error(int nq, int span, int sink, int recent) {
    const int d = 64, hq = 2, hkv = 1;
    const int n = sink + recent + 32 + nq, t = n - 1;
    synth s;
    synth_make(&s, n, hq, hkv, d, 1);
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, hq, hkv, d);
    cr_assert_eq(o.probe_queries, 0);
    o.probe_queries = nq;
    cr_assert_eq(o.probe_span, 0);
    o.probe_span = span;
    o.sink = sink;
    o.recent = recent;
    o.clip_k = 0.9f;
    o.clip_v = 0.85f;
    o.group = 32;
    o.rounding = 0; /* the brute force below rounds to nearest */
    oscar_calib *c;
    oscar_params *p = calibrate_windows(&o, &s, n, 0, &c);
    oscar_calib_attn_report a;
    cr_assert_eq(oscar_calib_layer_attn_report_get(c, 0, &a), OSCAR_OK);
    cr_assert_eq(a.probes, 1, "seed %llu", (unsigned long long)g_seed);
    const float *R[2];
    float clip[2] = {0.9f, 0.85f};
    cr_assert_eq(oscar_params_rotation(p, 0, 0, OSCAR_K, &R[0]), OSCAR_OK);
    cr_assert_eq(oscar_params_rotation(p, 0, 0, OSCAR_V, &R[1]), OSCAR_OK);
    /* Rotated bf16 rows, exact and quantized (every row; a position reads its own region from them).
     * FORMAT.md §1 fixes x R in fp32 but not the order of its sum: the calibration rotates the
     * probe's rows 0..t with one sgemm (calib.c rotate_rows), oscar_ref_rotate sums in i order, and
     * the two differ by an fp32 ulp or so. A few rotated values per draw lie that close to a bf16
     * rounding midpoint and round the other way; one such value moves its 2-bit group (scale, clip)
     * and the error with it: 1 draw in 200-500 failed, by up to 4 % (K side, seed
     * 6605975128237700949 with OpenBLAS 0.3.21's Haswell kernel; which draws fail depends on the
     * BLAS kernel), far past any rounding tolerance. The rotation is not what this test checks, so
     * the rows come from the same sgemm call as the calibration's (hkv 1: the probe's rows are
     * s.k, s.v as they are). The queries are not rounded: their rotation order does not matter. */
    float *x[2], *xq[2], meta[4];
    uint8_t codes[16];
    for (int w = 0; w < 2; w++) {
        x[w] = malloc(sizeof(float) * (size_t)n * d);
        xq[w] = malloc(sizeof(float) * (size_t)n * d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, w ? s.v : s.k, d, R[w], d, 0.0f, x[w], d);
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < d; i++)
                x[w][(size_t)r * d + i] = oscar_round_to(OSCAR_DTYPE_BF16, x[w][(size_t)r * d + i]);
            oscar_ref_quantize_row(d, 32, 0, clip[w], OSCAR_DTYPE_F16, x[w] + (size_t)r * d, codes, meta);
            oscar_ref_dequantize_row(d, 32, 0, codes, meta, xq[w] + (size_t)r * d);
        }
    }
    double num[3] = {0}, den = 0; /* K only, V only, both */
    for (int ta = t - nq + 1; ta <= t; ta++)
        for (int j = 0; j < hq; j++) {
            float qr[64];
            oscar_ref_rotate(d, s.q + ((size_t)ta * hq + j) * d, R[0], qr);
            double o_[4][64];
            for (int m = 0; m < 4; m++) { /* m bit 0: K quantized, bit 1: V quantized */
                double sc[1024], mx = -1e300, z = 0;
                for (int r = 0; r <= ta; r++) {
                    const int in2 = r >= sink && r <= ta - recent; /* ta's 2-bit region */
                    const float *K = (m & 1) && in2 ? xq[0] : x[0];
                    double acc = 0;
                    for (int i = 0; i < d; i++) acc += (double)qr[i] * K[(size_t)r * d + i];
                    sc[r] = acc / sqrt((double)d);
                    mx = fmax(mx, sc[r]);
                }
                for (int r = 0; r <= ta; r++) z += exp(sc[r] - mx);
                for (int i = 0; i < d; i++) o_[m][i] = 0;
                for (int r = 0; r <= ta; r++) {
                    const int in2 = r >= sink && r <= ta - recent;
                    const float *V = (m & 2) && in2 ? xq[1] : x[1];
                    for (int i = 0; i < d; i++) o_[m][i] += exp(sc[r] - mx) / z * V[(size_t)r * d + i];
                }
            }
            for (int i = 0; i < d; i++) {
                den += o_[0][i] * o_[0][i];
                for (int m = 1; m < 4; m++) num[m - 1] += (o_[m][i] - o_[0][i]) * (o_[m][i] - o_[0][i]);
            }
        }
    double want[3] = {num[0] / den, num[1] / den, num[2] / den}, got[3] = {a.err_k[2], a.err_v[2], a.err_kv[2]};
    /* From the same bf16 rows the two differ only by the calibration's fp32 scores, softmax and
     * P V against fp64 here: at most 6e-5 relative over 1500 draws (1e-9 absolute covers errors
     * near the fp32 rounding of o itself), so 2e-3 is loose for rounding yet far below what a
     * wrong 2-bit region per position does to the error. */
    for (int m = 0; m < 3; m++)
        cr_assert(fabs(got[m] - want[m]) <= 2e-3 * want[m] + 1e-9,
                  "%s, %d query positions: report %.8g, brute force %.8g (seed %llu)", m == 0 ? "K" : m == 1 ? "V" : "KV",
                  nq, got[m], want[m], (unsigned long long)g_seed);
    for (int w = 0; w < 2; w++) {
        free(x[w]);
        free(xq[w]);
    }
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    synth_free(&s);
}
/* sink and recent drawn in separate statements: within one call's arguments the order of the two
 * draws is unspecified, so a printed seed would replay other windows under another compiler
 * (recent first: the order gcc took, so seeds gcc builds printed still replay). */
static void check_probe_error_drawn(int nq) {
    const int recent = 16 + (int)(rnd() % 16);
    const int sink = 4 + (int)(rnd() % 8);
    check_probe_error(nq, 0, sink, recent);
}
Test(calib, probe_error_matches_brute_force) { check_probe_error_drawn(1); }
/* Several query positions per probe: the earlier ones read the rows after
 * their own 2-bit region exact, although the last position's region holds
 * them quantized (with that region for every position the test fails). */
Test(calib, probe_queries_error_matches_brute_force) {
    check_probe_error_drawn(4);
    check_probe_error_drawn(9);
    /* probe_span 1: positions from sink + recent + 32 = 52 on, although the window's second half
     * starts at 56 (n = 112); with span 0 the test fails. */
    check_probe_error(60, 1, 4, 16);
}

/* probe_queries 0 (default): 16 query positions without windows (sink 0,
 * recent 0), 1 with them; the same parameters and reports as asking for
 * them explicitly. */
Test(calib, probe_queries_auto) {
    const int d = 64, hq = 4, hkv = 2, L = 1, win = 160, nwin = 6;
    synth s;
    synth_make(&s, nwin * win, hq, hkv, d, 1);
    for (int layout = 0; layout < 2; layout++) {
        oscar_calib_options o;
        small_window_options(&o, L, hq, hkv, d);
        if (layout == 1) o.sink = o.recent = 0;
        oscar_calib *c[2];
        oscar_params *p[2];
        for (int r = 0; r < 2; r++) {
            o.probe_queries = r == 0 ? 0 : layout == 1 ? 16 : 1;
            p[r] = calibrate_windows(&o, &s, win, 1, &c[r]);
        }
        oscar_calib_attn_report a[2];
        for (int r = 0; r < 2; r++) cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], 0, &a[r]), OSCAR_OK);
        cr_assert_eq(memcmp(&a[0], &a[1], sizeof a[0]), 0, "layout %d: auto differs from explicit", layout);
        for (int w = 0; w < 2; w++) {
            float x, y;
            oscar_params_clip(p[0], 0, (oscar_kv)w, &x);
            oscar_params_clip(p[1], 0, (oscar_kv)w, &y);
            cr_assert_eq(x, y, "layout %d: auto clip %g, explicit %g", layout, (double)x, (double)y);
        }
        if (layout == 1) { /* and 16 positions are not 1: the s0w0 report differs from a 1-position fit */
            oscar_calib *c1;
            o.probe_queries = 1;
            oscar_params *p1 = calibrate_windows(&o, &s, win, 1, &c1);
            oscar_calib_attn_report a1;
            cr_assert_eq(oscar_calib_layer_attn_report_get(c1, 0, &a1), OSCAR_OK);
            cr_assert_neq(a1.err_kv[0], a[0].err_kv[0], "s0w0: 16 positions gave the 1-position error");
            oscar_params_destroy(p1);
            oscar_calib_destroy(c1);
        }
        for (int r = 0; r < 2; r++) {
            oscar_params_destroy(p[r]);
            oscar_calib_destroy(c[r]);
        }
    }
    synth_free(&s);
}

/* A few keys carry very large scores: queries are 3 u + 0.5 noise (u the first
 * coordinate), ordinary keys N(0, I), and 2 % "spike" keys add B u (B = 12),
 * scoring ~ 3B / sqrt(d) = 4.5 nats above the rest: softmax gives the few
 * spikes in a window about half of the attention.
 * R = U.H.P maps u onto a Walsh row: a spike's rotated coordinates are
 * +-B/sqrt(d) plus noise, and its largest ones are those aligned with the
 * query direction, exactly what a clip saturates, so a clip shrinks the
 * spikes' scores. The rows objective averages the score error over all rows,
 * where the many ordinary rows want a clip; the probes see the spikes. */
static void spike_synth(synth *s, int n, int hkv, int d, double spike_p, double spike_b) {
    const int hq = 2 * hkv;
    s->n = n, s->hq = hq, s->hkv = hkv, s->d = d;
    s->q = malloc(sizeof(float) * (size_t)n * (size_t)hq * (size_t)d);
    s->k = malloc(sizeof(float) * (size_t)n * (size_t)hkv * (size_t)d);
    s->v = malloc(sizeof(float) * (size_t)n * (size_t)hkv * (size_t)d);
    for (int t = 0; t < n; t++) {
        for (int j = 0; j < hq; j++)
            for (int i = 0; i < d; i++)
                s->q[((size_t)t * hq + j) * d + i] = (float)((i == 0 ? 3.0 : 0.0) + 0.5 * nrand());
        for (int h = 0; h < hkv; h++) {
            int spike = urand() < spike_p;
            for (int i = 0; i < d; i++) {
                s->k[((size_t)t * hkv + h) * d + i] = (float)(nrand() + (spike && i == 0 ? spike_b : 0.0));
                s->v[((size_t)t * hkv + h) * d + i] = (float)nrand();
            }
        }
    }
}

/* Per layer the probes' choice varies with which spikes the 8 probes per head
 * hold (a single layer was not milder in about 1 draw in 6 while this was
 * written); the rows objective picks ~0.88 on this data. Over 6 independent
 * layers the mean probe clip_k must be milder. That is a statistical claim, so
 * the data are fixed: with fresh data it held by 0.018-0.063 for 24 seeds but
 * failed by 0.012 for seed 4769059305408880123 (a test failing by chance). The
 * per-layer K error comparison holds for any data (same probes, c_K minimises it). */
Test(calib, probes_keep_large_scores) {
    const int d = 64, win = 384, nwin = 10, HKV = 2, L = 6;
    synth s[6];
    const uint64_t state = g_state;
    g_state = 101;
    for (int l = 0; l < L; l++) spike_synth(&s[l], win * nwin, HKV, d, 0.02, 12.0);
    g_state = state;
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, 2 * HKV, HKV, d);
    o.sink = 16;
    o.recent = 64;
    o.holdout_rows = 2048;
    oscar_calib *c[2];
    oscar_params *p[2];
    p[0] = calibrate_windows(&o, s, win, 1, &c[0]);
    o.clip_objective = 1;
    p[1] = calibrate_windows(&o, s, win, 1, &c[1]);
    double mean_k[2] = {0, 0};
    for (int l = 0; l < L; l++) {
        float ck[2], cv[2];
        oscar_calib_attn_report a[2];
        for (int r = 0; r < 2; r++) {
            oscar_params_clip(p[r], l, OSCAR_K, &ck[r]);
            oscar_params_clip(p[r], l, OSCAR_V, &cv[r]);
            cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &a[r]), OSCAR_OK);
            mean_k[r] += ck[r] / (double)L;
        }
        cr_log_info("spikes layer %d: probes clip K %.2f V %.2f (attn K err %.5f); rows clip K %.2f V %.2f (attn K "
                    "err %.5f)",
                    l, (double)ck[0], (double)cv[0], a[0].err_k[2], (double)ck[1], (double)cv[1], a[1].err_k[2]);
        /* Same probes in both runs; c_K minimises the K-only attention error over the grid. */
        cr_assert_leq(a[0].err_k[2], a[1].err_k[2], "layer %d: K attention error %g at the probes' clip > %g at the rows'",
                      l, a[0].err_k[2], a[1].err_k[2]);
    }
    cr_assert_gt(mean_k[0], mean_k[1], "mean probe clip_k %.3f is not milder than the rows' %.3f (fixed data)",
                 mean_k[0], mean_k[1]);
    fprintf(stderr, "spikes: mean clip_k probes %.3f rows %.3f\n", mean_k[0], mean_k[1]);
    for (int r = 0; r < 2; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* ------------------------------------------------- error-feedback rounding */

/* Mean e^T Ct e of fresh rows quantized at clip 1, Ct = R^T C R. */
static double metric_error(int d, const float *R, const double *C, const float *F, const float *rows, int n) {
    double *Ct = calloc((size_t)d * d, sizeof(double)), *tmp = calloc((size_t)d * d, sizeof(double));
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = 0;
            for (int k = 0; k < d; k++) a += C[(size_t)i * d + k] * R[(size_t)k * d + j];
            tmp[(size_t)i * d + j] = a;
        }
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double a = 0;
            for (int k = 0; k < d; k++) a += (double)R[(size_t)k * d + i] * tmp[(size_t)k * d + j];
            Ct[(size_t)i * d + j] = a;
        }
    float xr[256], xq[256], deq[256], meta[16];
    uint8_t codes[64];
    double total = 0;
    for (int t = 0; t < n; t++) {
        oscar_ref_rotate(d, rows + (size_t)t * d, R, xr);
        for (int j = 0; j < d; j++) xq[j] = oscar_round_to(OSCAR_DTYPE_BF16, xr[j]);
        oscar_ref_quantize_row_fb(d, d, 0, 1.0f, OSCAR_DTYPE_F16, xq, F, codes, meta);
        oscar_ref_dequantize_row(d, d, 0, codes, meta, deq);
        double e[256], s = 0;
        for (int j = 0; j < d; j++) e[j] = (double)deq[j] - xr[j];
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) s += e[i] * Ct[(size_t)i * d + j] * e[j];
        total += s;
    }
    free(Ct);
    free(tmp);
    return total / n;
}

/* Error-feedback weights of metric Ct with ridge `damp` (a share of the mean eigenvalue), grown
 * tenfold while a weight exceeds 16, from the definition (FORMAT.md 2.3) as the tests'
 * reference computes it (support/refcheck.c, written apart from calib.c). */
static void expected_feedback(int d, const double *Ct, double damp, double *F) {
    const size_t dd = (size_t)d * (size_t)d;
    float *Ff = malloc(dd * sizeof *Ff);
    for (;; damp *= 10.0) {
        const double mx = rc_feedback_weights(d, Ct, damp, Ff);
        if ((mx >= 0.0 && mx <= 16.0) || damp >= 1.0) break;
    }
    for (size_t i = 0; i < dd; i++) F[i] = Ff[i];
    free(Ff);
}

/* The ridge of the feedback metric is options.feedback_damp: the keys' weights are those of
 * R^T C_K R + damp (tr / d) I. Default 0 means 0.001 with windows and, without windows (sink 0,
 * recent 0), one of the grid 0.001 / 0.01 / 0.1 chosen on the probes (want < 0: any of them; the
 * next test checks which); an explicit damp is used as given (with and without windows); each fixed
 * ridge gives other weights than the fixed one before. */
Test(calib, feedback_damp_is_the_ridge) {
    const int d = 128, hq = 4, hkv = 2, n = 2500, L = 1;
    synth s[1];
    synth_make(&s[0], n, hq, hkv, d, 0);
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    cr_assert_eq(o.feedback_damp, 0.0f, "default: 0 (0.001 with windows, chosen on the probes without)");
    /* option, sink, recent -> the ridge expected */
    const float opt[4] = {0.0f, 0.0f, 0.01f, 0.1f};
    const int sink[4] = {64, 0, 0, 64}, recent[4] = {256, 0, 0, 256};
    const double want[4] = {1e-3, -1.0, (double)0.01f, (double)0.1f};
    const double grid[3] = {1e-3, 1e-2, 1e-1};
    const size_t dd = (size_t)d * (size_t)d;
    double *C = malloc(dd * sizeof(double)), *Ct = malloc(dd * sizeof(double)), *Fe = malloc(dd * sizeof(double));
    float *Fprev = malloc(dd * sizeof(float));
    for (int t = 0; t < 4; t++) {
        o.feedback_damp = opt[t];
        o.sink = sink[t];
        o.recent = recent[t];
        oscar_calib *c;
        oscar_params *p = calibrate(&o, s, &c);
        for (int h = 0; h < hkv; h++) {
            const float *R, *F;
            cr_assert_eq(oscar_calib_target(c, 0, h, OSCAR_K, C), OSCAR_OK, "%s", oscar_last_error());
            cr_assert_eq(oscar_params_rotation(p, 0, h, OSCAR_K, &R), OSCAR_OK);
            cr_assert_eq(oscar_params_feedback(p, 0, h, OSCAR_K, &F), OSCAR_OK);
            cr_assert_not_null(F);
            for (int i = 0; i < d; i++) /* Fe = C R, then Ct = R^T Fe */
                for (int j = 0; j < d; j++) {
                    double a = 0.0;
                    for (int k = 0; k < d; k++) a += C[(size_t)i * d + k] * (double)R[(size_t)k * d + j];
                    Fe[(size_t)i * d + j] = a;
                }
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++) {
                    double a = 0.0;
                    for (int k = 0; k < d; k++) a += (double)R[(size_t)k * d + i] * Fe[(size_t)k * d + j];
                    Ct[(size_t)i * d + j] = a;
                }
            double best = INFINITY;
            for (int gi = 0; gi < (want[t] < 0.0 ? 3 : 1); gi++) {
                expected_feedback(d, Ct, want[t] < 0.0 ? grid[gi] : want[t], Fe);
                double worst = 0.0;
                for (size_t i = 0; i < dd; i++) {
                    double e = fabs((double)F[i] - Fe[i]) / (1.0 + fabs(Fe[i]));
                    worst = e > worst ? e : worst;
                }
                best = worst < best ? worst : best;
            }
            cr_assert_lt(best, 1e-4, "case %d head %d: weights off the definition with ridge %g by %g", t, h, want[t],
                         best);
            if (h == 0 && t > 0 && want[t] > 0.0) { /* against the last fixed ridge (the grid may pick 0.01) */
                double diff = 0.0;
                for (size_t i = 0; i < dd; i++) diff += fabs((double)F[i] - (double)Fprev[i]);
                cr_assert_gt(diff, 1e-3 * (double)dd, "case %d: the same weights as the fixed ridge before", t);
            }
            if (h == 0 && want[t] > 0.0) memcpy(Fprev, F, dd * sizeof(float));
        }
        oscar_params_destroy(p);
        oscar_calib_destroy(c);
    }
    const float bad[3] = {-0.01f, 1.5f, NAN};
    for (int b = 0; b < 3; b++) {
        o.feedback_damp = bad[b];
        oscar_calib *c = (oscar_calib *)1;
        cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT);
        cr_assert(strstr(oscar_last_error(), "feedback_damp") != NULL, "%s", oscar_last_error());
    }
    free(C);
    free(Ct);
    free(Fe);
    free(Fprev);
    synth_free(&s[0]);
}

/* Without windows and with feedback_damp 0 the keys' ridge is the grid value (0.001, 0.01, 0.1) whose
 * weights give the smallest probe error: the layer's key probe error at the chosen clip is the
 * smallest of the three runs with that ridge given explicitly (up to the noise of a float vs double ridge).
 * With windows the default stays 0.001: the same weights as an explicit 0.001. */
Test(calib, feedback_damp_chosen_on_probes_without_windows) {
    const int d = 128, hq = 4, hkv = 2, n = 2500, L = 1;
    synth s[1];
    synth_make(&s[0], n, hq, hkv, d, 0);
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    o.sink = 0;
    o.recent = 0;
    const float grid[3] = {0.001f, 0.01f, 0.1f};
    double errs[3], lo = INFINITY;
    for (int g = 0; g < 3; g++) {
        o.feedback_damp = grid[g];
        oscar_calib *c;
        oscar_params *p = calibrate_windows(&o, s, 500, 0, &c);
        oscar_calib_attn_report r;
        cr_assert_eq(oscar_calib_layer_attn_report_get(c, 0, &r), OSCAR_OK);
        cr_assert_gt(r.probes, 0, "the test needs probes");
        errs[g] = r.err_k[2];
        lo = errs[g] < lo ? errs[g] : lo;
        oscar_params_destroy(p);
        oscar_calib_destroy(c);
    }
    cr_assert(errs[0] != errs[1] || errs[1] != errs[2], "the grid must make a difference here");
    o.feedback_damp = 0.0f;
    oscar_calib *c;
    oscar_params *p = calibrate_windows(&o, s, 500, 0, &c);
    oscar_calib_attn_report r;
    cr_assert_eq(oscar_calib_layer_attn_report_get(c, 0, &r), OSCAR_OK);
    /* Up to 1e-3 of the smallest, or nearer the smallest than the runner-up: the grid runs take the
     * ridge as a float (0.01f) and the chosen one as a double (1e-2), a ~1e-8 change that can still move a
     * head's clip to a neighbour within the probe error's noise (CI seed of stop 43: 2.3e-4 above). */
    double second = INFINITY;
    for (int g = 0; g < 3; g++)
        if (errs[g] > lo && errs[g] < second) second = errs[g];
    const double bound = fmax(lo * (1.0 + 1e-3), isfinite(second) ? 0.5 * (lo + second) : lo * (1.0 + 1e-3));
    cr_assert_leq(r.err_k[2], bound, "chosen %g, grid %g %g %g (OSCAR_TEST_SEED=%llu)", r.err_k[2], errs[0], errs[1],
                  errs[2], (unsigned long long)g_seed);
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    /* With windows: 0 is 0.001 (the file of an explicit 0.001f differs only by the float's rounding). */
    o.sink = 64;
    o.recent = 256;
    const float *F[2];
    oscar_params *pw[2];
    for (int t = 0; t < 2; t++) {
        o.feedback_damp = t ? 0.001f : 0.0f;
        pw[t] = calibrate_windows(&o, s, 500, 0, &c);
        cr_assert_eq(oscar_params_feedback(pw[t], 0, 0, OSCAR_K, &F[t]), OSCAR_OK);
        oscar_calib_destroy(c);
    }
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)d * (size_t)d; i++) {
        double e = fabs((double)F[0][i] - (double)F[1][i]);
        worst = e > worst ? e : worst;
    }
    cr_assert_lt(worst, 1e-4, "windowed default: other weights than ridge 0.001 (%g)", worst);
    oscar_params_destroy(pw[0]);
    oscar_params_destroy(pw[1]);
    synth_free(&s[0]);
}

Test(calib, feedback_weights) {
    const int d = 128, hq = 4, hkv = 2, n = 2500, L = 1;
    synth s[1], fresh;
    synth_make(&s[0], n, hq, hkv, d, 0);
    synth_make(&fresh, 300, hq, hkv, d, 0);
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, hq, hkv, d);
    cr_assert_eq(o.rounding, 1, "error feedback is the default");
    oscar_calib *c1, *c0;
    /* Value metric: an anisotropic PSD matrix (a stand-in for W_O^T W_O). */
    double *M = calloc((size_t)d * d, sizeof(double));
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) M[(size_t)i * d + j] = (i == j ? 1.0 : 0.0) + 0.5 * cos(0.1 * i) * cos(0.1 * j);
    cr_assert_eq(oscar_calib_create(&o, &c1), OSCAR_OK, "%s", oscar_last_error());
    for (int h = 0; h < hkv; h++) cr_assert_eq(oscar_calib_set_value_metric(c1, 0, h, M), OSCAR_OK, "%s", oscar_last_error());
    /* Bad metrics are refused by name. */
    M[5] += 1.0;
    cr_assert_eq(oscar_calib_set_value_metric(c1, 0, 0, M), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "symmetric") != NULL, "%s", oscar_last_error());
    M[5] -= 1.0;
    cr_assert_eq(oscar_calib_set_value_metric(c1, 1, 0, M), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_set_value_metric(c1, 0, hkv, M), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_set_value_metric(c1, 0, 0, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_calib_begin_pass(c1, 0), OSCAR_OK);
    feed_pass(c1, 0, &s[0], 0, OSCAR_DTYPE_F32, s[0].q, s[0].k, s[0].v);
    cr_assert_eq(oscar_calib_begin_pass(c1, 1), OSCAR_OK);
    feed_pass(c1, 0, &s[0], 1, OSCAR_DTYPE_F32, s[0].q, s[0].k, s[0].v);
    oscar_params *p1 = NULL;
    cr_assert_eq(oscar_calib_finalize(c1, &p1), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_set_value_metric(c1, 0, 0, M), OSCAR_ERR_STATE);
    o.rounding = 0;
    oscar_params *p0 = calibrate(&o, s, &c0);
    const float *F0 = (const float *)1, *FK, *FV;
    cr_assert_eq(oscar_params_feedback(p0, 0, 0, OSCAR_K, &F0), OSCAR_OK);
    cr_assert_null(F0, "rounding 0 writes no feedback weights");
    cr_assert_eq(oscar_params_feedback(p1, 0, 0, OSCAR_K, &FK), OSCAR_OK);
    cr_assert_eq(oscar_params_feedback(p1, 0, 0, OSCAR_V, &FV), OSCAR_OK);
    cr_assert_not_null(FK);
    cr_assert_not_null(FV);
    int nz_k = 0, nz_v = 0;
    for (int j = 0; j < d; j++)
        for (int k = 0; k < d; k++) {
            float fk = FK[(size_t)j * d + k], fv = FV[(size_t)j * d + k];
            cr_assert(isfinite(fk) && fabsf(fk) <= 16.0f && isfinite(fv) && fabsf(fv) <= 16.0f);
            if (k <= j) cr_assert(fk == 0.0f && fv == 0.0f, "weight (%d, %d) on/below the diagonal", j, k);
            nz_k += fk != 0.0f;
            nz_v += fv != 0.0f;
        }
    cr_assert_gt(nz_k, d * (d - 1) / 4, "key weights mostly zero");
    cr_assert_gt(nz_v, d * (d - 1) / 4, "value weights mostly zero although a metric was given");
    /* What the weights are for: fresh keys' error in the attention metric. */
    double *CK = malloc(sizeof(double) * (size_t)d * d);
    cr_assert_eq(oscar_calib_target(c1, 0, 0, OSCAR_K, CK), OSCAR_OK);
    const float *R;
    cr_assert_eq(oscar_params_rotation(p1, 0, 0, OSCAR_K, &R), OSCAR_OK);
    float *rows = malloc(sizeof(float) * 300 * (size_t)d);
    for (int t = 0; t < 300; t++) memcpy(rows + (size_t)t * d, fresh.k + (size_t)t * hkv * d, sizeof(float) * (size_t)d);
    double e_near = metric_error(d, R, CK, NULL, rows, 300), e_fb = metric_error(d, R, CK, FK, rows, 300);
    cr_assert_lt(e_fb, 0.85 * e_near, "feedback %g vs nearest %g (seed %llu)", e_fb, e_near, (unsigned long long)g_seed);
    /* Without a value metric the values round to nearest (all-zero weights). */
    oscar_calib *c2;
    o.rounding = 1;
    oscar_params *p2 = calibrate(&o, s, &c2);
    cr_assert_eq(oscar_params_feedback(p2, 0, 0, OSCAR_V, &FV), OSCAR_OK);
    for (int i = 0; i < d * d; i++) cr_assert(FV[i] == 0.0f);
    o.rounding = 2;
    oscar_calib *bad = (oscar_calib *)1;
    cr_assert_eq(oscar_calib_create(&o, &bad), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "rounding") != NULL, "%s", oscar_last_error());
    free(rows);
    free(CK);
    free(M);
    oscar_params_destroy(p0);
    oscar_params_destroy(p1);
    oscar_params_destroy(p2);
    oscar_calib_destroy(c0);
    oscar_calib_destroy(c1);
    oscar_calib_destroy(c2);
    synth_free(&s[0]);
    synth_free(&fresh);
}

/* Attention-weighted key target (key_attn_weight): brute force in fp64 of the documented rule. Feed f of
 * a layer (0-based) samples query positions t = sink + recent + (f % 8) + 8 i < n; each query head j of
 * KV head h adds a q q^T with a = sum over sink <= p <= t - recent of softmax(q K[0..t]^T / sqrt(d))_p^2;
 * C_K = (1 - w) C_Q + w C_W tr(C_Q) / tr(C_W) per head (per layer: the mean of the heads' mixtures). */
static void brute_attn_target(const synth *s, int win, int sink, int recent, double w, int per_head, int r,
                              double *out) {
    const int d = s->d, g = s->hq / s->hkv;
    const size_t dd = (size_t)d * (size_t)d;
    double *CQ = calloc(dd, sizeof(double)), *CW = calloc(dd, sizeof(double)), *sc = malloc(sizeof(double) * win);
    memset(out, 0, sizeof(double) * dd);
    for (int h = per_head ? r : 0; h < (per_head ? r + 1 : s->hkv); h++) {
        memset(CQ, 0, sizeof(double) * dd);
        memset(CW, 0, sizeof(double) * dd);
        int ntok = 0;
        for (int f = 0, t0 = 0; t0 < s->n; f++, t0 += win) {
            const int n = s->n - t0 < win ? s->n - t0 : win;
            for (int t = 0; t < n; t++, ntok++)
                for (int j = h * g; j < (h + 1) * g; j++) {
                    const float *q = s->q + ((size_t)(t0 + t) * (size_t)s->hq + (size_t)j) * (size_t)d;
                    for (int a = 0; a < d; a++)
                        for (int b = 0; b < d; b++) CQ[a * d + b] += (double)q[a] * q[b];
                    if (t < sink + recent + f % 8 || (t - sink - recent - f % 8) % 8) continue;
                    double mx = -INFINITY, z = 0.0, a2 = 0.0;
                    for (int p = 0; p <= t; p++) {
                        const float *k = s->k + ((size_t)(t0 + p) * (size_t)s->hkv + (size_t)h) * (size_t)d;
                        double dot = 0.0;
                        for (int a = 0; a < d; a++) dot += (double)q[a] * k[a];
                        sc[p] = dot / sqrt((double)d);
                        mx = sc[p] > mx ? sc[p] : mx;
                    }
                    for (int p = 0; p <= t; p++) z += exp(sc[p] - mx);
                    for (int p = sink; p <= t - recent; p++) a2 += exp(sc[p] - mx) * exp(sc[p] - mx);
                    for (int a = 0; a < d; a++)
                        for (int b = 0; b < d; b++) CW[a * d + b] += a2 / (z * z) * q[a] * q[b];
                }
        }
        double trq = 0.0, trw = 0.0;
        for (int a = 0; a < d; a++) {
            trq += CQ[a * d + a] / ((double)ntok * g);
            trw += CW[a * d + a];
        }
        const double share = per_head ? 1.0 : 1.0 / s->hkv;
        for (size_t i = 0; i < dd; i++)
            out[i] += share * ((1.0 - w) * CQ[i] / ((double)ntok * g) + w * CW[i] * trq / trw);
    }
    free(CQ);
    free(CW);
    free(sc);
}

Test(calib, key_attn_target_matches_brute_force) {
    const int d = 64, hq = 4, hkv = 2, win = 150;
    /* The windowed layout, and none at all (s0w0: every key, the query's own too, is 2-bit). */
    const int sinks[2] = {8, 0}, recents[2] = {32, 0};
    synth s;
    synth_make(&s, 5 * win + 77 + (int)(rnd() % 40), hq, hkv, d, 1);
    for (int i = 0; i < s.n * hq * d; i++) s.q[i] *= 0.15f; /* attention neither one-hot nor flat */
    const size_t dd = (size_t)d * (size_t)d;
    double *got = malloc(sizeof(double) * dd), *want = malloc(sizeof(double) * dd), *plain = malloc(sizeof(double) * dd);
    for (int lay = 0; lay < 2; lay++)
    for (int per_head = 0; per_head < 2; per_head++)
        for (int wi = 0; wi < 2; wi++) {
            const int sink = sinks[lay], recent = recents[lay];
            const float w = wi ? 1.0f : 0.5f;
            oscar_calib_options o;
            oscar_calib_options_default(&o, 1, hq, hkv, d);
            o.per_head = per_head, o.sink = sink, o.recent = recent, o.holdout_rows = 256, o.key_attn_weight = w;
            oscar_calib *c = NULL;
            cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK, "%s", oscar_last_error());
            cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
            for (int t = 0; t < s.n; t += win) {
                const int n = s.n - t < win ? s.n - t : win;
                cr_assert_eq(oscar_calib_feed(c, 0, n, s.q + (size_t)t * hq * d, s.k + (size_t)t * hkv * d,
                                              s.v + (size_t)t * hkv * d, OSCAR_DTYPE_F32),
                             OSCAR_OK, "%s", oscar_last_error());
            }
            cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK, "%s", oscar_last_error());
            for (int r = 0; r < (per_head ? hkv : 1); r++) {
                cr_assert_eq(oscar_calib_target(c, 0, r, OSCAR_K, got), OSCAR_OK, "%s", oscar_last_error());
                brute_attn_target(&s, win, sink, recent, w, per_head, r, want);
                brute_attn_target(&s, win, sink, recent, 0.0, per_head, r, plain);
                double e = rel_frob(got, want, dd), moved = rel_frob(plain, want, dd);
                cr_log_info("sink %d recent %d per_head %d weight %.1f head %d: rel err %.2e, weighting moves C_K "
                            "by %.3f", sink, recent, per_head, (double)w, r, e, moved);
                cr_assert_lt(e, 1e-4, "sink %d recent %d per_head %d weight %g head %d: rel err %g (seed %llu)", sink,
                             recent, per_head, (double)w, r, e, (unsigned long long)g_seed);
                cr_assert_gt(moved, 1e-2, "the weighting should change the target here (moved %g)", moved);
                for (int a = 0; a < d; a++)
                    for (int b = 0; b < d; b++) cr_assert_eq(got[a * d + b], got[b * d + a], "not symmetric");
            }
            oscar_calib_destroy(c);
        }
    /* It needs the keys in pass 0; bad weights are refused at create. */
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, hq, hkv, d);
    o.key_attn_weight = 1.0f;
    oscar_calib *c = NULL;
    cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_OK);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(c, 0, win, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "key_attn_weight") != NULL, "%s", oscar_last_error());
    oscar_calib_destroy(c);
    const float bad[3] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        o.key_attn_weight = bad[i];
        c = (oscar_calib *)1;
        cr_assert_eq(oscar_calib_create(&o, &c), OSCAR_ERR_INVALID_ARGUMENT, "key_attn_weight %g", (double)bad[i]);
        cr_assert_null(c);
    }
    free(got);
    free(want);
    free(plain);
    synth_free(&s);
}

/* finalize's clip fitting in worker threads: the same parameters and reports for any count. */
Test(calib, threads_do_not_change_the_result) {
    const int d = 64, hq = 4, hkv = 2, L = 2, win = 160;
    synth s[2];
    for (int l = 0; l < L; l++) synth_make(&s[l], 10 * win + 21, hq, hkv, d, l);
    const int counts[3] = {1, 3, 0};
    oscar_calib *c[3];
    oscar_params *p[3];
    for (int r = 0; r < 3; r++) {
        oscar_calib_options o;
        small_window_options(&o, L, hq, hkv, d);
        o.threads = counts[r];
        p[r] = calibrate_windows(&o, s, win, 1, &c[r]);
    }
    const size_t n = (size_t)L * 2 * (size_t)p[0]->num_rot * (size_t)d * (size_t)d;
    for (int r = 1; r < 3; r++) {
        cr_assert_eq(memcmp(p[0]->rot, p[r]->rot, n * sizeof(float)), 0, "threads %d: other rotations", counts[r]);
        cr_assert_not_null(p[r]->fb);
        cr_assert_eq(memcmp(p[0]->fb, p[r]->fb, n * sizeof(float)), 0, "threads %d: other feedback", counts[r]);
        for (int l = 0; l < L; l++) {
            oscar_calib_attn_report a, b;
            cr_assert_eq(oscar_calib_layer_attn_report_get(c[0], l, &a), OSCAR_OK);
            cr_assert_eq(oscar_calib_layer_attn_report_get(c[r], l, &b), OSCAR_OK);
            cr_assert_eq(memcmp(&a, &b, sizeof a), 0, "threads %d layer %d: other probe errors", counts[r], l);
            for (int h = 0; h < hkv; h++)
                for (int w = 0; w < 2; w++) {
                    float x, y;
                    oscar_params_clip_head(p[0], l, h, (oscar_kv)w, &x);
                    oscar_params_clip_head(p[r], l, h, (oscar_kv)w, &y);
                    cr_assert_eq(x, y, "threads %d: layer %d head %d clip differs", counts[r], l, h);
                }
        }
    }
    for (int r = 0; r < 3; r++) {
        oscar_params_destroy(p[r]);
        oscar_calib_destroy(c[r]);
    }
    oscar_calib_options o;
    oscar_calib_options_default(&o, 1, hq, hkv, d);
    const int bad[2] = {-1, 65};
    for (int i = 0; i < 2; i++) {
        o.threads = bad[i];
        oscar_calib *x = (oscar_calib *)1;
        cr_assert_eq(oscar_calib_create(&o, &x), OSCAR_ERR_INVALID_ARGUMENT, "threads %d", bad[i]);
        cr_assert_null(x);
    }
    for (int l = 0; l < L; l++) synth_free(&s[l]);
}

/* Pass 1 must feed pass 0's windows: a pass-1 window of another length where pass 0's window holds an
 * attention probe (pass 0 without the values, so pass 1 brings the probe's keys and values) is refused
 * with nothing accumulated, and the right window is then taken. Before, the probe was dropped without a
 * word and the layer's clips fell back to the other objective (hard25). */
Test(calib, pass_one_windows_must_be_pass_zero_windows) {
    const int d = 64, hq = 4, hkv = 2, n = 1200;
    synth s;
    synth_make(&s, n, hq, hkv, d, 0);
    oscar_calib *c = make(1, hq, hkv, d, 1, 256, 0.0f);
    cr_assert_eq(oscar_calib_begin_pass(c, 0), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(c, 0, n, s.q, NULL, NULL, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_begin_pass(c, 1), OSCAR_OK);
    cr_assert_eq(oscar_calib_feed(c, 0, n - 100, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "same windows") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_calib_feed(c, 0, n, NULL, s.k, s.v, OSCAR_DTYPE_F32), OSCAR_OK, "%s", oscar_last_error());
    oscar_params *p = NULL;
    cr_assert_eq(oscar_calib_finalize(c, &p), OSCAR_OK, "%s", oscar_last_error());
    oscar_calib_attn_report r;
    cr_assert_eq(oscar_calib_layer_attn_report_get(c, 0, &r), OSCAR_OK);
    cr_assert_gt(r.probes, 0, "the probe of the one window was lost");
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    synth_free(&s);
}
