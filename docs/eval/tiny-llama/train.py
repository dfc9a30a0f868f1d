#!/usr/bin/env python3
"""Train a small Llama-layout model on CPU (JAX), saved in Hugging Face format.

A second architecture for oscar-eval / oscar-calibrate (issue 16): model_type llama, no q/k-norm,
4 query heads / 2 KV heads of head_dim 64 (tiny-qwen3: 8 / 2 of 128, q/k-norm), rope_theta 1e4,
tied embeddings. The math is transformers' LlamaForCausalLM (RMSNorm, rotate-half RoPE, GQA,
SwiGLU), written out in jax.numpy so that only `pip install jax numpy` is needed (JAX runs it on a GPU where it finds one).

Data: tiny-qwen3's calib.tokens (calib.txt tokenized with the tiny-qwen3 tokenizer), without its
first 131072 tokens: [0, 65536) is what oscar-calibrate reads, [65536, 131072) is kept for
validation, so neither calibration nor evaluation text was seen in training. eval.tokens is never read.

    python3 train.py --out /work/models-local/tiny-llama [--minutes 40] [--seed 0]

The schedule (warm-up, cosine to 0.1 x; sequences of --short-seq tokens, then of --seq for the last
--long-frac) runs over --max-steps or --minutes, whichever ends first: with a time limit the result
depends on the machine's speed (train.log records what ran). The held-out perplexity is checked every
--val-every steps and the best checkpoint is the one written.

The model is written outside the repository (never commit it): config.json, model.safetensors (BF16),
tokenizer.json / tokenizer_config.json copied from tiny-qwen3, train.log.
"""
import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hf_io import save_hf  # noqa: E402 (this folder: the script's own)

CFG = dict(hidden=256, layers=6, heads=4, kv_heads=2, head_dim=64, inter=704, vocab=8192, theta=10000.0,
           eps=1e-5, max_pos=4096)


def init_params(key, c):
    h, d, nq, nk, f, V = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"], c["inter"], c["vocab"]
    keys = iter(jax.random.split(key, 8 * c["layers"] + 2))
    std = 0.02
    out_std = std / math.sqrt(2 * c["layers"])

    def n(shape, s):
        return s * jax.random.normal(next(keys), shape, jnp.float32)

    p = {"embed": n((V, h), std), "norm": jnp.ones((h,), jnp.float32), "layers": []}
    for _ in range(c["layers"]):
        p["layers"].append({
            "ln1": jnp.ones((h,), jnp.float32), "ln2": jnp.ones((h,), jnp.float32),
            "q": n((nq * d, h), std), "k": n((nk * d, h), std), "v": n((nk * d, h), std),
            "o": n((h, nq * d), out_std),
            "gate": n((f, h), std), "up": n((f, h), std), "down": n((h, f), out_std),
        })
    return p


def rmsnorm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_tables(T, d, theta):
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    f = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([f, f], axis=-1)
    return jnp.asarray(np.cos(emb), jnp.float32), jnp.asarray(np.sin(emb), jnp.float32)


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def dropout(x, rate, key):
    if key is None or rate <= 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def forward(p, ids, c, cos, sin, key=None, rate=0.0):
    B, T = ids.shape
    d, nq, nk = c["head_dim"], c["heads"], c["kv_heads"]
    g = nq // nk
    x = p["embed"][ids]
    mask = jnp.tril(jnp.ones((T, T), bool))
    keys = list(jax.random.split(key, 2 * len(p["layers"]))) if key is not None else [None] * (2 * len(p["layers"]))
    for i, L in enumerate(p["layers"]):
        xn = rmsnorm(x, L["ln1"], c["eps"])
        q = (xn @ L["q"].T).reshape(B, T, nq, d)
        k = (xn @ L["k"].T).reshape(B, T, nk, d)
        v = (xn @ L["v"].T).reshape(B, T, nk, d)
        q = q * cos[None, :T, None] + rotate_half(q) * sin[None, :T, None]
        k = k * cos[None, :T, None] + rotate_half(k) * sin[None, :T, None]
        q = q.reshape(B, T, nk, g, d)
        s = jnp.einsum("btkgd,bskd->bkgts", q, k) / math.sqrt(d)
        s = jnp.where(mask, s, -1e30)
        a = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bkgts,bskd->btkgd", a, v).reshape(B, T, nq * d)
        x = x + dropout(o @ L["o"].T, rate, keys[2 * i])
        xn = rmsnorm(x, L["ln2"], c["eps"])
        x = x + dropout((jax.nn.silu(xn @ L["gate"].T) * (xn @ L["up"].T)) @ L["down"].T, rate, keys[2 * i + 1])
    x = rmsnorm(x, p["norm"], c["eps"])
    return x @ p["embed"].T


def loss_fn(p, ids, c, cos, sin, key=None, rate=0.0):
    logits = forward(p, ids[:, :-1], c, cos, sin, key, rate)
    lp = jax.nn.log_softmax(logits, axis=-1)
    tgt = ids[:, 1:]
    return -jnp.mean(jnp.take_along_axis(lp, tgt[..., None], axis=-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shared", default="/work/shared")
    ap.add_argument("--minutes", type=float, default=35.0, help="training time budget (wall)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--short-seq", type=int, default=512, help="sequence length before the last --long-frac")
    ap.add_argument("--short-batch", type=int, default=16)
    ap.add_argument("--long-frac", type=float, default=0.2, help="share of the time budget at --seq")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.1, help="on the residual branches, training only")
    ap.add_argument("--val-every", type=int, default=50, help="steps between held-out checks (best kept)")
    a = ap.parse_args()
    c = dict(CFG)
    toks = np.fromfile(os.path.join(a.shared, "data/tiny-qwen3/calib.tokens"), "<u4").astype(np.int32)
    train = toks[131072:]
    val = toks[65536:131072]
    if train.max() >= c["vocab"]:
        sys.exit("token id outside the vocabulary")
    rng = np.random.default_rng(a.seed)
    T = a.seq + 1
    cos, sin = rope_tables(a.seq, c["head_dim"], c["theta"])
    p = init_params(jax.random.PRNGKey(a.seed), c)
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    b1, b2, wd = 0.9, 0.95, 0.1

    @jax.jit
    def step(p, m, v, ids, lr, t, key):
        loss, gr = jax.value_and_grad(loss_fn)(p, ids, c, cos, sin, key, a.dropout)
        gn = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(gr)))
        sc = jnp.minimum(1.0, 1.0 / (gn + 1e-6))
        gr = jax.tree_util.tree_map(lambda x: x * sc, gr)
        m = jax.tree_util.tree_map(lambda a_, g: b1 * a_ + (1 - b1) * g, m, gr)
        v = jax.tree_util.tree_map(lambda a_, g: b2 * a_ + (1 - b2) * g * g, v, gr)
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t

        def upd(x, mm, vv):
            decay = wd if x.ndim == 2 else 0.0
            return x - lr * (mm / bc1 / (jnp.sqrt(vv / bc2) + 1e-8) + decay * x)

        p = jax.tree_util.tree_map(upd, p, m, v)
        return p, m, v, loss

    @jax.jit
    def eval_loss(p, ids):
        return loss_fn(p, ids, c, cos, sin)

    def val_ppl(p):
        T = a.seq + 1
        return math.exp(np.mean([float(eval_loss(p, jnp.asarray(val[i:i + T][None])))
                                 for i in range(0, 8 * a.seq, a.seq)]))

    best = [float("inf"), 0, None]
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "train.log"), "w")
    budget = a.minutes * 60
    t0 = time.time()
    warm = 30
    ntok = 0
    s = 0
    while s < a.max_steps:
        s += 1
        # the schedule follows wall time or the step count, whichever runs out first
        prog = max((time.time() - t0) / budget, (s - 1) / a.max_steps)
        if prog >= 1.0:
            break
        seq, bs = (a.seq, a.batch) if prog >= 1.0 - a.long_frac else (a.short_seq, a.short_batch)
        starts = rng.integers(0, len(train) - seq - 1, bs)
        ids = jnp.asarray(np.stack([train[i:i + seq + 1] for i in starts]))
        # linear warm-up, then cosine to 0.1 x at the end of the time budget
        lr = a.lr * min(1.0, s / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        p, m, v, loss = step(p, m, v, ids, lr, float(s), jax.random.PRNGKey(a.seed * 1000003 + s))
        loss = float(loss)  # waits for the step
        ntok += bs * seq
        if s % 10 == 0 or s <= 3:
            msg = f"step {s} seq {seq} loss {loss:.4f} lr {lr:.2e} tokens {ntok} elapsed {time.time() - t0:.0f}s"
            if a.val_every and s % a.val_every == 0:
                vl = val_ppl(p)
                if vl < best[0]:
                    best[:] = [vl, s, jax.tree_util.tree_map(np.asarray, p)]
                msg += f" held-out ppl {vl:.3f}"
            print(msg, flush=True)
            log.write(msg + "\n"); log.flush()
    s -= 1
    vl = val_ppl(p)
    if vl < best[0]:
        best[:] = [vl, s, p]
    p = best[2]
    msg = f"done: {s} steps, {ntok} tokens, {time.time() - t0:.0f} s; kept step {best[1]}: " \
          f"held-out calib.tokens[65536:81920] ppl {best[0]:.3f} (8 x {a.seq}, fp32)"
    print(msg, flush=True)
    log.write(msg + "\n")
    save_hf(p, c, a.out, os.path.join(a.shared, "models/tiny-qwen3"))


if __name__ == "__main__":
    main()
