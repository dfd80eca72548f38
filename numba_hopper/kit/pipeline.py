"""The TMA producer/consumer ring buffer, as device functions over mbarriers.

A pipeline of ``stages`` slots has two mbarriers per slot, laid out from ``bars`` (a 32-bit
shared address, 8-byte aligned):

- ``full[s]``  at ``bars + 8*s``: arrival count 1 (the producer's ``arrive.expect_tx``)
  plus the transaction bytes the TMA loads deliver (their ``complete_tx``);
- ``empty[s]`` at ``bars + 8*(stages + s)``: one arrival per consumer (``consumer_arrivals``
  fixed at init).

Both sides walk the slots with a :class:`PipelineState` ``(stage, phase)``, two 32-bit
integers from :func:`pipeline_start`: the stage wraps at ``stages`` and the phase flips when
it does. The state runs on across output tiles of a persistent kernel and is never reset (as
CUTLASS's ``PipelineState``: resetting it per tile makes the producer and consumers disagree
about parity after a tile whose k-block count is not a multiple of ``stages``). The producer
waits on ``empty`` with the opposite parity, so its first pass over the fresh barriers does
not block (CuTe's ``make_producer_start_state``).

:func:`make_tma_pipeline` bundles these for one ring (stage count, arrivals, bytes per
slot, cluster peers) as a :class:`TmaPipeline` of device functions, the way a kernel uses
it. The functions below are its parts, also usable on their own::

    st = pipeline_start()                           st = pipeline_start()
    # producer (one elected thread)                 # consumers
    producer_acquire(bars, STAGES, st)              consumer_wait(bars, st)
    full = producer_commit(bars, st, TX_BYTES)      ... wgmma on slot st.stage ...
    tma_load_2d(dst, tmap, x, y, full)              consumer_release(bars, STAGES, st)
    st = pipeline_advance(st, STAGES)               st = pipeline_advance(st, STAGES)

Debug builds: ``producer_acquire`` and ``consumer_wait`` take an optional ``site``, a
:class:`DebugSite` built by ``debug_site(record, tile, k_block)`` (the address of a debug
record, the tile and the k-block being waited for). With ``site=None`` (the default, and
what release kernels pass) a wait spins without bound and compiles to a plain wait: numba
prunes the ``site is None`` branch at compile time. With a site the wait gives up after
``DEBUG_TIMEOUT_NS``; the first thread in the grid to give up fills the record (fields
``numba_hopper.runtime.debug.RECORD_FIELDS``, one ``uint32`` each) and every thread that gives up traps. ``numba_hopper.runtime.debug.DebugRecord`` allocates the record in
host-mapped memory, which the host can still read once the trap has killed the context.
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


def make_tma_pipeline(stages, consumer_arrivals, tx_bytes, cluster_size=1) -> TmaPipeline:
    """One TMA ring as a :class:`TmaPipeline` of device functions (CuTe DSL's
    ``PipelineTmaAsync``), which owns its stage count, its arrivals, the bytes a slot's
    loads deliver and the signalling between the CTAs of a cluster::

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

    @cuda.jit(device=True, forceinline=True)
    def init(bars):
        pipeline_init(bars, stages, consumer_arrivals)

    @cuda.jit(device=True, forceinline=True)
    def acquire(bars, state, site):
        producer_acquire(bars, stages, state, site)
        return producer_commit(bars, state, tx_bytes)

    @cuda.jit(device=True, forceinline=True)
    def wait(bars, state, site):
        consumer_wait(bars, state, site)

    @cuda.jit(device=True, forceinline=True)
    def release(bars, state, peers):
        if cluster_size == 1:
            consumer_release(bars, stages, state)
        else:
            for rank in range(cluster_size):
                if (peers >> rank) & 1:
                    consumer_release_in(bars, stages, state, rank)

    @cuda.jit(device=True, forceinline=True)
    def advance(state):
        return pipeline_advance(state, stages)

    @cuda.jit(device=True, forceinline=True)
    def skip(state, slots):
        return pipeline_skip(state, slots, stages)

    return TmaPipeline(init, acquire, wait, release, advance, skip)
