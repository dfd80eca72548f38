"""mbarrier intrinsics compile to the expected PTX and SYNCS SASS (CPU)."""

import numpy as np
from numba import cuda

from numba_hopper.intrinsics import (
    fence_mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_cluster,
    mbarrier_arrive_cluster_rank,
    mbarrier_arrive_expect_tx,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait_parity,
    shared_address,
)
from numba_hopper.tools.sass import inspect_kernel


@cuda.jit(launch_bounds=(128, 1))
def _mbarrier_kernel(out, n):
    bars = cuda.shared.array(4, np.uint64)
    b = shared_address(bars)
    if cuda.threadIdx.x == 0:
        mbarrier_init(b, 1)
        mbarrier_init(b + 8, 128)
        fence_mbarrier_init()
    cuda.syncthreads()
    mbarrier_arrive(b + 8)
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(b, 64)
        mbarrier_expect_tx(b, 16)
        mbarrier_complete_tx(b, 80)
    mbarrier_wait_parity(b, 0)  # two spin loops in one kernel: their labels must not clash
    mbarrier_wait_parity(b + 8, 0)
    t = mbarrier_try_wait_parity(b, 1)
    u = mbarrier_test_wait_parity(b + 8, 0)
    if n == 3:
        mbarrier_arrive_cluster(b + 16)
        mbarrier_arrive_cluster_rank(b + 24, n)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_inval(b)
    out[cuda.threadIdx.x] = t + 2 * u


def test_mbarrier_instructions_reach_ptx_and_sass():
    r = inspect_kernel(_mbarrier_kernel, "void(int32[::1], int32)")
    for ptx in (
        "mbarrier.init.shared::cta.b64",
        "fence.mbarrier_init.release.cluster;",
        "mbarrier.arrive.shared::cta.b64 _,",
        "mbarrier.arrive.expect_tx.shared::cta.b64 _,",
        "mbarrier.expect_tx.relaxed.cta.shared::cta.b64",
        "mbarrier.complete_tx.relaxed.cta.shared::cta.b64",
        "mbarrier.try_wait.parity.shared::cta.b64",
        "mbarrier.test_wait.parity.shared::cta.b64",
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _,",
        "mapa.shared::cluster.u32",
        "mbarrier.inval.shared::cta.b64",
    ):
        assert ptx in r.ptx, ptx
    assert r.count("SYNCS.EXCH.64") == 2  # init
    assert r.count("SYNCS.ARRIVE.TRANS64") >= 3  # arrive, arrive.expect_tx, expect_tx, complete_tx
    assert r.count("SYNCS.PHASECHK.TRANS64.TRYWAIT") >= 3  # two spin loops + try_wait
    assert r.count("SYNCS.PHASECHK.TRANS64") >= 1  # test_wait
    assert r.count("SYNCS.CCTL") == 1  # inval
    assert r.spill_bytes == 0 and r.stack_frame == 0
    assert not r.warnings
