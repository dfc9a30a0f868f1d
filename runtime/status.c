/* Status codes, the thread-local error message, version and method names. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "oscar_internal.h"

/* Per-thread so concurrent callers never see each other's messages (the
 * same model as errno / dlerror); nothing else in the library is global. */
static _Thread_local char tls_error[1024];

oscar_status oscar_set_error(oscar_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_error, sizeof tls_error, fmt, ap);
    va_end(ap);
    return s;
}

oscar_status oscar_set_errbuf(oscar_status s, const oscar_errbuf *e) {
    if (s == OSCAR_OK) return s;
    if (e && e->msg[0])
        snprintf(tls_error, sizeof tls_error, "%s", e->msg);
    else
        snprintf(tls_error, sizeof tls_error, "%s", oscar_status_string(s));
    return s;
}

void oscar_clear_error(void) { tls_error[0] = '\0'; }

const char *oscar_last_error(void) { return tls_error; }

const char *oscar_version(int *major, int *minor, int *patch) {
    if (major) *major = OSCAR_VERSION_MAJOR;
    if (minor) *minor = OSCAR_VERSION_MINOR;
    if (patch) *patch = OSCAR_VERSION_PATCH;
#define OSCAR_STR2(x) #x
#define OSCAR_STR(x) OSCAR_STR2(x)
    return OSCAR_STR(OSCAR_VERSION_MAJOR) "." OSCAR_STR(OSCAR_VERSION_MINOR) "." OSCAR_STR(OSCAR_VERSION_PATCH);
}

const char *oscar_status_string(oscar_status s) {
    switch (s) {
    case OSCAR_OK: return "ok";
    case OSCAR_ERR_INVALID_ARGUMENT: return "invalid argument";
    case OSCAR_ERR_UNSUPPORTED_HEAD_DIM: return "unsupported head_dim (supported: " OSCAR_HEAD_DIM_RULE ")";
    case OSCAR_ERR_UNSUPPORTED_GROUP: return "unsupported quant group (supported: " OSCAR_GROUP_RULE ")";
    case OSCAR_ERR_UNSUPPORTED: return "unsupported by this backend or method";
    case OSCAR_ERR_SHAPE_MISMATCH: return "shape mismatch between parameters and model/layout";
    case OSCAR_ERR_NONFINITE: return "NaN or Inf in activations";
    case OSCAR_ERR_EMPTY: return "empty input";
    case OSCAR_ERR_TOO_LONG: return "sequence too long";
    case OSCAR_ERR_BLOCK_TABLE: return "block table entry or window slot out of range";
    case OSCAR_ERR_OUT_OF_MEMORY: return "out of memory";
    case OSCAR_ERR_IO: return "I/O error";
    case OSCAR_ERR_CORRUPT_FILE: return "corrupt or malformed file";
    case OSCAR_ERR_VERSION: return "incompatible version";
    case OSCAR_ERR_NO_BACKEND: return "backend not available";
    case OSCAR_ERR_BACKEND: return "backend runtime error";
    case OSCAR_ERR_WORKSPACE: return "workspace missing or too small";
    case OSCAR_ERR_STATE: return "call out of order";
    case OSCAR_ERR_INTERNAL: return "internal error";
    }
    return "unknown status code";
}

const char *oscar_method_name(oscar_method m) { return oscar_format_method_name(m); }

oscar_status oscar_method_from_name(const char *name, oscar_method *out) {
    oscar_clear_error();
    if (!name || !out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_method_from_name: NULL argument");
    for (int m = 0; m < OSCAR_METHOD_COUNT_; m++) {
        if (strcmp(name, oscar_format_method_name((oscar_method)m)) == 0) {
            *out = (oscar_method)m;
            return OSCAR_OK;
        }
    }
    return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                           "unknown method '%s'; valid methods: oscar2, oscar2-lm, int2, quarot2, bf16, int4, "
                           "int8, kivi2",
                           name);
}
