"""The paged cache through the binding on the CPU backend (NumPy arrays)
against NumPy decode attention over the same rows (FORMAT.md §3-5):
prefill of sequences of different lengths, then token-by-token decode steps
that demote the oldest recent token into 2 bits."""
import numpy as np
import pytest

import liboscar
from conftest import bf16_exact, ref_attention, ref_int2

HQ, HKV, D, S0, W, PAGE = 8, 2, 128, 4, 16, 16


def run(cpu, rng, method, group, lens, steps, d=D):
    layout = liboscar.Layout(head_dim=d, group=group, num_q_heads=HQ, num_kv_heads=HKV, page_size=PAGE, sink=S0,
                             recent=W, max_seq_len=512, kv_dtype="bf16", method=method)
    plan = liboscar.Plan(cpu, layout)
    cache = plan.cache(num_layers=2, num_seqs=len(lens), max_seq_len=max(lens) + steps)
    total = max(lens) + steps
    # bf16-exact rows with channel outliers: what the cache stores is then
    # exactly these rows (identity rotation) or their 2-bit codes.
    scale = 1 + 6 * (rng.random((1, 1, d)) < 0.05)
    ks = [bf16_exact(rng.standard_normal((total, HKV, d)) * scale) for _ in lens]
    vs = [bf16_exact(rng.standard_normal((total, HKV, d))) for _ in lens]
    layer = 1
    cat = lambda rows: liboscar.to_bf16(np.concatenate(rows))  # noqa: E731
    cache.append(layer, cat([k[:n] for k, n in zip(ks, lens)]), cat([v[:n] for v, n in zip(vs, lens)]),
                 new_tokens=lens)
    worst, fp_gap, shift_gap = 0.0, np.inf, 0.0
    cur = list(lens)
    for step in range(steps + 1):
        if step:
            cache.append(layer, cat([k[n:n + 1] for k, n in zip(ks, cur)]),
                         cat([v[n:n + 1] for v, n in zip(vs, cur)]))
            cur = [n + 1 for n in cur]
        assert cache.lens[layer].tolist() == cur
        qf = bf16_exact(rng.standard_normal((len(lens), HQ, d)))
        out = liboscar.from_bf16(cache.decode(layer, liboscar.to_bf16(qf)))
        for i, n in enumerate(cur):
            k, v = ks[i][:n], vs[i][:n]
            quant = (lambda x: ref_int2(x, group)) if method == "int2" else (lambda x: x)
            kq, vq = quant(k), quant(v)
            ref = ref_attention(qf[i], k, v, kq, vq, S0, W)
            mx = np.abs(ref).max()
            worst = max(worst, np.abs(out[i] - ref).max() / mx)
            if method == "int2" and n > S0 + W:
                # Wrong references the comparison must tell apart: no 2-bit region at
                # all (every step whose 2-bit region holds >= 16 rows: a few rows of
                # small weight may legitimately sit within output rounding of full
                # precision, as one row of 21 did for seed 2942739016), the boundary
                # one token off (some step).
                if n - S0 - W >= 16:
                    fp = ref_attention(qf[i], k, v, k, v, S0, W)
                    fp_gap = min(fp_gap, np.abs(fp - ref).max() / mx)
                shifted = ref_attention(qf[i], k, v, kq, vq, S0, W + 1)
                shift_gap = max(shift_gap, np.abs(shifted - ref).max() / mx)
    return worst, fp_gap, shift_gap


# head_dim 96 (Phi-3, GPT-NeoX-20B) and 80 (Phi-2, Pythia): every multiple of 16 from 32 to 256 (FORMAT.md 3.5)
@pytest.mark.parametrize("method,group,d", [("bf16", 128, 128), ("int2", 128, 128), ("int2", 32, 128),
                                            ("int2", 96, 96), ("int2", 48, 96), ("bf16", 80, 80), ("int2", 80, 80)])
def test_append_decode_matches_numpy(cpu, rng, method, group, d):
    worst, fp_gap, shift_gap = run(cpu, rng, method, group, lens=[1, 37, 200], steps=30, d=d)
    # bf16 output rounding (2^-8 relative) is the only difference allowed.
    assert worst < 8e-3, f"decode differs from the NumPy reference by {worst:.2e} (relative to max |o|)"
    if method == "int2":
        assert fp_gap > 3 * worst, f"full precision is as close as the 2-bit reference ({fp_gap:.2e})"
        assert shift_gap > 1.5 * worst, f"the comparison cannot tell the 2-bit boundary apart ({shift_gap:.2e})"


# Seeds whose shortest sequence once made the full-precision check fail (its 2-bit region held 1-11 rows)
@pytest.mark.parametrize("seed", [2942739016, 18])
def test_append_decode_small_2bit_region_seeds(cpu, seed):
    worst, fp_gap, shift_gap = run(cpu, np.random.default_rng(seed), "int2", 48, lens=[1, 37, 200], steps=30, d=96)
    assert worst < 8e-3 and fp_gap > 3 * worst and shift_gap > 1.5 * worst, (worst, fp_gap, shift_gap)


def test_dtype_and_shape_errors(cpu):
    layout = liboscar.Layout(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, max_seq_len=256, method="int2",
                             kv_dtype="f16")
    plan = liboscar.Plan(cpu, layout)
    c = plan.cache(num_layers=1, num_seqs=2, max_seq_len=256)
    good = np.zeros((2, HKV, D), np.float16)
    with pytest.raises(TypeError, match=r"k: dtype float32, expected float16"):
        c.append(0, good.astype(np.float32), good)
    with pytest.raises(ValueError, match=r"v: shape \(2, 2, 64\), expected \(2, 2, 128\)"):
        c.append(0, good, np.zeros((2, HKV, 64), np.float16))
    with pytest.raises(ValueError, match="not C-contiguous"):
        c.append(0, good, np.zeros((2, HKV, 2 * D), np.float16)[:, :, ::2])
    with pytest.raises(ValueError, match="new_tokens must give 2"):
        c.append(0, good, good, new_tokens=[3, 0])
    with pytest.raises(ValueError, match="would exceed max_seq_len 256"):
        c.append(0, np.zeros((300, HKV, D), np.float16), np.zeros((300, HKV, D), np.float16), new_tokens=[299, 1])
    with pytest.raises(ValueError, match="needs an appended token"):
        c.decode(0, np.zeros((2, HQ, D), np.float16))
    # bf16 layouts say how to make bfloat16 bits.
    lb = liboscar.Layout(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, max_seq_len=256, method="int2")
    cb = liboscar.Plan(cpu, lb).cache(num_layers=1, num_seqs=2)
    with pytest.raises(TypeError, match="to_bf16"):
        cb.append(0, good, good)


def test_library_refuses_bad_block_table(cpu):
    """The low-level call with the caller's own buffers: a page id out of
    range comes back as the library's BLOCK_TABLE error and message."""
    layout = liboscar.Layout(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, max_seq_len=512, method="int2",
                             kv_dtype="f16", sink=S0, recent=W, page_size=PAGE)
    plan = liboscar.Plan(cpu, layout)
    sz = plan.sizes
    pages = np.zeros(4 * sz.page_bytes, np.uint8)
    windows = np.zeros(sz.window_slot_bytes, np.uint8)
    ws = np.zeros(plan.workspace_bytes(1, 512), np.uint8)
    plan.workspace_init(ws)
    n = 100  # needs ceil((100 - 20) / 16) = 5 pages; the table points past the pool
    bt = np.array([[0, 1, 2, 3, 9, 0, 0, 0]], np.int32)
    kv = np.ones((n, HKV, D), np.float16)
    with pytest.raises(liboscar.OscarError) as e:
        plan.append(0, pages, windows, np.array([n], np.int32), np.array([0], np.int32), bt,
                    np.array([0, n], np.int32), kv, kv, ws, max_seq_len=n)
    assert e.value.status == 9, str(e.value)  # OSCAR_ERR_BLOCK_TABLE
    assert "9" in str(e.value)
    with pytest.raises(liboscar.OscarError, match="NaN|non-finite|Inf"):
        bt[0, 4] = 3
        bad = kv.copy()
        bad[50, 1, 7] = np.nan
        plan.append(0, pages, windows, np.array([n], np.int32), np.array([0], np.int32), bt,
                    np.array([0, n], np.int32), bad, kv, ws, max_seq_len=n)
