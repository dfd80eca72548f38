"""Gated products (``gemm(a, b, up=, activation=)``: ``act(a @ b) * (a @ up)``) on a CPU: what the
kernel compiles to, the plan's tensor maps, and the option checks."""

import itertools

import pytest

from _fakes import FakeCAI
from numba_hopper import gemm
from numba_hopper.matmul import plan as _plan
from numba_hopper.runtime.arrays import device_view
from numba_hopper.matmul.fusion import Fusion
from numba_hopper.matmul.heuristics import max_stages
from numba_hopper.errors import DtypeError, LayoutError, ShapeError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.runtime.launch import DeviceLimits
from numba_hopper.tools.sass import inspect_kernel

SILU = EpilogueConfig(activation="silu")


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_m,block_n,out_dtype", [(128, 256, "bf16"), (64, 128, "f32")])
def test_gated_sass_gates_half_the_accumulators(block_m, block_n, out_dtype):
    stages = max_stages("bf16", out_dtype, block_n, epilogue=SILU, gated=True, b_major="K", block_m=block_m)
    cfg = GemmConfig("bf16", out_dtype, "K", "K", block_m=block_m, block_n=block_n, stages=stages, epilogue=SILU,
                     gated=True)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, ()))
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("HGMMA") >= 4
    # one tanh.approx (silu's sigmoid) per gated output value: half the fragment's registers
    assert r.count("MUFU.TANH") == block_n // 4
    assert r.count("UTMASTG") == block_n // 2 // cfg.epi_cols  # output sub-tiles, unrolled


def test_gated_config_halves_the_b_box_and_the_output_tile():
    cfg = GemmConfig(b_major="K", block_n=256, epilogue=SILU, gated=True)
    assert cfg.gated and cfg.out_block_n == 128 and cfg.b_box == (1, 128, 64) and cfg.tensormaps == 4
    assert cfg.epi_cols == 64 and cfg.b_tile_bytes == 256 * 128
    # without an activation: the gated product itself, through the fused store that multiplies
    plain = GemmConfig(b_major="K", block_n=256, gated=True)
    assert plain.epilogue == EpilogueConfig() and plain == GemmConfig(b_major="K", block_n=256, gated=True,
                                                                    epilogue=EpilogueConfig())


@pytest.mark.parametrize("kw", [dict(block_n=192), dict(b_major="N"), dict(cluster_n=2), dict(in_dtype="e4m3"),
                                dict(grouped="contiguous")])
def test_gated_config_refuses_what_it_does_not_run(kw):
    with pytest.raises(ValueError, match="gated"):
        GemmConfig(**{"b_major": "K", "block_n": 256, "epilogue": SILU, "gated": True, **kw})


def test_gated_epilogue_fuses_an_activation_only():
    with pytest.raises(ValueError, match="activation and aux only; got bias"):
        GemmConfig(b_major="K", block_n=256, gated=True, epilogue=EpilogueConfig(activation="silu", bias="col"))


def test_gated_plan_passes_both_weights_and_twice_the_columns(monkeypatch):
    class Prepared(Exception):
        pass

    launched = {}

    def prepare_launch(kernel, grid, threads, args, **kw):
        launched.update(params=args[0], grid=grid)
        raise Prepared

    boxes = []
    monkeypatch.setattr(_plan, "make_gemm_kernel", lambda cfg: launched.setdefault("cfg", cfg))
    monkeypatch.setattr(_plan, "encode_template", lambda view, box, **kw: boxes.append((view.shape, box)) or _Template)
    limits = DeviceLimits(0, (9, 0), 132, max_shared_per_block_optin=227 * 1024)
    monkeypatch.setattr(_plan, "device_limits", lambda device: limits)
    monkeypatch.setattr("numba_hopper.matmul.heuristics.device_limits", lambda device: limits)
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    M, N, K = 4096, 5632, 2048
    va, vo = device_view(_m(M, K)), device_view(_m(M, N))
    vb, vu = device_view(_w(N, K)), device_view(_w(N, K))
    fusion = Fusion({"up": vu}, activation="silu")
    plan = _plan.gemm_plan(va, vb, vo, fusion, None, False)
    values = [0] * (_plan.USER + 1)
    values[_plan.A], values[_plan.B], values[_plan.OUT] = va.ptr, vb.ptr, vo.ptr
    values[_plan.VALUE_INDEX["up"]] = vu.ptr
    with pytest.raises(Prepared):
        plan(0, values)
    cfg, params = launched["cfg"], launched["params"]
    assert cfg.gated and (cfg.block_m, cfg.block_n, cfg.b_major) == (128, 256, "K")
    assert (params.M, params.N, params.K) == (M, 2 * N, K) and len(params.maps) == 4
    assert params.maps[3].value == vu.ptr  # B_up's map, at its address
    # B and B_up (stored (N, K)) in half-tile boxes; the output in 64 x 64 sub-tiles
    assert boxes == [((1, M, K), (1, 128, 64)), ((1, N, K), (1, 128, 64)), ((1, M, N), (1, 64, 64)),
                     ((1, N, K), (1, 128, 64))]


class _Template:
    words = (0,) * 16


_addresses = itertools.count(0x7F0000000000, 1 << 28)  # every fake array its own memory


def _m(rows, cols, typestr="<f2"):
    return FakeCAI((rows, cols), typestr, ptr=next(_addresses))


def _w(n, k, typestr="<f2"):
    """``w.t()`` of a row-major (n, k) weight: a column-major (k, n) array."""
    return FakeCAI((k, n), typestr, ptr=next(_addresses), strides=(int(typestr[-1]), k * int(typestr[-1])))


X = _m(16, 64)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(up=_w(32, 64), bias=FakeCAI((32,), "<f4")), ValueError, "only an activation and aux_out; got bias"),
    (dict(up=_w(32, 64), alpha=2.0), ValueError, "only an activation and aux_out; got alpha"),
    (dict(up=_w(16, 64)), ValueError, "up has shape"),
    (dict(up=_w(32, 64, "<f4")), TypeError, "up.dtype"),
    (dict(up=_m(64, 32)), LayoutError, "up= needs up column-major"),
    (dict(up=_w(32, 64), out=FakeCAI((16, 32), "<f2", ptr=next(_addresses), strides=(2, 32))), LayoutError,
     "row-major out"),
])
def test_gemm_rejects_bad_gated_calls(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        gemm(X, _w(32, 64), activation="silu", **kw)


def test_gated_b_must_be_column_major():
    with pytest.raises(LayoutError, match="up= needs b column-major"):
        gemm(X, _m(64, 32), up=_w(32, 64), activation="silu")


def test_gated_fp8_is_refused():
    x, w, u = (FakeCAI(s, "|u1", ptr=next(_addresses), strides=st) for s, st in
               (((16, 64), None), ((64, 32), (1, 64)), ((64, 32), (1, 64))))
    with pytest.raises(DtypeError, match="up.dtype must be one of .'bf16', 'f16'.; got 'u8'"):
        gemm(x, w, up=u, dtype="e4m3", activation="silu")


def test_valid_gated_call_reaches_the_gpu_check(monkeypatch):
    import numba_hopper.matmul.plan_cache as g

    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        gemm(X, _w(32, 64), up=_w(32, 64), activation="silu")


@pytest.mark.kernel_matrix
def test_gated_kernel_keeping_both_products_does_not_spill():
    """``aux_out`` on a gated kernel: both products stored beside the gated tile, no spills."""
    from numba.cuda import types

    ecfg = EpilogueConfig(activation="silu", aux_dtype="bf16")
    stages = max_stages("bf16", "bf16", 256, epilogue=ecfg, gated=True, b_major="K")
    cfg = GemmConfig("bf16", "bf16", "K", "K", block_n=256, stages=stages, epilogue=ecfg, gated=True)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (types.uint16[:, ::1],)))
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("MUFU.TANH") == 256 // 4 and r.count("UTMASTG") == 2
    assert r.count("STG") == 256 // 2  # a thread's 64 gate and 64 up values


def test_gated_aux_out_holds_both_products():
    with pytest.raises(ShapeError, match=r"aux_out has shape \(16, 32\), expected \(16, 64\)"):
        gemm(X, _w(32, 64), up=_w(32, 64), activation="silu", aux_out=_m(16, 32))
