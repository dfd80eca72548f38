"""The consumers' K loops of products that accumulate in the wgmmas' registers: one accumulator
(:func:`plain_mma`; split after the first k-block's issue, :func:`plain_split_mma`), one per
wgmma of a k-block (:func:`chained_mma`), and two 64-row blocks per consumer: its 128 rows of a
256-row tile (:func:`tall_mma`) or a whole 128-row tile in its turn (:func:`pingpong_mma`)."""

from __future__ import annotations

from numba import cuda

from ... import intrinsics as nh
from ..gemm_config import GemmConfig
from .issue import KBlock, Turns, first_k_block_start, k_loop

__all__ = ["plain_mma", "plain_split_mma", "chained_mma", "tall_mma", "pingpong_mma"]


def _plain_stage(kb: KBlock):
    """``stage(acc, smem, st, cw, first) -> acc``: a k-block's wgmmas into the consumer's accumulator."""
    issue, descriptors = kb.issue, kb.descriptors

    @cuda.jit(device=True, forceinline=True)
    def mma_stage(acc, smem, st, cw, first):
        return issue(acc, descriptors(smem, st, cw), first)

    return mma_stage


def plain_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma``: the k-blocks' wgmmas into the consumer's accumulator, ``cfg.mma_depth`` of them
    in flight behind the one just issued."""
    return k_loop(pipe, _plain_stage(kb), cfg.debug, cfg.mma_depth, turns.pass_on)


def plain_split_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``(start, finish)``: :func:`plain_mma` split after the issue of the item's first k-block
    (``cfg.overlaps_store``: the consumer stores the previous tile in between).
    ``start(acc, smem, bars, st, p, item, c) -> acc`` issues it into ``acc``, started afresh;
    ``finish(acc, smem, bars, st, p, item, c, peers, tile) -> (acc, st)`` runs the rest of the
    K loop, that k-block's slot in flight."""
    issue = kb.issue

    @cuda.jit(device=True, forceinline=True)
    def issue_afresh(acc, descs, c):
        return issue(acc, descs, True)

    return (first_k_block_start(pipe, kb, issue_afresh, cfg.debug),
            k_loop(pipe, _plain_stage(kb), cfg.debug, cfg.mma_depth, turns.pass_on, after_first=True))


def chained_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma`` over ``cfg.acc_chains`` accumulators, one per wgmma of a k-block (each started
    afresh by the first k-block), summed once their wgmmas are done: a narrow tile's wgmmas are
    short, and chained on one accumulator each would wait for the one before it."""
    BN = cfg.block_n
    k_step, descriptors = kb.k_step, kb.descriptors

    @cuda.jit(device=True, forceinline=True)
    def mma_stage_chained(accs, smem, st, cw, first):
        """One k-block's wgmmas, each on its own accumulator of ``accs``: none waits for
        another's result."""
        descs = descriptors(smem, st, cw)
        scale_d = 0 if first else 1
        nh.wgmma_fence()
        accs = (k_step(accs[0], descs, 0, scale_d), k_step(accs[1], descs, 1, scale_d),
                k_step(accs[2], descs, 2, scale_d), k_step(accs[3], descs, 3, scale_d))
        nh.wgmma_commit_group()
        return accs

    chained_k_loop = k_loop(pipe, mma_stage_chained, cfg.debug, cfg.mma_depth, turns.pass_on)

    @cuda.jit(device=True, forceinline=True)
    def mma_chained(acc, smem, bars, st, p, item, c, peers, tile):
        zero = nh.wgmma_accumulator(BN, "f32")  # (copies of acc would be moved inside the loop)
        accs, st = chained_k_loop((acc, zero, zero, zero), smem, bars, st, p, item, c, peers, tile)
        total = nh.tuple_as_array(nh.wgmma_fence_operand(accs[0]))
        parts = (nh.tuple_as_array(nh.wgmma_fence_operand(accs[1])), nh.tuple_as_array(nh.wgmma_fence_operand(accs[2])),
                 nh.tuple_as_array(nh.wgmma_fence_operand(accs[3])))
        for e in range(BN // 2):
            total[e] += (parts[0][e] + parts[1][e]) + parts[2][e]
        return nh.array_as_tuple(total, acc), st

    assert cfg.acc_chains == kb.steps, cfg  # one accumulator per wgmma of a k-block
    return mma_chained


def _two_blocks_stage(kb: KBlock, blocks_per_consumer):
    """``stage(accs, smem, st, cw, first) -> accs``: one k-block's wgmmas on the consumer's two
    64-row blocks of the tile (``accs``: their accumulators), rows ``blocks_per_consumer * cw``
    and the next, as one group (spelled out: LLVM leaves a loop over two accumulators rolled,
    and ptxas then pads each group with an empty wgmma)."""
    k_step, descriptors = kb.k_step, kb.descriptors

    @cuda.jit(device=True, forceinline=True)
    def mma_stage_blocks(accs, smem, st, cw, first):
        upper = descriptors(smem, st, blocks_per_consumer * cw)
        lower = descriptors(smem, st, blocks_per_consumer * cw + 1)
        scale_d = 0 if first else 1
        top, bottom = accs
        nh.wgmma_fence()
        top, bottom = k_step(top, upper, 0, scale_d), k_step(bottom, lower, 0, scale_d)
        top, bottom = k_step(top, upper, 1, 1), k_step(bottom, lower, 1, 1)
        top, bottom = k_step(top, upper, 2, 1), k_step(bottom, lower, 2, 1)
        top, bottom = k_step(top, upper, 3, 1), k_step(bottom, lower, 3, 1)
        nh.wgmma_commit_group()
        return top, bottom

    assert kb.steps == 4, kb  # (the stage spells out a 16-bit k-block's four k-steps)
    return mma_stage_blocks


def tall_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma`` of a 256-row tile's consumer (``cfg.consumer_rows`` = 128): its two 64-row blocks,
    ``2 * cw`` and ``2 * cw + 1`` (``acc``: their accumulators), over the item's k-blocks."""
    return k_loop(pipe, _two_blocks_stage(kb, 2), cfg.debug, cfg.mma_depth, turns.pass_on)


def pingpong_mma(cfg: GemmConfig, pipe, kb: KBlock, turns: Turns):
    """``mma`` over the whole tile (``acc``: the upper and lower 64 rows' accumulators) in this
    consumer's turn, which it hands to the other consumer once its last k-block's wgmmas are
    issued. Turns also keep the consumers' ring waits in order: a consumer waits for a slot's
    fill only after every earlier fill has been waited for, so a parity wait never mistakes a
    fill two laps back for the one it needs."""
    wait_turn = turns.wait
    tile_k_loop = k_loop(pipe, _two_blocks_stage(kb, 0), cfg.debug, cfg.mma_depth, turns.pass_on)

    @cuda.jit(device=True, forceinline=True)
    def mma_pingpong(acc, smem, bars, st, p, item, c, peers, tile):
        wait_turn(c)
        return tile_k_loop(acc, smem, bars, st, p, item, c, peers, tile)

    return mma_pingpong
