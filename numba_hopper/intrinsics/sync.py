"""Synchronization: setmaxnreg, proxy fences, elect.sync, named barriers, trap.

``setmaxnreg_inc``/``setmaxnreg_dec`` only take effect when the kernel has a register cap
at entry: declare it with ``@cuda.jit(launch_bounds=(threads, 1))``; otherwise ptxas drops
them (see ``KernelReport.setmaxnreg_ignored``).
"""

from ._ptx import Const, ptx_intrinsic

__all__ = [
    "setmaxnreg_inc",
    "setmaxnreg_dec",
    "fence_proxy_async",
    "fence_proxy_async_shared_cluster",
    "fence_proxy_async_global",
    "elect_sync",
    "named_barrier_sync",
    "named_barrier_arrive",
    "trap",
]


def _check_maxnreg(v):
    if not (24 <= v <= 256) or v % 8:
        return f"must be a multiple of 8 in [24, 256] (setmaxnreg register count); got {v}"
    return None


setmaxnreg_inc = ptx_intrinsic(
    "setmaxnreg_inc",
    "setmaxnreg.inc.sync.aligned.u32 {n};",
    n=Const(_check_maxnreg),
    doc="PTX ISA setmaxnreg (miscellaneous instructions).inc: raise this warp's register count to ``n`` (warpgroup-"
    "collective; needs launch_bounds=(threads, 1)).",
)

setmaxnreg_dec = ptx_intrinsic(
    "setmaxnreg_dec",
    "setmaxnreg.dec.sync.aligned.u32 {n};",
    n=Const(_check_maxnreg),
    doc="PTX ISA setmaxnreg (miscellaneous instructions).dec: release registers down to ``n`` per thread (warpgroup-"
    "collective; needs launch_bounds=(threads, 1)).",
)

fence_proxy_async = ptx_intrinsic(
    "fence_proxy_async",
    "fence.proxy.async.shared::cta;",
    doc="PTX ISA 9.7.13.4 fence.proxy.async: order generic-proxy shared::cta accesses (st.shared, "
    "stmatrix) with async-proxy ones (wgmma, TMA).",
)

fence_proxy_async_shared_cluster = ptx_intrinsic(
    "fence_proxy_async_shared_cluster",
    "fence.proxy.async.shared::cluster;",
    doc="PTX ISA 9.7.13.4 fence.proxy.async for the shared::cluster state space.",
)

fence_proxy_async_global = ptx_intrinsic(
    "fence_proxy_async_global",
    "fence.proxy.async.global;",
    doc="PTX ISA 9.7.13.4 fence.proxy.async for the global state space.",
)

elect_sync = ptx_intrinsic(
    "elect_sync",
    "{ .reg .pred p; elect.sync _|p, 0xffffffff; selp.u32 {out}, 1, 0, p; }",
    result="bool",
    doc="PTX ISA 9.7.13.14 elect.sync: True in exactly one active lane of the (fully active) warp.",
)

named_barrier_sync = ptx_intrinsic(
    "named_barrier_sync",
    "bar.sync {barrier_id}, {nthreads};",
    barrier_id="u32",
    nthreads="u32",
    doc="PTX ISA 9.7.13.1 bar.sync: arrive at barrier ``barrier_id`` (0..15; 0 is syncthreads') and "
    "wait until ``nthreads`` threads (a multiple of 32) have arrived.",
)

named_barrier_arrive = ptx_intrinsic(
    "named_barrier_arrive",
    "bar.arrive {barrier_id}, {nthreads};",
    barrier_id="u32",
    nthreads="u32",
    doc="PTX ISA 9.7.13.1 bar.arrive: arrive at barrier ``barrier_id`` without waiting (producer side).",
)

trap = ptx_intrinsic(
    "trap",
    "trap;",
    doc="PTX ISA 9.7.19.3 trap: abort the kernel with an error the host sees at its next "
    "synchronization (the CUDA context is unusable afterwards).",
)
