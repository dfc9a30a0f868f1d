#include "run_cmd.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/wait.h>

int run(char *out, size_t n, int seconds, const char *fmt, ...) {
    char cmd[8192], full[8400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "timeout -k 2 %d %s 2>&1", seconds, cmd);
    out[0] = '\0';
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}
