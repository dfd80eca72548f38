"""The GEMM's static persistent tile scheduler, with stream-K and its fix-up, and the grouped GEMM's.

A persistent CTA walks work items: whole tiles ``cta, cta + ctas, ...`` (data-parallel),
then, with stream-K, pieces of the K loops of the last tiles. The walk gives a CTA's items
(a tile and a k-block range each) one after another, and maps a linear tile id to
output-tile coordinates (the kit's grouped raster, :func:`numba_hopper.kit.scheduler.grouped_tile`,
over cluster tiles, or with ``cfg.group_n`` the same raster transposed). Producer and consumers
call the same functions on the same ids, so they agree on every item without communicating. A stream-K tile's pieces meet in the
fix-up: partial sums passed from CTA to CTA through a global workspace.

Which cluster takes which slot of the walk (``cta`` above counts clusters) is the launch's
order, or with ``cfg.cluster_order = "gpc"`` the GPC-major order of where the clusters run
(:func:`make_tile_scheduler`'s ``claim``).

With ``cfg.dynamic_schedule`` a cluster's first tile is its slot and each later one the next
tile no cluster has taken: its leader (the producer of cluster rank 0) counts it off a global
counter and hands it to every role of the cluster through a ring of tile ids
(:func:`_dynamic_walk`). In the static walk CTA c takes tile ``c + n * ctas`` whenever it gets
there; over hundreds of tiles the CTAs' speeds drift apart, the tiles in flight spread over
many rows of the raster, and the operand panels they share are read from DRAM again instead of
the L2 (the output layer's products at 8192 tokens read 1.4x more per tile than at 1/8 of the
vocabulary, ``benchmarks/results/gemm-traffic-h200.json``). Counted off in order, the tiles
in flight stay consecutive.

Grouped kernels (``cfg.grouped``, mixture-of-experts layers) number the tiles of all
groups in one sequence, group after group, and walk it the same way (``cta, cta + ctas,
...``). The group sizes live on the device and are read there, so the host never waits for
them. Since a CTA's tile ids only grow, its walk carries a cursor (the group of its last
tile and where that group's tiles start) and moves it forward over the groups' tile
counts: each CTA reads each group's size at most once per launch.

:func:`make_tile_scheduler` is the component the kernel calls; the walks are also built
for the host (:func:`host_work_walk`, :func:`host_group_walk`), for tests and planning.
"""

import functools
import operator
from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..kit.barriers import warpgroup_sync
from ..kit.scheduler import OutputTile, grouped_tile, grouped_tile_host
from .gemm_config import TILE_ID_SLOTS

__all__ = ["TileScheduler", "Work", "WorkItem", "GroupWork", "GroupItem", "GroupTile",
           "make_tile_scheduler", "device_work_walk", "host_work_walk",
           "host_group_walk"]


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


Work = namedtuple("Work", ["ctiles_m", "ctiles_n", "per_batch", "num_tiles", "k_blocks", "cta", "ctas", "dp_tiles",
                           "claims"])
WorkItem = namedtuple("WorkItem", ["tile", "k_begin", "k_end", "seq"])
WorkItem.__doc__ = """A work item: ``tile`` (cluster tiles, batch-major), its k-blocks ``[k_begin, k_end)``, and
``seq``, its place in the CTA's walk (0, 1, ...)."""
TileScheduler = namedtuple("TileScheduler", ["init", "nominate", "claim", "work", "first", "next", "origin", "fixup"])


def make_tile_scheduler(cfg) -> TileScheduler:
    """The scheduler of the kernel of ``cfg``: a :class:`TileScheduler` of device functions.

    - ``init(smem)``: (one thread, before the block's first synchronization) the barriers of a
      dynamic schedule's ring of tile ids (nothing otherwise);
    - ``nominate(params, tid) -> rank``, before griddepcontrol.wait, then ``claim(params, rank,
      slot_address, tid) -> slot`` after it: this CTA's cluster's slot among the launch's
      clusters (every thread of the cluster calls both; ``slot_address``:
      ``cfg.layout.cluster_slot`` in shared memory);
    - ``work(params, slot) -> Work``: this CTA's share of the launch (:class:`GemmParams`);
    - ``first(work)``, ``next(work, item) -> WorkItem``: its items; ``item.tile >=
      work.num_tiles`` ends the walk;
    - ``origin(work, item, rm, rn) -> OutputTile``: batch and first row and column of the
      output tile of CTA ``(rm, rn)`` of the cluster in the cluster tile of ``item``;
    - ``fixup(frag, work, item, workspace, consumer) -> bool``: stream-K's exchange of
      partial sums (nothing without ``cfg.stream_k``); True when ``frag`` now holds the
      tile's whole sum and this consumer stores it.

    With ``cfg.grouped`` the same functions walk the tiles of every group
    (:func:`_group_walk`): ``work`` is a :class:`GroupWork`, the items :class:`GroupItem`
    and the tiles :class:`GroupTile`, whose ``row_end`` bounds the rows the epilogue may write.
    """
    if cfg.grouped is not None:
        return _grouped_scheduler(cfg)
    BM, BN, CM, CN, GROUP_M, GROUP_N = cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.cluster_n, cfg.group_m, cfg.group_n
    CLUSTER = cfg.cluster_size
    ONE_PRODUCT = cfg.epilogue is not None  # gemm() neither batches nor splits K with an epilogue
    STREAM_K = cfg.stream_k
    BK = cfg.block_k
    PARTIAL_BYTES = cfg.partial_bytes
    OWN_BARRIER = cfg.barrier_ids.consumer  # (+ cw: each consumer warpgroup's own)
    PARTIAL_QUADS = BN // 8  # float4s per thread: 4 * PARTIAL_QUADS = BN / 2 accumulators
    first_item, next_item = device_work_walk(STREAM_K)
    nominate, claim = _cluster_slots(cfg)

    @cuda.jit(device=True, forceinline=True)
    def work(p, slot):
        """Cluster tiles cover CM x CN output tiles; a CTA whose tile falls past the edge (odd
        tile count) still loads its share for its peers: its own part is zero-filled by TMA
        and its store is clipped away. Work units: batch items, or slices of K."""
        ctiles_m = ((p.M + BM - 1) // BM + CM - 1) // CM
        ctiles_n = ((p.N + BN - 1) // BN + CN - 1) // CN
        per_batch = ctiles_m * ctiles_n
        num_tiles = p.batches * per_batch
        k_blocks = p.k_split if p.k_split else (p.K + BK - 1) // BK
        dp_tiles = p.dp_tiles if STREAM_K else num_tiles
        return Work(ctiles_m, ctiles_n, per_batch, num_tiles, k_blocks, slot, cuda.gridDim.x // CLUSTER, dp_tiles,
                    p.cluster_claims)

    @cuda.jit(device=True, forceinline=True)
    def static_first(w):
        return WorkItem(*first_item(w.cta, w.ctas, w.dp_tiles, w.num_tiles, w.k_blocks), 0)

    @cuda.jit(device=True, forceinline=True)
    def static_next(w, item):
        return WorkItem(*next_item(item, w.cta, w.ctas, w.dp_tiles, w.num_tiles, w.k_blocks), item.seq + 1)

    init, first, next_ = _dynamic_walk(cfg) if cfg.dynamic_schedule else (_no_ring, static_first, static_next)

    @cuda.jit(device=True, forceinline=True)
    def origin(w, item, rm, rn):
        """CTA (rm, rn) of a cluster computes output tile (CM*cm + rm, CN*cn + rn) of cluster tile (cm, cn)."""
        tile = item.tile
        b = 0 if ONE_PRODUCT else nh.div_u32(tile, w.per_batch)
        if GROUP_N:  # the grouped raster transposed: groups of GROUP_N columns, walked row by row
            cn, cm = grouped_tile(tile - b * w.per_batch, w.ctiles_n, w.ctiles_m, GROUP_N)
        else:
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
        warpgroup_sync(OWN_BARRIER + c.cw)
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
        warpgroup_sync(OWN_BARRIER + c.cw)
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

    return TileScheduler(init, nominate, claim, work, first, next_, origin, fixup)


@cuda.jit(device=True, forceinline=True)
def _no_ring(smem):
    """``init`` of a static schedule: it has no ring of tile ids."""


def _dynamic_walk(cfg):
    """``(init, first, next)`` of ``cfg.dynamic_schedule`` (:func:`make_tile_scheduler`).

    A cluster's first item is its slot's tile. Each later one, the cluster's leader (the
    producer thread of cluster rank 0) takes off the counter at ``work.claims`` (the first u32:
    tiles taken after the first wave) and hands to every CTA of the cluster through a ring of
    ``TILE_ID_SLOTS`` slots (``cfg.layout.tile_ids``: ``full`` mbarriers, ``empty`` mbarriers,
    then the u32 ids), as a producer hands k-blocks to consumers: it waits for the slot's
    ``empty`` in its own CTA, stores the id into the slot in each CTA and arrives on each CTA's
    ``full`` (release at cluster scope); every reader (each CTA's producer thread and lane 0 of
    each consumer warp, after its warp read the id) waits on its CTA's ``full`` (acquire at
    cluster scope) and arrives on the leader's ``empty``. The leader hands out each tile when
    it reads the one before, so the counter's round trip (a microsecond or two under load) runs
    under a whole tile's k-blocks (handed out as the producer finished the previous tile's
    loads, the peer producer's wait for it emptied the ring: 4-6% less work per cycle). A tile
    id at or past ``num_tiles`` ends every role's walk. The leader that hands out that end
    counts its cluster done (the second u32); the last cluster to do so, after which nobody
    takes a tile, clears both for the next launch."""
    CLUSTER = cfg.cluster_size
    SLOTS = TILE_ID_SLOTS
    RING = cfg.layout.tile_ids
    FULL, EMPTY, IDS = 0, 8 * SLOTS, 16 * SLOTS
    READERS = CLUSTER * (1 + 4 * cfg.consumers)  # arrivals on the leader's empty barriers

    @cuda.jit(device=True, forceinline=True)
    def init(smem):
        for s in range(SLOTS):
            nh.mbarrier_init(smem + RING + FULL + 8 * s, 1)
            nh.mbarrier_init(smem + RING + EMPTY + 8 * s, READERS)

    @cuda.jit(device=True, forceinline=True)
    def in_cta(addr, rank):
        """``addr`` (this CTA's shared memory) in CTA ``rank`` of the cluster."""
        return nh.mapa(addr, rank) if CLUSTER > 1 else addr

    @cuda.jit(device=True, forceinline=True)
    def leader():
        """The producer thread of cluster rank 0 (the only producer thread that walks)."""
        return cuda.threadIdx.x < 128 and (CLUSTER == 1 or nh.cluster_ctarank() == 0)

    @cuda.jit(device=True, forceinline=True)
    def count_done(w):
        if nh.atom_add_acq_rel_gpu_u32(w.claims + 4, 1) == w.ctas - 1:
            nh.st_global_u32(w.claims, 0)
            nh.st_global_u32(w.claims + 4, 0)

    @cuda.jit(device=True, forceinline=True)
    def hand_out(w, q):
        """(The leader) take the tile of ring position ``q`` off the counter and hand it to
        every CTA of the cluster; count the cluster done at the walk's end."""
        slot, phase = q % SLOTS, (q // SLOTS) & 1
        ring = nh.dynamic_shared_base() + RING
        nh.mbarrier_wait_parity_cluster(ring + EMPTY + 8 * slot, phase ^ 1)
        taken = w.ctas + nh.atom_add_acq_rel_gpu_u32(w.claims, 1)
        for r in range(CLUSTER):
            nh.st_shared_cluster_u32(in_cta(ring + IDS + 4 * slot, r), np.uint32(taken))
            nh.mbarrier_arrive_cluster(in_cta(ring + FULL + 8 * slot, r))
        if taken >= w.num_tiles:
            count_done(w)

    @cuda.jit(device=True, forceinline=True)
    def first(w):
        if leader():
            if w.cta < w.num_tiles:
                hand_out(w, 0)
            else:  # (a grid of more clusters than tiles)
                count_done(w)
        return WorkItem(w.cta, 0, w.k_blocks, 0)

    @cuda.jit(device=True, forceinline=True)
    def next_(w, item):
        """Ring position ``q`` holds item ``q + 1`` (the first item takes none); the leader hands
        out the one after it first, a tile ahead of every reader."""
        q = item.seq
        slot, phase = q % SLOTS, (q // SLOTS) & 1
        ring = nh.dynamic_shared_base() + RING
        nh.mbarrier_wait_parity_cluster(ring + FULL + 8 * slot, phase)
        tile = np.int64(nh.ld_shared_u32(ring + IDS + 4 * slot))
        if tile < w.num_tiles and leader():
            hand_out(w, q + 1)
        producer = cuda.threadIdx.x < 128
        if not producer:
            cuda.syncwarp()
        if producer or cuda.threadIdx.x % 32 == 0:  # the id is read: the slot may be handed out again
            if CLUSTER > 1:
                nh.mbarrier_arrive_cluster_rank(ring + EMPTY + 8 * slot, 0)
            else:
                nh.mbarrier_arrive(ring + EMPTY + 8 * slot)
        return WorkItem(tile, 0, w.k_blocks, q + 1)

    return init, first, next_


def _cluster_slots(cfg):
    """``(nominate, claim)`` of :class:`TileScheduler` for ``cfg.cluster_order``.

    "launch": a cluster's slot is its index in the grid. "gpc": the GPC-major rank of the TPC
    its CTAs run on (``params.tpc_order``, probed by ``numba_hopper.matmul.placement``), so
    that the clusters of a GPC take consecutive slots, hence neighbouring tiles of the raster,
    and read the same operand tiles at about the same time. The L2 request coalescer merges such
    reads from SMs of one GPC; a launch deals consecutive clusters to different GPCs, so in
    launch order 1x2 clusters' reads of B, the operand they do not multicast, merged 1%, against
    69% in GPC order (measured at 512x3584x18944). Neighbouring slots must share that operand:
    the grouped raster's consecutive tiles share B's column panel, which suits 1x2 clusters;
    2x1 clusters multicast B and take the raster walked row by row (``cfg.group_n``), whose
    consecutive tiles share A's row panel. At 2560x9728x8192 (A M-major) the 2x1 clusters'
    reads from the L2 fell 11% so, near cuBLAS's (same tile and cluster), where GPC order over
    the grouped raster had raised them 4% (``benchmarks/results/gemm-traffic-h200.json``, run
    "rows").

    Clusters land wherever SMs are free: with another kernel holding some, two clusters can
    run on one TPC one after the other. So each cluster claims a slot: the first free one from
    its rank on (compare-and-swap on the u32 claims after ``params.cluster_claims``' count).
    There are as many slots as clusters, so every claim ends and no two clusters get one slot.
    The claimer then counts its cluster; the last of the launch to count clears the claims and
    the count for the next launch (every cluster claimed before it counted, and acq_rel orders
    those claims before the clearing stores). The next launch claims after its
    griddepcontrol.wait, when this one has completed.

    The rank is read, and the claim's lines prefetched into L2, before the wait (``nominate``):
    after it only the compare-and-swap and a cluster barrier delay the first loads (each read
    from DRAM cost about a microsecond: 4 us a launch at 512x3584x18944). The
    claimer is thread 32, which the producer's role leaves idle, so that its count never
    delays the producer's first loads.
    """
    CLUSTER = cfg.cluster_size
    if cfg.cluster_order != "gpc":
        @cuda.jit(device=True, forceinline=True)
        def no_nomination(p, tid):
            return 0

        @cuda.jit(device=True, forceinline=True)
        def launch_slot(p, rank, slot_address, tid):
            return cuda.blockIdx.x // CLUSTER

        return no_nomination, launch_slot

    CLAIMER = 32

    @cuda.jit(device=True, forceinline=True)
    def claimer(tid):
        return tid == CLAIMER and nh.cluster_ctarank() == 0

    @cuda.jit(device=True, forceinline=True)
    def nominate(p, tid):
        """The claimer's first choice of slot: its TPC's rank (modulo the clusters)."""
        if not claimer(tid):
            return 0
        clusters = cuda.gridDim.x // CLUSTER
        rank = nh.ld_global_u32(p.tpc_order + 4 * (nh.smid() // 2))
        rank = rank - nh.div_u32(rank, clusters) * clusters
        nh.prefetch_global_l2(p.cluster_claims)
        nh.prefetch_global_l2(p.cluster_claims + 4 + 4 * rank)
        return rank

    @cuda.jit(device=True, forceinline=True)
    def claim(p, rank, slot_address, tid):
        clusters = cuda.gridDim.x // CLUSTER
        if claimer(tid):
            slot = rank
            while nh.atom_cas_global_u32(p.cluster_claims + 4 + 4 * slot, 0, 1) != 0:
                slot = slot + 1 if slot + 1 < clusters else 0
            for cta in range(CLUSTER):
                nh.st_shared_cluster_u32(nh.mapa(slot_address, cta), slot)
        cuda.syncwarp()
        nh.cluster_arrive()  # (release: the slot's stores before it)
        if claimer(tid) and nh.atom_add_acq_rel_gpu_u32(p.cluster_claims, 1) == clusters - 1:
            for s in range(clusters):
                nh.st_global_u32(p.cluster_claims + 4 + 4 * s, 0)
            nh.st_global_u32(p.cluster_claims, 0)
        cuda.syncwarp()
        nh.cluster_wait()
        return nh.ld_shared_u32(slot_address)

    return nominate, claim


GROUP_WALK_END = 2**31 - 1  # the tile id of a grouped walk's end (tile ids are below 2^31: the host checks)
GroupWork = namedtuple("GroupWork", ["tiles_n", "num_tiles", "k_blocks", "cta", "ctas", "groups", "group_rows",
                                     "rows"])
GroupWork.__doc__ = """A CTA's share of a grouped launch: ``tiles_n`` tile columns per group, ``num_tiles``
the walk's end marker (:data:`GROUP_WALK_END`, above every tile id), ``groups`` G, ``group_rows`` where
the sizes are (the device address, or a host sequence), ``rows`` the M of A and the output
(every row bound is clamped to it)."""
GroupItem = namedtuple("GroupItem", ["tile", "k_begin", "k_end", "group", "base", "tiles_m", "row0", "row_end"])
GroupItem.__doc__ = """A work item of a grouped walk, with the walk's cursor: the item's ``group``, the id of
that group's first tile (``base``), its tile rows (``tiles_m``) and rows ``[row0, row_end)``."""
GroupTile = namedtuple("GroupTile", ["batch", "m0", "n0", "row_end"])
GroupTile.__doc__ = """An output tile of a grouped GEMM: ``batch`` the group (B's batch coordinate, and A's and
the output's when masked), first row ``m0`` and column ``n0``, and ``row_end``: rows at or
after it belong to no group of this tile and must not be written."""


def _group_walk(load, wrap, masked, block_m, block_n, group_m, raster):
    """``(first, next, origin)`` of the grouped walk, each passed through ``wrap``: ``load(rows,
    g)`` reads group g's int32 from ``rows``; ``raster`` is ``grouped_tile`` (device or host).

    Tile ids run over group 0's ``tiles_m(0) * tiles_n`` tiles, then group 1's, and so on;
    within a group, in the L2-friendly ``grouped_tile`` order. Group g's rows: contiguous,
    ``[end(g-1), end(g))`` (``end(-1) = 0``); masked, ``[0, count(g))``. Every bound is
    clamped into ``[0, rows]`` and a group whose end is below its start is empty, so sizes
    that break the documented preconditions cannot make a tile reach outside A or the
    output (the results are then wrong, not out of bounds).
    """
    shift = block_m.bit_length() - 1
    assert block_m == 1 << shift

    @wrap
    def bounds(w, g, prev_end):
        """``(row0, row_end, tiles_m)`` of group g; ``prev_end``: group g-1's ``row_end`` (0 for g = 0)."""
        row0 = 0 if masked else prev_end
        row_end = min(load(w.group_rows, g), w.rows)
        return row0, row_end, (max(row_end - row0, 0) + block_m - 1) >> shift

    @wrap
    def seek(w, tile, g, base, tiles_m, row0, row_end):
        """The item of ``tile``, from the cursor at group ``g`` (whose first tile is ``base``) on."""
        while g < w.groups and tile >= base + tiles_m * w.tiles_n:
            base += tiles_m * w.tiles_n
            g += 1
            if g < w.groups:
                row0, row_end, tiles_m = bounds(w, g, row_end)
        if g >= w.groups:  # past the last group's tiles: the end of the walk
            return GroupItem(w.num_tiles, 0, 0, g, base, tiles_m, row0, row_end)
        return GroupItem(tile, 0, w.k_blocks, g, base, tiles_m, row0, row_end)

    @wrap
    def first(w):
        row0, row_end, tiles_m = bounds(w, 0, 0)
        return seek(w, w.cta, 0, 0, tiles_m, row0, row_end)

    @wrap
    def next_(w, item):
        return seek(w, item.tile + w.ctas, item.group, item.base, item.tiles_m, item.row0, item.row_end)

    @wrap
    def origin(w, item, rm, rn):
        pm, pn = raster(item.tile - item.base, item.tiles_m, w.tiles_n, group_m)
        return GroupTile(item.group, item.row0 + pm * block_m, pn * block_n, item.row_end)

    return first, next_, origin


@cuda.jit(device=True, forceinline=True)
def _load_group_rows(address, g):
    return nh.ld_global_u32(address + 4 * g)


def _grouped_scheduler(cfg) -> TileScheduler:
    BM, BN, BK = cfg.block_m, cfg.block_n, cfg.block_k
    MASKED = cfg.grouped == "masked"
    first, next_, origin = _group_walk(_load_group_rows, cuda.jit(device=True, forceinline=True),
                                       MASKED, BM, BN, cfg.group_m, grouped_tile)

    @cuda.jit(device=True, forceinline=True)
    def work(p, slot):
        """The end marker is a constant, not a count: the groups' tiles are known only as the
        walk reads their sizes (and a constant costs the consumers no register)."""
        return GroupWork((p.N + BN - 1) // BN, GROUP_WALK_END, (p.K + BK - 1) // BK, np.int64(slot),
                         np.int64(cuda.gridDim.x), p.batches, p.group_rows, p.M)

    @cuda.jit(device=True, forceinline=True)
    def fixup(frag, w, item, workspace, c):
        return True

    return TileScheduler(_no_ring, *_cluster_slots(cfg), work, first, next_, origin, fixup)


def host_group_walk(mode, block_m, block_n, group_m=8):
    """``(first, next, origin)`` of the grouped walk of ``mode`` ("contiguous"/"masked") as
    plain Python functions over a :class:`GroupWork` whose ``group_rows`` is a sequence (tests)."""
    return _group_walk(operator.getitem, lambda f: f, mode == "masked", block_m, block_n,
                       group_m, grouped_tile_host)
