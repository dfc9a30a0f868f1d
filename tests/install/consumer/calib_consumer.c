/* Links oscar::calib only: calibrates one tiny synthetic layer, so the
 * calibration library, its LAPACK and its private link to liboscar load and
 * run from the installed (and moved) prefix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <oscar/oscar.h>

int main(void) {
    enum { L = 1, HQ = 2, HKV = 1, D = 64, N = 512 };
    oscar_calib_options o;
    oscar_calib_options_default(&o, L, HQ, HKV, D);
    o.clip_k = 0.96f, o.clip_v = 0.92f; /* fixed clips: no probes needed */
    oscar_calib *c = NULL;
    float *q = malloc(sizeof(float) * N * HQ * D), *kv = malloc(sizeof(float) * N * HKV * D);
    oscar_params *p = NULL;
    int rc = 1;
    if (!q || !kv || oscar_calib_create(&o, &c)) goto out;
    for (int i = 0; i < N * HQ * D; i++) q[i] = (float)sin(0.37 * i) * (1.0f + (float)(i % D) / 8.0f);
    for (int i = 0; i < N * HKV * D; i++) kv[i] = (float)cos(0.11 * i) * (1.0f + (float)((i * 7) % D) / 16.0f);
    for (int pass = 0; pass < 2; pass++)
        if (oscar_calib_begin_pass(c, pass) || oscar_calib_feed(c, 0, N, q, kv, kv, OSCAR_DTYPE_F32)) goto out;
    if (oscar_calib_finalize(c, &p)) goto out;
    double err = 1;
    if (oscar_params_orthogonality_error(p, 0, 0, OSCAR_K, &err) || !(err < 1e-5)) goto out;
    printf("calibrated: |R R^T - I| %.1e\n", err);
    rc = 0;
out:
    if (rc) fprintf(stderr, "calib_consumer: %s\n", oscar_last_error());
    oscar_params_destroy(p);
    oscar_calib_destroy(c);
    free(q);
    free(kv);
    return rc;
}
