/* Slow: fp32 perplexity of tiny-qwen3 over the first 65536 eval tokens
 * (32 windows of 2048, window s scoring tokens [s+1, s+2049)) must equal
 * reference.json's ppl_fp32_first_65536 = 12.198094 within 0.1%. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine.h"
#include "shared_dir.h"


static void progress(void *user, int64_t w, int64_t windows, double nll, int64_t scored)
{
    (void)user;
    fprintf(stderr, "ppl window %lld/%lld: running %.4f\n", (long long)w, (long long)windows,
            exp(nll / (double)scored));
}

Test(engine_ppl, first_65536_eval_tokens_match_reference, .timeout = 1500)
{
    char sh[4096], path[4200];
    if (!rc_shared_dir(sh, sizeof sh)) cr_skip_test("shared folder %s absent", sh);
    snprintf(path, sizeof path, "%s/models/tiny-qwen3", sh);
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(path, &m), OSCAR_OK, "%s", oe_last_error());
    snprintf(path, sizeof path, "%s/data/tiny-qwen3/eval.tokens", sh);
    uint32_t *tok = NULL;
    int64_t n = 0;
    cr_assert_eq(oe_tokens_load(path, oe_model_config(m)->vocab, &tok, &n), OSCAR_OK, "%s", oe_last_error());
    cr_assert(n > 65536);
    const double ref = 12.198094316074592; /* reference.json: ppl_fp32_first_65536 */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    oe_ppl_result r;
    /* 65536 fed tokens + the last window's final target. */
    cr_assert_eq(oe_perplexity(m, tok, 65537, 2048, NULL, progress, NULL, &r), OSCAR_OK, "%s", oe_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("perplexity %.6f (reference %.6f, relative difference %.2e) over %lld windows, %lld scored, %.1f s\n",
           r.ppl, ref, fabs(r.ppl - ref) / ref, (long long)r.windows, (long long)r.scored, secs);
    cr_expect_eq(r.windows, 32);
    cr_expect_eq(r.scored, 65536);
    cr_expect(fabs(r.ppl - ref) / ref < 1e-3, "perplexity %.6f vs reference %.6f", r.ppl, ref);
    free(tok);
    oe_model_free(m);
}
