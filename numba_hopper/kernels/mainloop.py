"""The GEMM's mainloop: TMA loads of A and B tiles into the ring, wgmma on them.

The producer's ``load`` walks a work item's k-blocks (128 bytes of K: 64 16-bit or 128 fp8
elements, ``cfg.block_k``): it acquires a ring slot and loads one k-block of the A tile
(BM x block_k) and of the B tile (block_k x BN) into it. The consumers' ``mma`` waits for
each slot, issues ``wgmma.m64nBNk16`` (k32 for fp8) on its 64 rows of A, and releases
the slot ``cfg.mma_depth`` k-blocks late (one, or more where the ring has slots to spare),
once ``wgmma.wait_group`` says the wgmmas that read it are done, so the tensor cores
always have the next k-blocks queued (PTX ISA, "Asynchronous warpgroup level matrix
multiply-accumulate operation", wgmma.wait_group).

Layouts: a K-major operand (A row-major, B column-major) is loaded as one box of one
k-block (128 bytes, the 128B swizzle span) by BM or BN rows. An MN-major operand (A
column-major, B row-major) is loaded as 64 x 64 boxes stacked along M/N and read by wgmma
with the transpose bit (a 32-wide B tile: one 64 x 32 box with 64-byte swizzle). Partial
tiles need no code: TMA zero-fills loads outside the tensor.

Clusters: CTA ``(rm, rn)`` of a ``cluster_m x cluster_n`` cluster loads part ``rn`` of its
A tile and part ``rm`` of its B tile and multicasts each to the CTAs that share that tile
(``cp.async.bulk.tensor`` with ``.multicast::cluster``); a slot is then released to every
producer that writes into it.

Ping-pong (``cfg.pingpong``): a consumer issues both 64-row halves of a whole tile, in turns
with the other consumer, and passes over the other's k-blocks in the ring.

Block-wise fp8 scales (``cfg.block_scaled``): a slot also holds A's scales of the tile's
rows for its k-block (one more TMA box), and the consumers' ``mma`` is two-level: each
k-block's product is waited for and added, scaled, into an f32 register sum
(``mma_promoted``). The sums double the accumulators, so block-scaled tiles are at most 192
wide (96 + 96 registers per thread), or 256 wide in two 128-column halves per k-block (64 + 128);
192- and 256-wide tiles take B's scales of two 128-column blocks. Tiles of at most 128 x 128
have room for a second accumulator and run k-blocks in pairs (``mma_promoted_pairs``).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from .gemm_config import FP8_DTYPES, KBLOCK_SCALE, WG_ROWS, GemmConfig
from ..kit.pipeline import TmaPipeline, debug_site

__all__ = ["Mainloop", "ClusterCta", "make_mainloop"]

Mainloop = namedtuple("Mainloop", ["cluster_cta", "prefetch", "load", "begin", "mma"])
ClusterCta = namedtuple("ClusterCta", ["rm", "rn", "a_mask", "b_mask", "peers"])

MN_BOX_BYTES = 64 * 128  # a 64 x 64 box of an MN-major operand
# The k-blocks ``prefetch`` brings into L2: graph-replayed decode ran faster with 4 than with 2,
# 8 or 12 (benchmarks/NOTES.md, session 24).
PREFETCH_KBLOCKS = 4


def make_mainloop(cfg: GemmConfig, pipe: TmaPipeline) -> Mainloop:
    """The mainloop of the kernel of ``cfg`` over the ring ``pipe``: a :class:`Mainloop` of
    device functions.

    - ``cluster_cta() -> ClusterCta``: this CTA's place in its cluster, the ranks that
      share its A tile (``a_mask``, same ``rm``) and its B tile (``b_mask``, same ``rn``),
      and ``peers``, the ranks whose producers write into its slots;
    - ``prefetch(tmaps, params, item, tile)``: (one thread) an L2 prefetch of the boxes ``load``
      loads for the first ``PREFETCH_KBLOCKS`` k-blocks of work ``item``;
    - ``load(smem, bars, st, tmaps, params, item, tile, cta) -> st``: (the producer's elected
      thread) the loads of work ``item``'s k-blocks of output ``tile`` (``tmaps``: the CTA's
      tensor maps, ``.a``, ``.b`` and, with block-wise scales, ``.a_scales``, gated ``.b_up``);
    - ``begin(consumer)``: (each consumer warpgroup, once, before its first ``mma``) with
      block-wise scales and two or three consumers, or ping-pong, hand the first turn to issue
      wgmmas to consumer 0;
    - ``mma(acc, smem, bars, st, params, item, consumer, peers, tile, ep) -> (acc, st)``: (a
      consumer warpgroup) its 64 rows of the tile's product over the item's k-blocks, in the
      accumulator tuple ``acc`` (ping-pong: the whole tile in the consumer's turn, ``acc`` the
      upper and lower rows' accumulators); with block-wise scales (``cfg.block_scaled``, read from
      ``ep``) each k-block's product is scaled into an f32 sum, returned in ``acc``'s place;
      with ``cfg.acc_chains`` > 1 the k-block's wgmmas go to separate accumulators, whose sum
      is returned.
    """
    BM, BN = cfg.block_m, cfg.block_n
    IN_T, B_T = cfg.in_dtype, cfg.b_type
    BK = cfg.block_k
    # wgmmas per k-block: k16 (16-bit) or k32 (fp8), 32 bytes of K each, 4 per 128-byte row.
    K_STEPS = BK // (32 if IN_T in FP8_DTYPES else 16)
    A_K_MAJOR, B_K_MAJOR = cfg.a_major == "K", cfg.b_major == "K"
    CM, CN, CLUSTER = cfg.cluster_m, cfg.cluster_n, cfg.cluster_size
    A_TILE, B_TILE, B_OFF = cfg.a_tile_bytes, cfg.b_tile_bytes, cfg.layout.b
    B_SWIZZLE = cfg.b_swizzle
    # CTAs of a tile row share its A tile, CTAs of a tile column its B tile. A gated tile's B slot
    # is B's rows n0 / 2 on, then as many of B_up's (kernel column n0 is output column n0 / 2).
    GATED = cfg.gated
    load_a = _operand_loader(A_K_MAJOR, BM, CN)
    load_b = _operand_loader(B_K_MAJOR, BN // 2 if GATED else BN, CM)
    prefetch_a, prefetch_b = _operand_prefetcher(A_K_MAJOR, BM), _operand_prefetcher(B_K_MAJOR, BN)
    # wgmma descriptors (128B swizzle). K-major: 8-row groups 1024 B apart (SBO), a k16 step
    # (k32 for fp8) is 32 B along the swizzled row. MN-major (16-bit only): 64-element MN
    # atoms one box apart (LBO), 8-k groups 1024 B apart (SBO), a k16 step is 16 rows of 128 B; with 64B swizzle (one
    # 32-element atom) rows are 64 B: SBO 512, a k16 step 1024 B.
    A_LBO, A_KSTEP = (16, 32) if A_K_MAJOR else (MN_BOX_BYTES, 2048)
    B_LBO, B_KSTEP = (16, 32) if B_K_MAJOR else (MN_BOX_BYTES, 16 * B_SWIZZLE)
    B_SBO = 8 * B_SWIZZLE
    TNSP_A, TNSP_B = int(not A_K_MAJOR), int(not B_K_MAJOR)
    A_WG_OFF = WG_ROWS * 128  # consumer 1's 64 rows: 64 K-major rows, or the second M box
    DEBUG = cfg.debug
    BLOCK_SCALED = cfg.block_scaled
    A_SCALES, A_SCALES_BYTES = cfg.layout.a_scales, cfg.a_scales_bytes
    # Block-wise scales: each consumer waits for its k-block's wgmmas before it promotes them,
    # so the tensor cores idle while all promote, unless the consumers take turns to issue:
    # consumer 0's k-block kb, consumer 1's kb, (consumer 2's kb,) consumer 0's kb + 1, ... so
    # that each promotes while the others' wgmmas run (measured +0 to 7%: benchmarks/NOTES.md).
    # Ping-pong consumers take turns by whole tiles. Consumer i waits for its turn at named
    # barrier TURN + i (256 threads: its own wait, the previous consumer's arrival).
    CONSUMERS = cfg.consumers
    TAKE_TURNS = (cfg.block_scaled or cfg.pingpong) and CONSUMERS > 1
    TURN = 1 + CONSUMERS  # (0: __syncthreads, 1 .. CONSUMERS: each consumer's own)
    SCALE_AHEAD = 2  # k-blocks: B's scales' loads (from L2) take about two k-blocks' wgmmas
    B_SCALES_BY_GROUP = cfg.grouped is not None  # grouped kernels: B's scales are (G, K/128, N/128)
    # A 192- or 256-wide tile spans two of B's 128-column scale blocks; a 64- or 128-wide one, at
    # a multiple of its width, lies in one (and compiles none of the second block's code).
    TWO_B_BLOCKS = BN > KBLOCK_SCALE
    CHUNK_REGS = 32  # accumulator registers of 64 columns: 8 columns per 4 registers
    # A 256-wide tile's sums (128 registers a thread) leave room for one 128-column accumulator:
    # each k-block runs as two halves, one B scale block each, issued, waited for and promoted
    # one after the other (the consumers taking turns per half).
    HALVES = 2 if BLOCK_SCALED and BN == 2 * KBLOCK_SCALE else 1
    HALF_N = BN // 2
    B_HALF_DESC = KBLOCK_SCALE * 128 // 16  # B's rows 128 on: 128 K-major rows of 128 B, in 16 B units

    @cuda.jit(device=True, forceinline=True)
    def cluster_cta():
        """Ranks run along M first: rank = rm + CM * rn."""
        rank = nh.cluster_ctarank() if CLUSTER > 1 else 0
        rm, rn = rank % CM, rank // CM
        a_mask = 0
        b_mask = 0
        for j in range(CN):
            a_mask |= 1 << (rm + CM * j)
        for i in range(CM):
            b_mask |= 1 << (i + CM * rn)
        return ClusterCta(rm, rn, a_mask, b_mask, a_mask | b_mask)

    @cuda.jit(device=True, forceinline=True)
    def prefetch(tmaps, p, item, tile):
        b = tile.batch
        k_first = b * p.k_split
        for kb in range(item.k_begin, min(item.k_end, item.k_begin + PREFETCH_KBLOCKS)):
            k0 = (k_first + kb) * BK
            prefetch_a(tmaps.a, tile.m0, k0, b * p.a_batched)
            prefetch_b(tmaps.b, tile.n0, k0, b * p.b_batched)

    @cuda.jit(device=True, forceinline=True)
    def load(smem, bars, st, tmaps, p, item, tile, cta):
        b = tile.batch
        k_first = b * p.k_split  # a K slice's first k-block (0 unless the units are K slices)
        for kb in range(item.k_begin, item.k_end):
            # Debug builds bound the wait; release builds pass None (compiled out).
            full = pipe.producer_acquire(bars, st, debug_site(p.debug_record, item.tile, kb) if DEBUG else None)
            k0 = (k_first + kb) * BK
            load_a(smem + st.stage * A_TILE, tmaps.a, tile.m0, k0, b * p.a_batched, full, cta.rn, cta.a_mask)
            if GATED:
                b_slot = smem + B_OFF + st.stage * B_TILE
                load_b(b_slot, tmaps.b, tile.n0 // 2, k0, b * p.b_batched, full, 0, 0)
                load_b(b_slot + B_TILE // 2, tmaps.b_up, tile.n0 // 2, k0, b * p.b_batched, full, 0, 0)
            else:
                load_b(smem + B_OFF + st.stage * B_TILE, tmaps.b, tile.n0, k0, b * p.b_batched, full, cta.rm,
                       cta.b_mask)
            if BLOCK_SCALED:  # the tile rows' scales of this k-block, from a 16-byte boundary
                nh.tma_load_3d(smem + A_SCALES + st.stage * A_SCALES_BYTES, tmaps.a_scales, tile.m0 - tile.m0 % 4,
                               k_first + kb, b * p.a_batched, full)
            st = pipe.advance(st)
        return st

    @cuda.jit(device=True, forceinline=True)
    def stage_descriptors(smem, st, cw):
        """wgmma descriptors of the slot's A rows of consumer ``cw`` and of its B tile: slot 0's
        (loop-invariant) advanced by whole slots, one multiply-add each (the address field
        counts 16 bytes and the ring stays below its 256 KiB span, so nothing carries out)."""
        stage = np.uint64(st.stage)
        return (nh.matrix_descriptor(smem + cw * A_WG_OFF, A_LBO, 1024, 128, 0) + stage * np.uint64(A_TILE // 16),
                nh.matrix_descriptor(smem + B_OFF, B_LBO, B_SBO, B_SWIZZLE, 0) + stage * np.uint64(B_TILE // 16))

    @cuda.jit(device=True, forceinline=True)
    def k_step(acc, descs, kk, scale_d):
        """The wgmma of k-step ``kk`` of the k-block at ``descs``."""
        return nh.wgmma_mma_async(acc, descs[0] + np.uint64(kk * A_KSTEP // 16), descs[1] + np.uint64(kk * B_KSTEP // 16),
                                  scale_d, IN_T, B_T, 1, 1, TNSP_A, TNSP_B)

    @cuda.jit(device=True, forceinline=True)
    def mma_block(acc, descs, first):
        """One k-block's wgmmas on the slot at ``descs``, committed as one group."""
        nh.wgmma_fence()
        for kk in range(K_STEPS):
            acc = k_step(acc, descs, kk, 0 if first and kk == 0 else 1)
        nh.wgmma_commit_group()
        return acc

    @cuda.jit(device=True, forceinline=True)
    def mma_stage(acc, smem, st, cw, first):
        return mma_block(acc, stage_descriptors(smem, st, cw), first)

    @cuda.jit(device=True, forceinline=True)
    def mma_stage_chained(accs, smem, st, cw, first):
        """One k-block's wgmmas, each on its own accumulator of ``accs`` (``cfg.acc_chains``):
        none waits for another's result."""
        descs = stage_descriptors(smem, st, cw)
        scale_d = 0 if first else 1
        nh.wgmma_fence()
        accs = (k_step(accs[0], descs, 0, scale_d), k_step(accs[1], descs, 1, scale_d),
                k_step(accs[2], descs, 2, scale_d), k_step(accs[3], descs, 3, scale_d))
        nh.wgmma_commit_group()
        return accs

    @cuda.jit(device=True, forceinline=True)
    def mma_stage_tile(accs, smem, st, cw, first):
        """(Ping-pong) one k-block's wgmmas on both 64-row halves of the tile, one group (spelled
        out: LLVM leaves a loop over two accumulators rolled, and ptxas then pads each group
        with an empty wgmma)."""
        upper, lower = stage_descriptors(smem, st, 0), stage_descriptors(smem, st, 1)
        scale_d = 0 if first else 1
        top, bottom = accs
        nh.wgmma_fence()
        top, bottom = k_step(top, upper, 0, scale_d), k_step(bottom, lower, 0, scale_d)
        top, bottom = k_step(top, upper, 1, 1), k_step(bottom, lower, 1, 1)
        top, bottom = k_step(top, upper, 2, 1), k_step(bottom, lower, 2, 1)
        top, bottom = k_step(top, upper, 3, 1), k_step(bottom, lower, 3, 1)
        nh.wgmma_commit_group()
        return top, bottom

    @cuda.jit(device=True, forceinline=True)
    def hand_over(c):
        """(Ping-pong) this consumer's wgmmas are all issued: the other's turn to issue."""
        nh.named_barrier_arrive(TURN + 1 - c.cw, 256)

    @cuda.jit(device=True, forceinline=True)
    def keep_turn(c):
        pass

    mma = _k_loop(pipe, mma_stage, DEBUG, cfg.mma_depth, keep_turn)
    tile_k_loop = _k_loop(pipe, mma_stage_tile, DEBUG, cfg.mma_depth, hand_over)

    @cuda.jit(device=True, forceinline=True)
    def mma_pingpong(acc, smem, bars, st, p, item, c, peers, tile, ep):
        """``mma`` over the whole tile (``acc``: the upper and lower 64 rows' accumulators) in this
        consumer's turn. Turns also keep the consumers' ring waits in order: a consumer waits
        for a slot's fill only after every earlier fill has been waited for, so a parity wait
        never mistakes a fill two laps back for the one it needs."""
        nh.named_barrier_sync(TURN + c.cw, 256)
        return tile_k_loop(acc, smem, bars, st, p, item, c, peers, tile, ep)

    chained_k_loop = _k_loop(pipe, mma_stage_chained, DEBUG, cfg.mma_depth, keep_turn)

    @cuda.jit(device=True, forceinline=True)
    def mma_chained(acc, smem, bars, st, p, item, c, peers, tile, ep):
        """``mma`` over ``cfg.acc_chains`` accumulators (each started afresh by the first
        k-block), summed once their wgmmas are done."""
        zero = nh.wgmma_accumulator(BN, "f32")  # (copies of acc would be moved inside the loop)
        accs, st = chained_k_loop((acc, zero, zero, zero), smem, bars, st, p, item, c, peers, tile, ep)
        total = nh.tuple_as_array(nh.wgmma_fence_operand(accs[0]))
        parts = (nh.tuple_as_array(nh.wgmma_fence_operand(accs[1])), nh.tuple_as_array(nh.wgmma_fence_operand(accs[2])),
                 nh.tuple_as_array(nh.wgmma_fence_operand(accs[3])))
        for e in range(BN // 2):
            total[e] += (parts[0][e] + parts[1][e]) + parts[2][e]
        return nh.array_as_tuple(total, acc), st

    @cuda.jit(device=True, forceinline=True)
    def load_b_scale(ep, g, n_block, k_begin, i, k_blocks):
        """B's scale of the tile's 128 x 128 block in k-block ``k_begin + i`` of the item's
        ``k_blocks`` (k-block 0's from ``i = k_blocks`` on); ``g``: a grouped tile's group."""
        k = np.uint32(k_begin + i) if i < k_blocks else np.uint32(0)
        if B_SCALES_BY_GROUP:
            return ep.b_block_scales[np.uint64(g), k, n_block]
        return ep.b_block_scales[k, n_block]

    first_b_scales = _scales_ahead(load_b_scale, SCALE_AHEAD)

    @cuda.jit(device=True, forceinline=True)
    def begin(c):
        if TAKE_TURNS and c.cw == CONSUMERS - 1:
            nh.named_barrier_arrive(TURN, 256)

    @cuda.jit(device=True, forceinline=True)
    def promote(sums, at, part, begin, end, s0, s1):
        """``sums[at + e] += part[e] * scale`` for accumulator registers ``begin`` to ``end``:
        ``s0`` on this thread's first row, ``s1`` on its second. Register 4i + 2j + c holds
        row row_in_wg + 8j, column 8i + 2 * (lane % 4) + c (PTX ISA 9.7.15.5.1.1, the
        accumulator D's fragment), so ``at`` = 64 is 128 columns on."""
        for e in range(begin, end):
            sums[at + e] += part[e] * (s0 if e % 4 < 2 else s1)

    @cuda.jit(device=True, forceinline=True)
    def a_scales(row_scales, st):
        """A's scales of this thread's two rows in the k-block of slot ``st``."""
        at = row_scales + st.stage * A_SCALES_BYTES
        return nh.ld_shared_f32(at), nh.ld_shared_f32(at + 32)

    @cuda.jit(device=True, forceinline=True)
    def take_turn(acc, descs, c):
        """Issue one k-block's (or half's) wgmmas on ``descs``, afresh, in this consumer's turn."""
        if TAKE_TURNS:
            nh.named_barrier_sync(TURN + c.cw, 256)
        acc = mma_block(acc, descs, True)
        if TAKE_TURNS:
            nh.named_barrier_arrive(next_turn(c.cw), 256)
        return acc

    @cuda.jit(device=True, forceinline=True)
    def next_turn(cw):
        """The named barrier of the consumer whose turn follows consumer ``cw``'s."""
        if CONSUMERS == 2:
            return TURN + 1 - cw
        return TURN + (cw + 1) % CONSUMERS

    @cuda.jit(device=True, forceinline=True)
    def the_tile_accumulator(acc):
        return acc

    @cuda.jit(device=True, forceinline=True)
    def a_half_accumulator(acc):
        return nh.wgmma_accumulator(HALF_N, "f32")

    part_accumulator = a_half_accumulator if HALVES == 2 else the_tile_accumulator

    @cuda.jit(device=True, forceinline=True)
    def mma_promoted(acc, smem, bars, st, p, item, c, peers, tile, ep):
        """Two-level accumulation (block-wise scales): each k-block's product in ``acc``
        (started afresh; a 256-wide tile's in two halves, see HALVES), waited for, then
        added, times its scales, into f32 ``sums`` (a tile wider than 128 or of three
        consumers has no registers for the next k-block's accumulator, so a consumer cannot
        queue it first: the consumers take turns instead, see TAKE_TURNS). A's
        scales arrive with the k-block in the ring (TMA) and are read while its wgmmas run;
        B's, one per k-block (two for a 192- or 256-wide tile, whose columns span two
        128-column blocks: TWO_B_BLOCKS), are loaded SCALE_AHEAD k-blocks ahead, so the L2's
        latency hides behind wgmmas. They load once the k-block's (last) wgmmas are issued,
        while those run: at the loop's top, the loads and their address arithmetic sat between
        the last promotion and the next issue, and the tensor cores waited for them (1-3% at
        M = 4096: benchmarks/NOTES.md, session 38). The sum comes back as a tuple like ``acc``
        (whose registers the next tile's wgmmas overwrite: scale_d = 0)."""
        sums = nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32"))
        # 32-bit k-block count and scale indices, as in _k_loop: with numba's 64-bit ones, the
        # loop's B-scale addresses took 64-bit compares and multiplies.
        k_begin, k_blocks = np.uint32(item.k_begin), np.int32(item.k_end - item.k_begin)
        n0 = np.uint32(tile.n0)
        n_block = np.uint32(n0 // KBLOCK_SCALE)
        # this thread's two rows in the box (which starts at the 16-byte boundary before m0)
        row_scales = smem + A_SCALES + 4 * (tile.m0 % 4 + c.cw * WG_ROWS + c.row_in_wg)
        b_scales = first_b_scales(ep, tile.batch, n_block, k_begin, k_blocks)
        if TWO_B_BLOCKS:
            # The tile's columns from 128 - n0 % 128 on lie in the next block. A 192-wide tile's
            # n0 is a multiple of 64, so its first 64 columns lie in this block, its last 64 in
            # the next, and its middle 64 in the next iff n0 % 128 == 64; a 256-wide tile's
            # halves lie in this block and the next. Past B's last block the columns are
            # padding (TMA clips their stores): they take the last block's scale.
            n_next = np.uint32(min(n_block + 1, ep.b_block_scales.shape[-1] - 1))
            mid_next = n0 % KBLOCK_SCALE != 0
            b_next_scales = first_b_scales(ep, tile.batch, n_next, k_begin, k_blocks)
        part_acc = part_accumulator(acc)
        for i in range(k_blocks):
            ahead = np.int32(i + SCALE_AHEAD)
            pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, k_begin + i) if DEBUG else None)
            descs = stage_descriptors(smem, st, c.cw)
            part_acc = take_turn(part_acc, descs, c)
            if HALVES == 1:
                b_later = load_b_scale(ep, tile.batch, n_block, k_begin, ahead, k_blocks)
                if TWO_B_BLOCKS:
                    b_next_later = load_b_scale(ep, tile.batch, n_next, k_begin, ahead, k_blocks)
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
                    b_later = load_b_scale(ep, tile.batch, n_block, k_begin, ahead, k_blocks)
                    b_next_later = load_b_scale(ep, tile.batch, n_next, k_begin, ahead, k_blocks)
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

    @cuda.jit(device=True, forceinline=True)
    def add_scaled(sums, part_acc, scales, s):
        """``sums += part_acc * scales * s`` once the part's wgmmas are waited for."""
        part_acc = nh.wgmma_fence_operand(part_acc)  # the reads below stay after the wait
        promote(sums, 0, nh.tuple_as_array(part_acc), 0, BN // 2, scales[0] * s, scales[1] * s)
        return part_acc

    @cuda.jit(device=True, forceinline=True)
    def mma_promoted_pairs(acc, smem, bars, st, p, item, c, peers, tile, ep):
        """``mma_promoted`` for tiles of at most 128 x 128: k-blocks two at a time, both issued
        in this consumer's turn into two accumulators; the first is waited for
        (``wait_group(1)``) and promoted while the second's wgmmas run, then the second (while
        the other consumer's run). Nothing stays in flight from one pair to the next: ptxas
        serializes every wgmma of a loop whose accumulators are read while a wgmma issued in an
        earlier iteration is in flight (C7514). An odd item's last k-block runs alone."""
        sums = nh.tuple_as_array(nh.wgmma_accumulator(BN, "f32"))
        k_begin, k_blocks = np.uint32(item.k_begin), np.int32(item.k_end - item.k_begin)
        n_block = np.uint32(np.uint32(tile.n0) // KBLOCK_SCALE)
        row_scales = smem + A_SCALES + 4 * (tile.m0 % 4 + c.cw * WG_ROWS + c.row_in_wg)
        b_scales = first_b_scales(ep, tile.batch, n_block, k_begin, k_blocks)  # the next pair's
        second_acc = nh.wgmma_accumulator(BN, "f32")
        for j in range(k_blocks // 2):
            st_second = pipe.advance(st)
            pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, k_begin + 2 * j) if DEBUG else None)
            pipe.consumer_wait(bars, st_second,
                               debug_site(p.debug_record, item.tile, k_begin + 2 * j + 1) if DEBUG else None)
            if TAKE_TURNS:
                nh.named_barrier_sync(TURN + c.cw, 256)
            acc = mma_block(acc, stage_descriptors(smem, st, c.cw), True)
            second_acc = mma_block(second_acc, stage_descriptors(smem, st_second, c.cw), True)
            if TAKE_TURNS:
                nh.named_barrier_arrive(next_turn(c.cw), 256)
            ahead = np.int32(2 * j + SCALE_AHEAD)  # (loaded while the pair's wgmmas run)
            b_later = (load_b_scale(ep, tile.batch, n_block, k_begin, ahead, k_blocks),
                       load_b_scale(ep, tile.batch, n_block, k_begin, ahead + 1, k_blocks))
            first_a, second_a = a_scales(row_scales, st), a_scales(row_scales, st_second)
            nh.wgmma_wait_group(1)
            if c.lane == 0:
                pipe.consumer_release(bars, st, peers)
            acc = add_scaled(sums, acc, first_a, b_scales[0])
            nh.wgmma_wait_group(0)
            if c.lane == 0:
                pipe.consumer_release(bars, st_second, peers)
            second_acc = add_scaled(sums, second_acc, second_a, b_scales[1])
            b_scales = b_later
            st = pipe.advance(st_second)
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

    assert cfg.acc_chains in (1, K_STEPS), cfg  # one accumulator per wgmma of a k-block
    if cfg.block_scaled:
        consumer_mma = mma_promoted_pairs if cfg.promotes_in_pairs else mma_promoted
    elif cfg.pingpong:
        assert K_STEPS == 4, cfg  # (mma_stage_tile spells out a 16-bit k-block's four k-steps)
        consumer_mma = mma_pingpong
    else:
        consumer_mma = mma_chained if cfg.acc_chains > 1 else mma
    return Mainloop(cluster_cta, prefetch, load, begin, consumer_mma)


def _k_loop(pipe, stage, debug, depth, issued):
    """``mma(acc, smem, bars, st, params, item, consumer, peers, tile, ep) -> (acc, st)``: the
    consumer's K loop over the item's k-blocks, ``acc = stage(acc, smem, st, cw, first)`` on
    each (``acc``: whatever ``stage`` accumulates into). ``depth`` k-blocks' wgmmas stay in
    flight behind the one just issued: a slot is released once ``wgmma.wait_group(depth)``
    says the wgmmas that read it are done. ``issued(consumer)`` runs once the last k-block's
    wgmmas are issued, before they are waited for."""
    repeated = _repeat(depth)

    @cuda.jit(device=True, forceinline=True)
    def mma(acc, smem, bars, st, p, item, c, peers, tile, ep):
        pending = repeated(st)  # the last ``depth`` slots issued, oldest first
        # A 32-bit count: numba's 64-bit loop index and compares cost each k-block of every
        # consumer warp a few more instructions (benchmarks/NOTES.md, session 26). (A while
        # loop on one counter saves 6 more, but ran 1-6% slower on a cool GPU: session 28.)
        k_blocks = np.int32(item.k_end - item.k_begin)
        for i in range(k_blocks):
            pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, item.k_begin + i) if debug else None)
            acc = stage(acc, smem, st, c.cw, i == 0)
            nh.wgmma_wait_group(depth)  # k-block i - depth is done reading its slot
            if i >= depth and c.lane == 0:
                pipe.consumer_release(bars, pending[0], peers)
            pending = pending[1:] + (st,)
            st = pipe.advance(st)
        issued(c)
        nh.wgmma_wait_group(0)
        for j in range(depth):  # the item's last min(depth, k-blocks) slots
            if k_blocks > depth - 1 - j and c.lane == 0:
                pipe.consumer_release(bars, pending[j], peers)
        return acc, st

    return mma


def _repeat(n):
    """``repeat(x) -> (x,) * n`` as a device function (numba's tuples do not multiply)."""

    @cuda.jit(device=True, forceinline=True)
    def repeat(x):
        return (x,)

    for _ in range(n - 1):
        repeat = _and_once_more(repeat)
    return repeat


def _and_once_more(repeat):
    @cuda.jit(device=True, forceinline=True)
    def longer(x):
        return repeat(x) + (x,)

    return longer


def _scales_ahead(load, n):
    """``first(ep, g, n_block, k_begin, k_blocks)``: the tuple of ``load(ep, g, n_block, k_begin,
    i, k_blocks)`` for the item's first ``n`` k-blocks, i = 0 .. n - 1."""

    @cuda.jit(device=True, forceinline=True)
    def first(ep, g, n_block, k_begin, k_blocks):
        return ()

    for i in range(n):
        first = _then_load(first, load, i)
    return first


def _then_load(first, load, i):
    @cuda.jit(device=True, forceinline=True)
    def first_then(ep, g, n_block, k_begin, k_blocks):
        return first(ep, g, n_block, k_begin, k_blocks) + (load(ep, g, n_block, k_begin, np.int32(i), k_blocks),)

    return first_then


def _operand_loader(k_major, rows, sharers):
    """``load(dst, tmap, mn0, k0, batch, full, part, mask)``: the TMA loads of one k-block of
    an operand tile of ``rows`` M (or N) rows, into ``dst``, completing on ``full``.

    K-major: ``rows`` rows of one k-block (128 B each) in one box; MN-major: 64 x 64 boxes stacked
    along M/N (one 64 x 32 box for a 32-row tile). Shared by ``sharers`` CTAs of a cluster, the CTA loads only its
    ``part`` (a slice of rows, or of boxes) and multicasts it to the ranks in ``mask``.
    """
    boxes = -(-rows // 64)
    part_rows, part_boxes = rows // sharers, boxes // sharers

    @cuda.jit(device=True, forceinline=True)
    def load(dst, tmap, mn0, k0, batch, full, part, mask):
        if sharers == 1:
            if k_major:
                nh.tma_load_3d(dst, tmap, k0, mn0, batch, full)
            else:
                for i in range(boxes):
                    nh.tma_load_3d(dst + i * MN_BOX_BYTES, tmap, mn0 + 64 * i, k0, batch, full)
        elif k_major:
            nh.tma_load_multicast_3d(dst + part * part_rows * 128, tmap, k0, mn0 + part * part_rows, batch, full,
                                     mask)
        else:
            for i in range(part_boxes):
                box = part * part_boxes + i
                nh.tma_load_multicast_3d(dst + box * MN_BOX_BYTES, tmap, mn0 + 64 * box, k0, batch, full, mask)

    return load


def _operand_prefetcher(k_major, rows):
    """``prefetch(tmap, mn0, k0, batch)``: an L2 prefetch of the boxes that ``_operand_loader``
    loads for one k-block of an operand tile of ``rows`` rows."""
    boxes = -(-rows // 64)

    @cuda.jit(device=True, forceinline=True)
    def prefetch(tmap, mn0, k0, batch):
        if k_major:
            nh.tma_prefetch_3d(tmap, k0, mn0, batch)
        else:
            for i in range(boxes):
                nh.tma_prefetch_3d(tmap, mn0 + 64 * i, k0, batch)

    return prefetch
