"""liboscar: OSCAR 2-bit KV cache from Python.

A thin ctypes binding of the C API (include/oscar/oscar.h, docs/API.md):
runtime and backend choice, parameter files, calibration, layouts and
sizes, the paged cache's append and decode. NumPy arrays on the CPU
backend; torch tensors on CUDA (device pointers, the current torch stream);
DeviceBuffer handles (cl_mem) on OpenCL, also in the caller's own context.

>>> import liboscar
>>> rt = liboscar.Runtime("cpu")
>>> liboscar.Layout(num_q_heads=8, num_kv_heads=2).sizes().bits_per_element
2.25
"""
from .core import (DTYPES, Calibrator, DeviceBuffer, Layout, LayoutSizes, OscarError, PagedCache, Params,
                   ParamsInfo, Plan, Runtime, fakequant, from_bf16, method_bits, method_id, method_name, to_bf16,
                   version)

__version__ = version()
__all__ = ["DTYPES", "Calibrator", "DeviceBuffer", "Layout", "LayoutSizes", "OscarError", "PagedCache", "Params",
           "ParamsInfo", "Plan", "Runtime", "fakequant", "from_bf16", "method_bits", "method_id", "method_name",
           "to_bf16", "version", "__version__"]
