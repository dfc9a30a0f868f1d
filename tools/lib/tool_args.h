/* Strict command-line integers for the tools: the whole argument must be a
 * decimal integer in [lo, hi] ("12abc", "", "1e3" and out-of-range values are
 * refused with a message naming the option and the allowed range), so a typo
 * never runs as something else. Header-only: the tools link different
 * libraries (liboscar alone, or the engine). */
#ifndef OSCAR_TOOL_ARGS_H
#define OSCAR_TOOL_ARGS_H

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Returns 1 and sets *out, or prints "TOOL: FLAG wants ..." to stderr and
 * returns 0 (the caller exits with status 2). */
static inline int tool_parse_int(const char *tool, const char *flag, const char *s, int64_t lo, int64_t hi,
                                 int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants an integer in [%" PRId64 ", %" PRId64 "], got '%s'\n", tool, flag, lo, hi, s);
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

#endif
