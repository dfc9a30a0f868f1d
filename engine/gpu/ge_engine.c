/* Host part of the GPU engine (see ge.h): weights, KV pools, activations,
 * the forward step, the weight products (ge_gemm.h) and liboscar calls. Every CUDA/cuBLAS call is
 * checked; failures come back as oscar_status with a message in
 * ge_last_error(). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_internal.h"
#include "ge.h"
#include "ge_check.h"
#include "ge_gemm.h"
#include "ge_kernels.h"

typedef struct ge_layer {
    void *wqkv, *wo, *wgu, *wdown;      /* weight dtype: [QKV][H], [H][Hq d], [2FF][H], [H][FF] */
    float *attn_norm, *mlp_norm, *q_norm, *k_norm, *bqkv, *bo;
} ge_layer;

#define GE_MAX_GRAPHS 16

struct ge_engine {
    oe_config cfg;
    ge_options opt;
    int f32;       /* weights and GEMM activations in fp32 */
    size_t wsz;    /* bytes per weight / act element */
    int QKV;       /* (Hq + 2 Hkv) d */
    int pdl;       /* the step's small kernels and GEMVs by programmatic dependent launch (sm_90, !no_pdl) */
    cudaStream_t st;
    ge_gemm *gm;           /* the weight products, their tuned algorithms */
    const void **w_tune;   /* [4][num_layers] wqkv, wo, wgu, wdown of every layer (ge_gemm_tune) */
    oscar_runtime *rt;
    oscar_params *prm;
    oscar_plan *plan;
    oscar_layout_desc layout;
    ge_kv_plan kv;
    int wide;              /* most 3-bit head-tensors of a layer (0: one page size for every layer) */
    size_t *layer_pb;      /* [num_layers] each layer's page size (oscar_plan_layer_sizes) */
    char *kv_pages, *kv_windows;
    oscar_cache *caches;
    void *ws;
    size_t ws_bytes;
    void *embed, *lm_head;
    float *final_norm;
    ge_layer *L;
    float *rope_cos, *rope_sin;
    int max_T, max_S;
    float *x, *qkv, *q32, *gu, *last, *logits;
    void *h, *qb, *kb, *vb, *attn, *attn16, *act, *hl;
    int32_t *d_ids, *d_pos, *d_cu, *d_lens, *d_slots, *d_bt, *d_rows, *d_next;
    int32_t *h_pos, *h_cu, *h_lens, *h_slots, *h_bt, *h_rows;
    size_t mem_weights, mem_kv, mem_ws, mem_act;
    ge_sched sched;
    int64_t steps;
    int chunk;        /* prefill chunk in use (options, clamped); 0: exact whole-prompt prefill */
    char notes[256];  /* what the engine changed in its options (ge_engine_notes) */
    /* Decode-step graphs, one per (batch size, length bucket), oldest evicted. */
    struct ge_graph {
        int n, bucket;
        cudaGraphExec_t exec;
    } graphs[GE_MAX_GRAPHS];
    int n_graphs, next_graph;
    int64_t graph_replays;
    ge_debug_fn dbg; /* diagnostics (ge_set_debug), NULL in normal runs */
    void *dbg_user;
    /* every device allocation, freed in ge_destroy */
    void **allocs;
    int n_allocs, cap_allocs;
};

void ge_options_default(ge_options *o)
{
    memset(o, 0, sizeof *o);
    o->method = OSCAR_METHOD_OSCAR2;
    o->kv_budget = (size_t)1 << 30;
    o->max_batch = 1;
    o->max_seq_len = 4096;
    o->max_prefill_tokens = 8192;
    o->mlp_chunk = 4096;
    o->page_size = 64;
    o->sink = 64;
    o->recent = 256;
    o->check_every = 64;
    o->prefill_chunk = 512;
}

static oscar_status dalloc(ge_engine *e, void **p, size_t bytes, size_t *counter, const char *what)
{
    *p = NULL;
    if (e->n_allocs == e->cap_allocs) {
        int cap = e->cap_allocs ? 2 * e->cap_allocs : 256;
        void **a = realloc(e->allocs, (size_t)cap * sizeof *a);
        if (!a) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
        e->allocs = a;
        e->cap_allocs = cap;
    }
    cudaError_t err = cudaMalloc(p, bytes ? bytes : 16);
    if (err != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "cudaMalloc of %.3f GiB for %s failed (%s); %.2f of %.2f GiB "
                            "free: lower the KV budget, the batch or max_prefill_tokens",
                            bytes / 1073741824.0, what, cudaGetErrorString(err), fr / 1073741824.0,
                            tot / 1073741824.0);
    }
    e->allocs[e->n_allocs++] = *p;
    if (counter) *counter += bytes;
    return OSCAR_OK;
}

void ge_destroy(ge_engine *e)
{
    if (!e) return;
    if (e->st) cudaStreamSynchronize(e->st);
    for (int i = 0; i < e->n_graphs; i++) cudaGraphExecDestroy(e->graphs[i].exec);
    for (int i = 0; i < e->n_allocs; i++) cudaFree(e->allocs[i]);
    free(e->allocs);
    free(e->L);
    free(e->layer_pb);
    free(e->caches);
    free(e->h_pos);
    free(e->h_cu);
    free(e->h_lens);
    free(e->h_slots);
    free(e->h_bt);
    free(e->h_rows);
    oscar_plan_destroy(e->plan);
    oscar_params_destroy(e->prm);
    oscar_runtime_destroy(e->rt);
    ge_gemm_destroy(e->gm);
    free(e->w_tune);
    if (e->st) cudaStreamDestroy(e->st);
    ge_sched_release(&e->sched);
    free(e);
}

const oe_config *ge_config(const ge_engine *e) { return &e->cfg; }
ge_sched *ge_engine_sched(ge_engine *e) { return &e->sched; }
const ge_kv_plan *ge_engine_kv(const ge_engine *e) { return &e->kv; }
const oscar_layout_desc *ge_engine_layout(const ge_engine *e) { return &e->layout; }
const size_t *ge_engine_layer_page_bytes(const ge_engine *e) { return e->layer_pb; }
const char *ge_engine_variant(const ge_engine *e) { return oscar_plan_variant(e->plan); }
int64_t ge_engine_graph_replays(const ge_engine *e) { return e->graph_replays; }
void ge_engine_gemm_report(const ge_engine *e, FILE *f) { ge_gemm_report(e->gm, f); }
const char *ge_engine_device(const ge_engine *e) { return oscar_runtime_device(e->rt); }
int ge_engine_chunk(const ge_engine *e) { return e->chunk; }
const char *ge_engine_notes(const ge_engine *e) { return e->notes; }

void ge_engine_memory(const ge_engine *e, size_t *weights, size_t *kv, size_t *workspace, size_t *activations)
{
    if (weights) *weights = e->mem_weights;
    if (kv) *kv = e->mem_kv;
    if (workspace) *workspace = e->mem_ws;
    if (activations) *activations = e->mem_act;
}

void ge_layout_make(const oe_config *c, const ge_options *o, oscar_layout_desc *l)
{
    oscar_layout_default(l);
    l->head_dim = c->head_dim;
    l->group = c->head_dim < 128 ? c->head_dim : 128;
    l->num_q_heads = c->num_q_heads;
    l->num_kv_heads = c->num_kv_heads;
    l->page_size = o->page_size;
    l->sink = o->sink;
    l->recent = o->recent;
    l->max_seq_len = o->max_seq_len;
    l->method = o->method;
}

oscar_status ge_kv_layout(const oe_config *c, const ge_options *o, oscar_layout_desc *l, size_t *layer_page_bytes,
                          int *max_wide)
{
    if (!c || !o || !l) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_layout: NULL argument");
    ge_layout_make(c, o, l);
    oscar_params *p = NULL;
    if (o->params_path && o->method != OSCAR_METHOD_BF16) {
        oscar_status s = oscar_params_load(o->params_path, &p);
        if (s != OSCAR_OK) return ge_set_error(s, "ge_kv_layout: %s", oscar_last_error());
    }
    oscar_status s = ge_kv_wide_layout(p, c->num_layers, l, layer_page_bytes, max_wide);
    oscar_params_destroy(p);
    return s;
}

/* Error-feedback weights for built-in parameters: strictly upper triangular,
 * |F| <= 0.2, decaying away from the diagonal (calibrated files hold up to
 * ~0.6, oscar-inspect "fb max"), the same for every layer, K and V. The
 * write path's cost does not depend on the values; the formula is
 * perf/gpu/bench_attention.cu's (OSCAR_BENCH_FB), so the figures compare. */
static oscar_status synth_feedback(oscar_params *p, const oe_config *c)
{
    const int d = c->head_dim;
    float *F = calloc((size_t)d * (size_t)d, sizeof *F);
    if (!F) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int j = 0; j < d; j++)
        for (int k = j + 1; k < d; k++)
            F[(size_t)j * d + k] = 0.2f * sinf(0.37f * (float)j + 1.3f * (float)k) / (float)(1 + (k - j) / 8);
    oscar_status s = OSCAR_OK;
    for (int l = 0; l < c->num_layers && s == OSCAR_OK; l++)
        for (int kv = 0; kv < 2 && s == OSCAR_OK; kv++) s = oscar_params_set_feedback(p, l, 0, (oscar_kv)kv, F);
    free(F);
    if (s != OSCAR_OK) return ge_set_error(s, "ge: synthetic feedback weights: %s", oscar_last_error());
    return OSCAR_OK;
}

/* Everything except the weights: runtime, plan, pools, workspace, activations, scheduler. */
static oscar_status setup_common(ge_engine *e)
{
    const oe_config *c = &e->cfg;
    const ge_options *o = &e->opt;
    if (o->max_batch <= 0 || o->max_seq_len <= 0 || o->max_prefill_tokens <= 0 || o->mlp_chunk <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge: max_batch %d, max_seq_len %d, max_prefill_tokens %d "
                            "and mlp_chunk %d must be positive", o->max_batch, o->max_seq_len,
                            o->max_prefill_tokens, o->mlp_chunk);
    if (o->prefill_chunk < 0 || (o->chunk_every_prompt && o->prefill_chunk == 0))
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge: prefill_chunk %d must be >= 0 (0: no chunks), and > 0 "
                            "with chunk_every_prompt", o->prefill_chunk);
    /* oscar_extend on GPUs takes at most 65535 query tokens per call. */
    if (o->prefill_chunk > 0 && o->max_prefill_tokens > 65535)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge: chunked prefill takes at most 65535 tokens per step "
                            "(oscar_extend); max_prefill_tokens is %d", o->max_prefill_tokens);
    if (o->synth_feedback && (o->params_path || (o->method != OSCAR_METHOD_OSCAR2 && o->method != OSCAR_METHOD_OSCAR2_LM)))
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge: synthetic feedback weights go with the built-in oscar2 / "
                            "oscar2-lm parameters (method %s%s)", oscar_method_name(o->method),
                            o->params_path ? ", and a parameter file was given" : "");
    e->chunk = o->prefill_chunk < o->max_prefill_tokens ? o->prefill_chunk : o->max_prefill_tokens;
    /* Append, then attend: a chunk longer than the recent window demotes its
     * own first tokens into 2 bits before they are attended (docs/EVAL.md). */
    if (e->chunk > 0 && o->method != OSCAR_METHOD_BF16 && e->chunk > o->recent) {
        e->chunk = o->recent > 0 ? o->recent : 1;
        snprintf(e->notes, sizeof e->notes, "prefill chunk %d clamped to %d, the recent window: a longer chunk "
                 "demotes its own first tokens to 2 bits before they are attended", o->prefill_chunk, e->chunk);
    } else if (e->chunk != o->prefill_chunk) {
        snprintf(e->notes, sizeof e->notes, "prefill chunk %d clamped to max_prefill_tokens %d", o->prefill_chunk,
                 e->chunk);
    }
    if (c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
        return ge_set_error(OSCAR_ERR_UNSUPPORTED_HEAD_DIM, "ge: head_dim %d; the GPU engine runs 64, 128 or 256",
                            c->head_dim);
    CU(cudaSetDevice(o->device));
    int major = 0;
    CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, o->device));
    e->pdl = major >= 9 && !o->no_pdl;
    CU(cudaStreamCreateWithFlags(&e->st, cudaStreamNonBlocking));
    /* A workspace of its own, so cuBLAS allocates nothing while a decode step
     * is captured into a graph. */
    void *blas_ws;
    GE(dalloc(e, &blas_ws, (size_t)32 << 20, &e->mem_act, "cuBLAS workspace"));
    GE(ge_gemm_create(e->st, blas_ws, (size_t)32 << 20, e->f32, !o->no_gemm_tune, &e->gm));
    e->QKV = (c->num_q_heads + 2 * c->num_kv_heads) * c->head_dim;

    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = "cuda";
    ro.plugin_dir = o->plugin_dir;
    ro.device_index = o->device;
    ro.validate = o->validate;
    if (oscar_runtime_create(&ro, &e->rt) != OSCAR_OK) {
        oscar_runtime_options_default(&ro);
        ro.plugin_dir = o->plugin_dir;
        oscar_runtime *probe = NULL;
        const char *why = oscar_last_error();
        static _Thread_local char report[2048];
        snprintf(report, sizeof report, "%s", why);
        if (oscar_runtime_create(&ro, &probe) == OSCAR_OK) {
            snprintf(report, sizeof report, "%s\n%s", why, oscar_runtime_report(probe));
            oscar_runtime_destroy(probe);
        }
        return ge_set_error(OSCAR_ERR_NO_BACKEND, "ge: liboscar's CUDA backend is not available: %s\n(set "
                            "OSCAR_PLUGIN_PATH to the folder of liboscar_backend_cuda.so)", report);
    }
    if (o->params_path) {
        OS(oscar_params_load(o->params_path, &e->prm));
        OS(oscar_params_check_shape(e->prm, c->num_layers, c->num_q_heads, c->num_kv_heads, c->head_dim, NULL));
    } else {
        OS(oscar_params_create_builtin(o->method, c->num_layers, c->num_q_heads, c->num_kv_heads, c->head_dim,
                                       &e->prm));
        if (o->synth_feedback) GE(synth_feedback(e->prm, c));
    }
    oscar_layout_desc *l = &e->layout;
    ge_layout_make(c, o, l);
    /* A file calibrated with --wide-bits (3-bit head-tensors): per-layer pages, each layer's pool of its
     * own page size, so the cache costs what the file averages (FORMAT.md §3.3). layer_pb [num_layers]
     * (the library's sizes), then what the engine's own sizing expects (ge_kv_wide_layout), checked. */
    e->layer_pb = calloc(2 * (size_t)c->num_layers, sizeof *e->layer_pb);
    if (!e->layer_pb) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t *expect = e->layer_pb + c->num_layers;
    GE(ge_kv_wide_layout(e->prm, c->num_layers, l, expect, &e->wide));
    OS(oscar_layout_validate(l));
    oscar_status ps = oscar_plan_create(e->rt, l, e->prm, &e->plan);
    if (ps != OSCAR_OK)
        /* E.g. a --wide-bits file on a backend that cannot store 3-bit head-tensors: the library says so. */
        return ge_set_error(ps, "ge: cannot serve method %s with %s%s%s on this backend: %s",
                            oscar_method_name(o->method), o->params_path ? "the parameter file " : "built-in parameters",
                            o->params_path ? o->params_path : "",
                            e->wide ? " (3-bit head-tensors, oscar-calibrate --wide-bits: per-layer pages)" : "",
                            oscar_last_error());
    for (int i = 0; i < c->num_layers; i++) {
        oscar_layout_sizes lsz;
        OS(oscar_plan_layer_sizes(e->plan, i, &lsz));
        if (lsz.page_bytes != expect[i])
            return ge_set_error(OSCAR_ERR_INTERNAL, "ge: layer %d's page is %zu bytes (oscar_plan_layer_sizes), the "
                                "engine's sizing (ge_kv_wide_layout) says %zu", i, lsz.page_bytes, expect[i]);
        e->layer_pb[i] = lsz.page_bytes;
    }

    /* KV pools: one allocation per kind for all layers; every layer holds num_pages pages (one block
     * table), layer i's pool num_pages of its own page size. */
    GE(ge_kv_plan_for(l, c->num_layers, e->layer_pb, o->kv_budget, o->max_batch, &e->kv));
    /* liboscar wants a page pool even while every sequence fits its windows. */
    if (e->kv.num_pages <= 0)
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge: a KV budget of %zu bytes holds no page besides %d window "
                            "slots; raise the budget", o->kv_budget, o->max_batch);
    size_t win = e->kv.window_bytes_per_layer;
    GE(dalloc(e, (void **)&e->kv_pages, e->kv.pool_bytes, &e->mem_kv, "KV page pools"));
    if (win) GE(dalloc(e, (void **)&e->kv_windows, (size_t)c->num_layers * win, &e->mem_kv, "KV window pools"));
    e->caches = calloc((size_t)c->num_layers, sizeof *e->caches);
    if (!e->caches) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    size_t pool_off = 0;
    for (int i = 0; i < c->num_layers; i++) {
        e->caches[i].pages = e->kv_pages + pool_off;
        pool_off += (size_t)e->kv.num_pages * e->layer_pb[i];
        e->caches[i].num_pages = e->kv.num_pages;
        e->caches[i].windows = win ? e->kv_windows + (size_t)i * win : NULL;
        e->caches[i].num_window_slots = o->max_batch;
    }
    e->max_S = o->max_batch;
    e->max_T = o->max_prefill_tokens > o->max_batch ? o->max_prefill_tokens : o->max_batch;
    /* oscar_extend wants the workspace for its query tokens (docs/API.md). */
    OS(oscar_plan_workspace_bytes(e->plan, e->chunk > 0 ? e->max_T : e->max_S, o->max_seq_len, &e->ws_bytes));
    GE(dalloc(e, &e->ws, e->ws_bytes, &e->mem_ws, "liboscar workspace"));
    OS(oscar_plan_workspace_init(e->plan, e->ws, e->st));
    GE(ge_sched_init(&e->sched, l, e->kv.num_pages, o->max_batch));

    /* Activations. */
    size_t T = (size_t)e->max_T, S = (size_t)e->max_S, H = (size_t)c->hidden, d = (size_t)c->head_dim,
           qd = (size_t)c->num_q_heads * d, kvd = (size_t)c->num_kv_heads * d, FF = (size_t)c->intermediate,
           V = (size_t)c->vocab, MC = (size_t)(o->mlp_chunk < e->max_T ? o->mlp_chunk : e->max_T), w = e->wsz;
    size_t *ma = &e->mem_act;
    GE(dalloc(e, (void **)&e->x, T * H * 4, ma, "residual"));
    GE(dalloc(e, &e->h, T * H * w, ma, "normed activations"));
    GE(dalloc(e, (void **)&e->qkv, T * (size_t)e->QKV * 4, ma, "qkv"));
    GE(dalloc(e, (void **)&e->q32, T * qd * 4, ma, "q fp32"));
    GE(dalloc(e, &e->qb, T * qd * 2, ma, "q bf16"));
    GE(dalloc(e, &e->kb, T * kvd * 2, ma, "k bf16"));
    GE(dalloc(e, &e->vb, T * kvd * 2, ma, "v bf16"));
    GE(dalloc(e, &e->attn, T * qd * w, ma, "attention output"));
    GE(dalloc(e, &e->attn16, (e->chunk > 0 ? T : S) * qd * 2, ma, "decode / extend output"));
    GE(dalloc(e, (void **)&e->gu, MC * 2 * FF * 4, ma, "gate/up"));
    GE(dalloc(e, &e->act, MC * FF * w, ma, "SwiGLU"));
    GE(dalloc(e, (void **)&e->last, S * H * 4, ma, "last rows"));
    GE(dalloc(e, &e->hl, S * H * w, ma, "last rows normed"));
    GE(dalloc(e, (void **)&e->logits, S * V * 4, ma, "logits"));
    size_t stride = (size_t)e->sched.stride;
    GE(dalloc(e, (void **)&e->d_ids, T * 4, ma, "ids"));
    GE(dalloc(e, (void **)&e->d_pos, T * 4, ma, "positions"));
    GE(dalloc(e, (void **)&e->d_cu, (S + 1) * 4, ma, "cu_seqlens"));
    GE(dalloc(e, (void **)&e->d_lens, S * 4, ma, "seq_lens"));
    GE(dalloc(e, (void **)&e->d_slots, S * 4, ma, "window slots"));
    GE(dalloc(e, (void **)&e->d_bt, S * stride * 4, ma, "block table"));
    GE(dalloc(e, (void **)&e->d_rows, S * 4, ma, "last rows"));
    GE(dalloc(e, (void **)&e->d_next, S * 4, ma, "next tokens"));
    e->h_pos = malloc(T * 4);
    e->h_cu = malloc((S + 1) * 4);
    e->h_lens = malloc(S * 4);
    e->h_slots = malloc(S * 4);
    e->h_bt = malloc(S * stride * 4);
    e->h_rows = malloc(S * 4);
    if (!e->h_pos || !e->h_cu || !e->h_lens || !e->h_slots || !e->h_bt || !e->h_rows)
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");

    /* RoPE tables for every position, same recipe as the CPU engine. */
    int h2 = c->head_dim / 2;
    float *inv = malloc((size_t)h2 * sizeof *inv), *d_inv;
    if (!inv) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    float af = 1.0f;
    oe_rope_inv_freq(c, inv, &af); /* RoPE scaling included; af: YaRN's cos/sin factor */
    oscar_status s = dalloc(e, (void **)&d_inv, (size_t)h2 * 4, ma, "inv_freq");
    /* On the engine's stream, as the kernel that reads it (see upload()). */
    if (s == OSCAR_OK && (cudaMemcpyAsync(d_inv, inv, (size_t)h2 * 4, cudaMemcpyHostToDevice, e->st) != cudaSuccess ||
                          cudaStreamSynchronize(e->st) != cudaSuccess))
        s = ge_set_error(OSCAR_ERR_BACKEND, "ge: upload of inv_freq failed");
    free(inv);
    GE(s);
    GE(dalloc(e, (void **)&e->rope_cos, (size_t)o->max_seq_len * h2 * 4, ma, "RoPE cos"));
    GE(dalloc(e, (void **)&e->rope_sin, (size_t)o->max_seq_len * h2 * 4, ma, "RoPE sin"));
    KL(ge_k_rope_table(e->rope_cos, e->rope_sin, d_inv, af, o->max_seq_len, c->head_dim, e->st));
    CU(cudaStreamSynchronize(e->st));
    return OSCAR_OK;
}

static oscar_status new_engine(const oe_config *cfg, const ge_options *o, ge_engine **out)
{
    *out = NULL;
    ge_engine *e = calloc(1, sizeof *e);
    if (!e) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    e->cfg = *cfg;
    if (o) e->opt = *o;
    else ge_options_default(&e->opt);
    e->f32 = e->opt.act_f32 != 0;
    e->wsz = e->f32 ? 4 : 2;
    e->L = calloc((size_t)cfg->num_layers, sizeof *e->L);
    if (!e->L) {
        free(e);
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    *out = e;
    return OSCAR_OK;
}

/* Host fp32 rows -> device weight dtype at dst (+ element offset).
 * The copy must go on the engine's stream: a plain cudaMemcpy from pageable
 * memory runs on the legacy default stream and may return before its DMA
 * has landed, and the engine's stream is non-blocking (no implicit ordering
 * with the legacy stream), so the conversion kernel could read the staging
 * buffer while it still held the previous tensor. */
static oscar_status upload(ge_engine *e, void *dst, size_t off, const float *src, size_t n, float *stage, int to_f32)
{
    CU(cudaMemcpyAsync(stage, src, n * 4, cudaMemcpyHostToDevice, e->st));
    void *d = (char *)dst + off * (to_f32 ? 4 : e->wsz);
    KL(ge_k_convert(d, to_f32, stage, n, e->st));
    CU(cudaStreamSynchronize(e->st));
    return OSCAR_OK;
}

static oscar_status create_from_model(const oe_model *m, ge_engine *e)
{
    const oe_config *c = &e->cfg;
    size_t H = (size_t)c->hidden, d = (size_t)c->head_dim, qd = (size_t)c->num_q_heads * d,
           kvd = (size_t)c->num_kv_heads * d, FF = (size_t)c->intermediate, V = (size_t)c->vocab, w = e->wsz;
    size_t biggest = V * H > FF * H ? V * H : FF * H;
    if (qd * H > biggest) biggest = qd * H;
    float *stage;
    GE(dalloc(e, (void **)&stage, biggest * 4, NULL, "upload staging"));
    size_t *mw = &e->mem_weights;
    GE(dalloc(e, &e->embed, V * H * w, mw, "embedding"));
    GE(upload(e, e->embed, 0, m->embed, V * H, stage, e->f32));
    if (m->lm_head == m->embed) e->lm_head = e->embed;
    else {
        GE(dalloc(e, &e->lm_head, V * H * w, mw, "lm_head"));
        GE(upload(e, e->lm_head, 0, m->lm_head, V * H, stage, e->f32));
    }
    GE(dalloc(e, (void **)&e->final_norm, H * 4, mw, "final norm"));
    GE(upload(e, e->final_norm, 0, m->final_norm, H, stage, 1));
    for (int i = 0; i < c->num_layers; i++) {
        const oe_layer *s = &m->layers[i];
        ge_layer *g = &e->L[i];
        if (s->b_gate || s->b_up || s->b_down)
            return ge_set_error(OSCAR_ERR_UNSUPPORTED, "ge: MLP biases are not supported");
        GE(dalloc(e, &g->wqkv, (size_t)e->QKV * H * w, mw, "wqkv"));
        GE(upload(e, g->wqkv, 0, s->wq, qd * H, stage, e->f32));
        GE(upload(e, g->wqkv, qd * H, s->wk, kvd * H, stage, e->f32));
        GE(upload(e, g->wqkv, (qd + kvd) * H, s->wv, kvd * H, stage, e->f32));
        GE(dalloc(e, &g->wo, H * qd * w, mw, "wo"));
        GE(upload(e, g->wo, 0, s->wo, H * qd, stage, e->f32));
        GE(dalloc(e, &g->wgu, 2 * FF * H * w, mw, "w_gate/w_up"));
        GE(upload(e, g->wgu, 0, s->w_gate, FF * H, stage, e->f32));
        GE(upload(e, g->wgu, FF * H, s->w_up, FF * H, stage, e->f32));
        GE(dalloc(e, &g->wdown, H * FF * w, mw, "w_down"));
        GE(upload(e, g->wdown, 0, s->w_down, H * FF, stage, e->f32));
        GE(dalloc(e, (void **)&g->attn_norm, H * 4, mw, "norm"));
        GE(upload(e, g->attn_norm, 0, s->attn_norm, H, stage, 1));
        GE(dalloc(e, (void **)&g->mlp_norm, H * 4, mw, "norm"));
        GE(upload(e, g->mlp_norm, 0, s->mlp_norm, H, stage, 1));
        if (s->q_norm) {
            GE(dalloc(e, (void **)&g->q_norm, d * 4, mw, "q norm"));
            GE(upload(e, g->q_norm, 0, s->q_norm, d, stage, 1));
            GE(dalloc(e, (void **)&g->k_norm, d * 4, mw, "k norm"));
            GE(upload(e, g->k_norm, 0, s->k_norm, d, stage, 1));
        }
        if (s->bq || s->bk || s->bv) {
            GE(dalloc(e, (void **)&g->bqkv, (size_t)e->QKV * 4, mw, "qkv bias"));
            /* On the engine's stream: the uploads below run there too. */
            CU(cudaMemsetAsync(g->bqkv, 0, (size_t)e->QKV * 4, e->st));
            if (s->bq) GE(upload(e, g->bqkv, 0, s->bq, qd, stage, 1));
            if (s->bk) GE(upload(e, g->bqkv, qd, s->bk, kvd, stage, 1));
            if (s->bv) GE(upload(e, g->bqkv, qd + kvd, s->bv, kvd, stage, 1));
        }
        if (s->bo) {
            GE(dalloc(e, (void **)&g->bo, H * 4, mw, "o bias"));
            GE(upload(e, g->bo, 0, s->bo, H, stage, 1));
        }
    }
    return OSCAR_OK;
}

oscar_status ge_create_from_model(const oe_model *m, const ge_options *o, ge_engine **out)
{
    if (!m || !out) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_create_from_model: NULL argument");
    ge_engine *e;
    GE(new_engine(oe_model_config(m), o, &e));
    oscar_status s = setup_common(e);
    if (s == OSCAR_OK) s = create_from_model(m, e);
    if (s != OSCAR_OK) {
        ge_destroy(e);
        return s;
    }
    *out = e;
    return OSCAR_OK;
}

static oscar_status rand_w(ge_engine *e, void **p, size_t n, int f32, uint64_t seed, float scale, float offset,
                           const char *what)
{
    GE(dalloc(e, p, n * (f32 ? 4 : e->wsz), &e->mem_weights, what));
    KL(ge_k_fill_random(*p, f32, n, seed, scale, offset, e->st));
    return OSCAR_OK;
}

oscar_status ge_create_random(const oe_config *cfg, uint64_t seed, const ge_options *o, ge_engine **out)
{
    if (!cfg || !out) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_create_random: NULL argument");
    ge_engine *e;
    GE(new_engine(cfg, o, &e));
    oscar_status s = setup_common(e);
    const oe_config *c = &e->cfg;
    size_t H = (size_t)c->hidden, d = (size_t)c->head_dim, qd = (size_t)c->num_q_heads * d,
           FF = (size_t)c->intermediate, V = (size_t)c->vocab;
    /* Uniform +-sqrt(3 / fan_in): unit variance through each projection. */
    float aH = sqrtf(3.0f / (float)H), aQ = sqrtf(3.0f / (float)qd), aF = sqrtf(3.0f / (float)FF);
    uint64_t k = seed * 1000003u;
    if (s == OSCAR_OK) s = rand_w(e, &e->embed, V * H, e->f32, k++, 1.0f, 0.0f, "embedding");
    if (s == OSCAR_OK) {
        if (c->tie_word_embeddings) e->lm_head = e->embed;
        else s = rand_w(e, &e->lm_head, V * H, e->f32, k++, aH, 0.0f, "lm_head");
    }
    if (s == OSCAR_OK) s = rand_w(e, (void **)&e->final_norm, H, 1, k++, 0.0f, 1.0f, "final norm");
    for (int i = 0; s == OSCAR_OK && i < c->num_layers; i++) {
        ge_layer *g = &e->L[i];
        s = rand_w(e, &g->wqkv, (size_t)e->QKV * H, e->f32, k++, aH, 0.0f, "wqkv");
        if (s == OSCAR_OK) s = rand_w(e, &g->wo, H * qd, e->f32, k++, aQ, 0.0f, "wo");
        if (s == OSCAR_OK) s = rand_w(e, &g->wgu, 2 * FF * H, e->f32, k++, aH, 0.0f, "w_gate/w_up");
        if (s == OSCAR_OK) s = rand_w(e, &g->wdown, H * FF, e->f32, k++, aF, 0.0f, "w_down");
        if (s == OSCAR_OK) s = rand_w(e, (void **)&g->attn_norm, H, 1, k++, 0.0f, 1.0f, "norm");
        if (s == OSCAR_OK) s = rand_w(e, (void **)&g->mlp_norm, H, 1, k++, 0.0f, 1.0f, "norm");
        if (s == OSCAR_OK && c->qk_norm) {
            s = rand_w(e, (void **)&g->q_norm, d, 1, k++, 0.0f, 1.0f, "q norm");
            if (s == OSCAR_OK) s = rand_w(e, (void **)&g->k_norm, d, 1, k++, 0.0f, 1.0f, "k norm");
        }
        if (s == OSCAR_OK && c->qkv_bias) s = rand_w(e, (void **)&g->bqkv, (size_t)e->QKV, 1, k++, 0.02f, 0.0f, "bias");
    }
    if (s == OSCAR_OK && cudaStreamSynchronize(e->st) != cudaSuccess)
        s = ge_set_error(OSCAR_ERR_BACKEND, "ge: random weight generation failed: %s",
                         cudaGetErrorString(cudaGetLastError()));
    if (s != OSCAR_OK) {
        ge_destroy(e);
        return s;
    }
    *out = e;
    return OSCAR_OK;
}

/* Y[M][N] (+)= X[M][K] W[N][K]^T, W and X in the weight dtype, Y fp32. */
static oscar_status gemm(ge_engine *e, int M, int N, int K, const void *W, const void *X, float *Y, float beta)
{
    return ge_gemm_run(e->gm, M, N, K, W, X, Y, beta, e->pdl);
}

oscar_status ge_sync_check(ge_engine *e)
{
    CU(cudaStreamSynchronize(e->st));
    CU(cudaGetLastError());
    OS(oscar_plan_check(e->plan, e->ws, e->st));
    return OSCAR_OK;
}

static oscar_status upload_batch(ge_engine *e, int n, const int32_t *slots, const int32_t *n_new, int *max_len)
{
    int32_t ml;
    GE(ge_sched_batch(&e->sched, n, slots, n_new, e->h_lens, e->h_slots, e->h_bt, e->h_cu, &ml));
    *max_len = ml;
    size_t stride = (size_t)e->sched.stride;
    CU(cudaMemcpyAsync(e->d_lens, e->h_lens, (size_t)n * 4, cudaMemcpyHostToDevice, e->st));
    CU(cudaMemcpyAsync(e->d_slots, e->h_slots, (size_t)n * 4, cudaMemcpyHostToDevice, e->st));
    CU(cudaMemcpyAsync(e->d_bt, e->h_bt, (size_t)n * stride * 4, cudaMemcpyHostToDevice, e->st));
    CU(cudaMemcpyAsync(e->d_cu, e->h_cu, (size_t)(n + 1) * 4, cudaMemcpyHostToDevice, e->st));
    return OSCAR_OK;
}

static oscar_batch make_batch(const ge_engine *e, int n, int max_len)
{
    oscar_batch b = {n, e->d_lens, e->d_slots, e->d_bt, e->sched.stride, max_len};
    return b;
}

void ge_set_debug(ge_engine *e, ge_debug_fn fn, void *user)
{
    if (!e) return;
    e->dbg = fn;
    e->dbg_user = user;
}

static float bf16_bits_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Device buffer (fp32 or bf16) -> fresh host fp32 copy; NULL on failure (error set). */
static float *download_f32(ge_engine *e, const void *dev, int is_f32, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof *h);
    uint16_t *b = is_f32 ? NULL : malloc((n ? n : 1) * sizeof *b);
    cudaError_t err = cudaStreamSynchronize(e->st);
    if (err == cudaSuccess && h && (is_f32 || b))
        err = cudaMemcpy(is_f32 ? (void *)h : (void *)b, dev, n * (is_f32 ? 4 : 2), cudaMemcpyDeviceToHost);
    if (!h || (!is_f32 && !b) || err != cudaSuccess) {
        if (err != cudaSuccess) ge_set_error(OSCAR_ERR_BACKEND, "ge debug: download failed: %s", cudaGetErrorString(err));
        else ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge debug: out of host memory");
        free(h);
        free(b);
        return NULL;
    }
    if (!is_f32)
        for (size_t i = 0; i < n; i++) h[i] = bf16_bits_to_f32(b[i]);
    free(b);
    return h;
}

static oscar_status dbg_emit(ge_engine *e, int layer, const char *what, const void *dev, int is_f32, size_t rows,
                             size_t cols)
{
    float *h = download_f32(e, dev, is_f32, rows * cols);
    if (!h) return OSCAR_ERR_BACKEND;
    e->dbg(e->dbg_user, layer, what, h, rows, cols);
    free(h);
    return OSCAR_OK;
}

/* Largest |device - host| over n elements at element offset off of dev, and the largest |host|. */
static oscar_status cmp_weight(ge_engine *e, FILE *f, const char *name, int layer, const void *dev, size_t off,
                               int is_f32, const float *host, size_t n, double *worst_rel)
{
    if (!host) return OSCAR_OK;
    const char *p = (const char *)dev + off * (is_f32 ? 4 : 2);
    float *h = download_f32(e, p, is_f32, n);
    if (!h) return OSCAR_ERR_BACKEND;
    double md = 0, mr = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double dd = fabs((double)h[i] - host[i]);
        if (!(dd <= md)) {
            md = dd;
            at = i;
        }
        if (fabs((double)host[i]) > mr) mr = fabs((double)host[i]);
    }
    double rel = mr > 0 ? md / mr : md;
    if (!(rel <= *worst_rel)) *worst_rel = rel;
    /* bf16 storage rounds by up to 2^-9 relative. */
    int bad = !(rel <= (is_f32 ? 0.0 : 4e-3));
    if (f && (bad || layer <= 0))
        fprintf(f, "weights: layer %d %-10s %zu elements: max |gpu - host| %.3g (max |host| %.3g) at %zu%s\n", layer,
                name, n, md, mr, at, bad ? "  MISMATCH" : "");
    free(h);
    return OSCAR_OK;
}

oscar_status ge_debug_weights(ge_engine *e, const oe_model *m, FILE *f, double *worst_rel)
{
    if (!e || !m || !worst_rel) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_debug_weights: NULL argument");
    *worst_rel = 0;
    const oe_config *c = &e->cfg;
    size_t H = (size_t)c->hidden, d = (size_t)c->head_dim, qd = (size_t)c->num_q_heads * d,
           kvd = (size_t)c->num_kv_heads * d, FF = (size_t)c->intermediate, V = (size_t)c->vocab;
    const int f32 = e->f32;
    GE(cmp_weight(e, f, "embed", -1, e->embed, 0, f32, m->embed, V * H, worst_rel));
    GE(cmp_weight(e, f, "lm_head", -1, e->lm_head, 0, f32, m->lm_head, V * H, worst_rel));
    GE(cmp_weight(e, f, "final_norm", -1, e->final_norm, 0, 1, m->final_norm, H, worst_rel));
    for (int i = 0; i < c->num_layers; i++) {
        const oe_layer *s = &m->layers[i];
        const ge_layer *g = &e->L[i];
        GE(cmp_weight(e, f, "wq", i, g->wqkv, 0, f32, s->wq, qd * H, worst_rel));
        GE(cmp_weight(e, f, "wk", i, g->wqkv, qd * H, f32, s->wk, kvd * H, worst_rel));
        GE(cmp_weight(e, f, "wv", i, g->wqkv, (qd + kvd) * H, f32, s->wv, kvd * H, worst_rel));
        GE(cmp_weight(e, f, "wo", i, g->wo, 0, f32, s->wo, H * qd, worst_rel));
        GE(cmp_weight(e, f, "w_gate", i, g->wgu, 0, f32, s->w_gate, FF * H, worst_rel));
        GE(cmp_weight(e, f, "w_up", i, g->wgu, FF * H, f32, s->w_up, FF * H, worst_rel));
        GE(cmp_weight(e, f, "w_down", i, g->wdown, 0, f32, s->w_down, H * FF, worst_rel));
        GE(cmp_weight(e, f, "attn_norm", i, g->attn_norm, 0, 1, s->attn_norm, H, worst_rel));
        GE(cmp_weight(e, f, "mlp_norm", i, g->mlp_norm, 0, 1, s->mlp_norm, H, worst_rel));
        if (g->q_norm) GE(cmp_weight(e, f, "q_norm", i, g->q_norm, 0, 1, s->q_norm, d, worst_rel));
        if (g->k_norm) GE(cmp_weight(e, f, "k_norm", i, g->k_norm, 0, 1, s->k_norm, d, worst_rel));
        if (g->bqkv) {
            GE(cmp_weight(e, f, "bq", i, g->bqkv, 0, 1, s->bq, qd, worst_rel));
            GE(cmp_weight(e, f, "bk", i, g->bqkv, qd, 1, s->bk, kvd, worst_rel));
            GE(cmp_weight(e, f, "bv", i, g->bqkv, qd + kvd, 1, s->bv, kvd, worst_rel));
        }
        if (g->bo) GE(cmp_weight(e, f, "bo", i, g->bo, 0, 1, s->bo, H, worst_rel));
    }
    return OSCAR_OK;
}

/* Profiling marks (ge_profile_step only): ev[i] is recorded on the stream
 * right after phase[i] ends; ev[0] (phase -1) before the step. */
typedef struct ge_marks {
    cudaEvent_t *ev;
    int *phase;
    int n, cap;
} ge_marks;

static oscar_status mark(ge_engine *e, ge_marks *m, ge_phase p)
{
    if (m->n >= m->cap)
        return ge_set_error(OSCAR_ERR_INTERNAL, "ge_profile_step: more phase marks than the %d counted", m->cap);
    CU(cudaEventRecord(m->ev[m->n], e->st));
    m->phase[m->n++] = (int)p;
    return OSCAR_OK;
}

/* An event after a phase, only when profiling (pm non-NULL; never while a
 * graph is captured: replay_decode passes NULL). */
#define MARK(p)                                                                                           \
    do {                                                                                                  \
        if (pm) GE(mark(e, pm, (p)));                                                                     \
    } while (0)

/* MLP row chunks of a step of Ti rows (forward's loop). */
static int mlp_chunk_rows(const ge_engine *e) { return e->opt.mlp_chunk < e->max_T ? e->opt.mlp_chunk : e->max_T; }

/* Times the weight products of a step of Ti rows for n sequences before it
 * runs (ge_gemm_tune: once per shape, so a decode step's graph, captured
 * later, replays the chosen algorithms). Decode steps only: their row
 * counts repeat (one per batch size), while prefill and mixed steps bring a
 * new count almost every step, and tuning each (~50 ms, estimated in ge_gemm.c) cost more
 * than it won (perf/e2e/RESULTS.md, thirty-eighth session). Between steps every activation
 * buffer is dead (a step starts from the embedding), so the timing may write
 * into them; the layers' weights are read in turn, as a step reads them. */
static oscar_status tune_step(ge_engine *e, int n, int Ti)
{
    if (e->f32 || e->opt.no_gemm_tune) return OSCAR_OK;
    const oe_config *c = &e->cfg;
    const int L = c->num_layers, H = c->hidden, qd = c->num_q_heads * c->head_dim, FF = c->intermediate;
    if (!e->w_tune) {
        e->w_tune = malloc((size_t)4 * L * sizeof *e->w_tune);
        if (!e->w_tune) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int i = 0; i < L; i++) {
            e->w_tune[i] = e->L[i].wqkv;
            e->w_tune[L + i] = e->L[i].wo;
            e->w_tune[2 * L + i] = e->L[i].wgu;
            e->w_tune[3 * L + i] = e->L[i].wdown;
        }
    }
    GE(ge_gemm_tune(e->gm, Ti, e->QKV, H, e->w_tune, L, e->h, e->qkv, 0.0f));
    GE(ge_gemm_tune(e->gm, Ti, H, qd, e->w_tune + L, L, e->attn, e->x, 1.0f));
    const int MC = mlp_chunk_rows(e), mlp_rows[2] = {Ti < MC ? Ti : MC, Ti > MC ? Ti % MC : 0};
    for (int j = 0; j < 2; j++) {
        if (mlp_rows[j] == 0) continue;
        GE(ge_gemm_tune(e->gm, mlp_rows[j], 2 * FF, H, e->w_tune + 2 * L, L, e->h, e->gu, 0.0f));
        GE(ge_gemm_tune(e->gm, mlp_rows[j], H, FF, e->w_tune + 3 * L, L, e->act, e->x, 1.0f));
    }
    const void *lm = e->lm_head;
    return ge_gemm_tune(e->gm, n, c->vocab, H, &lm, 1, e->hl, e->logits, 0.0f);
}

oscar_status ge_tune_decode(ge_engine *e, int max_batch)
{
    if (!e) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_tune_decode: NULL engine");
    if (max_batch < 1 || max_batch > e->opt.max_batch)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                            "ge_tune_decode: max_batch %d outside 1..%d (the engine's max_batch option)", max_batch,
                            e->opt.max_batch);
    /* one row count per bucket of 16 (ge_gemm.h), the largest exactly: its bucket is timed at it */
    for (int n = 16;; n += 16) {
        const int m = n < max_batch ? n : max_batch;
        GE(tune_step(e, m, m));
        if (m == max_batch) break;
    }
    CU(cudaStreamSynchronize(e->st));
    return OSCAR_OK;
}

/* The device work of one step: embedding, every layer (append + attention),
 * final norm, LM head, argmax into d_next. Only launches on e->st: a decode
 * step's call is captured into a graph (replay_decode). pm: NULL, or the
 * profiling marks (an event after every phase; ge_profile_step). */
static oscar_status forward(ge_engine *e, int n, int Ti, int decode, int extend, int max_new, const oscar_batch *bp,
                            ge_marks *pm)
{
    const oe_config *c = &e->cfg;
    const oscar_batch b = *bp;
    const int64_t T = Ti;
    const int H = c->hidden, d = c->head_dim, Hq = c->num_q_heads, Hkv = c->num_kv_heads, qd = Hq * d,
              FF = c->intermediate;
    const float eps = (float)c->rms_eps, scale = (float)(1.0 / sqrt((double)d));
    const int f32 = e->f32, MC = mlp_chunk_rows(e);
    KL(ge_k_embed(e->x, e->embed, f32, e->d_ids, Ti, H, e->st));
    MARK(GE_PHASE_EMBED);
    const int kvd = Hkv * d;
    if (e->dbg) GE(dbg_emit(e, -1, "embed", e->x, 1, (size_t)Ti, (size_t)H));
    for (int li = 0; li < c->num_layers; li++) {
        const ge_layer *g = &e->L[li];
        KL(ge_k_rmsnorm(e->h, f32, e->x, g->attn_norm, Ti, H, eps, e->pdl, e->st));
        MARK(GE_PHASE_ATTN_NORM);
        GE(gemm(e, Ti, e->QKV, H, g->wqkv, e->h, e->qkv, 0.0f));
        MARK(GE_PHASE_QKV_GEMM);
        KL(ge_k_qkv_post(e->qkv, g->bqkv, g->q_norm, g->k_norm, e->rope_cos, e->rope_sin, e->d_pos, Ti, Hq, Hkv, d,
                         eps, e->q32, e->qb, e->kb, e->vb, e->pdl, e->st));
        MARK(GE_PHASE_QKV_POST);
        if (e->dbg) {
            GE(dbg_emit(e, li, "q", e->q32, 1, (size_t)Ti, (size_t)qd));
            GE(dbg_emit(e, li, "k", e->kb, 0, (size_t)Ti, (size_t)kvd));
            GE(dbg_emit(e, li, "v", e->vb, 0, (size_t)Ti, (size_t)kvd));
        }
        OS(oscar_append(e->plan, li, &e->caches[li], &b, e->d_cu, (int32_t)T, e->kb, e->vb, 0, e->ws, e->ws_bytes,
                        e->st));
        MARK(GE_PHASE_APPEND);
        if (decode) {
            void *o = f32 ? e->attn16 : e->attn;
            OS(oscar_decode(e->plan, li, &e->caches[li], &b, e->qb, 0, o, 0, scale, 0, e->ws, e->ws_bytes, e->st));
            if (f32) KL(ge_k_bf16_to_f32(e->attn, e->attn16, (size_t)n * qd, e->st));
        } else if (extend) {
            /* Chunked prefill: the new tokens attend over the whole cache. */
            oscar_attn_args a;
            oscar_attn_args_default(&a);
            a.cu_q = e->d_cu;
            a.total_q = Ti;
            a.max_q_len = max_new;
            a.q = e->qb;
            a.out = f32 ? e->attn16 : e->attn;
            a.out_bytes = (size_t)T * qd * 2;
            a.sm_scale = scale;
            a.workspace = e->ws;
            a.workspace_bytes = e->ws_bytes;
            a.stream = e->st;
            OS(oscar_extend(e->plan, li, &e->caches[li], &b, &a));
            if (f32) KL(ge_k_bf16_to_f32(e->attn, e->attn16, (size_t)T * qd, e->st));
        } else {
            KL(ge_k_prefill_attention(e->attn, f32, e->q32, e->kb, e->vb, e->d_cu, n, max_new, Hq, Hkv, d, scale,
                                      e->st));
        }
        MARK(GE_PHASE_ATTENTION);
        if (e->dbg) GE(dbg_emit(e, li, "attn", e->attn, f32, (size_t)(decode ? n : Ti), (size_t)qd));
        GE(gemm(e, Ti, H, qd, g->wo, e->attn, e->x, 1.0f));
        if (g->bo) KL(ge_k_add_bias(e->x, g->bo, Ti, H, e->st));
        MARK(GE_PHASE_O_GEMM);
        KL(ge_k_rmsnorm(e->h, f32, e->x, g->mlp_norm, Ti, H, eps, e->pdl, e->st));
        MARK(GE_PHASE_MLP_NORM);
        for (int r0 = 0; r0 < Ti; r0 += MC) {
            int rows = Ti - r0 < MC ? Ti - r0 : MC;
            GE(gemm(e, rows, 2 * FF, H, g->wgu, (const char *)e->h + (size_t)r0 * H * e->wsz, e->gu, 0.0f));
            MARK(GE_PHASE_GATE_UP_GEMM);
            KL(ge_k_swiglu(e->act, f32, e->gu, rows, FF, e->pdl, e->st));
            MARK(GE_PHASE_SWIGLU);
            GE(gemm(e, rows, H, FF, g->wdown, e->act, e->x + (size_t)r0 * H, 1.0f));
            MARK(GE_PHASE_DOWN_GEMM);
        }
        if (e->dbg) GE(dbg_emit(e, li, "x", e->x, 1, (size_t)Ti, (size_t)H));
    }
    KL(ge_k_gather_rows(e->last, e->x, e->d_rows, n, H, e->st));
    KL(ge_k_rmsnorm(e->hl, f32, e->last, e->final_norm, n, H, eps, e->pdl, e->st));
    MARK(GE_PHASE_FINAL_NORM);
    GE(gemm(e, n, c->vocab, H, e->lm_head, e->hl, e->logits, 0.0f));
    MARK(GE_PHASE_LM_HEAD);
    KL(ge_k_argmax(e->d_next, e->logits, n, c->vocab, e->st));
    MARK(GE_PHASE_ARGMAX);
    return OSCAR_OK;
}
#undef MARK

/* Decode-step length bucket: the split plan of oscar_decode depends on the
 * batch's max_seq_len, so a graph serves every step whose longest sequence
 * is within its bucket (powers of two from 1024, capped at the layout's). */
static int length_bucket(const ge_engine *e, int max_len)
{
    int b = 1024;
    while (b < max_len && b < e->layout.max_seq_len) b *= 2;
    return b < e->layout.max_seq_len ? b : e->layout.max_seq_len;
}

/* The CUDA graph of a decode step: captured the first time a (batch size,
 * bucket) is seen, found after; the step's inputs (tokens, positions,
 * lengths, block tables) are already in the device buffers the graph reads. */
static oscar_status decode_graph(ge_engine *e, int n, int max_len, cudaGraphExec_t *out)
{
    const int bucket = length_bucket(e, max_len);
    struct ge_graph *g = NULL;
    for (int i = 0; i < e->n_graphs && !g; i++)
        if (e->graphs[i].n == n && e->graphs[i].bucket == bucket) g = &e->graphs[i];
    if (!g) {
        cudaGraph_t graph;
        oscar_batch b = make_batch(e, n, bucket);
        CU(cudaStreamBeginCapture(e->st, cudaStreamCaptureModeThreadLocal));
        oscar_status s = forward(e, n, n, 1, 0, 1, &b, NULL);
        cudaError_t ce = cudaStreamEndCapture(e->st, &graph);
        if (s != OSCAR_OK) {
            if (ce == cudaSuccess) cudaGraphDestroy(graph);
            return s;
        }
        CU(ce);
        cudaGraphExec_t exec;
        ce = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        CU(ce);
        if (e->n_graphs < GE_MAX_GRAPHS) {
            g = &e->graphs[e->n_graphs++];
        } else {
            g = &e->graphs[e->next_graph];
            e->next_graph = (e->next_graph + 1) % GE_MAX_GRAPHS;
            cudaGraphExecDestroy(g->exec);
        }
        g->n = n;
        g->bucket = bucket;
        g->exec = exec;
    }
    *out = g->exec;
    return OSCAR_OK;
}

/* A decode step replayed from its CUDA graph. */
static oscar_status replay_decode(ge_engine *e, int n, int max_len)
{
    cudaGraphExec_t exec;
    GE(decode_graph(e, n, max_len, &exec));
    CU(cudaGraphLaunch(exec, e->st));
    e->graph_replays++;
    return OSCAR_OK;
}

/* ------------------------------------------------------------ profiling */

static const char *const phase_names[GE_PHASE_COUNT] = {
    "embed", "rmsnorm (attn)", "QKV GEMM", "qkv_post (norm, RoPE)", "oscar_append (write path)",
    "attention (oscar_decode)", "O GEMM", "rmsnorm (mlp)", "gate-up GEMM", "swiglu", "down GEMM",
    "gather + final norm", "LM head GEMM", "argmax"};

const char *ge_phase_name(ge_phase p) { return (int)p >= 0 && p < GE_PHASE_COUNT ? phase_names[p] : "?"; }

int ge_phase_per_layer(ge_phase p) { return p >= GE_PHASE_ATTN_NORM && p <= GE_PHASE_DOWN_GEMM; }

typedef struct ge_prof_req {
    ge_profile_mode mode;
    int prequeue;
    ge_profile *out;
} ge_prof_req;

static oscar_status cu_ok(cudaError_t err, const char *what)
{
    if (err == cudaSuccess) return OSCAR_OK;
    return ge_set_error(OSCAR_ERR_BACKEND, "ge_profile_step: %s failed: %s", what, cudaGetErrorString(err));
}

/* The gate's time limit. Queuing a whole step takes the host a few ms; but
 * a stream holds about a thousand pending launches, and a phased step of
 * many layers (kernels + events) can need more: the host then blocks in a
 * launch, the gate opens on this limit, and the GPU starts with a full queue
 * that the host refills as it drains (ge_profile.gate_timed_out). */
#define GE_GATE_NS 50000000ull

/* One decode step's device work with events (ge_profile_step): optionally
 * behind a gate kernel that the host opens once everything is queued. */
static oscar_status profiled_forward(ge_engine *e, int n, int max_len, const ge_prof_req *rq)
{
    const oe_config *c = &e->cfg;
    ge_profile *out = rq->out;
    memset(out, 0, sizeof *out);
    out->layers = c->num_layers;
    const int MC = mlp_chunk_rows(e), chunks = (n + MC - 1) / MC;
    const double w = (double)e->wsz, L = (double)c->num_layers, H = (double)c->hidden,
                 qd = (double)c->num_q_heads * c->head_dim, FF = (double)c->intermediate;
    out->weight_bytes[GE_PHASE_QKV_GEMM] = L * (double)e->QKV * H * w;
    out->weight_bytes[GE_PHASE_O_GEMM] = L * H * qd * w;
    out->weight_bytes[GE_PHASE_GATE_UP_GEMM] = L * chunks * 2.0 * FF * H * w;
    out->weight_bytes[GE_PHASE_DOWN_GEMM] = L * chunks * H * FF * w;
    out->weight_bytes[GE_PHASE_LM_HEAD] = (double)c->vocab * H * w;

    cudaGraphExec_t exec = NULL;
    if (rq->mode == GE_PROFILE_GRAPH) GE(decode_graph(e, n, max_len, &exec)); /* captured before the gate */
    ge_marks m = {NULL, NULL, 0, rq->mode == GE_PROFILE_PHASES ? 2 + c->num_layers * (7 + 3 * chunks) + 3 : 2};
    int created = 0;
    volatile int *flag = NULL; /* [0]: the host opens the gate, [1]: the gate timed out */
    oscar_status s = OSCAR_OK;
    m.ev = calloc((size_t)m.cap, sizeof *m.ev);
    m.phase = calloc((size_t)m.cap, sizeof *m.phase);
    if (!m.ev || !m.phase) s = ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    while (s == OSCAR_OK && created < m.cap) {
        s = cu_ok(cudaEventCreate(&m.ev[created]), "cudaEventCreate");
        if (s == OSCAR_OK) created++;
    }
    if (s == OSCAR_OK && rq->prequeue) {
        void *hp = NULL, *dp = NULL;
        s = cu_ok(cudaHostAlloc(&hp, 2 * sizeof(int), cudaHostAllocMapped), "cudaHostAlloc (gate flag)");
        if (s == OSCAR_OK) {
            flag = hp;
            flag[0] = 0;
            flag[1] = 0;
            s = cu_ok(cudaHostGetDevicePointer(&dp, hp, 0), "cudaHostGetDevicePointer (gate flag)");
        }
        if (s == OSCAR_OK)
            s = cu_ok((cudaError_t)ge_k_gate((const volatile int *)dp, (int *)dp + 1, GE_GATE_NS, e->st), "gate kernel");
    }
    if (s == OSCAR_OK) {
        s = cu_ok(cudaEventRecord(m.ev[0], e->st), "cudaEventRecord");
        m.phase[0] = -1;
        m.n = 1;
    }
    if (s == OSCAR_OK) {
        /* The host-launched modes run the step the graph would replay: with
         * graphs on, oscar_decode plans for the length bucket, not max_len. */
        const int graphs = !e->opt.no_graphs && !e->opt.validate;
        oscar_batch b = make_batch(e, n, graphs ? length_bucket(e, max_len) : max_len);
        if (rq->mode == GE_PROFILE_PHASES) {
            s = forward(e, n, n, 1, 0, 1, &b, &m);
        } else {
            if (rq->mode == GE_PROFILE_GRAPH) {
                s = cu_ok(cudaGraphLaunch(exec, e->st), "cudaGraphLaunch");
                if (s == OSCAR_OK) e->graph_replays++;
            } else {
                s = forward(e, n, n, 1, 0, 1, &b, NULL);
            }
            if (s == OSCAR_OK) {
                s = cu_ok(cudaEventRecord(m.ev[1], e->st), "cudaEventRecord");
                m.phase[1] = -1;
                m.n = 2;
            }
        }
    }
    /* Open the gate in every case (it also times out on its own), then wait. */
    if (flag) flag[0] = 1;
    cudaError_t se = cudaStreamSynchronize(e->st);
    if (s == OSCAR_OK) s = cu_ok(se, "cudaStreamSynchronize (profiled step)");
    if (s == OSCAR_OK && m.n < 2) s = ge_set_error(OSCAR_ERR_INTERNAL, "ge_profile_step: %d events recorded", m.n);
    if (s == OSCAR_OK) {
        out->events = m.n;
        out->gate_timed_out = flag ? flag[1] != 0 : 0;
        float ms = 0;
        for (int i = 1; i < m.n && s == OSCAR_OK; i++) {
            s = cu_ok(cudaEventElapsedTime(&ms, m.ev[i - 1], m.ev[i]), "cudaEventElapsedTime");
            if (s == OSCAR_OK && m.phase[i] >= 0 && m.phase[i] < GE_PHASE_COUNT) out->phase_us[m.phase[i]] += 1e3 * ms;
        }
        if (s == OSCAR_OK) s = cu_ok(cudaEventElapsedTime(&ms, m.ev[0], m.ev[m.n - 1]), "cudaEventElapsedTime");
        if (s == OSCAR_OK) out->step_us = 1e3 * ms;
    }
    for (int i = 0; i < created; i++) cudaEventDestroy(m.ev[i]);
    if (flag) cudaFreeHost((void *)flag);
    free(m.ev);
    free(m.phase);
    return s;
}

/* ge_step; rq: NULL, or a profiled decode step (ge_profile_step). */
static oscar_status step(ge_engine *e, int n, const int32_t *slots, const int32_t *n_new, const int32_t *tokens,
                         int32_t *next, float *logits, const ge_prof_req *rq)
{
    if (!e || n <= 0 || !slots || !n_new || !tokens || !next)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_step: NULL argument or %d sequences", n);
    const oe_config *c = &e->cfg;
    if (n > e->max_S) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_step: %d sequences, max_batch %d", n, e->max_S);
    int decode = 1;
    int64_t T = 0;
    for (int i = 0; i < n; i++) {
        if (n_new[i] != 1) decode = 0;
        T += n_new[i];
    }
    if (T > e->max_T)
        return ge_set_error(OSCAR_ERR_TOO_LONG, "ge_step: %lld tokens in one step, the engine holds %d "
                            "(max_prefill_tokens)", (long long)T, e->max_T);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= e->sched.num_slots)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_step: slot %d out of range", slots[i]);
    /* A prefill step attends exactly among its own tokens when every
     * sequence starts empty; over the cache with oscar_extend otherwise. */
    int extend = !decode && e->chunk > 0 && e->opt.chunk_every_prompt;
    for (int i = 0; i < n && !decode && !extend; i++)
        if (e->sched.slots[slots[i]].len != 0) {
            if (e->chunk == 0)
                return ge_set_error(OSCAR_ERR_UNSUPPORTED, "ge_step: slot %d already holds %d tokens; with "
                                    "prefill_chunk 0 a prefill step takes whole prompts (feed continuations one "
                                    "token at a time)", slots[i], e->sched.slots[slots[i]].len);
            extend = 1;
        }
    for (int64_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_step: token %lld is %d, outside the vocabulary of %d",
                                (long long)t, tokens[t], c->vocab);
    int max_len;
    GE(upload_batch(e, n, slots, n_new, &max_len));
    int max_new = 0;
    for (int i = 0; i < n; i++) {
        int L0 = e->h_lens[i] - n_new[i];
        for (int j = 0; j < n_new[i]; j++) e->h_pos[e->h_cu[i] + j] = L0 + j;
        e->h_rows[i] = e->h_cu[i + 1] - 1;
        if (n_new[i] > max_new) max_new = n_new[i];
    }
    CU(cudaMemcpyAsync(e->d_pos, e->h_pos, (size_t)T * 4, cudaMemcpyHostToDevice, e->st));
    CU(cudaMemcpyAsync(e->d_rows, e->h_rows, (size_t)n * 4, cudaMemcpyHostToDevice, e->st));
    CU(cudaMemcpyAsync(e->d_ids, tokens, (size_t)T * 4, cudaMemcpyHostToDevice, e->st));

    if (decode) GE(tune_step(e, n, n));
    if (rq) {
        if (!decode) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_profile_step: decode steps only");
        GE(profiled_forward(e, n, max_len, rq));
    } else if (decode && !e->opt.no_graphs && !e->opt.validate && !e->dbg) {
        GE(replay_decode(e, n, max_len));
    } else {
        oscar_batch b = make_batch(e, n, max_len);
        GE(forward(e, n, (int)T, decode, extend, max_new, &b, NULL));
    }
    CU(cudaMemcpyAsync(next, e->d_next, (size_t)n * 4, cudaMemcpyDeviceToHost, e->st));
    if (logits)
        CU(cudaMemcpyAsync(logits, e->logits, (size_t)n * c->vocab * 4, cudaMemcpyDeviceToHost, e->st));
    CU(cudaStreamSynchronize(e->st));
    e->steps++;
    if (e->opt.validate || (e->opt.check_every > 0 && e->steps % e->opt.check_every == 0)) GE(ge_sync_check(e));
    for (int i = 0; i < n; i++) GE(ge_sched_advance(&e->sched, slots[i], n_new[i]));
    return OSCAR_OK;
}

oscar_status ge_step(ge_engine *e, int n, const int32_t *slots, const int32_t *n_new, const int32_t *tokens,
                     int32_t *next, float *logits)
{
    return step(e, n, slots, n_new, tokens, next, logits, NULL);
}

oscar_status ge_profile_step(ge_engine *e, int n, const int32_t *slots, const int32_t *tokens, ge_profile_mode mode,
                             int prequeue, int32_t *next, ge_profile *out)
{
    if (!e || !out || n <= 0 || !slots || !tokens || !next)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_profile_step: NULL argument or %d sequences", n);
    if (mode != GE_PROFILE_PHASES && mode != GE_PROFILE_HOST && mode != GE_PROFILE_GRAPH)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_profile_step: unknown mode %d", (int)mode);
    if (e->dbg)
        return ge_set_error(OSCAR_ERR_STATE, "ge_profile_step: the layer diagnostics (ge_set_debug) are on; their "
                            "downloads would be timed");
    if (mode == GE_PROFILE_GRAPH && (e->opt.no_graphs || e->opt.validate))
        return ge_set_error(OSCAR_ERR_STATE, "ge_profile_step: a graph replay was asked for, but the engine runs "
                            "decode steps from the host (%s)", e->opt.no_graphs ? "no_graphs" : "validate");
    int32_t *ones = malloc((size_t)n * sizeof *ones);
    if (!ones) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < n; i++) ones[i] = 1;
    ge_prof_req rq = {mode, prequeue != 0, out};
    oscar_status s = step(e, n, slots, ones, tokens, next, NULL, &rq);
    free(ones);
    return s;
}

oscar_status ge_fill_synthetic(ge_engine *e, int32_t slot, int32_t len, uint64_t seed)
{
    if (!e || slot < 0 || slot >= e->sched.num_slots || e->sched.slots[slot].state == GE_SLOT_FREE)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_fill_synthetic: slot %d holds no sequence", slot);
    const oe_config *c = &e->cfg;
    size_t kvd = (size_t)c->num_kv_heads * c->head_dim;
    int chunk = e->max_T;
    /* Random rows of roughly the spread of real post-RoPE keys/values. */
    KL(ge_k_fill_random(e->kb, 0, (size_t)chunk * kvd, seed * 2 + 1, 2.0f, 0.0f, e->st));
    KL(ge_k_fill_random(e->vb, 0, (size_t)chunk * kvd, seed * 2 + 2, 1.0f, 0.0f, e->st));
    while (e->sched.slots[slot].len < len) {
        int32_t n = len - e->sched.slots[slot].len;
        if (n > chunk) n = chunk;
        int max_len;
        GE(upload_batch(e, 1, &slot, &n, &max_len));
        oscar_batch b = make_batch(e, 1, max_len);
        for (int li = 0; li < c->num_layers; li++)
            OS(oscar_append(e->plan, li, &e->caches[li], &b, e->d_cu, n, e->kb, e->vb, 0, e->ws, e->ws_bytes, e->st));
        CU(cudaStreamSynchronize(e->st));
        GE(ge_sched_advance(&e->sched, slot, n));
    }
    return ge_sync_check(e);
}

static oscar_status step_cb(void *user, int n, const int32_t *slots, const int32_t *n_new, const int32_t *tokens,
                            int32_t *next, float *logits)
{
    return ge_step((ge_engine *)user, n, slots, n_new, tokens, next, logits);
}

/* A request sharing a prefix starts from a copy of the prefix's window slot
 * (sink and recent rows) and of its partly written last page; the full
 * pages are shared through the block table (ge_sched_admit). */
static oscar_status fork_cb(void *user, int32_t src_slot, int32_t dst_slot, int32_t src_page, int32_t dst_page)
{
    ge_engine *e = user;
    const size_t wb = e->kv.window_slot_bytes;
    for (int li = 0; li < e->cfg.num_layers; li++) {
        const oscar_cache *c = &e->caches[li];
        const size_t pb = e->layer_pb[li]; /* per-layer pages: each layer's own */
        if (wb && c->windows)
            CU(cudaMemcpyAsync((char *)c->windows + (size_t)dst_slot * wb, (const char *)c->windows + (size_t)src_slot * wb,
                               wb, cudaMemcpyDeviceToDevice, e->st));
        if (src_page >= 0)
            CU(cudaMemcpyAsync((char *)c->pages + (size_t)dst_page * pb, (const char *)c->pages + (size_t)src_page * pb,
                               pb, cudaMemcpyDeviceToDevice, e->st));
    }
    return OSCAR_OK;
}

oscar_status ge_generate(ge_engine *e, int n_req, const int32_t *const *prompts, const int32_t *prompt_lens,
                         int max_new, int stepwise, int prefix_len, int32_t *out, float *logits, ge_gen_stats *st)
{
    if (!e) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_generate: NULL engine");
    for (int r = 0; prompt_lens && r < n_req; r++)
        if (!stepwise && e->chunk == 0 && prompt_lens[r] > e->opt.max_prefill_tokens)
            return ge_set_error(OSCAR_ERR_TOO_LONG, "ge_generate: prompt %d has %d tokens, max_prefill_tokens is %d "
                                "(set prefill_chunk for longer prompts)", r, prompt_lens[r], e->opt.max_prefill_tokens);
    ge_run_opts ro = {.step = step_cb, .fork = fork_cb, .user = e, .vocab = e->cfg.vocab,
                      .max_prefill_tokens = e->opt.max_prefill_tokens, .stepwise = stepwise, .chunk = e->chunk,
                      .chunk_every_prompt = e->opt.chunk_every_prompt, .prefix_len = prefix_len};
    GE(ge_run_requests(&e->sched, &ro, n_req, prompts, prompt_lens, max_new, out, logits, st));
    return ge_sync_check(e);
}
