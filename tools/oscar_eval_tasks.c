/* oscar-eval --tasks: a long-context key-value lookup (docs/EVAL.md).
 *
 * A document of `ctx` tokens is calibration/evaluation text with F facts
 * "The code of X D1 D2 D3." inserted at sentence ends, spread over the
 * part of the document that lies in the 2-bit region for every query, and
 * F queries at its end, "The code of X D1 D2 D3." for every fact in a
 * random order (teacher forced). A query is right when the model's argmax
 * predicts all three digit tokens of its answer. The words come from the
 * model's own tokenizer (byte-level BPE "Ġword" or SentencePiece "▁word"
 * single tokens); names X are distinct per document. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar_eval.h"

/* Candidate key names: common single-token words; those missing from the
 * vocabulary are skipped. */
static const char *const k_names[] = {
    "server",  "kernel",  "driver",  "file",     "package", "user",    "module",  "device",  "system",
    "option",  "process", "network", "machine",  "program", "script",  "library", "command", "project",
    "service", "client",  "host",    "window",   "table",   "source",  "target",  "group",   "account",
    "printer", "disk",    "screen",  "keyboard", "mouse",   "router",  "switch",  "cache",   "buffer",
    "queue",   "thread",  "socket",  "port",     "page",    "image",   "folder",  "archive", "branch",
    "channel", "mirror",  "backup",  "session",  "domain",  "profile", "editor",  "browser", "manual"};
#define N_NAMES ((int)(sizeof k_names / sizeof k_names[0]))

/* Finds "PREFIXword": ID in tokenizer.json (the vocab's JSON text); -1 if absent. */
static int vocab_id(const char *json, const char *prefix, const char *word)
{
    char key[96];
    snprintf(key, sizeof key, "\"%s%s\":", prefix, word);
    const char *p = strstr(json, key);
    if (!p) return -1;
    p += strlen(key);
    while (*p == ' ') p++;
    char *end;
    long v = strtol(p, &end, 10);
    return end == p || v < 0 || v > 0x7fffffff ? -1 : (int)v;
}

int ev_task_vocab_load(const char *model_dir, int vocab, ev_task_vocab *tv, char *err, size_t errlen)
{
    memset(tv, 0, sizeof *tv);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
    if (oe_check_regular(path, "tokenizer") != OSCAR_OK) { /* a FIFO would block the fopen */
        snprintf(err, errlen, "--tasks needs the model's tokenizer.json: %s", oe_last_error());
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--tasks needs the model's tokenizer.json (%s): cannot open it", path);
        return -1;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n > 0 && n < (256L << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = '\0';
    else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "--tasks: cannot read %s (empty, over 256 MiB or unreadable); give the model's own "
                 "tokenizer.json", path);
        return -1;
    }
    /* Word-start marker: byte-level BPE (GPT-2 / Qwen / Llama-3) or SentencePiece. */
    const char *sp = vocab_id(buf, "\xc4\xa0", "code") >= 0 ? "\xc4\xa0" : "\xe2\x96\x81";
    const char *words[4] = {"The", "code", "of", NULL};
    int *ids[4] = {&tv->the, &tv->code, &tv->of, NULL};
    int ok = 1;
    for (int i = 0; words[i]; i++) ok &= (*ids[i] = vocab_id(buf, sp, words[i])) >= 0;
    tv->period = vocab_id(buf, "", ".");
    ok &= tv->period >= 0;
    for (int dgt = 0; dgt < 10; dgt++) {
        char s[2] = {(char)('0' + dgt), 0};
        ok &= (tv->digit_sp[dgt] = vocab_id(buf, sp, s)) >= 0;
        ok &= (tv->digit[dgt] = vocab_id(buf, "", s)) >= 0;
    }
    for (int i = 0; i < N_NAMES && tv->nnames < EV_TASK_MAX_NAMES; i++) {
        int id = vocab_id(buf, sp, k_names[i]);
        /* A key must be one token no other key or word of the fact shares: a tokenizer mapping two
         * names (or a name and "code", a digit, ...) to one id made facts that answer two queries,
         * scored as if they were distinct. */
        int taken = id == tv->the || id == tv->code || id == tv->of || id == tv->period;
        for (int dgt = 0; dgt < 10; dgt++) taken |= id == tv->digit[dgt] || id == tv->digit_sp[dgt];
        for (int j = 0; j < tv->nnames; j++) taken |= id == tv->names[j];
        if (id >= 0 && !taken) tv->names[tv->nnames++] = id;
    }
    free(buf);
    int ids_ok = ok;
    for (int i = 0; i < 3; i++) ids_ok &= *ids[i] < vocab;
    for (int dgt = 0; dgt < 10; dgt++) ids_ok &= tv->digit[dgt] < vocab && tv->digit_sp[dgt] < vocab;
    for (int i = 0; i < tv->nnames; i++) ids_ok &= tv->names[i] < vocab;
    if (!ok || !ids_ok || tv->period >= vocab || tv->nnames < EV_TASK_FACTS) {
        snprintf(err, errlen,
                 "--tasks: the tokenizer (%s) lacks single tokens for \" The\", \" code\", \" of\", \".\", "
                 "the digits (with and without a leading space) or %d key names (found %d)",
                 path, EV_TASK_FACTS, tv->nnames);
        return -1;
    }
    return 0;
}

/* "The code of X D1 D2 D3 ." into out; returns EV_TASK_FACT_LEN. */
static int fact_tokens(const ev_task_vocab *tv, int name, const int dg[3], uint32_t *out)
{
    int i = 0;
    out[i++] = (uint32_t)tv->the;
    out[i++] = (uint32_t)tv->code;
    out[i++] = (uint32_t)tv->of;
    out[i++] = (uint32_t)name;
    out[i++] = (uint32_t)tv->digit_sp[dg[0]];
    out[i++] = (uint32_t)tv->digit[dg[1]];
    out[i++] = (uint32_t)tv->digit[dg[2]];
    out[i++] = (uint32_t)tv->period;
    return i;
}

int ev_task_fits(int ctx, int sink, int recent)
{
    const int F = EV_TASK_FACTS, FL = EV_TASK_FACT_LEN;
    /* Every fact must lie in the 2-bit region for every query: it ends at
     * least recent + 8 positions before the first query. */
    const int q0 = ctx - F * FL, facts_end = q0 - recent - 8, first = sink + 8;
    return facts_end - first >= F * (FL + 16);
}

int ev_task_build(const ev_task_vocab *tv, const uint32_t *text, int64_t ntext, int ctx, int sink, int recent,
                  uint64_t seed, uint32_t *doc, int *answer_rows)
{
    const int F = EV_TASK_FACTS, FL = EV_TASK_FACT_LEN;
    const int q0 = ctx - F * FL, facts_end = q0 - recent - 8, first = sink + 8;
    if (!ev_task_fits(ctx, sink, recent) || ntext < ctx) return -1;
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 0x51ED;
    for (int i = 0; i < 4; i++) ev_xorshift(&st);
    int name[EV_TASK_FACTS], dg[EV_TASK_FACTS][3], order[EV_TASK_FACTS];
    /* Text from a random offset; names that occur in it are not used (a key must be unique). */
    int64_t off = ntext > ctx ? (int64_t)(ev_xorshift(&st) % (uint64_t)(ntext - ctx)) : 0;
    int pool[EV_TASK_MAX_NAMES], np = 0;
    for (int i = 0; i < tv->nnames; i++) {
        int seen = 0;
        for (int64_t t = off; t < off + ctx && !seen; t++) seen = text[t] == (uint32_t)tv->names[i];
        if (!seen) pool[np++] = tv->names[i];
    }
    if (np < F) return -1;
    for (int f = 0; f < F; f++) { /* distinct names: a partial shuffle */
        int j = f + (int)(ev_xorshift(&st) % (uint64_t)(np - f));
        int t = pool[f];
        pool[f] = pool[j];
        pool[j] = t;
        name[f] = pool[f];
        dg[f][0] = 1 + (int)(ev_xorshift(&st) % 9u); /* a 3-digit number without a leading zero */
        dg[f][1] = (int)(ev_xorshift(&st) % 10u);
        dg[f][2] = (int)(ev_xorshift(&st) % 10u);
        order[f] = f;
    }
    for (int f = F - 1; f > 0; f--) {
        int j = (int)(ev_xorshift(&st) % (uint64_t)(f + 1));
        int t = order[f];
        order[f] = order[j];
        order[j] = t;
    }
    /* Fact f goes after the first sentence end at or past a random point of
     * the first half of its segment (else at the segment's end). */
    const int seg = (facts_end - first) / F;
    int pos = 0;
    int64_t src = off;
    for (int f = 0; f < F; f++) {
        int lo = first + f * seg + (int)(ev_xorshift(&st) % (uint64_t)(seg / 2));
        int hi = first + (f + 1) * seg - FL;
        while (pos < hi && src < ntext) {
            uint32_t t = text[src++];
            doc[pos++] = t;
            if (pos >= lo && t == (uint32_t)tv->period) break;
        }
        pos += fact_tokens(tv, name[f], dg[f], doc + pos);
    }
    while (pos < q0 && src < ntext) doc[pos++] = text[src++];
    if (pos < q0) return -1;
    for (int q = 0; q < F; q++) {
        int f = order[q];
        fact_tokens(tv, name[f], dg[f], doc + pos);
        answer_rows[q] = pos + 3; /* row of X: it predicts D1; D2, D3 follow */
        pos += FL;
    }
    return pos == ctx ? 0 : -1;
}
