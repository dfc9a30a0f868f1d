/* An inference engine's use of an installed liboscar, the way vLLM or
 * llama.cpp embed a kernel library: the engine owns every buffer (page pools
 * per layer, window pools, block tables, activations, one workspace), its
 * own page and window-slot allocators, and its own stream; the library only
 * reads and writes them. Built against the installed (and moved) prefix by
 * tests/install/check_install.sh through find_package(oscar CONFIG).
 *
 * A 3-layer model: layer 0 kept in BF16 (method bf16), layers 1-2 in 2 bits
 * (quarot2), so two plans of different page sizes share one workspace and one
 * stream. Four requests with continuous batching: prompts prefilled in chunks
 * (append, then oscar_extend with LSE over the chunk's queries) mixed with
 * other requests' decode tokens in the same batch; a finished request's pages
 * and window slot are scribbled over and handed to the next one. Every output
 * and LSE is checked against exact attention computed here in double over
 * the rows as the cache holds them (BF16 layer: the bf16 rows; 2-bit layers:
 * the 16-bit sink and recent rows and, between them, the rows through
 * oscar_fakequant, the cache's own codec), decode against extend bit for bit, the
 * rotated output against R_V, and the OpenCL run (the engine's own cl_context,
 * queues and cl_mem buffers) against the CPU run. Then the error paths an
 * engine meets, each with its status code and a message naming the problem.
 * Exit status 0 only if every check passed.
 * Usage: engine_consumer [--require-opencl | --cpu-only] */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oscar/oscar.h>

#ifdef ENGINE_OPENCL
#include <CL/cl.h>
#endif

enum {
    LAYERS = 3, HQ = 4, HKV = 2, D = 128, GROUP = 64, PAGE = 16, SINK = 16, RECENT = 32, MAXLEN = 256,
    SLOTS = 3,   /* window slots = most sequences in flight */
    MAXCHUNK = 40,
    NREQ = 4,
    MAXSTEPS = 64,
    MAXTOK = SLOTS * MAXCHUNK, /* most new tokens in one step */
};
/* Prefill chunks: request 0's is longer than the recent window (its first queries then see the
 * chunk's end in 2 bits, FORMAT.md §5.1), the others' shorter. */
static const int k_prompt[NREQ] = {150, 60, 90, 120}, k_gen[NREQ] = {8, 8, 8, 8}, k_chunk[NREQ] = {40, 24, 16, 24};
#define ROW_KV (HKV * D)
#define ROW_Q (HQ * D)

static int g_failures;
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "engine_consumer: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    g_failures++;
}
#define CHECK_OK(call)                                                                                                \
    do {                                                                                                              \
        oscar_status s_ = (call);                                                                                     \
        if (s_ != OSCAR_OK) {                                                                                         \
            fail("%s:%d: %s -> %d (%s)", __FILE__, __LINE__, #call, (int)s_, oscar_last_error());                     \
            return 0;                                                                                                 \
        }                                                                                                             \
    } while (0)

/* ------------------------------------------------------------ numbers */
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Deterministic value of (what, request, position, layer, element), roughly N(0, 1) with a few
 * large channels in K as real keys have. */
static float value(int what, int req, int pos, int layer, int e) {
    uint64_t x = ((uint64_t)what << 56) ^ ((uint64_t)req << 48) ^ ((uint64_t)pos << 24) ^ ((uint64_t)layer << 20) ^
                 (uint64_t)e;
    double s = 0;
    for (int i = 0; i < 4; i++) {
        x += 0x9e3779b97f4a7c15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        s += (double)(z >> 11) * 0x1p-53;
    }
    double v = (s - 2.0) * 1.7320508; /* sum of 4 uniforms: mean 2, variance 1/3 */
    if (what == 1 && e % D == 7) v *= 8.0;  /* a key outlier channel */
    return (float)v;
}

/* --------------------------------------------------------- the device */
/* The engine's memory: host memory on the CPU backend, its own cl_mem on OpenCL. */
typedef struct dev {
    const char *name;
    oscar_runtime *rt;
    void *stream; /* the engine's queue (NULL on the CPU) */
#ifdef ENGINE_OPENCL
    cl_context ctx;
    cl_command_queue qdef, qeng;
#endif
} dev;

static void *dev_alloc(dev *d, size_t bytes) {
#ifdef ENGINE_OPENCL
    if (d->ctx) {
        cl_int rc;
        cl_mem m = clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, bytes, NULL, &rc);
        return rc == CL_SUCCESS ? (void *)m : NULL;
    }
#endif
    (void)d;
    return calloc(1, bytes);
}
static void dev_free(dev *d, void *p) {
    if (!p) return;
#ifdef ENGINE_OPENCL
    if (d->ctx) {
        clReleaseMemObject((cl_mem)p);
        return;
    }
#endif
    (void)d;
    free(p);
}
static int dev_put(dev *d, void *dst, size_t off, const void *src, size_t bytes) {
#ifdef ENGINE_OPENCL
    if (d->ctx) return clEnqueueWriteBuffer(d->qeng, (cl_mem)dst, CL_TRUE, off, bytes, src, 0, NULL, NULL) == CL_SUCCESS;
#endif
    (void)d;
    memcpy((char *)dst + off, src, bytes);
    return 1;
}
static int dev_get(dev *d, void *dst, const void *src, size_t bytes) {
#ifdef ENGINE_OPENCL
    if (d->ctx) return clEnqueueReadBuffer(d->qeng, (cl_mem)src, CL_TRUE, 0, bytes, dst, 0, NULL, NULL) == CL_SUCCESS;
#endif
    (void)d;
    memcpy(dst, src, bytes);
    return 1;
}

/* ------------------------------------------------------------- the engine */
typedef struct kind { /* one cache layout (BF16 pages or 2-bit pages) */
    oscar_layout_desc l;
    oscar_layout_sizes sz;
    oscar_params *params;
    oscar_plan *plan;
    int num_pages, stride; /* pages in each layer's pool; block table columns */
    int free_pages[64], nfree;
} kind;

typedef struct request {
    int id, len, slot, active, done;
    int pages[2][32], npages[2]; /* per kind */
} request;

typedef struct engine {
    dev *d;
    kind kinds[2]; /* 0: bf16 (layer 0), 1: 2-bit (layers 1, 2) */
    void *pages[LAYERS], *windows[LAYERS];
    void *ws;
    size_t ws_bytes;
    /* per-step device buffers */
    void *lens, *slots, *bt[2], *cu, *k, *v, *q, *out, *out2, *lse;
    request req[NREQ];
    int free_slots[SLOTS], nfree_slots;
    /* host copies of every row, for the reference */
    uint16_t *hk, *hv; /* [NREQ][LAYERS][MAXLEN][HKV][D] */
    float *fk, *fv;    /* the same rows as the 2-bit region stores them (oscar_fakequant) */
    /* results kept for the CPU/OpenCL comparison: [step][layer][MAXTOK][HQ][D] */
    uint16_t *outs;
    int steps;
    double err2[2], ref2[2], lse_err[2], worst[2];
    int decode_checks, rot_checks;
} engine;

static int kind_of_layer(int layer) { return layer == 0 ? 0 : 1; }
static int plan_layer(int layer) { return layer == 0 ? 0 : layer - 1; }
static size_t row_at(int r, int layer, int pos) {
    return (((size_t)r * LAYERS + (size_t)layer) * MAXLEN + (size_t)pos) * ROW_KV;
}

static int kind_init(engine *e, int k, oscar_method m, int nlayers) {
    kind *kd = &e->kinds[k];
    oscar_layout_default(&kd->l); /* start from the defaults, then the model's shape */
    kd->l.head_dim = D, kd->l.group = GROUP, kd->l.num_q_heads = HQ, kd->l.num_kv_heads = HKV;
    kd->l.page_size = PAGE, kd->l.sink = SINK, kd->l.recent = RECENT, kd->l.max_seq_len = MAXLEN;
    kd->l.method = m;
    CHECK_OK(oscar_layout_validate(&kd->l));
    CHECK_OK(oscar_layout_sizes_get(&kd->l, &kd->sz));
    int64_t per_seq = 0, total = 0;
    CHECK_OK(oscar_layout_pages_for(&kd->l, MAXLEN, &per_seq));
    for (int r = 0; r < NREQ; r++) {
        int64_t n;
        CHECK_OK(oscar_layout_pages_for(&kd->l, k_prompt[r] + k_gen[r], &n));
        total += n;
    }
    kd->stride = (int)per_seq;
    if (kd->stride > 16) return fail("kind %d: %d pages per sequence, the tables here hold 16", k, kd->stride), 0;
    kd->num_pages = (int)total - 1; /* fewer than all requests need: pages must be reused */
    if (kd->num_pages > 64) return fail("kind %d: %d pages", k, kd->num_pages), 0;
    for (int i = 0; i < kd->num_pages; i++) kd->free_pages[i] = kd->num_pages - 1 - i;
    kd->nfree = kd->num_pages;
    CHECK_OK(oscar_params_create_builtin(m, nlayers, HQ, HKV, D, &kd->params));
    CHECK_OK(oscar_params_check_shape(kd->params, nlayers, HQ, HKV, D, NULL));
    CHECK_OK(oscar_plan_create(e->d->rt, &kd->l, kd->params, &kd->plan));
    return 1;
}

static int engine_init(engine *e, dev *d) {
    memset(e, 0, sizeof *e);
    e->d = d;
    if (!kind_init(e, 0, OSCAR_METHOD_BF16, 1) || !kind_init(e, 1, OSCAR_METHOD_QUAROT2, 2)) return 0;
    if (e->kinds[0].sz.window_slot_bytes != 0) return fail("bf16 layout has window slots"), 0;
    for (int layer = 0; layer < LAYERS; layer++) {
        kind *kd = &e->kinds[kind_of_layer(layer)];
        e->pages[layer] = dev_alloc(d, (size_t)kd->num_pages * kd->sz.page_bytes);
        if (kd->sz.window_slot_bytes) e->windows[layer] = dev_alloc(d, SLOTS * kd->sz.window_slot_bytes);
        if (!e->pages[layer] || (kd->sz.window_slot_bytes && !e->windows[layer])) return fail("pool alloc"), 0;
    }
    /* One workspace for both plans, sized for the larger, initialised once per plan. */
    for (int k = 0; k < 2; k++) {
        size_t b;
        CHECK_OK(oscar_plan_workspace_bytes(e->kinds[k].plan, MAXTOK, MAXLEN, &b));
        if (b > e->ws_bytes) e->ws_bytes = b;
    }
    e->ws = dev_alloc(d, e->ws_bytes);
    e->lens = dev_alloc(d, sizeof(int32_t) * SLOTS);
    e->slots = dev_alloc(d, sizeof(int32_t) * SLOTS);
    e->cu = dev_alloc(d, sizeof(int32_t) * (SLOTS + 1));
    for (int k = 0; k < 2; k++) e->bt[k] = dev_alloc(d, sizeof(int32_t) * SLOTS * (size_t)e->kinds[k].stride);
    e->k = dev_alloc(d, 2 * MAXTOK * ROW_KV);
    e->v = dev_alloc(d, 2 * MAXTOK * ROW_KV);
    e->q = dev_alloc(d, 2 * MAXTOK * ROW_Q);
    e->out = dev_alloc(d, 2 * MAXTOK * ROW_Q);
    e->out2 = dev_alloc(d, 2 * MAXTOK * ROW_Q);
    e->lse = dev_alloc(d, sizeof(float) * MAXTOK * HQ);
    if (!e->ws || !e->lens || !e->slots || !e->cu || !e->bt[0] || !e->bt[1] || !e->k || !e->v || !e->q || !e->out ||
        !e->out2 || !e->lse)
        return fail("buffer alloc"), 0;
    for (int k = 0; k < 2; k++) CHECK_OK(oscar_plan_workspace_init(e->kinds[k].plan, e->ws, d->stream));
    for (int i = 0; i < SLOTS; i++) e->free_slots[i] = SLOTS - 1 - i;
    e->nfree_slots = SLOTS;
    e->hk = calloc((size_t)NREQ * LAYERS * MAXLEN * ROW_KV, 2);
    e->hv = calloc((size_t)NREQ * LAYERS * MAXLEN * ROW_KV, 2);
    e->fk = calloc((size_t)NREQ * LAYERS * MAXLEN * ROW_KV, sizeof(float));
    e->fv = calloc((size_t)NREQ * LAYERS * MAXLEN * ROW_KV, sizeof(float));
    e->outs = calloc((size_t)MAXSTEPS * LAYERS * MAXTOK * ROW_Q, 2);
    for (int r = 0; r < NREQ; r++) e->req[r].id = r;
    return e->hk && e->hv && e->fk && e->fv && e->outs ? 1 : (fail("host alloc"), 0);
}

static void engine_free(engine *e) {
    dev *d = e->d;
    for (int layer = 0; layer < LAYERS; layer++) dev_free(d, e->pages[layer]), dev_free(d, e->windows[layer]);
    void *bufs[] = {e->ws, e->lens, e->slots, e->cu, e->bt[0], e->bt[1], e->k, e->v, e->q, e->out, e->out2, e->lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dev_free(d, bufs[i]);
    for (int k = 0; k < 2; k++) oscar_plan_destroy(e->kinds[k].plan), oscar_params_destroy(e->kinds[k].params);
    free(e->hk), free(e->hv), free(e->fk), free(e->fv), free(e->outs);
}

/* Grows a request's page lists to cover len tokens; 0 when the pool is dry. */
static int reserve(engine *e, request *r, int len) {
    for (int k = 0; k < 2; k++) {
        kind *kd = &e->kinds[k];
        int64_t need;
        if (oscar_layout_pages_for(&kd->l, len, &need)) return 0;
        while (r->npages[k] < need) {
            if (!kd->nfree) return 0;
            r->pages[k][r->npages[k]++] = kd->free_pages[--kd->nfree];
        }
    }
    return 1;
}

/* A finished request gives back its pages and slot; the engine does not clear
 * them, and here scribbles over them so stale bytes cannot pass for a cache. */
static int release(engine *e, request *r) {
    static unsigned char junk[65536];
    memset(junk, 0xa5, sizeof junk);
    if (e->kinds[0].sz.page_bytes > sizeof junk || e->kinds[1].sz.page_bytes > sizeof junk ||
        e->kinds[1].sz.window_slot_bytes > sizeof junk)
        return fail("pages or slots larger than the scribble buffer"), 0;
    for (int k = 0; k < 2; k++) {
        kind *kd = &e->kinds[k];
        for (int i = 0; i < r->npages[k]; i++) {
            int pg = r->pages[k][i];
            for (int layer = 0; layer < LAYERS; layer++)
                if (kind_of_layer(layer) == k &&
                    !dev_put(e->d, e->pages[layer], (size_t)pg * kd->sz.page_bytes, junk, kd->sz.page_bytes))
                    return fail("scribble page"), 0;
            kd->free_pages[kd->nfree++] = pg;
        }
        r->npages[k] = 0;
    }
    for (int layer = 1; layer < LAYERS; layer++)
        if (!dev_put(e->d, e->windows[layer], (size_t)r->slot * e->kinds[1].sz.window_slot_bytes, junk,
                     e->kinds[1].sz.window_slot_bytes))
            return fail("scribble slot"), 0;
    e->free_slots[e->nfree_slots++] = r->slot;
    r->active = 0, r->done = 1;
    return 1;
}

/* Exact attention of one query (bf16 values, double math) over rows 0..t of a request's layer
 * stored at length L: the sink and the last RECENT rows as given (16-bit), the rows between
 * them as the 2-bit region holds them (oscar_fakequant) on the 2-bit layers. */
static void reference(const engine *e, int r, int layer, int64_t L, int t, const uint16_t *q, double *o,
                      double *lse) {
    const double scale = 1.0 / sqrt((double)D);
    double *s = malloc(sizeof(double) * (size_t)(t + 1));
    if (!s) {
        fail("host alloc");
        for (int i = 0; i < ROW_Q; i++) o[i] = NAN;
        for (int h = 0; h < HQ; h++) lse[h] = NAN;
        return;
    }
    for (int h = 0; h < HQ; h++) {
        int g = h / (HQ / HKV);
        double m = -INFINITY;
        for (int p = 0; p <= t; p++) {
            int q2 = layer > 0 && p >= SINK && p < L - RECENT;
            const uint16_t *kr = e->hk + row_at(r, layer, p) + (size_t)g * D;
            const float *fr = e->fk + row_at(r, layer, p) + (size_t)g * D;
            double dot = 0;
            for (int i = 0; i < D; i++) dot += (double)bf2f(q[h * D + i]) * (q2 ? fr[i] : bf2f(kr[i]));
            s[p] = dot * scale;
            if (s[p] > m) m = s[p];
        }
        double l = 0;
        for (int i = 0; i < D; i++) o[h * D + i] = 0;
        for (int p = 0; p <= t; p++) {
            int q2 = layer > 0 && p >= SINK && p < L - RECENT;
            double w = exp(s[p] - m);
            const uint16_t *vr = e->hv + row_at(r, layer, p) + (size_t)g * D;
            const float *fr = e->fv + row_at(r, layer, p) + (size_t)g * D;
            l += w;
            for (int i = 0; i < D; i++) o[h * D + i] += w * (q2 ? fr[i] : bf2f(vr[i]));
        }
        for (int i = 0; i < D; i++) o[h * D + i] /= l;
        lse[h] = m + log(l);
    }
    free(s);
}

typedef struct step_batch {
    int n, who[SLOTS], newtok[SLOTS], total, maxq, all_decode;
    int32_t lens[SLOTS], slots[SLOTS], cu[SLOTS + 1];
} step_batch;

/* Admits waiting requests into free slots and picks each active one's tokens. */
static int schedule(engine *e, step_batch *sb) {
    memset(sb, 0, sizeof *sb);
    for (int r = 0; r < NREQ; r++) {
        request *rq = &e->req[r];
        if (!rq->active && !rq->done && e->nfree_slots) {
            rq->active = 1, rq->len = 0, rq->slot = e->free_slots[--e->nfree_slots];
        }
    }
    sb->all_decode = 1;
    for (int r = 0; r < NREQ; r++) {
        request *rq = &e->req[r];
        if (!rq->active) continue;
        int n = rq->len < k_prompt[r] ? (k_prompt[r] - rq->len < k_chunk[r] ? k_prompt[r] - rq->len : k_chunk[r]) : 1;
        if (!reserve(e, rq, rq->len + n)) return fail("page pool dry for request %d", r), 0;
        sb->who[sb->n] = r, sb->newtok[sb->n] = n;
        sb->lens[sb->n] = rq->len + n, sb->slots[sb->n] = rq->slot;
        sb->cu[sb->n + 1] = sb->cu[sb->n] + n;
        if (n > sb->maxq) sb->maxq = n;
        if (n != 1) sb->all_decode = 0;
        sb->n++;
    }
    sb->total = sb->cu[sb->n];
    return 1;
}

static int run_step(engine *e, int step) {
    step_batch sb;
    if (!schedule(e, &sb)) return 0;
    if (!sb.n) return 2; /* all done */
    dev *d = e->d;
    int32_t bt[2][SLOTS * 32];
    for (int k = 0; k < 2; k++) {
        memset(bt[k], 0xff, sizeof bt[k]); /* unused columns: -1, never read */
        for (int i = 0; i < sb.n; i++)
            for (int j = 0; j < e->req[sb.who[i]].npages[k]; j++)
                bt[k][i * e->kinds[k].stride + j] = e->req[sb.who[i]].pages[k][j];
        if (!dev_put(d, e->bt[k], 0, bt[k], sizeof(int32_t) * (size_t)(sb.n * e->kinds[k].stride))) return 0;
    }
    if (!dev_put(d, e->lens, 0, sb.lens, sizeof(int32_t) * (size_t)sb.n) ||
        !dev_put(d, e->slots, 0, sb.slots, sizeof(int32_t) * (size_t)sb.n) ||
        !dev_put(d, e->cu, 0, sb.cu, sizeof(int32_t) * (size_t)(sb.n + 1)))
        return fail("upload"), 0;
    int maxlen = 0;
    for (int i = 0; i < sb.n; i++) maxlen = sb.lens[i] > maxlen ? sb.lens[i] : maxlen;

    static uint16_t k[MAXTOK * ROW_KV], v[MAXTOK * ROW_KV], q[MAXTOK * ROW_Q], out[MAXTOK * ROW_Q],
        out2[MAXTOK * ROW_Q];
    static float lse[MAXTOK * HQ], lse2[MAXTOK * HQ];
    for (int layer = 0; layer < LAYERS; layer++) {
        kind *kd = &e->kinds[kind_of_layer(layer)];
        int pl = plan_layer(layer);
        /* this layer's new K/V rows and queries (the engine's projections + RoPE) */
        for (int i = 0; i < sb.n; i++)
            for (int j = 0; j < sb.newtok[i]; j++) {
                int r = sb.who[i], pos = sb.lens[i] - sb.newtok[i] + j, tok = sb.cu[i] + j;
                for (int x = 0; x < ROW_KV; x++) {
                    k[tok * ROW_KV + x] = e->hk[row_at(r, layer, pos) + (size_t)x] = f2bf(value(1, r, pos, layer, x));
                    v[tok * ROW_KV + x] = e->hv[row_at(r, layer, pos) + (size_t)x] = f2bf(value(2, r, pos, layer, x));
                }
                for (int x = 0; x < ROW_Q; x++) q[tok * ROW_Q + x] = f2bf(value(3, r, pos, layer, x));
            }
        if (layer > 0) /* what the 2-bit region will hold of these rows, for the reference */
            for (int i = 0; i < sb.n; i++) {
                size_t at = row_at(sb.who[i], layer, sb.lens[i] - sb.newtok[i]);
                for (size_t x = 0; x < (size_t)sb.newtok[i] * ROW_KV; x++)
                    e->fk[at + x] = bf2f(e->hk[at + x]), e->fv[at + x] = bf2f(e->hv[at + x]);
                CHECK_OK(oscar_fakequant(kd->params, kd->l.method, pl, OSCAR_K, GROUP, sb.newtok[i], HKV, D, e->fk + at));
                CHECK_OK(oscar_fakequant(kd->params, kd->l.method, pl, OSCAR_V, GROUP, sb.newtok[i], HKV, D, e->fv + at));
            }
        if (!dev_put(d, e->k, 0, k, 2u * (size_t)sb.total * ROW_KV) ||
            !dev_put(d, e->v, 0, v, 2u * (size_t)sb.total * ROW_KV) ||
            !dev_put(d, e->q, 0, q, 2u * (size_t)sb.total * ROW_Q))
            return fail("upload rows"), 0;
        oscar_cache c = {e->pages[layer], kd->num_pages, e->windows[layer], e->windows[layer] ? SLOTS : 0};
        oscar_batch b = {sb.n, e->lens, e->windows[layer] ? e->slots : NULL, e->bt[kind_of_layer(layer)], kd->stride,
                         maxlen};
        CHECK_OK(oscar_append(kd->plan, pl, &c, &b, e->cu, sb.total, e->k, e->v, 0, e->ws, e->ws_bytes, d->stream));
        oscar_attn_args a;
        oscar_attn_args_default(&a);
        a.cu_q = e->cu, a.total_q = sb.total, a.max_q_len = sb.maxq;
        a.q = e->q, a.out = e->out, a.out_bytes = 2u * (size_t)sb.total * ROW_Q;
        a.lse = e->lse, a.lse_bytes = sizeof(float) * (size_t)sb.total * HQ;
        a.workspace = e->ws, a.workspace_bytes = e->ws_bytes, a.stream = d->stream;
        CHECK_OK(oscar_extend(kd->plan, pl, &c, &b, &a));
        CHECK_OK(oscar_plan_check(kd->plan, e->ws, d->stream));
        if (!dev_get(d, out, e->out, 2u * (size_t)sb.total * ROW_Q) ||
            !dev_get(d, lse, e->lse, sizeof(float) * (size_t)sb.total * HQ))
            return fail("download"), 0;
        memcpy(e->outs + ((size_t)step * LAYERS + (size_t)layer) * MAXTOK * ROW_Q, out, 2u * (size_t)sb.total * ROW_Q);

        /* against exact attention */
        int kk = kind_of_layer(layer);
        for (int i = 0; i < sb.n; i++)
            for (int j = 0; j < sb.newtok[i]; j++) {
                int tok = sb.cu[i] + j, pos = sb.lens[i] - sb.newtok[i] + j;
                double o[ROW_Q], l[HQ], num = 0, den = 0;
                reference(e, sb.who[i], layer, sb.lens[i], pos, q + tok * ROW_Q, o, l);
                for (int x = 0; x < ROW_Q; x++) {
                    double g = bf2f(out[tok * ROW_Q + x]);
                    num += (g - o[x]) * (g - o[x]), den += o[x] * o[x];
                }
                e->err2[kk] += num, e->ref2[kk] += den;
                if (sqrt(num / den) > e->worst[kk]) e->worst[kk] = sqrt(num / den);
                for (int h = 0; h < HQ; h++) {
                    double dl = fabs(lse[tok * HQ + h] - l[h]);
                    if (!(dl <= (kk == 0 ? 1e-3 : 0.05)))
                        fail("%s layer %d request %d position %d head %d: lse %.6f, exact %.6f", d->name, layer,
                             sb.who[i], pos, h, lse[tok * HQ + h], l[h]);
                    if (dl > e->lse_err[kk]) e->lse_err[kk] = dl;
                }
            }
        /* a decode step: oscar_decode and extend without cu_q give the same bits */
        if (sb.all_decode) {
            int rot = layer > 0 && (step % 2);
            CHECK_OK(oscar_decode(kd->plan, pl, &c, &b, e->q, 0, e->out2, 0, 0.0f, rot, e->ws, e->ws_bytes, d->stream));
            oscar_attn_args a1 = a;
            a1.cu_q = NULL, a1.out = e->out, a1.rotated_output = rot;
            CHECK_OK(oscar_extend(kd->plan, pl, &c, &b, &a1));
            CHECK_OK(oscar_plan_check(kd->plan, e->ws, d->stream));
            if (!dev_get(d, out2, e->out2, 2u * (size_t)sb.n * ROW_Q) ||
                !dev_get(d, out, e->out, 2u * (size_t)sb.n * ROW_Q) ||
                !dev_get(d, lse2, e->lse, sizeof(float) * (size_t)sb.n * HQ))
                return fail("download"), 0;
            if (memcmp(out, out2, 2u * (size_t)sb.n * ROW_Q))
                fail("%s layer %d step %d: oscar_decode and oscar_extend (cu_q NULL) differ", d->name, layer, step);
            if (memcmp(lse, lse2, sizeof(float) * (size_t)sb.n * HQ))
                fail("%s layer %d step %d: LSE of extend with and without cu_q differ", d->name, layer, step);
            e->decode_checks++;
            if (rot) { /* o R_V: turned back with R_V^T it is the first extend's output */
                const uint16_t *plain = e->outs + ((size_t)step * LAYERS + (size_t)layer) * MAXTOK * ROW_Q;
                for (int i = 0; i < sb.n; i++)
                    for (int h = 0; h < HQ; h++) {
                        const float *R;
                        CHECK_OK(oscar_params_rotation(kd->params, pl, h / (HQ / HKV), OSCAR_V, &R));
                        double num = 0, den = 0;
                        for (int x = 0; x < D; x++) {
                            double o = 0;
                            for (int y = 0; y < D; y++) o += (double)bf2f(out2[(i * HQ + h) * D + y]) * R[x * D + y];
                            double want = bf2f(plain[(i * HQ + h) * D + x]);
                            num += (o - want) * (o - want), den += want * want;
                        }
                        if (!(sqrt(num / den) < 0.02))
                            fail("%s layer %d: rotated output times R_V^T is %.3g off the plain output", d->name, layer,
                                 sqrt(num / den));
                    }
                e->rot_checks++;
            }
        }
    }
    /* advance; finished requests hand their pages and slot on */
    for (int i = 0; i < sb.n; i++) {
        request *rq = &e->req[sb.who[i]];
        rq->len = sb.lens[i];
        if (rq->len == k_prompt[rq->id] + k_gen[rq->id] && !release(e, rq)) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ error paths */
static int expect(const char *what, oscar_status got, oscar_status want, const char *needle) {
    const char *msg = oscar_last_error();
    if (got != want) return fail("%s: status %d, expected %d (%s)", what, (int)got, (int)want, msg), 0;
    if (!msg[0] || (needle && !strstr(msg, needle)))
        return fail("%s: message \"%s\" does not name \"%s\"", what, msg, needle ? needle : "anything"), 0;
    return 1;
}

/* A device-side error comes back at the call (CPU) or from oscar_plan_check (GPUs). */
static oscar_status through_check(oscar_status s, oscar_plan *plan, engine *e) {
    return s != OSCAR_OK ? s : oscar_plan_check(plan, e->ws, e->d->stream);
}

static int error_paths(engine *e) {
    dev *d = e->d;
    kind *kd = &e->kinds[1];
    /* one sequence of 100 tokens in slot 0, pages 0..3 */
    int32_t len = 100, slot = 0, cu[2] = {0, 1}, bt[16];
    for (int i = 0; i < kd->stride; i++) bt[i] = i < 4 ? i : -1;
    if (!dev_put(d, e->lens, 0, &len, 4) || !dev_put(d, e->slots, 0, &slot, 4) || !dev_put(d, e->cu, 0, cu, 8) ||
        !dev_put(d, e->bt[1], 0, bt, sizeof(int32_t) * (size_t)kd->stride))
        return 0;
    oscar_cache c = {e->pages[1], kd->num_pages, e->windows[1], SLOTS};
    oscar_batch b = {1, e->lens, e->slots, e->bt[1], kd->stride, MAXLEN};
    int ok = 1;
    ok &= expect("workspace too small",
                 oscar_decode(kd->plan, 0, &c, &b, e->q, 0, e->out, 0, 0.0f, 0, e->ws, 64, d->stream),
                 OSCAR_ERR_WORKSPACE, "workspace");
    ok &= expect("layer past the plan's parameters",
                 oscar_decode(kd->plan, 2, &c, &b, e->q, 0, e->out, 0, 0.0f, 0, e->ws, e->ws_bytes, d->stream),
                 OSCAR_ERR_INVALID_ARGUMENT, "layer 2");
    ok &= expect("block table shorter than the batch's bound",
                 oscar_decode(kd->plan, 0, &c, &(oscar_batch){1, e->lens, e->slots, e->bt[1], 2, MAXLEN}, e->q, 0,
                              e->out, 0, 0.0f, 0, e->ws, e->ws_bytes, d->stream),
                 OSCAR_ERR_TOO_LONG, "block_table_stride");
    /* a page id past the pool */
    bt[3] = kd->num_pages;
    if (!dev_put(d, e->bt[1], 0, bt, sizeof(int32_t) * (size_t)kd->stride)) return 0;
    ok &= expect("block table entry past the pool",
                 through_check(oscar_decode(kd->plan, 0, &c, &b, e->q, 0, e->out, 0, 0.0f, 0, e->ws, e->ws_bytes,
                                            d->stream),
                               kd->plan, e),
                 OSCAR_ERR_BLOCK_TABLE, "block");
    bt[3] = 3;
    if (!dev_put(d, e->bt[1], 0, bt, sizeof(int32_t) * (size_t)kd->stride)) return 0;
    /* the device flag is cleared: the next good call passes */
    CHECK_OK(oscar_decode(kd->plan, 0, &c, &b, e->q, 0, e->out, 0, 0.0f, 0, e->ws, e->ws_bytes, d->stream));
    CHECK_OK(oscar_plan_check(kd->plan, e->ws, d->stream));
    if (oscar_last_error()[0]) ok = 0, fail("a successful call left the message \"%s\"", oscar_last_error());
    /* a NaN key row */
    uint16_t row[ROW_KV] = {0};
    row[5] = 0x7fc0;
    if (!dev_put(d, e->k, 0, row, sizeof row)) return 0;
    ok &= expect("NaN in a key row",
                 through_check(oscar_append(kd->plan, 0, &c, &b, e->cu, 1, e->k, e->v, 0, e->ws, e->ws_bytes,
                                            d->stream),
                               kd->plan, e),
                 OSCAR_ERR_NONFINITE, "NaN");
    oscar_attn_args a;
    oscar_attn_args_default(&a);
    a.total_q = 1, a.max_q_len = 1, a.q = e->q, a.out = e->out, a.out_bytes = ROW_Q; /* half of what it writes */
    a.workspace = e->ws, a.workspace_bytes = e->ws_bytes, a.stream = d->stream;
    ok &= expect("extend output smaller than it writes", oscar_extend(kd->plan, 0, &c, &b, &a),
                 OSCAR_ERR_INVALID_ARGUMENT, "out_bytes");
    a.out_bytes = 2 * ROW_Q;
    a.struct_size = 3; /* never filled by oscar_attn_args_default */
    ok &= expect("unversioned args", oscar_extend(kd->plan, 0, &c, &b, &a), OSCAR_ERR_VERSION, "struct_size");
    oscar_layout_desc l = kd->l;
    l.head_dim = 100;
    ok &= expect("head_dim 100", oscar_layout_validate(&l), OSCAR_ERR_UNSUPPORTED_HEAD_DIM, "head_dim 100");
    oscar_params *p4;
    CHECK_OK(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 2, 8, 4, D, &p4));
    oscar_plan *bad = NULL;
    ok &= expect("parameters of another model", oscar_plan_create(d->rt, &kd->l, p4, &bad), OSCAR_ERR_SHAPE_MISMATCH,
                 NULL);
    oscar_plan_destroy(bad);
    oscar_params_destroy(p4);
    oscar_runtime_options o;
    oscar_runtime_options_default(&o);
    o.backend = "vulkan";
    oscar_runtime *rt2 = NULL;
    ok &= expect("unknown backend", oscar_runtime_create(&o, &rt2), OSCAR_ERR_NO_BACKEND, "vulkan");
    if (rt2) ok = 0, fail("a refused runtime_create returned a handle");
    return ok;
}

/* --------------------------------------------------------------- driver */
static int run_engine(dev *d, engine *e) {
    if (!engine_init(e, d)) return 0;
    for (e->steps = 0; e->steps < MAXSTEPS; e->steps++) {
        int s = run_step(e, e->steps);
        if (!s) return 0;
        if (s == 2) break;
    }
    for (int r = 0; r < NREQ; r++)
        if (!e->req[r].done) return fail("%s: request %d never finished", d->name, r), 0;
    double bf = sqrt(e->err2[0] / e->ref2[0]), q2 = sqrt(e->err2[1] / e->ref2[1]);
    if (!(e->worst[0] < 0.01)) fail("%s: bf16 layer output off exact attention by %.3g", d->name, e->worst[0]);
    if (!(e->worst[1] < 0.02)) fail("%s: 2-bit layers' output off attention over their stored rows by %.3g", d->name, e->worst[1]);
    if (e->decode_checks < 8 || e->rot_checks < 4)
        fail("%s: only %d decode and %d rotated checks ran", d->name, e->decode_checks, e->rot_checks);
    printf("engine on %s (%s): %d layers, %d requests, %d steps; error vs attention over the stored rows: bf16 %.2e "
           "(lse %.1e), quarot2 %.3f (worst token %.3f, lse %.3f); decode == extend %d times\n",
           oscar_runtime_backend(d->rt), oscar_runtime_device(d->rt), LAYERS, NREQ, e->steps, bf, e->lse_err[0], q2,
           e->worst[1], e->lse_err[1], e->decode_checks);
    return error_paths(e);
}

int main(int argc, char **argv) {
    int require_opencl = argc > 1 && !strcmp(argv[1], "--require-opencl");
    int cpu_only = argc > 1 && !strcmp(argv[1], "--cpu-only");
    int major = -1;
    oscar_version(&major, NULL, NULL);
    if (major != OSCAR_VERSION_MAJOR) return fail("header major %d, library %d", OSCAR_VERSION_MAJOR, major), 1;

    static engine ecpu;
    dev cpu = {.name = "cpu"};
    oscar_runtime_options o;
    oscar_runtime_options_default(&o);
    o.backend = "cpu";
    if (oscar_runtime_create(&o, &cpu.rt)) return fail("cpu runtime: %s", oscar_last_error()), 1;
    run_engine(&cpu, &ecpu);
    oscar_runtime_destroy(cpu.rt); /* before the plans: allowed, they hold the backend */

#ifdef ENGINE_OPENCL
    static engine ecl;
    dev cl = {.name = "opencl"};
    cl_platform_id plat;
    cl_device_id cdev;
    cl_uint np = 0;
    cl_int rc = CL_SUCCESS;
    int have = !cpu_only && clGetPlatformIDs(1, &plat, &np) == CL_SUCCESS && np > 0 &&
               clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &cdev, NULL) == CL_SUCCESS;
    if (have) {
        cl.ctx = clCreateContext(NULL, 1, &cdev, NULL, NULL, &rc);
        cl.qdef = clCreateCommandQueue(cl.ctx, cdev, 0, &rc);
        cl.qeng = clCreateCommandQueue(cl.ctx, cdev, 0, &rc);
        cl.stream = cl.qeng; /* every call on the engine's queue, not the runtime's default */
        oscar_runtime_options_default(&o);
        o.native_context = cl.ctx, o.native_queue = cl.qdef;
        if (rc != CL_SUCCESS || oscar_runtime_create(&o, &cl.rt)) {
            have = 0;
            if (require_opencl) fail("opencl runtime on the engine's context: %s", oscar_last_error());
        }
    } else if (require_opencl) {
        fail("no OpenCL device");
    }
    if (have) {
        if (run_engine(&cl, &ecl) && ecl.steps == ecpu.steps) {
            /* the same steps on both backends: outputs agree within bf16 rounding and 2-bit ties */
            double num[2] = {0, 0}, den[2] = {0, 0};
            for (size_t i = 0; i < (size_t)ecl.steps * LAYERS * MAXTOK * ROW_Q; i++) {
                int kk = (int)((i / ((size_t)MAXTOK * ROW_Q)) % LAYERS) ? 1 : 0;
                double a = bf2f(ecpu.outs[i]), g = bf2f(ecl.outs[i]);
                num[kk] += (a - g) * (a - g), den[kk] += a * a;
            }
            printf("opencl vs cpu: bf16 %.2e, quarot2 %.2e\n", sqrt(num[0] / den[0]), sqrt(num[1] / den[1]));
            if (!(sqrt(num[0] / den[0]) < 0.01) || !(sqrt(num[1] / den[1]) < 0.03))
                fail("opencl and cpu outputs differ: %.3g / %.3g", sqrt(num[0] / den[0]), sqrt(num[1] / den[1]));
        }
        oscar_runtime_destroy(cl.rt);
        engine_free(&ecl); /* plans released after the runtime; the engine's buffers after the plans */
    }
    if (cl.qeng) clReleaseCommandQueue(cl.qeng);
    if (cl.qdef) clReleaseCommandQueue(cl.qdef);
    if (cl.ctx) clReleaseContext(cl.ctx);
#else
    (void)cpu_only;
    if (require_opencl) fail("built without OpenCL headers");
#endif
    engine_free(&ecpu);
    if (g_failures) {
        fprintf(stderr, "engine_consumer: %d check(s) failed\n", g_failures);
        return 1;
    }
    printf("engine_consumer: all checks passed\n");
    return 0;
}
