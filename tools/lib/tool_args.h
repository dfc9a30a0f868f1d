/* Strict command-line integers for the tools: the whole argument must be a
 * decimal integer in [lo, hi] ("12abc", " 12", "", "1e3" and out-of-range values are
 * refused with a message naming the option and the allowed range), so a typo
 * never runs as something else. Header-only: the tools link different
 * libraries (liboscar alone, or the engine). */
#ifndef OSCAR_TOOL_ARGS_H
#define OSCAR_TOOL_ARGS_H

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Returns 1 and sets *out, or prints "TOOL: FLAG wants ..." to stderr and
 * returns 0 (the caller exits with status 2). */
static inline int tool_parse_int(const char *tool, const char *flag, const char *s, int64_t lo, int64_t hi,
                                 int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    /* strtoll skips leading white space: " 12" ran as 12, where "12 " was refused */
    if (errno || end == s || *end || isspace((unsigned char)*s) || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants an integer in [%" PRId64 ", %" PRId64 "], got '%s'\n", tool, flag, lo, hi, s);
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* The number (from 1) of the first empty item of list, items joined by sep ("a,,b": 2, ",a": 1,
 * "a,": 2), or 0 when none is empty ("" too: an empty list is the caller's to name). strtok skips
 * empty items, so "int2,,int4" ran as "int2,int4" and a typo lost an item without a word. */
static inline int tool_list_empty_item(const char *list, char sep) {
    if (!*list) return 0;
    int k = 1;
    for (const char *p = list;; p++, k++) {
        const char *e = strchr(p, sep);
        if ((e ? e : p + strlen(p)) == p) return k;
        if (!e) return 0;
        p = e;
    }
}

/* Each option at most once: a repeated one was taken last-one-wins without a word (oscar-eval
 * --context 512 --context 2048 ran 2048), and so were two spellings of one setting (oscar-calibrate
 * --per-head --per-layer). Call tool_args_once at the top of the argument loop, on the argument the
 * loop is about to read as an option (an option's value is consumed in the loop and never gets
 * there); an argument not starting with '-' passes. repeatable: options that add up (oscar-eval
 * --storage), NULL-terminated, or NULL. same: groups of the spellings of one setting, each a string
 * of space-separated options ("--per-head --per-layer"), NULL-terminated, or NULL. Returns 1, or
 * prints "TOOL: FLAG is given twice; ..." to stderr and returns 0 (the caller exits with status 2). */
typedef struct tool_seen {
    const char *arg[64];
    int n;
} tool_seen;

/* 1 when flag is one of the space-separated options of group. */
static inline int tool_in_group(const char *group, const char *flag) {
    const size_t n = strlen(flag);
    for (const char *p = group; (p = strstr(p, flag)); p += n)
        if ((p == group || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return 1;
    return 0;
}

static inline int tool_args_once(tool_seen *seen, const char *tool, const char *arg, const char *const *repeatable,
                                 const char *const *same) {
    if (arg[0] != '-') return 1;
    for (const char *const *r = repeatable; r && *r; r++)
        if (!strcmp(arg, *r)) return 1;
    for (int k = 0; k < seen->n; k++) {
        if (!strcmp(seen->arg[k], arg)) {
            fprintf(stderr, "%s: %s is given twice; give each option once\n", tool, arg);
            return 0;
        }
        for (const char *const *g = same; g && *g; g++)
            if (tool_in_group(*g, arg) && tool_in_group(*g, seen->arg[k])) {
                fprintf(stderr, "%s: %s and %s are both given; they set one thing: give one of them\n", tool, arg,
                        seen->arg[k]);
                return 0;
            }
    }
    if (seen->n < (int)(sizeof seen->arg / sizeof seen->arg[0])) seen->arg[seen->n++] = arg;
    return 1;
}

/* 1 when path is a symbolic link to nothing, with the reason in why: stat()
 * fails on it as on a new name, but a write through it would create the file
 * where the link points. */
static inline int tool_dangling_link(const char *path, char *why, size_t n) {
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || stat(path, &sb) == 0) return 0;
    const int e = errno;
    char to[4096];
    const ssize_t k = readlink(path, to, sizeof to - 1);
    to[k > 0 ? k : 0] = '\0';
    /* a loop (or a chain too long to follow) exists: "does not exist" misled */
    if (e == ELOOP) {
        if (snprintf(why, n, "%s is a symbolic link to '%s' that cannot be followed (%s: a link loop); give a file "
                     "name (remove the link)", path, to, strerror(e)) < 0 && n > 0)
            why[0] = '\0';
        return 1;
    }
    /* a message cut to n bytes is still a message: the return value is looked at only so that
     * gcc's format-truncation check (-Werror) knows the cut is expected */
    if (snprintf(why, n, "%s is a symbolic link to '%s', which does not exist; give a file name (remove the link) "
                 "or create the link's target first", path, to) < 0 && n > 0)
        why[0] = '\0';
    return 1;
}

/* 1 when path can be created (written as PATH.tmp, then renamed): its folder
 * exists and is writable, and it is not itself a folder, nor a device, FIFO
 * or socket (the rename would replace /dev/null or a pipe with a regular
 * file), nor a dangling symbolic link; else 0 with the reason in why. Checked before a tool does its work. */
static inline int tool_output_ok(const char *path, char *why, size_t n) {
    if (!*path) { /* the probe below is ".tmpXXXXXX" in "." and passed; the save's rename to "" failed after the run */
        snprintf(why, n, "'' is an empty path; give a file name");
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    struct stat sb;
    if (tool_dangling_link(path, why, n)) return 0;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(why, n, "%s is a directory; give a file name", path);
        return 0;
    }
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        snprintf(why, n, "%s is %s, not a regular file: the output is renamed over it; give a file name", path,
                 S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device" : "a socket");
        return 0;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(why, n, "%s: folder '%s' does not exist; create it first", path, dir);
        return 0;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, n, "%s: folder '%s' is not writable (%s)", path, dir, strerror(errno));
        return 0;
    }
    /* access() says yes to root everywhere, and to anyone on /proc or /sys: create (and remove) a
     * temporary as the save will, or the whole run happened before "cannot create". */
    char probe[4200];
    if ((size_t)snprintf(probe, sizeof probe, "%s.tmpXXXXXX", path) >= sizeof probe) {
        snprintf(why, n, "%.200s...: the path is too long; give a shorter one", path);
        return 0;
    }
    int fd = mkstemp(probe);
    if (fd < 0) {
        snprintf(why, n, "%s: cannot create a file in folder '%s' (%s); choose a writable folder", path, dir,
                 strerror(errno));
        return 0;
    }
    close(fd);
    unlink(probe);
    return 1;
}

/* 1 when paths a and b name one file: the same string, or existing files
 * with the same device and inode (a link, another spelling of the path).
 * Checked so that no output is written over an input or another output. */
static inline int tool_same_file(const char *a, const char *b) {
    if (!a || !b) return 0;
    if (!strcmp(a, b)) return 1;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Standard output is a tool's result: a write error (a full disk, /dev/full,
 * a closed pipe's EIO) must not end in status 0 with a truncated report.
 * tool_watch_stdout(tool) at the start of main checks stdout at exit and
 * turns a failed write into status 1 with a message. */
static inline const char **tool_stdout_owner(void) {
    static const char *name = "tool";
    return &name;
}
static inline void tool_stdout_check(void) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int e = errno;
        fprintf(stderr, "%s: writing standard output failed (%s); the output is incomplete\n", *tool_stdout_owner(),
                e ? strerror(e) : "write error");
        fflush(stderr);
        _exit(1);
    }
}
static inline void tool_watch_stdout(const char *tool) {
    *tool_stdout_owner() = tool;
    atexit(tool_stdout_check);
}

#endif
