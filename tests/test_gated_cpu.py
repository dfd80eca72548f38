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


def _gated_plan(monkeypatch, M, N, K, aux=False):
    """``(cfg, params, boxes, plan)`` of a gated call's plan, stopped at its launch."""

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
    monkeypatch.setattr(_plan, "numba_array", lambda view, bits=None: None)  # (the epilogue's arrays: no GPU here)
    monkeypatch.setattr(_plan, "alloc_scratch", lambda *args: 1 << 40)
    monkeypatch.setattr(_plan, "free_scratch", lambda *args: None)
    va, vo = device_view(_m(M, K)), device_view(_m(M, N))
    vb, vu = device_view(_w(N, K)), device_view(_w(N, K))
    operands = {"up": vu, "aux": device_view(_m(M, 2 * N))} if aux else {"up": vu}
    fusion = Fusion(operands, activation="silu")
    plan = _plan.gemm_plan(va, vb, vo, fusion, None, False)
    values = [0] * (_plan.USER + 1)
    values[_plan.A], values[_plan.B], values[_plan.OUT] = va.ptr, vb.ptr, vo.ptr
    for name, v in operands.items():
        values[_plan.VALUE_INDEX[name]] = v.ptr
    with pytest.raises(Prepared):
        plan(0, values)
    return launched["cfg"], launched["params"], boxes, plan


def test_gated_plan_passes_both_weights_and_twice_the_columns(monkeypatch):
    M, N, K = 4096, 5632, 2048
    cfg, params, boxes, _ = _gated_plan(monkeypatch, M, N, K)
    vu_ptr = params.maps[3].value
    assert cfg.gated and (cfg.block_m, cfg.block_n, cfg.b_major) == (128, 256, "K")
    assert (params.M, params.N, params.K) == (M, 2 * N, K) and len(params.maps) == 4
    # B and B_up (stored (N, K)) in half-tile boxes; the output in 64 x 64 sub-tiles
    assert boxes == [((1, M, K), (1, 128, 64)), ((1, N, K), (1, 128, 64)), ((1, M, N), (1, 64, 64)),
                     ((1, N, K), (1, 128, 64))]
    assert vu_ptr != params.maps[1].value


@pytest.mark.parametrize("N", [5632, 100])
def test_gated_plan_writes_both_products_through_two_maps(monkeypatch, N):
    """``aux`` (M, 2N): a map of each half, clipped at N, in 64 x 64 boxes; a half TMA cannot
    address (N = 100: up's starts 200 bytes in) is written to aligned scratch and copied after
    (as is the output, whose 200-byte rows TMA cannot write either)."""
    M, K = 512, 256
    cfg, params, boxes, plan = _gated_plan(monkeypatch, M, N, K, aux=True)
    assert cfg.gated_aux and len(params.maps) == 6
    assert boxes[-2:] == [((1, M, N), (1, 64, 64))] * 2
    first, second = (m.value for m in params.maps[4:])
    copies = [s for s in plan.specs if isinstance(s, _plan._Copy)]
    if N % 8 == 0:
        assert second - first == 2 * N and not copies
    else:  # (aux's rows are 400 bytes, so the gate's half is written in place; the output's are not)
        assert second % 16 == 0 and second - first != 2 * N and len(copies) == 2
        assert {c.dst.view.shape for c in copies} == {(M, N)}


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
@pytest.mark.parametrize("aux_dtype", ["bf16", "f32"])
def test_gated_kernel_keeping_both_products_stores_them_through_tma(aux_dtype):
    """``aux_out`` on a gated kernel: the raw accumulator's sub-tiles through TMA (128 bytes wide:
    4 for bf16 products, 8 for f32 ones) before the gated tile's 2, no global stores, no spills."""
    from numba.cuda import types

    ecfg = EpilogueConfig(activation="silu", aux_dtype=aux_dtype)
    stages = max_stages("bf16", "bf16", 256, epilogue=ecfg, gated=True, b_major="K")
    cfg = GemmConfig("bf16", "bf16", "K", "K", block_n=256, stages=stages, epilogue=ecfg, gated=True)
    assert cfg.gated_aux and cfg.tensormaps == 6
    aux_type = types.uint16[:, ::1] if aux_dtype == "bf16" else types.float32[:, ::1]
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, (aux_type,)))
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("MUFU.TANH") == 256 // 4
    assert r.count("UTMASTG") == 2 + 256 * (2 if aux_dtype == "bf16" else 4) // 128
    assert r.count("STG") == 0


def test_gated_aux_out_holds_both_products():
    with pytest.raises(ShapeError, match=r"aux_out has shape \(16, 32\), expected \(16, 64\)"):
        gemm(X, _w(32, 64), up=_w(32, 64), activation="silu", aux_out=_m(16, 32))
