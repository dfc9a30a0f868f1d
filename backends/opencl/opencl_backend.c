/* OpenCL backend plugin (liboscar_backend_opencl.so). Buffers are cl_mem
 * handles passed as void*; stream is a cl_command_queue or NULL for the
 * backend's own in-order queue. Kernels are compiled at plan time from the
 * generated source (templates/ rendered into oscar_opencl_source.c) with the
 * shape as -D constants; programs are cached per context by their options. */
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_core.h"
#include "oscar_format.h" /* page geometry: the sizes a call's buffers must hold */

extern const char oscar_opencl_source[];
extern const size_t oscar_opencl_source_len;
extern const int oscar_opencl_tuning[3][7];

#define MAX_PROGRAMS 64

typedef struct cl_prog_entry {
    char opts[384];
    cl_program prog;
} cl_prog_entry;

typedef struct cl_ctx {
    gpu_ctx_head head;
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    cl_uint compute_units;
    char name[256];
    cl_prog_entry progs[MAX_PROGRAMS];
    int nprogs;
    /* A plan's cl_kernel objects are shared by every thread using the plan,
     * and OpenCL kernel arguments are state of the kernel object: setting
     * them and enqueueing must be one step, or a launch may run with another
     * thread's arguments (clSetKernelArg is not thread-safe on one kernel).
     * Also guards the program cache (plans created from several threads). */
    pthread_mutex_t lock;
} cl_ctx;

typedef struct cl_plan_kernels {
    cl_kernel k[7];
} cl_plan_kernels;

/* A plan's kernels, in cl_plan_kernels' order. */
static const char *const k_kernel_names[7] = {"oscar_store", "oscar_demote", "oscar_rotate_q", "oscar_decode",
                                              "oscar_merge", "oscar_extend", "oscar_merge_ext"};

/* Releases the first n kernels of pk (the ones created) and pk itself. */
static void release_kernels(cl_plan_kernels *pk, int n) {
    for (int i = 0; i < n; i++) clReleaseKernel(pk->k[i]);
    free(pk);
}

static cl_command_queue Q(cl_ctx *c, void *stream) { return stream ? (cl_command_queue)stream : c->queue; }

/* The caller's cl_mem and queues must belong to the runtime's context: OpenCL
 * leaves another context's objects undefined (PoCL ran such an append, other
 * drivers fail with -34, CL_INVALID_CONTEXT, naming nothing). */
static oscar_status foreign(const char *fn, const char *name, const char *what, oscar_errbuf *err) {
    return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                            "opencl %s: %s is a %s of another cl_context than the runtime's; allocate buffers with "
                            "oscar_buffer_alloc and pass queues of the runtime's context, or create the runtime on "
                            "your context (oscar_runtime_options.native_context / native_queue)",
                            fn, name, what);
}
static oscar_status queue_ok(const cl_ctx *c, const char *fn, void *stream, oscar_errbuf *err) {
    if (!stream) return OSCAR_OK;
    cl_context qc = NULL;
    cl_int rc = clGetCommandQueueInfo((cl_command_queue)stream, CL_QUEUE_CONTEXT, sizeof qc, &qc, NULL);
    if (rc != CL_SUCCESS)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl %s: stream is not a cl_command_queue (clGetCommandQueueInfo: %d); pass NULL "
                                "(the runtime's queue) or a queue of the runtime's context",
                                fn, (int)rc);
    if (qc != c->context) return foreign(fn, "stream", "cl_command_queue", err);
    /* A context may span devices; the programs are built for the runtime's device only (a kernel
     * enqueued on another device's queue: PoCL aborted the process, other drivers fail with -45). */
    cl_device_id qd = NULL;
    rc = clGetCommandQueueInfo((cl_command_queue)stream, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
    if (rc == CL_SUCCESS && qd != c->device) {
        char dn[128] = "";
        clGetDeviceInfo(qd, CL_DEVICE_NAME, sizeof dn - 1, dn, NULL);
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl %s: stream is a cl_command_queue of another device (%s) of the runtime's "
                                "context; the kernels are built for the runtime's device (%s): pass a queue of that "
                                "device, or a runtime made on the other device's queue",
                                fn, dn, c->name);
    }
    /* A call's kernels follow each other on the queue (rotation, attention, merge): an
     * out-of-order queue would run them at once, on each other's half-written data. */
    cl_command_queue_properties props = 0;
    rc = clGetCommandQueueInfo((cl_command_queue)stream, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (rc == CL_SUCCESS && (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl %s: stream is an out-of-order cl_command_queue; a call's kernels depend on "
                                "each other in queue order: pass an in-order queue",
                                fn);
    return OSCAR_OK;
}

static oscar_status cl_fail(oscar_errbuf *err, const char *what, cl_int rc) {
    return oscar_errbuf_set(err, OSCAR_ERR_BACKEND, "opencl: %s failed with error %d", what, (int)rc);
}

/* First device of the index-th overall (platform, device) pair. */
static cl_int find_device_unlocked(int index, cl_platform_id *plat, cl_device_id *dev, char *why, size_t whylen) {
    cl_uint np = 0;
    cl_int rc = clGetPlatformIDs(0, NULL, &np);
    if (rc != CL_SUCCESS || np == 0) {
        snprintf(why, whylen, "no OpenCL platform (clGetPlatformIDs: %d, %u platforms); install an ICD such as pocl",
                 (int)rc, np);
        return rc != CL_SUCCESS ? rc : CL_DEVICE_NOT_FOUND;
    }
    cl_platform_id ps[16];
    if (np > 16) np = 16;
    clGetPlatformIDs(np, ps, NULL);
    int seen = 0;
    for (cl_uint i = 0; i < np; i++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id ds[16];
        if (nd > 16) nd = 16;
        clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, nd, ds, NULL);
        for (cl_uint j = 0; j < nd; j++, seen++)
            if (seen == index) {
                *plat = ps[i];
                *dev = ds[j];
                return CL_SUCCESS;
            }
    }
    snprintf(why, whylen, "OpenCL device index %d not found (%d devices on %u platforms)", index, seen, np);
    return CL_DEVICE_NOT_FOUND;
}

/* PoCL (3.1, Debian 12) sets its devices up on the first clGetDeviceIDs
 * of the process and is not safe doing so from several threads at once:
 * runtimes created concurrently segfaulted in clGetDeviceInfo (a device
 * name still NULL). One discovery at a time; once it is done, contexts
 * and queries on them may run concurrently. Process-wide, as PoCL's state. */
static pthread_mutex_t g_discovery_lock = PTHREAD_MUTEX_INITIALIZER;
static cl_int find_device(int index, cl_platform_id *plat, cl_device_id *dev, char *why, size_t whylen) {
    pthread_mutex_lock(&g_discovery_lock);
    cl_int rc = find_device_unlocked(index, plat, dev, why, whylen);
    pthread_mutex_unlock(&g_discovery_lock);
    return rc;
}

static int ocl_probe(int device_index, oscar_errbuf *why) {
    cl_platform_id p;
    cl_device_id d;
    char msg[256];
    if (find_device(device_index, &p, &d, msg, sizeof msg) != CL_SUCCESS) {
        oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND, "%s", msg);
        return 0;
    }
    return 100;
}

static const gpu_vendor k_vendor;

static void describe(cl_ctx *c, const char *note) {
    clGetDeviceInfo(c->device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof c->compute_units, &c->compute_units, NULL);
    char dn[200] = "", pn[48] = "";
    clGetDeviceInfo(c->device, CL_DEVICE_NAME, sizeof dn - 1, dn, NULL);
    clGetPlatformInfo(c->platform, CL_PLATFORM_NAME, sizeof pn - 1, pn, NULL);
    snprintf(c->name, sizeof c->name, "%s (%s%s)", dn, pn, note);
}

static oscar_status ocl_init(int device_index, void **ctx, oscar_errbuf *err) {
    cl_ctx *c = calloc(1, sizeof *c);
    if (!c) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "opencl init: out of host memory");
    c->head.vendor = &k_vendor;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return oscar_errbuf_set(err, OSCAR_ERR_INTERNAL, "opencl init: cannot create the launch lock");
    }
    char msg[256];
    cl_int rc = find_device(device_index, &c->platform, &c->device, msg, sizeof msg);
    if (rc != CL_SUCCESS) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return oscar_errbuf_set(err, OSCAR_ERR_NO_BACKEND, "opencl init: %s", msg);
    }
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)c->platform, 0};
    c->context = clCreateContext(props, 1, &c->device, NULL, NULL, &rc);
    if (rc == CL_SUCCESS) c->queue = clCreateCommandQueue(c->context, c->device, 0, &rc);
    if (rc != CL_SUCCESS) {
        if (c->context) clReleaseContext(c->context);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return cl_fail(err, "context/queue creation", rc);
    }
    describe(c, "");
    *ctx = c;
    return OSCAR_OK;
}

static void ocl_shutdown(void *ctx) {
    cl_ctx *c = ctx;
    if (!c) return;
    for (int i = 0; i < c->nprogs; i++) clReleaseProgram(c->progs[i].prog);
    clReleaseCommandQueue(c->queue);
    clReleaseContext(c->context);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static const char *ocl_device_name(void *ctx) { return ((cl_ctx *)ctx)->name; }

static oscar_status ocl_alloc(void *ctx, size_t bytes, void **buf, oscar_errbuf *err) {
    cl_ctx *c = ctx;
    cl_int rc;
    if (!buf) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl alloc: buf is NULL");
    cl_mem m = clCreateBuffer(c->context, CL_MEM_READ_WRITE, bytes ? bytes : 16, NULL, &rc);
    if (rc != CL_SUCCESS) {
        /* Name the device's limits: -61 (CL_INVALID_BUFFER_SIZE) alone tells no caller what to change. */
        cl_ulong max_alloc = 0, global = 0;
        clGetDeviceInfo(c->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
        clGetDeviceInfo(c->device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY,
                                "opencl alloc: clCreateBuffer(%zu bytes) failed (%d); the device allows buffers of "
                                "up to %llu bytes (CL_DEVICE_MAX_MEM_ALLOC_SIZE) and has %llu bytes in all: "
                                "allocate less (fewer sequences, pages or a shorter max_seq_len)",
                                bytes, (int)rc, (unsigned long long)max_alloc, (unsigned long long)global);
    }
    *buf = m;
    return OSCAR_OK;
}

static void ocl_free(void *ctx, void *buf) {
    (void)ctx;
    if (buf) clReleaseMemObject((cl_mem)buf);
}

/* The size of a caller's cl_mem m, refusing what is no cl_mem or one of another context. */
static oscar_status mem_size(const cl_ctx *c, const char *fn, const char *name, const void *m, size_t *have,
                             oscar_errbuf *err) {
    cl_context mc = NULL;
    cl_int rc = clGetMemObjectInfo((cl_mem)m, CL_MEM_SIZE, sizeof *have, have, NULL);
    if (rc == CL_SUCCESS) rc = clGetMemObjectInfo((cl_mem)m, CL_MEM_CONTEXT, sizeof mc, &mc, NULL);
    if (rc != CL_SUCCESS)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl %s: %s is not a cl_mem of this runtime (clGetMemObjectInfo: %d); pass "
                                "buffers from oscar_buffer_alloc or the runtime's native context",
                                fn, name, (int)rc);
    return mc == c->context ? OSCAR_OK : foreign(fn, name, "cl_mem", err);
}

/* A copy of bytes at offset stays inside the cl_mem (it knows its size): the
 * runtime's -30 (CL_INVALID_VALUE) alone names neither the buffer nor the fix. */
static oscar_status copy_fits(const cl_ctx *c, const char *fn, const void *m, size_t offset, size_t bytes,
                              void *stream, oscar_errbuf *err) {
    size_t have = 0;
    oscar_status s = mem_size(c, fn, "the buffer", m, &have, err);
    if (s != OSCAR_OK) return s;
    if (offset > have || bytes > have - offset)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl %s: %zu bytes at offset %zu run past the end of the %zu-byte buffer; nothing "
                                "was copied (copy at most %zu bytes there)",
                                fn, bytes, offset, have, offset < have ? have - offset : 0);
    return queue_ok(c, fn, stream, err);
}

static oscar_status ocl_write(void *ctx, void *dst, size_t offset, const void *src, size_t bytes, void *stream,
                              oscar_errbuf *err) {
    if (!bytes) return OSCAR_OK;
    if (!dst || !src) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl write: NULL buffer");
    oscar_status s = copy_fits(ctx, "write", dst, offset, bytes, stream, err);
    if (s != OSCAR_OK) return s;
    /* Blocking: the caller may reuse src at once (not a hot-path call). */
    cl_int rc = clEnqueueWriteBuffer(Q(ctx, stream), (cl_mem)dst, CL_TRUE, offset, bytes, src, 0, NULL, NULL);
    return rc == CL_SUCCESS ? OSCAR_OK : cl_fail(err, "clEnqueueWriteBuffer", rc);
}

static oscar_status ocl_read(void *ctx, void *dst, const void *src, size_t offset, size_t bytes, void *stream,
                             oscar_errbuf *err) {
    if (!bytes) return OSCAR_OK;
    if (!dst || !src) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl read: NULL buffer");
    oscar_status s = copy_fits(ctx, "read", src, offset, bytes, stream, err);
    if (s != OSCAR_OK) return s;
    cl_int rc = clEnqueueReadBuffer(Q(ctx, stream), (cl_mem)src, CL_TRUE, offset, bytes, dst, 0, NULL, NULL);
    return rc == CL_SUCCESS ? OSCAR_OK : cl_fail(err, "clEnqueueReadBuffer", rc);
}

static oscar_status ocl_sync(void *ctx, void *stream, oscar_errbuf *err) {
    oscar_status s = queue_ok(ctx, "synchronize", stream, err);
    if (s != OSCAR_OK) return s;
    cl_int rc = clFinish(Q(ctx, stream));
    return rc == CL_SUCCESS ? OSCAR_OK : cl_fail(err, "clFinish", rc);
}

static int ocl_compute_units(void *ctx) { return (int)((cl_ctx *)ctx)->compute_units; }

/* The tuning of head_dim d: gen/variants.json's entry for d, else that of the smallest tuned head_dim
 * above it (96 and 80 run with 128's, 160 and 192 with 256's): its threads and V elements per thread
 * serve any multiple of 16 (the decode kernel idles the threads past floor(threads / (d / elems))
 * parts in the V pass, templates/decode.jinja). */
static const int *tuning_of(int d) {
    const int *best = oscar_opencl_tuning[2];
    for (int i = 0; i < 3; i++)
        if (oscar_opencl_tuning[i][0] >= d && oscar_opencl_tuning[i][0] < best[0]) best = oscar_opencl_tuning[i];
    return best;
}

/* Builds (or takes from the context's cache) the program of layout l with OSCAR_GQ = cap query heads
 * per work-group, and creates its 7 kernels into *out (caller releases them). */
static oscar_status ocl_build(cl_ctx *c, const oscar_layout_desc *l, const int *t, int cap, const char *extra,
                              cl_plan_kernels **out, oscar_errbuf *err) {
    const int bf16m = l->method == OSCAR_METHOD_BF16, G = bf16m ? l->head_dim : l->group;
    char opts[384];
    const int n = snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DOSCAR_D=%d -DOSCAR_G=%d -DOSCAR_NG=%d -DOSCAR_KVB=%d -DOSCAR_MF32=%d -DOSCAR_BF16M=%d "
             "-DOSCAR_GQ=%d -DOSCAR_LM=%d -DOSCAR_NT=%d -DOSCAR_E=%d -DOSCAR_TPT=%d -DOSCAR_VB=%d%s%s",
             l->head_dim, G, l->head_dim / G, l->kv_dtype == OSCAR_DTYPE_BF16, l->meta_dtype == OSCAR_DTYPE_F32,
             bf16m, cap, l->method == OSCAR_METHOD_OSCAR2_LM, t[1], t[2], t[5], t[6], extra[0] ? " " : "", extra);
    if (n < 0 || (size_t)n >= sizeof opts) /* a cut option string would build other kernels than asked */
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl plan: OSCAR_OPENCL_OPTIONS is too long (%zu characters; with the library's "
                                "own options the build string holds %zu): shorten it",
                                strlen(extra), sizeof opts - 1 - ((size_t)n - strlen(extra)));
    cl_program prog = NULL;
    for (int i = 0; i < c->nprogs; i++)
        if (!strcmp(c->progs[i].opts, opts)) prog = c->progs[i].prog;
    cl_int rc;
    if (!prog) {
        const char *src = oscar_opencl_source;
        size_t len = oscar_opencl_source_len;
        prog = clCreateProgramWithSource(c->context, 1, &src, &len, &rc);
        if (rc != CL_SUCCESS) return cl_fail(err, "clCreateProgramWithSource", rc);
        rc = clBuildProgram(prog, 1, &c->device, opts, NULL, NULL);
        if (rc != CL_SUCCESS) {
            char log[400] = "";
            clGetProgramBuildInfo(prog, c->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
            clReleaseProgram(prog);
            if (extra[0]) /* the caller's options: name the variable that brought them */
                return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                        "opencl plan: kernel build failed (%d) with OSCAR_OPENCL_OPTIONS '%.100s': %s "
                                        "(fix or unset OSCAR_OPENCL_OPTIONS; options: %s)",
                                        (int)rc, extra, log, opts);
            return oscar_errbuf_set(err, OSCAR_ERR_BACKEND, "opencl plan: kernel build failed (%d) for %s: %s",
                                    (int)rc, opts, log);
        }
        if (c->nprogs < MAX_PROGRAMS) {
            snprintf(c->progs[c->nprogs].opts, sizeof c->progs[c->nprogs].opts, "%s", opts);
            c->progs[c->nprogs++].prog = prog;
        } else {
            /* Cache full: the plan keeps its kernels, the program is released with them. */
        }
    }
    cl_plan_kernels *pk = calloc(1, sizeof *pk);
    if (!pk) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "opencl plan: out of host memory");
    for (int i = 0; i < 7; i++) {
        pk->k[i] = clCreateKernel(prog, k_kernel_names[i], &rc);
        if (rc != CL_SUCCESS) {
            release_kernels(pk, i);
            return cl_fail(err, "clCreateKernel", rc);
        }
    }
    int cached = 0;
    for (int i = 0; i < c->nprogs; i++) cached |= c->progs[i].prog == prog;
    if (!cached) clReleaseProgram(prog); /* kernels hold a reference */
    *out = pk;
    return OSCAR_OK;
}

/* The local memory a work-group may use: the device's, or less where OSCAR_OPENCL_LOCAL_MEM (bytes)
 * says so (a driver that reports more than its kernels run well with; the tests' way to stand in
 * for a 32 KB device). */
static oscar_status local_mem_limit(const cl_ctx *c, cl_ulong *out, cl_ulong *device, oscar_errbuf *err) {
    cl_ulong dev_local = 0;
    clGetDeviceInfo(c->device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof dev_local, &dev_local, NULL);
    *device = dev_local;
    const char *env = getenv("OSCAR_OPENCL_LOCAL_MEM");
    if (env && *env) {
        char *end = NULL;
        errno = 0;
        const unsigned long long v = strtoull(env, &end, 10);
        if (errno || end == env || *end || v == 0 || env[0] == '-')
            return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                    "opencl plan: OSCAR_OPENCL_LOCAL_MEM '%.40s' is not a positive number of bytes: "
                                    "set it to one (e.g. 32768) or unset it",
                                    env);
        if (!dev_local || v < dev_local) dev_local = (cl_ulong)v;
    }
    *out = dev_local;
    return OSCAR_OK;
}

static oscar_status ocl_select_locked(cl_ctx *c, const oscar_layout_desc *l, gpu_kernels *k, oscar_errbuf *err) {
    const int *t = tuning_of(l->head_dim);
    int bf16m = l->method == OSCAR_METHOD_BF16, gq = l->num_q_heads / l->num_kv_heads;
    int G = bf16m ? l->head_dim : l->group;
    const char *extra = getenv("OSCAR_OPENCL_OPTIONS");
    if (!extra) extra = "";
    /* The kernels' shape is the library's -DOSCAR_* macros: one given again here (a later -D wins)
     * would build kernels of another head_dim, group or layout than the plan's buffers. */
    if (strstr(extra, "OSCAR_"))
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl plan: OSCAR_OPENCL_OPTIONS '%.200s' names an OSCAR_ macro; the library sets "
                                "those from the layout: remove it (the variable is for compiler options such as "
                                "-cl-fast-relaxed-math)",
                                extra);
    /* The device's limits, checked here rather than left to the first enqueue (error -54 or -5, naming
     * nothing): work-items each kernel is launched with (the q rotation falls back from 4 D to D) and
     * local memory. */
    const int D = l->head_dim;
    const size_t want[7] = {(size_t)D, (size_t)D, (size_t)D, (size_t)t[1], (size_t)D, (size_t)t[1], (size_t)D};
    cl_ulong dev_local = 0, dev_own = 0;
    oscar_status ls = local_mem_limit(c, &dev_local, &dev_own, err);
    if (ls != OSCAR_OK) return ls;
    size_t dim[3] = {0, 0, 0}; /* work-items per dimension: the launches use the first only */
    clGetDeviceInfo(c->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof dim, dim, NULL);
    /* A work-group serves at most 16 query heads of its KV head (its local arrays grow with OSCAR_GQ, a
     * capacity); a larger ratio (MQA with many heads, GQA 20+) runs in equal chunks of at most 16, one
     * work-group each (the kernels' hchunks, the host's cap). Where the attention kernels' local arrays
     * outgrow the device (32 KB at head_dim 256 and GQA 9+), the program is rebuilt for chunks of half
     * as many heads, down to one. */
    int most = 16, chunks, cap;
    cl_plan_kernels *pk = NULL;
    for (;;) {
        chunks = (gq + most - 1) / most, cap = (gq + chunks - 1) / chunks;
        oscar_status s = ocl_build(c, l, t, cap, extra, &pk, err);
        if (s != OSCAR_OK) return s;
        k->rot_single = 0;
        int bad = -1;
        size_t wg = 0;
        cl_ulong local = 0;
        for (int i = 0; i < 7 && bad < 0; i++) {
            cl_int rc = clGetKernelWorkGroupInfo(pk->k[i], c->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
            if (rc == CL_SUCCESS)
                rc = clGetKernelWorkGroupInfo(pk->k[i], c->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local,
                                              NULL);
            if (rc != CL_SUCCESS) {
                release_kernels(pk, 7);
                return cl_fail(err, "clGetKernelWorkGroupInfo", rc);
            }
            if (dim[0] && dim[0] < wg) wg = dim[0];
            if (i == 2) k->rot_single = wg < 4 * (size_t)D;
            if (wg < want[i] || (dev_local && local > dev_local)) bad = i;
        }
        if (bad < 0) break;
        release_kernels(pk, 7);
        if (wg < want[bad])
            return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                    "opencl plan: kernel %s needs work-groups of %zu items at head_dim %d; this "
                                    "device (%s) runs it with at most %zu: use a backend or device with larger "
                                    "work-groups",
                                    k_kernel_names[bad], want[bad], D, c->name, wg);
        const int by_heads = bad == 3 || bad == 5; /* decode and extend hold arrays per query head */
        if (by_heads && cap > 1) {
            most = cap / 2;
            continue;
        }
        /* A limit set by the variable is named: blaming the device (and head_dim) sent users the wrong way. */
        if (dev_local < dev_own || !dev_own)
            return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                    "opencl plan: kernel %s needs %llu bytes of local memory at head_dim %d%s; "
                                    "OSCAR_OPENCL_LOCAL_MEM limits it to %llu (the device (%s) has %llu): raise or "
                                    "unset OSCAR_OPENCL_LOCAL_MEM",
                                    k_kernel_names[bad], (unsigned long long)local, D,
                                    by_heads ? " with one query head per work-group" : "",
                                    (unsigned long long)dev_local, c->name, (unsigned long long)dev_own);
        return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                "opencl plan: kernel %s needs %llu bytes of local memory at head_dim %d%s; this device "
                                "(%s) has %llu: use a smaller head_dim or another backend",
                                k_kernel_names[bad], (unsigned long long)local, D,
                                by_heads ? " with one query head per work-group" : "", c->name,
                                (unsigned long long)dev_local);
    }
    k->store = pk->k[0];
    k->demote = pk->k[1];
    k->rotate_q = pk->k[2];
    k->decode = pk->k[3];
    k->merge = pk->k[4];
    k->extend = pk->k[5];
    k->merge_ext = pk->k[6];
    k->cap = k->ext_cap = cap; /* the program is built for this capacity (OSCAR_GQ) */
    k->ext_threads = t[1];
    k->ext_elems = t[2];
    k->threads = t[1];
    k->elems = t[2];
    k->min_chunk = t[3];
    k->blocks_per_sm = t[4];
    k->owner = pk;
    /* the name carries the head chunks where the device's local memory made them (not GQA > 16's own) */
    char hc[24] = "";
    if (chunks > (gq + 15) / 16) snprintf(hc, sizeof hc, "_hc%d", chunks);
    snprintf(k->name, sizeof k->name, "d%d_g%d_q%d_%s_m%s%s%s", l->head_dim, G, gq,
             l->kv_dtype == OSCAR_DTYPE_BF16 ? "bf16" : "f16", l->meta_dtype == OSCAR_DTYPE_F32 ? "f32" : "f16",
             bf16m ? "_paged16" : (l->method == OSCAR_METHOD_OSCAR2_LM ? "_lm" : "_u"), hc);
    return OSCAR_OK;
}

static oscar_status ocl_select(void *ctx, const oscar_layout_desc *l, gpu_kernels *k, oscar_errbuf *err) {
    cl_ctx *c = ctx;
    pthread_mutex_lock(&c->lock);
    oscar_status s = ocl_select_locked(c, l, k, err);
    pthread_mutex_unlock(&c->lock);
    return s;
}

static void ocl_release(void *ctx, gpu_kernels *k) {
    (void)ctx;
    cl_plan_kernels *pk = k->owner;
    if (!pk) return;
    release_kernels(pk, 7);
    k->owner = NULL;
}

static oscar_status ocl_launch(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                               const gpu_arg *args, int nargs, void *stream, oscar_errbuf *err) {
    cl_ctx *c = ctx;
    cl_kernel kn = (cl_kernel)kernel;
    size_t global[3] = {(size_t)gx * block, gy, gz}, local[3] = {block, 1, 1};
    /* Arguments + enqueue under the context's lock (see cl_ctx.lock): the
     * enqueue captures the arguments, so the next thread may then set its own. */
    pthread_mutex_lock(&c->lock);
    cl_int rc = CL_SUCCESS;
    const char *what = "clSetKernelArg";
    for (int i = 0; i < nargs && rc == CL_SUCCESS; i++) rc = clSetKernelArg(kn, (cl_uint)i, args[i].n, args[i].p);
    if (rc == CL_SUCCESS) {
        what = "clEnqueueNDRangeKernel";
        rc = clEnqueueNDRangeKernel(Q(c, stream), kn, 3, NULL, global, local, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&c->lock);
    if (rc == CL_SUCCESS) return OSCAR_OK;
    char fn[64] = "";
    clGetKernelInfo(kn, CL_KERNEL_FUNCTION_NAME, sizeof fn - 1, fn, NULL);
    return oscar_errbuf_set(err, OSCAR_ERR_BACKEND, "opencl: %s of %s (work-groups of %u items, grid %ux%ux%u) failed "
                            "with error %d", what, fn, block, gx, gy, gz, (int)rc);
}

static const gpu_vendor k_vendor = {"opencl",  ocl_select, ocl_release, ocl_launch, ocl_compute_units,
                                    ocl_alloc, ocl_free,   ocl_write,   ocl_read,   ocl_sync,  NULL, NULL, 0};

/* ------------------------------------------------------ buffer sizes */
/* A cl_mem knows its size, so every buffer of a call is checked against
 * what the call's counts make the kernels touch before anything is
 * launched: a count larger than its buffer would run the kernels past it
 * (heap corruption on a CPU device, a fault or garbage on a GPU). The
 * plugin's plan wraps the shared GPU plan with the sizes this needs. */
typedef struct ocl_plan {
    void *gpu; /* gpu_core's plan */
    oscar_layout_desc l;
    size_t slot_bytes, es; /* page bytes: per layer, gpu_plan_page_bytes */
    int windowed; /* window slots and pool are read */
} ocl_plan;

static oscar_status ocl_plan_create(void *ctx, const oscar_backend_plan_desc *desc, void **bplan, char *variant,
                                    size_t variant_len, oscar_errbuf *err) {
    if (!desc || !bplan) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl plan: NULL descriptor");
    ocl_plan *op = calloc(1, sizeof *op);
    if (!op) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "opencl plan: out of host memory");
    oscar_status s = gpu_plan_create(ctx, desc, &op->gpu, variant, variant_len, err);
    if (s != OSCAR_OK) {
        free(op);
        return s;
    }
    oscar_page_geom g;
    oscar_page_geom_init(&desc->layout, &g);
    op->l = desc->layout;
    op->slot_bytes = g.window_slot_bytes;
    op->es = desc->layout.kv_dtype == OSCAR_DTYPE_F32 ? 4 : 2;
    op->windowed = desc->layout.method != OSCAR_METHOD_BF16 && desc->layout.sink + desc->layout.recent > 0;
    *bplan = op;
    return OSCAR_OK;
}
static void ocl_plan_destroy(void *ctx, void *bplan) {
    ocl_plan *op = bplan;
    if (!op) return;
    gpu_plan_destroy(ctx, op->gpu);
    free(op);
}
static void *gpu_of(void *bplan) { return bplan ? ((ocl_plan *)bplan)->gpu : NULL; }
static oscar_status ocl_workspace_bytes(void *ctx, void *bplan, int max_seqs, int max_seq_len, size_t *bytes,
                                        oscar_errbuf *err) {
    return gpu_workspace_bytes(ctx, gpu_of(bplan), max_seqs, max_seq_len, bytes, err);
}
static oscar_status ocl_workspace_init(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    return gpu_workspace_init(ctx, gpu_of(bplan), workspace, stream, err);
}
static oscar_status ocl_check(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err) {
    return gpu_check(ctx, gpu_of(bplan), workspace, stream, err);
}

/* a * b * c, or SIZE_MAX where it would wrap (no buffer is that large). */
static size_t mul3(size_t a, size_t b, size_t c) {
    if (b && a > SIZE_MAX / b) return SIZE_MAX;
    a *= b;
    return c && a > SIZE_MAX / c ? SIZE_MAX : a * c;
}
/* Bytes of rows tokens stride elements apart, the last one row wide. */
static size_t rows_bytes(int64_t rows, int64_t stride, int64_t row, size_t es) {
    if (rows < 1) return 0;
    size_t n = mul3((size_t)(rows - 1), (size_t)stride, 1);
    return n > SIZE_MAX - (size_t)row ? SIZE_MAX : mul3(n + (size_t)row, es, 1);
}
/* OK when buffer m (NULL: not used by this call) holds need bytes. */
static oscar_status mem_holds(const cl_ctx *c, const char *fn, const char *name, const void *m, size_t need,
                              oscar_status code, oscar_errbuf *err) {
    if (!m || !need) return OSCAR_OK;
    size_t have = 0;
    oscar_status s = mem_size(c, fn, name, m, &have, err);
    if (s != OSCAR_OK) return s;
    if (have < need)
        return oscar_errbuf_set(err, code,
                                "opencl %s: %s holds %zu bytes but the call's counts need %zu; nothing was run "
                                "(pass a larger buffer or the counts that describe it)",
                                fn, name, have, need);
    return OSCAR_OK;
}
/* Adds buffer m (NULL: not used by this call) to s as bytes of the cl_mem it lives in (its parent, for a
 * sub-buffer); its handle was checked by mem_holds. */
static void add_span(oscar_span *s, int *n, const void *m, const char *name) {
    if (!m) return;
    cl_mem parent = NULL;
    size_t off = 0, size = 0;
    clGetMemObjectInfo((cl_mem)m, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (clGetMemObjectInfo((cl_mem)m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) != CL_SUCCESS ||
        !parent || clGetMemObjectInfo((cl_mem)m, CL_MEM_OFFSET, sizeof off, &off, NULL) != CL_SUCCESS)
        parent = (cl_mem)m, off = 0;
    s[(*n)++] = (oscar_span){parent, off, off + size, name};
}
/* Refuses a buffer the call writes (the first nw of s) that shares memory with another of its buffers:
 * the kernels would read what the call itself overwrites (a cache page or an out row over an index
 * array or q), a wrong result without a word. */
static oscar_status check_overlaps(const oscar_span *s, int nw, int n, const char *fn, oscar_errbuf *err) {
    int j = 0;
    const int i = oscar_span_overlap(s, nw, n, &j);
    if (i < 0) return OSCAR_OK;
    return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                            "opencl %s: %s and %s are the same memory (one cl_mem, or overlapping sub-buffers), and "
                            "the call writes %s: it would change what it reads; nothing was run (give every buffer "
                            "of a call a cl_mem of its own)",
                            fn, s[i].name, s[j].name, s[i].name);
}
/* Appends the workspace, the pools and the index arrays of a call to s (the written ones first:
 * those before it, the workspace, and for an append the pools); returns the count written. */
static int batch_spans(const ocl_plan *op, const oscar_cache *c, const oscar_batch *b, const void *ws, int append,
                       oscar_span *s, int *n) {
    add_span(s, n, ws, "workspace");
    int nw = *n;
    add_span(s, n, c->pages, "cache.pages");
    if (op->windowed) add_span(s, n, c->windows, "cache.windows");
    if (append) nw = *n;
    add_span(s, n, b->seq_lens, "batch.seq_lens");
    if (op->windowed) add_span(s, n, b->window_slots, "batch.window_slots");
    add_span(s, n, b->block_table, "batch.block_table");
    return nw;
}

/* Buffers every call reads: the cache pools, the batch's index arrays, the workspace. */
static oscar_status check_batch_buffers(const cl_ctx *cx, const ocl_plan *op, const char *fn, int layer,
                                        const oscar_cache *c, const oscar_batch *b, const void *ws, size_t ws_bytes,
                                        void *stream, oscar_errbuf *err) {
    const size_t ns = b->num_seqs > 0 ? (size_t)b->num_seqs : 0;
    const size_t stride = b->block_table_stride > 0 ? (size_t)b->block_table_stride : 0;
    oscar_status s;
    if ((s = queue_ok(cx, fn, stream, err)) ||
        (s = mem_holds(cx, fn, "cache.pages", c->pages,
                       mul3(c->num_pages > 0 ? (size_t)c->num_pages : 0, gpu_plan_page_bytes(op->gpu, layer), 1),
                       OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (op->windowed &&
         (s = mem_holds(cx, fn, "cache.windows", c->windows,
                        mul3(c->num_window_slots > 0 ? (size_t)c->num_window_slots : 0, op->slot_bytes, 1),
                        OSCAR_ERR_INVALID_ARGUMENT, err))) ||
        (s = mem_holds(cx, fn, "batch.seq_lens", b->seq_lens, mul3(ns, 4, 1), OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (op->windowed && (s = mem_holds(cx, fn, "batch.window_slots", b->window_slots, mul3(ns, 4, 1),
                                        OSCAR_ERR_INVALID_ARGUMENT, err))) ||
        (s = mem_holds(cx, fn, "batch.block_table", b->block_table, mul3(ns, stride, 4), OSCAR_ERR_INVALID_ARGUMENT,
                       err)) ||
        (s = mem_holds(cx, fn, "workspace", ws, ws_bytes, OSCAR_ERR_WORKSPACE, err)))
        return s;
    return OSCAR_OK;
}

static oscar_status ocl_append(void *ctx, void *bplan, const oscar_backend_append_args *a, oscar_errbuf *err) {
    const ocl_plan *op = bplan;
    const cl_ctx *cx = ctx;
    const char *fn = "oscar_append";
    if (!op) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl %s: plan is NULL", fn);
    const int64_t row = (int64_t)op->l.num_kv_heads * op->l.head_dim;
    const size_t ns = a->batch.num_seqs > 0 ? (size_t)a->batch.num_seqs : 0;
    oscar_status s;
    if ((s = check_batch_buffers(cx, op, fn, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes,
                                 a->stream, err)) ||
        (s = mem_holds(cx, fn, "cu_new", a->cu_new, mul3(ns + 1, 4, 1), OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (s = mem_holds(cx, fn, "k", a->k, rows_bytes(a->total_new, a->kv_stride, row, op->es), OSCAR_ERR_INVALID_ARGUMENT,
                       err)) ||
        (s = mem_holds(cx, fn, "v", a->v, rows_bytes(a->total_new, a->kv_stride, row, op->es), OSCAR_ERR_INVALID_ARGUMENT,
                       err)))
        return s;
    oscar_span sp[9];
    int n = 0;
    const int nw = batch_spans(op, &a->cache, &a->batch, a->workspace, 1, sp, &n);
    add_span(sp, &n, a->cu_new, "cu_new");
    add_span(sp, &n, a->k, "k");
    add_span(sp, &n, a->v, "v");
    if ((s = check_overlaps(sp, nw, n, fn, err))) return s;
    oscar_backend_append_args g = *a;
    return gpu_append(ctx, op->gpu, &g, err);
}

static oscar_status ocl_decode(void *ctx, void *bplan, const oscar_backend_decode_args *a, oscar_errbuf *err) {
    const ocl_plan *op = bplan;
    const cl_ctx *cx = ctx;
    const char *fn = "oscar_decode";
    if (!op) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl %s: plan is NULL", fn);
    const int64_t row = (int64_t)op->l.num_q_heads * op->l.head_dim;
    oscar_status s;
    if ((s = check_batch_buffers(cx, op, fn, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes,
                                 a->stream, err)) ||
        (s = mem_holds(cx, fn, "q", a->q, rows_bytes(a->batch.num_seqs, a->q_stride, row, op->es),
                       OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (s = mem_holds(cx, fn, "out", a->out, rows_bytes(a->batch.num_seqs, a->out_stride, row, op->es),
                       OSCAR_ERR_INVALID_ARGUMENT, err)))
        return s;
    oscar_span sp[9];
    int n = 0;
    add_span(sp, &n, a->out, "out");
    const int nw = batch_spans(op, &a->cache, &a->batch, a->workspace, 0, sp, &n);
    add_span(sp, &n, a->q, "q");
    if ((s = check_overlaps(sp, nw, n, fn, err))) return s;
    return gpu_decode(ctx, op->gpu, a, err);
}

static oscar_status ocl_extend(void *ctx, void *bplan, const oscar_backend_extend_args *a, oscar_errbuf *err) {
    const ocl_plan *op = bplan;
    const cl_ctx *cx = ctx;
    const char *fn = "oscar_extend";
    if (!op) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, "opencl %s: plan is NULL", fn);
    const int64_t row = (int64_t)op->l.num_q_heads * op->l.head_dim;
    const size_t ns = a->batch.num_seqs > 0 ? (size_t)a->batch.num_seqs : 0;
    const size_t tq = a->total_q > 0 ? (size_t)a->total_q : 0;
    oscar_status s;
    if ((s = check_batch_buffers(cx, op, fn, a->layer, &a->cache, &a->batch, a->workspace, a->workspace_bytes,
                                 a->stream, err)) ||
        (s = mem_holds(cx, fn, "cu_q", a->cu_q, mul3(ns + 1, 4, 1), OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (s = mem_holds(cx, fn, "q", a->q, rows_bytes(a->total_q, a->q_stride, row, op->es), OSCAR_ERR_INVALID_ARGUMENT,
                       err)) ||
        (s = mem_holds(cx, fn, "out", a->out, rows_bytes(a->total_q, a->out_stride, row, op->es),
                       OSCAR_ERR_INVALID_ARGUMENT, err)) ||
        (s = mem_holds(cx, fn, "lse", a->lse, mul3(tq, (size_t)op->l.num_q_heads, sizeof(float)),
                       OSCAR_ERR_INVALID_ARGUMENT, err)))
        return s;
    oscar_span sp[10];
    int n = 0;
    add_span(sp, &n, a->out, "out");
    add_span(sp, &n, a->lse, "lse");
    const int nw = batch_spans(op, &a->cache, &a->batch, a->workspace, 0, sp, &n);
    add_span(sp, &n, a->q, "q");
    add_span(sp, &n, a->cu_q, "cu_q");
    if ((s = check_overlaps(sp, nw, n, fn, err))) return s;
    return gpu_extend(ctx, op->gpu, a, err);
}

static const oscar_backend_api k_api = {
    OSCAR_BACKEND_ABI_VERSION, "opencl",           ocl_probe,       ocl_init,
    ocl_shutdown,              ocl_device_name,    ocl_alloc,       ocl_free,
    ocl_write,                 ocl_read,           ocl_sync,        ocl_plan_create,
    ocl_plan_destroy,          ocl_workspace_bytes, ocl_workspace_init, ocl_check,
    ocl_append,                ocl_decode,         ocl_extend,
    OSCAR_BACKEND_CAP_WIDE_CODES};

__attribute__((visibility("default"))) const oscar_backend_api *oscar_backend_entry_v1(void) { return &k_api; }

/* The caller's context and queue (runtime options native_context and
 * native_queue; the registry finds this by name, so older plugins are
 * refused with a message instead of misread): programs, kernels and the
 * default queue are the caller's, so its cl_mem buffers and its queues of
 * that context work as device memory and streams. Both are retained here and
 * released by ocl_shutdown, as the handles ocl_init creates. */
__attribute__((visibility("default"))) oscar_status oscar_backend_init_native_v1(void *native_context,
                                                                                void *native_queue, void **ctx,
                                                                                oscar_errbuf *err) {
    if (!native_context || !native_queue)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl: give both native_context (a cl_context) and native_queue (an in-order "
                                "cl_command_queue of it), or neither");
    cl_context qctx = NULL;
    cl_command_queue_properties qprops = 0;
    cl_device_id dev = NULL;
    cl_command_queue q = (cl_command_queue)native_queue;
    cl_int rc = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (rc == CL_SUCCESS) rc = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof dev, &dev, NULL);
    if (rc == CL_SUCCESS) rc = clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof qprops, &qprops, NULL);
    if (rc != CL_SUCCESS)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl: native_queue is not a valid cl_command_queue (clGetCommandQueueInfo: %d)",
                                (int)rc);
    if (qctx != (cl_context)native_context)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl: native_queue belongs to another cl_context than native_context; pass a "
                                "queue created on native_context");
    if (qprops & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                                "opencl: native_queue is out of order; the append's two launches need an in-order "
                                "queue (create it without CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)");
    cl_ctx *c = calloc(1, sizeof *c);
    if (!c) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, "opencl init: out of host memory");
    c->head.vendor = &k_vendor;
    /* As ocl_init: calloc's zeros are a mutex only where the libc's initializer is all zeros (glibc);
     * elsewhere (e.g. macOS) the launch lock would fail to lock and threads would race on the kernels. */
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return oscar_errbuf_set(err, OSCAR_ERR_INTERNAL, "opencl init: cannot create the launch lock");
    }
    c->context = (cl_context)native_context;
    c->queue = q;
    c->device = dev;
    clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof c->platform, &c->platform, NULL);
    clRetainContext(c->context);
    clRetainCommandQueue(c->queue);
    describe(c, ", caller's context");
    *ctx = c;
    return OSCAR_OK;
}
