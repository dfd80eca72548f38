"""``numba_hopper.gemm``: ``out = a @ b`` on Hopper with the warp-specialized TMA/wgmma kernel.

Inputs are bf16 or fp16 (fp32 accumulation), outputs bf16, fp16 or fp32. Each of ``a``,
``b`` and ``out`` may be row-major or column-major (a leading dimension larger than the
extent is fine); the layouts reach the kernel through the TMA descriptors and the wgmma
transpose bits, never through copies. A column-major ``out`` is computed as
``out.T = b.T @ a.T``, which is the same kernel on swapped, transposed operands.

The fallback that copies: TMA needs 16-byte-aligned base addresses and leading dimensions
that are multiples of 16 bytes. An operand that breaks that (say a row-major bf16 matrix
with 1001 columns, or a slice starting at an odd element) is first copied into an aligned
row-major scratch buffer, and an ``out`` that breaks it (any odd N in bf16) receives the
result through one (``numba_hopper._copy``). Layouts that TMA can read cost no copy.

Arrays: PyTorch tensors (bf16 included), CuPy arrays, numba device arrays and anything with
``__cuda_array_interface__``. numba has no bf16 dtype: hold bf16 data in ``uint16`` arrays
and pass ``dtype="bf16"`` (``out_dtype="bf16"`` then allocates a ``uint16`` result).
The result is of the caller's kind: ``out`` if given, else a new array like ``a``.
"""

from __future__ import annotations

import dataclasses

from ._arrays import DeviceView, device_view
from ._copy import aligned_scratch, copy_2d
from ._device import hopper_device_reason
from .kernels.gemm_sm90 import GEMM_THREADS, GemmConfig, make_gemm_kernel, max_stages
from .launch import as_stream_handle, device_limits, prepare_launch
from .tensormap import TensorMap

__all__ = ["gemm", "GemmConfig"]

INPUT_DTYPES = ("bf16", "f16")
OUTPUT_DTYPES = ("bf16", "f16", "f32")


def gemm(a, b, out=None, *, out_dtype=None, dtype=None, stream=None, config=None):
    """Return ``a @ b`` for ``a`` of shape (M, K) and ``b`` of shape (K, N).

    ``out_dtype``: "bf16", "f16" or "f32" (default: the input dtype, or ``out``'s dtype).
    ``dtype``: how to read ``uint16`` inputs ("bf16" or "f16"), for arrays without bf16.
    ``stream``: a numba, CuPy or PyTorch stream or a raw ``CUstream`` handle; default the
    current PyTorch stream for PyTorch inputs, else the default stream.
    ``config``: a :class:`GemmConfig` to override the kernel choice (layouts and dtypes in
    it are ignored; they come from the arrays).

    Raises ``TypeError`` (dtype, array kind) or ``ValueError`` (shape, layout, device)
    before anything is launched; ``RuntimeError`` when there is no Hopper GPU.
    """
    # Steady state: the same arrays (pointer, shape, strides, dtype) as an earlier call
    # that was fully checked; its plan only needs this call's stream.
    key = out is not None and (_array_key(a), _array_key(b), _array_key(out), out_dtype, dtype, config)
    plan = key and _plans.get(key)
    if plan:
        plan(_stream_handle(stream, a))
        return out

    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    _check_inputs(va, vb)
    M, K = va.shape
    N = vb.shape[1]
    if out is None:
        out_dtype = out_dtype or va.dtype
        _check_dtype("out_dtype", out_dtype, OUTPUT_DTYPES)
    else:
        vo = device_view(out, dtype=out_dtype)
        _check_out(vo, M, N, va.device, out_dtype)
    reason = hopper_device_reason()
    if reason is not None:
        raise RuntimeError(f"numba_hopper.gemm needs a Hopper GPU (compute capability 9.x): {reason}")
    if out is None:
        out = _empty_like(a, (M, N), out_dtype, va)
        vo = device_view(out, dtype=out_dtype if out_dtype == "bf16" else None)
    if M == 0 or N == 0:
        return out
    handle = _stream_handle(stream, a)
    if K == 0:
        _zero_fill(vo, handle)
        return out

    plan = _plan(va, vb, vo, config)
    if key and plan.scratch is None:  # plans with scratch buffers are rebuilt per call
        _plans[key] = plan
        if len(_plans) > PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))
    plan(handle)
    return out


# --- plans: everything about a call but its stream, built once per operand set -----------

PLAN_CACHE_SIZE = 256
_plans: dict = {}


class _Plan:
    """Copies in, the prepared kernel launch, copy out; holds what the launch points at."""

    def __init__(self, launch, tensor_maps, copies_in, copy_out, scratch):
        self.launch, self.tensor_maps = launch, tensor_maps
        self.copies_in, self.copy_out, self.scratch = copies_in, copy_out, scratch

    def __call__(self, stream):
        for src, dst in self.copies_in:
            copy_2d(src, dst, stream)
        self.launch(stream)
        if self.copy_out:
            copy_2d(*self.copy_out, stream)


def _plan(va, vb, vo, config):
    if _is_col_major(vo):  # out.T (N x M, row-major) = b.T @ a.T
        va, vb, vo = _t(vb), _t(va), _t(vo)
    scratch, copies_in, copy_out = [], [], None
    operands = []
    for v in (va, vb):
        if _tma_ok(v, row_major=True) or _tma_ok(v, row_major=False):
            operands.append(v)
        else:
            copy, owner = aligned_scratch(v)
            scratch.append(owner)
            copies_in.append((v, copy))
            operands.append(copy)
    va, vb = operands
    if not _tma_ok(vo, row_major=True):
        result, owner = aligned_scratch(vo)
        scratch.append(owner)
        copy_out, vo = (result, vo), result
    cfg = _choose_config(va, vb, vo, config)
    maps = _tensor_maps(cfg, va, vb, vo)
    M, N = vo.shape
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    grid = min(tiles, device_limits(vo.device).sm_count)
    launch = prepare_launch(
        make_gemm_kernel(cfg), grid, GEMM_THREADS,
        (maps[0].device_ptr, maps[1].device_ptr, maps[2].device_ptr, M, N, va.shape[1]),
        shared_mem=cfg.shared_bytes, cache_key=("gemm_sm90", cfg),
    )
    return _Plan(launch, maps, copies_in, copy_out, scratch or None)


# --- validation ----------------------------------------------------------------------


def _check_dtype(what, dt, allowed):
    if dt not in allowed:
        raise TypeError(f"{what} must be one of {allowed}; got {dt!r}")


def _check_inputs(va: DeviceView, vb: DeviceView):
    for name, v in (("a", va), ("b", vb)):
        if len(v.shape) != 2:
            raise ValueError(f"{name} must be 2-D, got shape {v.shape}")
        _check_dtype(f"{name}.dtype", v.dtype, INPUT_DTYPES)
    if va.dtype != vb.dtype:
        raise TypeError(f"a and b must have the same dtype; got {va.dtype} and {vb.dtype}")
    if va.shape[1] != vb.shape[0]:
        raise ValueError(f"shape mismatch: a is {va.shape}, b is {vb.shape} (a.shape[1] must equal b.shape[0])")
    if va.device != vb.device:
        raise ValueError(f"a is on device {va.device} and b on device {vb.device}")


def _check_out(vo: DeviceView, M, N, device, out_dtype):
    if tuple(vo.shape) != (M, N):
        raise ValueError(f"out has shape {tuple(vo.shape)}, expected {(M, N)}")
    _check_dtype("out.dtype", vo.dtype, OUTPUT_DTYPES)
    if out_dtype is not None and out_dtype != vo.dtype:
        raise TypeError(f"out has dtype {vo.dtype} but out_dtype={out_dtype!r}")
    if vo.device != device:
        raise ValueError(f"out is on device {vo.device}, the inputs on device {device}")


# --- layouts ---------------------------------------------------------------------------


def _t(v: DeviceView) -> DeviceView:
    """The transpose of a 2-D view (no data moves)."""
    return dataclasses.replace(v, shape=v.shape[::-1], strides=v.strides[::-1])


def _is_row_major(v):
    rows, cols = v.shape
    return (v.strides[1] == 1 or cols <= 1) and (v.strides[0] >= cols or rows <= 1)


def _is_col_major(v):
    return not _is_row_major(v) and _is_row_major(_t(v))


def _leading_dim(v):
    """Elements between consecutive rows of a row-major view (>= its width).

    A single row has no meaningful stride (frameworks report anything): use the width
    rounded up to 16 bytes, which is what TMA asks of a stride it never steps.
    """
    if v.shape[0] > 1:
        return v.strides[0]
    pad = 16 // v.itemsize
    return -(-max(v.shape[1], 1) // pad) * pad


def _tma_ok(v, row_major):
    """Can TMA read ``v`` (or its transpose, if not ``row_major``) as a row-major matrix?"""
    w = v if row_major else _t(v)
    return _is_row_major(w) and v.ptr % 16 == 0 and (_leading_dim(w) * v.itemsize) % 16 == 0


def _canonical(v):
    """A row-major view with the strides TMA is given: ``(leading dim, 1)``."""
    return dataclasses.replace(v, strides=(_leading_dim(v), 1))


def _choose_config(va, vb, vo, config):
    a_major = "K" if _tma_ok(va, row_major=True) else "M"
    b_major = "N" if _tma_ok(vb, row_major=True) else "K"
    base = config or GemmConfig()
    stages = config.stages if config else max_stages(
        va.dtype, vo.dtype, base.block_n, device_limits(vo.device).max_shared_per_block_optin,
        a_major=a_major, b_major=b_major,
    )
    return dataclasses.replace(base, in_dtype=va.dtype, out_dtype=vo.dtype, a_major=a_major,
                               b_major=b_major, stages=stages)


def _tensor_maps(cfg, va, vb, vo):
    """TMA descriptors matching the kernel's boxes (see kernels/gemm_sm90.py)."""
    # K-major A: (M, K) rows of 64 k; M-major A: stored (K, M), 64 x 64 boxes.
    if cfg.a_major == "K":
        ta = TensorMap(_canonical(va), (cfg.block_m, 64), swizzle=128)
    else:
        ta = TensorMap(_canonical(_t(va)), (64, 64), swizzle=128)
    # K-major B: stored (N, K); N-major B: (K, N), 64 x 64 boxes.
    if cfg.b_major == "K":
        tb = TensorMap(_canonical(_t(vb)), (cfg.block_n, 64), swizzle=128)
    else:
        tb = TensorMap(_canonical(vb), (64, 64), swizzle=128)
    tc = TensorMap(_canonical(vo), (64, cfg.epi_cols), swizzle=128)
    return ta, tb, tc


# --- arrays of the caller's kind -----------------------------------------------------------


def _empty_like(a, shape, dt, va):
    if va.framework == "torch":
        import torch

        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
        return torch.empty(shape, dtype=tdt, device=a.device)
    if va.framework == "cupy":
        import cupy

        if dt == "bf16":  # CuPy's own bfloat16 (ml_dtypes, CuPy >= 14) if ``a`` is one, else bits
            return cupy.empty(shape, dtype=a.dtype if va.dtype == "bf16" and a.dtype.name == "bfloat16" else cupy.uint16)
        return cupy.empty(shape, dtype={"f16": cupy.float16, "f32": cupy.float32}[dt])
    from numba import cuda
    import numpy as np

    return cuda.device_array(shape, dtype={"bf16": np.uint16, "f16": np.float16, "f32": np.float32}[dt])


def _array_key(x):
    """What identifies an array's memory layout, read without building a DeviceView."""
    if hasattr(x, "data_ptr"):  # torch
        return x.data_ptr(), x.shape, x.stride(), x.dtype
    if type(x).__module__.startswith("cupy"):  # its array interface cannot name bfloat16
        return x.data.ptr, x.shape, x.strides, x.dtype
    cai = x.__cuda_array_interface__
    return cai["data"][0], cai["shape"], cai["strides"], cai["typestr"]


def _stream_handle(stream, a):
    """``stream``'s handle; by default PyTorch's current stream for a PyTorch ``a``."""
    if stream is None and hasattr(a, "data_ptr"):
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher uses
        if raw is not None:
            return raw(a.get_device())
        return torch.cuda.current_stream(a.get_device()).cuda_stream
    return as_stream_handle(stream)


def _zero_fill(v, stream):
    """``v[...] = 0`` for a row- or column-major view, on ``stream``."""
    from cuda.bindings import driver

    w = v if _is_row_major(v) else _t(v)
    rows, cols = w.shape
    pitch = _leading_dim(w) * v.itemsize
    (err,) = driver.cuMemsetD2D8Async(v.ptr, pitch, 0, cols * v.itemsize, rows, stream)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemsetD2D8Async failed: {err}")

