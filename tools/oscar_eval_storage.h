/* oscar-eval --storage: storage-format ablations evaluated by fake-quant only
 * (docs/eval/retrieval.md, fifth step). Nothing here is a library format:
 * the on-disk layout, the ABI and the kernels are untouched; the figures say
 * whether such a format change would be worth building, with its bits counted.
 *
 * A SPEC is a comma-separated list of key=value:
 *   out=K        keep K rows per page (EV_PAGE tokens) and KV head in bf16, the
 *                rest in 2 bits (1..EV_PAGE-1); a 6-bit in-page index per row
 *   by=err|norm  which rows: largest squared 2-bit reconstruction error of the
 *                row (its own codes, computable by the write path from the row
 *                alone) or largest L2 norm (default err)
 *   group=G      quant group along head_dim for the selected heads (32, 64, 128)
 *   kv=k|v|kv    the tensors it applies to (default kv; K and V select apart)
 *   clip=C       clip ratio (0, 1] of the selected heads instead of the file's (a
 *                calibration-side change, to combine with the storage ones)
 *   vgroup=G     the values' group where it differs from group= (V then changes
 *                on the selected heads whatever kv= says; kv=v refuses them)
 *   vclip=C      the values' clip where it differs from clip= (same rules)
 *   bits=B       code width of the selected heads: 2 (the format's), 3 or 4 bits
 *                per element, 2^B uniform levels per group (a format that does not
 *                exist: ev_fakequant_bits, the write path's rotation, clip and
 *                error feedback with 2^B - 1 steps instead of 3)
 *   vbits=B      the values' code width where it differs from bits= (same rules
 *                as vgroup=)
 *   heads=all|L:H+L:H...  the (layer, KV head) pairs it applies to (default all)
 * out= and by= apply to the tensors of kv= only. At least one of out, group,
 * clip, vgroup, vclip, bits, vbits; out= does not combine with bits=/vbits=. Clauses joined by '/' set different heads apart
 * ("clip=1,group=32,kv=k,heads=4:1+3:0/vclip=1,heads=4:1"): where several name
 * a (layer, KV head, K/V), the last one decides all of its settings. */
#ifndef OSCAR_EVAL_STORAGE_H
#define OSCAR_EVAL_STORAGE_H

#include <stddef.h>

#include "oscar/oscar.h"

#define EV_PAGE 64      /* tokens per page (the layout default, FORMAT.md) */
#define EV_PAGE_INDEX_BITS 6 /* log2(EV_PAGE): one in-page index per 16-bit row */

typedef enum ev_outlier_by { EV_BY_ERR = 0, EV_BY_NORM = 1 } ev_outlier_by;

typedef struct ev_storage {
    int outliers;          /* rows per page and KV head kept bf16 (0: none) */
    ev_outlier_by by;
    int group;             /* quant group of the selected heads (0: the run's) */
    float clip;            /* clip ratio of the selected heads (0: the file's) */
    int vgroup;            /* values' group where it differs from group (0: none) */
    float vclip;           /* values' clip where it differs from clip (0: none) */
    int bits;              /* code width of the selected heads (0: the format's 2) */
    int vbits;             /* values' code width where it differs from bits (0: none) */
    int tensors;           /* bit OSCAR_K: keys, bit OSCAR_V: values */
    int L, Hkv, d;
    unsigned char *heads;  /* [L][Hkv]: 1 where the change applies */
    char spec[160];        /* as given (the whole SPEC in the first clause) */
    struct ev_storage *more; /* the next '/' clause (NULL: none) */
} ev_storage;

#define EV_NGROUPS 15 /* groups 32, 48, ..., 256: the format's, index G / 16 - 2 (ev_group_index) */

/* Parses SPEC for a model of L layers, Hkv KV heads, head_dim d. 0, or -1
 * with a message in err (nothing to free then; s->heads NULL). */
int ev_storage_parse(const char *spec, int L, int Hkv, int d, ev_storage *s, char *err, size_t errlen);
void ev_storage_free(ev_storage *s);

/* Whether the change applies to (layer, KV head, tensor). */
int ev_storage_applies(const ev_storage *s, int layer, int h, oscar_kv which);

/* The change of (layer, KV head, tensor) (which: OSCAR_K or OSCAR_V), from
 * the last clause naming it: rows kept bf16 per page and their criterion,
 * quant group (0: the run's), clip ratio (0: the file's). 0 where none. */
int ev_storage_outliers_of(const ev_storage *s, int layer, int h, oscar_kv which);
ev_outlier_by ev_storage_by_of(const ev_storage *s, int layer, int h, oscar_kv which);
int ev_storage_group_of(const ev_storage *s, int layer, int h, oscar_kv which);
float ev_storage_clip_of(const ev_storage *s, int layer, int h, oscar_kv which);
/* Code width of (layer, KV head, tensor) that bits=/vbits= set: 0 where they set none (the
 * parameters' code width then applies: 2, or 3 for a file's 3-bit head-tensors). */
int ev_storage_bits_of(const ev_storage *s, int layer, int h, oscar_kv which);
/* Whether some clause keeps rows bf16 (out=). */
int ev_storage_has_outliers(const ev_storage *s);
/* 32, 64, 128 -> 0, 1, 2; -1 otherwise. */
int ev_group_index(int group);

/* Bits per element of the quantized region, averaged over every (layer, KV
 * head, K/V) (each holds the same number of elements): a changed head stores
 * per page out rows of 16 bits plus EV_PAGE_INDEX_BITS each and EV_PAGE - out
 * rows of B + 32/group bits per element (out, group and code width B of that
 * tensor: bits=/vbits= where set, else the parameters' width p, 3 for a file's
 * 3-bit head-tensors, 2 for the rest and without parameters);
 * run_group is the group of the rest. */
double ev_storage_bits(const ev_storage *s, int run_group, const oscar_params *p);

/* Marks in keep[0..n) the k entries of score with the largest values (ties:
 * the lower index); all of them when k >= n. */
void ev_topk(const double *score, int n, int k, unsigned char *keep);

/* Applies the change to the rows [lo, hi) of one layer's tensor after the
 * base fake-quant: orig holds the bf16 rows, q the run group's fake-quant,
 * qg[ev_group_index(G)] the fake-quant at group G for each G a head here
 * uses (NULL elsewhere; qg itself may be NULL without group=), all
 * [n][Hkv][d]; q is
 * overwritten where the change applies. Pages are absolute positions
 * [EV_PAGE p, EV_PAGE (p + 1)); each page's outliers are chosen among its rows
 * in [lo, hi), so hi must be a page end or the end of what exists (the write
 * path chooses once the page is complete). kept counts the rows kept bf16. */
void ev_storage_apply(const ev_storage *s, int layer, oscar_kv which, int lo, int hi, const float *orig,
                      const float *const qg[EV_NGROUPS], float *q, long long *kept);

/* B-bit fake-quant of the rows [lo, hi) of KV head h in rows ([n][Hkv][d],
 * bf16 values): the write path of oscar2 (format/ref_quant.c) with 2^bits
 * uniform levels per group instead of four: rotate by the head's R (x R),
 * round to bf16, clip to +-tau (tau the c-quantile of the row's absolute
 * values, c the head's clip in p), scale = (max - min) / (2^bits - 1) and
 * bias = min per group in fp16, codes in error-feedback order with the head's
 * weights F (nearest rounding without them), dequantize, rotate back. At
 * bits = 2 it is oscar_fakequant's OSCAR2 path (tests/test_eval_storage.c
 * checks that). 0, or -1 on a bad argument or a parameter getter's error. */
int ev_fakequant_bits(const oscar_params *p, int layer, int h, oscar_kv which, int bits, int group, int Hkv,
                      int d, int lo, int hi, float *rows);

#endif
