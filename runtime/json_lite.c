/* Small JSON reader/writer (see json_lite.h for why and what subset).
 * Strict RFC 8259 parsing as jansson does it: UTF-8 validated, no raw
 * control characters, no \u0000, integers must fit 64 bits; nesting is
 * bounded so hostile headers cannot exhaust the stack, and objects are
 * hashed (with a seed a file cannot know) so hostile headers with many keys
 * stay linear. */
#define OSCAR_JSON_NO_JANSSON_NAMES 1
#include "json_lite.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { J_NULL, J_FALSE, J_TRUE, J_INT, J_REAL, J_STR, J_ARR, J_OBJ };
#define MAX_DEPTH 64
/* A parameter header holds a few hundred values; the bound keeps a hostile
 * 16 MiB header of tiny values from costing gigabytes (~100 bytes a value). */
#define MAX_VALUES (1u << 20)

struct oscar_json {
    int type;
    size_t refs;
    oscar_json_int i;
    char *s; /* J_STR: the string; J_REAL: its source text, written back verbatim */
    size_t len;
    oscar_json **v; /* J_ARR, J_OBJ values */
    char **k;       /* J_OBJ keys */
    size_t n, cap;
    size_t *slot;   /* J_OBJ: open-addressing index (entry + 1, 0 empty), nslot a power of 2 */
    size_t nslot;
    uint64_t seed;  /* J_OBJ: the index's hash seed (hash_key) */
};

/* murmur3's 64-bit finalizer: every input bit moves every output bit. */
static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static oscar_json *new_value(int type) {
    oscar_json *j = calloc(1, sizeof *j);
    if (j) {
        j->type = type;
        j->refs = 1;
        /* From the object's heap address and this frame's stack address (both placed
         * by ASLR): a file cannot know it, so it cannot pick keys that share a slot. */
        if (type == J_OBJ) j->seed = mix64((uint64_t)(uintptr_t)j ^ ((uint64_t)(uintptr_t)&j << 20));
    }
    return j;
}

void oscar_json_decref(oscar_json *j) {
    if (!j || --j->refs) return;
    for (size_t i = 0; i < j->n; i++) {
        oscar_json_decref(j->v[i]);
        if (j->k) free(j->k[i]);
    }
    free(j->v);
    free(j->k);
    free(j->slot);
    free(j->s);
    free(j);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;  /* overlong */
        if (c == 0xED) hi = 0x9F;  /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;  /* overlong */
        if (c == 0xF4) hi = 0x8F;  /* beyond U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return len;
}

static int utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = utf8_len((const unsigned char *)s + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

oscar_json *oscar_json_object(void) { return new_value(J_OBJ); }
oscar_json *oscar_json_array(void) { return new_value(J_ARR); }
oscar_json *oscar_json_boolean(int v) { return new_value(v ? J_TRUE : J_FALSE); }
oscar_json *oscar_json_integer(oscar_json_int v) {
    oscar_json *j = new_value(J_INT);
    if (j) j->i = v;
    return j;
}
/* Takes ownership of s (len bytes + NUL). */
static oscar_json *string_own(int type, char *s, size_t len) {
    oscar_json *j = new_value(type);
    if (!j) {
        free(s);
        return NULL;
    }
    j->s = s;
    j->len = len;
    return j;
}
oscar_json *oscar_json_string(const char *s) {
    if (!s) return NULL;
    size_t len = strlen(s);
    if (!utf8_valid(s, len)) return NULL;
    char *c = malloc(len + 1);
    if (!c) return NULL;
    memcpy(c, s, len + 1);
    return string_own(J_STR, c, len);
}

/* ---------------------------------------------------------------- objects */
/* FNV-1a from the object's seed, mixed: FNV's low bits depend only on the low bits
 * before each byte, so keys crafted to share them shared a slot (quadratic lookups). */
static size_t hash_key(const oscar_json *o, const char *k) {
    uint64_t h = 1469598103934665603ull ^ o->seed;
    for (; *k; k++) h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return (size_t)mix64(h);
}

/* Index of key in obj, or (size_t)-1. */
static size_t find_key(const oscar_json *o, const char *key) {
    if (!o->nslot) return (size_t)-1;
    for (size_t h = hash_key(o, key) & (o->nslot - 1);; h = (h + 1) & (o->nslot - 1)) {
        size_t e = o->slot[h];
        if (!e) return (size_t)-1;
        if (!strcmp(o->k[e - 1], key)) return e - 1;
    }
}

static void index_insert(oscar_json *o, size_t entry) {
    size_t h = hash_key(o, o->k[entry]) & (o->nslot - 1);
    while (o->slot[h]) h = (h + 1) & (o->nslot - 1);
    o->slot[h] = entry + 1;
}

/* Room for one more entry (arrays and objects); index kept at load <= 1/2. */
static int grow(oscar_json *c) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        if (cap > SIZE_MAX / sizeof(void *)) return -1;
        oscar_json **v = realloc(c->v, cap * sizeof *v);
        if (!v) return -1;
        c->v = v;
        if (c->type == J_OBJ) {
            char **k = realloc(c->k, cap * sizeof *k);
            if (!k) return -1;
            c->k = k;
        }
        c->cap = cap;
    }
    if (c->type == J_OBJ && (c->n + 1) * 2 > c->nslot) {
        size_t ns = c->nslot ? c->nslot * 2 : 16;
        if (ns > SIZE_MAX / sizeof(size_t)) return -1;
        size_t *slot = calloc(ns, sizeof *slot);
        if (!slot) return -1;
        free(c->slot);
        c->slot = slot;
        c->nslot = ns;
        for (size_t i = 0; i < c->n; i++) index_insert(c, i);
    }
    return 0;
}

/* Sets key (copied, or taken when own_key) to v (reference stolen). */
static int object_put(oscar_json *o, char *key, int own_key, oscar_json *v) {
    size_t e = find_key(o, key);
    if (e != (size_t)-1) {
        oscar_json_decref(o->v[e]);
        o->v[e] = v;
        if (own_key) free(key);
        return 0;
    }
    char *k = key;
    if (!own_key) {
        size_t len = strlen(key);
        k = malloc(len + 1);
        if (k) memcpy(k, key, len + 1);
    }
    if (!k || grow(o)) {
        free(k);
        oscar_json_decref(v);
        return -1;
    }
    o->k[o->n] = k;
    o->v[o->n] = v;
    index_insert(o, o->n++);
    return 0;
}

int oscar_json_object_set_new(oscar_json *obj, const char *key, oscar_json *v) {
    if (!obj || obj->type != J_OBJ || !key || !v || !utf8_valid(key, strlen(key))) {
        oscar_json_decref(v);
        return -1;
    }
    return object_put(obj, (char *)key, 0, v);
}

int oscar_json_object_set(oscar_json *obj, const char *key, oscar_json *v) {
    if (v) v->refs++;
    return oscar_json_object_set_new(obj, key, v);
}

int oscar_json_array_append_new(oscar_json *arr, oscar_json *v) {
    if (!arr || arr->type != J_ARR || !v || grow(arr)) {
        oscar_json_decref(v);
        return -1;
    }
    arr->v[arr->n++] = v;
    return 0;
}

oscar_json *oscar_json_object_get(const oscar_json *obj, const char *key) {
    if (!obj || obj->type != J_OBJ || !key) return NULL;
    size_t e = find_key(obj, key);
    return e == (size_t)-1 ? NULL : obj->v[e];
}

int oscar_json_object_nth(const oscar_json *obj, size_t i, const char **key, oscar_json **val) {
    if (!obj || obj->type != J_OBJ || i >= obj->n) return 0;
    *key = obj->k[i];
    *val = obj->v[i];
    return 1;
}

int oscar_json_is_object(const oscar_json *v) { return v && v->type == J_OBJ; }
int oscar_json_is_array(const oscar_json *v) { return v && v->type == J_ARR; }
int oscar_json_is_string(const oscar_json *v) { return v && v->type == J_STR; }
int oscar_json_is_integer(const oscar_json *v) { return v && v->type == J_INT; }
int oscar_json_is_boolean(const oscar_json *v) { return v && (v->type == J_TRUE || v->type == J_FALSE); }
int oscar_json_is_true(const oscar_json *v) { return v && v->type == J_TRUE; }
oscar_json_int oscar_json_integer_value(const oscar_json *v) { return v && v->type == J_INT ? v->i : 0; }
const char *oscar_json_string_value(const oscar_json *v) { return v && v->type == J_STR ? v->s : NULL; }
size_t oscar_json_string_length(const oscar_json *v) { return v && v->type == J_STR ? v->len : 0; }
size_t oscar_json_array_size(const oscar_json *v) { return v && v->type == J_ARR ? v->n : 0; }
oscar_json *oscar_json_array_get(const oscar_json *arr, size_t i) {
    return arr && arr->type == J_ARR && i < arr->n ? arr->v[i] : NULL;
}

/* ------------------------------------------------------------------ writer */
typedef struct buf {
    char *p;
    size_t n, cap;
    int bad;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->bad) return;
    if (n > SIZE_MAX - b->n - 1) {
        b->bad = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap = cap > SIZE_MAX / 2 ? b->n + n + 1 : cap * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* jansson's escaping: quote, backslash and control characters only. */
static void put_string(buf *b, const char *s, size_t len) {
    put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c != '"' && c != '\\' && c >= 0x20) continue;
        put(b, s + run, i - run);
        run = i + 1;
        char seq[8];
        switch (c) {
        case '"': puts_(b, "\\\""); break;
        case '\\': puts_(b, "\\\\"); break;
        case '\b': puts_(b, "\\b"); break;
        case '\f': puts_(b, "\\f"); break;
        case '\n': puts_(b, "\\n"); break;
        case '\r': puts_(b, "\\r"); break;
        case '\t': puts_(b, "\\t"); break;
        default:
            snprintf(seq, sizeof seq, "\\u%04X", c);
            puts_(b, seq);
        }
    }
    put(b, s + run, len - run);
    put(b, "\"", 1);
}

typedef struct keyref {
    const char *k;
    size_t i;
} keyref;
static int keyref_cmp(const void *a, const void *b) {
    return strcmp(((const keyref *)a)->k, ((const keyref *)b)->k);
}

static void dump(buf *b, const oscar_json *j, unsigned flags) {
    const char *comma = flags & OSCAR_JSON_COMPACT ? "," : ", ", *colon = flags & OSCAR_JSON_COMPACT ? ":" : ": ";
    char num[32];
    switch (j->type) {
    case J_NULL: puts_(b, "null"); break;
    case J_FALSE: puts_(b, "false"); break;
    case J_TRUE: puts_(b, "true"); break;
    case J_INT:
        snprintf(num, sizeof num, "%lld", j->i);
        puts_(b, num);
        break;
    case J_REAL: put(b, j->s, j->len); break;
    case J_STR: put_string(b, j->s, j->len); break;
    case J_ARR:
        puts_(b, "[");
        for (size_t i = 0; i < j->n; i++) {
            if (i) puts_(b, comma);
            dump(b, j->v[i], flags);
        }
        puts_(b, "]");
        break;
    case J_OBJ: {
        keyref *order = NULL;
        if ((flags & OSCAR_JSON_SORT_KEYS) && j->n > 1) {
            order = malloc(j->n * sizeof *order);
            if (!order) {
                b->bad = 1;
                return;
            }
            for (size_t i = 0; i < j->n; i++) order[i] = (keyref){j->k[i], i};
            qsort(order, j->n, sizeof *order, keyref_cmp);
        }
        puts_(b, "{");
        for (size_t i = 0; i < j->n; i++) {
            size_t e = order ? order[i].i : i;
            if (i) puts_(b, comma);
            put_string(b, j->k[e], strlen(j->k[e]));
            puts_(b, colon);
            dump(b, j->v[e], flags);
        }
        puts_(b, "}");
        free(order);
        break;
    }
    }
}

char *oscar_json_dumps(const oscar_json *v, unsigned flags) {
    if (!v) return NULL;
    buf b = {0};
    dump(&b, v, flags);
    if (b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------------ parser */
typedef struct parser {
    const char *s;
    size_t n, i;
    unsigned flags;
    oscar_json_error *err;
    int depth;
    size_t values;
} parser;

static oscar_json *fail(parser *p, const char *what) {
    if (p->err && !p->err->text[0]) {
        snprintf(p->err->text, sizeof p->err->text, "%s", what);
        p->err->position = p->i > (size_t)INT32_MAX ? INT32_MAX : (int)p->i;
    }
    return NULL;
}

static void skip_ws(parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int hex4(parser *p, unsigned *out) {
    if (p->n - p->i < 4) return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i + (size_t)k];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16) return 0;
        v = v * 16 + d;
    }
    p->i += 4;
    *out = v;
    return 1;
}

/* Parses the string at p->i (a '"'); returns a malloc'ed NUL-terminated copy. */
static char *parse_string(parser *p, size_t *len_out) {
    p->i++;
    /* The decoded string is never longer than its source. */
    size_t start = p->i, out = 0;
    size_t end = start;
    while (end < p->n && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end > p->n) end = p->n;
    char *d = malloc(end - start + 1);
    if (!d) {
        fail(p, "out of memory");
        return NULL;
    }
    for (;;) {
        if (p->i >= p->n) {
            fail(p, "unterminated string");
            break;
        }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            d[out] = '\0';
            *len_out = out;
            return d;
        }
        if (c < 0x20) {
            fail(p, "control character in string");
            break;
        }
        if (c != '\\') {
            size_t l = utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
            if (!l) {
                fail(p, "invalid UTF-8 in string");
                break;
            }
            memcpy(d + out, p->s + p->i, l);
            out += l;
            p->i += l;
            continue;
        }
        p->i++;
        if (p->i >= p->n) {
            fail(p, "unterminated string");
            break;
        }
        char e = p->s[p->i++];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            d[out++] = map[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') {
            p->i--;
            fail(p, "invalid escape in string");
            break;
        }
        unsigned cp;
        if (!hex4(p, &cp)) {
            fail(p, "invalid \\u escape");
            break;
        }
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail(p, "lone low surrogate in \\u escape");
            break;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned lo;
            if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                fail(p, "high surrogate not followed by a low surrogate");
                break;
            }
            p->i += 2;
            if (!hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                fail(p, "high surrogate not followed by a low surrogate");
                break;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) {
            fail(p, "\\u0000 is not allowed in a string");
            break;
        }
        /* An escape takes 6 or 12 source bytes and at most 4 output bytes. */
        if (cp < 0x80) d[out++] = (char)cp;
        else if (cp < 0x800) {
            d[out++] = (char)(0xC0 | (cp >> 6));
            d[out++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            d[out++] = (char)(0xE0 | (cp >> 12));
            d[out++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            d[out++] = (char)(0x80 | (cp & 0x3F));
        } else {
            d[out++] = (char)(0xF0 | (cp >> 18));
            d[out++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            d[out++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            d[out++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    free(d);
    return NULL;
}

static int is_digit(parser *p) { return p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9'; }

static oscar_json *parse_number(parser *p) {
    size_t start = p->i;
    int neg = 0, real = 0;
    if (p->s[p->i] == '-') {
        neg = 1;
        p->i++;
    }
    if (!is_digit(p)) return fail(p, "invalid number");
    if (p->s[p->i] == '0') {
        p->i++;
        if (is_digit(p)) return fail(p, "invalid number (leading zero)");
    } else
        while (is_digit(p)) p->i++;
    size_t int_end = p->i;
    if (p->i < p->n && p->s[p->i] == '.') {
        real = 1;
        p->i++;
        if (!is_digit(p)) return fail(p, "invalid number");
        while (is_digit(p)) p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        real = 1;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (!is_digit(p)) return fail(p, "invalid number");
        while (is_digit(p)) p->i++;
    }
    if (real) {
        size_t len = p->i - start;
        char *t = malloc(len + 1);
        if (!t) return fail(p, "out of memory");
        memcpy(t, p->s + start, len);
        t[len] = '\0';
        /* Overflow to infinity is refused (as jansson); the value itself is
         * kept as text. strtod reads the locale's decimal point. */
        char *dot = strchr(t, '.');
        const char *lp = localeconv()->decimal_point;
        if (dot && lp && lp[0] && !lp[1]) *dot = lp[0];
        errno = 0;
        double x = strtod(t, NULL);
        int over = errno == ERANGE && (x == HUGE_VAL || x == -HUGE_VAL);
        if (dot) *dot = '.';
        if (over) {
            free(t);
            p->i = start;
            return fail(p, "real number overflow");
        }
        oscar_json *j = string_own(J_REAL, t, len);
        return j ? j : fail(p, "out of memory");
    }
    /* Accumulate negatively so INT64_MIN fits. */
    long long v = 0;
    for (size_t k = start + (size_t)neg; k < int_end; k++) {
        int dgt = p->s[k] - '0';
        if (v < (LLONG_MIN + dgt) / 10) {
            p->i = start;
            return fail(p, "too big integer");
        }
        v = v * 10 - dgt;
    }
    if (!neg) {
        if (v == LLONG_MIN) {
            p->i = start;
            return fail(p, "too big integer");
        }
        v = -v;
    }
    oscar_json *j = oscar_json_integer(v);
    return j ? j : fail(p, "out of memory");
}

static oscar_json *parse_value(parser *p);

static oscar_json *parse_container(parser *p, int obj) {
    if (++p->depth > MAX_DEPTH) return fail(p, "nesting deeper than 64 levels");
    oscar_json *c = obj ? oscar_json_object() : oscar_json_array();
    if (!c) return fail(p, "out of memory");
    char close = obj ? '}' : ']';
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        p->depth--;
        return c;
    }
    for (;;) {
        char *key = NULL;
        if (obj) {
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') {
                fail(p, "string or '}' expected");
                break;
            }
            size_t klen;
            size_t kpos = p->i;
            key = parse_string(p, &klen);
            if (!key) break;
            if ((p->flags & OSCAR_JSON_REJECT_DUPLICATES) && find_key(c, key) != (size_t)-1) {
                free(key);
                p->i = kpos;
                fail(p, "duplicate object key");
                break;
            }
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                fail(p, "':' expected");
                break;
            }
            p->i++;
        }
        oscar_json *v = parse_value(p);
        if (!v) {
            free(key);
            break;
        }
        if (obj ? object_put(c, key, 1, v) : oscar_json_array_append_new(c, v)) {
            fail(p, "out of memory");
            break;
        }
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            p->depth--;
            return c;
        }
        fail(p, obj ? "',' or '}' expected" : "',' or ']' expected");
        break;
    }
    oscar_json_decref(c);
    return NULL;
}

static oscar_json *literal(parser *p, const char *word, int type) {
    size_t len = strlen(word);
    if (p->n - p->i < len || memcmp(p->s + p->i, word, len) != 0) return fail(p, "invalid token");
    p->i += len;
    oscar_json *j = new_value(type);
    return j ? j : fail(p, "out of memory");
}

static oscar_json *parse_value(parser *p) {
    skip_ws(p);
    if (p->i >= p->n) return fail(p, "unexpected end of input");
    if (++p->values > MAX_VALUES) return fail(p, "more than 1048576 values");
    char c = p->s[p->i];
    if (c == '{' || c == '[') return parse_container(p, c == '{');
    if (c == '"') {
        size_t len;
        char *s = parse_string(p, &len);
        if (!s) return NULL;
        oscar_json *j = string_own(J_STR, s, len);
        return j ? j : fail(p, "out of memory");
    }
    if (c == 't') return literal(p, "true", J_TRUE);
    if (c == 'f') return literal(p, "false", J_FALSE);
    if (c == 'n') return literal(p, "null", J_NULL);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
    return fail(p, "invalid token");
}

oscar_json *oscar_json_loadb(const char *s, size_t len, unsigned flags, oscar_json_error *err) {
    parser p = {s, len, 0, flags, err, 0, 0};
    if (err) {
        err->text[0] = '\0';
        err->position = 0;
    }
    if (!s) return fail(&p, "no input");
    skip_ws(&p);
    if (p.i >= p.n || (s[p.i] != '{' && s[p.i] != '[')) return fail(&p, "'[' or '{' expected");
    oscar_json *j = parse_value(&p);
    if (!j) return NULL;
    skip_ws(&p);
    if (p.i != p.n) {
        oscar_json_decref(j);
        return fail(&p, "end of file expected");
    }
    return j;
}
