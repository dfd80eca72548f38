"""Sums of products (``gemm_sum``: ``a_0 @ b_0 + a_1 @ b_1 + ...`` in one K-segmented kernel) on a
CPU: what the kernel compiles to, the plan's tensor maps and segment bounds, and the checks."""

import dataclasses
import itertools

import pytest

from _fakes import FakeCAI
from numba_hopper import gemm_sum
from numba_hopper.errors import DtypeError, OverlapError, ShapeError
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.matmul import plan as _plan
from numba_hopper.runtime.arrays import device_view
from numba_hopper.runtime.launch import DeviceLimits
from numba_hopper.runtime.tensormap import validate_tiled
from numba_hopper.tools.sass import inspect_kernel


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("kw", [dict(k_segments=3), dict(k_segments=2, cluster_m=2),
                                dict(k_segments=3, block_n=128, pingpong=True)])
def test_segmented_sass_loads_each_k_block_once_without_spills(kw):
    cfg = GemmConfig("bf16", "bf16", "K", "N", **{"block_m": 128, "block_n": 256, "stages": 4, **kw})
    plain = dataclasses.replace(cfg, k_segments=1)
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    base = inspect_kernel(make_gemm_kernel(plain), gemm_argument_types(plain))
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    # the segment picks a map address, not a load: as many TMA loads and wgmmas as one product
    assert r.count("UTMALDG") == base.count("UTMALDG") and r.count("HGMMA") == base.count("HGMMA")


def test_segmented_config_counts_its_maps_and_refuses_what_it_does_not_run():
    assert GemmConfig(k_segments=3).tensormaps == 7 and GemmConfig(k_segments=2).tensormaps == 5
    for kw in (dict(k_segments=4), dict(k_segments=0), dict(k_segments=2, stream_k=True, block_n=128),
               dict(k_segments=2, in_dtype="e4m3", a_major="K", b_major="K")):
        with pytest.raises(ValueError, match="k_segments"):
            GemmConfig(**kw)


class _Template:
    words = (0,) * 16


_addresses = itertools.count(0x7F0000000000, 1 << 28)  # every fake array its own memory


def _m(rows, cols, typestr="<f2"):
    return FakeCAI((rows, cols), typestr, ptr=next(_addresses))


def _planned(monkeypatch, pairs, out):
    """The config, kernel parameters and map boxes of ``gemm_sum_plan``'s launch (never launched)."""
    class Prepared(Exception):
        pass

    launched, boxes = {}, []

    def prepare_launch(kernel, grid, threads, args, **kw):
        launched.update(params=args[0])
        raise Prepared

    monkeypatch.setattr(_plan, "make_gemm_kernel", lambda cfg: launched.setdefault("cfg", cfg))
    def encode_template(view, box, swizzle=0, **kw):  # (TMA's constraints checked, nothing encoded)
        validate_tiled(dtype=view.dtype, address=view.ptr, shape=view.shape, strides=view.strides, box=box,
                       swizzle=swizzle)
        boxes.append((view.shape, box))
        return _Template

    monkeypatch.setattr(_plan, "encode_template", encode_template)
    limits = DeviceLimits(0, (9, 0), 132, max_shared_per_block_optin=227 * 1024)
    monkeypatch.setattr(_plan, "device_limits", lambda device: limits)
    monkeypatch.setattr("numba_hopper.matmul.heuristics.device_limits", lambda device: limits)
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    monkeypatch.setattr(_plan._Copy, "prepare", lambda self, values: (None, ()))  # (copies: not the subject)
    monkeypatch.setattr(_plan, "alloc_scratch", lambda *args: 1 << 40)
    monkeypatch.setattr(_plan, "free_scratch", lambda *args: None)
    views = [(device_view(a), device_view(b)) for a, b in pairs]
    vo = device_view(out)
    plan = _plan.gemm_sum_plan(views, vo, None, False)
    values = [0] * (_plan.USER + 4)
    values[_plan.A], values[_plan.B], values[_plan.OUT] = views[0][0].ptr, views[0][1].ptr, vo.ptr
    for i, (va, vb) in enumerate(views[1:]):
        values[_plan.USER + 2 * i], values[_plan.USER + 2 * i + 1] = va.ptr, vb.ptr
    with pytest.raises(Prepared):
        plan(0, values)
    return launched["cfg"], launched["params"], boxes, views


def test_plan_runs_each_pairs_k_blocks_in_turn(monkeypatch):
    M, N, Ks = 8192, 2560, (4096, 1000, 1024)  # (a ragged K: its last k-block zero-filled by TMA)
    pairs = [(_m(M, k), _m(k, N)) for k in Ks]
    cfg, params, boxes, views = _planned(monkeypatch, pairs, _m(M, N))
    assert cfg.k_segments == 3 and (cfg.a_major, cfg.b_major) == ("K", "N")
    assert params.k_begins == (64, 80) and params.K == 96 * 64 and (params.M, params.N) == (M, N)
    # A, B, D, then the other pairs' A and B at their own addresses
    assert [m.value for m in params.maps] == [views[0][0].ptr, views[0][1].ptr, params.maps[2].value,
                                              views[1][0].ptr, views[1][1].ptr, views[2][0].ptr, views[2][1].ptr]
    assert [shape for shape, _ in boxes] == [(1, M, 4096), (1, 4096, N), (1, M, N), (1, M, 1000), (1, 1000, N),
                                             (1, M, 1024), (1, 1024, N)]


def test_plan_of_column_major_operands_and_an_unaligned_out(monkeypatch):
    """Column-major a, b and out: ``out.T = sum(b_i.T @ a_i.T)``, the output through an aligned copy
    (300 rows: 600 bytes a column); every map within TMA's constraints."""
    M, N = 300, 264

    def col(rows, cols):
        return FakeCAI((rows, cols), "<f2", ptr=next(_addresses), strides=(2, 2 * rows))

    cfg, params, boxes, _ = _planned(monkeypatch, [(col(M, k), col(k, N)) for k in (128, 200, 64)], col(M, N))
    assert (cfg.a_major, cfg.b_major) == ("K", "N") and (params.M, params.N) == (N, M)
    assert params.k_begins == (2, 6) and params.K == 7 * 64


def test_plan_reads_every_pair_in_one_major(monkeypatch):
    M, N = 256, 512
    col = FakeCAI((128, N), "<f2", ptr=next(_addresses), strides=(2, 256))  # a column-major b
    cfg, params, boxes, _ = _planned(monkeypatch, [(_m(M, 64), _m(64, N)), (_m(M, 128), col)], _m(M, N))
    assert cfg.b_major == "N" and len(params.maps) == 5
    assert boxes[-1][0] == (1, 128, N)  # the copy, row-major like the first pair's b


X = _m(64, 128)


@pytest.mark.parametrize("pairs,out,exc,msg", [
    ([], None, ShapeError, "1 to 3"),
    ([(X, _m(128, 32))] * 4, None, ShapeError, "1 to 3"),
    ([X, _m(128, 32)], None, TypeError, "pairs"),
    ([(X, _m(128, 32)), (_m(64, 64), _m(64, 16))], None, ShapeError, r"share one \(M, N\)"),
    ([(X, _m(128, 32)), (_m(64, 64), _m(32, 32))], None, ShapeError, "shape mismatch"),
    ([(X, _m(128, 32)), (_m(64, 64, "<f4"), _m(64, 32, "<f4"))], None, TypeError, "a.dtype"),
    ([(X, _m(128, 32)), (FakeCAI((64, 64), "<u2"), FakeCAI((64, 32), "<u2"))], None, TypeError, "dtype"),
    ([(X, _m(128, 32))], X, ShapeError, "out has shape"),
])
def test_gemm_sum_rejects_bad_calls(pairs, out, exc, msg):
    with pytest.raises(exc, match=msg):
        gemm_sum(pairs, out)


def test_gemm_sum_refuses_fp8_and_an_out_over_an_operand():
    x, w = FakeCAI((64, 128), "|u1", ptr=next(_addresses)), FakeCAI((128, 32), "|u1", ptr=next(_addresses))
    with pytest.raises(DtypeError, match="16-bit pairs"):
        gemm_sum([(x, w)], dtype="e4m3")
    a = _m(64, 128)
    with pytest.raises(OverlapError):
        gemm_sum([(a, _m(128, 64))], a.__class__((64, 64), "<f2", ptr=a.__cuda_array_interface__["data"][0]))
