"""What the call path plans for the edges torch accepts (CPU: an H100's limits, nothing launched).

- ``bmm`` of operands TMA cannot address: aligned scratch copies, one launch per operand for
  the whole batch, and an ``out`` it cannot write computed in scratch and copied out;
- ``K == 0``: the epilogue of a zero product, the GEMM kernel on one zero-filled k-block;
  without an epilogue a zero fill (one memset for an evenly spaced batch).
"""

import itertools

import pytest
from _fakes import FakeCAI

import numba_hopper.matmul.api as api
import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper.matmul import extra_launches, heuristics, plan as _plan
from numba_hopper.matmul.fusion import Fusion
from numba_hopper.runtime.arrays import DeviceView, tma_addressable
from numba_hopper.tools import prebuild

BASE = 1 << 30  # a 16-byte-aligned address that is never dereferenced


@pytest.fixture(autouse=True)
def h100(monkeypatch):
    for module in (_plan, heuristics):
        monkeypatch.setattr(module, "device_limits", lambda device=0: prebuild.H100)


def _view(shape, strides, dtype="bf16", ptr=BASE):
    size = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}[dtype]
    return DeviceView(ptr, shape, strides, dtype, size, 0, "torch")


def _specs(plan, kind):
    return [s for s in plan.specs if isinstance(s, kind)]


def _addressable(op, stride):
    v = op.view
    return (tma_addressable(v, True) or tma_addressable(v, False)) and stride * v.itemsize % 16 == 0


# --- bmm ---------------------------------------------------------------------------------------


def test_bmm_copies_what_tma_cannot_address_one_launch_per_operand():
    """torch's OpInfo bmm sample, bf16 (10, 5, 10) x (10, 10, 5): rows of 20 and 10 bytes, an
    output row of 10: each operand copied once for all 10 items, the output through scratch."""
    a, b, out = _view((5, 10), (10, 1)), _view((10, 5), (5, 1)), _view((5, 5), (5, 1))
    plan = _plan.bmm_plan(a, b, out, 10, (50, 50, 25), None)
    copy_a, copy_b, gemm, copy_out = plan.specs
    assert isinstance(gemm, _plan._Gemm) and gemm.batch.count == 10
    for copy, src, shape in ((copy_a, _plan.A, (10, 5, 10)), (copy_b, _plan.B, (10, 10, 5))):
        assert copy.src.src == _plan.Src(src) and copy.src.view.shape == shape  # the whole batch
        assert copy.dst.src.index == _plan.SCRATCH and copy.dst.view.shape == shape
    assert _addressable(gemm.a, gemm.batch.a) and _addressable(gemm.b, gemm.batch.b)
    assert (gemm.a.src, gemm.b.src) == (copy_a.dst.src, copy_b.dst.src)
    assert gemm.d.src.index == _plan.SCRATCH and tma_addressable(gemm.d.view, True) and gemm.batch.c * 2 % 16 == 0
    assert copy_out.src.src == gemm.d.src and copy_out.dst.src == _plan.Src(_plan.OUT)
    assert copy_out.dst.view.shape == (10, 5, 5) and copy_out.dst.view.strides == (25, 5, 1)
    assert plan.scratch_bytes >= 10 * (5 * 16 + 10 * 8 + 5 * 8) * 2


@pytest.mark.parametrize("case", ["misaligned base", "batch stride", "odd strides", "broadcast"])
def test_bmm_copies_only_the_operands_that_need_it(case):
    aligned_b, strides = _view((64, 32), (32, 1)), (64 * 64, 64 * 32, 4 * 32)
    a = {"misaligned base": _view((4, 64), (64, 1), ptr=BASE + 2),
         "batch stride": _view((4, 64), (64, 1)),
         "odd strides": _view((4, 64), (2, 8)),  # neither row- nor column-major
         "broadcast": _view((4, 60), (61, 1))}[case]
    sa = {"batch stride": 4 * 64 + 1, "broadcast": 0}.get(case, 4 * 64)
    b = aligned_b if case != "broadcast" else _view((60, 32), (32, 1))
    plan = _plan.bmm_plan(a, b, _view((4, 32), (32, 1)), 3, (sa, strides[1], strides[2]), None)
    (copy,) = _specs(plan, _plan._Copy)
    (gemm,) = _specs(plan, _plan._Gemm)
    assert copy.src.src == _plan.Src(_plan.A)
    if case == "broadcast":  # one matrix for every item: one matrix copied, read at batch stride 0
        assert copy.src.view.ndim == 2 and gemm.batch.a == 0
    else:
        assert copy.src.view.shape == (3, 4, 64) and copy.src.view.strides[0] == sa
    assert gemm.b.src == _plan.Src(_plan.B) and gemm.d.src == _plan.Src(_plan.OUT)


def test_bmm_of_tma_addressable_operands_copies_nothing():
    plan = _plan.bmm_plan(_view((8, 64), (1, 8)), _view((64, 32), (32, 1)), _view((8, 32), (32, 1)), 5,
                          (512, 2048, 256), None)
    assert [type(s) for s in plan.specs] == [_plan._Gemm]


def test_bmm_column_major_out_runs_swapped():
    """out[i] column-major: out.T = b.T @ a.T, as gemm computes it, with no copy."""
    a, b, out = _view((8, 64), (64, 1)), _view((64, 24), (24, 1)), _view((8, 24), (1, 8))
    (gemm,) = _plan.bmm_plan(a, b, out, 4, (512, 1536, 192), None).specs
    assert (gemm.a.src, gemm.b.src, gemm.d.src) == (_plan.Src(_plan.B), _plan.Src(_plan.A), _plan.Src(_plan.OUT))
    assert gemm.d.view.shape == (24, 8) and (gemm.batch.a, gemm.batch.b) == (1536, 512)


@pytest.mark.parametrize("count,z", [(1, 1), (10, 10), (70000, 65535)])
def test_a_batched_copy_is_one_launch(monkeypatch, count, z):
    """The copy kernel's grid: blocks of 8 rows x 32 columns, z over the batch up to its limit
    (the kernel strides over the rest)."""
    launches = []
    monkeypatch.setattr(extra_launches, "prepare_launch", lambda *args: launches.append(args))
    monkeypatch.setattr(extra_launches, "as_numba", lambda v: v)
    shape = (count, 100, 70) if count > 1 else (100, 70)
    src = _view(shape, (7000, 70, 1)[-len(shape):])
    dst = _view(shape, (8000, 80, 1)[-len(shape):])
    extra_launches.prepare_copy(src, dst)
    ((kernel, grid, block, (s, d)),) = launches
    assert grid == (13, 3, z) and block == (8, 32)
    assert s.shape == d.shape == (count, 100, 70) and (s.strides[1:], d.strides[1:]) == ((70, 1), (80, 1))


# --- K == 0 ------------------------------------------------------------------------------------

EPILOGUES = {
    "c": lambda M, N: {"beta": 0.5, "c": _view((M, N), (N, 1))},
    "bias per row": lambda M, N: {"bias": _view((M,), (1,), "f32")},
    "sigmoid": lambda M, N: {},
    "aux_out": lambda M, N: {"aux": _view((M, N), (N, 1), "f32")},
}


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("out_major", ["R", "C"])
def test_k0_with_an_epilogue_runs_the_kernel_on_a_zeroed_k_block(name, out_major):
    M, N = 7, 96
    fusion = Fusion(EPILOGUES[name](M, N), bias_dim=0, activation="sigmoid")
    out = _view((M, N), (N, 1)) if out_major == "R" else _view((M, N), (1, M + 1))
    plan = _plan.gemm_plan(_view((M, 0), (1, 1)), _view((0, N), (1, 1)), out, fusion, None, False, split_k=4)
    memset = plan.specs[0]
    (gemm,) = _specs(plan, _plan._Gemm)
    assert isinstance(memset, _plan._Memset) and memset.src.index == _plan.SCRATCH
    assert memset.width == (M + N) * 128 and gemm.batch.count == 1  # (split_k: nothing to split)
    kernel_a, kernel_b = (gemm.a, gemm.b) if out_major == "R" else (gemm.b.t(), gemm.a.t())
    assert kernel_a.view.shape == (M, 64) and kernel_a.view.strides == (64, 1)  # K-major zeros, one k-block
    assert kernel_b.view.shape == (64, N) and kernel_b.view.strides == (1, 64)
    for op in (kernel_a, kernel_b):
        assert op.src.index == _plan.SCRATCH
        assert memset.src.offset <= op.src.offset < memset.src.offset + memset.width
    assert gemm.cfg.epilogue is not None and gemm.cfg.epilogue.activation == "sigmoid"
    assert gemm.d.src == _plan.Src(_plan.OUT)


def test_k0_gated_and_fp8():
    gated = Fusion({"up": _view((0, 64), (1, 1))}, activation="silu")
    plan = _plan.gemm_plan(_view((16, 0), (1, 1)), _view((0, 64), (1, 1)), _view((16, 64), (64, 1)), gated, None,
                           False)
    (gemm,) = _specs(plan, _plan._Gemm)
    assert gemm.up is gemm.b and gemm.cfg.gated  # B_up: the same zeros as B
    fp8 = Fusion({"alpha": 2.0}, activation="relu")
    plan = _plan.gemm_plan(_view((16, 0), (1, 1), "e4m3"), _view((0, 64), (1, 1), "e5m2"),
                           _view((16, 64), (64, 1)), fp8, None, False)
    (gemm,) = _specs(plan, _plan._Gemm)
    assert gemm.a.view.shape == (16, 128) and gemm.b.view.shape == (128, 64)  # one fp8 k-block: 128 elements
    assert plan.specs[0].width == (16 + 64) * 128


def test_of_zero_product_drops_block_scales_and_keeps_the_rest():
    scales = {"a_block_scales": _view((4, 0), (1, 1), "f32"), "b_block_scales": _view((0, 1), (1, 1), "f32")}
    assert Fusion(dict(scales)).of_zero_product() is None  # nothing left: the zero fill
    kept = Fusion({**scales, "alpha": 2.0}, activation="gelu").of_zero_product()
    assert set(kept.operands) == {"alpha"} and kept.activation == "gelu" and not kept.block_scaled


_ADDRESSES = itertools.count(0x7F0000000000, 1 << 24)


def _m(rows, cols, typestr="<f2", strides=None):
    return FakeCAI((rows, cols), typestr, ptr=next(_ADDRESSES), strides=strides)


@pytest.fixture
def planned(monkeypatch):
    """gemm/bmm on fake arrays, their plans recorded (``(kind, args)``) instead of built."""
    log = []
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: None)
    monkeypatch.setattr(plan_cache, "remember", lambda key, entry: None)
    monkeypatch.setattr(_plan.Plan, "__call__", lambda plan, stream, values: None)
    for name in ("gemm_plan", "zero_fill_plan", "bmm_plan"):
        real = getattr(api, name)
        monkeypatch.setattr(api, name, lambda *args, _name=name, _real=real: log.append((_name, args)) or _real(*args))
    return log


@pytest.mark.parametrize("kw,kind", [
    ({}, "zero_fill_plan"),
    ({"c": "c", "beta": 0.0}, "zero_fill_plan"),  # c unread: no epilogue
    ({"c": "c", "beta": 2.0}, "gemm_plan"),
    ({"bias": "bias"}, "gemm_plan"),
    ({"activation": "sigmoid"}, "gemm_plan"),  # sigmoid(0) = 0.5
    ({"alpha": 3.0}, "gemm_plan"),
    ({"row_scale": "rows"}, "gemm_plan"),
    ({"aux_out": "c"}, "gemm_plan"),
])
def test_k0_with_an_epilogue_is_planned_as_a_gemm(planned, kw, kind):
    M, N = 5, 24
    arrays = {"c": _m(M, N, "<f4"), "bias": FakeCAI((N,), "<f4", ptr=next(_ADDRESSES)),
              "rows": FakeCAI((M,), "<f4", ptr=next(_ADDRESSES))}
    kw = {k: arrays.get(v, v) if isinstance(v, str) else v for k, v in kw.items()}
    api.gemm(_m(M, 0), _m(0, N), out=_m(M, N), stream=0, **kw)
    assert [k for k, _ in planned] == [kind]


def test_k0_zero_fill_of_a_batch_is_one_memset(planned):
    api.bmm(FakeCAI((6, 7, 0), "<f2", ptr=next(_ADDRESSES)), FakeCAI((6, 0, 9), "<f2", ptr=next(_ADDRESSES)),
            out=FakeCAI((6, 7, 9), "<f2", ptr=next(_ADDRESSES)), stream=0)
    ((kind, args),) = planned
    memset, = _plan.zero_fill_plan(*args).specs
    assert kind == "zero_fill_plan" and (memset.rows, memset.width, memset.pitch) == (42, 18, 18)


def test_k0_zero_fill_of_any_layout():
    """Rows of an out that is neither row- nor column-major are not contiguous: zeros are copied in."""
    plan = _plan.zero_fill_plan(_view((7, 9), (18, 2)), 3, 200)
    memset, copy = plan.specs
    assert memset.src.index == _plan.SCRATCH and copy.src.src == memset.src
    assert copy.src.view.strides[0] == 0 and copy.dst.view.shape == (3, 7, 9) and copy.dst.src == _plan.Src(_plan.OUT)
    rows = _plan.zero_fill_plan(_view((7, 9), (16, 1)), 3, 200).specs  # rows, but not evenly spaced items
    assert [(m.src, m.rows, m.pitch) for m in rows] == [(_plan.Src(_plan.OUT, 400 * i), 7, 32) for i in range(3)]
