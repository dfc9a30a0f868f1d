"""Hostile use of the binding, as an engine vendor probes it: threads sharing
one object, buffers of the wrong kind for the backend, NumPy-style
shorthands. Each test failed before the commit that added it."""
import os
import threading

import numpy as np
import pytest

import liboscar
from liboscar import _capi

SMALL = dict(head_dim=64, group=64, num_q_heads=2, num_kv_heads=1, page_size=16, sink=4, recent=16,
             max_seq_len=256)

try:
    _ocl = liboscar.Runtime("opencl")
except liboscar.OscarError:
    if "opencl" in os.environ.get("OSCAR_REQUIRE_BACKENDS", ""):
        raise
    _ocl = None
needs_opencl = pytest.mark.skipif(_ocl is None, reason="OpenCL backend unavailable")
needs_calib = pytest.mark.skipif(not _capi.have_calib() and os.environ.get("OSCAR_REQUIRE_CALIB") != "1",
                                 reason="liboscar_calib not built here (no LAPACK/LAPACKE/cblas.h)")


def _bf(rng, *shape):
    return liboscar.to_bf16(rng.standard_normal(shape).astype(np.float32))


@needs_calib
def test_calibrator_fed_from_threads_matches_sequential():
    # oscar_calib_feed must be called from one thread at a time (its scratch rows are shared);
    # ctypes releases the GIL, so Python threads feeding one Calibrator (a layer each) raced in
    # the C code: C_K and C_V came out wrong by up to 15 %, without an error. The binding
    # serializes the calls on one Calibrator, so the targets equal the sequential ones exactly.
    L, hq, hkv, d, n, feeds = 4, 4, 2, 64, 128, 12
    rng = np.random.default_rng(11)
    data = [[tuple(rng.standard_normal((n, h, d)).astype(np.float32) for h in (hq, hkv, hkv)) for _ in range(feeds)]
            for _ in range(L)]

    def targets(threaded):
        c = liboscar.Calibrator(L, hq, hkv, d, threads=1)
        for p in (0, 1):
            c.begin_pass(p)

            def feed(layer):
                for q, k, v in data[layer]:
                    c.feed(layer, q if p == 0 else None, k, v)

            if threaded:
                ts = [threading.Thread(target=feed, args=(layer,)) for layer in range(L)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
            else:
                for layer in range(L):
                    feed(layer)
        out = [c.target(layer, which, h) for layer in range(L) for which in "kv" for h in range(hkv)]
        c.close()
        return out

    ref = targets(False)
    for _ in range(3):
        got = targets(True)
        worst = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(got, ref))
        assert worst == 0.0, f"threaded feeds differ from sequential ones by {worst:.3g} (relative)"


@needs_opencl
def test_paged_cache_used_from_threads_on_opencl():
    # A PagedCache on OpenCL shares its staging buffers, length buffer and workspace between
    # layers: threads decoding different layers of one cache overwrote each other's query and
    # lengths, and most outputs were another layer's or garbage (112 of 120 here), silently.
    rng = np.random.default_rng(5)
    plan = liboscar.Plan(_ocl, liboscar.Layout(**SMALL, method="int2"))
    L = 4
    c = plan.cache(L, 2, 200)
    for layer in range(L):
        n = 50 + layer
        c.append(layer, _bf(rng, 2 * n, 1, 64), _bf(rng, 2 * n, 1, 64), [n, n])
    qs = [_bf(rng, 2, 2, 64) for _ in range(L)]
    ref = [c.decode(layer, qs[layer]) for layer in range(L)]
    wrong = []

    def work(layer):
        for _ in range(20):
            if not np.array_equal(c.decode(layer, qs[layer]), ref[layer]):
                wrong.append(layer)
            c.extend(layer, qs[layer], [1, 1])  # extend's own staging and workspace, shared too

    ts = [threading.Thread(target=work, args=(layer,)) for layer in range(L)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not wrong, f"{len(wrong)} of {20 * L} threaded decodes differ from the same decode alone"
    c.check()
    plan.close()


@needs_opencl
def test_opencl_calls_name_the_memory_they_take(monkeypatch):
    # On OpenCL, Plan calls take DeviceBuffers (cl_mem) and PagedCache calls host arrays. A NumPy
    # array passed to a Plan call was told to be a "torch tensor on the GPU" (which OpenCL cannot
    # take), a DeviceBuffer passed to a PagedCache call that "this backend needs host memory"
    # (it needs device memory; the cache copies host arrays), and a torch CUDA tensor was taken:
    # its device pointer went to the plugin as a cl_mem (a crash, as a CPU buffer did in 8b6dfb0).
    rng = np.random.default_rng(3)
    plan = liboscar.Plan(_ocl, liboscar.Layout(**SMALL, method="int2"))
    c = plan.cache(1, 2, 100)
    c.append(0, _bf(rng, 40, 1, 64), _bf(rng, 40, 1, 64), [20, 20])
    q = _bf(rng, 2, 2, 64)
    out = _ocl.alloc((2, 2, 64), "bf16")
    args = (0, c.pages[0], c.windows[0], c._lens_dev, c.window_slots, c.block_table)
    with pytest.raises(ValueError, match=r"q: .*opencl.*DeviceBuffer") as e:
        plan.decode(*args, q, out, c.workspace)
    assert "torch" not in str(e.value)
    qd = _ocl.alloc((2, 2, 64), "bf16")
    qd.write(q)
    with pytest.raises(ValueError, match=r"q: .*PagedCache.*host.*Plan\.decode") as e:
        c.decode(0, qd)
    assert "needs host memory" not in str(e.value)

    class FakeCudaTensor:  # what the binding reads of a torch tensor on a CUDA device
        is_cuda, device, shape, dtype = True, "cuda:0", (2, 2, 64), "bfloat16"

        def is_contiguous(self):
            return True

        def data_ptr(self):
            return 0x7F0000001000

        def element_size(self):
            return 2

    monkeypatch.setattr(liboscar.core, "torch", type("torch", (), {"Tensor": FakeCudaTensor}))
    with pytest.raises(ValueError, match=r"q: a torch tensor on cuda:0.*opencl.*DeviceBuffer"):
        plan.decode(*args, FakeCudaTensor(), out, c.workspace)
    monkeypatch.undo()
    assert c.decode(0, q).shape == q.shape  # the right kinds still run
    plan.close()


def test_bf16_conversions_keep_the_shape_of_a_scalar():
    # np.ascontiguousarray returns at least 1-D: to_bf16(1.5) and from_bf16 of a 0-d array came back
    # with shape (1,), so a scalar became a one-element vector (and broadcast against others) silently.
    for x in (1.5, np.float32(1.5), np.array(1.5, np.float64)):
        b = liboscar.to_bf16(x)
        assert b.shape == () and b.dtype == np.uint16 and int(b) == 0x3FC0
        f = liboscar.from_bf16(b)
        assert f.shape == () and f.dtype == np.float32 and float(f) == 1.5
    assert liboscar.from_bf16(np.uint16(0x3FC0)).shape == ()
    v = np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::-1]  # strided: still converted as given
    assert np.array_equal(liboscar.from_bf16(liboscar.to_bf16(v)), v)


def test_device_buffer_shape_may_be_one_integer(cpu):
    # NumPy takes np.zeros(16); Runtime.alloc(16, "u8") and view(16) failed with "'int' object is not
    # iterable", naming neither the call nor the argument.
    b = cpu.alloc(16, "f32")
    assert b.shape == (16,) and b.nbytes == 64
    b.write(np.arange(16, dtype=np.float32))
    assert b.view(np.int64(4)).shape == (4,)
    assert np.array_equal(b.view(4).read(), np.arange(4, dtype=np.float32))
    with pytest.raises(TypeError, match="DeviceBuffer shape"):
        cpu.alloc(2.5, "f32")
    with pytest.raises(TypeError, match="DeviceBuffer shape"):
        cpu.alloc(True, "f32")


@needs_opencl
def test_extend_error_survives_its_workspace_growing():
    # PagedCache.extend sizes its own workspace for the call's query count and replaces it with a
    # larger one when a later call has more queries. The device flags bad rows (here a NaN query) in
    # that workspace's error word, read by check(): the replaced workspace was dropped unread, so a
    # flagged extend followed by a longer one left check() silent and the NaN rows' outputs unflagged.
    rng = np.random.default_rng(9)
    plan = liboscar.Plan(_ocl, liboscar.Layout(**SMALL, method="int2"))
    c = plan.cache(1, 2, 200)
    c.append(0, _bf(rng, 100, 1, 64), _bf(rng, 100, 1, 64), [50, 50])
    q = _bf(rng, 2, 2, 64)
    q[0, 0, 0] = 0x7FC0  # a bf16 NaN
    c.extend(0, q, [1, 1])
    c.extend(0, _bf(rng, 80, 2, 64), [40, 40])  # needs a larger workspace than the first call's
    with pytest.raises(liboscar.OscarError, match="NaN"):
        c.check()
    c.check()  # read and cleared: nothing left to raise
    c.extend(0, _bf(rng, 2, 2, 64), [1, 1])
    c.check()
    plan.close()
