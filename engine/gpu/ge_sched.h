/* Host-side bookkeeping of the GPU engine's paged KV cache: KV sizing for a
 * memory budget, the page allocator (free list) and the FIFO request
 * scheduler that owns window slots and block tables. Plain C, no CUDA, so
 * it is tested on the CPU (tests/test_e2e_sched.c).
 *
 * One page id names the same page in every layer's pool (each layer has its
 * own pool of num_pages pages), so one allocator and one block table serve
 * all layers. The window slot of a running sequence is also its row in the
 * host block table.
 *
 * Shared prefixes: pages are reference-counted. A request submitted with
 * ge_sched_submit_shared names a prefix request (a prompt of its own, no
 * generated tokens) whose cache it starts from: at admission its block
 * table takes the prefix's full pages (those no later append of the request
 * writes: ge_shared_pages) by reference, and the engine copies the prefix's
 * window slot and its last, partly written page, if any, into the request's
 * own (ge_slot.fork_src / fork_page). The pages stay until their last
 * holder finishes. */
#ifndef OSCAR_GE_SCHED_H
#define OSCAR_GE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "oscar/oscar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Message of the last failing ge_* call in this thread ("" if none). */
const char *ge_last_error(void);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
oscar_status ge_set_error(oscar_status s, const char *fmt, ...);

/* ----------------------------------------------------------------- sizing */
/* Every layer's pool holds the same page ids (one block table), so a page id
 * costs one page in every layer. Layers may differ in page size: a parameter
 * file with 3-bit head-tensors (oscar-calibrate --wide-bits) is served with
 * per-layer pages (layout.wide_per_layer 1, docs/FORMAT.md §3.3), layer l's
 * page the 2-bit page plus its own 1-bit planes. The sizing functions take
 * layer_page_bytes [num_layers], each layer's page size (oscar_plan_layer_sizes
 * or ge_kv_wide_layout), or NULL: every layer the layout's page size
 * (oscar_layout_sizes_get), num_layers x one page as before per-layer pages. */
typedef struct ge_kv_plan {
    int32_t num_pages;        /* pages per layer pool (the same in every layer) */
    int32_t num_slots;        /* window slots per layer (0 for BF16: no windows) */
    size_t page_bytes, window_slot_bytes; /* page_bytes: the layout's (largest) page */
    size_t pool_bytes_per_layer;   /* num_pages * page_bytes (the largest layer's pool; layer l's is
                                      num_pages * its own page size) */
    size_t window_bytes_per_layer; /* num_slots * window_slot_bytes */
    size_t total_bytes;            /* all layers, <= the budget */
    size_t page_bytes_all_layers;  /* one page id in every layer: the sum of the layers' page sizes */
    size_t pool_bytes;             /* all layers' pools: num_pages * page_bytes_all_layers */
} ge_kv_plan;

/* KV bytes (all layers) of one sequence of len tokens: its pages plus its
 * window slot. */
oscar_status ge_kv_seq_bytes(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, int64_t len,
                             size_t *bytes);
/* Asymptotic KV bytes per token (all layers, paged part only). */
oscar_status ge_kv_bytes_per_token(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes,
                                   double *bytes);
/* Pools for a budget with max_slots window slots: the rest of the budget
 * goes to pages, num_pages = rest / page_bytes_all_layers. Refused when the
 * slots alone exceed the budget. */
oscar_status ge_kv_plan_for(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, size_t budget,
                            int max_slots, ge_kv_plan *out);
/* Largest batch of sequences of len tokens whose pages and window slots fit
 * the budget (0 when not even one fits), with the plan for that batch. */
oscar_status ge_max_batch(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes, size_t budget,
                          int64_t len, int *batch, ge_kv_plan *plan);
/* Average stored bits per K/V element of a sequence of len tokens over the
 * layers (windows, codes, metadata and each layer's 1-bit planes):
 * oscar_layout_bits_per_element of each layer's page, averaged. */
oscar_status ge_kv_bits_per_element(const oscar_layout_desc *l, int num_layers, const size_t *layer_page_bytes,
                                    int64_t len, double *bits);
/* What parameters p (may be NULL: built-in) ask of layout l: when l's method
 * is oscar2 and p has 3-bit head-tensors (oscar_params_code_bits), l gets
 * wide_tensors = the most of any layer and wide_per_layer = 1; otherwise l is
 * left as it is (oscar_plan_create refuses 3-bit parameters for another
 * method, and on a backend that cannot store them, with its message).
 * layer_page_bytes [num_layers] (may be NULL) gets each layer's page size
 * as oscar_plan_layer_sizes reports it: the 2-bit page plus that layer's
 * planes (l's page size everywhere without them); *max_wide (may be NULL)
 * the most 3-bit head-tensors of a layer (0: none). p must have num_layers
 * layers and l's KV heads (OSCAR_ERR_SHAPE_MISMATCH). */
oscar_status ge_kv_wide_layout(const oscar_params *p, int num_layers, oscar_layout_desc *l, size_t *layer_page_bytes,
                               int *max_wide);

/* ---------------------------------------------------------- page allocator */
typedef struct ge_pages {
    int32_t *free_ids; /* stack of free page ids */
    int32_t n_free;
    int32_t capacity;
    int32_t *refs;     /* [capacity] holders of each page (0: free); catches double frees */
} ge_pages;

oscar_status ge_pages_init(ge_pages *a, int32_t capacity);
void ge_pages_release(ge_pages *a);
/* All or nothing: n ids into out (one reference each), or
 * OSCAR_ERR_OUT_OF_MEMORY and nothing taken. */
oscar_status ge_pages_alloc(ge_pages *a, int32_t n, int32_t *out);
/* One more holder for each of n pages in use (a shared prefix); all or
 * nothing: ids out of range, free or listed twice are refused. */
oscar_status ge_pages_ref(ge_pages *a, int32_t n, const int32_t *ids);
/* Drops one reference to each page; a page whose last holder lets go goes
 * back to the free list. Refuses ids out of range, free or listed twice
 * (nothing dropped then). */
oscar_status ge_pages_free(ge_pages *a, int32_t n, const int32_t *ids);
/* Pages of a sequence of len tokens that no later append to it writes (full
 * pages of the 2-bit history, or of the 16-bit pages of the BF16 method):
 * what a request continuing from a prefix of len tokens can share. */
int32_t ge_shared_pages(const oscar_layout_desc *l, int64_t len);

/* -------------------------------------------------------------- scheduler */
typedef enum ge_seq_state { GE_SLOT_FREE = 0, GE_SEQ_PREFILL = 1, GE_SEQ_DECODE = 2 } ge_seq_state;

typedef struct ge_request {
    int32_t prompt_len, max_new;
    int32_t slot;   /* -1 until admitted */
    int32_t done;
    int32_t prefix; /* request whose cache this one starts from (its first prefix_len
                       prompt tokens), or -1 */
} ge_request;

typedef struct ge_slot {
    ge_seq_state state;
    int32_t req;      /* request id */
    int32_t len;      /* tokens in the cache (a shared request starts at its prefix's length) */
    int32_t target;   /* prompt_len + max_new: the length reserved */
    int32_t n_pages;  /* pages held (reserved at admission for target), shared ones included */
    int32_t n_shared; /* the first n_shared of them are the prefix's, held by reference */
    int32_t fork_src; /* set at admission of a shared request: the prefix's slot, whose
                         window slot the engine copies into this one; -1 otherwise */
    int32_t fork_page;/* index in the block table of the prefix's partly written last page,
                         which the engine copies into this slot's page of that index; -1: none */
} ge_slot;

typedef struct ge_sched {
    oscar_layout_desc layout;
    int32_t num_slots, stride; /* stride: block table columns = pages for max_seq_len */
    ge_pages pages;
    int32_t *block_table;      /* [num_slots][stride], -1 where unused */
    ge_slot *slots;
    ge_request *reqs;
    int32_t n_reqs, cap_reqs, head; /* FIFO: requests head.. not yet admitted */
    int32_t running;
} ge_sched;

/* num_pages: pages per layer pool; num_slots: window slots = most running sequences. */
oscar_status ge_sched_init(ge_sched *s, const oscar_layout_desc *l, int32_t num_pages, int32_t num_slots);
void ge_sched_release(ge_sched *s);
/* Queues a request; refuses one that could never run (longer than
 * max_seq_len or needing more pages than the pool holds). *id may be NULL. */
oscar_status ge_sched_submit(ge_sched *s, int32_t prompt_len, int32_t max_new, int32_t *id);
/* Queues a request whose first tokens are the whole prompt of request
 * prefix (submitted before, with max_new 0): prompt_len counts them too and
 * must exceed them (the request needs a token of its own). Refused like
 * ge_sched_submit, and when prefix is not such a request. */
oscar_status ge_sched_submit_shared(ge_sched *s, int32_t prefix, int32_t prompt_len, int32_t max_new, int32_t *id);
/* Admits queued requests in FIFO order while the head fits: a free slot,
 * its pages (reserved for prompt + max_new, so a running sequence never
 * waits for a page; a shared request takes its prefix's full pages by
 * reference and needs only the rest), and at most max_tokens prompt tokens
 * in total (a shared request counts only its own; the head is always
 * admitted when nothing else was, if it fits). A shared request also waits
 * until its prefix is in the cache (running, prompt complete); a prefix
 * that already finished is an error (OSCAR_ERR_INVALID_ARGUMENT). Stops at
 * the first that does not fit (no overtaking). Writes admitted slots to
 * out_slots (capacity num_slots) and their count to *n; each shared one
 * has fork_src / fork_page set for the engine's copies. */
oscar_status ge_sched_admit(ge_sched *s, int32_t max_tokens, int32_t *out_slots, int32_t *n);
/* The sequence in slot gained n tokens in the cache. */
oscar_status ge_sched_advance(ge_sched *s, int32_t slot, int32_t n);
/* The sequence in slot is done: pages back to the free list, slot free. */
oscar_status ge_sched_finish(ge_sched *s, int32_t slot);
/* Fills the oscar_batch host arrays for the sequences in slots[0..n) after
 * each gains new_tokens[i] tokens: seq_lens (after), window_slots, the
 * compacted block table [n][stride] and cu_new [n+1]; *max_len gets the
 * longest. Nothing in the scheduler changes. */
oscar_status ge_sched_batch(const ge_sched *s, int32_t n, const int32_t *slots, const int32_t *new_tokens,
                            int32_t *seq_lens, int32_t *window_slots, int32_t *block_table, int32_t *cu_new,
                            int32_t *max_len);
/* Consistency check: every page either free or held by as many running
 * slots as its reference count says (one, unless shared), no page twice in
 * a row, shared pages equal to the prefix's where it still runs, counts
 * agree, block table rows match n_pages. OSCAR_OK or OSCAR_ERR_INTERNAL
 * with the problem written to msg. */
oscar_status ge_sched_check(const ge_sched *s, char *msg, size_t msg_len);

/* ------------------------------------------------------------ request loop */
typedef struct ge_gen_stats {
    double prefill_s, decode_s;
    int64_t prefill_tokens, decode_tokens, steps;
    int max_running;
} ge_gen_stats;

/* One forward step (ge_step's contract): sequences slots[0..n) bring n_new[i]
 * tokens (concatenated in tokens); next[i] gets the greedy token, logits
 * ([n][vocab], may be NULL) the last rows' logits; advances the scheduler. */
typedef oscar_status (*ge_step_fn)(void *user, int n, const int32_t *slots, const int32_t *n_new,
                                   const int32_t *tokens, int32_t *next, float *logits);
/* A shared request was admitted into dst_slot (ge_sched_admit): copy the
 * prefix's window slot src_slot into dst_slot's and, when src_page >= 0, the
 * prefix's partly written page src_page into dst_page (every layer). */
typedef oscar_status (*ge_fork_fn)(void *user, int32_t src_slot, int32_t dst_slot, int32_t src_page,
                                   int32_t dst_page);

typedef struct ge_run_opts {
    ge_step_fn step;
    ge_fork_fn fork;        /* needed with prefix_len > 0 */
    void *user;             /* passed to step and fork */
    int vocab;
    int max_prefill_tokens; /* most prompt tokens admitted for one prefill round */
    int stepwise;           /* 1: prompts go through decode steps, one token per step */
    int chunk;              /* > 0: a prompt longer than max_prefill_tokens, and a shared
                               request's own tokens, go at most chunk tokens per prefill step
                               (the engine attends them over the cache with oscar_extend);
                               0: whole prompts in one step */
    int chunk_every_prompt; /* with chunk > 0: every prompt in chunks, also those that fit one step */
    int prefix_len;         /* > 0: every prompt starts with the same prefix_len tokens (checked),
                               prefilled once as a request of its own and shared by reference
                               (ge_sched_submit_shared); needs chunk > 0 or stepwise */
} ge_run_opts;

/* Greedy generation of n_req prompts: submitted to s in order, admitted FIFO
 * (at most max_prefill_tokens prompt tokens per prefill round), prefilled
 * (whole prompts in one step, in chunks, or stepwise: one token per step;
 * a shared prefix first, once), then decoded together one token per step; a
 * sequence leaves after max_new tokens and its slot and pages go to the
 * next request, so the batch stays full. A shared prefix's slot is given
 * back once every request using it has been admitted.
 * out [n_req][max_new]; logits (may be NULL) [n_req][max_new][vocab]. */
oscar_status ge_run_requests(ge_sched *s, const ge_run_opts *o, int n_req, const int32_t *const *prompts,
                             const int32_t *prompt_lens, int max_new, int32_t *out, float *logits,
                             ge_gen_stats *st);

#ifdef __cplusplus
}
#endif
#endif
