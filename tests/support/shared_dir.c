#include "shared_dir.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int rc_shared_dir(char *buf, size_t len) {
    const char *env = getenv("OSCAR_SHARED_DIR");
    if (env && *env)
        snprintf(buf, len, "%s", env);
    else
        snprintf(buf, len, "%s/../shared", OSCAR_SOURCE_DIR);
    struct stat sb;
    return stat(buf, &sb) == 0 && S_ISDIR(sb.st_mode);
}
