"""gemm takes numba, CuPy and PyTorch arrays and returns the caller's kind (GPU)."""

import numpy as np
import pytest

from _ref import bf16_bits_to_f64, f32_to_bf16_bits
from numba_hopper import gemm

pytestmark = pytest.mark.gpu


def _rel(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


def _f16(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32).astype(np.float16)


def test_numba_arrays_in_and_out():
    from numba import cuda

    rng = np.random.default_rng()
    a, b = _f16(rng, 200, 96), _f16(rng, 96, 136)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    res = gemm(cuda.to_device(a), cuda.to_device(b), out_dtype="f32")
    assert cuda.is_cuda_array(res) and res.dtype == np.float32 and res.shape == (200, 136)
    assert _rel(res.copy_to_host(), ref) < 1e-4
    out = cuda.to_device(np.full((200, 136), np.nan, np.float16))
    assert gemm(cuda.to_device(a), cuda.to_device(b), out=out) is out
    assert _rel(out.copy_to_host().astype(np.float64), ref) < 2e-3


def test_cupy_arrays_f16_and_bf16_bits():
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng()
    a, b = _f16(rng, 150, 64), _f16(rng, 64, 120)
    res = gemm(cupy.asarray(a), cupy.asarray(b))
    assert isinstance(res, cupy.ndarray) and res.dtype == np.float16
    assert _rel(res.get().astype(np.float64), a.astype(np.float64) @ b.astype(np.float64)) < 2e-3

    ab = f32_to_bf16_bits(rng.standard_normal((150, 64), dtype=np.float32))
    bb = f32_to_bf16_bits(rng.standard_normal((64, 120), dtype=np.float32))
    bits = gemm(cupy.asarray(ab), cupy.asarray(bb), dtype="bf16")
    assert isinstance(bits, cupy.ndarray) and bits.dtype == np.uint16
    assert _rel(bf16_bits_to_f64(bits.get()), bf16_bits_to_f64(ab) @ bf16_bits_to_f64(bb)) < 1e-2


def test_cupy_native_bfloat16():
    cupy = pytest.importorskip("cupy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng()
    a = rng.standard_normal((130, 64), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 72), dtype=np.float32).astype(ml_dtypes.bfloat16)
    try:
        da, db = cupy.asarray(a), cupy.asarray(b)
    except (TypeError, ValueError, NotImplementedError) as exc:
        pytest.skip(f"CuPy {cupy.__version__} has no bfloat16: {exc}")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    res = gemm(da, db)
    assert isinstance(res, cupy.ndarray) and res.dtype == da.dtype
    assert _rel(res.get().astype(np.float64), ref) < 1e-2
    assert _rel(gemm(da, db, out_dtype="f32").get(), ref) < 1e-4


def test_mixed_kinds_return_the_kind_of_a():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    a = torch.randn(64, 80, device="cuda", dtype=torch.float16)
    b = torch.randn(80, 48, device="cuda", dtype=torch.float16)
    res = gemm(a, cupy.asarray(b))
    torch.cuda.synchronize()
    assert isinstance(res, torch.Tensor) and res.dtype == torch.float16
    ref = a.double() @ b.double()
    assert ((res.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_host_tensors_are_refused_before_any_launch():
    torch = pytest.importorskip("torch")
    b = torch.randn(8, 4, device="cuda", dtype=torch.float16)
    with pytest.raises(TypeError, match="cuda"):
        gemm(torch.randn(4, 8, dtype=torch.float16), b)
    with pytest.raises(TypeError, match="host"):
        gemm(np.zeros((4, 8), np.float16), b)
