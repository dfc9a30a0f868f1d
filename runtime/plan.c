/* Plans: bind layout + parameters to the chosen backend, then forward the
 * hot-path calls after cheap argument checks (no allocation, no device
 * reads unless the runtime was created with validate = 1). */
#include <stdio.h>
#include <stdlib.h>

#include "runtime.h"

oscar_status oscar_plan_create(oscar_runtime *rt, const oscar_layout_desc *layout_in, const oscar_params *params,
                               oscar_plan **out) {
    oscar_clear_error();
    if (!rt || !layout_in || !out)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_plan_create: NULL argument");
    *out = NULL;
    oscar_layout_desc lay; /* the caller's struct may be an older, smaller one: read a full copy */
    const oscar_layout_desc *layout = &lay;
    oscar_status s = oscar_layout_import(layout_in, &lay);
    if (s != OSCAR_OK) return s;
    const oscar_method m = layout->method;
    const int needs_params = m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM;
    oscar_params *owned = NULL;
    if (!params) {
        if (needs_params)
            return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                                   "oscar_plan_create: method %s needs calibrated parameters; load them with "
                                   "oscar_params_load (made by oscar-calibrate)",
                                   oscar_method_name(m));
        /* INT2/BF16: identity; QUAROT2: Hadamard. One layer serves every layer index. */
        s = oscar_params_create_builtin(m, 1, layout->num_q_heads, layout->num_kv_heads, layout->head_dim, &owned);
        if (s != OSCAR_OK) return s;
        params = owned;
    }
    if (params->head_dim != layout->head_dim || params->num_kv_heads != layout->num_kv_heads ||
        params->num_q_heads != layout->num_q_heads) {
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "oscar_plan_create: parameters are for head_dim %d, %d q heads, %d kv heads but the "
                               "layout has head_dim %d, %d q heads, %d kv heads; use parameters calibrated for "
                               "this model",
                               params->head_dim, params->num_q_heads, params->num_kv_heads, layout->head_dim,
                               layout->num_q_heads, layout->num_kv_heads);
    }
    /* Calibrated methods need calibrated parameters: a file made for a
     * baseline (identity or Hadamard rotation, no clips) would silently serve
     * as "oscar2"; and clips fitted for one group size are not those of another. */
    if (needs_params && params->method != OSCAR_METHOD_OSCAR2 && params->method != OSCAR_METHOD_OSCAR2_LM) {
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "oscar_plan_create: the parameters are for method %s but the layout asks %s; use "
                               "parameters from oscar-calibrate (or oscar_params_create_builtin(%s, ...))",
                               oscar_method_name(params->method), oscar_method_name(m), oscar_method_name(m));
    }
    /* quarot2 is the Hadamard rotation, and its plan takes the rotation from the parameters (int2 and
     * bf16 force the identity): another method's would serve as "quarot2" silently (int2's identity
     * made it int2, oscar2's an unclipped OSCAR rotation). */
    if (m == OSCAR_METHOD_QUAROT2 && params->method != OSCAR_METHOD_QUAROT2) {
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "oscar_plan_create: the parameters are for method %s but the layout asks quarot2, "
                               "whose rotation they would replace; pass NULL (the built-in Hadamard rotation) or "
                               "oscar_params_create_builtin(quarot2, ...)",
                               oscar_method_name(params->method));
    }
    if (needs_params && params->calib_tokens > 0 && params->group != layout->group) {
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                               "oscar_plan_create: the parameters' clips were fitted for group %d but the layout has "
                               "group %d; use layout group %d or recalibrate with --group %d",
                               params->group, layout->group, params->group, layout->group);
    }
    /* Not refused: parameters calibrated for other windows (sink/recent, recorded by the
     * calibration since the twenty-third session; older files say 64/256 whatever they were fitted
     * for). The windows are a serving policy: such clips still give a valid cache, only a less
     * accurate one (docs/EVAL.md measures 64/256 clips without windows), and an engine may tune its
     * windows without recalibrating. */
    /* Code widths (FORMAT.md §2.7): opt-in, and only where the backend stores them. */
    const int wide = needs_params && oscar_params_has_wide(params);
    if ((wide || layout->wide_tensors > 0) && !(rt->api->caps & OSCAR_BACKEND_CAP_WIDE_CODES)) {
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_UNSUPPORTED,
                               "oscar_plan_create: backend %s cannot store 3-bit head-tensors (%s): use the cpu, "
                               "opencl or cuda backend, or parameters calibrated with --wide-bits 0 and "
                               "layout.wide_tensors 0",
                               rt->api->name,
                               wide ? "the parameters' code_bits field (format_version 4) has 3s"
                                    : "layout.wide_tensors > 0");
    }
    if (wide) {
        if (m != OSCAR_METHOD_OSCAR2) {
            oscar_params_destroy(owned);
            return oscar_set_error(OSCAR_ERR_UNSUPPORTED,
                                   "oscar_plan_create: the parameters' code_bits field has 3-bit head-tensors, "
                                   "which only method oscar2 stores (the layout asks %s)",
                                   oscar_method_name(m));
        }
        for (int l = 0; l < params->num_layers; l++)
            if (oscar_params_wide_in_layer(params, l) > layout->wide_tensors) {
                const int n = oscar_params_wide_in_layer(params, l);
                oscar_params_destroy(owned);
                return oscar_set_error(OSCAR_ERR_SHAPE_MISMATCH,
                                       "oscar_plan_create: layer %d of the parameters stores %d head-tensors in 3 "
                                       "bits (code_bits) but layout.wide_tensors is %d: set it to at least the "
                                       "largest count of any layer and size pages with oscar_layout_sizes_get "
                                       "(or, with wide_per_layer 1, each layer's with oscar_plan_layer_sizes)",
                                       l, n, layout->wide_tensors);
            }
    }
    const int L = params->num_layers, d = params->head_dim;
    const size_t nclip = (size_t)L * (size_t)params->num_kv_heads;
    float *clip = malloc(sizeof(float) * 2 * nclip);
    oscar_plan *plan = calloc(1, sizeof *plan);
    if (!clip || !plan) {
        free(clip);
        free(plan);
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_plan_create: out of memory");
    }
    /* Only the calibrated methods clip; the baselines are defined without it. */
    for (size_t i = 0; i < nclip; i++) { /* params->clip is [L][Hkv][2]: the descriptor's K and V apart */
        clip[i] = needs_params ? params->clip[2 * i] : 1.0f;
        clip[nclip + i] = needs_params ? params->clip[2 * i + 1] : 1.0f;
    }
    /* params->rot is [L][2][num_rot][d][d]; the plugin ABI wants K and V apart. */
    size_t per = (size_t)params->num_rot * (size_t)d * (size_t)d;
    float *rk = malloc(sizeof(float) * per * (size_t)L), *rv = malloc(sizeof(float) * per * (size_t)L);
    /* Feedback weights belong to the calibrated methods' rotations only. */
    const int use_fb = needs_params && params->fb;
    float *fk = use_fb ? malloc(sizeof(float) * per * (size_t)L) : NULL,
          *fv = use_fb ? malloc(sizeof(float) * per * (size_t)L) : NULL;
    /* Per-layer page sizes (oscar_plan_layer_sizes) need the widths after the parameters are gone. */
    const size_t nbits = (size_t)L * (size_t)params->num_kv_heads * 2;
    const int keep_bits = layout->wide_per_layer && wide;
    if (keep_bits) plan->code_bits = malloc(nbits);
    if (!rk || !rv || (use_fb && (!fk || !fv)) || (keep_bits && !plan->code_bits)) {
        free(plan->code_bits);
        free(rk);
        free(rv);
        free(fk);
        free(fv);
        free(clip);
        free(plan);
        oscar_params_destroy(owned);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_plan_create: out of memory");
    }
    for (int l = 0; l < L; l++) {
        memcpy(rk + per * (size_t)l, oscar_params_rot_ptr(params, l, 0, 0), sizeof(float) * per);
        memcpy(rv + per * (size_t)l, oscar_params_rot_ptr(params, l, 1, 0), sizeof(float) * per);
        if (use_fb) {
            memcpy(fk + per * (size_t)l, oscar_params_fb_ptr(params, l, 0, 0), sizeof(float) * per);
            memcpy(fv + per * (size_t)l, oscar_params_fb_ptr(params, l, 1, 0), sizeof(float) * per);
        }
    }
    oscar_backend_plan_desc desc = {
        .layout = *layout,
        .num_layers = L,
        .num_rot = params->num_rot,
        .identity_rotation = (m == OSCAR_METHOD_INT2 || m == OSCAR_METHOD_BF16) ? 1 : params->identity,
        .rot_k = rk,
        .rot_v = rv,
        .clip_k = clip,
        .clip_v = clip + nclip,
        .fb_k = fk,
        .fb_v = fv,
        .code_bits = wide ? params->bits : NULL,
    };
    if (m == OSCAR_METHOD_INT2 || m == OSCAR_METHOD_BF16) {
        /* Force identity whatever the parameters hold. */
        for (int l = 0; l < L; l++)
            for (int r = 0; r < params->num_rot; r++)
                for (int i = 0; i < d; i++)
                    for (int j = 0; j < d; j++) {
                        size_t o = per * (size_t)l + ((size_t)r * (size_t)d + (size_t)i) * (size_t)d + (size_t)j;
                        rk[o] = rv[o] = i == j ? 1.0f : 0.0f;
                    }
    }
    if (plan->code_bits) memcpy(plan->code_bits, params->bits, nbits);
    oscar_errbuf e = {{0}};
    plan->rt = rt;
    plan->layout = *layout;
    plan->num_layers = L;
    plan->shared_layers = owned != NULL; /* built-in rotations are the same for every layer */
    s = rt->api->plan_create(rt->ctx, &desc, &plan->bplan, plan->variant, sizeof plan->variant, &e);
    free(rk);
    free(rv);
    free(fk);
    free(fv);
    free(clip);
    oscar_params_destroy(owned);
    if (s != OSCAR_OK) {
        free(plan->code_bits);
        free(plan);
        return oscar_set_errbuf(s, &e);
    }
    atomic_fetch_add(&rt->refs, 1); /* the plan holds its runtime (released in oscar_plan_destroy) */
    *out = plan;
    return OSCAR_OK;
}

void oscar_plan_destroy(oscar_plan *plan) {
    if (!plan) return;
    oscar_runtime *rt = plan->rt;
    if (plan->bplan) rt->api->plan_destroy(rt->ctx, plan->bplan);
    free(plan->code_bits);
    free(plan);
    oscar_runtime_destroy(rt); /* drops the plan's hold; frees rt if its owner destroyed it already */
}

const char *oscar_plan_variant(const oscar_plan *plan) { return plan ? plan->variant : ""; }

oscar_status oscar_plan_workspace_bytes(const oscar_plan *plan, int max_seqs, int max_seq_len, size_t *bytes) {
    oscar_clear_error();
    if (!plan || !bytes) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_plan_workspace_bytes: NULL argument");
    if (max_seqs <= 0 || max_seq_len <= 0)
        return oscar_set_error(OSCAR_ERR_EMPTY, "oscar_plan_workspace_bytes: max_seqs %d and max_seq_len %d must be >= 1",
                               max_seqs, max_seq_len);
    if (max_seq_len > plan->layout.max_seq_len)
        return oscar_set_error(OSCAR_ERR_TOO_LONG, "oscar_plan_workspace_bytes: max_seq_len %d exceeds the layout's %d",
                               max_seq_len, plan->layout.max_seq_len);
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->workspace_bytes(plan->rt->ctx, plan->bplan, max_seqs, max_seq_len, bytes, &e),
                            &e);
}

oscar_status oscar_plan_layer_sizes(const oscar_plan *plan, int layer, oscar_layout_sizes *out) {
    oscar_clear_error();
    if (!plan || !out)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_plan_layer_sizes: NULL %s; pass a plan from "
                               "oscar_plan_create and an oscar_layout_sizes to fill", plan ? "output" : "plan");
    if (layer < 0 || (!plan->shared_layers && layer >= plan->num_layers))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_plan_layer_sizes: layer %d outside [0, %d) of the plan's parameters", layer,
                               plan->num_layers);
    /* the built-in parameters serve every layer index as layer 0 (oscar_append) */
    oscar_layout_sizes_fill(&plan->layout, plan->code_bits, plan->shared_layers ? 0 : layer, out);
    return OSCAR_OK;
}

oscar_status oscar_plan_workspace_init(oscar_plan *plan, void *workspace, void *stream) {
    oscar_clear_error();
    if (!plan || !workspace) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_plan_workspace_init: NULL argument");
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->workspace_init(plan->rt->ctx, plan->bplan, workspace, stream, &e), &e);
}

oscar_status oscar_plan_check(oscar_plan *plan, void *workspace, void *stream) {
    oscar_clear_error();
    if (!plan || !workspace) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_plan_check: NULL argument");
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->check(plan->rt->ctx, plan->bplan, workspace, stream, &e), &e);
}

/* Whether a layout keeps 16-bit rows in window slots: sink 0 and recent 0
 * leave none (window_slot_bytes 0), and the BF16 method pages every row. */
static int uses_windows(const oscar_layout_desc *l) {
    return l->method != OSCAR_METHOD_BF16 && l->sink + l->recent > 0;
}

/* Cheap checks shared by append and decode (no device reads). */
static oscar_status check_common(const oscar_plan *plan, const char *fn, int layer, const oscar_cache *cache,
                                 const oscar_batch *batch, void *workspace, size_t workspace_bytes) {
    if (!plan || !cache || !batch) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (layer < 0 || (!plan->shared_layers && layer >= plan->num_layers))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: layer %d outside [0, %d) of the plan's parameters", fn,
                               layer, plan->num_layers);
    if (batch->num_seqs <= 0)
        return oscar_set_error(OSCAR_ERR_EMPTY, "%s: num_seqs is %d; pass at least one sequence", fn, batch->num_seqs);
    if (!batch->seq_lens || !batch->block_table)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: seq_lens and block_table are required", fn);
    if (uses_windows(&plan->layout) && (!batch->window_slots || !cache->windows || cache->num_window_slots <= 0))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: the %s cache with sink %d and recent %d needs window_slots and a window pool "
                               "(cache->windows, num_window_slots > 0)",
                               fn, oscar_method_name(plan->layout.method), plan->layout.sink, plan->layout.recent);
    if (!cache->pages || cache->num_pages <= 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: cache->pages is NULL or num_pages <= 0", fn);
    if (batch->max_seq_len <= 0 || batch->max_seq_len > plan->layout.max_seq_len)
        return oscar_set_error(OSCAR_ERR_TOO_LONG, "%s: batch max_seq_len %d outside [1, %d] (layout max_seq_len)", fn,
                               batch->max_seq_len, plan->layout.max_seq_len);
    int64_t pages;
    oscar_layout_pages_for(&plan->layout, batch->max_seq_len, &pages);
    if (batch->block_table_stride < 0 || (pages > batch->block_table_stride))
        return oscar_set_error(OSCAR_ERR_TOO_LONG,
                               "%s: sequences of up to %d tokens need %lld pages but block_table_stride is %d", fn,
                               batch->max_seq_len, (long long)pages, batch->block_table_stride);
    /* The least a call of num_seqs sequences can run with (the size for the
     * shortest length: fewest splits). The kernels split a longer batch into
     * as many parts as the workspace holds, so one workspace sized by
     * oscar_plan_workspace_bytes(max_seqs, max_seq_len) serves every smaller
     * batch and length; the split plan of another (num_seqs, length) may want
     * more parts than that size holds and then gets fewer, never an error. */
    size_t need;
    oscar_errbuf e = {{0}};
    oscar_status s = plan->rt->api->workspace_bytes(plan->rt->ctx, plan->bplan, batch->num_seqs, 1, &need, &e);
    if (s != OSCAR_OK) return oscar_set_errbuf(s, &e);
    if (!workspace || workspace_bytes < need)
        return oscar_set_error(OSCAR_ERR_WORKSPACE,
                               "%s: workspace of %zu bytes given, at least %zu needed for %d sequences; size it with "
                               "oscar_plan_workspace_bytes for the largest batch and length",
                               fn, workspace ? workspace_bytes : 0, need, batch->num_seqs);
    return OSCAR_OK;
}

/* One page or window slot an append writes, and who writes it. */
typedef struct written {
    int32_t id, seq, col; /* col: block table column, -1 for a window slot */
} written;
static int cmp_written(const void *a, const void *b) {
    const written *x = a, *y = b;
    return x->id != y->id ? (x->id < y->id ? -1 : 1) : x->seq != y->seq ? (x->seq < y->seq ? -1 : 1) : (x->col > y->col) - (x->col < y->col);
}

/* validate = 1, append (host copies, already range-checked): no window slot
 * and no page is written twice, by two sequences or through two columns of
 * one block table; both writes would land, one over the other. A sequence
 * without new tokens writes nothing, so it may share (a prefix's pages). */
static oscar_status check_append_aliasing(const oscar_plan *plan, const char *fn, const int32_t *lens,
                                          const int32_t *slots, const int32_t *bt, size_t stride, const int32_t *cu,
                                          size_t n) {
    const oscar_layout_desc *l = &plan->layout;
    const int quantized = l->method != OSCAR_METHOD_BF16, windowed = uses_windows(l);
    const int64_t S0 = quantized ? l->sink : 0, W = quantized ? l->recent : 0, P = l->page_size;
    written *w = malloc(sizeof *w * (n * stride + 1)), *ws = malloc(sizeof *ws * (n + 1));
    size_t nw = 0, nws = 0;
    oscar_status s = OSCAR_OK;
    if (!w || !ws) {
        s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory while validating", fn);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const int64_t L = lens[i], k = (int64_t)cu[i + 1] - cu[i], L0 = L - k;
        if (k <= 0) continue;
        if (windowed && (W > 0 || L0 < S0)) ws[nws++] = (written){slots[i], (int32_t)i, -1};
        /* Paged rows written: new rows of the 2-bit (or BF16) region and rows
         * demoted out of the recent window, one run [a, e) of positions. */
        int64_t a = quantized ? (L0 - W > S0 ? L0 - W : S0) : L0, e = L - W;
        if (a >= e) continue;
        for (int64_t c = (a - S0) / P; c <= (e - 1 - S0) / P; c++)
            w[nw++] = (written){bt[i * stride + (size_t)c], (int32_t)i, (int32_t)c};
    }
    qsort(ws, nws, sizeof *ws, cmp_written);
    for (size_t j = 1; j < nws; j++)
        if (ws[j].id == ws[j - 1].id) {
            s = oscar_set_error(OSCAR_ERR_BLOCK_TABLE,
                                "%s: window slot %d is written by sequences %d and %d of this append; each sequence "
                                "needs a window slot of its own",
                                fn, ws[j].id, ws[j - 1].seq, ws[j].seq);
            goto done;
        }
    qsort(w, nw, sizeof *w, cmp_written);
    for (size_t j = 1; j < nw; j++)
        if (w[j].id == w[j - 1].id) {
            s = oscar_set_error(OSCAR_ERR_BLOCK_TABLE,
                                "%s: page %d is written through block_table[%d][%d] and block_table[%d][%d] in this "
                                "append; a page belongs to one sequence at a time (only pages no append writes may "
                                "be shared)",
                                fn, w[j].id, w[j - 1].seq, w[j - 1].col, w[j].seq, w[j].col);
            goto done;
        }
done:
    free(w);
    free(ws);
    return s;
}

oscar_status oscar_check_batch_arrays(const oscar_layout_desc *l, const oscar_cache *c, const oscar_batch *b,
                                      const int32_t *lens, const int32_t *slots, const int32_t *bt,
                                      const int32_t *cu_new, int32_t total_new, const char *fn, oscar_errbuf *err) {
    const int windowed = uses_windows(l);
    for (int i = 0; i < b->num_seqs; i++) {
        const int32_t L = lens[i];
        if (L < 1)
            return oscar_errbuf_set(err, OSCAR_ERR_EMPTY, "%s: seq_lens[%d] = %d; every sequence needs >= 1 token",
                                    fn, i, L);
        if (L > l->max_seq_len || (b->max_seq_len > 0 && L > b->max_seq_len))
            return oscar_errbuf_set(err, OSCAR_ERR_TOO_LONG,
                                    "%s: seq_lens[%d] = %d exceeds max_seq_len (layout %d, batch %d); raise it", fn,
                                    i, L, l->max_seq_len, b->max_seq_len);
        const int64_t np = oscar_pages_for(l, L);
        if (np > b->block_table_stride)
            return oscar_errbuf_set(err, OSCAR_ERR_TOO_LONG,
                                    "%s: sequence %d of %d tokens needs %lld pages but block_table_stride is %d; "
                                    "widen the block table",
                                    fn, i, L, (long long)np, b->block_table_stride);
        /* A batch that fits in the windows needs no page pool or block table. */
        if (np > 0 && !bt)
            return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                    "%s: sequence %d needs %lld pages but cache.pages or block_table is NULL", fn, i,
                                    (long long)np);
        const int32_t *row = bt ? bt + (size_t)i * (size_t)b->block_table_stride : NULL;
        for (int64_t k = 0; k < np; k++)
            if (row[k] < 0 || row[k] >= c->num_pages)
                return oscar_errbuf_set(err, OSCAR_ERR_BLOCK_TABLE,
                                        "%s: block_table[%d][%lld] = %d outside [0, num_pages = %d)", fn, i,
                                        (long long)k, row[k], c->num_pages);
        if (windowed && (slots[i] < 0 || slots[i] >= c->num_window_slots))
            return oscar_errbuf_set(err, OSCAR_ERR_BLOCK_TABLE,
                                    "%s: window_slots[%d] = %d outside [0, num_window_slots = %d)", fn, i, slots[i],
                                    c->num_window_slots);
    }
    if (!cu_new) return OSCAR_OK;
    /* cu_new from 0 to total_new (a last entry past total_new claims rows that
     * were not given), then each sequence's count */
    if (total_new < 0 || cu_new[0] != 0 || cu_new[b->num_seqs] != total_new)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "%s: cu_new must start at 0 and end at total_new = %d (got %d .. %d)", fn, total_new,
                                cu_new[0], cu_new[b->num_seqs]);
    for (int i = 0; i < b->num_seqs; i++) {
        const int64_t n = (int64_t)cu_new[i + 1] - cu_new[i]; /* hostile entries must not overflow */
        if (n < 0 || n > lens[i])
            return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                    "%s: sequence %d gets %lld new tokens but seq_lens is %d; cu_new must be "
                                    "non-decreasing and n_i <= seq_len",
                                    fn, i, (long long)n, lens[i]);
    }
    return OSCAR_OK;
}

/* validate = 1: one index array's bytes to the host. A copy the backend refuses (on OpenCL: the
 * array's cl_mem is smaller than the call's counts say) is worded as the call's, naming the array:
 * the backend's own message is about a read the caller never asked for. */
static oscar_status host_copy(oscar_runtime *rt, const char *fn, const char *name, void *dst, const void *src,
                              size_t offset, size_t bytes, void *stream, oscar_errbuf *e) {
    const oscar_status s = rt->api->read(rt->ctx, dst, src, offset, bytes, stream, e);
    if (s != OSCAR_OK) {
        char why[sizeof e->msg];
        snprintf(why, sizeof why, "%s", e->msg[0] ? e->msg : oscar_status_string(s));
        oscar_errbuf_set(e, s, "%s: validate = 1 reads %s on the host and could not (%s): pass %s with the entries the "
                         "call's counts say", fn, name, why, name);
    }
    return s;
}

/* validate = 1: copy the index arrays to the host and check them all, as the
 * CPU backend does (oscar_check_batch_arrays), then the aliasing of an append. */
static oscar_status validate_on_host(const oscar_plan *plan, const char *fn, const oscar_cache *cache,
                                     const oscar_batch *b, const int32_t *cu_new, int32_t total_new, void *stream) {
    oscar_runtime *rt = plan->rt;
    const size_t n = (size_t)b->num_seqs, stride = (size_t)b->block_table_stride;
    /* Only the columns a sequence of max_seq_len tokens uses (<= stride, checked
     * by check_common): the stride is the caller's row pitch, not what is read,
     * so a wide (or hostile) one costs no host memory. The copy is dense. */
    const size_t used = (size_t)oscar_pages_for(&plan->layout, b->max_seq_len);
    oscar_batch bc = *b;
    bc.block_table_stride = (int32_t)used;
    const int windowed = uses_windows(&plan->layout); /* slots are read and checked only where they are used */
    int32_t *lens = malloc(sizeof(int32_t) * n), *slots = malloc(sizeof(int32_t) * n);
    int32_t *bt = malloc(sizeof(int32_t) * (n * used + 1)), *cu = malloc(sizeof(int32_t) * (n + 1));
    oscar_status s = OSCAR_OK;
    oscar_errbuf e = {{0}};
    if (!lens || !slots || !bt || !cu) {
        s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory while validating", fn);
        goto done;
    }
    if ((s = host_copy(rt, fn, "batch.seq_lens", lens, b->seq_lens, 0, sizeof(int32_t) * n, stream, &e)) ||
        (windowed &&
         (s = host_copy(rt, fn, "batch.window_slots", slots, b->window_slots, 0, sizeof(int32_t) * n, stream, &e))) ||
        (used == stride &&
         (s = host_copy(rt, fn, "batch.block_table", bt, b->block_table, 0, sizeof(int32_t) * n * used, stream, &e))))
        goto failed;
    for (size_t i = 0; used && used < stride && i < n; i++)
        if ((s = host_copy(rt, fn, "batch.block_table", bt + i * used, b->block_table, sizeof(int32_t) * i * stride,
                           sizeof(int32_t) * used, stream, &e)))
            goto failed;
    if ((cu_new && (s = host_copy(rt, fn, "cu_new", cu, cu_new, 0, sizeof(int32_t) * (n + 1), stream, &e))) ||
        (s = rt->api->sync(rt->ctx, stream, &e)) ||
        (s = oscar_check_batch_arrays(&plan->layout, cache, &bc, lens, slots, bt, cu_new ? cu : NULL, total_new, fn,
                                      &e)))
        goto failed;
    if (cu_new) s = check_append_aliasing(plan, fn, lens, slots, bt, used, cu, n);
    goto done;
failed:
    oscar_set_errbuf(s, &e);
done:
    free(lens);
    free(slots);
    free(bt);
    free(cu);
    return s;
}

/* validate = 1, extend: cu_q and seq_lens to the host, the backends' rules. */
static oscar_status validate_cu_q(const oscar_plan *plan, const char *fn, const oscar_batch *b, const int32_t *cu_q,
                                  int32_t total_q, int32_t max_q_len, void *stream) {
    oscar_runtime *rt = plan->rt;
    size_t n = (size_t)b->num_seqs;
    int32_t *lens = malloc(sizeof(int32_t) * n), *cu = malloc(sizeof(int32_t) * (n + 1));
    oscar_errbuf e = {{0}};
    oscar_status s = OSCAR_OK;
    if (!lens || !cu)
        s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory while validating", fn);
    else if ((s = host_copy(rt, fn, "batch.seq_lens", lens, b->seq_lens, 0, sizeof(int32_t) * n, stream, &e)) ||
             (s = host_copy(rt, fn, "cu_q", cu, cu_q, 0, sizeof(int32_t) * (n + 1), stream, &e)) ||
             (s = rt->api->sync(rt->ctx, stream, &e)) ||
             (s = oscar_check_cu_q(cu, lens, b->num_seqs, total_q, max_q_len, fn, &e)))
        oscar_set_errbuf(s, &e);
    free(lens);
    free(cu);
    return s;
}

/* Whether `rows` tokens `stride` elements apart, the last `row` elements
 * wide, span at most PTRDIFF_MAX bytes. A longer span is no buffer's (the
 * caller passed a wrong stride) and would wrap the backends' offsets: they
 * would touch memory before the buffer. rows, stride, row >= 1. */
static int span_fits(int64_t rows, int64_t stride, int64_t row, size_t es) {
    const uint64_t limit = (uint64_t)PTRDIFF_MAX / es, n1 = (uint64_t)(rows - 1);
    return n1 == 0 ? (uint64_t)row <= limit : (uint64_t)stride <= (limit - (uint64_t)row) / n1;
}
static oscar_status stride_too_large(const char *fn, const char *name, int64_t stride, int64_t rows) {
    return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                           "%s: %s %lld over %lld tokens spans more bytes than any buffer holds; pass the stride in "
                           "elements between consecutive tokens (0 = dense)",
                           fn, name, (long long)stride, (long long)rows);
}

oscar_status oscar_append(oscar_plan *plan, int layer, const oscar_cache *cache, const oscar_batch *batch,
                          const int32_t *cu_new, int32_t total_new, const void *k, const void *v, int64_t kv_stride,
                          void *workspace, size_t workspace_bytes, void *stream) {
    oscar_clear_error();
    oscar_status s = check_common(plan, "oscar_append", layer, cache, batch, workspace, workspace_bytes);
    if (s != OSCAR_OK) return s;
    if (!cu_new) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_append: cu_new is NULL");
    if (total_new <= 0) return oscar_set_error(OSCAR_ERR_EMPTY, "oscar_append: total_new is %d; nothing to append", total_new);
    if (!k || !v) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_append: k or v is NULL");
    const int64_t row = (int64_t)plan->layout.num_kv_heads * plan->layout.head_dim;
    if (kv_stride == 0) kv_stride = row;
    if (kv_stride < row)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_append: kv_stride %lld is smaller than num_kv_heads*head_dim = %lld",
                               (long long)kv_stride, (long long)row);
    const size_t es = oscar_dtype_size(plan->layout.kv_dtype);
    if (!span_fits(total_new, kv_stride, row, es)) return stride_too_large("oscar_append", "kv_stride", kv_stride, total_new);
    if (plan->rt->validate &&
        (s = validate_on_host(plan, "oscar_append", cache, batch, cu_new, total_new, stream)) != OSCAR_OK)
        return s;
    oscar_backend_append_args a = {
        .layer = plan->shared_layers ? 0 : layer, .cache = *cache, .batch = *batch, .cu_new = cu_new, .total_new = total_new,
        .k = k, .v = v, .kv_stride = kv_stride, .workspace = workspace, .workspace_bytes = workspace_bytes,
        .stream = stream,
    };
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->append(plan->rt->ctx, plan->bplan, &a, &e), &e);
}

oscar_status oscar_decode(oscar_plan *plan, int layer, const oscar_cache *cache, const oscar_batch *batch,
                          const void *q, int64_t q_stride, void *out, int64_t out_stride, float sm_scale,
                          int rotated_output, void *workspace, size_t workspace_bytes, void *stream) {
    oscar_clear_error();
    oscar_status s = check_common(plan, "oscar_decode", layer, cache, batch, workspace, workspace_bytes);
    if (s != OSCAR_OK) return s;
    if (!q || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_decode: q or out is NULL");
    const int64_t row = (int64_t)plan->layout.num_q_heads * plan->layout.head_dim;
    if (q_stride == 0) q_stride = row;
    if (out_stride == 0) out_stride = row;
    if (q_stride < row || out_stride < row)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_decode: q_stride %lld / out_stride %lld smaller than num_q_heads*head_dim = %lld",
                               (long long)q_stride, (long long)out_stride, (long long)row);
    const size_t es = oscar_dtype_size(plan->layout.kv_dtype);
    if (!span_fits(batch->num_seqs, q_stride, row, es))
        return stride_too_large("oscar_decode", "q_stride", q_stride, batch->num_seqs);
    if (!span_fits(batch->num_seqs, out_stride, row, es))
        return stride_too_large("oscar_decode", "out_stride", out_stride, batch->num_seqs);
    if (!(sm_scale >= 0.0f) || isinf(sm_scale))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_decode: sm_scale must be finite and >= 0 (0 = 1/sqrt(d))");
    if (sm_scale == 0.0f) sm_scale = 1.0f / sqrtf((float)plan->layout.head_dim);
    if (plan->rt->validate && (s = validate_on_host(plan, "oscar_decode", cache, batch, NULL, 0, stream)) != OSCAR_OK)
        return s;
    oscar_backend_decode_args a = {
        .layer = plan->shared_layers ? 0 : layer, .cache = *cache, .batch = *batch, .q = q, .q_stride = q_stride, .out = out,
        .out_stride = out_stride, .sm_scale = sm_scale, .rotated_output = rotated_output ? 1 : 0,
        .workspace = workspace, .workspace_bytes = workspace_bytes, .stream = stream,
    };
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->decode(plan->rt->ctx, plan->bplan, &a, &e), &e);
}

/* The first version of oscar_attn_args is the whole struct (it was added with
 * its first field set): struct_size below it is a caller's mistake. */
#define OSCAR_ATTN_ARGS_SIZE_V1 (offsetof(oscar_attn_args, stream) + sizeof(void *))

void oscar_attn_args_default(oscar_attn_args *a) {
    if (!a) return;
    memset(a, 0, sizeof *a);
    a->struct_size = (uint32_t)sizeof *a;
}

oscar_status oscar_extend(oscar_plan *plan, int layer, const oscar_cache *cache, const oscar_batch *batch,
                          const oscar_attn_args *args_in) {
    oscar_clear_error();
    const char *fn = "oscar_extend";
    if (!args_in) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: args is NULL", fn);
    oscar_attn_args x;
    oscar_status s =
        oscar_struct_import(&x, sizeof x, args_in, OSCAR_ATTN_ARGS_SIZE_V1, "oscar_extend args", "oscar_attn_args_default");
    if (s != OSCAR_OK) return s;
    if (!plan || !cache || !batch) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    /* Before anything sized by it: the checks below run on max(num_seqs, total_q)
     * rows, and validate = 1 allocates num_seqs entries (a negative count was a
     * huge allocation, refused as out of memory, or an abort under ASan). */
    if (batch->num_seqs < 1)
        return oscar_set_error(OSCAR_ERR_EMPTY, "%s: num_seqs is %d; pass at least one sequence", fn, batch->num_seqs);
    if (x.total_q < 1)
        return oscar_set_error(OSCAR_ERR_EMPTY, "%s: total_q is %d; pass at least one query token", fn, x.total_q);
    if (!x.cu_q && (x.total_q != batch->num_seqs || x.max_q_len > 1))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: cu_q is NULL (one query per sequence) but total_q is %d and max_q_len %d; set "
                               "total_q = num_seqs (%d) and max_q_len = 1, or pass cu_q",
                               fn, x.total_q, x.max_q_len, batch->num_seqs);
    if (!x.cu_q) x.max_q_len = 1;
    if (x.max_q_len < 1 || x.max_q_len > x.total_q || (batch->max_seq_len > 0 && x.max_q_len > batch->max_seq_len))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: max_q_len %d outside [1, min(total_q %d, batch max_seq_len %d)]; set it to the "
                               "largest query count of a sequence",
                               fn, x.max_q_len, x.total_q, batch->max_seq_len);
    /* Extend writes partials per query token: size the workspace for the larger count. */
    const int rows = x.total_q > batch->num_seqs ? x.total_q : batch->num_seqs;
    oscar_batch sized = *batch;
    sized.num_seqs = rows;
    s = check_common(plan, fn, layer, cache, &sized, x.workspace, x.workspace_bytes);
    if (s != OSCAR_OK) return s;
    if (!x.q || !x.out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: q or out is NULL", fn);
    const int64_t row = (int64_t)plan->layout.num_q_heads * plan->layout.head_dim;
    if (x.q_stride == 0) x.q_stride = row;
    if (x.out_stride == 0) x.out_stride = row;
    if (x.q_stride < row || x.out_stride < row)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: q_stride %lld / out_stride %lld smaller than num_q_heads*head_dim = %lld", fn,
                               (long long)x.q_stride, (long long)x.out_stride, (long long)row);
    const size_t es = oscar_dtype_size(plan->layout.kv_dtype);
    if (!span_fits(x.total_q, x.q_stride, row, es)) return stride_too_large(fn, "q_stride", x.q_stride, x.total_q);
    if (!span_fits(x.total_q, x.out_stride, row, es)) return stride_too_large(fn, "out_stride", x.out_stride, x.total_q);
    /* A stride whose byte count wraps around would pass the size check: such a
     * call needs more than any buffer holds. */
    const size_t n1 = (size_t)(x.total_q - 1);
    size_t out_need = SIZE_MAX;
    if (n1 == 0 || (size_t)x.out_stride <= (SIZE_MAX / es - (size_t)row) / n1)
        out_need = (n1 * (size_t)x.out_stride + (size_t)row) * es;
    if (x.out_bytes < out_need)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: out_bytes %zu is smaller than the %zu bytes %d query tokens of stride %lld "
                               "write; pass out's size in out_bytes (nothing was written)",
                               fn, x.out_bytes, out_need, x.total_q, (long long)x.out_stride);
    const size_t lse_need = (size_t)x.total_q * (size_t)plan->layout.num_q_heads * sizeof(float);
    if (x.lse && x.lse_bytes < lse_need)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "%s: lse_bytes %zu is smaller than total_q * num_q_heads * 4 = %zu; pass lse's size "
                               "in lse_bytes, or lse = NULL (nothing was written)",
                               fn, x.lse_bytes, lse_need);
    if (!(x.sm_scale >= 0.0f) || isinf(x.sm_scale))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: sm_scale must be finite and >= 0 (0 = 1/sqrt(d))", fn);
    if (x.sm_scale == 0.0f) x.sm_scale = 1.0f / sqrtf((float)plan->layout.head_dim);
    if (plan->rt->validate &&
        (s = validate_on_host(plan, fn, cache, batch, NULL, 0, x.stream)) == OSCAR_OK && x.cu_q)
        s = validate_cu_q(plan, fn, batch, x.cu_q, x.total_q, x.max_q_len, x.stream);
    if (s != OSCAR_OK) return s;
    oscar_backend_extend_args a = {
        .layer = plan->shared_layers ? 0 : layer, .cache = *cache, .batch = *batch, .cu_q = x.cu_q,
        .total_q = x.total_q, .max_q_len = x.max_q_len, .q = x.q, .q_stride = x.q_stride, .out = x.out,
        .out_stride = x.out_stride, .lse = x.lse, .sm_scale = x.sm_scale, .rotated_output = x.rotated_output ? 1 : 0,
        .workspace = x.workspace, .workspace_bytes = x.workspace_bytes, .stream = x.stream,
    };
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(plan->rt->api->extend(plan->rt->ctx, plan->bplan, &a, &e), &e);
}
