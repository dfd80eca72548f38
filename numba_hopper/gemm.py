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
import threading

from ._arrays import DeviceView, device_view
from ._copy import aligned_scratch, copy_2d
from ._device import hopper_device_reason
from .kernels.gemm_sm90 import GEMM_THREADS, GemmConfig, make_gemm_kernel, max_stages
from .debug import DebugRecord, debug_enabled
from .errors import (
    DeviceMismatchError,
    DtypeError,
    LayoutError,
    OverlapError,
    ShapeError,
    UnsupportedDeviceError,
)
from .launch import as_stream_handle, device_limits, max_active_clusters, prepare_launch
from .tensormap import TensorMap

__all__ = ["gemm", "GemmConfig"]

INPUT_DTYPES = ("bf16", "f16")
OUTPUT_DTYPES = ("bf16", "f16", "f32")


def gemm(a, b, out=None, *, out_dtype=None, dtype=None, stream=None, config=None, debug=None):
    """Return ``a @ b`` for ``a`` of shape (M, K) and ``b`` of shape (K, N).

    ``out_dtype``: "bf16", "f16" or "f32" (default: the input dtype, or ``out``'s dtype).
    ``dtype``: how to read ``uint16`` inputs ("bf16" or "f16"), for arrays without bf16.
    ``stream``: a numba, CuPy or PyTorch stream or a raw ``CUstream`` handle; default the
    current PyTorch stream for PyTorch inputs, else the default stream.
    ``config``: a :class:`GemmConfig` to override the kernel choice (layouts and dtypes in
    it are ignored; they come from the arrays).

    ``debug``: run the debug build (bounded pipeline waits) and synchronize; a hang raises
    :class:`~numba_hopper.errors.PipelineHangError` (default: ``NUMBA_HOPPER_DEBUG``).

    Raises, before anything is launched (``numba_hopper.errors``): ``DtypeError``
    (a TypeError: dtypes; array kinds raise a plain TypeError), ``ShapeError``,
    ``LayoutError`` (negative strides, a broadcast ``out``), ``OverlapError`` (``out``
    sharing memory with ``a`` or ``b``), ``DeviceMismatchError`` (all ValueErrors) and
    ``UnsupportedDeviceError`` (a RuntimeError) when there is no Hopper GPU. Empty outputs
    launch nothing; ``K == 0`` zero-fills ``out``.
    """
    debug = debug_enabled(debug)
    # Steady state: the same arrays (pointer, shape, strides, dtype) as an earlier call
    # that was fully checked; its plan only needs this call's stream.
    key = out is not None and not debug and (
        _array_key(a), _array_key(b), _array_key(out), out_dtype, dtype, config)
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
        _check_no_overlap(vo, va, vb)
    reason = hopper_device_reason()
    if reason is not None:
        raise UnsupportedDeviceError(f"numba_hopper.gemm needs a Hopper GPU (compute capability 9.x): {reason}")
    if out is None:
        out = _empty_like(a, (M, N), out_dtype, va)
        vo = device_view(out, dtype=out_dtype if out_dtype == "bf16" else None)
    if M == 0 or N == 0:
        return out
    handle = _stream_handle(stream, a)
    if K == 0:
        _zero_fill(vo, handle)
        return out

    plan = _plan(va, vb, vo, config, debug)
    if key and plan.scratch is None:  # plans with scratch buffers are rebuilt per call
        with _plans_lock:  # two threads evicting the same oldest plan would KeyError
            _plans[key] = plan
            while len(_plans) > PLAN_CACHE_SIZE:
                _plans.pop(next(iter(_plans)))
    plan(handle)
    if debug:
        plan.record.synchronize(handle)
    return out


# --- plans: everything about a call but its stream, built once per operand set -----------

PLAN_CACHE_SIZE = 256
_plans: dict = {}
_plans_lock = threading.Lock()


class _Plan:
    """Copies in, the prepared kernel launch, copy out; holds what the launch points at."""

    def __init__(self, launch, tensor_maps, copies_in, copy_out, scratch, record):
        self.launch, self.tensor_maps = launch, tensor_maps
        self.copies_in, self.copy_out, self.scratch = copies_in, copy_out, scratch
        self.record = record  # a DebugRecord in debug mode, else None

    def __call__(self, stream):
        for src, dst in self.copies_in:
            copy_2d(src, dst, stream)
        self.launch(stream)
        if self.copy_out:
            copy_2d(*self.copy_out, stream)


def _plan(va, vb, vo, config, debug):
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
    cfg = _choose_config(va, vb, vo, config, debug)
    maps = _tensor_maps(cfg, va, vb, vo)
    M, N = vo.shape
    kernel = make_gemm_kernel(cfg)
    record = DebugRecord() if debug else None
    args = (maps[0].device_ptr, maps[1].device_ptr, maps[2].device_ptr, M, N, va.shape[1],
            record.address if record else 0)
    # Persistent grid: as many CTAs (in whole clusters) as can be resident at once, and no
    # more than there is work for.
    cluster_tiles = -(-M // (cfg.block_m * cfg.cluster_m)) * -(-N // (cfg.block_n * cfg.cluster_n))
    if cfg.cluster_size > 1:
        resident = max_active_clusters(kernel, cfg.cluster_size, GEMM_THREADS, args,
                                       shared_mem=cfg.shared_bytes, cache_key=("gemm_sm90", cfg))
    else:
        resident = device_limits(vo.device).sm_count
    launch = prepare_launch(
        kernel, min(cluster_tiles, resident) * cfg.cluster_size, GEMM_THREADS, args,
        cluster=cfg.cluster_size if cfg.cluster_size > 1 else None, shared_mem=cfg.shared_bytes,
        cache_key=("gemm_sm90", cfg),
    )
    return _Plan(launch, maps, copies_in, copy_out, scratch or None, record)


# --- validation ----------------------------------------------------------------------


def _check_dtype(what, dt, allowed):
    if dt not in allowed:
        raise DtypeError(f"{what} must be one of {allowed}; got {dt!r}")


def _check_strides(name, v: DeviceView):
    # Negative strides (flipped views) are refused rather than copied: the copy path reads
    # through numba arrays, and a silent copy would hide a likely mistake.
    if any(s < 0 for s in v.strides):
        raise LayoutError(f"{name} has negative strides {v.strides}; pass a copy (e.g. .contiguous())")


def _check_inputs(va: DeviceView, vb: DeviceView):
    for name, v in (("a", va), ("b", vb)):
        if len(v.shape) != 2:
            raise ShapeError(f"{name} must be 2-D, got shape {v.shape}")
        _check_dtype(f"{name}.dtype", v.dtype, INPUT_DTYPES)
        _check_strides(name, v)
    if va.dtype != vb.dtype:
        raise DtypeError(f"a and b must have the same dtype; got {va.dtype} and {vb.dtype}")
    if va.shape[1] != vb.shape[0]:
        raise ShapeError(f"shape mismatch: a is {va.shape}, b is {vb.shape} (a.shape[1] must equal b.shape[0])")
    if va.device != vb.device:
        raise DeviceMismatchError(f"a is on device {va.device} and b on device {vb.device}")


def _check_out(vo: DeviceView, M, N, device, out_dtype):
    if tuple(vo.shape) != (M, N):
        raise ShapeError(f"out has shape {tuple(vo.shape)}, expected {(M, N)}")
    _check_dtype("out.dtype", vo.dtype, OUTPUT_DTYPES)
    if out_dtype is not None and out_dtype != vo.dtype:
        raise DtypeError(f"out has dtype {vo.dtype} but out_dtype={out_dtype!r}")
    if vo.device != device:
        raise DeviceMismatchError(f"out is on device {vo.device}, the inputs on device {device}")
    _check_strides("out", vo)
    if 0 not in vo.shape and any(s == 0 and n > 1 for s, n in zip(vo.strides, vo.shape)):
        raise LayoutError(f"out has a zero stride {vo.strides} (a broadcast view): its elements alias")


def _byte_range(v: DeviceView):
    """``[first, last)`` bytes that ``v``'s elements span (strides are non-negative here)."""
    last = v.ptr + sum((n - 1) * s for n, s in zip(v.shape, v.byte_strides)) + v.itemsize
    return v.ptr, last


def _check_no_overlap(vo: DeviceView, va: DeviceView, vb: DeviceView):
    """``out`` must not share memory with an input: the kernel reads them while it writes.

    Judged by address ranges (conservative for interleaved views). Once epilogues read a
    ``c`` operand, ``out`` being exactly ``c`` (in place) will be the one allowed overlap.
    """
    if 0 in vo.shape:
        return
    lo, hi = _byte_range(vo)
    for name, v in (("a", va), ("b", vb)):
        if 0 not in v.shape:
            vlo, vhi = _byte_range(v)
            if lo < vhi and vlo < hi:
                raise OverlapError(f"out [0x{lo:x}, 0x{hi:x}) overlaps {name} [0x{vlo:x}, 0x{vhi:x})")


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


def _choose_config(va, vb, vo, config, debug):
    """The kernel for these operands: ``config``'s tiling, or the default heuristic's.

    Default: 128x256 tiles, the deepest ring that fits, and a 1x2 cluster (the two CTAs of
    a tile row share their A tile through multicast) once every CTA has at least two tiles
    to do: measured +3-8% over no cluster from 4096^3 up, -6% at 2048^3 (one tile per CTA),
    benchmarks/NOTES.md.
    """
    a_major = "K" if _tma_ok(va, row_major=True) else "M"
    b_major = "N" if _tma_ok(vb, row_major=True) else "K"
    limits = device_limits(vo.device)
    if config is None:
        M, N = vo.shape
        base = GemmConfig()
        tiles_m, tiles_n = -(-M // base.block_m), -(-N // base.block_n)
        if tiles_n >= 2 and tiles_m * tiles_n >= 2 * limits.sm_count:
            base = dataclasses.replace(base, cluster_n=2)
        stages = max_stages(va.dtype, vo.dtype, base.block_n, limits.max_shared_per_block_optin,
                            a_major=a_major, b_major=b_major)
    else:
        base, stages = config, config.stages
    return dataclasses.replace(base, in_dtype=va.dtype, out_dtype=vo.dtype, a_major=a_major,
                               b_major=b_major, stages=stages, debug=debug)


def _tensor_maps(cfg, va, vb, vo):
    """TMA descriptors matching the kernel's boxes (see kernels/gemm_sm90.py)."""
    # K-major A: (M, K) rows of 64 k; M-major A: stored (K, M), 64 x 64 boxes.
    ta = TensorMap(_canonical(va if cfg.a_major == "K" else _t(va)), cfg.a_box, swizzle=128)
    # K-major B: stored (N, K); N-major B: (K, N), 64 x 64 boxes.
    tb = TensorMap(_canonical(_t(vb) if cfg.b_major == "K" else vb), cfg.b_box, swizzle=128)
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

