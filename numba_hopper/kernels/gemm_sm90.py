"""Warp-specialized, persistent TMA + wgmma GEMM for sm_90a: ``D = A @ B`` (with a fused epilogue).

One CTA per SM: a producer warpgroup and one consumer warpgroup per 64 rows of the tile (256,
384 or 512 threads for 64-, 128- or 192-row tiles), or two of 128 rows each on 256-row
tiles. The kernel only orchestrates its components, each in its own module:

- the ring (:mod:`numba_hopper.kit.pipeline`): ``stages`` slots of one A and one B k-block,
  handed from the producer to the consumers by mbarriers;
- the mainloop (:mod:`.mainloop`): the producer's TMA loads into the ring (multicast in a
  cluster), the consumers' wgmmas on it (block-wise scaled fp8 products promote each
  k-block into f32 sums there);
- the tile scheduler (:mod:`.scheduler`): which tiles and k-block ranges a persistent CTA
  takes, and stream-K's fix-up of tiles whose K loop several CTAs share;
- the epilogue (:mod:`.epilogue`): accumulators through the fused math, stmatrix and TMA
  stores to the output.

Roles:

- warpgroup 0, the producer: gives registers back (``setmaxnreg.dec``, next to two or three
  consumers); one elected thread walks the CTA's work items and loads their k-blocks;
- warpgroups 1 to BM / 64 (two on 256-row tiles), the consumers: take registers
  (``setmaxnreg.inc``; a single consumer has them all from the start); each owns 64 rows of
  the BM x BN output tile (128 rows, two 64-row wgmmas a k-step, of a 256-row tile),
  accumulates them in registers (128 f32 per thread for BN = 256), and stores them while
  the producer already loads the next tile (plain 16-bit and unscaled promoted products of
  two consumers, or three on narrower tiles: while the next tile's first k-block runs,
  ``cfg.overlaps_store``). With
  ``cfg.pingpong`` the two consumers instead take whole tiles in turn (each the upper and lower
  64 rows), one storing its tile while the other computes the next.

``make_gemm_kernel(config)`` builds (and caches) one kernel per :class:`GemmConfig`; every
config value is a compile-time constant of that kernel. Its arguments are a
:class:`GemmParams` and, with a fused epilogue, an :class:`EpilogueArgs` (``()`` without).
See the PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier",
"Data Movement and Conversion Instructions: cp.async.bulk.tensor" and "Asynchronous
Warpgroup Level Matrix Multiply-Accumulate Instructions", and the CUDA C++ Programming
Guide, "Thread Block Clusters".
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
from numba import cuda
from numba.cuda import types

from .. import intrinsics as nh
from .epilogue import make_epilogue
from .epilogue_config import EpilogueArgs, epilogue_argument_type
from .gemm_config import KBLOCK_SCALE, WG_ROWS, Consumer, GemmConfig, GemmParams
from .mainloop import make_mainloop
from ..kit.fragments import thread_rows
from ..kit.pipeline import make_tma_pipeline, pipeline_start
from ..kit.warpspec import WarpSpecialization, warp_specialization, warpgroup_index
from ..runtime.tensormap import TENSORMAP_ARG
from .scheduler import make_tile_scheduler

# The kernel's tensor maps (kernel parameters, by value); A's block-wise scales: (1, K blocks, M)
# f32, box (1, 1, BM); a gated kernel's B_up; ``segments``: a K-segmented kernel's other A and B
# maps, (A_1, B_1, A_2, B_2) as far as it has them; ``glu``: a GLU backward's up products and
# second output (C is the gate's products), or (); ``aux``: a gated kernel's products (B's, B_up's), or ().
TensorMaps = namedtuple("TensorMaps", ["a", "b", "d", "c", "a_scales", "b_up", "segments", "glu", "aux"])

__all__ = ["GemmConfig", "GemmParams", "EpilogueArgs", "make_gemm_kernel", "gemm_argument_types"]

# Producer registers after setmaxnreg.dec; the consumers share the rest of the launch's
# registers (``register_budget``). The cluster producer also computes multicast masks and peer
# offsets: at 40 it spills.
PRODUCER_REGS = 40
PRODUCER_REGS_CLUSTER = 56
# A fused epilogue keeps more values live in the consumers: give them the registers the
# producer can spare (measured: bias+gelu_tanh+c spills 96 B at 40/232, none at 24/240). So does
# a promoted store behind the next tile's first k-block (GemmConfig.overlaps_store): three
# consumers' 192 x 128 kernel spills 512 B at 40/152, none at 24/160. (A plain 16-bit one holds
# its tile packed: 128 x 256 tiles fit at 56/224.)
PRODUCER_REGS_FUSED = 24
PRODUCER_REGS_FUSED_CLUSTER = 40
# A grouped producer also walks the groups' row ends in 64-bit arithmetic: at 24 it spills
# (4 B in a bf16 128x256 kernel with silu); its fused epilogues take no C. Block-scaled
# grouped kernels keep PRODUCER_REGS_FUSED: their 192-wide tiles' consumers spill at 232.
PRODUCER_REGS_FUSED_GROUPED = 32


def make_gemm_kernel(cfg: GemmConfig):
    """The ``@cuda.jit`` kernel ``gemm_kernel(params, ep)`` for ``cfg`` (built once per config)."""
    return _build_gemm_kernel(cfg)


def gemm_argument_types(cfg: GemmConfig, epilogue_types=None, b_scales=None) -> tuple:
    """The numba types of ``make_gemm_kernel(cfg)``'s arguments ``(params, epilogue)`` as
    ``gemm`` passes them. ``epilogue_types``: the types of the fused epilogue's arguments in
    ``cfg.epilogue.arg_names`` order (None: a plain kernel, whose second argument is ``()``).
    ``b_scales``: the type of a block-scaled kernel's ``params.b_scales``, a float32 array (2-D,
    or 3-D grouped) typed by its layout as a launch passes it (default: any layout, "A")."""
    not_int64 = {"maps": types.UniTuple(TENSORMAP_ARG, cfg.tensormaps), "k_begins": types.UniTuple(types.int64, 2)}
    if cfg.block_scaled:
        not_int64["b_scales"] = b_scales or types.Array(types.float32, 3 if cfg.grouped else 2, "A")
    params = types.NamedTuple(tuple(not_int64.get(f, types.int64) for f in GemmParams._fields), GemmParams)
    if epilogue_types is None:
        return params, types.Tuple(())
    return params, epilogue_argument_type(cfg.epilogue, epilogue_types)


def warp_roles(cfg: GemmConfig) -> WarpSpecialization:
    """The kernel's producer/consumer split (the kit's :func:`warp_specialization`): one
    producer warpgroup, ``cfg.consumers`` consumer warpgroups, the producer's registers after
    ``setmaxnreg`` chosen here. The warpgroups only trade the registers the CTA got at launch,
    so a consumer gets its share of what the producer gives back; a larger request never
    completes (``setmaxnreg.inc`` waits for registers that no warp will free)."""
    if cfg.epilogue is None and not (cfg.overlaps_store and cfg.promoted):
        producer = PRODUCER_REGS_CLUSTER if cfg.cluster_size > 1 else PRODUCER_REGS
    elif cfg.grouped is not None and not cfg.promoted:
        producer = PRODUCER_REGS_FUSED_GROUPED
    else:
        producer = PRODUCER_REGS_FUSED_CLUSTER if cfg.cluster_size > 1 else PRODUCER_REGS_FUSED
    return warp_specialization(cfg.consumers, producer, cfg.cluster_size)


def register_budget(cfg: GemmConfig):
    """``(producer, consumer)`` registers per thread after ``setmaxnreg`` (:func:`warp_roles`)."""
    roles = warp_roles(cfg)
    return roles.producer_regs, roles.consumer_regs


@functools.lru_cache(maxsize=None)
def _build_gemm_kernel(cfg: GemmConfig):
    CLUSTER = cfg.cluster_size
    LAUNCH_BOUNDS = warp_roles(cfg).launch_bounds
    # A decode kernel (the narrow tiles of a swapped product) runs for a few microseconds, about
    # one of them waiting for its first k-blocks from DRAM. A consumer thread, idle until they
    # arrive, prefetches them into L2 before griddepcontrol.wait: the prefetch moves no data
    # into the CTA, and the previous kernel's writes go to that same L2. Wider tiles measured
    # slower with it (1024^3 and 2048^3 by 5-16%).
    PREFETCH_FIRST_TILE = cfg.out_major == "M"
    BARRIERS = cfg.layout.barriers
    SLOT = cfg.layout.cluster_slot
    # A CTA's slot is overwritten by multicasts from the CTAs of its tile row (A) and tile
    # column (B), so all of their consumer warps must release it.
    empty_arrivals = 4 * cfg.slot_readers * (cfg.cluster_m + cfg.cluster_n - 1)
    pipe = make_tma_pipeline(cfg.stages, empty_arrivals,
                             cfg.a_tile_bytes + cfg.b_tile_bytes + cfg.a_scales_box_bytes, CLUSTER)
    mainloop = make_mainloop(cfg, pipe)
    scheduler = make_tile_scheduler(cfg)
    epilogue = make_epilogue(cfg)
    tensormaps, prefetch_tensormaps = _tensormap_access(cfg)
    shared_schedule, role_schedule = _schedules(cfg, scheduler)
    producer = _producer(cfg, mainloop, scheduler, tensormaps, role_schedule)
    consumer = _consumers(cfg, pipe, mainloop, scheduler, epilogue, tensormaps, role_schedule)

    @cuda.jit(device=True, forceinline=True)
    def prefetch_first_tile(p, cta):
        work = scheduler.work(p, cuda.blockIdx.x)  # (decode kernels run no clusters)
        item = scheduler.first(work)
        if item.tile < work.num_tiles:
            mainloop.prefetch(tensormaps(p), p, item, scheduler.origin(work, item, cta.rm, cta.rn))

    @cuda.jit(launch_bounds=LAUNCH_BOUNDS)
    def gemm_kernel(p, ep):
        tid = cuda.threadIdx.x
        smem = nh.dynamic_shared_base()
        if tid == 0:
            prefetch_tensormaps(p)
            epilogue.init(smem)
            scheduler.init(smem)
            pipe.init(smem + BARRIERS)  # (its fence.mbarrier_init covers every barrier above)
        cta = mainloop.cluster_cta()
        if CLUSTER > 1:
            nh.cluster_sync()  # every barrier of the cluster is initialized before any use
        else:
            cuda.syncthreads()
        if PREFETCH_FIRST_TILE and tid == 128:
            prefetch_first_tile(p, cta)
        # Launched as a programmatic dependent, the kernel got here while the previous kernel
        # of the stream may still run: until now it touched only shared memory and its
        # parameters. Past the wait, that kernel's writes are visible and it reads nothing
        # this kernel overwrites.
        rank = scheduler.nominate(p, tid)
        nh.griddepcontrol_wait()
        work = shared_schedule(p, scheduler.claim(p, rank, smem + SLOT, tid))
        if tid < 128:
            producer(p, smem, tid, cta, work)
        else:
            consumer(p, ep, smem, tid, cta, work)
        if CLUSTER > 1:
            # No CTA may exit while a peer can still arrive on its barriers or multicast
            # into its shared memory.
            cuda.syncwarp()
            nh.cluster_sync()

    return gemm_kernel


def _tensormap_access(cfg: GemmConfig):
    """``(tensormaps(p) -> TensorMaps, prefetch_tensormaps(p))``: the kernel's tensor maps among
    its parameters, and their prefetch into the descriptor cache."""
    HAS_C, SCALED, GATED, SEGMENT_MAPS = cfg.has_c, cfg.block_scaled, cfg.gated, 2 * (cfg.k_segments - 1)
    C_MAP = 3 if HAS_C else 0
    LAST_MAP = 3 + HAS_C + SCALED + GATED - 1  # A's scales or B_up where the kernel has them
    FIRST_SEGMENT_MAP = LAST_MAP + 1
    GLU, FIRST_GLU_MAP = cfg.glu, FIRST_SEGMENT_MAP + SEGMENT_MAPS
    AUX, FIRST_AUX_MAP = cfg.gated_aux, FIRST_GLU_MAP + 2 * cfg.glu
    # The 192-wide promoted grouped kernels' consumers spill (120 + 204 B) when the tensor maps
    # are prefetched: ptxas then keeps the maps' addresses live from the kernel's start. They load
    # without the prefetch.
    AT_REGISTER_LIMIT = cfg.grouped is not None and cfg.promoted and cfg.block_n > KBLOCK_SCALE

    @cuda.jit(device=True, forceinline=True)
    def segment_maps(p):
        """The other K segments' A and B maps: (A_1, B_1[, A_2, B_2]), or ()."""
        if SEGMENT_MAPS == 2:
            return (nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP]),
                    nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP + 1]))
        if SEGMENT_MAPS == 4:
            return (nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP]),
                    nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP + 1]),
                    nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP + 2]),
                    nh.tensormap_param_address(p.maps[FIRST_SEGMENT_MAP + 3]))
        return ()

    glu_maps, aux_maps = _map_pair(GLU, FIRST_GLU_MAP), _map_pair(AUX, FIRST_AUX_MAP)

    @cuda.jit(device=True, forceinline=True)
    def tensormaps(p):
        """Where the launch put the tensor maps of A, B, D, C, A's scales, B_up, the other K
        segments', a GLU backward's and a gated kernel's products (C, A's scales and B_up only if
        the kernel has them; else another map stands in, unused). Each role takes them after
        ``setmaxnreg``: values live across it must fit the producer's few registers (fused kernels
        with a cluster spilled 40 B otherwise)."""
        last = nh.tensormap_param_address(p.maps[LAST_MAP])  # A's scales or B_up (never both)
        return TensorMaps(nh.tensormap_param_address(p.maps[0]), nh.tensormap_param_address(p.maps[1]),
                          nh.tensormap_param_address(p.maps[2]), nh.tensormap_param_address(p.maps[C_MAP]), last, last,
                          segment_maps(p), glu_maps(p), aux_maps(p))

    @cuda.jit(device=True, forceinline=True)
    def prefetch_tensormaps(p):
        """Start fetching the maps into the descriptor cache while the barriers are set up and
        (as a programmatic dependent) the previous kernel finishes: the first loads and stores
        then find them there instead of each waiting for its map from memory."""
        if AT_REGISTER_LIMIT:
            return
        maps = tensormaps(p)
        nh.prefetch_tensormap(maps.a)
        nh.prefetch_tensormap(maps.b)
        nh.prefetch_tensormap(maps.d)
        if HAS_C:
            nh.prefetch_tensormap(maps.c)
        if SCALED:
            nh.prefetch_tensormap(maps.a_scales)
        if GATED:
            nh.prefetch_tensormap(maps.b_up)
        if SEGMENT_MAPS > 0:
            for i in range(SEGMENT_MAPS):
                nh.prefetch_tensormap(maps.segments[i])
        if GLU:
            nh.prefetch_tensormap(maps.glu[0])
            nh.prefetch_tensormap(maps.glu[1])
        if AUX:
            nh.prefetch_tensormap(maps.aux[0])
            nh.prefetch_tensormap(maps.aux[1])

    return tensormaps, prefetch_tensormaps


def _map_pair(present, first):
    """``maps(p) -> (map, map)``: the addresses of the kernel parameters' tensor maps ``first`` and
    ``first + 1``, or () where the kernel has no such pair (``present`` false)."""

    @cuda.jit(device=True, forceinline=True)
    def maps(p):
        if present:
            return nh.tensormap_param_address(p.maps[first]), nh.tensormap_param_address(p.maps[first + 1])
        return ()

    return maps


def _schedules(cfg: GemmConfig, scheduler):
    """``(shared_schedule(p, slot), role_schedule(p, shared))``: where the CTA's schedule is
    computed. Before the roles split; a grouped kernel's (eight 64-bit values) by each role
    after ``setmaxnreg`` instead, as the producer could not keep it in its registers (grouped
    kernels run no clusters)."""
    GROUPED = cfg.grouped is not None

    @cuda.jit(device=True, forceinline=True)
    def shared_schedule(p, slot):
        if GROUPED:
            return 0
        return scheduler.work(p, slot)

    @cuda.jit(device=True, forceinline=True)
    def role_schedule(p, shared):
        if GROUPED:
            return scheduler.work(p, cuda.blockIdx.x)
        return shared

    return shared_schedule, role_schedule


def _producer(cfg: GemmConfig, mainloop, scheduler, tensormaps, role_schedule):
    """``producer(p, smem, tid, cta, work)``: warpgroup 0, whose elected thread loads the
    k-blocks of the CTA's work items."""
    BARRIERS = cfg.layout.barriers
    roles = warp_roles(cfg)
    TRADES, PRODUCER_REGS = roles.trades, roles.producer_regs

    @cuda.jit(device=True, forceinline=True)
    def producer(p, smem, tid, cta, work):
        if TRADES:
            nh.setmaxnreg_dec(PRODUCER_REGS)
        if tid < 32 and nh.elect_sync():
            tmaps, work = tensormaps(p), role_schedule(p, work)
            st = pipeline_start()
            item = scheduler.first(work)
            while item.tile < work.num_tiles:
                tile = scheduler.origin(work, item, cta.rm, cta.rn)
                st = mainloop.load(smem, smem + BARRIERS, st, tmaps, p, item, tile, cta)
                item = scheduler.next(work, item)
            # The CTA's last load is issued: the next kernel of the stream may start its set-up
            # (its CTAs take the SMs that free up, then wait in griddepcontrol.wait). Released at
            # the kernel's start instead, long products at M = 64-128 measured 5-19% slower.
            nh.griddepcontrol_launch_dependents()

    return producer


def _consumers(cfg: GemmConfig, pipe, mainloop, scheduler, epilogue, tensormaps, role_schedule):
    """``consumer(p, ep, smem, tid, cta, work)``: the consumer warpgroups' role, cooperative (each
    its 64 rows of every tile; ``cfg.overlaps_store``: each tile stored behind the next one's
    first k-block), or of two 64-row blocks (a 256-row tile's consumers, or ping-pong)."""
    BN, BARRIERS, PINGPONG = cfg.block_n, cfg.layout.barriers, cfg.pingpong
    roles = warp_roles(cfg)
    TRADES, CONSUMER_REGS = roles.trades, roles.consumer_regs

    @cuda.jit(device=True, forceinline=True)
    def consumer_of(tid):
        """This thread's :class:`Consumer`, after ``setmaxnreg``."""
        if TRADES:
            nh.setmaxnreg_inc(CONSUMER_REGS)
        # The kit's warp-uniform warpgroup index (lane 0's thread index, broadcast). Computed
        # from each thread's own index, ptxas would keep A's wgmma descriptors (which depend on
        # it) in vector registers and move them to uniform ones (R2UR) before every wgmma: 16
        # more instructions per k-block of every consumer warp. Grouped kernels, which branch
        # on a warpgroup's rows, would also lose the k-block loop's uniform registers
        # (WARPSYNC before each k-block): 1-16% slower, and 192-wide block-scaled ones spill.
        wg = warpgroup_index()
        t = tid - 128 * wg
        # (a 32-bit lane: the k-block loop's release test stays a 32-bit compare)
        return Consumer(wg - 1, t, np.int32(t % 32), thread_rows(t)[0], t == 0)

    @cuda.jit(device=True, forceinline=True)
    def cooperative_start(p, tid, work):
        """A cooperative consumer's ``(consumer, tensor maps, work, ring state, epilogue state,
        first item)``, its first turn handed out."""
        c = consumer_of(tid)
        tmaps, work = tensormaps(p), role_schedule(p, work)
        st = pipeline_start()
        stored = epilogue.start()
        mainloop.begin(c)
        return c, tmaps, work, st, stored, scheduler.first(work)

    @cuda.jit(device=True, forceinline=True)
    def consumer(p, ep, smem, tid, cta, work):
        c, tmaps, work, st, stored, item = cooperative_start(p, tid, work)
        acc = nh.wgmma_accumulator(BN, "f32")
        while item.tile < work.num_tiles:
            tile = scheduler.origin(work, item, cta.rm, cta.rn)
            terms = epilogue.begin_tile(smem, c, tile, c.cw, stored, tmaps, p, ep)
            acc, st = mainloop.mma(acc, smem, smem + BARRIERS, st, p, item, c, cta.peers, tile)
            frag = nh.tuple_as_array(acc)
            if scheduler.fixup(frag, work, item, p.workspace, c):
                stored = epilogue.store_tile(frag, smem, c, tile, c.cw, stored, tmaps, p, ep, terms)
            item = scheduler.next(work, item)
        epilogue.drain(c, stored, ep)

    @cuda.jit(device=True, forceinline=True)
    def overlapped_consumer(p, ep, smem, tid, cta, work):
        """(``cfg.overlaps_store``) ``consumer``, with each tile's first k-block issued before
        the previous tile's store, so the tensor cores work through the store: the tile is
        held (``epilogue.hold``: a plain 16-bit one as packed pairs, whose f32 registers the
        new accumulator takes; a promoted one's sums beside it). Nothing stays in flight
        across the loop's back edge (ptxas would serialize its wgmmas, C7514). The row and
        column terms (clamped reads) are read for the first item even on a CTA without one."""
        c, tmaps, work, st, stored, item = cooperative_start(p, tid, work)
        sums = nh.wgmma_accumulator(BN, "f32")
        tile = scheduler.origin(work, item, cta.rm, cta.rn)
        terms = epilogue.begin_tile(smem, c, tile, c.cw, stored, tmaps, p, ep)
        first = True
        while item.tile < work.num_tiles:
            held = epilogue.hold(sums)
            acc = mainloop.start(nh.wgmma_accumulator(BN, "f32"), smem, smem + BARRIERS, st, p, item, c)
            if not first:
                stored = epilogue.store_tile(nh.tuple_as_array(held), smem, c, tile, c.cw, stored, tmaps, p, ep,
                                             terms)
                tile = scheduler.origin(work, item, cta.rm, cta.rn)
                terms = epilogue.begin_tile(smem, c, tile, c.cw, stored, tmaps, p, ep)
            sums, st = mainloop.finish(acc, smem, smem + BARRIERS, st, p, item, c, cta.peers, tile)
            first = False
            item = scheduler.next(work, item)
        if not first:
            stored = epilogue.store_tile(nh.tuple_as_array(epilogue.hold(sums)), smem, c, tile, c.cw, stored, tmaps,
                                         p, ep, terms)
        epilogue.drain(c, stored, ep)

    @cuda.jit(device=True, forceinline=True)
    def passed_over(st, item, work):
        """(Ping-pong) the ring state and work item past ``item``, which the other consumer takes."""
        if item.tile < work.num_tiles:
            st = pipe.skip(st, item.k_end - item.k_begin)
            item = scheduler.next(work, item)
        return st, item

    @cuda.jit(device=True, forceinline=True)
    def two_block_consumer(p, ep, smem, tid, cta, work):
        """A consumer of two 64-row blocks: with ``cfg.pingpong``, consumer ``c.cw`` takes every
        other work item of the CTA's, first its ``c.cw``-th, computes the whole tile in its turn
        and stores it while the other consumer computes the next; on 256-row tiles, blocks
        ``2 * c.cw`` and ``2 * c.cw + 1`` of every tile."""
        c = consumer_of(tid)
        tmaps = tensormaps(p)
        acc = (nh.wgmma_accumulator(BN, "f32"), nh.wgmma_accumulator(BN, "f32"))
        st = pipeline_start()
        stored = epilogue.start()
        mainloop.begin(c)
        item = scheduler.first(work)
        if PINGPONG and c.cw == 1:
            st, item = passed_over(st, item, work)
        rows = 0 if PINGPONG else 2 * c.cw
        while item.tile < work.num_tiles:
            tile = scheduler.origin(work, item, cta.rm, cta.rn)
            upper = epilogue.begin_tile(smem, c, tile, rows, stored, tmaps, p, ep)
            lower = epilogue.begin_tile(smem, c, tile, rows + 1, stored, tmaps, p, ep)
            acc, st = mainloop.mma(acc, smem, smem + BARRIERS, st, p, item, c, cta.peers, tile)
            stored = epilogue.store_tile(nh.tuple_as_array(acc[0]), smem, c, tile, rows, stored, tmaps, p, ep, upper)
            stored = epilogue.store_tile(nh.tuple_as_array(acc[1]), smem, c, tile, rows + 1, stored, tmaps, p, ep,
                                         lower)
            item = scheduler.next(work, item)
            if PINGPONG:
                st, item = passed_over(st, item, work)
        epilogue.drain(c, stored, ep)

    if cfg.consumer_rows > WG_ROWS or PINGPONG:
        return two_block_consumer
    return overlapped_consumer if cfg.overlaps_store else consumer
