"""OpenCL from Python (PoCL on the CPU in CI): the PagedCache on buffers of
the library's allocator, and the caller's own cl_context, queues and cl_mem
buffers (runtime native_context / native_queue, DeviceBuffer.wrap), each
against the CPU backend on the same rows (within bf16 output rounding,
2^-8 relative, as tests/test_opencl_interop.c). The caller's side uses
libOpenCL through ctypes. Skipped without the OpenCL plugin or a device,
unless $OSCAR_REQUIRE_BACKENDS names opencl."""
import ctypes
import os
from ctypes import byref, c_int32, c_size_t, c_uint32, c_void_p

import numpy as np
import pytest

import liboscar

REQUIRED = "opencl" in os.environ.get("OSCAR_REQUIRE_BACKENDS", "")
try:
    _ocl = liboscar.Runtime("opencl")
except liboscar.OscarError as e:
    if REQUIRED:
        raise
    pytest.skip(f"OpenCL backend unavailable: {e}", allow_module_level=True)

HQ, HKV, D, S0, W, PAGE = 8, 2, 128, 16, 32, 16
LENS = [200, 90]


def layout(method):
    return liboscar.Layout(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, sink=S0, recent=W, page_size=PAGE,
                           max_seq_len=512, method=method)


def params_for(method):
    return liboscar.Params.builtin(method, 2, HQ, HKV, D) if method != "int2" else None


def rows(rng, n, h):
    return liboscar.to_bf16(rng.standard_normal((n, h, D)).astype(np.float32))


def rel(a, b):
    a, b = liboscar.from_bf16(a), liboscar.from_bf16(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("method", ["int2", "quarot2", "oscar2"])
def test_paged_cache_on_opencl_matches_cpu(cpu, rng, method):
    caches = [liboscar.Plan(rt, layout(method), params_for(method)).cache(2, len(LENS), 300) for rt in (_ocl, cpu)]
    assert isinstance(caches[0].pages[0], liboscar.DeviceBuffer)
    k, v = rows(rng, sum(LENS), HKV), rows(rng, sum(LENS), HKV)
    for c in caches:
        c.append(1, k, v, new_tokens=LENS)
    worst = 0.0
    for _ in range(3):  # decode steps: one token each, the oldest recent row demoted
        k1, v1, q = rows(rng, 2, HKV), rows(rng, 2, HKV), rows(rng, 2, HQ)
        outs = []
        for c in caches:
            c.append(1, k1, v1)
            outs.append(c.decode(1, q))
        worst = max(worst, rel(*outs))
    caches[0].check()
    assert worst < 8e-3, f"{method}: OpenCL differs from the CPU backend by {worst:.2e}"


@pytest.mark.parametrize("method", ["int2", "quarot2"])
def test_paged_cache_extend_on_opencl_matches_cpu(cpu, rng, method):
    # PagedCache.extend raised NotImplementedError on OpenCL: a chunk of queries
    # per sequence after its append, with the LSE, against the CPU backend.
    caches = [liboscar.Plan(rt, layout(method), params_for(method)).cache(2, len(LENS), 300) for rt in (_ocl, cpu)]
    k, v = rows(rng, sum(LENS), HKV), rows(rng, sum(LENS), HKV)
    for c in caches:
        c.append(0, k, v, new_tokens=LENS)
    chunks = [5, 3]  # then a chunk each: the last tokens' queries over the cache
    k2, v2, q = rows(rng, 8, HKV), rows(rng, 8, HKV), rows(rng, 8, HQ)
    outs, lses = [], []
    for c in caches:
        c.append(0, k2, v2, new_tokens=chunks)
        o, lse = c.extend(0, q, chunks, lse=True)
        outs.append(o)
        lses.append(lse)
    caches[0].check()
    assert rel(*outs) < 8e-3, f"{method}: OpenCL extend differs from the CPU backend by {rel(*outs):.2e}"
    assert np.abs(lses[0] - lses[1]).max() < 1e-3
    assert np.isfinite(lses[0]).all()


def test_extend_device_errors_reach_check(rng):
    """A NaN query in an extend is flagged by the device in the extend's own workspace: check() read
    only the cache's, so the error was never raised and the query's output rows were zeros."""
    c = liboscar.Plan(_ocl, layout("int2")).cache(1, len(LENS), 300)
    c.append(0, rows(rng, sum(LENS), HKV), rows(rng, sum(LENS), HKV), new_tokens=LENS)
    q = liboscar.from_bf16(rows(rng, 4, HQ))
    q[1, 3, 7] = np.nan
    c.extend(0, liboscar.to_bf16(q), [2, 2])
    with pytest.raises(liboscar.OscarError, match="NaN"):
        c.check()
    c.check()  # read and cleared: the next check is clean
    c.extend(0, rows(rng, 4, HQ), [2, 2])
    c.check()


def test_device_buffer_of_another_backend_is_refused(rng):
    """A DeviceBuffer of the CPU runtime (a host pointer) passed to an OpenCL plan went to the plugin
    as a cl_mem: the process died (segmentation fault) in the OpenCL runtime. Refused by name before
    any pointer reaches the library, as for NumPy arrays on a device backend."""
    c = liboscar.Plan(_ocl, layout("int2")).cache(1, len(LENS), 300)
    c.append(0, rows(rng, sum(LENS), HKV), rows(rng, sum(LENS), HKV), new_tokens=LENS)
    cpu = liboscar.Runtime("cpu")
    ws = cpu.alloc(c.workspace.shape, "u8")
    q = c._stage("q", rows(rng, len(LENS), HQ), "bf16", None)
    out = _ocl.alloc(q.shape, "bf16")
    lens = c._to_dev(c.lens[0], c._lens_dev, None)
    with pytest.raises(ValueError, match="workspace: a DeviceBuffer of the cpu runtime"):
        c.plan.decode(0, c.pages[0], c.windows[0], lens, c.window_slots, c.block_table, q, out, ws,
                      max_seq_len=max(LENS))
    with pytest.raises(ValueError, match="workspace: a DeviceBuffer of the cpu runtime"):
        c.plan.workspace_init(ws)
    c.plan.decode(0, c.pages[0], c.windows[0], lens, c.window_slots, c.block_table, q, out, c.workspace,
                  max_seq_len=max(LENS))
    c.check()


class Caller:
    """The caller's own OpenCL context, two in-order queues and buffers."""

    def __init__(self):
        cl = self.cl = ctypes.CDLL("libOpenCL.so.1")
        for name, res in (("clCreateContext", c_void_p), ("clCreateCommandQueue", c_void_p),
                          ("clCreateBuffer", c_void_p)):
            getattr(cl, name).restype = res
        cl.clCreateContext.argtypes = [c_void_p, c_uint32, c_void_p, c_void_p, c_void_p, c_void_p]
        cl.clCreateCommandQueue.argtypes = [c_void_p, c_void_p, ctypes.c_uint64, c_void_p]
        cl.clCreateBuffer.argtypes = [c_void_p, ctypes.c_uint64, c_size_t, c_void_p, c_void_p]
        cl.clEnqueueWriteBuffer.argtypes = cl.clEnqueueReadBuffer.argtypes = [
            c_void_p, c_void_p, c_uint32, c_size_t, c_size_t, c_void_p, c_uint32, c_void_p, c_void_p]
        for name in ("clReleaseMemObject", "clReleaseCommandQueue", "clReleaseContext", "clFinish"):
            getattr(cl, name).argtypes = [c_void_p]
        plat, dev, n, err = c_void_p(), c_void_p(), c_uint32(), c_int32()
        assert cl.clGetPlatformIDs(1, byref(plat), byref(n)) == 0 and n.value > 0
        assert cl.clGetDeviceIDs(plat, ctypes.c_uint64(0xFFFFFFFF), 1, byref(dev), None) == 0
        self.ctx = cl.clCreateContext(None, 1, byref(dev), None, None, byref(err))
        assert err.value == 0
        self.q = cl.clCreateCommandQueue(self.ctx, dev, 0, byref(err))
        self.q2 = cl.clCreateCommandQueue(self.ctx, dev, 0, byref(err))
        assert err.value == 0
        self.mems = []

    def buffer(self, rt, host=None, shape=None, kind="u8"):
        """A cl_mem of the caller's context (filled from host if given), as a DeviceBuffer."""
        nbytes = host.nbytes if host is not None else int(np.prod(shape)) * {"u8": 1, "i32": 4, "bf16": 2}[kind]
        err = c_int32()
        m = self.cl.clCreateBuffer(self.ctx, 1, max(nbytes, 1), None, byref(err))  # CL_MEM_READ_WRITE
        assert err.value == 0
        self.mems.append(m)
        if host is not None:
            a = np.ascontiguousarray(host)
            assert self.cl.clEnqueueWriteBuffer(self.q2, m, 1, 0, a.nbytes, a.ctypes.data, 0, None, None) == 0
        return liboscar.DeviceBuffer.wrap(rt, m, host.shape if host is not None else shape, kind)

    def read(self, buf, dtype):
        out = np.empty(buf.shape, dtype)
        assert self.cl.clEnqueueReadBuffer(self.q2, buf.handle, 1, 0, out.nbytes, out.ctypes.data, 0, None, None) == 0
        return out

    def close(self):
        for m in self.mems:
            self.cl.clReleaseMemObject(m)
        self.cl.clReleaseCommandQueue(self.q)
        self.cl.clReleaseCommandQueue(self.q2)
        self.cl.clReleaseContext(self.ctx)


def test_caller_context_queue_and_buffers(cpu, rng):
    c = Caller()
    try:
        rt = liboscar.Runtime("opencl", native_context=c.ctx, native_queue=c.q)
        lay = layout("int2")
        plan, ref = liboscar.Plan(rt, lay), liboscar.Plan(cpu, lay).cache(1, len(LENS), 300)
        sz, ns = plan.sizes, len(LENS)
        per = lay.pages_for(300)
        n = sum(LENS)
        k, v, q = rows(rng, n, HKV), rows(rng, n, HKV), rows(rng, ns, HQ)
        lens = np.array(LENS, np.int32)
        buf = lambda host: c.buffer(rt, host, kind={np.dtype(np.int32): "i32", np.dtype(np.uint16): "bf16"}[
            host.dtype])  # noqa: E731
        pages = c.buffer(rt, shape=(ns * per * sz.page_bytes,))
        windows = c.buffer(rt, shape=(ns * sz.window_slot_bytes,))
        ws = c.buffer(rt, shape=(plan.workspace_bytes(ns, 300),))
        bt = buf(np.arange(ns * per, dtype=np.int32).reshape(ns, per))
        slots, seq_lens, cu = buf(np.arange(ns, dtype=np.int32)), buf(lens), buf(np.array([0, *np.cumsum(LENS)],
                                                                                            np.int32))
        kb, vb, qb = buf(k), buf(v), buf(q)
        out = c.buffer(rt, shape=q.shape, kind="bf16")
        c.cl.clFinish(c.q2)
        plan.workspace_init(ws, stream=c.q2)
        # the work on the caller's second queue (in order, so each call sees the previous one's results)
        plan.append(0, pages, windows, seq_lens, slots, bt, cu, kb, vb, ws, max_seq_len=max(LENS), stream=c.q2)
        plan.decode(0, pages, windows, seq_lens, slots, bt, qb, out, ws, max_seq_len=max(LENS), stream=c.q2)
        plan.check(ws, stream=c.q2)
        got = c.read(out, np.uint16)
        ref.append(0, k, v, new_tokens=LENS)
        assert rel(got, ref.decode(0, q)) < 8e-3
        # misuse is refused by the binding before any handle reaches the library
        with pytest.raises(TypeError, match="DeviceBuffer of i32, expected bf16"):
            plan.decode(0, pages, windows, seq_lens, slots, bt, seq_lens, out, ws, max_seq_len=max(LENS))
        with pytest.raises(ValueError, match="needs host memory"):
            liboscar.Plan(cpu, lay).decode(0, pages, windows, seq_lens, slots, bt, qb, out, ws)
        plan.close()
        rt.close()
    finally:
        c.close()


def test_library_buffers_round_trip():
    b = _ocl.alloc((3, 5), "i32")
    x = np.arange(15, dtype=np.int32).reshape(3, 5)
    b.write(x)
    np.testing.assert_array_equal(b.read(), x)
    with pytest.raises(ValueError, match="needs 80 bytes"):
        b.view((4, 5))
    b.close()


# Shapes no model zoo entry names: GQA 8 on 5 KV heads, 3 on 7, 24 on 1, 12 on 3;
# every head_dim and page size; lengths around S0 + W and the page boundaries.
@pytest.mark.parametrize("hq,hkv,d,page,method", [(40, 5, 128, 32, "oscar2"), (21, 7, 64, 16, "bf16"),
                                                  (24, 1, 256, 128, "quarot2"), (36, 3, 128, 64, "oscar2")])
def test_unseen_shapes_on_opencl_match_cpu(cpu, rng, hq, hkv, d, page, method):
    lay = liboscar.Layout(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, group=min(d, 128), sink=S0, recent=W,
                          page_size=page, max_seq_len=1024, method=method)
    prm = liboscar.Params.builtin(method, 1, hq, hkv, d)
    lens = [1, S0 + W - 1, S0 + W, S0 + W + page + 1, 3 * page + 5]
    caches = [liboscar.Plan(rt, lay, prm).cache(1, len(lens), 600) for rt in (_ocl, cpu)]

    def r(n, h):
        return liboscar.to_bf16(rng.standard_normal((n, h, d)).astype(np.float32))

    k, v = r(sum(lens), hkv), r(sum(lens), hkv)
    for c in caches:
        c.append(0, k, v, new_tokens=lens)
    k1, v1, q = r(len(lens), hkv), r(len(lens), hkv), r(len(lens), hq)
    outs = []
    for c in caches:
        c.append(0, k1, v1)
        outs.append(c.decode(0, q))
    caches[0].check()
    worst = rel(*outs)
    assert worst < 8e-3, f"{hq}/{hkv}/{d} page {page} {method}: OpenCL differs from the CPU backend by {worst:.2e}"


def test_extend_prepares_its_workspace_on_the_calls_queue(cpu, rng, monkeypatch):
    """PagedCache.extend zeroes a newly grown workspace's error word (oscar_plan_workspace_init) and
    then runs on the call's stream; the init went to the runtime's default queue instead, unordered
    with the caller's queue that the extend (and the caller's own work) ran on. Every init of an
    extend now names the call's queue, as its append, extend and reads do."""
    from liboscar import core

    c = Caller()
    try:
        rt = liboscar.Runtime("opencl", native_context=c.ctx, native_queue=c.q)
        cache = liboscar.Plan(rt, layout("int2")).cache(1, len(LENS), 300)
        ref = liboscar.Plan(cpu, layout("int2")).cache(1, len(LENS), 300)
        k, v = rows(rng, sum(LENS), HKV), rows(rng, sum(LENS), HKV)
        cache.append(0, k, v, new_tokens=LENS, stream=c.q2)
        ref.append(0, k, v, new_tokens=LENS)
        calls = [([1, 1], rows(rng, 2, HQ)), ([40, 30], rows(rng, 70, HQ))]  # the second grows the workspace
        want = [ref.extend(0, q, chunks) for chunks, q in calls]
        streams = []
        real = core.lib.oscar_plan_workspace_init
        monkeypatch.setattr(core.lib, "oscar_plan_workspace_init",
                            lambda plan, ws, stream: (streams.append(stream), real(plan, ws, stream))[1])
        for (chunks, q), w in zip(calls, want):
            assert rel(cache.extend(0, q, chunks, stream=c.q2), w) < 8e-3
        assert streams == [c.q2, c.q2]  # a workspace for the first extend, a larger one for the second
        cache.check(stream=c.q2)
        cache.plan.close()
        rt.close()
    finally:
        c.close()
