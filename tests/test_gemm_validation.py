"""gemm() refuses bad input with a specific exception before launching anything (CPU).

Arrays are FakeCAI objects (no memory behind them); where a check needs a GPU-only step
(the device, the launch) that step is monkeypatched.
"""

import numpy as np
import pytest
from _fakes import FakeCAI

import numba_hopper.matmul.api as g
import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper.errors import (
    DeviceMismatchError,
    DtypeError,
    LayoutError,
    NumbaHopperError,
    OverlapError,
    ShapeError,
    UnsupportedDeviceError,
)
from numba_hopper.runtime.arrays import device_view
from numba_hopper import gemm

BASE = 0x7F0000000000


def _m(rows, cols, typestr="<f2", ptr=BASE, strides=None):
    return FakeCAI((rows, cols), typestr, ptr=ptr, strides=strides)


def _ab(M=4, N=4, K=8):
    """Two f16 inputs far apart in memory."""
    return _m(M, K), _m(K, N, ptr=BASE + (1 << 30))


def _out(M=4, N=4, typestr="<f2", **kw):
    return _m(M, N, typestr, ptr=kw.pop("ptr", BASE + (2 << 30)), **kw)


@pytest.mark.parametrize("exc,base", [(DtypeError, TypeError), (ShapeError, ValueError), (LayoutError, ValueError),
                                      (OverlapError, ValueError), (DeviceMismatchError, ValueError),
                                      (UnsupportedDeviceError, RuntimeError)])
def test_errors_subclass_the_builtin_ones(exc, base):
    assert issubclass(exc, base) and issubclass(exc, NumbaHopperError)


def test_wrong_ndim():
    with pytest.raises(ShapeError, match="a must be 2-D"):
        gemm(FakeCAI((8,), "<f2"), _m(8, 4))
    with pytest.raises(ShapeError, match="b must be 2-D"):
        gemm(_m(4, 8), FakeCAI((2, 8, 4), "<f2"))


def test_activations_of_more_dimensions_are_checked_as_their_rows():
    b = _m(8, 4, ptr=BASE + (1 << 30))
    with pytest.raises(ShapeError, match=r"a is \(2, 3, 6\), b is \(8, 4\)"):
        gemm(FakeCAI((2, 3, 6), "<f2"), b)
    with pytest.raises(LayoutError, match=r"leading dimensions \(2, 3\) do not merge"):
        gemm(FakeCAI((2, 3, 8), "<f2", strides=(16, 32, 2)), b)
    with pytest.raises(ShapeError, match=r"out has shape \(6, 4\), expected \(2, 3, 4\)"):
        gemm(FakeCAI((2, 3, 8), "<f2"), b, out=_out(6, 4))
    with pytest.raises(ShapeError, match=r"c has shape \(6, 4\), expected \(2, 3, 4\)"):
        gemm(FakeCAI((2, 3, 8), "<f2"), b, c=_out(6, 4), beta=1.0)


def test_unsupported_dtype():
    with pytest.raises(DtypeError, match="a.dtype must be one of"):
        gemm(_m(4, 8, "<f4"), _m(8, 4, "<f4"))


def test_dtype_mismatch():
    b = device_view(_m(8, 4, "<u2", ptr=BASE + (1 << 30)), dtype="bf16")  # bf16 as numba holds it
    with pytest.raises(DtypeError, match="same dtype"):
        gemm(_m(4, 8), b)


def test_shape_mismatch():
    with pytest.raises(ShapeError, match="shape mismatch"):
        gemm(_m(4, 8), _m(9, 4))


def test_host_arrays():
    with pytest.raises(TypeError, match="host \\(CPU\\) array"):
        gemm(np.zeros((4, 8), np.float16), np.zeros((8, 4), np.float16))


def test_unsupported_out_dtype_argument():
    with pytest.raises(DtypeError, match="out_dtype"):
        gemm(*_ab(), out_dtype="i8")


def test_out_wrong_shape():
    with pytest.raises(ShapeError, match="out has shape"):
        gemm(*_ab(), out=_out(4, 5))


def test_out_wrong_dtype():
    with pytest.raises(DtypeError, match="out.dtype"):
        gemm(*_ab(), out=_out(typestr="<i4"))


def test_out_dtype_disagrees_with_out():
    # out_dtype re-reads out's storage (bf16 over uint16), so it must have out's item size.
    with pytest.raises(ValueError, match="dtype override 'f16'.*'f32' storage"):
        gemm(*_ab(), out=_out(typestr="<f4"), out_dtype="f16")


def test_out_broadcast_layout():
    with pytest.raises(LayoutError, match="zero stride"):
        gemm(*_ab(), out=_out(strides=(0, 2)))


@pytest.mark.parametrize("which", ["a", "b", "out"])
def test_negative_strides(which):
    a, b = _ab()
    out = _out()
    flipped = dict(a=_m(4, 8, strides=(-16, 2)), b=_m(8, 4, ptr=BASE + (1 << 30), strides=(-8, 2)),
                   out=_out(strides=(-8, 2)))
    args = {**dict(a=a, b=b, out=out), which: flipped[which]}
    with pytest.raises(LayoutError, match=f"{which} has negative strides"):
        gemm(args["a"], args["b"], out=args["out"])


@pytest.mark.parametrize("offset", [0, 16, 8 * 2 * 4 - 2])
def test_out_overlapping_an_input(offset):
    a, b = _ab()
    with pytest.raises(OverlapError, match="overlaps a"):
        gemm(a, b, out=_out(ptr=BASE + offset))


def test_out_just_past_an_input_is_fine(monkeypatch):
    a, b = _ab()
    launched = _no_launch(monkeypatch)
    out = _out(ptr=BASE + 4 * 8 * 2)  # a spans 64 bytes
    gemm(a, b, out=out)
    assert launched == ["plan"]


def test_arrays_on_different_devices(monkeypatch):
    a, b = _ab()
    real = g.device_view

    def on_device_1_for_b(obj, dtype=None):
        v = real(obj, dtype=dtype)
        return v.__class__(**{**v.__dict__, "device": 1}) if obj is b else v

    monkeypatch.setattr(g, "device_view", on_device_1_for_b)
    with pytest.raises(DeviceMismatchError, match="a is on device 0 and b on device 1"):
        gemm(a, b)


def test_out_on_another_device(monkeypatch):
    a, b = _ab()
    out = _out()
    real = g.device_view

    def out_on_device_1(obj, dtype=None):
        v = real(obj, dtype=dtype)
        return v.__class__(**{**v.__dict__, "device": 1}) if obj is out else v

    monkeypatch.setattr(g, "device_view", out_on_device_1)
    with pytest.raises(DeviceMismatchError, match="out is on device 1"):
        gemm(a, b, out=out)


def test_non_hopper_gpu(monkeypatch):
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "device 0 is compute capability 8.0, not Hopper (9.x)")
    with pytest.raises(UnsupportedDeviceError, match="needs a Hopper GPU.*8.0"):
        gemm(*_ab())


def _no_launch(monkeypatch):
    """Pretend to be on Hopper; return the list of what gemm planned or zero-filled."""
    launched = []

    class Plan:
        def __call__(self, stream, values):
            pass

    def plan(*args):
        launched.append("plan")
        return Plan()

    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: None)
    monkeypatch.setattr(g, "gemm_plan", plan)
    monkeypatch.setattr(g, "zero_fill_plan", lambda v, *a: launched.append(("zero_fill", v.shape)) or Plan())
    # these plans launch nothing: keep them out of the real cache
    monkeypatch.setattr(plan_cache, "remember", lambda key, entry: None)
    return launched


@pytest.mark.parametrize("M,N", [(0, 4), (4, 0), (0, 0)])
def test_empty_output_launches_nothing(monkeypatch, M, N):
    launched = _no_launch(monkeypatch)
    out = _out(M, N)
    assert gemm(_m(M, 8), _m(8, N, ptr=BASE + (1 << 30)), out=out) is out
    assert launched == []


def test_k0_only_zero_fills(monkeypatch):
    launched = _no_launch(monkeypatch)
    out = _out(4, 4)
    gemm(_m(4, 0), _m(0, 4, ptr=BASE + (1 << 30)), out=out)
    assert launched == [("zero_fill", (4, 4))]


def test_validation_comes_before_the_device_check(monkeypatch):
    # A bad argument is reported as such even on a machine that could not run the GEMM.
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "no CUDA driver or GPU found")
    with pytest.raises(ShapeError):
        gemm(_m(4, 8), _m(9, 4))
