/* Writes the seed corpus for fuzz_params_load: a few small valid parameter
 * files (valid_*) and mutations of them (bad_*). Usage: oscar-fuzz-corpus DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar_ref.h"
#include "oscar_internal.h"

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void dump(const char *dir, const char *name, const unsigned char *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void save(oscar_params *p, const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (oscar_params_save(p, path) != OSCAR_OK) {
        fprintf(stderr, "%s\n", oscar_last_error());
        exit(1);
    }
    oscar_params_destroy(p);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    oscar_params *p;
    /* valid_int2: 1 layer, 1/1 heads, d 64, identity, no eigenvalues. */
    if (oscar_params_create_builtin(OSCAR_METHOD_INT2, 1, 1, 1, 64, &p)) return 1;
    save(p, dir, "valid_int2");
    /* valid_quarot: Hadamard rotations with eigenvalues and fitted-looking clips. */
    if (oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 1, 4, 2, 64, &p)) return 1;
    p->eig = calloc(2 * 64, sizeof(double));
    for (int i = 0; i < 2 * 64; i++) p->eig[i] = 64.0 - (i % 64);
    p->clip[0] = 0.97f;
    p->clip[1] = 0.9f;
    p->calib_tokens = 2048;
    snprintf(p->model_hash, sizeof p->model_hash, "seed");
    save(p, dir, "valid_quarot");
    /* valid_perhead: 2 layers, per-head rotations (2 KV heads), OSCAR2 defaults. */
    if (oscar_params_alloc(2, 4, 2, 64, 1, &p)) return 1;
    p->method = OSCAR_METHOD_OSCAR2;
    for (int i = 0; i < 8; i++) p->clip[i] = 0.96f; /* [2 layers][2 KV heads][K, V] */
    save(p, dir, "valid_perhead");
    /* valid_feedback: 1 layer, d 64, error-feedback weights (format_version 2). */
    if (oscar_params_alloc(1, 2, 1, 64, 0, &p)) return 1;
    p->method = OSCAR_METHOD_OSCAR2;
    p->fb = calloc(2 * 64 * 64, sizeof(float));
    if (!p->fb) return 1;
    for (int m = 0; m < 2; m++)
        for (int j = 0; j < 64; j++)
            for (int k = j + 1; k < 64; k++) p->fb[(m * 64 + j) * 64 + k] = 0.01f * (float)((j * 7 + k * 3) % 21 - 10);
    save(p, dir, "valid_feedback");
    /* valid_wide: 2 layers, 2 KV heads, one 3-bit head-tensor (code_bits, format_version 4). */
    if (oscar_params_alloc(2, 4, 2, 64, 1, &p)) return 1;
    p->method = OSCAR_METHOD_OSCAR2;
    for (int i = 0; i < 8; i++) p->clip[i] = 0.96f;
    if (oscar_params_set_code_bits(p, 1, 0, OSCAR_K, 3)) return 1;
    save(p, dir, "valid_wide");

    /* Mutations of valid_quarot. */
    char src[1024];
    snprintf(src, sizeof src, "%s/valid_quarot", dir);
    size_t n;
    unsigned char *b = slurp(src, &n);
    if (!b) return 1;
    uint64_t hl;
    memcpy(&hl, b, 8);
    dump(dir, "bad_truncated_header", b, 8 + (size_t)hl / 2);
    dump(dir, "bad_truncated_data", b, n - 5);
    unsigned char *m = malloc(n);
    memcpy(m, b, n);
    uint64_t big = (16u << 20) + 8;
    memcpy(m, &big, 8);
    dump(dir, "bad_header_len", m, n);
    memcpy(m, b, n);
    float nanv = NAN;
    memcpy(m + n - 4, &nanv, 4); /* last clip */
    dump(dir, "bad_clip_nan", m, n);
    memcpy(m, b, n);
    memcpy(m + 8 + hl + 4, &nanv, 4); /* in the first rotation */
    dump(dir, "bad_rot_nan", m, n);
    memcpy(m, b, n);
    char *v = memchr(m + 8, '1', (size_t)hl); /* first digit '1' in the header: usually format_version */
    if (v) *v = '9';
    dump(dir, "bad_digit", m, n);
    free(m);
    free(b);

    /* Mutations of valid_feedback: a weight on the diagonal, one too large. */
    snprintf(src, sizeof src, "%s/valid_feedback", dir);
    b = slurp(src, &n);
    if (!b) return 1;
    memcpy(&hl, b, 8);
    m = malloc(n);
    memcpy(m, b, n);
    /* Tensor data order per layer: rot_k, rot_v, fb_k, fb_v (no eigenvalues), then clip. */
    size_t fb_k = 8 + (size_t)hl + 2 * 64 * 64 * 4;
    float one = 1.0f, huge = 1e6f;
    memcpy(m + fb_k + (5 * 64 + 5) * 4, &one, 4);
    dump(dir, "bad_fb_diagonal", m, n);
    memcpy(m, b, n);
    memcpy(m + fb_k + (5 * 64 + 9) * 4, &huge, 4);
    dump(dir, "bad_fb_large", m, n);
    free(m);
    free(b);
    return 0;
}
