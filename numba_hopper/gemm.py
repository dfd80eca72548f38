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

Fused epilogues (``alpha``, ``beta``/``c``, ``bias``, ``activation``, ``aux_out``,
``epilogue``, ``row_scale``/``col_scale``) compile into the kernel's epilogue
(kernels/epilogue.py): a call without them runs the plain kernel, unchanged.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import cuda

from ._arrays import DeviceView, device_view
from ._copy import aligned_scratch, copy_2d
from ._device import hopper_device_reason
from .kernels.epilogue import ACTIVATIONS, EpilogueConfig
from .kernels.gemm_sm90 import GEMM_THREADS, GemmConfig, c_box_cols, make_gemm_kernel, max_stages
from .launch import as_stream_handle, device_limits, prepare_launch
from .tensormap import TensorMap

__all__ = ["gemm", "GemmConfig"]

INPUT_DTYPES = ("bf16", "f16")
OUTPUT_DTYPES = ("bf16", "f16", "f32")


def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None,
         out_dtype=None, aux_out=None, epilogue=None, epilogue_args=(), row_scale=None, col_scale=None,
         dtype=None, stream=None, config=None):
    """Return ``a @ b`` for ``a`` of shape (M, K) and ``b`` of shape (K, N), or with a fused
    epilogue ``act(alpha * row_scale[:, None] * col_scale[None, :] * (a @ b) + beta * c + bias)``.

    ``out_dtype``: "bf16", "f16" or "f32" (default: the input dtype, or ``out``'s dtype).
    ``dtype``: how to read ``uint16`` inputs ("bf16" or "f16"), for arrays without bf16.
    ``stream``: a numba, CuPy or PyTorch stream or a raw ``CUstream`` handle; default the
    current PyTorch stream for PyTorch inputs, else the default stream.
    ``config``: a :class:`GemmConfig` to override the kernel choice (layouts and dtypes in
    it are ignored; they come from the arrays).

    Fused epilogue, computed in float32 on the accumulator before the output is rounded
    (each part costs only when given):

    - ``alpha``, ``beta``: scalars; ``c``: an (M, N) matrix (bf16/f16/f32, any layout),
      read only if ``beta != 0`` (BLAS). ``out`` may be ``c`` (in-place update).
    - ``bias``: a vector (bf16/f16/f32) added along ``bias_dim``: 1 = one value per column
      (length N, as ``torch.addmm``), 0 = one per row (length M). Without ``bias_dim`` its
      length decides; when M == N it must be given.
    - ``activation``: None, "relu", "gelu" (erf), "gelu_tanh", "silu" or "sigmoid"
      ("gelu_tanh", "silu" and "sigmoid" use the hardware ``tanh.approx.f32``, relative
      error about 2^-11).
    - ``aux_out``: an (M, N) array (bf16/f16/f32) that receives the value before the
      activation (for a backward pass).
    - ``epilogue``: a ``@cuda.jit(device=True)`` function ``f(value, row, col, *epilogue_args)``
      returning the new value, applied after the activation to every element of the M x N
      output (float32 ``value``, int64 ``row`` and ``col``); ``epilogue_args``: a tuple of
      device arrays and scalars passed through. It is compiled into the kernel (one kernel
      per function), so keep it small: it runs in the registers of the epilogue.
    - ``row_scale`` (length M), ``col_scale`` (length N): float32 vectors.

    Raises ``TypeError`` (dtype, array kind) or ``ValueError`` (shape, layout, device)
    before anything is launched; ``RuntimeError`` when there is no Hopper GPU.
    """
    # Steady state: the same arrays (pointer, shape, strides, dtype) as an earlier call
    # that was fully checked; its plan only needs this call's stream.
    fused = _fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args,
                         row_scale, col_scale)
    key = out is not None and (_array_key(a), _array_key(b), _array_key(out), out_dtype, dtype, config,
                               fused and _fusion_key(fused))
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
    fusion = fused and _fusion(fused, M, N, va.device, dtype)
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
        if fusion:
            raise ValueError("K == 0 with a fused epilogue is not supported")
        _zero_fill(vo, handle)
        return out

    plan = _plan(va, vb, vo, config, fusion)
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


def _plan(va, vb, vo, config, fusion):
    transposed = _is_col_major(vo)
    if transposed:  # out.T (N x M, row-major) = b.T @ a.T
        va, vb, vo = _t(vb), _t(va), _t(vo)
    scratch, copies_in, copy_out = [], [], None
    if fusion:
        fusion = fusion.transposed() if transposed else fusion
        if fusion.c is not None and not _tma_ok(fusion.c, row_major=True):  # C as the output
            copy, owner = aligned_scratch(fusion.c)
            scratch.append(owner)
            copies_in.append((fusion.c, copy))
            fusion = dataclasses.replace(fusion, c=copy)
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
    cfg = _choose_config(va, vb, vo, config, fusion and fusion.config(transposed))
    maps = _tensor_maps(cfg, va, vb, vo)
    M, N = vo.shape
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    grid = min(tiles, device_limits(vo.device).sm_count)
    args = (maps[0].device_ptr, maps[1].device_ptr, maps[2].device_ptr, M, N, va.shape[1])
    if fusion:
        c_map = fusion.c is not None and TensorMap(_canonical(fusion.c), (64, c_box_cols(cfg)),
                                                   swizzle=c_box_cols(cfg) * fusion.c.itemsize)
        maps += (c_map,) if c_map else ()
        args += (fusion.kernel_args(cfg.epilogue, c_map),)
    launch = prepare_launch(make_gemm_kernel(cfg), grid, GEMM_THREADS, args, shared_mem=cfg.shared_bytes)
    return _Plan(launch, maps, copies_in, copy_out, scratch or None)


# --- fused epilogues ---------------------------------------------------------------------

_FUSION_NAMES = ("alpha", "beta", "c", "bias", "bias_dim", "activation", "aux_out", "epilogue", "epilogue_args",
                 "row_scale", "col_scale")


def _fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args, row_scale,
                 col_scale):
    """The epilogue keywords as a dict, or None for a plain GEMM (which then runs the plain kernel)."""
    if (alpha == 1.0 and beta == 0.0 and c is None and bias is None and bias_dim is None and activation is None
            and aux_out is None and epilogue is None and row_scale is None and col_scale is None):
        if epilogue_args:
            raise ValueError("epilogue_args were given without an epilogue function")
        return None
    return dict(zip(_FUSION_NAMES, (alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue,
                                    tuple(epilogue_args), row_scale, col_scale)))


def _fusion_key(f):
    """What identifies a fused call's epilogue for the plan cache (arrays by pointer and layout)."""
    def key(x):
        return _array_key(x) if hasattr(x, "data_ptr") or hasattr(x, "__cuda_array_interface__") else x

    return tuple(tuple(map(key, v)) if n == "epilogue_args" else key(v) for n, v in f.items())


@dataclasses.dataclass(frozen=True)
class _Fusion:
    """A checked fused epilogue: views of its arrays, in the user's (M, N) coordinates."""

    alpha: float
    beta: float
    c: DeviceView | None
    bias: DeviceView | None
    bias_dim: int
    activation: str | None
    aux: DeviceView | None
    user: object
    user_args: tuple
    row_scale: DeviceView | None
    col_scale: DeviceView | None

    def transposed(self):
        """The same epilogue for the kernel that computes ``out.T``."""
        return dataclasses.replace(
            self, c=self.c and _t(self.c), aux=self.aux and _t(self.aux), bias_dim=1 - self.bias_dim,
            row_scale=self.col_scale, col_scale=self.row_scale)

    def config(self, transposed):
        return EpilogueConfig(
            alpha=self.alpha != 1.0, row_scale=self.row_scale is not None, col_scale=self.col_scale is not None,
            c_dtype=self.c and self.c.dtype, bias=self.bias and ("row", "col")[self.bias_dim],
            bias_dtype=self.bias.dtype if self.bias else "f32", activation=self.activation,
            aux_dtype=self.aux and self.aux.dtype, user=self.user, transposed=transposed)

    def kernel_args(self, ecfg, c_map):
        """The kernel's epilogue tuple, in ``ecfg.arg_names`` order."""
        values = dict(c_map=c_map and c_map.device_ptr, alpha=np.float32(self.alpha), beta=np.float32(self.beta),
                      row_scale=self.row_scale, col_scale=self.col_scale, bias=self.bias, aux=self.aux,
                      user_args=tuple(map(_user_arg, self.user_args)))
        return tuple(_numba_array(v) if isinstance(v, DeviceView) else v
                     for v in (values[name] for name in ecfg.arg_names))


def _fusion(f, M, N, device, dtype):
    """Check the epilogue keywords against an (M, N) output; return a :class:`_Fusion`."""
    def view(name, x, shape, dtypes=OUTPUT_DTYPES):
        v = device_view(x)
        if v.dtype == "u16" and dtype:
            v = v.with_dtype(dtype)
        if tuple(v.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(v.shape)}, expected {shape}")
        _check_dtype(f"{name}.dtype", v.dtype, dtypes)
        if v.device != device:
            raise ValueError(f"{name} is on device {v.device}, the inputs on device {device}")
        return v

    if f["activation"] not in (None,) + ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {ACTIVATIONS}; got {f['activation']!r}")
    if f["beta"] != 0.0 and f["c"] is None:
        raise ValueError(f"beta = {f['beta']} needs c")
    c = f["c"] if f["beta"] != 0.0 else None  # BLAS: C is not read when beta == 0
    bias, bias_dim = f["bias"], f["bias_dim"]
    if bias is not None:
        length = device_view(bias).shape[0] if len(device_view(bias).shape) == 1 else None
        if bias_dim is None:
            if M == N:
                raise ValueError(f"bias of length {length} fits rows and columns of the {M} x {N} output: "
                                 "pass bias_dim=0 (one value per row) or bias_dim=1 (per column)")
            bias_dim = {N: 1, M: 0}.get(length)
        if bias_dim not in (0, 1):
            raise ValueError(f"bias_dim must be 0 (per row, length M = {M}) or 1 (per column, length N = {N}); "
                             f"got bias_dim={f['bias_dim']!r} for a bias of shape {device_view(bias).shape}")
    elif bias_dim is not None:
        raise ValueError("bias_dim was given without a bias")
    user = f["epilogue"]
    if user is not None and not hasattr(user, "py_func"):
        raise TypeError(f"epilogue must be a @cuda.jit(device=True) function; got {type(user).__name__}")
    if f["epilogue_args"] and user is None:
        raise ValueError("epilogue_args were given without an epilogue function")
    return _Fusion(
        alpha=float(f["alpha"]), beta=float(f["beta"]),
        c=c if c is None else view("c", c, (M, N)),
        bias=bias if bias is None else view("bias", bias, ((M, N)[bias_dim],)),
        bias_dim=1 if bias_dim is None else bias_dim,
        activation=f["activation"],
        aux=f["aux_out"] if f["aux_out"] is None else view("aux_out", f["aux_out"], (M, N)),
        user=user,
        user_args=f["epilogue_args"],
        row_scale=f["row_scale"] if f["row_scale"] is None else view("row_scale", f["row_scale"], (M,), ("f32",)),
        col_scale=f["col_scale"] if f["col_scale"] is None else view("col_scale", f["col_scale"], (N,), ("f32",)),
    )


def _numba_array(v: DeviceView):
    """A numba device array over a view (16-bit floats as their uint16 bits), for the kernel."""
    return cuda.from_cuda_array_interface(
        {"shape": tuple(v.shape), "strides": v.byte_strides, "typestr": "<f4" if v.itemsize == 4 else "<u2",
         "data": (v.ptr, False), "version": 3},
        owner=None, sync=False)


def _user_arg(x):
    """An epilogue argument as numba can pass it: device arrays become numba arrays."""
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, cuda.devicearray.DeviceNDArray):
        return cuda.as_cuda_array(x, sync=False)
    return x


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


def _choose_config(va, vb, vo, config, epilogue=None):
    a_major = "K" if _tma_ok(va, row_major=True) else "M"
    b_major = "N" if _tma_ok(vb, row_major=True) else "K"
    base = config or GemmConfig()
    stages = config.stages if config else max_stages(
        va.dtype, vo.dtype, base.block_n, device_limits(vo.device).max_shared_per_block_optin,
        a_major=a_major, b_major=b_major, epilogue=epilogue,
    )
    return dataclasses.replace(base, in_dtype=va.dtype, out_dtype=vo.dtype, a_major=a_major,
                               b_major=b_major, stages=stages, epilogue=epilogue)


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

        if dt == "bf16":
            return cupy.empty(shape, dtype=cupy.uint16)
        return cupy.empty(shape, dtype={"f16": cupy.float16, "f32": cupy.float32}[dt])
    from numba import cuda
    import numpy as np

    return cuda.device_array(shape, dtype={"bf16": np.uint16, "f16": np.float16, "f32": np.float32}[dt])


def _array_key(x):
    """What identifies an array's memory layout, read without building a DeviceView."""
    if hasattr(x, "data_ptr"):  # torch
        return x.data_ptr(), x.shape, x.stride(), x.dtype
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

