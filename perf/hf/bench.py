"""transformers + liboscar on a GPU: agreement and decode speed of
liboscar.hf.OscarCache against transformers' own caches, with tiny-qwen3.
perf/hf/run.sh drives it (see there for the machine set-up); it writes a
Markdown report to --md and prints it.

Agreement
  1. Greedy generation (bf16 weights, 1024-token prompt of eval.tokens, 64
     new tokens): OscarCache bf16 and oscar2 against transformers' default
     cache (DynamicCache, SDPA), and against the GPU engine's tokens
     (--engine-tokens, from oscar-gpu-generate on the same prompt).
  2. Teacher forced (fp32 weights, the cache's K/V in bf16), 16 windows of
     2048 tokens, every query reading the cache as a decode step does
     (prefill="stepwise"): perplexity, KL(p_bf16 || p_method) and top-1
     against OscarCache's bf16 method, for oscar-eval's figures
     (docs/eval/report.md, the CPU engine with oscar_fakequant).
Speed
  Decode steps (one token per sequence, bf16 weights) at batch x context,
  after a real prefill: OscarCache oscar2 (calibrated parameters, fused
  2-bit decode), DynamicCache and StaticCache (SDPA), and QuantizedCache
  when its backend (optimum-quanto or hqq) is importable. Median step time
  over --steps steps after --warmup steps, CUDA-synchronised wall clock.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, StaticCache

import liboscar
from liboscar.hf import OscarCache

REPORT_EVAL = {  # docs/eval/report.md (oscar-eval, CPU engine, 16 windows of 2048, S0 64, W 256)
    "bf16": (13.8879, 0.0, 1.0), "int2": (14.1940, 0.02488, 0.9376), "oscar2": (13.9696, 0.00500, 0.9748)}


def log(*a: object) -> None:
    print(*a, flush=True)


DEV = "cuda"  # --device cpu: a small smoke run of every path on the CPU backend


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def free() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


def load(path: str, dtype: torch.dtype) -> torch.nn.Module:
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(DEV).eval()
    return m


def cache_kw(model, cache) -> dict:
    """The keyword argument that hands a cache to a transformers model's
    forward and generate: ``cache`` since transformers 5.24, where
    ``past_key_values`` is deprecated (a FutureWarning on every call),
    ``past_key_values`` before it (as python/tests/conftest.py)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def greedy(model, ids: torch.Tensor, n: int, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model.generate(ids, **cache_kw(model, cache), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    model.set_attn_implementation("sdpa")
    return out.sequences[0, ids.shape[1]:].cpu(), torch.stack(out.logits, 1)[0].float().cpu()


def first_diff(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement_generate(model, toks: np.ndarray, params: liboscar.Params, prompt: int, n: int,
                       engine: dict) -> list[str]:
    ids = torch.tensor(toks[:prompt].astype(np.int64))[None].to(DEV)
    ref_tok, ref_log = greedy(model, ids, n)
    rows = ["| cache | vs | tokens equal | first divergence | max logit diff before it | max logit diff, step 0 |",
            "|---|---|---|---|---|---|"]
    for method in ("bf16", "oscar2"):
        cache = OscarCache(model, params if method == "oscar2" else None, method=method,
                           max_seq_len=prompt + n + 8)
        tok, lg = greedy(model, ids, n, cache)
        fd = first_diff(tok.tolist(), ref_tok.tolist())
        before = float((lg[:max(fd, 1)] - ref_log[:max(fd, 1)]).abs().max())
        rows.append(f"| OscarCache {method} ({cache.variant}) | DynamicCache (SDPA) | "
                    f"{int((tok == ref_tok).sum())}/{n} | {fd if fd < n else '-'} | {before:.4f} | "
                    f"{float((lg[0] - ref_log[0]).abs().max()):.4f} |")
        et = engine.get(method)
        if et is not None:
            fe = first_diff(tok.tolist(), et)
            rows.append(f"| OscarCache {method} | GPU engine (oscar-gpu-generate, same prompt) | "
                        f"{sum(int(a == b) for a, b in zip(tok.tolist(), et))}/{n} | {fe if fe < n else '-'} | "
                        f"(engine prints tokens only) | - |")
        log(f"generate {method}: tokens {tok.tolist()[:16]} ... ; default {ref_tok.tolist()[:16]} ...")
        del cache
    return rows


def teacher_forced(path: str, toks: np.ndarray, params: liboscar.Params, windows: int, ctx: int) -> list[str]:
    """prefill='stepwise' over `windows` windows of ctx tokens, batched."""
    model = load(path, torch.float32)
    x = torch.tensor(np.stack([toks[s:s + ctx + 1] for s in range(0, windows * ctx, ctx)]).astype(np.int64))
    ids, tgt = x[:, :-1].to(DEV), x[:, 1:].to(DEV)
    with torch.no_grad():
        plain = model(ids).logits.double()  # SDPA, fp32 K/V, for reference
    out, base = {}, None
    for method in ("bf16", "int2", "oscar2"):
        t0 = time.time()
        cache = OscarCache(model, params if method == "oscar2" else None, method=method, prefill="stepwise",
                           max_seq_len=ctx)
        with torch.no_grad():
            lg = model(ids, **cache_kw(model, cache)).logits.double()
        model.set_attn_implementation("sdpa")
        sync()
        lp = torch.log_softmax(lg, -1)
        nll = -lp.gather(-1, tgt[..., None]).mean().item()
        if base is None:
            base = lp
        kl = (base.exp() * (base - lp)).sum(-1).mean().item()
        top1 = (lp.argmax(-1) == base.argmax(-1)).double().mean().item()
        out[method] = (math.exp(nll), kl, top1, time.time() - t0)
        log(f"teacher forced {method}: ppl {out[method][0]:.4f} KL {kl:.5f} top-1 {top1:.4f} "
            f"({out[method][3]:.1f} s)")
        del cache, lg
    lp = torch.log_softmax(plain, -1)
    ppl_plain = math.exp(-lp.gather(-1, tgt[..., None]).mean().item())
    rows = [f"Teacher forced, fp32 weights, {windows} windows of {ctx} tokens of eval.tokens ({windows * ctx} "
            f"scored tokens), sink 64, recent 256, every query reading the cache as a decode step does "
            f"(prefill='stepwise'); KL and top-1 against OscarCache's bf16 method. transformers' default "
            f"(SDPA, fp32 K/V) ppl: {ppl_plain:.4f}.", "",
            "| method | ppl | delta ppl | KL to bf16 | top-1 | oscar-eval (docs/eval/report.md): ppl / KL / top-1 | "
            "time (s) |", "|---|---|---|---|---|---|---|"]
    for m, (ppl, kl, top1, dt) in out.items():
        e = REPORT_EVAL[m]
        rows.append(f"| {m} | {ppl:.4f} | {ppl - out['bf16'][0]:+.4f} | {kl:.5f} | {top1:.4f} | "
                    f"{e[0]:.4f} / {e[1]:.5f} / {e[2]:.4f} | {dt:.1f} |")
    del model
    free()
    return rows


def cache_bytes(cache) -> int:
    if isinstance(cache, OscarCache):
        return cache.nbytes()
    if type(cache).__name__ == "QuantizedCache":
        return -1  # packed tensor subclasses: their numel/element_size are not their bytes
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def make_cache(kind: str, model, params: liboscar.Params, batch: int, ctx: int, steps: int):
    if kind == "oscar2":
        return OscarCache(model, params, max_seq_len=ctx + steps + 8)
    if kind == "dynamic":
        return DynamicCache(config=model.config)
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=ctx + steps + 8)
    from transformers import QuantizedCache
    backend = kind.split("-")[1]
    if backend == "quanto" and DEV == "cuda":
        avoid_quanto_jit()
    return QuantizedCache(backend, config=model.config, nbits=2, q_group_size=64, residual_length=128)


def avoid_quanto_jit() -> None:
    """optimum-quanto's CUDA unpack kernel lives in an extension it compiles
    on first use (marlin, AWQ: minutes, into site-packages); register its own
    pure-torch unpack for CUDA tensors instead (the cache's 2-bit unpack is then
    a few torch ops; the rest of QuantizedCache is torch ops anyway)."""
    from types import SimpleNamespace

    from optimum.quanto.library.extensions import get_extension, is_extension_available
    from optimum.quanto.library.unpack import unpack
    if is_extension_available("quanto_cuda"):
        ext = get_extension("quanto_cuda")
        if ext._lib is None:  # its `lib` property compiles only while _lib is None
            ext._lib = SimpleNamespace(unpack=unpack)


def time_decode(model, kind: str, params, batch: int, ctx: int, steps: int, warmup: int) -> dict:
    g = torch.Generator().manual_seed(batch * 1000 + ctx)
    ids = torch.randint(1, model.config.vocab_size, (batch, ctx), generator=g).to(DEV)
    cache = make_cache(kind, model, params, batch, ctx, steps + warmup)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        # StaticCache's prefill attends over the whole buffer through an explicit mask
        # [B, 1, q, max_cache_len]: in chunks, so that mask stays small.
        chunk = 4096 if kind == "static" else ctx
        for s in range(0, ctx, chunk):
            out = model(ids[:, s:s + chunk], **cache_kw(model, cache), use_cache=True, logits_to_keep=1)
        sync()
        prefill = time.perf_counter() - t0
        nxt = out.logits[:, -1:].argmax(-1)
        times = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            out = model(nxt, **cache_kw(model, cache), use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    res = {"step_ms": 1e3 * statistics.median(times), "prefill_s": prefill, "kv_bytes": cache_bytes(cache),
           "variant": getattr(cache, "variant", "")}
    model.set_attn_implementation("sdpa")
    del cache, out
    free()
    return res


def speed(path: str, params: liboscar.Params, batches: list, contexts: list, steps: int, warmup: int,
          deadline: float) -> list[str]:
    model = load(path, torch.bfloat16)
    kinds = ["dynamic", "oscar2", "static"]
    skipped = []
    for name, mod in (("quanto", "optimum.quanto"), ("hqq", "hqq")):
        try:
            ok = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            ok = False
        (kinds.append(f"quantized-{name}") if ok else skipped.append(f"{mod} not installed"))
    rows = [f"Decode step (one new token per sequence) of tiny-qwen3 (8 layers, 8/2 heads, d 128), bf16 weights, "
            f"after a real prefill of random tokens; median of {steps} steps after {warmup}, wall clock with CUDA "
            f"synchronisation (the whole model step: 8 layers of projections, MLP and attention, plus Python). "
            f"Contexts beyond the model's 4096 positions use its RoPE unchanged (speed only).", "",
            "| batch | context | cache | step (ms) | tokens/s | speed-up vs DynamicCache | vs StaticCache | "
            "KV memory (MiB) | prefill (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for ctx in contexts:
        for b in batches:
            res, failed = {}, []
            for kind in kinds:  # the default cache and OscarCache first: the point's core comparison
                if time.time() > deadline:
                    failed.append(f"| {b} | {ctx} | {kind} | skipped (time) | | | | | |")
                    continue
                try:
                    res[kind] = time_decode(model, kind, params, b, ctx, steps, warmup)
                except Exception as e:  # an out-of-memory or unsupported backend: say so in the table
                    free()
                    failed.append(f"| {b} | {ctx} | {kind} | failed: {type(e).__name__}: {str(e)[:80]} | | | | | |")
                    log(f"{kind} B{b} x {ctx}: {type(e).__name__}: {e}")
            for kind, r in res.items():
                rel = lambda base: (f"{res[base]['step_ms'] / r['step_ms']:.2f}x" if base in res else "-")  # noqa
                name = f"OscarCache oscar2 ({r['variant']})" if kind == "oscar2" else kind
                mem = f"{r['kv_bytes'] / 2**20:.0f}" if r["kv_bytes"] >= 0 else "-"
                rows.append(f"| {b} | {ctx} | {name} | {r['step_ms']:.2f} | {b / r['step_ms'] * 1e3:.0f} | "
                            f"{rel('dynamic')} | {rel('static')} | {mem} | {r['prefill_s']:.2f} |")
                log(rows[-1])
            rows += failed
    rows.append("")
    rows.append("QuantizedCache (2-bit, group 64, residual 128; it dequantizes the whole cache every step): " +
                (f"not run: {' and '.join(skipped)} on this machine, which has no network to install them."
                 if len(skipped) == 2 else f"rows quantized-* above ({'; '.join(skipped) or 'both backends'})."
                 " quanto on CUDA: its pure-torch unpack (its CUDA extension is compiled on first use)."))
    del model
    free()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="eval.tokens (uint32), at least windows * ctx + 1 tokens")
    ap.add_argument("--params", required=True, help="oscar2 parameter file of the model")
    ap.add_argument("--engine-tokens", default="", help="file with lines 'METHOD: t0 t1 ...' (GPU engine)")
    ap.add_argument("--md", required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=170, help="seconds; later speed points are skipped")
    a = ap.parse_args()
    global DEV
    DEV = a.device
    deadline = time.time() + a.time_limit
    toks = np.fromfile(a.tokens, dtype=np.uint32)
    params = liboscar.Params.load(a.params)
    engine = {}
    if a.engine_tokens and Path(a.engine_tokens).exists():
        for line in Path(a.engine_tokens).read_text().splitlines():
            if ":" in line:
                m, t = line.split(":", 1)
                engine[m.strip()] = [int(x) for x in t.split()]
    import transformers
    head = [f"transformers {transformers.__version__}, torch {torch.__version__}, liboscar {liboscar.version()}, "
            f"{torch.cuda.get_device_name() if DEV == 'cuda' else 'CPU'}; model {a.model}", ""]
    sections = []
    model = load(a.model, torch.bfloat16)
    sections += [f"### Greedy generation, bf16 weights (prompt {a.prompt} tokens of eval.tokens, {a.gen} new tokens)",
                 ""]
    sections += agreement_generate(model, toks, params, a.prompt, a.gen, engine) + [""]
    del model
    free()
    sections += ["### Teacher forced against oscar-eval", ""]
    sections += teacher_forced(a.model, toks, params, a.windows, a.ctx) + [""]
    sections += ["### Decode speed", ""]
    sections += speed(a.model, params, [int(x) for x in a.batches.split(",")],
                      [int(x) for x in a.contexts.split(",")], a.steps, a.warmup, deadline)
    text = "\n".join(head + sections) + "\n"
    Path(a.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
