"""The copies ``gemm`` makes when TMA cannot address an array directly.

TMA needs a 16-byte-aligned base and row strides that are multiples of 16 bytes. An
operand that breaks that (a 1001-column bf16 matrix, a slice at an odd offset, an
arbitrary 2-D stride) is copied into a row-major scratch buffer whose leading dimension is
rounded up to 16 bytes; an ``out`` that breaks it receives the result from such a buffer.
Copies move raw element bits, so they work for any dtype of the same item size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import cuda

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@cuda.jit
def _copy_2d(src, dst):
    r, c = cuda.grid(2)
    if r < src.shape[0] and c < src.shape[1]:
        dst[r, c] = src[r, c]


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


def _numba_stream(stream):
    return cuda.external_stream(int(stream)) if stream else cuda.default_stream()


def aligned_scratch(v):
    """An uninitialized row-major buffer shaped like the 2-D view ``v``: ``(view, owner)``.

    numba defers frees (and cuMemFree waits for the device), so dropping ``owner`` right
    after queuing work on the buffer is safe.
    """
    rows, cols = v.shape
    pad = 16 // v.itemsize
    ld = -(-max(cols, 1) // pad) * pad
    owner = cuda.device_array((rows, ld), dtype=_BITS[v.itemsize])
    return dataclasses.replace(v, ptr=owner.device_ctypes_pointer.value, strides=(ld, 1)), owner


def copy_2d(src, dst, stream):
    """``dst[...] = src`` for two 2-D views of the same shape and item size, on ``stream``."""
    rows, cols = src.shape
    grid = (-(-rows // 8), -(-cols // 32))
    _copy_2d[grid, (8, 32), _numba_stream(stream)](as_numba(src), as_numba(dst))
