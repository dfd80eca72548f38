"""A warpgroup's accumulator to global memory: convert, ``stmatrix`` into swizzled shared
memory, TMA store; and a guarded direct store for tiles TMA cannot clip.

:func:`make_tile_store` builds the store of one consumer warpgroup's ``64 x n`` f32
accumulator tile into a row-major output, independent of any GEMM configuration::

    store = make_tile_store(n=256, out_dtype="bf16", buffers=2)
    # host: a SmemPlan buffer of store.buffer_bytes per consumer warpgroup, and the output's
    # tensor map with box store.box and swizzle store.swizzle (TensorMapArg / TensorMap)
    stores = np.int32(0)                      # this warpgroup's sub-tile stores so far
    stores = store.tile(acc, buf, t, EPI + cw, tmap_out, row0, col0, stores)
    ...
    store.drain(t)                            # before the CTA exits

The tile goes out in sub-tiles of 64 rows x ``store.span`` bytes (128: 64 bf16 or 32 f32
columns; 64 or 32 where ``n`` is narrower), one TMA box each. For each sub-tile:

1. the warpgroup's leader (``t == 0``) waits until the TMA store that last read the buffer
   is done reading (``cp.async.bulk.wait_group.read``, ``buffers - 1`` left in flight), and
   the warpgroup meets at its named barrier ``barrier_id``;
2. every thread converts its registers (``cvt.rn.bf16x2.f32``) and writes them: 16-bit
   outputs with ``stmatrix.x4`` (16 x 16 elements a warp per instruction, lane addresses from
   :func:`~numba_hopper.kit.fragments.x4_lane_offset`), f32 with 8-byte stores, each at its
   TMA-swizzled place (:func:`~numba_hopper.kit.layouts.box_address`), so that a warp's
   writes are bank-conflict free;
3. ``fence.proxy.async`` (the generic-proxy writes become visible to TMA), the barrier again,
   and the leader issues ``cp.async.bulk.tensor`` (store) and commits it.

With two buffers a sub-tile is written while the previous one drains, and the last stores of
a tile drain under the next tile's mainloop. TMA drops elements outside the tensor, so a
partial tile needs no code. ``stores`` (int32, carried by the caller across tiles) picks the
buffer. ``tile_3d`` takes a batch coordinate for a 3-D tensor map (batch outermost).

``direct(acc, out, row0, col0, t)`` writes the tile straight from registers to the numba
array ``out`` (2-D, row-major; ``uint16`` holding bf16/f16 bits, or float32), skipping
elements outside ``out.shape``: for tiles whose bound is not the tensor's (a sequence that
ends inside a packed batch) or outputs TMA cannot address. Each thread writes 2-element
pairs of its two rows: 8 times slower stores than TMA's, so keep it to edge tiles.

Writing bf16 into a PyTorch tensor: numba has no bf16 dtype and PyTorch's CUDA array
interface refuses bf16, so pass ``cuda.as_cuda_array(t.view(torch.int16))`` (the same
bytes) as ``out``, or make the tensor map over the tensor itself (``TensorMap(t, ...)``
reads its dtype from PyTorch).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from ..intrinsics import (bulk_commit_group, bulk_wait_group, bulk_wait_group_read, f32_to_bf16, f32_to_f16,
                          fence_proxy_async, named_barrier_sync, pack_tuple, st_shared_v2_f32, stmatrix_x4,
                          tma_store_2d, tma_store_3d, tuple_as_array)
from .fragments import x4_lane_offset
from .layouts import box_address

__all__ = ["TileStore", "make_tile_store", "OUT_DTYPES"]

OUT_DTYPES = {"bf16": 2, "f16": 2, "f32": 4}
ROWS = 64  # a warpgroup's accumulator rows

TileStore = namedtuple("TileStore", ["n", "out_dtype", "buffers", "span", "box", "swizzle", "buffer_bytes", "tile",
                                     "tile_3d", "drain", "direct"])
TileStore.__doc__ = """The store of one warpgroup's ``64 x n`` tile (:func:`make_tile_store`): host numbers
``span`` (bytes of a sub-tile row), ``box`` (the output tensor map's box, numpy order) and
``swizzle`` (its swizzle, = ``span``), ``buffer_bytes`` (shared memory per warpgroup, 1024-byte
aligned buffers); device functions ``tile(acc, buf, t, barrier_id, tmap, row0, col0, stores) ->
stores``, ``tile_3d(..., col0, batch, stores)``, ``drain(t)`` and ``direct(acc, out, row0, col0, t)``."""


def make_tile_store(n, out_dtype="bf16", buffers=2) -> TileStore:
    """The :class:`TileStore` of a ``64 x n`` f32 accumulator (``n`` the wgmma N: a multiple
    of 16 up to 256) to ``out_dtype`` ("bf16", "f16" or "f32") through ``buffers`` (1 or 2)
    sub-tile buffers per warpgroup. Checked here: the rule and the fix in each error."""
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {tuple(OUT_DTYPES)} (fp8 outputs need a scale: write them with "
                         f"pack_e4m3x4 and a direct store); got {out_dtype!r}")
    if not isinstance(n, int) or n % 16 or not 16 <= n <= 256:
        raise ValueError(f"n must be a multiple of 16 in [16, 256] (stmatrix stores 16 x 16 blocks; wgmma N <= 256); "
                         f"got {n!r}")
    if buffers not in (1, 2):
        raise ValueError(f"buffers must be 1 or 2 (2: a sub-tile is written while the last one drains); got "
                         f"{buffers!r}")
    E = OUT_DTYPES[out_dtype]
    SPAN = next(s for s in (128, 64, 32) if (n * E) % s == 0)
    COLS = SPAN // E  # columns of a sub-tile
    SUBTILES = n // COLS
    SUB_BYTES = ROWS * SPAN
    BUF_STRIDE = -(-SUB_BYTES // 1024) * 1024  # (each buffer on the swizzle's 1024-byte period)
    BUFFERS = buffers
    IN_FLIGHT = buffers - 1  # stores that may still read a buffer when the next is written
    F32 = out_dtype == "f32"
    GROUPS = COLS // 16  # 16-bit: stmatrix.x4 16-column groups per sub-tile
    PAIRS = COLS // 8  # f32: 8-column groups per sub-tile
    PACK = "f16" if out_dtype == "f16" else "bf16"

    @cuda.jit(device=True, forceinline=True)
    def write_16bit(packed, buf, q, t):
        regs = tuple_as_array(packed)
        lane = t % 32
        r, c = x4_lane_offset(lane)
        row = 16 * (t // 32) + r
        for g in range(GROUPS):
            p = q * GROUPS + g
            addr = box_address(buf, row, 2 * (16 * g + c), SPAN)
            stmatrix_x4(addr, regs[4 * p], regs[4 * p + 1], regs[4 * p + 2], regs[4 * p + 3])

    @cuda.jit(device=True, forceinline=True)
    def write_f32(acc, buf, q, t):
        frag = tuple_as_array(acc)
        row = 16 * (t // 32) + (t % 32) // 4
        for g in range(PAIRS):
            i = q * PAIRS + g
            byte = 4 * (8 * g + 2 * (t % 4))
            st_shared_v2_f32(box_address(buf, row, byte, SPAN), frag[4 * i], frag[4 * i + 1])
            st_shared_v2_f32(box_address(buf, row + 8, byte, SPAN), frag[4 * i + 2], frag[4 * i + 3])

    @cuda.jit(device=True, forceinline=True)
    def stage(regs, buf0, t, barrier_id, q, stores):
        """Sub-tile ``q`` into its buffer; returns the buffer's address once it is ready for TMA."""
        buf = buf0 + (stores % BUFFERS) * BUF_STRIDE
        if t == 0:
            bulk_wait_group_read(IN_FLIGHT)  # the store that last read buf has read it
        named_barrier_sync(barrier_id, 128)
        if F32:
            write_f32(regs, buf, q, t)
        else:
            write_16bit(regs, buf, q, t)
        fence_proxy_async()
        named_barrier_sync(barrier_id, 128)
        return buf

    @cuda.jit(device=True, forceinline=True)
    def converted(acc):
        if F32:
            return acc
        return pack_tuple(acc, PACK)

    @cuda.jit(device=True, forceinline=True)
    def tile(acc, buf0, t, barrier_id, tmap, row0, col0, stores):
        regs = converted(acc)
        for q in range(SUBTILES):
            buf = stage(regs, buf0, t, barrier_id, q, stores)
            if t == 0:
                tma_store_2d(tmap, buf, col0 + q * COLS, row0)
                bulk_commit_group()
            stores = np.int32(stores + 1)
        return stores

    @cuda.jit(device=True, forceinline=True)
    def tile_3d(acc, buf0, t, barrier_id, tmap, row0, col0, batch, stores):
        regs = converted(acc)
        for q in range(SUBTILES):
            buf = stage(regs, buf0, t, barrier_id, q, stores)
            if t == 0:
                tma_store_3d(tmap, buf, col0 + q * COLS, row0, batch)
                bulk_commit_group()
            stores = np.int32(stores + 1)
        return stores

    @cuda.jit(device=True, forceinline=True)
    def drain(t):
        if t == 0:
            bulk_wait_group(0)

    to_bits = f32_to_f16 if out_dtype == "f16" else f32_to_bf16

    @cuda.jit(device=True, forceinline=True)
    def element(v):
        if F32:
            return v
        return to_bits(v)

    @cuda.jit(device=True, forceinline=True)
    def store_pair(out, frag, k, r, c):
        rows, cols = out.shape
        if r < rows:
            if c < cols:
                out[r, c] = element(frag[k])
            if c + 1 < cols:
                out[r, c + 1] = element(frag[k + 1])

    def group_store(i):
        """The 8-column group ``i`` (a compile-time constant: a run-time index would move the
        fragment to local memory) of the thread's two rows."""

        @cuda.jit(device=True, forceinline=True)
        def store(out, frag, r0, c0):
            store_pair(out, frag, 4 * i, r0, c0 + 8 * i)
            store_pair(out, frag, 4 * i + 2, r0 + 8, c0 + 8 * i)

        return store

    direct_groups = _chained([group_store(i) for i in range(n // 8)])

    @cuda.jit(device=True, forceinline=True)
    def direct(acc, out, row0, col0, t):
        direct_groups(out, tuple_as_array(acc), row0 + 16 * (t // 32) + (t % 32) // 4, col0 + 2 * (t % 4))

    return TileStore(n, out_dtype, buffers, SPAN, (ROWS, COLS), SPAN, BUFFERS * BUF_STRIDE, tile, tile_3d, drain,
                     direct)


def _chained(steps):
    """A device function ``run(out, frag, r0, c0)`` calling each of ``steps`` in turn with
    those arguments (each step's constants stay constants: no loop for LLVM to leave rolled)."""

    @cuda.jit(device=True, forceinline=True)
    def run(out, frag, r0, c0):
        pass

    for step in steps:
        run = _then(run, step)
    return run


def _then(first, step):
    @cuda.jit(device=True, forceinline=True)
    def both(out, frag, r0, c0):
        first(out, frag, r0, c0)
        step(out, frag, r0, c0)

    return both
