"""Shared helpers: NumPy references of what the library computes
(docs/FORMAT.md), written from the format document, not from the C code."""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

import liboscar

REPO = Path(__file__).resolve().parents[2]


def torch_devices() -> list:
    """"cpu", and "cuda" where torch sees a GPU and the CUDA plugin loads:
    the devices the transformers tests run OscarCache on."""
    try:
        import torch
    except ImportError:
        return ["cpu"]
    if not torch.cuda.is_available():
        return ["cpu"]
    try:
        liboscar.Runtime("cuda")
    except liboscar.OscarError:
        return ["cpu"]
    return ["cpu", "cuda"]


def cache_kw(model, cache) -> dict:
    """The keyword argument that hands a cache to a transformers model's
    forward and generate: ``cache`` since transformers 5.24, where
    ``past_key_values`` is deprecated (a FutureWarning on every call),
    ``past_key_values`` before it."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def pytest_report_header(config):
    return f"liboscar {liboscar.version()} from {Path(liboscar.__file__).parent}"


@pytest.fixture
def rng(request):
    # A fresh seed per run (printed on failure), as the C tests do.
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def cpu():
    return liboscar.Runtime("cpu")


def bf16_exact(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16, as float32."""
    return liboscar.from_bf16(liboscar.to_bf16(np.asarray(x, np.float32)))


def ref_int2(x: np.ndarray, group: int) -> np.ndarray:
    """FORMAT.md §2.2-2.3, uniform levels, no clip, F16 metadata, nearest
    rounding, on rows [..., d] that are already bf16-exact (float32 math)."""
    x = np.asarray(x, np.float32)
    d = x.shape[-1]
    g = x.reshape(-1, d // group, group)
    mn, mx = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    a = ((mx - mn) / np.float32(3)).astype(np.float32).astype(np.float16).astype(np.float32)
    b = mn.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = ((g - b) / a).astype(np.float32)
        code = np.clip(np.floor(t + np.float32(0.5)), 0, 3)
    code = np.where(a == 0, 0, code).astype(np.float32)
    return (b + a * code).astype(np.float32).reshape(x.shape)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, kq: np.ndarray, vq: np.ndarray, sink: int,
                  recent: int) -> np.ndarray:
    """float64 decode attention of the last position's query q [Hq, d] over
    one sequence (FORMAT.md §3.1, §5): positions < sink or >= L - recent read
    the 16-bit rows k, v [L, H, d], the others the dequantized kq, vq."""
    L, H, d = k.shape
    hq = q.shape[0]
    pos = np.arange(L)
    quant = (pos >= sink) & (pos < L - recent)
    kk = np.where(quant[:, None, None], kq, k).astype(np.float64)
    vv = np.where(quant[:, None, None], vq, v).astype(np.float64)
    out = np.empty((hq, d))
    for h in range(hq):
        g = h // (hq // H)
        s = kk[:, g, :] @ q[h].astype(np.float64) / np.sqrt(d)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ vv[:, g, :]
    return out
