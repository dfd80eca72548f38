"""The small element-wise kernels a GEMM call may add beside the GEMM kernel.

- ``copy_matrices``: ``dst[...] = src`` for two 3-D arrays of one shape (a batch of
  matrices, in one launch); it moves raw element bits, so it serves any dtype of the same
  item size (the aligned copies of operands TMA cannot address,
  ``numba_hopper.matmul.extra_launches``).
- ``reduce_kernel(out_dtype)``: split-K's second kernel. The GEMM kernel writes slice ``s``
  of the product to ``workspace[s]`` (fp32, row-major); this kernel adds the slices in the
  order 0, 1, ... and converts once to the output dtype, so a split-K result is
  deterministic (bitwise the same on every run), unlike an atomic or TMA reduce-add across
  slices. It also applies a scale-only fused epilogue (``alpha``, ``row_scale``,
  ``col_scale``), which the slices cannot: they write partial sums, not outputs.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["copy_matrices", "reduce_kernel"]


@cuda.jit
def copy_matrices(src, dst):
    """``dst[i, r, c] = src[i, r, c]``: x along rows, y along columns, z over the matrices (a
    block takes every ``gridDim.z``-th one: a batch may outnumber the grid's z limit)."""
    r, c = cuda.grid(2)
    if r < src.shape[1] and c < src.shape[2]:
        for i in range(cuda.blockIdx.z, src.shape[0], cuda.gridDim.z):
            dst[i, r, c] = src[i, r, c]


@cuda.jit(device=True, inline="always")
def _total(ws, r, c):
    """``sum(ws[:, r, c])`` in the order 0, 1, ...: the same bits on every run."""
    acc = np.float32(0)
    for s in range(ws.shape[0]):
        acc += ws[s, r, c]
    return acc


@functools.lru_cache(maxsize=None)
def reduce_kernel(out_dtype, alpha=False, row_scale=False, col_scale=False):
    """``reduce(ws, n, out)``: ``out = sum(ws[:, :, :n])`` (x along columns: coalesced), in
    ``out_dtype`` ("f32", or "bf16"/"f16" stored as their ``uint16`` bits).

    With any of ``alpha``, ``row_scale``, ``col_scale`` (compile-time flags):
    ``reduce(ws, n, out, alpha, rows, cols)``, ``out[r, c] = sum * alpha * rows[r] * cols[c]``
    with only the flagged factors, in the fused epilogue's order (``numba_hopper.kernels.epilogue``);
    ``rows``/``cols`` may have any stride (0: one per-tensor value).
    """
    if out_dtype == "f32":
        convert = cuda.jit(device=True, inline="always")(lambda x: x)
    else:  # 16-bit outputs are stored as their bit patterns, rounded to nearest even
        pack = nh.pack_bf16x2 if out_dtype == "bf16" else nh.pack_f16x2

        @cuda.jit(device=True, inline="always")
        def convert(x):
            return np.uint16(pack(x, np.float32(0)) & 0xFFFF)

    if not (alpha or row_scale or col_scale):
        @cuda.jit
        def reduce(ws, n, out):
            c, r = cuda.grid(2)
            if r < out.shape[0] and c < n:
                out[r, c] = convert(_total(ws, r, c))

        return reduce

    ALPHA, ROW_SCALE, COL_SCALE = alpha, row_scale, col_scale  # (branches prune on closure bools)

    @cuda.jit
    def scaled_reduce(ws, n, out, factor, rows, cols):
        c, r = cuda.grid(2)
        if r < out.shape[0] and c < n:
            v = _total(ws, r, c)
            if ALPHA:
                v = v * factor
            if ROW_SCALE:
                v = v * rows[r]
            if COL_SCALE:
                v = v * cols[c]
            out[r, c] = convert(v)

    return scaled_reduce
