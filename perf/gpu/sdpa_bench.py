#!/usr/bin/env python3
"""External yardstick: torch SDPA decode (1 query token) on contiguous BF16
K/V, shapes HQ/HKV/D[/G] from the command line (default 32/8/128, Qwen3-8B),
FlashAttention backend when it accepts the call (GQA via enable_gqa), else the
next one that does. Median of CUDA-event-timed calls after warm-up (about
150 ms of calls per point), rotating K/V copies so one round exceeds the L2.
Writes TSV: shape, backend, batch, context, median_us, bytes, GB/s, qlen.
OSCAR_BENCH_CASES=BxL,... picks the points; OSCAR_SDPA_QLEN=n times n query
tokens per sequence at the last n positions (causal, lower right: a chunk of
chunked prefill or a speculative verify over the cache), the yardstick of
oscar_extend (bench_attention's OSCAR_BENCH_EXTEND).
    python3 sdpa_bench.py OUT.tsv [quick] [HQ/HKV/D[/G] ...]"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

quick = "quick" in sys.argv[2:]
shapes = [a for a in sys.argv[2:] if a != "quick"] or ["32/8/128/128"]
cases = [(b, l) for l in (4096, 32768, 131072) for b in (1, 8, 32, 64)]
if quick:
    cases = [(1, 4096), (32, 32768)]
if os.environ.get("OSCAR_BENCH_CASES"):
    cases = [tuple(int(x) for x in c.split("x")) for c in os.environ["OSCAR_BENCH_CASES"].split(",")]
qlen = int(os.environ.get("OSCAR_SDPA_QLEN", "1"))
mask = None
out = open(sys.argv[1], "w")
out.write("shape\tbackend\tbatch\tcontext\tmedian_us\tbytes\tGBps\tqlen\n")
points = []
for sh in shapes:
    parts = [int(x) for x in sh.split("/")]
    HQ, HKV, D = parts[:3]
    # no group given: the format's default group of D (oscar_group_default, format/oscar_format.h)
    G = parts[3] if len(parts) > 3 else D if D <= 128 else D // 2 if (D // 2) % 16 == 0 else D
    key = "%d/%d/%d/%d" % (HQ, HKV, D, G)
    points += [(key, HQ, HKV, D, b, l) for b, l in cases]
for key, HQ, HKV, D, b, l in points:
    free, _ = torch.cuda.mem_get_info()
    kv_bytes = 2 * b * HKV * l * D * 2
    copies = max(1, min(8, int(4 * 60e6 // kv_bytes) + 1))
    if kv_bytes * copies > 0.8 * free:
        print("sdpa skip %s B=%d L=%d" % (key, b, l))
        continue
    q = torch.randn(b, HQ, qlen, D, device="cuda", dtype=torch.bfloat16)
    if qlen > 1:
        mask = causal_lower_right(qlen, l)
    ks = [torch.randn(b, HKV, l, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn(b, HKV, l, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    used = None
    for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
               SDPBackend.MATH):
        try:
            with sdpa_kernel(be):
                F.scaled_dot_product_attention(q, ks[0], vs[0], attn_mask=mask, enable_gqa=True)
            torch.cuda.synchronize()
            used = be
            break
        except (RuntimeError, TypeError, NotImplementedError):
            continue
    if used is None:
        print("sdpa %s B=%d L=%d q=%d: no SDPA backend takes this call" % (key, b, l, qlen))
        continue
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with sdpa_kernel(used):
        e0.record()
        F.scaled_dot_product_attention(q, ks[0], vs[0], attn_mask=mask, enable_gqa=True)
        e1.record()
        e1.synchronize()
    iters = 20 if quick else max(10, min(60, int(150 / max(e0.elapsed_time(e1), 1e-3))))
    ts = []
    with sdpa_kernel(used):
        for i in range(iters + 5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], attn_mask=mask, enable_gqa=True)
            e1.record()
            e1.synchronize()
            if i >= 5:
                ts.append(e0.elapsed_time(e1))
    ts.sort()
    t_us = ts[len(ts) // 2] * 1000
    nbytes = kv_bytes + 2 * b * HQ * qlen * D * 2
    name = str(used).split(".")[-1]
    print("sdpa %-14s %-20s B=%-3d L=%-6d q=%-4d %9.1f us %8.0f GB/s" % (key, name, b, l, qlen, t_us, nbytes / t_us / 1e3))
    out.write("%s\t%s\t%d\t%d\t%.2f\t%d\t%.1f\t%d\n" % (key, name, b, l, t_us, nbytes, nbytes / t_us / 1e3, qlen))
    out.flush()
    del ks, vs, q
    torch.cuda.empty_cache()
