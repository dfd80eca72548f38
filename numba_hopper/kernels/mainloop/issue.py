"""The consumers' building blocks, shared by every mainloop variant: a k-block's wgmmas on a ring
slot (:func:`make_k_block`), the consumers' turns to issue them (:func:`make_turns`) and the K
loop that keeps k-blocks in flight (:func:`k_loop`)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from ... import intrinsics as nh
from ...kit.barriers import make_ordered_barrier
from ...kit.layouts import make_descriptors, make_mma
from ...kit.pipeline import debug_site
from ..gemm_config import WG_ROWS, GemmConfig

__all__ = ["KBlock", "make_k_block", "Turns", "make_turns", "k_loop", "first_k_block_start"]

KBlock = namedtuple("KBlock", ["steps", "descriptors", "k_step", "issue"])
Turns = namedtuple("Turns", ["begin", "wait", "pass_on"])


def make_k_block(cfg: GemmConfig) -> KBlock:
    """One k-block's wgmmas (k16 on 16-bit inputs, k32 on fp8, 32 bytes of K each: ``steps`` a
    k-block) for the kernel of ``cfg``, as device functions over the kit's descriptors and SS
    wgmmas (:func:`~numba_hopper.kit.layouts.make_descriptors`, :func:`~numba_hopper.kit.layouts.make_mma`):

    - ``descriptors(smem, st, cw) -> (a, b)``: the wgmma descriptors of ring slot ``st``'s A rows
      of consumer ``cw`` and of its B tile;
    - ``k_step(acc, descs, kk, scale_d) -> acc``: the wgmma of k-step ``kk`` of the k-block at
      ``descs``;
    - ``issue(acc, descs, first) -> acc``: the k-block's wgmmas, committed as one group (the
      first k-block of an item starts its accumulator afresh: ``scale_d = 0``).
    """
    A, B = cfg.a_layout, cfg.b_layout  # the ring slot's tiles (kit layouts)
    a_desc, b_desc = make_descriptors(A), make_descriptors(B)
    mma = make_mma(A, B, cfg.block_n)  # (N-major B tiles are whole 64-column boxes: 160 of 192 read)
    A_TILE, B_TILE, B_OFF = A.tile_bytes, B.tile_bytes, cfg.layout.b
    A_WG_OFF = A.mn_offset(WG_ROWS)  # consumer 1's 64 rows: 64 K-major rows, or the second M box
    # (called by plain names, the descriptors are inlined into this function's numba IR: their
    # address arithmetic then stays 32-bit where the consumer's index is a constant, ping-pong)
    a_at, b_at = a_desc.at, b_desc.at
    step, k_block = mma.step, mma.k_block

    @cuda.jit(device=True, forceinline=True)
    def stage_descriptors(smem, st, cw):
        """wgmma descriptors of the slot's A rows of consumer ``cw`` and of its B tile: slot 0's
        (loop-invariant) advanced by whole slots, one multiply-add each."""
        return (a_desc.advance(a_at(smem + cw * A_WG_OFF), st.stage, A_TILE),
                b_desc.advance(b_at(smem + B_OFF), st.stage, B_TILE))

    @cuda.jit(device=True, forceinline=True)
    def k_step(acc, descs, kk, scale_d):
        """The wgmma of k-step ``kk`` of the k-block at ``descs``."""
        return step(acc, descs[0], descs[1], kk, scale_d)

    @cuda.jit(device=True, forceinline=True)
    def mma_block(acc, descs, first):
        """One k-block's wgmmas on the slot at ``descs``, committed as one group."""
        return k_block(acc, descs[0], descs[1], first)

    return KBlock(A.k_steps, stage_descriptors, k_step, mma_block)


def make_turns(cfg: GemmConfig) -> Turns:
    """The consumers' turns to issue wgmmas, where they take them: promoted products of two or
    three consumers, and ping-pong ones (each turn a whole tile).

    A promoting consumer waits for its k-block's wgmmas before it promotes them, so the
    tensor cores idle while all promote, unless the consumers take turns to issue: consumer 0's
    k-block kb, consumer 1's kb, (consumer 2's kb,) consumer 0's kb + 1, ... so that each
    promotes while the others' wgmmas run (measured +0 to 7%). The turns are the kit's ordered
    barrier over the consumers (named barriers ``cfg.barrier_ids.turns`` on).

    - ``begin(c)``: (each consumer, once, before its first turn) the first turn to consumer 0;
    - ``wait(c)``: wait for this consumer's turn;
    - ``pass_on(c)``: this consumer's wgmmas are issued: the next consumer's turn.

    Without turns all three compile to nothing.
    """
    CONSUMERS = cfg.consumers
    TAKE_TURNS = (cfg.promoted or cfg.pingpong) and CONSUMERS > 1
    order = make_ordered_barrier(cfg.barrier_ids.turns, max(2, CONSUMERS))  # (one consumer: unused)
    first_turn, wait_turn, next_turn = order.start, order.wait, order.arrive

    @cuda.jit(device=True, forceinline=True)
    def begin(c):
        if TAKE_TURNS:
            first_turn(c.cw)

    @cuda.jit(device=True, forceinline=True)
    def wait(c):
        if TAKE_TURNS:
            wait_turn(c.cw)

    @cuda.jit(device=True, forceinline=True)
    def pass_on(c):
        if TAKE_TURNS:
            next_turn(c.cw)

    return Turns(begin, wait, pass_on)


def k_loop(pipe, stage, debug, depth, issued, after_first=False):
    """``mma(acc, smem, bars, st, params, item, consumer, peers, tile) -> (acc, st)``: the
    consumer's K loop over the item's k-blocks, ``acc = stage(acc, smem, st, cw, first)`` on
    each (``acc``: whatever ``stage`` accumulates into). ``depth`` k-blocks' wgmmas stay in
    flight behind the one just issued: a slot is released once ``wgmma.wait_group(depth)``
    says the wgmmas that read it are done. ``issued(consumer)`` runs once the last k-block's
    wgmmas are issued, before they are waited for. ``after_first``: the item's first k-block
    is already issued into ``acc`` from slot ``st`` (a split loop's ``start``) and still in flight."""
    repeated = _repeat(depth)
    FIRST = 1 if after_first else 0

    @cuda.jit(device=True, forceinline=True)
    def mma(acc, smem, bars, st, p, item, c, peers, tile):
        pending = repeated(st)  # the last ``depth`` slots issued, oldest first
        if FIRST:  # (depth >= 1: the first k-block's slot is not released yet)
            pending = pending[1:] + (st,)
            st = pipe.advance(st)
        # A 32-bit count: numba's 64-bit loop index and compares cost each k-block of every
        # consumer warp a few more instructions. (A while loop on one counter saves 6 more, but
        # measured 1-6% slower on a cool GPU.)
        k_blocks = np.int32(item.k_end - item.k_begin)
        for i in range(np.int32(FIRST), k_blocks):
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


def first_k_block_start(pipe, kb: KBlock, issue, debug):
    """``start(acc, smem, bars, st, params, item, consumer) -> acc`` of a K loop split after the
    item's first k-block (``cfg.overlaps_store``: the consumer stores the previous tile before
    the rest, :func:`k_loop` with ``after_first``): once that k-block's slot is full, its wgmmas
    issued into ``acc``, a fresh accumulator, by ``issue(acc, descs, consumer)`` (``descs``: the
    slot's descriptors for the consumer's rows)."""
    descriptors = kb.descriptors

    @cuda.jit(device=True, forceinline=True)
    def start(acc, smem, bars, st, p, item, c):
        pipe.consumer_wait(bars, st, debug_site(p.debug_record, item.tile, item.k_begin) if debug else None)
        return issue(acc, descriptors(smem, st, c.cw), c)

    return start


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
