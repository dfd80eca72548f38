"""validate_launch with fake device limits, stream handles from fake stream objects."""

import ctypes

import pytest

from numba_hopper.runtime import launch as L
from numba_hopper.runtime.launch import DeviceLimits, as_stream_handle, validate_launch

H100 = DeviceLimits(device=0, cc=(9, 0), sm_count=132)  # defaults are the H100's limits
AMPERE = DeviceLimits(device=1, cc=(8, 0), sm_count=108, max_shared_per_block_optin=166912)


def test_dims_are_normalized_to_three():
    d = validate_launch(8, (128, 2), 2, 0, H100)
    assert d.grid == (8, 1, 1) and d.block == (128, 2, 1) and d.cluster == (2, 1, 1)
    assert validate_launch((4, 4, 2), 384, None, 1024, H100).cluster is None


def test_non_hopper_device_is_refused():
    with pytest.raises(ValueError, match="compute capability 8.0.*Hopper"):
        validate_launch(1, 32, None, 0, AMPERE)


@pytest.mark.parametrize(
    "grid, cluster, message",
    [
        (6, 4, r"cluster dimension x = 4 does not divide grid dimension 6"),
        ((8, 3), (2, 2), r"cluster dimension y = 2 does not divide grid dimension 3"),
        (16, 16, r"cluster \(16, 1, 1\) has 16 CTAs; at most 8.*non_portable_cluster=True"),
        ((8, 8), (4, 4), r"has 16 CTAs; at most 8"),
        (9, 9, r"has 9 CTAs"),
        (4, 0, r"cluster dimensions must be >= 1"),
        (4, (1, 2, 3, 4), r"cluster must be an int or a tuple of 1-3 ints"),
    ],
)
def test_bad_cluster_shapes(grid, cluster, message):
    with pytest.raises(ValueError, match=message):
        validate_launch(grid, 128, cluster, 0, H100)


def test_non_portable_cluster_allows_sixteen_not_more():
    assert validate_launch(32, 128, 16, 0, H100, non_portable_cluster=True).cluster == (16, 1, 1)
    with pytest.raises(ValueError, match="has 32 CTAs; at most 16"):
        validate_launch(64, 128, (16, 2), 0, H100, non_portable_cluster=True)


def test_device_without_cluster_launch():
    limits = DeviceLimits(device=0, cc=(9, 0), sm_count=132, cluster_launch=False)
    with pytest.raises(ValueError, match="does not support cluster launch"):
        validate_launch(2, 32, 2, 0, limits)


@pytest.mark.parametrize(
    "block, message",
    [
        (1025, r"1025 threads; the device allows at most 1024"),
        ((32, 32, 2), r"2048 threads"),
        ((1, 1, 65), r"block dimension z = 65 exceeds the device limit 64"),
        (0, r"block dimensions must be >= 1"),
        ((), r"block must be an int or a tuple of 1-3 ints"),
        (128.0, r"block must be an int or a tuple"),
    ],
)
def test_bad_blocks(block, message):
    with pytest.raises(ValueError, match=message):
        validate_launch(1, block, None, 0, H100)


def test_grid_limits():
    with pytest.raises(ValueError, match="grid dimension y = 65536 exceeds"):
        validate_launch((1, 65536), 32, None, 0, H100)
    with pytest.raises(ValueError, match="grid dimensions must be >= 1"):
        validate_launch(0, 32, None, 0, H100)


def test_shared_memory_up_to_the_opt_in_limit():
    assert validate_launch(1, 128, None, 232448, H100).shared_mem == 232448
    with pytest.raises(ValueError, match="shared_mem = 232449 bytes exceeds the 232448 bytes"):
        validate_launch(1, 128, None, 232449, H100)


def test_static_shared_memory_counts_against_the_limit():
    with pytest.raises(ValueError, match=r"exceeds the 228352 bytes.*minus the kernel's 4096 bytes of static"):
        validate_launch(1, 128, None, 230000, H100, static_shared=4096)


def test_negative_shared_memory():
    with pytest.raises(ValueError, match="non-negative"):
        validate_launch(1, 128, None, -1, H100)


# --- cuda.core grid units ---------------------------------------------------------------


def test_grid_in_blocks_is_converted_to_clusters_for_cuda_core():
    d = validate_launch((8, 4, 2), 128, (2, 2, 1), 0, H100)
    assert L._core_grid(d, grid_counts_clusters=True) == (4, 2, 2)
    assert L._core_grid(d, grid_counts_clusters=False) == (8, 4, 2)
    plain = validate_launch((8, 4, 2), 128, None, 0, H100)
    assert L._core_grid(plain, grid_counts_clusters=True) == (8, 4, 2)


@pytest.mark.parametrize("version, clusters", [("0.3.2", False), ("0.4.0", True), ("1.2.2", True), ("0.10.1", True)])
def test_cuda_core_version_decides_the_grid_unit(monkeypatch, version, clusters):
    import cuda.core

    monkeypatch.setattr(cuda.core, "__version__", version)
    L._core_grid_counts_clusters.cache_clear()
    try:
        assert L._core_grid_counts_clusters() is clusters
    finally:
        L._core_grid_counts_clusters.cache_clear()


# --- streams --------------------------------------------------------------------------


class CoreLikeStream:  # cuda.core.Stream, numba Stream: __cuda_stream__() -> (version, handle)
    def __init__(self, h):
        self.h = h

    def __cuda_stream__(self):
        return (0, self.h)


class TorchLikeStream:
    cuda_stream = 0x1234


class CupyLikeStream:
    ptr = 0x5678


class _CUstreamLike:
    def __int__(self):
        return 0x9ABC


class HandleStream:
    handle = _CUstreamLike()


class CtypesHandleStream:
    handle = ctypes.c_void_p(0xDEF0)


class NullCtypesHandleStream:
    handle = ctypes.c_void_p(None)


@pytest.mark.parametrize(
    "stream, handle",
    [
        (None, 0),
        (0, 0),
        (0x42, 0x42),
        (CoreLikeStream(0x77), 0x77),
        (CoreLikeStream(_CUstreamLike()), 0x9ABC),
        (TorchLikeStream(), 0x1234),
        (CupyLikeStream(), 0x5678),
        (HandleStream(), 0x9ABC),
        (CtypesHandleStream(), 0xDEF0),
        (NullCtypesHandleStream(), 0),
    ],
)
def test_as_stream_handle(stream, handle):
    assert as_stream_handle(stream) == handle


def test_as_stream_handle_rejects_other_objects():
    with pytest.raises(TypeError, match="cannot get a CUDA stream handle from str"):
        as_stream_handle("default")
    with pytest.raises(TypeError, match="bool"):
        as_stream_handle(True)
    with pytest.raises(ValueError, match="negative"):
        as_stream_handle(-1)


# --- dynamic shared memory opt-in, once per kernel and device ---------------------------


def test_opt_in_is_set_once_per_kernel_and_device_for_the_largest_size(monkeypatch):
    calls = []
    monkeypatch.setattr(L, "_set_kernel_attribute", lambda h, dev, name, v: calls.append((int(h), dev, name, v)))
    monkeypatch.setattr(L, "_dyn_smem_set", {})
    monkeypatch.setattr(L, "_non_portable_set", set())

    class K:
        handle = 0xAB

    L._opt_in(K, 0, 100_000, False)
    L._opt_in(K, 0, 100_000, False)
    L._opt_in(K, 0, 50_000, False)  # smaller: already covered
    L._opt_in(K, 1, 50_000, False)  # another device
    L._opt_in(K, 0, 200_000, True)
    L._opt_in(K, 0, 200_000, True)
    L._opt_in(K, 0, 0, False)
    assert calls == [
        (0xAB, 0, "MAX_DYNAMIC_SHARED_SIZE_BYTES", 100_000),
        (0xAB, 1, "MAX_DYNAMIC_SHARED_SIZE_BYTES", 50_000),
        (0xAB, 0, "MAX_DYNAMIC_SHARED_SIZE_BYTES", 200_000),
        (0xAB, 0, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1),
    ]


def test_packed_parameters_become_ctypes_values():
    """numba packs array fields as Python ints; cuLaunchKernelEx needs addressable values."""
    import ctypes

    from numba_hopper._numba_internals import _as_ctypes

    assert _as_ctypes(5).value == 5 and ctypes.sizeof(_as_ctypes(5)) == 8  # intptr_t
    assert isinstance(_as_ctypes(True), ctypes.c_bool) and _as_ctypes(0.5).value == 0.5
    kept = ctypes.c_int32(3)
    assert _as_ctypes(kept) is kept
    with pytest.raises(TypeError, match="kernel parameter"):
        _as_ctypes("x")


# --- the gemm's small kernels: launched by prepare_launch, not by numba's launch ----------
#
# numba warns "Grid size N will likely result in GPU under-utilization" (NumbaPerformanceWarning)
# when a launch is configured through the dispatcher, ``kernel[grid, block]``
# (numba.cuda.dispatcher._LaunchConfiguration, for fewer than 128 blocks). A gemm's copy and
# split-K reduce launches are small; they must go through prepare_launch (cuLaunchKernelEx),
# which never configures a numba launch, so a gemm call prints nothing.


@pytest.fixture
def no_driver(monkeypatch):
    """prepare_launch with the driver faked: an H100's limits, kernels compiled for sm_90a
    without a GPU, and cuLaunchKernelEx recording (grid, block) instead of launching."""
    import contextlib

    from cuda.bindings import driver
    from numba import cuda
    from numba.cuda import api
    from numba.cuda.cudadrv import devices
    from numba.cuda.dispatcher import CUDADispatcher

    from numba_hopper import _numba_internals as internals

    def refuse(self, *args, **kwargs):
        raise AssertionError("a numba launch configuration: numba's launch path, and its warning")

    launched = []

    def launch_ex(cfg, func, params, extra):
        launched.append(((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ)))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(devices._runtime, "ensure_context", contextlib.nullcontext)  # device arrays of fake pointers
    monkeypatch.setattr(api, "current_context", lambda: None)
    monkeypatch.setattr(cuda, "get_current_device", lambda: type("Device", (), {"id": 0})())
    monkeypatch.setattr(L, "device_limits", lambda device=0: H100)
    monkeypatch.setattr(internals, "kernel_for_args",
                        lambda d, args: internals.compile_kernel(d, internals.arg_types(d, args), (9, 0, "a")))
    monkeypatch.setattr(internals, "cu_kernel", lambda kernel: type("CoreKernel", (), {"handle": 0})())
    monkeypatch.setattr(internals, "static_shared_bytes", lambda kernel: 0)
    monkeypatch.setattr(driver, "cuLaunchKernelEx", launch_ex)
    monkeypatch.setattr(CUDADispatcher, "configure", refuse)
    return launched


def _view(shape, strides, dtype, itemsize, ptr=1 << 30):
    from numba_hopper.runtime.arrays import DeviceView

    return DeviceView(ptr, shape, strides, dtype, itemsize, 0, "numba")


def test_numba_warns_on_its_own_launch_of_a_small_grid():
    """What the gemm's launches avoid (numba needs no GPU to configure a launch)."""
    import warnings

    from numba.cuda.core.errors import NumbaPerformanceWarning

    from numba_hopper.kernels.elementwise import copy_matrices

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy_matrices[(1, 1), (8, 32)]
    assert any(issubclass(w.category, NumbaPerformanceWarning) and "Grid size 1 " in str(w.message) for w in caught)


def test_copy_and_split_k_reduce_launch_without_numbas_launch_or_its_warning(no_driver):
    import warnings

    from numba_hopper.matmul.extra_launches import prepare_copy, prepare_reduce

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning, NumbaPerformanceWarning included, fails the test
        copy = prepare_copy(_view((5, 7), (7, 1), "bf16", 2), _view((5, 7), (8, 1), "bf16", 2, ptr=1 << 31))
        copy(0)
        reduce = prepare_reduce(_view((2, 5, 8), (40, 8, 1), "f32", 4), _view((5, 7), (8, 1), "bf16", 2, ptr=1 << 31))
        reduce(0)
    assert isinstance(copy, L.PreparedLaunch) and isinstance(reduce, L.PreparedLaunch)
    assert no_driver == [((1, 1, 1), (8, 32, 1)), ((1, 1, 1), (32, 8, 1))]  # one block each: numba would warn


def test_scaled_split_k_reduce_binds_each_calls_scales(no_driver):
    """The reduce of a scale-only epilogue: alpha and the scale vectors (a stride-0 per-tensor
    one, an absent one) are rebound from each call's values like the partials and out."""
    from numba_hopper.matmul import plan as _plan

    partials = _plan.Operand(_view((2, 5, 8), (40, 8, 1), "f32", 4, ptr=0), _plan.Src(_plan.SCRATCH, 256))
    out = _plan.Operand(_view((5, 7), (8, 1), "bf16", 2), _plan.Src(_plan.OUT))
    ALPHA, ROW_SCALE = _plan.VALUE_INDEX["alpha"], _plan.VALUE_INDEX["row_scale"]
    rows = _plan.Operand(_view((5,), (0,), "f32", 4), _plan.Src(ROW_SCALE))
    values = [0] * _plan.USER
    values[_plan.SCRATCH], values[_plan.OUT], values[ALPHA], values[ROW_SCALE] = 1 << 32, 1 << 31, 0.5, 1 << 30
    launch, binds = _plan._Reduce(partials, out, _plan.Src(ALPHA), rows).prepare(values)
    launch(0, values, binds)
    assert sorted((index, offset) for _, index, offset in binds) == sorted([
        (_plan.SCRATCH, 256), (_plan.OUT, 0), (ALPHA, 0), (ROW_SCALE, 0)])
    assert no_driver == [((1, 1, 1), (32, 8, 1))]


def test_dependent_launch_sets_programmatic_serialization_beside_the_cluster():
    from cuda.bindings import driver

    ids = driver.CUlaunchAttributeID
    cluster_dim, pdl = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    kernel = type("CoreKernel", (), {"handle": 0})()
    for cluster, dependent, want in ((None, False, []), (None, True, [pdl]), (2, True, [cluster_dim, pdl])):
        dims = validate_launch(4, 128, cluster, 0, H100)
        cfg = L.PreparedLaunch(kernel, None, [], dims, 0, dependent=dependent)._driver_config(0)
        assert [a.id for a in cfg.attrs[:cfg.numAttrs]] == want
        if dependent:
            assert cfg.attrs[-1].value.programmaticStreamSerializationAllowed == 1
