"""Debug mode on a CPU: release kernels carry none of its code, debug kernels all of it."""

import pytest
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.runtime.debug import debug_enabled
from numba_hopper.errors import PipelineHangError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.kit.pipeline import PipelineState, consumer_wait, debug_site, pipeline_init, producer_acquire
from numba_hopper.tools.sass import inspect_kernel

DEBUG_OPCODES = ("BPT.TRAP", "ATOMG.E.CAS")  # trap; the record's compare-and-swap


def _has_globaltimer(report):
    return "SR_GLOBALTIMER" in report.sass


def test_release_gemm_has_no_debug_code_and_debug_gemm_has_it():
    # (The debug code is the pipeline's bounded waits: the operands' majors do not change it.)
    cfg = GemmConfig()
    release = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    debug = inspect_kernel(make_gemm_kernel(GemmConfig(debug=True)), gemm_argument_types(cfg))
    assert not any(release.count(op) for op in DEBUG_OPCODES) and not _has_globaltimer(release)
    assert all(debug.count(op) for op in DEBUG_OPCODES) and _has_globaltimer(debug), debug.summary()
    # (The debug build may spill: the producer's timer loop runs in 40 registers, and the
    # consumers' bounded waits run beside a tile held for its store.)
    assert debug.count("HGMMA") == release.count("HGMMA") and release.spill_bytes == 0


def _waits_kernel(with_pipeline, debug=False):
    """The same waits through pipeline.py (site None or a DebugSite) or as raw intrinsics."""

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(out, record, n):
        bars = nh.dynamic_shared_base()
        if cuda.threadIdx.x == 0:
            pipeline_init(bars, 4, 1)
        cuda.syncthreads()
        st = PipelineState(0, 0)
        for kb in range(n):
            if with_pipeline:
                site = debug_site(record, 0, kb) if debug else None
                producer_acquire(bars, 4, st, site)
                consumer_wait(bars, st, site)
            else:
                nh.mbarrier_wait_parity(bars + 8 * (4 + st.stage), st.phase ^ 1)
                nh.mbarrier_wait_parity(bars + 8 * st.stage, st.phase)
            st = PipelineState((st.stage + 1) % 4, st.phase ^ (st.stage == 3))
        out[0] = 1

    return kernel


def test_release_pipeline_waits_compile_to_the_raw_waits():
    sig = "void(int32[::1], int64, int32)"
    raw = inspect_kernel(_waits_kernel(False), sig)
    release = inspect_kernel(_waits_kernel(True), sig)
    debug = inspect_kernel(_waits_kernel(True, debug=True), sig)
    assert release.opcodes == raw.opcodes
    assert debug.count("BPT.TRAP") and debug.count("ATOMG") and _has_globaltimer(debug)


def test_bounded_wait_and_trap_reach_ptx():
    r = inspect_kernel(_waits_kernel(True, debug=True), "void(int32[::1], int64, int32)")
    assert "%globaltimer" in r.ptx and "trap;" in r.ptx and "atom.global.cas.b32" in r.ptx
    assert "st.volatile.global.u32" in r.ptx and "membar.sys" in r.ptx


@pytest.mark.parametrize("value,expected", [(None, False), ("0", False), ("", False), ("1", True)])
def test_debug_env_var(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("NUMBA_HOPPER_DEBUG", raising=False)
    else:
        monkeypatch.setenv("NUMBA_HOPPER_DEBUG", value)
    assert debug_enabled() is expected
    assert debug_enabled(True) is True and debug_enabled(False) is False


def test_pipeline_hang_error_names_role_and_slot():
    rec = dict(role="producer", slot=2, phase=1, barrier=0x1f040, tile=7, k_block=12, block=3, thread=0)
    err = PipelineHangError(rec, "CUDA_ERROR_LAUNCH_FAILED", 2.0)
    assert isinstance(err, RuntimeError) and err.role == "producer" and err.slot == 2 and err.k_block == 12
    assert "producer waited 2 s on empty[slot 2]" in str(err) and "tile 7" in str(err)
