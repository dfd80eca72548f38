"""The producer's side of the mainloop: each k-block's TMA loads of the A and B tiles (and, with
block-wise scales, of A's scales) into a ring slot, the L2 prefetch of a tile's first k-blocks,
and a CTA's place in its cluster (:func:`make_loads`)."""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ... import intrinsics as nh
from ...kit.layouts import make_tile_loads
from ...kit.pipeline import TmaPipeline, debug_site
from ..gemm_config import GemmConfig

__all__ = ["ClusterCta", "Loads", "make_loads", "PREFETCH_KBLOCKS"]

ClusterCta = namedtuple("ClusterCta", ["rm", "rn", "a_mask", "b_mask", "peers"])
Loads = namedtuple("Loads", ["cluster_cta", "prefetch", "load"])

# The k-blocks ``prefetch`` brings into L2: graph-replayed decode measured faster with 4 than
# with 2, 8 or 12.
PREFETCH_KBLOCKS = 4


def make_loads(cfg: GemmConfig, pipe: TmaPipeline) -> Loads:
    """The producer's device functions of the kernel of ``cfg`` over the ring ``pipe``:

    - ``cluster_cta() -> ClusterCta``: this CTA's place in its cluster, the ranks that
      share its A tile (``a_mask``, same ``rm``) and its B tile (``b_mask``, same ``rn``),
      and ``peers``, the ranks whose producers write into its slots;
    - ``prefetch(tmaps, params, item, tile)``: (one thread) an L2 prefetch of the boxes ``load``
      loads for the first ``PREFETCH_KBLOCKS`` k-blocks of work ``item``;
    - ``load(smem, bars, st, tmaps, params, item, tile, cta) -> st``: (the producer's elected
      thread) the loads of work ``item``'s k-blocks of output ``tile`` (``tmaps``: the CTA's
      tensor maps, ``.a``, ``.b`` and, with block-wise scales, ``.a_scales``, gated ``.b_up``;
      K-segmented, each k-block from its segment's pair of ``.segments``).
    """
    BK = cfg.block_k
    CM, CN, CLUSTER = cfg.cluster_m, cfg.cluster_n, cfg.cluster_size
    A_TILE, B_TILE, B_OFF = cfg.a_tile_bytes, cfg.b_tile_bytes, cfg.layout.b
    # CTAs of a tile row share its A tile, CTAs of a tile column its B tile: each loads its part
    # and multicasts it. A gated tile's B slot is B's rows n0 / 2 on, then as many of B_up's
    # (kernel column n0 is output column n0 / 2), each half one load of its own.
    GATED = cfg.gated
    a_loads = make_tile_loads(cfg.a_layout, CN, cfg.a_evict)
    b_loads = make_tile_loads(cfg.b_load_layout, 1 if GATED else CM, cfg.b_evict)
    b_prefetch = make_tile_loads(cfg.b_layout).prefetch_3d
    DEBUG = cfg.debug
    BLOCK_SCALED = cfg.block_scaled
    A_SCALES, A_SCALES_BYTES = cfg.layout.a_scales, cfg.a_scales_bytes
    SEGMENTS = cfg.k_segments

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
            a_loads.prefetch_3d(tmaps.a, tile.m0, k0, b * p.a_batched)
            b_prefetch(tmaps.b, tile.n0, k0, b * p.b_batched)

    @cuda.jit(device=True, forceinline=True)
    def segment_of(tmaps, p, kb):
        """``(A's map, B's map, k-block in them)`` of k-block ``kb`` of a K-segmented kernel."""
        if SEGMENTS > 2:
            if kb >= p.k_begins[1]:
                return tmaps.segments[2], tmaps.segments[3], kb - p.k_begins[1]
        if kb >= p.k_begins[0]:
            return tmaps.segments[0], tmaps.segments[1], kb - p.k_begins[0]
        return tmaps.a, tmaps.b, kb

    @cuda.jit(device=True, forceinline=True)
    def load(smem, bars, st, tmaps, p, item, tile, cta):
        b = tile.batch
        k_first = b * p.k_split  # a K slice's first k-block (0 unless the units are K slices)
        a_map, b_map = tmaps.a, tmaps.b
        for kb in range(item.k_begin, item.k_end):
            # Debug builds bound the wait; release builds pass None (compiled out).
            full = pipe.producer_acquire(bars, st, debug_site(p.debug_record, item.tile, kb) if DEBUG else None)
            k0 = (k_first + kb) * BK
            if SEGMENTS > 1:
                a_map, b_map, k_in = segment_of(tmaps, p, kb)
                k0 = k_in * BK
            a_loads.load_part_3d(smem + st.stage * A_TILE, a_map, tile.m0, k0, b * p.a_batched, full, cta.rn,
                                 cta.a_mask)
            if GATED:
                b_slot = smem + B_OFF + st.stage * B_TILE
                b_loads.load_3d(b_slot, tmaps.b, tile.n0 // 2, k0, b * p.b_batched, full)
                b_loads.load_3d(b_slot + B_TILE // 2, tmaps.b_up, tile.n0 // 2, k0, b * p.b_batched, full)
            else:
                b_loads.load_part_3d(smem + B_OFF + st.stage * B_TILE, b_map, tile.n0, k0, b * p.b_batched, full,
                                     cta.rm, cta.b_mask)
            if BLOCK_SCALED:  # the tile rows' scales of this k-block, from a 16-byte boundary
                nh.tma_load_3d(smem + A_SCALES + st.stage * A_SCALES_BYTES, tmaps.a_scales, tile.m0 - tile.m0 % 4,
                               k_first + kb, b * p.a_batched, full)
            st = pipe.advance(st)
        return st

    return Loads(cluster_cta, prefetch, load)

