/* Parameter object and parameter file: built-ins, accessors, bit-exact
 * round trip, and every class of hostile file refused with the right code. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "oscar_ref.h"
#include "oscar_internal.h"

static uint64_t g_seed;
static uint64_t rnd(void) {
    g_seed ^= g_seed << 13;
    g_seed ^= g_seed >> 7;
    g_seed ^= g_seed << 17;
    return g_seed;
}
static double urand(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static void seed_init(void) { g_seed = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() ^ 0x9e37ull; }

static char g_dir[256], g_path_concurrent[512];
static void mk_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/oscar_test_params_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}
static void rm_dir(void) {
    DIR *dp = opendir(g_dir);
    if (!dp) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
            unlink(path);
        }
    closedir(dp);
    rmdir(g_dir);
}

/* Random orthogonal d x d (Gram-Schmidt in fp64, stored fp32). */
static void random_orthogonal(int d, float *R) {
    double *A = malloc(sizeof(double) * (size_t)d * (size_t)d);
    for (int i = 0; i < d * d; i++) A[i] = urand() - 0.5;
    for (int i = 0; i < d; i++) {
        for (int j = 0; j < i; j++) {
            double s = 0;
            for (int k = 0; k < d; k++) s += A[i * d + k] * A[j * d + k];
            for (int k = 0; k < d; k++) A[i * d + k] -= s * A[j * d + k];
        }
        double n = 0;
        for (int k = 0; k < d; k++) n += A[i * d + k] * A[i * d + k];
        n = sqrt(n);
        for (int k = 0; k < d; k++) A[i * d + k] /= n;
    }
    for (int i = 0; i < d * d; i++) R[i] = (float)A[i];
    free(A);
}

static oscar_params *random_params(int L, int hq, int hkv, int d, int per_head, int with_eig) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_alloc(L, hq, hkv, d, per_head, &p), OSCAR_OK, "%s", oscar_last_error());
    p->method = OSCAR_METHOD_OSCAR2;
    p->identity = 0;
    p->calib_tokens = 1234;
    snprintf(p->model_hash, sizeof p->model_hash, "hash-%llu", (unsigned long long)(rnd() % 100000));
    snprintf(p->composition, sizeof p->composition, "U.H.P");
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int r = 0; r < p->num_rot; r++) random_orthogonal(d, oscar_params_rot_ptr(p, l, kv, r));
    if (with_eig) {
        p->eig = malloc(sizeof(double) * (size_t)L * 2 * (size_t)p->num_rot * (size_t)d);
        for (size_t i = 0; i < (size_t)L * 2 * (size_t)p->num_rot * (size_t)d; i++) p->eig[i] = urand() * 10;
    }
    for (int l = 0; l < L; l++) /* one ratio per layer (the clip tensor of format versions 1-2) */
        for (int kv = 0; kv < 2; kv++) cr_assert_eq(oscar_params_set_clip(p, l, (oscar_kv)kv, (float)(0.5 + 0.5 * urand())), OSCAR_OK);
    return p;
}

static uint8_t *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return b;
}

static void write_file(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

TestSuite(params, .init = seed_init);

Test(params, builtin_methods) {
    const int d = 64;
    for (int m = 0; m < OSCAR_METHOD_COUNT_; m++) {
        oscar_params *p = NULL;
        cr_assert_eq(oscar_params_create_builtin((oscar_method)m, 3, 8, 2, d, &p), OSCAR_OK, "%s", oscar_last_error());
        oscar_params_info info;
        cr_assert_eq(oscar_params_get_info(p, &info), OSCAR_OK);
        cr_assert_eq(info.num_layers, 3);
        cr_assert_eq(info.head_dim, d);
        cr_assert_eq((int)info.method, m);
        cr_assert_eq(info.per_head, 0);
        for (int l = 0; l < 3; l++)
            for (int kv = 0; kv < 2; kv++) {
                const float *R;
                cr_assert_eq(oscar_params_rotation(p, l, 0, (oscar_kv)kv, &R), OSCAR_OK);
                for (int i = 0; i < d; i++)
                    for (int j = 0; j < d; j++) {
                        float want = (i == j) ? 1.0f : 0.0f;
                        if (m == OSCAR_METHOD_QUAROT2)
                            want = (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0f : 1.0f) / sqrtf((float)d);
                        cr_assert_float_eq(R[i * d + j], want, 1e-6, "method %d l %d (%d,%d)", m, l, i, j);
                    }
                const double *ev = (const double *)1;
                cr_assert_eq(oscar_params_eigenvalues(p, l, 0, (oscar_kv)kv, &ev), OSCAR_OK);
                cr_assert_null(ev);
                float c;
                cr_assert_eq(oscar_params_clip(p, l, (oscar_kv)kv, &c), OSCAR_OK);
                float want = 1.0f;
                if (m == OSCAR_METHOD_OSCAR2 || m == OSCAR_METHOD_OSCAR2_LM) want = kv ? 0.92f : 0.96f;
                cr_assert_eq(c, want);
            }
        cr_assert_str_eq(p->composition, m == OSCAR_METHOD_QUAROT2 ? "H" : "I");
        cr_assert_eq(p->identity, m != OSCAR_METHOD_QUAROT2);
        oscar_params_destroy(p);
    }
    oscar_params_destroy(NULL);
}

Test(params, builtin_bad_shapes) {
    oscar_params *p = (oscar_params *)1;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 2, 8, 2, 100, &p), OSCAR_ERR_UNSUPPORTED_HEAD_DIM);
    cr_assert_null(p);
    cr_assert(strstr(oscar_last_error(), "100") != NULL);
    cr_assert(strstr(oscar_last_error(), "multiple of 16") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 2, 8, 3, 128, &p), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 0, 8, 2, 128, &p), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 2, -8, 2, 128, &p), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_COUNT_, 2, 8, 2, 128, &p), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 2, 8, 2, 128, NULL), OSCAR_ERR_INVALID_ARGUMENT);
}

Test(params, accessors_and_clip) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 4, 8, 2, 128, &p), OSCAR_OK);
    const float *R;
    cr_assert_eq(oscar_params_rotation(p, 4, 0, OSCAR_K, &R), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_rotation(p, -1, 0, OSCAR_K, &R), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_rotation(p, 0, 0, (oscar_kv)2, &R), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_rotation(p, 0, 7, OSCAR_K, &R), OSCAR_OK); /* kv_head ignored unless per_head */
    float bad[] = {0.0f, -0.1f, 1.0001f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(oscar_params_set_clip(p, 1, OSCAR_V, bad[i]), OSCAR_ERR_INVALID_ARGUMENT, "clip %g", (double)bad[i]);
        cr_assert(strstr(oscar_last_error(), "(0, 1]") != NULL);
    }
    float c = (float)(0.01 + 0.99 * urand()), got;
    cr_assert_eq(oscar_params_set_clip(p, 3, OSCAR_V, c), OSCAR_OK);
    cr_assert_eq(oscar_params_clip(p, 3, OSCAR_V, &got), OSCAR_OK);
    cr_assert_eq(got, c, "seed %llu", (unsigned long long)g_seed);
    cr_assert_eq(oscar_params_clip(p, 3, OSCAR_K, &got), OSCAR_OK);
    cr_assert_eq(got, 0.96f);
    cr_assert_eq(oscar_params_set_clip(p, 1, OSCAR_V, 1.0f), OSCAR_OK);
    oscar_params_destroy(p);

    oscar_params *ph = random_params(2, 8, 4, 64, 1, 1);
    cr_assert_eq(oscar_params_rotation(ph, 0, 4, OSCAR_K, &R), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_rotation(ph, 1, 3, OSCAR_V, &R), OSCAR_OK);
    cr_assert_eq(R, oscar_params_rot_ptr(ph, 1, 1, 3));
    oscar_params_destroy(ph);
}

Test(params, check_shape) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 8, 8, 2, 128, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_check_shape(p, 8, 8, 2, 128, NULL), OSCAR_OK);
    cr_assert_eq(oscar_params_check_shape(p, 8, 8, 2, 128, "anything"), OSCAR_OK); /* built-in: no hash */
    cr_assert_eq(oscar_params_check_shape(p, 36, 32, 8, 128, NULL), OSCAR_ERR_SHAPE_MISMATCH);
    const char *m = oscar_last_error();
    cr_assert(strstr(m, "8 layers") && strstr(m, "36 layers") && strstr(m, "32 query heads") &&
                  strstr(m, "recalibrate with oscar-calibrate for this model"),
              "message: %s", m);
    cr_assert_eq(oscar_params_check_shape(p, 8, 8, 2, 64, NULL), OSCAR_ERR_SHAPE_MISMATCH);
    snprintf(p->model_hash, sizeof p->model_hash, "abc");
    cr_assert_eq(oscar_params_check_shape(p, 8, 8, 2, 128, "abc"), OSCAR_OK);
    cr_assert_eq(oscar_params_check_shape(p, 8, 8, 2, 128, "abd"), OSCAR_ERR_SHAPE_MISMATCH);
    cr_assert(strstr(oscar_last_error(), "abd") != NULL);
    oscar_params_destroy(p);
}

static void assert_same(const oscar_params *a, const oscar_params *b) {
    cr_assert_eq(a->num_layers, b->num_layers);
    cr_assert_eq(a->num_q_heads, b->num_q_heads);
    cr_assert_eq(a->num_kv_heads, b->num_kv_heads);
    cr_assert_eq(a->head_dim, b->head_dim);
    cr_assert_eq(a->per_head, b->per_head);
    cr_assert_eq(a->num_rot, b->num_rot);
    cr_assert_eq(a->method, b->method);
    cr_assert_eq(a->identity, b->identity);
    cr_assert_eq(a->calib_tokens, b->calib_tokens);
    cr_assert_eq(a->group, b->group);
    cr_assert_str_eq(a->model_hash, b->model_hash);
    cr_assert_str_eq(a->composition, b->composition);
    size_t d = (size_t)a->head_dim, nr = (size_t)a->num_layers * 2 * (size_t)a->num_rot;
    cr_assert_eq(memcmp(a->rot, b->rot, nr * d * d * sizeof(float)), 0, "rotations differ (seed %llu)",
                 (unsigned long long)g_seed);
    cr_assert_eq(memcmp(a->clip, b->clip, (size_t)a->num_layers * (size_t)a->num_kv_heads * 2 * sizeof(float)), 0);
    cr_assert_eq(a->eig == NULL, b->eig == NULL);
    if (a->eig) cr_assert_eq(memcmp(a->eig, b->eig, nr * d * sizeof(double)), 0);
}

Test(params, round_trip_bit_exact, .init = mk_dir, .fini = rm_dir) {
    seed_init();
    const int shapes[][5] = {{1, 1, 1, 64, 0}, {3, 8, 2, 128, 0}, {2, 8, 4, 64, 1}, {1, 4, 2, 256, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int with_eig = 0; with_eig < 2; with_eig++) {
            oscar_params *p = random_params(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                                            with_eig);
            char path[400], tmp[420];
            snprintf(path, sizeof path, "%s/p%zu_%d.safetensors", g_dir, s, with_eig);
            snprintf(tmp, sizeof tmp, "%s.tmp", path);
            cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
            cr_assert_eq(access(tmp, F_OK), -1, "atomic save left %s behind", tmp);
            oscar_params *q = NULL;
            cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s (seed %llu)", oscar_last_error(),
                         (unsigned long long)g_seed);
            assert_same(p, q);
            /* Saving the loaded copy reproduces the file byte for byte. */
            char path2[420];
            snprintf(path2, sizeof path2, "%s.again", path);
            cr_assert_eq(oscar_params_save(q, path2), OSCAR_OK);
            size_t n1, n2;
            uint8_t *b1 = read_file(path, &n1), *b2 = read_file(path2, &n2);
            cr_assert_eq(n1, n2);
            cr_assert_eq(memcmp(b1, b2, n1), 0);
            /* Header padded to 8 bytes: tensor data aligned. */
            uint64_t hn;
            memcpy(&hn, b1, 8);
            cr_assert_eq(hn % 8, 0);
            free(b1);
            free(b2);
            oscar_params_destroy(p);
            oscar_params_destroy(q);
        }
    /* Built-ins round trip too (no eigenvalues, identity flag recovered). */
    for (int m = 0; m < OSCAR_METHOD_COUNT_; m++) {
        oscar_params *p = NULL, *q = NULL;
        cr_assert_eq(oscar_params_create_builtin((oscar_method)m, 2, 4, 2, 64, &p), OSCAR_OK);
        char path[400];
        snprintf(path, sizeof path, "%s/builtin%d.safetensors", g_dir, m);
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK);
        cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
        assert_same(p, q);
        oscar_params_destroy(p);
        oscar_params_destroy(q);
    }
}

Test(params, save_errors, .init = mk_dir, .fini = rm_dir) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 1, 1, 1, 64, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_save(p, "/nonexistent-dir/x/p.safetensors"), OSCAR_ERR_IO);
    cr_assert(strstr(oscar_last_error(), "/nonexistent-dir/x/p.safetensors") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_save(NULL, "x"), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_save(p, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_params_destroy(p);
    oscar_params *q = (oscar_params *)1;
    char path[400];
    snprintf(path, sizeof path, "%s/missing.safetensors", g_dir);
    cr_assert_eq(oscar_params_load(path, &q), OSCAR_ERR_IO);
    cr_assert_null(q);
    cr_assert_eq(oscar_params_load(g_dir, &q), OSCAR_ERR_IO); /* a folder */
}

/* A save renames its temporary over the path: over a FIFO, a device (here a
 * link to /dev/null, as `--out /dev/null` or /dev/stdout would be) or a folder
 * that replaced the node with a regular file and returned OK (as root, in
 * /dev itself). Refused with OSCAR_ERR_IO naming it, the node left as it was. */
Test(params, save_refuses_paths_that_are_not_regular_files, .init = mk_dir, .fini = rm_dir) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 1, 1, 1, 64, &p), OSCAR_OK);
    char fifo[400], dev[400], dir[400];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_dir);
    snprintf(dev, sizeof dev, "%s/null", g_dir);
    snprintf(dir, sizeof dir, "%s/sub", g_dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(symlink("/dev/null", dev), 0);
    cr_assert_eq(mkdir(dir, 0700), 0);
    const char *paths[3] = {fifo, dev, dir}, *kinds[3] = {"a FIFO", "a device", "a directory"};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(oscar_params_save(p, paths[i]), OSCAR_ERR_IO, "%s: %s", paths[i], oscar_last_error());
        cr_expect(strstr(oscar_last_error(), kinds[i]) && strstr(oscar_last_error(), "regular file"), "%s",
                  oscar_last_error());
    }
    struct stat sb;
    cr_expect(stat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    cr_expect(lstat(dev, &sb) == 0 && S_ISLNK(sb.st_mode), "the link to /dev/null was replaced");
    DIR *dp = opendir(g_dir);
    cr_assert(dp);
    int n = 0;
    for (struct dirent *e; (e = readdir(dp));) n += e->d_name[0] != '.';
    closedir(dp);
    cr_expect_eq(n, 3, "a refused save left a temporary file behind");
    rmdir(dir);
    oscar_params_destroy(p);
}

/* The saved file's format_version, clip tensor shape and (clip not NULL) its
 * first `cap` values. */
static void file_clip_header(const char *path, int *version, int *rank, int64_t shape[3], float *clip, size_t cap) {
    size_t n;
    uint8_t *b = read_file(path, &n);
    uint64_t hn;
    memcpy(&hn, b, 8);
    json_error_t err;
    json_t *hdr = json_loadb((const char *)b + 8, hn, 0, &err);
    cr_assert_not_null(hdr);
    json_t *meta = json_loads(json_string_value(json_object_get(json_object_get(hdr, "__metadata__"), "oscar")), 0,
                              &err);
    cr_assert_not_null(meta);
    *version = (int)json_integer_value(json_object_get(meta, "format_version"));
    json_t *ct = json_object_get(hdr, "clip"), *sh = json_object_get(ct, "shape");
    *rank = (int)json_array_size(sh);
    for (int i = 0; i < *rank && i < 3; i++) shape[i] = json_integer_value(json_array_get(sh, (size_t)i));
    if (clip) { /* copied: the data need not be 4-byte aligned in the buffer */
        size_t off = (size_t)json_integer_value(json_array_get(json_object_get(ct, "data_offsets"), 0));
        cr_assert(8 + hn + off + cap * sizeof(float) <= n);
        memcpy(clip, b + 8 + hn + off, cap * sizeof(float));
    }
    json_decref(meta);
    json_decref(hdr);
    free(b);
}

Test(params, clip_per_kv_head) {
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 3, 8, 4, 64, &p), OSCAR_OK);
    float c;
    for (int h = 0; h < 4; h++) { /* built-in: the published ratios on every head */
        cr_assert_eq(oscar_params_clip_head(p, 2, h, OSCAR_K, &c), OSCAR_OK);
        cr_assert_eq(c, 0.96f);
        cr_assert_eq(oscar_params_clip_head(p, 2, h, OSCAR_V, &c), OSCAR_OK);
        cr_assert_eq(c, 0.92f);
    }
    /* One head changed: the others keep theirs; the per-layer view is the mildest. */
    cr_assert_eq(oscar_params_set_clip_head(p, 1, 2, OSCAR_K, 0.9f), OSCAR_OK);
    cr_assert_eq(oscar_params_set_clip_head(p, 1, 3, OSCAR_K, 0.99f), OSCAR_OK);
    cr_assert_eq(oscar_params_clip_head(p, 1, 2, OSCAR_K, &c), OSCAR_OK);
    cr_assert_eq(c, 0.9f);
    cr_assert_eq(oscar_params_clip_head(p, 1, 1, OSCAR_K, &c), OSCAR_OK);
    cr_assert_eq(c, 0.96f);
    cr_assert_eq(oscar_params_clip_head(p, 1, 3, OSCAR_V, &c), OSCAR_OK);
    cr_assert_eq(c, 0.92f);
    cr_assert_eq(oscar_params_clip(p, 1, OSCAR_K, &c), OSCAR_OK);
    cr_assert_eq(c, 0.99f);
    cr_assert_eq(oscar_params_clip(p, 0, OSCAR_K, &c), OSCAR_OK);
    cr_assert_eq(c, 0.96f);
    /* The per-layer setter sets every head. */
    cr_assert_eq(oscar_params_set_clip(p, 1, OSCAR_K, 0.95f), OSCAR_OK);
    for (int h = 0; h < 4; h++) {
        cr_assert_eq(oscar_params_clip_head(p, 1, h, OSCAR_K, &c), OSCAR_OK);
        cr_assert_eq(c, 0.95f);
    }
    /* Bad input: head out of range, ratio outside (0, 1] or NaN, NULL out. */
    cr_assert_eq(oscar_params_set_clip_head(p, 1, 4, OSCAR_K, 0.9f), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "kv_head 4") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_clip_head(p, 1, -1, OSCAR_K, 0.9f), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_clip_head(p, 3, 0, OSCAR_K, &c), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_clip_head(p, 0, 0, (oscar_kv)2, &c), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_clip_head(p, 0, 0, OSCAR_K, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_clip_head(NULL, 0, 0, OSCAR_K, &c), OSCAR_ERR_INVALID_ARGUMENT);
    float bad[] = {0.0f, -0.1f, 1.0001f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(oscar_params_set_clip_head(p, 0, 1, OSCAR_V, bad[i]), OSCAR_ERR_INVALID_ARGUMENT, "clip %g",
                     (double)bad[i]);
        cr_assert(strstr(oscar_last_error(), "(0, 1]") != NULL);
    }
    cr_assert_eq(oscar_params_clip_head(p, 0, 1, OSCAR_V, &c), OSCAR_OK);
    cr_assert_eq(c, 0.92f, "a refused ratio left the old one");
    cr_assert_eq(oscar_params_set_clip_head(p, 0, 1, OSCAR_V, 1.0f), OSCAR_OK); /* 1: no clipping */
    oscar_params_destroy(p);
}

/* Files hold the lowest version that fits: per-layer clips stay [L, 2] (what
 * version 1-2 readers know); per-head ones are [L, Hkv, 2] in version 3. */
Test(params, clip_file_versions, .init = mk_dir, .fini = rm_dir) {
    seed_init();
    for (int fb = 0; fb < 2; fb++) {
        oscar_params *p = random_params(2, 8, 4, 64, 1, 1), *q = NULL;
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 4; h++)
                for (int kv = 0; kv < 2; kv++)
                    cr_assert_eq(oscar_params_set_clip_head(p, l, h, (oscar_kv)kv, (float)(0.8 + 0.05 * h + 0.01 * l)),
                                 OSCAR_OK);
        if (fb) {
            p->fb = calloc((size_t)2 * 2 * 4 * 64 * 64, sizeof(float));
            cr_assert_not_null(p->fb);
        }
        char path[400];
        int version, rank;
        int64_t sh[3] = {0};
        snprintf(path, sizeof path, "%s/heads%d.safetensors", g_dir, fb);
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
        file_clip_header(path, &version, &rank, sh, NULL, 0);
        cr_assert_eq(version, 3);
        cr_assert(rank == 3 && sh[0] == 2 && sh[1] == 4 && sh[2] == 2, "clip shape rank %d [%lld %lld %lld]", rank,
                  (long long)sh[0], (long long)sh[1], (long long)sh[2]);
        cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 4; h++)
                for (int kv = 0; kv < 2; kv++) {
                    float a, b;
                    cr_assert_eq(oscar_params_clip_head(p, l, h, (oscar_kv)kv, &a), OSCAR_OK);
                    cr_assert_eq(oscar_params_clip_head(q, l, h, (oscar_kv)kv, &b), OSCAR_OK);
                    cr_assert_eq(a, b, "layer %d head %d kv %d (seed %llu)", l, h, kv, (unsigned long long)g_seed);
                }
        oscar_params_destroy(q);
        /* Per-layer ratios again: the file falls back to version 1 / 2 and [L, 2]. */
        for (int l = 0; l < 2; l++) {
            cr_assert_eq(oscar_params_set_clip(p, l, OSCAR_K, 0.97f), OSCAR_OK);
            cr_assert_eq(oscar_params_set_clip(p, l, OSCAR_V, 0.9f - 0.01f * (float)l), OSCAR_OK);
        }
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK);
        file_clip_header(path, &version, &rank, sh, NULL, 0);
        cr_assert_eq(version, fb ? 2 : 1);
        cr_assert(rank == 2 && sh[0] == 2 && sh[1] == 2);
        cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
        assert_same(p, q);
        oscar_params_destroy(q);
        oscar_params_destroy(p);
    }
}

/* A file written by an earlier release (format_version 1, one clip ratio per
 * layer; docs/eval/nearest-search): every KV head gets its layer's ratio, and
 * saving it again writes the same bytes. */
Test(params, old_file_loads, .init = mk_dir, .fini = rm_dir) {
    const char *old = OSCAR_SOURCE_DIR "/docs/eval/nearest-search/tiny-qwen3.oscar.safetensors";
    int version, rank;
    int64_t sh[3] = {0};
    float raw[2 * 8]; /* [L][2] of its 8 layers */
    file_clip_header(old, &version, &rank, sh, raw, 2 * 8);
    cr_assert(version == 1 && rank == 2 && sh[0] == 8 && sh[1] == 2);
    size_t n;
    uint8_t *b = read_file(old, &n);
    oscar_params *p = NULL;
    cr_assert_eq(oscar_params_load(old, &p), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(p->num_kv_heads, 2);
    cr_assert_eq((int64_t)p->num_layers, sh[0]);
    for (int l = 0; l < p->num_layers; l++)
        for (int h = 0; h < p->num_kv_heads; h++)
            for (int kv = 0; kv < 2; kv++) {
                float c;
                cr_assert_eq(oscar_params_clip_head(p, l, h, (oscar_kv)kv, &c), OSCAR_OK);
                cr_assert_eq(c, raw[2 * l + kv], "layer %d head %d kv %d", l, h, kv);
            }
    char path[400];
    snprintf(path, sizeof path, "%s/again.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK);
    size_t n2;
    uint8_t *b2 = read_file(path, &n2);
    cr_assert(n2 == n && memcmp(b, b2, n) == 0, "re-saving an old file changed its bytes");
    free(b2);
    free(b);
    oscar_params_destroy(p);
}

/* ------------------------------------------------------- hostile files */

/* A valid file in memory to mutate: 2 layers, 4/2 heads, d 64, eigenvalues. */
static uint8_t *g_file;
static size_t g_size;
static void valid_file_of(int head_clips) {
    seed_init();
    mk_dir();
    oscar_params *p = random_params(2, 4, 2, 64, 0, 1);
    if (head_clips == 1) cr_assert_eq(oscar_params_set_clip_head(p, 0, 1, OSCAR_K, 0.93f), OSCAR_OK); /* version 3 */
    if (head_clips == 2) cr_assert_eq(oscar_params_set_code_bits(p, 1, 0, OSCAR_V, 3), OSCAR_OK); /* version 4 */
    char path[400];
    snprintf(path, sizeof path, "%s/valid.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK);
    oscar_params_destroy(p);
    g_file = read_file(path, &g_size);
}
static void valid_file(void) { valid_file_of(0); }
static void free_file(void) {
    free(g_file);
    rm_dir();
}

/* Loads bytes through both entry points (memory and path); both must agree. */
static oscar_status load_bytes(const uint8_t *b, size_t n) {
    oscar_params *p = (oscar_params *)1;
    oscar_status s = oscar_params_load_memory(b, n, &p);
    if (s == OSCAR_OK)
        oscar_params_destroy(p);
    else
        cr_assert_null(p);
    char path[400];
    snprintf(path, sizeof path, "%s/mut.safetensors", g_dir);
    write_file(path, b, n);
    oscar_params *q = NULL;
    oscar_status s2 = oscar_params_load(path, &q);
    oscar_params_destroy(q);
    cr_assert_eq(s, s2, "memory and file loaders disagree: %d vs %d", s, s2);
    return s;
}

static int g_raw_meta; /* set by a mutator that wrote __metadata__.oscar itself */
typedef void (*mutator)(json_t *hdr, json_t *meta, uint8_t *data, size_t data_size);

/* Rebuilds the file after fn edits the header, the metadata object and/or
 * the data bytes; returns the load status and copies the message. */
static oscar_status load_mutated(mutator fn, char *msg, size_t msg_cap) {
    uint64_t n;
    memcpy(&n, g_file, 8);
    json_error_t err;
    json_t *hdr = json_loadb((const char *)g_file + 8, n, 0, &err);
    cr_assert_not_null(hdr);
    json_t *md = json_object_get(hdr, "__metadata__");
    json_t *meta = json_loads(json_string_value(json_object_get(md, "oscar")), 0, &err);
    size_t data_size = g_size - 8 - n;
    uint8_t *data = malloc(data_size + 1);
    memcpy(data, g_file + 8 + n, data_size);
    g_raw_meta = 0;
    fn(hdr, meta, data, data_size);
    if (meta && !g_raw_meta) {
        char *ms = json_dumps(meta, JSON_COMPACT);
        json_object_set_new(json_object_get(hdr, "__metadata__"), "oscar", json_string(ms));
        free(ms);
    }
    json_decref(meta);
    char *hs = json_dumps(hdr, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(hdr);
    size_t hl = strlen(hs);
    uint8_t *out = malloc(8 + hl + data_size);
    uint64_t hl64 = hl;
    memcpy(out, &hl64, 8);
    memcpy(out + 8, hs, hl);
    memcpy(out + 8 + hl, data, data_size);
    oscar_status s = load_bytes(out, 8 + hl + data_size);
    snprintf(msg, msg_cap, "%s", oscar_last_error());
    free(hs);
    free(out);
    free(data);
    return s;
}

static size_t tensor_begin(json_t *hdr, const char *name) {
    return (size_t)json_integer_value(json_array_get(json_object_get(json_object_get(hdr, name), "data_offsets"), 0));
}
static void set_offsets(json_t *hdr, const char *name, json_int_t b, json_int_t e) {
    json_t *off = json_object_get(json_object_get(hdr, name), "data_offsets");
    json_array_set_new(off, 0, json_integer(b));
    json_array_set_new(off, 1, json_integer(e));
}

static void m_none(json_t *h, json_t *m, uint8_t *d, size_t n) { (void)h, (void)m, (void)d, (void)n; }
static void m_version(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "format_version", json_integer(OSCAR_PARAMS_FORMAT_VERSION + 1));
}
static void m_no_layers(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_del(m, "num_layers");
}
static void m_layers_str(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "num_layers", json_string("2"));
}
static void m_layers_huge(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "num_layers", json_integer(100000));
}
static void m_layers_more(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "num_layers", json_integer(3));
}
static void m_head_dim(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "head_dim", json_integer(96));
}
static void m_group(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "group", json_integer(48));
}
static void m_kv_div(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "num_kv_heads", json_integer(3));
}
static void m_method(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "method", json_string("int3"));
}
static void m_per_head(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "per_head", json_true()); /* shapes then disagree: num_rot 2 */
}
static void m_no_meta(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_del(h, "__metadata__");
}
static void m_meta_not_obj(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "__metadata__"), "oscar", json_string("[1,2]"));
    g_raw_meta = 1;
}
static void m_hash_long(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    char s[100];
    memset(s, 'a', 99);
    s[99] = 0;
    json_object_set_new(m, "model_hash", json_string(s));
}
static void m_missing_clip(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_del(h, "clip");
}
static void m_missing_rot(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_del(h, "layers.1.rot_v");
}
static void m_missing_eig(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_del(h, "layers.1.eig_v");
}
static void m_unknown_tensor(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set(h, "layers.7.rot_k", json_object_get(h, "layers.0.rot_k"));
}
static void m_dtype(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "layers.0.rot_k"), "dtype", json_string("F16"));
}
static void m_dtype_unknown(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "clip"), "dtype", json_string("Q2"));
}
/* Terminal escapes in strings the loader quotes or keeps (oscar-inspect prints them). */
static void m_hash_escape(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "model_hash", json_string("\x1b]0;pwned\x07"));
}
static void m_key_escape(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set(h, "\x1b[2Jlayers", json_object_get(h, "layers.0.rot_k"));
}
static void m_dtype_escape(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "clip"), "dtype", json_string("F\x1b[31m"));
}
static void set_shape3(json_t *h, const char *name, int a, int b, int c) {
    json_t *sh = json_array();
    json_array_append_new(sh, json_integer(a));
    json_array_append_new(sh, json_integer(b));
    json_array_append_new(sh, json_integer(c));
    json_object_set_new(json_object_get(h, name), "shape", sh);
}
static void m_shape(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    set_shape3(h, "layers.1.rot_k", 1, 32, 128);
}
static void m_shape_rank(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_t *sh = json_array();
    json_array_append_new(sh, json_integer(4));
    json_object_set_new(json_object_get(h, "clip"), "shape", sh);
}
static void m_oob(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d;
    size_t b = n - 8; /* clip is 16 bytes: moved so it runs past the end */
    set_offsets(h, "clip", (json_int_t)b, (json_int_t)b + 16);
}
static void m_negative(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    set_offsets(h, "clip", -16, 0);
}
static void m_overlap(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    size_t b = tensor_begin(h, "layers.0.rot_k");
    set_offsets(h, "layers.0.rot_v", (json_int_t)b + 4, (json_int_t)b + 4 + 64 * 64 * 4);
}
static void m_short_span(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    size_t b = tensor_begin(h, "clip");
    set_offsets(h, "clip", (json_int_t)b, (json_int_t)b + 12);
}
static void m_offsets_type(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "clip"), "data_offsets", json_string("0-16"));
}
static void m_tensor_not_obj(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(h, "clip", json_integer(3));
}
static void m_nan_rot(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    float v = NAN;
    memcpy(d + tensor_begin(h, "layers.1.rot_v") + 4 * 70, &v, 4);
}
static void m_inf_eig(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    double v = -INFINITY;
    memcpy(d + tensor_begin(h, "layers.0.eig_k") + 8 * 3, &v, 8);
}
static void m_not_orthogonal(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    float *R = (float *)(void *)(d + tensor_begin(h, "layers.0.rot_k"));
    float v;
    memcpy(&v, R + 5, 4);
    v += 0.01f;
    memcpy(R + 5, &v, 4);
}
static float g_clip_value;
static void m_clip(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    memcpy(d + tensor_begin(h, "clip") + 4 * 3, &g_clip_value, 4);
}
Test(params, valid_mutation_baseline, .init = valid_file, .fini = free_file) {
    char msg[512];
    cr_assert_eq(load_mutated(m_none, msg, sizeof msg), OSCAR_OK, "%s", msg);
}

Test(params, corrupt_files_refused, .init = valid_file, .fini = free_file) {
    struct {
        mutator fn;
        oscar_status want;
        const char *needle;
    } cases[] = {
        {m_version, OSCAR_ERR_VERSION, "format_version"},
        {m_no_layers, OSCAR_ERR_CORRUPT_FILE, "num_layers"},
        {m_layers_str, OSCAR_ERR_CORRUPT_FILE, "num_layers"},
        {m_layers_huge, OSCAR_ERR_CORRUPT_FILE, "num_layers"},
        {m_layers_more, OSCAR_ERR_CORRUPT_FILE, "is not 3"},
        {m_head_dim, OSCAR_ERR_CORRUPT_FILE, "head_dim"},
        {m_kv_div, OSCAR_ERR_CORRUPT_FILE, "divide"},
        {m_group, OSCAR_ERR_CORRUPT_FILE, "group 48"},
        {m_method, OSCAR_ERR_CORRUPT_FILE, "method"},
        {m_per_head, OSCAR_ERR_CORRUPT_FILE, "dimension 0"},
        {m_no_meta, OSCAR_ERR_CORRUPT_FILE, "__metadata__"},
        {m_meta_not_obj, OSCAR_ERR_CORRUPT_FILE, "not a JSON object"},
        {m_hash_long, OSCAR_ERR_CORRUPT_FILE, "model_hash"},
        {m_missing_clip, OSCAR_ERR_CORRUPT_FILE, "clip"},
        {m_missing_rot, OSCAR_ERR_CORRUPT_FILE, "layers.1.rot_v"},
        {m_missing_eig, OSCAR_ERR_CORRUPT_FILE, "layers.1.eig_v"},
        {m_unknown_tensor, OSCAR_ERR_CORRUPT_FILE, "layers.7.rot_k"},
        {m_dtype, OSCAR_ERR_CORRUPT_FILE, "F16"},
        {m_dtype_unknown, OSCAR_ERR_CORRUPT_FILE, "Q2"},
        {m_shape, OSCAR_ERR_CORRUPT_FILE, "layers.1.rot_k"},
        {m_shape_rank, OSCAR_ERR_CORRUPT_FILE, "rank"},
        {m_oob, OSCAR_ERR_CORRUPT_FILE, "outside"},
        {m_negative, OSCAR_ERR_CORRUPT_FILE, "outside"},
        {m_overlap, OSCAR_ERR_CORRUPT_FILE, "overlap"},
        {m_short_span, OSCAR_ERR_CORRUPT_FILE, "spans"},
        {m_offsets_type, OSCAR_ERR_CORRUPT_FILE, "data_offsets"},
        {m_tensor_not_obj, OSCAR_ERR_CORRUPT_FILE, "not an object"},
        {m_nan_rot, OSCAR_ERR_CORRUPT_FILE, "non-finite"},
        {m_inf_eig, OSCAR_ERR_CORRUPT_FILE, "not finite"},
        {m_not_orthogonal, OSCAR_ERR_CORRUPT_FILE, "not orthogonal"},
        {m_hash_escape, OSCAR_ERR_CORRUPT_FILE, "non-printable"},
        {m_key_escape, OSCAR_ERR_CORRUPT_FILE, "?[2Jlayers"},
        {m_dtype_escape, OSCAR_ERR_CORRUPT_FILE, "F?[31m"},
    };
    char msg[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        oscar_status s = load_mutated(cases[i].fn, msg, sizeof msg);
        cr_assert_eq(s, cases[i].want, "case %zu: got %d (%s)", i, s, msg);
        cr_assert(strstr(msg, cases[i].needle) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i, msg,
                  cases[i].needle);
        for (const char *c = msg; *c; c++) /* no control character from the file reaches a message */
            cr_assert((unsigned char)*c >= 0x20, "case %zu: control byte 0x%02x in the message", i, (unsigned)*c);
    }
    float bad_clips[] = {0.0f, -0.5f, 1.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_clips / sizeof bad_clips[0]; i++) {
        g_clip_value = bad_clips[i];
        cr_assert_eq(load_mutated(m_clip, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "clip %g", (double)g_clip_value);
        cr_assert(strstr(msg, "clip ratio of layer 1 KV head 0 V") != NULL, "%s", msg);
    }
}

/* Per-head clip ratios (format_version 3): the same checks, and the shape
 * needs the version. */
static void valid_head_file(void) { valid_file_of(1); }
static void m_clip_v2(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "format_version", json_integer(2));
}
static void m_clip_heads(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    set_shape3(h, "clip", 2, 3, 2);
}

Test(params, clip_heads_corrupt_files_refused, .init = valid_head_file, .fini = free_file) {
    char msg[512];
    cr_assert_eq(load_mutated(m_none, msg, sizeof msg), OSCAR_OK, "%s", msg);
    cr_assert_eq(load_mutated(m_clip_v2, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "need format_version 3") != NULL, "%s", msg);
    cr_assert_eq(load_mutated(m_clip_heads, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "dimension 1") != NULL, "%s", msg);
    float bad_clips[] = {0.0f, -0.5f, 1.5f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_clips / sizeof bad_clips[0]; i++) {
        g_clip_value = bad_clips[i]; /* value 3 of [L][Hkv][2]: layer 0, KV head 1, V */
        cr_assert_eq(load_mutated(m_clip, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "clip %g", (double)g_clip_value);
        cr_assert(strstr(msg, "clip ratio of layer 0 KV head 1 V") != NULL, "%s", msg);
    }
}

/* Code widths (format_version 4, FORMAT.md §2.7): tensor code_bits [L][Hkv][2] I32, 2 or 3, 3 only for
 * oscar2; the tensor needs the version. */
static void valid_wide_file(void) { valid_file_of(2); }
static int32_t g_bits_value;
static void m_bits_value(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    memcpy(d + tensor_begin(h, "code_bits") + 4 * 5, &g_bits_value, 4); /* layer 1, KV head 0, V */
}
static void m_bits_v3(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "format_version", json_integer(3));
}
static void m_bits_lm(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "method", json_string("oscar2-lm"));
}
static void m_bits_shape(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    set_shape3(h, "code_bits", 2, 2, 1);
}
static void m_bits_dtype(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "code_bits"), "dtype", json_string("F32"));
}

Test(params, code_bits_corrupt_files_refused, .init = valid_wide_file, .fini = free_file) {
    char msg[512];
    cr_assert_eq(load_mutated(m_none, msg, sizeof msg), OSCAR_OK, "%s", msg);
    cr_assert_eq(load_mutated(m_bits_v3, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "need format_version 4") != NULL, "%s", msg);
    cr_assert_eq(load_mutated(m_bits_lm, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "code_bits of layer 1 KV head 0 V is 3, which needs method oscar2") != NULL, "%s", msg);
    cr_assert_eq(load_mutated(m_bits_shape, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "code_bits") != NULL, "%s", msg);
    cr_assert_eq(load_mutated(m_bits_dtype, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "%s", msg);
    cr_assert(strstr(msg, "dtype") != NULL, "%s", msg);
    const int32_t bad[] = {0, 1, 4, 8, -1, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g_bits_value = bad[i];
        cr_assert_eq(load_mutated(m_bits_value, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "bits %d", (int)bad[i]);
        cr_assert(strstr(msg, "code_bits of layer 1 KV head 0 V is") != NULL && strstr(msg, "must be 2 or 3") != NULL,
                  "%s", msg);
    }
    g_bits_value = 2; /* a file may spell out 2 everywhere */
    cr_assert_eq(load_mutated(m_bits_value, msg, sizeof msg), OSCAR_OK, "%s", msg);
}

Test(params, code_bits_round_trip_and_setter, .init = mk_dir, .fini = rm_dir) {
    seed_init();
    oscar_params *p = random_params(3, 8, 2, 128, 1, 1);
    int b = 0;
    cr_assert_eq(oscar_params_code_bits(p, 2, 1, OSCAR_K, &b), OSCAR_OK);
    cr_assert_eq(b, 2, "default width %d", b);
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 1, OSCAR_K, 4), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "code width 4") != NULL, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 2, OSCAR_K, 3), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_set_code_bits(p, 3, 0, OSCAR_K, 3), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_code_bits(p, 0, 0, OSCAR_K, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 0, 0, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    char path[400];
    snprintf(path, sizeof path, "%s/wide.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
    int version = 0, rank = 0;
    int64_t shape[3];
    file_clip_header(path, &version, &rank, shape, NULL, 0);
    cr_assert_eq(version, 4, "a file with 3-bit head-tensors is format_version %d", version);
    oscar_params *q = NULL;
    cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
    assert_same(p, q);
    for (int l = 0; l < 3; l++)
        for (int h = 0; h < 2; h++)
            for (int w = 0; w < 2; w++) {
                cr_assert_eq(oscar_params_code_bits(q, l, h, (oscar_kv)w, &b), OSCAR_OK);
                const int want = (l == 2 && h == 1 && w == 0) || (l == 0 && h == 0 && w == 1) ? 3 : 2;
                cr_assert_eq(b, want, "layer %d head %d %c: %d bits after the round trip", l, h, w ? 'V' : 'K', b);
            }
    oscar_params_destroy(q);
    /* Back to 2 bits everywhere: the file is again the older version and has no code_bits. */
    cr_assert_eq(oscar_params_set_code_bits(p, 2, 1, OSCAR_K, 2), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 0, 0, OSCAR_V, 2), OSCAR_OK);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
    file_clip_header(path, &version, &rank, shape, NULL, 0);
    cr_assert_lt(version, 4, "a file with 2 bits everywhere is format_version %d", version);
    oscar_params_destroy(p);
    /* 3-bit codes have uniform levels: Lloyd-Max parameters refuse them. */
    oscar_params *lm = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2_LM, 1, 4, 2, 64, &lm), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(lm, 0, 0, OSCAR_K, 3), OSCAR_ERR_UNSUPPORTED);
    cr_assert(strstr(oscar_last_error(), "oscar2") != NULL, "%s", oscar_last_error());
    oscar_params_destroy(lm);
}

Test(params, raw_header_attacks, .init = valid_file, .fini = free_file) {
    uint8_t *b = malloc(g_size + 64);
    uint64_t n;
    memcpy(&n, g_file, 8);
    /* Header length over 16 MiB, past the end, and lengths near 2^64. */
    uint64_t lens[] = {(16u << 20) + 1, (uint64_t)g_size, (uint64_t)g_size - 7, UINT64_MAX, UINT64_MAX - 7};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        memcpy(b, g_file, g_size);
        memcpy(b, &lens[i], 8);
        cr_assert_eq(load_bytes(b, g_size), OSCAR_ERR_CORRUPT_FILE, "len %llu", (unsigned long long)lens[i]);
    }
    /* Truncation at every interesting point: never OK, never a crash. */
    size_t cuts[] = {0, 1, 7, 8, 9, 8 + (size_t)n / 2, 8 + (size_t)n, 8 + (size_t)n + 100, g_size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        cr_assert_eq(load_bytes(g_file, cuts[i]), OSCAR_ERR_CORRUPT_FILE, "cut at %zu of %zu", cuts[i], g_size);
    /* Non-object JSON and non-JSON headers. */
    const char *heads[] = {"[]", "123", "\"str\"", "null", "{", "{\"a\":1,\"a\":2}", "{}"};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        uint64_t hl = strlen(heads[i]);
        memcpy(b, &hl, 8);
        memcpy(b + 8, heads[i], hl);
        cr_assert_eq(load_bytes(b, 8 + hl), OSCAR_ERR_CORRUPT_FILE, "header %s", heads[i]);
    }
    /* Random byte flips: any status is fine except a crash; OK only if
     * the flip left the file valid. */
    for (int it = 0; it < 200; it++) {
        memcpy(b, g_file, g_size);
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips; f++) b[rnd() % g_size] ^= (uint8_t)(1u << (rnd() % 8));
        oscar_params *p = NULL;
        oscar_status s = oscar_params_load_memory(b, g_size, &p);
        cr_assert(s == OSCAR_OK || s == OSCAR_ERR_CORRUPT_FILE || s == OSCAR_ERR_VERSION, "status %d", s);
        oscar_params_destroy(p);
    }
    free(b);
}

/* Every file of the committed fuzz corpus: never a crash; valid_* load. */
Test(params, fuzz_corpus_replay) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    char *slash = strrchr(dir, '/');
    cr_assert_not_null(slash);
    *slash = '\0';
    slash = strrchr(dir, '/');
    cr_assert_not_null(slash);
    snprintf(slash, sizeof dir - (size_t)(slash - dir), "/fuzz/corpus");
    DIR *dp = opendir(dir);
    cr_assert_not_null(dp, "fuzz corpus folder %s missing", dir);
    struct dirent *e;
    int files = 0, valid = 0;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        oscar_params *p = NULL;
        oscar_status s = oscar_params_load(path, &p);
        if (strncmp(e->d_name, "valid_", 6) == 0) {
            cr_assert_eq(s, OSCAR_OK, "%s: %s", e->d_name, oscar_last_error());
            valid++;
        } else {
            cr_assert(s == OSCAR_OK || s == OSCAR_ERR_CORRUPT_FILE || s == OSCAR_ERR_VERSION, "%s: status %d",
                      e->d_name, s);
        }
        oscar_params_destroy(p);
        files++;
    }
    closedir(dp);
    cr_assert_geq(files, 5);
    cr_assert_geq(valid, 2);
}

/* ------------------------------------------------- error-feedback weights */

static void random_fb(oscar_params *p) {
    size_t d = (size_t)p->head_dim, n = (size_t)p->num_layers * 2 * (size_t)p->num_rot;
    p->fb = calloc(n * d * d, sizeof(float));
    cr_assert_not_null(p->fb);
    for (size_t m = 0; m < n; m++)
        for (size_t j = 0; j < d; j++)
            for (size_t k = j + 1; k < d; k++) p->fb[(m * d + j) * d + k] = (float)(0.6 * urand() - 0.3);
}

static int64_t file_format_version(const char *path) {
    int v, rank;
    int64_t sh[3];
    file_clip_header(path, &v, &rank, sh, NULL, 0);
    return v;
}

Test(params, feedback_round_trip_and_version, .init = mk_dir, .fini = rm_dir) {
    seed_init();
    const int shapes[][5] = {{2, 8, 2, 128, 0}, {2, 8, 4, 64, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        oscar_params *p = random_params(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], 1);
        char path[400];
        snprintf(path, sizeof path, "%s/plain%zu.safetensors", g_dir, s);
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(file_format_version(path), 1, "files without feedback stay readable by version-1 loaders");
        random_fb(p);
        snprintf(path, sizeof path, "%s/fb%zu.safetensors", g_dir, s);
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
        cr_assert_eq(file_format_version(path), 2);
        oscar_params *q = NULL;
        cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
        assert_same(p, q);
        size_t d = (size_t)p->head_dim, n = (size_t)p->num_layers * 2 * (size_t)p->num_rot * d * d;
        cr_assert_not_null(q->fb);
        cr_assert_eq(memcmp(p->fb, q->fb, n * sizeof(float)), 0, "feedback weights differ (seed %llu)",
                     (unsigned long long)g_seed);
        /* The accessor hands out the (layer, head) slice. */
        const float *F = NULL;
        int last = p->per_head ? p->num_kv_heads - 1 : 0;
        cr_assert_eq(oscar_params_feedback(q, 1, last, OSCAR_V, &F), OSCAR_OK);
        cr_assert_eq(F, oscar_params_fb_ptr(q, 1, OSCAR_V, last));
        cr_assert_eq(oscar_params_feedback(q, 2, 0, OSCAR_K, &F), OSCAR_ERR_INVALID_ARGUMENT);
        oscar_params_destroy(p);
        oscar_params_destroy(q);
    }
    oscar_params *b = NULL;
    const float *F = (const float *)1;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 1, 2, 1, 64, &b), OSCAR_OK);
    cr_assert_eq(oscar_params_feedback(b, 0, 0, OSCAR_K, &F), OSCAR_OK);
    cr_assert_null(F, "built-in parameters round to nearest");
    oscar_params_destroy(b);
}

Test(params, set_feedback, .init = mk_dir, .fini = rm_dir) {
    seed_init();
    const int d = 64;
    oscar_params *p = NULL, *q = NULL;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 3, 4, 2, d, &p), OSCAR_OK);
    float *F = calloc((size_t)d * d, sizeof *F);
    for (int j = 0; j < d; j++) /* strictly upper triangular, |F| < 0.5 */
        for (int k = j + 1; k < d; k++) F[j * d + k] = (float)(urand() - 0.5);
    cr_assert_eq(oscar_params_set_feedback(p, 1, 0, OSCAR_V, F), OSCAR_OK, "%s", oscar_last_error());
    const float *G = NULL;
    cr_assert_eq(oscar_params_feedback(p, 1, 0, OSCAR_V, &G), OSCAR_OK);
    cr_assert_not_null(G);
    cr_assert_eq(memcmp(F, G, (size_t)d * d * sizeof *F), 0);
    cr_assert_eq(oscar_params_feedback(p, 2, 0, OSCAR_K, &G), OSCAR_OK);
    for (int i = 0; i < d * d; i++) cr_assert_eq(G[i], 0.0f, "the other layers round to nearest (zero weights)");
    char path[400];
    snprintf(path, sizeof path, "%s/set_fb.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_feedback(q, 1, 0, OSCAR_V, &G), OSCAR_OK);
    cr_assert_eq(memcmp(F, G, (size_t)d * d * sizeof *F), 0, "saved and loaded");
    oscar_params_destroy(q);
    /* Bad weights and arguments change nothing. */
    float keep = F[1];
    const float bad[] = {NAN, INFINITY, 17.0f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        F[1] = bad[i];
        cr_assert_eq(oscar_params_set_feedback(p, 1, 0, OSCAR_V, F), OSCAR_ERR_INVALID_ARGUMENT);
    }
    F[1] = keep;
    F[d + 1] = 0.5f; /* on the diagonal */
    cr_assert_eq(oscar_params_set_feedback(p, 1, 0, OSCAR_V, F), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(), "diagonal"), "%s", oscar_last_error());
    F[d + 1] = 0.0f;
    F[d] = 0.5f; /* below it */
    cr_assert_eq(oscar_params_set_feedback(p, 1, 0, OSCAR_V, F), OSCAR_ERR_INVALID_ARGUMENT);
    F[d] = 0.0f;
    cr_assert_eq(oscar_params_feedback(p, 1, 0, OSCAR_V, &G), OSCAR_OK);
    cr_assert_eq(G[1], keep);
    cr_assert_eq(oscar_params_set_feedback(p, 3, 0, OSCAR_K, F), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_set_feedback(p, 0, 0, (oscar_kv)2, F), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_set_feedback(p, 0, 0, OSCAR_K, NULL), OSCAR_ERR_INVALID_ARGUMENT);
    cr_assert_eq(oscar_params_set_feedback(NULL, 0, 0, OSCAR_K, F), OSCAR_ERR_INVALID_ARGUMENT);
    oscar_params_destroy(p);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 1, 4, 2, d, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_set_feedback(p, 0, 0, OSCAR_K, F), OSCAR_ERR_INVALID_ARGUMENT, "quarot2 rounds to nearest");
    oscar_params_destroy(p);
    free(F);
}

static void valid_fb_file(void) {
    seed_init();
    mk_dir();
    oscar_params *p = random_params(2, 4, 2, 64, 0, 1);
    random_fb(p);
    char path[400];
    snprintf(path, sizeof path, "%s/valid_fb.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, path), OSCAR_OK);
    oscar_params_destroy(p);
    g_file = read_file(path, &g_size);
}
static float g_fb_value;
static int g_fb_index;
static void m_fb_value(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)n;
    memcpy(d + tensor_begin(h, "layers.1.fb_v") + 4 * (size_t)g_fb_index, &g_fb_value, 4);
}
static void m_fb_v1(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)h, (void)d, (void)n;
    json_object_set_new(m, "format_version", json_integer(1));
}
static void m_fb_missing(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_del(h, "layers.1.fb_k");
}
static void m_fb_dtype(json_t *h, json_t *m, uint8_t *d, size_t n) {
    (void)m, (void)d, (void)n;
    json_object_set_new(json_object_get(h, "layers.0.fb_v"), "dtype", json_string("F64"));
}

Test(params, feedback_corrupt_files_refused, .init = valid_fb_file, .fini = free_file) {
    char msg[512];
    cr_assert_eq(load_mutated(m_none, msg, sizeof msg), OSCAR_OK, "%s", msg);
    struct {
        mutator fn;
        const char *needle;
    } cases[] = {
        {m_fb_v1, "format_version 2"},
        {m_fb_missing, "layers.1.fb_k"},
        {m_fb_dtype, "layers.0.fb_v"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(load_mutated(cases[i].fn, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "case %zu: %s", i, msg);
        cr_assert(strstr(msg, cases[i].needle) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i, msg,
                  cases[i].needle);
        for (const char *c = msg; *c; c++) /* no control character from the file reaches a message */
            cr_assert((unsigned char)*c >= 0x20, "case %zu: control byte 0x%02x in the message", i, (unsigned)*c);
    }
    /* Values: (row, column) of a 64 x 64 matrix. */
    struct {
        int j, k;
        float v;
    } bad[] = {{3, 3, 0.5f}, {10, 2, -0.1f}, {0, 5, 16.5f}, {7, 40, NAN}, {7, 41, -INFINITY}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g_fb_index = bad[i].j * 64 + bad[i].k;
        g_fb_value = bad[i].v;
        cr_assert_eq(load_mutated(m_fb_value, msg, sizeof msg), OSCAR_ERR_CORRUPT_FILE, "entry (%d, %d) = %g: %s",
                     bad[i].j, bad[i].k, (double)bad[i].v, msg);
        cr_assert(strstr(msg, "layers.1.fb_v") != NULL, "%s", msg);
    }
    /* A large but allowed weight above the diagonal loads. */
    g_fb_index = 5;
    g_fb_value = -16.0f;
    cr_assert_eq(load_mutated(m_fb_value, msg, sizeof msg), OSCAR_OK, "%s", msg);
}

/* Two writers saving to one path at once (a calibration retried while the
 * first still runs, two engines sharing a cache folder) and a reader: both
 * wrote PATH.tmp, so one writer's rename moved the other's half-written
 * file into place and its own rename then failed ("No such file or
 * directory (check disk space...)"): ~75 % of the saves failed and the
 * reader loaded truncated files. Each save now has a temporary file of its
 * own: every save succeeds and a reader sees one whole file or the other. */
typedef struct saver_arg {
    const oscar_params *p;
    const char *path;
    int fails;
    char why[512];
} saver_arg;
static void *saver(void *v) {
    saver_arg *a = v;
    for (int i = 0; i < 40; i++)
        if (oscar_params_save(a->p, a->path) != OSCAR_OK) {
            a->fails++;
            snprintf(a->why, sizeof a->why, "%s", oscar_last_error());
        }
    return NULL;
}
static volatile int g_stop;
static void *loader(void *v) {
    int *bad = v;
    while (!g_stop) {
        oscar_params *q = NULL;
        if (oscar_params_load(g_path_concurrent, &q) != OSCAR_OK) (*bad)++;
        oscar_params_destroy(q);
    }
    return NULL;
}
Test(params, concurrent_saves_to_one_path_are_each_whole, .init = mk_dir, .fini = rm_dir, .timeout = 120) {
    oscar_params *p[2];
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 2, 2, 1, 64, &p[0]), OSCAR_OK);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_INT2, 2, 2, 1, 64, &p[1]), OSCAR_OK);
    snprintf(g_path_concurrent, sizeof g_path_concurrent, "%s/same.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p[0], g_path_concurrent), OSCAR_OK, "%s", oscar_last_error());
    saver_arg a[2] = {{p[0], g_path_concurrent, 0, ""}, {p[1], g_path_concurrent, 0, ""}};
    int bad = 0;
    pthread_t t[3];
    g_stop = 0;
    cr_assert_eq(pthread_create(&t[2], NULL, loader, &bad), 0);
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, saver, &a[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    g_stop = 1;
    pthread_join(t[2], NULL);
    cr_expect_eq(a[0].fails + a[1].fails, 0, "%d and %d of 40 saves failed: %s%s", a[0].fails, a[1].fails, a[0].why,
                 a[1].why);
    cr_expect_eq(bad, 0, "the reader could not load %d of the files it saw", bad);
    /* No temporary file is left beside it. */
    DIR *dp = opendir(g_dir);
    cr_assert(dp);
    int files = 0;
    for (struct dirent *e; (e = readdir(dp));) files += e->d_name[0] != '.';
    closedir(dp);
    cr_expect_eq(files, 1, "%d files in the folder (temporary files left behind)", files);
    oscar_params_destroy(p[0]);
    oscar_params_destroy(p[1]);
}

/* A header for L layers of per-head rotations [nr, d, d] and a clip tensor,
 * with no tensor bytes behind it: the caller makes the file as long as the
 * header says (ftruncate: a sparse file) or claims it is. Returns the file's
 * declared size. */
static size_t write_big_header(int fd, int L, int nr, int d) {
    size_t cap = (size_t)L * 2 * 160 + 1024, off = 0, rot = (size_t)nr * d * d * 4;
    char *h = malloc(cap);
    int n = snprintf(h, cap, "{\"__metadata__\":{\"oscar\":\"{\\\"format_version\\\":1,\\\"num_layers\\\":%d,"
                     "\\\"num_q_heads\\\":%d,\\\"num_kv_heads\\\":%d,\\\"head_dim\\\":%d,\\\"per_head\\\":true,"
                     "\\\"method\\\":\\\"oscar2\\\"}\"}", L, nr, nr, d);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++, off += rot)
            n += snprintf(h + n, cap - (size_t)n, ",\"layers.%d.rot_%c\":{\"dtype\":\"F32\",\"shape\":[%d,%d,%d],"
                          "\"data_offsets\":[%zu,%zu]}", l, kv ? 'v' : 'k', nr, d, d, off, off + rot);
    n += snprintf(h + n, cap - (size_t)n, ",\"clip\":{\"dtype\":\"F32\",\"shape\":[%d,2],\"data_offsets\":[%zu,%zu]}}",
                  L, off, off + (size_t)L * 8);
    uint64_t hl = (uint64_t)n;
    cr_assert_eq(write(fd, &hl, 8), 8);
    cr_assert_eq(write(fd, h, (size_t)n), n);
    free(h);
    return 8 + (size_t)n + off + (size_t)L * 8;
}

/* A sparse file (holes read as zeros) declaring 128 MiB of rotations: refused
 * by name before anything is allocated from it. (Before: mapped, 128 MiB
 * allocated and copied, then refused as "not orthogonal"; a sparse file of
 * tens of GiB made the process allocate and touch that much.) */
Test(params, sparse_file_refused_before_allocating, .init = mk_dir, .fini = rm_dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/sparse.safetensors", g_dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    size_t size = write_big_header(fd, 32, 8, 256);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    close(fd);
    oscar_params *p = (oscar_params *)1;
    cr_assert_eq(oscar_params_load(path, &p), OSCAR_ERR_CORRUPT_FILE);
    cr_assert_null(p);
    cr_assert(strstr(oscar_last_error(), "sparse"), "%s", oscar_last_error());
}

/* A header declaring more tensor bytes than any model needs (1024 layers of
 * 64 per-head 256 x 256 rotations: 32 GiB) is refused by its size, whatever
 * the file claims to hold; and a file shorter than its size said when opened
 * (truncated while loading) is a read error, not a SIGBUS: the loader reads,
 * it does not map. */
Test(params, huge_and_truncated_files, .init = mk_dir, .fini = rm_dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/huge.safetensors", g_dir);
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    cr_assert(fd >= 0);
    size_t size = write_big_header(fd, 1024, 64, 256);
    oscar_params *p = (oscar_params *)1;
    cr_assert_eq(oscar_params_load_fd(fd, size, size, &p), OSCAR_ERR_CORRUPT_FILE);
    cr_assert_null(p);
    cr_assert(strstr(oscar_last_error(), "limit"), "%s", oscar_last_error());
    close(fd);
    /* a valid small file whose size is claimed one page beyond its end */
    oscar_params *v;
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_QUAROT2, 2, 8, 2, 128, &v), OSCAR_OK);
    snprintf(path, sizeof path, "%s/small.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(v, path), OSCAR_OK);
    oscar_params_destroy(v);
    fd = open(path, O_RDWR);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_eq(oscar_params_load_fd(fd, (size_t)st.st_size, UINT64_MAX, &p), OSCAR_OK);
    oscar_params_destroy(p);
    /* truncated mid-tensor after the size was taken */
    cr_assert_eq(ftruncate(fd, st.st_size / 2), 0);
    cr_assert_eq(oscar_params_load_fd(fd, (size_t)st.st_size, UINT64_MAX, &p), OSCAR_ERR_IO);
    cr_assert_null(p);
    cr_assert(strstr(oscar_last_error(), "truncated"), "%s", oscar_last_error());
    close(fd);
}
