"""sync intrinsics: setmaxnreg, proxy fences, elect.sync, named barriers, grid dependency control (CPU)."""

import pytest
from numba import cuda

from numba_hopper.intrinsics import (
    elect_sync,
    fence_proxy_async,
    fence_proxy_async_global,
    fence_proxy_async_shared_cluster,
    griddepcontrol_launch_dependents,
    griddepcontrol_wait,
    named_barrier_arrive,
    named_barrier_sync,
    redux_sync_max_u32,
    setmaxnreg_dec,
    setmaxnreg_inc,
)
from numba_hopper.tools.sass import inspect_kernel


def _warp_specialized(out):
    if cuda.threadIdx.x // 128 == 0:
        setmaxnreg_dec(40)
    else:
        setmaxnreg_inc(232)
    out[cuda.threadIdx.x] = 1


def test_setmaxnreg_with_launch_bounds_reaches_sass():
    r = inspect_kernel(cuda.jit(launch_bounds=(384, 1))(_warp_specialized), "void(int32[::1])")
    assert "setmaxnreg.dec.sync.aligned.u32 40;" in r.ptx
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in r.ptx
    assert r.count("USETMAXREG") == 2
    assert not r.setmaxnreg_ignored and not r.warnings


def test_setmaxnreg_without_launch_bounds_is_reported_ignored():
    r = inspect_kernel(cuda.jit(_warp_specialized), "void(int32[::1])")
    assert r.count("USETMAXREG") == 0
    assert r.setmaxnreg_ignored
    assert any("C7508" in w and "setmaxnreg" in w for w in r.warnings), r.link_log


@pytest.mark.parametrize("n", [250, 16, 264, 0])
def test_setmaxnreg_rejects_bad_counts(n):
    src = f"def k(out):\n    setmaxnreg_inc({n})\n    out[0] = 1\n"
    ns = {"setmaxnreg_inc": setmaxnreg_inc}
    exec(src, ns)
    with pytest.raises(Exception, match=rf"setmaxnreg_inc: 'n' must be a multiple of 8 in \[24, 256\].*got {n}"):
        inspect_kernel(cuda.jit(launch_bounds=(128, 1))(ns["k"]), "void(int32[::1])")


def test_setmaxnreg_rejects_run_time_count():
    @cuda.jit(launch_bounds=(128, 1))
    def k(out, n):
        setmaxnreg_dec(n)
        out[0] = 1

    with pytest.raises(Exception, match="setmaxnreg_dec: 'n' must be a compile-time integer constant"):
        inspect_kernel(k, "void(int32[::1], int32)")


@cuda.jit(launch_bounds=(256, 1))
def _sync_kernel(out, n):
    if elect_sync():
        out[cuda.threadIdx.x] = 1
    fence_proxy_async()
    fence_proxy_async_shared_cluster()
    fence_proxy_async_global()
    if cuda.threadIdx.x < 128:
        named_barrier_arrive(1, 256)
    else:
        named_barrier_sync(1, 256)
    named_barrier_sync(n, 128)  # run-time barrier id


def test_sync_instructions_reach_ptx_and_sass():
    r = inspect_kernel(_sync_kernel, "void(int32[::1], int32)")
    for ptx in (
        "elect.sync _|p, 0xffffffff;",
        "fence.proxy.async.shared::cta;",
        "fence.proxy.async.shared::cluster;",
        "fence.proxy.async.global;",
        "bar.arrive ",
        "bar.sync ",
    ):
        assert ptx in r.ptx, ptx
    assert r.count("ELECT") == 1
    assert r.count("FENCE.VIEW.ASYNC.S") >= 1 and r.count("FENCE.VIEW.ASYNC.G") == 1
    assert r.count("BAR.ARV") == 1
    assert r.count("BAR.SYNC") >= 2
    assert r.spill_bytes == 0


def test_redux_sync_max_is_one_warp_reduction():
    @cuda.jit
    def k(out, x):
        out[cuda.threadIdx.x] = redux_sync_max_u32(x[cuda.threadIdx.x])

    r = inspect_kernel(k, "void(uint32[::1], uint32[::1])")
    assert "redux.sync.max.u32" in r.ptx and r.count("REDUX.MAX") >= 1


def test_griddepcontrol_waits_before_the_load_and_releases_dependents_after_the_store():
    @cuda.jit
    def k(out, x):
        griddepcontrol_wait()
        out[cuda.threadIdx.x] = x[cuda.threadIdx.x] + 1
        griddepcontrol_launch_dependents()

    r = inspect_kernel(k, "void(uint32[::1], uint32[::1])")
    assert "griddepcontrol.wait;" in r.ptx and "griddepcontrol.launch_dependents;" in r.ptx
    assert r.count("ACQBULK") == 1 and r.count("PREEXIT") == 1
    # the asm's memory clobber keeps the load after the wait and the store before the release
    sass = r.sass
    assert sass.index("ACQBULK") < sass.index("LDG") < sass.index("STG") < sass.index("PREEXIT")
