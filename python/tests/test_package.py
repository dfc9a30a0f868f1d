"""The package itself: versions, ABI mirror, library errors, backend choice."""
import ctypes
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

import liboscar
from liboscar import _capi


def test_version_matches_c_library():
    assert liboscar.__version__ == liboscar.version()
    try:
        dist = metadata.version("liboscar")
    except metadata.PackageNotFoundError:
        pytest.skip("running from the source tree (OSCAR_LIBRARY_DIR), not an installed package")
    assert dist == liboscar.version(), "python/pyproject.toml version differs from the C library's"


def test_bundled_libraries_and_plugin_folder():
    lib_dir = Path(_capi.lib._name).parent
    if lib_dir != Path(liboscar.__file__).resolve().parent / "_lib":
        pytest.skip(f"library from OSCAR_LIBRARY_DIR ({lib_dir}), not the bundled one")
    if os.environ.get("OSCAR_REQUIRE_CALIB") == "1":  # CI: LAPACK is there, so must the library be
        assert (lib_dir / "liboscar_calib.so.0").exists()
    # The registry searches <dir of liboscar>/oscar: pip puts the plugins there.
    plugins = sorted(p.name for p in (lib_dir / "oscar").glob("liboscar_backend_*.so"))
    required = [b for b in os.environ.get("OSCAR_REQUIRE_BACKENDS", "").split(",") if b]
    for b in required:  # CI requires opencl (PoCL)
        assert f"liboscar_backend_{b}.so" in plugins, f"{b} plugin not bundled: {plugins}"
    rt = liboscar.Runtime()
    for name in plugins:
        assert f"found:   {lib_dir / 'oscar' / name}" in rt.report or "cannot run here" in rt.report, rt.report


def test_struct_sizes_mirror_the_header():
    for cls, fill, args in ((_capi.LayoutDesc, _capi.lib.oscar_layout_default, ()),
                            (_capi.RuntimeOptions, _capi.lib.oscar_runtime_options_default, ())):
        assert _capi.defaults(cls, fill, *args).struct_size == ctypes.sizeof(cls)
    if _capi.have_calib():
        o = _capi.defaults(_capi.CalibOptions, _capi.calib().oscar_calib_options_default, 1, 8, 2, 128)
        assert o.struct_size == ctypes.sizeof(_capi.CalibOptions)

    # A mirror that lags the header is refused, not misread.
    class Short(ctypes.Structure):
        _fields_ = _capi.LayoutDesc._fields_[:-1]
    with pytest.raises(ImportError, match="mirror the header's new fields"):
        _capi.defaults(Short, _capi.lib.oscar_layout_default)


def test_cpu_request_opens_no_plugin(cpu):
    assert cpu.backend == "cpu"
    for name in ("cuda", "hip", "opencl"):
        assert f"{name:<7} skipped: not opened, backend 'cpu' requested" in cpu.report, cpu.report


def test_library_errors_carry_its_message():
    with pytest.raises(liboscar.OscarError, match="unknown backend 'metal'.*valid: cpu, cuda, hip, opencl") as e:
        liboscar.Runtime("metal")
    assert e.value.status == 14  # OSCAR_ERR_NO_BACKEND
    with pytest.raises(liboscar.OscarError, match="head_dim 100 is not supported; use a multiple of 16 from 32 to 256"):
        liboscar.Layout(head_dim=100).validate()
    # head_dim 96 (Phi-3) is a shape of the format: without a group the layout takes the format's default
    # (oscar_layout_default_group), 96; a group that does not divide it is named with that default
    assert liboscar.Layout(head_dim=96).group == 96 and liboscar.Layout(head_dim=256).group == 128
    with pytest.raises(liboscar.OscarError, match="group 128 is not supported for head_dim 96.*default 96"):
        liboscar.Layout(head_dim=96, group=128).validate()
    liboscar.Layout(head_dim=96).validate()
    assert liboscar.Layout(head_dim=96, group=96).sizes().bits_per_element == pytest.approx(2 + 32 / 96)
    with pytest.raises(liboscar.OscarError, match="int3"):
        liboscar.method_id("int3")
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        liboscar.Layout(kv_dtype="f8").sizes()


def test_bf16_helpers_round_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 65504.0, np.inf], np.float32)
    # 1 + 2^-8 is a tie: stays 1.0 (even); 1 + 3*2^-8 rounds up to 1 + 2^-6.
    np.testing.assert_array_equal(liboscar.from_bf16(liboscar.to_bf16(x)),
                                  np.array([1.0, 1.0, 1.015625, -2.5, 65536.0, np.inf], np.float32))
    assert np.isnan(liboscar.from_bf16(liboscar.to_bf16(np.array([np.nan], np.float32))))[0]


def test_hf_bench_hands_caches_through_cache_kw():
    """perf/hf/bench.py passed ``past_key_values=`` to transformers (a FutureWarning on every call from
    5.24 on, where the keyword is ``cache``): every call hands the cache through its cache_kw, as
    conftest.cache_kw does. A source check: CI has no torch to run the bench."""
    import ast

    from conftest import REPO

    tree = ast.parse((REPO / "perf/hf/bench.py").read_text())
    bad = [f"line {n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
           for k in n.keywords if k.arg in ("past_key_values", "cache")]
    assert not bad, f"perf/hf/bench.py passes the cache by a fixed keyword at {', '.join(bad)}; use **cache_kw(model, cache)"
    assert any(isinstance(n, ast.FunctionDef) and n.name == "cache_kw" for n in tree.body)


@pytest.mark.parametrize("kind", ["fifo", "folder", "not a library"])
def test_library_dir_holding_no_library_is_named(tmp_path, kind):
    """OSCAR_LIBRARY_DIR whose liboscar.so.0 is a FIFO made `import liboscar` wait forever (dlopen
    reads it); a folder or another file gave a bare OSError. Each is an ImportError naming the path."""
    path = tmp_path / "liboscar.so.0"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"not an ELF file")
    env = dict(os.environ, OSCAR_LIBRARY_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", "import liboscar"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=str(tmp_path))
    assert r.returncode != 0
    assert "ImportError" in r.stderr and str(path) in r.stderr and "OSCAR_LIBRARY_DIR" in r.stderr, r.stderr
