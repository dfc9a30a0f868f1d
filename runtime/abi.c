/* Versioned argument structs (docs/API.md, "ABI stability"): the library
 * reads a caller's struct through a copy sized by its struct_size, so a
 * caller built against an older header (smaller struct) keeps working, and
 * one built against a newer header works as long as it leaves the fields
 * this library does not know at zero. */
#include <stdio.h>

#include "oscar_internal.h"

/* Upper bound on any version of a versioned struct (today's are under 128 bytes). */
#define OSCAR_STRUCT_SIZE_MAX 4096u

oscar_status oscar_struct_import(void *dst, size_t full_size, const void *src, size_t min_size, const char *what,
                                 const char *fill_with) {
    uint32_t n;
    memcpy(&n, src, sizeof n); /* struct_size is the first field of every versioned struct */
    if (n < min_size)
        return oscar_set_error(OSCAR_ERR_VERSION,
                               "%s: struct_size %u is smaller than the first version of the struct (%zu bytes); "
                               "set struct_size = sizeof the struct, e.g. by filling it with %s()",
                               what, n, min_size, fill_with);
    /* No version of a struct will be this large: garbage (a struct never
     * filled by its *_default) would make the scan below read past it. */
    if (n > OSCAR_STRUCT_SIZE_MAX)
        return oscar_set_error(OSCAR_ERR_VERSION,
                               "%s: struct_size %u is not the size of any version of the struct (at most %u "
                               "bytes): the struct was not initialized; fill it with %s() before setting fields",
                               what, n, (unsigned)OSCAR_STRUCT_SIZE_MAX, fill_with);
    if (n > full_size) {
        /* A newer caller: fine while every field this library lacks is zero
         * (zero means "as before" for every field added after version 1). */
        const unsigned char *tail = (const unsigned char *)src + full_size;
        for (size_t i = 0; i < n - full_size; i++)
            if (tail[i])
                return oscar_set_error(OSCAR_ERR_VERSION,
                                       "%s: struct_size %u is larger than this library's %zu bytes and byte %zu "
                                       "beyond it is set: a field of a newer header this library does not know "
                                       "(update liboscar or leave that field zero), or a struct never filled "
                                       "by %s()",
                                       what, n, full_size, full_size + i, fill_with);
        n = (uint32_t)full_size;
    }
    memset(dst, 0, full_size);
    memcpy(dst, src, n);
    ((uint32_t *)dst)[0] = (uint32_t)full_size;
    return OSCAR_OK;
}

oscar_status oscar_layout_import(const oscar_layout_desc *in, oscar_layout_desc *out) {
    if (!in) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "layout: NULL descriptor");
    oscar_status s = oscar_struct_import(out, sizeof *out, in, OSCAR_LAYOUT_DESC_SIZE_V1, "layout",
                                         "oscar_layout_default");
    if (s != OSCAR_OK) return s;
    char msg[256];
    s = oscar_format_check_layout(out, msg, sizeof msg);
    return s == OSCAR_OK ? OSCAR_OK : oscar_set_error(s, "%s", msg);
}
