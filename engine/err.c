/* Per-thread error message of the engine (liboscar keeps its own). */
#include <stdarg.h>
#include <stdio.h>

#include "engine_internal.h"

static _Thread_local char g_msg[1024];

oscar_status oe_set_error(oscar_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}

const char *oe_last_error(void) { return g_msg; }
