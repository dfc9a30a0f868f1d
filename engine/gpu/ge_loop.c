/* Request loop of the GPU engine (see ge_sched.h: ge_run_requests): FIFO
 * admission, prefill of the admitted prompts (whole, in chunks when longer
 * than one step or always, or stepwise; a shared prefix once), decode steps over every running sequence, finished
 * sequences leave and free their pages. Plain C: the forward step and the
 * prefix copies are callbacks, so tests drive it with a fake model. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ge_sched.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prompts of the requests this call submitted: request id first + r is
 * prompts[r]; the shared prefix (id first - 1 when there is one) is the
 * first prefix_len tokens of prompts[0]. */
typedef struct req_map {
    int32_t first, prefix_id;
    int prefix_len;
    const int32_t *const *prompts;
    const int32_t *lens;
} req_map;

static const int32_t *prompt_of(const req_map *m, int32_t req, int32_t *len)
{
    if (req == m->prefix_id) {
        *len = m->prefix_len;
        return m->prompts[0];
    }
    *len = m->lens[req - m->first];
    return m->prompts[req - m->first];
}

static oscar_status check_opts(const ge_sched *s, const ge_run_opts *o, int n_req, const int32_t *const *prompts,
                               const int32_t *prompt_lens, int max_new, const int32_t *out)
{
    if (!s || !o || !o->step || n_req <= 0 || !prompts || !prompt_lens || max_new <= 0 || !out || o->vocab <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: NULL argument, %d requests or %d new "
                            "tokens", n_req, max_new);
    if (o->chunk < 0 || o->prefix_len < 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: chunk %d and prefix_len %d must be >= 0",
                            o->chunk, o->prefix_len);
    for (int r = 0; r < n_req; r++)
        if (!prompts[r] || prompt_lens[r] <= 0)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: prompt %d is NULL or has %d tokens", r,
                                prompts[r] ? prompt_lens[r] : 0);
    if (o->prefix_len == 0) return OSCAR_OK;
    if (!o->fork || (o->chunk == 0 && !o->stepwise))
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: a shared prefix needs a fork callback and "
                            "chunked (chunk > 0) or stepwise prefill: the requests' own tokens attend over the cache");
    for (int r = 0; r < n_req; r++) {
        if (prompt_lens[r] <= o->prefix_len)
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: the shared prefix of %d tokens is not "
                                "shorter than prompt %d (%d tokens)", o->prefix_len, r, prompt_lens[r]);
        if (memcmp(prompts[r], prompts[0], (size_t)o->prefix_len * sizeof **prompts))
            return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: prompt %d does not start with the "
                                "shared prefix (the first %d tokens of prompt 0)", r, o->prefix_len);
    }
    return OSCAR_OK;
}

oscar_status ge_run_requests(ge_sched *s, const ge_run_opts *o, int n_req, const int32_t *const *prompts,
                             const int32_t *prompt_lens, int max_new, int32_t *out, float *logits, ge_gen_stats *st)
{
    oscar_status rc = check_opts(s, o, n_req, prompts, prompt_lens, max_new, out);
    if (rc != OSCAR_OK) return rc;
    ge_gen_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    const size_t V = (size_t)o->vocab;
    /* Stepwise prefill is chunked prefill of one token per sequence and step,
     * of every prompt. */
    const int chunk = o->stepwise ? 1 : o->chunk, every = o->stepwise || o->chunk_every_prompt;
    req_map map = {s->n_reqs, -1, o->prefix_len, prompts, prompt_lens};
    if (o->prefix_len > 0) {
        if ((rc = ge_sched_submit(s, o->prefix_len, 0, &map.prefix_id)) != OSCAR_OK) return rc;
        map.first = map.prefix_id + 1;
    }
    for (int r = 0; r < n_req; r++) {
        rc = map.prefix_id >= 0 ? ge_sched_submit_shared(s, map.prefix_id, prompt_lens[r], max_new, NULL)
                                : ge_sched_submit(s, prompt_lens[r], max_new, NULL);
        if (rc != OSCAR_OK) return rc;
    }
    int S = s->num_slots;
    /* Token buffer: the most prompt tokens one prefill step can take (the cap,
     * or all prompts if fewer, or the longest prompt admitted alone), or one
     * token per slot in a decode step. */
    int64_t all_prompts = 0, longest = 0;
    for (int r = 0; r < n_req; r++) {
        all_prompts += prompt_lens[r];
        if (prompt_lens[r] > longest) longest = prompt_lens[r];
    }
    int64_t tok_cap = o->max_prefill_tokens > 0 && o->max_prefill_tokens < all_prompts ? o->max_prefill_tokens
                                                                                         : all_prompts;
    if (longest > tok_cap) tok_cap = longest;
    tok_cap += S;
    int32_t *adm = malloc((size_t)S * 4), *sl = malloc((size_t)S * 4), *nn = malloc((size_t)S * 4),
            *tok = malloc((size_t)tok_cap * 4), *nx = malloc((size_t)S * 4), *ngen = calloc((size_t)n_req, 4);
    float *lg = logits ? malloc((size_t)S * V * 4) : NULL;
    if (!adm || !sl || !nn || !tok || !nx || !ngen || (logits && !lg)) {
        rc = ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    int done_count = 0;
    while (done_count < n_req) {
        int32_t na = 0;
        if ((rc = ge_sched_admit(s, o->max_prefill_tokens, adm, &na)) != OSCAR_OK) goto done;
        double t0 = now_s();
        for (int i = 0; i < na; i++) {
            const ge_slot *q = &s->slots[adm[i]];
            if (q->fork_src >= 0) {
                const int32_t *src_row = s->block_table + (size_t)q->fork_src * s->stride,
                              *dst_row = s->block_table + (size_t)adm[i] * s->stride;
                int32_t sp = q->fork_page >= 0 ? src_row[q->fork_page] : -1,
                        dp = q->fork_page >= 0 ? dst_row[q->fork_page] : -1;
                if ((rc = o->fork(o->user, q->fork_src, adm[i], sp, dp)) != OSCAR_OK) goto done;
            }
        }
        /* Prefill rounds over the admitted sequences still short of their
         * prompt: whole prompts at once, or chunk tokens of each per step. */
        int np = na;
        while (np > 0) {
            int64_t T = 0;
            for (int i = 0; i < np; i++) {
                int32_t len;
                const int32_t *p = prompt_of(&map, s->slots[adm[i]].req, &len);
                int32_t at = s->slots[adm[i]].len, take = len - at;
                /* Chunks for a prompt that does not fit one step, a continuation, or all. */
                if (chunk > 0 && (every || at > 0 || len > o->max_prefill_tokens) && take > chunk) take = chunk;
                nn[i] = take;
                memcpy(tok + T, p + at, (size_t)take * 4);
                T += take;
                st->prefill_tokens += take;
            }
            if ((rc = o->step(o->user, np, adm, nn, tok, nx, lg)) != OSCAR_OK) goto done;
            int keep = 0;
            for (int i = 0; i < np; i++) {
                int32_t len, req = s->slots[adm[i]].req;
                prompt_of(&map, req, &len);
                if (s->slots[adm[i]].len < len) {
                    adm[keep++] = adm[i]; /* more of its prompt next round */
                    continue;
                }
                if (req == map.prefix_id) continue; /* the prefix generates nothing */
                int r = req - map.first;
                out[(size_t)r * max_new] = nx[i];
                if (logits) memcpy(logits + (size_t)r * max_new * V, lg + (size_t)i * V, V * 4);
                ngen[r] = 1;
            }
            np = keep;
        }
        if (na > 0) st->prefill_s += now_s() - t0;
        /* Sequences that are complete leave; their pages go back. The
         * prefix leaves once every request sharing it has been admitted. */
        int n = 0, finished = 0;
        for (int32_t k = 0; k < s->num_slots; k++) {
            if (s->slots[k].state == GE_SLOT_FREE) continue;
            if (s->slots[k].req == map.prefix_id) {
                if (s->head == s->n_reqs) {
                    if ((rc = ge_sched_finish(s, k)) != OSCAR_OK) goto done;
                    finished++;
                }
                continue;
            }
            int r = s->slots[k].req - map.first;
            if (ngen[r] >= max_new) {
                if ((rc = ge_sched_finish(s, k)) != OSCAR_OK) goto done;
                done_count++;
                finished++;
                continue;
            }
            sl[n] = k;
            nn[n] = 1;
            tok[n] = out[(size_t)r * max_new + ngen[r] - 1];
            n++;
        }
        if (n > st->max_running) st->max_running = n;
        if (n == 0 && na == 0 && finished == 0 && done_count < n_req) {
            rc = ge_set_error(OSCAR_ERR_INTERNAL, s->running == 0 ? "ge_run_requests: the next request cannot be "
                              "admitted into an empty cache" : "ge_run_requests: no request can be admitted while "
                              "the shared prefix holds its slot; give the engine more slots or pages");
            goto done;
        }
        if (n == 0) continue; /* admit again */
        double t1 = now_s();
        if ((rc = o->step(o->user, n, sl, nn, tok, nx, lg)) != OSCAR_OK) goto done;
        st->decode_s += now_s() - t1;
        st->decode_tokens += n;
        st->steps++;
        for (int i = 0; i < n; i++) {
            int r = s->slots[sl[i]].req - map.first;
            out[(size_t)r * max_new + ngen[r]] = nx[i];
            if (logits) memcpy(logits + ((size_t)r * max_new + ngen[r]) * V, lg + (size_t)i * V, V * 4);
            ngen[r]++;
        }
    }
    rc = OSCAR_OK;
done:
    free(adm);
    free(sl);
    free(nn);
    free(tok);
    free(nx);
    free(ngen);
    free(lg);
    return rc;
}
