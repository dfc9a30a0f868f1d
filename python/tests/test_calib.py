"""Calibration from Python (liboscar_calib) against NumPy: the key target
C_K (docs: mean over KV heads of E[q q^T] over tokens and the query heads
that read the head), its eigen-decomposition, and a parameter file that
loads back."""
import os

import numpy as np
import pytest

import liboscar
from liboscar import _capi

if not _capi.have_calib() and os.environ.get("OSCAR_REQUIRE_CALIB") != "1":
    pytest.skip("liboscar_calib not built here (no LAPACK/LAPACKE/cblas.h)", allow_module_level=True)

L, HQ, HKV, D, N = 2, 4, 2, 64, 600


def synthetic(rng):
    # Anisotropic queries with a few outlier channels, so C_K is far from identity.
    mix = rng.standard_normal((D, D)) * (1 + 5 * (rng.random(D) < 0.1))
    q = (rng.standard_normal((N, HQ, D)) @ mix / np.sqrt(D)).astype(np.float32)
    k = rng.standard_normal((N, HKV, D)).astype(np.float32)
    v = rng.standard_normal((N, HKV, D)).astype(np.float32)
    return q, k, v


@pytest.mark.parametrize("per_head", [1, 0])
def test_key_target_rotation_and_file(rng, tmp_path, per_head):
    # key_attn_weight=0: the published C_K = E[q q^T] checked below (the default weighs the queries by
    # their attention on the 2-bit region: tests/test_calib.c key_attn_target_matches_brute_force)
    c = liboscar.Calibrator(L, HQ, HKV, D, clip_k=0.96, clip_v=0.92, rounding=0, per_head=per_head,
                            key_attn_weight=0)
    data = [synthetic(rng) for _ in range(L)]
    for p in (0, 1):
        c.begin_pass(p)
        for layer, (q, k, v) in enumerate(data):
            c.feed(layer, q, k, v)
    q = data[1][0].astype(np.float64)
    g = HQ // HKV
    # per head (the default): E[q q^T] over tokens and the g query heads reading the head;
    # per layer: the mean of those over the KV heads
    cks = [np.einsum("thi,thj->ij", q[:, h * g:(h + 1) * g], q[:, h * g:(h + 1) * g]) / (N * g) for h in range(HKV)]
    heads = range(HKV) if per_head else [0]
    for h in heads:
        ck = cks[h] if per_head else sum(cks) / HKV
        got = c.target(1, "k", kv_head=h)
        np.testing.assert_allclose(got, ck, rtol=1e-9, atol=1e-12 * np.abs(ck).max())
    prm = c.finalize()
    for h in heads:
        ck = cks[h] if per_head else sum(cks) / HKV
        lam = prm.eigenvalues(1, "k", kv_head=h)
        np.testing.assert_allclose(lam, np.sort(np.linalg.eigvalsh(ck))[::-1], rtol=1e-7, atol=1e-9 * lam[0])
        R = prm.rotation(1, "k", kv_head=h).astype(np.float64)
        np.testing.assert_allclose(R @ R.T, np.eye(D), atol=1e-5)
    assert prm.clip(0, "k") == pytest.approx(0.96) and prm.clip(0, "v") == pytest.approx(0.92)
    assert prm.feedback(0, "k") is None  # rounding=0: nearest
    rep = c.layer_report(1)
    assert rep["err_k"][2] < rep["err_k"][0], f"OSCAR not better than no rotation: {rep}"
    path = tmp_path / "p.safetensors"
    prm.save(path)
    back = liboscar.Params.load(path)
    assert back.info.calib_tokens == N and back.info.method == "oscar2"
    np.testing.assert_array_equal(back.rotation(1, "k"), prm.rotation(1, "k"))


def test_calibrator_errors(rng):
    with pytest.raises(TypeError, match="unknown option 'clipk'"):
        liboscar.Calibrator(L, HQ, HKV, D, clipk=0.9)
    c = liboscar.Calibrator(L, HQ, HKV, D)
    q, k, v = synthetic(rng)
    with pytest.raises(liboscar.OscarError, match="pass"):
        c.feed(0, q, k, v)  # before begin_pass(0)
    c.begin_pass(0)
    with pytest.raises(ValueError, match=r"k: shape \(600, 2, 32\), expected \(600, 2, 64\)"):
        c.feed(0, q, k[:, :, :32], v)
    with pytest.raises(TypeError, match="q: dtype float64"):
        c.feed(0, q.astype(np.float64), k, v)
    bad = q.copy()
    bad[3, 1, 5] = np.inf
    with pytest.raises(liboscar.OscarError, match="non-finite|NaN|Inf"):
        c.feed(0, bad, k, v)


def test_probe_options_mirrored(rng):
    # probe_queries / clip_margin / probe_span (issue 16): the binding mirrors them and the
    # library checks them (tests/test_calib.c checks what they do)
    c = liboscar.Calibrator(L, HQ, HKV, D, probe_queries=16, clip_margin=0.05, probe_span=1, sink=8, recent=32)
    data = [synthetic(rng) for _ in range(L)]
    for p in (0, 1):
        c.begin_pass(p)
        for layer, (q, k, v) in enumerate(data):
            c.feed(layer, q, k, v)
    c.finalize()
    for bad in (dict(probe_queries=65), dict(clip_margin=2.0), dict(probe_span=3)):
        with pytest.raises(Exception, match=next(iter(bad))):
            liboscar.Calibrator(L, HQ, HKV, D, **bad)


def test_pass1_reads_only_k_and_v(rng):
    """feed(layer, None, k, v) in pass 1 (what liboscar.hf.calibrate does) gives the
    file that feeding q again gives; in pass 0 q is required."""
    data = [synthetic(rng) for _ in range(L)]
    files = []
    for keep_q in (True, False):
        c = liboscar.Calibrator(L, HQ, HKV, D, clip_k=0.96, clip_v=0.92)
        c.begin_pass(0)
        for layer, (q, k, v) in enumerate(data):
            c.feed(layer, q, k, v)
        c.begin_pass(1)
        for layer, (q, k, v) in enumerate(data):
            c.feed(layer, q if keep_q else None, k, v)
        files.append(c.finalize())
    for layer in range(L):
        for which in "kv":
            np.testing.assert_array_equal(files[0].rotation(layer, which, 1), files[1].rotation(layer, which, 1))
            np.testing.assert_array_equal(files[0].feedback(layer, which, 1), files[1].feedback(layer, which, 1))
    c = liboscar.Calibrator(L, HQ, HKV, D)
    c.begin_pass(0)
    with pytest.raises(liboscar.OscarError):
        c.feed(0, None, data[0][1], data[0][2])
    with pytest.raises(TypeError, match="k: dtype float64"):
        c.feed(0, None, data[0][1].astype(np.float64), data[0][2])


def test_code_width_budget_is_the_default(rng):
    """wide_bits defaults to the library's budget (0.05 bits per element, OSCAR_CALIB_WIDE_BITS_AUTO):
    on 5 layers x 2 KV heads x K/V = 20 head-tensors it widens one, wide_bits=0 none, and oscar2-lm
    calibrates with the defaults, 2 bits everywhere (tests/test_calib.c wide_bits_default)."""
    layers = 5
    data = [synthetic(rng) for _ in range(layers)]

    def run(**kw):
        c = liboscar.Calibrator(layers, HQ, HKV, D, **kw)
        for p in (0, 1):
            c.begin_pass(p)
            for layer, (q, k, v) in enumerate(data):
                c.feed(layer, q, k, v)
        prm = c.finalize()
        return sum(prm.code_bits(layer, h, w) == 3 for layer in range(layers) for h in range(HKV) for w in "kv")

    assert run() == 1
    assert run(wide_bits=0) == 0
    assert run(method="oscar2-lm") == 0
    with pytest.raises(liboscar.OscarError, match="wide_bits"):
        liboscar.Calibrator(layers, HQ, HKV, D, method="oscar2-lm", wide_bits=0.05)


def test_feed_of_a_scalar_names_the_shape_it_needs(rng):
    """A 0-d array was made 1-D by np.ascontiguousarray, and the message read "q: shape (1,), expected
    (0, 4, 64)": neither the shape given nor the one needed. Now it names both."""
    c = liboscar.Calibrator(L, HQ, HKV, D)
    c.begin_pass(0)
    q, k, v = synthetic(rng)
    with pytest.raises(ValueError, match=r"q: expected a 3-D array \[tokens, 4, 64\], got a 0-d array"):
        c.feed(0, np.float32(1.0), k, v)
    with pytest.raises(ValueError, match=r"k: expected a 3-D array \[tokens, 2, 64\], got a 0-d array"):
        c.feed(0, q, np.array(1.0, np.float32), v)
    with pytest.raises(ValueError, match=r"v: expected a 3-D array \[tokens, 2, 64\], got a 2-d array"):
        c.feed(0, q, k, v[:, 0])
    c.feed(0, q, k, v)


def test_float_options_that_float32_cannot_hold_are_refused():
    """clip_k=1e-50 became 0 in the options' float32, which means "fit the clip": the fixed clip asked
    for was silently replaced by a fitted one. Positive values that float32 makes 0, subnormal or
    infinite are refused by name, for every float option."""
    for key, bad in (("clip_k", 1e-50), ("clip_v", 1e-40), ("clip_margin", 1e-46), ("feedback_damp", 1e39)):
        with pytest.raises(ValueError, match=f"{key}: .* in float32"):
            liboscar.Calibrator(L, HQ, HKV, D, **{key: bad})
    liboscar.Calibrator(L, HQ, HKV, D, clip_k=0.0, clip_v=0.9, wide_bits=-1)
