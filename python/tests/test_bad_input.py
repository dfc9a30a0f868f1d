"""Hostile arguments through the Python binding: refused with a message
naming the argument, never passed on silently changed (ctypes wraps an int
modulo 2^bits and int() truncates a float)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import liboscar

SMALL = dict(head_dim=64, group=64, num_q_heads=2, num_kv_heads=1, page_size=16, sink=8, recent=16,
             max_seq_len=100, method="int2")


def test_layout_integers_that_do_not_fit_are_refused():
    # 2**32 + 2 heads reached the library as 2 heads, 64.9 as 64: both "valid".
    with pytest.raises(ValueError, match="num_q_heads"):
        liboscar.Layout(**{**SMALL, "num_q_heads": 2**32 + 2}).validate()
    with pytest.raises(ValueError, match="max_seq_len"):
        liboscar.Layout(**{**SMALL, "max_seq_len": 2**32 + 100}).sizes()
    with pytest.raises(TypeError, match="head_dim"):
        liboscar.Layout(**{**SMALL, "head_dim": 64.9}).validate()


def test_call_arguments_that_do_not_fit_are_refused(cpu):
    lay = liboscar.Layout(**SMALL)
    plan = liboscar.Plan(cpu, lay)
    # workspace_bytes(2**32 + 1, ...) was the size for 1 sequence; pages_for(2**64 + 90) that of 90 tokens.
    with pytest.raises(ctypes.ArgumentError, match="outside"):
        plan.workspace_bytes(2**32 + 1, 100)
    with pytest.raises(ctypes.ArgumentError, match="outside"):
        lay.pages_for(2**64 + 90)
    assert lay.pages_for(90) == liboscar.Layout(**SMALL).pages_for(90)
    with pytest.raises(ctypes.ArgumentError, match="outside"):
        liboscar.Params.builtin("int2", 2**32 + 1, 2, 1, 64)
    # Plan.append's layer 2**32 went to layer 0.
    c = plan.cache(1, 1, 64)
    k = np.zeros((1, 1, 64), np.uint16)
    with pytest.raises(ctypes.ArgumentError, match="outside"):
        plan.append(2**32, c.pages[0], c.windows[0], np.ones(1, np.int32), c.window_slots, c.block_table,
                    np.array([0, 1], np.int32), k, k, c.workspace)
    plan.close()


def test_huge_device_buffer_shape_is_not_wrapped(cpu):
    # np.prod in int64 wrapped (2**40)**2 to 0 bytes.
    b = liboscar.DeviceBuffer(cpu, 0, (2**40, 2**40), "u8", owned=False)
    assert b.nbytes == 2**80


def test_misaligned_arrays_are_refused(cpu):
    # A C-contiguous uint16 view at an odd address went to the library, which
    # reads whole 16-bit elements (undefined behaviour in C).
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    c = plan.cache(1, 2, 64)
    raw = np.zeros(2 * 64 * 2 + 1, np.uint8)
    k = raw[1:].view(np.uint16).reshape(2, 1, 64)
    assert k.flags.c_contiguous and not k.flags.aligned
    with pytest.raises(ValueError, match="k: array data is not aligned"):
        c.append(0, k, np.zeros((2, 1, 64), np.uint16))
    c.append(0, np.require(k, requirements="CA"), np.zeros((2, 1, 64), np.uint16))


def test_plan_keeps_the_layout_it_was_made_with(cpu):
    # The plan checked shapes against the caller's Layout object: changed
    # after Plan() (8 -> 1 query heads), a 1-head q passed the check and the
    # library read 8 heads' rows from it and wrote 8 into out (heap overflow).
    lay = liboscar.Layout(**{**SMALL, "num_q_heads": 8})
    plan = liboscar.Plan(cpu, lay)
    c = plan.cache(1, 1, 64)
    z = np.zeros((1, 1, 64), np.uint16)
    c.append(0, z, z)
    lay.num_q_heads = 1
    with pytest.raises(ValueError, match=r"q: shape \(1, 1, 64\), expected \(1, 8, 64\)"):
        c.decode(0, np.zeros((1, 1, 64), np.uint16))
    assert plan.layout.num_q_heads == 8
    assert c.decode(0, np.zeros((1, 8, 64), np.uint16)).shape == (1, 8, 64)


def test_dtype_and_method_given_as_numbers(cpu):
    # kv_dtype=0 (the enum value) made a plan whose append raised KeyError: 0.
    plan = liboscar.Plan(cpu, liboscar.Layout(**{**SMALL, "kv_dtype": 0, "method": 2}))
    assert (plan.layout.kv_dtype, plan.layout.method) == ("bf16", "int2")
    c = plan.cache(1, 1, 64)
    z = np.zeros((1, 1, 64), np.uint16)
    c.append(0, z, z)
    assert c.decode(0, np.zeros((1, 2, 64), np.uint16)).shape == (1, 2, 64)


def test_which_other_than_k_or_v(cpu):
    # which="x" raised a bare KeyError: 'x'.
    p = liboscar.Params.builtin("int2", 1, 2, 1, 64)
    with pytest.raises(ValueError, match="'k' .* or 'v'"):
        p.rotation(0, "x")
    with pytest.raises(ValueError, match="which"):
        liboscar.fakequant(np.zeros((1, 1, 64), np.float32), "int2", which="K")
    assert p.rotation(0, "v").shape == (64, 64)


def test_strings_with_a_nul_byte_are_refused(cpu, tmp_path):
    # The library reads C strings: "a.safetensors\0.bak" saved to (and loaded
    # from) a.safetensors, another file than the one named.
    p = liboscar.Params.builtin("int2", 1, 2, 1, 64)
    target = tmp_path / "a.safetensors"
    with pytest.raises(ValueError, match="NUL"):
        p.save(str(target) + "\0.bak")
    assert not target.exists()
    p.save(target)
    with pytest.raises(ValueError, match="NUL"):
        liboscar.Params.load(str(target) + "\0x")
    assert liboscar.Params.load(target).info.num_layers == 1
    with pytest.raises(ValueError, match="NUL"):
        liboscar.Runtime("cpu\0cuda")
    with pytest.raises(ValueError, match="NUL"):
        liboscar.method_id("int2\0x")


def test_plan_snapshot_keeps_every_layout_field(cpu):
    # The snapshot a Plan keeps (test_plan_keeps_the_layout_it_was_made_with)
    # listed the fields one by one and dropped wide_tensors when that field
    # came: plan.sizes were those of a layout without room for 3-bit rows, so
    # PagedCache made pages smaller than the library writes.
    lay = liboscar.Layout(**{**SMALL, "method": "oscar2", "wide_tensors": 1})
    plan = liboscar.Plan(cpu, lay, liboscar.Params.builtin("oscar2", 1, 2, 1, 64))
    assert plan.layout == lay
    assert plan.sizes == lay.sizes()
    assert plan.sizes.page_bytes > liboscar.Layout(**{**SMALL, "method": "oscar2"}).sizes().page_bytes


def test_cache_layer_out_of_range_names_the_layer(cpu):
    # decode and extend looked the layer up in Python lists first: a layer past
    # the end was a bare IndexError, and -1 read the last layer's lengths.
    lay = liboscar.Layout(num_q_heads=4, num_kv_heads=2, max_seq_len=256, sink=16, recent=32, page_size=16,
                          kv_dtype="f16", method="int2")
    cache = liboscar.Plan(cpu, lay).cache(num_layers=2, num_seqs=1)
    k = np.ones((3, 2, 128), np.float16)
    cache.append(1, k, k, new_tokens=[3])
    q = np.ones((1, 4, 128), np.float16)
    for layer in (-1, 2, 1.0, True):
        for call in (lambda: cache.decode(layer, q), lambda: cache.extend(layer, q, [1]),
                     lambda: cache.append(layer, k, k, new_tokens=[3])):
            with pytest.raises(ValueError, match="layer"):
                call()


def test_cache_layers_that_are_not_integers(cpu):
    # layers= went through int(): [1.7] held layer 1 (the call said nothing), True layer 1, "0" layer 0.
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    for bad in ([1.7], [0.0], [True], ["0"], [None]):
        with pytest.raises(TypeError, match="layers"):
            plan.cache(num_layers=2, num_seqs=1, layers=bad)
    assert plan.cache(num_layers=2, num_seqs=1, layers=[np.int64(1)]).held_layers == {1}


def test_token_counts_and_bounds_that_are_not_integers(cpu):
    # new_tokens / q_tokens went through np.asarray(..., np.int64), which
    # truncates: [0.5, 1.5] became [0, 1], summed to the 1 row given and was
    # appended as counts the caller never meant. max_q_len and max_seq_len
    # went through int() (2.9 -> 2) before the binding's range check.
    lay = liboscar.Layout(num_q_heads=4, num_kv_heads=2, max_seq_len=256, sink=16, recent=32, page_size=16,
                          kv_dtype="f16", method="int2")
    plan = liboscar.Plan(cpu, lay)
    cache = plan.cache(num_layers=1, num_seqs=2)
    k = np.ones((1, 2, 128), np.float16)
    with pytest.raises(TypeError, match="new_tokens: expected integer token counts"):
        cache.append(0, k, k, new_tokens=[0.5, 1.5])
    assert cache.lens[0].tolist() == [0, 0]
    k3 = np.ones((3, 2, 128), np.float16)
    cache.append(0, k3, k3, new_tokens=np.array([1, 2], np.uint8))  # any integer dtype is fine
    q = np.ones((2, 4, 128), np.float16)
    with pytest.raises(TypeError, match="q_tokens: expected integer token counts"):
        cache.extend(0, q, [1.0, 1.0])
    assert cache.extend(0, q, [1, 1]).shape == (2, 4, 128)
    c = cache
    args = (0, c.pages[0], c.windows[0], c.lens[0].copy(), c.window_slots, c.block_table,
            np.array([0, 1, 2], np.int32), q, np.empty_like(q), c.workspace)
    with pytest.raises(TypeError, match="max_q_len"):
        plan.extend(*args, 1.9)
    with pytest.raises(TypeError, match="max_seq_len"):
        plan.decode(0, c.pages[0], c.windows[0], c.lens[0].copy(), c.window_slots, c.block_table, q,
                    np.empty_like(q), c.workspace, max_seq_len=2.5)
    plan.extend(*args, 1)


def test_device_buffer_shape_must_be_non_negative_integers(cpu):
    # alloc((-5,)) allocated 1 byte and returned a buffer of shape (-5,).
    with pytest.raises(ValueError, match="negative"):
        cpu.alloc((-5,), "u8")
    with pytest.raises(TypeError, match="shape"):
        liboscar.DeviceBuffer(cpu, 0, (2.5,), "u8", owned=False)
    with pytest.raises(ValueError, match="kind"):
        cpu.alloc((4,), "i64")


def test_method_bits_of_a_shape_no_cache_stores(cpu):
    # head_dim 96 returned 0.0 bits per element, as if it were a figure.
    with pytest.raises(ValueError, match="head_dim 96"):
        liboscar.method_bits("int2", head_dim=96)
    with pytest.raises(ValueError, match="meta_dtype"):
        liboscar.method_bits("int2", meta_dtype="bf16")
    assert liboscar.method_bits("int2", 128, 64) == 2.5


def test_cache_bounds_and_row_arrays_name_the_argument(cpu):
    # max_seq_len -5 failed inside oscar_layout_pages_for ("negative length"),
    # 2.5 was truncated to 2; a scalar k was a bare IndexError.
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    with pytest.raises(ValueError, match=r"max_seq_len -5 outside \[1, 100\]"):
        plan.cache(1, 1, -5)
    with pytest.raises(TypeError, match="max_seq_len"):
        plan.cache(1, 1, 2.5)
    c = plan.cache(1, 1, 64)
    z = np.zeros((1, 1, 64), np.uint16)
    with pytest.raises(ValueError, match=r"k: expected an array \[tokens, heads, head_dim\], got shape \(\)"):
        c.append(0, np.uint16(0), z)
    with pytest.raises(ValueError, match=r"v: expected an array .* got list"):
        c.append(0, z, z.tolist())
    c.append(0, z, z)
    with pytest.raises(ValueError, match=r"q: expected an array"):
        c.extend(0, np.zeros((2, 64), np.uint16), [1])


def test_read_only_lse_is_refused(cpu):
    # Plan.extend refused read-only pages, windows, workspace and out but not
    # lse: the library wrote into a read-only array (and a read-only memmap
    # was a segmentation fault).
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    c = plan.cache(1, 1, 64)
    c.append(0, np.zeros((4, 1, 64), np.uint16), np.zeros((4, 1, 64), np.uint16), [4])
    ws = np.zeros(plan.workspace_bytes(2, 64), np.uint8)
    plan.workspace_init(ws)
    lse = np.full((2, 2), 7.0, np.float32)
    lse.setflags(write=False)
    with pytest.raises(ValueError, match="lse: array is read-only"):
        plan.extend(0, c.pages[0], c.windows[0], np.array([4], np.int32), c.window_slots, c.block_table,
                    np.array([0, 2], np.int32), np.zeros((2, 2, 64), np.uint16), np.zeros((2, 2, 64), np.uint16), ws,
                    2, lse=lse, max_seq_len=64)
    assert (lse == 7.0).all()


def test_device_buffer_write_of_another_dtype_is_refused(cpu):
    # DeviceBuffer.write copied the host array's bytes whatever its dtype: a block
    # table written from np.array([0, 5, 10]) (int64) became [0, 0, 5] in the i32
    # buffer, two sequences sharing page 0, status OK.
    b = liboscar.DeviceBuffer.alloc(cpu, (3,), "i32")
    with pytest.raises(TypeError, match=r"int64.*i32"):
        b.write(np.array([0, 5, 10], dtype=np.int64))
    with pytest.raises(TypeError, match="to_bf16"):
        liboscar.DeviceBuffer.alloc(cpu, (2,), "bf16").write(np.zeros(2, np.float32))
    b.write(np.array([0, 5, 10], dtype=np.int32))
    np.testing.assert_array_equal(b.read(), [0, 5, 10])
    b.close()


def test_complex_values_are_refused(cpu):
    # NumPy's cast to float drops the imaginary part with only a ComplexWarning:
    # fakequant, to_bf16, set_feedback and set_value_metric used the real parts.
    z = np.zeros((2, 1, 64), np.complex64) + 1j
    with pytest.raises(TypeError, match="rows: complex"):
        liboscar.fakequant(z, "int2")
    with pytest.raises(TypeError, match="x: complex"):
        liboscar.to_bf16(z)
    p = liboscar.Params.builtin("oscar2", 1, 2, 1, 64)
    with pytest.raises(TypeError, match="F: complex"):
        p.set_feedback(0, np.zeros((64, 64), np.complex128))
    c = liboscar.Calibrator(1, 2, 1, 64)
    with pytest.raises(TypeError, match="M: complex"):
        c.set_value_metric(0, 0, np.eye(64) + 0j)


def test_closed_device_buffer_is_refused(cpu):
    # A DeviceBuffer kept its handle after close(): read() and write() copied
    # from and into freed memory, and a Plan call took the freed pointer as its
    # pages or workspace. Now every use of a closed buffer, or of a view of
    # one, is refused by name.
    b = liboscar.DeviceBuffer.alloc(cpu, (4,), "i32")
    b.write(np.arange(4, dtype=np.int32))
    v = b.view((2,))
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.read()
    with pytest.raises(ValueError, match="closed"):
        b.write(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="closed"):
        v.read()
    with pytest.raises(ValueError, match="closed"):
        b.view((1,))
    with pytest.raises(ValueError, match="seq_lens: .*closed"):
        liboscar.core._ptr(b, "i32", (4,), "seq_lens", True)
    b.close()  # twice: a no-op


def test_device_buffer_closes_like_the_other_handles(cpu):
    # DeviceBuffer kept a closed flag of its own beside the _Handle mixin the
    # other objects share: its handle stayed readable after close() (the freed
    # pointer, e.g. for a clEnqueueReadBuffer) and its messages differed from
    # theirs. Now it is a _Handle: a closed buffer, a view of one (however
    # deep), or a buffer of a closed Runtime is refused by name.
    b = liboscar.DeviceBuffer.alloc(cpu, (4,), "i32")
    assert isinstance(b, liboscar.core._Handle)
    v = b.view((2,))
    vv = v.view((1,))
    assert v.handle == vv.handle == b.handle
    b.close()
    assert "closed" in repr(b)
    with pytest.raises(ValueError, match="this DeviceBuffer is closed; create a new one"):
        b.handle
    with pytest.raises(ValueError, match="read: the DeviceBuffer this one views is closed"):
        vv.read()
    with pytest.raises(ValueError, match="view: the DeviceBuffer this one views is closed"):
        v.view((1,))
    with pytest.raises(ValueError, match="DeviceBuffer this one views is closed"):
        vv.handle
    rt = liboscar.Runtime("cpu")
    c = liboscar.DeviceBuffer.alloc(rt, (4,), "f32")
    w = c.view((2,))
    rt.close()
    for call, name in ((c.read, "read"), (w.read, "read"), (lambda: c.view((1,)), "view"),
                       (lambda: c.write(np.zeros(4, np.float32)), "write"),
                       (lambda: liboscar.core._ptr(w, "f32", (2,), "out", True), "out")):
        with pytest.raises(ValueError, match=f"{name}: .*Runtime is closed"):
            call()
    c.close()  # freed by rt.close(): a no-op
    w.close()
    for o in (b, v, vv, c, w):
        o.close()  # twice: a no-op


def test_closing_a_runtime_frees_its_buffers():
    # Runtime.close() left the buffers of alloc() behind: the library cannot free
    # them once its runtime is gone, so they leaked. The runtime frees them first
    # (after its Plans, which may still use them).
    rt = liboscar.Runtime("cpu")
    bufs = [liboscar.DeviceBuffer.alloc(rt, (8,), k) for k in ("f32", "i32", "bf16")]
    view = bufs[0].view((4,))
    plan = liboscar.Plan(rt, liboscar.Layout(**SMALL))
    rt.close()  # waits for the plan
    assert all(b._raw is not None for b in bufs), "freed while a Plan of the runtime was open"
    bufs[1].write(np.arange(8, dtype=np.int32))
    assert (bufs[1].read() == np.arange(8)).all()
    plan.close()  # the runtime goes now, and its buffers with it
    assert all(b._raw is None for b in bufs)
    with pytest.raises(ValueError, match="read: this DeviceBuffer's Runtime is closed"):
        view.read()
    for b in bufs:
        b.close()  # a no-op


def test_closed_objects_are_refused_by_name(cpu):
    # A closed Params, Plan or Calibrator reached the C side as a NULL handle,
    # refused as "NULL argument" without saying which object; a Plan made with
    # closed Params was told that oscar2 "needs calibrated parameters". Now
    # each names itself.
    p = liboscar.Params.builtin("oscar2", 1, 2, 1, 64)
    p.close()
    with pytest.raises(ValueError, match="Params is closed"):
        p.info()
    with pytest.raises(ValueError, match="Params is closed"):
        liboscar.Plan(cpu, liboscar.Layout(**{**SMALL, "method": "oscar2"}), p)
    with pytest.raises(ValueError, match="Params is closed"):
        liboscar.fakequant(np.zeros((2, 1, 64), np.float32), "oscar2", p)
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    c = plan.cache(1, 1, 64)
    plan.close()
    z = np.zeros((1, 1, 64), np.uint16)
    with pytest.raises(ValueError, match="Plan is closed"):
        c.append(0, z, z)
    with pytest.raises(ValueError, match="Plan is closed"):
        plan.workspace_bytes(1, 64)
    cal = liboscar.Calibrator(1, 2, 1, 64)
    cal.close()
    with pytest.raises(ValueError, match="Calibrator is closed"):
        cal.begin_pass(1)
    rt = liboscar.Runtime("cpu")
    rt.close()
    with pytest.raises(ValueError, match="Runtime is closed"):
        rt.synchronize()
    with pytest.raises(ValueError, match="runtime is closed"):
        liboscar.Plan(rt, liboscar.Layout(**SMALL))
    for o in (p, plan, cal, rt):
        o.close()  # twice: a no-op


def test_cache_layer_and_sequence_counts_are_bounded_first(cpu):
    # num_layers went straight into set(range(num_layers)) and a lengths array: 2000 layers (past the
    # library's 1024) were taken, and 10**9 took all host memory until the OOM killer ended the process.
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    for n in (10**9, 2000, 0, -1):
        with pytest.raises(ValueError, match="num_layers"):
            plan.cache(num_layers=n, num_seqs=1)
    for n in (0, -3):
        with pytest.raises(ValueError, match="num_seqs"):
            plan.cache(num_layers=1, num_seqs=n)
    with pytest.raises(ValueError, match="num_seqs"):
        plan.cache(num_layers=1, num_seqs=2**40)
    with pytest.raises(TypeError, match="num_layers"):
        plan.cache(num_layers=1.5, num_seqs=1)
    assert plan.cache(num_layers=2, num_seqs=3).num_layers == 2


def test_workspace_init_and_check_refuse_a_workspace_too_small(cpu):
    # oscar_plan_workspace_init / _check take no size: the binding passed a 1-byte (or 2-D) array
    # and the library wrote its 4-byte error word past the end (heap-buffer-overflow under ASan).
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    need = plan.workspace_bytes(1, 1)
    for ws in (np.zeros(1, np.uint8), np.zeros(0, np.uint8), np.zeros(need - 1, np.uint8)):
        for call in (plan.workspace_init, plan.check):
            with pytest.raises(ValueError, match=f"workspace: {ws.size} bytes.*Plan.workspace_bytes"):
                call(ws)
    with pytest.raises(ValueError, match=r"workspace: shape \(1, 1\)"):
        plan.workspace_init(np.zeros((1, 1), np.uint8))
    ws = np.zeros(need, np.uint8)
    plan.workspace_init(ws)
    plan.check(ws)


def test_set_clip_of_a_string_names_the_argument():
    # set_clip(0, "k", "0.5") raised ctypes.ArgumentError "argument 4: wrong type", naming neither c nor the fix.
    p = liboscar.Params.builtin("oscar2", 2, 2, 1, 64)
    for bad in ("0.5", None, True, [0.5]):
        with pytest.raises(TypeError, match="c: .* is not a number"):
            p.set_clip(0, "k", bad)
    p.set_clip(0, "k", np.float32(0.5))
    assert p.clip(0, "k") == 0.5


def test_window_slots_may_be_none_without_windows(cpu):
    # The C API takes NULL window_slots where the window pool is unused (sink 0, recent 0); the binding
    # refused None with a TypeError. With windows the library refuses NULL by name.
    rng = np.random.default_rng(7)
    lay = liboscar.Layout(**{**SMALL, "sink": 0, "recent": 0})
    plan = liboscar.Plan(cpu, lay)
    n = 20
    k = liboscar.to_bf16(rng.standard_normal((n, 1, 64)).astype(np.float32))
    v = liboscar.to_bf16(rng.standard_normal((n, 1, 64)).astype(np.float32))
    q = liboscar.to_bf16(rng.standard_normal((1, 2, 64)).astype(np.float32))
    outs = []
    for slots in ("given", None):
        c = plan.cache(1, 1, 64)
        ws = c.window_slots if slots == "given" else None
        lens = np.array([n], np.int32)
        plan.append(0, c.pages[0], None, lens, ws, c.block_table, np.array([0, n], np.int32), k, v, c.workspace,
                    max_seq_len=64)
        out = np.zeros((1, 2, 64), np.uint16)
        plan.decode(0, c.pages[0], None, lens, ws, c.block_table, q, out, c.workspace, max_seq_len=64)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1]) and np.abs(liboscar.from_bf16(outs[0])).max() > 0
    wplan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    c = wplan.cache(1, 1, 64)
    with pytest.raises(liboscar.OscarError, match="window_slots"):
        wplan.append(0, c.pages[0], c.windows[0], np.array([n], np.int32), None, c.block_table,
                     np.array([0, n], np.int32), k, v, c.workspace, max_seq_len=64)


def test_decode_out_sharing_memory_with_q_is_refused(cpu, rng):
    # q and out as overlapping views of one array: the CPU decode wrote sequence 0's output over
    # sequence 1's query before reading it, a wrong answer without a word. Now refused, out untouched.
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    ns, n = 3, int(rng.integers(20, 90))
    c = plan.cache(1, ns, 100)
    rows = lambda *s: liboscar.to_bf16(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    c.append(0, rows(ns * n, 1, 64), rows(ns * n, 1, 64), [n] * ns)
    both = rows(ns + 1, 2, 64)
    q, out = both[:ns], both[1:]
    before = both.copy()
    with pytest.raises(liboscar.OscarError, match="out and q overlap"):
        c.decode(0, q, out)
    assert (both == before).all()
    ref = c.decode(0, q.copy())  # buffers of their own: runs
    assert ref.shape == q.shape
    plan.close()


def test_cache_with_more_layers_than_the_parameters_is_refused(cpu):
    """A PagedCache of more layers than its plan's parameters allocated the extra pools, and the
    error came only at the first append to such a layer. Refused at construction, naming both."""
    lay = liboscar.Layout(**{**SMALL, "method": "quarot2"})
    plan = liboscar.Plan(cpu, lay, liboscar.Params.builtin("quarot2", 2, 2, 1, 64))
    with pytest.raises(ValueError, match=r"num_layers 3.*parameters have 2 layers"):
        plan.cache(3, 1, 64)
    with pytest.raises(ValueError, match=r"layer 2.*parameters have 2 layers"):
        plan.cache(3, 1, 64, layers=[0, 2])
    plan.cache(3, 1, 64, layers=[0, 1])  # the extra layer holds no pools: nothing of it reaches the library
    c = plan.cache(2, 1, 64)
    k = np.zeros((1, 1, 64), np.uint16)
    c.append(1, k, k)
    # without parameters (the built-in ones of int2, quarot2, bf16) one layer serves every index
    liboscar.Plan(cpu, liboscar.Layout(**SMALL)).cache(40, 1, 64).append(39, k, k)


def test_bytes_names_and_bool_enums(cpu):
    """Runtime(b"cpu") reported the unknown backend "b'cpu'" (str() of the bytes); method_id(True)
    and dtype_id(True) were method 1 and dtype 1 (bool is an int subclass). Bytes are decoded as
    ASCII; bools are refused."""
    assert liboscar.Runtime(b"cpu").backend == "cpu"
    assert liboscar.method_id(b"int2") == liboscar.method_id("int2")
    with pytest.raises(TypeError, match="backend: bytes .* not ASCII"):
        liboscar.Runtime(b"cp\xffu")
    for f in (liboscar.method_id, liboscar.method_name, liboscar.core.dtype_id):
        with pytest.raises(TypeError, match="bool"):
            f(True)
    with pytest.raises(TypeError, match="bool"):
        liboscar.Layout(**{**SMALL, "method": True}).validate()  # was a plan of oscar2-lm (method 1)
    with pytest.raises(TypeError, match="bool"):
        liboscar.Layout(**{**SMALL, "kv_dtype": True}).validate()
    assert liboscar.method_id(2) == 2 and liboscar.core.dtype_id(1) == 1  # the enum values still pass


def test_scales_that_float32_cannot_hold_are_refused(cpu, rng):
    """sm_scale reaches the library as a float32, where 0 means 1/sqrt(head_dim): 1e-50 became 0 and
    the call silently used the default scale; 1e-40 became a subnormal and 1e39 infinity (refused by
    the library as not finite, a value the caller never gave). Positive values that float32 makes 0,
    subnormal or infinite are refused by name; 0 is still the default."""
    plan = liboscar.Plan(cpu, liboscar.Layout(**SMALL))
    c = plan.cache(1, 2, 64)
    k = liboscar.to_bf16(rng.standard_normal((2, 1, 64)).astype(np.float32))
    c.append(0, k, k)
    q = liboscar.to_bf16(rng.standard_normal((2, 2, 64)).astype(np.float32))
    for bad in (1e-50, 1e-40, 1e39):
        with pytest.raises(ValueError, match=r"sm_scale: .* in float32"):
            c.decode(0, q, sm_scale=bad)
        with pytest.raises(ValueError, match=r"sm_scale: .* in float32"):
            c.extend(0, q, [1, 1], sm_scale=bad)
    assert np.array_equal(c.decode(0, q, sm_scale=0.0), c.decode(0, q, sm_scale=0.125))  # 1/sqrt(64)
    assert np.array_equal(c.decode(0, q, sm_scale=np.float32(0.125)), c.decode(0, q))


def test_a_batch_of_another_size_is_named_as_such(cpu):
    """A cache's sequence count is fixed at construction. Rows of another batch size appended without
    new_tokens (a decode step) were refused with "new_tokens must give 2 non-negative counts ... (got
    [1, 1])", naming an argument the caller never passed (liboscar.hf's OscarCache reused for another
    batch size met that message too). Now the batch size and the fix are named."""
    c = liboscar.Plan(cpu, liboscar.Layout(**SMALL)).cache(1, 2, 64)
    k3, q3 = np.zeros((3, 1, 64), np.uint16), np.zeros((3, 2, 64), np.uint16)
    with pytest.raises(ValueError, match=r"k: 3 rows, but this cache holds 2 sequences.*one row per sequence.*"
                                         r"new cache") as e:
        c.append(0, k3, k3)
    assert "new_tokens must" not in str(e.value)
    with pytest.raises(ValueError, match=r"new_tokens: 3 counts, but this cache holds 2 sequences.*new cache"):
        c.append(0, k3, k3, new_tokens=[1, 1, 1])
    c.append(0, k3, k3, new_tokens=[2, 1])
    with pytest.raises(ValueError, match=r"q_tokens: 3 counts, but this cache holds 2 sequences.*new cache"):
        c.extend(0, q3, [1, 1, 1])
    assert c.extend(0, q3, [2, 1]).shape == q3.shape
