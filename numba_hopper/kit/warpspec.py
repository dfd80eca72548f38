"""The warp-specialized skeleton: a producer warpgroup and consumer warpgroups, their
register budget, the warp-uniform warpgroup index and barrier set-up with its fences.

A warp-specialized CTA is ``1 + consumers`` warpgroups of 128 threads. Warpgroup 0, the
producer, issues TMA loads from one elected thread and needs few registers; warpgroups
``1 .. consumers`` run wgmmas and hold accumulators. ``setmaxnreg`` moves registers between
them (PTX ISA 9.7.19 "setmaxnreg"): the kernel is compiled for
``launch_bounds=(threads, 1)``, which gives every thread ``65536 / threads`` registers
(rounded down to 8); the producer gives some back (``setmaxnreg.dec``) and the consumers
take them (``setmaxnreg.inc``)::

    threads   at launch   producer   consumers
    384       168         40         232  (= (3 * 168 - 40) / 2, rounded down to 8)
    512       128         40         152  (= (4 * 128 - 40) / 3, rounded down to 8)
    256       255         -          -    (one consumer: nothing to trade)

``KernelReport.registers`` shows the launch bound (168 above), not the 232 the consumers run
with; :class:`WarpSpecialization` states both. A consumer count that asks for more registers
than the producer frees never completes (``setmaxnreg.inc`` waits for them): the budget is
checked on the host.

**Warp-uniform warpgroup index.** ``warpgroup_index()`` is ``threadIdx.x // 128`` broadcast
from lane 0 (``shfl.sync``): ptxas then knows every lane of a warp has the same value.
Computed from ``threadIdx.x`` alone, each consumer's descriptors, which depend on it, live in
vector registers and are copied to uniform ones (``R2UR``) before every wgmma, and branches on
it put a ``WARPSYNC`` before the wgmmas (``KernelReport.warpsync_before_wgmma``).

**The skeleton.** :func:`warp_specialization` checks a split and builds the kernel body::

    ws = warp_specialization(consumers=2, producer_regs=40)   # 384 threads, 40 / 232
    body = ws.body(init, producer, consumer)

    @cuda.jit(launch_bounds=ws.launch_bounds)
    def kernel(...):
        body((smem, tmap_a, ...))        # args: one tuple, passed to the three functions

``init(args)`` runs on thread 0 (mbarrier inits, tensor-map prefetches), then
``fence.mbarrier_init`` and a barrier over the CTA (over the cluster when
``cluster_size > 1``: no peer multicasts into a barrier before it exists). Then warpgroup 0
runs ``producer(args)`` after ``setmaxnreg.dec``, and consumer warpgroup ``cw`` (0-based)
runs ``consumer(cw, t, args)`` after ``setmaxnreg.inc`` (``t``: its thread in the
warpgroup; both int32). In a cluster every thread meets at a last cluster barrier, so no CTA
exits while a peer may still arrive on its barriers or multicast into it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..intrinsics import cluster_sync, fence_mbarrier_init, setmaxnreg_dec, setmaxnreg_inc

__all__ = ["WarpSpecialization", "warp_specialization", "warpgroup_index", "register_budget",
           "REGISTERS_PER_SM", "MAX_REGISTERS"]

REGISTERS_PER_SM = 65536  # a CTA of launch_bounds(threads, 1) may use them all
MAX_REGISTERS = 256  # setmaxnreg's ceiling (a thread addresses at most 255)


@cuda.jit(device=True, forceinline=True)
def warpgroup_index():
    """``threadIdx.x // 128``, warp-uniform (lane 0's, broadcast by ``shfl.sync``)."""
    return cuda.shfl_sync(0xFFFFFFFF, cuda.threadIdx.x, 0) // 128


def register_budget(consumers, producer_regs=40):
    """``(at_launch, producer, consumer)`` registers per thread for one producer warpgroup
    and ``consumers`` consumer warpgroups under ``launch_bounds(128 * (1 + consumers), 1)``.

    ``at_launch = 65536 // threads`` rounded down to 8 (at most 255: what ptxas compiles every
    thread for);
    ``consumer`` is the consumers' share of the launch's registers (counted in setmaxnreg's
    multiples of 8) once the producer keeps ``producer_regs``, rounded down to 8, at most
    256. Raises ``ValueError`` (the rule and the fix) for a producer count not a multiple of
    8 in [24, the launch's]."""
    if not isinstance(consumers, int) or not 1 <= consumers <= 7:
        raise ValueError(f"consumers must be 1..7 warpgroups (a CTA has at most 1024 threads); got {consumers!r}")
    threads = 128 * (1 + consumers)
    granted = min(MAX_REGISTERS, REGISTERS_PER_SM // threads // 8 * 8)  # (allocated in units of 8)
    at_launch = min(255, granted)
    if not isinstance(producer_regs, int) or producer_regs % 8 or not 24 <= producer_regs <= granted:
        raise ValueError(f"producer_regs must be a multiple of 8 in [24, {granted}] (setmaxnreg takes multiples of "
                         f"8 from 24; the producer can only give registers back); got {producer_regs!r}")
    consumer = min(MAX_REGISTERS, (granted * (1 + consumers) - producer_regs) // consumers // 8 * 8)
    return at_launch, producer_regs, consumer


@dataclass(frozen=True)
class WarpSpecialization:
    """A checked producer/consumer split (:func:`warp_specialization`): ``consumers``
    warpgroups beside one producer warpgroup, ``threads`` in all, ``launch_bounds`` for
    ``@cuda.jit``, ``cluster_size`` CTAs per cluster, and the registers a thread has
    ``at_launch`` and after ``setmaxnreg``: ``producer_regs``, ``consumer_regs``. With one
    consumer no registers move (``trades`` is False) and no ``setmaxnreg`` is emitted."""

    consumers: int
    cluster_size: int
    at_launch: int
    producer_regs: int
    consumer_regs: int

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def launch_bounds(self) -> tuple:
        return self.threads, 1

    @property
    def trades(self) -> bool:
        return self.consumers > 1

    def body(self, init, producer, consumer):
        """The kernel body ``body(args)`` (module doc) over the user's device functions
        ``init(args)``, ``producer(args)`` and ``consumer(cw, t, args)``."""
        CLUSTER, TRADES = self.cluster_size, self.trades
        PRODUCER_REGS, CONSUMER_REGS = self.producer_regs, self.consumer_regs

        @cuda.jit(device=True, forceinline=True)
        def body(args):
            tid = cuda.threadIdx.x
            if tid == 0:
                init(args)
                fence_mbarrier_init()  # the inits are visible to the cluster and the async proxy
            if CLUSTER > 1:
                cluster_sync()
            else:
                cuda.syncthreads()
            wg = warpgroup_index()
            if wg == 0:
                if TRADES:
                    setmaxnreg_dec(PRODUCER_REGS)
                producer(args)
            else:
                if TRADES:
                    setmaxnreg_inc(CONSUMER_REGS)
                consumer(np.int32(wg - 1), np.int32(tid - 128 * wg), args)  # (32-bit: cheaper compares)
            if CLUSTER > 1:
                cuda.syncwarp()
                cluster_sync()

        return body


def warp_specialization(consumers=2, producer_regs=40, cluster_size=1) -> WarpSpecialization:
    """Check a split of one producer and ``consumers`` consumer warpgroups and return its
    :class:`WarpSpecialization` (registers from :func:`register_budget`; ``producer_regs``
    is ignored with one consumer, which keeps the launch's registers)."""
    if not isinstance(cluster_size, int) or not 1 <= cluster_size <= 16:
        raise ValueError(f"cluster_size must be 1..16 CTAs; got {cluster_size!r}")
    if consumers == 1:
        at_launch = register_budget(1, 24)[0]
        return WarpSpecialization(1, cluster_size, at_launch, at_launch, at_launch)  # (no setmaxnreg)
    return WarpSpecialization(consumers, cluster_size, *register_budget(consumers, producer_regs))
