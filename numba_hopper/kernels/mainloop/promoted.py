"""The consumers' K loops of promoted fp8 products (``cfg.promoted``): two-level accumulation,
each k-block's product (128 K, four k32 wgmmas) waited for and added, times its block-wise
scales (``cfg.block_scaled``), into f32 register sums. :func:`promoted_mma` promotes one k-block
at a time (a 256-wide tile's in two 128-column halves); :func:`promoted_pairs_mma`, for tiles of
at most 128 x 128, two at a time.

Why: the tensor cores add fp8 products into an accumulator that keeps about 14 bits, so an
unpromoted sum's error grows with K (``use_fast_accum=True``); added into f32 every 128 K, the
error is that of 128-term sums, whatever K is (cuBLASLt's default fp8 kernels promote too).
Without block-wise scales the scales below are the constant 1, which the compiler folds away:
the promotion is one FADD per accumulator register per k-block.

With block-wise scales, a ring slot holds A's scales of the tile's rows for its k-block (a TMA
box beside the k-block's); B's scales, one per 128 x 128 block of B, are loaded from global
memory (``GemmParams.b_scales``) ``SCALE_AHEAD`` k-blocks ahead, so the L2's latency hides
behind wgmmas; 192- and 256-wide tiles take B's scales of two 128-column blocks. The sums double
the accumulators, so promoted tiles are at most 192 wide (96 + 96 registers per thread), or 256
wide in two 128-column halves per k-block (64 + 128).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from ... import intrinsics as nh
from ...kit.fragments import row_half
from ...kit.pipeline import debug_site
from ..gemm_config import KBLOCK_SCALE, WG_ROWS, GemmConfig
from .issue import KBlock, Turns, first_k_block_start

__all__ = ["PromotedMma", "promoted_mma", "promoted_pairs_mma", "SCALE_AHEAD"]

SCALE_AHEAD = 2  # k-blocks: B's scales' loads (from L2) take about two k-blocks' wgmmas

PromotedMma = namedtuple("PromotedMma", ["mma", "start", "finish"])
PromotedMma.__doc__ = """A promoted K loop's device functions: ``mma(acc, smem, bars, st, p, item, c, peers,
tile) -> (sums, st)`` over the item's k-blocks; ``start(acc, smem, bars, st, p, item, c) -> acc`` and
``finish(acc, smem, bars, st, p, item, c, peers, tile) -> (sums, st)``, the same loop split after
the first k-block's issue (``cfg.overlaps_store``: the previous tile is stored in between)."""

_Promotion = namedtuple("_Promotion", ["load_b_scale", "first_b_scales", "a_scales", "promote", "take_turn"])


def _promotion(cfg: GemmConfig, kb: KBlock, turns: Turns) -> _Promotion:
    """The device functions both block-scaled loops use:

    - ``load_b_scale(p, g, n_block, k_begin, i, k_blocks)``: B's scale of the tile's 128 x 128
      block in k-block ``k_begin + i`` of the item's ``k_blocks`` (k-block 0's from
      ``i = k_blocks`` on); ``g``: a grouped tile's group;
    - ``first_b_scales(p, g, n_block, k_begin, k_blocks)``: those of the item's first
      ``SCALE_AHEAD`` k-blocks, a tuple;
    - ``a_scales(row_scales, st)``: A's scales of this thread's two rows in slot ``st``;
    - ``promote(sums, at, part, begin, end, s0, s1)``: ``sums[at + e] += part[e] * scale`` for
      accumulator registers ``begin`` to ``end``: ``s0`` on this thread's first row, ``s1`` on
      its second. Register 4i + 2j + c holds row row_in_wg + 8j, column 8i + 2 * (lane % 4) + c
      (PTX ISA 9.7.15.5.1.1, the accumulator D's fragment), so ``at`` = 64 is 128 columns on;
    - ``take_turn(acc, descs, c)``: one k-block's (or half's) wgmmas on ``descs``, afresh, in
      this consumer's turn.
    """
    A_SCALES_BYTES = cfg.a_scales_bytes
    SCALED = cfg.block_scaled
    B_SCALES_BY_GROUP = cfg.grouped is not None  # grouped kernels: B's scales are (G, K/128, N/128)
    mma_block, wait_turn, pass_turn = kb.issue, turns.wait, turns.pass_on

    @cuda.jit(device=True, forceinline=True)
    def load_b_scale(p, g, n_block, k_begin, i, k_blocks):
        if not SCALED:
            return np.float32(1)
        k = np.uint32(k_begin + i) if i < k_blocks else np.uint32(0)
        if B_SCALES_BY_GROUP:
            return p.b_scales[np.uint64(g), k, n_block]
        return p.b_scales[k, n_block]

    @cuda.jit(device=True, forceinline=True)
    def a_scales(row_scales, st):
        if not SCALED:
            return np.float32(1), np.float32(1)
        at = row_scales + st.stage * A_SCALES_BYTES
        return nh.ld_shared_f32(at), nh.ld_shared_f32(at + 32)

    @cuda.jit(device=True, forceinline=True)
    def promote(sums, at, part, begin, end, s0, s1):
        for e in range(begin, end):
            sums[at + e] += part[e] * (s1 if row_half(e) else s0)

    @cuda.jit(device=True, forceinline=True)
    def take_turn(acc, descs, c):
        wait_turn(c)
        acc = mma_block(acc, descs, True)
        pass_turn(c)
        return acc

    return _Promotion(load_b_scale, _scales_ahead(load_b_scale, SCALE_AHEAD), a_scales, promote, take_turn)


def promoted_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma``: each k-block's product in ``acc`` (started afresh; a 256-wide tile's in two
    halves, see HALVES), waited for, then added, times its scales, into f32 ``sums`` (a tile
    wider than 128 or of three consumers has no registers for the next k-block's accumulator,
    so a consumer cannot queue it first: the consumers take turns instead, ``make_turns``). A's
    scales arrive with the k-block in the ring (TMA) and are read while its wgmmas run; B's,
    one per k-block (two for a 192- or 256-wide tile, whose columns span two 128-column blocks:
    TWO_B_BLOCKS), load once the k-block's (last) wgmmas are issued, while those run: at the
    loop's top, the loads and their address arithmetic sat between the last promotion and the
    next issue, and the tensor cores waited for them (measured 1-3% at M = 4096). The sum comes
    back as a tuple like ``acc`` (whose registers the next tile's wgmmas overwrite: scale_d = 0)."""
    BN = cfg.block_n
    DEBUG = cfg.debug
    A_SCALES = cfg.layout.a_scales
    SCALED = cfg.block_scaled
    # A 192- or 256-wide tile spans two of B's 128-column scale blocks; a 64- or 128-wide one, at
    # a multiple of its width, lies in one (and compiles none of the second block's code).
    TWO_B_BLOCKS = BN > KBLOCK_SCALE
    CHUNK_REGS = 32  # accumulator registers of 64 columns: 8 columns per 4 registers
    # A 256-wide tile's sums (128 registers a thread) leave room for one 128-column accumulator:
    # each k-block runs as two halves, one B scale block each, issued, waited for and promoted
    # one after the other (the consumers taking turns per half).
    HALVES = 2 if BN == 2 * KBLOCK_SCALE else 1
    HALF_N = BN // 2
    B_HALF_DESC = KBLOCK_SCALE * 128 // 16  # B's rows 128 on: 128 K-major rows of 128 B, in 16 B units
    stage_descriptors = kb.descriptors
    load_b_scale, first_b_scales, a_scales, promote, take_turn = _promotion(cfg, kb, turns)
    start, promote_first = _first_k_block(cfg, pipe, kb, take_turn)

    @cuda.jit(device=True, forceinline=True)
    def the_tile_accumulator(acc):
        return acc

    @cuda.jit(device=True, forceinline=True)
    def a_half_accumulator(acc):
        return nh.wgmma_accumulator(HALF_N, "f32")

    part_accumulator = a_half_accumulator if HALVES == 2 else the_tile_accumulator

    @cuda.jit(device=True, forceinline=True)
    def mma_promoted(acc, smem, bars, st, p, item, c, peers, tile):
        return promoted_from(nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32")), acc, smem, bars, st, p, item, c,
                             peers, tile, np.int32(0))

    @cuda.jit(device=True, forceinline=True)
    def finish(acc, smem, bars, st, p, item, c, peers, tile):
        sums = nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32"))
        acc, st = promote_first(sums, acc, bars, st, c, peers)
        return promoted_from(sums, acc, smem, bars, st, p, item, c, peers, tile, np.int32(1))

    @cuda.jit(device=True, forceinline=True)
    def promoted_from(sums, acc, smem, bars, st, p, item, c, peers, tile, first):
        """The item's k-blocks from its ``first`` on, promoted into ``sums``."""
        # 32-bit k-block count and scale indices, as in k_loop: with numba's 64-bit ones, the
        # loop's B-scale addresses took 64-bit compares and multiplies.
        k_begin, k_blocks = np.uint32(item.k_begin + first), np.int32(item.k_end - item.k_begin - first)
        n0 = np.uint32(tile.n0)
        n_block = np.uint32(n0 // KBLOCK_SCALE)
        # this thread's two rows in the box (which starts at the 16-byte boundary before m0)
        row_scales = smem + A_SCALES + 4 * (tile.m0 % 4 + c.cw * WG_ROWS + c.row_in_wg)
        b_scales = first_b_scales(p, tile.batch, n_block, k_begin, k_blocks)
        if TWO_B_BLOCKS:
            # The tile's columns from 128 - n0 % 128 on lie in the next block. A 192-wide tile's
            # n0 is a multiple of 64, so its first 64 columns lie in this block, its last 64 in
            # the next, and its middle 64 in the next iff n0 % 128 == 64; a 256-wide tile's
            # halves lie in this block and the next. Past B's last block the columns are
            # padding (TMA clips their stores): they take the last block's scale.
            n_next = n_block
            if SCALED:
                n_next = np.uint32(min(n_block + 1, p.b_scales.shape[-1] - 1))
            mid_next = n0 % KBLOCK_SCALE != 0
            b_next_scales = first_b_scales(p, tile.batch, n_next, k_begin, k_blocks)
        part_acc = part_accumulator(acc)
        for i in range(k_blocks):
            ahead = np.int32(i + SCALE_AHEAD)
            pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, k_begin + i) if DEBUG else None)
            descs = stage_descriptors(smem, st, c.cw)
            part_acc = take_turn(part_acc, descs, c)
            if HALVES == 1:
                b_later = load_b_scale(p, tile.batch, n_block, k_begin, ahead, k_blocks)
                if TWO_B_BLOCKS:
                    b_next_later = load_b_scale(p, tile.batch, n_next, k_begin, ahead, k_blocks)
            a0, a1 = a_scales(row_scales, st)
            nh.wgmma_wait_group(0)
            part_acc = nh.wgmma_fence_operand(part_acc)  # the reads below stay after the wait
            if HALVES == 1 and c.lane == 0:
                pipe.consumer_release(bars, st, peers)
            part = nh.tuple_as_array(part_acc)
            s0, s1 = a0 * b_scales[0], a1 * b_scales[0]
            if TWO_B_BLOCKS:
                t0, t1 = a0 * b_next_scales[0], a1 * b_next_scales[0]
                if HALVES == 2:  # columns 0-127 in this scale block, 128-255 in the next
                    promote(sums, 0, part, 0, BN // 4, s0, s1)
                    part_acc = take_turn(part_acc, (descs[0], descs[1] + np.uint64(B_HALF_DESC)), c)
                    b_later = load_b_scale(p, tile.batch, n_block, k_begin, ahead, k_blocks)
                    b_next_later = load_b_scale(p, tile.batch, n_next, k_begin, ahead, k_blocks)
                    nh.wgmma_wait_group(0)
                    part_acc = nh.wgmma_fence_operand(part_acc)
                    if c.lane == 0:
                        pipe.consumer_release(bars, st, peers)
                    promote(sums, BN // 4, nh.tuple_as_array(part_acc), 0, BN // 4, t0, t1)
                else:  # one selection per k-block, still one FFMA per register
                    m0, m1 = (t0, t1) if mid_next else (s0, s1)
                    promote(sums, 0, part, 0, CHUNK_REGS, s0, s1)
                    promote(sums, 0, part, CHUNK_REGS, 2 * CHUNK_REGS, m0, m1)
                    promote(sums, 0, part, 2 * CHUNK_REGS, BN // 2, t0, t1)
                b_next_scales = b_next_scales[1:] + (b_next_later,)
            else:
                promote(sums, 0, part, 0, BN // 2, s0, s1)
            b_scales = b_scales[1:] + (b_later,)
            st = pipe.advance(st)
        return nh.array_as_tuple(sums, acc), st

    return PromotedMma(mma_promoted, start, finish)


def promoted_pairs_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma`` as :func:`promoted_mma`, for tiles of at most 128 x 128: k-blocks two at a time,
    both issued in this consumer's turn into two accumulators; the first is waited for
    (``wait_group(1)``) and promoted while the second's wgmmas run, then the second (while
    the other consumer's run). Nothing stays in flight from one run to the next: ptxas
    serializes every wgmma of a loop whose accumulators are read while a wgmma issued in an
    earlier iteration is in flight (C7514). An odd item's last k-block runs alone.

    A lone consumer (64-row tiles) has no other consumer's wgmmas to promote behind: its
    tensor cores idle from a run's last wait to its next issue. Without block-wise scales its
    runs are longer (``GemmConfig.promotion_run`` k-blocks), each accumulator given its next
    k-block as soon as it is promoted, so the idle gap comes once per run; an item's last
    k-blocks run in pairs, then alone."""
    BN = cfg.block_n
    DEBUG = cfg.debug
    A_SCALES = cfg.layout.a_scales
    RUN = cfg.promotion_run
    stage_descriptors, mma_block, wait_turn, pass_turn = kb.descriptors, kb.issue, turns.wait, turns.pass_on
    load_b_scale, first_b_scales, a_scales, promote, take_turn = _promotion(cfg, kb, turns)
    start, promote_first = _first_k_block(cfg, pipe, kb, take_turn)

    @cuda.jit(device=True, forceinline=True)
    def add_scaled(sums, part_acc, scales, s):
        """``sums += part_acc * scales * s`` once the part's wgmmas are waited for."""
        part_acc = nh.wgmma_fence_operand(part_acc)  # the reads below stay after the wait
        promote(sums, 0, nh.tuple_as_array(part_acc), 0, BN // 2, scales[0] * s, scales[1] * s)
        return part_acc

    @cuda.jit(device=True, forceinline=True)
    def issue_pair(acc, second_acc, smem, bars, st, p, item, c, k):
        """k-blocks ``k`` and ``k + 1`` (slots ``st`` and the next) into the two accumulators."""
        st_second = pipe.advance(st)
        pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, k) if DEBUG else None)
        pipe.consumer_wait(bars, st_second, debug_site(p.debug_record, item.tile, k + 1) if DEBUG else None)
        wait_turn(c)
        acc = mma_block(acc, stage_descriptors(smem, st, c.cw), True)
        second_acc = mma_block(second_acc, stage_descriptors(smem, st_second, c.cw), True)
        pass_turn(c)
        return acc, second_acc, st_second

    @cuda.jit(device=True, forceinline=True)
    def promote_then_issue(sums, acc, second_acc, smem, bars, st, st_second, p, item, c, peers, k):
        """(A lone unscaled consumer) the older k-block's promotion, then k-block ``k`` into its
        accumulator: ``(older, newer, slot, slot)`` of the two in flight."""
        nh.wgmma_wait_group(1)
        if c.lane == 0:
            pipe.consumer_release(bars, st, peers)
        acc = add_scaled(sums, acc, (np.float32(1), np.float32(1)), np.float32(1))
        st_next = pipe.advance(st_second)
        pipe.consumer_wait(bars, st_next, debug_site(p.debug_record, item.tile, k) if DEBUG else None)
        return second_acc, mma_block(acc, stage_descriptors(smem, st_next, c.cw), True), st_second, st_next

    # (a chain of inlined calls, not a loop: ptxas would serialize a loop's wgmmas, C7514)
    rest_of_run = _repeated(promote_then_issue, RUN - 2)

    @cuda.jit(device=True, forceinline=True)
    def drain_pair(sums, acc, second_acc, bars, st, st_second, c, peers, first_a, second_a, b_scales):
        """The two k-blocks in flight promoted, times their scales: ``(acc, second_acc, next slot)``."""
        nh.wgmma_wait_group(1)
        if c.lane == 0:
            pipe.consumer_release(bars, st, peers)
        acc = add_scaled(sums, acc, first_a, b_scales[0])
        nh.wgmma_wait_group(0)
        if c.lane == 0:
            pipe.consumer_release(bars, st_second, peers)
        second_acc = add_scaled(sums, second_acc, second_a, b_scales[1])
        return acc, second_acc, pipe.advance(st_second)

    @cuda.jit(device=True, forceinline=True)
    def mma_promoted_pairs(acc, smem, bars, st, p, item, c, peers, tile):
        return pairs_from(nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32")), acc, smem, bars, st, p, item, c, peers,
                          tile, np.int32(0))

    @cuda.jit(device=True, forceinline=True)
    def finish(acc, smem, bars, st, p, item, c, peers, tile):
        sums = nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32"))
        if item.k_end - item.k_begin >= 2:
            acc, st = first_pair(sums, acc, smem, bars, st, p, item, c, peers)
            first = np.int32(2)
        else:
            acc, st = promote_first(sums, acc, bars, st, c, peers)
            first = np.int32(1)
        return pairs_from(sums, acc, smem, bars, st, p, item, c, peers, tile, first)

    @cuda.jit(device=True, forceinline=True)
    def first_pair(sums, acc, smem, bars, st, p, item, c, peers):
        """(Unscaled, two consumers) the item's first pair, its first k-block already
        issued into ``acc``: the second issued, both promoted: ``(acc, next slot)``."""
        st_second = pipe.advance(st)
        pipe.consumer_wait(bars, st_second, debug_site(p.debug_record, item.tile, item.k_begin + 1) if DEBUG else None)
        second_acc = take_turn(nh.wgmma_accumulator(BN, "f32"), stage_descriptors(smem, st_second, c.cw), c)
        ones = (np.float32(1), np.float32(1))
        acc, second_acc, st = drain_pair(sums, acc, second_acc, bars, st, st_second, c, peers, ones, ones, ones)
        return acc, st

    @cuda.jit(device=True, forceinline=True)
    def pairs_from(sums, acc, smem, bars, st, p, item, c, peers, tile, first):
        """The item's k-blocks from its ``first`` on, promoted into ``sums``."""
        k_begin, k_blocks = np.uint32(item.k_begin + first), np.int32(item.k_end - item.k_begin - first)
        n_block = np.uint32(np.uint32(tile.n0) // KBLOCK_SCALE)
        row_scales = smem + A_SCALES + 4 * (tile.m0 % 4 + c.cw * WG_ROWS + c.row_in_wg)
        b_scales = first_b_scales(p, tile.batch, n_block, k_begin, k_blocks)  # the next pair's
        second_acc = nh.wgmma_accumulator(BN, "f32")
        for j in range(k_blocks // RUN):
            k = k_begin + RUN * j
            acc, second_acc, st_second = issue_pair(acc, second_acc, smem, bars, st, p, item, c, k)
            ahead = np.int32(RUN * j + SCALE_AHEAD)  # (loaded while the pair's wgmmas run; RUN = 2)
            b_later = (load_b_scale(p, tile.batch, n_block, k_begin, ahead, k_blocks),
                       load_b_scale(p, tile.batch, n_block, k_begin, ahead + 1, k_blocks))
            first_a, second_a = a_scales(row_scales, st), a_scales(row_scales, st_second)
            # (a run longer than a pair is unscaled: the scales above and below are 1)
            acc, second_acc, st, st_second = rest_of_run(sums, acc, second_acc, smem, bars, st, st_second, p, item, c,
                                                         peers, k + 2)
            acc, second_acc, st = drain_pair(sums, acc, second_acc, bars, st, st_second, c, peers, first_a, second_a,
                                             b_scales)
            b_scales = b_later
        if RUN > 2:  # a long run's last pairs (unscaled)
            for j in range(k_blocks % RUN // 2):
                acc, second_acc, st_second = issue_pair(acc, second_acc, smem, bars, st, p, item, c,
                                                        k_begin + k_blocks - k_blocks % RUN + 2 * j)
                acc, second_acc, st = drain_pair(sums, acc, second_acc, bars, st, st_second, c, peers,
                                                 a_scales(row_scales, st), a_scales(row_scales, st_second), b_scales)
        if k_blocks % 2 == 1:
            pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, k_begin + k_blocks - 1) if DEBUG else None)
            acc = take_turn(acc, stage_descriptors(smem, st, c.cw), c)
            last_a = a_scales(row_scales, st)
            nh.wgmma_wait_group(0)
            if c.lane == 0:
                pipe.consumer_release(bars, st, peers)
            acc = add_scaled(sums, acc, last_a, b_scales[0])
            st = pipe.advance(st)
        return nh.array_as_tuple(sums, acc), st

    return PromotedMma(mma_promoted_pairs, start, finish)


def _first_k_block(cfg: GemmConfig, pipe, kb: KBlock, take_turn):
    """``(start, promote_first)`` of a kernel that stores a tile while the next one's first
    k-block runs (``cfg.overlaps_store``, unscaled):

    - ``start(acc, smem, bars, st, p, item, c) -> acc``: the item's first k-block issued into
      ``acc`` (a fresh accumulator: the previous tile's sums are still to be stored) in this
      consumer's turn;
    - ``promote_first(sums, acc, bars, st, c, peers) -> (acc, st)``: once the previous tile is
      stored, that k-block waited for and copied into the fresh ``sums``, its slot released:
      the ring's next slot.
    """
    HALF = cfg.block_n // 2

    @cuda.jit(device=True, forceinline=True)
    def promote_first(sums, acc, bars, st, c, peers):
        nh.wgmma_wait_group(0)
        acc = nh.wgmma_fence_operand(acc)  # the reads below stay after the wait
        if c.lane == 0:
            pipe.consumer_release(bars, st, peers)
        part = nh.tuple_as_array(acc)
        for e in range(HALF):
            sums[e] = part[e]
        return acc, pipe.advance(st)

    return first_k_block_start(pipe, kb, take_turn, cfg.debug), promote_first


def _repeated(step, n):
    """``step`` applied ``n`` times, inlined: ``(sums, acc, second_acc, smem, bars, st,
    st_second, p, item, c, peers, k)`` to ``(acc, second_acc, st, st_second)``, k-blocks ``k``
    to ``k + n - 1``."""

    @cuda.jit(device=True, forceinline=True)
    def none(sums, acc, second_acc, smem, bars, st, st_second, p, item, c, peers, k):
        return acc, second_acc, st, st_second

    repeated = none
    for i in range(n):
        repeated = _then_step(repeated, step, i)
    return repeated


def _then_step(first, step, i):
    @cuda.jit(device=True, forceinline=True)
    def first_then(sums, acc, second_acc, smem, bars, st, st_second, p, item, c, peers, k):
        acc, second_acc, st, st_second = first(sums, acc, second_acc, smem, bars, st, st_second, p, item, c, peers, k)
        return step(sums, acc, second_acc, smem, bars, st, st_second, p, item, c, peers, k + i)

    return first_then


def _scales_ahead(load, n):
    """``first(p, g, n_block, k_begin, k_blocks)``: the tuple of ``load(p, g, n_block, k_begin,
    i, k_blocks)`` for the item's first ``n`` k-blocks, i = 0 .. n - 1."""

    @cuda.jit(device=True, forceinline=True)
    def first(p, g, n_block, k_begin, k_blocks):
        return ()

    for i in range(n):
        first = _then_load(first, load, i)
    return first


def _then_load(first, load, i):
    @cuda.jit(device=True, forceinline=True)
    def first_then(p, g, n_block, k_begin, k_blocks):
        return first(p, g, n_block, k_begin, k_blocks) + (load(p, g, n_block, k_begin, np.int32(i), k_blocks),)

    return first_then
