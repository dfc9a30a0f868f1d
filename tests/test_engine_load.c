/* Engine loading: hostile safetensors files and unsupported configs are
 * refused with a clear message (never a crash), and small synthetic
 * Llama / Qwen2 / Qwen3 checkpoints written here load and run. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "oscar_calibrate.h" /* ocal_run: the calibration oscar-calibrate runs */
#include "run_cmd.h"

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/oscar_engine_test_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp failed");
}

static void remove_dir(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

static unsigned g_seed;
static float frand(void) { return (float)rand_r(&g_seed) / (float)RAND_MAX * 2.0f - 1.0f; }

/* A tensor to write: name, dims, fp32 values stored as dtype. */
typedef struct wt {
    char name[96];
    int ndim;
    int64_t shape[2];
    const char *dtype; /* "F32" or "BF16" */
} wt;

static int64_t wt_numel(const wt *t) { return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }

/* Writes a safetensors file of random tensors (values ~ scale). */
static void write_st(const char *path, const wt *ts, int nt, float scale)
{
    char *hdr = malloc(65536);
    size_t hl = 0;
    int64_t off = 0;
    hl += (size_t)snprintf(hdr + hl, 65536 - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < nt; i++) {
        int64_t bytes = wt_numel(&ts[i]) * (strcmp(ts[i].dtype, "F32") ? 2 : 4);
        if (ts[i].ndim == 1)
            hl += (size_t)snprintf(hdr + hl, 65536 - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],"
                                   "\"data_offsets\":[%lld,%lld]}", ts[i].name, ts[i].dtype,
                                   (long long)ts[i].shape[0], (long long)off, (long long)(off + bytes));
        else
            hl += (size_t)snprintf(hdr + hl, 65536 - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                   "\"data_offsets\":[%lld,%lld]}", ts[i].name, ts[i].dtype,
                                   (long long)ts[i].shape[0], (long long)ts[i].shape[1], (long long)off,
                                   (long long)(off + bytes));
        off += bytes;
    }
    hl += (size_t)snprintf(hdr + hl, 65536 - hl, "}");
    cr_assert(hl < 65000);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, hl, f);
    for (int i = 0; i < nt; i++) {
        int is_norm = strstr(ts[i].name, "norm") != NULL;
        for (int64_t e = 0; e < wt_numel(&ts[i]); e++) {
            float v = is_norm ? 1.0f + 0.1f * frand() : scale * frand();
            uint32_t u;
            memcpy(&u, &v, 4);
            if (!strcmp(ts[i].dtype, "F32")) {
                fwrite(&u, 4, 1, f);
            } else {
                uint16_t b = (uint16_t)(u >> 16);
                fwrite(&b, 2, 1, f);
            }
        }
    }
    fclose(f);
    free(hdr);
}

typedef struct tiny_cfg {
    const char *type;
    int layers, hidden, heads, kv_heads, head_dim, inter, vocab, tie, bias, qk_norm;
} tiny_cfg;

/* config.json + model.safetensors of a random tiny model in g_dir. */
static void write_model(const tiny_cfg *c, const char *extra_json)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{\"model_type\":\"%s\",\"num_hidden_layers\":%d,\"hidden_size\":%d,\"num_attention_heads\":%d,"
               "\"num_key_value_heads\":%d,\"head_dim\":%d,\"intermediate_size\":%d,\"vocab_size\":%d,"
               "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"tie_word_embeddings\":%s,\"hidden_act\":\"silu\"%s}",
            c->type, c->layers, c->hidden, c->heads, c->kv_heads, c->head_dim, c->inter, c->vocab,
            c->tie ? "true" : "false", extra_json ? extra_json : "");
    fclose(f);
    wt ts[128];
    int n = 0;
#define ADD(nm, d0, d1)                                                                            \
    do {                                                                                           \
        snprintf(ts[n].name, sizeof ts[n].name, "%s", nm);                                         \
        ts[n].ndim = (d1) ? 2 : 1;                                                                 \
        ts[n].shape[0] = d0;                                                                       \
        ts[n].shape[1] = d1;                                                                       \
        ts[n].dtype = (n % 2) ? "BF16" : "F32";                                                    \
        n++;                                                                                       \
    } while (0)
    ADD("model.embed_tokens.weight", c->vocab, c->hidden);
    ADD("model.norm.weight", c->hidden, 0);
    if (!c->tie) ADD("lm_head.weight", c->vocab, c->hidden);
    int qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim;
    for (int L = 0; L < c->layers; L++) {
        char nm[96];
#define LADD(suffix, d0, d1)                                                                       \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", L, suffix);                                  \
        ADD(nm, d0, d1);                                                                           \
    } while (0)
        LADD("input_layernorm.weight", c->hidden, 0);
        LADD("post_attention_layernorm.weight", c->hidden, 0);
        LADD("self_attn.q_proj.weight", qd, c->hidden);
        LADD("self_attn.k_proj.weight", kvd, c->hidden);
        LADD("self_attn.v_proj.weight", kvd, c->hidden);
        LADD("self_attn.o_proj.weight", c->hidden, qd);
        if (c->bias) {
            LADD("self_attn.q_proj.bias", qd, 0);
            LADD("self_attn.k_proj.bias", kvd, 0);
            LADD("self_attn.v_proj.bias", kvd, 0);
        }
        if (c->qk_norm) {
            LADD("self_attn.q_norm.weight", c->head_dim, 0);
            LADD("self_attn.k_norm.weight", c->head_dim, 0);
        }
        LADD("mlp.gate_proj.weight", c->inter, c->hidden);
        LADD("mlp.up_proj.weight", c->inter, c->hidden);
        LADD("mlp.down_proj.weight", c->hidden, c->inter);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
    write_st(path, ts, n, 0.2f);
}

static void write_file(const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite(data, 1, len, f);
    fclose(f);
}

static void *read_file(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    void *p = malloc(*len);
    cr_assert_eq(fread(p, 1, *len, f), *len);
    fclose(f);
    return p;
}

static const tiny_cfg k_qwen3 = {"qwen3", 2, 64, 4, 2, 32, 96, 50, 1, 0, 1};
static const tiny_cfg k_qwen2 = {"qwen2", 2, 64, 4, 2, 16, 96, 50, 0, 1, 0};
static const tiny_cfg k_llama = {"llama", 3, 48, 6, 3, 8, 80, 40, 0, 0, 0};

static void run_model(const tiny_cfg *tc)
{
    char path[512];
    snprintf(path, sizeof path, "%s", g_dir);
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(path, &m), OSCAR_OK, "%s: %s", tc->type, oe_last_error());
    const oe_config *c = oe_model_config(m);
    cr_expect_eq(c->num_layers, tc->layers);
    cr_expect_eq(c->qkv_bias, tc->bias);
    cr_expect_eq(c->qk_norm, tc->qk_norm);
    cr_expect_eq(c->tie_word_embeddings, tc->tie);
    int n = 37; /* not a multiple of the attention block */
    uint32_t tok[37];
    for (int i = 0; i < n; i++) tok[i] = (uint32_t)(rand_r(&g_seed) % (unsigned)tc->vocab);
    float *logits = malloc((size_t)n * tc->vocab * sizeof(float));
    for (int i = 0; i < n * tc->vocab; i++) logits[i] = NAN;
    oe_ctx *ctx = NULL;
    cr_assert_eq(oe_ctx_create(m, n, &ctx), OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(oe_forward(ctx, tok, n, NULL, logits), OSCAR_OK, "%s", oe_last_error());
    for (int i = 0; i < n * tc->vocab; i++) cr_assert(isfinite(logits[i]), "%s: logit %d not finite", tc->type, i);
    /* Causality: changing the last token leaves earlier rows unchanged. */
    float *again = malloc((size_t)n * tc->vocab * sizeof(float));
    tok[n - 1] = (tok[n - 1] + 1) % (uint32_t)tc->vocab;
    cr_assert_eq(oe_forward(ctx, tok, n, NULL, again), OSCAR_OK);
    for (int i = 0; i < (n - 1) * tc->vocab; i++)
        cr_assert(fabsf(again[i] - logits[i]) <= 1e-5f * (1.0f + fabsf(logits[i])),
                  "%s: row %d changed when only the last token did", tc->type, i / tc->vocab);
    int diff = 0;
    for (int i = (n - 1) * tc->vocab; i < n * tc->vocab; i++) diff |= again[i] != logits[i];
    cr_expect(diff, "%s: last row did not change with the last token", tc->type);
    /* Window too long and an out-of-vocabulary id are refused. */
    cr_expect_eq(oe_forward(ctx, tok, n + 1, NULL, logits), OSCAR_ERR_TOO_LONG);
    tok[3] = (uint32_t)tc->vocab;
    cr_expect_eq(oe_forward(ctx, tok, n, NULL, logits), OSCAR_ERR_INVALID_ARGUMENT);
    cr_expect(strstr(oe_last_error(), "vocabulary"), "message: %s", oe_last_error());
    free(again);
    free(logits);
    oe_ctx_free(ctx);
    oe_model_free(m);
}

static void seed(void)
{
    g_seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    printf("seed %u\n", g_seed);
}

/* Mistral: the Llama layout; its sliding_window bounds the windows the engine
 * may run with full causal attention (null: no bound). */
Test(engine_load, mistral_runs_within_its_span)
{
    seed();
    make_dir();
    tiny_cfg mi = k_llama;
    mi.type = "mistral";
    write_model(&mi, ",\"sliding_window\":null");
    run_model(&mi);
    oe_model *m = NULL;
    oe_ctx *ctx = NULL;
    write_model(&mi, ",\"sliding_window\":12");
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(oe_model_config(m)->sliding_window, 12);
    cr_expect_eq(oe_ctx_create(m, 12, &ctx), OSCAR_OK, "%s", oe_last_error());
    oe_ctx_free(ctx);
    ctx = NULL;
    cr_expect_eq(oe_ctx_create(m, 13, &ctx), OSCAR_ERR_UNSUPPORTED);
    cr_expect_null(ctx);
    cr_expect(strstr(oe_last_error(), "sliding_window 12"), "message: %s", oe_last_error());
    oe_model_free(m);
    m = NULL;
    write_model(&mi, ",\"sliding_window\":-4");
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE);
    cr_expect(strstr(oe_last_error(), "sliding_window"), "message: %s", oe_last_error());
    remove_dir();
}

/* transformers builds Mistral's projections without biases whatever attention_bias says; the engine
 * took attention_bias true as q/k/v biases (a checkpoint without them failed to load, one with them
 * ran another model than transformers). Now it loads as transformers does, and bias tensors in such
 * a checkpoint are refused, named. */
Test(engine_load, mistral_has_no_biases_whatever_attention_bias_says)
{
    seed();
    make_dir();
    tiny_cfg mi = k_llama;
    mi.type = "mistral";
    write_model(&mi, ",\"attention_bias\":true");
    run_model(&mi); /* expects qkv_bias 0 */
    mi.bias = 1;
    write_model(&mi, ",\"attention_bias\":true");
    oe_model *m = NULL;
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE);
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "q_proj.bias") && strstr(oe_last_error(), "Mistral"), "message: %s",
              oe_last_error());
    remove_dir();
}

Test(engine_load, synthetic_qwen3_qwen2_llama_run)
{
    seed();
    const tiny_cfg *cs[3] = {&k_qwen3, &k_qwen2, &k_llama};
    for (int i = 0; i < 3; i++) {
        make_dir();
        write_model(cs[i], NULL);
        run_model(cs[i]);
        remove_dir();
    }
}

/* Calibrates m on ntok tokens as oscar-calibrate does (ocal_run), in windows of 128 with sink 8 and
 * recent 16 (the windows the clips are fitted for), clips fitted for `group`. */
static oscar_params *calibrate_small(oe_model *m, const uint32_t *tok, int64_t ntok, int group, oscar_calib **c)
{
    ocal_options o;
    ocal_options_default(&o);
    o.window = 128;
    o.max_tokens = ntok;
    o.sink = 8;
    o.recent = 16;
    o.group = group;
    oscar_params *p = NULL;
    ocal_stats st;
    char err[1024];
    cr_assert_eq(ocal_run(m, tok, ntok, &o, c, &p, &st, err, sizeof err), OSCAR_OK, "group %d: %s", group, err);
    cr_assert_eq(st.windows, ntok / 128);
    return p;
}

/* Head dims that are not powers of two (docs/FORMAT.md 3.5): a Phi-3-shaped Llama (head_dim 96) and a
 * Qwen3 with Phi-2's head_dim 80 load, run, and calibrate end to end as oscar-calibrate does (both
 * passes, finalize with the A (x) S spreading matrix): orthogonal per-head rotations, the format's
 * default group, a file round trip, and a plan on the CPU backend. */
Test(engine_load, head_dims_96_and_80_run_and_calibrate, .timeout = 300)
{
    seed();
    const tiny_cfg cs[2] = {{"llama", 2, 192, 4, 2, 96, 128, 40, 0, 0, 0}, {"qwen3", 2, 160, 4, 2, 80, 96, 50, 1, 0, 1}};
    for (int i = 0; i < 2; i++) {
        const int d = cs[i].head_dim;
        make_dir();
        write_model(&cs[i], NULL);
        run_model(&cs[i]);
        oe_model *m = NULL;
        cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
        int group = 0;
        char err[1024];
        cr_assert_eq(ocal_check_shape(d, &group, err, sizeof err), OSCAR_OK, "%s", err);
        cr_assert_eq(group, d, "default group of head_dim %d", d);
        const int64_t ntok = 3 * 128;
        uint32_t *tok = malloc((size_t)ntok * sizeof *tok);
        for (int64_t t = 0; t < ntok; t++) tok[t] = (uint32_t)(rand_r(&g_seed) % (unsigned)cs[i].vocab);
        oscar_calib *c = NULL;
        oscar_params *p = calibrate_small(m, tok, ntok, group, &c);
        oscar_params_info info;
        cr_assert_eq(oscar_params_get_info(p, &info), OSCAR_OK);
        cr_assert_eq(info.head_dim, d);
        for (int l = 0; l < cs[i].layers; l++)
            for (int h = 0; h < cs[i].kv_heads; h++)
                for (int w = 0; w < 2; w++) {
                    const float *R;
                    cr_assert_eq(oscar_params_rotation(p, l, h, (oscar_kv)w, &R), OSCAR_OK);
                    double worst = 0;
                    for (int a = 0; a < d; a++)
                        for (int b = 0; b < d; b++) {
                            double s = 0;
                            for (int k = 0; k < d; k++) s += (double)R[a * d + k] * R[b * d + k];
                            worst = fmax(worst, fabs(s - (a == b)));
                        }
                    cr_assert_lt(worst, 1e-5, "d %d layer %d head %d: max |R R^T - I| = %g", d, l, h, worst);
                }
        char path[512];
        snprintf(path, sizeof path, "%s/p.oscar.safetensors", g_dir);
        cr_assert_eq(oscar_params_save(p, path), OSCAR_OK, "%s", oscar_last_error());
        oscar_params *q = NULL;
        cr_assert_eq(oscar_params_load(path, &q), OSCAR_OK, "%s", oscar_last_error());
        oscar_runtime *rt = NULL;
        oscar_runtime_options ro;
        oscar_runtime_options_default(&ro);
        ro.backend = "cpu";
        cr_assert_eq(oscar_runtime_create(&ro, &rt), OSCAR_OK, "%s", oscar_last_error());
        oscar_layout_desc l;
        oscar_layout_default(&l);
        l.head_dim = d, l.group = group, l.num_q_heads = cs[i].heads, l.num_kv_heads = cs[i].kv_heads;
        l.max_seq_len = 1024;
        l.sink = 8, l.recent = 16; /* the windows the clips were fitted for (calibrate_small) */
        oscar_plan *plan = NULL;
        cr_assert_eq(oscar_plan_create(rt, &l, q, &plan), OSCAR_OK, "%s", oscar_last_error());
        oscar_plan_destroy(plan);
        oscar_runtime_destroy(rt);
        oscar_params_destroy(q);
        oscar_params_destroy(p);
        oscar_calib_destroy(c);
        free(tok);
        oe_model_free(m);
        remove_dir();
    }
}

#ifdef OSCAR_BIN_DIR
/* The "all" line of layer 0 in oscar-copy-probe's table (its numbers), or "" when there is none. */
static void probe_line(const char *out, char *line, size_t n)
{
    const char *at = strstr(out, "    0   all |");
    size_t k = 0;
    if (at)
        while (at[k] && at[k] != '\n' && k + 1 < n) k++;
    snprintf(line, n, "%.*s", (int)k, at ? at : "");
}

/* oscar-copy-probe quantized the 2-bit rows with group 0 (the whole head) and printed the bits of the
 * head_dim's default group: at head_dim 256 it measured group-256 rows with clips fitted for group
 * 128 and reported 2.250 bits for them. Now it quantizes at the group it reports: the default (128
 * here), or --group G, refused when the parameters' clips were fitted for another group. */
Test(engine_load, copy_probe_quantizes_at_the_group_it_reports, .timeout = 600)
{
    seed();
    make_dir();
    const tiny_cfg c = {"qwen3", 1, 64, 2, 1, 256, 96, 50, 1, 0, 1};
    write_model(&c, NULL);
    const int ntok = 384;
    uint32_t tok[384];
    for (int i = 0; i < ntok; i++) tok[i] = (uint32_t)(rand_r(&g_seed) % (unsigned)c.vocab);
    write_file("t.tokens", tok, sizeof tok);
    oscar_params *p = NULL;
    char pb[512], pc[512];
    snprintf(pb, sizeof pb, "%s/builtin.safetensors", g_dir);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 1, 2, 1, 256, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_save(p, pb), OSCAR_OK, "%s", oscar_last_error());
    oscar_params_destroy(p);
    p = NULL;
    char out[16384], line[3][512];
    const char *args = "--trials 1 --context 200 --sink 16 --recent 32";
    const char *groups[3] = {"", "--group 128", "--group 256"};
    const char *heads[3] = {"group 128, 2.250 bits/elt", "group 128, 2.250 bits/elt", "group 256, 2.125 bits/elt"};
    for (int i = 0; i < 3; i++) {
        int rc = run(out, sizeof out, 300, OSCAR_BIN_DIR "/oscar-copy-probe %s --tokens %s/t.tokens --params %s %s %s",
                     g_dir, g_dir, pb, args, groups[i]);
        cr_assert_eq(rc, 0, "'%s': exit %d: %s", groups[i], rc, out);
        cr_expect(strstr(out, heads[i]), "'%s' should report %s: %s", groups[i], heads[i], out);
        probe_line(out, line[i], sizeof line[i]);
        cr_assert(line[i][0], "'%s': no table: %s", groups[i], out);
    }
    cr_expect_str_eq(line[0], line[1], "the default group of head_dim 256 is 128");
    cr_expect_str_neq(line[0], line[2], "group 256 measured the same errors as group 128");
    /* Parameters calibrated for group 256 serve --group 256 only. */
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    oscar_calib *cal = NULL;
    p = calibrate_small(m, tok, ntok, 256, &cal);
    snprintf(pc, sizeof pc, "%s/g256.safetensors", g_dir);
    cr_assert_eq(oscar_params_save(p, pc), OSCAR_OK, "%s", oscar_last_error());
    int rc = run(out, sizeof out, 300, OSCAR_BIN_DIR "/oscar-copy-probe %s --tokens %s/t.tokens --params %s %s", g_dir,
                 g_dir, pc, args);
    cr_expect_eq(rc, 2, "clips of group 256 at group 128: exit %d: %s", rc, out);
    cr_expect(strstr(out, "fitted for group 256") && strstr(out, "--group"), "message: %s", out);
    rc = run(out, sizeof out, 300, OSCAR_BIN_DIR "/oscar-copy-probe %s --tokens %s/t.tokens --params %s %s --group 256",
             g_dir, g_dir, pc, args);
    cr_expect_eq(rc, 0, "--group 256: exit %d: %s", rc, out);
    cr_expect(strstr(out, "group 256, 2.125 bits/elt"), "%s", out);
    rc = run(out, sizeof out, 60, OSCAR_BIN_DIR "/oscar-copy-probe %s --tokens %s/t.tokens --params %s %s --group 100",
             g_dir, g_dir, pb, args);
    cr_expect_eq(rc, 2, "--group 100: exit %d: %s", rc, out);
    cr_expect(strstr(out, "--group 100"), "message: %s", out);
    oscar_params_destroy(p);
    oscar_calib_destroy(cal);
    oe_model_free(m);
    remove_dir();
}

/* A parameter file with 3-bit head-tensors (FORMAT.md §2.7): oscar-copy-probe said "2-bit" and printed the
 * 2-bit bits per element for it (oscar-eval counted the bits but called it "uniform 2-bit"). Both now name
 * the code widths, and count the 1-bit plane: one of the 2 head-tensors of a 1-layer, 1-KV-head model at
 * group 128 is 2.25 + 1/2 bits per element. */
Test(engine_load, tools_name_three_bit_head_tensors, .timeout = 600)
{
    seed();
    make_dir();
    const tiny_cfg c = {"qwen3", 1, 64, 2, 1, 256, 96, 50, 1, 0, 1};
    write_model(&c, NULL);
    uint32_t tok[384];
    for (int i = 0; i < 384; i++) tok[i] = (uint32_t)(rand_r(&g_seed) % (unsigned)c.vocab);
    write_file("t.tokens", tok, sizeof tok);
    oscar_params *p = NULL;
    char pw[512], out[16384], path[600];
    snprintf(pw, sizeof pw, "%s/wide.safetensors", g_dir);
    cr_assert_eq(oscar_params_create_builtin(OSCAR_METHOD_OSCAR2, 1, 2, 1, 256, &p), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 0, 0, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_save(p, pw), OSCAR_OK, "%s", oscar_last_error());
    oscar_params_destroy(p);
    const char *args = "--context 200 --sink 16 --recent 32";
    int rc = run(out, sizeof out, 300, OSCAR_BIN_DIR "/oscar-copy-probe %s --tokens %s/t.tokens --params %s %s "
                 "--trials 1", g_dir, g_dir, pw, args);
    cr_assert_eq(rc, 0, "oscar-copy-probe: exit %d: %s", rc, out);
    cr_expect(strstr(out, "oscar2 2/3-bit: 1 of 2 head-tensors in 3 bits, group 128, 2.750 bits/elt"), "%s", out);
    rc = run(out, sizeof out, 300, OSCAR_BIN_DIR "/oscar-eval %s --tokens %s/t.tokens --params %s %s --methods "
             "bf16,oscar2 --max-tokens 200 --retrieval-trials 0 --allow-other-model --out %s/r.json --md %s/r.md", g_dir,
             g_dir, pw, args, g_dir, g_dir);
    cr_assert_eq(rc, 0, "oscar-eval: exit %d: %s", rc, out);
    snprintf(path, sizeof path, "%s/r.md", g_dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    size_t k = fread(out, 1, sizeof out - 1, f);
    out[k] = '\0';
    fclose(f);
    cr_expect(strstr(out, "| oscar2 | 16/32 | 2.750 |"), "%s", out);
    cr_expect(strstr(out, "store 1 of 2 head-tensors in 3 bits"), "%s", out);
    snprintf(path, sizeof path, "%s/r.json", g_dir);
    f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    k = fread(out, 1, sizeof out - 1, f);
    out[k] = '\0';
    fclose(f);
    cr_expect(strstr(out, "2/3-bit: 1 of 2 head-tensors in 3 bits"), "the note: %s", out);
    cr_expect(strstr(out, "\"three_bit_head_tensors\": 1"), "%s", out);
    remove_dir();
}
#endif

/* config.json of a 1-layer Llama (2 heads, head_dim 32) ending in `tail` (its members after the shape, each with
 * a leading comma) at the test folder; the config only. */
static oscar_status llama_config(const char *tail, oe_config *c)
{
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":64,\"num_attention_heads\":2,"
               "\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":96,\"vocab_size\":50%s}",
            tail);
    fclose(f);
    return oe_config_load(path, c);
}

/* That Llama with `rope` (a JSON member or "") and a rope_theta. */
static oscar_status rope_config(const char *rope, oe_config *c)
{
    char tail[4096];
    snprintf(tail, sizeof tail, ",\"max_position_embeddings\":131072,\"rope_theta\":%s%s",
             strstr(rope, "yarn") ? "1000000.0" : "500000.0", rope);
    return llama_config(tail, c);
}

/* RoPE scaling as transformers computes it (modeling_rope_utils): Llama 3.1's llama3 (frequencies of
 * wavelength under old_ctx / high_freq_factor kept, over old_ctx / low_freq_factor divided by factor,
 * blended between: head_dim 32 at theta 5e5 has all three), YaRN (a ramp from extrapolated to
 * interpolated frequencies between the correction dims, cos/sin scaled by 0.1 ln(factor) + 1) and
 * linear, against the formulas in double; they were refused before. A forward pass runs with each, and
 * its logits differ from the unscaled model's. */
Test(engine_load, rope_scaling_llama3_yarn_linear)
{
    seed();
    make_dir();
    const int d = 32, h2 = d / 2;
    const double two_pi = 6.283185307179586;
    oe_config c;
    float inv[16], af = 0.0f;
    cr_assert_eq(rope_config(",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
                             "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}", &c),
                 OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(c.rope.type, OE_ROPE_LLAMA3);
    oe_rope_inv_freq(&c, inv, &af);
    cr_expect_eq(af, 1.0f);
    int regimes[3] = {0, 0, 0};
    for (int i = 0; i < h2; i++) {
        const double f0 = 1.0 / pow(500000.0, 2.0 * i / d), wl = two_pi / f0;
        double want = f0;
        if (wl > 8192.0) {
            want = f0 / 8.0, regimes[2]++;
        } else if (wl >= 2048.0) {
            const double sm = (8192.0 / wl - 1.0) / 3.0;
            want = (1.0 - sm) * f0 / 8.0 + sm * f0, regimes[1]++;
        } else {
            regimes[0]++;
        }
        cr_expect(fabs(inv[i] - want) <= 2e-6 * want, "llama3 inv_freq[%d] %.9g, want %.9g", i, inv[i], want);
    }
    cr_assert(regimes[0] && regimes[1] && regimes[2], "the case must hold every regime");
    /* YaRN as Qwen configs write it (legacy "type"): factor 4 over a 8192-token pretraining context */
    cr_assert_eq(rope_config(",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4.0,"
                             "\"original_max_position_embeddings\":8192}", &c),
                 OSCAR_OK, "%s", oe_last_error());
    cr_assert_eq(c.rope.type, OE_ROPE_YARN);
    oe_rope_inv_freq(&c, inv, &af);
    cr_expect(fabs(af - (0.1 * log(4.0) + 1.0)) < 1e-6, "yarn attention factor %g", af);
    const double lo = floor(d * log(8192.0 / (32.0 * two_pi)) / (2.0 * log(1e6))),
                 hi = ceil(d * log(8192.0 / two_pi) / (2.0 * log(1e6)));
    cr_assert(lo > 0 && hi < h2 - 1, "the ramp must lie inside the dims (%g .. %g)", lo, hi);
    for (int i = 0; i < h2; i++) {
        const double pos = pow(1e6, 2.0 * i / d), ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0);
        const double want = ramp / (4.0 * pos) + (1.0 - ramp) / pos;
        cr_expect(fabs(inv[i] - want) <= 2e-6 * want, "yarn inv_freq[%d] %.9g, want %.9g", i, inv[i], want);
    }
    cr_assert_eq(rope_config(",\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2.0,\"rope_theta\":500000.0}",
                             &c),
                 OSCAR_OK, "%s", oe_last_error());
    oe_rope_inv_freq(&c, inv, &af);
    for (int i = 0; i < h2; i++) {
        const double want = 0.5 / pow(500000.0, 2.0 * i / d);
        cr_expect(fabs(inv[i] - want) <= 2e-6 * want, "linear inv_freq[%d] %.9g, want %.9g", i, inv[i], want);
    }
    /* What the formulas cannot run on: refused, naming it. */
    static const struct {
        const char *rope, *says;
    } bad[] = {
        {",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
         "\"original_max_position_embeddings\":8192}", "high_freq_factor"},
        {",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":2.0,\"high_freq_factor\":2.0}",
         "different"},
        {",\"rope_scaling\":{\"rope_type\":\"linear\"}", "needs a factor"},
        {",\"rope_scaling\":{\"rope_type\":\"longrope\",\"factor\":2.0}", "longrope"},
        {",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2.0},\"rope_parameters\":{\"rope_type\":\"yarn\","
         "\"factor\":2.0,\"rope_theta\":500000.0}", "different rope types"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":-4.0}", "factor"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        cr_expect_neq(rope_config(bad[b].rope, &c), OSCAR_OK, "%s loaded", bad[b].rope);
        cr_expect(strstr(oe_last_error(), bad[b].says), "%s: %s", bad[b].rope, oe_last_error());
    }
    /* Forward passes: each scaling runs, and changes the logits of the unscaled model (head_dim 8 at
     * theta 1e4: wavelengths 6 / 63 / 628 / 6283, the last blended by llama3; YaRN ramps dims 0 .. 2). */
    static const char *const scaled[] = {
        "",
        ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192}",
        ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":64}",
        ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4.0}"};
    const int n = 24;
    uint32_t tok[24];
    for (int i = 0; i < n; i++) tok[i] = (uint32_t)(rand_r(&g_seed) % (unsigned)k_llama.vocab);
    float *base = malloc((size_t)n * k_llama.vocab * sizeof(float)), *lg = malloc((size_t)n * k_llama.vocab * 4);
    cr_assert(base && lg);
    const unsigned weights_seed = g_seed;
    for (size_t r = 0; r < sizeof scaled / sizeof scaled[0]; r++) {
        g_seed = weights_seed; /* the same weights for every config */
        write_model(&k_llama, scaled[r]);
        oe_model *m = NULL;
        cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s: %s", scaled[r], oe_last_error());
        oe_ctx *ctx = NULL;
        cr_assert_eq(oe_ctx_create(m, n, &ctx), OSCAR_OK, "%s", oe_last_error());
        cr_assert_eq(oe_forward(ctx, tok, n, NULL, r ? lg : base), OSCAR_OK, "%s", oe_last_error());
        if (r) {
            double diff = 0.0;
            for (int i = 0; i < n * k_llama.vocab; i++) {
                cr_assert(isfinite(lg[i]));
                diff = fmax(diff, fabs((double)lg[i] - base[i]));
            }
            cr_expect(diff > 1e-4, "%s: logits equal to the unscaled model's (max diff %g)", scaled[r], diff);
        }
        oe_ctx_free(ctx);
        oe_model_free(m);
    }
    free(base);
    free(lg);
    remove_dir();
}

Test(engine_load, unsupported_configs_refused)
{
    seed();
    make_dir();
    oe_model *m = (oe_model *)(uintptr_t)1;
    tiny_cfg bad = k_llama;
    bad.type = "gemma2";
    write_model(&bad, NULL);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_UNSUPPORTED);
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "model_type 'gemma2'") && strstr(oe_last_error(), "liboscar.hf"),
              "message: %s", oe_last_error());
    write_model(&k_llama, ",\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":4.0}");
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_UNSUPPORTED);
    cr_expect(strstr(oe_last_error(), "dynamic") && strstr(oe_last_error(), "llama3"), "message: %s",
              oe_last_error());
    write_model(&k_llama, ",\"hidden_act\":\"gelu\"");
    /* duplicate key -> JSON refused */
    cr_expect_neq(oe_model_load(g_dir, &m), OSCAR_OK);
    /* Top-level rope_theta 10000 against rope_parameters' 500000: transformers runs the latter; the
     * engine ran the former without a word. A contradiction is refused; agreeing values load. */
    write_model(&k_llama, ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":500000.0}");
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE, "%s", oe_last_error());
    cr_expect(strstr(oe_last_error(), "disagree"), "message: %s", oe_last_error());
    write_model(&k_llama, ",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":10000.0}");
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(oe_model_config(m)->rope_theta, 10000.0);
    oe_model_free(m);
    /* Weights not matching the config: q_proj has the wrong shape. */
    tiny_cfg wrong = k_qwen3;
    write_model(&wrong, NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"model_type\":\"qwen3\",\"num_hidden_layers\":2,\"hidden_size\":64,\"num_attention_heads\":2,"
               "\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":96,\"vocab_size\":50,\"tie_word_embeddings\":true}");
    fclose(f);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_SHAPE_MISMATCH, "%s", oe_last_error());
    cr_expect(strstr(oe_last_error(), "q_proj"), "message: %s", oe_last_error());
    /* Missing config. */
    unlink(path);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_IO);
    remove_dir();
}

/* config.json values the engine cannot read (a number in quotes, a wrong type, an out-of-range
 * integer) were replaced by the default without a word: "rope_theta": "1000000.0" ran tiny-qwen3 at
 * theta 10000 (perplexity 13.1 instead of 8.8). partial_rotary_factor, which transformers honours,
 * was ignored. Each is refused naming the key; null stays "use the default". */
static void patch_config(const char *from, const char *to)
{
    size_t len = 0;
    char *raw = read_file("config.json", &len), txt[4096], out[4096];
    cr_assert(len < sizeof txt);
    memcpy(txt, raw, len); /* read_file's bytes are not a C string */
    txt[len] = '\0';
    free(raw);
    char *at = strstr(txt, from);
    cr_assert(at && len + strlen(to) < sizeof out, "config.json lacks %s", from);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - txt), txt, to, at + strlen(from));
    write_file("config.json", out, strlen(out));
}

Test(engine_load, config_values_of_the_wrong_type_are_refused)
{
    seed();
    make_dir();
    static const struct {
        const char *from, *to, *named;
        oscar_status want;
    } cases[] = {
        {"\"rope_theta\":10000.0", "\"rope_theta\":\"500000.0\"", "rope_theta is a string", OSCAR_ERR_CORRUPT_FILE},
        {"\"rope_theta\":10000.0", "\"rope_theta\":-1", "rope_theta", OSCAR_ERR_CORRUPT_FILE},
        {"\"rope_theta\":10000.0", "\"rope_parameters\":{\"rope_theta\":[1]}", "rope_parameters.rope_theta",
         OSCAR_ERR_CORRUPT_FILE},
        {"\"rms_norm_eps\":1e-6", "\"rms_norm_eps\":\"1e-5\"", "rms_norm_eps is a string", OSCAR_ERR_CORRUPT_FILE},
        {"\"num_key_value_heads\":3", "\"num_key_value_heads\":0", "num_key_value_heads is 0", OSCAR_ERR_CORRUPT_FILE},
        {"\"num_key_value_heads\":3", "\"num_key_value_heads\":\"3\"", "num_key_value_heads is a string",
         OSCAR_ERR_CORRUPT_FILE},
        {"\"head_dim\":8", "\"head_dim\":8.0", "head_dim is a real number", OSCAR_ERR_CORRUPT_FILE},
        {"\"head_dim\":8", "\"head_dim\":8,\"max_position_embeddings\":-4096", "max_position_embeddings is -4096",
         OSCAR_ERR_CORRUPT_FILE},
        {"\"tie_word_embeddings\":false", "\"tie_word_embeddings\":\"false\"", "tie_word_embeddings is a string",
         OSCAR_ERR_CORRUPT_FILE},
        {"\"head_dim\":8", "\"head_dim\":8,\"attention_bias\":1", "attention_bias is a number", OSCAR_ERR_CORRUPT_FILE},
        {"\"head_dim\":8", "\"head_dim\":8,\"partial_rotary_factor\":0.5", "partial_rotary_factor 0.5",
         OSCAR_ERR_UNSUPPORTED},
        {"\"rope_theta\":10000.0", "\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.25}",
         "rope_parameters.partial_rotary_factor 0.25", OSCAR_ERR_UNSUPPORTED},
        {"\"rope_theta\":10000.0", "\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6}}",
         "per layer type", OSCAR_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_model(&k_llama, NULL);
        patch_config(cases[i].from, cases[i].to);
        oe_model *m = (oe_model *)(uintptr_t)1;
        oscar_status s = oe_model_load(g_dir, &m);
        cr_expect_eq(s, cases[i].want, "%s: status %d (%s)", cases[i].to, (int)s, oe_last_error());
        cr_expect_null(m, "%s: a model came back", cases[i].to);
        cr_expect(strstr(oe_last_error(), cases[i].named), "%s: the message should say '%s': %s", cases[i].to,
                  cases[i].named, oe_last_error());
        if (s == OSCAR_OK) oe_model_free(m);
    }
    /* null and a factor of 1 are the defaults: the model loads, with rope_parameters' theta. */
    write_model(&k_llama, NULL);
    patch_config("\"rope_theta\":10000.0", "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":"
                 "500000.0,\"partial_rotary_factor\":1.0},\"max_position_embeddings\":null");
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(oe_model_config(m)->rope_theta, 500000.0);
    cr_expect_eq(oe_model_config(m)->max_position, 0);
    oe_model_free(m);
    remove_dir();
}

/* rms_norm_eps is added to the mean square under the root of every RMSNorm: 5, 0.5 or 1e-300 loaded
 * and ran (a perplexity of 7825 for tiny-qwen3 at 5, exit 0), and the float32 epsilon of the GPU
 * engine is 0 below 1e-45 (an all-zero row then divides by zero). Checkpoints use 1e-5 and 1e-6;
 * outside [1e-12, 0.1] the config is refused naming the key, the value and the range. A value JSON
 * cannot hold (NaN, 1e999) is refused by the parser. */
Test(engine_load, rms_norm_eps_outside_its_range_is_refused)
{
    seed();
    make_dir();
    static const struct {
        const char *to, *shown;
    } bad[] = {
        {"5", "5"}, {"0.5", "0.5"}, {"0.10000001", "0.10000001"}, {"1e-300", "1e-300"}, {"9e-13", "9e-13"},
        {"0", "0"}, {"-0.0", "-0"}, {"-1e-06", "-1e-06"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char to[64], shown[64];
        snprintf(to, sizeof to, "\"rms_norm_eps\":%s", bad[i].to);
        snprintf(shown, sizeof shown, "rms_norm_eps is %s,", bad[i].shown);
        write_model(&k_llama, NULL);
        patch_config("\"rms_norm_eps\":1e-6", to);
        oe_model *m = (oe_model *)(uintptr_t)1;
        oscar_status s = oe_model_load(g_dir, &m);
        cr_expect_eq(s, OSCAR_ERR_CORRUPT_FILE, "%s: status %d (%s)", to, (int)s, oe_last_error());
        cr_expect_null(m, "%s: a model came back", to);
        cr_expect(strstr(oe_last_error(), shown) && strstr(oe_last_error(), "[1e-12, 0.1]"),
                  "%s: the message should say '%s' and the range [1e-12, 0.1]: %s", to, shown, oe_last_error());
        if (s == OSCAR_OK) oe_model_free(m);
    }
    static const char *const unparsable[] = {"NaN", "Infinity", "1e999"};
    for (size_t i = 0; i < sizeof unparsable / sizeof unparsable[0]; i++) {
        char to[64];
        snprintf(to, sizeof to, "\"rms_norm_eps\":%s", unparsable[i]);
        write_model(&k_llama, NULL);
        patch_config("\"rms_norm_eps\":1e-6", to);
        oe_model *m = NULL;
        oscar_status s = oe_model_load(g_dir, &m);
        cr_expect_neq(s, OSCAR_OK, "%s was taken", to);
        if (s == OSCAR_OK) oe_model_free(m);
    }
    /* the range's ends, what checkpoints use, null and no key (the default 1e-6) load */
    static const struct {
        const char *to;
        double want;
    } good[] = {
        {"\"rms_norm_eps\":1e-12", 1e-12}, {"\"rms_norm_eps\":0.1", 0.1}, {"\"rms_norm_eps\":1e-5", 1e-5},
        {"\"rms_norm_eps\":1e-6", 1e-6},   {"\"rms_norm_eps\":null", 1e-6}, {"", 1e-6}, /* "": no key */
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        write_model(&k_llama, NULL);
        patch_config(*good[i].to ? "\"rms_norm_eps\":1e-6" : "\"rms_norm_eps\":1e-6,", good[i].to);
        oe_model *m = NULL;
        cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s: %s", good[i].to, oe_last_error());
        cr_expect_eq(oe_model_config(m)->rms_eps, good[i].want, "%s: rms_eps %g", good[i].to,
                     oe_model_config(m)->rms_eps);
        oe_model_free(m);
    }
    remove_dir();
}

/* Every truncation and random header damage of a valid file: refused or
 * parsed, never a crash or an out-of-bounds read (ASan). */
Test(engine_load, corrupt_safetensors_refused)
{
    seed();
    make_dir();
    write_model(&k_qwen2, NULL);
    size_t len = 0;
    unsigned char *good = read_file("model.safetensors", &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | good[i];
    char path[512];
    snprintf(path, sizeof path, "%s/x.safetensors", g_dir);
    oe_safetensors *st = NULL;
    /* Truncations: inside the length, inside the header, inside the data. */
    size_t cuts[] = {0, 3, 8, 9, 8 + (size_t)hl / 2, 8 + (size_t)hl, 8 + (size_t)hl + 1, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_file("x.safetensors", good, cuts[i]);
        oscar_status s = oe_st_open(path, &st);
        cr_expect_eq(s, OSCAR_ERR_CORRUPT_FILE, "truncated to %zu bytes: status %d (%s)", cuts[i], (int)s,
                     oe_last_error());
        cr_expect_null(st);
        cr_expect(strlen(oe_last_error()) > 10);
    }
    /* The model loader reports the truncated shard too. */
    write_file("model.safetensors", good, len - 5);
    oe_model *m = NULL;
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE);
    cr_expect(strstr(oe_last_error(), "truncated"), "message: %s", oe_last_error());
    write_file("model.safetensors", good, len);
    /* Header length larger than the file. */
    unsigned char *bad = malloc(len);
    memcpy(bad, good, len);
    bad[6] = 0x7f;
    write_file("x.safetensors", bad, len);
    cr_expect_eq(oe_st_open(path, &st), OSCAR_ERR_CORRUPT_FILE);
    /* Hand-written hostile headers. */
    const char *hdrs[] = {
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,999]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}",
        "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}",
        "{\"a\":[1,2]}",
        "[1,2,3]",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}",
    };
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
        size_t hn = strlen(hdrs[i]);
        unsigned char *buf = calloc(1, 8 + hn + 8);
        for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)hn >> (8 * b));
        memcpy(buf + 8, hdrs[i], hn);
        write_file("x.safetensors", buf, 8 + hn + 8);
        oscar_status s = oe_st_open(path, &st);
        cr_expect(s == OSCAR_ERR_CORRUPT_FILE || s == OSCAR_ERR_UNSUPPORTED, "header %zu accepted (status %d)", i,
                  (int)s);
        free(buf);
    }
    /* The valid 8-byte one parses. */
    {
        const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
        size_t hn = strlen(h);
        unsigned char *buf = calloc(1, 8 + hn + 8);
        for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)hn >> (8 * b));
        memcpy(buf + 8, h, hn);
        write_file("x.safetensors", buf, 8 + hn + 8);
        cr_assert_eq(oe_st_open(path, &st), OSCAR_OK, "%s", oe_last_error());
        cr_expect_eq(oe_st_count(st), 1);
        oe_st_close(st);
        free(buf);
    }
    /* Random byte damage inside the header: any status, no crash. */
    for (int it = 0; it < 200; it++) {
        memcpy(bad, good, len);
        int flips = 1 + rand_r(&g_seed) % 4;
        for (int k = 0; k < flips; k++) bad[8 + (size_t)rand_r(&g_seed) % hl] = (unsigned char)rand_r(&g_seed);
        write_file("x.safetensors", bad, len);
        if (oe_st_open(path, &st) == OSCAR_OK) {
            for (int i = 0; i < oe_st_count(st); i++) {
                const oe_tensor *t = oe_st_at(st, i);
                float *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
                (void)oe_tensor_to_f32(t, tmp, t->numel);
                free(tmp);
            }
            oe_st_close(st);
            st = NULL;
        }
    }
    free(bad);
    free(good);
    remove_dir();
}

/* A tensor in two shards: the loader took the first shard's copy, even where
 * the index names the other (a silently different weight). Refused. */
Test(engine_load, tensor_in_two_shards_refused)
{
    seed();
    make_dir();
    write_model(&k_qwen2, NULL);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/model.safetensors", g_dir);
    snprintf(b, sizeof b, "%s/a.safetensors", g_dir);
    cr_assert_eq(rename(a, b), 0);
    const char *one = "{\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\"}}";
    write_file("model.safetensors.index.json", one, strlen(one));
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    oe_model_free(m);
    m = NULL;
    wt dup = {"model.norm.weight", 1, {64, 0}, "F32"};
    snprintf(b, sizeof b, "%s/b.safetensors", g_dir);
    write_st(b, &dup, 1, 0.2f);
    const char *two = "{\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\","
                      "\"model.norm.weight\":\"b.safetensors\"}}";
    write_file("model.safetensors.index.json", two, strlen(two));
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE, "%s", oe_last_error());
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "model.norm.weight") && strstr(oe_last_error(), "two shards"), "message: %s",
              oe_last_error());
    oe_model_free(m);
    remove_dir();
}

/* config.json with fewer layers than the checkpoint: the loader ran the first
 * layers only, a different model with finite logits and status OK. */
Test(engine_load, layers_past_the_config_refused)
{
    seed();
    make_dir();
    write_model(&k_qwen3, NULL); /* 2 layers */
    size_t len = 0;
    unsigned char *w = read_file("model.safetensors", &len);
    tiny_cfg one = k_qwen3;
    one.layers = 1;
    write_model(&one, NULL);
    oe_model *m = NULL;
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error()); /* matching config and weights */
    oe_model_free(m);
    m = NULL;
    write_file("model.safetensors", w, len); /* 2 layers of weights under the 1-layer config */
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_SHAPE_MISMATCH, "%s", oe_last_error());
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "model.layers.1.") && strstr(oe_last_error(), "num_hidden_layers 1"),
              "message: %s", oe_last_error());
    oe_model_free(m);
    free(w);
    remove_dir();
}

/* A safetensors file holding one tensor `name` ([d0][d1]) of the given bytes. */
static void write_raw_st(const char *path, const char *name, const char *dtype, int64_t d0, int64_t d1,
                         const void *data, size_t nbytes)
{
    char hdr[512];
    int hl = snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[0,%zu]}}",
                      name, dtype, (long long)d0, (long long)d1, nbytes);
    cr_assert(hl > 0 && (size_t)hl < sizeof hdr);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    cr_assert_eq(fwrite(len, 1, 8, f), 8);
    cr_assert_eq(fwrite(hdr, 1, (size_t)hl, f), (size_t)hl);
    cr_assert_eq(fwrite(data, 1, nbytes, f), nbytes);
    cr_assert_eq(fclose(f), 0);
}

/* tie_word_embeddings true with an lm_head.weight in the checkpoint as well:
 * the loader ignored lm_head.weight and ran the input embedding as the output
 * layer whatever lm_head held (transformers warns that both are present with
 * different values and does not tie them: another model). A copy equal to the
 * embedding (torch exports keep both names for one storage) loads; a different
 * one (one element here) or one of another shape is refused, naming
 * tie_word_embeddings. tie_word_embeddings false without lm_head.weight is
 * refused too (transformers would start the output layer from random values). */
Test(engine_load, tied_lm_head_must_match_the_embedding)
{
    seed();
    make_dir();
    oe_model *m = NULL;
    /* Untied config, checkpoint without lm_head.weight. */
    write_model(&k_qwen3, NULL); /* tied: no lm_head.weight */
    size_t tied_len = 0;
    unsigned char *tied = read_file("model.safetensors", &tied_len);
    tiny_cfg untied = k_qwen3;
    untied.tie = 0;
    write_model(&untied, NULL);
    cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(oe_model_config(m)->tie_word_embeddings, 0);
    oe_model_free(m);
    m = NULL;
    write_file("model.safetensors", tied, tied_len);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE, "%s", oe_last_error());
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "lm_head.weight") && strstr(oe_last_error(), "tie_word_embeddings"),
              "message: %s", oe_last_error());
    free(tied);

    /* Tied config; lm_head.weight in a second shard, a byte copy of the embedding. */
    write_model(&k_qwen3, NULL);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/model.safetensors", g_dir);
    snprintf(b, sizeof b, "%s/a.safetensors", g_dir);
    cr_assert_eq(rename(a, b), 0);
    oe_safetensors *st = NULL;
    cr_assert_eq(oe_st_open(b, &st), OSCAR_OK, "%s", oe_last_error());
    const oe_tensor *emb = oe_st_find(st, "model.embed_tokens.weight");
    cr_assert(emb && emb->ndim == 2);
    const int64_t V = emb->shape[0], H = emb->shape[1];
    const size_t nbytes = emb->nbytes, esize = oe_dtype_size(emb->dtype);
    char dtype[16];
    snprintf(dtype, sizeof dtype, "%s", oe_dtype_name(emb->dtype));
    unsigned char *copy = malloc(nbytes);
    cr_assert(copy);
    memcpy(copy, emb->data, nbytes);
    oe_st_close(st);
    snprintf(b, sizeof b, "%s/b.safetensors", g_dir);
    const char *index = "{\"weight_map\":{\"model.embed_tokens.weight\":\"a.safetensors\","
                        "\"lm_head.weight\":\"b.safetensors\"}}";
    write_file("model.safetensors.index.json", index, strlen(index));
    write_raw_st(b, "lm_head.weight", dtype, V, H, copy, nbytes);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_OK, "an lm_head.weight equal to the embedding: %s", oe_last_error());
    oe_model_free(m);
    m = NULL;
    copy[nbytes / 2 + 1] ^= 0x20; /* one element differs (a byte inside it; F32 or BF16 alike) */
    write_raw_st(b, "lm_head.weight", dtype, V, H, copy, nbytes);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE, "a different lm_head.weight was accepted");
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "lm_head.weight") && strstr(oe_last_error(), "tie_word_embeddings"),
              "message: %s", oe_last_error());
    write_raw_st(b, "lm_head.weight", dtype, V - 1, H, copy, nbytes - (size_t)H * esize);
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_SHAPE_MISMATCH, "an lm_head.weight of another shape: %s",
                 oe_last_error());
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "lm_head.weight"), "message: %s", oe_last_error());
    free(copy);
    remove_dir();
}

Test(engine_load, token_files_checked)
{
    seed();
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/t.tokens", g_dir);
    uint32_t *ids = NULL;
    int64_t n = 0;
    unsigned char raw[12] = {1, 0, 0, 0, 0x10, 0x27, 0, 0, 0xff, 0, 0, 0}; /* 1, 10000, 255 */
    write_file("t.tokens", raw, 12);
    cr_assert_eq(oe_tokens_load(path, 20000, &ids, &n), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(n, 3);
    cr_expect(ids[0] == 1 && ids[1] == 10000 && ids[2] == 255);
    free(ids);
    cr_expect_eq(oe_tokens_load(path, 8192, &ids, &n), OSCAR_ERR_CORRUPT_FILE);
    cr_expect(strstr(oe_last_error(), "token 1 is id 10000"), "message: %s", oe_last_error());
    cr_expect_null(ids);
    write_file("t.tokens", raw, 11);
    cr_expect_eq(oe_tokens_load(path, 20000, &ids, &n), OSCAR_ERR_CORRUPT_FILE);
    write_file("t.tokens", raw, 0);
    cr_expect_eq(oe_tokens_load(path, 20000, &ids, &n), OSCAR_ERR_EMPTY);
    remove_dir();
}

/* A token file is read whole into one buffer of its size: one larger than the machine's memory (a
 * hostile or mistaken path, here a sparse file of twice the memory) went to malloc, which failed
 * ("out of memory", exit 1) or, where memory is overcommitted, succeeded and filled the memory
 * (ASan aborts past its largest allocation). It is refused from its size, before any allocation,
 * naming the sizes. */
Test(engine_load, token_file_larger_than_memory_is_refused_from_its_size)
{
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/huge.tokens", g_dir);
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    cr_assert(pages > 0 && psz > 0);
    const off_t size = (off_t)pages * psz * 2;
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    const int sparse = ftruncate(fileno(f), size) == 0;
    fclose(f);
    if (!sparse) {
        remove_dir();
        cr_skip_test("this file system holds no sparse file of %lld bytes", (long long)size);
    }
    uint32_t *ids = (uint32_t *)(uintptr_t)1;
    int64_t n = -1;
    oscar_status s = oe_tokens_load(path, 20000, &ids, &n);
    cr_expect_eq(s, OSCAR_ERR_CORRUPT_FILE, "status %d: %s", (int)s, oe_last_error());
    cr_expect(strstr(oe_last_error(), "GiB") && strstr(oe_last_error(), "memory"),
              "the message should give the file's size and the memory: %s", oe_last_error());
    cr_expect(ids == NULL && n == 0, "ids %p, count %lld", (void *)ids, (long long)n);
    if (s == OSCAR_OK) free(ids);
    remove_dir();
}

/* That Llama (max_position_embeddings 4096) with exactly `members` after it. */
static oscar_status members_config(const char *members, oe_config *c)
{
    char tail[4096];
    snprintf(tail, sizeof tail, ",\"max_position_embeddings\":4096%s", members);
    return llama_config(tail, c);
}

/* transformers 5 reads rope_scaling as the old name of rope_parameters: when given it replaces
 * rope_parameters whole, rope_theta included (rope_scaling.rope_theta, else the top level's, else
 * 10000). The engine never read rope_scaling.rope_theta (ran theta 10000: logits 0.48 relative off
 * transformers' on a random Llama) and, with both objects of one type, ran rope_parameters' factor
 * where transformers ran rope_scaling's (0.24 off). One reading is taken when both agree; a config
 * whose two objects (or two thetas) disagree is refused, naming both. */
Test(engine_load, rope_scaling_is_rope_parameters_old_name)
{
    make_dir();
    oe_config c;
    cr_assert_eq(members_config(",\"rope_scaling\":{\"rope_type\":\"default\",\"rope_theta\":1234.5}", &c), OSCAR_OK,
                 "%s", oe_last_error());
    cr_expect_eq(c.rope_theta, 1234.5, "rope_scaling.rope_theta not read: theta %g", c.rope_theta);
    cr_assert_eq(members_config(",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                                "\"original_max_position_embeddings\":64,\"rope_theta\":777.0}", &c), OSCAR_OK,
                 "%s", oe_last_error());
    cr_expect_eq(c.rope_theta, 777.0, "theta %g", c.rope_theta);
    cr_expect_eq(c.rope.type, OE_ROPE_YARN);
    /* the top level's theta under a rope_scaling without one (transformers 4 configs) */
    cr_assert_eq(members_config(",\"rope_theta\":500000.0,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}", &c),
                 OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(c.rope_theta, 500000.0);
    /* both objects, saying the same: loads */
    cr_assert_eq(members_config(",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":777.0},"
                                "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":777.0}", &c),
                 OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(c.rope_theta, 777.0);
    cr_expect_eq(c.rope.factor, 4.0);
    static const struct {
        const char *members, *says;
    } bad[] = {
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2.0,\"original_max_position_embeddings\":64},"
         "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":64}",
         "rope_scaling and rope_parameters"},
        {",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":777.0},"
         "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4.0,\"rope_theta\":10000.0}",
         "rope_theta"},
        {",\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":\"default\",\"rope_theta\":777.0}", "disagree"},
        {",\"rope_scaling\":{\"rope_type\":\"default\",\"rope_theta\":777.0,\"partial_rotary_factor\":0.5}",
         "partial_rotary_factor"},
        {",\"rope_scaling\":{\"full_attention\":{\"rope_type\":\"default\",\"rope_theta\":777.0}}", "per layer type"},
        {",\"rope_scaling\":{\"rope_type\":\"default\",\"rope_theta\":\"777\"}", "rope_theta"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        cr_expect_neq(members_config(bad[b].members, &c), OSCAR_OK, "%s loaded", bad[b].members);
        cr_expect(strstr(oe_last_error(), bad[b].says), "%s: %s", bad[b].members, oe_last_error());
    }
    remove_dir();
}

/* Keys a config.json may leave out take transformers' defaults for these model types (LlamaConfig,
 * MistralConfig, Qwen2Config and Qwen3Config, 4.x and 5.x alike): tie_word_embeddings false, and
 * Mistral's sliding_window 4096. The engine read an absent tie_word_embeddings as true, so a checkpoint
 * with its own lm_head.weight was refused with "config.json has tie_word_embeddings true" (it had no
 * such key; transformers runs lm_head.weight), and a Mistral without sliding_window ran windows past
 * 4096 tokens with full attention where transformers slides. */
Test(engine_load, absent_keys_take_transformers_defaults)
{
    seed();
    make_dir();
    tiny_cfg untied = k_llama;
    write_model(&untied, NULL);
    const int n = 16;
    uint32_t tok[16];
    for (int i = 0; i < n; i++) tok[i] = (uint32_t)(rand_r(&g_seed) % (unsigned)untied.vocab);
    float *want = malloc((size_t)n * untied.vocab * sizeof(float)), *got = malloc((size_t)n * untied.vocab * 4);
    cr_assert(want && got);
    float *out[2] = {want, got};
    for (int r = 0; r < 2; r++) {
        if (r) patch_config(",\"tie_word_embeddings\":false", "");
        oe_model *m = NULL;
        cr_assert_eq(oe_model_load(g_dir, &m), OSCAR_OK, "%s: %s", r ? "no tie_word_embeddings" : "false",
                     oe_last_error());
        cr_expect_eq(oe_model_config(m)->tie_word_embeddings, 0);
        oe_ctx *ctx = NULL;
        cr_assert_eq(oe_ctx_create(m, n, &ctx), OSCAR_OK, "%s", oe_last_error());
        cr_assert_eq(oe_forward(ctx, tok, n, NULL, out[r]), OSCAR_OK, "%s", oe_last_error());
        oe_ctx_free(ctx);
        oe_model_free(m);
    }
    cr_expect_eq(memcmp(want, got, (size_t)n * untied.vocab * sizeof(float)), 0,
                 "an absent tie_word_embeddings ran another output layer than false");
    free(want);
    free(got);
    /* A checkpoint without lm_head.weight and no tie_word_embeddings: transformers starts the output
     * layer from random values; refused, saying what the absent key means and the fix. */
    tiny_cfg tied = k_llama;
    tied.tie = 1;
    write_model(&tied, NULL);
    patch_config(",\"tie_word_embeddings\":true", "");
    oe_model *m = NULL;
    cr_expect_eq(oe_model_load(g_dir, &m), OSCAR_ERR_CORRUPT_FILE);
    cr_expect_null(m);
    cr_expect(strstr(oe_last_error(), "lm_head.weight") && strstr(oe_last_error(), "no tie_word_embeddings"),
              "message: %s", oe_last_error());
    /* Mistral without sliding_window: MistralConfig's 4096 */
    tiny_cfg mi = k_llama;
    mi.type = "mistral";
    write_model(&mi, NULL);
    oe_config c;
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    cr_assert_eq(oe_config_load(path, &c), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(c.sliding_window, 4096, "sliding_window %d", c.sliding_window);
    write_model(&mi, ",\"sliding_window\":null");
    cr_assert_eq(oe_config_load(path, &c), OSCAR_OK, "%s", oe_last_error());
    cr_expect_eq(c.sliding_window, 0);
    remove_dir();
}

/* Qwen3Config's head_dim is 128 when config.json has no head_dim key (Qwen3-0.6B: hidden 1024, 16
 * heads, head_dim 128); the engine took hidden / heads, refusing such a checkpoint as "the weights and
 * config.json are of different models" (transformers runs it), and oscar-calibrate's fingerprint
 * disagreed with liboscar.hf's. null stays hidden / heads (transformers' attention then fails). */
Test(engine_load, qwen3_without_head_dim_is_128)
{
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    static const struct {
        const char *type, *head_dim;
        int want;
    } cases[] = {{"qwen3", "", 128}, {"qwen3", ",\"head_dim\":null", 32}, {"qwen2", "", 32}, {"llama", "", 32},
                 {"mistral", "", 32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f, "{\"model_type\":\"%s\",\"num_hidden_layers\":1,\"hidden_size\":64,\"num_attention_heads\":2,"
                   "\"num_key_value_heads\":1,\"intermediate_size\":96,\"vocab_size\":50%s}",
                cases[i].type, cases[i].head_dim);
        fclose(f);
        oe_config c;
        cr_assert_eq(oe_config_load(path, &c), OSCAR_OK, "%s", oe_last_error());
        cr_expect_eq(c.head_dim, cases[i].want, "%s%s: head_dim %d, transformers %d", cases[i].type,
                     cases[i].head_dim, c.head_dim, cases[i].want);
    }
    remove_dir();
}

/* No num_key_value_heads key: MistralConfig's default is 8 KV heads, Qwen2Config's and Qwen3Config's 32
 * (LlamaConfig's, and null for any: num_attention_heads). The engine took num_attention_heads for all, so
 * a Mistral of 16 heads and 8 KV heads without the key was refused as another model's weights
 * (transformers runs it). A count the heads do not divide is refused naming the default it came from. */
Test(engine_load, absent_num_key_value_heads_is_the_config_class_default)
{
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    static const struct {
        const char *type, *kv;
        int heads, want; /* want 0: refused */
    } cases[] = {{"mistral", "", 32, 8},  {"qwen2", "", 64, 32}, {"qwen3", "", 32, 32},
                 {"llama", "", 32, 32},   {"mistral", ",\"num_key_value_heads\":null", 32, 32},
                 {"qwen2", ",\"num_key_value_heads\":null", 4, 4}, {"qwen2", "", 4, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f, "{\"model_type\":\"%s\",\"num_hidden_layers\":1,\"hidden_size\":%d,\"num_attention_heads\":%d,"
                   "\"head_dim\":16,\"intermediate_size\":96,\"vocab_size\":50%s}",
                cases[i].type, 16 * cases[i].heads, cases[i].heads, cases[i].kv);
        fclose(f);
        oe_config c;
        const oscar_status s = oe_config_load(path, &c);
        if (!cases[i].want) {
            cr_expect_eq(s, OSCAR_ERR_CORRUPT_FILE, "%s, %d heads, no key: loaded", cases[i].type, cases[i].heads);
            cr_expect(strstr(oe_last_error(), "no num_key_value_heads"), "message: %s", oe_last_error());
            continue;
        }
        cr_assert_eq(s, OSCAR_OK, "%s", oe_last_error());
        cr_expect_eq(c.num_kv_heads, cases[i].want, "%s%s, %d heads: %d KV heads, transformers %d", cases[i].type,
                     cases[i].kv, cases[i].heads, c.num_kv_heads, cases[i].want);
    }
    remove_dir();
}

/* A quantized checkpoint (config.json's quantization_config: GPTQ's qweight / scales, AWQ, FP8 with
 * weight_scale_inv, bitsandbytes) holds no plain weights the engine reads: it was refused as "checkpoint
 * lacks tensor '...q_proj.weight'; the weights do not match config.json" (GPTQ) or by a tensor's dtype
 * (FP8), naming neither the quantization nor the fix. Refused from config.json, naming the method. */
Test(engine_load, quantized_checkpoints_refused_by_name)
{
    make_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", g_dir);
    static const char *const q[] = {",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4}",
                                    ",\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\"}",
                                    ",\"quantization_config\":{\"bits\":4}", ",\"quantization_config\":null"};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f, "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"hidden_size\":64,\"num_attention_heads\":2,"
                   "\"intermediate_size\":96,\"vocab_size\":50%s}", q[i]);
        fclose(f);
        oe_config c;
        const oscar_status s = oe_config_load(path, &c);
        if (strstr(q[i], "null")) {
            cr_expect_eq(s, OSCAR_OK, "%s: %s", q[i], oe_last_error());
            continue;
        }
        cr_expect_eq(s, OSCAR_ERR_UNSUPPORTED, "%s loaded", q[i]);
        cr_expect(strstr(oe_last_error(), "quantization_config") && strstr(oe_last_error(), "F32, F16 or BF16") &&
                      (!strstr(q[i], "quant_method") || strstr(oe_last_error(), strstr(q[i], "gptq") ? "gptq" : "fp8")),
                  "%s: %s", q[i], oe_last_error());
    }
    remove_dir();
}
