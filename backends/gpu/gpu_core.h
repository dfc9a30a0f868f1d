/* Host logic shared by the GPU plugins (CUDA, HIP, OpenCL): plans, argument
 * validation, workspace layout, split-KV sizing and the launch sequence of
 * the generated kernels. Each plugin supplies a gpu_vendor table (memory,
 * kernel selection, launch) and compiles this file into its own .so; no
 * liboscar symbol is used (runtime/oscar_backend.h inline helpers only). */
#ifndef OSCAR_GPU_CORE_H
#define OSCAR_GPU_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "oscar_backend.h"

/* One kernel argument: its bytes, as cudaLaunchKernel / clSetKernelArg take them.
 * Buffers are passed as their handle value (device pointer or cl_mem). */
typedef struct gpu_arg {
    const void *p;
    size_t n;
} gpu_arg;
/* Most positional arguments a vendor's launch takes (its argument array); each argument
 * list in gpu_core.c is checked against it at compile time (GPU_ARGS_FIT). */
#define GPU_MAX_ARGS 64
#define GPU_ARGS_FIT(a) _Static_assert(sizeof(a) / sizeof((a)[0]) <= GPU_MAX_ARGS, #a ": too many kernel arguments")

/* The kernels of one plan (handles: CUDA/HIP function addresses, cl_kernel). */
typedef struct gpu_kernels {
    const void *store, *demote, *rotate_q, *decode, *merge;
    const void *append1; /* one-launch write path (oscar_append1_params), NULL: store + demote */
    /* warp write path (CUDA, quantized methods; oscar_append1_params): plain loads, cp.async
     * rings; NULL: none. append_wf: all of F in wf_smem dynamic shared bytes, at most
     * wf_resident CTAs per compute unit; NULL: none. append_wk, append_wk8: the same with 64 K
     * threads, K tokens per CTA sharing that copy of F (K <= 4; K = 8, capped at 64 registers);
     * wk_resident[f][i] CTAs of K = 2 << i per compute unit without (f 0) and with F; NULL: none */
    const void *append_w, *append_wr, *append_wf, *append_wk, *append_wk8;
    unsigned wf_smem;
    int wf_resident;
    int wk_resident[2][3];
    /* tile write path (CUDA, quantized methods; oscar_append1_params, launch_smem): tile_tokens
     * new tokens per CTA, tile_smem dynamic shared bytes; NULL: none */
    const void *append_t;
    int tile_tokens;
    unsigned tile_smem;
    /* Generic (fp32) extend attention and its merge (templates/decode.jinja, ext):
     * ext_cap query heads per work-group, ext_threads threads, ext_elems V elements each. */
    const void *extend, *merge_ext;
    int ext_cap, ext_threads, ext_elems;
    int threads, elems, min_chunk, blocks_per_sm;
    /* 1: the generic q rotation runs D threads, one per output, where the device's work-groups do not
     * hold 4 D (OpenCL devices of 256- or 512-item work-groups); 0: 4 D, a quarter of the dims each */
    int rot_single;
    int resident; /* decode CTAs resident per compute unit when known (occupancy query), else 0 */
    /* The tc decode at 3 CTAs per SM where decode runs at 2 (NULL: none), taken for grids
     * of at least a third of a CTA per compute unit before splitting (gpu_core.c). */
    const void *decode_o3;
    int resident_o3;
    int cap;      /* query heads one decode work-group serves; 0: the plan's whole GQA ratio */
    int tc;       /* decode/merge are the tensor-core family (oscar_tc_*_params, launch_smem) */
    unsigned smem; /* dynamic shared memory bytes of the tc decode */
    /* Tensor-core extend (NULL: none): the decode variant's extend instantiation
     * (tc_extend, tc_ext_resident CTAs per compute unit), and the widest variant of the
     * family for chunks with more (query row, head) columns than cap (xcap columns
     * per CTA share each tile's unpacking). */
    const void *tc_extend, *xextend;
    int tc_ext_resident, xcap, xresident;
    /* their 3-CTA twins (NULL: none), taken by the decode twin's rule counted in extend CTAs */
    const void *tc_extend_o3, *xextend_o3;
    int tc_ext_resident_o3, xresident_o3;
    unsigned xsmem;
    /* Tensor-core decode and extend of the layers that hold 3-bit head-tensors (NULL: none; such
     * layers then take the generic extend kernels), their CTAs per compute unit and dynamic
     * shared bytes. */
    const void *decode_w3, *extend_w3;
    int resident_w3, ext_resident_w3;
    /* Long-chunk extend over the 2-bit history (extend_fa.jinja; NULL: none), its CTAs per compute
     * unit: the chunk's (query row, head) pairs as the MMA rows, 64 per CTA (gpu_core.c) */
    const void *extend_fa;
    int fa_resident;
    /* its q rotation and merge of many query rows (8 per block, R read once for them; NULL: none) */
    const void *rotate_rows, *merge_rows;
    int decode_lp; /* decode is the limb-packed kernel (the W3 kernels' 2-bit heads follow it) */
    unsigned smem_w3;
    char name[128];
    void *owner; /* vendor data released by release() */
} gpu_kernels;

typedef oscar_status (*gpu_launch_smem_fn)(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned block, unsigned smem, const gpu_arg *args, int nargs, void *stream,
                                           oscar_errbuf *err);
typedef struct gpu_vendor {
    const char *name;
    /* Finds (CUDA/HIP) or compiles (OpenCL) the kernels for a layout. */
    oscar_status (*select)(void *ctx, const oscar_layout_desc *l, gpu_kernels *k, oscar_errbuf *err);
    void (*release)(void *ctx, gpu_kernels *k);
    oscar_status (*launch)(void *ctx, const void *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned block,
                           const gpu_arg *args, int nargs, void *stream, oscar_errbuf *err);
    int (*compute_units)(void *ctx);
    oscar_status (*alloc)(void *ctx, size_t bytes, void **buf, oscar_errbuf *err);
    void (*free)(void *ctx, void *buf);
    oscar_status (*write)(void *ctx, void *dst, size_t offset, const void *src, size_t bytes, void *stream,
                          oscar_errbuf *err);
    oscar_status (*read)(void *ctx, void *dst, const void *src, size_t offset, size_t bytes, void *stream,
                         oscar_errbuf *err);
    oscar_status (*sync)(void *ctx, void *stream, oscar_errbuf *err);
    /* Launch with dynamic shared memory; only vendors with tc kernels set it. */
    gpu_launch_smem_fn launch_smem;
    /* As launch_smem, but the kernel may start while the stream's previous kernel
     * still runs (CUDA programmatic dependent launch): it waits for that kernel's
     * results itself (griddepcontrol.wait). Set wherever launch_smem is (a plain
     * launch where the device has no such launch). */
    gpu_launch_smem_fn launch_dep;
    /* 1: a call's buffers are device pointers of one address space (CUDA, HIP), whose aliasing the
     * core checks by address; 0: handles (OpenCL, which checks its cl_mem objects itself) */
    int device_pointers;
} gpu_vendor;

/* Every vendor context starts with this header. */
typedef struct gpu_ctx_head {
    const gpu_vendor *vendor;
} gpu_ctx_head;

oscar_status gpu_plan_create(void *ctx, const oscar_backend_plan_desc *desc, void **bplan, char *variant,
                             size_t variant_len, oscar_errbuf *err);
void gpu_plan_destroy(void *ctx, void *bplan);
/* Page bytes of the plan's layer (FORMAT.md §3.3: per layer with layout.wide_per_layer 1), 0 for a
 * NULL plan or a layer out of range (the call then refuses the layer). */
size_t gpu_plan_page_bytes(const void *bplan, int layer);
oscar_status gpu_workspace_bytes(void *ctx, void *bplan, int max_seqs, int max_seq_len, size_t *bytes,
                                 oscar_errbuf *err);
oscar_status gpu_workspace_init(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err);
oscar_status gpu_check(void *ctx, void *bplan, void *workspace, void *stream, oscar_errbuf *err);
oscar_status gpu_append(void *ctx, void *bplan, const oscar_backend_append_args *a, oscar_errbuf *err);
oscar_status gpu_decode(void *ctx, void *bplan, const oscar_backend_decode_args *a, oscar_errbuf *err);
oscar_status gpu_extend(void *ctx, void *bplan, const oscar_backend_extend_args *a, oscar_errbuf *err);

/* Decode split sizing (exposed for the benchmark and tests). With resident
 * > 0 (CTAs the whole device holds at once) the split count minimises
 * waves x (chunk + a CTA's fixed cost), the critical path of equal-work CTAs,
 * so the last wave is not a thin tail and chunks do not shrink to overhead;
 * otherwise it aims at target_blocks CTAs. */
/* Split plan of the tensor-core decode: ns2 splits of chunk2 tokens over the
 * 2-bit history (the longest one in the batch), then nsplit - ns2 splits of
 * chunk16 16-bit rows (window rows, or every row of the BF16 method), the two
 * kinds balanced by the bytes a token costs; hchunks CTAs per KV head along
 * the query heads. Depends only on (num_seqs, max_len), never on the lengths.
 * heavy_heads (W3 layers): KV heads with a 1-bit plane, whose CTAs cost about twice a
 * 2-bit one; where the 2-bit chunk reaches heavy_chunk tokens they split their history
 * into ns2 + ns2x chunks of chunk2w (about half of chunk2; the ns2x further ones in grid
 * rows of their own, counted by the wave model), else chunk2w and ns2x are 0. In rows of
 * their own where heavy_rows is 2, or 1 and at most a quarter of the heads are heavy;
 * otherwise (in_row) from 2 heavy_chunk up, ns2 counting them all (ns2x 0; the other
 * heads' splits past their last are empty) and the 2-bit layer's split count.
 * pstride = nsplit + ns2x: the partials of a (row, query head) in the workspace.
 * force_n > 0: that split count (at most the rows' tiles allow) instead of the wave model's
 * choice, carved the same way (A/B runs: $OSCAR_DECODE_SPLITS). */
typedef struct gpu_tc_splits {
    int ns2, chunk2, chunk16, nsplit, hchunks, chunk2w, ns2x, pstride;
} gpu_tc_splits;
void gpu_tc_choose(int num_seqs, int kv_heads, int gqa, int cap, int max_len, int sink, int recent, int bf16m,
                   int head_dim, int row2_bytes, int resident, int max_splits, int heavy_heads, int heavy_chunk,
                   int heavy_rows, int force_n, gpu_tc_splits *t);

/* The CUDA and HIP plugins run the (head_dim, group) pairs of their generated variant set
 * (gen/variants.json; the default: every head_dim, at 64, 128, 256 with groups 32, 64, 128, elsewhere
 * the default group); the format allows more (oscar_format.h). pairs:
 * the n (head_dim, group) pairs the plugin holds, in any order, repeats allowed. Returns OSCAR_OK when
 * (d, group) is one of them, else OSCAR_ERR_UNSUPPORTED_HEAD_DIM (no pair of head_dim d) or
 * OSCAR_ERR_UNSUPPORTED_GROUP, with a message naming what is compiled, the backends that run the
 * shape (cpu, opencl) and gen/variants.json. nm: the plugin's name for the message. */
oscar_status gpu_check_compiled_shape(const char *nm, int d, int group, const int (*pairs)[2], int n,
                                      oscar_errbuf *err);

/* $name as a count in 0 .. max, else def: unset or empty, or set to anything else, which also names
 * the variable in *bad (the first such; the caller then refuses the plan or runtime: a typo in a
 * tuning variable would time or test the default rule without a word). */
int gpu_env_count(const char *name, int def, int max, const char **bad);

void gpu_choose_splits(int num_seqs, int kv_heads, int max_len, int threads, int min_chunk, int target_blocks,
                       int resident, int max_splits, int *nsplit, int *chunk);

#endif
