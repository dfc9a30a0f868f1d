// Decode-attention benchmark of the CUDA plugin (liboscar_backend_cuda.so,
// loaded like the runtime does: dlopen + oscar_backend_entry_v1).
// Shapes from the command line as HQ/HKV/D[/G] (default 32/8/128/128, the
// Qwen3-8B layer; G defaults to the format's group of D); page 64 (OSCAR_BENCH_PAGE), sink 64, recent 256, BF16 windows, F16 metadata.
// Batch x context grid per shape; per point:
// 2-bit OSCAR decode, the library's BF16 paged decode (same kernel family,
// 16-bit pages), the write path (append of one token per sequence), each the
// median of many CUDA-event-timed calls after warm-up, rotating enough cache
// copies to exceed the L2. Bytes read are counted from the layout; GB/s and the
// fraction of a measured device-to-device copy bandwidth are printed.
// OSCAR_BENCH_FB=1 adds "oscar2-fb": the oscar2 plan with error-feedback
// weights (write path only differs); OSCAR_BENCH_PREFILL=n also times an
// append of n tokens per sequence (a prefill chunk) for the 2-bit methods.
// OSCAR_BENCH_WIDE=n adds "oscar2-w3": the layer holds n 3-bit head-tensors
// (FORMAT.md 2.7; the CUDA W3 kernels, or the generic ones with OSCAR_DECODE_W3=0).
//   bench_attention PLUGIN.so OUT.tsv [quick] [HQ/HKV/D[/G] ...]
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "oscar_backend.h"
#include "oscar_format.h"

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)
#define OK(x)                                                                                       \
    do {                                                                                            \
        oscar_status s_ = (x);                                                                      \
        if (s_ != OSCAR_OK) {                                                                       \
            fprintf(stderr, "%s:%d %s: status %d %s\n", __FILE__, __LINE__, #x, (int)s_, err.msg);  \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static const oscar_backend_api *api;
static void *ctx;
static oscar_errbuf err;

__global__ void fill_random(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = x;
    }
}
// 16-bit values in [-2, 2): bf16 (exponent 126-128) or small f16.
__global__ void fill_bf16(unsigned short *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = (unsigned short)((x & 0x8000u) | 0x3e80u | (x & 0x7fu)); // +-[0.25, 0.5)
    }
}
// Page metadata (f16 pairs a ~ 0.01, b ~ -0.06) of every page: the meta arrays
// run from meta_off to the end of each page.
__global__ void fill_meta(unsigned char *pages, size_t num_pages, size_t page_bytes, size_t meta_off) {
    size_t pairs = (page_bytes - meta_off) / 4;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < num_pages * pairs;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned short *m = (unsigned short *)(pages + (i / pairs) * page_bytes + meta_off) + 2 * (i % pairs);
        m[0] = 0x2200 + (unsigned short)(i % 64);
        m[1] = 0xac00 + (unsigned short)(i % 128);
    }
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Case {
    int B, L;
};

// OSCAR_BENCH_CASES="32x32768,1x131072" restricts the grid (profiling runs).
static bool wanted(int B, int L) {
    const char *e = getenv("OSCAR_BENCH_CASES");
    if (!e || !*e) return true;
    char key[32];
    snprintf(key, sizeof key, "%dx%d", B, L);
    for (const char *p = e; (p = strstr(p, key)) != nullptr; p++) {
        char after = p[strlen(key)];
        if ((p == e || p[-1] == ',') && (after == ',' || after == 0)) return true;
    }
    return false;
}

// Median ms of fn(i), i = 0..n-1, event-timed one call at a time; n from a probe
// call: about 150 ms of calls, between lo and hi of them (*count = n).
template <class F> static float timed_median(cudaEvent_t e0, cudaEvent_t e1, int lo, int hi, int *count, F fn) {
    auto once = [&](int i) {
        cudaEventRecord(e0);
        fn(i);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        return ms;
    };
    const float probe = once(0);
    const int n = std::max(lo, std::min(hi, (int)(150.0f / std::max(probe, 1e-3f))));
    std::vector<float> ts;
    for (int i = 0; i < n; i++) ts.push_back(once(i));
    *count = n;
    return median(ts);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s liboscar_backend_cuda.so out.tsv [quick] [HQ/HKV/D[/G] ...]\n", argv[0]);
        return 2;
    }
    int quick = 0;
    std::vector<std::vector<int>> shapes;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "quick")) {
            quick = 1;
            continue;
        }
        int hq = 0, hkv = 0, d = 0, g = 0;
        int n = sscanf(argv[i], "%d/%d/%d/%d", &hq, &hkv, &d, &g);
        if (n < 3 || hq < 1 || hkv < 1 || hq % hkv || !oscar_head_dim_supported(d)) {
            fprintf(stderr, "bad shape '%s': want HQ/HKV/D[/G], HQ a multiple of HKV, D " OSCAR_HEAD_DIM_RULE "\n",
                    argv[i]);
            return 2;
        }
        shapes.push_back({hq, hkv, d, n == 4 ? g : oscar_group_default(d)}); // no G: the format's default

    }
    if (shapes.empty()) shapes.push_back({32, 8, 128, 128});
    void *so = dlopen(argv[1], RTLD_NOW);
    if (!so) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    oscar_backend_entry_fn entry;
    *(void **)&entry = dlsym(so, OSCAR_BACKEND_ENTRY_SYMBOL);
    api = entry();
    OK(api->init(0, &ctx, &err));
    printf("device: %s\n", api->device_name(ctx));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total_b;
    CK(cudaMemGetInfo(&free_b, &total_b));

    // Copy roofline: device-to-device copy of 4 GiB, bytes read + written.
    double copy_bw;
    {
        size_t n = (size_t)4 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        CK(cudaMemset(a, 1, n));
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        std::vector<float> ts;
        for (int i = 0; i < 12; i++) {
            cudaEventRecord(e0);
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i >= 2) ts.push_back(ms);
        }
        copy_bw = 2.0 * n / (median(ts) * 1e-3);
        printf("copy roofline: %.0f GB/s (read + write)\n", copy_bw / 1e9);
        cudaFree(a);
        cudaFree(b);
    }

    FILE *out = fopen(argv[2], "w");
    fprintf(out, "shape\tmethod\tbatch\tcontext\tsplits_variant\tmedian_us\tbytes\tGBps\tfrac_copy\tappend_us\tappend_stream_us\n");
    std::vector<int> extend_ns;
    if (const char *x = getenv("OSCAR_BENCH_EXTEND"))
        for (const char *c = x; *c;) {
            int n = atoi(c);
            if (n > 0) extend_ns.push_back(n);
            while (*c && *c != ',') c++;
            if (*c) c++;
        }
    FILE *ext_out = getenv("OSCAR_BENCH_EXTEND_TSV") ? fopen(getenv("OSCAR_BENCH_EXTEND_TSV"), "w") : nullptr;
    if (ext_out) fprintf(ext_out, "shape\tmethod\tbatch\tcontext\tn\textend_us\tdecode_us\n");
    for (const std::vector<int> &sh : shapes) {
    // OSCAR_BENCH_PAGE=16|32|64|128: tokens per page (default 64; vLLM's default block is 16).
    const int P = getenv("OSCAR_BENCH_PAGE") ? atoi(getenv("OSCAR_BENCH_PAGE")) : 64;
    const int Hq = sh[0], H = sh[1], D = sh[2], G = sh[3], S0 = 64, W = 256;
    char shape[64];
    snprintf(shape, sizeof shape, "%d/%d/%d/%d", Hq, H, D, G);
    std::vector<Case> cases;
    // The A/B and write-path runs (OSCAR_BENCH_CASES) may also name batch 2, 4, 16, 128, 172 (the
    // end-to-end run's largest oscar2 batch), 192 and 256, and context 8192.
    std::vector<int> Bs = {1, 8, 32, 64};
    std::vector<int> Ls = {4096, 32768, 131072};
    if (getenv("OSCAR_BENCH_CASES")) {
        Bs.insert(Bs.end(), {2, 4, 16, 128, 172, 192, 256});
        Ls.push_back(8192);
    }
    for (int L : Ls)
        for (int B : Bs) cases.push_back({B, L});
    if (quick) cases = {{1, 4096}, {32, 32768}};

    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    // OSCAR_BENCH_METHODS=oscar2 skips the BF16-paged yardstick (profiling runs); =oscar2-fb with
    // OSCAR_BENCH_FB=1 runs the feedback plan alone.
    const char *only = getenv("OSCAR_BENCH_METHODS");
    const int prefill_n = getenv("OSCAR_BENCH_PREFILL") ? atoi(getenv("OSCAR_BENCH_PREFILL")) : 0;
    // OSCAR_BENCH_WIDE=n (1 <= n <= 2 H): a fourth plan, oscar2-w3, whose layer holds n 3-bit
    // head-tensors (the first n in (KV head, K before V) order; FORMAT.md 2.7): the cost of a layer
    // with 3-bit head-tensors (OSCAR_DECODE_W3=0: the generic kernels there, for an A/B).
    const int wide_n = getenv("OSCAR_BENCH_WIDE") ? atoi(getenv("OSCAR_BENCH_WIDE")) : 0;
    for (int mi = 0; mi < 4; mi++) {
        int bf16m = mi == 1, fbm = mi == 2, w3m = mi == 3;
        if (fbm && !getenv("OSCAR_BENCH_FB")) continue;
        if (w3m && (wide_n < 1 || wide_n > 2 * H)) continue;
        if (only && *only && !strstr(only, bf16m ? "bf16" : "oscar2")) continue;
        if (only && !strcmp(only, "oscar2-fb") && !fbm) continue; /* the feedback plan alone (profiles) */
        if (only && !strcmp(only, "oscar2-w3") && !w3m) continue;
        const char *mname = bf16m ? "bf16-paged" : fbm ? "oscar2-fb" : w3m ? "oscar2-w3" : "oscar2";
        oscar_layout_desc l = {sizeof l, D, G, Hq, H, P, S0, W, 131072 + 64, OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16,
                               bf16m ? OSCAR_METHOD_BF16 : OSCAR_METHOD_OSCAR2, w3m ? wide_n : 0};
        std::vector<uint8_t> bits((size_t)2 * H, 2);
        for (int i = 0; i < wide_n && i < 2 * H; i++) bits[i] = 3;
        // Hadamard rotation for both K and V (a real OSCAR rotation costs the same).
        std::vector<float> R((size_t)D * D);
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) R[(size_t)i * D + j] = (__builtin_popcount(i & j) & 1 ? -1.f : 1.f) / sqrtf(D);
        std::vector<float> ck(H, 0.96f), cv(H, 0.92f); // [layer][KV head] clip ratios
        // Feedback weights: strictly upper triangular, |F| ~ 0.01-0.2 (the cost does not depend on the values).
        std::vector<float> F((size_t)D * D, 0.f);
        for (int j = 0; j < D; j++)
            for (int k = j + 1; k < D; k++)
                F[(size_t)j * D + k] = 0.2f * sinf(0.37f * j + 1.3f * k) / (float)(1 + (k - j) / 8);
        oscar_backend_plan_desc pd = {l, 1, 1, bf16m, bf16m ? nullptr : R.data(), bf16m ? nullptr : R.data(), ck.data(), cv.data(),
                                      fbm ? F.data() : nullptr, fbm ? F.data() : nullptr, w3m ? bits.data() : nullptr};
        void *plan;
        char variant[128];
        OK(api->plan_create(ctx, &pd, &plan, variant, sizeof variant, &err));
        printf("%s variant %s\n", mname, variant);
        int S = bf16m ? 0 : S0 + W;
        size_t page_bytes = bf16m ? (size_t)2 * H * P * D * 2
                                  : (size_t)2 * H * P * D / 4 + (size_t)2 * H * P * (D / G) * 2 * 2 +
                                        (w3m ? (size_t)wide_n * P * D / 8 : 0); /* the 1-bit planes */
        size_t slot_bytes = bf16m ? 0 : (size_t)2 * H * S * D * 2;
        for (const Case &c : cases) {
            int B = c.B, L = c.L;
            if (!wanted(B, L)) continue;
            int npages_seq = (std::max(0, L - S) + P - 1) / P;
            size_t cache_bytes = (size_t)B * npages_seq * page_bytes + (size_t)B * slot_bytes;
            // Rotate copies so that one round exceeds ~4x the L2.
            int copies = (int)std::min<size_t>(8, std::max<size_t>(1, (size_t)(4 * 60e6) / std::max<size_t>(cache_bytes, 1) + 1));
            if ((double)cache_bytes * copies > 0.8 * free_b) {
                printf("skip %s B=%d L=%d: %.1f GB does not fit\n", mname, B, L, cache_bytes * copies / 1e9);
                continue;
            }
            std::vector<void *> pages(copies), wins(copies);
            int num_pages = B * npages_seq + 1;
            std::vector<int> bt((size_t)B * (npages_seq + 1)), perm(num_pages), lens(B, L), slots(B), cu(B + 1);
            for (int i = 0; i < num_pages; i++) perm[i] = i;
            srand(1234);
            for (int i = num_pages - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
            for (int s = 0, k = 0; s < B; s++) {
                for (int j = 0; j < npages_seq + 1; j++) bt[(size_t)s * (npages_seq + 1) + j] = j < npages_seq ? perm[k++] : perm[num_pages - 1];
                slots[s] = s;
            }
            for (int i = 0; i <= B; i++) cu[i] = i;
            for (int k = 0; k < copies; k++) {
                CK(cudaMalloc(&pages[k], (size_t)num_pages * page_bytes));
                fill_random<<<1024, 256>>>((unsigned *)pages[k], (size_t)num_pages * page_bytes / 4, 77u + k);
                if (bf16m)
                    fill_bf16<<<1024, 256>>>((unsigned short *)pages[k], (size_t)num_pages * page_bytes / 2, 5u + k);
                else
                    fill_meta<<<1024, 256>>>((unsigned char *)pages[k], num_pages, page_bytes, (size_t)2 * H * P * D / 4);
                wins[k] = nullptr;
                if (!bf16m) {
                    CK(cudaMalloc(&wins[k], (size_t)B * slot_bytes));
                    fill_bf16<<<1024, 256>>>((unsigned short *)wins[k], (size_t)B * slot_bytes / 2, 9u + k);
                }
            }
            int *dbt, *dlens, *dslots, *dcu;
            CK(cudaMalloc(&dbt, bt.size() * 4));
            CK(cudaMalloc(&dlens, B * 4));
            CK(cudaMalloc(&dslots, B * 4));
            CK(cudaMalloc(&dcu, (B + 1) * 4));
            CK(cudaMemcpy(dbt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dlens, lens.data(), B * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dslots, slots.data(), B * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dcu, cu.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
            void *q, *o, *kv, *ws;
            CK(cudaMalloc(&q, (size_t)B * Hq * D * 2));
            CK(cudaMalloc(&o, (size_t)B * Hq * D * 2));
            CK(cudaMalloc(&kv, (size_t)B * H * D * 2));
            fill_bf16<<<256, 256>>>((unsigned short *)q, (size_t)B * Hq * D, 3);
            fill_bf16<<<256, 256>>>((unsigned short *)kv, (size_t)B * H * D, 4);
            size_t wsb;
            OK(api->workspace_bytes(ctx, plan, B, L, &wsb, &err));
            CK(cudaMalloc(&ws, wsb));
            OK(api->workspace_init(ctx, plan, ws, nullptr, &err));
            CK(cudaDeviceSynchronize());
            oscar_batch batch = {B, dlens, bf16m ? nullptr : dslots, dbt, npages_seq + 1, L};
            auto decode = [&](int k) {
                oscar_backend_decode_args a = {0, {pages[k], num_pages, wins[k], B}, batch, q, (int64_t)Hq * D, o,
                                               (int64_t)Hq * D, 0.08838834764f, 0, ws, wsb, nullptr};
                OK(api->decode(ctx, plan, &a, &err));
            };
            for (int i = 0; i < 5; i++) decode(i % copies);
            // About 150 ms of timed calls per point, 10 to 60 of them.
            int iters;
            float t = timed_median(e0, e1, quick ? 20 : 10, quick ? 20 : 60, &iters, [&](int i) { decode(i % copies); }) * 1000.f;
            OK(api->check(ctx, plan, ws, nullptr, &err));
            // Extend attention (OSCAR_BENCH_EXTEND=n1,n2,...): n query tokens per sequence at
            // positions L-n..L-1 over the same cache (speculative verify, chunked prefill);
            // median us, written to OSCAR_BENCH_EXTEND_TSV (default: stdout only).
            if (extend_ns.size() && api->extend) {
                for (int n : extend_ns) {
                    if (n > L) continue;
                    std::vector<int> cuq(B + 1);
                    for (int i = 0; i <= B; i++) cuq[i] = i * n;
                    int *dcuq;
                    void *qe, *oe, *wse;
                    size_t wseb;
                    OK(api->workspace_bytes(ctx, plan, std::max(B, B * n), L, &wseb, &err));
                    CK(cudaMalloc(&dcuq, (B + 1) * 4));
                    CK(cudaMalloc(&qe, (size_t)B * n * Hq * D * 2));
                    CK(cudaMalloc(&oe, (size_t)B * n * Hq * D * 2));
                    CK(cudaMalloc(&wse, wseb));
                    OK(api->workspace_init(ctx, plan, wse, nullptr, &err));
                    CK(cudaMemcpy(dcuq, cuq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
                    fill_bf16<<<1024, 256>>>((unsigned short *)qe, (size_t)B * n * Hq * D, 8);
                    auto ext = [&](int k) {
                        oscar_backend_extend_args a = {0, {pages[k], num_pages, wins[k], B}, batch, dcuq, B * n, n,
                                                       qe, (int64_t)Hq * D, oe, (int64_t)Hq * D, nullptr,
                                                       0.08838834764f, 0, wse, wseb, nullptr};
                        OK(api->extend(ctx, plan, &a, &err));
                    };
                    ext(0);
                    int it;
                    float tex = timed_median(e0, e1, 3, 30, &it, [&](int i) { ext(i % copies); }) * 1000.f;
                    OK(api->check(ctx, plan, wse, nullptr, &err));
                    printf("%-14s %-10s B=%-3d L=%-6d extend n=%-4d %10.1f us  (%.2fx one decode step, %.3f us per query token)\n",
                           shape, mname, B, L, n, tex, tex / t, tex / (B * n));
                    if (ext_out) {
                        fprintf(ext_out, "%s\t%s\t%d\t%d\t%d\t%.2f\t%.2f\n", shape, mname, B, L, n, tex, t);
                        fflush(ext_out);
                    }
                    cudaFree(dcuq);
                    cudaFree(qe);
                    cudaFree(oe);
                    cudaFree(wse);
                }
            }
            // Write path: append one token per sequence at position L-1 (lens stay L: the
            // token replaces the last one, demoting one row, as a decode step does).
            // Median us of `runs` appends of `total` new tokens (cu: device [B+1]) after 3 warm-ups,
            // each alone between two events (the GPU idles between calls); *stream: the mean of
            // `runs` appends issued back to back, as in a decode step where more work follows
            // in the stream (no idle gap, launch latency hidden).
            auto time_append = [&](const int *cu, int total, void *src, int runs, float *stream) {
                std::vector<float> t;
                auto one = [&](int i) {
                    oscar_backend_append_args a = {0, {pages[i % copies], num_pages, wins[i % copies], B}, batch, cu,
                                                   total, src, src, (int64_t)H * D, ws, wsb, nullptr};
                    OK(api->append(ctx, plan, &a, &err));
                };
                for (int i = 0; i < runs + 3; i++) {
                    cudaEventRecord(e0);
                    one(i);
                    cudaEventRecord(e1);
                    cudaEventSynchronize(e1);
                    float ms;
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (i >= 3) t.push_back(ms);
                }
                if (stream) {
                    cudaEventRecord(e0);
                    for (int i = 0; i < runs; i++) one(i);
                    cudaEventRecord(e1);
                    cudaEventSynchronize(e1);
                    float ms;
                    cudaEventElapsedTime(&ms, e0, e1);
                    *stream = ms * 1000.f / runs;
                }
                return median(t) * 1000.f;
            };
            float tws = 0.f;
            float tw = time_append(dcu, B, kv, iters, &tws);
            OK(api->check(ctx, plan, ws, nullptr, &err));
            // Prefill chunk: n new tokens per sequence rewrite positions L-n..L-1
            // (2-bit rows past the window are stored directly, the window's rows demoted).
            if (prefill_n > 0 && !bf16m && prefill_n <= L) {
                int n = prefill_n;
                std::vector<int> cun(B + 1);
                for (int i = 0; i <= B; i++) cun[i] = i * n;
                int *dcun;
                void *kvn;
                CK(cudaMalloc(&dcun, (B + 1) * 4));
                CK(cudaMalloc(&kvn, (size_t)B * n * H * D * 2));
                CK(cudaMemcpy(dcun, cun.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
                fill_bf16<<<1024, 256>>>((unsigned short *)kvn, (size_t)B * n * H * D, 6);
                float tpm = time_append(dcun, B * n, kvn, 10, nullptr);
                OK(api->check(ctx, plan, ws, nullptr, &err));
                printf("%-10s B=%-3d L=%-6d prefill append of %d tokens/seq: %9.1f us (%.3f us per new token)\n",
                       mname, B, L, n, tpm, tpm / (B * n));
                cudaFree(dcun);
                cudaFree(kvn);
            }
            // Bytes the decode must read: pages (codes + meta or 16-bit rows) + windows + q/out.
            double tok2 = bf16m ? 0 : std::max(0, L - S), tok16 = bf16m ? L : std::min(L, S);
            double bytes = B * (tok2 * H * (2.0 * D / 4 + 2.0 * (D / G) * 4) + tok16 * H * 2.0 * D * 2) +
                           2.0 * B * Hq * D * 2 + (w3m ? B * tok2 * wide_n * D / 8.0 : 0.0);
            double gbs = bytes / (t * 1e-6) / 1e9;
            printf("%-14s %-10s B=%-3d L=%-6d %9.1f us  %8.1f MB  %7.0f GB/s  %5.1f%% of copy  append %7.1f us (%4.1f%%)"
                   ", in stream %.1f us\n",
                   shape, mname, B, L, t, bytes / 1e6, gbs, 100.0 * gbs * 1e9 / copy_bw, tw, 100.0 * tw / t, tws);
            fprintf(out, "%s\t%s\t%d\t%d\t%s\t%.2f\t%.0f\t%.1f\t%.4f\t%.2f\t%.2f\n", shape, mname, B, L, variant,
                    t, bytes, gbs, gbs * 1e9 / copy_bw, tw, tws);
            fflush(out);
            fflush(stdout);
            for (int k = 0; k < copies; k++) {
                cudaFree(pages[k]);
                if (wins[k]) cudaFree(wins[k]);
            }
            cudaFree(dbt);
            cudaFree(dlens);
            cudaFree(dslots);
            cudaFree(dcu);
            cudaFree(q);
            cudaFree(o);
            cudaFree(kv);
            cudaFree(ws);
        }
        api->plan_destroy(ctx, plan);
    }
    }
    fprintf(out, "#copy_GBps\t%.1f\n", copy_bw / 1e9);
    fclose(out);
    if (ext_out) fclose(ext_out);
    api->shutdown(ctx);
    return 0;
}
