/* oscar-inspect PARAMS.safetensors: what a parameter file holds.
 * Prints the metadata, then per layer the K/V clip ratios, the top
 * eigenvalues, the spectrum concentration (share of the top 8 eigenvalues in
 * the trace) and the orthogonality error max |R R^T - I| of each rotation.
 * Exits non-zero with the library's message on a bad file. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "oscar/oscar.h"
#include "tool_args.h"

/* Prints s with control characters (C0, DEL, UTF-8 C1) and bytes that are
 * not valid UTF-8 as \xNN: a path or a message may come from a hostile file
 * and must not drive the terminal. */
static void put_escaped(FILE *f, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u >= 0xf0 && *u <= 0xf4 ? 4 : *u >= 0xe0 && *u <= 0xef ? 3 : *u >= 0xc2 && *u <= 0xdf ? 2 : 1;
        int ok = n > 1 || (*u >= 0x20 && *u < 0x7f);
        for (int i = 1; i < n && ok; i++) ok = (u[i] & 0xc0) == 0x80;
        if (ok && n == 2 && u[0] == 0xc2 && u[1] < 0xa0) ok = 0; /* C1 controls U+0080..U+009F */
        if (ok) {
            fwrite(u, 1, (size_t)n, f);
            u += n;
        } else {
            fprintf(f, "\\x%02x", *u);
            u++;
        }
    }
}

static int is_identity(int d, const float *R) {
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++)
            if (R[i * d + j] != (i == j ? 1.0f : 0.0f)) return 0;
    return 1;
}

/* "top: a b c  conc8 x%" or "(none)" for built-in parameters. */
static void print_spectrum(int d, const double *lam) {
    if (!lam) {
        printf("eigenvalues (none: built-in)");
        return;
    }
    /* scaled by the largest |eigenvalue|: finite eigenvalues near DBL_MAX (a file may hold any finite
     * value) summed to inf and the share printed as nan% */
    double m = 0.0, tr = 0.0, top8 = 0.0;
    for (int i = 0; i < d; i++)
        if (fabs(lam[i]) > m) m = fabs(lam[i]);
    for (int i = 0; m > 0.0 && i < d; i++) {
        tr += lam[i] / m;
        if (i < 8) top8 += lam[i] / m;
    }
    printf("top eig %.4g %.4g %.4g %.4g  top-8 share %5.1f%%", lam[0], lam[1], lam[2], lam[3],
           tr > 0.0 ? 100.0 * top8 / tr : 0.0);
}

int main(int argc, char **argv) {
    tool_watch_stdout("oscar-inspect");
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s PARAMS.safetensors\n"
               "Prints the metadata, clips, spectra and orthogonality of a liboscar parameter file.\n"
               "Exit status: 0 ok, 2 bad input (not a parameter file, unreadable), 1 other failure.\n",
               argv[0]);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s PARAMS.safetensors\n", argv[0]);
        return 2;
    }
    oscar_params *p = NULL;
    oscar_status s = oscar_params_load(argv[1], &p);
    if (s != OSCAR_OK) { /* the file given is the input: anything wrong with it is bad input */
        fprintf(stderr, "oscar-inspect: %s: ", oscar_status_string(s));
        put_escaped(stderr, oscar_last_error()); /* names the path, maybe bytes of the file */
        fputc('\n', stderr);
        return s == OSCAR_ERR_OUT_OF_MEMORY || s == OSCAR_ERR_INTERNAL ? 1 : 2;
    }
    oscar_params_info info;
    if ((s = oscar_params_get_info(p, &info)) != OSCAR_OK) {
        fprintf(stderr, "oscar-inspect: %s\n", oscar_last_error());
        oscar_params_destroy(p);
        return 1;
    }
    fputs("file          ", stdout);
    put_escaped(stdout, argv[1]);
    fputc('\n', stdout);
    printf("method        %s\n", oscar_method_name(info.method));
    printf("shape         %d layers, %d query heads, %d KV heads, head_dim %d\n", info.num_layers, info.num_q_heads,
           info.num_kv_heads, info.head_dim);
    printf("rotations     %s\n", info.per_head ? "one per KV head" : "one per layer (K and V)");
    printf("calib tokens  %d\n", info.calib_tokens);
    fputs("model hash    ", stdout);
    put_escaped(stdout, info.model_hash[0] ? info.model_hash : "(none)"); /* the loader refuses controls; belt and braces */
    fputc('\n', stdout);
    const int d = info.head_dim, nrot = info.per_head ? info.num_kv_heads : 1;
    const float *F0 = NULL;
    oscar_params_feedback(p, 0, 0, OSCAR_K, &F0);
    printf("rounding      %s\n", F0 ? "error feedback (fb_k / fb_v weights, FORMAT.md 2.3)" : "nearest");
    double worst_all = 0.0;
    for (int l = 0; l < info.num_layers; l++) {
        float ck = 0.0f, cv = 0.0f;
        oscar_params_clip(p, l, OSCAR_K, &ck);
        oscar_params_clip(p, l, OSCAR_V, &cv);
        printf("layer %3d  clip K %.3f V %.3f", l, (double)ck, (double)cv);
        for (int h = 0; h < info.num_kv_heads; h++) { /* per KV head when the heads differ */
            float hk = ck, hv = cv;
            oscar_params_clip_head(p, l, h, OSCAR_K, &hk);
            oscar_params_clip_head(p, l, h, OSCAR_V, &hv);
            if (hk != ck || hv != cv) {
                printf("  (per KV head K/V:");
                for (int g = 0; g < info.num_kv_heads; g++) {
                    oscar_params_clip_head(p, l, g, OSCAR_K, &hk);
                    oscar_params_clip_head(p, l, g, OSCAR_V, &hv);
                    printf(" %.2f/%.2f", (double)hk, (double)hv);
                }
                printf(")");
                break;
            }
        }
        for (int h = 0; h < info.num_kv_heads; h++) /* code widths other than 2 (FORMAT.md 2.7) */
            for (int w = 0; w < 2; w++) {
                int b = 2;
                if (oscar_params_code_bits(p, l, h, (oscar_kv)w, &b) == OSCAR_OK && b != 2)
                    printf("  [KV head %d %c: %d-bit codes]", h, w ? 'V' : 'K', b);
            }
        printf("\n");
        for (int w = 0; w < 2; w++)
            for (int r = 0; r < nrot; r++) {
                const float *R = NULL;
                const double *lam = NULL;
                double oe = 0.0;
                if (oscar_params_rotation(p, l, r, (oscar_kv)w, &R) != OSCAR_OK ||
                    oscar_params_eigenvalues(p, l, r, (oscar_kv)w, &lam) != OSCAR_OK ||
                    oscar_params_orthogonality_error(p, l, r, (oscar_kv)w, &oe) != OSCAR_OK) {
                    fprintf(stderr, "oscar-inspect: %s\n", oscar_last_error());
                    oscar_params_destroy(p);
                    return 1;
                }
                if (oe > worst_all) worst_all = oe;
                printf("    %c", w ? 'V' : 'K');
                if (info.per_head) printf(" head %d", r);
                printf("  |RR^T-I| %.2e%s  ", oe, is_identity(d, R) ? " (identity)" : "");
                print_spectrum(d, lam);
                const float *F = NULL;
                oscar_params_feedback(p, l, r, (oscar_kv)w, &F);
                if (F) {
                    double mx = 0.0;
                    for (int i = 0; i < d * d; i++) mx = fabs(F[i]) > mx ? fabs(F[i]) : mx;
                    printf("  fb max %.3f%s", mx, mx == 0.0 ? " (nearest)" : "");
                }
                printf("\n");
            }
    }
    printf("max orthogonality error over all rotations: %.3e\n", worst_all);
    oscar_params_destroy(p);
    return 0;
}
