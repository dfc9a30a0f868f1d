/* Request loop of the GPU engine (see ge_sched.h: ge_run_requests): FIFO
 * admission, prefill of the admitted prompts, decode steps over every running
 * sequence, finished sequences leave and free their pages. Plain C: the
 * forward step is a callback, so tests drive it with a fake model. */
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

oscar_status ge_run_requests(ge_sched *s, ge_step_fn step, void *user, int vocab, int max_prefill_tokens,
                             int n_req, const int32_t *const *prompts, const int32_t *prompt_lens, int max_new,
                             int stepwise, int32_t *out, float *logits, ge_gen_stats *st)
{
    if (!s || !step || n_req <= 0 || !prompts || !prompt_lens || max_new <= 0 || !out || vocab <= 0)
        return ge_set_error(OSCAR_ERR_INVALID_ARGUMENT, "ge_run_requests: NULL argument, %d requests or %d new "
                            "tokens", n_req, max_new);
    ge_gen_stats local;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    const size_t V = (size_t)vocab;
    int32_t first = s->n_reqs;
    for (int r = 0; r < n_req; r++) {
        oscar_status q = ge_sched_submit(s, prompt_lens[r], max_new, NULL);
        if (q != OSCAR_OK) return q;
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
    int64_t tok_cap = max_prefill_tokens > 0 && max_prefill_tokens < all_prompts ? max_prefill_tokens : all_prompts;
    if (longest > tok_cap) tok_cap = longest;
    tok_cap += S;
    int32_t *adm = malloc((size_t)S * 4), *sl = malloc((size_t)S * 4), *nn = malloc((size_t)S * 4),
            *tok = malloc((size_t)tok_cap * 4), *nx = malloc((size_t)S * 4),
            *ngen = calloc((size_t)n_req, 4);
    float *lg = logits ? malloc((size_t)S * V * 4) : NULL;
    oscar_status rc = OSCAR_OK;
    if (!adm || !sl || !nn || !tok || !nx || !ngen || (logits && !lg)) {
        rc = ge_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    int done_count = 0;
    while (done_count < n_req) {
        int32_t na = 0;
        if ((rc = ge_sched_admit(s, max_prefill_tokens, adm, &na)) != OSCAR_OK) goto done;
        if (na > 0) {
            double t0 = now_s();
            if (stepwise) {
                for (int i = 0; i < na; i++) {
                    int r = s->slots[adm[i]].req - first;
                    for (int j = 0; j < prompt_lens[r]; j++) {
                        int32_t one = 1;
                        rc = step(user, 1, &adm[i], &one, &prompts[r][j], nx, lg);
                        if (rc != OSCAR_OK) goto done;
                    }
                    out[(size_t)r * max_new] = nx[0];
                    if (logits) memcpy(logits + (size_t)r * max_new * V, lg, V * 4);
                    ngen[r] = 1;
                }
            } else {
                int64_t T = 0;
                for (int i = 0; i < na; i++) {
                    int r = s->slots[adm[i]].req - first;
                    nn[i] = prompt_lens[r];
                    memcpy(tok + T, prompts[r], (size_t)nn[i] * 4);
                    T += nn[i];
                }
                if ((rc = step(user, na, adm, nn, tok, nx, lg)) != OSCAR_OK) goto done;
                for (int i = 0; i < na; i++) {
                    int r = s->slots[adm[i]].req - first;
                    out[(size_t)r * max_new] = nx[i];
                    if (logits) memcpy(logits + (size_t)r * max_new * V, lg + (size_t)i * V, V * 4);
                    ngen[r] = 1;
                }
            }
            for (int i = 0; i < na; i++) st->prefill_tokens += prompt_lens[s->slots[adm[i]].req - first];
            st->prefill_s += now_s() - t0;
        }
        /* Sequences that are complete leave; their pages go back. */
        int n = 0, finished = 0;
        for (int32_t k = 0; k < s->num_slots; k++) {
            if (s->slots[k].state == GE_SLOT_FREE) continue;
            int r = s->slots[k].req - first;
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
        if (n == 0 && na == 0 && finished == 0 && s->running == 0 && done_count < n_req) {
            rc = ge_set_error(OSCAR_ERR_INTERNAL, "ge_run_requests: the next request cannot be admitted into an empty cache");
            goto done;
        }
        if (n == 0) continue; /* admit again */
        double t0 = now_s();
        if ((rc = step(user, n, sl, nn, tok, nx, lg)) != OSCAR_OK) goto done;
        st->decode_s += now_s() - t0;
        st->decode_tokens += n;
        st->steps++;
        for (int i = 0; i < n; i++) {
            int r = s->slots[sl[i]].req - first;
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
