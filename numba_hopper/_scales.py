"""FP8 scaling keywords (``scale_a``, ``scale_b``) mapped onto the fused epilogue.

``(scale_a * A) @ (B * scale_b) = scale_a[:, None] * scale_b[None, :] * (A @ B)``, so the
scales are factors of the f32 accumulator in the epilogue (``kernels/epilogue.py``), never
applied to the operands:

- a Python number (per-tensor) multiplies into ``alpha``;
- a one-element float32 device array (per-tensor: shape (), (1,) or (1, 1)) is read by the
  kernel as a stride-0 vector, ``row_scale`` for ``scale_a`` and ``col_scale`` for
  ``scale_b``: its value never comes back to the host (no synchronization; a CUDA graph
  replays whatever the array holds then);
- a float32 vector of M (``scale_a``) or N (``scale_b``) values (row-wise; also as
  ``torch._scaled_mm`` shapes them, (M, 1) and (1, N)) is ``row_scale`` / ``col_scale``.

Block-wise scales (DeepSeek-V3's 1 x 128 / 128 x 128) need the scales inside the K loop
(two-level accumulation) and are refused here until the kernel has that mainloop.
"""

from __future__ import annotations

from numbers import Real

from .errors import DtypeError, ShapeError

__all__ = ["fold_scales"]

_F32_NAMES = ("torch.float32", "float32", "<f4")


def _shape(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = x.__cuda_array_interface__["shape"]
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
    if len(shape) == 2:
        raise ValueError(f"{name} of shape {shape}: block-wise scaling is not supported yet (per-tensor: a "
                         f"number or one element; row-wise: {n} values)")
    raise ShapeError(f"{name} has shape {shape}; expected a number or one element (per-tensor) or {n} values "
                     f"(row-wise, {'one per row of a' if side == 0 else 'one per column of b'})")


def fold_scales(a, b, scale_a, scale_b, alpha, row_scale, col_scale):
    """``(alpha, row_scale, col_scale)`` of a call with ``scale_a``/``scale_b`` folded in
    (module docstring). A scale given as a vector cannot share its side with the explicit
    ``row_scale`` (``scale_a``) or ``col_scale`` (``scale_b``)."""
    sa, sb = _shape(a), _shape(b)
    if len(sa) != 2 or len(sb) != 2:
        return alpha, row_scale, col_scale  # not a GEMM: check_inputs says why
    M, N = sa[0], sb[1]
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
    return alpha, row_scale, col_scale
