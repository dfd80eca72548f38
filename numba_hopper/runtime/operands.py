"""What the call path reads of the caller's arrays and streams, kept cheap: it runs every call.

- :func:`describe`: an array's layout signature (what decides a plan: framework, shape,
  strides, dtype, device, 16-byte alignment) and its address, read straight from the
  framework's attributes (no :class:`~numba_hopper.runtime.arrays.DeviceView`, no driver call for
  PyTorch and CuPy);
- :func:`empty_like`: a new CuPy or numba output through the caller's framework (CuPy's
  pool, numba);
- :func:`current_torch_stream`: PyTorch's current ``CUstream`` (the default for its tensors).

Nothing here imports torch or cupy until their arrays are seen.
"""

from __future__ import annotations

import functools

from .arrays import _pointer_device

__all__ = ["describe", "empty_like", "current_torch_stream"]


def _describe_torch(t):
    ptr = t.data_ptr()  # get_device(): the CUDA ordinal, -1 on the CPU (an int: cheaper than .device)
    return ("torch", t.shape, t.stride(), t.dtype, t.get_device(), ptr % 16 == 0), ptr


def _describe_cupy(a):
    ptr = a.data.ptr
    return ("cupy", a.shape, a.strides, a.dtype, a.device.id, ptr % 16 == 0), ptr


def _describe_cai(x):
    cai = x.__cuda_array_interface__
    ptr = cai["data"][0]
    device = _pointer_device(ptr) if ptr else 0
    return ("cai", cai["shape"], cai.get("strides"), cai["typestr"], device, ptr % 16 == 0, cai.get("mask")), ptr


def _undescribable(x):
    return None, 0  # never a plan's key: the checks on the slow path say what is wrong


def _describer(x):
    root = (type(x).__module__ or "").split(".", 1)[0]
    if root == "torch" and hasattr(x, "data_ptr"):
        return _describe_torch
    if root == "cupy" and hasattr(x, "data") and hasattr(x, "device"):
        return _describe_cupy
    if hasattr(x, "__cuda_array_interface__"):
        return _describe_cai
    return _undescribable


_describers: dict = {}


def describe(x):
    """``(signature, address)`` of an array: equal signatures mean the same plan applies."""
    fn = _describers.get(type(x))
    if fn is None:
        fn = _describers.setdefault(type(x), _describer(x))
    return fn(x)


def empty_like(a, shape, dtype, framework):
    """An uninitialized CuPy or numba array of ``a``'s kind (``framework`` as ``DeviceView``
    names it); PyTorch outputs come from ``matmul``'s faster maker."""
    if framework == "cupy":
        import cupy

        if dtype == "bf16":  # CuPy's own bfloat16 (ml_dtypes, CuPy >= 14) if ``a`` is one, else bits
            return cupy.empty(shape, dtype=a.dtype if a.dtype.name == "bfloat16" else cupy.uint16)
        return cupy.empty(shape, dtype={"f16": cupy.float16, "f32": cupy.float32, "e4m3": cupy.uint8,
                                        "e5m2": cupy.uint8}[dtype])
    import numpy as np
    from numba import cuda

    return cuda.device_array(shape, dtype={"bf16": np.uint16, "f16": np.float16, "f32": np.float32, "e4m3": np.uint8,
                                           "e5m2": np.uint8}[dtype])


def current_torch_stream(device):
    """A function giving PyTorch's current ``CUstream`` on ``device``. PyTorch's own binding
    (what Triton's launcher uses) costs a fraction of a driver call through cuda-python, and
    this runs on every call."""
    import torch

    return functools.partial(torch._C._cuda_getCurrentRawStream, device)
