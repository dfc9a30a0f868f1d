/* Safetensors reader: the file is mapped read-only and its header checked
 * before any tensor is handed out, since checkpoints come from outside. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine_internal.h"

/* A header beyond this is not a plausible checkpoint (the format itself caps it at 100 MB). */
#define OE_ST_MAX_HEADER (100u * 1024u * 1024u)

struct oe_safetensors {
    void *map;
    size_t map_len;
    oe_tensor *tensors;
    int count;
};

static const struct {
    const char *name;
    oe_dtype dtype;
    size_t size;
} k_dtypes[] = {
    {"F64", OE_F64, 8},  {"F32", OE_F32, 4}, {"F16", OE_F16, 2}, {"BF16", OE_BF16, 2},
    {"I64", OE_I64, 8},  {"I32", OE_I32, 4}, {"I16", OE_I16, 2}, {"I8", OE_I8, 1},
    {"U8", OE_U8, 1},    {"BOOL", OE_BOOL, 1},
};

size_t oe_dtype_size(oe_dtype d)
{
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].dtype == d) return k_dtypes[i].size;
    return 0;
}

const char *oe_dtype_name(oe_dtype d)
{
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].dtype == d) return k_dtypes[i].name;
    return "?";
}

void oe_st_close(oe_safetensors *st)
{
    if (!st) return;
    if (st->tensors) {
        for (int i = 0; i < st->count; i++) free((char *)st->tensors[i].name);
        free(st->tensors);
    }
    if (st->map) munmap(st->map, st->map_len);
    free(st);
}

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Fills t from one header entry; data area is [base, base + data_len). */
static oscar_status parse_entry(const char *path, const char *name, json_t *e,
                                const unsigned char *base, uint64_t data_len, oe_tensor *t)
{
    if (!json_is_object(e))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' is not a JSON object; the file is "
                            "not a valid safetensors file", path, name);
    json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape"),
           *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' lacks dtype/shape/data_offsets; "
                            "re-export the checkpoint", path, name);
    const char *ds = json_string_value(jd);
    size_t esize = 0;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (!strcmp(ds, k_dtypes[i].name)) {
            t->dtype = k_dtypes[i].dtype;
            esize = k_dtypes[i].size;
        }
    if (!esize)
        return oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype '%s', which the engine "
                            "does not read (F64/F32/F16/BF16/I64/I32/I16/I8/U8/BOOL)", path, name, ds);
    size_t nd = json_array_size(js);
    if (nd > OE_ST_MAX_DIMS)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' has %zu dimensions (at most %d)",
                            path, name, nd, OE_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' has a negative or non-integer "
                                "dimension", path, name);
        uint64_t v = (uint64_t)json_integer_value(d);
        if (v && numel > UINT64_MAX / 16 / v)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' shape overflows", path, name);
        numel *= v;
        t->shape[i] = (int64_t)v;
    }
    json_t *j0 = json_array_get(jo, 0), *j1 = json_array_get(jo, 1);
    if (!json_is_integer(j0) || !json_is_integer(j1) || json_integer_value(j0) < 0 ||
        json_integer_value(j1) < json_integer_value(j0))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' has invalid data_offsets", path, name);
    uint64_t b = (uint64_t)json_integer_value(j0), en = (uint64_t)json_integer_value(j1);
    if (en > data_len)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' ends at byte %" PRIu64 " of a %" PRIu64
                            "-byte data area; the file is truncated or corrupt", path, name, en, data_len);
    if (en - b != numel * esize)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' holds %" PRIu64 " bytes but its shape "
                            "and dtype need %" PRIu64, path, name, en - b, numel * esize);
    t->numel = (int64_t)numel;
    t->nbytes = (size_t)(en - b);
    t->data = base + b;
    return OSCAR_OK;
}

typedef struct st_span {
    uint64_t b, e;
    const char *name;
} st_span;
static int span_cmp(const void *x, const void *y)
{
    const st_span *a = x, *b = y;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->e < b->e ? -1 : a->e > b->e;
}

/* The tensors must tile the data area exactly, as the format requires: from
 * byte 0, each starting where the previous ended, the last ending at the
 * end of the file. A header length off by a byte (which JSON padding can
 * hide) leaves a gap or an overhang at the end; overlapping tensors alias. */
static oscar_status check_tiling(const char *path, const oe_safetensors *st, const unsigned char *base,
                                 uint64_t data_len)
{
    st_span *sp = malloc((st->count ? (size_t)st->count : 1) * sizeof *sp);
    if (!sp) return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_st_open: out of memory");
    for (int i = 0; i < st->count; i++) {
        sp[i].b = (uint64_t)((const unsigned char *)st->tensors[i].data - base);
        sp[i].e = sp[i].b + (uint64_t)st->tensors[i].nbytes;
        sp[i].name = st->tensors[i].name;
    }
    qsort(sp, (size_t)st->count, sizeof *sp, span_cmp);
    uint64_t at = 0;
    oscar_status s = OSCAR_OK;
    for (int i = 0; i < st->count && s == OSCAR_OK; i++) {
        if (sp[i].b < at)
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' starts at byte %" PRIu64 " inside the "
                             "previous tensor (ends at %" PRIu64 "): overlapping data_offsets; the file is "
                             "corrupt", path, sp[i].name, sp[i].b, at);
        else if (sp[i].b > at)
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %" PRIu64 " bytes at %" PRIu64 " of the data area "
                             "belong to no tensor (before '%s'); the header length or the offsets are wrong",
                             path, sp[i].b - at, at, sp[i].name);
        at = sp[i].e;
    }
    if (s == OSCAR_OK && at != data_len)
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: the tensors end at byte %" PRIu64 " of a %" PRIu64 "-byte "
                         "data area: the header length or the offsets are wrong (the file is corrupt or was "
                         "truncated/padded)", path, at, data_len);
    free(sp);
    return s;
}

oscar_status oe_st_open(const char *path, oe_safetensors **out)
{
    if (!path || !out) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_st_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block: refused below */
    if (fd < 0)
        return oe_set_error(OSCAR_ERR_IO, "%s: cannot open (%s); check the model directory", path,
                            strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return oe_set_error(OSCAR_ERR_IO, "%s: not a regular file", path);
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    if (fsize < 8) {
        close(fd);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %" PRIu64 " bytes, too short for a safetensors "
                            "header; the file is truncated", path, fsize);
    }
    /* Mapped, as every checkpoint loader does (weights are GBs, read once per
     * page): a file truncated while mapped raises SIGBUS in the tool that
     * reads it, so checkpoints must not be rewritten in place under a running
     * tool. liboscar's parameter loader, which engines embed, reads instead. */
    void *map = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return oe_set_error(OSCAR_ERR_IO, "%s: mmap failed (%s)", path, strerror(errno));
    oe_safetensors *st = calloc(1, sizeof *st);
    if (!st) {
        munmap(map, (size_t)fsize);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_st_open: out of memory");
    }
    st->map = map;
    st->map_len = (size_t)fsize;
    const unsigned char *p = map;
    uint64_t hlen = read_le64(p);
    if (hlen == 0 || hlen > OE_ST_MAX_HEADER || hlen > fsize - 8) {
        oe_st_close(st);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: header length %" PRIu64 " is invalid for a %" PRIu64
                            "-byte file; the file is truncated or not safetensors", path, hlen, fsize);
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        oe_st_close(st);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: header is not a JSON object (%s); the file is "
                            "corrupt", path, root ? "wrong type" : jerr.text);
    }
    size_t n = json_object_size(root);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) {
        json_decref(root);
        oe_st_close(st);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_st_open: out of memory");
    }
    const unsigned char *base = p + 8 + hlen;
    uint64_t data_len = fsize - 8 - hlen;
    const char *key;
    json_t *val;
    oscar_status s = OSCAR_OK;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__")) continue;
        oe_tensor *t = &st->tensors[st->count];
        s = parse_entry(path, key, val, base, data_len, t);
        if (s != OSCAR_OK) break;
        t->name = strdup(key);
        if (!t->name) {
            s = oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_st_open: out of memory");
            break;
        }
        st->count++;
    }
    json_decref(root);
    if (s == OSCAR_OK) s = check_tiling(path, st, base, data_len);
    if (s != OSCAR_OK) {
        oe_st_close(st);
        return s;
    }
    *out = st;
    return OSCAR_OK;
}

int oe_st_count(const oe_safetensors *st) { return st ? st->count : 0; }

const oe_tensor *oe_st_at(const oe_safetensors *st, int i)
{
    return (st && i >= 0 && i < st->count) ? &st->tensors[i] : NULL;
}

const oe_tensor *oe_st_find(const oe_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    for (int i = 0; i < st->count; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

float oe_round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return x; /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

oscar_status oe_tensor_to_f32(const oe_tensor *t, float *out, int64_t n)
{
    if (!t || !out) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_tensor_to_f32: NULL argument");
    if (n != t->numel)
        return oe_set_error(OSCAR_ERR_SHAPE_MISMATCH, "tensor '%s': %" PRId64 " elements, caller expects %"
                            PRId64, t->name, t->numel, n);
    const unsigned char *p = t->data;
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case OE_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case OE_F64: {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
            break;
        }
        case OE_BF16: {
            uint32_t u = (uint32_t)p[2 * i] << 16 | (uint32_t)p[2 * i + 1] << 24;
            memcpy(&out[i], &u, 4);
            break;
        }
        case OE_F16: out[i] = half_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8)); break;
        case OE_I32: {
            int32_t v;
            memcpy(&v, p + 4 * i, 4);
            out[i] = (float)v;
            break;
        }
        case OE_I64: {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
            break;
        }
        default:
            return oe_set_error(OSCAR_ERR_UNSUPPORTED, "tensor '%s': dtype %s cannot be converted to fp32",
                                t->name, oe_dtype_name(t->dtype));
        }
    }
    return OSCAR_OK;
}
