/* runtime/json_lite.c (the parameter-file header's JSON, so liboscar.so
 * needs no JSON library) against jansson, which the loader used before:
 * same accept/refuse decision on random and mutated documents, same bytes
 * written for JSON_COMPACT | JSON_SORT_KEYS, plus the hostile cases the
 * loader depends on (depth, duplicates, NUL, bad UTF-8, 64-bit overflow). */
#define OSCAR_JSON_NO_JANSSON_NAMES 1
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json_lite.h"

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

typedef struct sbuf {
    char s[8192];
    size_t n;
} sbuf;
static void add(sbuf *b, const char *t) {
    size_t l = strlen(t);
    if (b->n + l < sizeof b->s) {
        memcpy(b->s + b->n, t, l);
        b->n += l;
        b->s[b->n] = '\0';
    }
}

/* Strings exercise escapes, multi-byte UTF-8 and surrogate pairs; `reals`
 * off keeps documents whose dumps must agree (jansson reformats reals). */
static void gen_string(sbuf *b) {
    static const char *parts[] = {"a", "key", "layers.0.rot_k", "\\\"", "\\\\", "\\/", "\\n", "\\t", "\\u0041",
                                  "\\u00e9", "\xc3\xa9", "\xe2\x82\xac", "\\ud83d\\ude00", "\xf0\x9f\x98\x80",
                                  " ", "\\u001f", "\\b", "\\f", "\\r", "Z"};
    add(b, "\"");
    int n = (int)(rnd() % 5);
    for (int i = 0; i < n; i++) add(b, parts[rnd() % (sizeof parts / sizeof *parts)]);
    add(b, "\"");
}
static void gen_value(sbuf *b, int depth, int reals) {
    unsigned k = rnd() % (depth > 3 ? 6 : 8);
    char num[40];
    switch (k) {
    case 0: add(b, "true"); break;
    case 1: add(b, "false"); break;
    case 2: add(b, "null"); break;
    case 3:
        snprintf(num, sizeof num, "%lld", (long long)(int64_t)((uint64_t)rnd() << 32 | rnd()) >> (rnd() % 63));
        add(b, num);
        break;
    case 4:
        if (reals) add(b, rnd() % 2 ? "1.5" : "-2e3");
        else add(b, "0");
        break;
    case 5: gen_string(b); break;
    default: {
        int obj = k == 6;
        add(b, obj ? "{" : "[");
        int n = (int)(rnd() % 4);
        for (int i = 0; i < n; i++) {
            if (i) add(b, rnd() % 4 ? "," : " , ");
            if (obj) {
                gen_string(b);
                add(b, ":");
            }
            gen_value(b, depth + 1, reals);
        }
        add(b, obj ? "}" : "]");
    }
    }
}

static void gen_doc(sbuf *b, int reals) {
    b->n = 0;
    b->s[0] = '\0';
    add(b, rnd() % 2 ? "{" : "[");
    b->n = 0; /* restart: top level is a container */
    sbuf inner = {{0}, 0};
    int obj = rnd() % 2;
    add(&inner, obj ? "{" : "[");
    int n = (int)(rnd() % 5);
    for (int i = 0; i < n; i++) {
        if (i) add(&inner, ",");
        if (obj) {
            gen_string(&inner);
            add(&inner, ":");
        }
        gen_value(&inner, 1, reals);
    }
    add(&inner, obj ? "}" : "]");
    if (rnd() % 3 == 0) add(&inner, "  \n");
    *b = inner;
}

/* 1 if both parse, 0 if both refuse; fails on disagreement. */
static int both(const char *s, size_t n, int compare_dump) {
    json_error_t je;
    oscar_json_error oe;
    json_t *j = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
    oscar_json *o = oscar_json_loadb(s, n, OSCAR_JSON_REJECT_DUPLICATES, &oe);
    cr_assert_eq(j != NULL, o != NULL, "jansson %s, json_lite %s on [%.*s] (%s / %s)", j ? "accepts" : "refuses",
                 o ? "accepts" : "refuses", (int)n, s, j ? "" : je.text, o ? "" : oe.text);
    if (j && compare_dump) {
        char *a = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
        char *b = oscar_json_dumps(o, OSCAR_JSON_COMPACT | OSCAR_JSON_SORT_KEYS);
        cr_assert(a && b && strcmp(a, b) == 0, "dumps differ on [%.*s]:\njansson   %s\njson_lite %s", (int)n, s, a,
                  b);
        free(a);
        free(b);
    }
    json_decref(j);
    oscar_json_decref(o);
    return o != NULL;
}

Test(json_lite, agrees_with_jansson_on_random_documents) {
    g_rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() ^ 0x51ed;
    cr_log_info("seed %llu", (unsigned long long)g_rng);
    int accepted = 0;
    sbuf b;
    for (int it = 0; it < 20000; it++) {
        gen_doc(&b, 0);
        accepted += both(b.s, b.n, 1);
    }
    /* Generated documents are valid unless a key repeats. */
    cr_assert_gt(accepted, 15000, "only %d of 20000 generated documents parsed", accepted);
}

Test(json_lite, agrees_with_jansson_on_mutated_documents) {
    g_rng = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    cr_log_info("seed %llu", (unsigned long long)g_rng);
    static const char bytes[] = "{}[]\":,\\u0 \t\n-1.eE+x\x80\xc3\xff\x01";
    int accepted = 0, refused = 0;
    sbuf b;
    for (int it = 0; it < 20000; it++) {
        gen_doc(&b, 1);
        int muts = 1 + (int)(rnd() % 3);
        for (int m = 0; m < muts && b.n > 0; m++) {
            size_t at = rnd() % b.n;
            char c = bytes[rnd() % (sizeof bytes - 1)];
            switch (rnd() % 3) {
            case 0: b.s[at] = c; break; /* replace */
            case 1: memmove(b.s + at, b.s + at + 1, b.n - at); b.n--; break; /* delete */
            default:
                if (b.n + 1 < sizeof b.s) {
                    memmove(b.s + at + 1, b.s + at, b.n - at + 1);
                    b.s[at] = c;
                    b.n++;
                }
            }
        }
        if (both(b.s, b.n, 0)) accepted++;
        else refused++;
    }
    cr_assert(accepted > 100 && refused > 100, "mutations too tame or too wild: %d accepted, %d refused", accepted,
              refused);
}

Test(json_lite, hostile_inputs) {
    oscar_json_error e;
    const char *cases[] = {
        "{\"a\":1,\"a\":2}",         /* duplicate key */
        "{\"a\":\"x\\u0000y\"}",     /* NUL inside a string */
        "{\"a\":\"\xc0\xaf\"}",      /* overlong UTF-8 */
        "{\"a\":\"\xed\xa0\x80\"}",  /* UTF-8 surrogate */
        "{\"a\":\"\\udc00\"}",       /* lone low surrogate */
        "{\"a\":9223372036854775808}", /* one past INT64_MAX */
        "{\"a\":01}",                /* leading zero */
        "{\"a\":1e999}",             /* real overflow */
        "{\"a\":1} x",               /* trailing garbage */
        "\"top\"",                   /* scalar at top level */
        "{\"a\":\"raw\ttab\"}",      /* raw control character */
        "",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_null(oscar_json_loadb(cases[i], strlen(cases[i]), OSCAR_JSON_REJECT_DUPLICATES, &e), "accepted %s",
                       cases[i]);
        cr_assert(e.text[0], "no message for %s", cases[i]);
    }
    /* An embedded NUL byte ends nothing: the length is what counts. */
    cr_assert_null(oscar_json_loadb("{\"a\":1}\0", 8, 0, &e));
    /* Extremes that must pass. */
    const char *ext = "{\"m\":-9223372036854775808,\"M\":9223372036854775807}";
    oscar_json *o = oscar_json_loadb(ext, strlen(ext), 0, &e);
    cr_assert_not_null(o, "%s", e.text);
    cr_assert_eq(oscar_json_integer_value(oscar_json_object_get(o, "m")), INT64_MIN);
    cr_assert_eq(oscar_json_integer_value(oscar_json_object_get(o, "M")), INT64_MAX);
    oscar_json_decref(o);
    /* Without REJECT_DUPLICATES the last value wins, as in jansson. */
    o = oscar_json_loadb("{\"a\":1,\"a\":2}", 13, 0, &e);
    cr_assert_eq(oscar_json_integer_value(oscar_json_object_get(o, "a")), 2);
    oscar_json_decref(o);
    /* Nesting: 64 levels parse, 65 are refused without touching the stack. */
    char deep[200];
    for (int depth = 64; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        o = oscar_json_loadb(deep, (size_t)depth * 2, 0, &e);
        cr_assert_eq(o != NULL, depth == 64, "depth %d: %s", depth, e.text);
        oscar_json_decref(o);
    }
    cr_assert(strstr(e.text, "nesting"), "%s", e.text);
}

Test(json_lite, value_count_is_bounded) {
    /* 2^20 values parse, one more is refused: memory stays bounded. */
    const size_t n = (size_t)1 << 20;
    for (size_t extra = 0; extra < 2; extra++) {
        size_t count = n - 1 + extra; /* the array itself is one value */
        size_t len = 2 * count + 1;
        char *s = malloc(len + 1);
        s[0] = '[';
        for (size_t i = 0; i < count; i++) s[1 + 2 * i] = '0', s[2 + 2 * i] = ',';
        s[len - 1] = ']';
        oscar_json_error e;
        oscar_json *o = oscar_json_loadb(s, len, 0, &e);
        cr_assert_eq(o != NULL, extra == 0, "%zu values: %s", count + 1, o ? "parsed" : e.text);
        if (!o) cr_assert(strstr(e.text, "more than 1048576 values"), "%s", e.text);
        oscar_json_decref(o);
        free(s);
    }
}

/* Parses a document with duplicate keys refused; *sec: the CPU time it took. */
static oscar_json *timed_object_parse(const char *s, size_t len, double *sec) {
    oscar_json_error e;
    clock_t t0 = clock();
    oscar_json *o = oscar_json_loadb(s, len, OSCAR_JSON_REJECT_DUPLICATES, &e);
    *sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
    cr_assert_not_null(o, "%s", e.text);
    return o;
}

Test(json_lite, many_keys_stay_linear) {
    /* 200k distinct keys: quadratic duplicate checks would take minutes. */
    const int n = 200000;
    size_t cap = (size_t)n * 16 + 2;
    char *s = malloc(cap);
    size_t len = 0;
    s[len++] = '{';
    for (int i = 0; i < n; i++) len += (size_t)snprintf(s + len, cap - len, "%s\"k%d\":%d", i ? "," : "", i, i);
    s[len++] = '}';
    double sec;
    oscar_json *o = timed_object_parse(s, len, &sec);
    cr_assert_eq(oscar_json_integer_value(oscar_json_object_get(o, "k123456")), 123456);
    cr_assert_lt(sec, 5.0, "parsing %d keys took %.1f s", n, sec);
    oscar_json_decref(o);
    free(s);
}

/* Keys crafted to collide in the low bits of FNV-1a from its standard offset
 * basis (the index's slot): the low k bits of the state depend only on the low
 * k bits before each byte, so a pair of 3-byte blocks that meet there from one
 * state stays met whatever follows, and m such stages give 2^m keys in one
 * slot. 65536 of them (a 3.4 MB parameter header) took 46 s under ASan, a
 * 16 MiB one minutes: quadratic. The slot hash is now seeded per object from
 * addresses a file cannot know, and mixes all 64 bits into the slot. */
Test(json_lite, crafted_colliding_keys_stay_linear, .timeout = 120) {
    enum { K = 21, STAGES = 16, BLK = 3 };
    static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
    const uint32_t mask = (1u << K) - 1, na = (uint32_t)(sizeof alpha - 1);
    int32_t *seen = malloc(sizeof(int32_t) << K);
    cr_assert(seen);
    char pair[STAGES][2][BLK];
    uint64_t s = 1469598103934665603ull & mask;
    for (int st = 0; st < STAGES; st++) {
        memset(seen, 0xff, sizeof(int32_t) << K);
        int found = 0;
        for (uint32_t c = 0; c < na * na * na && !found; c++) {
            const char b[BLK] = {alpha[c % na], alpha[c / na % na], alpha[c / na / na]};
            uint64_t t = s;
            for (int i = 0; i < BLK; i++) t = ((t ^ (unsigned char)b[i]) * 1099511628211ull) & mask;
            if (seen[t] >= 0) {
                const uint32_t o = (uint32_t)seen[t];
                const char a[BLK] = {alpha[o % na], alpha[o / na % na], alpha[o / na / na]};
                memcpy(pair[st][0], a, BLK);
                memcpy(pair[st][1], b, BLK);
                s = t;
                found = 1;
            }
            seen[t] = (int32_t)c;
        }
        cr_assert(found, "no colliding blocks at stage %d", st);
    }
    free(seen);
    const size_t n = (size_t)1 << STAGES, cap = n * (STAGES * BLK + 6) + 2;
    char *js = malloc(cap);
    cr_assert(js);
    size_t len = 0;
    js[len++] = '{';
    for (size_t i = 0; i < n; i++) {
        if (i) js[len++] = ',';
        js[len++] = '"';
        for (int st = 0; st < STAGES; st++, len += BLK) memcpy(js + len, pair[st][(i >> st) & 1], BLK);
        memcpy(js + len, "\":0", 3);
        len += 3;
    }
    js[len++] = '}';
    double sec;
    oscar_json *o = timed_object_parse(js, len, &sec);
    char last[STAGES * BLK + 1];
    for (int st = 0; st < STAGES; st++) memcpy(last + st * BLK, pair[st][1], BLK);
    last[STAGES * BLK] = '\0';
    cr_assert(oscar_json_is_integer(oscar_json_object_get(o, last)), "the last key is not found");
    cr_assert_lt(sec, 5.0, "parsing %zu colliding keys took %.1f s", n, sec);
    oscar_json_decref(o);
    free(js);
}
