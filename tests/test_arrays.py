"""device_view on fakes: the CUDA array interface, torch-like and CuPy-like objects, host arrays."""

import numpy as np
import pytest

from numba_hopper.runtime.arrays import DeviceView, device_view

from _fakes import FakeCAI


def test_contiguous_cai_array():
    v = device_view(FakeCAI((4, 6), "<f4"))
    assert v == DeviceView(0x7F0000000000, (4, 6), (6, 1), "f32", 4, v.device, "cai")
    assert v.byte_strides == (24, 4)
    assert v.ndim == 2


def test_strided_cai_array_strides_in_elements():
    v = device_view(FakeCAI((3, 4, 5), "<u2", strides=(4096, 64, 2)))
    assert v.strides == (2048, 32, 1)
    assert v.dtype == "u16" and v.itemsize == 2


@pytest.mark.parametrize(
    "typestr, name",
    [("|u1", "u8"), ("|i1", "i8"), ("<f2", "f16"), ("<i4", "i32"), ("<f8", "f64"), ("<u4", "u32"), ("<i8", "i64")],
)
def test_cai_dtypes(typestr, name):
    assert device_view(FakeCAI((16,), typestr)).dtype == name


def test_bf16_override_over_uint16_and_fp8_over_uint8():
    assert device_view(FakeCAI((8, 8), "<u2"), dtype="bf16").dtype == "bf16"
    assert device_view(FakeCAI((8, 8), "|u1"), dtype="e4m3").dtype == "e4m3"
    assert device_view(FakeCAI((8, 8), "|u1"), dtype="e5m2").dtype == "e5m2"
    assert device_view(FakeCAI((8, 8), "<f4"), dtype="tf32").dtype == "tf32"


def test_tf32_is_never_inferred():
    assert device_view(FakeCAI((8,), "<f4")).dtype == "f32"


def test_override_must_keep_the_item_size():
    with pytest.raises(ValueError, match="does not match"):
        device_view(FakeCAI((8,), "<f4"), dtype="bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        device_view(FakeCAI((8,), "<f4"), dtype="float32")


def test_unsupported_dtype_names_the_bf16_route():
    with pytest.raises(TypeError, match="bf16"):
        device_view(FakeCAI((8,), "<c8"))


def test_byte_strides_must_be_whole_elements():
    with pytest.raises(ValueError, match="whole elements"):
        device_view(FakeCAI((4, 4), "<f4", strides=(18, 4)))


def test_masked_arrays_are_refused():
    with pytest.raises(TypeError, match="mask"):
        device_view(FakeCAI((4,), "<f4", mask=object()))


def test_host_numpy_array_is_a_clear_type_error():
    with pytest.raises(TypeError, match="host"):
        device_view(np.zeros((4, 4), np.float32))


def test_non_array_is_a_type_error():
    with pytest.raises(TypeError, match="not a CUDA device array"):
        device_view([1, 2, 3])


def test_device_view_passes_through_with_override():
    v = device_view(FakeCAI((8,), "<u2"))
    assert device_view(v) is v
    assert device_view(v, dtype="bf16").dtype == "bf16"


# --- torch- and CuPy-like objects (recognised by their type's module) ------------------


class _TorchDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class _TorchDevice:
    def __init__(self, type_, index):
        self.type, self.index = type_, index


class FakeTensor:
    def __init__(self, shape, stride, dtype, device=("cuda", 1), ptr=0x7E0000000000):
        self.shape = shape
        self._stride = stride
        self.dtype = _TorchDtype(dtype)
        self.device = _TorchDevice(*device)
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._stride


FakeTensor.__module__ = "torch"


@pytest.mark.parametrize(
    "torch_name, name", [("bfloat16", "bf16"), ("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"), ("float16", "f16")]
)
def test_torch_tensor_dtypes_without_the_array_interface(torch_name, name):
    v = device_view(FakeTensor((32, 64), (128, 1), torch_name))
    assert v.dtype == name and v.framework == "torch"
    assert v.strides == (128, 1) and v.shape == (32, 64)
    assert v.device == 1 and v.ptr == 0x7E0000000000


def test_cpu_torch_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="cuda"):
        device_view(FakeTensor((4,), (1,), "float32", device=("cpu", None)))


class FakeCupyArray:
    """What device_view reads of a cupy.ndarray (never its array interface)."""

    def __init__(self, shape, dtype, strides=None, ptr=0x7F0000000000, device=3):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.strides = strides or tuple(int(s) for s in np.empty(shape, self.dtype).strides)
        self.data = type("MemoryPointer", (), {"ptr": ptr})()
        self.device = type("Device", (), {"id": device})()


FakeCupyArray.__module__ = "cupy._core.core"


def test_cupy_like_array_gets_its_device_from_the_array():
    v = device_view(FakeCupyArray((8, 8), "<f2"))
    assert v.framework == "cupy" and v.device == 3 and v.dtype == "f16"


def test_cupy_bfloat16_by_dtype_name_and_uint16_override():
    class Bfloat16Dtype:  # ml_dtypes.bfloat16 as CuPy 14 reports it: named, opaque typestr
        name, itemsize, str = "bfloat16", 2, "<V2"

    a = FakeCupyArray((4, 6), "<u2", strides=(24, 2))
    a.dtype = Bfloat16Dtype()
    v = device_view(a)
    assert (v.dtype, v.shape, v.strides) == ("bf16", (4, 6), (12, 1))
    assert device_view(FakeCupyArray((4, 6), "<u2"), dtype="bf16").dtype == "bf16"


@pytest.mark.parametrize("shape,strides,merged", [
    ((2, 3, 8), (24, 8, 1), ((6, 8), (8, 1))),          # contiguous activations (batch, tokens, K)
    ((2, 3, 8), (48, 16, 1), ((6, 8), (16, 1))),        # padded rows: their pitch is kept
    ((1, 3, 1, 8), (99, 8, 5, 1), ((3, 8), (8, 1))),    # dimensions of one are never stepped
    ((1, 1, 8), (64, 7, 1), ((1, 8), (7, 1))),          # a single row
    ((1, 6, 8), (48, 1, 6), ((6, 8), (1, 6))),          # column-major rows (a transposed (K, M))
    ((2, 0, 8), (0, 8, 1), ((0, 8), (8, 1))),           # empty
])
def test_merge_rows_reads_leading_dimensions_as_rows(shape, strides, merged):
    from numba_hopper.runtime.arrays import merge_rows

    v = merge_rows(device_view(FakeCAI(shape, "<f2", strides=tuple(2 * s for s in strides))))
    assert (v.shape, v.strides) == merged


@pytest.mark.parametrize("shape,strides", [((2, 3, 8), (8, 16, 1)),    # leading dimensions transposed
                                           ((2, 3, 8), (40, 8, 1)),    # a gap between batch items
                                           ((2, 6, 8), (48, 1, 6))])   # column-major items, two of them
def test_merge_rows_refuses_dimensions_that_do_not_merge(shape, strides):
    from numba_hopper.runtime.arrays import merge_rows

    assert merge_rows(device_view(FakeCAI(shape, "<f2", strides=tuple(2 * s for s in strides)))) is None
