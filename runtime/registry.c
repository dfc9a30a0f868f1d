/* Backend registry: finds the plugins at load time, probes them, picks one.
 * Search order for liboscar_backend_NAME.so: options->plugin_dir,
 * $OSCAR_PLUGIN_PATH (colon-separated), the folder holding liboscar and its
 * oscar/ subfolder (the installed layout), the executable's folder and
 * ../lib beside it. A requested backend (options->backend or $OSCAR_BACKEND)
 * is the only plugin opened. Every candidate and the reason it
 * was skipped go into the runtime's report. */
#define _GNU_SOURCE 1 /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

/* Subfolder of liboscar's folder holding the installed plugins. */
#define OSCAR_PLUGIN_SUBDIR "oscar"

static void report_add(oscar_runtime *rt, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    /* Whole lines, however long the paths in them: a line past the end is lost to the reader. */
    char *grown = realloc(rt->report, rt->report_len + (size_t)n + 1);
    if (!grown) return; /* out of memory: the report keeps the lines it has */
    rt->report = grown;
    char *line = rt->report + rt->report_len;
    va_start(ap, fmt);
    vsnprintf(line, (size_t)n + 1, fmt, ap);
    va_end(ap);
    rt->report_len += (size_t)n;
    if (rt->log) {
        const int nl = line[n - 1] == '\n';
        if (nl) line[n - 1] = '\0'; /* the log takes lines without their newline */
        rt->log(rt->log_user, line);
        if (nl) line[n - 1] = '\n';
    }
}

/* Frees a runtime object (its report included); the backend is the caller's to shut down. */
static void runtime_free(oscar_runtime *rt) {
    if (!rt) return;
    free(rt->report);
    free(rt);
}

void oscar_runtime_options_default(oscar_runtime_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
}

/* Folders searched: plugin_dir, up to 64 OSCAR_PLUGIN_PATH entries, and the 4 fixed ones. */
#define OSCAR_PLUGIN_PATH_ENTRIES_MAX 64
#define OSCAR_SEARCH_DIRS_MAX (1 + OSCAR_PLUGIN_PATH_ENTRIES_MAX + 4)

/* Folders to search, in order; returns how many were written. An OSCAR_PLUGIN_PATH entry too long
 * for a path is skipped with a report line (plugin_dir is refused before this), and so are the
 * entries past the 64th: the fixed folders after them (liboscar's own, its oscar/ subfolder, the
 * executable's) keep their places (a list of 16 dropped them behind a long variable, silently). */
static int search_dirs(oscar_runtime *rt, const oscar_runtime_options *o, char dirs[][PATH_MAX], int max) {
    int n = 0;
    if (o->plugin_dir && o->plugin_dir[0] && n < max) snprintf(dirs[n++], PATH_MAX, "%s", o->plugin_dir);
    const char *env = getenv("OSCAR_PLUGIN_PATH");
    if (env) {
        const char *p = env;
        const int env_max = n + OSCAR_PLUGIN_PATH_ENTRIES_MAX < max - 4 ? n + OSCAR_PLUGIN_PATH_ENTRIES_MAX : max - 4;
        while (*p) {
            const char *c = strchr(p, ':');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            if (len > 0 && n >= env_max) {
                report_add(rt, "  OSCAR_PLUGIN_PATH entries from '%.*s' on skipped: more than %d folders; "
                           "shorten it\n", (int)(len < 200 ? len : 200), p, OSCAR_PLUGIN_PATH_ENTRIES_MAX);
                break;
            }
            if (len > 0 && len < PATH_MAX) {
                memcpy(dirs[n], p, len);
                dirs[n++][len] = '\0';
            } else if (len >= PATH_MAX) {
                report_add(rt, "  OSCAR_PLUGIN_PATH entry of %zu bytes ('%.40s...') skipped: longer than a path "
                           "(PATH_MAX %d); shorten it\n", len, p, (int)PATH_MAX);
            }
            if (!c) break;
            p = c + 1;
        }
    }
    Dl_info info;
    if (n < max && dladdr((void *)&oscar_runtime_create, &info) && info.dli_fname) {
        snprintf(dirs[n], PATH_MAX, "%s", info.dli_fname);
        char *slash = strrchr(dirs[n], '/');
        if (slash) {
            *slash = '\0';
            n++;
            /* Installed layout (cmake/OscarPackage.cmake): <libdir>/liboscar.so
             * with the plugins in <libdir>/oscar, found wherever the prefix was moved. */
            size_t len = strlen(dirs[n - 1]);
            if (n < max && len + sizeof "/" OSCAR_PLUGIN_SUBDIR <= PATH_MAX) {
                memcpy(dirs[n], dirs[n - 1], len);
                memcpy(dirs[n] + len, "/" OSCAR_PLUGIN_SUBDIR, sizeof "/" OSCAR_PLUGIN_SUBDIR);
                n++;
            }
        }
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            if (n < max) snprintf(dirs[n++], PATH_MAX, "%s", exe);
            if (n < max) snprintf(dirs[n++], PATH_MAX, "%.*s/../lib", PATH_MAX - 8, exe);
        }
    }
    return n;
}

/* One candidate plugin: opened and probed, or a reason in `why`. */
typedef struct candidate {
    const char *name;
    const oscar_backend_api *api;
    void *dl;
    int score;
    char path[PATH_MAX + 64];
} candidate;

static void try_plugin(oscar_runtime *rt, const oscar_runtime_options *o, candidate *c, char dirs[][PATH_MAX],
                       int ndirs) {
    c->score = 0;
    int found_any = 0;
    char seen[16][PATH_MAX];
    int nseen = 0;
    for (int i = 0; i < ndirs && !c->api; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/liboscar_backend_%s.so", dirs[i], c->name);
        if (access(path, R_OK) != 0) continue;
        /* dlopen reads the file: on a FIFO it waited for a writer forever (oscar_runtime_create hung on
         * a pipe named liboscar_backend_opencl.so in OSCAR_PLUGIN_PATH); only regular files are tried. */
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            found_any = 1;
            report_add(rt, "  %-7s skipped: %s is not a regular file (a folder, FIFO or device): remove it or "
                       "change OSCAR_PLUGIN_PATH / plugin_dir\n", c->name, path);
            continue;
        }
        /* The same file reached through two search folders is tried once. */
        char real[PATH_MAX];
        if (realpath(path, real)) {
            int dup = 0;
            for (int k = 0; k < nseen; k++) dup |= !strcmp(seen[k], real);
            if (dup) continue;
            if (nseen < 16) memcpy(seen[nseen++], real, sizeof real);
        }
        found_any = 1;
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!dl) {
            const char *e = dlerror();
            report_add(rt, "  %-7s skipped: %s cannot be loaded (%s)\n", c->name, path, e ? e : "?");
            continue;
        }
        oscar_backend_entry_fn entry;
        void *sym = dlsym(dl, OSCAR_BACKEND_ENTRY_SYMBOL);
        memcpy(&entry, &sym, sizeof entry); /* object-to-function pointer without UB casts */
        const oscar_backend_api *api = sym ? entry() : NULL;
        if (!api) {
            report_add(rt, "  %-7s skipped: %s exports no %s\n", c->name, path, OSCAR_BACKEND_ENTRY_SYMBOL);
            dlclose(dl);
            continue;
        }
        if (api->abi_version != OSCAR_BACKEND_ABI_VERSION) {
            report_add(rt, "  %-7s skipped: %s has plugin ABI %u, this library needs %u (rebuild the plugin)\n",
                       c->name, path, api->abi_version, (unsigned)OSCAR_BACKEND_ABI_VERSION);
            dlclose(dl);
            continue;
        }
        oscar_errbuf why = {{0}};
        int score = api->probe(o->device_index, &why);
        if (score <= 0) {
            report_add(rt, "  %-7s skipped: %s loaded but cannot run here: %s\n", c->name, path,
                       why.msg[0] ? why.msg : "no device");
            dlclose(dl);
            continue;
        }
        c->api = api;
        c->dl = dl;
        c->score = score;
        snprintf(c->path, sizeof c->path, "%s", path);
        report_add(rt, "  %-7s found:   %s (score %d)\n", c->name, path, score);
    }
    if (!found_any) report_add(rt, "  %-7s skipped: liboscar_backend_%s.so not in any search folder\n", c->name, c->name);
}

oscar_status oscar_runtime_create(const oscar_runtime_options *o, oscar_runtime **out) {
    oscar_clear_error();
    if (!out) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_runtime_create: NULL output");
    *out = NULL;
    oscar_runtime_options def;
    if (!o) {
        oscar_runtime_options_default(&def);
        o = &def;
    }
    /* Read the caller's options through a full-size copy: an older (smaller)
     * struct gets the new fields zeroed (runtime/abi.c). */
    oscar_runtime_options opt;
    oscar_status vs = oscar_struct_import(&opt, sizeof opt, o, OSCAR_RUNTIME_OPTIONS_SIZE_V1, "oscar_runtime_create",
                                          "oscar_runtime_options_default");
    if (vs != OSCAR_OK) return vs;
    o = &opt;
    /* Cut to PATH_MAX, a longer plugin_dir named another folder (its prefix), and plugins were
     * loaded from there. */
    if (o->plugin_dir && strnlen(o->plugin_dir, PATH_MAX) >= PATH_MAX)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_runtime_create: plugin_dir is %d bytes or longer (PATH_MAX): no folder has such "
                               "a path; pass the plugins' folder (shorter, e.g. through a symlink) or NULL",
                               PATH_MAX);
    /* No GPU ordinal is negative: with no backend named such an index fell through to the CPU
     * reference as if no GPU were there. */
    if (o->device_index < 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_runtime_create: device_index %d is negative; pass the GPU's ordinal (0 for the "
                               "first device; the CPU backend ignores it)",
                               (int)o->device_index);
    /* A safety switch: a value it does not take must not leave validation off without a word. */
    const char *venv = getenv("OSCAR_VALIDATE");
    if (venv && venv[0] && strcmp(venv, "0") != 0 && strcmp(venv, "1") != 0)
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "OSCAR_VALIDATE='%.40s' is not 0 or 1; set OSCAR_VALIDATE=1 to check index arrays on "
                               "the host before every call, 0 or unset not to",
                               venv);
    oscar_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_runtime_create: out of memory");
    rt->log = o->log;
    rt->log_user = o->log_user;
    rt->validate = o->validate || (venv && !strcmp(venv, "1"));

    const char *want = o->backend;
    const char *want_src = "options";
    /* The caller's OpenCL context and queue (interop): OpenCL or nothing. */
    const int native = o->native_context || o->native_queue;
    if (native && want && want[0] && strcmp(want, "opencl") != 0) {
        runtime_free(rt);
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                               "oscar_runtime_create: native_context/native_queue are OpenCL handles but backend "
                               "'%s' was requested; request 'opencl' or leave them NULL",
                               want);
    }
    if (native) want = "opencl";
    if (!want || !want[0]) {
        want = getenv("OSCAR_BACKEND");
        want_src = "OSCAR_BACKEND";
    }
    if (want && !want[0]) want = NULL;
    if (want && strcmp(want, "cpu") && strcmp(want, "cuda") && strcmp(want, "hip") && strcmp(want, "opencl")) {
        runtime_free(rt);
        return oscar_set_error(OSCAR_ERR_NO_BACKEND,
                               "unknown backend '%s' (from %s); valid: cpu, cuda, hip, opencl", want, want_src);
    }

    report_add(rt, "liboscar %s backends:\n", oscar_version(NULL, NULL, NULL));
    report_add(rt, "  %-7s found:   built in (score 1)\n", "cpu");
    char(*dirs)[PATH_MAX] = calloc(OSCAR_SEARCH_DIRS_MAX, PATH_MAX);
    if (!dirs) {
        runtime_free(rt);
        return oscar_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oscar_runtime_create: out of memory");
    }
    int ndirs = search_dirs(rt, o, dirs, OSCAR_SEARCH_DIRS_MAX);
    candidate cands[3] = {{.name = "cuda"}, {.name = "hip"}, {.name = "opencl"}};
    for (int i = 0; i < 3; i++) {
        /* Asked for one backend: open no other plugin (a vendor runtime loaded
         * only to be probed can leave threads and memory behind). */
        if (want && strcmp(want, cands[i].name) != 0)
            report_add(rt, "  %-7s skipped: not opened, backend '%s' requested (%s)\n", cands[i].name, want,
                       want_src);
        else
            try_plugin(rt, o, &cands[i], dirs, ndirs);
    }
    free(dirs);

    /* Choose: the requested one, else the highest score (CPU scores 1). */
    int pick = -1; /* -1: cpu */
    if (want && strcmp(want, "cpu") != 0) {
        for (int i = 0; i < 3; i++)
            if (!strcmp(cands[i].name, want)) pick = cands[i].api ? i : -2;
        if (pick == -2) {
            oscar_status s = oscar_set_error(OSCAR_ERR_NO_BACKEND,
                                             "backend '%s' requested (%s) but not available here:\n%s"
                                             "Build its plugin (see README) or choose another backend.",
                                             want, want_src, oscar_runtime_report(rt));
            for (int i = 0; i < 3; i++)
                if (cands[i].dl) dlclose(cands[i].dl);
            runtime_free(rt);
            return s;
        }
    } else if (!want) {
        int best = 1;
        for (int i = 0; i < 3; i++)
            if (cands[i].api && cands[i].score > best) {
                best = cands[i].score;
                pick = i;
            }
    }
    for (int i = 0; i < 3; i++)
        if (i != pick && cands[i].dl) dlclose(cands[i].dl);

    if (pick >= 0) {
        rt->api = cands[pick].api;
        rt->dl = cands[pick].dl;
    } else {
        rt->api = oscar_cpu_backend();
    }
    oscar_errbuf err = {{0}};
    oscar_status s;
    if (native) {
        /* Optional plugin entry, looked up by name (no plugin ABI change). */
        typedef oscar_status (*init_native_fn)(void *, void *, void **, oscar_errbuf *);
        init_native_fn init_native = NULL;
        void *sym = dlsym(rt->dl, "oscar_backend_init_native_v1");
        memcpy(&init_native, &sym, sizeof init_native);
        s = init_native ? init_native(o->native_context, o->native_queue, &rt->ctx, &err)
                        : oscar_errbuf_set(&err, OSCAR_ERR_NO_BACKEND,
                                           "the OpenCL plugin cannot take a caller's context (it predates "
                                           "native_context); rebuild it");
    } else {
        s = rt->api->init(o->device_index, &rt->ctx, &err);
    }
    if (s != OSCAR_OK) {
        oscar_set_errbuf(s, &err);
        if (rt->dl) dlclose(rt->dl);
        runtime_free(rt);
        return s;
    }
    snprintf(rt->backend, sizeof rt->backend, "%s", rt->api->name);
    const char *dev = rt->api->device_name ? rt->api->device_name(rt->ctx) : NULL;
    snprintf(rt->device, sizeof rt->device, "%s", dev ? dev : "unknown");
    report_add(rt, "chosen: %s (%s)%s\n", rt->backend, rt->device,
               want ? (strcmp(want_src, "options") ? " [from OSCAR_BACKEND]" : " [requested]") : "");
    *out = rt;
    return OSCAR_OK;
}

void oscar_runtime_destroy(oscar_runtime *rt) {
    if (!rt) return;
    /* Drops one holder (the creator's, or a plan's: oscar_plan_destroy calls
     * this); the last one tears the backend down. */
    if (atomic_fetch_sub(&rt->refs, 1) > 0) return;
    if (rt->api && rt->api->shutdown) rt->api->shutdown(rt->ctx);
    if (rt->dl) dlclose(rt->dl);
    runtime_free(rt);
}

const char *oscar_runtime_backend(const oscar_runtime *rt) { return rt ? rt->backend : ""; }
const char *oscar_runtime_device(const oscar_runtime *rt) { return rt ? rt->device : ""; }
const char *oscar_runtime_report(const oscar_runtime *rt) { return rt && rt->report ? rt->report : ""; }

/* ------------------------------------------------------------- buffers */
oscar_status oscar_buffer_alloc(oscar_runtime *rt, size_t bytes, void **buf) {
    oscar_clear_error();
    if (!rt || !buf) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_buffer_alloc: NULL argument");
    if (bytes == 0) return oscar_set_error(OSCAR_ERR_EMPTY, "oscar_buffer_alloc: zero bytes requested");
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(rt->api->alloc(rt->ctx, bytes, buf, &e), &e);
}

void oscar_buffer_free(oscar_runtime *rt, void *buf) {
    if (rt && buf) rt->api->free(rt->ctx, buf);
}

/* offset + bytes past SIZE_MAX: no buffer ends there (host memory would be
 * addressed by a wrapped pointer). */
static oscar_status copy_wraps(const char *fn, size_t offset, size_t bytes) {
    return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT,
                           "%s: offset %zu + %zu bytes passes SIZE_MAX; pass the offset into the buffer and the "
                           "byte count of the copy",
                           fn, offset, bytes);
}

oscar_status oscar_buffer_write(oscar_runtime *rt, void *dst, size_t offset, const void *src, size_t bytes,
                                void *stream) {
    oscar_clear_error();
    if (!rt || !dst || (!src && bytes))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_buffer_write: NULL argument");
    if (offset > SIZE_MAX - bytes) return copy_wraps("oscar_buffer_write", offset, bytes);
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(rt->api->write(rt->ctx, dst, offset, src, bytes, stream, &e), &e);
}

oscar_status oscar_buffer_read(oscar_runtime *rt, void *dst, const void *src, size_t offset, size_t bytes,
                               void *stream) {
    oscar_clear_error();
    if (!rt || !src || (!dst && bytes))
        return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_buffer_read: NULL argument");
    if (offset > SIZE_MAX - bytes) return copy_wraps("oscar_buffer_read", offset, bytes);
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(rt->api->read(rt->ctx, dst, src, offset, bytes, stream, &e), &e);
}

oscar_status oscar_synchronize(oscar_runtime *rt, void *stream) {
    oscar_clear_error();
    if (!rt) return oscar_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oscar_synchronize: NULL runtime");
    oscar_errbuf e = {{0}};
    return oscar_set_errbuf(rt->api->sync(rt->ctx, stream, &e), &e);
}
