"""Extend attention through the binding on the CPU backend: several query
tokens per sequence after an append (FORMAT.md §5.1: a query at position p
reads rows 0..p as stored at the sequence's length), against NumPy, with the
log-sum-exp; one query per sequence equals decode byte for byte."""
import numpy as np
import pytest

import liboscar
from conftest import bf16_exact, ref_int2

HQ, HKV, D, S0, W, PAGE = 8, 2, 128, 4, 16, 16


def ref_extend(q, k, v, kq, vq, n, p):
    """float64 attention (and natural-log LSE) of the query at position p of
    a sequence of n stored rows: 16-bit sink and last W rows, 2-bit between."""
    pos = np.arange(n)
    quant = (pos >= S0) & (pos < n - W)
    kk = np.where(quant[:, None, None], kq[:n], k[:n]).astype(np.float64)[:p + 1]
    vv = np.where(quant[:, None, None], vq[:n], v[:n]).astype(np.float64)[:p + 1]
    out, lse = np.empty((HQ, D)), np.empty(HQ)
    for h in range(HQ):
        g = h // (HQ // HKV)
        s = kk[:, g, :] @ q[h].astype(np.float64) / np.sqrt(D)
        e = np.exp(s - s.max())
        out[h] = (e / e.sum()) @ vv[:, g, :]
        lse[h] = s.max() + np.log(e.sum())
    return out, lse


def test_extend_matches_numpy_and_decode(cpu, rng):
    layout = liboscar.Layout(head_dim=D, group=32, num_q_heads=HQ, num_kv_heads=HKV, page_size=PAGE, sink=S0,
                             recent=W, max_seq_len=256, kv_dtype="bf16", method="int2")
    plan = liboscar.Plan(cpu, layout)
    lens, nq = [5, 40, 97], [3, 40, 17]  # queries cross the window boundary and the 2-bit region
    cache = plan.cache(num_layers=1, num_seqs=3, max_seq_len=128)
    ks = [bf16_exact(rng.standard_normal((n, HKV, D))) for n in lens]
    vs = [bf16_exact(rng.standard_normal((n, HKV, D))) for n in lens]
    cache.append(0, liboscar.to_bf16(np.concatenate(ks)), liboscar.to_bf16(np.concatenate(vs)), new_tokens=lens)
    qf = bf16_exact(rng.standard_normal((sum(nq), HQ, D)))
    out, lse = cache.extend(0, liboscar.to_bf16(qf), nq, lse=True)
    out = liboscar.from_bf16(out)
    row, worst, lse_worst = 0, 0.0, 0.0
    for i, (n, m) in enumerate(zip(lens, nq)):
        kq, vq = ref_int2(ks[i], 32), ref_int2(vs[i], 32)
        for p in range(n - m, n):
            ref, rl = ref_extend(qf[row], ks[i], vs[i], kq, vq, n, p)
            worst = max(worst, np.abs(out[row] - ref).max() / np.abs(ref).max())
            lse_worst = max(lse_worst, np.abs(lse[row] - rl).max())
            row += 1
    assert worst < 8e-3, f"extend differs from NumPy by {worst:.2e} of max |o|"
    assert lse_worst < 1e-3, f"LSE differs from NumPy by {lse_worst:.2e}"
    # The last query of each sequence is a decode query: same bytes as decode.
    last = np.cumsum(nq) - 1
    qd = liboscar.to_bf16(qf[last])
    dec = cache.decode(0, qd)
    one = cache.extend(0, qd, [1, 1, 1])
    assert np.array_equal(dec, one), "extend with one query per sequence differs from decode"


def four_token_cache(cpu, rng):
    """A BF16-method cache of one sequence holding 4 tokens."""
    layout = liboscar.Layout(head_dim=D, group=128, num_q_heads=HQ, num_kv_heads=HKV, page_size=PAGE, sink=S0,
                             recent=W, max_seq_len=64, kv_dtype="bf16", method="bf16")
    cache = liboscar.Plan(cpu, layout).cache(num_layers=1, num_seqs=1, max_seq_len=64)
    k = liboscar.to_bf16(rng.standard_normal((4, HKV, D)))
    cache.append(0, k, k, new_tokens=[4])
    return cache


def test_extend_refuses_more_queries_than_tokens(cpu, rng):
    cache = four_token_cache(cpu, rng)
    with pytest.raises(ValueError, match="more query tokens"):
        cache.extend(0, liboscar.to_bf16(rng.standard_normal((5, HQ, D))), [5])


def test_extend_lse_is_a_flag(cpu, rng):
    """An array passed as lse met NumPy's "truth value is ambiguous", naming nothing of the call."""
    cache = four_token_cache(cpu, rng)
    q = liboscar.to_bf16(rng.standard_normal((4, HQ, D)))
    with pytest.raises(TypeError, match="lse is a flag"):
        cache.extend(0, q, [4], lse=np.empty((4, HQ), np.float32))


def test_learned_sinks_from_the_lse(cpu, rng):
    """docs/API.md: a per-head sink logit s_h (gpt-oss) joins each softmax's
    denominator; from the LSE, out * 1 / (1 + exp(s_h - lse)) is that
    attention, against NumPy with the sink as an extra score of zero value."""
    layout = liboscar.Layout(head_dim=D, group=32, num_q_heads=HQ, num_kv_heads=HKV, page_size=PAGE, sink=S0,
                             recent=W, max_seq_len=256, kv_dtype="bf16", method="int2")
    cache = liboscar.Plan(cpu, layout).cache(num_layers=1, num_seqs=1, max_seq_len=128)
    n, m = 70, 6
    k = bf16_exact(rng.standard_normal((n, HKV, D)))
    v = bf16_exact(rng.standard_normal((n, HKV, D)))
    cache.append(0, liboscar.to_bf16(k), liboscar.to_bf16(v), new_tokens=[n])
    q = bf16_exact(rng.standard_normal((m, HQ, D)))
    out, lse = cache.extend(0, liboscar.to_bf16(q), [m], lse=True)
    # Sinks near each head's LSE take a visible share of the weight whatever
    # the seed (a fixed range fell below 5 % on seed 3694801925).
    sinks = lse.mean(axis=0) + rng.uniform(-1.5, 1.5, HQ)
    got = liboscar.from_bf16(out) / (1.0 + np.exp(sinks[:, None] - lse[:, :, None]))
    got_lse = np.logaddexp(lse, sinks)
    kq, vq = ref_int2(k, 32), ref_int2(v, 32)
    pos = np.arange(n)
    quant = (pos >= S0) & (pos < n - W)
    kk = np.where(quant[:, None, None], kq, k).astype(np.float64)
    vv = np.where(quant[:, None, None], vq, v).astype(np.float64)
    worst, lse_worst, share = 0.0, 0.0, 0.0
    for t, p in enumerate(range(n - m, n)):
        for h in range(HQ):
            g = h // (HQ // HKV)
            s = np.append(kk[:p + 1, g] @ q[t, h].astype(np.float64) / np.sqrt(D), sinks[h])
            e = np.exp(s - s.max())
            ref = (e[:-1] / e.sum()) @ vv[:p + 1, g]
            share = max(share, e[-1] / e.sum())
            worst = max(worst, np.abs(got[t, h] - ref).max() / np.abs(ref).max())
            lse_worst = max(lse_worst, abs(got_lse[t, h] - (s.max() + np.log(e.sum()))))
    assert share > 0.05, "the sinks must take a visible share for the check to mean anything"
    assert worst < 8e-3, f"sinked output differs from NumPy by {worst:.2e} of max |o|"
    assert lse_worst < 1e-3, f"sinked LSE differs from NumPy by {lse_worst:.2e}"
