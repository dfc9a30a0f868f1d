/* Parameter file: safetensors with OSCAR metadata (docs/FORMAT.md §6).
 * The loader treats every file as hostile: sizes, offsets and shapes are
 * checked against each other and against the file before anything is
 * allocated from them, and every value is checked after. */
#include <errno.h>
#include <fcntl.h>
#include "json_lite.h" /* not jansson: liboscar.so needs only libc */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "oscar_ref.h"
#include "oscar_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the parameter file reader assumes a little-endian host"
#endif

#define MAX_HEADER_BYTES (16u << 20)
#define MAX_LAYERS 1024
#define MAX_HEADS 4096
#define ORTHO_TOL 1e-3
#define NKIND 6      /* tensors per layer: rot_k rot_v eig_k eig_v fb_k fb_v */
/* The largest tensor payload a file may declare. The biggest real shape
 * (128 layers, 16 KV heads per-head, head_dim 256, rotations and feedback
 * weights) is 2 GiB; a header asking for more is hostile, not a model. */
#define MAX_TENSOR_BYTES ((uint64_t)8 << 30)
/* A file whose disk blocks hold less than half its declared tensor bytes is
 * sparse (holes read as zeros): refused above this size before allocating. */
#define SPARSE_CHECK_BYTES ((uint64_t)64 << 20)

/* ------------------------------------------------------------------ save */

static int method_bits(oscar_method m) {
    switch (m) {
    case OSCAR_METHOD_BF16: return 16;
    case OSCAR_METHOD_INT4: return 4;
    case OSCAR_METHOD_INT8: return 8;
    default: return 2;
    }
}

static int add_tensor(json_t *hdr, const char *name, const char *dtype, int rank, const int64_t *shape,
                      size_t *offset, size_t nbytes) {
    json_t *t = json_object(), *sh = json_array(), *off = json_array();
    if (!t || !sh || !off) goto fail;
    for (int i = 0; i < rank; i++)
        if (json_array_append_new(sh, json_integer(shape[i]))) goto fail;
    if (json_array_append_new(off, json_integer((json_int_t)*offset)) ||
        json_array_append_new(off, json_integer((json_int_t)(*offset + nbytes))))
        goto fail;
    if (json_object_set_new(t, "dtype", json_string(dtype)) || json_object_set_new(t, "shape", sh) ||
        json_object_set_new(t, "data_offsets", off))
        goto fail_t;
    *offset += nbytes;
    return json_object_set_new(hdr, name, t);
fail:
    json_decref(sh);
    json_decref(off);
fail_t:
    json_decref(t);
    return -1;
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

OSCAR_API oscar_status oscar_params_save(const oscar_params *p, const char *path) {
    oscar_clear_error();
    if (!p || !path) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_save: NULL argument");
    /* The file is renamed over path: a device (/dev/null, /dev/stdout), a
     * FIFO or a socket there would be replaced by a regular file, not written to. */
    struct stat pst;
    if (stat(path, &pst) == 0 && !S_ISREG(pst.st_mode))
        return oscar_set_error(OSCAR_ERR_IO,
                               "cannot save parameters to %s: it is %s, not a regular file, and the save renames a "
                               "new file over it; give the path of a file",
                               path,
                               S_ISDIR(pst.st_mode)                              ? "a directory"
                               : S_ISFIFO(pst.st_mode)                           ? "a FIFO"
                               : S_ISCHR(pst.st_mode) || S_ISBLK(pst.st_mode) ? "a device"
                                                                                 : "a socket or special file");
    const size_t d = (size_t)p->head_dim, nr = (size_t)p->num_rot;
    const size_t rot_bytes = nr * d * d * sizeof(float), eig_bytes = nr * d * sizeof(double);

    /* Metadata object, serialised as a string under __metadata__.oscar. */
    json_t *meta = json_object();
    char version[32];
    snprintf(version, sizeof version, "%d.%d.%d", OSCAR_VERSION_MAJOR, OSCAR_VERSION_MINOR, OSCAR_VERSION_PATCH);
    /* The lowest version that holds the file: version 1 readers know everything but the
     * feedback weights, version 2 readers everything but per-head clip ratios, version 3 readers
     * everything but code widths other than 2 (FORMAT.md §2.7). */
    const int clip_heads = oscar_params_clips_per_layer(p) ? 1 : p->num_kv_heads;
    const int wide = oscar_params_has_wide(p);
    json_object_set_new(meta, "format_version", json_integer(wide ? 4 : clip_heads > 1 ? 3 : p->fb ? 2 : 1));
    json_object_set_new(meta, "library_version", json_string(version));
    json_object_set_new(meta, "method", json_string(oscar_method_name(p->method)));
    json_object_set_new(meta, "num_layers", json_integer(p->num_layers));
    json_object_set_new(meta, "num_q_heads", json_integer(p->num_q_heads));
    json_object_set_new(meta, "num_kv_heads", json_integer(p->num_kv_heads));
    json_object_set_new(meta, "head_dim", json_integer(p->head_dim));
    json_object_set_new(meta, "group", json_integer(p->group));
    json_object_set_new(meta, "bits", json_integer(method_bits(p->method)));
    json_object_set_new(meta, "sink", json_integer(p->sink));
    json_object_set_new(meta, "recent", json_integer(p->recent));
    json_object_set_new(meta, "per_head", json_boolean(p->per_head));
    json_object_set_new(meta, "composition", json_string(p->composition));
    json_object_set_new(meta, "calib_tokens", json_integer(p->calib_tokens));
    json_object_set_new(meta, "model_hash", json_string(p->model_hash));
    char *meta_str = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(meta);

    json_t *hdr = json_object(), *md = json_object();
    int bad = !meta_str || !hdr || !md;
    if (!bad) bad = json_object_set_new(md, "oscar", json_string(meta_str)) || json_object_set(hdr, "__metadata__", md);
    json_decref(md);
    free(meta_str);
    /* Data order: per layer rot_k, rot_v, eig_k, eig_v, fb_k, fb_v; then clip. */
    size_t off = 0;
    int64_t shape3[3] = {(int64_t)nr, (int64_t)d, (int64_t)d}, shape2[2] = {(int64_t)nr, (int64_t)d};
    char name[64];
    for (int l = 0; l < p->num_layers && !bad; l++) {
        for (int kv = 0; kv < 2 && !bad; kv++) {
            snprintf(name, sizeof name, "layers.%d.rot_%c", l, kv ? 'v' : 'k');
            bad = add_tensor(hdr, name, "F32", 3, shape3, &off, rot_bytes) != 0;
        }
        for (int kv = 0; kv < 2 && !bad && p->eig; kv++) {
            snprintf(name, sizeof name, "layers.%d.eig_%c", l, kv ? 'v' : 'k');
            bad = add_tensor(hdr, name, "F64", 2, shape2, &off, eig_bytes) != 0;
        }
        for (int kv = 0; kv < 2 && !bad && p->fb; kv++) {
            snprintf(name, sizeof name, "layers.%d.fb_%c", l, kv ? 'v' : 'k');
            bad = add_tensor(hdr, name, "F32", 3, shape3, &off, rot_bytes) != 0;
        }
    }
    /* clip: [num_layers][2] when every head shares its layer's ratios, else [num_layers][num_kv_heads][2]. */
    int64_t clip_shape[3] = {p->num_layers, clip_heads, 2};
    const size_t clip_count = (size_t)p->num_layers * (size_t)clip_heads * 2;
    float *clip_out = malloc(clip_count * sizeof(float));
    bad = bad || !clip_out;
    for (size_t i = 0; !bad && i < clip_count; i++) /* head 0 of each layer when per layer */
        clip_out[i] = *oscar_params_clip_ptr(p, (int)(i / 2 / (size_t)clip_heads), (int)(i / 2 % (size_t)clip_heads),
                                             (int)(i % 2));
    if (!bad && clip_heads == 1) clip_shape[1] = 2;
    if (!bad) bad = add_tensor(hdr, "clip", "F32", clip_heads > 1 ? 3 : 2, clip_shape, &off, clip_count * sizeof(float));
    /* code_bits: [num_layers][num_kv_heads][2] I32, only when some head-tensor is not at 2 bits. */
    const size_t bits_count = wide ? (size_t)p->num_layers * (size_t)p->num_kv_heads * 2 : 0;
    int32_t *bits_out = wide ? malloc(bits_count * sizeof(int32_t)) : NULL;
    if (wide) {
        bad = bad || !bits_out;
        for (size_t i = 0; !bad && i < bits_count; i++) bits_out[i] = p->bits[i];
        int64_t bits_shape[3] = {p->num_layers, p->num_kv_heads, 2};
        if (!bad) bad = add_tensor(hdr, "code_bits", "I32", 3, bits_shape, &off, bits_count * sizeof(int32_t));
    }
    char *hdr_str = bad ? NULL : json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(hdr);
    if (!hdr_str) {
        free(clip_out);
        free(bits_out);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory building the file header");
    }

    /* Header padded with spaces to 8 bytes so the tensor data is aligned. */
    size_t hlen = strlen(hdr_str), padded = (hlen + 7) & ~(size_t)7;
    /* A temporary file of this save's own (mkstemp): with one fixed name, a
     * concurrent save to the same path would rename this one's half-written
     * file into place, or have its own moved away under it. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 12);
    if (!tmp) {
        free(hdr_str);
        free(clip_out);
        free(bits_out);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmpXXXXXX", 11);
    int fd = mkstemp(tmp);
    if (fd >= 0 && fchmod(fd, 0644) != 0) { /* mkstemp makes it 0600; a parameter file is not a secret */
        close(fd);
        unlink(tmp);
        fd = -1;
    }
    if (fd < 0) {
        oscar_status s = oscar_set_error(OSCAR_ERR_IO, "cannot create %s: %s (check the folder exists and is writable)",
                                         tmp, strerror(errno));
        free(tmp);
        free(hdr_str);
        free(clip_out);
        free(bits_out);
        return s;
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    int err = write_all(fd, lenbuf, 8) || write_all(fd, hdr_str, hlen) || write_all(fd, spaces, padded - hlen);
    free(hdr_str);
    for (int l = 0; l < p->num_layers && !err; l++) {
        for (int kv = 0; kv < 2 && !err; kv++) err = write_all(fd, oscar_params_rot_ptr(p, l, kv, 0), rot_bytes);
        for (int kv = 0; kv < 2 && !err && p->eig; kv++)
            err = write_all(fd, oscar_params_eig_ptr(p, l, kv, 0), eig_bytes);
        for (int kv = 0; kv < 2 && !err && p->fb; kv++) err = write_all(fd, oscar_params_fb_ptr(p, l, kv, 0), rot_bytes);
    }
    if (!err) err = write_all(fd, clip_out, clip_count * sizeof(float));
    free(clip_out);
    if (!err && bits_out) err = write_all(fd, bits_out, bits_count * sizeof(int32_t));
    free(bits_out);
    if (!err) err = fsync(fd);
    int saved = errno;
    if (close(fd) != 0 && !err) {
        err = 1;
        saved = errno;
    }
    if (!err && rename(tmp, path) != 0) {
        err = 1;
        saved = errno;
    }
    if (err) {
        unlink(tmp);
        oscar_status s = oscar_set_error(OSCAR_ERR_IO, "cannot write parameters to %s: %s (check disk space and "
                                         "permissions)", path, strerror(saved));
        free(tmp);
        return s;
    }
    free(tmp);
    return OSCAR_OK;
}

/* ------------------------------------------------------------------ load */

static oscar_status corrupt(const char *what) {
    return oscar_set_error(OSCAR_ERR_CORRUPT_FILE, "corrupt parameter file: %s; regenerate it with oscar-calibrate",
                           what);
}

/* Reads an integer metadata field in [lo, hi]; missing -> def (or error if required). */
static oscar_status meta_int(json_t *meta, const char *key, int required, int64_t lo, int64_t hi, int64_t def,
                             int64_t *out) {
    json_t *v = json_object_get(meta, key);
    if (!v) {
        if (required)
            return oscar_set_error(OSCAR_ERR_CORRUPT_FILE,
                                   "corrupt parameter file: metadata key \"%s\" is missing; regenerate it with "
                                   "oscar-calibrate",
                                   key);
        *out = def;
        return OSCAR_OK;
    }
    if (!json_is_integer(v))
        return oscar_set_error(OSCAR_ERR_CORRUPT_FILE,
                               "corrupt parameter file: metadata \"%s\" is not an integer; regenerate it with "
                               "oscar-calibrate",
                               key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return oscar_set_error(OSCAR_ERR_CORRUPT_FILE,
                               "corrupt parameter file: metadata \"%s\" = %lld outside [%lld, %lld]; regenerate it "
                               "with oscar-calibrate",
                               key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return OSCAR_OK;
}

static oscar_status meta_str(json_t *meta, const char *key, size_t cap, char *out) {
    json_t *v = json_object_get(meta, key);
    out[0] = '\0';
    if (!v) return OSCAR_OK;
    if (!json_is_string(v) || json_string_length(v) >= cap || strlen(json_string_value(v)) != json_string_length(v))
        return oscar_set_error(OSCAR_ERR_CORRUPT_FILE,
                               "corrupt parameter file: metadata \"%s\" must be a string of at most %zu characters",
                               key, cap - 1);
    /* Printable ASCII only: tools print these strings, and a hostile file's
     * terminal escapes must not reach a user's terminal or an engine's log. */
    for (const char *c = json_string_value(v); *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            return oscar_set_error(OSCAR_ERR_CORRUPT_FILE,
                                   "corrupt parameter file: metadata \"%s\" has a non-printable character (byte "
                                   "0x%02x): it must be printable ASCII", key, (unsigned)(unsigned char)*c);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return OSCAR_OK;
}

/* A file's string as a message may quote it: at most 80 bytes, anything not
 * printable ASCII as '?' (a hostile file's terminal escapes stay out of logs). */
static const char *shown(char dst[81], const char *src) {
    size_t k = 0;
    for (; src[k] && k < 80; k++) dst[k] = src[k] >= 0x20 && src[k] < 0x7f ? src[k] : '?';
    dst[k] = '\0';
    return dst;
}

/* One expected tensor: where the header says its bytes are. */
typedef struct tensor_slot {
    size_t begin, end;
    int found;
} tensor_slot;

/* Parses "layers.{l}.{rot,eig,fb}_{k,v}", "clip" or "code_bits" into a slot index:
 * layer * NKIND + {rot_k 0, rot_v 1, eig_k 2, eig_v 3, fb_k 4, fb_v 5};
 * clip is num_layers * NKIND, code_bits num_layers * NKIND + 1. */
static int tensor_index(const char *name, int num_layers) {
    if (strcmp(name, "clip") == 0) return num_layers * NKIND;
    if (strcmp(name, "code_bits") == 0) return num_layers * NKIND + 1;
    if (strncmp(name, "layers.", 7) != 0) return -1;
    const char *s = name + 7;
    long l = 0;
    int digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 5) {
        l = l * 10 + (*s - '0');
        s++;
        digits++;
    }
    if (digits == 0 || (digits > 1 && name[7] == '0') || l >= num_layers || *s != '.') return -1;
    s++;
    int kind;
    if (strcmp(s, "rot_k") == 0)
        kind = 0;
    else if (strcmp(s, "rot_v") == 0)
        kind = 1;
    else if (strcmp(s, "eig_k") == 0)
        kind = 2;
    else if (strcmp(s, "eig_v") == 0)
        kind = 3;
    else if (strcmp(s, "fb_k") == 0)
        kind = 4;
    else if (strcmp(s, "fb_v") == 0)
        kind = 5;
    else
        return -1;
    return (int)l * NKIND + kind;
}

static int cmp_slot(const void *a, const void *b) {
    const tensor_slot *x = *(const tensor_slot *const *)a, *y = *(const tensor_slot *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Checks one header entry: dtype, shape and byte range against what the
 * metadata implies. Nothing is read from the data region here. */
static oscar_status check_entry(const char *name, json_t *t, const char *dtype, int rank, const int64_t *shape,
                                size_t elem, size_t data_size, tensor_slot *slot) {
    char msg[256];
    if (!json_is_object(t)) {
        snprintf(msg, sizeof msg, "header entry \"%s\" is not an object", name);
        return corrupt(msg);
    }
    json_t *dt = json_object_get(t, "dtype"), *sh = json_object_get(t, "shape"), *of = json_object_get(t, "data_offsets");
    if (!json_is_string(dt) || strcmp(json_string_value(dt), dtype) != 0) {
        char sh_dt[81];
        snprintf(msg, sizeof msg, "tensor \"%s\" has dtype %s, expected %s", name,
                 json_is_string(dt) ? shown(sh_dt, json_string_value(dt)) : "(missing)", dtype);
        return corrupt(msg);
    }
    if (!json_is_array(sh) || json_array_size(sh) != (size_t)rank) {
        snprintf(msg, sizeof msg, "tensor \"%s\" must have rank %d", name, rank);
        return corrupt(msg);
    }
    size_t count = 1;
    for (int i = 0; i < rank; i++) {
        json_t *e = json_array_get(sh, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) != shape[i]) {
            snprintf(msg, sizeof msg, "tensor \"%s\" dimension %d is not %lld as the metadata implies", name, i,
                     (long long)shape[i]);
            return corrupt(msg);
        }
        count *= (size_t)shape[i];
    }
    if (!json_is_array(of) || json_array_size(of) != 2 || !json_is_integer(json_array_get(of, 0)) ||
        !json_is_integer(json_array_get(of, 1))) {
        snprintf(msg, sizeof msg, "tensor \"%s\" has no valid data_offsets [begin, end]", name);
        return corrupt(msg);
    }
    json_int_t b = json_integer_value(json_array_get(of, 0)), e = json_integer_value(json_array_get(of, 1));
    if (b < 0 || e < b || (uint64_t)e > (uint64_t)data_size) {
        snprintf(msg, sizeof msg, "tensor \"%s\" data_offsets [%lld, %lld] outside the %zu data bytes", name,
                 (long long)b, (long long)e, data_size);
        return corrupt(msg);
    }
    if ((uint64_t)(e - b) != (uint64_t)(count * elem)) {
        snprintf(msg, sizeof msg, "tensor \"%s\" spans %lld bytes but its shape needs %zu", name,
                 (long long)(e - b), count * elem);
        return corrupt(msg);
    }
    slot->begin = (size_t)b;
    slot->end = (size_t)e;
    slot->found = 1;
    return OSCAR_OK;
}

/* Where the tensor bytes come from: memory (fuzzer, tests) or a file read
 * with pread, not mapped, so that a file truncated while it loads is a short
 * read (an error) and never a SIGBUS in the caller's process. */
typedef struct {
    const uint8_t *mem; /* NULL: read from fd */
    int fd;
    uint64_t disk_bytes; /* bytes the file's blocks hold; UINT64_MAX for memory */
} pf_src;

static oscar_status src_read(const pf_src *src, size_t off, void *dst, size_t n) {
    if (src->mem) {
        memcpy(dst, src->mem + off, n);
        return OSCAR_OK;
    }
    uint8_t *o = dst;
    while (n > 0) {
        size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
        ssize_t got = pread(src->fd, o, chunk, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return oscar_set_error(OSCAR_ERR_IO, "parameter file: %s at byte %zu (was the file truncated or "
                                   "replaced while it loaded? write it elsewhere and rename it into place)",
                                   got < 0 ? strerror(errno) : "unexpected end of file", off);
        o += got, off += (size_t)got, n -= (size_t)got;
    }
    return OSCAR_OK;
}

/* bytes: the first 8 + header-length bytes (all of them for memory); size:
 * the whole file's size. */
static oscar_status load_impl(const uint8_t *bytes, size_t size, const pf_src *src, oscar_params **out) {
    char msg[256];
    if (size < 8) return corrupt("shorter than the 8-byte header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)bytes[i] << (8 * i);
    if (n > MAX_HEADER_BYTES) {
        snprintf(msg, sizeof msg, "header length %llu exceeds the 16 MiB limit", (unsigned long long)n);
        return corrupt(msg);
    }
    if (n > size - 8) {
        snprintf(msg, sizeof msg, "header length %llu runs past the end of the %zu-byte file", (unsigned long long)n,
                 size);
        return corrupt(msg);
    }
    const size_t data_base = 8 + (size_t)n; /* file offset of the tensor data */
    size_t data_size = size - 8 - (size_t)n;

    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES,
                             &jerr);
    json_t *meta = NULL;
    oscar_params *p = NULL;
    tensor_slot *slots = NULL;
    tensor_slot **order = NULL;
    uint8_t *tmp = NULL; /* clip / code-width tensor as read */
    oscar_status s = OSCAR_OK;
    if (!hdr) {
        snprintf(msg, sizeof msg, "header is not valid JSON (%s at byte %d)", jerr.text, jerr.position);
        return corrupt(msg);
    }
    if (!json_is_object(hdr)) {
        s = corrupt("header is not a JSON object");
        goto done;
    }
    json_t *md = json_object_get(hdr, "__metadata__");
    json_t *ms = json_is_object(md) ? json_object_get(md, "oscar") : NULL;
    if (!json_is_string(ms)) {
        s = corrupt("__metadata__.oscar is missing or not a string (is this an OSCAR parameter file?)");
        goto done;
    }
    meta = json_loadb(json_string_value(ms), json_string_length(ms), JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(meta)) {
        s = corrupt("__metadata__.oscar is not a JSON object");
        goto done;
    }

    int64_t fv = 0, L = 0, hq = 0, hkv = 0, d = 0, group = 0, sink = 0, recent = 0, ctok = 0;
    if ((s = meta_int(meta, "format_version", 1, 1, INT32_MAX, 0, &fv))) goto done;
    if (fv > OSCAR_PARAMS_FORMAT_VERSION) {
        s = oscar_set_error(OSCAR_ERR_VERSION,
                            "parameter file format_version %lld is newer than this library's %d: upgrade liboscar "
                            "or regenerate the file with this version's oscar-calibrate",
                            (long long)fv, OSCAR_PARAMS_FORMAT_VERSION);
        goto done;
    }
    if ((s = meta_int(meta, "num_layers", 1, 1, MAX_LAYERS, 0, &L))) goto done;
    if ((s = meta_int(meta, "num_q_heads", 1, 1, MAX_HEADS, 0, &hq))) goto done;
    if ((s = meta_int(meta, "num_kv_heads", 1, 1, MAX_HEADS, 0, &hkv))) goto done;
    if ((s = meta_int(meta, "head_dim", 1, 0, 1 << 20, 0, &d))) goto done;
    if ((s = meta_int(meta, "group", 0, 0, 1 << 20, oscar_group_default((int)d), &group))) goto done;
    if ((s = meta_int(meta, "sink", 0, 0, INT32_MAX, 64, &sink))) goto done;
    if ((s = meta_int(meta, "recent", 0, 0, INT32_MAX, 256, &recent))) goto done;
    if ((s = meta_int(meta, "calib_tokens", 0, 0, INT32_MAX, 0, &ctok))) goto done;
    if (!oscar_head_dim_supported((int)d)) {
        snprintf(msg, sizeof msg, "head_dim %lld is not " OSCAR_HEAD_DIM_RULE, (long long)d);
        s = corrupt(msg);
        goto done;
    }
    if (!oscar_group_supported((int)group, (int)d)) {
        snprintf(msg, sizeof msg, "group %lld is not " OSCAR_GROUP_RULE " %lld", (long long)group,
                 (long long)d);
        s = corrupt(msg);
        goto done;
    }
    if (hq % hkv != 0) {
        snprintf(msg, sizeof msg, "num_kv_heads %lld does not divide num_q_heads %lld", (long long)hkv, (long long)hq);
        s = corrupt(msg);
        goto done;
    }
    json_t *ph = json_object_get(meta, "per_head");
    if (!json_is_boolean(ph)) {
        s = corrupt("metadata \"per_head\" is missing or not a boolean");
        goto done;
    }
    int per_head = json_is_true(ph);
    json_t *mm = json_object_get(meta, "method");
    int method = -1;
    if (json_is_string(mm))
        for (int m = 0; m < OSCAR_METHOD_COUNT_; m++)
            if (strcmp(json_string_value(mm), oscar_method_name((oscar_method)m)) == 0) method = m;
    if (method < 0) {
        s = corrupt("metadata \"method\" is missing or not a known method name");
        goto done;
    }
    char model_hash[65], composition[16], libver[32];
    if ((s = meta_str(meta, "model_hash", sizeof model_hash, model_hash))) goto done;
    if ((s = meta_str(meta, "composition", sizeof composition, composition))) goto done;
    if ((s = meta_str(meta, "library_version", sizeof libver, libver))) goto done;

    /* Every header key must be an expected tensor with the right dtype,
     * shape and an exact, in-bounds byte range. */
    const int64_t nr = per_head ? hkv : 1;
    const size_t nslots = (size_t)L * NKIND + 2;
    slots = calloc(nslots, sizeof *slots);
    order = calloc(nslots, sizeof *order);
    if (!slots || !order) {
        s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory reading the parameter header");
        goto done;
    }
    const char *key;
    json_t *val;
    int64_t clip_heads = 1;
    json_object_foreach(hdr, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        int idx = tensor_index(key, (int)L);
        if (idx < 0) {
            char sh_key[81];
            snprintf(msg, sizeof msg, "unexpected tensor \"%s\" (not rot/eig/fb of a layer < %lld, nor clip, nor "
                     "code_bits)", shown(sh_key, key), (long long)L);
            s = corrupt(msg);
            goto done;
        }
        if (idx == (int)L * NKIND + 1) { /* code_bits: [L][Hkv][2] I32, from version 4 */
            if (fv < 4) {
                s = corrupt("code widths per head-tensor (tensor code_bits) need format_version 4");
                goto done;
            }
            int64_t shb[3] = {L, hkv, 2};
            if ((s = check_entry(key, val, "I32", 3, shb, 4, data_size, &slots[idx]))) goto done;
            continue;
        }
        int kind = idx == (int)L * NKIND ? NKIND : idx % NKIND;
        int64_t sh3[3] = {nr, d, d}, sh2[2] = {nr, d}, shc[3] = {L, 2, 2};
        if (kind <= 1 || kind == 4 || kind == 5)
            s = check_entry(key, val, "F32", 3, sh3, 4, data_size, &slots[idx]);
        else if (kind <= 3)
            s = check_entry(key, val, "F64", 2, sh2, 8, data_size, &slots[idx]);
        else { /* [L][2] (one ratio per layer, any version) or, from version 3, [L][Hkv][2] */
            json_t *csh = json_object_get(val, "shape");
            clip_heads = json_is_array(csh) && json_array_size(csh) == 3 ? hkv : 1;
            if (clip_heads > 1 && fv < 3) {
                s = corrupt("clip ratios per KV head (clip of shape [num_layers, num_kv_heads, 2]) need "
                            "format_version 3");
                goto done;
            }
            shc[1] = clip_heads > 1 ? hkv : 2;
            s = check_entry(key, val, "F32", clip_heads > 1 ? 3 : 2, shc, 4, data_size, &slots[idx]);
        }
        if (s) goto done;
    }
    int have_eig = slots[2].found, have_fb = slots[4].found;
    if (have_fb && fv < 2) {
        s = corrupt("feedback weights (fb_k, fb_v) need format_version 2");
        goto done;
    }
    size_t nfound = 0;
    for (int64_t l = 0; l < L; l++)
        for (int k = 0; k < NKIND; k++) {
            tensor_slot *t = &slots[l * NKIND + k];
            int opt = k >= 4 ? have_fb : k >= 2 ? have_eig : 1; /* optional kinds: all layers or none */
            const char *kname = k < 2 ? "rot" : k < 4 ? "eig" : "fb";
            if (!t->found && opt) {
                snprintf(msg, sizeof msg, "tensor \"layers.%lld.%s_%c\" is missing", (long long)l, kname,
                         k % 2 ? 'v' : 'k');
                s = corrupt(msg);
                goto done;
            }
            if (t->found && !opt) {
                snprintf(msg, sizeof msg, "%s tensors are given for some layers but not layer 0 K: give all or none",
                         kname);
                s = corrupt(msg);
                goto done;
            }
            if (t->found) order[nfound++] = t;
        }
    if (!slots[L * NKIND].found) {
        s = corrupt("tensor \"clip\" is missing");
        goto done;
    }
    order[nfound++] = &slots[L * NKIND];
    if (slots[L * NKIND + 1].found) order[nfound++] = &slots[L * NKIND + 1];
    qsort(order, nfound, sizeof *order, cmp_slot);
    for (size_t i = 1; i < nfound; i++)
        if (order[i]->begin < order[i - 1]->end) {
            snprintf(msg, sizeof msg, "tensor data ranges overlap at byte %zu", order[i]->begin);
            s = corrupt(msg);
            goto done;
        }

    /* The sizes are now proven to fit in the file, but a file's size is not
     * its content: cap the payload, and refuse a sparse file, before
     * allocating from it. */
    uint64_t payload = 0;
    for (size_t i = 0; i < nfound; i++) payload += order[i]->end - order[i]->begin;
    if (payload > MAX_TENSOR_BYTES) {
        snprintf(msg, sizeof msg, "tensors declare %llu bytes, above the %llu-byte limit of a parameter file "
                 "(check num_layers, num_kv_heads and per_head)", (unsigned long long)payload,
                 (unsigned long long)MAX_TENSOR_BYTES);
        s = corrupt(msg);
        goto done;
    }
    if (payload > SPARSE_CHECK_BYTES && src->disk_bytes < payload / 2) {
        snprintf(msg, sizeof msg, "tensors declare %llu bytes but the file's disk blocks hold only %llu: a sparse "
                 "file (holes), not a parameter file; regenerate it", (unsigned long long)payload,
                 (unsigned long long)src->disk_bytes);
        s = corrupt(msg);
        goto done;
    }
    /* Allocate and copy. */
    if ((s = oscar_params_alloc((int)L, (int)hq, (int)hkv, (int)d, per_head, &p))) {
        snprintf(msg, sizeof msg, "%s", oscar_last_error()); /* copy: the message buffer is reused */
        s = s == OSCAR_ERR_OUT_OF_MEMORY ? oscar_set_error(s, "%s", msg) : corrupt(msg);
        goto done;
    }
    p->method = (oscar_method)method;
    p->group = (int32_t)group;
    p->sink = (int32_t)sink;
    p->recent = (int32_t)recent;
    p->calib_tokens = (int32_t)ctok;
    memcpy(p->model_hash, model_hash, sizeof model_hash);
    memcpy(p->composition, composition, sizeof composition);
    const size_t dd = (size_t)d * (size_t)d;
    if (have_eig) {
        p->eig = malloc((size_t)L * 2 * (size_t)nr * (size_t)d * sizeof(double));
        if (!p->eig) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading eigenvalues");
            goto done;
        }
    }
    if (have_fb) {
        p->fb = malloc((size_t)L * 2 * (size_t)nr * dd * sizeof(float));
        if (!p->fb) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading feedback weights");
            goto done;
        }
    }
    for (int64_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            tensor_slot *t = &slots[l * NKIND + kv];
            if ((s = src_read(src, data_base + t->begin, oscar_params_rot_ptr(p, (int)l, kv, 0), t->end - t->begin)))
                goto done;
            if (have_eig) {
                t = &slots[l * NKIND + 2 + kv];
                if ((s = src_read(src, data_base + t->begin, oscar_params_eig_ptr(p, (int)l, kv, 0),
                                  t->end - t->begin)))
                    goto done;
            }
            if (have_fb) {
                t = &slots[l * NKIND + 4 + kv];
                if ((s = src_read(src, data_base + t->begin, oscar_params_fb_ptr(p, (int)l, kv, 0),
                                  t->end - t->begin)))
                    goto done;
            }
        }
    /* A per-layer clip tensor gives every KV head its layer's ratios. */
    {
        tensor_slot *t = &slots[L * NKIND];
        if (!(tmp = malloc(t->end - t->begin))) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading clip ratios");
            goto done;
        }
        if ((s = src_read(src, data_base + t->begin, tmp, t->end - t->begin))) goto done;
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < hkv; h++)
                memcpy(oscar_params_clip_ptr(p, (int)l, (int)h, 0),
                       tmp + (size_t)(l * clip_heads + (clip_heads > 1 ? h : 0)) * 2 * sizeof(float),
                       2 * sizeof(float));
        free(tmp);
        tmp = NULL;
    }

    /* Values: finite, orthogonal rotations, clips in (0, 1]. */
    p->identity = 1;
    for (int64_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t r = 0; r < nr; r++) {
                const float *R = oscar_params_rot_ptr(p, (int)l, kv, (int)r);
                for (size_t i = 0; i < dd; i++) {
                    if (!isfinite(R[i])) {
                        snprintf(msg, sizeof msg, "rotation layers.%lld.rot_%c[%lld] has a non-finite value",
                                 (long long)l, kv ? 'v' : 'k', (long long)r);
                        s = corrupt(msg);
                        goto done;
                    }
                    if (R[i] != ((i / (size_t)d) == (i % (size_t)d) ? 1.0f : 0.0f)) p->identity = 0;
                }
                double e = oscar_ref_orthogonality_error((int)d, R, ORTHO_TOL);
                if (e > ORTHO_TOL) {
                    snprintf(msg, sizeof msg, "rotation layers.%lld.rot_%c[%lld] is not orthogonal (max |R R^T - I| = %.3g > 1e-3)",
                             (long long)l, kv ? 'v' : 'k', (long long)r, e);
                    s = corrupt(msg);
                    goto done;
                }
                const float *F = oscar_params_fb_ptr(p, (int)l, kv, (int)r);
                size_t bad;
                if (F && !oscar_params_fb_valid(F, (int)d, &bad)) {
                    snprintf(msg, sizeof msg,
                             "feedback weights layers.%lld.fb_%c[%lld] entry (%zu, %zu) = %g: must be finite, "
                             "|F| <= 16 and 0 on and below the diagonal",
                             (long long)l, kv ? 'v' : 'k', (long long)r, bad / (size_t)d, bad % (size_t)d,
                             (double)F[bad]);
                    s = corrupt(msg);
                    goto done;
                }
                const double *ev = oscar_params_eig_ptr(p, (int)l, kv, (int)r);
                for (int64_t i = 0; ev && i < d; i++)
                    if (!isfinite(ev[i])) {
                        snprintf(msg, sizeof msg, "eigenvalues layers.%lld.eig_%c[%lld] are not finite", (long long)l,
                                 kv ? 'v' : 'k', (long long)r);
                        s = corrupt(msg);
                        goto done;
                    }
            }
    for (int64_t i = 0; i < L * hkv * 2; i++)
        if (!(p->clip[i] > 0.0f && p->clip[i] <= 1.0f)) {
            snprintf(msg, sizeof msg, "clip ratio of layer %lld KV head %lld %c is %g, outside (0, 1]",
                     (long long)(i / 2 / hkv), (long long)(i / 2 % hkv), i % 2 ? 'V' : 'K', (double)p->clip[i]);
            s = corrupt(msg);
            goto done;
        }
    if (slots[L * NKIND + 1].found) { /* code widths: 2 or 3, 3 only with uniform levels (oscar2) */
        const size_t nb = (size_t)L * (size_t)hkv * 2;
        p->bits = malloc(nb);
        if (!p->bits) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading code widths");
            goto done;
        }
        if (!(tmp = malloc(nb * sizeof(int32_t)))) {
            s = oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading code widths");
            goto done;
        }
        if ((s = src_read(src, data_base + slots[L * NKIND + 1].begin, tmp, nb * sizeof(int32_t)))) goto done;
        for (size_t i = 0; i < nb; i++) {
            int32_t b;
            memcpy(&b, tmp + i * sizeof b, sizeof b);
            if (b != 2 && b != 3) {
                snprintf(msg, sizeof msg, "code_bits of layer %lld KV head %lld %c is %ld: must be 2 or 3",
                         (long long)(i / 2 / (size_t)hkv), (long long)(i / 2 % (size_t)hkv), i % 2 ? 'V' : 'K',
                         (long)b);
                s = corrupt(msg);
                goto done;
            }
            if (b == 3 && method != OSCAR_METHOD_OSCAR2) {
                snprintf(msg, sizeof msg, "code_bits of layer %lld KV head %lld %c is 3, which needs method oscar2 "
                         "(uniform levels), not %s", (long long)(i / 2 / (size_t)hkv),
                         (long long)(i / 2 % (size_t)hkv), i % 2 ? 'V' : 'K', oscar_method_name((oscar_method)method));
                s = corrupt(msg);
                goto done;
            }
            p->bits[i] = (uint8_t)b;
        }
    }
    *out = p;
    p = NULL;
done:
    oscar_params_destroy(p);
    free(tmp);
    free(slots);
    free(order);
    json_decref(meta);
    json_decref(hdr);
    return s;
}

oscar_status oscar_params_load_memory(const void *data, size_t size, oscar_params **out) {
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_load: out is NULL");
    *out = NULL;
    if (!data && size) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_load: data is NULL");
    pf_src src = {data, -1, UINT64_MAX};
    return load_impl(data, size, &src, out);
}

oscar_status oscar_params_load_fd(int fd, size_t size, uint64_t disk_bytes, oscar_params **out) {
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_load: out is NULL");
    *out = NULL;
    if (size < 8) return corrupt("shorter than the 8-byte header length");
    pf_src src = {NULL, fd, disk_bytes};
    uint8_t len[8];
    oscar_status s = src_read(&src, 0, len, 8);
    if (s) return s;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len[i] << (8 * i);
    if (n > MAX_HEADER_BYTES || n > size - 8) 
        return load_impl(len, size, &src, out); /* refused there before it reads past len */
    /* Only the header is read into memory; tensors go straight into the
     * parameters' own arrays. */
    uint8_t *head = malloc(8 + (size_t)n);
    if (!head) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory reading the parameter header");
    memcpy(head, len, 8);
    if (!(s = src_read(&src, 8, head + 8, (size_t)n))) s = load_impl(head, size, &src, out);
    free(head);
    return s;
}

OSCAR_API oscar_status oscar_params_load(const char *path, oscar_params **out) {
    oscar_clear_error();
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_load: out is NULL");
    *out = NULL;
    if (!path) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_params_load: path is NULL");
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block: refused below */
    if (fd < 0) return oscar_set_error(OSCAR_ERR_IO, "cannot open parameter file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return oscar_set_error(OSCAR_ERR_IO, "%s is not a regular file: give the path of a .safetensors file", path);
    }
    oscar_status s = oscar_params_load_fd(fd, (size_t)st.st_size, (uint64_t)st.st_blocks * 512u, out);
    close(fd);
    return s;
}
