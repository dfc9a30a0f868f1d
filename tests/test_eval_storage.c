/* oscar-eval --storage (tools/oscar_eval_storage.c): SPEC parsing and its
 * messages, the bit count, top-k per page and where the change is applied
 * (which heads, which tensor, page boundaries, the row criterion). No model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oscar_eval.h" /* --tasks vocabulary */
#include "oscar_eval_storage.h"
#include "tool_params.h" /* code widths of a parameter set */

enum { L = 8, HKV = 2, D = 128 };

static void parse_ok(const char *spec, ev_storage *s)
{
    char err[400] = "";
    cr_assert_eq(ev_storage_parse(spec, L, HKV, D, s, err, sizeof err), 0, "%s: %s", spec, err);
}

static void parse_bad(const char *spec, const char *needle)
{
    ev_storage s;
    char err[400] = "";
    cr_assert_eq(ev_storage_parse(spec, L, HKV, D, &s, err, sizeof err), -1, "'%s' accepted", spec);
    cr_assert(strstr(err, needle), "'%s': message '%s' lacks '%s'", spec, err, needle);
    cr_assert_null(s.heads);
}

Test(eval_storage, parses_specs)
{
    ev_storage s;
    parse_ok("out=2", &s);
    cr_assert_eq(s.outliers, 2);
    cr_assert_eq(s.by, EV_BY_ERR);
    cr_assert_eq(s.group, 0);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HKV; h++) {
            cr_assert(ev_storage_applies(&s, l, h, OSCAR_K));
            cr_assert(ev_storage_applies(&s, l, h, OSCAR_V));
        }
    ev_storage_free(&s);
    parse_ok("group=32,kv=k,heads=4:1+3:0", &s);
    cr_assert_eq(s.outliers, 0);
    cr_assert_eq(s.group, 32);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HKV; h++) {
            int want = (l == 4 && h == 1) || (l == 3 && h == 0);
            cr_assert_eq(ev_storage_applies(&s, l, h, OSCAR_K), want, "layer %d head %d", l, h);
            cr_assert_eq(ev_storage_applies(&s, l, h, OSCAR_V), 0);
        }
    cr_assert_eq(ev_storage_applies(&s, L, 0, OSCAR_K), 0);
    cr_assert_eq(ev_storage_applies(&s, 4, HKV, OSCAR_K), 0);
    ev_storage_free(&s);
    parse_ok("clip=1,kv=k,heads=4:1", &s);
    cr_assert_float_eq(s.clip, 1.0f, 0.0f);
    cr_assert_eq(s.outliers + s.group, 0);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), 2.25, 1e-12); /* a clip costs no bits */
    ev_storage_free(&s);
    parse_ok("clip=0.9,group=64", &s);
    cr_assert_float_eq(s.clip, 0.9f, 0.0f);
    ev_storage_free(&s);
    parse_ok("out=1,by=norm,kv=v,heads=all", &s);
    cr_assert_eq(s.by, EV_BY_NORM);
    cr_assert(ev_storage_applies(&s, 0, 0, OSCAR_V));
    cr_assert_eq(ev_storage_applies(&s, 0, 0, OSCAR_K), 0);
    ev_storage_free(&s);
}

Test(eval_storage, refuses_bad_specs_with_a_reason)
{
    parse_bad("", "empty");
    parse_bad("out=0", "1..63");
    parse_bad("out=64", "1..63");
    parse_bad("out=2x", "1..63");
    parse_bad("out=", "key=value");
    parse_bad("=3", "key=value");
    parse_bad("out", "key=value");
    parse_bad("outliers=2", "unknown key");
    parse_bad("out=1,out=2", "twice");
    parse_bad("out=1,by=max", "err or norm");
    parse_bad("group=16", "unsupported");
    parse_bad("group=256", "unsupported");
    parse_bad("out=1,kv=q", "k, v or kv");
    parse_bad("out=1,heads=8:0", "layer in 0..7");
    parse_bad("out=1,heads=0:2", "KV head in 0..1");
    parse_bad("out=1,heads=3", "LAYER:KV_HEAD");
    parse_bad("out=1,heads=+", "empty item");
    parse_bad("out=1,heads=4:1++4:0", "empty item"); /* strtok skipped it: ran as heads=4:1+4:0 */
    parse_bad("out=1,,kv=k", "empty item");
    parse_bad(",out=1", "empty item");
    parse_bad("out=1,", "empty item");
    parse_bad("kv=k", "changes nothing");
    parse_bad("clip=0", "(0, 1]");
    parse_bad("clip=1.5", "(0, 1]");
    parse_bad("clip=nan", "(0, 1]");
    parse_bad("clip=0.9x", "(0, 1]");
    parse_bad("clip= 0.9", "(0, 1]"); /* strtod skipped the space */
    parse_bad("group= 32", "unsupported");
    parse_bad("out= 1", "1..");
    parse_bad("clip=1e-46,group=64", "(0, 1]"); /* 0 as a float: the clip unset, silently */
    parse_bad("vclip=1e-46", "(0, 1]");
    parse_bad("group=32,by=norm", "by= needs out=");
    ev_storage s;
    char err[400];
    cr_assert_eq(ev_storage_parse("group=128", L, HKV, 64, &s, err, sizeof err), -1, "group 128 > head_dim 64");
    cr_assert_eq(ev_storage_parse("out=1", 0, HKV, D, &s, err, sizeof err), -1);
}

Test(eval_storage, counts_bits)
{
    ev_storage s;
    parse_ok("out=1", &s);
    double want = (1.0 * (16.0 + 6.0 / D) + 63.0 * 2.25) / 64.0;
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), want, 1e-12);
    ev_storage_free(&s);
    /* keys of 2 heads out of 8 x 2 x {K, V} = 32 head-tensors */
    parse_ok("out=2,kv=k,heads=4:1+3:0", &s);
    double ch = (2.0 * (16.0 + 6.0 / D) + 62.0 * 2.25) / 64.0;
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 2.0 * ch) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("group=32,kv=k,heads=4:1+3:0", &s);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 2.0 * 3.0) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("group=64", &s);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), 2.5, 1e-12);
    ev_storage_free(&s);
    parse_ok("group=64,out=4", &s);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (4.0 * (16.0 + 6.0 / D) + 60.0 * 2.5) / 64.0, 1e-12);
    ev_storage_free(&s);
}

Test(eval_storage, topk)
{
    const double sc[6] = {0.5, 3.0, 1.0, 3.0, -1.0, 2.0};
    unsigned char keep[6];
    ev_topk(sc, 6, 1, keep);
    cr_assert_arr_eq(keep, ((unsigned char[]){0, 1, 0, 0, 0, 0}), 6); /* tie: the lower index */
    ev_topk(sc, 6, 3, keep);
    cr_assert_arr_eq(keep, ((unsigned char[]){0, 1, 0, 1, 0, 1}), 6);
    ev_topk(sc, 6, 6, keep);
    cr_assert_arr_eq(keep, ((unsigned char[]){1, 1, 1, 1, 1, 1}), 6);
    ev_topk(sc, 2, 5, keep);
    cr_assert_arr_eq(keep, ((unsigned char[]){1, 1}), 2);
}

/* Rows: orig = 1 + row-dependent offsets; q = orig plus an error e(p, h) on
 * the first value; qg = orig plus 1000 (marks where the group copy went). */
enum { N = 200, HH = 2, DD = 32 };
static float orig[N][HH][DD], q[N][HH][DD], qg[N][HH][DD];

static double err_of(int p, int h) { return (double)((p * 37 + h * 11) % 101) * 0.01; }

static void fill(void)
{
    for (int p = 0; p < N; p++)
        for (int h = 0; h < HH; h++)
            for (int j = 0; j < DD; j++) {
                orig[p][h][j] = 1.0f + 0.001f * (float)j;
                q[p][h][j] = orig[p][h][j] + (j == 0 ? (float)err_of(p, h) : 0.0f);
                qg[p][h][j] = orig[p][h][j] + 1000.0f;
            }
}

Test(eval_storage, keeps_the_worst_rows_of_each_page)
{
    ev_storage s;
    char err[400];
    cr_assert_eq(ev_storage_parse("out=2,kv=k,heads=1:1", 2, HH, DD, &s, err, sizeof err), 0, "%s", err);
    fill();
    const int lo = 70, hi = 192; /* first page [64, 128) partly before lo; last ends at 192 */
    q[66][1][0] = orig[66][1][0] + 5.0f; /* the page's largest error, but before lo: never chosen */
    q[hi][1][0] = orig[hi][1][0] + 5.0f; /* after hi: never chosen */
    long long kept = 0;
    ev_storage_apply(&s, 0, OSCAR_K, lo, hi, &orig[0][0][0], NULL, &q[0][0][0], &kept);
    cr_assert_eq(kept, 0, "layer 0 is not named");
    ev_storage_apply(&s, 1, OSCAR_V, lo, hi, &orig[0][0][0], NULL, &q[0][0][0], &kept);
    cr_assert_eq(kept, 0, "values are not named");
    ev_storage_apply(&s, 1, OSCAR_K, lo, hi, &orig[0][0][0], NULL, &q[0][0][0], &kept);
    cr_assert_eq(kept, 4, "2 rows in each of the pages [70, 128) and [128, 192)");
    const int pages[2][2] = {{lo, 128}, {128, hi}};
    for (int pg = 0; pg < 2; pg++) {
        /* the expected two: largest err_of in the page (ties: lower index) */
        int b1 = -1, b2 = -1;
        for (int p = pages[pg][0]; p < pages[pg][1]; p++)
            if (b1 < 0 || err_of(p, 1) > err_of(b1, 1)) b1 = p;
        for (int p = pages[pg][0]; p < pages[pg][1]; p++)
            if (p != b1 && (b2 < 0 || err_of(p, 1) > err_of(b2, 1))) b2 = p;
        for (int p = pages[pg][0]; p < pages[pg][1]; p++) {
            int k = p == b1 || p == b2;
            float want = orig[p][1][0] + (k ? 0.0f : (float)err_of(p, 1));
            cr_assert_eq(q[p][1][0], want, "row %d kept %d", p, k);
            cr_assert_eq(q[p][0][0], orig[p][0][0] + (float)err_of(p, 0), "head 0 row %d untouched", p);
        }
    }
    for (int p = 0; p < lo; p++)
        cr_assert_eq(q[p][1][0], orig[p][1][0] + (p == 66 ? 5.0f : (float)err_of(p, 1)), "row %d < lo", p);
    for (int p = hi; p < N; p++)
        cr_assert_eq(q[p][1][0], orig[p][1][0] + (p == hi ? 5.0f : (float)err_of(p, 1)), "row %d >= hi", p);
    ev_storage_free(&s);
}

Test(eval_storage, norm_criterion_and_group_copy)
{
    ev_storage s;
    char err[400];
    cr_assert_eq(ev_storage_parse("out=1,by=norm,group=32,kv=v,heads=0:0", 1, HH, DD, &s, err, sizeof err), 0, "%s", err);
    fill();
    orig[100][0][5] = 9.0f; /* the largest norm of page [64, 128) of head 0 */
    orig[150][0][7] = -9.0f; /* and of page [128, 192) */
    long long kept = 0;
    ev_storage_apply(&s, 0, OSCAR_V, 64, 192, &orig[0][0][0], (const float *const[EV_NGROUPS]){&qg[0][0][0], NULL, NULL}, &q[0][0][0], &kept);
    cr_assert_eq(kept, 2);
    for (int p = 64; p < 192; p++) {
        if (p == 100 || p == 150) cr_assert_eq(memcmp(q[p][0], orig[p][0], sizeof q[p][0]), 0, "row %d kept bf16", p);
        else cr_assert_eq(q[p][0][3], qg[p][0][3], "row %d: the group copy", p);
        cr_assert_eq(q[p][1][0], orig[p][1][0] + (float)err_of(p, 1), "head 1 untouched");
    }
    ev_storage_free(&s);
    ev_storage_free(&s); /* twice is harmless */
    ev_storage_free(NULL);
}

/* vgroup= / vclip=: the values set apart from the keys on the same heads
 * (the copy heads' keys unclipped in groups of 32, their values otherwise). */
Test(eval_storage, values_apart_from_keys)
{
    ev_storage s;
    parse_ok("clip=1,group=32,kv=k,heads=4:1+3:0,vclip=0.98", &s);
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_K), 32);
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_V), 0, "values keep the run's group");
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_K), 1.0f, 0.0f);
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_V), 0.98f, 0.0f);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HKV; h++) {
            int want = (l == 4 && h == 1) || (l == 3 && h == 0);
            cr_assert_eq(ev_storage_applies(&s, l, h, OSCAR_K), want, "K layer %d head %d", l, h);
            cr_assert_eq(ev_storage_applies(&s, l, h, OSCAR_V), want, "V layer %d head %d", l, h);
        }
    /* the values' clip costs no bits: as the keys-only row */
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 2.0 * 3.0) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("clip=1,group=32,heads=4:1,vgroup=64", &s); /* kv= default: V unclipped too, in groups of 64 */
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_K), 32);
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_V), 64);
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_V), 1.0f, 0.0f);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 3.0 + 2.5) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("out=1,kv=k,vgroup=32,heads=0:0", &s); /* out= stays on the keys */
    cr_assert_eq(ev_storage_outliers_of(&s, 0, 0, OSCAR_K), 1);
    cr_assert_eq(ev_storage_outliers_of(&s, 0, 0, OSCAR_V), 0);
    cr_assert_eq(ev_storage_group_of(&s, 0, 0, OSCAR_K), 0);
    cr_assert_eq(ev_storage_group_of(&s, 0, 0, OSCAR_V), 32);
    double ch = (1.0 * (16.0 + 6.0 / D) + 63.0 * 2.25) / 64.0;
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + ch + 3.0) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("vclip=0.9", &s); /* alone: the values of every head */
    cr_assert(ev_storage_applies(&s, 0, 0, OSCAR_V));
    cr_assert_eq(ev_storage_clip_of(&s, 0, 0, OSCAR_K), 0.0f, "no clip= given: the keys keep the file's");
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), 2.25, 1e-12);
    ev_storage_free(&s);
    parse_bad("vgroup=48", "unsupported");
    parse_bad("vgroup=16", "vgroup=");
    parse_bad("vclip=0", "vclip= wants");
    parse_bad("vclip=2", "(0, 1]");
    parse_bad("group=32,kv=v,vgroup=64", "kv=v");
    parse_bad("clip=1,kv=v,vclip=0.9", "kv=v");
    parse_bad("vclip=0.9,vclip=0.8", "twice");
    parse_bad("kv=k,heads=4:1", "vgroup=G");
}

/* ev_storage_apply copies the group fake-quant on the values by vgroup= even
 * where kv= names only the keys. */
Test(eval_storage, vgroup_applies_the_group_copy_to_values)
{
    ev_storage s;
    char err[400];
    cr_assert_eq(ev_storage_parse("clip=1,kv=k,vgroup=32,heads=0:1", 1, HH, DD, &s, err, sizeof err), 0, "%s", err);
    fill();
    long long kept = 0;
    ev_storage_apply(&s, 0, OSCAR_V, 64, 192, &orig[0][0][0], (const float *const[EV_NGROUPS]){&qg[0][0][0], NULL, NULL}, &q[0][0][0], &kept);
    cr_assert_eq(kept, 0);
    for (int p = 64; p < 192; p++) {
        cr_assert_eq(q[p][1][3], qg[p][1][3], "row %d: the group copy on head 1's values", p);
        cr_assert_eq(q[p][0][0], orig[p][0][0] + (float)err_of(p, 0), "head 0 untouched");
    }
    for (int p = 0; p < 64; p++) cr_assert_eq(q[p][1][3], orig[p][1][3], "row %d < lo untouched", p);
    ev_storage_free(&s);
}

/* Clauses joined by '/': different settings per head; the last clause that
 * names a (layer, head, tensor) decides it; bits per head-tensor. */
Test(eval_storage, clauses_set_heads_apart)
{
    ev_storage s;
    parse_ok("clip=1,group=32,kv=k,heads=4:1+3:0/vclip=1,kv=k,heads=4:1/group=64,kv=k,heads=3:0", &s);
    cr_assert_str_eq(s.spec, "clip=1,group=32,kv=k,heads=4:1+3:0/vclip=1,kv=k,heads=4:1/group=64,kv=k,heads=3:0");
    /* 4:1: the second clause (keys: nothing set there, so the file's clip and the run's group) */
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_K), 0, "the second clause replaces the first on 4:1's keys");
    cr_assert_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_K), 0.0f);
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_V), 1.0f, 0.0f);
    cr_assert(ev_storage_applies(&s, 4, 1, OSCAR_V));
    /* 3:0: the third clause on K, nothing on V */
    cr_assert_eq(ev_storage_group_of(&s, 3, 0, OSCAR_K), 64);
    cr_assert_eq(ev_storage_clip_of(&s, 3, 0, OSCAR_K), 0.0f);
    cr_assert_eq(ev_storage_applies(&s, 3, 0, OSCAR_V), 0);
    cr_assert_eq(ev_storage_applies(&s, 0, 0, OSCAR_K), 0);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (31.0 * 2.25 + 2.5) / 32.0, 1e-12);
    cr_assert_eq(ev_storage_has_outliers(&s), 0);
    ev_storage_free(&s);
    /* the usual way: one clause for the keys, one for 4:1's values */
    parse_ok("clip=1,group=32,kv=k,heads=4:1+3:0/vclip=1,kv=k,clip=1,group=32,heads=4:1", &s);
    cr_assert_eq(ev_storage_group_of(&s, 4, 1, OSCAR_K), 32);
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_K), 1.0f, 0.0f);
    cr_assert_float_eq(ev_storage_clip_of(&s, 4, 1, OSCAR_V), 1.0f, 0.0f);
    cr_assert_eq(ev_storage_clip_of(&s, 3, 0, OSCAR_V), 0.0f, "3:0's values keep the file's clip");
    cr_assert_float_eq(ev_storage_clip_of(&s, 3, 0, OSCAR_K), 1.0f, 0.0f);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 2.0 * 3.0) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("group=32,kv=k,heads=0:0/out=1,kv=v,heads=1:1", &s);
    cr_assert_eq(ev_storage_has_outliers(&s), 1);
    cr_assert_eq(ev_storage_outliers_of(&s, 1, 1, OSCAR_V), 1);
    cr_assert_eq(ev_storage_outliers_of(&s, 0, 0, OSCAR_K), 0);
    ev_storage_free(&s);
    parse_bad("group=32/", "empty clause");
    parse_bad("/group=32", "empty clause");
    parse_bad("group=32//clip=1", "empty clause");
    parse_bad("group=32/colour=red", "unknown key");
    parse_bad("group=32/kv=k", "changes nothing");
}

/* Two groups in one layer and tensor: each head takes its own group's copy. */
Test(eval_storage, each_head_its_group)
{
    ev_storage s;
    char err[400];
    cr_assert_eq(ev_storage_parse("group=32,heads=0:0/group=64,heads=0:1", 1, HH, 64, &s, err, sizeof err), 0, "%s", err);
    enum { NN = 4, DG = 64 };
    static float o[NN][HH][DG], x[NN][HH][DG], g32[NN][HH][DG], g64[NN][HH][DG];
    for (int p = 0; p < NN; p++)
        for (int h = 0; h < HH; h++)
            for (int j = 0; j < DG; j++) o[p][h][j] = x[p][h][j] = 1.0f, g32[p][h][j] = 32.0f, g64[p][h][j] = 64.0f;
    /* qg at ev_group_index(32) = 0 and ev_group_index(64) = 2 */
    ev_storage_apply(&s, 0, OSCAR_K, 0, NN, &o[0][0][0],
                     (const float *const[EV_NGROUPS]){[0] = &g32[0][0][0], [2] = &g64[0][0][0]}, &x[0][0][0], NULL);
    for (int p = 0; p < NN; p++) {
        cr_assert_eq(x[p][0][5], 32.0f, "head 0: group 32");
        cr_assert_eq(x[p][1][5], 64.0f, "head 1: group 64");
    }
    ev_storage_free(&s);
}

/* ------------------------------------------------- bits= (wider codes) */
Test(eval_storage, code_width_parses_counts_and_is_refused)
{
    ev_storage s;
    parse_ok("bits=3,kv=k,heads=4:1", &s);
    cr_assert_eq(ev_storage_bits_of(&s, 4, 1, OSCAR_K), 3);
    cr_assert_eq(ev_storage_bits_of(&s, 4, 1, OSCAR_V), 0);
    cr_assert_eq(ev_storage_bits_of(&s, 4, 0, OSCAR_K), 0);
    /* one head-tensor of 32 at 3 + 32/128 bits */
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (31.0 * 2.25 + 3.25) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("bits=3,kv=k,heads=4:1,vbits=4,group=64", &s);
    cr_assert_eq(ev_storage_bits_of(&s, 4, 1, OSCAR_V), 4);
    cr_assert(ev_storage_applies(&s, 4, 1, OSCAR_V));
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), (30.0 * 2.25 + 3.5 + 4.25) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("bits=3,kv=k,heads=4:1/bits=2,heads=4:1", &s); /* the last clause decides */
    cr_assert_eq(ev_storage_bits_of(&s, 4, 1, OSCAR_K), 2);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), 2.25, 1e-12);
    ev_storage_free(&s);
    parse_bad("bits=5", "2, 3 or 4");
    parse_bad("bits=1", "2, 3 or 4");
    parse_bad("vbits=3x", "2, 3 or 4");
    parse_bad("vbits=3,kv=v", "with kv=v use");
    parse_bad("out=1,bits=3", "does not combine");
}

/* rows [n][h][d] of bf16 values with a few large channels (as keys have) */
static void bf16_rows(float *x, int n, int hkv, int d, unsigned seed)
{
    for (int i = 0; i < n * hkv * d; i++) {
        seed = seed * 1664525u + 1013904223u;
        float u = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
        float v = (i % d) % 17 == 3 ? 8.0f * u : u;
        uint32_t b;
        memcpy(&b, &v, 4);
        b &= 0xffff0000u; /* exact in bf16 */
        memcpy(&v, &b, 4);
        x[i] = v;
    }
}

static oscar_params *shipped_params(void)
{
    oscar_params *p = NULL;
    const char *path = OSCAR_SOURCE_DIR "/docs/eval/tiny-qwen3.oscar.safetensors";
    cr_assert_eq(oscar_params_load(path, &p), OSCAR_OK, "%s: %s", path, oscar_last_error());
    return p;
}

/* At 2 bits the tool's coder is the library's OSCAR2 write path, bit for bit:
 * the shipped file's per-head rotations, feedback weights and clips. */
Test(eval_storage, two_bit_code_width_is_the_write_path)
{
    enum { NT = 48 };
    oscar_params *p = shipped_params();
    static float a[NT * HKV * D], b[NT * HKV * D];
    for (int layer = 0; layer < L; layer += 3)
        for (int w = 0; w < 2; w++)
            for (int group = 32; group <= 128; group *= 2) {
                bf16_rows(a, NT, HKV, D, 7u + (unsigned)(layer * 4 + w));
                memcpy(b, a, sizeof a);
                cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, layer, (oscar_kv)w, group, NT, HKV, D, a), OSCAR_OK,
                             "%s", oscar_last_error());
                for (int h = 0; h < HKV; h++)
                    cr_assert_eq(ev_fakequant_bits(p, layer, h, (oscar_kv)w, 2, group, HKV, D, 0, NT, b), 0);
                for (int i = 0; i < NT * HKV * D; i++)
                    cr_assert_eq(memcmp(&a[i], &b[i], sizeof a[i]), 0, "layer %d %c group %d value %d: %g vs %g", layer,
                                 "KV"[w], group, i, (double)a[i], (double)b[i]);
            }
    oscar_params_destroy(p);
}

/* Head-tensors a spec does not re-code keep the parameters' code width in the bit count (a file's 3-bit
 * head-tensors: one more bit each, as the variant runs them); bits=/vbits= set their own. */
Test(eval_storage, counts_the_parameters_code_widths)
{
    oscar_params *p = shipped_params();
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HKV; h++)
            for (int w = 0; w < 2; w++) cr_assert_eq(oscar_params_set_code_bits(p, l, h, (oscar_kv)w, 2), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 4, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_code_bits(p, 3, 0, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    int total = 0;
    cr_assert_eq(tool_params_wide_count(p, &total), 2);
    cr_assert_eq(total, 2 * L * HKV);
    cr_assert_float_eq(tool_params_bits(p, OSCAR_METHOD_OSCAR2, D, 128), 2.25 + 2.0 / 32.0, 1e-12);
    cr_assert_float_eq(tool_params_bits(p, OSCAR_METHOD_QUAROT2, D, 128), 2.25, 1e-12); /* oscar2 only */
    char label[96];
    tool_params_width_label(p, label, sizeof label);
    cr_assert_str_eq(label, "2/3-bit: 2 of 32 head-tensors in 3 bits");
    tool_params_width_label(NULL, label, sizeof label);
    cr_assert_str_eq(label, "2-bit");
    ev_storage s;
    parse_ok("clip=1,kv=k,heads=4:1", &s);
    cr_assert_float_eq(ev_storage_bits(&s, 128, p), (30.0 * 2.25 + 2.0 * 3.25) / 32.0, 1e-12);
    cr_assert_float_eq(ev_storage_bits(&s, 128, NULL), 2.25, 1e-12);
    ev_storage_free(&s);
    parse_ok("bits=2,kv=k,heads=4:1", &s); /* narrowed back to 2 bits */
    cr_assert_float_eq(ev_storage_bits(&s, 128, p), (31.0 * 2.25 + 3.25) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("group=64,kv=v,heads=3:0", &s); /* 3 bits at group 64 */
    cr_assert_float_eq(ev_storage_bits(&s, 128, p), (30.0 * 2.25 + 3.25 + 3.5) / 32.0, 1e-12);
    ev_storage_free(&s);
    parse_ok("bits=3,heads=5:0", &s);
    cr_assert_float_eq(ev_storage_bits(&s, 128, p), (28.0 * 2.25 + 4.0 * 3.25) / 32.0, 1e-12);
    ev_storage_free(&s);
    oscar_params_destroy(p);
}

/* The library's 3-bit head-tensors (parameters' code_bits, FORMAT.md §2.7) are the eighth step's fake-quant
 * `bits=3` bit for bit: what oscar-eval measures with a --wide-bits file is what --storage bits=3 measured. */
Test(eval_storage, three_bit_code_width_is_the_library_format)
{
    enum { NT = 48 };
    oscar_params *p = shipped_params();
    cr_assert_eq(oscar_params_set_code_bits(p, 4, 1, OSCAR_K, 3), OSCAR_OK, "%s", oscar_last_error());
    cr_assert_eq(oscar_params_set_clip_head(p, 4, 1, OSCAR_K, 1.0f), OSCAR_OK);
    cr_assert_eq(oscar_params_set_code_bits(p, 3, 0, OSCAR_V, 3), OSCAR_OK, "%s", oscar_last_error());
    static float a[NT * HKV * D], b[NT * HKV * D];
    const int layers[2] = {3, 4};
    for (int li = 0; li < 2; li++)
        for (int w = 0; w < 2; w++)
            for (int group = 32; group <= 128; group *= 2) {
                const int layer = layers[li];
                bf16_rows(a, NT, HKV, D, 17u + (unsigned)(layer * 4 + w));
                memcpy(b, a, sizeof a);
                cr_assert_eq(oscar_fakequant(p, OSCAR_METHOD_OSCAR2, layer, (oscar_kv)w, group, NT, HKV, D, a), OSCAR_OK,
                             "%s", oscar_last_error());
                int wide = 0;
                for (int h = 0; h < HKV; h++) {
                    int bits = 0;
                    cr_assert_eq(oscar_params_code_bits(p, layer, h, (oscar_kv)w, &bits), OSCAR_OK);
                    wide += bits == 3;
                    cr_assert_eq(ev_fakequant_bits(p, layer, h, (oscar_kv)w, bits, group, HKV, D, 0, NT, b), 0);
                }
                for (int i = 0; i < NT * HKV * D; i++)
                    cr_assert_eq(memcmp(&a[i], &b[i], sizeof a[i]), 0, "layer %d %c group %d value %d: %g vs %g", layer,
                                 "KV"[w], group, i, (double)a[i], (double)b[i]);
                if (wide) { /* and 2 bits would not have matched: the width is what the library used */
                    bf16_rows(b, NT, HKV, D, 17u + (unsigned)(layer * 4 + w));
                    for (int h = 0; h < HKV; h++)
                        cr_assert_eq(ev_fakequant_bits(p, layer, h, (oscar_kv)w, 2, group, HKV, D, 0, NT, b), 0);
                    cr_assert_neq(memcmp(a, b, sizeof a), 0, "layer %d %c: 3 bits gave the 2-bit rows", layer, "KV"[w]);
                }
            }
    oscar_params_destroy(p);
}

/* Wider codes: rows outside [lo, hi) and other heads untouched, and the error
 * falls with each bit (unclipped, where the clip's own error does not stay). */
Test(eval_storage, wider_codes_lower_the_error)
{
    enum { NT = 64 };
    oscar_params *p = shipped_params();
    cr_assert_eq(oscar_params_set_clip_head(p, 4, 1, OSCAR_K, 1.0f), OSCAR_OK);
    static float x[NT * HKV * D], y[NT * HKV * D];
    bf16_rows(x, NT, HKV, D, 99u);
    double mse[5] = {0};
    for (int bits = 2; bits <= 4; bits++) {
        memcpy(y, x, sizeof x);
        cr_assert_eq(ev_fakequant_bits(p, 4, 1, OSCAR_K, bits, 128, HKV, D, 8, NT - 8, y), 0);
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < HKV; h++)
                for (int j = 0; j < D; j++) {
                    const size_t i = ((size_t)t * HKV + (size_t)h) * D + (size_t)j;
                    if (h == 0 || t < 8 || t >= NT - 8) cr_assert_eq(memcmp(&x[i], &y[i], sizeof x[i]), 0);
                    else mse[bits] += (double)(x[i] - y[i]) * (double)(x[i] - y[i]);
                }
    }
    cr_assert(mse[3] < 0.5 * mse[2] && mse[4] < 0.5 * mse[3], "mse %g %g %g", mse[2], mse[3], mse[4]);
    cr_assert_eq(ev_fakequant_bits(p, 4, 1, OSCAR_K, 9, 128, HKV, D, 0, NT, y), -1);
    cr_assert_eq(ev_fakequant_bits(p, 4, 2, OSCAR_K, 3, 128, HKV, D, 0, NT, y), -1);
    oscar_params_destroy(p);
}

/* --tasks' key names come from the model's tokenizer.json: a tokenizer mapping two names to one id
 * (or a name to a word of the fact) made facts that answer two queries, scored as distinct. Such a
 * name is skipped; the others stay, each its own token. */
Test(eval_tasks, key_names_are_distinct_tokens) {
    char dir[] = "/tmp/oscar-tasks-XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    const char *G = "\xc4\xa0"; /* byte-level BPE word start */
    fprintf(f, "{\"model\":{\"vocab\":{\"%sThe\":1,\"%scode\":2,\"%sof\":3,\".\":4", G, G, G);
    for (int d = 0; d < 10; d++) fprintf(f, ",\"%s%d\":%d,\"%d\":%d", G, d, 10 + d, d, 20 + d);
    /* server and kernel share id 30; driver is "code"'s id; the rest are their own */
    fprintf(f, ",\"%sserver\":30,\"%skernel\":30,\"%sdriver\":2", G, G, G);
    const char *rest[] = {"file", "package", "user", "module", "device", "system", "option", "process", "network"};
    for (int i = 0; i < 9; i++) fprintf(f, ",\"%s%s\":%d", G, rest[i], 40 + i);
    fprintf(f, "}}}");
    cr_assert_eq(fclose(f), 0);
    ev_task_vocab tv;
    char err[512] = "";
    cr_assert_eq(ev_task_vocab_load(dir, 100, &tv, err, sizeof err), 0, "%s", err);
    cr_expect_eq(tv.nnames, 10, "names: %d (server once, kernel and driver skipped, 9 others)", tv.nnames);
    for (int i = 0; i < tv.nnames; i++) {
        cr_expect_neq(tv.names[i], tv.code, "name %d is the id of \"code\"", i);
        for (int j = 0; j < i; j++) cr_expect_neq(tv.names[i], tv.names[j], "names %d and %d share id %d", j, i, tv.names[i]);
    }
    unlink(path);
    rmdir(dir);
}

/* group=/vgroup= take every group the format allows for the head_dim (multiples
 * of 16, >= 32, dividing it; FORMAT.md §2.2), not only 32/64/128, and name the
 * allowed ones when refusing. */
Test(eval_storage, group_every_format_group)
{
    static const struct { int d, g, ok; } cases[] = {
        {96, 48, 1}, {96, 96, 1}, {96, 32, 1}, {96, 64, 0}, {256, 256, 1}, {192, 96, 1}, {160, 80, 1},
        {128, 48, 0}, {128, 16, 0}, {128, 40, 0}, {64, 128, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[32], err[400] = "";
        ev_storage s;
        snprintf(spec, sizeof spec, "group=%d,vgroup=%d", cases[i].g, cases[i].g);
        const int r = ev_storage_parse(spec, L, HKV, cases[i].d, &s, err, sizeof err);
        cr_expect_eq(r, cases[i].ok ? 0 : -1, "head_dim %d %s: %d (%s)", cases[i].d, spec, r, err);
        if (r == 0) {
            cr_expect_eq(ev_storage_group_of(&s, 0, 0, OSCAR_K), cases[i].g);
            cr_expect(ev_group_index(cases[i].g) >= 0 && ev_group_index(cases[i].g) < EV_NGROUPS, "group %d",
                      cases[i].g);
            ev_storage_free(&s);
        }
    }
    char err[400] = "";
    ev_storage s;
    cr_assert_eq(ev_storage_parse("group=48", L, HKV, 128, &s, err, sizeof err), -1);
    cr_expect(strstr(err, "32, 64, 128"), "message names the allowed groups: %s", err);
    cr_assert_eq(ev_storage_parse("group=64", L, HKV, 96, &s, err, sizeof err), -1);
    cr_expect(strstr(err, "32, 48, 96"), "message names the allowed groups: %s", err);
}
