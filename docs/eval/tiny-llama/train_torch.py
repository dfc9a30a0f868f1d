#!/usr/bin/env python3
"""train.py's model and data in PyTorch, for a GPU machine (issue 16, ninth step).

The same Llama layout (6 layers, hidden 256, 4 query / 2 KV heads of head_dim 64, rope_theta 1e4, tied
embeddings, no q/k-norm), the same data split (tiny-qwen3's calib.tokens from 131072 on; [65536,
131072) held out; eval.tokens never read), the same optimiser settings (AdamW b 0.9 / 0.95, weight
decay 0.1 on matrices, gradient clip 1, warm-up then cosine to 0.1 x, residual dropout) and the same
Hugging Face output (train.py's save_hf, BF16). What differs:
- it runs on a GPU (CUDA) for --minutes of wall time, many more steps than the 2-core CPU allows;
- --copy-frac of the training sequences repeat a span of themselves (a chunk of training text, then the
  same chunk again), so that the model learns to copy: the CPU model of train.py did not (BF16
  retrieval 0.10), and a model without copy heads cannot tell whether a rule that widens "the head
  that matters" finds the heads retrieval needs.

    python3 train_torch.py --calib-tokens calib.tokens --tok-dir DIR_WITH_tokenizer.json --out OUT
"""
import argparse
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from hf_io import save_hf  # this folder (train.py's output format)

CFG = dict(hidden=256, layers=6, heads=4, kv_heads=2, head_dim=64, inter=704, vocab=8192, theta=10000.0,
           eps=1e-5, max_pos=4096)


def init_params(c, dev, gen):
    h, d, nq, nk, f, V = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"], c["inter"], c["vocab"]
    std, out_std = 0.02, 0.02 / math.sqrt(2 * c["layers"])

    def n(shape, s):
        return torch.nn.Parameter(s * torch.randn(shape, generator=gen, device="cpu").to(dev))

    p = {"embed": n((V, h), std), "norm": torch.nn.Parameter(torch.ones(h, device=dev)), "layers": []}
    for _ in range(c["layers"]):
        p["layers"].append({
            "ln1": torch.nn.Parameter(torch.ones(h, device=dev)), "ln2": torch.nn.Parameter(torch.ones(h, device=dev)),
            "q": n((nq * d, h), std), "k": n((nk * d, h), std), "v": n((nk * d, h), std),
            "o": n((h, nq * d), out_std),
            "gate": n((f, h), std), "up": n((f, h), std), "down": n((h, f), out_std),
        })
    return p


def params_list(p):
    out = [p["embed"], p["norm"]]
    for L in p["layers"]:
        out += list(L.values())
    return out


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * w


def rope_tables(T, d, theta, dev):
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    f = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([f, f], axis=-1)
    return (torch.tensor(np.cos(emb), dtype=torch.float32, device=dev),
            torch.tensor(np.sin(emb), dtype=torch.float32, device=dev))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def forward(p, ids, c, cos, sin, rate=0.0):
    B, T = ids.shape
    d, nq, nk = c["head_dim"], c["heads"], c["kv_heads"]
    g = nq // nk
    x = p["embed"][ids]
    for L in p["layers"]:
        xn = rmsnorm(x, L["ln1"], c["eps"])
        q = (xn @ L["q"].T).view(B, T, nq, d)
        k = (xn @ L["k"].T).view(B, T, nk, d)
        v = (xn @ L["v"].T).view(B, T, nk, d)
        q = q * cos[None, :T, None] + rotate_half(q) * sin[None, :T, None]
        k = k * cos[None, :T, None] + rotate_half(k) * sin[None, :T, None]
        # query head j reads KV head j // g (train.py's reshape to [nk, g])
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, nq * d)
        x = x + F.dropout(o @ L["o"].T, rate, training=rate > 0)
        xn = rmsnorm(x, L["ln2"], c["eps"])
        x = x + F.dropout((F.silu(xn @ L["gate"].T) * (xn @ L["up"].T)) @ L["down"].T, rate, training=rate > 0)
    x = rmsnorm(x, p["norm"], c["eps"])
    return x @ p["embed"].T


def loss_fn(p, ids, c, cos, sin, rate=0.0):
    logits = forward(p, ids[:, :-1], c, cos, sin, rate)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def batch(rng, train, seq, bs, copy_frac):
    rows = []
    for _ in range(bs):
        if rng.random() < copy_frac:
            # natural prefix, a chunk, the same chunk again (like oscar-eval's retrieval task)
            r = int(rng.integers(32, seq // 2))
            pre = seq + 1 - 2 * r
            a = int(rng.integers(0, len(train) - pre - r - 1))
            b = int(rng.integers(0, len(train) - r - 1))
            chunk = train[b:b + r]
            rows.append(np.concatenate([train[a:a + pre], chunk, chunk]))
        else:
            i = int(rng.integers(0, len(train) - seq - 1))
            rows.append(train[i:i + seq + 1])
    return np.stack(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calib-tokens", required=True)
    ap.add_argument("--tok-dir", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--short-seq", type=int, default=512)
    ap.add_argument("--short-batch", type=int, default=32)
    ap.add_argument("--long-frac", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--copy-frac", type=float, default=0.25)
    ap.add_argument("--val-every", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cuda (bf16 autocast) or cpu (fp32; set --threads)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    a = ap.parse_args()
    c = dict(CFG)
    dev = a.device
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = True
    toks = np.fromfile(a.calib_tokens, "<u4").astype(np.int64)
    train, val = toks[131072:], toks[65536:131072]
    rng = np.random.default_rng(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    cos, sin = rope_tables(a.seq, c["head_dim"], c["theta"], dev)
    p = init_params(c, dev, gen)
    mats = [x for x in params_list(p) if x.ndim == 2]
    vecs = [x for x in params_list(p) if x.ndim != 2]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.1}, {"params": vecs, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    # AdamW decays by lr * wd * x; train.py's update is x - lr (adam + wd x): the same

    def val_ppl():
        with torch.no_grad():
            ls = [float(loss_fn(p, torch.tensor(val[i:i + a.seq + 1][None], device=dev), c, cos, sin))
                  for i in range(0, 8 * a.seq, a.seq)]
        return math.exp(float(np.mean(ls)))

    def copy_acc():
        # retrieval as oscar-eval measures it: 64 tokens, a 992-token chunk, the chunk again
        hits = n = 0
        with torch.no_grad():
            for t in range(4):
                s0 = 16384 + t * 1056
                ids = np.concatenate([val[s0:s0 + 64], val[s0 + 64:s0 + 1056], val[s0 + 64:s0 + 1056]])
                lg = forward(p, torch.tensor(ids[None], device=dev), c, cos, sin)[0]
                pred = lg.argmax(-1).cpu().numpy()
                R = 992
                for i in range(1056, 2047):
                    hits += int(pred[i] == ids[i + 1])
                    n += 1
        return hits / n

    best = [float("inf"), 0, None]
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "train.log"), "w")
    budget = a.minutes * 60
    t0 = time.time()
    warm, ntok, s = 100, 0, 0
    while True:
        s += 1
        prog = (time.time() - t0) / budget
        if prog >= 1.0:
            break
        seq, bs = (a.seq, a.batch) if prog >= 1.0 - a.long_frac else (a.short_seq, a.short_batch)
        ids = torch.tensor(batch(rng, train, seq, bs, a.copy_frac), device=dev)
        lr = a.lr * min(1.0, s / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.startswith("cuda")):
            loss = loss_fn(p, ids, c, cos, sin, a.dropout)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params_list(p), 1.0)
        opt.step()
        ntok += bs * seq
        if s % a.val_every == 0:
            vl = val_ppl()
            msg = f"step {s} seq {seq} loss {float(loss):.4f} lr {lr:.2e} tokens {ntok} elapsed {time.time() - t0:.0f}s" \
                  f" held-out ppl {vl:.3f}"
            if vl < best[0]:
                best[:] = [vl, s, {k: v.detach().cpu().clone() for k, v in
                                   [("embed", p["embed"]), ("norm", p["norm"])]}]
                best[2]["layers"] = [{k: v.detach().cpu().clone() for k, v in L.items()} for L in p["layers"]]
                msg += f" copy {copy_acc():.3f}"
            print(msg, flush=True)
            log.write(msg + "\n")
            log.flush()
    vl = val_ppl()
    if vl < best[0]:
        best[:] = [vl, s, None]
        best[2] = {"embed": p["embed"].detach().cpu(), "norm": p["norm"].detach().cpu(),
                   "layers": [{k: v.detach().cpu() for k, v in L.items()} for L in p["layers"]]}
    q = best[2]
    for k in ("embed", "norm"):
        p[k].data.copy_(q[k])
    for L, Q in zip(p["layers"], q["layers"]):
        for k in L:
            L[k].data.copy_(Q[k])
    msg = f"done: {s - 1} steps, {ntok} tokens, {time.time() - t0:.0f} s; kept step {best[1]}: held-out " \
          f"calib.tokens[65536:81920] ppl {best[0]:.3f} (8 x {a.seq}, fp32); copy accuracy {copy_acc():.3f}"
    print(msg, flush=True)
    log.write(msg + "\n")
    log.close()
    save_hf({"embed": p["embed"].detach().cpu().numpy(), "norm": p["norm"].detach().cpu().numpy(),
             "layers": [{k: v.detach().cpu().numpy() for k, v in L.items()} for L in p["layers"]]},
            c, a.out, a.tok_dir)


if __name__ == "__main__":
    main()
