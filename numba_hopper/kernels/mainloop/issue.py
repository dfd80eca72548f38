"""The consumers' building blocks, shared by every mainloop variant: a k-block's wgmmas on a ring
slot (:func:`make_k_block`), the consumers' turns to issue them (:func:`make_turns`) and the K
loop that keeps k-blocks in flight (:func:`k_loop`)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from ... import intrinsics as nh
from ...kit.pipeline import debug_site
from ..gemm_config import FP8_DTYPES, WG_ROWS, GemmConfig
from .loads import MN_BOX_BYTES

__all__ = ["KBlock", "make_k_block", "Turns", "make_turns", "k_loop"]

KBlock = namedtuple("KBlock", ["steps", "descriptors", "k_step", "issue"])
Turns = namedtuple("Turns", ["begin", "wait", "pass_on"])


def make_k_block(cfg: GemmConfig) -> KBlock:
    """One k-block's wgmmas (k16 on 16-bit inputs, k32 on fp8, 32 bytes of K each: ``steps`` a
    k-block) for the kernel of ``cfg``, as device functions:

    - ``descriptors(smem, st, cw) -> (a, b)``: the wgmma descriptors of ring slot ``st``'s A rows
      of consumer ``cw`` and of its B tile;
    - ``k_step(acc, descs, kk, scale_d) -> acc``: the wgmma of k-step ``kk`` of the k-block at
      ``descs``;
    - ``issue(acc, descs, first) -> acc``: the k-block's wgmmas, committed as one group (the
      first k-block of an item starts its accumulator afresh: ``scale_d = 0``).
    """
    IN_T, B_T = cfg.in_dtype, cfg.b_type
    # wgmmas per k-block: k16 (16-bit) or k32 (fp8), 32 bytes of K each, 4 per 128-byte row.
    K_STEPS = cfg.block_k // (32 if IN_T in FP8_DTYPES else 16)
    A_K_MAJOR, B_K_MAJOR = cfg.a_major == "K", cfg.b_major == "K"
    A_TILE, B_TILE, B_OFF = cfg.a_tile_bytes, cfg.b_tile_bytes, cfg.layout.b
    B_SWIZZLE = cfg.b_swizzle
    # wgmma descriptors (128B swizzle). K-major: 8-row groups 1024 B apart (SBO), a k16 step
    # (k32 for fp8) is 32 B along the swizzled row. MN-major (16-bit only): 64-element MN
    # atoms one box apart (LBO), 8-k groups 1024 B apart (SBO), a k16 step is 16 rows of 128 B; with 64B swizzle (one
    # 32-element atom) rows are 64 B: SBO 512, a k16 step 1024 B.
    A_LBO, A_KSTEP = (16, 32) if A_K_MAJOR else (MN_BOX_BYTES, 2048)
    B_LBO, B_KSTEP = (16, 32) if B_K_MAJOR else (MN_BOX_BYTES, 16 * B_SWIZZLE)
    B_SBO = 8 * B_SWIZZLE
    TNSP_A, TNSP_B = int(not A_K_MAJOR), int(not B_K_MAJOR)
    A_WG_OFF = WG_ROWS * 128  # consumer 1's 64 rows: 64 K-major rows, or the second M box

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

    return KBlock(K_STEPS, stage_descriptors, k_step, mma_block)


def make_turns(cfg: GemmConfig) -> Turns:
    """The consumers' turns to issue wgmmas, where they take them: block-wise scaled products of
    two or three consumers, and ping-pong ones (each turn a whole tile).

    A block-scaled consumer waits for its k-block's wgmmas before it promotes them, so the
    tensor cores idle while all promote, unless the consumers take turns to issue: consumer 0's
    k-block kb, consumer 1's kb, (consumer 2's kb,) consumer 0's kb + 1, ... so that each
    promotes while the others' wgmmas run (measured +0 to 7%). Consumer i waits for its turn at
    named barrier TURN + i (256 threads: its own wait, the previous consumer's arrival).

    - ``begin(c)``: (each consumer, once, before its first turn) the first turn to consumer 0;
    - ``wait(c)``: wait for this consumer's turn;
    - ``pass_on(c)``: this consumer's wgmmas are issued: the next consumer's turn.

    Without turns all three compile to nothing.
    """
    CONSUMERS = cfg.consumers
    TAKE_TURNS = (cfg.block_scaled or cfg.pingpong) and CONSUMERS > 1
    TURN = 1 + CONSUMERS  # (0: __syncthreads, 1 .. CONSUMERS: each consumer's own)

    @cuda.jit(device=True, forceinline=True)
    def next_turn(cw):
        """The named barrier of the consumer whose turn follows consumer ``cw``'s."""
        if CONSUMERS == 2:
            return TURN + 1 - cw
        return TURN + (cw + 1) % CONSUMERS

    @cuda.jit(device=True, forceinline=True)
    def begin(c):
        if TAKE_TURNS and c.cw == CONSUMERS - 1:
            nh.named_barrier_arrive(TURN, 256)

    @cuda.jit(device=True, forceinline=True)
    def wait(c):
        if TAKE_TURNS:
            nh.named_barrier_sync(TURN + c.cw, 256)

    @cuda.jit(device=True, forceinline=True)
    def pass_on(c):
        if TAKE_TURNS:
            nh.named_barrier_arrive(next_turn(c.cw), 256)

    return Turns(begin, wait, pass_on)


def k_loop(pipe, stage, debug, depth, issued):
    """``mma(acc, smem, bars, st, params, item, consumer, peers, tile) -> (acc, st)``: the
    consumer's K loop over the item's k-blocks, ``acc = stage(acc, smem, st, cw, first)`` on
    each (``acc``: whatever ``stage`` accumulates into). ``depth`` k-blocks' wgmmas stay in
    flight behind the one just issued: a slot is released once ``wgmma.wait_group(depth)``
    says the wgmmas that read it are done. ``issued(consumer)`` runs once the last k-block's
    wgmmas are issued, before they are waited for."""
    repeated = _repeat(depth)

    @cuda.jit(device=True, forceinline=True)
    def mma(acc, smem, bars, st, p, item, c, peers, tile):
        pending = repeated(st)  # the last ``depth`` slots issued, oldest first
        # A 32-bit count: numba's 64-bit loop index and compares cost each k-block of every
        # consumer warp a few more instructions. (A while loop on one counter saves 6 more, but
        # measured 1-6% slower on a cool GPU.)
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
