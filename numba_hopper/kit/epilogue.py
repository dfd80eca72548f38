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
                          fence_proxy_async, pack_bf16x2, pack_e4m3x2, pack_e5m2x2, pack_f16x2, pack_tuple, st_shared_u16,
                          st_shared_v2_f32, stmatrix_x4, tma_store_2d, tma_store_3d, tuple_as_array)
from .barriers import warpgroup_sync
from .fragments import thread_rows, x4_lane_offset
from .layouts import make_box_address

__all__ = ["TileStore", "TileEpilogue", "make_tile_store", "OUT_DTYPES", "NO_MAX"]

OUT_DTYPES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}
ROWS = 64  # a warpgroup's accumulator rows
NO_MAX = np.uint32(0)  # what a pair hook returns as its m when it tracks nothing
_PACK = {"bf16": pack_bf16x2, "f16": pack_f16x2, "e4m3": pack_e4m3x2, "e5m2": pack_e5m2x2}

TileStore = namedtuple("TileStore", ["n", "out_dtype", "buffers", "cols", "span", "box", "swizzle", "buffer_bytes",
                                     "address", "write", "convert", "write_converted", "acquire", "commit",
                                     "commit_3d", "tile", "tile_3d", "drain", "direct"])
TileStore.__doc__ = """The store of one warpgroup's ``64 x n`` tile (:func:`make_tile_store`).

Host numbers: ``cols`` (columns of a sub-tile), ``span`` (bytes of a sub-tile row), ``box``
(the output tensor map's box, numpy order) and ``swizzle`` (its swizzle, = ``span``),
``buffer_bytes`` (shared memory per warpgroup, 1024-byte aligned buffers).

Device functions, whole tiles: ``tile(acc, buf, t, barrier_id, tmap, row0, col0, stores) ->
stores``, ``tile_3d(..., col0, batch, stores)``, ``drain(t)`` and ``direct(acc, out, row0, col0,
t)``. A sub-tile at a time (what ``tile`` runs, for kernels that do more around each sub-tile):
``acquire(leader, barrier_id)`` (the buffer's last TMA store has read it, the warpgroup met),
``write(frag, buf, q, row, lane, ctx) -> m`` (sub-tile ``q`` of the fragment ``frag``, a local
array of the accumulator, into the buffer; ``row``: the thread's first fragment row, ``lane``:
its lane; ``ctx`` goes to the epilogue hooks; ``m``: the hooks' max), or ``convert(acc) -> held``
once (a 16-bit output without hooks: the accumulator tuple as a tuple of packed pairs, half its
registers, so a kernel can hold a tile to store while its next accumulator fills; else ``acc``)
and ``write_converted(regs, buf, q, t)`` per sub-tile (``regs``: ``tuple_as_array(held)``;
``t``: the thread's index in the warpgroup), ``commit(buf, leader,
barrier_id, tmap, col, row)`` and ``commit_3d(..., row, batch)`` (the writes made visible to TMA,
the warpgroup met, the leader's TMA store of the buffer to (``row``, ``col``)), and
``address(buf, row, byte)``, where the swizzle puts byte ``byte`` of row ``row`` of a sub-tile."""

TileEpilogue = namedtuple("TileEpilogue", ["gather", "pair"])
TileEpilogue.__doc__ = """Hooks that map the accumulator on its way to the output (``make_tile_store(...,
epilogue=)``): device functions the store calls for every group of values it writes.

- ``gather(buf, addr, row, col, q, ctx) -> items``: once per group, before its values: what
  each pair of it needs besides the accumulator (a residual staged in the output's layout, read
  at ``addr + offset``; column terms). A 16-bit output's group is one ``stmatrix.x4``, the
  16 x 16 block whose pairs ``x = 2h + j`` are rows ``row + 8j`` and columns ``col + 8h``
  (``addr``: this lane's row address in it): ``items`` is a 4-tuple, one per pair. An f32 or fp8
  output's group is one pair, at (``row``, ``col``) and ``addr``: ``items`` is its item. ``col``
  counts from the first column of sub-tile ``q``.
- ``pair(frag, k, row, j, col, item, ctx) -> (v0, v1, m)``: the values to store for
  accumulator registers ``k`` and ``k + 1`` (row ``row + 8j`` of the warpgroup's tile, ``row`` the
  thread's first; columns ``col``, ``col + 1`` of the sub-tile; ``item`` from ``gather``), and ``m``,
  a uint32 that the store keeps the maximum of (:data:`NO_MAX` when unused; e.g. the bits of
  ``|v|``, which order as the floats do, for an amax). With ``make_tile_store(...,
  second_output=)``: ``(v0, v1, m, w0, w1)``, ``w0, w1`` the same place's values of a second
  output sub-tile."""


@cuda.jit(device=True, forceinline=True)
def _nothing_per_pair(buf, addr, row, col, q, ctx):
    return 0


@cuda.jit(device=True, forceinline=True)
def _nothing_per_block(buf, addr, row, col, q, ctx):
    return 0, 0, 0, 0


@cuda.jit(device=True, forceinline=True)
def _stored_as_is(frag, k, row, j, col, item, ctx):
    return frag[k], frag[k + 1], NO_MAX


def _checked_tile_store(n, out_dtype, buffers, cols, epilogue, second_output) -> int:
    """:func:`make_tile_store`'s arguments checked (the rule and the fix in each error); returns
    the sub-tile's columns (``cols``, or the widest swizzle span that divides a row)."""
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {tuple(OUT_DTYPES)}; got {out_dtype!r}")
    if not isinstance(n, int) or n % 16 or not 16 <= n <= 256:
        raise ValueError(f"n must be a multiple of 16 in [16, 256] (stmatrix stores 16 x 16 blocks; wgmma N <= 256); "
                         f"got {n!r}")
    if buffers not in (1, 2):
        raise ValueError(f"buffers must be 1 or 2 (2: a sub-tile is written while the last one drains); got "
                         f"{buffers!r}")
    E = OUT_DTYPES[out_dtype]
    if cols is None:
        cols = next(s for s in (128, 64, 32) if (n * E) % s == 0) // E
    if not isinstance(cols, int) or cols * E not in (32, 64, 128) or n % cols or cols % (16 if E == 2 else 8):
        raise ValueError(f"cols must divide n = {n} in sub-tile rows of 32, 64 or 128 bytes (a TMA swizzle span) of "
                         f"whole {16 if E == 2 else 8}-column groups; got {cols!r}")
    if epilogue is not None and not isinstance(epilogue, TileEpilogue):
        raise ValueError(f"epilogue must be None or a TileEpilogue(gather, pair) of device functions; got {epilogue!r}")
    if second_output is not None and (epilogue is None or E != 2 or second_output % 1024
                                      or second_output < ROWS * cols * E):
        raise ValueError("second_output is the byte offset, a multiple of 1024 past the sub-tile, of a 16-bit "
                         f"output's second sub-tile, written from its epilogue's pair hook; got {second_output!r}")
    return cols


def make_tile_store(n, out_dtype="bf16", buffers=2, *, cols=None, epilogue=None, second_output=None) -> TileStore:
    """The :class:`TileStore` of a ``64 x n`` f32 accumulator (``n`` the wgmma N: a multiple
    of 16 up to 256) to ``out_dtype`` ("bf16", "f16", "f32", or "e4m3"/"e5m2": fp8 pairs,
    scaled by an ``epilogue`` hook where they need a scale) through ``buffers`` (1 or 2)
    sub-tile buffers per warpgroup. ``cols``: columns of a sub-tile (default: the widest
    swizzle span, 128, 64 or 32 bytes, that divides a row of the tile); ``epilogue``: None (the
    accumulator as it is), or a :class:`TileEpilogue` of hooks. ``second_output``: (16-bit,
    with hooks) ``write`` also writes a second sub-tile, the pair hook's ``w0, w1``, laid out as
    the first, this many bytes past it in each buffer (the caller stores it: e.g. the two
    gradients of a gated unit). Checked here: the rule and the fix in each error."""
    cols = _checked_tile_store(n, out_dtype, buffers, cols, epilogue, second_output)
    SECOND = second_output is not None
    SECOND_OFF = second_output or 0
    E = OUT_DTYPES[out_dtype]
    SPAN = cols * E
    COLS, SUBTILES = cols, n // cols
    SUB_BYTES = ROWS * SPAN
    # (each buffer on the swizzle's 1024-byte period, a second output's sub-tile included)
    BUF_STRIDE = -(-(SECOND_OFF + SUB_BYTES if SECOND else SUB_BYTES) // 1024) * 1024
    BUFFERS = buffers
    IN_FLIGHT = buffers - 1  # stores that may still read a buffer when the next is written
    STMATRIX = E == 2  # 16-bit: stmatrix.x4 16 x 16 blocks; f32 and fp8: one store a pair
    FP8 = E == 1
    GROUPS = COLS // 16  # stmatrix blocks of a 16-bit sub-tile
    PAIR_GROUPS = COLS // 8  # 8-column groups of an f32 or fp8 sub-tile
    pack = _PACK.get(out_dtype)
    # Without hooks a 16-bit tile is converted whole before its stores (pack_tuple): per pair in
    # the stores, ptxas left the k-step loop of the guide's GEMMs rolled (a padded wgmma each).
    PACKED, PACK = epilogue is None and E == 2, "f16" if out_dtype == "f16" else "bf16"
    if epilogue is None:
        epilogue = TileEpilogue(_nothing_per_block if E == 2 else _nothing_per_pair, _stored_as_is)
    gather, pair = epilogue

    address = make_box_address(SPAN)

    @cuda.jit(device=True, forceinline=True)
    def write(frag, buf, q, row, lane, ctx):
        """Sub-tile ``q`` of the fragment into ``buf``: register 4i + 2j + c holds row row + 8j,
        column 8i + 2(lane % 4) + c (:func:`~numba_hopper.kit.fragments.acc_col`)."""
        m_max = NO_MAX
        if not STMATRIX:  # a pair is 8 (f32) or 2 (fp8) bytes, stored at its place in the swizzled row
            for ii in range(PAIR_GROUPS):
                i = PAIR_GROUPS * q + ii
                for j in range(2):
                    r = row + 8 * j
                    col = 8 * ii + 2 * (lane % 4)
                    addr = address(buf, r, col * E)
                    k = 4 * i + 2 * j
                    v0, v1, m = pair(frag, k, row, j, col, gather(buf, addr, r, col, q, ctx), ctx)
                    m_max = max(m_max, m)
                    if FP8:
                        st_shared_u16(addr, pack(v0, v1))
                    else:
                        st_shared_v2_f32(addr, v0, v1)
        else:
            # stmatrix.x4: matrix m (its row addresses from lanes 8m..8m+7) is the 8x8 block at rows
            # 8(m%2), columns 8(m//2) of a 16x16 block = registers 8P+2m, 8P+2m+1
            # (:func:`~numba_hopper.kit.fragments.x4_lane_offset`).
            r = (row - lane // 4) + x4_lane_offset(lane)[0]  # (row - lane // 4: the warp's first row)
            for p in range(GROUPS):  # 16-column groups of this sub-tile
                base = 8 * (GROUPS * q + p)
                # this lane's 16-byte chunk of the block: x4_lane_offset's column / 8
                addr = address(buf, r, 16 * (2 * p + (lane // 8) // 2))
                col = 16 * p + 2 * (lane % 4)
                items = gather(buf, addr, row, col, q, ctx)
                # register pair x = 2h + j: row row + 8j, column col + 8h
                v = (
                    pair(frag, base + 0, row, 0, col, items[0], ctx),
                    pair(frag, base + 2, row, 1, col, items[1], ctx),
                    pair(frag, base + 4, row, 0, col + 8, items[2], ctx),
                    pair(frag, base + 6, row, 1, col + 8, items[3], ctx),
                )
                regs = (pack(v[0][0], v[0][1]), pack(v[1][0], v[1][1]), pack(v[2][0], v[2][1]),
                        pack(v[3][0], v[3][1]))
                m_max = max(m_max, v[0][2], v[1][2], v[2][2], v[3][2])
                stmatrix_x4(addr, regs[0], regs[1], regs[2], regs[3])
                if SECOND:
                    stmatrix_x4(addr + SECOND_OFF, pack(v[0][3], v[0][4]), pack(v[1][3], v[1][4]),
                                pack(v[2][3], v[2][4]), pack(v[3][3], v[3][4]))
        return m_max

    @cuda.jit(device=True, inline="always", forceinline=True)
    def acquire(leader, barrier_id):
        if leader:
            bulk_wait_group_read(IN_FLIGHT)  # the store that last read the buffer has read it
        warpgroup_sync(barrier_id)

    @cuda.jit(device=True, inline="always", forceinline=True)
    def commit(buf, leader, barrier_id, tmap, col, row):
        fence_proxy_async()  # the generic-proxy writes, visible to TMA
        warpgroup_sync(barrier_id)
        if leader:
            tma_store_2d(tmap, buf, col, row)
            bulk_commit_group()

    @cuda.jit(device=True, inline="always", forceinline=True)
    def commit_3d(buf, leader, barrier_id, tmap, col, row, batch):
        fence_proxy_async()
        warpgroup_sync(barrier_id)
        if leader:
            tma_store_3d(tmap, buf, col, row, batch)
            bulk_commit_group()

    @cuda.jit(device=True, forceinline=True)
    def write_packed(regs, buf, q, t):
        """Sub-tile ``q`` of a 16-bit accumulator converted up front (``regs``: its packed pairs)."""
        lane = t % 32
        r, c = x4_lane_offset(lane)
        row = 16 * (t // 32) + r
        for g in range(GROUPS):
            p = q * GROUPS + g
            stmatrix_x4(address(buf, row, 2 * (16 * g + c)), regs[4 * p], regs[4 * p + 1], regs[4 * p + 2],
                        regs[4 * p + 3])

    @cuda.jit(device=True, forceinline=True)
    def converted(acc):
        if PACKED:
            return pack_tuple(acc, PACK)
        return acc

    @cuda.jit(device=True, forceinline=True)
    def write_tile(regs, buf, q, t):
        if PACKED:
            write_packed(regs, buf, q, t)
        else:
            write(regs, buf, q, thread_rows(t)[0], t % 32, None)

    @cuda.jit(device=True, forceinline=True)
    def tile(acc, buf0, t, barrier_id, tmap, row0, col0, stores):
        regs = tuple_as_array(converted(acc))
        for q in range(SUBTILES):
            buf = buf0 + (stores % BUFFERS) * BUF_STRIDE
            acquire(t == 0, barrier_id)
            write_tile(regs, buf, q, t)
            commit(buf, t == 0, barrier_id, tmap, col0 + q * COLS, row0)
            stores = np.int32(stores + 1)
        return stores

    @cuda.jit(device=True, forceinline=True)
    def tile_3d(acc, buf0, t, barrier_id, tmap, row0, col0, batch, stores):
        regs = tuple_as_array(converted(acc))
        for q in range(SUBTILES):
            buf = buf0 + (stores % BUFFERS) * BUF_STRIDE
            acquire(t == 0, barrier_id)
            write_tile(regs, buf, q, t)
            commit_3d(buf, t == 0, barrier_id, tmap, col0 + q * COLS, row0, batch)
            stores = np.int32(stores + 1)
        return stores

    @cuda.jit(device=True, forceinline=True)
    def drain(t):
        if t == 0:
            bulk_wait_group(0)

    direct = None if FP8 else _make_direct_store(n, out_dtype)  # (an fp8 element alone has no conversion)

    return TileStore(n, out_dtype, buffers, COLS, SPAN, (ROWS, COLS), SPAN, BUFFERS * BUF_STRIDE, address, write,
                     converted, write_tile, acquire, commit, commit_3d, tile, tile_3d, drain, direct)


def _make_direct_store(n, out_dtype):
    """``direct(acc, out, row0, col0, t)``: a warpgroup's 64 x ``n`` f32 accumulator converted to
    ``out_dtype`` (16-bit or f32) and stored element by element into the 2-D array ``out`` at
    ``(row0, col0)``, inside its bounds (no shared memory, no TMA)."""
    F32 = out_dtype == "f32"
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
    def direct_store(acc, out, row0, col0, t):
        direct_groups(out, tuple_as_array(acc), row0 + 16 * (t // 32) + (t % 32) // 4, col0 + 2 * (t % 4))

    return direct_store


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
