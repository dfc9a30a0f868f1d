"""ctypes declarations of include/oscar/oscar.h (the C ABI; no C extension).

The structs mirror the header field by field; ``check_abi`` compares their
sizes with the ``struct_size`` the library's ``*_default`` functions write, so
a header change that is not mirrored here fails at import, not in a call.
"""
from __future__ import annotations

import ctypes
import operator
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint32, c_void_p)
from pathlib import Path
from typing import Optional

c_int32_p = POINTER(c_int32)
c_float_p = POINTER(c_float)
c_double_p = POINTER(c_double)

# ctypes stores a Python int into a C integer modulo 2^bits, silently: 2**32 + 8
# heads would reach the library as 8. Every integer that goes in is checked
# against its C type's range first (struct fields by name, arguments by position).
_INT_RANGES = {t: ((-(1 << (8 * ctypes.sizeof(t) - 1)), (1 << (8 * ctypes.sizeof(t) - 1)) - 1)
                   if t(-1).value < 0 else (0, (1 << (8 * ctypes.sizeof(t))) - 1))
               for t in (c_int, c_int32, c_int64, c_uint32, c_size_t)}
_INT_NAMES = {c_int: "int", c_int32: "int32_t", c_int64: "int64_t", c_uint32: "uint32_t", c_size_t: "size_t"}


def checked_int(value, ctype, name: str) -> int:
    """value as an int that the C type ctype holds exactly; TypeError for a
    non-integer (a float is not truncated), ValueError outside the range."""
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {value!r} ({type(value).__name__})") from None
    lo, hi = _INT_RANGES[ctype]
    if not lo <= i <= hi:
        raise ValueError(f"{name}: {i} is outside [{lo}, {hi}], the range of the C {_INT_NAMES[ctype]} it is passed as")
    return i


class _Struct(Structure):
    """A ctypes Structure whose integer fields refuse what they cannot hold."""

    def __setattr__(self, name, value):
        t = type(self).__dict__.get("_types_")
        if t is None:
            t = type(self)._types_ = dict(type(self)._fields_)
        if t.get(name) in _INT_RANGES:
            value = checked_int(value, t[name], f"{type(self).__name__}.{name}")
        super().__setattr__(name, value)

    def __init__(self, *args, **kw):
        super().__init__()
        for (name, _), v in zip(self._fields_, args):
            setattr(self, name, v)
        for name, v in kw.items():
            setattr(self, name, v)


def _ranged(ctype):
    """ctype as an argtype that range-checks its argument (ctypes.ArgumentError names its position)."""
    class T(ctype):
        @classmethod
        def from_param(cls, v):
            return cls(checked_int(v, ctype, f"{_INT_NAMES[ctype]} argument"))
    T.__name__ = ctype.__name__
    return T


class LayoutDesc(_Struct):
    _fields_ = [("struct_size", c_uint32), ("head_dim", c_int32), ("group", c_int32), ("num_q_heads", c_int32),
                ("num_kv_heads", c_int32), ("page_size", c_int32), ("sink", c_int32), ("recent", c_int32),
                ("max_seq_len", c_int32), ("kv_dtype", c_int), ("meta_dtype", c_int), ("method", c_int),
                ("wide_tensors", c_int32), ("wide_per_layer", c_int32)]


class LayoutSizes(_Struct):
    _fields_ = [("page_bytes", c_size_t), ("window_slot_bytes", c_size_t), ("k_codes_offset", c_size_t),
                ("v_codes_offset", c_size_t), ("k_meta_offset", c_size_t), ("v_meta_offset", c_size_t),
                ("bits_per_element", c_double)]


class ParamsInfo(_Struct):
    _fields_ = [("num_layers", c_int32), ("num_q_heads", c_int32), ("num_kv_heads", c_int32), ("head_dim", c_int32),
                ("per_head", c_int32), ("method", c_int), ("calib_tokens", c_int32), ("model_hash", c_char * 65)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_int64, c_int64)
LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p)


class CalibOptions(_Struct):
    _fields_ = [("struct_size", c_uint32), ("num_layers", c_int32), ("num_q_heads", c_int32),
                ("num_kv_heads", c_int32), ("head_dim", c_int32), ("group", c_int32), ("per_head", c_int32),
                ("method", c_int), ("clip_k", c_float), ("clip_v", c_float), ("holdout_rows", c_int32),
                ("model_hash", c_char_p), ("progress", c_void_p), ("progress_user", c_void_p), ("sink", c_int32),
                ("recent", c_int32), ("clip_objective", c_int32), ("permutation", c_int32), ("rounding", c_int32),
                ("copy_probes", c_int32), ("copy_mass_loss", c_float), ("clip_per_head", c_int32),
                ("key_attn_weight", c_float), ("threads", c_int32), ("probe_queries", c_int32),
                ("clip_margin", c_float), ("probe_span", c_int32), ("feedback_damp", c_float), ("wide_bits", c_float),
                ("copy_head_mass", c_float), ("copy_head_clip", c_float)]


class CalibLayerReport(_Struct):
    _fields_ = [("err_k", c_double * 3), ("err_v", c_double * 3), ("clip_k", c_float), ("clip_v", c_float)]


class RuntimeOptions(_Struct):
    _fields_ = [("struct_size", c_uint32), ("backend", c_char_p), ("plugin_dir", c_char_p),
                ("device_index", c_int32), ("validate", c_int32), ("log", c_void_p), ("log_user", c_void_p),
                ("native_context", c_void_p), ("native_queue", c_void_p)]


class Cache(_Struct):
    _fields_ = [("pages", c_void_p), ("num_pages", c_int32), ("windows", c_void_p), ("num_window_slots", c_int32)]


class Batch(_Struct):
    _fields_ = [("num_seqs", c_int32), ("seq_lens", c_void_p), ("window_slots", c_void_p),
                ("block_table", c_void_p), ("block_table_stride", c_int32), ("max_seq_len", c_int32)]


class AttnArgs(_Struct):
    """oscar_attn_args (include/oscar/oscar.h); fill with oscar_attn_args_default."""
    _fields_ = [("struct_size", c_uint32), ("cu_q", c_void_p), ("total_q", c_int32), ("max_q_len", c_int32),
                ("q", c_void_p), ("q_stride", c_int64), ("out", c_void_p), ("out_stride", c_int64),
                ("out_bytes", c_size_t), ("lse", c_void_p), ("lse_bytes", c_size_t), ("sm_scale", c_float),
                ("rotated_output", c_int32), ("workspace", c_void_p), ("workspace_bytes", c_size_t),
                ("stream", c_void_p)]


def _candidates(name: str) -> list[Path]:
    """Where liboscar is looked for: $OSCAR_LIBRARY_DIR (e.g. a CMake build's
    lib/), then the copy bundled in this package by `pip install`."""
    dirs = []
    env = os.environ.get("OSCAR_LIBRARY_DIR")
    if env:
        dirs.append(Path(env))
    dirs.append(Path(__file__).resolve().parent / "_lib")
    return [d / name for d in dirs]


def _load(name: str) -> ctypes.CDLL:
    tried = []
    for path in _candidates(name):
        if not path.exists():
            tried.append(str(path))
            continue
        # dlopen reads the file: on a FIFO `import liboscar` waited for a writer forever, and a folder
        # or a file that is no library gave a bare OSError. Either is named, with the variable to fix.
        if not path.is_file():
            raise ImportError(f"liboscar: {path} is not a regular file (a folder, FIFO or device); set "
                              f"OSCAR_LIBRARY_DIR to a CMake build's lib folder, or unset it for the bundled copy")
        try:
            return ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"liboscar: {path} cannot be loaded ({e}); set OSCAR_LIBRARY_DIR to a CMake build's "
                              f"lib folder, or unset it for the bundled copy") from e
    raise ImportError(f"liboscar: {name} not found (looked in {', '.join(tried)}); install the package with "
                      f"`pip install ./python` or set OSCAR_LIBRARY_DIR to a CMake build's lib folder")


lib = _load("liboscar.so.0")
_calib: Optional[ctypes.CDLL] = None


_CHECKED = {t: _ranged(t) for t in _INT_RANGES}


def _sig(dll: ctypes.CDLL, name: str, restype, *argtypes) -> None:
    f = getattr(dll, name)
    f.restype = restype
    f.argtypes = [_CHECKED.get(a, a) for a in argtypes]


def _declare_core(L: ctypes.CDLL) -> None:
    S = c_int  # oscar_status
    _sig(L, "oscar_version", c_char_p, POINTER(c_int), POINTER(c_int), POINTER(c_int))
    _sig(L, "oscar_status_string", c_char_p, c_int)
    _sig(L, "oscar_last_error", c_char_p)
    _sig(L, "oscar_method_name", c_char_p, c_int)
    _sig(L, "oscar_method_from_name", S, c_char_p, POINTER(c_int))
    _sig(L, "oscar_layout_default", None, c_void_p)
    _sig(L, "oscar_layout_validate", S, POINTER(LayoutDesc))
    _sig(L, "oscar_layout_sizes_get", S, POINTER(LayoutDesc), POINTER(LayoutSizes))
    _sig(L, "oscar_layout_pages_for", S, POINTER(LayoutDesc), c_int64, POINTER(c_int64))
    _sig(L, "oscar_layout_default_group", c_int32, c_int32)
    _sig(L, "oscar_layout_bits_per_element", S, POINTER(LayoutDesc), c_int64, POINTER(c_double))
    _sig(L, "oscar_params_create_builtin", S, c_int, c_int, c_int, c_int, c_int, POINTER(c_void_p))
    _sig(L, "oscar_params_load", S, c_char_p, POINTER(c_void_p))
    _sig(L, "oscar_params_save", S, c_void_p, c_char_p)
    _sig(L, "oscar_params_destroy", None, c_void_p)
    _sig(L, "oscar_params_get_info", S, c_void_p, POINTER(ParamsInfo))
    _sig(L, "oscar_params_rotation", S, c_void_p, c_int, c_int, c_int, POINTER(c_float_p))
    _sig(L, "oscar_params_orthogonality_error", S, c_void_p, c_int, c_int, c_int, POINTER(c_double))
    _sig(L, "oscar_params_eigenvalues", S, c_void_p, c_int, c_int, c_int, POINTER(c_double_p))
    _sig(L, "oscar_params_feedback", S, c_void_p, c_int, c_int, c_int, POINTER(c_float_p))
    _sig(L, "oscar_params_clear_feedback", S, c_void_p)
    _sig(L, "oscar_params_set_feedback", S, c_void_p, c_int, c_int, c_int, POINTER(c_float))
    _sig(L, "oscar_params_clip", S, c_void_p, c_int, c_int, POINTER(c_float))
    _sig(L, "oscar_params_set_clip", S, c_void_p, c_int, c_int, c_float)
    _sig(L, "oscar_params_clip_head", S, c_void_p, c_int, c_int, c_int, POINTER(c_float))
    _sig(L, "oscar_params_set_clip_head", S, c_void_p, c_int, c_int, c_int, c_float)
    _sig(L, "oscar_params_code_bits", S, c_void_p, c_int, c_int, c_int, POINTER(c_int))
    _sig(L, "oscar_params_set_code_bits", S, c_void_p, c_int, c_int, c_int, c_int)
    _sig(L, "oscar_params_check_shape", S, c_void_p, c_int, c_int, c_int, c_int, c_char_p)
    _sig(L, "oscar_fakequant", S, c_void_p, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_void_p)
    _sig(L, "oscar_method_bits", c_double, c_int, c_int, c_int, c_int)
    _sig(L, "oscar_runtime_options_default", None, c_void_p)
    _sig(L, "oscar_runtime_create", S, POINTER(RuntimeOptions), POINTER(c_void_p))
    _sig(L, "oscar_runtime_destroy", None, c_void_p)
    _sig(L, "oscar_runtime_backend", c_char_p, c_void_p)
    _sig(L, "oscar_runtime_device", c_char_p, c_void_p)
    _sig(L, "oscar_runtime_report", c_char_p, c_void_p)
    _sig(L, "oscar_synchronize", S, c_void_p, c_void_p)
    _sig(L, "oscar_buffer_alloc", S, c_void_p, c_size_t, POINTER(c_void_p))
    _sig(L, "oscar_buffer_free", None, c_void_p, c_void_p)
    _sig(L, "oscar_buffer_write", S, c_void_p, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p)
    _sig(L, "oscar_buffer_read", S, c_void_p, c_void_p, c_void_p, c_size_t, c_size_t, c_void_p)
    _sig(L, "oscar_plan_create", S, c_void_p, POINTER(LayoutDesc), c_void_p, POINTER(c_void_p))
    _sig(L, "oscar_plan_destroy", None, c_void_p)
    _sig(L, "oscar_plan_variant", c_char_p, c_void_p)
    _sig(L, "oscar_plan_layer_sizes", S, c_void_p, c_int, POINTER(LayoutSizes))
    _sig(L, "oscar_plan_workspace_bytes", S, c_void_p, c_int, c_int, POINTER(c_size_t))
    _sig(L, "oscar_plan_workspace_init", S, c_void_p, c_void_p, c_void_p)
    _sig(L, "oscar_plan_check", S, c_void_p, c_void_p, c_void_p)
    _sig(L, "oscar_append", S, c_void_p, c_int, POINTER(Cache), POINTER(Batch), c_void_p, c_int32, c_void_p,
         c_void_p, c_int64, c_void_p, c_size_t, c_void_p)
    _sig(L, "oscar_decode", S, c_void_p, c_int, POINTER(Cache), POINTER(Batch), c_void_p, c_int64, c_void_p, c_int64,
         c_float, c_int, c_void_p, c_size_t, c_void_p)
    _sig(L, "oscar_attn_args_default", None, POINTER(AttnArgs))
    _sig(L, "oscar_extend", S, c_void_p, c_int, POINTER(Cache), POINTER(Batch), POINTER(AttnArgs))


def _declare_calib(C: ctypes.CDLL) -> None:
    S = c_int
    _sig(C, "oscar_calib_options_default", None, c_void_p, c_int, c_int, c_int, c_int)
    _sig(C, "oscar_calib_create", S, POINTER(CalibOptions), POINTER(c_void_p))
    _sig(C, "oscar_calib_destroy", None, c_void_p)
    _sig(C, "oscar_calib_begin_pass", S, c_void_p, c_int)
    _sig(C, "oscar_calib_feed", S, c_void_p, c_int, c_int, c_void_p, c_void_p, c_void_p, c_int)
    _sig(C, "oscar_calib_set_value_metric", S, c_void_p, c_int, c_int, c_void_p)
    _sig(C, "oscar_calib_target", S, c_void_p, c_int, c_int, c_int, c_void_p)
    _sig(C, "oscar_calib_finalize", S, c_void_p, POINTER(c_void_p))
    _sig(C, "oscar_calib_layer_report_get", S, c_void_p, c_int, POINTER(CalibLayerReport))


def defaults(cls, fill, *args):
    """A struct filled by the library's ``*_default`` function ``fill``.
    The library writes its own sizeof, so it fills a generous scratch buffer
    (no overflow if the header grew) and the sizes must agree exactly: a
    header change not mirrored in this file raises here instead of passing
    a misread struct."""
    buf = ctypes.create_string_buffer(ctypes.sizeof(cls) + 4096)
    fill(buf, *args)
    size = int.from_bytes(buf.raw[:4], "little")
    if size != ctypes.sizeof(cls):
        raise ImportError(f"liboscar: {cls.__name__} is {size} bytes in the library but {ctypes.sizeof(cls)} in "
                          f"liboscar/_capi.py; the binding and the library differ: mirror the header's new fields "
                          f"there (or rebuild the package)")
    return cls.from_buffer_copy(buf.raw[:ctypes.sizeof(cls)])


def calib() -> ctypes.CDLL:
    """liboscar_calib, loaded on first use (serving needs only liboscar)."""
    global _calib
    if _calib is None:
        try:
            dll = _load("liboscar_calib.so.0")
        except ImportError as e:
            raise ImportError(f"{e}. The calibration library is built only where LAPACK, LAPACKE and cblas.h are "
                              f"installed (Debian: liblapacke-dev libopenblas-dev); serving works without it") from e
        _declare_calib(dll)
        defaults(CalibOptions, dll.oscar_calib_options_default, 1, 1, 1, 128)
        _calib = dll
    return _calib


def have_calib() -> bool:
    """Whether liboscar_calib is there (it needs LAPACK at build time)."""
    try:
        calib()
        return True
    except ImportError:
        return False


def check_abi() -> None:
    defaults(LayoutDesc, lib.oscar_layout_default)
    defaults(RuntimeOptions, lib.oscar_runtime_options_default)


_declare_core(lib)
check_abi()
