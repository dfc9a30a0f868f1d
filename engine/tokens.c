/* Token files: uint32 little-endian ids, nothing else. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_internal.h"

oscar_status oe_tokens_load(const char *path, int vocab, uint32_t **out, int64_t *count)
{
    if (!path || !out || !count) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_tokens_load: NULL argument");
    *out = NULL;
    *count = 0;
    oscar_status rs = oe_check_regular(path, "token file");
    if (rs != OSCAR_OK) return rs;
    FILE *f = fopen(path, "rb");
    if (!f) return oe_set_error(OSCAR_ERR_IO, "%s: cannot open token file (%s)", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return oe_set_error(OSCAR_ERR_IO, "%s: cannot seek", path);
    }
    long sz = ftell(f);
    rewind(f);
    if (sz < 0 || sz % 4) {
        fclose(f);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: size %ld is not a multiple of 4; a token file holds "
                            "uint32 little-endian ids", path, sz);
    }
    if (sz == 0) {
        fclose(f);
        return oe_set_error(OSCAR_ERR_EMPTY, "%s: the token file is empty", path);
    }
    /* The ids are held whole (the tools use all of them): a file larger than the machine's memory went
     * to malloc, which failed ("out of memory") or, with memory overcommitted, succeeded and the read
     * filled the memory. Refused from its size, before any allocation. */
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    const double gib = 1073741824.0, mem = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0.0;
    if (mem > 0.0 && (double)sz > mem) {
        fclose(f);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: the token file is %.1f GiB (%ld tokens), more than this "
                            "machine's memory (%.1f GiB), which holds the ids whole; give a shorter file (head -c "
                            "BYTES, a multiple of 4)", path, (double)sz / gib, sz / 4, mem / gib);
    }
    int64_t n = sz / 4;
    /* One buffer, decoded in place (little-endian bytes to ids): the file's size in memory, not twice it. */
    uint32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) {
        fclose(f);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "%s: out of memory for %" PRId64 " tokens", path, n);
    }
    size_t got = fread(ids, 1, (size_t)sz, f);
    fclose(f);
    if (got != (size_t)sz) {
        free(ids);
        return oe_set_error(OSCAR_ERR_IO, "%s: short read", path);
    }
    for (int64_t i = 0; i < n; i++) {
        unsigned char p[4];
        memcpy(p, ids + i, 4);
        ids[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (vocab > 0 && ids[i] >= (uint32_t)vocab) {
            uint32_t bad = ids[i];
            free(ids);
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: token %" PRId64 " is id %u, outside the vocabulary "
                                "of %d; the file was tokenized for another model", path, i, bad, vocab);
        }
    }
    *out = ids;
    *count = n;
    return OSCAR_OK;
}
