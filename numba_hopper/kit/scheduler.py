"""Persistent tile schedulers: which output tiles a CTA computes, in linear or grouped order.

A persistent kernel launches one CTA per SM (``persistent_grid`` in :mod:`.host`) and each
CTA walks tiles ``blockIdx.x, blockIdx.x + gridDim.x, ...``. Its producer and consumers call
the same functions on the same ids, so they agree on every tile without talking. The tile id
maps to output coordinates by the raster:

- ``"linear"``: row by row, ``(tile // tiles_n, tile % tiles_n)``;
- ``"grouped"`` (Triton's grouped ordering): ids run down ``group_m`` tile rows before moving
  one tile column right, so the CTAs of a wave read ``group_m`` row panels of A and a few
  column panels of B, which stay in L2, instead of one row panel and every column panel::

      group_m = 2, tiles 4 x 3:     0  2  4
                                    1  3  5
                                    6  8 10
                                    7  9 11

All arithmetic is 32-bit (``div.u32`` inline): numba's 64-bit division is a subroutine call
whose calling convention costs registers in a warp-specialized kernel. Ids and tile counts
must stay below 2**32.

::

    sched = make_tile_scheduler(BM, BN, raster="grouped", group_m=8)
    work = sched.work(M, N, batches)       # tile counts (TileWork)
    tile = sched.first()
    while tile < work.num_tiles:
        t = sched.origin(work, tile)       # OutputTile(batch, m0, n0)
        ...
        tile = sched.next(tile)
"""

from __future__ import annotations

import operator
from collections import namedtuple

import numpy as np
from numba import cuda

from ..intrinsics import div_u32

__all__ = ["TileScheduler", "TileWork", "OutputTile", "make_tile_scheduler", "grouped_tile", "grouped_tile_host",
           "RASTERS"]

RASTERS = ("linear", "grouped")

TileWork = namedtuple("TileWork", ["tiles_m", "tiles_n", "per_batch", "num_tiles"])
TileWork.__doc__ = """A launch's tile counts (uint32): ``tiles_m`` x ``tiles_n`` tiles per batch
(``per_batch``), ``num_tiles`` in all."""
OutputTile = namedtuple("OutputTile", ["batch", "m0", "n0"])
OutputTile.__doc__ = """A tile's batch index and first row and column (uint32)."""
TileScheduler = namedtuple("TileScheduler", ["block_m", "block_n", "raster", "group_m", "work", "first", "next",
                                             "origin"])
TileScheduler.__doc__ = """A persistent tile walk (:func:`make_tile_scheduler`): device functions
``work(M, N, batches) -> TileWork``, ``first() -> tile``, ``next(tile) -> tile`` and ``origin(work,
tile) -> OutputTile``."""


def _grouped(div):
    def grouped_tile(tile, tiles_m, tiles_n, group_m):
        """``(pm, pn)``: the tile row and column of id ``tile`` in grouped order (module doc);
        the last group has ``tiles_m % group_m`` rows when ``group_m`` does not divide
        ``tiles_m``."""
        per_group = group_m * tiles_n
        group = div(tile, per_group)
        first_m = group * group_m
        size_m = min(tiles_m - first_m, group_m)
        local = tile - group * per_group
        pn = div(local, size_m)
        return first_m + local - pn * size_m, pn

    return grouped_tile


grouped_tile = cuda.jit(device=True, forceinline=True)(_grouped(div_u32))
grouped_tile_host = _grouped(operator.floordiv)


def make_tile_scheduler(block_m, block_n, raster="grouped", group_m=8) -> TileScheduler:
    """The :class:`TileScheduler` of ``block_m`` x ``block_n`` tiles in ``raster`` order
    ("linear" or "grouped", ``group_m`` tile rows a group)."""
    if raster not in RASTERS:
        raise ValueError(f"raster must be one of {RASTERS}; got {raster!r}")
    for name, v in (("block_m", block_m), ("block_n", block_n), ("group_m", group_m)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int; got {v!r}")
    GROUPED = raster == "grouped"

    @cuda.jit(device=True, forceinline=True)
    def work(M, N, batches):
        tiles_m = np.uint32((M + block_m - 1) // block_m)
        tiles_n = np.uint32((N + block_n - 1) // block_n)
        per_batch = np.uint32(tiles_m * tiles_n)
        return TileWork(tiles_m, tiles_n, per_batch, np.uint32(per_batch * np.uint32(batches)))

    @cuda.jit(device=True, forceinline=True)
    def first():
        return np.uint32(cuda.blockIdx.x)

    @cuda.jit(device=True, forceinline=True)
    def next_(tile):
        return np.uint32(tile + np.uint32(cuda.gridDim.x))

    @cuda.jit(device=True, forceinline=True)
    def origin(w, tile):
        batch = div_u32(tile, w.per_batch)
        local = np.uint32(tile - batch * w.per_batch)
        if GROUPED:
            pm, pn = grouped_tile(local, w.tiles_m, w.tiles_n, np.uint32(group_m))
        else:
            pm = div_u32(local, w.tiles_n)
            pn = local - pm * w.tiles_n
        return OutputTile(batch, np.uint32(pm * block_m), np.uint32(pn * block_n))

    return TileScheduler(block_m, block_n, raster, group_m, work, first, next_, origin)
