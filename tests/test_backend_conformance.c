/* GPU backend conformance: every plugin that can run here (OpenCL on PoCL in
 * CI; CUDA on a GPU machine; HIP where an AMD GPU exists) is loaded directly
 * (dlopen + oscar_backend_entry_v1, no runtime) and driven with the same
 * inputs as the CPU reference backend oscar_cpu_backend(). After every append
 * the device pools are read back and compared: with the expected cache built
 * from the reference primitives (codes may differ only where the reference t
 * lies within 1e-4 of a rounding boundary, FORMAT.md §2.4), byte for byte
 * with the CPU backend's pools outside such codes, and untouched memory
 * (spare pages, the spare window slot) must still hold the 0xFF poison.
 * Decode outputs are checked against a float64 attention and the CPU
 * backend's outputs within bf16/f16 output rounding. Bad block-table entries,
 * window slots and NaN rows must raise the device flag reported by check().
 * OSCAR_REQUIRE_BACKENDS="opencl,cuda" turns a missing backend into a failure.
 * Notes go to stderr, not cr_log_*: Criterion 2.4's runner leaks a log
 * message buffer, which LeakSanitizer reports as a failure. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "refcheck.h"

#define LAYERS 2
/* The layer the cases append to and attend: 1, except where a 3-bit head-tensor case runs a layer of
 * 2-bit head-tensors of the same plan (run_wide). */
static int g_layer = 1;
#define LAYER g_layer

static const char *const k_backends[] = {"opencl", "cuda", "hip"};
#define NB 3

/* ------------------------------------------------------------ plugins */
typedef struct plug {
    void *so;
    const oscar_backend_api *api;
    void *ctx;
    char why[600];
} plug;

static int required(const char *name) {
    const char *r = getenv("OSCAR_REQUIRE_BACKENDS");
    if (!r) return 0;
    size_t n = strlen(name);
    for (const char *p = r; (p = strstr(p, name)); p += n)
        if ((p == r || p[-1] == ',' || p[-1] == ' ') && (p[n] == 0 || p[n] == ',' || p[n] == ' ')) return 1;
    return 0;
}

/* Loads liboscar_backend_NAME.so from $OSCAR_PLUGIN_PATH (or the dynamic
 * loader's path) and initialises device 0. Returns 0 with a reason if absent. */
static int plug_open(const char *name, plug *p) {
    memset(p, 0, sizeof *p);
    char file[600];
    const char *path = getenv("OSCAR_PLUGIN_PATH");
    char dirs[1024];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d && !p->so; d = strtok_r(NULL, ":", &save)) {
        snprintf(file, sizeof file, "%s/liboscar_backend_%s.so", d, name);
        p->so = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    }
    if (!p->so) {
        snprintf(file, sizeof file, "liboscar_backend_%s.so", name);
        p->so = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    }
    if (!p->so) {
        snprintf(p->why, sizeof p->why, "plugin not found (%s)", dlerror());
        return 0;
    }
    oscar_backend_entry_fn entry;
    *(void **)&entry = dlsym(p->so, OSCAR_BACKEND_ENTRY_SYMBOL);
    cr_assert(entry, "%s: no %s symbol", name, OSCAR_BACKEND_ENTRY_SYMBOL);
    p->api = entry();
    cr_assert_eq(p->api->abi_version, OSCAR_BACKEND_ABI_VERSION);
    cr_assert_str_eq(p->api->name, name);
    oscar_errbuf why = {{0}};
    if (p->api->probe(0, &why) <= 0) {
        snprintf(p->why, sizeof p->why, "probe: %.500s", why.msg);
        return 0;
    }
    oscar_errbuf err = {{0}};
    cr_assert_eq(p->api->init(0, &p->ctx, &err), OSCAR_OK, "%s init: %s", name, err.msg);
    return 1;
}
static void plug_close(plug *p) {
    if (p->ctx) p->api->shutdown(p->ctx);
    /* The plugin stays loaded: vendor runtimes do not like being unloaded. */
}

/* Calls fn for each backend that runs here; a required one that does not fails. */
#define FOR_EACH_BACKEND(P, ...)                                                                               \
    do {                                                                                                       \
        int ran_ = 0;                                                                                          \
        for (int bi_ = 0; bi_ < NB; bi_++) {                                                                   \
            plug P;                                                                                            \
            if (!plug_open(k_backends[bi_], &P)) {                                                             \
                cr_assert(!required(k_backends[bi_]), "backend %s required by OSCAR_REQUIRE_BACKENDS: %s",      \
                          k_backends[bi_], P.why);                                                             \
                fprintf(stderr, "backend %s skipped: %s\n", k_backends[bi_], P.why);                                 \
                continue;                                                                                      \
            }                                                                                                  \
            ran_++;                                                                                            \
            __VA_ARGS__;                                                                                       \
            plug_close(&P);                                                                                    \
        }                                                                                                      \
        if (!ran_) fprintf(stderr, "no GPU backend available: nothing compared\n");                                  \
    } while (0)

/* ------------------------------------------------------------- device helpers */
static void *dev_alloc(plug *p, size_t bytes) {
    void *b = NULL;
    oscar_errbuf err = {{0}};
    cr_assert_eq(p->api->alloc(p->ctx, bytes ? bytes : 16, &b, &err), OSCAR_OK, "%s alloc: %s", p->api->name,
                 err.msg);
    return b;
}
static void *dev_upload(plug *p, const void *src, size_t bytes) {
    void *b = dev_alloc(p, bytes);
    oscar_errbuf err = {{0}};
    if (bytes) cr_assert_eq(p->api->write(p->ctx, b, 0, src, bytes, NULL, &err), OSCAR_OK, "write: %s", err.msg);
    return b;
}
static void dev_download(plug *p, void *dst, const void *src, size_t bytes) {
    oscar_errbuf err = {{0}};
    if (bytes) cr_assert_eq(p->api->read(p->ctx, dst, src, 0, bytes, NULL, &err), OSCAR_OK, "read: %s", err.msg);
    cr_assert_eq(p->api->sync(p->ctx, NULL, &err), OSCAR_OK, "sync: %s", err.msg);
}

/* ------------------------------------------------------------- scenario */
typedef rc_cfg cfg;

typedef struct env {
    const oscar_backend_api *cpu;
    void *cpu_ctx, *cpu_plan;
    plug *g;
    void *g_plan;
    oscar_layout_desc l;
    int num_rot, identity;
    float *rot_k, *rot_v;
    float *fb_k, *fb_v; /* [LAYERS][num_rot][d][d] error-feedback weights, NULL: nearest */
    float clip_k[LAYERS * RC_MAX_KV_HEADS], clip_v[LAYERS * RC_MAX_KV_HEADS]; /* [layer][kv head] */
    uint64_t cpu_ws[OSCAR_WORKSPACE_HEADER / 8];
    void *g_ws;
    size_t g_ws_bytes;
    /* device pools mirroring the host rc_paged pools */
    void *d_pages, *d_windows;
    size_t pages_bytes, windows_bytes;
    void *h_pages, *h_windows; /* read-back copies */
    char variant[128];
} env;

/* Error-feedback weights as calibration makes them (normalised upper
 * Cholesky factor of a metric's inverse), from a different random
 * anisotropic metric for every (layer, K/V, rotation index), so a wrong
 * layer, kind or head offset shows. */
static float *random_feedback(rc_rng *r, int num_rot, int d) {
    size_t dd = (size_t)d * d, n = (size_t)LAYERS * num_rot;
    float *F = malloc(n * dd * sizeof *F);
    double *C = malloc(dd * sizeof *C);
    for (size_t i = 0; i < n; i++) {
        rc_random_metric(r, d, 1e3, C);
        double mx = rc_feedback_weights(d, C, 1e-3, F + i * dd);
        cr_assert(mx > 0.0 && mx <= 16.0, "feedback weights: max |F| %g", mx);
    }
    free(C);
    return F;
}

/* Set by a test (each runs in a process of its own) that forces a CUDA kernel
 * through its environment switch: every CUDA plan must name it. */
static const char *expect_cuda_variant;
/* Set by a test whose shapes every backend's default build holds: a refused plan fails it instead of
 * being skipped. */
static int require_variant;

/* Set by the 3-bit head-tensor cases (FORMAT.md §2.7): code widths [LAYERS][H][2] given to both plans,
 * and the layout's room for them (layout.wide_tensors). */
static const uint8_t *wide_code_bits;
static int wide_room;
/* Set by the per-layer page case: layout.wide_per_layer 1, each layer's pools of its own page size
 * (format/layout.c oscar_format_layer_page_bytes over wide_bits_live). wide_bits_live: the plan's code
 * widths while a 3-bit case runs its schedules. */
static int wide_per_layer_on;
static const uint8_t *wide_bits_live;
/* Set by a case whose planted rows must reach the codes as planted: no rotation, whatever the method. */
static int force_identity;

/* Returns 0 if the backend does not build this variant (skipped with a note).
 * fb: give both backends error-feedback weights. */
static int env_init(env *e, plug *g, const cfg *c, rc_rng *r, uint64_t seed, int max_seqs, int max_len, int fb) {
    memset(e, 0, sizeof *e);
    e->g = g;
    e->cpu = oscar_cpu_backend();
    rc_plan_setup(c, LAYERS, r, &e->l, &e->num_rot, &e->identity, &e->rot_k, &e->rot_v, e->clip_k, e->clip_v);
    if (force_identity && !e->identity) {
        free(e->rot_k);
        free(e->rot_v);
        e->rot_k = e->rot_v = NULL;
        e->identity = 1;
    }
    e->l.wide_tensors = wide_room;
    e->l.wide_per_layer = wide_per_layer_on;
    if (fb) {
        e->fb_k = random_feedback(r, e->num_rot, c->d);
        e->fb_v = random_feedback(r, e->num_rot, c->d);
    }
    oscar_errbuf err = {{0}};
    oscar_backend_plan_desc pd = {.layout = e->l, .num_layers = LAYERS, .num_rot = e->num_rot,
                                  .identity_rotation = e->identity, .rot_k = e->rot_k, .rot_v = e->rot_v,
                                  .clip_k = e->clip_k, .clip_v = e->clip_v, .fb_k = e->fb_k, .fb_v = e->fb_v,
                                  .code_bits = wide_code_bits};
    oscar_status s = g->api->plan_create(g->ctx, &pd, &e->g_plan, e->variant, sizeof e->variant, &err);
    /* OpenCL compiles every variant at plan time: none can be missing there,
     * a refusal of a valid shape is a bug (it hid GQA above 16). CUDA and HIP
     * refuse a head_dim, group or storage option the format allows but their set
     * lacks (head_dim 96 with group 32 in the default set: OSCAR_ERR_UNSUPPORTED_GROUP):
     * skipped there, unless the test holds shapes every default build has. */
    const int missing = s == OSCAR_ERR_UNSUPPORTED || s == OSCAR_ERR_UNSUPPORTED_HEAD_DIM ||
                        s == OSCAR_ERR_UNSUPPORTED_GROUP;
    cr_assert(!missing || (strcmp(g->api->name, "opencl") != 0 && !require_variant),
              "seed %llu: %s refused a valid shape (d %d, group %d, %d q heads, %d KV heads): %s",
              (unsigned long long)seed, g->api->name, c->d, c->G, c->Hq, c->H, err.msg);
    if (missing) {
        fprintf(stderr, "%s: variant not built, skipped: %s\n", g->api->name, err.msg);
        free(e->rot_k);
        free(e->rot_v);
        free(e->fb_k);
        free(e->fb_v);
        return 0;
    }
    cr_assert_eq(s, OSCAR_OK, "seed %llu: %s plan_create: %s", (unsigned long long)seed, g->api->name, err.msg);
    /* a case that forces a CUDA kernel choice checks that the plan took it */
    if (expect_cuda_variant && !strcmp(g->api->name, "cuda"))
        cr_assert(strstr(e->variant, expect_cuda_variant), "seed %llu: cuda took %s, the case wants a %s variant",
                  (unsigned long long)seed, e->variant, expect_cuda_variant);
    cr_assert_eq(e->cpu->init(0, &e->cpu_ctx, &err), OSCAR_OK);
    cr_assert_eq(e->cpu->plan_create(e->cpu_ctx, &pd, &e->cpu_plan, NULL, 0, &err), OSCAR_OK, "cpu plan: %s",
                 err.msg);
    cr_assert_eq(e->cpu->workspace_init(e->cpu_ctx, e->cpu_plan, e->cpu_ws, NULL, &err), OSCAR_OK);
    cr_assert_eq(g->api->workspace_bytes(g->ctx, e->g_plan, max_seqs, max_len, &e->g_ws_bytes, &err), OSCAR_OK,
                 "workspace_bytes: %s", err.msg);
    e->g_ws = dev_alloc(g, e->g_ws_bytes);
    cr_assert_eq(g->api->workspace_init(g->ctx, e->g_plan, e->g_ws, NULL, &err), OSCAR_OK);
    return 1;
}

static void env_bind_pools(env *e, const rc_paged *b) {
    e->pages_bytes = b->page_bytes * (size_t)(b->num_pages > 0 ? b->num_pages : 1);
    e->windows_bytes = b->slot_bytes * (size_t)b->num_slots + 1;
    e->d_pages = dev_upload(e->g, b->pages, e->pages_bytes);
    e->d_windows = dev_upload(e->g, b->windows, e->windows_bytes);
    e->h_pages = malloc(e->pages_bytes);
    e->h_windows = malloc(e->windows_bytes);
}

/* Releases the pools env_bind_pools bound (the env can bind others). */
static void env_unbind_pools(env *e) {
    e->g->api->free(e->g->ctx, e->d_pages);
    e->g->api->free(e->g->ctx, e->d_windows);
    free(e->h_pages);
    free(e->h_windows);
    e->d_pages = e->d_windows = e->h_pages = e->h_windows = NULL;
}

static void env_free(env *e) {
    plug *g = e->g;
    g->api->free(g->ctx, e->g_ws);
    env_unbind_pools(e);
    g->api->plan_destroy(g->ctx, e->g_plan);
    e->cpu->plan_destroy(e->cpu_ctx, e->cpu_plan);
    e->cpu->shutdown(e->cpu_ctx);
    free(e->rot_k);
    free(e->rot_v);
    free(e->fb_k);
    free(e->fb_v);
}

static const float *layer_rot(const env *e, int kv) {
    const float *b = kv ? e->rot_v : e->rot_k;
    return b ? b + (size_t)LAYER * e->num_rot * e->l.head_dim * e->l.head_dim : NULL;
}
static const float *layer_fb(const env *e, int kv) {
    const float *b = kv ? e->fb_v : e->fb_k;
    return b ? b + (size_t)LAYER * e->num_rot * e->l.head_dim * e->l.head_dim : NULL;
}

static oscar_batch batch_of(const rc_paged *b) {
    oscar_batch bt = {.num_seqs = b->num_seqs, .seq_lens = b->seq_lens, .window_slots = b->window_slots,
                      .block_table = b->block_table, .block_table_stride = b->stride, .max_seq_len = 0};
    for (int i = 0; i < b->num_seqs; i++)
        if (b->seq_lens[i] > bt.max_seq_len) bt.max_seq_len = b->seq_lens[i];
    return bt;
}

/* Device copies of a batch's index arrays. */
typedef struct dev_batch {
    void *lens, *slots, *bt;
} dev_batch;
static oscar_batch dev_batch_of(env *e, const rc_paged *b, dev_batch *db) {
    oscar_batch bt = batch_of(b);
    db->lens = dev_upload(e->g, b->seq_lens, (size_t)b->num_seqs * 4);
    db->slots = dev_upload(e->g, b->window_slots, (size_t)b->num_slots * 4);
    db->bt = dev_upload(e->g, b->block_table, (size_t)b->num_seqs * b->stride * 4);
    bt.seq_lens = db->lens;
    bt.window_slots = db->slots;
    bt.block_table = db->bt;
    return bt;
}
static void dev_batch_free(env *e, dev_batch *db) {
    e->g->api->free(e->g->ctx, db->lens);
    e->g->api->free(e->g->ctx, db->slots);
    e->g->api->free(e->g->ctx, db->bt);
}

/* Appends n[i] tokens to every sequence on both backends. */
static void do_append(env *e, rc_paged *b, float *const *K, float *const *V, const int *n, int pad, uint64_t seed) {
    int H = e->l.num_kv_heads, d = e->l.head_dim;
    int32_t *cu = malloc((size_t)(b->num_seqs + 1) * sizeof *cu);
    cu[0] = 0;
    for (int i = 0; i < b->num_seqs; i++) cu[i + 1] = cu[i] + n[i];
    int total = cu[b->num_seqs];
    int64_t stride = (int64_t)H * d + pad;
    size_t es = oscar_dtype_size(e->l.kv_dtype), kvb = (size_t)(total ? total : 1) * stride * es;
    char *kb = malloc(kvb), *vb = malloc(kvb);
    rc_poison(kb, kvb);
    rc_poison(vb, kvb);
    for (int i = 0; i < b->num_seqs; i++) {
        int L0 = b->seq_lens[i];
        for (int t = 0; t < n[i]; t++) {
            size_t src = (size_t)(L0 + t) * H * d, dst = (size_t)(cu[i] + t) * stride * es;
            rc_to_dtype(e->l.kv_dtype, K[i] + src, kb + dst, (size_t)H * d);
            rc_to_dtype(e->l.kv_dtype, V[i] + src, vb + dst, (size_t)H * d);
        }
        b->seq_lens[i] = L0 + n[i];
    }
    oscar_errbuf err = {{0}};
    oscar_backend_append_args a = {.layer = LAYER, .cache = {b->pages, b->num_pages, b->windows, b->num_slots},
                                   .batch = batch_of(b), .cu_new = cu, .total_new = total, .k = kb, .v = vb,
                                   .kv_stride = stride, .workspace = e->cpu_ws, .workspace_bytes = sizeof e->cpu_ws};
    cr_assert_eq(e->cpu->append(e->cpu_ctx, e->cpu_plan, &a, &err), OSCAR_OK, "seed %llu: cpu append: %s",
                 (unsigned long long)seed, err.msg);
    dev_batch db;
    plug *g = e->g;
    void *dcu = dev_upload(g, cu, (size_t)(b->num_seqs + 1) * 4), *dk = dev_upload(g, kb, kvb),
         *dv = dev_upload(g, vb, kvb);
    oscar_backend_append_args ga = {.layer = LAYER, .cache = {e->d_pages, b->num_pages, e->d_windows, b->num_slots},
                                    .batch = dev_batch_of(e, b, &db), .cu_new = dcu, .total_new = total, .k = dk,
                                    .v = dv, .kv_stride = stride, .workspace = e->g_ws,
                                    .workspace_bytes = e->g_ws_bytes};
    cr_assert_eq(g->api->append(g->ctx, e->g_plan, &ga, &err), OSCAR_OK, "seed %llu: %s append: %s",
                 (unsigned long long)seed, g->api->name, err.msg);
    cr_assert_eq(g->api->check(g->ctx, e->g_plan, e->g_ws, NULL, &err), OSCAR_OK, "seed %llu: %s check: %s",
                 (unsigned long long)seed, g->api->name, err.msg);
    dev_batch_free(e, &db);
    g->api->free(g->ctx, dcu);
    g->api->free(g->ctx, dk);
    g->api->free(g->ctx, dv);
    free(cu);
    free(kb);
    free(vb);
}

/* Pools read back; cache compared with the expected cache (boundary rule),
 * with the CPU backend byte for byte, and poison checked where nothing may write. */
static void check_cache(env *e, const rc_paged *b, rc_seq_ref *refs, uint64_t seed, const char *what) {
    dev_download(e->g, e->h_pages, e->d_pages, e->pages_bytes);
    dev_download(e->g, e->h_windows, e->d_windows, e->windows_bytes);
    char msg[256];
    for (int i = 0; i < b->num_seqs; i++) {
        int bad = rc_compare_seq(&refs[i], b->seq_lens[i], e->h_pages, e->h_windows,
                                 b->block_table + (size_t)i * b->stride, b->window_slots[i], 1, msg, sizeof msg);
        cr_assert_eq(bad, 0, "seed %llu %s (%s, %s), sequence %d of L=%d: %d rows differ; first: %s",
                     (unsigned long long)seed, e->g->api->name, e->variant, what, i, b->seq_lens[i], bad, msg);
    }
    /* Byte differences with the CPU backend: only boundary codes may differ,
     * so they must be rare (each is a whole byte holding 4 codes). */
    size_t diff = 0, used = 0;
    const unsigned char *a = e->h_pages, *c = b->pages;
    for (size_t j = 0; j < e->pages_bytes; j++) diff += a[j] != c[j];
    const unsigned char *wa = e->h_windows, *wc = b->windows;
    for (size_t j = 0; j < e->windows_bytes; j++) {
        cr_assert_eq(wa[j], wc[j], "seed %llu %s (%s, %s): window pool byte %zu differs from the CPU backend "
                     "(0x%02x vs 0x%02x)", (unsigned long long)seed, e->g->api->name, e->variant, what, j, wa[j], wc[j]);
    }
    for (int i = 0; i < b->num_seqs; i++) used += (size_t)rc_pages_for(&e->l, b->seq_lens[i]) * b->page_bytes;
    cr_assert_leq(diff * 200, used + 200, "seed %llu %s (%s, %s): %zu page bytes differ from the CPU backend",
                  (unsigned long long)seed, e->g->api->name, e->variant, what, diff);
    /* Pages no sequence needs yet must still hold the poison. */
    char *usedmap = calloc((size_t)b->num_pages + 1, 1);
    for (int i = 0; i < b->num_seqs; i++)
        for (int k = 0; k < rc_pages_for(&e->l, b->seq_lens[i]); k++) usedmap[b->block_table[(size_t)i * b->stride + k]] = 1;
    for (int pg = 0; pg < b->num_pages; pg++)
        if (!usedmap[pg])
            for (size_t j = 0; j < b->page_bytes; j++)
                cr_assert_eq(a[(size_t)pg * b->page_bytes + j], 0xff,
                             "seed %llu %s (%s): unused page %d byte %zu was written", (unsigned long long)seed,
                             e->g->api->name, e->variant, pg, j);
    free(usedmap);
}

/* The q~ a CUDA decode or extend left in its workspace (gpu_core.c: fp32
 * [query token][Hq][d] after the header). */
static const void *dev_qt(const env *e) {
    return (const char *)e->g_ws + OSCAR_WORKSPACE_HEADER;
}

/* The plugin's variant is of the CUDA tensor-core family ("_w3" after it: a plan with 3-bit head-tensors,
 * whose layers of 3-bit head-tensors take the generic kernels; "_w3t": the family's W3 kernels). */
static int is_tc(const env *e) {
    const size_t vn = strlen(e->variant);
    return (vn >= 3 && !strcmp(e->variant + vn - 3, "_tc")) || (vn >= 6 && !strcmp(e->variant + vn - 6, "_tc_w3")) ||
           (vn >= 7 && !strcmp(e->variant + vn - 7, "_tc_w3t"));
}
static int is_w3t(const env *e) {
    const size_t vn = strlen(e->variant);
    return vn >= 4 && !strcmp(e->variant + vn - 4, "_w3t");
}

static void check_decode(env *e, rc_paged *b, rc_seq_ref *refs, rc_rng *r, int rotated_output, uint64_t seed) {
    int Hq = e->l.num_q_heads, d = e->l.head_dim, qpad = rc_randint(r, 0, 3) * 8, opad = rc_randint(r, 0, 2) * 8;
    size_t es = oscar_dtype_size(e->l.kv_dtype);
    int64_t qs = (int64_t)Hq * d + qpad, os = (int64_t)Hq * d + opad;
    size_t qbytes = (size_t)b->num_seqs * qs * es, obytes = (size_t)b->num_seqs * os * es;
    float *q = malloc((size_t)b->num_seqs * Hq * d * sizeof *q);
    char *qb = malloc(qbytes), *ob = malloc(obytes), *cob = malloc(obytes);
    double *ref = malloc((size_t)Hq * d * sizeof *ref), *reft = malloc((size_t)Hq * d * sizeof *reft);
    const int tc = is_tc(e);
    float *qt = tc ? malloc((size_t)b->num_seqs * Hq * d * sizeof *qt) : NULL;
    rc_gen_kv(r, b->num_seqs, Hq, d, 2, e->l.kv_dtype, q);
    rc_poison(qb, qbytes);
    rc_poison(ob, obytes);
    rc_poison(cob, obytes);
    for (int i = 0; i < b->num_seqs; i++)
        rc_to_dtype(e->l.kv_dtype, q + (size_t)i * Hq * d, qb + (size_t)i * qs * es, (size_t)Hq * d);
    float sm = (float)(rc_uniform(r) < 0.5 ? 1.0 / sqrt(d) : 0.3 / sqrt(d));
    oscar_errbuf err = {{0}};
    oscar_backend_decode_args ca = {.layer = LAYER, .cache = {b->pages, b->num_pages, b->windows, b->num_slots},
                                    .batch = batch_of(b), .q = qb, .q_stride = qs, .out = cob, .out_stride = os,
                                    .sm_scale = sm, .rotated_output = rotated_output, .workspace = e->cpu_ws,
                                    .workspace_bytes = sizeof e->cpu_ws};
    cr_assert_eq(e->cpu->decode(e->cpu_ctx, e->cpu_plan, &ca, &err), OSCAR_OK, "cpu decode: %s", err.msg);
    plug *g = e->g;
    dev_batch db;
    void *dq = dev_upload(g, qb, qbytes), *dout = dev_upload(g, ob, obytes);
    oscar_backend_decode_args ga = {.layer = LAYER, .cache = {e->d_pages, b->num_pages, e->d_windows, b->num_slots},
                                    .batch = dev_batch_of(e, b, &db), .q = dq, .q_stride = qs, .out = dout,
                                    .out_stride = os, .sm_scale = sm, .rotated_output = rotated_output,
                                    .workspace = e->g_ws, .workspace_bytes = e->g_ws_bytes};
    cr_assert_eq(g->api->decode(g->ctx, e->g_plan, &ga, &err), OSCAR_OK, "seed %llu: %s decode: %s",
                 (unsigned long long)seed, g->api->name, err.msg);
    dev_download(g, ob, dout, obytes);
    if (tc) dev_download(g, qt, dev_qt(e), (size_t)b->num_seqs * Hq * d * sizeof *qt);
    cr_assert_eq(g->api->check(g->ctx, e->g_plan, e->g_ws, NULL, &err), OSCAR_OK, "check after decode: %s", err.msg);
    char msg[256];
    for (int i = 0; i < b->num_seqs; i++) {
        const int L = b->seq_lens[i];
        rc_attention_f64(&refs[i], L, Hq, q + (size_t)i * Hq * d, layer_rot(e, 0), layer_rot(e, 1), e->num_rot, sm,
                         rotated_output, ref);
        /* the tensor-core kernels score the 2-bit rows with q~ in two int8 limbs (FORMAT.md §5):
         * their reference does the same from the q~ they held */
        if (tc)
            rc_attention_f64_q(&refs[i], L, L - 1, Hq, q + (size_t)i * Hq * d, layer_rot(e, 0), layer_rot(e, 1),
                               e->num_rot, sm, rotated_output, reft, NULL, NULL, qt + (size_t)i * Hq * d);
        const char *o = ob + (size_t)i * os * es;
        /* Absolute floor 2^-10 of the largest output (FORMAT.md §5): the tensor-core
         * decode rounds P' = p a to fp16 (2^-11; FlashAttention's bf16 P is 2^-9).
         * Measured on the H200: errors up to 2.1e-4 of the largest output. */
        int bad = rc_check_output_abs(e->l.kv_dtype, o, tc ? reft : ref, (size_t)Hq * d, 0x1p-10, msg, sizeof msg);
        cr_assert_eq(bad, 0, "seed %llu %s (%s): decode of sequence %d (L=%d, rotated_output %d): %d outputs off; %s",
                     (unsigned long long)seed, g->api->name, e->variant, i, b->seq_lens[i], rotated_output, bad, msg);
        /* Against the CPU backend's own output: each is within output rounding
         * of its float64 reference (the tensor-core family's: with its q~ limbs), so
         * they agree within two 16-bit ulps plus the difference of the references. */
        float *gf = malloc((size_t)Hq * d * sizeof *gf), *cf = malloc((size_t)Hq * d * sizeof *cf);
        rc_from_dtype(e->l.kv_dtype, o, gf, (size_t)Hq * d);
        rc_from_dtype(e->l.kv_dtype, cob + (size_t)i * os * es, cf, (size_t)Hq * d);
        double rel = e->l.kv_dtype == OSCAR_DTYPE_BF16 ? 0x1p-7 : 0x1p-9, mx = 0.0;
        for (int j = 0; j < Hq * d; j++) mx = fabs(cf[j]) > mx ? fabs(cf[j]) : mx;
        for (int j = 0; j < Hq * d; j++) {
            double a = fabs(gf[j]) > fabs(cf[j]) ? fabs(gf[j]) : fabs(cf[j]);
            cr_assert_leq(fabs((double)gf[j] - cf[j]), rel * a + 0.01 * mx + (tc ? fabs(reft[j] - ref[j]) : 0.0),
                          "seed %llu %s (%s): decode of sequence %d output %d: %g vs CPU backend %g",
                          (unsigned long long)seed, g->api->name, e->variant, i, j, gf[j], cf[j]);
        }
        free(gf);
        free(cf);
        for (size_t j = (size_t)Hq * d * es; j < (size_t)os * es; j++)
            cr_assert_eq((unsigned char)o[j], 0xff, "seed %llu: decode wrote into the output stride padding",
                         (unsigned long long)seed);
    }
    dev_batch_free(e, &db);
    g->api->free(g->ctx, dq);
    g->api->free(g->ctx, dout);
    free(q);
    free(qb);
    free(ob);
    free(cob);
    free(ref);
    free(reft);
    free(qt);
}

/* ------------------------------------------------------------- extend */
enum { EXT_LSE = 1, EXT_NOCU = 2 /* cu_q NULL: decode through extend */ };

/* LSE within 2e-4 (1 + |lse|) (FORMAT.md §5.1); tensor-core kernels (tc > 0) add
 * their floor: q~ meets 16-bit rows as a 16-bit value plus its rounding remainder
 * (2^-16 of each element for bf16), so a score may be off by 2^-16 of its
 * sum_j |q~_j k~_j|, and the LSE by the largest such error; 2^-15 leaves room for
 * the fp32 sums (abs_score: rc_attention_f64_at's). */
static int rc_lse_off(double got, double ref, int tc, double abs_score) {
    return !(fabs(got - ref) <= 2e-4 * (1.0 + fabs(ref)) + (tc ? 0x1p-15 * abs_score : 0.0));
}

/* Extend attention with qn[i] query tokens for sequence i (its last qn[i]
 * positions) on the CPU backend and on the device, against the float64
 * reference (FORMAT.md §5.1: rows as stored at seq_lens) and each other.
 * Outputs and LSE start as NaN patterns with one spare row each, and stride
 * padding: nothing but the rows of the call may change. bt: the block table
 * to attend with (NULL: the batch's own). EXT_NOCU also runs decode and wants
 * the same bytes. */
/* Device copies of an extend call's host arguments ca (the CPU backend's): cu_q, q, the output and LSE
 * buffers (uploaded from out0 / lse0, poisoned by the caller), the batch, the device pools and workspace.
 * dev_ext_free releases them. */
typedef struct dev_ext {
    dev_batch db;
    void *cu, *q, *out, *lse;
} dev_ext;
static oscar_backend_extend_args dev_ext_of(env *e, const rc_paged *b, const oscar_backend_extend_args *ca,
                                            const int32_t *cu, size_t qbytes, const void *out0, size_t obytes,
                                            const void *lse0, size_t lbytes, dev_ext *d) {
    plug *g = e->g;
    d->cu = dev_upload(g, cu, (size_t)(b->num_seqs + 1) * 4);
    d->q = dev_upload(g, ca->q, qbytes);
    d->out = dev_upload(g, out0, obytes);
    d->lse = dev_upload(g, lse0, lbytes);
    oscar_backend_extend_args ga = *ca;
    ga.cache = (oscar_cache){e->d_pages, b->num_pages, e->d_windows, b->num_slots};
    ga.batch = dev_batch_of(e, b, &d->db);
    ga.cu_q = ca->cu_q ? d->cu : NULL;
    ga.q = d->q;
    ga.out = d->out;
    ga.lse = ca->lse ? d->lse : NULL;
    ga.workspace = e->g_ws;
    ga.workspace_bytes = e->g_ws_bytes;
    return ga;
}
static void dev_ext_free(env *e, dev_ext *d) {
    dev_batch_free(e, &d->db);
    e->g->api->free(e->g->ctx, d->cu);
    e->g->api->free(e->g->ctx, d->q);
    e->g->api->free(e->g->ctx, d->out);
    e->g->api->free(e->g->ctx, d->lse);
}

/* Layer LAYER of e's plan holds a 3-bit head-tensor (the code widths of the plan: wide_bits_live while a
 * wide case runs, wide_code_bits while its plan is made). */
static int layer_is_wide(const env *e) {
    const uint8_t *bits = wide_bits_live ? wide_bits_live : wide_code_bits;
    if (!bits || e->l.wide_tensors == 0) return 0;
    for (int i = 0; i < 2 * e->l.num_kv_heads; i++)
        if (bits[(size_t)LAYER * 2 * e->l.num_kv_heads + i] == 3) return 1;
    return 0;
}

/* CUDA's long-chunk kernel runs the 2-bit rows of an extend with query rows where the shape has it
 * (one group per row at d 64 / 128, F16 metadata, uniform levels, a layer without 3-bit head-tensors)
 * and the call of nseq sequences has max_q_len >= 2 and at least 64 (query row, head) pairs per KV head,
 * or 49 where nseq x num_kv_heads >= 32, or max_q_len >= 2 alone with $OSCAR_EXTEND_FA=1 (never with 0;
 * gpu_core.c fa_choose); its reference is its own precision rule (FORMAT.md §5.1). The caller checks
 * that the variant is of the tensor-core family. */
static int fa_takes(const env *e, int nseq, int maxq) {
    const char *fae = getenv("OSCAR_EXTEND_FA");
    const int d = e->l.head_dim, gq = e->l.num_q_heads / e->l.num_kv_heads;
    const int pairs = nseq * e->l.num_kv_heads >= 32 ? 49 : 64;
    const int on = maxq >= 2 && (fae && *fae ? !strcmp(fae, "1") : maxq * gq >= pairs);
    return on && !strcmp(e->g->api->name, "cuda") && (d == 64 || d == 128) && e->l.group == d &&
           e->l.meta_dtype == OSCAR_DTYPE_F16 && !layer_is_wide(e) && e->l.method != OSCAR_METHOD_BF16 &&
           e->l.method != OSCAR_METHOD_OSCAR2_LM;
}

static void check_extend(env *e, const rc_paged *b, const int32_t *bt, rc_seq_ref *refs, rc_rng *r, const int *qn,
                         int rotated_output, int flags, uint64_t seed) {
    int Hq = e->l.num_q_heads, d = e->l.head_dim, nseq = b->num_seqs;
    size_t es = oscar_dtype_size(e->l.kv_dtype);
    int32_t *cu = malloc((size_t)(nseq + 1) * sizeof *cu);
    cu[0] = 0;
    int maxq = 1;
    for (int i = 0; i < nseq; i++) {
        cr_assert(qn[i] >= 1 && qn[i] <= b->seq_lens[i]);
        cr_assert(!(flags & EXT_NOCU) || qn[i] == 1);
        cu[i + 1] = cu[i] + qn[i];
        maxq = qn[i] > maxq ? qn[i] : maxq;
    }
    int total = cu[nseq];
    int64_t qs = (int64_t)Hq * d + rc_randint(r, 0, 2) * 8, os = (int64_t)Hq * d + rc_randint(r, 0, 2) * 8;
    size_t qbytes = (size_t)total * qs * es, obytes = (size_t)(total + 1) * os * es;
    size_t lbytes = (size_t)(total + 1) * Hq * sizeof(float);
    float *q = malloc((size_t)total * Hq * d * sizeof *q), *clse = malloc(lbytes), *glse = malloc(lbytes);
    char *qb = malloc(qbytes), *cob = malloc(obytes), *gob = malloc(obytes);
    double *ref = malloc((size_t)Hq * d * sizeof *ref), *reft = malloc((size_t)Hq * d * sizeof *reft),
           *rlse = malloc((size_t)Hq * sizeof *rlse), *rlset = malloc((size_t)Hq * sizeof *rlset),
           *rabs = malloc((size_t)Hq * sizeof *rabs);
    const int tc = is_tc(e);
    float *qt = tc ? malloc((size_t)total * Hq * d * sizeof *qt) : NULL; /* the device's q~ */
    const int fa = tc && !(flags & EXT_NOCU) && fa_takes(e, nseq, maxq);
    rc_gen_kv(r, total, Hq, d, 2, e->l.kv_dtype, q);
    rc_poison(qb, qbytes);
    rc_poison(cob, obytes);
    rc_poison(gob, obytes);
    rc_poison(clse, lbytes);
    for (int t = 0; t < total; t++)
        rc_to_dtype(e->l.kv_dtype, q + (size_t)t * Hq * d, qb + (size_t)t * qs * es, (size_t)Hq * d);
    float sm = (float)(rc_uniform(r) < 0.5 ? 1.0 / sqrt(d) : 0.3 / sqrt(d));
    rc_paged bb = *b;
    if (bt) bb.block_table = (int32_t *)bt;
    int want_lse = flags & EXT_LSE, nocu = flags & EXT_NOCU;
    oscar_errbuf err = {{0}};
    oscar_backend_extend_args ca = {.layer = LAYER, .cache = {b->pages, b->num_pages, b->windows, b->num_slots},
                                    .batch = batch_of(&bb), .cu_q = nocu ? NULL : cu, .total_q = total,
                                    .max_q_len = maxq, .q = qb, .q_stride = qs, .out = cob, .out_stride = os,
                                    .lse = want_lse ? clse : NULL, .sm_scale = sm, .rotated_output = rotated_output,
                                    .workspace = e->cpu_ws, .workspace_bytes = sizeof e->cpu_ws};
    cr_assert_eq(e->cpu->extend(e->cpu_ctx, e->cpu_plan, &ca, &err), OSCAR_OK, "seed %llu: cpu extend: %s",
                 (unsigned long long)seed, err.msg);
    plug *g = e->g;
    dev_ext dx;
    oscar_backend_extend_args ga = dev_ext_of(e, &bb, &ca, cu, qbytes, gob, obytes, gob, lbytes, &dx);
    void *dout = dx.out, *dlse = dx.lse;
    cr_assert_eq(g->api->extend(g->ctx, e->g_plan, &ga, &err), OSCAR_OK, "seed %llu: %s extend: %s",
                 (unsigned long long)seed, g->api->name, err.msg);
    dev_download(g, gob, dout, obytes);
    if (tc) dev_download(g, qt, dev_qt(e), (size_t)total * Hq * d * sizeof *qt);
    dev_download(g, glse, dlse, lbytes);
    cr_assert_eq(g->api->check(g->ctx, e->g_plan, e->g_ws, NULL, &err), OSCAR_OK, "seed %llu: check after extend: %s",
                 (unsigned long long)seed, err.msg);
    char msg[256];
    const char *names[2] = {"cpu", g->api->name};
    const char *outs[2] = {cob, gob};
    const float *lses[2] = {clse, glse};
    for (int i = 0; i < nseq; i++) {
        int L = b->seq_lens[i];
        for (int k = 0; k < qn[i]; k++) {
            int tok = cu[i] + k, pos = L - qn[i] + k;
            rc_attention_f64_at(&refs[i], L, pos, Hq, q + (size_t)tok * Hq * d, layer_rot(e, 0), layer_rot(e, 1),
                                e->num_rot, sm, rotated_output, ref, rlse, rabs);
            /* the device's reference: the tensor-core family scores the 2-bit rows with the q~
             * it held in two int8 limbs (FORMAT.md §5) */
            if (fa)
                rc_attention_f64_fa(&refs[i], L, pos, Hq, q + (size_t)tok * Hq * d, layer_rot(e, 0), layer_rot(e, 1),
                                    e->num_rot, sm, rotated_output, reft, rlset, qt + (size_t)tok * Hq * d);
            else if (tc)
                rc_attention_f64_q(&refs[i], L, pos, Hq, q + (size_t)tok * Hq * d, layer_rot(e, 0), layer_rot(e, 1),
                                   e->num_rot, sm, rotated_output, reft, rlset, NULL, qt + (size_t)tok * Hq * d);
            for (int w = 0; w < 2; w++) {
                const char *o = outs[w] + (size_t)tok * os * es;
                const int wt = w && tc;
                /* CPU: the fp32 reference bound; device: the tensor-core floor (FORMAT.md §5). */
                int bad = rc_check_output_abs(e->l.kv_dtype, o, wt ? reft : ref, (size_t)Hq * d, w ? 0x1p-10 : 2e-4,
                                              msg, sizeof msg);
                cr_assert_eq(bad, 0,
                             "seed %llu %s (%s): extend of sequence %d (L=%d, %d queries), query at %d: %d outputs "
                             "off; %s",
                             (unsigned long long)seed, names[w], e->variant, i, L, qn[i], pos, bad, msg);
                for (size_t j = (size_t)Hq * d * es; j < (size_t)os * es; j++)
                    cr_assert_eq((unsigned char)o[j], 0xff, "seed %llu %s: extend wrote into the stride padding",
                                 (unsigned long long)seed, names[w]);
                if (want_lse)
                    for (int h = 0; h < Hq; h++)
                        cr_assert(!rc_lse_off(lses[w][(size_t)tok * Hq + h], wt ? rlset[h] : rlse[h], wt, rabs[h]),
                                  "seed %llu %s (%s): LSE of sequence %d query at %d head %d: %.9g vs reference %.9g",
                                  (unsigned long long)seed, names[w], e->variant, i, pos, h,
                                  (double)lses[w][(size_t)tok * Hq + h], wt ? rlset[h] : rlse[h]);
            }
        }
    }
    /* The spare rows (and the whole LSE buffer when not asked) keep their NaN pattern. */
    for (int w = 0; w < 2; w++) {
        for (size_t j = (size_t)total * os * es; j < obytes; j++)
            cr_assert_eq((unsigned char)outs[w][j], 0xff, "seed %llu %s: extend wrote past total_q rows",
                         (unsigned long long)seed, names[w]);
        const unsigned char *lb = (const unsigned char *)lses[w];
        for (size_t j = want_lse ? (size_t)total * Hq * 4 : 0; j < lbytes; j++)
            cr_assert_eq(lb[j], 0xff, "seed %llu %s: LSE byte %zu written", (unsigned long long)seed, names[w], j);
    }
    if (nocu) { /* decode through extend: oscar_decode's very bytes */
        char *dec = malloc(obytes);
        rc_poison(dec, obytes);
        void *ddec = dev_upload(g, dec, obytes);
        oscar_backend_decode_args da = {.layer = LAYER, .cache = ga.cache, .batch = ga.batch, .q = dx.q, .q_stride = qs,
                                        .out = ddec, .out_stride = os, .sm_scale = sm,
                                        .rotated_output = rotated_output, .workspace = e->g_ws,
                                        .workspace_bytes = e->g_ws_bytes};
        cr_assert_eq(g->api->decode(g->ctx, e->g_plan, &da, &err), OSCAR_OK, "decode: %s", err.msg);
        dev_download(g, dec, ddec, obytes);
        cr_assert(!memcmp(dec, gob, obytes), "seed %llu %s (%s): extend with cu_q NULL differs from decode",
                  (unsigned long long)seed, g->api->name, e->variant);
        g->api->free(g->ctx, ddec);
        free(dec);
    }
    dev_ext_free(e, &dx);
    free(cu);
    free(q);
    free(clse);
    free(glse);
    free(qb);
    free(cob);
    free(gob);
    free(ref);
    free(reft);
    free(rlse);
    free(rlset);
    free(qt);
    free(rabs);
}

/* Query counts of one extend step: the tokens just appended (chunked
 * prefill), 1 where none were (a decode row in the same batch), or at
 * random anything up to the whole sequence (the chunk reaching back). */
#define EXT_MAX_Q 96 /* above the pages of the tests (16..64); keeps the float64 reference quick */
static void extend_counts(rc_rng *r, const rc_paged *b, const int *n, int *qn) {
    for (int i = 0; i < b->num_seqs; i++) {
        int L = b->seq_lens[i], cap = L < EXT_MAX_Q ? L : EXT_MAX_Q;
        qn[i] = n[i] > 0 ? (n[i] < cap ? n[i] : cap) : 1;
        if (rc_randint(r, 0, 3) == 0) qn[i] = rc_randint(r, 1, cap);
    }
}

/* Prefix reuse: sequences 1.. point their first block-table entries at
 * sequence 0's pages (all rows of the prefix are the same K/V, so the
 * references hold), and the pages they no longer use are poisoned on both
 * backends, so a read through the wrong id shows. Ends the scenario (the
 * poisoned pages break the cache comparison). */
static void check_shared_prefix(env *e, rc_paged *b, rc_seq_ref *refs, rc_rng *r, int share, uint64_t seed) {
    int P = e->l.page_size, S0 = b->l.method == OSCAR_METHOD_BF16 ? 0 : e->l.sink,
        W = b->l.method == OSCAR_METHOD_BF16 ? 0 : e->l.recent, minL = b->seq_lens[0];
    for (int i = 1; i < b->num_seqs; i++) minL = b->seq_lens[i] < minL ? b->seq_lens[i] : minL;
    /* whole pages of the prefix that are 2-bit (written) in every sequence */
    int np = (share - S0) / P, full = (minL - W - S0) / P;
    if (full < np) np = full;
    if (np < 1) return;
    size_t btn = (size_t)b->num_seqs * b->stride;
    int32_t *bt = malloc(btn * sizeof *bt);
    memcpy(bt, b->block_table, btn * sizeof *bt);
    char *poison = malloc(b->page_bytes);
    rc_poison(poison, b->page_bytes);
    oscar_errbuf err = {{0}};
    for (int i = 1; i < b->num_seqs; i++)
        for (int k = 0; k < np; k++) {
            int32_t own = bt[(size_t)i * b->stride + k];
            memcpy((char *)b->pages + (size_t)own * b->page_bytes, poison, b->page_bytes);
            cr_assert_eq(e->g->api->write(e->g->ctx, e->d_pages, (size_t)own * b->page_bytes, poison, b->page_bytes,
                                          NULL, &err),
                         OSCAR_OK);
            bt[(size_t)i * b->stride + k] = b->block_table[k];
        }
    fprintf(stderr, "shared prefix: %d pages of sequence 0 read by %d sequences\n", np, b->num_seqs);
    int *qn = malloc((size_t)b->num_seqs * sizeof *qn);
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < b->num_seqs; i++) qn[i] = rc_randint(r, 1, b->seq_lens[i] < 80 ? b->seq_lens[i] : 80);
        check_extend(e, b, bt, refs, r, qn, rep, EXT_LSE, seed);
    }
    free(qn);
    free(poison);
    free(bt);
}

enum { TOKENS = 0, CHUNKS = 1, PREFILL = 2 };

/* With feedback weights the reference's codes must differ from nearest
 * rounding's on most 2-bit rows, or matching them would prove nothing. */
static void check_feedback_matters(const env *e, const rc_seq_ref *refs, int nseq, uint64_t seed) {
    int d = e->l.head_dim, G = e->l.group, lm = e->l.method == OSCAR_METHOD_OSCAR2_LM;
    size_t rows = 0, changed = 0;
    uint8_t codes[64];
    float meta[16];
    for (int i = 0; i < nseq; i++)
        for (int p = e->l.sink; p < refs[i].Lmax; p++)
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < refs[i].H; h++) {
                    size_t row = (size_t)p * refs[i].H + h;
                    oscar_ref_quantize_row(d, G, lm, refs[i].clip[kv][h], e->l.meta_dtype, refs[i].rot[kv] + row * d,
                                           codes, meta);
                    changed += memcmp(codes, refs[i].codes[kv] + row * d / 4, (size_t)d / 4) != 0;
                    rows++;
                }
    if (rows) fprintf(stderr, "feedback changed the codes of %zu of %zu rows\n", changed, rows);
    cr_assert_geq(changed * 4, rows * 3, "seed %llu: feedback changed the codes of only %zu of %zu rows",
                  (unsigned long long)seed, changed, rows);
}

/* Rows whose values sit exactly on the boundaries between two levels (a
 * group of {0, 3s} extremes gives a = s, b = 0; values 0.5s, 1.5s, 2.5s are
 * ties, s a power of two: exact in bf16/f16), so a code rule that is off by
 * one ulp anywhere shows. 15% of each group at 3s keeps clips >= 0.85 from
 * moving the extremes. Every third row of each sequence. */
static void plant_ties(rc_rng *r, float *x, int n_tokens, int H, int d) {
    static const float pat[20] = {3, 3, 3, 0, 0.5f, 1.5f, 2.5f, 1, 2, 0.5f, 1.5f, 2.5f, 0.5f, 1.5f, 2.5f, 1, 2, 0, 0.5f, 2.5f};
    for (int t = 0; t < n_tokens; t += 3)
        for (int h = 0; h < H; h++) {
            float s = ldexpf(1.0f, rc_randint(r, -3, 3));
            int off = rc_randint(r, 0, 19);
            for (int j = 0; j < d; j++) x[((size_t)t * H + h) * d + j] = s * pat[(j + off) % 20];
        }
}

/* Zeros of both signs (ties 2): every other row holds -0 and +0 in random order beside positive values,
 * every sixth is zeros only, so a group's minimum (and an all-zero group's maximum) is a zero whose
 * sign fminf/fmaxf and the reference's compares chose differently: the stored bias's sign bit
 * differed from the CPU's on OpenCL (FORMAT.md §2.2 now takes +0). */
static void plant_signed_zeros(rc_rng *r, float *x, int n_tokens, int H, int d) {
    for (int t = 0; t < n_tokens; t += 2)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < d; j++) {
                float *e = &x[((size_t)t * H + h) * d + j];
                const int z = t % 6 == 0 || rc_randint(r, 0, 9) < 6;
                *e = z ? (rc_randint(r, 0, 1) ? -0.0f : 0.0f) : fabsf(*e);
            }
}

/* Lloyd-Max's middle threshold (ties 3): groups of 15 x +2^18, 15 x -2^18 and +-2^-133 (bf16's least
 * denormal) in shuffled places, so the mean b is (about) 0, a ~ 2.5e5 and the tiny negative value's
 * t = (x - b) / a underflows to -0: the reference's code 2, where the kernels' threshold -0 gave 1
 * (F32 metadata; an identity plan so the rows reach the codes as planted). Every other row. */
static void plant_lm_underflow(rc_rng *r, float *x, int n_tokens, int H, int d, int G) {
    for (int t = 0; t < n_tokens; t += 2)
        for (int h = 0; h < H; h++)
            for (int g0 = 0; g0 < d; g0 += G) {
                float *e = &x[((size_t)t * H + h) * d + g0];
                for (int j = 0; j < G; j++)
                    e[j] = j < 2 ? (j ? ldexpf(1.0f, -133) : -ldexpf(1.0f, -133))
                                 : (j % 2 ? ldexpf(1.0f, 18) : -ldexpf(1.0f, 18));
                for (int j = G - 1; j > 0; j--) { /* shuffle */
                    const int k = rc_randint(r, 0, j);
                    const float tmp = e[j];
                    e[j] = e[k], e[k] = tmp;
                }
            }
}

/* ext: an extend check after every append (extend_counts); share > 0: the
 * first `share` tokens of K/V are the same in every sequence, and the run ends
 * with check_shared_prefix; ties: plant_ties in the K/V rows. */
/* New tokens of the next append of a schedule (TOKENS: one each, PREFILL: the rest, CHUNKS: random up to
 * a page and a window); 0 when every sequence has reached its final length. */
static int next_counts(rc_rng *r, const cfg *c, const rc_paged *b, const int *final_lens, int mode, int *n) {
    int any = 0;
    for (int i = 0; i < b->num_seqs; i++) {
        int rem = final_lens[i] - b->seq_lens[i];
        if (mode == TOKENS) n[i] = rem > 0;
        else if (mode == PREFILL) n[i] = rem;
        else n[i] = rem > 0 ? rc_randint(r, 0, rem < c->P + c->W + 5 ? rem : c->P + c->W + 5) : 0;
        if (b->seq_lens[i] == 0 && n[i] == 0) n[i] = 1;
        any |= n[i] > 0;
    }
    return any;
}

/* The schedule of run_scenario_x in the plan of e, layer LAYER, with pools of its own (unbound at the end). */
static void scenario_body(env *e, rc_rng *r, uint64_t seed, const cfg *c, int nseq, const int *final_lens, int mode,
                          int fb, int ext, int share, int ties) {
    size_t H = (size_t)c->H, d = (size_t)c->d;
    float **K = malloc((size_t)nseq * sizeof *K), **V = malloc((size_t)nseq * sizeof *V);
    rc_seq_ref *refs = calloc((size_t)nseq, sizeof *refs);
    int32_t *maxl = malloc((size_t)nseq * sizeof *maxl);
    for (int i = 0; i < nseq; i++) {
        cr_assert(final_lens[i] >= 1 && final_lens[i] <= 100000);
        maxl[i] = final_lens[i];
        K[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        V[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        rc_gen_kv(r, final_lens[i], (int)H, (int)d, 3, c->kv, K[i]);
        rc_gen_kv(r, final_lens[i], (int)H, (int)d, 2, c->kv, V[i]);
        if (ties == 3) {
            plant_lm_underflow(r, K[i], final_lens[i], (int)H, (int)d, c->G);
            plant_lm_underflow(r, V[i], final_lens[i], (int)H, (int)d, c->G);
        } else if (ties == 2) {
            plant_signed_zeros(r, K[i], final_lens[i], (int)H, (int)d);
            plant_signed_zeros(r, V[i], final_lens[i], (int)H, (int)d);
        } else if (ties) {
            plant_ties(r, K[i], final_lens[i], (int)H, (int)d);
            plant_ties(r, V[i], final_lens[i], (int)H, (int)d);
        }
        if (i > 0 && share > 0) {
            size_t nsh = (size_t)(share < final_lens[i] ? share : final_lens[i]) * H * d;
            cr_assert(share <= final_lens[0]);
            memcpy(K[i], K[0], nsh * sizeof(float));
            memcpy(V[i], V[0], nsh * sizeof(float));
        }
        cr_assert_eq(rc_seq_ref_build_fb(&e->l, layer_rot(e, 0), layer_rot(e, 1), layer_fb(e, 0), layer_fb(e, 1),
                                         e->num_rot, e->clip_k + LAYER * e->l.num_kv_heads, e->clip_v + LAYER * e->l.num_kv_heads, final_lens[i], K[i], V[i],
                                         &refs[i]),
                     0);
    }
    if (fb) check_feedback_matters(e, refs, nseq, seed);
    rc_paged b;
    cr_assert_eq(rc_paged_init(r, &e->l, nseq, maxl, 3, &b), 0);
    env_bind_pools(e, &b);
    int *n = malloc((size_t)nseq * sizeof *n), steps = 0;
    const char *what = mode == TOKENS ? "token by token" : mode == CHUNKS ? "chunks" : "prefill";
    for (;;) {
        if (!next_counts(r, c, &b, final_lens, mode, n)) break;
        do_append(e, &b, K, V, n, rc_randint(r, 0, 1) * 16, seed);
        /* Token by token: check every few steps (PoCL under ASan is slow). */
        if (mode != TOKENS || steps % 7 == 0) check_cache(e, &b, refs, seed, what);
        if (mode != TOKENS || steps % 23 == 0) check_decode(e, &b, refs, r, 0, seed);
        if (ext) {
            int *qn = malloc((size_t)nseq * sizeof *qn);
            extend_counts(r, &b, n, qn);
            check_extend(e, &b, NULL, refs, r, qn, steps & 1, steps % 3 ? EXT_LSE : 0, seed);
            free(qn);
        }
        steps++;
    }
    check_cache(e, &b, refs, seed, what);
    check_decode(e, &b, refs, r, 0, seed);
    check_decode(e, &b, refs, r, 1, seed);
    if (ext) {
        int *ones = malloc((size_t)nseq * sizeof *ones);
        for (int i = 0; i < nseq; i++) ones[i] = 1;
        check_extend(e, &b, NULL, refs, r, ones, 0, EXT_LSE | EXT_NOCU, seed);
        check_extend(e, &b, NULL, refs, r, ones, 1, EXT_LSE, seed);
        free(ones);
    }
    if (share > 0) check_shared_prefix(e, &b, refs, r, share, seed);
    for (int i = 0; i < nseq; i++) {
        free(K[i]);
        free(V[i]);
        rc_seq_ref_free(&refs[i]);
    }
    free(K);
    free(V);
    free(refs);
    free(maxl);
    free(n);
    rc_paged_free(&b);
    env_unbind_pools(e);
}

static void run_scenario_x(plug *g, const cfg *c, int nseq, const int *final_lens, int mode, int fb, int ext,
                           int share, int ties) {
    cr_assert(nseq >= 1 && nseq <= 64);
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    int maxlen = 1;
    for (int i = 0; i < nseq; i++) maxlen = final_lens[i] > maxlen ? final_lens[i] : maxlen;
    env e;
    /* extend checks need workspace for every query token of a step */
    if (!env_init(&e, g, c, &r, seed, ext ? nseq * EXT_MAX_Q : nseq, maxlen, fb)) return;
    scenario_body(&e, &r, seed, c, nseq, final_lens, mode, fb, ext, share, ties);
    env_free(&e);
}

static void run_scenario_fb(plug *g, const cfg *c, int nseq, const int *final_lens, int mode, int fb) {
    run_scenario_x(g, c, nseq, final_lens, mode, fb, 0, 0, 0);
}

static void run_scenario(plug *g, const cfg *c, int nseq, const int *final_lens, int mode) {
    run_scenario_fb(g, c, nseq, final_lens, mode, 0);
}

static int boundary_lens(const cfg *c, int *out) {
    int S = c->S0 + c->W, P = c->P, n = 0;
    int cand[] = {1, c->S0 - 1, c->S0, S - 1, S, S + 1, S + P - 1, S + P + 1, S + 2 * P + 3};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
        if (cand[i] >= 1) out[n++] = cand[i];
    return n;
}

static void run_boundaries(plug *g, const cfg *c) {
    int lens[16];
    int n = boundary_lens(c, lens);
    run_scenario(g, c, n, lens, TOKENS);
    run_scenario(g, c, n, lens, CHUNKS);
    run_scenario(g, c, n, lens, PREFILL);
}

/* GQA 4, uniform levels, small windows, page 16: every schedule, every region boundary. */
Test(conformance, oscar2_d64_g32_all_schedules, .timeout = 600) {
    cfg c = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, run_boundaries(&g, &c));
}
/* Lloyd-Max, per-head rotations, f16 windows, f32 and f16 metadata, GQA 4 and 8. */
Test(conformance, lloyd_max_f16_f32_meta, .timeout = 600) {
    cfg c = {128, 64, 32, 3, 5, 4, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0};
    cfg c2 = {64, 64, 16, 2, 6, 16, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    FOR_EACH_BACKEND(g, {
        run_boundaries(&g, &c);
        run_boundaries(&g, &c2);
    });
}
/* W = 0 (no recent window), no sink, INT2 and QUAROT2 (no clip), GQA 1. */
Test(conformance, no_windows_int2_quarot2, .timeout = 600) {
    cfg c = {64, 32, 16, 5, 0, 4, 4, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 16, 0, 0, 2, 2, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c3 = {128, 32, 64, 2, 9, 8, 2, OSCAR_METHOD_QUAROT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        int lens[] = {1, 5, 6, 21, 40};
        run_scenario(&g, &c, 5, lens, CHUNKS);
        run_scenario(&g, &c2, 5, lens, PREFILL);
        run_boundaries(&g, &c3);
    });
}
/* Values exactly on level boundaries: the kernels' codes (three compares
 * against per-group thresholds) must equal the reference's division rule
 * there too; nearest rounding and error feedback, groups 32 and 128. */
Test(conformance, level_boundary_ties, .timeout = 600) {
    cfg c = {128, 32, 16, 4, 12, 4, 2, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 16, 0, 8, 2, 1, OSCAR_METHOD_INT2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0};
    FOR_EACH_BACKEND(g, {
        int lens[] = {3, 40, 77};
        run_scenario_x(&g, &c, 3, lens, CHUNKS, 0, 0, 0, 1);
        run_scenario_x(&g, &c2, 3, lens, PREFILL, 0, 0, 0, 1);
        run_scenario_x(&g, &c, 3, lens, CHUNKS, 1, 0, 0, 1);
        run_scenario_x(&g, &c, 3, lens, CHUNKS, 0, 0, 0, 2); /* zeros of both signs */
        run_scenario_x(&g, &c2, 3, lens, PREFILL, 0, 0, 0, 2);
        cfg lm = {64, 32, 16, 4, 12, 4, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F32, 0};
        force_identity = 1;
        run_scenario_x(&g, &lm, 3, lens, CHUNKS, 0, 0, 0, 3);
        force_identity = 0;
    });
}
/* The BF16 method (16-bit pages, no windows): the library's own yardstick. */
Test(conformance, bf16_method_paged16, .timeout = 600) {
    cfg c = {128, 128, 16, 64, 256, 8, 2, OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 32, 0, 0, 8, 1, OSCAR_METHOD_BF16, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        int lens[] = {1, 15, 16, 17, 49};
        run_scenario(&g, &c, 5, lens, TOKENS);
        run_scenario(&g, &c, 5, lens, PREFILL);
        run_scenario(&g, &c2, 5, lens, CHUNKS);
    });
}
/* Default-like shapes: d 256 and 128, page 64, large windows, long prefill in
 * one append, one long sequence alone (several decode splits), GQA 8. */
Test(conformance, large_shapes_long_prefill_splits, .timeout = 600) {
    cfg c = {256, 128, 64, 64, 256, 16, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {128, 128, 64, 64, 256, 8, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c3 = {128, 128, 16, 4, 32, 8, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        int lens[] = {1, 63, 320, 321, 449};
        run_scenario(&g, &c, 5, lens, PREFILL);
        int one[] = {2500};
        run_scenario(&g, &c2, 1, one, PREFILL);
        run_scenario(&g, &c3, 1, one, CHUNKS);
    });
}

/* Error-feedback rounding (parameters with fb_k/fb_v): the append kernels
 * must carry each value's rounding error into the later values exactly as
 * the reference does, so codes match it like nearest rounding's do (a
 * boundary case ends the row's comparison: refcheck.h). Per-head and shared
 * rotations, groups 32/64/128, uniform and Lloyd-Max levels, bf16/f16
 * windows, f16/f32 metadata (f32: not in the CUDA default set), pages 16-64;
 * demotion from the recent window (small W, token by token) and direct
 * stores (prefill, chunks). */
Test(conformance, error_feedback_rounding, .timeout = 900) {
    cfg c = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c2 = {128, 64, 32, 3, 5, 4, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0};
    cfg c3 = {128, 128, 64, 64, 256, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c4 = {256, 128, 16, 4, 32, 16, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c5 = {128, 32, 32, 3, 29, 8, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c6 = {128, 64, 16, 3, 5, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    /* no windows: every new row goes straight to 2 bits with feedback (CUDA: the store warp of the
     * warp write path runs the chain, as the demote warp does with windows) */
    cfg c7 = {128, 128, 32, 0, 0, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    FOR_EACH_BACKEND(g, {
        int lens[16];
        int n = boundary_lens(&c, lens);
        run_scenario_fb(&g, &c, n, lens, TOKENS, 1);
        run_scenario_fb(&g, &c, n, lens, CHUNKS, 1);
        int l2[] = {1, 3, 9, 31, 40, 77};
        run_scenario_fb(&g, &c2, 6, l2, CHUNKS, 1);
        int l3[] = {1, 63, 320, 321, 449};
        run_scenario_fb(&g, &c3, 5, l3, PREFILL, 1);
        /* the default shape in chunks: the CUDA tile write path where it is forced */
        int l3c[] = {2, 70, 321, 330};
        run_scenario_fb(&g, &c3, 4, l3c, CHUNKS, 1);
        int l4[] = {5, 36, 37, 90};
        run_scenario_fb(&g, &c4, 4, l4, CHUNKS, 1);
        int l5[] = {1, 32, 33, 100, 170};
        run_scenario_fb(&g, &c5, 5, l5, TOKENS, 1);
        run_scenario_fb(&g, &c6, 6, l2, CHUNKS, 1);
        int l7[] = {1, 31, 33, 70};
        run_scenario_fb(&g, &c7, 4, l7, TOKENS, 1);
    });
}

/* CUDA's shared-F warp write path (templates/append.jinja append_wk, append_wk8: K tokens of one row
 * kind and head per CTA, F copied into shared memory once per CTA, named barriers per token), forced
 * by $OSCAR_APPEND_WK with $OSCAR_APPEND_WF_CTAS=0 (else small grids keep the one-token instance;
 * docs/API.md): K = 3 (a pair past the last token in the last CTA), 8 (the 64-register instance,
 * five pairs idle) and 1; demotions token by token and in chunks, Lloyd-Max levels, no windows (the
 * store warps' chains), nearest rounding (F absent). Other backends run the scenarios once. */
Test(conformance, shared_f_warp_write_path, .timeout = 900) {
    cfg c5 = {128, 32, 32, 3, 29, 8, 2, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c6 = {128, 64, 16, 3, 5, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    cfg c7 = {128, 128, 32, 0, 0, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    const int l5[] = {1, 32, 33, 100, 170}, l6[] = {3, 9, 31, 40}, l7[] = {1, 31, 33, 70};
    static const char *const ks[] = {"3", "8", "1"};
    setenv("OSCAR_APPEND_WF_CTAS", "0", 1);
    FOR_EACH_BACKEND(g, {
        for (int k = 0; k < (strcmp(k_backends[bi_], "cuda") ? 1 : 3); k++) {
            setenv("OSCAR_APPEND_WK", ks[k], 1);
            run_scenario_fb(&g, &c5, 5, l5, TOKENS, 1);
            run_scenario_fb(&g, &c6, 4, l6, TOKENS, 1);
            run_scenario_fb(&g, &c6, 4, l6, CHUNKS, 1);
            run_scenario_fb(&g, &c6, 4, l6, TOKENS, 0);
            run_scenario_fb(&g, &c7, 4, l7, TOKENS, 1);
        }
    });
    unsetenv("OSCAR_APPEND_WK");
    unsetenv("OSCAR_APPEND_WF_CTAS");
}

/* ---------------------------------------------------------- device flags */
/* The tensor-core decode family (CUDA: templates/decode_tc.jinja) at d 128
 * GQA 4: groups 128, 64 and 32, BF16 and F16 windows, per-head rotations,
 * lengths below S0 + W, not a multiple of the page or of the 32-token tile,
 * mixed in one batch, and one long sequence over several splits. */
Test(conformance, d128_gqa4_tensor_core_shapes, .timeout = 900) {
    cfg c = {128, 128, 64, 64, 256, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {128, 64, 16, 3, 29, 4, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 1};
    cfg c3 = {128, 32, 32, 0, 0, 8, 2, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        int lens[] = {1, 63, 320, 321, 449, 1111};
        run_scenario(&g, &c, 6, lens, PREFILL);
        int one[] = {3001};
        run_scenario(&g, &c, 1, one, CHUNKS);
        int l2[] = {1, 3, 31, 32, 33, 100, 517};
        run_scenario(&g, &c2, 7, l2, CHUNKS);
        run_scenario(&g, &c3, 7, l2, PREFILL);
    });
}

/* The limb-packed tensor-core decode (CUDA's default for plans of at most 4 query
 * heads per KV head, templates/decode_tc.jinja LP; set here so an environment with
 * OSCAR_DECODE_LP=0 cannot skip it) on every head_dim,
 * group and metadata width it serves, GQA 1 to 4, partial tiles, lengths below
 * S0 + W and several splits. Other backends ignore the switch and run the case
 * as any other. */
Test(conformance, limb_packed_decode, .timeout = 900) {
    setenv("OSCAR_DECODE_LP", "1", 1);
    expect_cuda_variant = "_lp_tc";
    static const int shp[][4] = {{128, 128, 8, 2}, {128, 32, 6, 2}, {64, 64, 4, 4}, {256, 128, 4, 2}, {128, 64, 3, 1}};
    FOR_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof shp / sizeof shp[0]; z++) {
            /* pages of 16 tokens (vLLM's default block) on every other shape: a 32-token tile then
             * spans two pages (the tile copies' own path) */
            cfg c = {shp[z][0], shp[z][1], z % 2 ? 32 : 16, 16, 48, shp[z][2], shp[z][3], OSCAR_METHOD_OSCAR2,
                     z == 4 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16,
                     (int)(z & 1)};
            int lens[] = {1, 40, 64, 65, 97, 211, 1300};
            run_scenario(&g, &c, 7, lens, PREFILL);
        }
    });
}

/* Every GQA ratio and head_dim of the model zoo (perf/RESULTS-attention.md):
 * 32/8/128 (ratio 4), 64/8/128 (8), 96/8/128 (12), 64/4/128 (16), 28/4/128 (7),
 * 24/8/128 (3), MHA (1), 16/8/256 (2), 32/8/64 (4), 20 query heads on one
 * KV head (above the 16 one CTA holds: several CTAs per KV head) and GQA 12 at
 * d 64 (the 16-head variant there, and its 3-CTA twin when forced). KV heads are
 * fewer than the real models' (the ratio and head_dim are what select and
 * shape the kernels) to keep the CPU reference quick; 96/8 runs at full size.
 * 2-bit (uniform) and the BF16 method, mixed lengths below and above S0 + W,
 * not multiples of the page, one sequence long enough for several splits; pages of
 * 32 tokens, of 16 on every third shape (two pages per 32-token tile). */
Test(conformance, model_zoo_shapes, .timeout = 1200) {
    static const int zoo[][3] = {{8, 2, 128}, {16, 2, 128}, {96, 8, 128}, {32, 2, 128}, {14, 2, 128},
                                 {6, 2, 128}, {2, 2, 128}, {4, 2, 256}, {8, 2, 64}, {20, 1, 128}, {24, 2, 64}};
    FOR_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof zoo / sizeof zoo[0]; z++) {
            int d = zoo[z][2], G = d == 64 ? 64 : 128;
            cfg c = {d, G, z % 3 == 1 ? 16 : 32, 16, 48, zoo[z][0], zoo[z][1], OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16,
                     OSCAR_DTYPE_F16, (int)(z & 1)};
            int lens[] = {1, 40, 63, 64, 65, 211, 1300};
            run_scenario(&g, &c, 7, lens, PREFILL);
            cfg c16 = {d, G, 16, 0, 0, zoo[z][0], zoo[z][1], OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
            int l16[] = {1, 17, 300, 1025};
            run_scenario(&g, &c16, 4, l16, PREFILL);
        }
    });
}

/* Shapes no model zoo entry names (a vendor's next model): GQA ratios 3, 5, 6,
 * 7, 8, 10, 12, 20, 24, 32, 40 and 64, odd KV head counts 1, 3, 5 and 7, every
 * head_dim, every page size, 2-bit and BF16; lengths 1, around S0 + W = 64
 * and the page boundaries after it, and one over several splits; prefill,
 * chunks and token by token; extend beside decode on every other shape. */
Test(conformance, unseen_gqa_shapes, .timeout = 1200) {
    static const int shp[][3] = {{21, 7, 64}, {40, 5, 128}, {30, 5, 256}, {21, 3, 256}, {20, 2, 64}, {36, 3, 128},
                                 {20, 1, 256}, {24, 1, 64}, {32, 1, 128}, {40, 1, 64}, {64, 1, 128}, {3, 3, 128}};
    static const int pages[] = {16, 32, 64, 128};
    static const int modes[] = {PREFILL, CHUNKS, TOKENS};
    FOR_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof shp / sizeof shp[0]; z++) {
            int d = shp[z][2], P = pages[z % 4];
            cfg c = {d, d == 64 ? 32 : 128, P, 16, 48, shp[z][0], shp[z][1],
                     z % 3 == 2 ? OSCAR_METHOD_BF16 : OSCAR_METHOD_OSCAR2, z & 2 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16,
                     OSCAR_DTYPE_F16, (int)(z & 1)};
            int lens[] = {1, 63, 64, 65, 64 + P - 1, 64 + P, 64 + 2 * P + 1, z % 4 == 0 ? 900 : 200};
            int mode = modes[z % 3];
            run_scenario_x(&g, &c, 8, lens, mode == TOKENS ? CHUNKS : mode, 0, (int)(z & 1), 0, 0);
            if (mode == TOKENS) { /* token by token is slow on the reference: short sequences only */
                int short_lens[] = {1, 63, 64, 65, 64 + P + 1};
                run_scenario_x(&g, &c, 5, short_lens, TOKENS, 0, 0, 0, 0);
            }
        }
    });
}

/* A large ragged batch (64 sequences, the most one scenario holds): lengths
 * 1 to 700 in a fixed shuffle, so sequences of every region mix in one
 * call's grid and split plan; GQA 5 on 3 KV heads at d 64, page 16. */
/* Head dims that are not powers of two (FORMAT.md 3.5, refcheck.h rc_other_dim_shapes), every method,
 * against the reference codec and the CPU backend: lengths around sink + recent and pages not full,
 * mixed in one batch, every schedule at 96 and 80, extend with error feedback at 96. CUDA and HIP
 * skip the shapes their default set lacks (groups other than the default, F32 metadata:
 * gen/variants.json other_dims); every_head_dim_default_group below covers what they hold. */
Test(conformance, head_dims_not_powers_of_two, .timeout = 1200) {
    FOR_EACH_BACKEND(g, {
        run_boundaries(&g, &rc_other_dim_shapes[0]);
        run_boundaries(&g, &rc_other_dim_shapes[1]);
        int lens[16];
        int n = boundary_lens(&rc_other_dim_shapes[0], lens);
        run_scenario_x(&g, &rc_other_dim_shapes[0], n, lens, CHUNKS, 1, 1, 0, 0);
        for (int i = 2; i < RC_OTHER_DIM_SHAPES; i++) {
            n = boundary_lens(&rc_other_dim_shapes[i], lens);
            run_scenario(&g, &rc_other_dim_shapes[i], n, lens, CHUNKS);
        }
    });
}

/* Every head_dim of the format that is not a power of two at its default group (oscar_group_default) with
 * F16 metadata: what the default CUDA and HIP builds hold for them (gen/variants.json other_dims: the
 * generic decode/extend family and the block-wide write kernels), so no backend may refuse one. The
 * methods and window dtypes rotate over the dims; feedback on the OSCAR2 shapes; appends in chunks to
 * mixed lengths around sink + recent, pages checked bit for bit, decode and extend after each. CUDA must take
 * the tensor-core family (every head_dim and group of the format: gen/oscar_gen.py tc_other_shape) except
 * for Lloyd-Max levels, which take a generic variant ("_q<cap>_"). */
Test(conformance, every_head_dim_default_group, .timeout = 900) {
    static const int dims[] = {32, 48, 80, 96, 112, 144, 160, 176, 192, 208, 224, 240};
    static const oscar_method ms[] = {OSCAR_METHOD_OSCAR2, OSCAR_METHOD_OSCAR2_LM, OSCAR_METHOD_BF16,
                                      OSCAR_METHOD_QUAROT2};
    require_variant = 1;
    expect_cuda_variant = "_q";
    FOR_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof dims / sizeof dims[0]; z++) {
            const oscar_method m = ms[z % 4];
            /* GQA 1, 3 (a capacity not compiled) and 8 (several CTAs per KV head at capacity 4) */
            const int gq = z % 3 == 0 ? 1 : z % 3 == 1 ? 3 : 8;
            cfg c = {dims[z], oscar_group_default(dims[z]), z % 2 ? 32 : 16, 4, 8, 2 * gq, 2, m,
                     z % 2 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, (int)(z % 5 == 0)};
            const int tc = m != OSCAR_METHOD_OSCAR2_LM;
            expect_cuda_variant = tc ? "_tc" : "_q";
            int lens[16];
            const int n = boundary_lens(&c, lens);
            run_scenario_x(&g, &c, n, lens, CHUNKS, m == OSCAR_METHOD_OSCAR2, 1, 0, 0);
        }
    });
}

/* The tensor-core decode at head dims that are not powers of two, at their default groups: d 32, 96, 192
 * (groups of 2 and 6 code words: a group of 6 takes the general V map), d 48, 80, 112, 160, 240 (groups of 3,
 * 5, 7, 5 and 15 words: an odd count ends each group's scores with a 16-dim k-step, and one m-tile of the
 * group has rows on both V halves); the BF16 method at d 48, 80, 96, 112, 160, 224: GQA 1 (limb-packed),
 * 5 (8 columns) and 12 (16 columns), pages of 16, 32 and 64 tokens (the two-page, one-page and general tile
 * copies), lengths below and above S0 + W, off the page, one over several splits; feedback on every other
 * shape; CUDA must take the tensor-core variant. */
Test(conformance, tensor_core_other_dims, .timeout = 1200) {
    static const int shp[][3] = {{96, 1, 16},  {96, 5, 32},  {96, 12, 64}, {32, 5, 16},  {32, 12, 32},
                                 {192, 1, 64}, {192, 12, 16}, {80, 1, 32},  {80, 12, 16}, {160, 5, 64},
                                 {48, 5, 16},  {112, 12, 32}, {240, 1, 16}, {240, 12, 64}};
    require_variant = 1;
    expect_cuda_variant = "_tc";
    FOR_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof shp / sizeof shp[0]; z++) {
            const int d = shp[z][0], gq = shp[z][1], P = shp[z][2];
            cfg c = {d, oscar_group_default(d), P, 16, 48, 2 * gq, 2, z % 3 == 1 ? OSCAR_METHOD_QUAROT2 : OSCAR_METHOD_OSCAR2,
                     z & 1 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, (int)(z & 1)};
            int lens[] = {1, 40, 63, 64, 65, 64 + P + 3, 211, 1300};
            run_scenario_x(&g, &c, 8, lens, PREFILL, (int)(z % 2 == 0), 1, 0, 0);
        }
        static const int bd[] = {96, 160, 224, 48, 80, 112};
        for (size_t z = 0; z < sizeof bd / sizeof bd[0]; z++) {
            cfg c16 = {bd[z], bd[z], 16 << (z % 3), 0, 0, z % 3 == 1 ? 24 : 4, 2, OSCAR_METHOD_BF16,
                       z & 1 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
            int l16[] = {1, 17, 300, 1025};
            run_scenario_x(&g, &c16, 4, l16, PREFILL, 0, 1, 0, 0);
        }
    });
}

Test(conformance, large_ragged_batch, .timeout = 900) {
    cfg c = {64, 32, 16, 16, 48, 15, 3, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    int lens[64];
    for (int i = 0; i < 64; i++) lens[i] = 1 + (int)(((unsigned)i * 2654435761u >> 7) % 700u);
    lens[5] = 64, lens[17] = 65, lens[40] = 1;
    FOR_EACH_BACKEND(g, run_scenario_x(&g, &c, 64, lens, PREFILL, 0, 1, 0, 0));
}

static void flag_case(plug *g, oscar_method m) {
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    cfg c = {64, 32, 16, 4, 8, 8, 2, m, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    env e;
    if (!env_init(&e, g, &c, &r, seed, 2, 200, 0)) return;
    int32_t maxl[2] = {100, 100};
    rc_paged b;
    cr_assert_eq(rc_paged_init(&r, &e.l, 2, maxl, 3, &b), 0);
    env_bind_pools(&e, &b);
    float *K[2], *V[2];
    for (int i = 0; i < 2; i++) {
        K[i] = malloc(100 * 2 * 64 * sizeof(float));
        V[i] = malloc(100 * 2 * 64 * sizeof(float));
        rc_gen_kv(&r, 100, 2, 64, 2, c.kv, K[i]);
        rc_gen_kv(&r, 100, 2, 64, 2, c.kv, V[i]);
    }
    int n[2] = {60, 70};
    do_append(&e, &b, K, V, n, 0, seed);
    oscar_errbuf err = {{0}};
    /* Bad page id, then bad window slot, then a NaN row: each raises its flag. */
    for (int which = 0; which < 3; which++) {
        if (m == OSCAR_METHOD_BF16 && which == 1) continue; /* no windows */
        rc_paged bb = b;
        int32_t *bt = malloc((size_t)b.num_seqs * b.stride * 4), *slots = malloc((size_t)b.num_slots * 4);
        memcpy(bt, b.block_table, (size_t)b.num_seqs * b.stride * 4);
        memcpy(slots, b.window_slots, (size_t)b.num_slots * 4);
        int32_t lens[2] = {b.seq_lens[0] + 1, b.seq_lens[1] + 1};
        int last = rc_pages_for(&e.l, lens[1]) - 1;
        if (which == 0) bt[(size_t)1 * b.stride + (last > 0 ? last : 0)] = which == 0 ? b.num_pages + 7 : -1;
        if (which == 1) slots[0] = b.num_slots + 3;
        bb.block_table = bt;
        bb.window_slots = slots;
        bb.seq_lens = lens;
        dev_batch db;
        oscar_batch dbt = dev_batch_of(&e, &bb, &db);
        int32_t cu[3] = {0, 1, 2};
        size_t row = (size_t)e.l.num_kv_heads * 64 * 2;
        uint16_t *kv = malloc(2 * row);
        for (size_t j = 0; j < row; j++) kv[j] = 0x3f80; /* 1.0 in bf16 */
        if (which == 2) kv[5] = 0x7fc0;                  /* NaN */
        void *dcu = dev_upload(g, cu, sizeof cu), *dk = dev_upload(g, kv, 2 * row);
        oscar_backend_append_args ga = {.layer = LAYER, .cache = {e.d_pages, b.num_pages, e.d_windows, b.num_slots},
                                        .batch = dbt, .cu_new = dcu, .total_new = 2, .k = dk, .v = dk,
                                        .kv_stride = (int64_t)e.l.num_kv_heads * 64, .workspace = e.g_ws,
                                        .workspace_bytes = e.g_ws_bytes};
        cr_assert_eq(g->api->append(g->ctx, e.g_plan, &ga, &err), OSCAR_OK);
        oscar_status want = which == 2 ? OSCAR_ERR_NONFINITE : OSCAR_ERR_BLOCK_TABLE;
        oscar_status got = g->api->check(g->ctx, e.g_plan, e.g_ws, NULL, &err);
        if (which == 0 && last < 0) want = OSCAR_OK;
        cr_assert_eq(got, want, "seed %llu %s method %d case %d: check returned %d, want %d (%s)",
                     (unsigned long long)seed, g->api->name, (int)m, which, (int)got, (int)want, err.msg);
        /* The flag is cleared by check. */
        cr_assert_eq(g->api->check(g->ctx, e.g_plan, e.g_ws, NULL, &err), OSCAR_OK);
        /* Decode with a bad block table raises the flag as well (no crash, no stray read). */
        if (which != 2) {
            size_t qb = (size_t)2 * e.l.num_q_heads * 64 * 2;
            uint16_t *qq = calloc(1, qb);
            void *dq = dev_upload(g, qq, qb), *dout = dev_alloc(g, qb);
            free(qq);
            oscar_backend_decode_args da = {.layer = LAYER,
                                            .cache = {e.d_pages, b.num_pages, e.d_windows, b.num_slots},
                                            .batch = dbt, .q = dq, .q_stride = (int64_t)e.l.num_q_heads * 64,
                                            .out = dout, .out_stride = (int64_t)e.l.num_q_heads * 64,
                                            .sm_scale = 0.125f, .workspace = e.g_ws, .workspace_bytes = e.g_ws_bytes};
            cr_assert_eq(g->api->decode(g->ctx, e.g_plan, &da, &err), OSCAR_OK);
            got = g->api->check(g->ctx, e.g_plan, e.g_ws, NULL, &err);
            if (!(which == 0 && last < 0))
                cr_assert_eq(got, OSCAR_ERR_BLOCK_TABLE, "seed %llu %s: decode over a bad %s did not raise the flag",
                             (unsigned long long)seed, g->api->name, which == 0 ? "page id" : "window slot");
            g->api->free(g->ctx, dq);
            g->api->free(g->ctx, dout);
        }
        g->api->free(g->ctx, dcu);
        g->api->free(g->ctx, dk);
        dev_batch_free(&e, &db);
        free(kv);
        free(bt);
        free(slots);
    }
    for (int i = 0; i < 2; i++) {
        free(K[i]);
        free(V[i]);
    }
    rc_paged_free(&b);
    env_free(&e);
}

Test(conformance, device_error_flags, .timeout = 300) {
    FOR_EACH_BACKEND(g, {
        flag_case(&g, OSCAR_METHOD_OSCAR2);
        flag_case(&g, OSCAR_METHOD_BF16);
    });
}

/* Plans refuse what the format does not allow, with a message. */
Test(conformance, plan_refuses_bad_layouts) {
    FOR_EACH_BACKEND(g, {
        oscar_layout_desc l = {sizeof l, 100, 20, 8, 2, 16, 4, 8, 1000, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16,
                               OSCAR_METHOD_INT2}; /* head_dim 100: not a multiple of 16 */
        oscar_backend_plan_desc pd = {.layout = l, .num_layers = 1, .num_rot = 1, .identity_rotation = 1};
        void *plan = NULL;
        oscar_errbuf err = {{0}};
        cr_assert_eq(g.api->plan_create(g.ctx, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
        pd.layout.head_dim = 64;
        pd.layout.group = 48;
        cr_assert_eq(g.api->plan_create(g.ctx, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED_GROUP);
        pd.layout.group = 32;
        pd.layout.page_size = 24;
        cr_assert_neq(g.api->plan_create(g.ctx, &pd, &plan, NULL, 0, &err), OSCAR_OK);
        cr_assert(strlen(err.msg) > 10);
    });
}

/* A device of 32 KB local memory per work-group (Mali, Adreno; PoCL stands in through
 * OSCAR_OPENCL_LOCAL_MEM): at head_dim 256 the attention kernels' arrays for 16 query heads take ~48 KB,
 * so the plan rebuilds them for fewer heads per work-group (it used to refuse the plan), and decode and
 * extend still match the reference; with too little for one head the plan is refused, naming it. */
static void small_local_memory(plug *g) {
    if (strcmp(g->api->name, "opencl")) return; /* the variable is the OpenCL plugin's */
    oscar_layout_desc l;
    oscar_layout_default(&l);
    l.head_dim = 256, l.group = 128, l.num_q_heads = 16, l.num_kv_heads = 1, l.method = OSCAR_METHOD_INT2;
    oscar_backend_plan_desc pd = {.layout = l, .num_layers = 1, .num_rot = 1, .identity_rotation = 1};
    void *plan = NULL;
    char variant[128] = "";
    oscar_errbuf err = {{0}};
    cr_assert_eq(setenv("OSCAR_OPENCL_LOCAL_MEM", "32768", 1), 0);
    cr_assert_eq(g->api->plan_create(g->ctx, &pd, &plan, variant, sizeof variant, &err), OSCAR_OK, "%s", err.msg);
    cr_assert(strstr(variant, "_hc"), "d 256 GQA 16 in 32 KB took %s, not a chunked build", variant);
    g->api->plan_destroy(g->ctx, plan);
    static const int shp[][3] = {{16, 1, 256}, {24, 2, 256}, {16, 1, 128}};
    for (size_t z = 0; z < sizeof shp / sizeof shp[0]; z++) {
        cfg c = {shp[z][2], 128, 32, 16, 48, shp[z][0], shp[z][1], z == 1 ? OSCAR_METHOD_BF16 : OSCAR_METHOD_OSCAR2,
                 OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, (int)(z & 1)};
        int lens[] = {1, 63, 65, 97, 300};
        run_scenario_x(g, &c, 5, lens, CHUNKS, (int)(z == 0), 1, 0, 0);
    }
    cr_assert_eq(setenv("OSCAR_OPENCL_LOCAL_MEM", "1024", 1), 0);
    plan = NULL;
    cr_assert_eq(g->api->plan_create(g->ctx, &pd, &plan, NULL, 0, &err), OSCAR_ERR_UNSUPPORTED);
    cr_assert_null(plan);
    /* the limit is the variable's, and the message says so (it blamed the device and head_dim) */
    cr_assert(strstr(err.msg, "local memory") && strstr(err.msg, "OSCAR_OPENCL_LOCAL_MEM limits it to 1024"), "%s",
              err.msg);
    cr_assert_eq(setenv("OSCAR_OPENCL_LOCAL_MEM", "32k", 1), 0);
    cr_assert_eq(g->api->plan_create(g->ctx, &pd, &plan, NULL, 0, &err), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "OSCAR_OPENCL_LOCAL_MEM '32k'"), "%s", err.msg);
    cr_assert_eq(unsetenv("OSCAR_OPENCL_LOCAL_MEM"), 0);
}

Test(conformance, opencl_small_local_memory, .timeout = 900) { FOR_EACH_BACKEND(g, small_local_memory(&g)); }

/* ------------------------------------------------------- extend attention */
/* The CPU backend as a "device" too, so the extend cases check it against
 * the float64 reference where no GPU plugin runs. */
static void plug_cpu(plug *p) {
    memset(p, 0, sizeof *p);
    p->api = oscar_cpu_backend();
    oscar_errbuf err = {{0}};
    cr_assert_eq(p->api->init(0, &p->ctx, &err), OSCAR_OK);
}
#define FOR_CPU_AND_EACH_BACKEND(P, ...)                                                                       \
    do {                                                                                                       \
        plug P;                                                                                                \
        plug_cpu(&P);                                                                                          \
        __VA_ARGS__;                                                                                           \
        plug_close(&P);                                                                                        \
        FOR_EACH_BACKEND(P, __VA_ARGS__);                                                                      \
    } while (0)

/* Chunked prefill, ragged: chunks of random sizes up to P + W + 5 appended,
 * then attended by their own queries (crossing the window boundary,
 * demotions inside the chunk, lengths below S0 + W), decode rows mixed in,
 * chunks reaching back over older rows; page 16, GQA 4, d 64; f16 windows
 * with Lloyd-Max and per-head rotations; the BF16 method. */
Test(extend, chunked_prefill_ragged, .timeout = 600) {
    cfg c = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 16, 3, 6, 4, 1, OSCAR_METHOD_OSCAR2_LM, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 1};
    cfg c3 = {64, 64, 16, 0, 0, 4, 2, OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    /* d 128, group 64, f32 metadata, GQA 6, page 32: the row-tiled CUDA kernels' other
     * metadata width and group, with 1, 2 and 4 row groups by the chunk */
    cfg c4 = {128, 64, 32, 4, 16, 6, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 1};
    FOR_CPU_AND_EACH_BACKEND(g, {
        int lens[] = {1, 3, 11, 12, 13, 29, 47, 90};
        run_scenario_x(&g, &c, 8, lens, CHUNKS, 0, 1, 0, 0);
        run_scenario_x(&g, &c2, 8, lens, CHUNKS, 0, 1, 0, 0);
        run_scenario_x(&g, &c3, 8, lens, CHUNKS, 0, 1, 0, 0);
        run_scenario_x(&g, &c4, 4, lens + 4, CHUNKS, 0, 1, 0, 0);
    });
}

/* GQA ratios 1, 2, 3, 5, 7, 16 at d 128 and 64, and 71 query heads on one KV
 * head at d 64 (Falcon-7B: above the 16 one OpenCL work-group holds, in
 * uneven head chunks), page 64 (queries beyond a page: one prefill of up to
 * 150 tokens, then chunks), odd lengths, a long sequence over several splits. */
Test(extend, gqa_ratios_page64_splits, .timeout = 600) {
    static const int zoo[][3] = {{2, 2, 128}, {4, 2, 64}, {6, 2, 128}, {5, 1, 64}, {7, 1, 128}, {16, 1, 128},
                                 {71, 1, 64}};
    FOR_CPU_AND_EACH_BACKEND(g, {
        for (size_t z = 0; z < sizeof zoo / sizeof zoo[0]; z++) {
            int d = zoo[z][2];
            cfg c = {d, d == 64 ? 32 : 128, 64, 8, 24, zoo[z][0], zoo[z][1], OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16,
                     OSCAR_DTYPE_F16, (int)(z & 1)};
            int lens[] = {5, 97, 150};
            run_scenario_x(&g, &c, 3, lens, z & 1 ? CHUNKS : PREFILL, 0, 1, 0, 0);
        }
        /* single queries at the end (decode through extend, n_i = 1) split it */
        cfg c = {128, 64, 64, 16, 32, 4, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
        int one[] = {900};
        run_scenario_x(&g, &c, 1, one, PREFILL, 0, 1, 0, 0);
    });
}

/* Every query count within the recent window (W 128 >= EXT_MAX_Q), so every
 * 2-bit row precedes every query and only the 16-bit rows need the causal mask
 * (the cases above send some query count past W in most calls, where the
 * tensor-core extend masks the 2-bit rows too; it fails with the 16-bit mask
 * one row late, checked on the H200).
 * d 128 group 128: GQA 4, GQA 12 with per-head rotations, the BF16 method
 * (causal over every row); ragged chunks, lengths below S0 + W. */
Test(extend, window_chunks_tensor_core_shapes, .timeout = 600) {
    cfg c = {128, 128, 64, 16, 128, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {128, 128, 32, 8, 128, 12, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c3 = {128, 128, 64, 0, 0, 8, 2, OSCAR_METHOD_BF16, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_CPU_AND_EACH_BACKEND(g, {
        int lens[] = {1, 40, 130, 300};
        run_scenario_x(&g, &c, 4, lens, CHUNKS, 0, 1, 0, 0);
        run_scenario_x(&g, &c2, 4, lens, CHUNKS, 0, 1, 0, 0);
        run_scenario_x(&g, &c3, 4, lens, CHUNKS, 0, 1, 0, 0);
    });
}

/* Prefix reuse: four sequences with a common 200-token prefix, their block
 * tables pointing at one copy of its 2-bit (BF16 method: 16-bit) pages, the
 * others poisoned. */
Test(extend, shared_prefix_pages, .timeout = 600) {
    cfg c = {64, 32, 16, 4, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 32, 0, 0, 4, 4, OSCAR_METHOD_BF16, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    FOR_CPU_AND_EACH_BACKEND(g, {
        int lens[] = {230, 201, 260, 215};
        run_scenario_x(&g, &c, 4, lens, PREFILL, 0, 1, 200, 0);
        run_scenario_x(&g, &c2, 4, lens, CHUNKS, 0, 1, 200, 0);
    });
}

/* The 3-CTA-per-SM twins of the 16-column tensor-core kernels (CUDA, d <= 128: the decode and, since
 * the thirty-seventh session, the extend instantiation; taken by grid size, forced here with
 * $OSCAR_DECODE_O3_CTAS=0) on the decode family's extend ($OSCAR_EXTEND_FA=0): GQA 4 with chunks of
 * more columns than the 8-column variant holds (the widest variant's twin), GQA 12 (its own), d 128
 * and 64, ragged chunks past the window, lengths below S0 + W, a long sequence over several splits. */
Test(extend, three_cta_twins, .timeout = 900) {
    cr_assert_eq(setenv("OSCAR_DECODE_O3_CTAS", "0", 1), 0);
    cr_assert_eq(setenv("OSCAR_EXTEND_FA", "0", 1), 0);
    cfg c = {128, 128, 64, 16, 128, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {128, 128, 32, 8, 128, 12, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c3 = {64, 64, 16, 4, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        if (!strcmp(g.api->name, "cuda")) { /* the twins are CUDA's; the others run these cases above */
            int lens[] = {1, 40, 130, 300, 77};
            run_scenario_x(&g, &c, 5, lens, CHUNKS, 0, 1, 0, 0);
            run_scenario_x(&g, &c2, 4, lens, CHUNKS, 1, 1, 0, 0);
            run_scenario_x(&g, &c3, 5, lens, CHUNKS, 0, 1, 0, 0);
            int one[] = {1500};
            run_scenario_x(&g, &c, 1, one, CHUNKS, 0, 1, 0, 0);
        }
    });
    cr_assert_eq(unsetenv("OSCAR_EXTEND_FA"), 0);
    cr_assert_eq(unsetenv("OSCAR_DECODE_O3_CTAS"), 0);
}

/* The long-chunk extend (CUDA, templates/extend_fa.jinja) on every extend call ($OSCAR_EXTEND_FA=1)
 * against the reference of its precision rule (FORMAT.md §5.1), the other backends as always: d 128
 * and 64 (one group per row), GQA 4, 6 and 1 (MHA), pages 16, 32 and 64, chunks past a small recent
 * window (causal over the 2-bit rows, demotions inside the chunk), ragged, lengths below S0 + W,
 * INT2 without windows, prefix reuse, one long sequence over several splits (d 128 and 64), the
 * 16-bit rows with the one 2-bit split and on a split of their own ($OSCAR_EXTEND_FA_SPLITS 1 and 3). */
Test(extend, long_chunk_kernel, .timeout = 900) {
    cr_assert_eq(setenv("OSCAR_EXTEND_FA", "1", 1), 0);
    cfg c = {128, 128, 64, 8, 24, 16, 4, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c2 = {64, 64, 16, 4, 8, 12, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 1};
    cfg c3 = {128, 128, 32, 0, 0, 4, 4, OSCAR_METHOD_INT2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    cfg c4 = {64, 64, 16, 4, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    FOR_EACH_BACKEND(g, {
        if (!strcmp(g.api->name, "cuda")) { /* the kernel is CUDA's; the others run these cases above */
            int lens[] = {1, 40, 77, 130, 300, 211};
            run_scenario_x(&g, &c, 6, lens, CHUNKS, 0, 1, 0, 0);
            run_scenario_x(&g, &c2, 4, lens + 2, CHUNKS, 1, 1, 0, 0);
            run_scenario_x(&g, &c3, 3, lens + 3, PREFILL, 0, 1, 0, 0);
            int shared[] = {230, 201, 260, 215};
            run_scenario_x(&g, &c4, 4, shared, PREFILL, 0, 1, 200, 0);
            int one[] = {1500};
            run_scenario_x(&g, &c, 1, one, CHUNKS, 0, 1, 0, 0);
            /* d 64 copies two 64-token sub-tiles a stage (pages of 16: eight page lookups a stage) */
            run_scenario_x(&g, &c2, 1, one, CHUNKS, 1, 1, 0, 0);
            /* the 16-bit rows after the tiles of the one 2-bit split, then on a split of their own */
            for (int ns = 1; ns <= 3; ns += 2) {
                char v[4];
                snprintf(v, sizeof v, "%d", ns);
                cr_assert_eq(setenv("OSCAR_EXTEND_FA_SPLITS", v, 1), 0);
                run_scenario_x(&g, &c, 6, lens, CHUNKS, 0, 1, 0, 0);
                run_scenario_x(&g, &c2, 4, lens + 2, CHUNKS, 1, 1, 0, 0);
            }
            cr_assert_eq(unsetenv("OSCAR_EXTEND_FA_SPLITS"), 0);
        }
    });
    cr_assert_eq(unsetenv("OSCAR_EXTEND_FA"), 0);
}

/* ------------------------------------------------- 3-bit head-tensors */
/* Plugins whose caps hold OSCAR_BACKEND_CAP_WIDE_CODES (OpenCL, CUDA) against the CPU backend with
 * some head-tensors in 3 bits (FORMAT.md §2.7: 2-bit plane + 1-bit plane per page): random
 * rotations, clips, error-feedback weights and code widths, fresh seeds, poisoned pools and
 * outputs, awkward lengths in a mixed batch, every write schedule. After every append the pools
 * must match the CPU backend's (windows byte for byte, page bytes but for rare boundary codes,
 * untouched pages and unused planes still poisoned); decode and extend outputs (and LSE) must
 * match the CPU backend's within output rounding. The CPU backend's 3-bit head-tensors equal the
 * reference codec's bit for bit (test_eval_equivalence). */
static void wide_pools_vs_cpu(env *e, const rc_paged *b, uint64_t seed, const char *what) {
    dev_download(e->g, e->h_pages, e->d_pages, e->pages_bytes);
    dev_download(e->g, e->h_windows, e->d_windows, e->windows_bytes);
    const unsigned char *wa = e->h_windows, *wc = b->windows;
    for (size_t j = 0; j < e->windows_bytes; j++)
        cr_assert_eq(wa[j], wc[j], "seed %llu %s (%s, %s): window pool byte %zu: 0x%02x vs CPU 0x%02x",
                     (unsigned long long)seed, e->g->api->name, e->variant, what, j, wa[j], wc[j]);
    const unsigned char *a = e->h_pages, *c = b->pages;
    size_t diff = 0, used = 0, pdiff = 0, pused = 0;
    const size_t hi = b->g.hi, pb = b->page_bytes;
    for (int pg = 0; pg < b->num_pages; pg++)
        for (size_t j = 0; j < pb; j++) {
            const size_t o = (size_t)pg * pb + j;
            diff += a[o] != c[o];
            if (j >= hi) pdiff += a[o] != c[o];
        }
    for (int i = 0; i < b->num_seqs; i++) used += (size_t)rc_pages_for(&e->l, b->seq_lens[i]) * pb;
    for (int i = 0; i < b->num_seqs; i++) pused += (size_t)rc_pages_for(&e->l, b->seq_lens[i]) * (pb - hi);
    /* each differing byte holds 4 codes (2-bit plane) or 8 code bits (1-bit plane): boundary codes only */
    cr_assert_leq(diff * 200, used + 200, "seed %llu %s (%s, %s): %zu of %zu used page bytes differ from the CPU "
                  "backend (%zu in the 1-bit planes)", (unsigned long long)seed, e->g->api->name, e->variant, what,
                  diff, used, pdiff);
    cr_assert_leq(pdiff * 100, pused + 100, "seed %llu %s (%s, %s): %zu of %zu 1-bit plane bytes differ from the CPU "
                  "backend", (unsigned long long)seed, e->g->api->name, e->variant, what, pdiff, pused);
}

/* Decode (or extend with counts qn, cu_q; LSE when asked) on both backends from the same random q; the
 * device's outputs within output rounding of the CPU backend's, padding untouched. */
/* The plane of each head-tensor of the layers under test ([LAYERS][H][2], oscar_format_planes), set by
 * run_wide for wide_ref. */
static int32_t wide_planes[LAYERS * RC_MAX_KV_HEADS * 2];

/* Float64 attention of the query at position t of sequence seq (length L; FORMAT.md §5.1) over the CPU
 * backend's pools of layer LAYER as stored, 3-bit rows included (codes, 1-bit planes, metadata, window
 * rows). q: [Hq][d] original space. qt: the device's q~ [Hq][d] (fp32, scaled by sm_scale log2 e) or
 * NULL: with it the paged rows are scored as the tensor-core kernels do (q~ in two int8 limbs against
 * the codes, the bias with q~; rc_attention_f64_q), with fa as the long-chunk kernel does (q' per
 * element in fp16, value rows fp16(a c + b); rc_attention_f64_fa). out [Hq][d]; lse [Hq] and abs_score
 * [Hq] as rc_attention_f64_at's. */
static void wide_ref(const env *e, const rc_paged *b, int seq, int t, const float *q, const float *qt, int fa,
                     double sm, int rotated_output, double *out, double *lse, double *abs_score) {
    const oscar_layout_desc *l = &e->l;
    const oscar_page_geom *g = &b->g;
    const int Hq = l->num_q_heads, H = l->num_kv_heads, d = l->head_dim, G = l->group, gq = Hq / H, P = l->page_size;
    const int L = b->seq_lens[seq], S0 = l->sink, W = l->recent;
    const float *RK = layer_rot(e, 0), *RV = layer_rot(e, 1);
    double *sc = malloc((size_t)(t + 1) * sizeof *sc), *kr = malloc((size_t)(t + 1) * d * sizeof *kr);
    double *vr = malloc((size_t)(t + 1) * d * sizeof *vr), *isb = malloc((size_t)(t + 1) * d * sizeof *isb);
    double qr[256], q2[256], o[256];
    for (int hq = 0; hq < Hq; hq++) {
        const int h = hq / gq;
        const float *rk = RK ? RK + (size_t)(e->num_rot == 1 ? 0 : h) * d * d : NULL;
        const float *rv = RV ? RV + (size_t)(e->num_rot == 1 ? 0 : h) * d * d : NULL;
        rc_rotate_q(q + (size_t)hq * d, rk, d, qr);
        if (qt) (fa ? rc_q_fa : rc_q_limbs2)(qt + (size_t)hq * d, d, sm, q2);
        double mx = -INFINITY, amx = 0;
        for (int p = 0; p <= t; p++) {
            double *k = kr + (size_t)p * d, *v = vr + (size_t)p * d, *kb = isb + (size_t)p * d;
            const int reg = rc_region(l, p, L);
            if (reg == RC_2BIT) { /* codes (+ bit 2 from the plane) and the group's (a, b) */
                const int jj = p - S0, r = jj % P;
                const int32_t pid = b->block_table[(size_t)seq * b->stride + jj / P];
                const unsigned char *pg = (const unsigned char *)b->pages + (size_t)pid * b->page_bytes;
                for (int kv = 0; kv < 2; kv++) {
                    const unsigned char *cd = pg + (kv ? g->v_codes : g->k_codes) + ((size_t)h * P + r) * g->codes_row_bytes;
                    const unsigned char *mt = pg + (kv ? g->v_meta : g->k_meta) + ((size_t)h * P + r) * g->meta_row_bytes;
                    const int pl = wide_planes[(LAYER * H + h) * 2 + kv];
                    const unsigned char *hi = pl >= 0 ? pg + g->hi + ((size_t)pl * P + r) * g->hi_row_bytes : NULL;
                    for (int j = 0; j < d; j++) {
                        const int code = hi ? oscar_ref_code3_at(cd, hi, j) : oscar_ref_code_at(cd, j);
                        const double a = oscar_load(l->meta_dtype, mt, (size_t)(j / G) * 2);
                        const double bb = oscar_load(l->meta_dtype, mt, (size_t)(j / G) * 2 + 1);
                        (kv ? v : k)[j] = a * code + bb;
                        if (kv && fa) v[j] = rc_fa_value((float)v[j]); /* the long-chunk kernel's operand */
                        if (!kv) kb[j] = bb;
                    }
                }
            } else { /* 16-bit rows of the window slot: [2][H][S0 + W][d] */
                const int row = p < S0 ? p : S0 + (p - S0) % W;
                const unsigned char *sl = (const unsigned char *)b->windows + (size_t)b->window_slots[seq] * b->slot_bytes;
                for (int kv = 0; kv < 2; kv++)
                    for (int j = 0; j < d; j++)
                        (kv ? v : k)[j] = oscar_load(l->kv_dtype, sl, (((size_t)kv * H + h) * (S0 + W) + row) * d + j);
            }
            double a = 0, aa = 0;
            for (int j = 0; j < d; j++) {
                a += qt && reg == RC_2BIT ? q2[j] * (k[j] - kb[j]) + qr[j] * kb[j] : qr[j] * k[j];
                aa += fabs(qr[j] * k[j]);
            }
            sc[p] = a * sm;
            mx = sc[p] > mx ? sc[p] : mx;
            amx = aa > amx ? aa : amx;
        }
        double sum = 0;
        for (int j = 0; j < d; j++) o[j] = 0;
        for (int p = 0; p <= t; p++) {
            const double w = exp(sc[p] - mx);
            sum += w;
            for (int j = 0; j < d; j++) o[j] += w * vr[(size_t)p * d + j];
        }
        for (int i = 0; i < d; i++) {
            double a = 0;
            if (rv && !rotated_output)
                for (int j = 0; j < d; j++) a += o[j] / sum * rv[i * d + j];
            else
                a = o[i] / sum;
            out[hq * d + i] = a;
        }
        if (lse) lse[hq] = mx + log(sum);
        if (abs_score) abs_score[hq] = amx * fabs(sm);
    }
    free(sc);
    free(kr);
    free(vr);
    free(isb);
}

static void wide_attend_vs_cpu(env *e, const rc_paged *b, rc_rng *r, const int *qn, int rotated_output, int lse,
                               uint64_t seed) {
    int Hq = e->l.num_q_heads, d = e->l.head_dim, nseq = b->num_seqs;
    size_t es = oscar_dtype_size(e->l.kv_dtype);
    int32_t *cu = malloc((size_t)(nseq + 1) * sizeof *cu);
    cu[0] = 0;
    int maxq = 1;
    for (int i = 0; i < nseq; i++) {
        cu[i + 1] = cu[i] + (qn ? qn[i] : 1);
        maxq = qn && qn[i] > maxq ? qn[i] : maxq;
    }
    int total = cu[nseq];
    /* on CUDA, a layer without 3-bit head-tensors takes the 2-bit kernels: long chunks the long-chunk one */
    const int fa = qn && fa_takes(e, nseq, maxq);
    int64_t qs = (int64_t)Hq * d + rc_randint(r, 0, 2) * 8, os = (int64_t)Hq * d + rc_randint(r, 0, 2) * 8;
    size_t qbytes = (size_t)total * qs * es, obytes = (size_t)(total + 1) * os * es;
    size_t lbytes = (size_t)(total + 1) * Hq * sizeof(float);
    float *q = malloc((size_t)total * Hq * d * sizeof *q), *clse = malloc(lbytes), *glse = malloc(lbytes);
    char *qb = malloc(qbytes), *cob = malloc(obytes), *gob = malloc(obytes);
    rc_gen_kv(r, total, Hq, d, 2, e->l.kv_dtype, q);
    rc_poison(qb, qbytes);
    rc_poison(cob, obytes);
    rc_poison(gob, obytes);
    rc_poison(clse, lbytes);
    rc_poison(glse, lbytes);
    for (int t = 0; t < total; t++)
        rc_to_dtype(e->l.kv_dtype, q + (size_t)t * Hq * d, qb + (size_t)t * qs * es, (size_t)Hq * d);
    float sm = (float)(rc_uniform(r) < 0.5 ? 1.0 / sqrt(d) : 0.3 / sqrt(d));
    oscar_errbuf err = {{0}};
    oscar_backend_extend_args ca = {.layer = LAYER, .cache = {b->pages, b->num_pages, b->windows, b->num_slots},
                                    .batch = batch_of(b), .cu_q = qn ? cu : NULL, .total_q = total,
                                    .max_q_len = maxq, .q = qb, .q_stride = qs, .out = cob, .out_stride = os,
                                    .lse = lse ? clse : NULL, .sm_scale = sm, .rotated_output = rotated_output,
                                    .workspace = e->cpu_ws, .workspace_bytes = sizeof e->cpu_ws};
    cr_assert_eq(e->cpu->extend(e->cpu_ctx, e->cpu_plan, &ca, &err), OSCAR_OK, "seed %llu: cpu: %s",
                 (unsigned long long)seed, err.msg);
    plug *g = e->g;
    dev_ext dx;
    oscar_backend_extend_args ga = dev_ext_of(e, b, &ca, cu, qbytes, gob, obytes, glse, lbytes, &dx);
    void *dq = dx.q, *dout = dx.out, *dlse = dx.lse;
    if (qn || lse) {
        cr_assert_eq(g->api->extend(g->ctx, e->g_plan, &ga, &err), OSCAR_OK, "seed %llu: %s extend: %s",
                     (unsigned long long)seed, g->api->name, err.msg);
    } else {
        oscar_backend_decode_args da = {.layer = LAYER, .cache = ga.cache, .batch = ga.batch, .q = dq,
                                        .q_stride = qs, .out = dout, .out_stride = os, .sm_scale = sm,
                                        .rotated_output = rotated_output, .workspace = e->g_ws,
                                        .workspace_bytes = e->g_ws_bytes};
        cr_assert_eq(g->api->decode(g->ctx, e->g_plan, &da, &err), OSCAR_OK, "seed %llu: %s decode: %s",
                     (unsigned long long)seed, g->api->name, err.msg);
    }
    dev_download(g, gob, dout, obytes);
    dev_download(g, glse, dlse, lbytes);
    cr_assert_eq(g->api->check(g->ctx, e->g_plan, e->g_ws, NULL, &err), OSCAR_OK, "seed %llu: check: %s",
                 (unsigned long long)seed, err.msg);
    const char *what = qn ? "extend" : lse ? "decode through extend" : "decode";
    float *gf = malloc((size_t)Hq * d * sizeof *gf), *cf = malloc((size_t)Hq * d * sizeof *cf);
    /* the device's q~ of every query row (the W3 kernels' limbs come from it) */
    float *qt = malloc((size_t)total * Hq * d * sizeof *qt);
    if (is_w3t(e)) dev_download(g, qt, dev_qt(e), (size_t)total * Hq * d * sizeof *qt);
    double *rex = malloc((size_t)Hq * d * sizeof *rex), *rtc = malloc((size_t)Hq * d * sizeof *rtc);
    double *lex = malloc((size_t)Hq * sizeof *lex), *ltc = malloc((size_t)Hq * sizeof *ltc),
           *asc = malloc((size_t)Hq * sizeof *asc);
    for (int t = 0; t < total; t++) {
        rc_from_dtype(e->l.kv_dtype, gob + (size_t)t * os * es, gf, (size_t)Hq * d);
        rc_from_dtype(e->l.kv_dtype, cob + (size_t)t * os * es, cf, (size_t)Hq * d);
        /* The float64 reference over the pools as stored (wide_ref), exact: the CPU backend's output is
         * within output rounding of it (this checks the reference itself). The tensor-core kernels (W3 in
         * a layer of 3-bit head-tensors, else the 2-bit family) score the paged rows with q~ in two int8
         * limbs and round P' to fp16 (FORMAT.md §5), the long-chunk kernel (long chunks of a layer without
         * 3-bit head-tensors) with its own rule (§5.1): each is checked against the reference with its
         * rule at the 2^-10 floor, and against the CPU backend within 1 % of the largest output plus the
         * two references' difference. */
        int seq = t, pos;
        if (qn) { /* extend: row t is query (t - cu[seq]) of the sequence whose rows hold it */
            for (seq = 0; cu[seq + 1] <= t; seq++) {
            }
            pos = b->seq_lens[seq] - qn[seq] + (t - cu[seq]);
        } else {
            pos = b->seq_lens[t] - 1;
        }
        char msg[256];
        wide_ref(e, b, seq, pos, q + (size_t)t * Hq * d, NULL, 0, sm, rotated_output, rex, lex, NULL);
        int bad = rc_check_output(e->l.kv_dtype, cob + (size_t)t * os * es, rex, (size_t)Hq * d, msg, sizeof msg);
        cr_assert_eq(bad, 0, "seed %llu: CPU backend against wide_ref, %s of query row %d: %d off; %s",
                     (unsigned long long)seed, what, t, bad, msg);
        const int w3t = is_w3t(e);
        if (w3t) { /* a layer without 3-bit head-tensors takes the 2-bit kernels, long chunks the long-chunk one */
            wide_ref(e, b, seq, pos, q + (size_t)t * Hq * d, qt + (size_t)t * Hq * d, fa, sm, rotated_output, rtc, ltc,
                     asc);
            bad = rc_check_output_abs(e->l.kv_dtype, gob + (size_t)t * os * es, rtc, (size_t)Hq * d, 0x1p-10, msg,
                                      sizeof msg);
            cr_assert_eq(bad, 0, "seed %llu %s (%s): %s of query row %d against its float64 reference: %d off; %s",
                         (unsigned long long)seed, g->api->name, e->variant, what, t, bad, msg);
        }
        /* each within output rounding (2^-8 / 2^-10 relative) plus 2e-4 of the largest output of its
         * float64 value (FORMAT.md §5): two ulps and twice that floor between them */
        double rel = e->l.kv_dtype == OSCAR_DTYPE_BF16 ? 0x1p-7 : 0x1p-9, mx = 0.0;
        for (int j = 0; j < Hq * d; j++) mx = fabs(cf[j]) > mx ? fabs(cf[j]) : mx;
        for (int j = 0; j < Hq * d; j++) {
            double a = fabs(gf[j]) > fabs(cf[j]) ? fabs(gf[j]) : fabs(cf[j]);
            cr_assert_leq(fabs((double)gf[j] - cf[j]),
                          rel * a + (w3t ? 0.01 * mx + fabs(rtc[j] - rex[j]) : 4e-4 * mx),
                          "seed %llu %s (%s): %s of query row %d output %d (head %d): %g vs CPU backend %g",
                          (unsigned long long)seed, g->api->name, e->variant, what, t, j, j / d, gf[j], cf[j]);
        }
        for (size_t j = (size_t)Hq * d * es; j < (size_t)os * es; j++)
            cr_assert_eq((unsigned char)gob[(size_t)t * os * es + j], 0xff, "seed %llu: %s wrote into the output "
                         "stride padding", (unsigned long long)seed, what);
        if (lse)
            for (int h = 0; h < Hq; h++) {
                double cl = clse[(size_t)t * Hq + h], gl = glse[(size_t)t * Hq + h];
                cr_assert(!rc_lse_off(cl, lex[h], 0, 0.0), "seed %llu %s: CPU backend LSE of row %d head %d: %g vs "
                          "wide_ref %g", (unsigned long long)seed, what, t, h, cl, lex[h]);
                if (w3t) {
                    cr_assert(!rc_lse_off(gl, ltc[h], 1, asc[h]), "seed %llu %s: LSE of row %d head %d: %g vs its "
                              "float64 reference %g", (unsigned long long)seed, what, t, h, gl, ltc[h]);
                    continue;
                }
                cr_assert(fabs(gl - cl) <= 2e-4 * (1.0 + fabs(cl)), "seed %llu %s: LSE of row %d head %d: %g vs CPU %g",
                          (unsigned long long)seed, what, t, h, gl, cl);
            }
    }
    for (size_t j = 0; j < (size_t)os * es; j++) /* the row past total_q */
        cr_assert_eq((unsigned char)gob[(size_t)total * os * es + j], 0xff, "seed %llu: %s wrote past total_q",
                     (unsigned long long)seed, what);
    free(gf);
    free(cf);
    free(qt);
    free(rex);
    free(rtc);
    free(lex);
    free(ltc);
    free(asc);
    dev_ext_free(e, &dx);
    free(cu);
    free(q);
    free(clse);
    free(glse);
    free(qb);
    free(cob);
    free(gob);
}

/* One layer's schedule (layer LAYER of e's plan): fresh K/V, its own poisoned pools, appends by mode; after
 * appends the pools and decode (and extend, with ext) outputs against the CPU backend's. */
static void wide_schedule(env *e, rc_rng *r, uint64_t seed, const cfg *c, int nseq, const int *final_lens, int mode,
                          int ext) {
    size_t H = (size_t)c->H, d = (size_t)c->d;
    float **K = malloc((size_t)nseq * sizeof *K), **V = malloc((size_t)nseq * sizeof *V);
    int32_t *maxl = malloc((size_t)nseq * sizeof *maxl);
    for (int i = 0; i < nseq; i++) {
        maxl[i] = final_lens[i];
        K[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        V[i] = malloc((size_t)final_lens[i] * H * d * sizeof(float));
        rc_gen_kv(r, final_lens[i], (int)H, (int)d, 3, c->kv, K[i]);
        rc_gen_kv(r, final_lens[i], (int)H, (int)d, 2, c->kv, V[i]);
    }
    rc_paged b;
    cr_assert_eq(rc_paged_init(r, &e->l, nseq, maxl, 3, &b), 0);
    if (e->l.wide_per_layer) { /* the layer's pages only: both backends' pools exactly that (poisoned) */
        b.page_bytes = oscar_format_layer_page_bytes(&e->l, wide_bits_live, LAYER);
        cr_assert_leq(b.page_bytes, b.g.page_bytes);
        void *shrunk = realloc(b.pages, b.page_bytes * (size_t)(b.num_pages > 0 ? b.num_pages : 1));
        cr_assert(shrunk);
        b.pages = shrunk;
    }
    env_bind_pools(e, &b);
    int *n = malloc((size_t)nseq * sizeof *n), *qn = malloc((size_t)nseq * sizeof *qn), steps = 0;
    const char *what = mode == TOKENS ? "token by token" : mode == CHUNKS ? "chunks" : "prefill";
    for (;;) {
        if (!next_counts(r, c, &b, final_lens, mode, n)) break;
        do_append(e, &b, K, V, n, rc_randint(r, 0, 1) * 16, seed);
        if (mode != TOKENS || steps % 7 == 0) wide_pools_vs_cpu(e, &b, seed, what);
        if (mode != TOKENS || steps % 11 == 0) wide_attend_vs_cpu(e, &b, r, NULL, steps & 1, 0, seed);
        if (ext && (mode != TOKENS || steps % 11 == 5)) {
            extend_counts(r, &b, n, qn);
            wide_attend_vs_cpu(e, &b, r, qn, steps & 1, steps % 3 != 0, seed);
        }
        steps++;
    }
    wide_pools_vs_cpu(e, &b, seed, what);
    wide_attend_vs_cpu(e, &b, r, NULL, 0, 0, seed);
    wide_attend_vs_cpu(e, &b, r, NULL, 1, 1, seed); /* cu_q NULL with an LSE */
    if (ext) {
        extend_counts(r, &b, n, qn);
        wide_attend_vs_cpu(e, &b, r, qn, 0, 1, seed);
    }
    for (int i = 0; i < nseq; i++) {
        free(K[i]);
        free(V[i]);
    }
    free(K);
    free(V);
    free(maxl);
    free(n);
    free(qn);
    rc_paged_free(&b);
    /* the pools go with the layer (env_free frees what is bound at the end) */
    env_unbind_pools(e);
}

/* Code widths of the wide cases: in layer 1 the first KV head's K and the last one's V are 3 bits, the
 * others at random; in layer 0 one head-tensor at random, or none with `none`. count: the 3-bit
 * head-tensors per layer; returns the most of any layer. */
static int wide_draw_bits(rc_rng *r, const cfg *c, int none, uint8_t *bits, int *count) {
    int room = 0;
    for (int l = 0; l < LAYERS; l++) {
        const int one = rc_randint(r, 0, 2 * c->H - 1);
        count[l] = 0;
        for (int i = 0; i < 2 * c->H; i++) {
            const uint8_t b = l == 1 ? ((i == 0 || i == 2 * c->H - 1 || rc_randint(r, 0, 2) == 0) ? 3 : 2)
                                     : (i == one && !none ? 3 : 2);
            bits[l * 2 * c->H + i] = b;
            count[l] += b == 3;
        }
        room = count[l] > room ? count[l] : room;
    }
    return room;
}

/* two: layer 0 of the plan holds only 2-bit head-tensors and, after layer 1 (3-bit head-tensors), runs
 * the conformance scenario (scenario_body: reference codec, float64 attention, CPU backend) with the same
 * schedule: on CUDA the tensor-core decode/extend and the warp/tile write paths on pages with plane room,
 * next to the generic kernels of the 3-bit layer, in one plan. Otherwise layer 0 has one 3-bit
 * head-tensor at random (planes numbered per layer). */
static void run_wide(plug *g, const cfg *c, int nseq, const int *final_lens, int mode, int fb, int ext, int two) {
    if (!(g->api->caps & OSCAR_BACKEND_CAP_WIDE_CODES)) {
        fprintf(stderr, "%s: no 3-bit head-tensors (caps 0x%x), skipped\n", g->api->name, (unsigned)g->api->caps);
        return;
    }
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    /* Room for one plane more than any layer uses (unused planes must stay untouched). */
    uint8_t bits[LAYERS * RC_MAX_KV_HEADS * 2];
    int count[LAYERS];
    const int room = wide_draw_bits(&r, c, two, bits, count);
    wide_code_bits = bits;
    wide_room = room + 1 <= 2 * c->H ? room + 1 : room;
    int maxlen = 1;
    for (int i = 0; i < nseq; i++) maxlen = final_lens[i] > maxlen ? final_lens[i] : maxlen;
    env e;
    int ok = env_init(&e, g, c, &r, seed, ext ? nseq * EXT_MAX_Q : nseq, maxlen, fb);
    wide_code_bits = NULL;
    wide_room = 0;
    if (!ok && strcmp(g->api->name, "opencl") != 0) {
        /* A plugin of generated variants may lack the shape (CUDA's default set: no f32 metadata); then it
         * must refuse the shape without 3-bit head-tensors too, else the refusal is theirs. */
        env e2;
        rc_rng r2;
        rc_rng_seed(&r2, seed);
        const int ok2 = env_init(&e2, g, c, &r2, seed, 1, maxlen, 0);
        if (ok2) env_free(&e2);
        cr_assert(!ok2, "seed %llu: %s plans the shape but refused it with 3-bit head-tensors",
                  (unsigned long long)seed, g->api->name);
        return;
    }
    cr_assert(ok, "seed %llu: %s has the capability but refused the plan", (unsigned long long)seed, g->api->name);
    cr_assert_eq(oscar_format_planes(&e.l, LAYERS, bits, wide_planes, NULL, 0), OSCAR_OK, "planes of the code widths");
    cr_assert(strstr(e.variant, "_w3") != NULL, "variant %s", e.variant);
    wide_bits_live = bits; /* which layer holds 3-bit head-tensors (layer_is_wide: which kernels run) */
    g_layer = 1;
    rc_worst_take();
    wide_schedule(&e, &r, seed, c, nseq, final_lens, mode, ext);
    if (getenv("OSCAR_TEST_WORST"))
        fprintf(stderr, "%s (%s): worst error / floor %.3f (3-bit layer, seed %llu)\n", g->api->name, e.variant,
                rc_worst_take(), (unsigned long long)seed);
    if (two) { /* the whole conformance scenario (reference codec, float64 attention) on the 2-bit layer */
        g_layer = 0;
        scenario_body(&e, &r, seed, c, nseq, final_lens, mode, fb, ext, 0, 0);
        g_layer = 1;
    }
    wide_bits_live = NULL;
    env_free(&e);
}

/* Per-layer pages (layout.wide_per_layer 1, FORMAT.md §3.3): layer 1 holds at least two 3-bit
 * head-tensors, layer 0 none (zero: plain 2-bit pages) or one; wide_tensors is one more than any layer
 * has, so no page holds a plane its layer lacks. Each layer runs wide_schedule on pools of exactly its
 * page size on both backends: pools against the CPU backend's, outputs against the float64 reference
 * and the CPU backend. */
static void run_wide_per_layer(plug *g, const cfg *c, int nseq, const int *final_lens, int mode, int fb, int ext,
                               int zero) {
    if (!(g->api->caps & OSCAR_BACKEND_CAP_WIDE_CODES)) {
        fprintf(stderr, "%s: no 3-bit head-tensors (caps 0x%x), skipped\n", g->api->name, (unsigned)g->api->caps);
        return;
    }
    uint64_t seed = rc_fresh_seed();
    rc_rng r;
    rc_rng_seed(&r, seed);
    uint8_t bits[LAYERS * RC_MAX_KV_HEADS * 2];
    int count[LAYERS];
    const int room = wide_draw_bits(&r, c, zero, bits, count);
    cr_assert(count[1] >= 2 && count[0] == (zero ? 0 : 1));
    wide_code_bits = bits;
    wide_room = room + 1 <= 2 * c->H ? room + 1 : room;
    wide_per_layer_on = 1;
    int maxlen = 1;
    for (int i = 0; i < nseq; i++) maxlen = final_lens[i] > maxlen ? final_lens[i] : maxlen;
    env e;
    int ok = env_init(&e, g, c, &r, seed, ext ? nseq * EXT_MAX_Q : nseq, maxlen, fb);
    wide_code_bits = NULL;
    wide_room = 0;
    wide_per_layer_on = 0;
    if (!ok) {
        cr_assert(strcmp(g->api->name, "opencl") != 0, "seed %llu: opencl refused the plan", (unsigned long long)seed);
        return; /* a shape the plugin's generated set lacks (run_wide checks that refusal) */
    }
    cr_assert_eq(oscar_format_planes(&e.l, LAYERS, bits, wide_planes, NULL, 0), OSCAR_OK, "planes of the code widths");
    wide_bits_live = bits;
    oscar_page_geom pg;
    oscar_page_geom_init(&e.l, &pg);
    for (int layer = LAYERS - 1; layer >= 0; layer--) {
        const size_t want = pg.hi + (size_t)count[layer] * (size_t)c->P * (size_t)c->d / 8;
        cr_assert_eq(oscar_format_layer_page_bytes(&e.l, bits, layer), want, "layer %d page bytes", layer);
        g_layer = layer;
        rc_worst_take();
        wide_schedule(&e, &r, seed, c, nseq, final_lens, mode, ext);
        if (getenv("OSCAR_TEST_WORST"))
            fprintf(stderr, "%s (%s): worst error / floor %.3f (per-layer pages, layer %d of %d planes, seed %llu)\n",
                    g->api->name, e.variant, rc_worst_take(), layer, count[layer], (unsigned long long)seed);
    }
    g_layer = 1;
    wide_bits_live = NULL;
    env_free(&e);
}

Test(wide, per_layer_pages, .timeout = 900) {
    cfg c1 = {128, 128, 64, 8, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c2 = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    const int l1[] = {3, 40, 95, 170}, l2[] = {1, 29, 64, 123, 77};
    FOR_EACH_BACKEND(g, {
        run_wide_per_layer(&g, &c1, 4, l1, CHUNKS, 1, 1, 1);
        run_wide_per_layer(&g, &c2, 5, l2, TOKENS, 0, 0, 0);
        run_wide_per_layer(&g, &c2, 5, l2, PREFILL, 1, 1, 1);
    });
}

/* 3-bit head-tensors at head_dims that are not powers of two: d 80 reads the 1-bit plane 16 bits at a
 * time (rows of 10 bytes), d 96 (group 32) 32 at a time; chunks with extend. */
Test(wide, d80_d96_planes, .timeout = 900) {
    cfg c1 = {80, 80, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c2 = {96, 32, 32, 2, 6, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    const int l1[] = {1, 11, 12, 13, 40, 77}, l2[] = {7, 50, 99};
    FOR_EACH_BACKEND(g, {
        run_wide(&g, &c1, 6, l1, CHUNKS, 1, 1, 1);
        run_wide(&g, &c2, 3, l2, PREFILL, 0, 1, 1);
    });
}

/* d 64, group 32, page 16, small windows: every region boundary, every schedule, nearest and feedback. */
Test(wide, d64_g32_boundaries_all_schedules, .timeout = 900) {
    cfg c = {64, 32, 16, 4, 8, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    int lens[16];
    int nl = boundary_lens(&c, lens);
    FOR_EACH_BACKEND(g, {
        run_wide(&g, &c, nl, lens, TOKENS, 1, 0, 1);
        run_wide(&g, &c, nl, lens, CHUNKS, 0, 1, 0);
        run_wide(&g, &c, nl, lens, PREFILL, 1, 1, 1);
    });
}
/* d 128 (tiny-qwen3's shape: GQA 4, group 128, page 64, per-head rotations), f16 windows, f32 metadata,
 * and d 256 with GQA 8: awkward lengths in a mixed batch, chunked prefill with extend. */
Test(wide, d128_d256_mixed_batch_extend, .timeout = 900) {
    cfg c1 = {128, 128, 64, 8, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c2 = {128, 64, 32, 4, 12, 4, 1, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32, 0};
    cfg c3 = {256, 128, 16, 2, 4, 16, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    const int l1[] = {1, 23, 88, 150, 211, 333}, l2[] = {7, 77, 130}, l3[] = {5, 60, 97};
    FOR_EACH_BACKEND(g, {
        run_wide(&g, &c1, 6, l1, CHUNKS, 1, 1, 1);
        /* CUDA: the heads with a plane split their history twice as fine from 32-token splits up (the
         * default takes it from 1024, lengths these cases do not reach; docs/API.md), with these
         * shapes' heads (most with a plane) in their own grid rows, then (OSCAR_DECODE_W3_ROWS=2) the
         * further splits in rows of their own */
        setenv("OSCAR_DECODE_W3_SPLIT", "32", 1);
        for (int rows = 1; rows <= 2; rows++) {
            setenv("OSCAR_DECODE_W3_ROWS", rows == 1 ? "1" : "2", 1);
            run_wide(&g, &c1, 6, l1, CHUNKS, 1, 1, 1);
            run_wide(&g, &c2, 3, l2, CHUNKS, 1, 1, 0);
            run_wide(&g, &c3, 3, l3, PREFILL, 0, 1, 1);
        }
        unsetenv("OSCAR_DECODE_W3_ROWS");
        unsetenv("OSCAR_DECODE_W3_SPLIT");
    });
}
/* A plan with 3-bit head-tensors in one layer and only 2-bit ones in the other: token by token the
 * 2-bit layer's appends take CUDA's warp kernels (small grids), then its write path is forced onto the
 * tile kernels (OSCAR_APPEND_TILE_CTAS=0: every append of at most W tokens; docs/API.md); GQA 4
 * (limb-packed tensor-core decode), 16 and 8, no sink, chunks with extend. */
Test(wide, two_bit_layer_beside_wide_layer, .timeout = 900) {
    cfg c1 = {128, 128, 64, 8, 16, 8, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 1};
    cfg c2 = {128, 32, 16, 4, 24, 32, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_F16, OSCAR_DTYPE_F16, 0};
    cfg c3 = {64, 64, 32, 0, 8, 16, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    const int l1[] = {3, 40, 95, 170}, l2[] = {1, 29, 64, 123, 77}, l3[] = {2, 50, 111};
    FOR_EACH_BACKEND(g, {
        unsetenv("OSCAR_APPEND_TILE_CTAS");
        run_wide(&g, &c1, 4, l1, TOKENS, 1, 0, 1);
        setenv("OSCAR_APPEND_TILE_CTAS", "0", 1);
        run_wide(&g, &c1, 4, l1, CHUNKS, 1, 1, 1);
        run_wide(&g, &c2, 5, l2, CHUNKS, 0, 1, 1);
        run_wide(&g, &c3, 3, l3, CHUNKS, 0, 1, 1);
    });
}
/* Plugins with the capability (OpenCL, CUDA), called past the runtime, refuse code widths they cannot
 * place, as the CPU backend does (format/layout.c oscar_format_planes): a width other than 2/3, more 3s
 * in a layer than layout.wide_tensors, 3s on another method. (A plugin without it is never given code
 * widths: the runtime refuses them first, test_bad_input.) */
static void wide_refusals(plug *g) {
    cfg c = {64, 64, 16, 4, 8, 4, 2, OSCAR_METHOD_OSCAR2, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, 0};
    rc_rng r;
    rc_rng_seed(&r, rc_fresh_seed());
    oscar_layout_desc l;
    int num_rot, identity;
    float *rk, *rv, ck[LAYERS * RC_MAX_KV_HEADS], cv[LAYERS * RC_MAX_KV_HEADS];
    rc_plan_setup(&c, LAYERS, &r, &l, &num_rot, &identity, &rk, &rv, ck, cv);
    uint8_t bits[LAYERS * 4] = {2, 2, 2, 2, 3, 2, 2, 3};
    const oscar_backend_api *apis[2] = {oscar_cpu_backend(), g->api};
    void *ctxs[2] = {NULL, g->ctx};
    oscar_errbuf err = {{0}};
    cr_assert_eq(apis[0]->init(0, &ctxs[0], &err), OSCAR_OK);
    for (int w = 0; w < 2; w++) {
        const int capable = (apis[w]->caps & OSCAR_BACKEND_CAP_WIDE_CODES) != 0;
        struct { uint8_t b4, room; oscar_method m; oscar_status want; const char *says; } cases[] = {
            {2, 2, OSCAR_METHOD_OSCAR2, OSCAR_OK, ""},
            {4, 2, OSCAR_METHOD_OSCAR2, OSCAR_ERR_INVALID_ARGUMENT, "must be 2 or 3"},
            {2, 1, OSCAR_METHOD_OSCAR2, OSCAR_ERR_SHAPE_MISMATCH, "wide_tensors"},
            {2, 0, OSCAR_METHOD_QUAROT2, OSCAR_ERR_UNSUPPORTED, "oscar2"},
        };
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            bits[5] = cases[k].b4;
            l.wide_tensors = cases[k].room;
            l.method = cases[k].m;
            oscar_backend_plan_desc pd = {.layout = l, .num_layers = LAYERS, .num_rot = num_rot, .rot_k = rk,
                                          .rot_v = rv, .clip_k = ck, .clip_v = cv, .code_bits = bits};
            void *plan = NULL;
            char variant[128] = "";
            err.msg[0] = 0;
            oscar_status s = apis[w]->plan_create(ctxs[w], &pd, &plan, variant, sizeof variant, &err);
            if (capable) {
                cr_expect_eq(s, cases[k].want, "%s case %zu: %s", apis[w]->name, k, err.msg);
                cr_expect(strstr(err.msg, cases[k].says) != NULL, "%s case %zu: %s", apis[w]->name, k, err.msg);
                if (s == OSCAR_OK) cr_expect(strstr(variant, "_w3") != NULL, "%s: variant %s", apis[w]->name, variant);
            }
            if (s == OSCAR_OK) apis[w]->plan_destroy(ctxs[w], plan);
        }
    }
    apis[0]->shutdown(ctxs[0]);
    free(rk);
    free(rv);
}
Test(wide, plan_refuses_bad_code_bits, .timeout = 300) { FOR_EACH_BACKEND(g, wide_refusals(&g)); }
