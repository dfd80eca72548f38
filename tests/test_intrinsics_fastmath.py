"""Fast-math and packing intrinsics: each compiles to its one SASS instruction, and
``pack_tuple`` checks its arguments at compile time (CPU)."""

import math

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import TypingError

from numba_hopper import intrinsics as nh
from numba_hopper.kit.fragments import make_exp2_rows
from numba_hopper.tools.sass import inspect_kernel

SIG = "void(float32[::1], uint32[::1])"


def _one_op_kernel(op):
    @cuda.jit
    def kernel(x):
        t = cuda.threadIdx.x
        x[t] = op(x[t], x[t + 32])

    return kernel


@cuda.jit(device=True)
def _ex2_ftz(a, b):
    return nh.ex2_approx_ftz(a)


@cuda.jit(device=True)
def _rcp_ftz(a, b):
    return nh.rcp_approx_ftz(a)


@cuda.jit(device=True)
def _lg2_ftz(a, b):
    return nh.lg2_approx_ftz(a)


@cuda.jit(device=True)
def _fmax(a, b):
    return nh.fmax(a, b)


@cuda.jit(device=True)
def _fmin(a, b):
    return nh.fmin(a, b)


@cuda.jit(device=True)
def _fmax_nan(a, b):
    return nh.fmax_nan(a, b)


@cuda.jit(device=True)
def _math_exp2(a, b):
    return math.exp2(a)


@cuda.jit(device=True)
def _divide(a, b):
    return np.float32(1) / a


@pytest.mark.parametrize("op, sass, ptx", [
    (_ex2_ftz, "MUFU.EX2", "ex2.approx.ftz.f32"),
    (_rcp_ftz, "MUFU.RCP", "rcp.approx.ftz.f32"),
    (_lg2_ftz, "MUFU.LG2", "lg2.approx.ftz.f32"),
    (_fmax, "FMNMX", "max.f32"),
    (_fmin, "FMNMX", "min.f32"),
    (_fmax_nan, "FMNMX.NAN", "max.NaN.f32"),
], ids=["ex2", "rcp", "lg2", "fmax", "fmin", "fmax_nan"])
def test_each_is_one_instruction(op, sass, ptx):
    r = inspect_kernel(_one_op_kernel(op), "void(float32[::1])")
    assert ptx in r.ptx
    assert r.opcodes[sass] == 1, r.summary()
    # no range fix-up around the MUFU (what ex2.approx without .ftz and numba's math.exp2 get)
    assert r.count("FSETP") == 0 and r.count("FMUL") == 0, r.opcodes


@cuda.jit(device=True)
def _rsqrt(a, b):
    return nh.rsqrt_approx(a)


def test_rsqrt_is_the_mufu():
    """``rsqrt.approx.f32``: one MUFU.RSQ (with the denormal path around it, as CUDA's ``rsqrtf``)."""
    r = inspect_kernel(_one_op_kernel(_rsqrt), "void(float32[::1])")
    assert "rsqrt.approx.f32" in r.ptx and r.opcodes["MUFU.RSQ"] == 1, r.summary()


@cuda.jit(device=True)
def _ex2_fma(a, b):
    return nh.ex2_fma(a)


def test_ex2_fma_stays_off_the_mufu():
    """The software exponential: a cubic and the exponent's integer add, no MUFU (its values
    are checked on the GPU: ``test_kit_gpu.py::test_ex2_fma_against_float64``)."""
    r = inspect_kernel(_one_op_kernel(_ex2_fma), "void(float32[::1])")
    assert "add.rm.f32" in r.ptx and r.ptx.count("fma.rn.f32") == 3
    assert not any(op.startswith("MUFU") for op in r.opcodes), r.opcodes
    assert r.count("FFMA") == 3 and r.count("FMNMX") == 1, r.opcodes
    with pytest.raises(ValueError, match="fma_eighths"):
        make_exp2_rows(9)


def _instructions(report):
    return sum(n for op, n in report.opcodes.items() if op != "NOP")


def test_numba_defaults_take_longer_paths():
    """What the intrinsics replace: numba's float32 exp2 (a denormal range fix-up around the
    MUFU) and division (rcp.rn: a Newton refinement and a slow-path branch) without fastmath."""
    ex2 = inspect_kernel(_one_op_kernel(_math_exp2), "void(float32[::1])")
    assert ex2.count("FSETP") >= 1 and ex2.count("FMUL") >= 2, ex2.opcodes
    one = _instructions(inspect_kernel(_one_op_kernel(_rcp_ftz), "void(float32[::1])"))
    assert _instructions(inspect_kernel(_one_op_kernel(_divide), "void(float32[::1])")) >= one + 5


@cuda.jit
def _pack_kernel(x, out):
    t = cuda.threadIdx.x
    v = (x[t], x[t + 1], x[t + 2], x[t + 3], x[t + 4], x[t + 5], x[t + 6], x[t + 7])
    bf, f16 = nh.pack_tuple(v, "bf16"), nh.pack_tuple(v, "f16")
    e4, e5 = nh.pack_tuple(v, "e4m3"), nh.pack_tuple(v, "e5m2")
    out[t] = (bf[0] ^ bf[1] ^ bf[2] ^ bf[3] ^ f16[0] ^ f16[1] ^ f16[2] ^ f16[3] ^ e4[0] ^ e4[1] ^ e5[0] ^ e5[1]
              ^ nh.pack_e4m3x4(v[1], v[0], v[3], v[2]) ^ nh.pack_e5m2x4(v[5], v[4], v[7], v[6])
              ^ nh.byte_perm(bf[1], bf[2], 0x5410) ^ (len(bf) * 100 + len(e4) * 10))


def test_pack_tuple_sizes_and_sass():
    r = inspect_kernel(_pack_kernel, SIG)
    fp8 = sum(n for op, n in r.opcodes.items() if op.startswith("F2FP.SATFINITE.E"))
    assert r.count("F2FP.BF16.F32.PACK_AB") == 4 and r.count("F2FP.F16.F32.PACK_AB") == 4, r.opcodes
    assert fp8 == 12, r.opcodes  # one cvt per fp8 pair: 4 + 4 (tuples), 2 + 2 (x4)
    assert r.count("PRMT") >= 1
    assert "cvt.rn.bf16x2.f32" in r.ptx and "cvt.rn.satfinite.e5m2x2.f32" in r.ptx


@pytest.mark.parametrize("values, dtype, message", [
    ("(x[0], x[1], x[2])", "'bf16'", "multiple of 2"),
    ("(x[0], x[1], x[2], x[3], x[4], x[5])", "'e4m3'", "multiple of 4"),
    ("(x[0], x[1])", "'f32'", "one of"),
    ("(1, 2)", "'bf16'", "UniTuple of float32"),
])
def test_pack_tuple_rejects_bad_arguments_at_compile_time(values, dtype, message):
    namespace = {"cuda": cuda, "nh": nh}
    exec(f"def k(x, out):\n    out[0] = nh.pack_tuple({values}, {dtype})[0]\n", namespace)
    with pytest.raises((TypeError, TypingError), match=message):
        cuda.compile_ptx(namespace["k"], SIG, cc=(9, 0, "a"))
