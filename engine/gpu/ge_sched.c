/* KV sizing, page allocator and FIFO scheduler of the GPU engine (see ge_sched.h). */
#include "ge_sched.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char g_err[512];

const char *ge_last_error(void) { return g_err; }

oscar_status ge_set_error(oscar_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return s;
}

/* ----------------------------------------------------------------- sizing */
/* The layout's sizes and the bytes of one page id across every layer: the sum of the layers' page sizes
 * (layer_page_bytes), or num_layers times the layout's page size when layer_page_bytes is NULL. */
static oscar_status sizes(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes,
                          oscar_layout_sizes *sz, size_t *page_all, const char *fn)
{
    if (!l || num_layers <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: NULL layout or %d layers", fn, num_layers);
    if (oscar_layout_sizes_get(l, sz) != OSCAR_OK)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: %s", fn, oscar_last_error());
    if (!layer_page_bytes) {
        *page_all = (size_t)num_layers * sz->page_bytes;
        return OSCAR_OK;
    }
    /* Per-layer pages (layout.wide_per_layer, FORMAT.md §3.3): each layer's page lies between the plain 2-bit
     * page (no 1-bit plane) and the layout's largest (wide_tensors planes). */
    oscar_layout_desc plain = *l;
    plain.wide_tensors = 0;
    plain.wide_per_layer = 0;
    oscar_layout_sizes psz;
    if (oscar_layout_sizes_get(&plain, &psz) != OSCAR_OK)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: %s", fn, oscar_last_error());
    size_t sum = 0;
    for (int i = 0; i < num_layers; i++) {
        size_t pb = layer_page_bytes[i];
        if (pb < psz.page_bytes || pb > sz->page_bytes || pb % 16)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: layer %d's page of %zu bytes is not a page of the "
                                "layout (a multiple of 16 from %zu, no 1-bit plane, to %zu, wide_tensors %d)", fn, i,
                                pb, psz.page_bytes, sz->page_bytes, l->wide_tensors);
        sum += pb;
    }
    *page_all = sum;
    return OSCAR_OK;
}

static size_t slot_bytes(const oscar_layout_desc *l, const oscar_layout_sizes *sz)
{
    /* The BF16 method keeps no windows: no slot memory. */
    return l->method == OSCAR_METHOD_BF16 ? 0 : sz->window_slot_bytes;
}

oscar_status ge_kv_seq_bytes(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, int64_t len,
                             size_t *bytes)
{
    oscar_layout_sizes sz;
    size_t page_all = 0;
    oscar_status s = sizes(l, num_layers, layer_page_bytes, &sz, &page_all, "ge_kv_seq_bytes");
    if (s != OSCAR_OK) return s;
    int64_t pages;
    if (!bytes || len < 0 || oscar_layout_pages_for(l, len, &pages) != OSCAR_OK)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_seq_bytes: NULL output or negative length");
    *bytes = (size_t)pages * page_all + (size_t)num_layers * slot_bytes(l, &sz);
    return OSCAR_OK;
}

oscar_status ge_kv_bytes_per_token(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes,
                                   double *bytes)
{
    oscar_layout_sizes sz;
    size_t page_all = 0;
    oscar_status s = sizes(l, num_layers, layer_page_bytes, &sz, &page_all, "ge_kv_bytes_per_token");
    if (s != OSCAR_OK) return s;
    if (!bytes) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_bytes_per_token: NULL output");
    *bytes = (double)page_all / (double)l->page_size;
    return OSCAR_OK;
}

oscar_status ge_kv_plan_for(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, size_t budget,
                            int max_slots, ge_kv_plan *out)
{
    oscar_layout_sizes sz;
    size_t page_all = 0;
    oscar_status s = sizes(l, num_layers, layer_page_bytes, &sz, &page_all, "ge_kv_plan_for");
    if (s != OSCAR_OK) return s;
    if (!out || max_slots <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_plan_for: NULL output or %d slots", max_slots);
    memset(out, 0, sizeof *out);
    size_t wb = slot_bytes(l, &sz);
    size_t windows = (size_t)max_slots * wb, all_windows = (size_t)num_layers * windows;
    if (all_windows > budget)
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_kv_plan_for: %d window slots need %zu bytes per layer, "
                            "more than the budget's %zu; lower the batch or raise the KV budget",
                            max_slots, windows, budget / (size_t)num_layers);
    /* Every layer holds the same page ids (one block table), so a page id costs a page in every layer:
     * with one page size this is (budget / num_layers - windows) / page_bytes, the same count. */
    size_t np = (budget - all_windows) / page_all;
    if (np > INT32_MAX) np = INT32_MAX;
    out->num_pages = (int32_t)np;
    out->num_slots = max_slots;
    out->page_bytes = sz.page_bytes;
    out->window_slot_bytes = wb;
    out->pool_bytes_per_layer = np * sz.page_bytes;
    out->window_bytes_per_layer = windows;
    out->page_bytes_all_layers = page_all;
    out->pool_bytes = np * page_all;
    out->total_bytes = out->pool_bytes + all_windows;
    return OSCAR_OK;
}

oscar_status ge_kv_bits_per_element(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes,
                                    int64_t len, double *bits)
{
    oscar_layout_sizes sz;
    size_t page_all = 0;
    oscar_status s = sizes(l, num_layers, layer_page_bytes, &sz, &page_all, "ge_kv_bits_per_element");
    if (s != OSCAR_OK) return s;
    if (!bits || len <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_bits_per_element: NULL output or length %lld",
                            (long long)len);
    if (!layer_page_bytes) {
        if (oscar_layout_bits_per_element(l, len, bits) != OSCAR_OK)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_bits_per_element: %s", oscar_last_error());
        return OSCAR_OK;
    }
    /* Layer i's page is the plain page plus n_i planes of P d / 8 bytes (sizes() checked the range):
     * its bits are those of a one-size layout with wide_tensors n_i. */
    oscar_layout_desc one = *l;
    one.wide_tensors = one.wide_per_layer = 0;
    oscar_layout_sizes psz;
    oscar_layout_sizes_get(&one, &psz);
    const size_t plane = (size_t)l->page_size * (size_t)l->head_dim / 8;
    double sum = 0.0;
    for (int i = 0; i < num_layers; i++) {
        one.wide_tensors = (int32_t)((layer_page_bytes[i] - psz.page_bytes) / plane);
        double b;
        if ((layer_page_bytes[i] - psz.page_bytes) % plane || oscar_layout_bits_per_element(&one, len, &b) != OSCAR_OK)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_bits_per_element: layer %d's page of %zu bytes is "
                                "not a 2-bit page plus whole 1-bit planes", i, layer_page_bytes[i]);
        sum += b;
    }
    *bits = sum / num_layers;
    return OSCAR_OK;
}

/* 3-bit head-tensors (KV head, K/V) of one layer of the parameters, or -1 with the error set. */
static int layer_wide(const oscar_params *p, int layer, int num_kv_heads)
{
    int n = 0;
    for (int h = 0; h < num_kv_heads; h++)
        for (int w = 0; w < 2; w++) {
            int bits = 2;
            if (oscar_params_code_bits(p, layer, h, (oscar_kv)w, &bits) != OSCAR_OK) {
                ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_wide_layout: %s", oscar_last_error());
                return -1;
            }
            n += bits == 3;
        }
    return n;
}

oscar_status ge_kv_wide_layout(const oscar_params *p, int num_layers, oscar_layout_desc *l, size_t *layer_page_bytes,
                               int *max_wide)
{
    if (max_wide) *max_wide = 0;
    if (!l || num_layers <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_wide_layout: NULL layout or %d layers", num_layers);
    /* Only oscar2 stores 3-bit head-tensors: for another method the layout stays as it is, and
     * oscar_plan_create refuses a file that has them with its own message. */
    const int wide_ok = p && l->method == OSCAR_METHOD_OSCAR2;
    if (wide_ok) {
        oscar_params_info info;
        if (oscar_params_get_info(p, &info) != OSCAR_OK)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_wide_layout: %s", oscar_last_error());
        if (info.num_layers != num_layers || info.num_kv_heads != l->num_kv_heads)
            return ge_set_error(OSCAR_ERR_SHAPE_MISMATCH, "ge_kv_wide_layout: the parameters are for %d layers of %d "
                                "KV heads, the model has %d of %d", info.num_layers, info.num_kv_heads, num_layers,
                                l->num_kv_heads);
    }
    int most = 0;
    for (int i = 0; wide_ok && i < num_layers; i++) {
        int n = layer_wide(p, i, l->num_kv_heads);
        if (n < 0) return OSCAR_ERR_INVALID_ARGUMENT;
        if (n > most) most = n;
    }
    /* Room for the most planes any layer has, each layer's pages exactly its own (FORMAT.md §3.3). */
    if (most > 0) {
        l->wide_tensors = most;
        l->wide_per_layer = 1;
    }
    if (max_wide) *max_wide = most;
    if (!layer_page_bytes) return OSCAR_OK;
    oscar_layout_sizes sz;
    if (oscar_layout_sizes_get(l, &sz) != OSCAR_OK)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_wide_layout: %s", oscar_last_error());
    for (int i = 0; i < num_layers; i++) {
        layer_page_bytes[i] = sz.page_bytes;
        if (most == 0) continue;
        /* Layer i's page: the 2-bit page plus its own planes, the page of a one-size layout with that many. */
        oscar_layout_desc one = *l;
        one.wide_tensors = layer_wide(p, i, l->num_kv_heads);
        one.wide_per_layer = 0;
        oscar_layout_sizes lsz;
        if (oscar_layout_sizes_get(&one, &lsz) != OSCAR_OK)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_kv_wide_layout: layer %d: %s", i, oscar_last_error());
        layer_page_bytes[i] = lsz.page_bytes;
    }
    return OSCAR_OK;
}

oscar_status ge_max_batch(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, size_t budget,
                          int64_t len, int *batch, ge_kv_plan *plan)
{
    if (!batch) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_max_batch: NULL output");
    *batch = 0;
    size_t per_seq = 0;
    oscar_status s = ge_kv_seq_bytes(l, num_layers, layer_page_bytes, len, &per_seq);
    if (s != OSCAR_OK) return s;
    int64_t pages;
    oscar_layout_pages_for(l, len, &pages);
    /* Upper bound from bytes, then step down until pages and slots fit
     * (page rounding can cost one sequence). */
    int64_t b = per_seq ? (int64_t)(budget / per_seq) : 0;
    if (b > 1 << 20) b = 1 << 20;
    for (; b > 0; b--) {
        ge_kv_plan p;
        if (ge_kv_plan_for(l, num_layers, layer_page_bytes, budget, (int)b, &p) != OSCAR_OK) continue;
        if ((int64_t)p.num_pages >= b * pages) {
            *batch = (int)b;
            if (plan) *plan = p;
            return OSCAR_OK;
        }
    }
    if (plan) memset(plan, 0, sizeof *plan);
    return OSCAR_OK;
}

/* ---------------------------------------------------------- page allocator */
oscar_status ge_pages_init(ge_pages *a, int32_t capacity)
{
    if (!a || capacity < 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_pages_init: NULL allocator or %d pages", capacity);
    memset(a, 0, sizeof *a);
    a->free_ids = malloc(((size_t)capacity + 1) * sizeof *a->free_ids);
    a->refs = calloc((size_t)capacity + 1, sizeof *a->refs);
    if (!a->free_ids || !a->refs) {
        ge_pages_release(a);
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_pages_init: out of host memory for %d pages", capacity);
    }
    a->capacity = capacity;
    /* Lowest ids on top of the stack: handed out first. */
    for (int32_t i = 0; i < capacity; i++) a->free_ids[i] = capacity - 1 - i;
    a->n_free = capacity;
    return OSCAR_OK;
}

void ge_pages_release(ge_pages *a)
{
    if (!a) return;
    free(a->free_ids);
    free(a->refs);
    memset(a, 0, sizeof *a);
}

oscar_status ge_pages_alloc(ge_pages *a, int32_t n, int32_t *out)
{
    if (!a || n < 0 || (n && !out))
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_pages_alloc: NULL argument or %d pages", n);
    if (n > a->n_free)
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_pages_alloc: %d pages asked, %d free of %d", n,
                            a->n_free, a->capacity);
    for (int32_t i = 0; i < n; i++) {
        int32_t id = a->free_ids[--a->n_free];
        a->refs[id] = 1;
        out[i] = id;
    }
    return OSCAR_OK;
}

/* Every id in range and in use, none listed twice. */
static oscar_status check_held(const ge_pages *a, int32_t n, const int32_t *ids, const char *fn)
{
    if (!a || n < 0 || (n && !ids))
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d pages", fn, n);
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= a->capacity || a->refs[ids[i]] <= 0)
            return ge_set_error(OSCAR_ERR_BLOCK_TABLE, "%s: page %d is out of range or not in use (double free?)",
                                fn, ids[i]);
        for (int32_t j = 0; j < i; j++)
            if (ids[j] == ids[i]) return ge_set_error(OSCAR_ERR_BLOCK_TABLE, "%s: page %d listed twice", fn, ids[i]);
    }
    return OSCAR_OK;
}

oscar_status ge_pages_ref(ge_pages *a, int32_t n, const int32_t *ids)
{
    oscar_status st = check_held(a, n, ids, "ge_pages_ref");
    if (st != OSCAR_OK) return st;
    for (int32_t i = 0; i < n; i++)
        if (a->refs[ids[i]] == INT32_MAX)
            return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_pages_ref: page %d has too many holders", ids[i]);
    for (int32_t i = 0; i < n; i++) a->refs[ids[i]]++;
    return OSCAR_OK;
}

oscar_status ge_pages_free(ge_pages *a, int32_t n, const int32_t *ids)
{
    oscar_status st = check_held(a, n, ids, "ge_pages_free");
    if (st != OSCAR_OK) return st;
    for (int32_t i = 0; i < n; i++)
        if (--a->refs[ids[i]] == 0) a->free_ids[a->n_free++] = ids[i];
    return OSCAR_OK;
}

int32_t ge_shared_pages(const oscar_layout_desc *l, int64_t len)
{
    if (!l || l->page_size <= 0 || len <= 0) return 0;
    /* Rows of the 2-bit history are final once written (positions
     * S0 .. len-W-1); the BF16 method writes every position to its page
     * (FORMAT.md §3.3; engine/ sees only the public header). */
    int64_t rows = l->method == OSCAR_METHOD_BF16 ? len : len - l->sink - l->recent;
    if (rows <= 0) return 0;
    int64_t full = rows / l->page_size;
    return full > INT32_MAX ? INT32_MAX : (int32_t)full;
}

/* -------------------------------------------------------------- scheduler */
oscar_status ge_sched_init(ge_sched *s, const oscar_layout_desc *l, int32_t num_pages, int32_t num_slots)
{
    if (!s || !l || num_pages < 0 || num_slots <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_init: NULL argument, %d pages or %d slots",
                            num_pages, num_slots);
    memset(s, 0, sizeof *s);
    int64_t stride;
    if (oscar_layout_pages_for(l, l->max_seq_len, &stride) != OSCAR_OK)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_init: %s", oscar_last_error());
    if (stride < 1) stride = 1; /* a table with no columns would be an empty allocation */
    s->layout = *l;
    s->num_slots = num_slots;
    s->stride = (int32_t)stride;
    oscar_status st = ge_pages_init(&s->pages, num_pages);
    if (st != OSCAR_OK) return st;
    s->block_table = malloc((size_t)num_slots * (size_t)stride * sizeof *s->block_table);
    s->slots = calloc((size_t)num_slots, sizeof *s->slots);
    if (!s->block_table || !s->slots) {
        ge_sched_release(s);
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_sched_init: out of host memory");
    }
    for (size_t i = 0; i < (size_t)num_slots * (size_t)stride; i++) s->block_table[i] = -1;
    return OSCAR_OK;
}

void ge_sched_release(ge_sched *s)
{
    if (!s) return;
    ge_pages_release(&s->pages);
    free(s->block_table);
    free(s->slots);
    free(s->reqs);
    memset(s, 0, sizeof *s);
}

static int64_t pages_for(const ge_sched *s, int64_t len)
{
    int64_t p = 0;
    oscar_layout_pages_for(&s->layout, len, &p);
    return p;
}

static oscar_status submit(ge_sched *s, int32_t prefix, int32_t prompt_len, int32_t max_new, int32_t *id)
{
    if (!s || prompt_len <= 0 || max_new < 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_submit: prompt of %d tokens, %d new", prompt_len,
                            max_new);
    int64_t target = (int64_t)prompt_len + max_new, shared = 0;
    if (prefix >= 0) {
        if (prefix >= s->n_reqs || s->reqs[prefix].max_new != 0 || s->reqs[prefix].prefix >= 0)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_submit_shared: request %d is not a prefix "
                                "(a queued request of its own prompt and no generated tokens)", prefix);
        if (s->reqs[prefix].prompt_len >= prompt_len)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_submit_shared: the prefix of %d tokens is not "
                                "shorter than the prompt of %d; the request needs a token of its own",
                                s->reqs[prefix].prompt_len, prompt_len);
        shared = ge_shared_pages(&s->layout, s->reqs[prefix].prompt_len);
    }
    if (target > s->layout.max_seq_len)
        return ge_set_error(OSCAR_ERR_TOO_LONG, "ge_sched_submit: %lld tokens exceed max_seq_len %d",
                            (long long)target, s->layout.max_seq_len);
    if (pages_for(s, target) - shared > s->pages.capacity)
        return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_sched_submit: %lld tokens need %lld pages, the pool "
                            "has %d; raise the KV budget", (long long)target, (long long)(pages_for(s, target) - shared),
                            s->pages.capacity);
    if (s->n_reqs == s->cap_reqs) {
        int32_t cap = s->cap_reqs ? 2 * s->cap_reqs : 64;
        ge_request *r = realloc(s->reqs, (size_t)cap * sizeof *r);
        if (!r) return ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "ge_sched_submit: out of host memory");
        s->reqs = r;
        s->cap_reqs = cap;
    }
    s->reqs[s->n_reqs] = (ge_request){prompt_len, max_new, -1, 0, prefix};
    if (id) *id = s->n_reqs;
    s->n_reqs++;
    return OSCAR_OK;
}

oscar_status ge_sched_submit(ge_sched *s, int32_t prompt_len, int32_t max_new, int32_t *id)
{
    return submit(s, -1, prompt_len, max_new, id);
}

oscar_status ge_sched_submit_shared(ge_sched *s, int32_t prefix, int32_t prompt_len, int32_t max_new, int32_t *id)
{
    if (prefix < 0) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_submit_shared: prefix request %d", prefix);
    return submit(s, prefix, prompt_len, max_new, id);
}

oscar_status ge_sched_admit(ge_sched *s, int32_t max_tokens, int32_t *out_slots, int32_t *n)
{
    if (!s || !out_slots || !n) return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_admit: NULL argument");
    *n = 0;
    int64_t tokens = 0;
    while (s->head < s->n_reqs) {
        ge_request *r = &s->reqs[s->head];
        /* A shared request starts from its prefix's cache: the prefix must be
         * running with its whole prompt in the cache. */
        const ge_request *pr = r->prefix >= 0 ? &s->reqs[r->prefix] : NULL;
        int32_t src = -1, from = 0, shared = 0;
        if (pr) {
            if (pr->done || (pr->slot >= 0 && s->slots[pr->slot].state == GE_SLOT_FREE))
                return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_admit: request %d shares the prefix of "
                                    "request %d, which finished before it was admitted", s->head, r->prefix);
            if (pr->slot < 0 || s->slots[pr->slot].len != pr->prompt_len) break; /* not prefilled yet */
            src = pr->slot;
            from = pr->prompt_len;
            shared = ge_shared_pages(&s->layout, from);
        }
        if (*n > 0 && tokens + r->prompt_len - from > max_tokens) break;
        int32_t slot = -1;
        for (int32_t i = 0; i < s->num_slots; i++)
            if (s->slots[i].state == GE_SLOT_FREE) {
                slot = i;
                break;
            }
        if (slot < 0) break;
        int32_t target = r->prompt_len + r->max_new;
        int32_t np = (int32_t)pages_for(s, target);
        if (np - shared > s->pages.n_free) break;
        int32_t *row = s->block_table + (size_t)slot * s->stride;
        const int32_t *src_row = src >= 0 ? s->block_table + (size_t)src * s->stride : NULL;
        if (ge_pages_alloc(&s->pages, np - shared, row + shared) != OSCAR_OK) break;
        if (shared) {
            oscar_status st = ge_pages_ref(&s->pages, shared, src_row);
            if (st != OSCAR_OK) {
                ge_pages_free(&s->pages, np - shared, row + shared);
                for (int32_t j = 0; j < np; j++) row[j] = -1;
                return st;
            }
            memcpy(row, src_row, (size_t)shared * sizeof *row);
        }
        /* The prefix's last page, if partly written, is copied into ours. */
        int32_t fork_page = src >= 0 && pages_for(s, from) > shared ? shared : -1;
        s->slots[slot] = (ge_slot){GE_SEQ_PREFILL, s->head, from, target, np, shared, src, fork_page};
        r->slot = slot;
        out_slots[(*n)++] = slot;
        tokens += r->prompt_len - from;
        s->running++;
        s->head++;
    }
    return OSCAR_OK;
}

static oscar_status check_slot(const ge_sched *s, int32_t slot, const char *fn)
{
    if (!s || slot < 0 || slot >= s->num_slots || s->slots[slot].state == GE_SLOT_FREE)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "%s: slot %d holds no running sequence", fn, slot);
    return OSCAR_OK;
}

oscar_status ge_sched_advance(ge_sched *s, int32_t slot, int32_t n)
{
    oscar_status st = check_slot(s, slot, "ge_sched_advance");
    if (st != OSCAR_OK) return st;
    ge_slot *q = &s->slots[slot];
    if (n < 0 || (int64_t)q->len + n > q->target)
        return ge_set_error(OSCAR_ERR_TOO_LONG, "ge_sched_advance: slot %d at %d tokens cannot take %d more "
                            "(reserved %d)", slot, q->len, n, q->target);
    q->len += n;
    q->state = GE_SEQ_DECODE;
    return OSCAR_OK;
}

oscar_status ge_sched_finish(ge_sched *s, int32_t slot)
{
    oscar_status st = check_slot(s, slot, "ge_sched_finish");
    if (st != OSCAR_OK) return st;
    ge_slot *q = &s->slots[slot];
    int32_t *row = s->block_table + (size_t)slot * s->stride;
    st = ge_pages_free(&s->pages, q->n_pages, row);
    if (st != OSCAR_OK) return st;
    for (int32_t i = 0; i < s->stride; i++) row[i] = -1;
    s->reqs[q->req].done = 1;
    memset(q, 0, sizeof *q);
    s->running--;
    return OSCAR_OK;
}

oscar_status ge_sched_batch(const ge_sched *s, int32_t n, const int32_t *slots, const int32_t *new_tokens,
                            int32_t *seq_lens, int32_t *window_slots, int32_t *block_table, int32_t *cu_new,
                            int32_t *max_len)
{
    if (!s || n <= 0 || !slots || !new_tokens || !seq_lens || !window_slots || !block_table || !cu_new || !max_len)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_sched_batch: NULL argument or %d sequences", n);
    cu_new[0] = 0;
    *max_len = 0;
    for (int32_t i = 0; i < n; i++) {
        oscar_status st = check_slot(s, slots[i], "ge_sched_batch");
        if (st != OSCAR_OK) return st;
        const ge_slot *q = &s->slots[slots[i]];
        int64_t len = (int64_t)q->len + new_tokens[i];
        if (new_tokens[i] <= 0 || len > q->target)
            return ge_set_error(OSCAR_ERR_TOO_LONG, "ge_sched_batch: slot %d at %d tokens with %d new exceeds "
                                "its reservation of %d", slots[i], q->len, new_tokens[i], q->target);
        seq_lens[i] = (int32_t)len;
        window_slots[i] = slots[i];
        memcpy(block_table + (size_t)i * s->stride, s->block_table + (size_t)slots[i] * s->stride,
               (size_t)s->stride * sizeof *block_table);
        cu_new[i + 1] = cu_new[i] + new_tokens[i];
        if (len > *max_len) *max_len = (int32_t)len;
    }
    return OSCAR_OK;
}

oscar_status ge_sched_check(const ge_sched *s, char *msg, size_t msg_len)
{
#define BAD(...)                                                                                       \
    do {                                                                                               \
        if (msg && msg_len) snprintf(msg, msg_len, __VA_ARGS__);                                       \
        free(holders);                                                                                 \
        free(seen);                                                                                    \
        return OSCAR_ERR_INTERNAL;                                                                     \
    } while (0)
    int32_t cap = s->pages.capacity;
    /* holders[id]: running slots whose row names page id; seen[id]: last slot + 1 that named it. */
    int32_t *holders = calloc((size_t)cap + 1, sizeof *holders), *seen = calloc((size_t)cap + 1, sizeof *seen);
    if (!holders || !seen) {
        free(holders);
        free(seen);
        if (msg && msg_len) snprintf(msg, msg_len, "out of memory");
        return OSCAR_ERR_OUT_OF_MEMORY;
    }
    int32_t running = 0;
    for (int32_t sl = 0; sl < s->num_slots; sl++) {
        const ge_slot *q = &s->slots[sl];
        const int32_t *row = s->block_table + (size_t)sl * s->stride;
        if (q->state == GE_SLOT_FREE) {
            for (int32_t j = 0; j < s->stride; j++)
                if (row[j] != -1) BAD("free slot %d has block table entry %d = %d", sl, j, row[j]);
            continue;
        }
        running++;
        if (q->n_pages != pages_for(s, q->target)) BAD("slot %d holds %d pages, needs %lld", sl, q->n_pages,
                                                       (long long)pages_for(s, q->target));
        if (q->len > q->target) BAD("slot %d length %d over its reservation %d", sl, q->len, q->target);
        if (q->n_shared < 0 || q->n_shared > q->n_pages) BAD("slot %d shares %d of its %d pages", sl, q->n_shared,
                                                             q->n_pages);
        const ge_request *r = &s->reqs[q->req];
        if (q->n_shared > 0) {
            /* Shared pages are the prefix's while the prefix still runs. */
            if (r->prefix < 0) BAD("slot %d shares pages but its request has no prefix", sl);
            const ge_request *pr = &s->reqs[r->prefix];
            if (q->n_shared != ge_shared_pages(&s->layout, pr->prompt_len))
                BAD("slot %d shares %d pages, its prefix of %d tokens has %d full ones", sl, q->n_shared,
                    pr->prompt_len, ge_shared_pages(&s->layout, pr->prompt_len));
            if (!pr->done && pr->slot >= 0 && s->slots[pr->slot].state != GE_SLOT_FREE &&
                memcmp(row, s->block_table + (size_t)pr->slot * s->stride, (size_t)q->n_shared * sizeof *row))
                BAD("slot %d's shared pages differ from its prefix's (slot %d)", sl, pr->slot);
        }
        for (int32_t j = 0; j < s->stride; j++) {
            int32_t id = row[j];
            if (j >= q->n_pages) {
                if (id != -1) BAD("slot %d entry %d past its pages is %d", sl, j, id);
                continue;
            }
            if (id < 0 || id >= cap) BAD("slot %d entry %d = %d out of range", sl, j, id);
            if (seen[id] == sl + 1) BAD("page %d twice in slot %d's block table", id, sl);
            seen[id] = sl + 1;
            if (s->pages.refs[id] <= 0) BAD("page %d held by slot %d but marked free", id, sl);
            holders[id]++;
        }
    }
    if (running != s->running) BAD("%d running slots, counter says %d", running, s->running);
    int64_t held = 0;
    for (int32_t id = 0; id < cap; id++) {
        if (holders[id] != s->pages.refs[id])
            BAD("page %d has %d holders, its reference count says %d", id, holders[id], s->pages.refs[id]);
        held += holders[id] > 0;
    }
    if (held + s->pages.n_free != cap) BAD("%lld pages held + %d free != %d", (long long)held, s->pages.n_free, cap);
    for (int32_t i = 0; i < s->pages.n_free; i++) {
        int32_t id = s->pages.free_ids[i];
        if (id < 0 || id >= cap || s->pages.refs[id] != 0 || seen[id] == -1) BAD("free list entry %d = %d is held", i, id);
        seen[id] = -1; /* twice in the free list */
    }
    free(holders);
    free(seen);
    return OSCAR_OK;
#undef BAD
}
