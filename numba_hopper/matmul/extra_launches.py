"""The launches a GEMM call may add beside the GEMM kernel: aligned copies and split-K's
reduce (their kernels: ``numba_hopper.kernels.elementwise``), each prepared once per plan.

TMA needs a 16-byte-aligned base and row strides that are multiples of 16 bytes. An
operand that breaks that (a 1001-column bf16 matrix, a slice at an odd offset, an
arbitrary 2-D stride) is copied into a row-major scratch region whose leading dimension is
rounded up to 16 bytes; an ``out`` that breaks it receives the result from such a region.
A batch of matrices (``bmm``) is copied in one launch. Copies move raw element bits, so
they work for any dtype of the same item size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import cuda

from ..runtime.arrays import DeviceView
from ..kernels.elementwise import copy_matrices, reduce_kernel
from ..runtime.launch import prepare_launch

__all__ = ["as_numba", "aligned_layout", "prepare_copy", "prepare_reduce"]

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def as_numba(v, dtype=None):
    """A numba device array over the view ``v`` (its raw bits unless ``dtype`` is given)."""
    return cuda.from_cuda_array_interface(
        {
            "shape": tuple(v.shape),
            "strides": tuple(s * v.itemsize for s in v.strides),
            "typestr": np.dtype(dtype or _BITS[v.itemsize]).str,
            "data": (v.ptr, False),
            "version": 3,
        },
        sync=False,
    )


def aligned_layout(v: DeviceView) -> tuple:
    """``(view, nbytes)``: a row-major layout shaped like the 2-D view ``v`` with its leading
    dimension rounded up to 16 bytes (the view's address is left 0: the caller places it)."""
    rows, cols = v.shape
    pad = 16 // v.itemsize
    ld = -(-max(cols, 1) // pad) * pad
    return DeviceView(0, (rows, cols), (ld, 1), v.dtype, v.itemsize, v.device, v.framework), rows * ld * v.itemsize


_GRID_Z = 65535  # the grid's z limit: the copy kernel strides over larger batches


def prepare_copy(src: DeviceView, dst: DeviceView):
    """The prepared launch of ``dst[...] = src`` for views of one shape and item size: 2-D, or
    3-D (a batch of matrices, copied in the same launch); its arguments are ``(src, dst)``."""
    if src.ndim == 2:
        src, dst = (dataclasses.replace(v, shape=(1, *v.shape), strides=(0, *v.strides)) for v in (src, dst))
    count, rows, cols = src.shape
    grid = (-(-rows // 8), -(-cols // 32), min(count, _GRID_Z))
    return prepare_launch(copy_matrices, grid, (8, 32), (as_numba(src), as_numba(dst)))


def prepare_reduce(partials, out_view, alpha=None, row_scale=None, col_scale=None):
    """The prepared launch of ``out = sum(partials[:, :, :N])`` for the 3-D f32 view ``partials``
    (slices x M x padded N) and the 2-D (M x N) view ``out_view``; its arguments are
    ``(partials, N, out)``.

    With scales (``alpha`` a number, ``row_scale``/``col_scale`` 1-D f32 views of length M / N,
    any stride), ``out = alpha * row_scale[:, None] * col_scale[None, :] * sum(...)`` with the
    factors given, and the arguments are ``(partials, N, out, alpha, row_scale, col_scale)``:
    one signature for every set of factors, an absent vector is a one-element view of
    ``partials`` that the kernel never reads.
    """
    rows, n = out_view.shape
    out = as_numba(out_view, np.float32 if out_view.dtype == "f32" else None)
    grid = (-(-n // 32), -(-rows // 8))
    flags = (alpha is not None, row_scale is not None, col_scale is not None)
    args = (as_numba(partials, np.float32), n, out)
    if any(flags):
        unread = DeviceView(partials.ptr, (1,), (0,), "f32", 4, partials.device, partials.framework)
        args += (np.float32(1.0 if alpha is None else alpha),
                 *(as_numba(unread if v is None else v, np.float32) for v in (row_scale, col_scale)))
    return prepare_launch(reduce_kernel(out_view.dtype, *flags), grid, (32, 8), args)
