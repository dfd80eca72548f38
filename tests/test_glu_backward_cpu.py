"""A gated unit's backward in a GEMM's epilogue (``gemm_glu_backward``) on a CPU: what the kernel
compiles to, the plan's tensor maps and boxes, and the checks."""

import dataclasses
import itertools

import pytest

from _fakes import FakeCAI
from numba_hopper import gemm_glu_backward
from numba_hopper.errors import DtypeError, LayoutError, OverlapError, ShapeError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue_config import EpilogueConfig
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.matmul import plan as _plan
from numba_hopper.runtime.arrays import device_view
from numba_hopper.runtime.launch import DeviceLimits
from numba_hopper.runtime.tensormap import validate_tiled
from numba_hopper.tools.sass import inspect_kernel

GLU = EpilogueConfig(glu="silu")


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("block_n,stages", [(256, 3), (192, 4)])
def test_glu_sass_streams_both_inputs_and_outputs_without_spills(block_n, stages):
    cfg = GemmConfig("bf16", "bf16", "K", "N", block_m=128, block_n=block_n, stages=stages, epilogue=GLU)
    residual = dataclasses.replace(cfg, epilogue=EpilogueConfig(c_dtype="bf16"))
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, ()))
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    # the shared memory of a residual C's kernel: two inputs' 32-column sub-tiles in a C buffer
    assert cfg.shared_bytes == residual.shared_bytes and cfg.epi_cols == 32 and cfg.tensormaps == 6
    subtiles = 2 * block_n // 32  # per CTA: two consumers
    assert r.count("UTMASTG") == subtiles  # a TMA store of each output's sub-tile
    assert r.count("STSM") == r.count("LDSM") == 2 * subtiles // 2 * 2  # stmatrix/ldmatrix: two 16-column groups
    assert r.count("MUFU") >= block_n // 2  # (a sigmoid an element: 64 x block_n over 128 threads)


def test_glu_config_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="glu takes"):
        EpilogueConfig(glu="silu", alpha=True)
    with pytest.raises(ValueError, match="glu takes"):
        EpilogueConfig(glu="relu")
    for kw in (dict(out_dtype="f32"), dict(k_segments=2), dict(in_dtype="e4m3", b_major="K")):
        with pytest.raises(ValueError, match="GLU backward"):
            GemmConfig(**{"epilogue": GLU, **kw})


_addresses = itertools.count(0x7F0000000000, 1 << 28)  # every fake array its own memory


def _m(rows, cols, typestr="<f2", strides=None):
    return FakeCAI((rows, cols), typestr, ptr=next(_addresses), strides=strides)


class _Template:
    words = (0,) * 16


def test_plan_maps_gate_and_up_like_c_and_the_second_output_like_d(monkeypatch):
    class Prepared(Exception):
        pass

    launched, boxes = {}, []
    monkeypatch.setattr(_plan, "make_gemm_kernel", lambda cfg: launched.setdefault("cfg", cfg))

    def encode_template(view, box, swizzle=0, **kw):  # (TMA's constraints checked, nothing encoded)
        validate_tiled(dtype=view.dtype, address=view.ptr, shape=view.shape, strides=view.strides, box=box,
                       swizzle=swizzle)
        boxes.append((view.shape, box, swizzle))
        return _Template

    def prepare_launch(kernel, grid, threads, args, **kw):
        launched.update(params=args[0])
        raise Prepared

    limits = DeviceLimits(0, (9, 0), 132, max_shared_per_block_optin=227 * 1024)
    monkeypatch.setattr(_plan, "encode_template", encode_template)
    monkeypatch.setattr(_plan, "device_limits", lambda device: limits)
    monkeypatch.setattr("numba_hopper.matmul.heuristics.device_limits", lambda device: limits)
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    monkeypatch.setattr(_plan, "alloc_scratch", lambda *args: 1 << 40)
    monkeypatch.setattr(_plan, "free_scratch", lambda *args: None)
    M, N, K = 8192, 5632, 2048
    dy, w = _m(M, K), _m(K, N)
    gate, up, d_gate, d_up = (device_view(_m(M, N)) for _ in range(4))
    plan = _plan.glu_backward_plan(device_view(dy), device_view(w), d_gate, gate, up, d_up, "silu", None, False)
    values = [0] * (_plan.USER + 3)
    values[_plan.A], values[_plan.B], values[_plan.OUT] = device_view(dy).ptr, device_view(w).ptr, d_gate.ptr
    values[_plan.USER:] = gate.ptr, up.ptr, d_up.ptr
    with pytest.raises(Prepared):
        plan(0, values)
    cfg, params = launched["cfg"], launched["params"]
    assert cfg.glu and not cfg.pingpong and (params.M, params.N, params.K) == (M, N, K)
    assert [m.value for m in params.maps][2:] == [d_gate.ptr, gate.ptr, up.ptr, d_up.ptr]
    # the inputs' boxes C's (64 x 32, 64-byte swizzle), the second output's D's
    assert boxes[3][1:] == boxes[4][1:] == ((1, 64, 32), 64) and boxes[5][1:] == boxes[2][1:]


X, W = _m(64, 128), _m(128, 32)


@pytest.mark.parametrize("args,kw,exc,msg", [
    ((X, W, _m(64, 32), _m(64, 16)), {}, ShapeError, "up has shape"),
    ((X, W, _m(64, 32, "<f4"), _m(64, 32)), {}, TypeError, "gate.dtype|gate has dtype"),
    ((X, W, _m(64, 32, strides=(2, 128)), _m(64, 32)), {}, LayoutError, "gate row-major"),
    ((X, W, _m(64, 32), _m(64, 32)), dict(activation="gelu"), ValueError, "activation"),
    ((X, W, _m(64, 32), _m(64, 32)), dict(out=_m(64, 16)), ShapeError, "out has shape"),
])
def test_rejects_bad_calls(args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        gemm_glu_backward(*args, **kw)


def test_refuses_fp8_and_an_output_over_an_input():
    x, w = FakeCAI((64, 128), "|u1", ptr=next(_addresses)), FakeCAI((128, 32), "|u1", ptr=next(_addresses))
    with pytest.raises(DtypeError, match="16-bit"):
        gemm_glu_backward(x, w, _m(64, 32), _m(64, 32), dtype="e4m3")
    gate = _m(64, 32)
    with pytest.raises(OverlapError):
        gemm_glu_backward(X, W, gate, _m(64, 32), out_up=gate)
