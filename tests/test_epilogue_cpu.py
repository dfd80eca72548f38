"""Fused GEMM epilogues on a CPU: what the fused kernels compile to, and gemm()'s option checks."""

import itertools

import pytest
from numba import cuda
from numba.cuda import types

from _fakes import FakeCAI
from numba_hopper.errors import OverlapError
from numba_hopper import gemm
from numba_hopper.kernels import gemm_argument_types
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.matmul.heuristics import max_stages
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel
from numba_hopper.tools.sass import inspect_kernel

F32 = types.float32


@cuda.jit(device=True)
def _scaled(v, row, col, scale):
    return v * scale[col]


def _fused(out_dtype, ecfg, ep_types, block_n=256, **kw):
    stages = max_stages("bf16", out_dtype, block_n, epilogue=ecfg, **kw)
    cfg = GemmConfig("bf16", out_dtype, "K", "N", block_n=block_n, stages=stages, epilogue=ecfg, **kw)
    assert cfg.shared_bytes <= 227 * 1024
    return inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg, ep_types))


BIAS_GELU_C = (EpilogueConfig(c_dtype="bf16", bias="col", bias_dtype="bf16", activation="gelu_tanh"),
               (F32, types.uint16[::1]))
USER = (EpilogueConfig(user=_scaled), (types.Tuple((types.float32[::1],)),))


# (Each fusion with one output dtype: the store of the result is the plain kernel's, compiled
# for both dtypes in test_gemm_cpu.)
@pytest.mark.kernel_matrix
@pytest.mark.parametrize("out_dtype,fusion", [("bf16", BIAS_GELU_C), ("f32", USER)], ids=["bias+gelu_tanh+c", "user-f32"])
def test_fused_kernels_do_not_spill(fusion, out_dtype):
    ecfg, ep_types = fusion
    r = _fused(out_dtype, ecfg, ep_types)
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("HGMMA") >= 4 and r.count("USETMAXREG") == 2 and not r.setmaxnreg_ignored
    assert r.count("UTMASTG") == 256 // GemmConfig(out_dtype=out_dtype).epi_cols  # sub-tiles unrolled
    if ecfg.c_dtype and out_dtype == "bf16":
        assert r.count("LDSM") > 0  # C read back with ldmatrix at stmatrix's addresses


def test_fused_64_row_tiles_do_not_spill():
    r = _fused("bf16", *BIAS_GELU_C, block_m=64, block_n=128)
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("USETMAXREG") == 0  # one consumer warpgroup keeps every register
    assert r.count("UTMASTG") == 2 and r.count("LDSM") > 0


def test_fused_192_row_tiles_do_not_spill():
    """Three consumers share what the producer gives back: 160 registers each."""
    r = _fused("bf16", *BIAS_GELU_C, block_m=192, block_n=192)
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("USETMAXREG") == 2 and r.count("UTMASTG") == 3 and r.count("LDSM") > 0


# Debug builds are not in this list: like plain debug builds (tests/test_debug_cpu.py) they
# spill, the bounded waits' bookkeeping costs registers and speed is not their point.
def test_fused_kernels_with_clusters_do_not_spill():
    r = _fused("bf16", *BIAS_GELU_C, cluster_m=2, cluster_n=2)  # both multicasts in one compile
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.count("UTMASTG") == 4 and r.count("LDSM") > 0


def test_split_k_refuses_an_epilogue():
    from numba_hopper.matmul import plan as _plan
    from numba_hopper.matmul.fusion import Fusion
    from numba_hopper.runtime.arrays import device_view

    va, vb, vo = device_view(_m(128, 64)), device_view(_m(64, 256)), device_view(_m(128, 256))
    with pytest.raises(ValueError, match="split_k > 1 cannot run a fused epilogue"):
        _plan.gemm_plan(va, vb, vo, Fusion(activation="relu"), None, False, split_k=2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="split_k must be None or an int >= 1"):
            gemm(A, B, split_k=bad)


def test_plain_kernel_has_no_epilogue_code():
    plain = inspect_kernel(make_gemm_kernel(GemmConfig()), gemm_argument_types(GemmConfig()))
    assert plain.count("LDSM") == 0 and plain.count("MUFU.TANH") == 0
    assert GemmConfig().shared_bytes == GemmConfig(epilogue=None).shared_bytes


def test_c_buffers_cost_one_stage():
    ecfg = BIAS_GELU_C[0]
    assert max_stages("bf16", "bf16", 256, epilogue=ecfg) == max_stages("bf16", "bf16", 256) - 1
    assert GemmConfig(epilogue=ecfg, stages=3).c_buf_bytes == 64 * 64 * 2
    assert GemmConfig(epilogue=EpilogueConfig(activation="relu")).c_buf_bytes == 0


def test_epilogue_arg_order():
    e = EpilogueConfig(alpha=True, c_dtype="f16", bias="row", aux_dtype="f32", user=_scaled)
    assert e.arg_names == ("beta", "alpha", "bias", "aux", "user_args")
    assert EpilogueConfig().arg_names == ()


@pytest.mark.parametrize("kw,msg", [(dict(activation="tanh"), "activation"), (dict(bias="both"), "bias"),
                                    (dict(c_dtype="i8"), "c_dtype"), (dict(bias_dtype="f64"), "bias_dtype")])
def test_epilogue_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EpilogueConfig(**kw)


# --- gemm()'s checks of the epilogue options, before any GPU is needed ------------------------


_addresses = itertools.count(0x7F0000000000, 1 << 20)  # every fake array its own memory


def _m(rows, cols, typestr="<f2"):
    return FakeCAI((rows, cols), typestr, ptr=next(_addresses))


def _v(n, typestr="<f4"):
    return FakeCAI((n,), typestr, ptr=next(_addresses))


A, B = _m(4, 8), _m(8, 6)  # M = 4, N = 6


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(c=_m(4, 5), beta=1.0), ValueError, "c has shape"),
    (dict(c=_m(4, 6, "<i4"), beta=1.0), TypeError, "c.dtype"),
    (dict(beta=1.0), ValueError, "needs c"),
    (dict(bias=_v(5)), ValueError, r"bias has shape \(5,\) for the 4 x 6 output; expected \(N,\) = \(6,\)"),
    (dict(bias=_v(6), bias_dim=0), ValueError, "bias has shape"),
    (dict(bias=_v(6), bias_dim=2), ValueError, "bias_dim must be"),
    (dict(bias=_v(6), bias_dim="1"), ValueError, "bias_dim must be"),
    (dict(bias=_v(6), bias_dim=True), ValueError, "bias_dim must be"),
    (dict(bias=FakeCAI((6, 1), "<f4")), ValueError, r"bias has shape \(6, 1\)"),
    (dict(bias=FakeCAI((4, 1), "<f4"), bias_dim=1), ValueError, r"with bias_dim=1 .* expected \(N,\) = \(6,\)"),
    (dict(bias=FakeCAI((1, 6), "<f4"), bias_dim=0), ValueError, r"with bias_dim=0 .* expected \(M,\) = \(4,\)"),
    (dict(bias=FakeCAI((2, 4, 6), "<f4")), ValueError, "bias has shape"),
    (dict(bias=_v(6, "<i4")), TypeError, "bias.dtype"),
    (dict(bias_dim=1), ValueError, "without a bias"),
    (dict(activation="tanh"), ValueError, "activation"),
    (dict(aux_out=_m(6, 4)), ValueError, "aux_out has shape"),
    (dict(aux_out=_m(4, 6, "<f8")), TypeError, "aux_out.dtype"),
    (dict(row_scale=_v(6)), ValueError, "row_scale has shape"),
    (dict(col_scale=_v(6, "<f2")), TypeError, "col_scale.dtype"),
    (dict(epilogue=lambda v, r, c: v), TypeError, "epilogue must be"),
    (dict(epilogue_args=(1.0,)), ValueError, "without an epilogue"),
])
def test_gemm_rejects_bad_epilogue_options(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        gemm(A, B, **kw)


# (shape, strides in bytes or None, bias_dim) -> per row?, the vector's stride in elements
_BIASES = {"1-D": ((4,), None, None, False, 1), "(1, N)": ((1, 4), None, None, False, 1),
           "(M, 1)": ((4, 1), None, None, True, 1), "1-D, bias_dim=0": ((4,), None, 0, True, 1),
           "1-D, bias_dim=1": ((4,), None, 1, False, 1), "(M, 1), bias_dim=0": ((4, 1), None, 0, True, 1),
           "(1, N), bias_dim=1": ((1, 4), None, 1, False, 1),
           "a column of a matrix": ((4, 1), (32, 4), None, True, 8), "a strided row": ((1, 4), (64, 8), None, False, 2)}


@pytest.mark.parametrize("case", list(_BIASES))
def test_bias_of_a_square_output_is_per_column_unless_asked(case):
    """As torch.addmm and F.linear broadcast it, a 1-D bias is one value per column whatever M and
    N are (M == N included: a Llama q_proj at 4096 tokens); per row: bias_dim=0 or an (M, 1) bias."""
    from numba_hopper.matmul.fusion import check_fusion, fusion_args

    shape, strides, bias_dim, per_row, stride = _BIASES[case]
    bias = FakeCAI(shape, "<f4", ptr=next(_addresses), strides=strides)
    f = fusion_args(1.0, 0.0, None, bias, bias_dim, None, None, None, (), None, None)
    fusion = check_fusion(f, 4, 4, 8, 0, None, "f16")
    assert fusion.bias_dim == (0 if per_row else 1)
    assert fusion.config(transposed=False).bias == ("row" if per_row else "col")
    assert (fusion.operands["bias"].shape, fusion.operands["bias"].strides) == ((4,), (stride,))


@pytest.mark.parametrize("bias_dim", [None, 0, 1])
def test_a_wrong_length_names_the_lengths_that_fit(bias_dim):
    with pytest.raises(ValueError) as caught:
        gemm(_m(256, 8), _m(8, 256), bias=_v(17), bias_dim=bias_dim)
    message = str(caught.value)
    assert "bias has shape (17,)" in message and "fits rows and columns" not in message
    assert ("(N,) = (256,)" in message) == (bias_dim != 0) and ("(M, 1) = (256, 1)" in message) == (bias_dim != 1)


def test_valid_options_reach_the_gpu_check(monkeypatch):
    import numba_hopper.matmul.plan_cache as g

    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        gemm(A, B, c=_m(4, 6, "<f4"), beta=1.0, bias=_v(6), activation="gelu", aux_out=_m(4, 6),
             row_scale=_v(4), col_scale=_v(6), epilogue=_scaled, epilogue_args=(_v(6),), alpha=2.0)
    for kw in (dict(bias_dim=0), dict(bias_dim=1), {}):  # a square output: per column unless asked
        with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
            gemm(_m(4, 8), _m(8, 4), bias=_v(4), **kw)
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        gemm(_m(4, 8), _m(8, 4), bias=FakeCAI((4, 1), "<f2", ptr=next(_addresses)), activation="relu")


def _reach_gpu_check(monkeypatch, **kw):
    import numba_hopper.matmul.plan_cache as g

    monkeypatch.setattr(g, "hopper_device_reason", lambda: "no GPU here")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
        gemm(A, B, **kw)


def test_out_may_be_c(monkeypatch):
    c = _m(4, 6, "<f4")
    _reach_gpu_check(monkeypatch, out=c, c=c, beta=1.0)


def _overlapping_calls():
    out, c = _m(4, 6, "<f4"), _m(4, 6, "<f4")
    inside_out = FakeCAI((4, 6), "<f4", ptr=out.__cuda_array_interface__["data"][0] + 8)
    return {"c inside out": dict(out=out, c=inside_out, beta=1.0), "aux_out is out": dict(out=out, aux_out=out),
            "aux_out is c": dict(c=c, beta=1.0, aux_out=c), "aux_out is a": dict(aux_out=FakeCAI((4, 6), "<f2"))}  # FakeCAI's default address is A's


@pytest.mark.parametrize("case", list(_overlapping_calls()))
def test_written_arrays_must_not_overlap(case):
    with pytest.raises(OverlapError, match="overlaps"):
        gemm(A, B, **_overlapping_calls()[case])


def test_user_epilogue_kernels_skip_the_disk_cache(monkeypatch):
    from numba_hopper.matmul import plan as _plan
    from numba_hopper.runtime.arrays import device_view
    from numba_hopper.matmul.fusion import Fusion

    class Prepared(Exception):
        pass

    def prepare_launch(*args, cache_key=None, **kw):
        keys.append(cache_key)
        raise Prepared

    keys = []
    monkeypatch.setattr(_plan, "make_gemm_kernel", lambda cfg: None)
    monkeypatch.setattr(_plan, "encode_template", lambda *a, **kw: FakeTemplate)
    monkeypatch.setattr(_plan, "device_limits", lambda device: type("L", (), {"sm_count": 132})())
    monkeypatch.setattr(_plan, "prepare_launch", prepare_launch)
    va, vb, vo = device_view(_m(128, 64)), device_view(_m(64, 256)), device_view(_m(128, 256))
    for ecfg in (EpilogueConfig(activation="relu"), EpilogueConfig(user=_scaled)):
        fusion = Fusion(activation=ecfg.activation, user=ecfg.user)
        operands = (_plan.Operand(v, _plan.Src(i)) for v, i in ((va, _plan.A), (vb, _plan.B), (vo, _plan.OUT)))
        launch = _plan._Gemm(GemmConfig(epilogue=ecfg), *operands, _plan._Batch(), _plan._Scratch(), fusion=fusion)
        with pytest.raises(Prepared):
            launch.prepare((0, va.ptr, vb.ptr, vo.ptr, *[0] * (_plan.USER - _plan.OUT - 1)))
    assert keys[0] == ("gemm_sm90", GemmConfig(epilogue=EpilogueConfig(activation="relu")))
    assert keys[1] is None


class FakeTemplate:
    words = (0,) * 16
