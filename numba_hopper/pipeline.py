"""The TMA producer/consumer ring buffer, as device functions over mbarriers.

A pipeline of ``stages`` slots has two mbarriers per slot, laid out from ``bars`` (a 32-bit
shared address, 8-byte aligned):

- ``full[s]``  at ``bars + 8*s``: arrival count 1 (the producer's ``arrive.expect_tx``)
  plus the transaction bytes the TMA loads deliver (their ``complete_tx``);
- ``empty[s]`` at ``bars + 8*(stages + s)``: one arrival per consumer (``consumer_arrivals``
  fixed at init).

Both sides walk the slots with a :class:`PipelineState` ``(stage, phase)``: the stage wraps
at ``stages`` and the phase flips when it does. The state runs on across output tiles of a
persistent kernel and is never reset (seed 000, section 7.4: resetting it per tile makes
the producer and consumers disagree about parity after a tile whose k-block count is not a
multiple of ``stages``). The producer waits on ``empty`` with the opposite parity, so its
first pass over the fresh barriers does not block (CuTe's ``make_producer_start_state``).

Usage, as in CuTe's ``PipelineTmaAsync``::

    # producer (one elected thread)                 # consumers
    producer_acquire(bars, STAGES, st)              consumer_wait(bars, st)
    full = producer_commit(bars, st, TX_BYTES)      ... wgmma on slot st.stage ...
    tma_load_2d(dst, tmap, x, y, full)              consumer_release(bars, STAGES, st)
    st = pipeline_advance(st, STAGES)               st = pipeline_advance(st, STAGES)
"""

from collections import namedtuple

from numba import cuda

from .intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)

__all__ = [
    "PipelineState",
    "pipeline_barrier_bytes",
    "pipeline_init",
    "pipeline_advance",
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
]

PipelineState = namedtuple("PipelineState", ["stage", "phase"])


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
def pipeline_advance(state, stages):
    """The next slot's state: the stage wraps at ``stages`` and the phase flips when it does."""
    # (A field named "index" would be shadowed by numba's tuple.index method.)
    stage = state.stage + 1
    if stage == stages:
        return PipelineState(0, state.phase ^ 1)
    return PipelineState(stage, state.phase)


@cuda.jit(device=True, forceinline=True)
def producer_acquire(bars, stages, state):
    """Wait until every consumer has released slot ``state.stage``."""
    mbarrier_wait_parity(bars + 8 * (stages + state.stage), state.phase ^ 1)


@cuda.jit(device=True, forceinline=True)
def producer_commit(bars, state, tx_bytes):
    """Arm ``full[state.stage]`` for ``tx_bytes`` of TMA data; return its address.

    The TMA loads issued next complete the phase through ``complete_tx`` on that barrier.
    """
    full = bars + 8 * state.stage
    mbarrier_arrive_expect_tx(full, tx_bytes)
    return full


@cuda.jit(device=True, forceinline=True)
def consumer_wait(bars, state):
    """Wait until the data of slot ``state.stage`` has landed."""
    mbarrier_wait_parity(bars + 8 * state.stage, state.phase)


@cuda.jit(device=True, forceinline=True)
def consumer_release(bars, stages, state):
    """Give slot ``state.stage`` back to the producer (one arrival of ``consumer_arrivals``)."""
    mbarrier_arrive(bars + 8 * (stages + state.stage))
