"""Python face of the liboscar C API (see docs/API.md for the C walk-through).

Memory: on the CPU backend every buffer is host memory, given as NumPy
arrays (or CPU torch tensors); on CUDA/HIP it is device memory, given as
torch tensors on the GPU, and calls run on ``torch.cuda.current_stream()``
unless a stream is passed. Arrays are checked for dtype, shape, contiguity
and device before any pointer reaches the library; the library's own
errors come back as :class:`OscarError` with its message.

16-bit K/V: ``kv_dtype="bf16"`` takes ``torch.bfloat16`` tensors, or NumPy
``uint16`` arrays holding bfloat16 bits (NumPy has no bfloat16; see
:func:`to_bf16` / :func:`from_bf16`); ``kv_dtype="f16"`` takes float16.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import math
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _capi
from ._capi import lib

try:  # torch is optional: NumPy on the CPU backend needs none of it
    import torch  # type: ignore
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None  # type: ignore

ArrayLike = Any  # numpy.ndarray or torch.Tensor

DTYPES = {"bf16": 0, "f16": 1, "f32": 2}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
_KV_IDS = {"k": 0, "v": 1}
_MAX_LAYERS = 1024  # the library's bound on a model's layers (runtime/params.c OSCAR_MAX_LAYERS)


def _kv(which: str) -> int:
    """"k" or "v" to oscar_kv; a ValueError naming both otherwise."""
    if which not in _KV_IDS:
        raise ValueError(f"which: {which!r}; use 'k' (keys) or 'v' (values)")
    return _KV_IDS[which]


class OscarError(RuntimeError):
    """A liboscar call failed. ``status`` is the oscar_status code,
    ``status_name`` its short description; the message is the library's
    (it names the problem and the fix)."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.status_name = lib.oscar_status_string(status).decode()
        super().__init__(f"{message} [{self.status_name}]")


def _check(status: int, where: str = "") -> None:
    if status != 0:
        msg = lib.oscar_last_error().decode(errors="replace") or where
        raise OscarError(status, msg)


def _cstr(value: Any, name: str, path: bool = False) -> bytes:
    """A C string for the library; a NUL inside would end it early, so the
    library would act on a shorter name (load or write another file). Bytes
    (not paths, which os.fsencode takes as they are) are decoded as ASCII:
    str() made b"cpu" the name "b'cpu'"."""
    if not path and isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise TypeError(f"{name}: bytes {bytes(value)!r} are not ASCII; pass a str") from None
    b = os.fsencode(value) if path else str(value).encode()
    if b"\0" in b:
        raise ValueError(f"{name}: {value!r} holds a NUL byte; C strings end there")
    return b


def version() -> str:
    """The C library's version, "MAJOR.MINOR.PATCH"."""
    return lib.oscar_version(None, None, None).decode()


def method_id(method: Union[str, int]) -> int:
    """Method name ("oscar2", "int2", ...) to its enum value; the library's
    message lists the valid names."""
    if isinstance(method, bool):  # an int subclass: True was method 1 (oscar2-lm)
        raise TypeError(f"method: a bool ({method!r}); pass a method name ('oscar2', 'int2', ...) or its enum value")
    if isinstance(method, int):
        return method
    out = ctypes.c_int()
    _check(lib.oscar_method_from_name(_cstr(method, "method"), ctypes.byref(out)))
    return out.value


def method_name(method: Union[str, int]) -> str:
    return lib.oscar_method_name(method_id(method)).decode()


def dtype_id(dtype: Union[str, int]) -> int:
    if isinstance(dtype, bool):  # an int subclass: True was dtype 1 (f16)
        raise TypeError(f"dtype: a bool ({dtype!r}); pass one of {', '.join(DTYPES)} or its enum value")
    if isinstance(dtype, int):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def method_bits(method: Union[str, int], head_dim: int = 128, group: int = 128, meta_dtype: str = "f16") -> float:
    """Bits per stored element of a method's quantized region (metadata counted)."""
    bits = float(lib.oscar_method_bits(method_id(method), head_dim, group, dtype_id(meta_dtype)))
    if bits == 0.0:  # the library's answer for a shape no cache stores
        raise ValueError(f"method_bits: {method_name(method)} has no storage at head_dim {head_dim}, group {group}, "
                         f"meta_dtype {meta_dtype!r} (head_dim a multiple of 16 from 32 to 256; group a multiple of 16, "
                         f"at least 32, dividing it, or 0; "
                         f"meta_dtype 'f16' or 'f32')")
    return bits


def _real(x: Any, dtype, name: str, copy: bool = False) -> np.ndarray:
    """x as a C-contiguous array of dtype; complex values are refused (NumPy's
    cast keeps the real parts with only a warning)."""
    a = np.asarray(x)
    if np.iscomplexobj(a):
        raise TypeError(f"{name}: complex values ({a.dtype}); pass real numbers")
    # np.asarray, not np.ascontiguousarray: that one makes a 0-d array 1-D (a scalar came back as shape (1,))
    return np.array(a, dtype=dtype, order="C", copy=True) if copy else np.asarray(a, dtype=dtype, order="C")


_F32_TINY = float(np.finfo(np.float32).tiny)  # the least normal float32, 1.18e-38


def _f32(value: Any, name: str, zero: str = "") -> float:
    """A float option the library takes as float32, as ctypes passes it; a positive value that float32
    makes 0 (for sm_scale and the clips: "use the default"), subnormal or infinite is refused, as its
    meaning would change silently. Zero, negative and non-finite values are the library's to judge."""
    x = float(value)
    if x > 0 and math.isfinite(x):
        f = ctypes.c_float(x).value
        if f == 0 or f < _F32_TINY or math.isinf(f):
            got = "0" if f == 0 else "inf" if math.isinf(f) else f"the subnormal {f:.3g}"
            raise ValueError(f"{name}: {value!r} becomes {got} in float32, the library's type{zero}; pass a value "
                             f"from {_F32_TINY:.3g} to {float(np.finfo(np.float32).max):.3g}, or 0")
    return x


# ------------------------------------------------------------------ bf16 bits
def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even, as the library."""
    u = _real(x, np.float32, "x").view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(b, dtype=np.uint16, order="C").astype(np.uint32) << 16).view(np.float32)


# ------------------------------------------------------------- array checks
def _is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


_NP_KV = {0: np.uint16, 1: np.float16, 2: np.float32}


_NP_KINDS = {k: np.dtype(t) for k, t in
             {"bf16": np.uint16, "f16": np.float16, "f32": np.float32, "i32": np.int32, "u8": np.uint8}.items()}
_TORCH_KINDS = ({"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "i32": torch.int32,
                 "u8": torch.uint8} if torch is not None else {})


def _ptr(x: ArrayLike, kind: str, shape: Optional[Sequence[Optional[int]]], name: str,
         device: Union[bool, "Runtime"]) -> int:
    """Checks one buffer and returns its address. kind: bf16/f16/f32/i32/u8;
    shape entries None are free; device: the backend wants GPU memory, or the
    Runtime of the call (a DeviceBuffer must then be of its backend)."""
    rt = device if isinstance(device, Runtime) else None
    if rt is not None:
        device = rt.on_device
    if isinstance(x, DeviceBuffer):
        if not device:
            raise ValueError(f"{name}: a DeviceBuffer is device memory; this backend needs host memory")
        # Its handle is of its own backend's kind (a host pointer for cpu, a cl_mem for opencl): another
        # backend's went to the plugin as its own (a CPU buffer as a cl_mem: a segmentation fault).
        if rt is not None and x.runtime.backend != rt.backend:
            raise ValueError(f"{name}: a DeviceBuffer of the {x.runtime.backend} runtime; this call runs on "
                             f"{rt.backend}: allocate it with that Runtime (Runtime.alloc) or wrap a buffer of "
                             f"its device")
        if x.kind != kind:
            raise TypeError(f"{name}: DeviceBuffer of {x.kind}, expected {kind}")
        got_shape = x.shape
        addr = x._live(name)
    elif _is_torch(x):
        if rt is not None and x.is_cuda and rt.on_device and rt.backend not in ("cuda", "hip"):
            # its CUDA/HIP device pointer went to the plugin as its own handle (a cl_mem): a crash
            raise ValueError(f"{name}: a torch tensor on {x.device}; the {rt.backend} backend takes its own "
                             f"buffers: a DeviceBuffer (Runtime.alloc, or DeviceBuffer.wrap of a cl_mem)")
        if x.is_cuda != device:
            where = "a GPU tensor" if device else "host memory (a NumPy array or a CPU tensor)"
            raise ValueError(f"{name}: this backend needs {where}, got a tensor on {x.device}")
        want = _TORCH_KINDS[kind]
        if x.dtype != want:
            raise TypeError(f"{name}: dtype {x.dtype}, expected {want}")
        if not x.is_contiguous():
            raise ValueError(f"{name}: tensor is not contiguous; pass {name}.contiguous()")
        got_shape = tuple(x.shape)
        addr = x.data_ptr()
        if addr % x.element_size():
            raise ValueError(f"{name}: tensor data is not aligned to its {x.element_size()}-byte elements; pass "
                             f"{name}.clone()")
    elif isinstance(x, np.ndarray):
        if device:
            if rt is not None and rt.backend not in ("cuda", "hip"):
                raise ValueError(f"{name}: the {rt.backend} backend needs device memory, a DeviceBuffer "
                                 f"(Runtime.alloc, or DeviceBuffer.wrap of a cl_mem), got a NumPy array (a "
                                 f"PagedCache takes host arrays and copies them)")
            raise ValueError(f"{name}: this backend needs device memory (torch tensors on the GPU), got a NumPy "
                             f"array")
        want = _NP_KINDS[kind]
        if x.dtype != want:
            hint = " (bfloat16 bits: use liboscar.to_bf16)" if kind == "bf16" else ""
            raise TypeError(f"{name}: dtype {x.dtype}, expected {want}{hint}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: array is not C-contiguous; pass numpy.ascontiguousarray({name})")
        if not x.flags.aligned:  # the library reads whole elements: a misaligned one is undefined behaviour
            raise ValueError(f"{name}: array data is not aligned to its {x.dtype.itemsize}-byte elements; pass "
                             f"numpy.require({name}, requirements='CA')")
        if not x.flags.writeable and name in ("pages", "windows", "workspace", "out", "lse"):  # written
            raise ValueError(f"{name}: array is read-only")
        got_shape = x.shape
        addr = x.__array_interface__["data"][0]
    else:
        raise TypeError(f"{name}: expected a NumPy array, a torch tensor or a DeviceBuffer, got {type(x).__name__}")
    if shape is not None and (len(got_shape) != len(shape) or
                              any(w is not None and g != w for g, w in zip(got_shape, shape))):
        want_s = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ")"
        raise ValueError(f"{name}: shape {tuple(got_shape)}, expected {want_s}")
    return addr


# ---------------------------------------------------------------- handles
class _Handle:
    """A C handle that close() frees: using the object afterwards raises ValueError naming it (the C side
    would only see a NULL argument). close() sets ``_raw`` to None. A handle that lives inside other
    handles (a DeviceBuffer in its Runtime and in the buffer it views) names them in :meth:`_closed_part`:
    closing any of them frees its memory too."""
    _raw: Any = None

    def _closed_part(self) -> Optional[str]:
        """None while the handle can be used, else what is closed ("this X")."""
        return f"this {type(self).__name__}" if self._raw is None else None

    @property
    def _h(self) -> Any:
        what = self._closed_part()
        if what is not None:
            raise ValueError(f"{what} is closed; create a new one")
        return self._raw

    @_h.setter
    def _h(self, h: Any) -> None:
        self._raw = h


# ---------------------------------------------------------------- runtime
class Runtime(_Handle):
    """The backend chosen at load time (``oscar_runtime``).

    ``backend``: "cpu", "cuda", "hip", "opencl" or None (``$OSCAR_BACKEND``,
    else the best one found). Asking for one backend opens only that plugin.
    ``report`` lists every backend considered and why it was skipped.
    From Python, buffers are NumPy arrays on "cpu", torch tensors on
    "cuda"/"hip", and :class:`DeviceBuffer` (``cl_mem`` handles) on "opencl".
    ``native_context`` / ``native_queue``: OpenCL only, the caller's
    ``cl_context`` and in-order ``cl_command_queue`` as integers (e.g.
    pyopencl's ``ctx.int_ptr``); the backend then lives in that context, so
    the caller's own ``cl_mem`` buffers (:meth:`DeviceBuffer.wrap`) and queues
    of it can be passed.
    """

    def __init__(self, backend: Optional[str] = None, plugin_dir: Optional[str] = None, device_index: int = 0,
                 validate: bool = False, native_context: Optional[int] = None, native_queue: Optional[int] = None):
        o = _capi.defaults(_capi.RuntimeOptions, lib.oscar_runtime_options_default)
        self._keep = [_cstr(s, n, path=n == "plugin_dir") if s else None
                      for s, n in ((backend, "backend"), (plugin_dir, "plugin_dir"))]
        o.backend, o.plugin_dir = self._keep
        o.device_index = device_index
        o.validate = 1 if validate else 0
        o.native_context, o.native_queue = native_context, native_queue
        h = ctypes.c_void_p()
        _check(lib.oscar_runtime_create(ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        # Plans must be destroyed before their runtime; the garbage collector
        # finalizes cycles in any order, so the runtime waits for its plans.
        self._plans = 0
        self._closing = False
        # Buffers from alloc: freed with the runtime (the library cannot free them after it).
        self._buffers: "weakref.WeakSet[DeviceBuffer]" = weakref.WeakSet()
        self.backend: str = lib.oscar_runtime_backend(h).decode()
        self.device: str = lib.oscar_runtime_device(h).decode()
        self.report: str = lib.oscar_runtime_report(h).decode()

    @property
    def on_device(self) -> bool:
        """True when buffers must be GPU memory (every backend but cpu)."""
        return self.backend != "cpu"

    def alloc(self, shape: Sequence[int], kind: str) -> "DeviceBuffer":
        """Device memory from the library's allocator (``oscar_buffer_alloc``)."""
        return DeviceBuffer.alloc(self, shape, kind)

    def default_stream(self) -> Optional[int]:
        """torch's current stream on CUDA/HIP (None, the default stream, without torch)."""
        if self.backend in ("cuda", "hip") and torch is not None and torch.cuda.is_available():
            return torch.cuda.current_stream().cuda_stream
        return None

    def synchronize(self, stream: Optional[int] = None) -> None:
        _check(lib.oscar_synchronize(self._h, stream))

    def close(self) -> None:
        """Destroys the runtime now, or when its last Plan is closed.

        The buffers :meth:`alloc` made (and :class:`PagedCache` pools on
        OpenCL, which come from it) are freed with it, at that same moment:
        after the Plans that may still use them, so they stay valid while a
        Plan of this runtime is open (the library cannot free a buffer once
        its runtime is gone). Buffers of yours (:meth:`DeviceBuffer.wrap`) are
        not touched. Closing twice, or closing a freed buffer, is a no-op;
        any other use of a freed buffer raises ValueError naming the closed
        Runtime."""
        self._closing = True
        if self._raw is not None and not getattr(self, "_plans", 0):
            for b in list(getattr(self, "_buffers", ())):
                b.close()
            self._lib.oscar_runtime_destroy(self._raw)
            self._raw = None

    def _plan_closed(self) -> None:
        self._plans -= 1
        if self._closing:
            self.close()

    _lib = lib

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Runtime(backend={self.backend!r}, device={self.device!r})"


# ----------------------------------------------------------- device buffers
_KIND_SIZE = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u8": 1}


def _buffer_shape(shape: Any) -> tuple:
    """A DeviceBuffer shape as a tuple of int64s; one integer is a 1-D shape, as NumPy takes it."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"DeviceBuffer shape: expected an integer or a sequence of integers, got {shape!r}") from None
    return tuple(_capi.checked_int(n, _capi.c_int64, "DeviceBuffer shape") for n in dims)


class DeviceBuffer(_Handle):
    """Device memory by handle, for backends whose buffers torch cannot make
    (OpenCL: a ``cl_mem``; any backend's ``oscar_buffer_alloc`` pointer):
    a logical ``shape`` of elements of ``kind`` ("bf16", "f16", "f32", "i32",
    "u8") for the binding's checks, starting at the handle (OpenCL buffers
    cannot be offset). :meth:`alloc` owns its memory (freed by :meth:`close`);
    :meth:`wrap` borrows the caller's. Copies are blocking. Once the buffer,
    the buffer it views or its Runtime is closed, ``handle`` and every use
    raise ValueError (the handle would name freed memory)."""

    def __init__(self, runtime: "Runtime", handle: int, shape: Sequence[int], kind: str, owned: bool):
        if kind not in _KIND_SIZE:
            raise ValueError(f"kind {kind!r}: use one of {', '.join(_KIND_SIZE)}")
        shape = _buffer_shape(shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"DeviceBuffer shape {shape} has a negative dimension")
        self.runtime, self.shape, self.kind = runtime, shape, kind
        self.nbytes = math.prod(self.shape) * _KIND_SIZE[kind]  # Python ints: no int64 wrap-around
        self._owned = owned
        self._base: Optional["DeviceBuffer"] = None
        self._raw = int(handle)

    def _closed_part(self) -> Optional[str]:
        if self.runtime._closed_part() is not None:  # before the buffer: closing a runtime frees its buffers
            return "this DeviceBuffer's Runtime"
        if self._raw is None:
            return "this DeviceBuffer"
        if self._base is not None and self._base._closed_part() is not None:
            return "the DeviceBuffer this one views"
        return None

    @property
    def handle(self) -> int:
        """The ``cl_mem`` or device pointer; ValueError once it names freed memory."""
        return self._h

    def _live(self, name: str) -> int:
        """The handle, or ValueError naming the argument once the handle names freed memory."""
        try:
            return self._h
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    @classmethod
    def alloc(cls, runtime: "Runtime", shape: Sequence[int], kind: str) -> "DeviceBuffer":
        n = cls(runtime, 0, shape, kind, owned=False).nbytes  # the shape and kind checks, before any allocation
        h = ctypes.c_void_p()
        _check(lib.oscar_buffer_alloc(runtime._h, max(n, 1), ctypes.byref(h)))
        b = cls(runtime, h.value, shape, kind, owned=True)
        runtime._buffers.add(b)
        return b

    @classmethod
    def wrap(cls, runtime: "Runtime", handle: int, shape: Sequence[int], kind: str) -> "DeviceBuffer":
        """The caller's buffer (e.g. a ``cl_mem`` of the runtime's native
        context); it must hold at least ``shape`` elements."""
        return cls(runtime, handle, shape, kind, owned=False)

    def view(self, shape: Sequence[int]) -> "DeviceBuffer":
        """The same memory seen with a smaller (or equal) shape."""
        self._live("view")
        v = DeviceBuffer(self.runtime, self._raw, shape, self.kind, owned=False)
        if v.nbytes > self.nbytes:
            raise ValueError(f"view {v.shape} needs {v.nbytes} bytes; the buffer has {self.nbytes}")
        v._base = self  # keeps an owned buffer alive
        return v

    def write(self, host: np.ndarray, stream: Optional[int] = None) -> None:
        """Copies a host array of the buffer's element kind (from offset 0) into the buffer."""
        a = np.ascontiguousarray(host)
        if a.dtype != _NP_KINDS[self.kind]:  # its bytes would be read as another type (int64 ids as pairs of i32)
            hint = " (bfloat16 bits: use liboscar.to_bf16)" if self.kind == "bf16" else ""
            raise TypeError(f"write: host dtype {a.dtype} into a buffer of {self.kind} "
                            f"({_NP_KINDS[self.kind]}); convert it first{hint}")
        if a.nbytes > self.nbytes:
            raise ValueError(f"write of {a.nbytes} bytes into a buffer of {self.nbytes}")
        h = self._live("write")
        _check(lib.oscar_buffer_write(self.runtime._h, h, 0, a.ctypes.data, a.nbytes, stream))

    def read(self, stream: Optional[int] = None) -> np.ndarray:
        """The buffer's contents as a new host array of its shape (bf16 as uint16 bits)."""
        h = self._live("read")
        out = np.empty(self.shape, dtype=_NP_KINDS[self.kind])
        _check(lib.oscar_buffer_read(self.runtime._h, out.ctypes.data, h, 0, out.nbytes, stream))
        return out

    def close(self) -> None:
        """Frees an :meth:`alloc` buffer (closing its Runtime frees it too); a no-op when closed."""
        if self._raw is not None and getattr(self, "_owned", False) and self.runtime._raw is not None:
            lib.oscar_buffer_free(self.runtime._raw, self._raw)
        self._owned = False
        self._raw = None

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        what = self._closed_part()
        h = f"handle={self._raw:#x}" if what is None else f"closed ({what})"
        return f"DeviceBuffer({h}, shape={self.shape}, kind={self.kind!r})"


# ----------------------------------------------------------------- params
@dataclass
class ParamsInfo:
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    per_head: bool
    method: str
    calib_tokens: int
    model_hash: str


class Params(_Handle):
    """Per-layer rotations, clip ratios and error-feedback weights
    (``oscar_params``): from a parameter file, calibration or built in."""

    def __init__(self, handle: ctypes.c_void_p):
        self._h = handle

    @classmethod
    def load(cls, path: str) -> "Params":
        """Loads a parameter file (safetensors; docs/FORMAT.md §6). Corrupt or
        foreign files raise OscarError naming the problem."""
        h = ctypes.c_void_p()
        _check(lib.oscar_params_load(_cstr(path, "path", path=True), ctypes.byref(h)))
        return cls(h)

    @classmethod
    def builtin(cls, method: Union[str, int], num_layers: int, num_q_heads: int, num_kv_heads: int,
                head_dim: int) -> "Params":
        """Identity (int2, bf16), Hadamard (quarot2), or identity with the
        published clips (oscar2, oscar2-lm)."""
        h = ctypes.c_void_p()
        _check(lib.oscar_params_create_builtin(method_id(method), num_layers, num_q_heads, num_kv_heads, head_dim,
                                               ctypes.byref(h)))
        return cls(h)

    def save(self, path: str) -> None:
        _check(lib.oscar_params_save(self._h, _cstr(path, "path", path=True)))

    @property
    def info(self) -> ParamsInfo:
        i = _capi.ParamsInfo()
        _check(lib.oscar_params_get_info(self._h, ctypes.byref(i)))
        return ParamsInfo(i.num_layers, i.num_q_heads, i.num_kv_heads, i.head_dim, bool(i.per_head),
                          lib.oscar_method_name(i.method).decode(), i.calib_tokens, i.model_hash.decode())

    def _matrix(self, fn, layer: int, which: str, kv_head: int, n: int, ctype, dtype) -> Optional[np.ndarray]:
        p = ctypes.POINTER(ctype)()
        _check(fn(self._h, layer, kv_head, _kv(which), ctypes.byref(p)))
        if not p:
            return None
        return np.ctypeslib.as_array(p, shape=(n,)).astype(dtype, copy=True)

    def rotation(self, layer: int, which: str = "k", kv_head: int = 0) -> np.ndarray:
        """The d x d rotation R (a stored row is x R), a copy."""
        d = self.info.head_dim
        return self._matrix(lib.oscar_params_rotation, layer, which, kv_head, d * d, ctypes.c_float,
                            np.float32).reshape(d, d)

    def eigenvalues(self, layer: int, which: str = "k", kv_head: int = 0) -> Optional[np.ndarray]:
        """Eigenvalues of the calibration target, largest first; None if built in."""
        return self._matrix(lib.oscar_params_eigenvalues, layer, which, kv_head, self.info.head_dim,
                            ctypes.c_double, np.float64)

    def feedback(self, layer: int, which: str = "k", kv_head: int = 0) -> Optional[np.ndarray]:
        """Error-feedback weights F (d x d, strictly upper triangular), or None."""
        d = self.info.head_dim
        f = self._matrix(lib.oscar_params_feedback, layer, which, kv_head, d * d, ctypes.c_float, np.float32)
        return None if f is None else f.reshape(d, d)

    def clear_feedback(self) -> None:
        _check(lib.oscar_params_clear_feedback(self._h))

    def set_feedback(self, layer: int, F, which: str = "k", kv_head: int = 0) -> None:
        """Sets error-feedback weights (d x d, strictly upper triangular, finite,
        |F| <= 16; oscar2 / oscar2-lm parameters): weights of your own, or
        synthetic ones to time the write path."""
        d = self.info.head_dim
        f = _real(F, np.float32, "F")
        if f.shape != (d, d):
            raise ValueError(f"F: shape {f.shape}, expected ({d}, {d})")
        _check(lib.oscar_params_set_feedback(self._h, layer, kv_head, _kv(which),
                                             f.ctypes.data_as(ctypes.POINTER(ctypes.c_float))))

    def orthogonality_error(self, layer: int, which: str = "k", kv_head: int = 0) -> float:
        e = ctypes.c_double()
        _check(lib.oscar_params_orthogonality_error(self._h, layer, kv_head, _kv(which), ctypes.byref(e)))
        return e.value

    def clip(self, layer: int, which: str = "k", kv_head: Optional[int] = None) -> float:
        """Clip ratio of one KV head, or (kv_head None) the layer's mildest over its heads."""
        c = ctypes.c_float()
        if kv_head is None:
            _check(lib.oscar_params_clip(self._h, layer, _kv(which), ctypes.byref(c)))
        else:
            _check(lib.oscar_params_clip_head(self._h, layer, kv_head, _kv(which), ctypes.byref(c)))
        return c.value

    def set_clip(self, layer: int, which: str, c: float, kv_head: Optional[int] = None) -> None:
        """Sets one KV head's clip ratio, or (kv_head None) every head's of the layer."""
        if isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating)):
            raise TypeError(f"c: {c!r} is not a number; pass the clip ratio as a float in (0, 1]")
        if kv_head is None:
            _check(lib.oscar_params_set_clip(self._h, layer, _kv(which), c))
        else:
            _check(lib.oscar_params_set_clip_head(self._h, layer, kv_head, _kv(which), c))

    def code_bits(self, layer: int, kv_head: int, which: str) -> int:
        """Code width (2 or 3) of one head-tensor (FORMAT.md 2.7)."""
        b = ctypes.c_int()
        _check(lib.oscar_params_code_bits(self._h, layer, kv_head, _kv(which), ctypes.byref(b)))
        return b.value

    def set_code_bits(self, layer: int, kv_head: int, which: str, bits: int) -> None:
        """Sets one head-tensor's code width: 3 stores it in 3 bits (oscar2 only; the layout needs
        wide_tensors room), 2 back to 2 bits."""
        _check(lib.oscar_params_set_code_bits(self._h, layer, kv_head, _kv(which), bits))

    def check_shape(self, num_layers: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    model_hash: Optional[str] = None) -> None:
        """Raises OscarError (SHAPE_MISMATCH) when the parameters are for another model."""
        _check(lib.oscar_params_check_shape(self._h, num_layers, num_q_heads, num_kv_heads, head_dim,
                                            _cstr(model_hash, "model_hash") if model_hash else None))

    def close(self) -> None:
        if self._raw is not None:
            self._lib.oscar_params_destroy(self._raw)
            self._raw = None

    _lib = lib

    def __del__(self) -> None:
        self.close()


def fakequant(rows: np.ndarray, method: Union[str, int], params: Optional[Params] = None, layer: int = 0,
              which: str = "k", group: int = 0) -> np.ndarray:
    """Quantize-dequantize host rows [n_tokens, num_kv_heads, head_dim]
    exactly as the cache stores them; returns a new float32 array in the
    original space."""
    x = _real(rows, np.float32, "rows", copy=True)
    if x.ndim != 3:
        raise ValueError(f"rows: shape {x.shape}, expected (n_tokens, num_kv_heads, head_dim)")
    _check(lib.oscar_fakequant(params._h if params else None, method_id(method), layer, _kv(which), group,
                               x.shape[0], x.shape[1], x.shape[2], x.ctypes.data))
    return x


# ----------------------------------------------------------------- layout
@dataclass
class LayoutSizes:
    page_bytes: int
    window_slot_bytes: int
    k_codes_offset: int
    v_codes_offset: int
    k_meta_offset: int
    v_meta_offset: int
    bits_per_element: float


def _layout_defaults() -> _capi.LayoutDesc:
    return _capi.defaults(_capi.LayoutDesc, lib.oscar_layout_default)


_LD = _layout_defaults()


@dataclass
class Layout:
    """Shape of one layer's paged cache (``oscar_layout_desc``); defaults are
    the library's. Dtypes by name ("bf16", "f16", "f32"), method by name."""
    head_dim: int = _LD.head_dim
    group: int = 0  # 0: the format's default for head_dim (oscar_layout_default_group: 96 at 96, 128 at 256)
    num_q_heads: int = _LD.num_q_heads
    num_kv_heads: int = _LD.num_kv_heads
    page_size: int = _LD.page_size
    sink: int = _LD.sink
    recent: int = _LD.recent
    max_seq_len: int = _LD.max_seq_len
    kv_dtype: str = _DTYPE_NAMES[_LD.kv_dtype]
    meta_dtype: str = _DTYPE_NAMES[_LD.meta_dtype]
    method: str = field(default_factory=lambda: method_name(_LD.method))
    wide_tensors: int = _LD.wide_tensors  # room for 3-bit head-tensors per layer (FORMAT.md 2.7; CPU, OpenCL and CUDA backends)
    # 1 (oscar2): each layer's pages hold only its own 3-bit head-tensors' planes (FORMAT.md 3.3); size
    # layer l's pool with Plan.layer_sizes(l).page_bytes (sizes() stays the largest page)
    wide_per_layer: int = _LD.wide_per_layer

    def __post_init__(self) -> None:
        if not self.group:  # a head_dim the C int cannot hold is reported by validate(), as any field
            with contextlib.suppress(TypeError, ValueError):
                self.group = int(lib.oscar_layout_default_group(_capi.checked_int(self.head_dim, _capi.c_int32,
                                                                                  "head_dim")))

    def _c(self) -> _capi.LayoutDesc:
        d = _layout_defaults()
        for f in ("head_dim", "group", "num_q_heads", "num_kv_heads", "page_size", "sink", "recent",
                  "max_seq_len", "wide_tensors", "wide_per_layer"):
            setattr(d, f, getattr(self, f))  # checked: no float truncated, no int wrapped
        d.kv_dtype, d.meta_dtype = dtype_id(self.kv_dtype), dtype_id(self.meta_dtype)
        d.method = method_id(self.method)
        return d

    def validate(self) -> None:
        """Raises OscarError naming the wrong field and what is allowed."""
        _check(lib.oscar_layout_validate(ctypes.byref(self._c())))

    def sizes(self) -> LayoutSizes:
        s = _capi.LayoutSizes()
        _check(lib.oscar_layout_sizes_get(ctypes.byref(self._c()), ctypes.byref(s)))
        return LayoutSizes(s.page_bytes, s.window_slot_bytes, s.k_codes_offset, s.v_codes_offset, s.k_meta_offset,
                           s.v_meta_offset, s.bits_per_element)

    def pages_for(self, seq_len: int) -> int:
        """Pages of the paged pool a sequence of seq_len tokens needs."""
        n = ctypes.c_int64()
        _check(lib.oscar_layout_pages_for(ctypes.byref(self._c()), seq_len, ctypes.byref(n)))
        return n.value

    def bits_per_element(self, seq_len: int) -> float:
        """Average stored bits per K/V element of a whole sequence (windows counted)."""
        b = ctypes.c_double()
        _check(lib.oscar_layout_bits_per_element(ctypes.byref(self._c()), seq_len, ctypes.byref(b)))
        return b.value


# ------------------------------------------------------------------- plan
_SM_ZERO = " (where 0 means 1/sqrt(head_dim))"


class Plan(_Handle):
    """Layout + parameters bound to a runtime (``oscar_plan``). ``params``
    may be None for int2, quarot2 and bf16 (built in).

    :meth:`append` and :meth:`decode` take your buffers (the C API's
    contract, docs/API.md); :meth:`cache` makes a :class:`PagedCache` that
    owns them for the simple case.
    """

    def __init__(self, runtime: Runtime, layout: Layout, params: Optional[Params] = None):
        self.runtime, self.params = runtime, params
        self._desc = layout._c()
        if runtime._raw is None:
            raise ValueError("Plan: the runtime is closed")
        h = ctypes.c_void_p()
        _check(lib.oscar_plan_create(runtime._h, ctypes.byref(self._desc), params._h if params else None,
                                     ctypes.byref(h)))
        self._h = h
        runtime._plans += 1
        # The layers the library serves (oscar_plan_create keeps the parameters' count; without
        # parameters the built-in ones serve every layer index): None for no bound.
        self._num_layers: Optional[int] = params.info.num_layers if params is not None else None
        # The shapes the library planned with, dtypes and method by name,
        # apart from the caller's object: a Layout changed after this call
        # must not change the shapes the calls check (the library would read
        # and write past arrays sized by the new values).
        # Every field from the struct by name, so a field added later is kept too.
        d = self._desc
        names = {"kv_dtype": lambda x: _DTYPE_NAMES[x], "meta_dtype": lambda x: _DTYPE_NAMES[x], "method": method_name}
        self._L = Layout(**{f.name: names.get(f.name, int)(getattr(d, f.name)) for f in dataclasses.fields(Layout)})
        self.layout = dataclasses.replace(self._L)
        self.variant: str = lib.oscar_plan_variant(h).decode()
        self.sizes = self._L.sizes()  # the largest page (every layer's with wide_per_layer 0)
        self._layer_pb: dict = {}  # layer -> its page_bytes (layer_sizes), for the calls' pool checks

    def layer_sizes(self, layer: int) -> LayoutSizes:
        """``oscar_plan_layer_sizes``: the page geometry of one layer; with ``wide_per_layer`` 1 its
        page_bytes counts only that layer's 1-bit planes (allocate each layer's pool with it)."""
        s = _capi.LayoutSizes()
        _check(lib.oscar_plan_layer_sizes(self._h, _capi.checked_int(layer, _capi.c_int, "layer"), ctypes.byref(s)))
        return LayoutSizes(s.page_bytes, s.window_slot_bytes, s.k_codes_offset, s.v_codes_offset, s.k_meta_offset,
                           s.v_meta_offset, s.bits_per_element)

    def _page_bytes(self, layer: int) -> int:
        if not self._L.wide_per_layer:
            return self.sizes.page_bytes
        if layer not in self._layer_pb:
            self._layer_pb[layer] = self.layer_sizes(layer).page_bytes  # raises for a layer out of range
        return self._layer_pb[layer]

    def workspace_bytes(self, max_seqs: int, max_seq_len: int) -> int:
        n = ctypes.c_size_t()
        _check(lib.oscar_plan_workspace_bytes(self._h, max_seqs, max_seq_len, ctypes.byref(n)))
        return n.value

    def _error_word(self, workspace: ArrayLike) -> int:
        """Address of a workspace for init and check. Those C calls take no size and write or read the
        error word at its start, so a 1-byte array was written past its end (heap corruption on the CPU
        backend): anything smaller than the least workspace a call takes is refused here."""
        addr = _ptr(workspace, "u8", (None,), "workspace", self._dev)
        need = self.workspace_bytes(1, 1)
        if workspace.shape[0] < need:
            raise ValueError(f"workspace: {workspace.shape[0]} bytes, smaller than any workspace of this plan "
                             f"({need} bytes for one sequence of one token); size it with "
                             f"Plan.workspace_bytes(max_seqs, max_seq_len)")
        return addr

    def workspace_init(self, workspace: ArrayLike, stream: Optional[int] = None) -> None:
        _check(lib.oscar_plan_workspace_init(self._h, self._error_word(workspace), self._stream(stream)))

    def check(self, workspace: ArrayLike, stream: Optional[int] = None) -> None:
        """Synchronizes and raises the errors device kernels flagged since the last check."""
        _check(lib.oscar_plan_check(self._h, self._error_word(workspace), self._stream(stream)))

    @property
    def _dev(self) -> "Runtime":
        return self.runtime  # _ptr: its device kind, and the backend a DeviceBuffer must be of

    def _stream(self, stream: Optional[int]) -> Optional[int]:
        return stream if stream is not None else self.runtime.default_stream()

    def _batch(self, layer, pages, windows, seq_lens, window_slots, block_table, max_seq_len):
        L, dev = self._L, self._dev
        if not hasattr(seq_lens, "shape") or len(seq_lens.shape) != 1:
            raise ValueError("seq_lens: expected a 1-D int32 array [num_seqs]")
        ns = int(seq_lens.shape[0])
        pb = self._page_bytes(layer)
        cache = _capi.Cache(_ptr(pages, "u8", (None,), "pages", dev), pages.shape[0] // pb,
                            _ptr(windows, "u8", (None,), "windows", dev) if windows is not None else None,
                            (windows.shape[0] // self.sizes.window_slot_bytes
                             if windows is not None and self.sizes.window_slot_bytes else 0))
        # per-layer pages: a pool of the largest pages serves every layer too (FORMAT.md 3.3)
        if pages.shape[0] % pb and (pb == self.sizes.page_bytes or pages.shape[0] % self.sizes.page_bytes):
            raise ValueError(f"pages: {pages.shape[0]} bytes is not a multiple of layer {layer}'s page_bytes "
                             f"{pb}")
        bt = _ptr(block_table, "i32", (ns, None), "block_table", dev)
        batch = _capi.Batch(ns, _ptr(seq_lens, "i32", (ns,), "seq_lens", dev),
                            # None: NULL, as the C API takes for a layout without windows (it refuses it otherwise)
                            _ptr(window_slots, "i32", (ns,), "window_slots", dev) if window_slots is not None
                            else None, bt, block_table.shape[1],
                            max_seq_len if max_seq_len is not None else L.max_seq_len)  # checked by Batch
        return cache, batch

    def append(self, layer: int, pages: ArrayLike, windows: Optional[ArrayLike], seq_lens: ArrayLike,
               window_slots: Optional[ArrayLike], block_table: ArrayLike, cu_new: ArrayLike, k: ArrayLike,
               v: ArrayLike, workspace: ArrayLike, max_seq_len: Optional[int] = None,
               stream: Optional[int] = None) -> None:
        """``oscar_append``: new K/V rows [total_new, num_kv_heads, head_dim]
        (kv_dtype) go into the cache; ``seq_lens`` are lengths after the
        append; sequence i's rows are ``cu_new[i]:cu_new[i+1]``."""
        L, dev = self._L, self._dev
        cache, batch = self._batch(layer, pages, windows, seq_lens, window_slots, block_table, max_seq_len)
        total = _rows(k, "k")
        shape = (total, L.num_kv_heads, L.head_dim)
        kp, vp = _ptr(k, L.kv_dtype, shape, "k", dev), _ptr(v, L.kv_dtype, shape, "v", dev)
        cu = _ptr(cu_new, "i32", (batch.num_seqs + 1,), "cu_new", dev)
        _check(lib.oscar_append(self._h, layer, ctypes.byref(cache), ctypes.byref(batch), cu, total, kp, vp, 0,
                                _ptr(workspace, "u8", (None,), "workspace", dev), workspace.shape[0],
                                self._stream(stream)))

    def decode(self, layer: int, pages: ArrayLike, windows: Optional[ArrayLike], seq_lens: ArrayLike,
               window_slots: Optional[ArrayLike], block_table: ArrayLike, q: ArrayLike, out: ArrayLike,
               workspace: ArrayLike, sm_scale: float = 0.0, rotated_output: bool = False,
               max_seq_len: Optional[int] = None, stream: Optional[int] = None) -> None:
        """``oscar_decode``: one query per sequence, q and out
        [num_seqs, num_q_heads, head_dim] (kv_dtype)."""
        L, dev = self._L, self._dev
        cache, batch = self._batch(layer, pages, windows, seq_lens, window_slots, block_table, max_seq_len)
        shape = (batch.num_seqs, L.num_q_heads, L.head_dim)
        _check(lib.oscar_decode(self._h, layer, ctypes.byref(cache), ctypes.byref(batch),
                                _ptr(q, L.kv_dtype, shape, "q", dev), 0, _ptr(out, L.kv_dtype, shape, "out", dev), 0,
                                _f32(sm_scale, "sm_scale", _SM_ZERO), 1 if rotated_output else 0,
                                _ptr(workspace, "u8", (None,), "workspace", dev), workspace.shape[0],
                                self._stream(stream)))

    def extend(self, layer: int, pages: ArrayLike, windows: Optional[ArrayLike], seq_lens: ArrayLike,
               window_slots: Optional[ArrayLike], block_table: ArrayLike, cu_q: ArrayLike, q: ArrayLike,
               out: ArrayLike, workspace: ArrayLike, max_q_len: int, lse: Optional[ArrayLike] = None,
               sm_scale: float = 0.0, rotated_output: bool = False, max_seq_len: Optional[int] = None,
               stream: Optional[int] = None) -> None:
        """``oscar_extend``: sequence i's query rows ``cu_q[i]:cu_q[i+1]`` of
        q and out [total_q, num_q_heads, head_dim] (kv_dtype) sit at the last
        n_i positions of the (already appended) sequence, causal; ``lse``
        [total_q, num_q_heads] float32 receives the natural-log sum of
        exp(scores) when given. The workspace must hold
        ``workspace_bytes(max(num_seqs, total_q), max_seq_len)``."""
        L, dev = self._L, self._dev
        cache, batch = self._batch(layer, pages, windows, seq_lens, window_slots, block_table, max_seq_len)
        total = _rows(q, "q")
        shape = (total, L.num_q_heads, L.head_dim)
        a = _capi.AttnArgs()
        lib.oscar_attn_args_default(ctypes.byref(a))
        a.cu_q = _ptr(cu_q, "i32", (batch.num_seqs + 1,), "cu_q", dev)
        a.total_q, a.max_q_len = total, max_q_len  # the struct refuses a float or an int32 overflow
        a.q = _ptr(q, L.kv_dtype, shape, "q", dev)
        a.out = _ptr(out, L.kv_dtype, shape, "out", dev)
        a.out_bytes = total * L.num_q_heads * L.head_dim * 2
        if lse is not None:
            a.lse = _ptr(lse, "f32", (total, L.num_q_heads), "lse", dev)
            a.lse_bytes = total * L.num_q_heads * 4
        a.sm_scale, a.rotated_output = _f32(sm_scale, "sm_scale", _SM_ZERO), 1 if rotated_output else 0
        a.workspace = _ptr(workspace, "u8", (None,), "workspace", dev)
        a.workspace_bytes = workspace.shape[0]
        a.stream = self._stream(stream)
        _check(lib.oscar_extend(self._h, layer, ctypes.byref(cache), ctypes.byref(batch), ctypes.byref(a)))

    def cache(self, num_layers: int, num_seqs: int, max_seq_len: Optional[int] = None,
              layers: Optional[Sequence[int]] = None) -> "PagedCache":
        return PagedCache(self, num_layers, num_seqs, max_seq_len, layers)

    def close(self) -> None:
        if self._raw is not None:
            self._lib.oscar_plan_destroy(self._raw)
            self._raw = None
            self.runtime._plan_closed()

    _lib = lib

    def __del__(self) -> None:
        self.close()


def _rows(x: Any, name: str) -> int:
    """Token count of a [tokens, heads, head_dim] array, before anything else
    reads its shape (a scalar was an IndexError, a list an AttributeError)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 3:
        got = f"shape {tuple(shape)}" if shape is not None else type(x).__name__
        raise ValueError(f"{name}: expected an array [tokens, heads, head_dim], got {got}")
    return int(shape[0])


def _counts(values: Sequence[int], name: str) -> np.ndarray:
    """Per-sequence token counts as int64, refusing what is not an integer:
    np.asarray(..., np.int64) truncated 2.7 to 2, so counts that did not
    describe the rows could still sum to their number."""
    a = np.asarray(values)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer token counts, got {np.asarray(values).tolist()!r} ({a.dtype})")
    return a.astype(np.int64)


def _layer_index(i: Any) -> int:
    """One entry of PagedCache's ``layers``: an integer (int() truncated 1.7 to layer 1 and took True as 1)."""
    if isinstance(i, bool):
        raise TypeError(f"layers: expected integer layer indices, got {i!r}")
    return _capi.checked_int(i, _capi.c_int, "layers")


def _serialized(method):
    """A PagedCache method run under the cache's lock: its device buffers (workspace, staging copies,
    the lengths and prefix sums on the device) are shared by every layer, so two threads' calls
    overwrote each other's inputs there (OpenCL decodes of different layers read another layer's
    query and lengths: wrong outputs, no error)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


class PagedCache:
    """A whole model's paged cache for ``num_seqs`` sequences of up to
    ``max_seq_len`` tokens, with pools, block table (sequence i owns a
    contiguous run of pages), window slots and workspace allocated once:
    NumPy arrays on the CPU backend, torch tensors on CUDA/HIP,
    :class:`DeviceBuffer` on OpenCL (there append and decode take and give
    host NumPy arrays, copied through device staging buffers). Each layer
    tracks its own lengths; append then decode, layer by layer. Threads may
    share a cache: its calls are serialized (one cache per thread runs them
    in parallel)."""

    def __init__(self, plan: Plan, num_layers: int, num_seqs: int, max_seq_len: Optional[int] = None,
                 layers: Optional[Sequence[int]] = None):
        """``layers``: the layer indices that get pools (default all); the
        others (a hybrid model's sliding-window layers, kept elsewhere) are
        refused by every call."""
        self._lock = threading.RLock()
        # Bounded before anything is built from them: num_layers 10**9 made set(range(...)) and the
        # per-layer lengths take all host memory (the process was killed by the OOM killer).
        num_layers = _capi.checked_int(num_layers, _capi.c_int32, "num_layers")
        num_seqs = _capi.checked_int(num_seqs, _capi.c_int32, "num_seqs")
        if not 1 <= num_layers <= _MAX_LAYERS:
            raise ValueError(f"num_layers {num_layers} outside [1, {_MAX_LAYERS}] (the library's bound on layers)")
        if num_seqs < 1:
            raise ValueError(f"num_seqs {num_seqs}: a cache holds at least one sequence")
        self.plan, self.num_layers, self.num_seqs = plan, num_layers, num_seqs
        held = set(range(num_layers)) if layers is None else {_layer_index(i) for i in layers}
        if not held or not held <= set(range(num_layers)):
            raise ValueError(f"layers {sorted(held)}: a non-empty subset of 0..{num_layers - 1}")
        P = plan._num_layers
        if P is not None and max(held) >= P:
            # refused here: the extra pools were allocated and the library refused the layer only at its
            # first append
            what = (f"num_layers {num_layers}" if layers is None else
                    f"layers {sorted(held)} (layer {max(held)})")
            fix = f"num_layers={P} (or layers= indices below it)" if layers is None else f"only layers below {P}"
            raise ValueError(f"PagedCache: {what}, but the plan's parameters have {P} layers (0..{P - 1}): pass "
                             f"{fix}, or parameters calibrated for {max(held) + 1} layers")
        self.held_layers = held
        L = plan._L
        self.max_seq_len = L.max_seq_len if max_seq_len is None else _capi.checked_int(max_seq_len, _capi.c_int32,
                                                                                        "max_seq_len")
        if not 1 <= self.max_seq_len <= L.max_seq_len:
            raise ValueError(f"max_seq_len {self.max_seq_len} outside [1, {L.max_seq_len}] (the layout's max_seq_len)")
        self.pages_per_seq = max(1, L.pages_for(self.max_seq_len))
        sz = plan.sizes
        # each layer's pool of its own pages (the same size for all without wide_per_layer)
        page_total = [num_seqs * self.pages_per_seq * (plan._page_bytes(i) if i in held else 0)
                      for i in range(num_layers)]
        win_total = num_seqs * sz.window_slot_bytes
        ws = plan.workspace_bytes(num_seqs, self.max_seq_len)
        bt = np.arange(num_seqs * self.pages_per_seq, dtype=np.int32).reshape(num_seqs, self.pages_per_seq)
        slots = np.arange(num_seqs, dtype=np.int32)
        self.lens = np.zeros((num_layers, num_seqs), dtype=np.int32)  # host copy, per layer
        self._held: dict = {}  # id(device buffer) -> (values it holds, stream they were queued on)
        self._staging: dict = {}  # OpenCL: name -> DeviceBuffer, grown as needed
        self._ext_retired: list = []  # extend workspaces outgrown since the last check(), their words unread
        rt = plan.runtime
        if rt.on_device and rt.backend not in ("cuda", "hip"):  # OpenCL: buffers by handle
            self.pages = [rt.alloc((page_total[i] if i in held else 1,), "u8") for i in range(num_layers)]
            self.windows = [rt.alloc((max(win_total, 1) if i in held else 1,), "u8") for i in range(num_layers)]
            self.workspace = rt.alloc((max(ws, 1),), "u8")
            self.block_table, self.window_slots = rt.alloc(bt.shape, "i32"), rt.alloc(slots.shape, "i32")
            self.block_table.write(bt)
            self.window_slots.write(slots)
            self._lens_dev, self._cu_dev = rt.alloc((num_seqs,), "i32"), rt.alloc((num_seqs + 1,), "i32")
        elif rt.on_device:
            if torch is None:
                raise ImportError("PagedCache on a GPU backend needs torch")
            dev = torch.device("cuda", torch.cuda.current_device())
            self._zeros = lambda n, dt: torch.zeros(n, dtype=dt, device=dev)
            self.pages = [torch.zeros(page_total[i] if i in held else 0, dtype=torch.uint8, device=dev)
                          for i in range(num_layers)]
            self.windows = [torch.zeros(max(win_total, 1) if i in held else 0, dtype=torch.uint8, device=dev)
                            for i in range(num_layers)]
            self.workspace = torch.zeros(max(ws, 1), dtype=torch.uint8, device=dev)
            self.block_table = torch.from_numpy(bt).to(dev)
            self.window_slots = torch.from_numpy(slots).to(dev)
            self._lens_dev = torch.zeros(num_seqs, dtype=torch.int32, device=dev)
            self._cu_dev = torch.zeros(num_seqs + 1, dtype=torch.int32, device=dev)
        else:
            self.pages = [np.zeros(page_total[i] if i in held else 0, dtype=np.uint8) for i in range(num_layers)]
            self.windows = [np.zeros(max(win_total, 1) if i in held else 0, dtype=np.uint8) for i in range(num_layers)]
            self.workspace = np.zeros(max(ws, 1), dtype=np.uint8)
            self.block_table, self.window_slots = bt, slots
        plan.workspace_init(self.workspace)

    def _to_dev(self, host: np.ndarray, buf, stream: Optional[int]):
        """Host int32 lengths into the device buffer, queued on the stream the
        kernels will run on (so a caller's side stream sees them in order).
        The buffer remembers what it holds: the same values again (every layer
        of one decode step) cost nothing, and the same values plus a constant
        (the next decode step) are one asynchronous add on the device instead
        of a host copy, which torch makes synchronous."""
        host = np.ascontiguousarray(host, dtype=np.int32)
        if not self.plan.runtime.on_device:
            return host
        held = self._held.get(id(buf))
        if held is not None and held[1] == stream and held[0].shape == host.shape:
            delta = host.astype(np.int64) - held[0]
            if not delta.any():
                return buf
            step = int(delta.flat[0])
        else:
            step = None
        if isinstance(buf, DeviceBuffer):
            buf.write(host, stream)
            self._held[id(buf)] = (host.astype(np.int64), stream)
            return buf
        side = stream is not None and stream != torch.cuda.current_stream().cuda_stream
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)) if side else contextlib.nullcontext():
            if step is not None and (delta == step).all():
                buf.add_(step)
            else:
                buf.copy_(torch.from_numpy(host))
        self._held[id(buf)] = (host.astype(np.int64), stream)
        return buf

    @property
    def _by_handle(self) -> bool:
        return isinstance(self.workspace, DeviceBuffer)

    def _stage(self, name: str, host: ArrayLike, kind: str, stream: Optional[int],
               copy: bool = True) -> "DeviceBuffer":
        """OpenCL: a host array (checked like any) copied (unless not copy)
        into the staging buffer `name`, returned as a view of its shape."""
        if isinstance(host, DeviceBuffer):  # _ptr would say "this backend needs host memory": it is the cache
            raise ValueError(f"{name}: a DeviceBuffer; PagedCache on {self.plan.runtime.backend} takes host arrays "
                             f"(NumPy) and copies them through its staging buffers: pass {name}.read(), or your "
                             f"DeviceBuffers to Plan.append / Plan.decode / Plan.extend")
        _ptr(host, kind, None, name, False)
        a = host.numpy() if _is_torch(host) else host
        buf = self._staging.get(name)
        if buf is None or buf.nbytes < a.nbytes:
            buf = self._staging[name] = self.plan.runtime.alloc((max(a.size, 1),), kind)
        view = buf.view(a.shape)
        if copy and a.nbytes:
            view.write(a, stream)
        return view

    def _check_layer(self, layer: int) -> None:
        # Before any list lookup: Python would take -1 as the last layer and
        # a layer past the end as a bare IndexError naming no field.
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer!r} out of range [0, {self.num_layers})")
        if layer not in self.held_layers:
            raise ValueError(f"layer {layer} has no pools in this cache (layers={sorted(self.held_layers)})")

    def _check_batch(self, n: np.ndarray, name: str) -> None:
        """Per-sequence counts of a batch of another size: named as such (a cache's size is fixed)."""
        if n.ndim == 1 and n.shape[0] != self.num_seqs:
            raise ValueError(f"{name}: {n.shape[0]} counts, but this cache holds {self.num_seqs} sequences (one "
                             f"count per sequence); make a new cache (Plan.cache) for a batch of another size")

    @_serialized
    def append(self, layer: int, k: ArrayLike, v: ArrayLike, new_tokens: Optional[Sequence[int]] = None,
               stream: Optional[int] = None) -> None:
        """Appends rows k, v [total_new, num_kv_heads, head_dim] to layer
        ``layer``: ``new_tokens[i]`` rows for sequence i, in order (default:
        one token per sequence, a decode step)."""
        self._check_layer(layer)
        total = _rows(k, "k")
        _rows(v, "v")
        if new_tokens is None and total != self.num_seqs:  # the message named new_tokens, never passed
            raise ValueError(f"k: {total} rows, but this cache holds {self.num_seqs} sequences: without new_tokens "
                             f"an append is a decode step, one row per sequence; pass new_tokens for several rows "
                             f"per sequence, or make a new cache (Plan.cache) for a batch of another size")
        n = np.full(self.num_seqs, 1, np.int64) if new_tokens is None else _counts(new_tokens, "new_tokens")
        self._check_batch(n, "new_tokens")
        if n.shape != (self.num_seqs,) or (n < 0).any() or int(n.sum()) != total:
            raise ValueError(f"new_tokens must give {self.num_seqs} non-negative counts summing to the {total} "
                             f"rows of k (got {n.tolist()})")
        lens = self.lens[layer] + n
        if (lens < 1).any():
            raise ValueError("every sequence needs at least one token after the append")
        if (lens > self.max_seq_len).any():
            raise ValueError(f"sequence length {int(lens.max())} would exceed max_seq_len {self.max_seq_len}")
        cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        stream = self.plan._stream(stream)
        if self._by_handle:
            kind = self.plan._L.kv_dtype
            k, v = self._stage("k", k, kind, stream), self._stage("v", v, kind, stream)
        self.plan.append(layer, self.pages[layer], self.windows[layer],
                         self._to_dev(lens, getattr(self, "_lens_dev", None), stream), self.window_slots,
                         self.block_table, self._to_dev(cu, getattr(self, "_cu_dev", None), stream), k, v,
                         self.workspace, max_seq_len=int(lens.max()), stream=stream)
        self.lens[layer] = lens

    @_serialized
    def decode(self, layer: int, q: ArrayLike, out: Optional[ArrayLike] = None, sm_scale: float = 0.0,
               rotated_output: bool = False, stream: Optional[int] = None) -> ArrayLike:
        """Decode attention of one query per sequence, q [num_seqs,
        num_q_heads, head_dim], over everything appended to the layer;
        returns ``out`` (allocated like q when not given)."""
        self._check_layer(layer)
        if (self.lens[layer] < 1).any():
            raise ValueError(f"layer {layer}: every sequence needs an appended token before decode")
        if out is None:
            out = torch.empty_like(q) if _is_torch(q) else np.empty_like(q)
        stream = self.plan._stream(stream)
        qd, od = q, out
        if self._by_handle:
            kind = self.plan._L.kv_dtype
            qd, od = self._stage("q", q, kind, stream), self._stage("out", out, kind, stream, copy=False)
        self.plan.decode(layer, self.pages[layer], self.windows[layer],
                         self._to_dev(self.lens[layer], getattr(self, "_lens_dev", None), stream), self.window_slots,
                         self.block_table, qd, od, self.workspace, sm_scale=sm_scale, rotated_output=rotated_output,
                         max_seq_len=int(self.lens[layer].max()), stream=stream)
        if self._by_handle:
            out[...] = od.read(stream)
        return out

    @_serialized
    def extend(self, layer: int, q: ArrayLike, q_tokens: Sequence[int], out: Optional[ArrayLike] = None,
               lse: bool = False, sm_scale: float = 0.0, rotated_output: bool = False,
               stream: Optional[int] = None):
        """Extend attention after an append: ``q_tokens[i]`` query rows of q
        [total_q, num_q_heads, head_dim] for sequence i, at its last
        ``q_tokens[i]`` positions, causal over everything appended (chunked
        prefill, speculative verify, prefix reuse). Returns ``out``, or
        ``(out, lse)`` with ``lse`` [total_q, num_q_heads] float32 when asked."""
        self._check_layer(layer)
        if not isinstance(lse, (bool, np.bool_)):
            # an array here met NumPy's "truth value is ambiguous", naming nothing of this call
            raise TypeError(f"lse is a flag: lse=True returns (out, lse), the LSE in a new array; got "
                            f"{type(lse).__name__}")
        n = _counts(q_tokens, "q_tokens")
        self._check_batch(n, "q_tokens")
        total = _rows(q, "q")
        if n.shape != (self.num_seqs,) or (n < 1).any() or int(n.sum()) != total:
            raise ValueError(f"q_tokens must give {self.num_seqs} counts >= 1 summing to the {total} rows of q "
                             f"(got {n.tolist()})")
        if (n > self.lens[layer]).any():
            raise ValueError(f"layer {layer}: more query tokens than appended tokens "
                             f"(q_tokens {n.tolist()}, lengths {self.lens[layer].tolist()})")
        cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        stream = self.plan._stream(stream)  # every step on it, the grown workspace's init too (as decode)
        need = self.plan.workspace_bytes(max(self.num_seqs, total), self.max_seq_len)
        ws = getattr(self, "_ext_ws", None)
        if ws is None or ws.shape[0] < need:
            if ws is not None and self.plan.runtime.on_device:
                # its error word may hold what the device flagged since the last check(): kept for it
                self._ext_retired.append(ws)
            if self._by_handle:
                ws = self.plan.runtime.alloc((need,), "u8")
            elif _is_torch(self.workspace):
                ws = torch.zeros(need, dtype=torch.uint8, device=self.workspace.device)
            else:
                ws = np.zeros(need, dtype=np.uint8)
            self.plan.workspace_init(ws, stream)
            self._ext_ws = ws
        if out is None:
            out = torch.empty_like(q) if _is_torch(q) else np.empty_like(q)
        lse_buf = None
        if lse:
            lse_buf = (torch.empty((total, self.plan._L.num_q_heads), dtype=torch.float32, device=q.device)
                       if _is_torch(q) else np.empty((total, self.plan._L.num_q_heads), np.float32))
        cu_dev = torch.from_numpy(cu).to(q.device) if _is_torch(q) else cu
        qd, od, ld = q, out, lse_buf
        if self._by_handle:  # OpenCL: host arrays through staging buffers, as decode
            kind = self.plan._L.kv_dtype
            qd, od = self._stage("q", q, kind, stream), self._stage("out", out, kind, stream, copy=False)
            cu_dev = self._stage("cu_q", cu, "i32", stream)
            ld = self._stage("lse", lse_buf, "f32", stream, copy=False) if lse else None
        self.plan.extend(layer, self.pages[layer], self.windows[layer],
                         self._to_dev(self.lens[layer], getattr(self, "_lens_dev", None), stream), self.window_slots,
                         self.block_table, cu_dev, qd, od, ws, int(n.max()), lse=ld, sm_scale=sm_scale,
                         rotated_output=rotated_output, max_seq_len=int(self.lens[layer].max()), stream=stream)
        if self._by_handle:
            out[...] = od.read(stream)
            if lse:
                lse_buf[...] = ld.read(stream)
        return (out, lse_buf) if lse else out

    @_serialized
    def check(self, stream: Optional[int] = None) -> None:
        """Raises the errors GPU kernels flagged (bad rows, indices) since the last check, in append
        and decode (the cache's workspace) and in extend (its own, larger one: a NaN query there was
        flagged in a word nobody read, its output rows zeros), including the extend workspaces
        outgrown since the last check (a larger call replaces it: its flags were dropped unread)."""
        ext = getattr(self, "_ext_ws", None)
        words = [self.workspace, *self._ext_retired, *([ext] if ext is not None else [])]
        first = None
        for w in words:  # every word is read and cleared, whichever raises; the first error is raised
            try:
                self.plan.check(w, stream)
            except OscarError as e:
                first = first or e
        self._ext_retired = []
        if first is not None:
            raise first


# ------------------------------------------------------------ calibration
class Calibrator(_Handle):
    """Two-pass calibration (``oscar_calib``, in liboscar_calib): feed every
    window's post-RoPE q, k, v of each layer in pass 0, again in pass 1,
    then :meth:`finalize`. Options are the C struct's fields
    (group, per_head, method, clip_k, clip_v, holdout_rows, model_hash, sink,
    recent, clip_objective, permutation, rounding, copy_probes, copy_mass_loss,
    clip_per_head, key_attn_weight, threads, probe_queries, clip_margin,
    probe_span, feedback_damp, wide_bits, copy_head_mass, copy_head_clip).

    Threads may share one Calibrator (e.g. a feeder per layer): its calls
    are serialized, as the C API requires (ctypes releases the GIL, and
    concurrent feeds raced in the core's shared scratch rows: wrong targets,
    no error)."""

    def __init__(self, num_layers: int, num_q_heads: int, num_kv_heads: int, head_dim: int, **options: Any):
        self._lock = threading.Lock()
        C = _capi.calib()
        o = _capi.defaults(_capi.CalibOptions, C.oscar_calib_options_default, num_layers, num_q_heads, num_kv_heads,
                           head_dim)
        self._keep = None
        for key, val in options.items():
            if key in ("struct_size", "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "progress",
                       "progress_user") or not hasattr(o, key):
                raise TypeError(f"Calibrator: unknown option {key!r}")
            if key == "method":
                val = method_id(val)
            elif key == "model_hash":
                self._keep = val = _cstr(val, "model_hash")
            elif (dict(o._fields_)[key] is ctypes.c_float and isinstance(val, (int, float, np.number))
                  and not isinstance(val, bool)):
                # e.g. clip_k 1e-50 was 0 in the struct, "fit the clip": a fixed clip silently became a fitted one
                zero = (" (where 0 means: fit the clip)" if key in ("clip_k", "clip_v") else
                        " (oscar_calib_options in oscar.h says what 0 means)")
                val = _f32(val, key, zero)
            setattr(o, key, val)
        h = ctypes.c_void_p()
        _check(C.oscar_calib_create(ctypes.byref(o), ctypes.byref(h)))
        self._C, self._h = C, h
        self.shape = (num_layers, num_q_heads, num_kv_heads, head_dim)

    def begin_pass(self, p: int) -> None:
        with self._lock:
            _check(self._C.oscar_calib_begin_pass(self._h, p))

    def feed(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """q [n, num_q_heads, head_dim], k and v [n, num_kv_heads, head_dim]:
        float32 or float16 host arrays (or bf16 bits as uint16). q may be
        None in pass 1, which reads only k and v."""
        _, hq, hkv, d = self.shape
        kinds = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint16): "bf16"}
        first = np.asarray(k if q is None else q)
        if first.dtype not in kinds:
            raise TypeError(f"{'k' if q is None else 'q'}: dtype {first.dtype}, expected float32, float16 or uint16 "
                            f"(bfloat16 bits)")
        kind = kinds[first.dtype]
        arrs = []  # alive until the call returns
        for x, h, nm in ((q, hq, "q"), (k, hkv, "k"), (v, hkv, "v")):
            a = None if x is None else np.asarray(x)
            if a is not None and a.ndim != 3:  # (np.ascontiguousarray made a 0-d array 1-D: "shape (1,)")
                raise ValueError(f"{nm}: expected a 3-D array [tokens, {h}, {d}], got a {a.ndim}-d array"
                                 + (f" of shape {a.shape}" if a.ndim else ""))
            arrs.append(None if a is None else np.asarray(a, order="C"))
        n = first.shape[0]
        ptrs = [None if a is None else _ptr(a, kind, shp, nm, False)
                for a, shp, nm in zip(arrs, ((n, hq, d), (n, hkv, d), (n, hkv, d)), ("q", "k", "v"))]
        with self._lock:
            _check(self._C.oscar_calib_feed(self._h, layer, n, ptrs[0], ptrs[1], ptrs[2], DTYPES[kind]))

    def set_value_metric(self, layer: int, kv_head: int, M: np.ndarray) -> None:
        d = self.shape[3]
        m = _real(M, np.float64, "M")
        if m.shape != (d, d):
            raise ValueError(f"M: shape {m.shape}, expected ({d}, {d})")
        with self._lock:
            _check(self._C.oscar_calib_set_value_metric(self._h, layer, kv_head, m.ctypes.data))

    def target(self, layer: int, which: str = "k", kv_head: int = 0) -> np.ndarray:
        """C_K (after pass 0) or C_V (after pass 1), d x d float64."""
        d = self.shape[3]
        out = np.empty((d, d), dtype=np.float64)
        with self._lock:
            _check(self._C.oscar_calib_target(self._h, layer, kv_head, _kv(which), out.ctypes.data))
        return out

    def finalize(self) -> Params:
        h = ctypes.c_void_p()
        with self._lock:
            _check(self._C.oscar_calib_finalize(self._h, ctypes.byref(h)))
        return Params(h)

    def layer_report(self, layer: int) -> dict:
        r = _capi.CalibLayerReport()
        with self._lock:
            _check(self._C.oscar_calib_layer_report_get(self._h, layer, ctypes.byref(r)))
        return {"err_k": list(r.err_k), "err_v": list(r.err_v), "clip_k": r.clip_k, "clip_v": r.clip_v}

    def close(self) -> None:
        lock = getattr(self, "_lock", None)  # (absent when __init__ failed before it)
        with lock if lock is not None else contextlib.nullcontext():  # not under another thread's feed
            if self._raw is not None:
                self._C.oscar_calib_destroy(self._raw)
                self._raw = None

    def __del__(self) -> None:
        self.close()
