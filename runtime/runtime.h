/* Runtime and plan objects (internal). */
#ifndef OSCAR_RUNTIME_H
#define OSCAR_RUNTIME_H

#include <stdatomic.h>

#include "oscar_internal.h"

struct oscar_runtime {
    const oscar_backend_api *api; /* chosen backend */
    void *ctx;                    /* its context */
    void *dl;                     /* dlopen handle of a plugin, NULL for cpu */
    int validate;                 /* host-side checks before device calls */
    oscar_log_fn log;
    void *log_user;
    char backend[16];
    char device[256];
    char *report;       /* discovery report (oscar_runtime_report), grown as lines come: a fixed
                           buffer dropped the lines after a few long plugin paths */
    size_t report_len;
    /* Holders beyond the first: each live plan holds the runtime, so
     * oscar_runtime_destroy before a plan's destroy leaves it alive until the
     * last plan goes (0 from calloc: the creator is the only holder). */
    atomic_int refs;
};

struct oscar_plan {
    oscar_runtime *rt;
    oscar_layout_desc layout;
    int32_t num_layers;
    int32_t shared_layers; /* 1: one set of built-in rotations serves every layer index */
    void *bplan;
    char variant[128];
    uint8_t *code_bits; /* owned copy of the parameters' [num_layers][H][2] code widths when
                           layout.wide_per_layer is 1 and some are 3 (per-layer page sizes), else NULL */
};

#endif
