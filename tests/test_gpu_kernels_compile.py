"""The GPU tests' kernels compile for sm_90a (CPU): typing errors show up without a GPU."""

import pytest

import test_intrinsics_gpu as g
from numba_hopper.tools.sass import inspect_kernel

SS_ARGS = "uint32[::1], int64, int64, int64, int64, int64, int64, int64, int64, int64, int64"


@pytest.mark.parametrize(
    "make, sig, opcode",
    [
        (lambda: g._ss_kernel(64, "f16", "f16", "f16", 1, 1), f"void({SS_ARGS}, uint32[:, ::1])", "HGMMA"),
        (lambda: g._ss_kernel(256, "s32", "s8", "u8", 0, 0), f"void({SS_ARGS}, int32[:, ::1])", "IGMMA"),
        (lambda: g._rs_kernel(128, "f32", "e4m3", "e5m2", 0), "void(uint32[::1], uint32[:, ::1], int64, int64, int64, "
         "float32[:, ::1])", "QGMMA"),
        (lambda: g._rs_ldmatrix_kernel(64), "void(uint32[::1], int64, float32[:, ::1])", "LDSM"),
        (lambda: g._twice_kernel(), "void(uint32[::1], int64, int64, float32[:, ::1])", "HGMMA"),
        (lambda: g._stmatrix_kernel, "void(uint32[:, ::1], uint32[:, ::1], uint32[:, :, ::1])", "STSM"),
        (lambda: g._phase_kernel, "void(uint8[:, ::1], int32[::1], int64)", "SYNCS"),
        (lambda: g._tx_kernel, "void(uint8[::1], int32[::1])", "SYNCS"),
        (lambda: g._cluster_arrive_kernel, "void(uint8[::1])", "SYNCS"),
        (lambda: g._named_barrier_kernel, "void(int32[:, ::1], int64)", "BAR"),
        (lambda: g._smem_kernel, "void(uint32[::1])", "STS"),
    ],
)
def test_gpu_test_kernel_compiles(make, sig, opcode):
    r = inspect_kernel(make(), sig)
    assert r.count(opcode) >= 1 and r.spill_bytes == 0, r.summary()


def test_warp_specialized_gpu_kernel_keeps_setmaxnreg():
    r = inspect_kernel(g._warp_specialized_kernel, "void(uint32[::1], int64, int64, float32[:, :, ::1])")
    assert r.count("USETMAXREG") == 2 and not r.setmaxnreg_ignored
    assert r.count("HGMMA") >= 1 and r.spill_bytes == 0, r.summary()


def test_a_tensor_map_passed_by_value_is_read_in_param_space():
    """A TensorMapArg parameter is a 64-byte-aligned 128-byte .param whose address TMA takes in
    place (cvta.param), with no copy to local memory."""
    import test_tma_gpu as t
    from numba.cuda import types

    from numba_hopper.runtime.tensormap import TENSORMAP_ARG

    r = inspect_kernel(t.load2d_by_value_kernel, (TENSORMAP_ARG, types.int32[:, :], types.int64, types.uint32[:, :]))
    assert ".param .align 64 .b8" in r.ptx and "[128]" in r.ptx and "cvta.param.u64" in r.ptx
    assert r.count("UTMALDG") == 1 and r.stack_frame == 0 and r.spill_bytes == 0, r.summary()

