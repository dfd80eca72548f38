"""The second kernel of split-K: sum the fp32 K-slice partials in a fixed order.

The GEMM kernel writes slice ``s`` of the product to ``workspace[s]`` (fp32, row-major);
this kernel adds the slices in the order 0, 1, ... and converts once to the output dtype,
so a split-K result is deterministic (bitwise the same on every run), unlike an atomic or
TMA reduce-add across slices.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from .._copy import as_numba
from ..launch import prepare_launch

__all__ = ["prepare_reduce"]


@functools.lru_cache(maxsize=None)
def _reduce_kernel(out_dtype):
    if out_dtype == "f32":
        convert = cuda.jit(device=True, inline="always")(lambda x: x)
    else:  # 16-bit outputs are stored as their bit patterns, rounded to nearest even
        pack = nh.pack_bf16x2 if out_dtype == "bf16" else nh.pack_f16x2

        @cuda.jit(device=True, inline="always")
        def convert(x):
            return np.uint16(pack(x, np.float32(0)) & 0xFFFF)

    @cuda.jit
    def reduce(ws, n, out):
        c, r = cuda.grid(2)  # x along columns: coalesced
        if r < out.shape[0] and c < n:
            acc = np.float32(0)
            for s in range(ws.shape[0]):
                acc += ws[s, r, c]
            out[r, c] = convert(acc)

    return reduce


def prepare_reduce(partials, out_view):
    """The prepared launch of ``out = sum(partials[:, :, :N])`` for the 3-D f32 view ``partials``
    (slices x M x padded N) and the 2-D (M x N) view ``out_view``: one bare launch per call,
    without numba's per-call argument handling. Its arguments are ``(partials, N, out)``."""
    rows, n = out_view.shape
    out = as_numba(out_view, np.float32 if out_view.dtype == "f32" else None)
    grid = (-(-n // 32), -(-rows // 8))
    return prepare_launch(_reduce_kernel(out_view.dtype), grid, (32, 8), (as_numba(partials, np.float32), n, out))
