/* oscar-eval --storage: 16-bit outlier rows per page and smaller quant groups
 * for chosen heads, as fake-quant ablations (tools/oscar_eval_storage.h). */
#include "oscar_eval_storage.h"
#include "oscar_format.h" /* the group rule */
#include "tool_params.h"   /* the parameters' code widths */
#include "tool_args.h"     /* tool_list_empty_item */

#include <math.h>
#include <stdint.h>
#include <ctype.h>
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
    if (!*s || isspace((unsigned char)*s)) return 0; /* strtol skips " " */
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
    if (tool_list_empty_item(val, '+'))
        return fail(err, errlen, "heads= has an empty item (a doubled, leading or trailing '+'):", val);
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
    if (tool_list_empty_item(spec, ',')) {
        fail(err, errlen, "empty item (a doubled, leading or trailing comma; separate key=value items by single "
             "commas) in", spec);
        goto bad;
    }
    int seen[10] = {0}; /* per key of keys[] below */
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq || eq == t || !eq[1]) {
            fail(err, errlen, "wants key=value items (out, by, group, kv, heads, clip, vgroup, vclip, bits, vbits), not", t);
            goto bad;
        }
        *eq = '\0';
        const char *key = t, *val = eq + 1;
        static const char *keys[10] = {"out", "by", "group", "kv", "heads", "clip", "vgroup", "vclip", "bits", "vbits"};
        int ki = -1;
        for (int i = 0; i < 10; i++)
            if (!strcmp(key, keys[i])) ki = i;
        if (ki < 0) {
            fail(err, errlen, "unknown key (out, by, group, kv, heads, clip, vgroup, vclip, bits, vbits):", key);
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
            /* the format's groups (format/oscar_format.h, FORMAT.md §2.2) */
            if (!parse_int(val, 1, 256, &v) || !oscar_group_supported((int)v, d)) {
                char allowed[128] = "";
                size_t used = 0;
                for (int g = 32; g <= d && used < sizeof allowed; g += 16)
                    if (oscar_group_supported(g, d))
                        used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%d", used ? ", " : "", g);
                snprintf(err, errlen, "--storage: %s= '%s' unsupported for head_dim %d: use one of %s (%s)", key, val,
                         d, allowed[0] ? allowed : "none", OSCAR_GROUP_RULE);
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
        case 8:
        case 9:
            if (!parse_int(val, 2, 4, &v)) {
                fail(err, errlen, ki == 8 ? "bits= wants a code width of 2, 3 or 4, not" : "vbits= wants a code width of 2, 3 or 4, not",
                     val);
                goto bad;
            }
            if (ki == 8) s->bits = (int)v;
            else s->vbits = (int)v;
            break;
        default: { /* clip, vclip */
            char *end;
            double cv = strtod(val, &end);
            if (end == val || *end || isspace((unsigned char)*val) || !(cv > 0.0 && cv <= 1.0) || !((float)cv > 0.0f)) { /* 1e-46: 0 as a float, unset */
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
    if (!s->outliers && !s->group && !s->clip && !s->vgroup && !s->vclip && !s->bits && !s->vbits) {
        fail(err, errlen, "changes nothing (give out=K, group=G, clip=C, vgroup=G, vclip=C, bits=B and/or vbits=B):",
             spec);
        goto bad;
    }
    if ((s->vgroup || s->vclip || s->vbits) && s->tensors == (1 << OSCAR_V)) {
        fail(err, errlen, "vgroup=/vclip=/vbits= set the values apart from the keys; with kv=v use group=/clip=/bits=:",
             spec);
        goto bad;
    }
    if (s->outliers && (s->bits || s->vbits)) {
        fail(err, errlen, "out= does not combine with bits=/vbits=:", spec);
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
    if (!in_kv(c, which) && !(which == OSCAR_V && (c->vgroup || c->vclip > 0.0f || c->vbits))) return 0;
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

int ev_storage_bits_of(const ev_storage *s, int layer, int h, oscar_kv which)
{
    const ev_storage *c = s ? clause_for(s, layer, h, which) : NULL;
    if (!c) return 0;
    if (which == OSCAR_V && c->vbits) return c->vbits;
    return in_kv(c, which) ? c->bits : 0;
}

int ev_storage_applies(const ev_storage *s, int layer, int h, oscar_kv which)
{
    return s && clause_for(s, layer, h, which) != NULL;
}

double ev_storage_bits(const ev_storage *s, int run_group, const oscar_params *p)
{
    double sum = 0.0;
    int n = 0;
    for (int l = 0; l < s->L; l++)
        for (int h = 0; h < s->Hkv; h++)
            for (int w = 0; w < 2; w++, n++) {
                const int g0 = ev_storage_group_of(s, l, h, (oscar_kv)w), g = g0 ? g0 : run_group;
                const int c0 = ev_storage_bits_of(s, l, h, (oscar_kv)w),
                          cb = c0 ? c0 : tool_params_code_bits(p, l, h, (oscar_kv)w);
                const double b = (double)cb + 32.0 / (double)g, k = ev_storage_outliers_of(s, l, h, (oscar_kv)w);
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

int ev_group_index(int group) { return group >= 32 && group <= 256 && group % 16 == 0 ? group / 16 - 2 : -1; }

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

/* ------------------------------------------------- wider codes (bits=) */
/* Round to nearest even at bf16 (8 significand bits), as the cache's input
 * dtype; NaN passes. */
static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return x;
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* Round to nearest even at fp16, saturating at +-65504 like the write path's
 * metadata (format/ref_quant.c meta_round). */
static float round_f16(float x)
{
    if (!isfinite(x)) return x;
    const double a = fabs((double)x);
    if (a >= 65520.0) return copysignf(65504.0f, x); /* rounds to Inf in fp16: saturate */
    if (a == 0.0) return x;
    double q;
    if (a < 0x1p-14) q = ldexp(nearbyint(ldexp((double)x, 24)), -24); /* subnormal: steps of 2^-24 */
    else {
        const int e = ilogb((double)x);
        q = ldexp(nearbyint(ldexp((double)x, 10 - e)), e - 10);
    }
    return (float)q;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The write path's tau (format/ref_quant.c oscar_ref_clip_tau): linear
 * interpolation between the order statistics at c (d - 1). */
static float clip_tau(int d, const float *x, float c)
{
    float s[256];
    float mx = 0.0f;
    for (int j = 0; j < d; j++) {
        s[j] = fabsf(x[j]);
        if (s[j] > mx) mx = s[j];
    }
    if (!(c < 1.0f)) return mx;
    qsort(s, (size_t)d, sizeof *s, cmp_float);
    const float pos = c * (float)(d - 1);
    int i = (int)floorf(pos);
    if (i < 0) i = 0;
    if (i > d - 1) i = d - 1;
    const float f = pos - (float)i, si = s[i], sn = i + 1 < d ? s[i + 1] : si;
    return si + f * (sn - si);
}

int ev_fakequant_bits(const oscar_params *p, int layer, int h, oscar_kv which, int bits, int group, int Hkv,
                      int d, int lo, int hi, float *rows)
{
    if (!p || !rows || bits < 2 || bits > 8 || d < 4 || d > 256 || d % 4 || group < 1 || d % group || h < 0 ||
        h >= Hkv || lo < 0 || hi < lo)
        return -1;
    const float *R = NULL, *F = NULL;
    float c = 1.0f;
    if (oscar_params_rotation(p, layer, h, which, &R) != OSCAR_OK || !R) return -1;
    if (oscar_params_feedback(p, layer, h, which, &F) != OSCAR_OK) return -1;
    if (oscar_params_clip_head(p, layer, h, which, &c) != OSCAR_OK) return -1;
    const float top = (float)((1 << bits) - 1);
    const int ng = d / group;
    float xr[256], v[256], deq[256], meta[2 * 256];
    for (int t = lo; t < hi; t++) {
        float *row = rows + ((size_t)t * (size_t)Hkv + (size_t)h) * (size_t)d;
        /* rotate (oscar_ref_rotate's order: i ascending, each term fused) and round to bf16 */
        for (int j = 0; j < d; j++) xr[j] = 0.0f;
        for (int i = 0; i < d; i++) {
            const float xi = row[i], *Ri = R + (size_t)i * d;
            for (int j = 0; j < d; j++) xr[j] = fmaf(xi, Ri[j], xr[j]);
        }
        for (int j = 0; j < d; j++) xr[j] = round_bf16(xr[j]);
        const float tau = c < 1.0f ? clip_tau(d, xr, c) : INFINITY;
        for (int j = 0; j < d; j++) v[j] = xr[j] < -tau ? -tau : (xr[j] > tau ? tau : xr[j]);
        for (int g = 0; g < ng; g++) {
            const float *gv = v + (size_t)g * group;
            float mn = gv[0], mx = gv[0];
            for (int j = 1; j < group; j++) {
                mn = gv[j] < mn ? gv[j] : mn;
                mx = gv[j] > mx ? gv[j] : mx;
            }
            meta[2 * g] = round_f16((mx - mn) / top);
            meta[2 * g + 1] = round_f16(mn);
        }
        if (F) memcpy(v, xr, (size_t)d * sizeof *v); /* feedback carries the clip's error too */
        for (int j = 0; j < d; j++) {
            const int g = j / group;
            const float a = meta[2 * g], b = meta[2 * g + 1];
            int code = 0;
            if (a != 0.0f) {
                const float r = floorf((v[j] - b) / a + 0.5f);
                code = !(r >= 0.0f) ? 0 : (r > top ? (int)top : (int)r);
            }
            deq[j] = b + a * (float)code;
            if (!F) continue;
            const float e = v[j] - deq[j];
            if (e == 0.0f) continue;
            const float *Fj = F + (size_t)j * (size_t)d;
            for (int k = j + 1; k < d; k++) v[k] = fmaf(-e, Fj[k], v[k]); /* FORMAT.md §2.3 */
        }
        /* rotate back: row[i] = sum_j deq[j] R[i][j] */
        for (int i = 0; i < d; i++) {
            const float *Ri = R + (size_t)i * d;
            float s = 0.0f;
            for (int j = 0; j < d; j++) s = fmaf(deq[j], Ri[j], s); /* oscar_ref_unrotate's order */
            row[i] = s;
        }
    }
    return 0;
}
