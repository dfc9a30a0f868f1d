/* CUDA backend plugin (liboscar_backend_cuda.so); the HIP plugin compiles
 * this same file with OSCAR_HIP defined (backends/hip/). Device pointers are
 * plain pointers, stream is a cudaStream_t/hipStream_t or NULL (default
 * stream). Kernels are the generated ones (gen/oscar_gen.py), looked up in
 * the generated dispatch table by the layout's variant key. */
#include <stdlib.h>
#include <string.h>

#ifdef OSCAR_HIP
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#include "oscar_hip_variants.h"
#define GPU(x) hip##x
#define GPU_OK hipSuccess
#define GPU_NAME "hip"
#define GPU_TABLE(x) oscar_hip_##x
typedef hipError_t gpu_err_t;
typedef hipStream_t gpu_stream_t;
typedef struct hipDeviceProp_t gpu_prop_t;
#else
#include <cuda_runtime_api.h>
#include "oscar_cuda_variants.h"
#define GPU(x) cuda##x
#define GPU_OK cudaSuccess
#define GPU_NAME "cuda"
#define GPU_TABLE(x) oscar_cuda_##x
typedef cudaError_t gpu_err_t;
typedef cudaStream_t gpu_stream_t;
typedef struct cudaDeviceProp gpu_prop_t;
#endif

#include "gpu_core.h"

typedef struct gpu_ctx {
    gpu_ctx_head head;
    int device;
    int sms;
    int pdl; /* programmatic dependent launch: sm_90+ and OSCAR_NO_PDL unset (read at init) */
    char name[300];
} gpu_ctx;

static oscar_status fail(oscar_errbuf *err, const char *what, gpu_err_t e) {
    return oscar_errbuf_set(err, OSCAR_ERR_BACKEND, GPU_NAME ": %s failed: %s", what, GPU(GetErrorString)(e));
}

#if defined(OSCAR_HIP) && defined(OSCAR_HIP_ARCHS_STR)
/* Whether isa (e.g. "gfx942") is one of the comma-separated targets of list, each compared up to
 * its feature suffix ("gfx90a:xnack+" builds gfx90a). */
static int arch_listed(const char *list, const char *isa) {
    const size_t n = strlen(isa);
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        if (strcspn(p, ",:") == n && !strncmp(p, isa, n)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}
#endif

static int g_probe(int device_index, oscar_errbuf *why) {
    int n = 0;
    gpu_err_t e = GPU(GetDeviceCount)(&n);
    if (e != GPU_OK) {
        oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND, GPU_NAME " runtime: %s (no driver or no device)",
                         GPU(GetErrorString)(e));
        return 0;
    }
    if (n <= device_index) {
        oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND, GPU_NAME ": device %d requested, %d present", device_index, n);
        return 0;
    }
#if !defined(OSCAR_HIP) && defined(OSCAR_CUDA_MIN_CC) && OSCAR_CUDA_MIN_CC > 0
    /* A device older than every architecture the kernels were built for has no image to run: declined
     * here, so the runtime takes another backend and its report says why (not a failed first launch). */
    gpu_prop_t prop;
    if (GPU(GetDeviceProperties)(&prop, device_index) == GPU_OK && prop.major * 10 + prop.minor < OSCAR_CUDA_MIN_CC) {
        oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND,
                         GPU_NAME ": %s has compute capability %d.%d, older than this plugin's kernels (built for "
                         "OSCAR_CUDA_ARCHS %s); rebuild liboscar with -DOSCAR_CUDA_ARCHS=%d%d (the kernels are "
                         "tested on 9.0 only) or use the OpenCL or CPU backend",
                         prop.name, prop.major, prop.minor, OSCAR_CUDA_ARCHS_STR, prop.major, prop.minor);
        return 0;
    }
#endif
#if defined(OSCAR_HIP) && defined(OSCAR_HIP_ARCHS_STR)
    /* AMD code objects run only on the ISA they were built for (no PTX-style JIT): a gfx942 (MI300)
     * under a gfx90a build failed at its first launch. Declined here, naming the rebuild. */
    gpu_prop_t prop;
    if (GPU(GetDeviceProperties)(&prop, device_index) == GPU_OK && prop.gcnArchName[0]) {
        char isa[64];
        snprintf(isa, sizeof isa, "%.*s", (int)strcspn(prop.gcnArchName, ":"), prop.gcnArchName);
        if (!arch_listed(OSCAR_HIP_ARCHS_STR, isa)) {
            oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND,
                             GPU_NAME ": %s is %s, which this plugin's kernels were not built for (OSCAR_HIP_ARCHS "
                             "%s); rebuild liboscar with -DOSCAR_HIP_ARCHS=\"%s\" (the HIP kernels have been compiled, "
                             "never run) or use the OpenCL or CPU backend",
                             prop.name, isa, OSCAR_HIP_ARCHS_STR, isa);
            return 0;
        }
    }
#endif
    return 100;
}

static const gpu_vendor k_vendor;

/* A switch of this plugin (docs/API.md) set to something it does not take: refused by name, not read
 * as unset (an A/B run would otherwise time the default without a word). */
static oscar_status bad_switch(oscar_errbuf *err, const char *where, const char *name, const char *values) {
    return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT,
                            GPU_NAME " %s: %s='%.40s' is not one of its values (%s); unset it for the default "
                            "(docs/API.md)",
                            where, name, getenv(name), values);
}

static oscar_status g_init(int device_index, void **ctx, oscar_errbuf *err) {
    gpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, GPU_NAME " init: out of host memory");
    c->head.vendor = &k_vendor;
    c->device = device_index;
    gpu_err_t e = GPU(SetDevice)(device_index);
    gpu_prop_t prop;
    if (e == GPU_OK) e = GPU(GetDeviceProperties)(&prop, device_index);
    if (e != GPU_OK) {
        free(c);
        return fail(err, "device selection", e);
    }
    c->sms = prop.multiProcessorCount;
#ifndef OSCAR_HIP
    const char *bad = NULL;
    const int no_pdl = gpu_env_count("OSCAR_NO_PDL", 0, 1, &bad);
    if (bad) {
        free(c);
        return bad_switch(err, "init", bad, "0 or 1");
    }
    c->pdl = prop.major >= 9 && !no_pdl;
#endif
    snprintf(c->name, sizeof c->name, "%s (%d SMs, %.1f GiB)", prop.name, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    *ctx = c;
    return OSCAR_OK;
}

static void g_shutdown(void *ctx) { free(ctx); }
static const char *g_device_name(void *ctx) { return ((gpu_ctx *)ctx)->name; }
static int g_units(void *ctx) { return ((gpu_ctx *)ctx)->sms; }

static oscar_status g_alloc(void *ctx, size_t bytes, void **buf, oscar_errbuf *err) {
    (void)ctx;
    if (!buf) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, GPU_NAME " alloc: buf is NULL");
    gpu_err_t e = GPU(Malloc)(buf, bytes ? bytes : 16);
    if (e != GPU_OK)
        return oscar_errbuf_set(err, OSCAR_ERR_OUT_OF_MEMORY, GPU_NAME " alloc of %zu bytes: %s", bytes,
                                GPU(GetErrorString)(e));
    return OSCAR_OK;
}

static void g_free(void *ctx, void *buf) {
    (void)ctx;
    if (buf) GPU(Free)(buf);
}

static oscar_status g_write(void *ctx, void *dst, size_t offset, const void *src, size_t bytes, void *stream,
                            oscar_errbuf *err) {
    (void)ctx;
    if (!bytes) return OSCAR_OK;
    if (!dst || !src) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, GPU_NAME " write: NULL buffer");
    /* Pageable source: synchronous with respect to the host, ordered on the stream. */
    gpu_err_t e = GPU(MemcpyAsync)((char *)dst + offset, src, bytes, GPU(MemcpyHostToDevice), (gpu_stream_t)stream);
    if (e == GPU_OK) e = GPU(StreamSynchronize)((gpu_stream_t)stream);
    return e == GPU_OK ? OSCAR_OK : fail(err, "memcpy to device", e);
}

static oscar_status g_read(void *ctx, void *dst, const void *src, size_t offset, size_t bytes, void *stream,
                           oscar_errbuf *err) {
    (void)ctx;
    if (!bytes) return OSCAR_OK;
    if (!dst || !src) return oscar_errbuf_set(err, OSCAR_ERR_INVALID_ARGUMENT, GPU_NAME " read: NULL buffer");
    gpu_err_t e = GPU(MemcpyAsync)(dst, (const char *)src + offset, bytes, GPU(MemcpyDeviceToHost), (gpu_stream_t)stream);
    if (e == GPU_OK) e = GPU(StreamSynchronize)((gpu_stream_t)stream);
    return e == GPU_OK ? OSCAR_OK : fail(err, "memcpy to host", e);
}

static oscar_status g_sync(void *ctx, void *stream, oscar_errbuf *err) {
    (void)ctx;
    gpu_err_t e = GPU(StreamSynchronize)((gpu_stream_t)stream);
    return e == GPU_OK ? OSCAR_OK : fail(err, "stream synchronize", e);
}

/* A tensor-core kernel: its dynamic shared-memory limit raised to smem, and the
 * CTAs per SM the occupancy API reports in *resident (0: unknown). */
static oscar_status tc_prepare(const void *fn, int threads, int smem, const char *what, int *resident,
                               oscar_errbuf *err) {
    gpu_err_t e = GPU(FuncSetAttribute)(fn, GPU(FuncAttributeMaxDynamicSharedMemorySize), smem);
    if (e != GPU_OK) {
        /* A GPU of less shared memory per block than the kernel's tiles (the sm_86/89 99 KB under a
         * build for them) is a shape this device cannot serve, not a runtime fault: say which. */
        int dev = 0;
        gpu_prop_t prop;
        if (GPU(GetDevice)(&dev) == GPU_OK && GPU(GetDeviceProperties)(&prop, dev) == GPU_OK) {
#ifdef OSCAR_HIP
            const size_t most = prop.sharedMemPerBlock;
#else
            const size_t most = prop.sharedMemPerBlockOptin;
#endif
            if (most && (size_t)smem > most)
                return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                        GPU_NAME " plan: the %s kernel for this shape needs %d bytes of shared memory "
                                        "per block; %s allows %zu: use the OpenCL or CPU backend for it",
                                        what, smem, prop.name, most);
        }
        char m[64];
        snprintf(m, sizeof m, "raising the %s kernel's shared memory limit", what);
        return fail(err, m, e);
    }
    int occ = 0;
    *resident = GPU(OccupancyMaxActiveBlocksPerMultiprocessor)(&occ, fn, threads, (size_t)smem) == GPU_OK && occ > 0
                    ? occ
                    : 0;
    return OSCAR_OK;
}

static oscar_status g_select(void *ctx, const oscar_layout_desc *l, gpu_kernels *k, oscar_errbuf *err) {
    (void)ctx;
    /* The A/B switches (docs/API.md), read before anything is chosen. */
    const char *bad = NULL;
    const int maxcap = gpu_env_count("OSCAR_DECODE_CAP", 0, 1024, &bad);
    if (bad) return bad_switch(err, "plan", bad, "a head count 1 to 1024, or 0 for no cap");
    const int lp_on = gpu_env_count("OSCAR_DECODE_LP", 1, 1, &bad);
    const int w3_on = gpu_env_count("OSCAR_DECODE_W3", 1, 1, &bad);
    if (bad) return bad_switch(err, "plan", bad, "0 or 1");
    int bf16m = l->method == OSCAR_METHOD_BF16, gq = l->num_q_heads / l->num_kv_heads;
    int G = bf16m ? l->head_dim : l->group, kvb = l->kv_dtype == OSCAR_DTYPE_BF16,
        mf32 = !bf16m && l->meta_dtype == OSCAR_DTYPE_F32, lm = l->method == OSCAR_METHOD_OSCAR2_LM;
    const oscar_gpu_decode_variant *dv = NULL;
    const oscar_gpu_append_variant *av = NULL;
    /* A head_dim or group the format allows but this build did not generate (gen/variants.json) is
     * refused with its own code, naming the backends that run it. */
    int pairs[64][2], np = 0;
    for (int t = 0; t < GPU_TABLE(num_decode_tables); t++)
        for (int i = 0; i < *GPU_TABLE(decode_table_sizes)[t]; i++) {
            const oscar_gpu_decode_variant *v = &GPU_TABLE(decode_tables)[t][i];
            int j = 0;
            while (j < np && (pairs[j][0] != v->d || pairs[j][1] != v->group)) j++;
            if (j == np && np < 64) pairs[np][0] = v->d, pairs[np++][1] = v->group;
        }
    oscar_status cs = gpu_check_compiled_shape(GPU_NAME, l->head_dim, G, (const int (*)[2])pairs, np, err);
    if (cs != OSCAR_OK) return cs;
    /* Preference: the tensor-core family, then the smallest head capacity that
     * holds the GQA ratio (else the largest: the ratio runs in several CTAs).
     * $OSCAR_DECODE_CAP=N (A/B knob, docs/API.md): no tensor-core variant of more than N
     * query heads per CTA (a larger ratio then runs in several CTAs per KV head). */
    for (int t = 0; t < GPU_TABLE(num_decode_tables); t++)
        for (int i = 0; i < *GPU_TABLE(decode_table_sizes)[t]; i++) {
            const oscar_gpu_decode_variant *v = &GPU_TABLE(decode_tables)[t][i];
            if (v->d != l->head_dim || v->group != G || v->kvb != kvb || v->mf32 != mf32 || v->lm != lm ||
                v->bf16m != bf16m || v->cap < 1 || (maxcap && v->tc && v->cap > maxcap))
                continue;
            if (!dv || v->tc > dv->tc) {
                dv = v;
                continue;
            }
            if (v->tc < dv->tc) continue;
            int holds = v->cap >= gq, dholds = dv->cap >= gq;
            if ((holds && (!dholds || v->cap < dv->cap)) || (!holds && !dholds && v->cap > dv->cap)) dv = v;
        }
    for (int t = 0; t < GPU_TABLE(num_append_tables); t++)
        for (int i = 0; i < *GPU_TABLE(append_table_sizes)[t]; i++) {
            const oscar_gpu_append_variant *v = &GPU_TABLE(append_tables)[t][i];
            if (v->d == l->head_dim && v->group == G && v->kvb == kvb && v->mf32 == mf32 && v->bf16m == bf16m)
                av = v;
        }
    if (!dv || !av)
        return oscar_errbuf_set(err, OSCAR_ERR_UNSUPPORTED,
                                GPU_NAME " plan: no generated kernel for d%d group %d (gqa %d) %s meta %s %s; rebuild "
                                "with -DOSCAR_GEN_SET=full or add it to gen/variants.json (docs/CODEGEN.md)",
                                l->head_dim, G, gq, kvb ? "bf16" : "f16", mf32 ? "f32" : "f16",
                                bf16m ? "bf16-method" : (lm ? "lloyd-max" : "uniform"));
    const oscar_gpu_tuning *t = NULL;
    for (int i = 0; i < GPU_TABLE(num_tuning); i++)
        if (GPU_TABLE(tuning)[i].d == l->head_dim) t = &GPU_TABLE(tuning)[i];
    k->store = av->store;
    k->demote = av->demote;
    k->append1 = av->append1;
    k->append_w = av->append_w;
    k->append_wr = av->append_wr;
    k->append_wf = NULL;
    k->append_wk = k->append_wk8 = NULL;
    k->wf_smem = 0;
    k->wf_resident = 0;
    k->append_t = NULL;
    k->rotate_q = dv->rotate_q;
    /* At most 4 query heads per KV head: the limb-packed decode (decode_tc.jinja LP; H200
     * A/B in perf/RESULTS-attention.md), unless OSCAR_DECODE_LP=0 asks for the plain
     * 8-column kernel (an A/B switch, docs/API.md). */
    const int lp = dv->tc && dv->decode_lp && gq <= 4 && lp_on;
    k->decode = lp ? dv->decode_lp : dv->decode;
    k->decode_lp = lp;
    k->merge = dv->merge;
    k->extend = dv->extend;
    k->merge_ext = dv->merge_ext;
    k->ext_cap = dv->ext_cap;
    k->ext_threads = dv->ext_threads;
    k->ext_elems = dv->ext_elems;
    k->threads = dv->threads;
    k->elems = dv->elems;
    k->min_chunk = t ? t->min_chunk : 256;
    k->blocks_per_sm = t ? t->blocks_per_sm : 4;
    k->owner = NULL;
    k->cap = dv->cap;
    k->tc = dv->tc;
    k->smem = (unsigned)dv->smem;
    /* The tensor-core kernels size their splits by the CTAs the device holds at once. */
    k->resident = 0;
    oscar_status st;
    if (dv->tc && (st = tc_prepare(k->decode, dv->threads, dv->smem, "decode", &k->resident, err))) return st;
    k->decode_o3 = NULL;
    k->resident_o3 = 0;
    if (dv->tc && dv->decode_o3) {
        if ((st = tc_prepare(dv->decode_o3, dv->threads, dv->smem, "decode", &k->resident_o3, err))) return st;
        k->decode_o3 = dv->decode_o3;
    }
    /* Extend on the tensor cores: the variant's own extend instantiation, and the
     * widest variant of the family (more columns per CTA). */
    if (dv->tc && dv->extend_tc) {
        if ((st = tc_prepare(dv->extend_tc, dv->threads, dv->smem, "extend", &k->tc_ext_resident, err))) return st;
        k->tc_extend = dv->extend_tc;
        if (dv->extend_o3) {
            if ((st = tc_prepare(dv->extend_o3, dv->threads, dv->smem, "extend", &k->tc_ext_resident_o3, err)))
                return st;
            k->tc_extend_o3 = dv->extend_o3;
        }
    }
    const oscar_gpu_decode_variant *xv = NULL;
    for (int t2 = 0; k->tc_extend && t2 < GPU_TABLE(num_decode_tables); t2++)
        for (int i = 0; i < *GPU_TABLE(decode_table_sizes)[t2]; i++) {
            const oscar_gpu_decode_variant *v = &GPU_TABLE(decode_tables)[t2][i];
            if (v->tc && v->d == dv->d && v->group == dv->group && v->kvb == dv->kvb && v->mf32 == dv->mf32 &&
                v->lm == dv->lm && v->bf16m == dv->bf16m && v->cap > dv->cap && v->extend_tc &&
                (!xv || v->cap > xv->cap))
                xv = v;
        }
    /* Layers with 3-bit head-tensors: the W3 instantiations, unless OSCAR_DECODE_W3=0 asks for the
     * generic extend kernels there (an A/B switch, docs/API.md). */
    k->decode_w3 = k->extend_w3 = NULL;
    k->resident_w3 = k->ext_resident_w3 = 0;
    k->smem_w3 = 0;
    if (dv->tc && dv->decode_w3 && dv->extend_w3 && w3_on) {
        if ((st = tc_prepare(dv->decode_w3, dv->threads, dv->smem_w3, "decode", &k->resident_w3, err)) ||
            (st = tc_prepare(dv->extend_w3, dv->threads, dv->smem_w3, "extend", &k->ext_resident_w3, err)))
            return st;
        k->decode_w3 = dv->decode_w3;
        k->extend_w3 = dv->extend_w3;
        k->smem_w3 = (unsigned)dv->smem_w3;
    }
    /* The long-chunk extend (shapes of one group per row at d 64 / 128, F16 metadata, uniform) */
    k->extend_fa = k->rotate_rows = k->merge_rows = NULL;
    k->fa_resident = 0;
    if (dv->tc && dv->extend_fa) {
        if ((st = tc_prepare(dv->extend_fa, 128, 0, "extend", &k->fa_resident, err))) return st;
        k->extend_fa = dv->extend_fa;
        k->rotate_rows = dv->rotate_rows;
        k->merge_rows = dv->merge_rows;
    }
    if (xv) {
        if ((st = tc_prepare(xv->extend_tc, xv->threads, xv->smem, "extend", &k->xresident, err))) return st;
        k->xextend = xv->extend_tc;
        k->xcap = xv->cap;
        k->xsmem = (unsigned)xv->smem;
        if (xv->extend_o3) {
            if ((st = tc_prepare(xv->extend_o3, xv->threads, xv->smem, "extend", &k->xresident_o3, err))) return st;
            k->xextend_o3 = xv->extend_o3;
        }
    }
    if (av->append_wf) {
        if ((st = tc_prepare(av->append_wf, 64, av->wf_smem, "warp append", &k->wf_resident, err))) return st;
        k->append_wf = av->append_wf;
        k->wf_smem = (unsigned)av->wf_smem;
    }
    memset(k->wk_resident, 0, sizeof k->wk_resident);
    if (av->append_wk && av->append_wk8) {
        /* K = 2, 4, 8 tokens per CTA, without and with F in shared memory (the limit set last stays) */
        for (int f = 0; f < 2; f++)
            for (int i = 0; i < 3; i++)
                if ((st = tc_prepare(i == 2 ? av->append_wk8 : av->append_wk, 128 << i, f ? av->wf_smem : 0,
                                     "warp append", &k->wk_resident[f][i], err)))
                    return st;
        k->append_wk = av->append_wk;
        k->append_wk8 = av->append_wk8;
    }
    if (av->append_t) {
        int unused = 0;
        if ((st = tc_prepare(av->append_t, 128, av->tile_smem, "tile append", &unused, err))) return st;
        k->append_t = av->append_t;
        k->tile_tokens = av->tile_tokens;
        k->tile_smem = (unsigned)av->tile_smem;
    }
    /* the limb-packed decode: "_lp" before the family's "_tc" suffix (which tools and tests read) */
    const size_t nl = strlen(dv->name);
    if (lp && nl >= 3 && !strcmp(dv->name + nl - 3, "_tc"))
        snprintf(k->name, sizeof k->name, "%.*s_lp_tc", (int)(nl - 3), dv->name);
    else
        snprintf(k->name, sizeof k->name, "%s", dv->name);
    return OSCAR_OK;
}

static void g_release(void *ctx, gpu_kernels *k) {
    (void)ctx;
    (void)k;
}

/* One launch path: dep asks for a programmatic dependent launch (the kernel may start
 * under the tail of the stream's previous kernel and waits for its results with
 * griddepcontrol; capturable in CUDA graphs), taken where the device has it (pdl). */
static oscar_status launch_kernel(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                                  unsigned smem, const gpu_arg *args, int nargs, void *stream, int dep,
                                  oscar_errbuf *err) {
    void *argv[GPU_MAX_ARGS]; /* gpu_core.c checks its argument lists against it at compile time */
    if (nargs > GPU_MAX_ARGS) return oscar_errbuf_set(err, OSCAR_ERR_INTERNAL, GPU_NAME ": too many kernel arguments");
    for (int i = 0; i < nargs; i++) argv[i] = (void *)args[i].p;
    dim3 grid = {gx, gy, gz}, blk = {block, 1, 1};
    gpu_err_t e;
#ifndef OSCAR_HIP
    if (dep && ((gpu_ctx *)ctx)->pdl) {
        cudaLaunchAttribute at[1];
        memset(at, 0, sizeof at);
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDim = grid;
        cfg.blockDim = blk;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = (cudaStream_t)stream;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        e = cudaLaunchKernelExC(&cfg, kernel, argv);
    } else
#endif
    {
        (void)ctx;
        (void)dep;
        e = GPU(LaunchKernel)(kernel, grid, blk, argv, smem, (gpu_stream_t)stream);
    }
    if (e == GPU_OK) e = GPU(GetLastError)();
    return e == GPU_OK ? OSCAR_OK : fail(err, "kernel launch", e);
}

static oscar_status g_launch_smem(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                                  unsigned smem, const gpu_arg *args, int nargs, void *stream, oscar_errbuf *err) {
    return launch_kernel(ctx, kernel, gx, gy, gz, block, smem, args, nargs, stream, 0, err);
}

static oscar_status g_launch_dep(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                                 unsigned smem, const gpu_arg *args, int nargs, void *stream, oscar_errbuf *err) {
    return launch_kernel(ctx, kernel, gx, gy, gz, block, smem, args, nargs, stream, 1, err);
}

static oscar_status g_launch(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                             const gpu_arg *args, int nargs, void *stream, oscar_errbuf *err) {
    return g_launch_smem(ctx, kernel, gx, gy, gz, block, 0, args, nargs, stream, err);
}

static const gpu_vendor k_vendor = {GPU_NAME, g_select, g_release, g_launch, g_units,       g_alloc,
                                    g_free,   g_write,  g_read,    g_sync,   g_launch_smem, g_launch_dep,
                                    1};

static const oscar_backend_api k_api = {
    OSCAR_BACKEND_ABI_VERSION, GPU_NAME,          g_probe,         g_init,
    g_shutdown,                g_device_name,     g_alloc,         g_free,
    g_write,                   g_read,            g_sync,          gpu_plan_create,
    gpu_plan_destroy,          gpu_workspace_bytes, gpu_workspace_init, gpu_check,
    gpu_append,                gpu_decode,        gpu_extend,
    /* caps: 3-bit head-tensors. CUDA: layers that hold one decode with the tensor-core W3 kernels (or,
     * with OSCAR_DECODE_W3=0, the generic extend kernels) and write with the block-wide ones, 2-bit layers
     * keep the tensor-core and warp/tile kernels (gpu_core.c). HIP: every layer runs the generic kernels,
     * whose plane code is the source CUDA runs with OSCAR_DECODE_W3=0 and OpenCL always (conformance
     * wide/ cases); like everything HIP, compiled here and never run */
    OSCAR_BACKEND_CAP_WIDE_CODES
};

__attribute__((visibility("default"))) const oscar_backend_api *oscar_backend_entry_v1(void) { return &k_api; }
