"""The attention epilogue: a consumer warpgroup's 64 output rows, normalized, to global memory,
and their log-sum-exps.

The f32 accumulator, times ``1 / l`` row by row, is packed to 16 bits and written with
``stmatrix`` into the warpgroup's 64 rows of the output staging tile (Q's layout: 64-column
boxes of 128-byte swizzled rows, :mod:`.config`), then stored by TMA, one ``(64, 64)`` box per
64 columns; TMA drops rows past the tensor's end, so a dense batch's last tile needs no code.
A packed (variable-length) batch's sequences end inside the tensor: a warpgroup whose rows
cross its sequence's end copies the rows that belong to it from the staging tile to global
memory itself (16 bytes a thread per store), and one whose rows all lie past it stores nothing.

The staging tile is its own buffer, or Q's (``cfg.o_aliases_q``: then the TMA store must have
read it before the producer loads the next tile's Q, and the warpgroup arrives on ``q_empty``
only then). Before writing a staging tile the leader waits until the previous tile's store
has read it (``cp.async.bulk.wait_group.read``).

Log-sum-exp: the first lane of each quad writes its two rows' (float32), if asked for.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..intrinsics.gmem_f32 import st_global_f32
from ..intrinsics.opaque import opaque_u32
from ..kit.fragments import scale_rows, thread_rows, x4_lane_offset
from .config import WG_ROWS, AttentionConfig
from .softmax import finalize

__all__ = ["Epilogue", "make_epilogue"]

Epilogue = namedtuple("Epilogue", ["store", "drain"])
Epilogue.__doc__ = """``make_epilogue(cfg)``: device functions ``store(o, m, l, p, maps, smem, w, cw, t, barrier)``
(a consumer warpgroup's rows of one tile; ``barrier``: its named barrier id) and ``drain(t)``
(before the CTA exits)."""

SPAN = 128  # bytes of a staging row in one box (64 16-bit columns)


def make_epilogue(cfg: AttentionConfig) -> Epilogue:
    """The epilogue of ``cfg``'s kernel (module doc)."""
    T, D, BOXES, BLOCK_M = cfg.dtype, cfg.head_dim, cfg.boxes, cfg.block_m
    O_OFF, BOX, O_WG = cfg.o_offset, cfg.o.box_bytes, cfg.o.mn_offset(WG_ROWS)
    Q_EMPTY = cfg.smem.offsets["q_bars"] + 8
    O_ALIASES_Q = cfg.o_aliases_q

    @cuda.jit(device=True, forceinline=True)
    def chunk_address(base, row, chunk):
        """Shared address of 16-byte chunk ``chunk`` (0-7) of staging row ``row`` of the box at
        ``base``, 128-byte swizzled as TMA lays it out (``kit.layouts.swizzle``), in 32-bit
        arithmetic: numba's 64-bit index math, hoisted out of the tile loop, spills."""
        row = np.uint32(row)
        return np.uint32(base + row * np.uint32(SPAN) + np.uint32(16) * (np.uint32(chunk) ^ (row & np.uint32(7))))

    @cuda.jit(device=True, forceinline=True)
    def write_rows(packed, base, t):
        """The packed 64 x D tile into the staging boxes at ``base`` (stmatrix.x4: 16 x 16
        elements a warp per instruction; lane addresses from ``x4_lane_offset``)."""
        regs = nh.tuple_as_array(packed)
        t = opaque_u32(t)  # (the lanes' swizzled offsets stay out of the mainloop's registers)
        r, c = x4_lane_offset(t % 32)
        row = np.uint32(16 * (t // 32) + r)
        half = np.uint32(c // 8)  # the lane's 8 columns of the 16
        for g in range(D // 16):  # 16-column groups, four per 64-column box
            addr = chunk_address(base + np.uint32((g // 4) * BOX), row, np.uint32(2 * (g % 4)) + half)
            nh.stmatrix_x4(addr, regs[4 * g], regs[4 * g + 1], regs[4 * g + 2], regs[4 * g + 3])

    @cuda.jit(device=True, forceinline=True)
    def copy_rows(base, p, w, row0, rows, t):
        """Rows ``0 .. rows-1`` of the staging boxes at ``base`` to the output's rows from
        ``row0`` (of the packed batch): thread ``t`` copies 16-byte chunk ``t % 8`` of rows
        ``t // 8 + 16 i`` of each box."""
        part, first = np.uint32(t % 8), np.int32(t // 8)
        at = p.out + 2 * ((row0 + first) * p.out_row + w.head * p.out_head + w.batch * p.out_batch + 8 * part)
        for i in range(4 * BOXES):
            row = first + np.int32(16 * (i % 4))
            if row < rows:
                v = nh.ld_shared_v4_u32(chunk_address(base + np.uint32((i // 4) * BOX), row, part))
                nh.st_global_v4_u32(at + 2 * (16 * (i % 4) * p.out_row + 64 * (i // 4)), v[0], v[1], v[2], v[3])

    @cuda.jit(device=True, forceinline=True)
    def store_lse(p, w, cw, t, m, l, lse):
        if p.lse != 0 and t % 4 == 0:
            r0, r1 = thread_rows(t)
            first = np.int32(w.m_block * BLOCK_M + cw * WG_ROWS)
            at = p.lse + 4 * (w.batch * p.lse_batch + w.head * p.lse_head + w.q_start + first)
            if first + r0 < w.seqlen_q:
                st_global_f32(at + 4 * r0, lse[0])
            if first + r1 < w.seqlen_q:
                st_global_f32(at + 4 * r1, lse[1])

    @cuda.jit(device=True, forceinline=True)
    def store(o, m, l, p, maps, smem, w, cw, t, barrier):
        inv, lse = finalize(m, l, p.scale)
        store_lse(p, w, cw, t, m, l, lse)
        packed = nh.pack_tuple(scale_rows(o, inv), T)
        base = opaque_u32(smem + O_OFF + cw * O_WG)  # (its addresses stay out of the mainloop's registers)
        first = np.int32(w.m_block * BLOCK_M + cw * WG_ROWS)
        rows = w.seqlen_q - first  # this warpgroup's rows inside the sequence (may be <= 0)
        if not O_ALIASES_Q and t == 0:
            nh.bulk_wait_group_read(0)  # the last tile's store has read the staging tile
        nh.named_barrier_sync(barrier, 128)
        write_rows(packed, base, t)
        if p.cu_seqlens_q != 0 and rows < WG_ROWS:  # a packed sequence ends in these rows
            nh.named_barrier_sync(barrier, 128)
            copy_rows(base, p, w, w.q_start + first, rows, t)
            nh.named_barrier_sync(barrier, 128)
            if O_ALIASES_Q and t == 0:
                nh.mbarrier_arrive(smem + Q_EMPTY)
        else:
            nh.fence_proxy_async()  # the stmatrix writes become visible to TMA
            nh.named_barrier_sync(barrier, 128)
            if t == 0:
                for b in range(BOXES):
                    nh.tma_store_4d(maps[3], base + b * BOX, 64 * b, w.q_start + first, w.head, w.tma_batch)
                nh.bulk_commit_group()
                if O_ALIASES_Q:
                    nh.bulk_wait_group_read(0)
                    nh.mbarrier_arrive(smem + Q_EMPTY)

    @cuda.jit(device=True, forceinline=True)
    def drain(t):
        if t == 0:
            nh.bulk_wait_group(0)

    return Epilogue(store, drain)
