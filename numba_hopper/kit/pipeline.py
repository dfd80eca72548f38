"""TMA producer/consumer rings over mbarriers, as device functions.

**A ring** (:func:`make_ring`, CuTe DSL's ``PipelineTmaAsync``) of ``stages`` slots has two
mbarriers per slot, laid out from ``bars`` (a 32-bit shared address, 8-byte aligned;
``ring.barrier_bytes`` = ``16 * stages`` of shared memory):

- ``full[s]``  at ``bars + 8*s``: arrival count 1 (the producer's ``arrive.expect_tx``)
  plus the transaction bytes the TMA loads deliver (their ``complete_tx``);
- ``empty[s]`` at ``bars + 8*(stages + s)``: ``consumer_arrivals`` arrivals, the number of
  threads that release each slot (say one elected lane per consumer warp: 4 per consumer
  warpgroup; in a cluster whose peers multicast into the slot, times the CTAs that write it).

Both sides walk the slots with a :class:`PipelineState` ``(stage, phase)``, two 32-bit
integers from ``ring.start()``: the stage wraps at ``stages`` and the phase flips when it
does. The state runs on across the work items of a persistent kernel and is never reset (as
CUTLASS's ``PipelineState``: resetting it per tile makes the producer and consumers disagree
about parity after a tile whose k-block count is not a multiple of ``stages``). The producer
waits on ``empty`` with the opposite parity, so its first pass over the fresh barriers does
not block (CuTe's ``make_producer_start_state``)::

    ring = make_ring(stages=4, consumer_arrivals=8, tx_bytes=A_BYTES + B_BYTES)
    ring.init(bars)                           # one thread; then the block synchronizes
    st = ring.start()
    # producer (one elected thread)           # consumers
    full = ring.acquire(bars, st)             ring.wait(bars, st)
    tma_load_3d(a_dst, tmap_a, ..., full)     ... wgmma on slot st.stage, wait_group ...
    tma_load_3d(b_dst, tmap_b, ..., full)     if lane == 0: ring.release(bars, st)
    st = ring.advance(st)                     st = ring.advance(st)

``acquire`` waits until every consumer released the slot and arms ``full`` for the ring's
``tx_bytes`` (``acquire_bytes(bars, st, n)`` arms it for ``n``: a slot whose loads vary).
Each ring has its own barriers, so a kernel runs several independent rings (attention's K and
V: QK^T starts once K has landed, whatever V does) by giving each its own ``bars`` region.
In a cluster, ``release_to(bars, st, peers)`` arrives on the slot's ``empty`` barrier in every
CTA whose bit is set in ``peers`` (their producers multicast into this CTA's slot).

The free functions below (``pipeline_init``, ``producer_acquire``, ...) are the ring's
parts, taking the stage count as an argument; :func:`make_tma_pipeline` bundles them as a
:class:`TmaPipeline` (the GEMM's form).

Debug builds: ``acquire``, ``wait`` (and ``producer_acquire``, ``consumer_wait``) take an
optional ``site``, a :class:`DebugSite` built by ``debug_site(record, tile, k_block)`` (the
address of a debug record, the tile and the k-block being waited for). With ``site=None``
(the default) a wait has no bound and compiles to a plain wait: numba prunes the
``site is None`` branch at compile time. With a site the wait gives up after
``DEBUG_TIMEOUT_NS``; the first thread in the grid to give up fills the record (fields
``numba_hopper.runtime.debug.RECORD_FIELDS``, one ``uint32`` each) and every thread that
gives up traps. ``numba_hopper.runtime.debug.DebugRecord`` allocates the record in
host-mapped memory, which the host can still read once the trap has killed the context.

PTX ISA 9.7.13.15 "mbarrier" (phases, ``expect_tx``/``complete_tx``), 9.7.9.25.5.2
"cp.async.bulk.tensor".
"""

from collections import namedtuple

import numpy as np
from numba import cuda

from ..intrinsics import (
    atom_cas_global_u32,
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster_rank,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    mbarrier_wait_parity_timeout,
    st_global_u32,
    trap,
)
from ..runtime.debug import CONSUMER, DEBUG_TIMEOUT_NS, PRODUCER

__all__ = [
    "PipelineState",
    "DebugSite",
    "debug_site",
    "pipeline_barrier_bytes",
    "pipeline_init",
    "pipeline_start",
    "pipeline_advance",
    "pipeline_skip",
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
    "consumer_release_in",
    "TmaPipeline",
    "make_tma_pipeline",
    "Ring",
    "make_ring",
]

PipelineState = namedtuple("PipelineState", ["stage", "phase"])
DebugSite = namedtuple("DebugSite", ["record", "tile", "k_block"])


def pipeline_barrier_bytes(stages):
    """Shared memory the barriers of a ``stages``-deep pipeline take (host side)."""
    return 16 * stages


@cuda.jit(device=True, forceinline=True)
def pipeline_init(bars, stages, consumer_arrivals):
    """Initialize every barrier; call from ONE thread, then synchronize the block."""
    for s in range(stages):
        mbarrier_init(bars + 8 * s, 1)
        mbarrier_init(bars + 8 * (stages + s), consumer_arrivals)
    fence_mbarrier_init()


@cuda.jit(device=True, forceinline=True)
def pipeline_start():
    """The state of a ring's first slot, on its first pass."""
    return PipelineState(np.uint32(0), np.uint32(0))


@cuda.jit(device=True, forceinline=True)
def pipeline_advance(state, stages):
    """The next slot's state: the stage wraps at ``stages`` and the phase flips when it does."""
    # (A field named "index" would be shadowed by numba's tuple.index method.) numba widens
    # integer arithmetic to 64 bits; the casts keep the state in 32-bit registers.
    stage = np.uint32(state.stage + 1)
    if stage == stages:
        return PipelineState(np.uint32(0), np.uint32(state.phase ^ 1))
    return PipelineState(stage, np.uint32(state.phase))


@cuda.jit(device=True, forceinline=True)
def pipeline_skip(state, slots, stages):
    """The state ``slots`` slots on (``slots`` >= 0): another consumer's k-blocks passed over."""
    stage = np.uint32(state.stage + slots)
    laps = stage // np.uint32(stages)
    return PipelineState(np.uint32(stage - laps * np.uint32(stages)), np.uint32(state.phase ^ (laps & 1)))


@cuda.jit(device=True, forceinline=True)
def debug_site(record, tile, k_block):
    """A :class:`DebugSite` of fixed field types, whatever integer types the caller has."""
    return DebugSite(np.int64(record), np.int64(tile), np.int64(k_block))


@cuda.jit(device=True, forceinline=True)  # a call would spill the consumers' accumulators
def _report_hang(site, role, bar, state, parity):
    """Fill the debug record if no thread has yet (first failure wins), then trap."""
    rec = site.record
    if atom_cas_global_u32(rec, 0, 1) == 0:
        st_global_u32(rec + 4, role)
        st_global_u32(rec + 8, state.stage)
        st_global_u32(rec + 12, parity)
        st_global_u32(rec + 16, bar)
        st_global_u32(rec + 20, site.tile)
        st_global_u32(rec + 24, site.k_block)
        st_global_u32(rec + 28, cuda.blockIdx.x)
        st_global_u32(rec + 32, cuda.threadIdx.x)
        cuda.threadfence_system()  # the record reaches host memory before the trap
    trap()


@cuda.jit(device=True, forceinline=True)
def _wait(bar, parity, site, role, state):
    if site is None:  # release build: resolved at compile time
        mbarrier_wait_parity(bar, parity)
    elif not mbarrier_wait_parity_timeout(bar, parity, DEBUG_TIMEOUT_NS):
        _report_hang(site, role, bar, state, parity)


@cuda.jit(device=True, forceinline=True)
def producer_acquire(bars, stages, state, site=None):
    """Wait until every consumer has released slot ``state.stage``."""
    _wait(bars + 8 * (stages + state.stage), state.phase ^ 1, site, PRODUCER, state)


@cuda.jit(device=True, forceinline=True)
def producer_commit(bars, state, tx_bytes):
    """Arm ``full[state.stage]`` for ``tx_bytes`` of TMA data; return its address.

    The TMA loads issued next complete the phase through ``complete_tx`` on that barrier.
    """
    full = bars + 8 * state.stage
    mbarrier_arrive_expect_tx(full, tx_bytes)
    return full


@cuda.jit(device=True, forceinline=True)
def consumer_wait(bars, state, site=None):
    """Wait until the data of slot ``state.stage`` has landed."""
    _wait(bars + 8 * state.stage, state.phase, site, CONSUMER, state)


@cuda.jit(device=True, forceinline=True)
def consumer_release(bars, stages, state):
    """Give slot ``state.stage`` back to the producer (one arrival of ``consumer_arrivals``)."""
    mbarrier_arrive(bars + 8 * (stages + state.stage))


@cuda.jit(device=True, forceinline=True)
def consumer_release_in(bars, stages, state, cta_rank):
    """:func:`consumer_release` on the pipeline of CTA ``cta_rank`` of the cluster.

    A producer that multicasts into its peers' slots must hear from their consumers too.
    """
    mbarrier_arrive_cluster_rank(bars + 8 * (stages + state.stage), cta_rank)


TmaPipeline = namedtuple("TmaPipeline", ["init", "producer_acquire", "consumer_wait", "consumer_release", "advance",
                                         "skip"])


Ring = namedtuple("Ring", ["stages", "consumer_arrivals", "tx_bytes", "barrier_bytes", "init", "start", "acquire",
                           "acquire_bytes", "wait", "release", "release_to", "advance", "skip"])
Ring.__doc__ = """One TMA ring (:func:`make_ring`): its host-side numbers ``stages``, ``consumer_arrivals``,
``tx_bytes`` and ``barrier_bytes`` (the shared memory of its barriers), and its device functions
``init(bars)``, ``start()``, ``acquire(bars, st, site=None) -> full``, ``acquire_bytes(bars, st, n,
site=None) -> full``, ``wait(bars, st, site=None)``, ``release(bars, st)``, ``release_to(bars, st,
peers)``, ``advance(st)`` and ``skip(st, n)`` (the module doc shows them in use)."""


def make_ring(stages, *, consumer_arrivals, tx_bytes, cluster_size=1) -> Ring:
    """A :class:`Ring` of ``stages`` slots whose ``empty`` barriers take ``consumer_arrivals``
    arrivals and whose ``full`` barriers expect ``tx_bytes`` (what one slot's TMA loads
    deliver: the sum of their boxes' bytes, out-of-bounds fill included) from ``acquire``.

    ``consumer_arrivals`` counts the threads that call ``release`` (or ``release_to``) for
    each slot, over every CTA whose consumers read a slot this CTA's producer fills or whose
    producer fills this CTA's slot: a count too high deadlocks, one too low lets the producer
    overwrite a slot still being read. ``cluster_size``: CTAs in the cluster (``release_to``
    addresses their barriers). Values are checked here, before any compilation.
    """
    for name, value, low, high in (("stages", stages, 1, 64), ("consumer_arrivals", consumer_arrivals, 1, 2**20 - 1),
                                   ("tx_bytes", tx_bytes, 0, 2**20 - 1), ("cluster_size", cluster_size, 1, 16)):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"make_ring: {name} must be an int in [{low}, {high}] (mbarrier counts: PTX ISA "
                             f"mbarrier.init and expect-tx ranges); got {value!r}")

    @cuda.jit(device=True, forceinline=True)
    def init(bars):
        pipeline_init(bars, stages, consumer_arrivals)

    @cuda.jit(device=True, forceinline=True)
    def acquire(bars, state, site=None):
        producer_acquire(bars, stages, state, site)
        return producer_commit(bars, state, tx_bytes)

    @cuda.jit(device=True, forceinline=True)
    def acquire_bytes(bars, state, nbytes, site=None):
        producer_acquire(bars, stages, state, site)
        return producer_commit(bars, state, nbytes)

    @cuda.jit(device=True, forceinline=True)
    def wait(bars, state, site=None):
        consumer_wait(bars, state, site)

    @cuda.jit(device=True, forceinline=True)
    def release(bars, state):
        consumer_release(bars, stages, state)

    @cuda.jit(device=True, forceinline=True)
    def release_to(bars, state, peers):
        for rank in range(cluster_size):
            if (peers >> rank) & 1:
                consumer_release_in(bars, stages, state, rank)

    @cuda.jit(device=True, forceinline=True)
    def advance(state):
        return pipeline_advance(state, stages)

    @cuda.jit(device=True, forceinline=True)
    def skip(state, slots):
        return pipeline_skip(state, slots, stages)

    return Ring(stages, consumer_arrivals, tx_bytes, pipeline_barrier_bytes(stages), init, pipeline_start, acquire,
                acquire_bytes, wait, release, release_to, advance, skip)


def make_tma_pipeline(stages, consumer_arrivals, tx_bytes, cluster_size=1) -> TmaPipeline:
    """One TMA ring as a :class:`TmaPipeline`: the :class:`Ring` of :func:`make_ring` with
    positional debug sites and a release that goes to the cluster's peers when there is a
    cluster::

        pipe.init(bars)                                  # one thread, then a barrier
        full = pipe.producer_acquire(bars, st, site)     # slot free; full armed for tx_bytes
        ... TMA loads of slot st.stage, completing on full ...
        pipe.consumer_wait(bars, st, site)               # slot's data landed
        pipe.consumer_release(bars, st, peers)           # one arrival per consumer warp
        st = pipe.advance(st)
        st = pipe.skip(st, n)                            # n slots on (ping-pong: the other consumer's)

    ``site``: None, or a :class:`DebugSite` for a bounded wait. ``peers``: the mask of cluster
    ranks whose producers write into this CTA's slots (multicast); each of them hears this
    release. Without a cluster the release is local and ``peers`` is unused.
    """
    ring = make_ring(stages, consumer_arrivals=consumer_arrivals, tx_bytes=tx_bytes, cluster_size=cluster_size)

    @cuda.jit(device=True, forceinline=True)
    def release(bars, state, peers):
        if cluster_size == 1:
            ring.release(bars, state)
        else:
            ring.release_to(bars, state, peers)

    return TmaPipeline(ring.init, ring.acquire, ring.wait, release, ring.advance, ring.skip)
