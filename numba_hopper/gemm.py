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
import threading

import numpy as np
from numba import cuda

from ._arrays import DeviceView, device_view
from ._copy import aligned_scratch, copy_2d
from ._device import hopper_device_reason
from .kernels.epilogue import ACTIVATIONS, EpilogueConfig
from .kernels.gemm_sm90 import EPI_ROWS, GemmConfig, c_box_cols, make_gemm_kernel, max_stages
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

__all__ = ["gemm", "bmm", "GemmConfig"]

INPUT_DTYPES = ("bf16", "f16")
OUTPUT_DTYPES = ("bf16", "f16", "f32")


def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None,
         out_dtype=None, aux_out=None, epilogue=None, epilogue_args=(), row_scale=None, col_scale=None,
         dtype=None, stream=None, config=None, debug=None):
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

    A fused epilogue never uses split-K (whose K slices produce partial sums, not outputs).
    Results are deterministic (bitwise the same on every call) on every path: split-K sums
    its slices in a fixed order in a second kernel, and stream-K (``config=GemmConfig(...,
    stream_k=True)``, never chosen automatically: it lost on every shape measured, see
    benchmarks/NOTES.md) adds each tile's partial sums in CTA order.

    ``debug``: run the debug build (bounded pipeline waits) and synchronize; a hang raises
    :class:`~numba_hopper.errors.PipelineHangError` (default: ``NUMBA_HOPPER_DEBUG``).

    Raises, before anything is launched (``numba_hopper.errors``): ``DtypeError``
    (a TypeError: dtypes; array kinds raise a plain TypeError), ``ShapeError``,
    ``LayoutError`` (negative strides, a broadcast ``out``), ``OverlapError`` (``out`` or
    ``aux_out`` sharing memory with an operand; ``out`` may be exactly ``c``),
    ``DeviceMismatchError`` (all ValueErrors) and
    ``UnsupportedDeviceError`` (a RuntimeError) when there is no Hopper GPU. Empty outputs
    launch nothing; ``K == 0`` zero-fills ``out``.
    """
    debug = debug_enabled(debug)
    # Steady state: the same arrays (pointer, shape, strides, dtype) as an earlier call
    # that was fully checked; its plan only needs this call's stream.
    fused = _fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args,
                         row_scale, col_scale)
    key = out is not None and not debug and (
        _array_key(a), _array_key(b), _array_key(out), out_dtype, dtype, config, fused and _fusion_key(fused))
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
        _check_out(vo, (M, N), va.device, out_dtype)
    fusion = fused and _fusion(fused, M, N, va.device, dtype)
    _check_no_overlap(vo if out is not None else None, va, vb, fusion)
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
        if fusion:
            raise ValueError("K == 0 with a fused epilogue is not supported")
        _zero_fill(vo, handle)
        return out

    plan = _plan(va, vb, vo, config, debug, fusion)
    if key and plan.reusable:
        _remember(key, plan)
    plan(handle)
    if debug:
        plan.record.synchronize(handle)
    return out


def bmm(a, b, out=None, *, out_dtype=None, dtype=None, stream=None, config=None):
    """Batched ``out[i] = a[i] @ b[i]`` for ``a`` (B, M, K) and ``b`` (B, K, N): one launch.

    Either operand may be 2-D, or have a batch stride of 0 (``torch.expand``), to use one
    matrix for every batch item. Each matrix may be row- or column-major; batch strides,
    base addresses and leading dimensions must be multiples of 16 bytes (TMA), and
    ``out`` (B, M, N) row-major per matrix: this entry point makes no aligned copies.
    Other arguments as for :func:`gemm` (no fused epilogue: those options are gemm's).
    """
    key = out is not None and ("bmm", _array_key(a), _array_key(b), _array_key(out), out_dtype, dtype, config)
    plan = key and _plans.get(key)
    if plan:
        plan(_stream_handle(stream, a))
        return out
    va, vb = device_view(a, dtype=dtype), device_view(b, dtype=dtype)
    for name, v in (("a", va), ("b", vb)):
        if len(v.shape) not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D, got shape {v.shape}")
    (ba, sa, ma), (bb, sb, mb) = _batch_split(va), _batch_split(vb)
    _check_inputs(ma, mb)
    batch = max(ba, bb)
    if {ba, bb} - {1, batch}:
        raise ValueError(f"batch sizes {ba} and {bb} do not broadcast")
    M, K, N = ma.shape[0], ma.shape[1], mb.shape[1]
    if out is None:
        out_dtype = out_dtype or va.dtype
        _check_dtype("out_dtype", out_dtype, OUTPUT_DTYPES)
    else:
        vo = device_view(out, dtype=out_dtype)
        _check_out(vo, (batch, M, N), va.device, out_dtype)
    reason = hopper_device_reason()
    if reason is not None:
        raise RuntimeError(f"numba_hopper.bmm needs a Hopper GPU (compute capability 9.x): {reason}")
    if out is None:
        out = _empty_like(a, (batch, M, N), out_dtype, va)
        vo = device_view(out, dtype=out_dtype if out_dtype == "bf16" else None)
    if batch == 0 or M == 0 or N == 0:
        return out
    handle = _stream_handle(stream, a)
    _, so, mo = _batch_split(vo)
    if K == 0:
        for i in range(batch):
            _zero_fill(dataclasses.replace(mo, ptr=mo.ptr + i * so * mo.itemsize), handle)
        return out
    for name, m, stride in (("a", ma, sa), ("b", mb, sb), ("out", mo, so)):
        ok = _tma_ok(m, row_major=True) or (name != "out" and _tma_ok(m, row_major=False))
        if not ok or (stride * m.itemsize) % 16:
            raise ValueError(
                f"bmm: {name} must hold {'row-major' if name == 'out' else 'row- or column-major'} matrices "
                f"with 16-byte-aligned base, leading dimension and batch stride; got strides "
                f"{(stride, *m.strides)} (elements) at {m.ptr:#x}"
            )
    cfg = _choose_config(ma, mb, mo, config, debug=False, units=batch)
    plan = _launch_plan(cfg, ma, mb, mo, _Batch(batch, sa, sb, so))
    if key:
        _remember(key, plan)
    plan(handle)
    return out


def _batch_split(v):
    """``(batch count, batch stride in elements (0: broadcast), 2-D view of item 0)``."""
    if len(v.shape) == 2:
        return 1, 0, v
    count, stride = v.shape[0], v.strides[0] if v.shape[0] > 1 else 0
    return count, stride, dataclasses.replace(v, shape=v.shape[1:], strides=v.strides[1:])


# --- plans: everything about a call but its stream, built once per operand set -----------

PLAN_CACHE_SIZE = 256
_plans: dict = {}
_plans_lock = threading.Lock()


def _remember(key, plan):
    with _plans_lock:  # two threads evicting the same oldest plan would KeyError
        _plans[key] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.pop(next(iter(_plans)))


class _Plan:
    """Everything about a call but its stream: copies in, the prepared launch, what follows.

    ``launch_for(stream)`` gives the prepared launch; a split-K plan keeps one fp32
    workspace (and the descriptor pointing at it) per stream, so calls on different
    streams never share one, while calls on one stream are ordered by the stream.
    """

    def __init__(self, launch_for, copies_in=(), finish=None, keep=(), reusable=True, record=None):
        self.launch_for, self.copies_in, self.finish = launch_for, copies_in, finish
        self.keep = keep  # what the launches point at: descriptors, scratch buffers
        self.reusable = reusable  # scratch buffers are per call: such plans are not cached
        self.record = record  # a DebugRecord in debug mode, else None

    def __call__(self, stream):
        for src, dst in self.copies_in:
            copy_2d(src, dst, stream)
        self.launch_for(stream)(stream)
        if self.finish:
            self.finish(stream)


def _plan(va, vb, vo, config, debug, fusion=None):
    transposed = _is_col_major(vo)
    if transposed:  # out.T (N x M, row-major) = b.T @ a.T
        va, vb, vo = _t(vb), _t(va), _t(vo)
    scratch, copies_in = [], []
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
    target = vo
    if not _tma_ok(vo, row_major=True):
        vo, owner = aligned_scratch(vo)
        scratch.append(owner)
    cfg = _choose_config(va, vb, vo, config, debug, fusion and fusion.config(transposed))
    record = DebugRecord() if debug else None
    M, N, K = vo.shape[0], vo.shape[1], va.shape[1]
    # Split-K slices write fp32 partial sums, so an epilogue could only run after the reduce:
    # fused calls simply do not split (GemmConfig refuses split_k > 1 with an epilogue).
    auto_split = not fusion and config is None and not cfg.stream_k
    splits = _split_count(cfg, M, N, K, device_limits(vo.device).sm_count) if auto_split else cfg.split_k
    if splits > 1:
        return _split_k_plan(cfg, va, vb, target, vo, splits, copies_in, scratch, record)
    finish = (lambda stream: copy_2d(vo, target, stream)) if vo is not target else None
    return _launch_plan(cfg, va, vb, vo, _Batch(), record, fusion, copies_in, finish, scratch)


def _launch_plan(cfg, va, vb, vo, batch, record=None, fusion=None, copies_in=(), finish=None, scratch=()):
    """The plan of one launch of ``cfg`` (with a stream-K workspace per stream if it needs one)."""
    if not cfg.stream_k:
        launch, maps = _prepare(cfg, va, vb, vo, batch, record, fusion)
        return _Plan(lambda stream: launch, copies_in, finish, (maps, scratch), not scratch, record)
    from numba import cuda

    M, N, K = vo.shape[0], vo.shape[1], va.shape[1]
    tiles = batch.count * -(-M // cfg.block_m) * -(-N // cfg.block_n)
    k_blocks, sms = -(-K // 64), device_limits(vo.device).sm_count
    grid, dp_tiles = _stream_k_schedule(tiles, k_blocks, sms)
    if (tiles - dp_tiles) * k_blocks * grid >= 2**32:  # the kernel's run bounds are 32-bit
        raise ValueError(f"stream_k: {tiles} tiles of {k_blocks} k-blocks are too many for its 32-bit index math")
    flags_offset = grid * 2 * cfg.partial_bytes
    per_stream = {}

    def launch_for(stream):
        if stream not in per_stream:  # flags start at zero, and each launch leaves them so
            ws = cuda.device_array(flags_offset + grid * 2 * 4, dtype=np.uint8)
            addr = ws.device_ctypes_pointer.value
            _memset(addr + flags_offset, grid * 2 * 4, stream)
            launch, maps = _prepare(cfg, va, vb, vo, batch, record, fusion, grid, dp_tiles, addr)
            per_stream[stream] = (launch, ws, maps)
        return per_stream[stream][0]

    return _Plan(launch_for, copies_in, finish, (per_stream, scratch), not scratch, record)


@dataclasses.dataclass(frozen=True)
class _Batch:
    """The batch (or K-slice) dimension of a launch: unit count and element strides."""

    count: int = 1
    a: int = 0  # 0: one A for every unit
    b: int = 0
    c: int = 0
    k_split: int = 0  # k-blocks per unit when the units are K slices


def _prepare(cfg, va, vb, vo, batch, record=None, fusion=None, grid=None, dp_tiles=0, workspace=0):
    """Descriptors and the prepared persistent launch of ``cfg`` over ``batch`` units.

    ``fusion``: the fused epilogue of a single (count 1) product, in kernel coordinates.
    ``grid``, ``dp_tiles``, ``workspace``: a stream-K launch's (:func:`_stream_k_schedule`).
    """
    maps = _tensor_maps(cfg, va, vb, vo, batch)
    M, N, K = vo.shape[0], vo.shape[1], va.shape[1]
    kernel = make_gemm_kernel(cfg)
    args = (maps[0].device_ptr, maps[1].device_ptr, maps[2].device_ptr, M, N, K, batch.count,
            int(batch.a != 0), int(batch.b != 0), batch.k_split, dp_tiles, workspace,
            record.address if record else 0)
    if fusion:
        cols = fusion.c is not None and c_box_cols(cfg)
        c_map = cols and TensorMap(_batched(fusion.c, 1, 0), (1, EPI_ROWS, cols), swizzle=cols * fusion.c.itemsize)
        maps += (c_map,) if c_map else ()
        args += (fusion.kernel_args(cfg.epilogue, c_map),)
    # The on-disk cache keys a kernel on the package's sources and the config's repr; a
    # user epilogue function is neither (its repr is an address, its code is the caller's),
    # so such kernels are compiled in every process rather than risk loading a stale one.
    user_code = cfg.epilogue is not None and cfg.epilogue.user is not None
    cache_key = None if user_code else ("gemm_sm90", cfg)
    # Persistent grid: as many CTAs (in whole clusters) as can be resident at once, and no
    # more than there is work for.
    cluster_tiles = batch.count * -(-M // (cfg.block_m * cfg.cluster_m)) * -(-N // (cfg.block_n * cfg.cluster_n))
    if cfg.cluster_size > 1:
        resident = max_active_clusters(kernel, cfg.cluster_size, cfg.threads, args,
                                       shared_mem=cfg.shared_bytes, cache_key=cache_key)
    else:
        resident = device_limits(vo.device).sm_count
    launch = prepare_launch(
        kernel, grid or min(cluster_tiles, resident) * cfg.cluster_size, cfg.threads, args,
        cluster=cfg.cluster_size if cfg.cluster_size > 1 else None, shared_mem=cfg.shared_bytes,
        cache_key=cache_key,
    )
    return launch, maps


def _split_count(cfg, M, N, K, sms):
    """K slices for a product with too few output tiles to fill the GPU (1: no split).

    Each slice writes fp32 partials that a second kernel sums in a fixed order, so the
    result is deterministic. The workspace round trip and the second launch cost more than
    idle SMs unless most SMs would idle and K is long: measured (benchmarks/NOTES.md), two
    slices lost at 1024^3 (0.47x vs 0.67x cuBLAS), and at 64x4096x4096 with 128x64 tiles
    (64 tiles on 132 SMs; 0.52x vs 0.61x). So: at most a quarter of the SMs busy, >= 128
    k-blocks, >= 32 per slice.
    """
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    k_blocks = -(-K // 64)
    if 4 * tiles > sms or k_blocks < 128:
        return 1
    return max(1, min(sms // tiles, k_blocks // 32, 16))


def _split_k_plan(cfg, va, vb, target, vo, splits, copies_in, scratch, record):
    from numba import cuda

    from .kernels.splitk import prepare_reduce

    M, N, K = vo.shape[0], vo.shape[1], va.shape[1]
    k_blocks = -(-K // 64)
    k_split = -(-k_blocks // splits)  # k-blocks per slice
    cfg = dataclasses.replace(cfg, out_dtype="f32", stages=max_stages(
        cfg.in_dtype, "f32", cfg.block_n, device_limits(vo.device).max_shared_per_block_optin,
        a_major=cfg.a_major, b_major=cfg.b_major, block_m=cfg.block_m))
    ld = -(-N // 4) * 4
    per_stream = {}

    def launch_for(stream):
        if stream not in per_stream:
            ws = cuda.device_array((splits, M, ld), dtype="float32")
            view = DeviceView(ws.device_ctypes_pointer.value, (M, N), (ld, 1), "f32", 4, vo.device, "numba")
            launch, maps = _prepare(cfg, va, vb, view, _Batch(splits, 0, 0, M * ld, k_split), record)
            per_stream[stream] = (launch, prepare_reduce(ws, N, target), ws, maps)
        return per_stream[stream][0]

    def finish(stream):
        per_stream[stream][1](stream)

    return _Plan(launch_for, copies_in, finish, (per_stream, scratch), not scratch, record)


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
            raise ShapeError(f"{name} has shape {tuple(v.shape)}, expected {shape}")
        _check_dtype(f"{name}.dtype", v.dtype, dtypes)
        if v.device != device:
            raise DeviceMismatchError(f"{name} is on device {v.device}, the inputs on device {device}")
        _check_strides(name, v)
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


def _check_out(vo: DeviceView, shape, device, out_dtype):
    if tuple(vo.shape) != shape:
        raise ShapeError(f"out has shape {tuple(vo.shape)}, expected {shape}")
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


def _check_no_overlap(vo, va: DeviceView, vb: DeviceView, fusion=None):
    """What the kernel writes (``out``, ``aux_out``) must not share memory with anything else
    it reads or writes: it reads them while it writes.

    Judged by address ranges (conservative for interleaved views). The one allowed overlap
    is ``c`` being exactly ``out`` (in place): each element of C is read by the CTA that
    then writes it, before it writes it. ``vo``: None for an output allocated here.
    """
    c = fusion and fusion.c
    aux = fusion and fusion.aux
    written = [(name, v) for name, v in (("out", vo), ("aux_out", aux)) if v is not None]
    for i, (wname, w) in enumerate(written):
        others = [("a", va), ("b", vb), *written[i + 1:]]
        if c is not None and not (wname == "out" and _same_view(c, w)):
            others.append(("c", c))
        for name, v in others:
            if 0 not in w.shape and 0 not in v.shape:
                (lo, hi), (vlo, vhi) = _byte_range(w), _byte_range(v)
                if lo < vhi and vlo < hi:
                    raise OverlapError(f"{wname} [0x{lo:x}, 0x{hi:x}) overlaps {name} [0x{vlo:x}, 0x{vhi:x})")


def _same_view(v: DeviceView, w: DeviceView):
    return (v.ptr, tuple(v.shape), tuple(v.strides), v.itemsize) == (w.ptr, tuple(w.shape), tuple(w.strides), w.itemsize)


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


# Relative time per output column of a tile, from benchmarks/NOTES.md (1792x1280x4096, one
# wave each): a narrower tile reads A from shared memory for fewer columns of MMA.
TILE_COST = {256: 1.0, 192: 1.075, 160: 1.07, 128: 1.065, 64: 1.52}
# The fewest k-blocks a stream-K CTA gets (more CTAs would only add fix-ups).
SK_MIN_ITERS = 4


def _tile_shape(M, N, units, sms, fused=False):
    """``(block_m, block_n)``: the tile with the shortest estimated run.

    Rows: 64 when M <= 64, where half of a 128-row tile would be padding (measured at
    64x4096x4096: 0.94x cuBLAS with 64x64 tiles, 0.58x with 128x64). Width: waves of tiles x
    width x tile cost; wave quantization decides: 1792x1280 takes 112 tiles of 128x160 (one
    wave on 132 SMs) rather than 70 of 128x256 (also one wave, of slower tiles); a skinny
    128x8192 takes 128 tiles of 128x64 rather than leaving 100 SMs idle with 32 tiles of
    128x256. Ties go to the wider tile. A fused epilogue has no 160-wide kernel.
    """
    def estimate(bn):
        tiles = units * -(-M // 128) * -(-N // bn)
        return -(-tiles // sms) * bn * TILE_COST[bn]

    return 64 if M <= 64 else 128, min((bn for bn in TILE_COST if not (fused and bn % 64)), key=estimate)


def _stream_k_schedule(tiles, k_blocks, sms):
    """``(grid, dp_tiles)`` of a stream-K launch of ``tiles`` tiles of ``k_blocks`` each.

    With at least one full wave, all but the last full wave are data-parallel and the last
    full wave plus the partial one are stream-K: every CTA gets one to two tiles' worth of
    k-iterations, so a tile is shared by at most three CTAs. With less than one wave, all
    tiles are stream-K, over at most as many CTAs as leave each ``SK_MIN_ITERS``.
    """
    full = tiles // sms
    if full == 0:
        return max(1, min(sms, tiles * k_blocks // SK_MIN_ITERS)), 0
    return sms, (full - 1) * sms


def _cluster_pays(tiles, K, sms):
    """Whether a 1x2 cluster (the two CTAs of a tile row share their A tile through multicast)
    beats single CTAs: only with many tiles per CTA and a long K loop. Measured (session 4,
    benchmarks/NOTES.md): +4.5% at 16384x4096x4096 (15.5 tiles per CTA), even at 8192^3, but
    -2.5% at 4096^3 (3.9), -5% at 6144^3 (8.7), -3% at 8192x8192x1024, -10% at 4096x4096x512.
    """
    return tiles >= 12 * sms and K >= 2048


def _choose_config(va, vb, vo, config, debug, epilogue=None, units=1):
    """The kernel for these operands: ``config``'s tiling, or the default heuristic's.

    Default: the tile :func:`_tile_shape` picks for ``units`` products, the deepest ring
    that fits, and a 1x2 cluster where :func:`_cluster_pays`.
    """
    a_major = "K" if _tma_ok(va, row_major=True) else "M"
    b_major = "N" if _tma_ok(vb, row_major=True) else "K"
    limits = device_limits(vo.device)
    if config is None:
        M, N = vo.shape
        block_m, block_n = _tile_shape(M, N, units, limits.sm_count, fused=epilogue is not None)
        base = GemmConfig(block_m=block_m, block_n=block_n)
        tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
        if block_m == 128 and tiles_n >= 2 and _cluster_pays(units * tiles_m * tiles_n, va.shape[1], limits.sm_count):
            base = dataclasses.replace(base, cluster_n=2)
        stages = max_stages(va.dtype, vo.dtype, base.block_n, limits.max_shared_per_block_optin,
                            a_major=a_major, b_major=b_major, block_m=base.block_m, epilogue=epilogue)
    else:
        base, stages = config, config.stages
    cfg = dataclasses.replace(base, in_dtype=va.dtype, out_dtype=vo.dtype, a_major=a_major,
                              b_major=b_major, stages=stages, debug=debug, epilogue=epilogue)
    if cfg.shared_bytes > limits.max_shared_per_block_optin:
        raise ValueError(f"config needs {cfg.shared_bytes} bytes of shared memory with these operands, more than "
                         f"the device's {limits.max_shared_per_block_optin}: give it fewer stages")
    return cfg


def _tensor_maps(cfg, va, vb, vo, batch):
    """3-D TMA descriptors (batch outermost) matching the kernel's boxes (gemm_sm90.py)."""
    # K-major A: (M, K) rows of 64 k; M-major A: stored (K, M), 64 x 64 boxes.
    ta = TensorMap(_batched(va if cfg.a_major == "K" else _t(va), batch.count, batch.a), cfg.a_box, swizzle=128)
    # K-major B: stored (N, K); N-major B: (K, N), 64 x 64 boxes.
    tb = TensorMap(_batched(_t(vb) if cfg.b_major == "K" else vb, batch.count, batch.b), cfg.b_box,
                   swizzle=cfg.b_swizzle)
    tc = TensorMap(_batched(vo, batch.count, batch.c), cfg.c_box, swizzle=cfg.epi_swizzle)
    return ta, tb, tc


def _batched(v, count, stride):
    """The row-major 2-D view ``v`` repeated ``count`` times, ``stride`` elements apart.

    A ``stride`` of 0 (one matrix for every unit) is a batch dimension of 1: the kernel
    reads it at batch coordinate 0. TMA wants every stride a multiple of 16 bytes, also of
    a dimension of 1, so a single matrix gets its own size as the stride.
    """
    v = _canonical(v)
    if stride == 0:
        count, stride = 1, v.shape[0] * v.strides[0]
    return dataclasses.replace(v, shape=(count, *v.shape), strides=(stride, *v.strides))


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


def _memset(addr, nbytes, stream):
    from cuda.bindings import driver

    (err,) = driver.cuMemsetD8Async(addr, 0, nbytes, stream)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemsetD8Async failed: {err}")


def _zero_fill(v, stream):
    """``v[...] = 0`` for a row- or column-major view, on ``stream``."""
    from cuda.bindings import driver

    w = v if _is_row_major(v) else _t(v)
    rows, cols = w.shape
    pitch = _leading_dim(w) * v.itemsize
    (err,) = driver.cuMemsetD2D8Async(v.ptr, pitch, 0, cols * v.itemsize, rows, stream)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemsetD2D8Async failed: {err}")

