"""The GEMM's static persistent tile scheduler, with stream-K and its fix-up.

A persistent CTA walks work items: whole tiles ``cta, cta + ctas, ...`` (data-parallel),
then, with stream-K, pieces of the K loops of the last tiles. The walk gives a CTA's items
(a tile and a k-block range each) one after another, and maps a linear tile id to
output-tile coordinates. Producer and consumers call the same functions on the same ids,
so they agree on every item without communicating. A stream-K tile's pieces meet in the
fix-up: partial sums passed from CTA to CTA through a global workspace.

:func:`make_tile_scheduler` is the component the kernel calls; the walk itself is also
built for the host (:func:`host_work_walk`, :func:`host_grouped_tile`), for tests and planning.
"""

import functools
import operator
from collections import namedtuple

from numba import cuda

from .. import intrinsics as nh

__all__ = ["TileScheduler", "Work", "WorkItem", "OutputTile", "make_tile_scheduler", "grouped_tile",
           "host_grouped_tile", "device_work_walk", "host_work_walk"]


def _grouped(div):
    """``grouped_tile`` with integer division ``div``."""

    def grouped_tile(tile, tiles_m, tiles_n, group_m):
        """Tile ``(pm, pn)`` of linear id ``tile`` in grouped (L2-friendly) order.

        Ids run down ``group_m`` tile-rows before moving one tile-column right, so a wave of
        CTAs reads ``group_m`` row panels of A and a few column panels of B instead of one row
        panel and every column panel (Triton's "grouped ordering").
        """
        per_group = group_m * tiles_n
        group = div(tile, per_group)
        first_m = group * group_m
        size_m = min(tiles_m - first_m, group_m)
        local = tile - group * per_group
        pn = div(local, size_m)
        return first_m + local - pn * size_m, pn

    return grouped_tile


# The device version divides in 32 bits (a 64-bit division is a subroutine call, whose
# return address spilled in the fused cluster kernel); host code and tests use the other.
grouped_tile = cuda.jit(device=True, forceinline=True)(_grouped(nh.div_u32))
host_grouped_tile = _grouped(operator.floordiv)


def _work_walk(div, stream_k, wrap):
    """``(first_item, next_item)`` with integer division ``div``, each function passed
    through ``wrap`` (``cuda.jit`` for device functions) as it is made."""

    @wrap
    def stream_k_start(cta, ctas, sk_iters):
        """First stream-K k-iteration of CTA ``cta``: ``sk_iters`` split into ``ctas`` equal runs."""
        return div(sk_iters * cta, ctas)

    @wrap
    def stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks):
        sk_iters = (num_tiles - dp_tiles) * k_blocks
        if not stream_k or sk_iters == 0:
            return num_tiles, 0, 0
        start = stream_k_start(cta, ctas, sk_iters)
        end = stream_k_start(cta + 1, ctas, sk_iters)
        rel = div(start, k_blocks)
        k_begin = start - rel * k_blocks
        return dp_tiles + rel, k_begin, min(k_blocks, k_begin + end - start)

    @wrap
    def first_item(cta, ctas, dp_tiles, num_tiles, k_blocks):
        """``(tile, k_begin, k_end)``: the first work item of CTA ``cta`` of ``ctas``.

        Tiles below ``dp_tiles`` are data-parallel: CTA c takes tiles c, c + ctas, ... with
        all ``k_blocks``. With ``stream_k``, the k-iterations of the other tiles (stream-K's
        hybrid, Osama et al. 2023) are split into ``ctas`` equal contiguous runs, one per
        CTA, cut at tile boundaries into items: a run starts with the end of one tile's K
        loop, may cover whole tiles, and ends with the start of another's. ``tile >=
        num_tiles``: no item. The caller keeps every run non-empty (stream-K iterations >=
        ``ctas``) and below 2^32.
        """
        if cta < dp_tiles:
            return cta, 0, k_blocks
        return stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks)

    @wrap
    def next_item(item, cta, ctas, dp_tiles, num_tiles, k_blocks):
        """The work item after ``item`` (see ``first_item``)."""
        tile = item[0]
        if tile < dp_tiles:
            if tile + ctas < dp_tiles:
                return tile + ctas, 0, k_blocks
            return stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks)
        first = (tile + 1 - dp_tiles) * k_blocks
        end = stream_k_start(cta + 1, ctas, (num_tiles - dp_tiles) * k_blocks)
        if not stream_k or first >= end:
            return num_tiles, 0, 0
        return tile + 1, 0, min(k_blocks, end - first)

    return first_item, next_item


@functools.lru_cache(maxsize=None)
def device_work_walk(stream_k):
    """``(first_item, next_item)`` as device functions (32-bit division).

    Without ``stream_k`` the walk is the data-parallel one, ``tile += ctas``, with no
    division at all.
    """
    return _work_walk(nh.div_u32, stream_k, cuda.jit(device=True, forceinline=True))


def host_work_walk():
    """The stream-K walk as plain Python functions (tests, host-side planning)."""
    return _work_walk(operator.floordiv, True, lambda f: f)


Work = namedtuple("Work", ["ctiles_m", "ctiles_n", "per_batch", "num_tiles", "k_blocks", "cta", "ctas", "dp_tiles"])
WorkItem = namedtuple("WorkItem", ["tile", "k_begin", "k_end"])
OutputTile = namedtuple("OutputTile", ["batch", "m0", "n0"])
TileScheduler = namedtuple("TileScheduler", ["work", "first", "next", "origin", "fixup"])


def make_tile_scheduler(cfg) -> TileScheduler:
    """The scheduler of the kernel of ``cfg``: a :class:`TileScheduler` of device functions.

    - ``work(params) -> Work``: this CTA's share of the launch (:class:`GemmParams`);
    - ``first(work)``, ``next(work, item) -> WorkItem``: its items; ``item.tile >=
      work.num_tiles`` ends the walk;
    - ``origin(work, tile, rm, rn) -> OutputTile``: batch and first row and column of the
      output tile of CTA ``(rm, rn)`` of the cluster in cluster tile ``tile``;
    - ``fixup(frag, work, item, workspace, consumer) -> bool``: stream-K's exchange of
      partial sums (nothing without ``cfg.stream_k``); True when ``frag`` now holds the
      tile's whole sum and this consumer stores it.
    """
    BM, BN, CM, CN, GROUP_M = cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.cluster_n, cfg.group_m
    CLUSTER = cfg.cluster_size
    ONE_PRODUCT = cfg.epilogue is not None  # gemm() neither batches nor splits K with an epilogue
    STREAM_K = cfg.stream_k
    BK = cfg.block_k
    PARTIAL_BYTES = cfg.partial_bytes
    PARTIAL_QUADS = BN // 8  # float4s per thread: 4 * PARTIAL_QUADS = BN / 2 accumulators
    first_item, next_item = device_work_walk(STREAM_K)

    @cuda.jit(device=True, forceinline=True)
    def work(p):
        """Cluster tiles cover CM x CN output tiles; a CTA whose tile falls past the edge (odd
        tile count) still loads its share for its peers: its own part is zero-filled by TMA
        and its store is clipped away. Work units: batch items, or slices of K."""
        ctiles_m = ((p.M + BM - 1) // BM + CM - 1) // CM
        ctiles_n = ((p.N + BN - 1) // BN + CN - 1) // CN
        per_batch = ctiles_m * ctiles_n
        num_tiles = p.batches * per_batch
        k_blocks = p.k_split if p.k_split else (p.K + BK - 1) // BK
        dp_tiles = p.dp_tiles if STREAM_K else num_tiles
        return Work(ctiles_m, ctiles_n, per_batch, num_tiles, k_blocks, cuda.blockIdx.x // CLUSTER,
                    cuda.gridDim.x // CLUSTER, dp_tiles)

    @cuda.jit(device=True, forceinline=True)
    def first(w):
        return WorkItem(*first_item(w.cta, w.ctas, w.dp_tiles, w.num_tiles, w.k_blocks))

    @cuda.jit(device=True, forceinline=True)
    def next_(w, item):
        return WorkItem(*next_item(item, w.cta, w.ctas, w.dp_tiles, w.num_tiles, w.k_blocks))

    @cuda.jit(device=True, forceinline=True)
    def origin(w, tile, rm, rn):
        """CTA (rm, rn) of a cluster computes output tile (CM*cm + rm, CN*cn + rn) of cluster tile (cm, cn)."""
        b = 0 if ONE_PRODUCT else nh.div_u32(tile, w.per_batch)
        cm, cn = grouped_tile(tile - b * w.per_batch, w.ctiles_m, w.ctiles_n, GROUP_M)
        return OutputTile(b, (CM * cm + rm) * BM, (CN * cn + rn) * BN)

    @cuda.jit(device=True, forceinline=True)
    def publish_partial(frag, workspace, slot, c):
        """Store this consumer's partial sums to ``slot`` and raise its flag.

        Fragment order (float4 q of thread t at ``16 * (128 q + t)``): every store of a warp
        is 512 contiguous bytes, and the reader uses the same layout, so nothing is shuffled.
        The warpgroup's barrier orders every thread's stores before the leader's release.
        """
        base = workspace + slot * PARTIAL_BYTES + 16 * c.t
        for q in range(PARTIAL_QUADS):
            nh.st_global_v4_f32(base + 2048 * q, frag[4 * q], frag[4 * q + 1], frag[4 * q + 2], frag[4 * q + 3])
        nh.named_barrier_sync(1 + c.cw, 128)
        if c.leader:
            nh.st_release_gpu_u32(workspace + cuda.gridDim.x * 2 * PARTIAL_BYTES + 4 * slot, 1)

    @cuda.jit(device=True, forceinline=True)
    def add_partial(frag, workspace, slot, c):
        """Add the partial sums in ``slot`` (the next CTA's), once they are there.

        The next CTA's run holds the rest of this tile's K loop; it published its partial
        (after adding its own next CTA's, if the tile goes on) before it could wait on this
        CTA, so the wait ends while every CTA is resident. Each tile's sum is taken in the
        same order on every run, so results are deterministic. The flag goes back to zero
        for the next launch.
        """
        flag = workspace + cuda.gridDim.x * 2 * PARTIAL_BYTES + 4 * slot
        if c.leader:
            while nh.ld_acquire_gpu_u32(flag) == 0:
                pass
            nh.st_global_u32(flag, 0)
        nh.named_barrier_sync(1 + c.cw, 128)
        base = workspace + slot * PARTIAL_BYTES + 16 * c.t
        for q in range(PARTIAL_QUADS):
            p = nh.ld_global_cg_v4_f32(base + 2048 * q)
            for e in range(4):
                frag[4 * q + e] += p[e]

    @cuda.jit(device=True, forceinline=True)
    def fixup(frag, w, item, workspace, c):
        if not STREAM_K:
            return True
        if item.k_end < w.k_blocks:  # the next CTA did the rest of the K loop
            add_partial(frag, workspace, 2 * (w.cta + 1) + c.cw, c)
        if item.k_begin > 0:  # and the previous CTA finishes the tile
            publish_partial(frag, workspace, 2 * w.cta + c.cw, c)
            return False
        return True

    return TileScheduler(work, first, next_, origin, fixup)
