"""Input checks of :func:`numba_hopper.attention`: every bad argument raises before anything runs.

They read only tensor metadata (shape, strides, dtype, device), never data, so they work on CPU,
meta and fake tensors and never wait for the GPU. :func:`check_call` returns the call's
:class:`Problem`; :func:`addressable` says whether TMA can read a tensor in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import DeviceMismatchError, DtypeError, LayoutError, ShapeError, UnsupportedDeviceError
from .config import HEAD_DIMS, AttentionConfig

__all__ = ["Problem", "check_call", "check_config", "check_device", "addressable", "CAUSAL_ALIGNS", "DTYPE_NAMES"]

CAUSAL_ALIGNS = ("bottom_right", "top_left")


def _dtype_names():
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "f16"}


DTYPE_NAMES = None  # filled on first use: {torch dtype: "bf16" | "f16"}


@dataclass(frozen=True)
class Problem:
    """A checked call. Dense: ``batch`` sequences of ``seqlen_q`` queries and ``seqlen_k`` keys;
    packed (``varlen``): ``batch`` sequences in ``total_q`` / ``total_k`` rows, at most
    ``seqlen_q`` / ``seqlen_k`` long (the ``max_seqlen_*`` arguments)."""

    dtype: str
    head_dim: int
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    varlen: bool
    total_q: int
    total_k: int
    causal: bool
    bottom_right: bool
    scale: float

    @property
    def kv_group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def out_shape(self) -> tuple:
        if self.varlen:
            return (self.total_q, self.heads, self.head_dim)
        return (self.batch, self.heads, self.seqlen_q, self.head_dim)

    @property
    def lse_shape(self) -> tuple:
        if self.varlen:
            return (self.heads, self.total_q)
        return (self.batch, self.heads, self.seqlen_q)

    @property
    def empty(self) -> bool:
        """No output row (nothing to launch)."""
        return (self.total_q if self.varlen else self.batch * self.seqlen_q) * self.heads == 0

    @property
    def no_keys(self) -> bool:
        """Every output row sees no key (output 0, log-sum-exp -inf, no launch)."""
        return (self.total_k if self.varlen else self.seqlen_k) == 0


def _shape(t):
    return tuple(int(s) for s in t.shape)


def check_call(q, k, v, causal, causal_align, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               out) -> Problem:
    """Check a call's arguments (the docstring of :func:`numba_hopper.attention` lists the rules);
    return its :class:`Problem` or raise ``DtypeError``, ``ShapeError``, ``LayoutError``,
    ``DeviceMismatchError``, ``TypeError`` or ``ValueError`` naming the argument."""
    import torch

    global DTYPE_NAMES
    if DTYPE_NAMES is None:
        DTYPE_NAMES = _dtype_names()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention: {name} must be a torch.Tensor; got {type(t).__name__}")
    if q.dtype not in DTYPE_NAMES:
        raise DtypeError(f"attention: q must be bfloat16 or float16; got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise DtypeError(f"attention: q, k and v must have one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"attention: causal_align must be one of {CAUSAL_ALIGNS}; got {causal_align!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        dims = _check_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    else:
        if max_seqlen_q is not None or max_seqlen_k is not None:
            raise ValueError("attention: max_seqlen_q / max_seqlen_k go with cu_seqlens_q / cu_seqlens_k (packed "
                             "batches)")
        dims = _check_dense(q, k, v)
    batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, total_q, total_k = dims
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"attention: head dim {head_dim} is not supported; supported: {HEAD_DIMS}")
    if kv_heads == 0 or heads % kv_heads:
        raise ShapeError(f"attention: the query heads ({heads}) must be a multiple of the key/value heads "
                         f"({kv_heads}) (grouped-query attention)")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"attention: scale must be a number; got {type(scale).__name__}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"attention: scale must be positive and finite; got {scale}")
    problem = Problem(DTYPE_NAMES[q.dtype], head_dim, batch, heads, kv_heads, seqlen_q, seqlen_k, varlen, total_q,
                      total_k, bool(causal), causal_align == "bottom_right", scale)
    tensors = [("q", q), ("k", k), ("v", v)] + [(n, t) for n, t in (("cu_seqlens_q", cu_seqlens_q),
                                                                     ("cu_seqlens_k", cu_seqlens_k)) if t is not None]
    if out is not None:
        _check_out(out, q, problem)
        tensors.append(("out", out))
    _check_devices(tensors)
    return problem


def _check_dense(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ShapeError(f"attention: q, k and v must be 4-D (batch, heads, seq, head_dim) (or packed 3-D with "
                         f"cu_seqlens); got shapes {_shape(q)}, {_shape(k)}, {_shape(v)}")
    batch, heads, seqlen_q, head_dim = _shape(q)
    kb, kv_heads, seqlen_k, kd = _shape(k)
    if _shape(v) != _shape(k):
        raise ShapeError(f"attention: v must have k's shape {_shape(k)} (a separate value head dim is not "
                         f"supported); got {_shape(v)}")
    if kb != batch:
        raise ShapeError(f"attention: q and k must have one batch size; got {batch} and {kb}")
    if kd != head_dim:
        raise ShapeError(f"attention: q and k must have one head dim; got {head_dim} and {kd}")
    return batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, batch * seqlen_q, batch * seqlen_k


def _check_packed(q, k, v, cu_q, cu_k, max_q, max_k):
    import torch

    if cu_q is None or cu_k is None:
        raise ValueError("attention: a packed batch needs both cu_seqlens_q and cu_seqlens_k")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ShapeError(f"attention: packed q, k and v must be 3-D (total, heads, head_dim); got shapes "
                         f"{_shape(q)}, {_shape(k)}, {_shape(v)}")
    total_q, heads, head_dim = _shape(q)
    total_k, kv_heads, kd = _shape(k)
    if _shape(v) != _shape(k):
        raise ShapeError(f"attention: v must have k's shape {_shape(k)}; got {_shape(v)}")
    if kd != head_dim:
        raise ShapeError(f"attention: q and k must have one head dim; got {head_dim} and {kd}")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ShapeError(f"attention: {name} must be a 1-D int32 tensor of batch + 1 cumulative offsets; got "
                             f"{getattr(cu, 'dtype', type(cu).__name__)} of shape {_shape(cu) if hasattr(cu, 'shape') else '?'}")
        if cu.stride(0) != 1:
            raise LayoutError(f"attention: {name} must be contiguous")
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ShapeError(f"attention: cu_seqlens_q and cu_seqlens_k must have one length (batch + 1); got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, value in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if value is None:
            raise ValueError(f"attention: a packed batch needs {name} (an int: the longest sequence; reading it "
                             "from cu_seqlens would wait for the GPU)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"attention: {name} must be a non-negative int; got {value!r}")
    return int(cu_q.shape[0]) - 1, heads, kv_heads, int(max_q), int(max_k), head_dim, total_q, total_k


def _check_out(out, q, problem):
    import torch

    if not isinstance(out, torch.Tensor):
        raise TypeError(f"attention: out must be a torch.Tensor; got {type(out).__name__}")
    if _shape(out) != problem.out_shape:
        raise ShapeError(f"attention: out must have q's shape {problem.out_shape}; got {_shape(out)}")
    if out.dtype != q.dtype:
        raise DtypeError(f"attention: out must have q's dtype {q.dtype}; got {out.dtype}")
    if not addressable(out):
        raise LayoutError(f"attention: out's strides {tuple(out.stride())} (or its address) cannot be written by TMA: "
                          "the head dim must be contiguous, the other strides multiples of 16 bytes, the address "
                          "16-byte aligned")


def _check_devices(tensors):
    devices = {t.device for _, t in tensors}
    if len(devices) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in tensors)
        raise DeviceMismatchError(f"attention: every tensor must be on one device; got {where}")
    (device,) = devices
    if device.type != "cuda":
        raise TypeError(f"attention: the tensors are on '{device}'; numba_hopper runs on CUDA tensors (.cuda())")


def check_config(config, problem):
    """An explicit ``config=``: an :class:`AttentionConfig` of the call's head dim and dtype."""
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"attention: config must be an AttentionConfig; got {type(config).__name__}")
    if (config.head_dim, config.dtype) != (problem.head_dim, problem.dtype):
        raise ValueError(f"attention: config is for head dim {config.head_dim}, {config.dtype}; the call has head dim "
                         f"{problem.head_dim}, {problem.dtype}")


def check_device(device):
    """Raise ``UnsupportedDeviceError`` unless ``device`` (a CUDA torch device) is a Hopper GPU."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        raise UnsupportedDeviceError(f"attention: {device} is compute capability {major}.{minor}; the kernels are "
                                     "compiled for sm_90a and run only on Hopper (9.0)")


def addressable(t) -> bool:
    """Whether TMA can read (or write) ``t`` in place: the last dimension contiguous, every other
    dimension of more than one element a positive stride of a multiple of 16 bytes, and a
    16-byte-aligned address."""
    size = t.element_size()
    if t.dim() == 0 or (t.shape[-1] > 1 and t.stride(-1) != 1):
        return False
    for n, s in zip(t.shape[:-1], t.stride()[:-1]):
        if n > 1 and (s <= 0 or s * size % 16):
            return False
    return t.data_ptr() % 16 == 0
