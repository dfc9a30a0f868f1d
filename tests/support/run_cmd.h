/* Runs a shell command for a test, with a time limit. */
#ifndef OSCAR_TEST_RUN_CMD_H
#define OSCAR_TEST_RUN_CMD_H
#include <stddef.h>
/* Runs the printf-formatted command (through sh, stderr merged into stdout) under `timeout -k 2
 * seconds`; returns its exit status (124: it ran out of time; 128 + N: killed by signal N; -1: it
 * could not be started) with the first n - 1 bytes of its output in out. */
int run(char *out, size_t n, int seconds, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#endif
