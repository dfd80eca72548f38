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

The consumers' variants, one each:

- one accumulator (the default; split after an item's first k-block where the previous tile
  is stored behind it, ``cfg.overlaps_store``), or one per wgmma of a k-block
  (``cfg.acc_chains``): :mod:`.mma`;
- two 64-row blocks per consumer: the consumer's 128 rows of a 256-row tile, or with
  ping-pong (``cfg.pingpong``) both halves of a whole tile, in turns with the other consumer,
  passing over the other's k-blocks in the ring: :mod:`.mma`;
- fp8 promotion (``cfg.promoted``): each k-block's product is waited for and added into an f32
  register sum, times its block-wise scales with ``cfg.block_scaled`` (a slot then also holds
  A's scales of the tile's rows for its k-block, one more TMA box); tiles of at most 128 x 128
  have room for a second accumulator and run k-blocks in pairs: :mod:`.promoted`.

The parts they share, a k-block's wgmmas, the consumers' turns and the K loop, are
:mod:`.issue`'s; the producer's loads are :mod:`.loads`'.
"""

from __future__ import annotations

from collections import namedtuple

from ...kit.pipeline import TmaPipeline
from ..gemm_config import WG_ROWS, GemmConfig
from .issue import make_k_block, make_turns
from .loads import ClusterCta, make_loads
from .mma import chained_mma, pingpong_mma, plain_mma, plain_split_mma, tall_mma
from .promoted import promoted_mma, promoted_pairs_mma

__all__ = ["Mainloop", "ClusterCta", "make_mainloop"]

Mainloop = namedtuple("Mainloop", ["cluster_cta", "prefetch", "load", "begin", "mma", "start", "finish"])


def make_mainloop(cfg: GemmConfig, pipe: TmaPipeline) -> Mainloop:
    """The mainloop of the kernel of ``cfg`` over the ring ``pipe``: a :class:`Mainloop` of
    device functions.

    - ``cluster_cta``, ``prefetch``, ``load``: the producer's (:func:`~.loads.make_loads`);
    - ``begin(consumer)``: (each consumer warpgroup, once, before its first ``mma``) promoted
      with two or three consumers, or ping-pong, hand the first turn to issue
      wgmmas to consumer 0;
    - ``mma(acc, smem, bars, st, params, item, consumer, peers, tile) -> (acc, st)``: (a
      consumer warpgroup) its 64 rows of the tile's product over the item's k-blocks, in the
      accumulator tuple ``acc`` (a 256-row tile: its two 64-row blocks, ``acc`` their two
      accumulators; ping-pong: the whole tile in the consumer's turn, ``acc`` the upper and
      lower rows' accumulators); promoted (``cfg.promoted``) each k-block's product
      is added (times its block-wise scales with ``cfg.block_scaled``, B's read from
      ``params.b_scales``) into an f32 sum, returned in ``acc``'s place; with
      ``cfg.acc_chains`` > 1 the k-block's wgmmas go to separate accumulators, whose sum is
      returned;
    - ``start``, ``finish``: (``cfg.overlaps_store``) ``mma`` split after the issue of the
      item's first k-block, which runs while the consumer stores the previous tile:
      ``start(acc, smem, bars, st, params, item, consumer) -> acc`` (``acc`` a fresh
      accumulator) and ``finish(acc, smem, bars, st, params, item, consumer, peers, tile) ->
      (acc, st)``; None in other kernels.
    """
    cluster_cta, prefetch, load = make_loads(cfg, pipe)
    kb, turns = make_k_block(cfg), make_turns(cfg)
    if cfg.promoted:
        mma, start, finish = (promoted_pairs_mma if cfg.promotes_in_pairs else promoted_mma)(cfg, pipe, kb, turns)
        if not cfg.overlaps_store:
            start = finish = None
    else:
        variant = (pingpong_mma if cfg.pingpong else tall_mma if cfg.consumer_rows > WG_ROWS
                   else chained_mma if cfg.acc_chains > 1 else plain_mma)
        mma = variant(cfg, pipe, kb, turns)
        start, finish = plain_split_mma(cfg, pipe, kb, turns) if cfg.overlaps_store else (None, None)
    return Mainloop(cluster_cta, prefetch, load, turns.begin, mma, start, finish)
