"""Which query tiles a persistent CTA computes, and each tile's rows, keys and masked blocks.

The grid is one CTA per SM. CTA ``c`` takes tiles ``c, c + gridDim.x, ...`` of the launch's
``tiles`` (``m_blocks`` 128-row query tiles per (batch, head) pair); its producer and its
consumers walk the same ids through :func:`make_scheduler`'s ``work`` and agree on every tile
without talking.

Order (FlashAttention-3's, ``hopper/tile_scheduler.hpp``): the (batch, head) pairs go in
sections of ``section`` pairs; inside a section the id runs over the pairs first, then over the
query tiles. Non-causal launches use sections of one pair, so the CTAs of a wave share one
head's K and V in L2. Causal launches take the query tiles longest first (the last tile of a
head sees every key, the first only 128 of them), in sections of pairs whose K and V fit in
L2 together: a static longest-processing-time-first order, which leaves the short tiles to
even out the CTAs' loads at the end.

Per tile (a :class:`Work`): the sequence lengths (read from ``cu_seqlens`` in a packed batch),
``n_blocks`` key blocks to visit (fewer under a causal mask), of which the first
``n_masked`` (the highest, visited first) need the per-element mask: keys past the sequence
end, or past the causal diagonal of some row of the tile. Query row ``i`` of a sequence sees
key ``j`` iff ``j < seqlen_k`` and ``j <= i + diag``, where ``diag`` is ``seqlen_k -
seqlen_q`` (causal, bottom-right), 0 (causal, top-left) or ``seqlen_k`` (not causal).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from .config import BLOCK_M, AttentionConfig

__all__ = ["Work", "Scheduler", "make_scheduler", "tile_order_host"]

Work = namedtuple("Work", ["valid", "m_block", "head", "kv_head", "batch", "q_start", "seqlen_q", "k_start",
                           "seqlen_k", "tma_batch", "diag", "n_blocks", "n_masked"])
Work.__doc__ = """One query tile: ``valid`` (its first row lies inside its sequence), its ``m_block``,
``head`` (and ``kv_head``), ``batch``, the rows ``q_start`` / ``k_start`` where its sequences begin in
the tensors (0 unless packed) and their lengths, ``tma_batch`` (the tensor maps' batch coordinate:
the batch, or 0 when packed), the causal ``diag`` (module doc), and ``n_blocks`` / ``n_masked``
(int32)."""
Scheduler = namedtuple("Scheduler", ["first", "next", "work"])
Scheduler.__doc__ = """Device functions ``first() -> tile``, ``next(tile) -> tile`` and ``work(params, tile) ->
Work`` (:func:`make_scheduler`); the walk ends once ``tile >= params.tiles``."""


def make_scheduler(cfg: AttentionConfig) -> Scheduler:
    """The tile walk of ``cfg``'s kernel (module doc). 32-bit divisions (``div.u32``) keep the
    producer, which runs on 24 registers, out of numba's 64-bit division subroutine."""
    key_blocks = cuda.jit(device=True, forceinline=True)(make_key_blocks(cfg.block_n))

    @cuda.jit(device=True, forceinline=True)
    def first():
        return np.uint32(cuda.blockIdx.x)

    @cuda.jit(device=True, forceinline=True)
    def next_tile(tile):
        return np.uint32(tile + cuda.gridDim.x)

    @cuda.jit(device=True, forceinline=True)
    def coordinates(p, tile):
        """``(m_block, batch, head)`` of tile id ``tile``."""
        section, m_blocks = np.uint32(p.section), np.uint32(p.m_blocks)
        pairs = np.uint32(p.batch * p.heads)
        sec = nh.div_u32(tile, section * m_blocks)
        first_pair = sec * section
        width = min(section, pairs - first_pair)  # the last section may be narrower
        within = tile - sec * section * m_blocks
        m_index = nh.div_u32(within, width)
        pair = first_pair + within - m_index * width
        m_block = m_blocks - 1 - m_index if p.causal else m_index
        batch = nh.div_u32(pair, np.uint32(p.heads))
        return m_block, batch, np.uint32(pair - batch * np.uint32(p.heads))

    @cuda.jit(device=True, forceinline=True)
    def sequence(cu_seqlens, batch, dense_len):
        """``(start, length)`` of sequence ``batch``: from the cumulative offsets when packed."""
        if cu_seqlens == 0:
            return np.int32(0), np.int32(dense_len)
        start = np.int32(nh.ld_global_u32(cu_seqlens + 4 * batch))
        return start, np.int32(np.int32(nh.ld_global_u32(cu_seqlens + 4 * batch + 4)) - start)

    @cuda.jit(device=True, forceinline=True)
    def work(p, tile):
        m_block, batch, head = coordinates(p, tile)
        q_start, seqlen_q = sequence(p.cu_seqlens_q, batch, p.seqlen_q)
        k_start, seqlen_k = sequence(p.cu_seqlens_k, batch, p.seqlen_k)
        m0 = np.int32(m_block * BLOCK_M)
        if p.causal:
            diag = np.int32(seqlen_k - seqlen_q) if p.bottom_right else np.int32(0)
        else:
            diag = seqlen_k
        n_blocks, n_masked = key_blocks(m0, seqlen_q, seqlen_k, diag)
        tma_batch = np.int32(0) if p.cu_seqlens_q != 0 else np.int32(batch)
        kv_head = np.int32(nh.div_u32(np.uint32(head), np.uint32(p.kv_group)))
        return Work(m0 < seqlen_q, np.int32(m_block), np.int32(head), kv_head, np.int32(batch), q_start, seqlen_q,
                    k_start, seqlen_k, tma_batch, diag, n_blocks, n_masked)

    return Scheduler(first, next_tile, work)


def make_key_blocks(block_n):
    """``key_blocks(m0, seqlen_q, seqlen_k, diag) -> (n_blocks, n_masked)`` of the query tile whose
    first row is ``m0`` (plain Python, compiled as a device function by :func:`make_scheduler`
    and run as it is on the host by the tests): the key blocks up to the last one its last row
    sees, and how many of them (the highest) some row sees only in part (module doc). Floor
    divisions (numba's ``//`` rounds toward minus infinity, as Python's)."""
    BN = block_n

    def key_blocks(m0, seqlen_q, seqlen_k, diag):
        last_row = np.int32(min(m0 + BLOCK_M, seqlen_q) - 1)
        n_blocks = max(np.int32(0), min(np.int32((seqlen_k + BN - 1) // BN), np.int32((last_row + diag) // BN + 1)))
        # blocks below both the sequence end and the first row's diagonal need no mask
        plain = max(np.int32(0), min(n_blocks, np.int32(seqlen_k // BN), np.int32((m0 + diag + 1) // BN)))
        return n_blocks, np.int32(n_blocks - plain)

    return key_blocks


def tile_order_host(m_blocks, pairs, section, causal):
    """Host twin of the walk: ``[(m_block, pair), ...]`` in tile-id order (for tests)."""
    order = []
    for tile in range(m_blocks * pairs):
        sec, within = divmod(tile, section * m_blocks)
        first_pair = sec * section
        width = min(section, pairs - first_pair)
        m_index, offset = divmod(within, width)
        order.append((m_blocks - 1 - m_index if causal else m_index, first_pair + offset))
    return order
