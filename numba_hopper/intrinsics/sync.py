"""Synchronization: setmaxnreg, proxy fences, elect.sync, named barriers, warp reductions, grid
dependency control (programmatic dependent launch), trap.

``setmaxnreg_inc``/``setmaxnreg_dec`` only take effect when the kernel has a register cap
at entry: declare it with ``@cuda.jit(launch_bounds=(threads, 1))``; otherwise ptxas drops
them (see ``KernelReport.setmaxnreg_ignored``).
"""

from ._ptx import Const, ptx_asm, u32

__all__ = [
    "setmaxnreg_inc",
    "setmaxnreg_dec",
    "fence_proxy_async",
    "fence_proxy_async_shared_cluster",
    "fence_proxy_async_global",
    "elect_sync",
    "named_barrier_sync",
    "named_barrier_arrive",
    "redux_sync_max_u32",
    "griddepcontrol_wait",
    "griddepcontrol_launch_dependents",
    "trap",
]


def _check_maxnreg(v):
    if not (24 <= v <= 256) or v % 8:
        return f"must be a multiple of 8 in [24, 256] (setmaxnreg register count); got {v}"
    return None


@ptx_asm("setmaxnreg.inc.sync.aligned.u32 {n};")
def setmaxnreg_inc(n: Const(_check_maxnreg)):
    """PTX ISA 9.7.19 Miscellaneous Instructions: setmaxnreg.inc: raise this warp's register
    count to ``n`` (warpgroup-collective; needs launch_bounds=(threads, 1)).
    """


@ptx_asm("setmaxnreg.dec.sync.aligned.u32 {n};")
def setmaxnreg_dec(n: Const(_check_maxnreg)):
    """PTX ISA 9.7.19 Miscellaneous Instructions: setmaxnreg.dec: release registers down to ``n``
    per thread (warpgroup-collective; needs launch_bounds=(threads, 1)).
    """


@ptx_asm("fence.proxy.async.shared::cta;")
def fence_proxy_async():
    """PTX ISA 9.7.13.4 fence.proxy.async: order generic-proxy shared::cta accesses (st.shared,
    stmatrix) with async-proxy ones (wgmma, TMA).
    """


@ptx_asm("fence.proxy.async.shared::cluster;")
def fence_proxy_async_shared_cluster():
    """PTX ISA 9.7.13.4 fence.proxy.async for the shared::cluster state space."""


@ptx_asm("fence.proxy.async.global;")
def fence_proxy_async_global():
    """PTX ISA 9.7.13.4 fence.proxy.async for the global state space."""


@ptx_asm("{ .reg .pred p; elect.sync _|p, 0xffffffff; selp.u32 {out}, 1, 0, p; }")
def elect_sync() -> bool:
    """PTX ISA 9.7.13.14 elect.sync: True in exactly one active lane of the (fully active) warp."""


@ptx_asm("bar.sync {barrier_id}, {nthreads};")
def named_barrier_sync(barrier_id: u32, nthreads: u32):
    """PTX ISA 9.7.13.1 bar.sync: arrive at barrier ``barrier_id`` (0..15; 0 is syncthreads') and
    wait until ``nthreads`` threads (a multiple of 32) have arrived.
    """


@ptx_asm("bar.arrive {barrier_id}, {nthreads};")
def named_barrier_arrive(barrier_id: u32, nthreads: u32):
    """PTX ISA 9.7.13.1 bar.arrive: arrive at barrier ``barrier_id`` without waiting (producer
    side).
    """


@ptx_asm("redux.sync.max.u32 {out}, {x}, 0xffffffff;")
def redux_sync_max_u32(x: u32) -> u32:
    """PTX ISA 9.7.13.11 redux.sync: the maximum of ``x`` over the warp's 32 lanes (all must
    call it)."""


@ptx_asm("griddepcontrol.wait;")
def griddepcontrol_wait():
    """PTX ISA 9.7.13 griddepcontrol.wait: wait until the grids this one depends on have
    completed and their memory is visible. A kernel launched as a programmatic dependent
    (``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``) may start before the previous
    kernel of its stream ends, so it executes this before it reads what that kernel wrote or
    writes what it reads. Without the attribute it returns at once.
    """


@ptx_asm("griddepcontrol.launch_dependents;")
def griddepcontrol_launch_dependents():
    """PTX ISA 9.7.13 griddepcontrol.launch_dependents: the next grid of the stream, if it was
    launched as a programmatic dependent, may start once every CTA of this grid has executed
    this or exited (it still waits for this grid's memory in its ``griddepcontrol.wait``).
    """


@ptx_asm("trap;")
def trap():
    """PTX ISA 9.7.19.3 trap: abort the kernel with an error the host sees at its next
    synchronization (the CUDA context is unusable afterwards).
    """
