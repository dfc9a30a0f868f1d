/* Internals shared by the engine's translation units. */
#ifndef OSCAR_ENGINE_INTERNAL_H
#define OSCAR_ENGINE_INTERNAL_H

#include "engine.h"

#if defined(__GNUC__)
#define OE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OE_PRINTF(a, b)
#endif

/* Records the message for oe_last_error() and returns s. */
oscar_status oe_set_error(oscar_status s, const char *fmt, ...) OE_PRINTF(2, 3);


typedef struct oe_layer {
    float *attn_norm;           /* [hidden] */
    float *wq, *wk, *wv, *wo;   /* [Hq d][hidden], [Hkv d][hidden] x2, [hidden][Hq d] */
    float *bq, *bk, *bv, *bo;   /* optional biases */
    float *q_norm, *k_norm;     /* [d], Qwen3 */
    float *mlp_norm;            /* [hidden] */
    float *w_gate, *w_up;       /* [inter][hidden] */
    float *w_down;              /* [hidden][inter] */
    float *b_gate, *b_up, *b_down;
} oe_layer;

struct oe_model {
    oe_config cfg;
    float *embed;    /* [vocab][hidden] */
    float *lm_head;  /* [vocab][hidden]; == embed when tied */
    float *final_norm;
    oe_layer *layers;
};

#endif
