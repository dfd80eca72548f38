"""Which query tiles a persistent CTA computes, and each tile's rows, keys and masked blocks.

The grid is one CTA per SM. CTA ``c`` takes work items ``c, c + gridDim.x, ...`` of the
launch's (one or two of the ``m_blocks`` query tiles of a (batch, head) pair each); its
producer and its consumers walk the same positions through :func:`make_scheduler`'s ``work``
and agree on every tile without talking.

Order: the (batch, head) pairs go in sections of ``section`` pairs (FlashAttention-3's L2
swizzle, ``hopper/tile_scheduler.hpp``); inside a section the id runs over the pairs first,
then over the query tiles. Non-causal launches use sections of one pair, so the CTAs of a wave
share one head's K and V in L2. Causal launches take sections of pairs whose K and V fit in L2
together, and their work items are pairs of query tiles: the last tile of a head (it sees every
key) with the first (it sees ``block_n`` of them), the second to last with the second, and so
on, so that every item costs about the same and CTA ``c``'s items ``c, c + gridDim.x, ...``
keep the CTAs equally loaded. (One tile per item, longest first, dealt round-robin, leaves the
CTA that gets the first tile of each wave 20-40% more work than the mean: the walk's length is
its longest CTA's.) A walk position is ``2 * item + half``: half 0 is the item's long tile,
half 1 its short one (none in the middle item of an odd tile count, nor without a mask).

Balanced schedule. Equal items still leave a quantization: 2048 items on 132 CTAs are 15 or 16
a CTA, and the walk lasts 16 (3% over the mean). A dense causal launch therefore takes a
host-computed schedule (:func:`balanced_schedule`, in ``AttentionParams.schedule``): single
tiles in the same order (section by section, longest first), each given to the CTA the
cost model (:func:`tile_costs`) says is free first, as a dynamic scheduler would hand them
out. The CTAs end within a short tile of each other. Row ``k`` of the table holds each CTA's
``k``-th tile (``pair * m_blocks + m_block``, :data:`NO_TILE` past its last), so a CTA walks
positions ``2 * (k * gridDim.x + cta)`` and reads each entry a tile ahead (``fetch``).

Per tile (a :class:`Work`): the sequence lengths (read from ``cu_seqlens`` in a packed batch),
``n_blocks`` key blocks to visit (fewer under a causal mask), of which the first
``n_masked`` (the highest, visited first) need the per-element mask: keys past the sequence
end, or past the causal diagonal of some row of the tile. Query row ``i`` of a sequence sees
key ``j`` iff ``j < seqlen_k`` and ``j <= i + diag``, where ``diag`` is ``seqlen_k -
seqlen_q`` (causal, bottom-right), 0 (causal, top-left) or ``seqlen_k`` (not causal).
"""

from __future__ import annotations

import heapq
from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from .config import AttentionConfig

__all__ = ["Work", "Scheduler", "make_scheduler", "pair_items", "walk_host", "tile_costs", "balanced_schedule",
           "schedule_walks", "NO_TILE", "TILE_OVERHEAD"]

NO_TILE = 0xFFFFFFFF  # a balanced schedule's entry past a CTA's last tile
# A tile's cost beyond its key blocks, in key blocks: Q's load, the first block's S and softmax
# and the last P V (nothing overlaps them) and the epilogue. Estimated from the non-causal rate
# at 2k against 16k tokens a sequence (16 and 128 key blocks a tile).
TILE_OVERHEAD = 2

Work = namedtuple("Work", ["valid", "m_block", "head", "kv_head", "batch", "q_start", "seqlen_q", "k_start",
                           "seqlen_k", "tma_batch", "diag", "n_blocks", "n_masked"])
Work.__doc__ = """One query tile: ``valid`` (its first row lies inside its sequence, and it is no repeat), its ``m_block``,
``head`` (and ``kv_head``), ``batch``, the rows ``q_start`` / ``k_start`` where its sequences begin in
the tensors (0 unless packed) and their lengths, ``tma_batch`` (the tensor maps' batch coordinate:
the batch, or 0 when packed), the causal ``diag`` (module doc), and ``n_blocks`` / ``n_masked``
(int32)."""
Scheduler = namedtuple("Scheduler", ["first", "next", "fetch", "work"])
Scheduler.__doc__ = """Device functions ``first() -> position``, ``next(params, position) -> position``,
``fetch(params, position) -> entry`` (the balanced schedule's entry, 0 without one) and
``work(params, position, entry) -> Work`` (:func:`make_scheduler`); the walk ends once
``position >= params.positions``."""


def make_scheduler(cfg: AttentionConfig) -> Scheduler:
    """The tile walk of ``cfg``'s kernel (module doc). 32-bit divisions (``div.u32``) keep the
    producer, which runs on 24 registers, out of numba's 64-bit division subroutine."""
    BLOCK_M = cfg.block_m
    key_blocks = cuda.jit(device=True, forceinline=True)(make_key_blocks(cfg.block_n, BLOCK_M))

    @cuda.jit(device=True, forceinline=True)
    def first():
        return np.uint32(2 * cuda.blockIdx.x)

    @cuda.jit(device=True, forceinline=True)
    def next_position(p, pos):
        """The item's short tile after its long one (causal), else the CTA's next item."""
        if p.causal and p.schedule == 0 and (pos & 1) == 0:
            return np.uint32(pos + 1)
        return np.uint32(((pos >> 1) + cuda.gridDim.x) << 1)

    @cuda.jit(device=True, forceinline=True)
    def fetch(p, pos):
        """The balanced schedule's entry of ``pos`` (0 without a schedule; the table has a row
        of :data:`NO_TILE` past the last, so the position after a walk's end reads one too)."""
        if p.schedule == 0:
            return np.uint32(0)
        return nh.ld_global_u32(p.schedule + 4 * (pos >> 1))

    @cuda.jit(device=True, forceinline=True)
    def coordinates(p, pos, entry):
        """``(m_block, batch, head, repeat)`` of walk position ``pos``; ``repeat``: the short
        half of the middle item of an odd tile count, which is its long half again, or a
        schedule's :data:`NO_TILE`."""
        heads = np.uint32(p.heads)
        if p.schedule != 0:
            pair = nh.div_u32(entry, np.uint32(p.m_blocks))
            batch = nh.div_u32(pair, heads)
            return entry - pair * np.uint32(p.m_blocks), batch, pair - batch * heads, entry == np.uint32(NO_TILE)
        item, half = pos >> 1, pos & 1
        section, pair_items, m_blocks = np.uint32(p.section), np.uint32(p.pair_items), np.uint32(p.m_blocks)
        pairs = np.uint32(p.batch * p.heads)
        sec = nh.div_u32(item, section * pair_items)
        first_pair = sec * section
        width = min(section, pairs - first_pair)  # the last section may be narrower
        within = item - sec * section * pair_items
        j = nh.div_u32(within, width)
        pair = first_pair + within - j * width
        m_block = j if half or not p.causal else m_blocks - 1 - j
        batch = nh.div_u32(pair, heads)
        return m_block, batch, pair - batch * heads, half != 0 and np.uint32(2) * j + np.uint32(1) == m_blocks

    @cuda.jit(device=True, forceinline=True)
    def sequence(cu_seqlens, batch, dense_len):
        """``(start, length)`` of sequence ``batch``: from the cumulative offsets when packed."""
        if cu_seqlens == 0:
            return np.int32(0), np.int32(dense_len)
        start = np.int32(nh.ld_global_u32(cu_seqlens + 4 * batch))
        return start, np.int32(np.int32(nh.ld_global_u32(cu_seqlens + 4 * batch + 4)) - start)

    @cuda.jit(device=True, forceinline=True)
    def work(p, pos, entry):
        m_block, batch, head, repeat = coordinates(p, pos, entry)
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
        return Work(m0 < seqlen_q and not repeat, np.int32(m_block), np.int32(head), kv_head, np.int32(batch), q_start, seqlen_q,
                    k_start, seqlen_k, tma_batch, diag, n_blocks, n_masked)

    return Scheduler(first, next_position, fetch, work)


def make_key_blocks(block_n, block_m):
    """``key_blocks(m0, seqlen_q, seqlen_k, diag) -> (n_blocks, n_masked)`` of the query tile whose
    first row is ``m0`` (plain Python, compiled as a device function by :func:`make_scheduler`
    and run as it is on the host by the tests): the key blocks up to the last one its last row
    sees, and how many of them (the highest) some row sees only in part (module doc). Floor
    divisions (numba's ``//`` rounds toward minus infinity, as Python's)."""
    BN = block_n

    def key_blocks(m0, seqlen_q, seqlen_k, diag):
        last_row = np.int32(min(m0 + block_m, seqlen_q) - 1)
        n_blocks = max(np.int32(0), min(np.int32((seqlen_k + BN - 1) // BN), np.int32((last_row + diag) // BN + 1)))
        # blocks below both the sequence end and the first row's diagonal need no mask
        plain = max(np.int32(0), min(n_blocks, np.int32(seqlen_k // BN), np.int32((m0 + diag + 1) // BN)))
        return n_blocks, np.int32(n_blocks - plain)

    return key_blocks


def pair_items(m_blocks: int, causal: bool) -> int:
    """Work items per (batch, head) pair: a causal item is two query tiles (module doc)."""
    return (m_blocks + 1) // 2 if causal else m_blocks


def walk_host(m_blocks: int, pairs: int, section: int, causal: bool, ctas: int) -> list:
    """Host twin of the walk: for each of ``ctas`` CTAs, its ``[(m_block, pair), ...]`` in order
    (for tests and for weighing a launch's balance)."""
    per_pair = pair_items(m_blocks, causal)
    items = per_pair * pairs
    walks = []
    for cta in range(ctas):
        walk = []
        for item in range(cta, items, ctas):
            sec, within = divmod(item, section * per_pair)
            first_pair = sec * section
            j, offset = divmod(within, min(section, pairs - first_pair))
            halves = [m_blocks - 1 - j, j] if causal else [j]
            walk += [(m, first_pair + offset) for m in dict.fromkeys(halves)]
        walks.append(walk)
    return walks


def tile_costs(m_blocks: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int, diag: int) -> list:
    """The modelled time of each query tile of a dense launch: its key blocks plus
    :data:`TILE_OVERHEAD`."""
    key_blocks = make_key_blocks(block_n, block_m)
    return [int(key_blocks(np.int32(m * block_m), np.int32(seqlen_q), np.int32(seqlen_k), np.int32(diag))[0])
            + TILE_OVERHEAD for m in range(m_blocks)]


def balanced_schedule(costs, pairs: int, section: int, ctas: int) -> np.ndarray:
    """The balanced schedule (module doc) of ``pairs`` (batch, head) pairs whose tile ``m`` costs
    ``costs[m]``, on ``ctas`` CTAs: uint32, ``(rows + 1, ctas)`` (the last row all
    :data:`NO_TILE`), entry ``[k, c]`` CTA ``c``'s ``k``-th tile."""
    m_blocks = len(costs)
    longest_first = sorted(range(m_blocks), key=lambda m: -costs[m])
    free_at = [(0, cta) for cta in range(ctas)]  # (modelled time, CTA): the heap's least is free first
    walks = [[] for _ in range(ctas)]
    for first_pair in range(0, pairs, section):
        for m in longest_first:
            for pair in range(first_pair, min(first_pair + section, pairs)):
                t, cta = heapq.heappop(free_at)
                walks[cta].append(pair * m_blocks + m)
                heapq.heappush(free_at, (t + costs[m], cta))
    table = np.full((max(map(len, walks)) + 1, ctas), NO_TILE, dtype=np.uint32)
    for cta, walk in enumerate(walks):
        table[:len(walk), cta] = walk
    return table


def schedule_walks(table: np.ndarray, m_blocks: int) -> list:
    """Each CTA's ``[(m_block, pair), ...]`` of a :func:`balanced_schedule` table (for tests)."""
    return [[(int(e) % m_blocks, int(e) // m_blocks) for e in column if e != NO_TILE] for column in table.T]
