"""The one copy ``gemm`` ever makes: an operand TMA cannot read, into an aligned buffer.

TMA needs a 16-byte-aligned base and row strides that are multiples of 16 bytes. An
operand that breaks that (a 1001-column bf16 matrix, a slice at an odd offset, an
arbitrary 2-D stride) is copied element by element into a row-major scratch buffer whose
leading dimension is rounded up to 16 bytes.
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


def copy_to_aligned_row_major(v, stream):
    """Copy the 2-D view ``v`` into a new aligned row-major buffer: ``(view, owner)``."""
    rows, cols = v.shape
    bits = _BITS[v.itemsize]
    pad = 16 // v.itemsize
    ld = -(-max(cols, 1) // pad) * pad
    src = cuda.from_cuda_array_interface(
        {
            "shape": (rows, cols),
            "strides": tuple(s * v.itemsize for s in v.strides),
            "typestr": np.dtype(bits).str,
            "data": (v.ptr, False),
            "version": 3,
        },
        sync=False,
    )
    nb_stream = cuda.external_stream(int(stream)) if stream else cuda.default_stream()
    owner = cuda.device_array((rows, ld), dtype=bits, stream=nb_stream)
    dst = owner[:, :cols]
    block = (8, 32)
    grid = (-(-rows // 8), -(-cols // 32))
    _copy_2d[grid, block, nb_stream](src, dst)
    view = dataclasses.replace(v, ptr=owner.device_ctypes_pointer.value, strides=(ld, 1))
    return view, owner
