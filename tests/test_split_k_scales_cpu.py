"""Split-K with a scale-only epilogue (CPU): which calls split, and the reduce that applies the
scales (the planner sees an H100; nothing is launched)."""

import pytest

from numba_hopper.matmul import heuristics as _heuristics

from numba_hopper.matmul import plan as _plan

from numba_hopper.tools import prebuild
from numba_hopper.runtime.arrays import DeviceView
from numba_hopper.matmul.fusion import Fusion
from numba_hopper.kernels.gemm_config import GemmConfig

BASE = 1 << 30  # a 16-byte-aligned address that is never dereferenced


@pytest.fixture(autouse=True)
def h100(monkeypatch):
    for module in (_plan, _heuristics):
        monkeypatch.setattr(module, "device_limits", lambda device=0: prebuild.H100)


def _views(M, N, K, dtype="e4m3"):
    """TN operands (a row-major (M, K), b column-major (K, N)) and a row-major (M, N) bf16 out."""
    size = 1 if dtype in ("e4m3", "e5m2") else 2
    a = DeviceView(BASE, (M, K), (K, 1), dtype, size, 0, "numba")
    b = DeviceView(BASE, (K, N), (1, K), dtype, size, 0, "numba")
    out = DeviceView(BASE, (M, N), (N, 1), "bf16", 2, 0, "numba")
    return a, b, out


def _vector(n, stride=1):
    return DeviceView(BASE, (n,), (stride,), "f32", 4, 0, "numba")


def _fusion(alpha=1.0, row_scale=None, col_scale=None, bias=None, activation=None):
    given = {"alpha": alpha if alpha != 1.0 else None, "row_scale": row_scale, "col_scale": col_scale, "bias": bias}
    return Fusion({name: x for name, x in given.items() if x is not None}, activation=activation)


def _src(name):
    return _plan.Src(_plan.VALUE_INDEX[name])


def _steps(plan):
    gemm, = (s for s in plan.specs if isinstance(s, _plan._Gemm))
    reduce = [s for s in plan.specs if isinstance(s, _plan._Reduce)]
    return gemm, reduce[0] if reduce else None


M, N, K = 128, 2112, 7168  # DeepSeek-V3's: 66 tiles of 64x64 leave half of the H100's 132 SMs idle
SPLIT = GemmConfig(block_m=64, block_n=64)  # with split_k=2, asked for: fp8 does not split on its own yet


@pytest.mark.parametrize("scales", ["per-tensor number", "per-tensor arrays", "row-wise"])
def test_fp8_scaled_split_k_scales_in_the_reduce(scales):
    row, col = {"per-tensor number": (None, None), "per-tensor arrays": (_vector(M, 0), _vector(N, 0)),
                "row-wise": (_vector(M), _vector(N))}[scales]
    fusion = _fusion(alpha=0.5, row_scale=row, col_scale=col)
    gemm, reduce = _steps(_plan.gemm_plan(*_views(M, N, K), fusion, SPLIT, False, split_k=2))
    assert gemm.batch.count == 2 and gemm.grid == 132  # two K slices fill the SMs
    # the slices run the plain kernel (promoted)
    assert gemm.cfg.epilogue is None and gemm.cfg.promoted and gemm.cfg.out_dtype == "f32"
    assert reduce.alpha == _src("alpha")
    assert (reduce.row_scale and reduce.row_scale.src, reduce.col_scale and reduce.col_scale.src) == (
        row and _src("row_scale"), col and _src("col_scale"))


def test_column_major_out_swaps_the_reduce_scales():
    """A column-major (N, M) out is computed as its (M, N) transpose: kernel rows are its columns."""
    fusion = _fusion(row_scale=_vector(N), col_scale=_vector(M))
    a, b, _ = _views(N, M, K)
    out = DeviceView(BASE, (N, M), (1, N), "bf16", 2, 0, "numba")
    _, reduce = _steps(_plan.gemm_plan(a, b, out, fusion, SPLIT, False, split_k=2))
    assert reduce.alpha is None  # alpha == 1: no factor
    assert reduce.row_scale.src == _src("col_scale") and reduce.row_scale.view.shape == (M,)
    assert reduce.col_scale.src == _src("row_scale") and reduce.col_scale.view.shape == (N,)
    assert reduce.out.view.shape == (M, N)


@pytest.mark.parametrize("extra", [{"bias": "bias"}, {"activation": "relu"}])
def test_other_epilogues_do_not_split(extra):
    kw = {k: _vector(N) if v == "bias" else v for k, v in extra.items()}
    gemm, reduce = _steps(_plan.gemm_plan(*_views(M, N, K), _fusion(alpha=0.5, **kw), None, False))
    assert reduce is None and gemm.batch.count == 1 and gemm.cfg.epilogue is not None


def test_scaled_calls_split_only_when_asked():
    fp8, _ = _steps(_plan.gemm_plan(*_views(M, N, K), _fusion(alpha=0.5), None, False))
    assert fp8.batch.count == 1  # the fused kernel
    views = _views(1, 2048, 16384, dtype="bf16")  # four K slices (two run swapped)
    gemm, reduce = _steps(_plan.gemm_plan(*views, _fusion(alpha=2.0), None, False))
    assert reduce is None and gemm.batch.count == 1  # unchanged: the fused kernel
    plain, _ = _steps(_plan.gemm_plan(*views, None, None, False))
    assert plain.batch.count > 1  # the 16-bit plain split, as before
    forced = GemmConfig(block_m=64, block_n=128)
    gemm, reduce = _steps(_plan.gemm_plan(*views, _fusion(alpha=2.0), forced, False, split_k=2))
    assert gemm.batch.count == 2 and gemm.cfg.epilogue is None and reduce.alpha == _src("alpha")
    assert (gemm.cfg.block_m, gemm.cfg.block_n) == (64, 128)  # the config's tile, in two K slices
    gemm, reduce = _steps(_plan.gemm_plan(*views, _fusion(alpha=2.0), None, False, split_k=2))
    assert gemm.batch.count == 2 and reduce.alpha == _src("alpha")  # the heuristic's tile, split as asked
    gemm, reduce = _steps(_plan.gemm_plan(*views, None, None, False, split_k=1))
    assert reduce is None and gemm.batch.count == 1  # never split

