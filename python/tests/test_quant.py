"""oscar_fakequant (the cache's write path on host rows) against a NumPy
implementation of docs/FORMAT.md §2."""
import numpy as np
import pytest

import liboscar
from conftest import bf16_exact, ref_int2


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int2_matches_numpy_reference(rng, group):
    x = bf16_exact(rng.standard_normal((300, 2, 128)).astype(np.float32) * (1 + 4 * rng.random((1, 1, 128))))
    got = liboscar.fakequant(x, "int2", group=group)
    want = ref_int2(x, group)
    np.testing.assert_array_equal(got, want)
    # The reference is not trivially the input: 2 bits lose a lot.
    assert np.abs(got - x).mean() > 0.05


def test_quarot2_is_hadamard_then_int2(rng):
    p = liboscar.Params.builtin("quarot2", 1, 4, 2, 64)
    H = p.rotation(0, "k")
    x = bf16_exact(rng.standard_normal((50, 2, 64)).astype(np.float32))
    got = liboscar.fakequant(x, "quarot2", p)
    # Stored row: bf16(x H), quantized; read back as x^ H^T (FORMAT.md §1-2).
    xr = bf16_exact(np.einsum("thd,de->the", x, H).astype(np.float32))
    want = np.einsum("the,de->thd", ref_int2(xr, 64), H)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_fakequant_errors():
    with pytest.raises(ValueError, match="shape"):
        liboscar.fakequant(np.zeros((4, 128), np.float32), "int2")
    with pytest.raises(liboscar.OscarError, match="head_dim 100 unsupported"):
        liboscar.fakequant(np.zeros((4, 1, 100), np.float32), "int2")
    # head_dim 96 is a shape of the format (group 0: the whole row, 96 values)
    x = np.linspace(-1, 1, 4 * 96, dtype=np.float32).reshape(4, 1, 96)
    assert np.abs(liboscar.fakequant(x, "int2") - x).max() <= 2 / 3 / 2 + 1e-3
