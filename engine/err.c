/* Per-thread error message of the engine (liboscar keeps its own). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_internal.h"

static _Thread_local char g_msg[1024];

/* Messages quote strings of the checkpoint (model_type, tensor names and
 * dtypes): a hostile file's control characters (C0, DEL, UTF-8 C1) and bytes
 * that are not UTF-8 become '?', so they never drive the terminal or forge
 * log lines of the tool that prints the message. */
static void oe_sanitize(char *m)
{
    unsigned char *u = (unsigned char *)m;
    while (*u) {
        int n = *u >= 0xf0 && *u <= 0xf4 ? 4 : *u >= 0xe0 && *u <= 0xef ? 3 : *u >= 0xc2 && *u <= 0xdf ? 2 : 1;
        int ok = n > 1 || (*u >= 0x20 && *u < 0x7f);
        for (int i = 1; i < n && ok; i++) ok = (u[i] & 0xc0) == 0x80; /* stops at the terminator */
        if (ok && n == 2 && u[0] == 0xc2 && u[1] < 0xa0) ok = 0;  /* C1 controls U+0080..U+009F */
        if (ok) {
            u += n;
        } else {
            *u++ = '?';
        }
    }
}

oscar_status oe_set_error(oscar_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    oe_sanitize(g_msg);
    return s;
}

const char *oe_last_error(void) { return g_msg; }

oscar_status oe_check_regular(const char *path, const char *what)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return oe_set_error(OSCAR_ERR_IO, "%s: cannot open %s (%s)", path, what, strerror(errno));
    struct stat sb;
    int rc = fstat(fd, &sb);
    close(fd);
    if (rc != 0) return oe_set_error(OSCAR_ERR_IO, "%s: cannot stat %s (%s)", path, what, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return oe_set_error(OSCAR_ERR_IO, "%s: the %s is %s, not a regular file; give the path of the file itself",
                            path, what,
                            S_ISFIFO(sb.st_mode)  ? "a FIFO"
                            : S_ISDIR(sb.st_mode) ? "a directory"
                            : S_ISCHR(sb.st_mode) ? "a character device"
                                                  : "not a regular file");
    return OSCAR_OK;
}
