/* oscar-eval --storage: 16-bit outlier rows per page and smaller quant groups
 * for chosen heads, as fake-quant ablations (tools/oscar_eval_storage.h). */
#include "oscar_eval_storage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *what, const char *val)
{
    snprintf(err, errlen, "--storage: %s '%s'", what, val);
    return -1;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    if (!*s) return 0;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* "L:H+L:H..." or "all" into s->heads. */
static int parse_heads(const char *val, ev_storage *s, char *err, size_t errlen)
{
    if (!strcmp(val, "all")) {
        memset(s->heads, 1, (size_t)s->L * (size_t)s->Hkv);
        return 0;
    }
    char buf[160];
    if (strlen(val) >= sizeof buf) return fail(err, errlen, "heads= list too long:", val);
    snprintf(buf, sizeof buf, "%s", val);
    memset(s->heads, 0, (size_t)s->L * (size_t)s->Hkv);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, "+", &save); t; t = strtok_r(NULL, "+", &save)) {
        char *colon = strchr(t, ':');
        long l, h;
        if (!colon) return fail(err, errlen, "heads= wants LAYER:KV_HEAD pairs joined by '+', not", t);
        *colon = '\0';
        if (!parse_int(t, 0, s->L - 1, &l) || !parse_int(colon + 1, 0, s->Hkv - 1, &h)) {
            *colon = ':';
            snprintf(err, errlen, "--storage: heads= pair '%s' is not a layer in 0..%d and a KV head in 0..%d", t,
                     s->L - 1, s->Hkv - 1);
            return -1;
        }
        s->heads[l * s->Hkv + h] = 1;
        n++;
    }
    if (n == 0) return fail(err, errlen, "heads= names no head:", val);
    return 0;
}

/* One clause (no '/'): the fields of s, s->more NULL. */
static int parse_clause(const char *spec, int L, int Hkv, int d, ev_storage *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (L < 1 || Hkv < 1 || d < 1) {
        snprintf(err, errlen, "--storage: bad model shape %d layers, %d KV heads, head_dim %d", L, Hkv, d);
        return -1;
    }
    if (!spec || !*spec) return fail(err, errlen, "empty SPEC", "");
    if (strlen(spec) >= sizeof s->spec) return fail(err, errlen, "SPEC too long:", spec);
    snprintf(s->spec, sizeof s->spec, "%s", spec);
    s->L = L, s->Hkv = Hkv, s->d = d;
    s->tensors = (1 << OSCAR_K) | (1 << OSCAR_V);
    s->by = EV_BY_ERR;
    s->heads = malloc((size_t)L * (size_t)Hkv);
    if (!s->heads) return fail(err, errlen, "out of memory for", spec);
    memset(s->heads, 1, (size_t)L * (size_t)Hkv);
    char buf[160];
    snprintf(buf, sizeof buf, "%s", spec);
    int seen[8] = {0}; /* per key of keys[] below */
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq || eq == t || !eq[1]) {
            fail(err, errlen, "wants key=value items (out, by, group, kv, heads, clip, vgroup, vclip), not", t);
            goto bad;
        }
        *eq = '\0';
        const char *key = t, *val = eq + 1;
        static const char *keys[8] = {"out", "by", "group", "kv", "heads", "clip", "vgroup", "vclip"};
        int ki = -1;
        for (int i = 0; i < 8; i++)
            if (!strcmp(key, keys[i])) ki = i;
        if (ki < 0) {
            fail(err, errlen, "unknown key (out, by, group, kv, heads, clip, vgroup, vclip):", key);
            goto bad;
        }
        if (seen[ki]++) {
            fail(err, errlen, "key given twice:", key);
            goto bad;
        }
        long v;
        switch (ki) {
        case 0:
            if (!parse_int(val, 1, EV_PAGE - 1, &v)) {
                fail(err, errlen, "out= wants rows per page in 1..63, not", val);
                goto bad;
            }
            s->outliers = (int)v;
            break;
        case 1:
            if (!strcmp(val, "err")) s->by = EV_BY_ERR;
            else if (!strcmp(val, "norm")) s->by = EV_BY_NORM;
            else {
                fail(err, errlen, "by= wants err or norm, not", val);
                goto bad;
            }
            break;
        case 2:
        case 6:
            if (!parse_int(val, 1, 256, &v) || (v != 32 && v != 64 && v != 128) || v > d || d % v) {
                snprintf(err, errlen, "--storage: %s= '%s' unsupported for head_dim %d: use 32, 64 or 128 "
                                      "dividing head_dim", key, val, d);
                goto bad;
            }
            if (ki == 2) s->group = (int)v;
            else s->vgroup = (int)v;
            break;
        case 3:
            if (!strcmp(val, "k")) s->tensors = 1 << OSCAR_K;
            else if (!strcmp(val, "v")) s->tensors = 1 << OSCAR_V;
            else if (!strcmp(val, "kv")) s->tensors = (1 << OSCAR_K) | (1 << OSCAR_V);
            else {
                fail(err, errlen, "kv= wants k, v or kv, not", val);
                goto bad;
            }
            break;
        case 4:
            if (parse_heads(val, s, err, errlen) != 0) goto bad;
            break;
        default: { /* clip, vclip */
            char *end;
            double cv = strtod(val, &end);
            if (*end || !(cv > 0.0 && cv <= 1.0)) {
                fail(err, errlen, ki == 5 ? "clip= wants a ratio in (0, 1], not" : "vclip= wants a ratio in (0, 1], not",
                     val);
                goto bad;
            }
            if (ki == 5) s->clip = (float)cv;
            else s->vclip = (float)cv;
            break;
        }
        }
    }
    if (!s->outliers && !s->group && !s->clip && !s->vgroup && !s->vclip) {
        fail(err, errlen, "changes nothing (give out=K, group=G, clip=C, vgroup=G and/or vclip=C):", spec);
        goto bad;
    }
    if ((s->vgroup || s->vclip) && s->tensors == (1 << OSCAR_V)) {
        fail(err, errlen, "vgroup=/vclip= set the values apart from the keys; with kv=v use group=/clip=:", spec);
        goto bad;
    }
    if (seen[1] && !s->outliers) { /* by= */
        fail(err, errlen, "by= needs out=K:", spec);
        goto bad;
    }
    return 0;
bad:
    free(s->heads);
    s->heads = NULL;
    return -1;
}

void ev_storage_free(ev_storage *s)
{
    if (!s) return;
    free(s->heads);
    s->heads = NULL;
    for (ev_storage *c = s->more, *next; c; c = next) {
        next = c->more;
        free(c->heads);
        free(c);
    }
    s->more = NULL;
}

int ev_storage_parse(const char *spec, int L, int Hkv, int d, ev_storage *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (!spec || !*spec) return fail(err, errlen, "empty SPEC", "");
    if (strlen(spec) >= sizeof s->spec) return fail(err, errlen, "SPEC too long:", spec);
    char buf[160];
    snprintf(buf, sizeof buf, "%s", spec);
    ev_storage *last = NULL;
    int n = 0;
    for (char *a = buf, *slash;; a = slash + 1) {
        slash = strchr(a, '/');
        if (slash) *slash = '\0';
        if (!*a) {
            ev_storage_free(s);
            return fail(err, errlen, "empty clause (clauses are joined by '/') in", spec);
        }
        ev_storage *c = n == 0 ? s : calloc(1, sizeof *c);
        if (!c) {
            ev_storage_free(s);
            return fail(err, errlen, "out of memory for", spec);
        }
        if (parse_clause(a, L, Hkv, d, c, err, errlen) != 0) {
            if (n) free(c);
            ev_storage_free(s);
            s->heads = NULL;
            return -1;
        }
        if (n) last->more = c;
        last = c;
        n++;
        if (!slash) break;
    }
    snprintf(s->spec, sizeof s->spec, "%s", spec);
    return 0;
}

int ev_storage_has_outliers(const ev_storage *s)
{
    for (const ev_storage *c = s; c; c = c->more)
        if (c->outliers) return 1;
    return 0;
}

/* Whether kv= names the tensor. */
static int in_kv(const ev_storage *s, oscar_kv which) { return (s->tensors & (1 << which)) != 0; }

/* Whether one clause names (layer, h, which). */
static int clause_applies(const ev_storage *c, int layer, int h, oscar_kv which)
{
    if (!c->heads || layer < 0 || layer >= c->L || h < 0 || h >= c->Hkv) return 0;
    if (!in_kv(c, which) && !(which == OSCAR_V && (c->vgroup || c->vclip > 0.0f))) return 0;
    return c->heads[layer * c->Hkv + h] != 0;
}

/* The last clause that names (layer, h, which), or NULL. */
static const ev_storage *clause_for(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *hit = NULL;
    for (const ev_storage *c = s; c; c = c->more)
        if (clause_applies(c, layer, h, which)) hit = c;
    return hit;
}

int ev_storage_outliers_of(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *c = s ? clause_for(s, layer, h, which) : NULL;
    return c && in_kv(c, which) ? c->outliers : 0;
}

ev_outlier_by ev_storage_by_of(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *c = s ? clause_for(s, layer, h, which) : NULL;
    return c ? c->by : EV_BY_ERR;
}

int ev_storage_group_of(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *c = s ? clause_for(s, layer, h, which) : NULL;
    if (!c) return 0;
    if (which == OSCAR_V && c->vgroup) return c->vgroup;
    return in_kv(c, which) ? c->group : 0;
}

float ev_storage_clip_of(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *c = s ? clause_for(s, layer, h, which) : NULL;
    if (!c) return 0.0f;
    if (which == OSCAR_V && c->vclip > 0.0f) return c->vclip;
    return in_kv(c, which) ? c->clip : 0.0f;
}

int ev_storage_applies(const ev_storage *s, int layer, int h, oscar_kv which)
{
    return s && clause_for(s, layer, h, which) != NULL;
}

double ev_storage_bits(const ev_storage *s, int run_group)
{
    double sum = 0.0;
    int n = 0;
    for (int l = 0; l < s->L; l++)
        for (int h = 0; h < s->Hkv; h++)
            for (int w = 0; w < 2; w++, n++) {
                const int g0 = ev_storage_group_of(s, l, h, (oscar_kv)w), g = g0 ? g0 : run_group;
                const double b = 2.0 + 32.0 / (double)g, k = ev_storage_outliers_of(s, l, h, (oscar_kv)w);
                sum += (k * (16.0 + EV_PAGE_INDEX_BITS / (double)s->d) + ((double)EV_PAGE - k) * b) / EV_PAGE;
            }
    return sum / n;
}

void ev_topk(const double *score, int n, int k, unsigned char *keep)
{
    memset(keep, 0, (size_t)n);
    if (k >= n) {
        memset(keep, 1, (size_t)n);
        return;
    }
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!keep[i] && (best < 0 || score[i] > score[best])) best = i;
        keep[best] = 1;
    }
}

int ev_group_index(int group) { return group == 32 ? 0 : group == 64 ? 1 : group == 128 ? 2 : -1; }

void ev_storage_apply(const ev_storage *s, int layer, oscar_kv which, int lo, int hi, const float *orig,
                      const float *const qg[EV_NGROUPS], float *q, long long *kept)
{
    const int Hkv = s->Hkv, d = s->d;
    const size_t row = (size_t)Hkv * (size_t)d;
    for (int h = 0; h < Hkv; h++) {
        if (!ev_storage_applies(s, layer, h, which)) continue;
        const int out = ev_storage_outliers_of(s, layer, h, which), gi = ev_group_index(ev_storage_group_of(s, layer, h, which));
        const ev_outlier_by by = ev_storage_by_of(s, layer, h, which);
        const float *g = gi >= 0 && qg ? qg[gi] : NULL;
        if (g)
            for (int p = lo; p < hi; p++) memcpy(q + p * row + (size_t)h * d, g + p * row + (size_t)h * d, (size_t)d * sizeof *q);
        if (!out) continue;
        for (int p0 = lo / EV_PAGE * EV_PAGE; p0 < hi; p0 += EV_PAGE) {
            const int a = p0 > lo ? p0 : lo, e = p0 + EV_PAGE < hi ? p0 + EV_PAGE : hi;
            double score[EV_PAGE];
            unsigned char keep[EV_PAGE];
            for (int p = a; p < e; p++) {
                const float *o = orig + p * row + (size_t)h * d, *x = q + p * row + (size_t)h * d;
                double acc = 0.0;
                for (int j = 0; j < d; j++) {
                    double t = by == EV_BY_NORM ? (double)o[j] : (double)o[j] - (double)x[j];
                    acc += t * t;
                }
                score[p - a] = acc;
            }
            ev_topk(score, e - a, out, keep);
            for (int p = a; p < e; p++)
                if (keep[p - a]) {
                    memcpy(q + p * row + (size_t)h * d, orig + p * row + (size_t)h * d, (size_t)d * sizeof *q);
                    if (kept) (*kept)++;
                }
        }
    }
}
