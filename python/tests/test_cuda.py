"""The binding on the CUDA backend with torch tensors: device pointers,
torch's current stream, checks of device/dtype/contiguity. Compared with the
CPU backend (the reference every backend is tested against) on the same
rows, and with the NumPy reference. Skipped without torch, a GPU or the
CUDA plugin. On the H200: `pip install ./python && pytest python/tests`."""
import numpy as np
import pytest

import liboscar
from conftest import REPO, bf16_exact, ref_attention, ref_int2

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to torch", allow_module_level=True)
try:
    _rt = liboscar.Runtime("cuda")
except liboscar.OscarError as e:  # plugin not built or cannot run here
    pytest.skip(f"CUDA backend unavailable: {e}", allow_module_level=True)

HQ, HKV, D = 8, 2, 128


@pytest.fixture(scope="module")
def gpu():
    return _rt


def layout(method, **kw):
    args = dict(head_dim=D, num_q_heads=HQ, num_kv_heads=HKV, page_size=64, sink=64, recent=256, max_seq_len=8192,
                kv_dtype="bf16", method=method)
    args.update(kw)
    return liboscar.Layout(**args)


def params_for(method):
    if method in ("oscar2", "oscar2-lm"):
        name = "tiny-qwen3.oscar.safetensors" if method == "oscar2" else "tiny-qwen3.oscar-lm.safetensors"
        return liboscar.Params.load(REPO / "docs/eval" / name)  # 8 layers, 8/2 heads, d 128, feedback weights
    return None


def to_t(x):  # float32 numpy (bf16-exact) -> bf16 CUDA tensor
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to("cuda").to(torch.bfloat16)


def run_both(gpu, cpu, rng, method, lens, steps, layer=3, stream=None):
    """Same appends and decodes on CUDA (torch) and CPU (NumPy); returns the
    worst relative difference of the outputs and the last outputs."""
    prm = params_for(method)
    lay = layout(method)
    cg = liboscar.Plan(gpu, lay, prm).cache(num_layers=8, num_seqs=len(lens), max_seq_len=max(lens) + steps + 1)
    cc = liboscar.Plan(cpu, lay, prm).cache(num_layers=8, num_seqs=len(lens), max_seq_len=max(lens) + steps + 1)
    total = max(lens) + steps
    scale = 1 + 6 * (rng.random((1, 1, D)) < 0.05)
    ks = [bf16_exact(rng.standard_normal((total, HKV, D)) * scale) for _ in lens]
    vs = [bf16_exact(rng.standard_normal((total, HKV, D))) for _ in lens]
    worst = 0.0
    cur = list(lens)
    for step in range(steps + 1):
        if step == 0:
            k = np.concatenate([k[:n] for k, n in zip(ks, lens)])
            v = np.concatenate([v[:n] for v, n in zip(vs, lens)])
            new = lens
        else:
            k = np.concatenate([k[n:n + 1] for k, n in zip(ks, cur)])
            v = np.concatenate([v[n:n + 1] for v, n in zip(vs, cur)])
            new = None
            cur = [n + 1 for n in cur]
        kt, vt = to_t(k), to_t(v)
        if stream is not None:  # the side stream must see the rows torch made on its own stream
            torch.cuda.ExternalStream(stream).wait_stream(torch.cuda.current_stream())
        cg.append(layer, kt, vt, new_tokens=new, stream=stream)
        cc.append(layer, liboscar.to_bf16(k), liboscar.to_bf16(v), new_tokens=new)
        q = bf16_exact(rng.standard_normal((len(lens), HQ, D)))
        qt = to_t(q)
        if stream is not None:
            torch.cuda.ExternalStream(stream).wait_stream(torch.cuda.current_stream())
        og = cg.decode(layer, qt, stream=stream)
        oc = liboscar.from_bf16(cc.decode(layer, liboscar.to_bf16(q)))
        if stream is not None:
            torch.cuda.current_stream().wait_stream(torch.cuda.ExternalStream(stream))
        og = og.float().cpu().numpy()
        worst = max(worst, float(np.abs(og - oc).max() / np.abs(oc).max()))
    cg.check(stream)
    return worst, og, oc, ks, vs, cur, q


@pytest.mark.parametrize("method", ["bf16", "int2", "quarot2", "oscar2", "oscar2-lm"])
def test_cuda_matches_cpu_backend(gpu, cpu, rng, method):
    worst, *_ = run_both(gpu, cpu, rng, method, lens=[1, 300, 1500, 4000], steps=8)
    # FORMAT.md: within bf16 output rounding of the reference (a tolerated
    # code at a rounding boundary moves an output by far less than this).
    assert worst < 1.6e-2, f"{method}: CUDA differs from the CPU backend by {worst:.2e}"


def test_cuda_int2_matches_numpy(gpu, cpu, rng):
    _, og, _, ks, vs, cur, q = run_both(gpu, cpu, rng, "int2", lens=[700, 90], steps=3)
    for i, n in enumerate(cur):
        k, v = ks[i][:n], vs[i][:n]
        ref = ref_attention(q[i], k, v, ref_int2(k, 128), ref_int2(v, 128), 64, 256)
        assert np.abs(og[i] - ref).max() / np.abs(ref).max() < 1.6e-2


def test_side_stream_is_used(gpu, cpu, rng):
    """Work queued on a caller's stream: explicit stream= and torch's current
    stream inside `with torch.cuda.stream(s)` give the default stream's result."""
    seed = int(rng.integers(1 << 31))
    base, og0, *_ = run_both(gpu, cpu, np.random.default_rng(seed), "int2", lens=[500, 20], steps=2)
    s = torch.cuda.Stream()
    _, og1, *_ = run_both(gpu, cpu, np.random.default_rng(seed), "int2", lens=[500, 20], steps=2,
                          stream=s.cuda_stream)
    np.testing.assert_array_equal(og0, og1)
    with torch.cuda.stream(s):
        assert gpu.default_stream() == s.cuda_stream
        _, og2, *_ = run_both(gpu, cpu, np.random.default_rng(seed), "int2", lens=[500, 20], steps=2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(og0, og2)


def test_device_dtype_contiguity_errors(gpu):
    c = liboscar.Plan(gpu, layout("int2")).cache(num_layers=1, num_seqs=2, max_seq_len=512)
    good = torch.zeros((2, HKV, D), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="needs device memory"):
        c.append(0, np.zeros((2, HKV, D), np.uint16), np.zeros((2, HKV, D), np.uint16))
    with pytest.raises(ValueError, match="needs a GPU tensor, got a tensor on cpu"):
        c.append(0, good.cpu(), good)
    with pytest.raises(TypeError, match="k: dtype torch.float32, expected torch.bfloat16"):
        c.append(0, good.float(), good)
    with pytest.raises(ValueError, match="not contiguous"):
        c.append(0, good, torch.zeros((2, HKV, 2 * D), dtype=torch.bfloat16, device="cuda")[:, :, ::2])


def test_device_errors_are_reported_by_check(gpu):
    """A NaN row cannot be refused by the asynchronous kernel: it is flagged
    on the device and oscar_plan_check raises it with the library's message."""
    c = liboscar.Plan(gpu, layout("int2")).cache(num_layers=1, num_seqs=1, max_seq_len=512)
    kv = torch.ones((400, HKV, D), dtype=torch.bfloat16, device="cuda")
    c.append(0, kv, kv, new_tokens=[400])
    c.check()
    bad = torch.ones((1, HKV, D), dtype=torch.bfloat16, device="cuda")
    bad[0, 1, 5] = float("nan")
    c.append(0, bad, bad)
    with pytest.raises(liboscar.OscarError) as e:
        c.check()
    assert e.value.status == 6, str(e.value)  # OSCAR_ERR_NONFINITE
