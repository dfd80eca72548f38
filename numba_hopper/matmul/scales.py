"""FP8 scaling keywords (``scale_a``, ``scale_b``) mapped onto the fused epilogue, or the mainloop.

``(scale_a * A) @ (B * scale_b) = scale_a[:, None] * scale_b[None, :] * (A @ B)``, so
per-tensor and row-wise scales are factors of the f32 accumulator in the epilogue
(``numba_hopper.kernels.epilogue``), never applied to the operands:

- a Python number (per-tensor) multiplies into ``alpha``;
- a one-element float32 device array (per-tensor: shape (), (1,) or (1, 1)) is read by the
  kernel as a stride-0 vector, ``row_scale`` for ``scale_a`` and ``col_scale`` for
  ``scale_b``: its value never comes back to the host (no synchronization; a CUDA graph
  replays whatever the array holds then);
- a float32 vector of M (``scale_a``) or N (``scale_b``) values (row-wise; also as
  ``torch._scaled_mm`` shapes them, (M, 1) and (1, N)) is ``row_scale`` / ``col_scale``.

Block-wise (DeepSeek-V3's recipe): ``scale_a`` (M, ceil(K / 128)), one per row and 128 K,
with ``scale_b`` (ceil(K / 128), ceil(N / 128)), one per 128 x 128 block of B (K, N): the
factor changes along K, so it cannot wait for the epilogue. The pair goes to the kernel's
mainloop (operands ``a_block_scales``/``b_block_scales``), which applies it to each k-block's
product (two-level accumulation, ``numba_hopper.kernels.mainloop.promoted``). Any strides:
torch's (M, K/128) scale_a with strides (1, M) and DeepGEMM's row-major ones alike.
"""

from __future__ import annotations

from numbers import Real

from .fusion import NUMBER
from .plan import values_packer
from ..runtime.arrays import device_view
from ..runtime.operands import describe
from ..errors import DtypeError, ShapeError
from ..kernels.gemm_config import KBLOCK_SCALE

__all__ = ["fold_scales", "scale_signature", "scale_binder", "NUMBER"]

_F32_NAMES = ("torch.float32", "float32", "<f4")


def _shape(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = device_view(x).shape  # (what is no device array: its TypeError)
    return tuple(int(s) for s in shape)


def _is_f32(x):
    dt = getattr(x, "dtype", None)
    if dt is None:
        return x.__cuda_array_interface__["typestr"] == "<f4"
    return str(dt) in _F32_NAMES


class _Vector:
    """A length-``n`` vector view of a device array's elements ``stride`` bytes apart (0: one
    element for all), as ``__cuda_array_interface__`` (numba, CuPy and other arrays)."""

    def __init__(self, base, n, stride):
        cai = base.__cuda_array_interface__
        self.base = base  # keeps the memory alive while the view is
        self.__cuda_array_interface__ = {"shape": (n,), "strides": (stride,), "typestr": cai["typestr"],
                                         "data": cai["data"], "version": 3}


def _byte_strides(x, shape):
    if hasattr(x, "stride") and callable(x.stride):  # torch: elements
        return tuple(4 * s for s in x.stride())
    strides = getattr(x, "strides", None)
    if strides is None:
        strides = x.__cuda_array_interface__.get("strides")
    if strides is None:  # C-contiguous
        return tuple(4 * int(_prod(shape[i + 1:])) for i in range(len(shape)))
    return tuple(int(s) for s in strides)


def _prod(xs):
    p = 1
    for v in xs:
        p *= v
    return p


def _as_vector(x, n, stride):
    if hasattr(x, "data_ptr"):  # torch: a view, no copy
        v = x.reshape(-1)
        return v.expand(n) if stride == 0 else v
    return _Vector(x, n, stride)


def _block_shapes(M, N, K):
    kb = -(-K // KBLOCK_SCALE)
    return (M, kb), (kb, -(-N // KBLOCK_SCALE))


def _is_block_wise(scale_a, scale_b, M, N, K):
    """Whether the scales are block-wise: scale_a (M, K blocks) with K longer than one block
    (or K == 0: no blocks), or a scale_b of B's block shape that is neither row-wise (1, N)
    nor one element."""
    a_shape, b_shape = _block_shapes(M, N, K)
    sa = None if scale_a is None or isinstance(scale_a, Real) else _shape(scale_a)
    sb = None if scale_b is None or isinstance(scale_b, Real) else _shape(scale_b)
    return (sa == a_shape and a_shape[1] != 1) or (sb == b_shape and sb != (1, N) and (_prod(sb) > 1 or K == 0))


def _block_scales(scale_a, scale_b, M, N, K):
    """``(scale_a, scale_b)``, checked to be the block-wise pair."""
    a_shape, b_shape = _block_shapes(M, N, K)
    for name, x, shape in (("scale_a", scale_a, a_shape), ("scale_b", scale_b, b_shape)):
        got = "none" if x is None else "a number" if isinstance(x, Real) else f"shape {_shape(x)}"
        if got != f"shape {shape}":
            raise ShapeError(f"block-wise scaling takes scale_a of shape {a_shape} (one per row and 128 K) with "
                             f"scale_b of shape {b_shape} (one per 128 x 128 block of b); {name} has {got}")
        if not _is_f32(x):
            raise DtypeError(f"{name} must be float32; got {getattr(x, 'dtype', None)}")
    return scale_a, scale_b


def _scale(name, x, n, side):
    """``(factor, vector)``: a per-tensor number, or a length-``n`` vector of ``x``."""
    if isinstance(x, Real):
        return float(x), None
    shape = _shape(x)
    if not _is_f32(x):
        raise DtypeError(f"{name} must be float32 (a Python number, or a float32 device array); got "
                         f"{getattr(x, 'dtype', None) or x.__cuda_array_interface__['typestr']}")
    size = _prod(shape)
    if size == 1 and len(shape) <= 2:  # per-tensor
        return 1.0, _as_vector(x, n, 0)
    strides = _byte_strides(x, shape)
    if len(shape) == 1 and shape[0] == n:
        return 1.0, _as_vector(x, n, strides[0])
    # torch._scaled_mm's row-wise shapes: scale_a (M, 1), scale_b (1, N)
    if len(shape) == 2 and shape == ((n, 1) if side == 0 else (1, n)):
        return 1.0, _as_vector(x, n, strides[side])
    raise ShapeError(f"{name} has shape {shape}; expected a number or one element (per-tensor) or {n} values "
                     f"(row-wise, {'one per row of a' if side == 0 else 'one per column of b'}; block-wise: "
                     "see gemm's docstring)")


def fold_scales(a, b, scale_a, scale_b, alpha, row_scale, col_scale):
    """``(alpha, row_scale, col_scale, block_scales)`` of a call with ``scale_a``/``scale_b``
    folded in (module docstring); ``block_scales``: the block-wise ``(scale_a, scale_b)``, or
    None. A scale given as a vector cannot share its side with the explicit ``row_scale``
    (``scale_a``) or ``col_scale`` (``scale_b``)."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) < 2 or len(sb) != 2:
        return alpha, row_scale, col_scale, None  # not a GEMM: check_inputs says why
    M, K, N = _prod(sa[:-1]), sa[-1], sb[1]  # (a (..., K): its leading dimensions are the rows)
    if _is_block_wise(scale_a, scale_b, M, N, K):
        return alpha, row_scale, col_scale, _block_scales(scale_a, scale_b, M, N, K)
    for name, x, n, side in (("scale_a", scale_a, M, 0), ("scale_b", scale_b, N, 1)):
        if x is None:
            continue
        factor, vec = _scale(name, x, n, side)
        alpha = alpha * factor
        if vec is None:
            continue
        other = "row_scale" if side == 0 else "col_scale"
        if (row_scale if side == 0 else col_scale) is not None:
            raise ValueError(f"{name} (a device array) and {other} both scale the output's "
                             f"{'rows' if side == 0 else 'columns'}: pass one of them")
        if side == 0:
            row_scale = vec
        else:
            col_scale = vec
    return alpha, row_scale, col_scale, None


# --- the fast path of calls whose only epilogue keywords are the scales --------------------

def scale_signature(x):
    """``(signature, value)`` of a scale keyword: ``(None, 1.0)``, ``(NUMBER, the number)`` or,
    for a device array, ``describe``'s (its layout, its address)."""
    if x is None:
        return None, 1.0
    if isinstance(x, Real):
        return NUMBER, float(x)
    return describe(x)


def scale_binder(scale_a, scale_b, block_scales):
    """``bind(alpha, a_value, b_value) -> values``: a call's epilogue values (in
    ``fusion_key_and_values``' order) from its scales' :func:`scale_signature` values, for
    calls with the same layouts as this one's, whose only epilogue keywords are the scales.
    ``fold_scales`` made every array scale a view at the array's own address: A's and B's
    block-wise scales, or the row and column scale vectors."""
    if block_scales is not None:
        return _BIND_BLOCKS
    return _bind_vectors[scale_a is not None and not isinstance(scale_a, Real),
                         scale_b is not None and not isinstance(scale_b, Real)]


# bind(alpha, a, b) of the block-wise scales, and of row and column vectors (whether each is one).
_BIND_BLOCKS = values_packer(("alpha", "a_block_scales", "b_block_scales"))
_bind_vectors = {(a, b): values_packer(("alpha", "row_scale" if a else None, "col_scale" if b else None))
                 for a in (False, True) for b in (False, True)}
