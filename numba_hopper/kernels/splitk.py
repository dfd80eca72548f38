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
from .._copy import _as_numba, _numba_stream

__all__ = ["reduce_splits"]


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
        r, c = cuda.grid(2)
        if r < out.shape[0] and c < n:
            acc = np.float32(0)
            for s in range(ws.shape[0]):
                acc += ws[s, r, c]
            out[r, c] = convert(acc)

    return reduce


def reduce_splits(workspace, n, out_view, stream):
    """``out = sum(workspace[:, :, :n])`` into the 2-D view ``out_view`` on ``stream``."""
    rows = out_view.shape[0]
    grid = (-(-rows // 8), -(-n // 32))
    _reduce_kernel(out_view.dtype)[grid, (8, 32), _numba_stream(stream)](workspace, n, _as_numba(out_view))
