"""FP8 outputs and ``amax_out`` on a CPU: what their kernels compile to, how a call's output scale
and amax reach the plan, and what is refused before launch (fake arrays; nothing reaches a GPU)."""

import itertools

import numpy as np
import pytest
from numba.cuda import types

from _fakes import FakeCAI
import numba_hopper.matmul.api as g
import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper import gemm, grouped_gemm
from numba_hopper.matmul import heuristics as _heuristics
from numba_hopper.matmul import plan as _plan
from numba_hopper.tools import prebuild
from numba_hopper.runtime.arrays import DeviceView
from numba_hopper.matmul.fusion import Fusion
from numba_hopper.errors import DtypeError, OverlapError, ShapeError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.tools.sass import inspect_kernel

_VEC = types.Array(types.float32, 1, "A")
_BITS = types.Array(types.uint32, 1, "A")


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("out_dtype", ["e4m3", "e5m2"])
def test_fp8_output_sass_converts_pairs_and_stores_them_by_tma(out_dtype):
    cfg = GemmConfig("e4m3", out_dtype, "K", "K", block_n=256, stages=4)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    # 4 sub-tiles of 64 x 64 bytes, 8 8-column groups of 2 rows: one cvt and one 2-byte store each
    assert r.count("F2FP.SATFINITE") == 64 and r.count("STS.U16") == 64, r.summary()
    assert f"{out_dtype.upper()}.F32.PACK_AB" in r.sass
    assert r.count("UTMASTG") > 0 and r.count("STSM") == 0
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


def test_amax_and_output_scale_sass():
    """A fused epilogue with an output scale and amax: one warp reduction and one atomic max
    per consumer warp at the end, not per tile."""
    ecfg = EpilogueConfig(bias="col", bias_dtype="bf16", activation="gelu_tanh", out_scale="array", amax=True)
    cfg = GemmConfig("e4m3", "e4m3", "K", "K", block_n=256, stages=4, epilogue=ecfg)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (types.uint16[::1], _VEC, _BITS)))
    assert r.count("REDUX.MAX") >= 1 and _global_max_atomics(r) == 1, r.summary()
    assert r.count("F2FP.SATFINITE") == 64
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


def test_amax_of_a_bf16_output_keeps_stmatrix():
    ecfg = EpilogueConfig(out_scale=None, amax=True)
    cfg = GemmConfig(epilogue=ecfg, stages=4)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (_BITS,)))
    assert r.count("STSM") > 0 and _global_max_atomics(r) == 1


def _global_max_atomics(r):
    """Atomic maxima to global memory: ATOMG, or REDG where ptxas sees the old value unused."""
    return r.count("ATOMG.E.MAX") + r.count("REDG.E.MAX")
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


@pytest.mark.parametrize("block_n,cols,swizzle", [(256, 64, 64), (128, 64, 64), (160, 32, 32)])
def test_fp8_output_sub_tiles(block_n, cols, swizzle):
    """Sub-tiles of 64-byte rows (32-byte ones in 160-wide tiles), swizzled as wide as a row."""
    cfg = GemmConfig("e4m3", "e4m3", "K", "K", block_n=block_n)
    assert (cfg.epi_cols, cfg.epi_swizzle, cfg.c_box) == (cols, swizzle, (1, 64, cols))


def test_output_scale_kinds():
    assert EpilogueConfig(out_scale="number").arg_names == ("out_scale",)
    assert EpilogueConfig(out_scale="array", amax=True).arg_names == ("out_scale", "amax")
    assert not EpilogueConfig(amax=True).scale_only and not EpilogueConfig(out_scale="number").scale_only
    with pytest.raises(ValueError, match="out_scale must be"):
        EpilogueConfig(out_scale="tensor")


# --- gemm()'s keywords ------------------------------------------------------------------------

_addresses = itertools.count(0x7C0000000000, 1 << 24)
M, N, K = 4, 32, 32


def _a(dtype="|u1"):
    return FakeCAI((M, K), dtype, ptr=next(_addresses))


def _b(dtype="|u1"):
    return FakeCAI((K, N), dtype, ptr=next(_addresses), strides=(1, K) if dtype == "|u1" else None)


def _one(typestr="<f4", shape=(1,)):
    return FakeCAI(shape, typestr, ptr=next(_addresses))


def _call(**kw):
    return gemm(_a(), _b(), dtype="e4m3", **kw)


@pytest.mark.parametrize("kw", [
    dict(out_dtype="e4m3"),
    dict(out_dtype="e5m2", scale_out=0.5, amax_out=_one()),
    dict(out=FakeCAI((M, N), "|u1", ptr=0x7B0000000000), out_dtype="e4m3", scale_out=_one(shape=())),
    dict(out=FakeCAI((M, N), "|u1", ptr=0x7B0000000000, strides=(1, M)), out_dtype="e4m3", amax_out=_one(shape=(1, 1))),
    dict(amax_out=_one(), out_dtype="f32"),
], ids=["plain", "scale-and-amax", "out=", "column-major", "amax-of-f32"])
def test_fp8_outputs_reach_the_gpu_check(monkeypatch, kw):
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        _call(**kw)


def test_16_bit_inputs_take_fp8_outputs(monkeypatch):
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        gemm(_a("<u2"), _b("<u2"), dtype="bf16", out_dtype="e4m3", scale_out=2.0)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(out=FakeCAI((M, N), "|u1", ptr=0x7B0000000000)), DtypeError, "out_dtype='e4m3'"),
    (dict(scale_out=2.0), DtypeError, "scale_out scales an fp8 output"),
    (dict(scale_out=2.0, out_dtype="f32"), DtypeError, "fold the factor into alpha"),
    (dict(out_dtype="e4m3", scale_out=_one(shape=(2,))), ShapeError, "scale_out must hold one element"),
    (dict(out_dtype="e4m3", scale_out=_one("<f2")), DtypeError, "scale_out.dtype must be"),
    (dict(amax_out=_one("<f8")), DtypeError, "amax_out.dtype must be"),
    (dict(amax_out=_one(shape=(M,))), ShapeError, "amax_out must hold one element"),
], ids=["uint8-out", "bf16-scale", "f32-scale", "scale-shape", "scale-dtype", "amax-dtype", "amax-shape"])
def test_bad_fp8_output_options_are_refused(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        _call(**kw)


def test_amax_must_not_overlap_the_output():
    out = FakeCAI((M, N), "<f4", ptr=next(_addresses))
    with pytest.raises(OverlapError, match="amax_out"):
        _call(out=out, amax_out=FakeCAI((1,), "<f4", ptr=out.__cuda_array_interface__["data"][0] + 8))


def test_grouped_refuses_fp8_outputs():
    a = FakeCAI((8, K), "|u1", ptr=next(_addresses))
    b = FakeCAI((2, K, N), "|u1", ptr=next(_addresses), strides=(K * N, 1, K))
    offsets = FakeCAI((2,), "<i4", ptr=next(_addresses))
    with pytest.raises(DtypeError, match="gemm writes fp8"):
        grouped_gemm(a, b, offsets, dtype="e4m3", out_dtype="e4m3")


def test_a_calls_output_scale_and_amax_land_at_their_values(monkeypatch):
    """A number ``scale_out`` is a value (the kernel's float argument), a one-element array an
    address; ``amax_out`` an address. Calls with them skip the scales-only fast path."""
    seen = []

    def first(key, a, b, out, f, fvalues, *rest):
        seen.append((key, [0, 0, 0, 0, *fvalues]))
        return out

    monkeypatch.setattr(g, "_first_gemm", first)
    g.clear_plans()
    amax = _one()
    _call(out_dtype="e4m3", scale_a=2.0, scale_out=0.25, amax_out=amax)
    key, values = seen[-1]
    at = _plan.VALUE_INDEX
    assert values[at["out_scale"]] == 0.25 and values[at["amax"]] == amax.__cuda_array_interface__["data"][0]
    assert values[at["alpha"]] == 2.0
    scale = _one()
    _call(out_dtype="e4m3", scale_out=scale)
    assert seen[-1][1][at["out_scale"]] == scale.__cuda_array_interface__["data"][0]
    assert seen[-1][0] != key and len(seen[-1][1]) == _plan.USER


# --- the plan (an H100's limits; nothing launched) -------------------------------------------

BASE = 1 << 30


@pytest.fixture
def h100(monkeypatch):
    for module in (_plan, _heuristics):
        monkeypatch.setattr(module, "device_limits", lambda device=0: prebuild.H100)


def _views(M, N, K, out="e4m3"):
    a = DeviceView(BASE, (M, K), (K, 1), "e4m3", 1, 0, "numba")
    b = DeviceView(BASE, (K, N), (1, K), "e4m3", 1, 0, "numba")
    return a, b, DeviceView(BASE, (M, N), (N, 1), out, 1 if out in ("e4m3", "e5m2") else 2, 0, "numba")


def _amax_fusion():
    amax = DeviceView(BASE + 4096, (1,), (1,), "f32", 4, 0, "numba")
    return Fusion({"out_scale": 0.5, "amax": amax})


def test_amax_is_zeroed_before_the_kernel(h100, monkeypatch):
    monkeypatch.setattr(_plan, "numba_array", lambda v, typestr=None: (v.ptr, typestr))  # (needs a driver)
    steps = _plan.gemm_plan(*_views(256, 512, 1024), _amax_fusion(), None, False).specs
    memset, gemm_step = steps
    assert isinstance(memset, _plan._Memset) and isinstance(gemm_step, _plan._Gemm)
    at = _plan.VALUE_INDEX
    assert (memset.src, memset.width, memset.rows) == (_plan.Src(at["amax"]), 4, 1)
    assert gemm_step.cfg.epilogue == EpilogueConfig(out_scale="number", amax=True)
    values = [0] * _plan.USER
    values[at["out_scale"]], values[at["amax"]] = 0.5, BASE + 4096
    args, srcs = gemm_step._epilogue_args(values)
    assert args.out_scale == np.float32(0.5) and args.amax == (BASE + 4096, "<u4")  # the float's bits
    assert srcs[args._fields.index("out_scale")] == _plan.Src(at["out_scale"])


def test_fp8_outputs_do_not_split_k(h100):
    """A decode-sized plain product splits K for a 16-bit output; its reduce writes no fp8."""
    views = _views(1, 4096, 32768, "bf16")
    assert any(isinstance(s, _plan._Reduce) for s in _plan.gemm_plan(*views, None, None, False).specs)
    views = _views(1, 4096, 32768)
    assert not any(isinstance(s, _plan._Reduce) for s in _plan.gemm_plan(*views, None, None, False).specs)
    with pytest.raises(ValueError, match="cannot write an fp8 output"):
        _plan.gemm_plan(*views, None, GemmConfig(block_m=64, block_n=128), False, split_k=2)
    with pytest.raises(ValueError, match="cannot write an fp8 output"):
        _plan.gemm_plan(*views, None, None, False, split_k=2)
