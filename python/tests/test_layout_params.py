"""Layouts, sizes and parameter files against the formulas of docs/FORMAT.md."""
import math

import numpy as np
import pytest

import liboscar
from conftest import REPO


@pytest.mark.parametrize("d,group,page,heads,meta", [(128, 128, 64, 8, "f16"), (64, 32, 16, 2, "f32"),
                                                     (256, 64, 128, 4, "f16")])
def test_layout_sizes_follow_the_format(d, group, page, heads, meta):
    L = liboscar.Layout(head_dim=d, group=group, page_size=page, num_kv_heads=heads, num_q_heads=heads * 2,
                        meta_dtype=meta, sink=64, recent=256, method="oscar2")
    s = L.sizes()
    mb = 2 if meta == "f16" else 4
    ng = d // group
    # §3.3: codes K, V then metadata K, V.
    assert s.page_bytes == 2 * heads * page * d // 4 + 2 * heads * page * ng * 2 * mb
    assert s.window_slot_bytes == 2 * heads * (64 + 256) * d * 2
    assert s.bits_per_element == pytest.approx(2 + 2 * mb * 8 / group)
    assert liboscar.method_bits("oscar2", d, group, meta) == pytest.approx(s.bits_per_element)
    for n in (0, 1, 320, 321, 320 + page, 320 + page + 1, 100000):
        assert L.pages_for(n) == math.ceil(max(0, n - 64 - 256) / page)
    # Whole sequence: 16-bit windows plus the 2-bit history.
    n = 10000
    q = n - 320
    assert L.bits_per_element(n) == pytest.approx((320 * 16 + q * s.bits_per_element) / n, rel=1e-9)


def test_layout_errors_name_the_field():
    with pytest.raises(liboscar.OscarError, match="group"):
        liboscar.Layout(head_dim=64, group=128).validate()
    with pytest.raises(liboscar.OscarError, match="num_kv_heads"):
        liboscar.Layout(num_q_heads=6, num_kv_heads=4).validate()


def hadamard(d):
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def test_builtin_params():
    p = liboscar.Params.builtin("quarot2", 2, 8, 2, 128)
    info = p.info
    assert (info.num_layers, info.num_q_heads, info.num_kv_heads, info.head_dim) == (2, 8, 2, 128)
    assert info.method == "quarot2" and not info.per_head
    np.testing.assert_allclose(p.rotation(1, "v"), hadamard(128), atol=1e-7)
    assert p.eigenvalues(0) is None and p.feedback(0) is None
    i = liboscar.Params.builtin("int2", 1, 8, 2, 64)
    np.testing.assert_array_equal(i.rotation(0, "k"), np.eye(64, dtype=np.float32))
    o = liboscar.Params.builtin("oscar2", 1, 8, 2, 128)
    assert (o.clip(0, "k"), o.clip(0, "v")) == (pytest.approx(0.96), pytest.approx(0.92))
    F = np.triu(np.random.default_rng(0).uniform(-0.5, 0.5, (128, 128)), 1).astype(np.float32)
    o.set_feedback(0, F, "v")
    np.testing.assert_array_equal(o.feedback(0, "v"), F)
    assert not o.feedback(0, "k").any(), "the others round to nearest (zero weights)"
    with pytest.raises(liboscar.OscarError, match="diagonal"):
        o.set_feedback(0, F + np.eye(128, dtype=np.float32), "k")
    with pytest.raises(ValueError, match="shape"):
        o.set_feedback(0, F[:64], "k")
    with pytest.raises(liboscar.OscarError, match="oscar2"):
        p.set_feedback(0, F)


def test_calibrated_file_and_round_trip(tmp_path):
    p = liboscar.Params.load(REPO / "docs/eval/tiny-qwen3.oscar.safetensors")
    info = p.info
    assert (info.num_layers, info.num_q_heads, info.num_kv_heads, info.head_dim) == (8, 8, 2, 128)
    assert info.method == "oscar2" and info.calib_tokens == 65536
    p.check_shape(8, 8, 2, 128)
    with pytest.raises(liboscar.OscarError, match="SHAPE|shape") as e:
        p.check_shape(36, 32, 8, 128)
    assert "36" in str(e.value)
    for layer in (0, 7):
        for which in "kv":
            R = p.rotation(layer, which).astype(np.float64)
            np.testing.assert_allclose(R @ R.T, np.eye(128), atol=1e-5)
            assert p.orthogonality_error(layer, which) < 1e-5
            lam = p.eigenvalues(layer, which)
            assert np.all(np.diff(lam) <= 0), "eigenvalues must come largest first"
            F = p.feedback(layer, which)
            assert F is not None and np.all(np.tril(F) == 0) and np.abs(F).max() > 0
    p.set_clip(3, "k", 0.9)
    p.set_clip(4, "v", 0.85, kv_head=1)  # one KV head's ratio (format_version 3)
    out = tmp_path / "p.safetensors"
    p.save(out)
    q = liboscar.Params.load(out)
    assert q.clip(3, "k") == pytest.approx(0.9)
    assert q.clip(3, "k", kv_head=1) == pytest.approx(0.9)
    assert q.clip(4, "v", kv_head=1) == pytest.approx(0.85)
    assert q.clip(4, "v", kv_head=0) == pytest.approx(p.clip(4, "v", kv_head=0))
    with pytest.raises(liboscar.OscarError, match="kv_head"):
        q.set_clip(0, "k", 0.9, kv_head=99)
    np.testing.assert_array_equal(q.rotation(5, "v"), p.rotation(5, "v"))
    np.testing.assert_array_equal(q.feedback(2, "k"), p.feedback(2, "k"))
    p.clear_feedback()
    assert p.feedback(0, "k") is None


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(liboscar.OscarError, match="nonexistent"):
        liboscar.Params.load(tmp_path / "nonexistent.safetensors")
    bad = tmp_path / "bad.safetensors"
    good = (REPO / "docs/eval/tiny-qwen3.oscar.safetensors").read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(liboscar.OscarError) as e:
        liboscar.Params.load(bad)
    assert e.value.status == 12  # OSCAR_ERR_CORRUPT_FILE
