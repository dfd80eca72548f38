"""ldmatrix / stmatrix / pack intrinsics (CPU)."""

import re

import numpy as np
import pytest
from numba import cuda

from numba_hopper.intrinsics import (
    ldmatrix_x1,
    ldmatrix_x1_trans,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    abs_bits,
    pack_bf16x2,
    pack_e4m3x2,
    pack_e5m2x2,
    pack_f16x2,
    shared_address,
    stmatrix_x1,
    stmatrix_x1_trans,
    stmatrix_x2,
    stmatrix_x2_trans,
    stmatrix_x4,
    stmatrix_x4_trans,
)
from numba_hopper.tools.sass import inspect_kernel


@cuda.jit(launch_bounds=(32, 1))
def _matrix_kernel(out, v):
    tile = cuda.shared.array(512, np.uint16, alignment=128)
    lane = cuda.threadIdx.x
    row = shared_address(tile) + 16 * lane
    x = v[lane]
    stmatrix_x1(row, x)
    stmatrix_x2(row, x, x + 1)
    stmatrix_x4(row, x, x + 1, x + 2, x + 3)
    stmatrix_x1_trans(row, x)
    stmatrix_x2_trans(row, x, x + 1)
    stmatrix_x4_trans(row, x, x + 1, x + 2, x + 3)
    cuda.syncwarp()
    a = ldmatrix_x1(row)
    b = ldmatrix_x2(row)
    c = ldmatrix_x4(row)
    d = ldmatrix_x1_trans(row)
    e = ldmatrix_x2_trans(row)
    f = ldmatrix_x4_trans(row)
    out[lane] = a[0] + b[0] + b[1] + c[0] + c[1] + c[2] + c[3] + d[0] + e[1] + f[3] + len(f) * len(b)


def test_ldmatrix_stmatrix_reach_ptx_and_sass():
    r = inspect_kernel(_matrix_kernel, "void(uint32[::1], uint32[::1])")
    for num in (1, 2, 4):
        for t in ("", ".trans"):
            assert f"stmatrix.sync.aligned.m8n8.x{num}{t}.shared::cta.b16" in r.ptx
            assert f"ldmatrix.sync.aligned.m8n8.x{num}{t}.shared::cta.b16" in r.ptx
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared::cta\.b16 \{%r\d+, %r\d+, %r\d+, %r\d+\}, \[%r\d+\];",
                     r.ptx)
    assert r.count("STSM") == 6 and r.count("LDSM") == 6
    assert re.search(r"STSM\.16\.MT88\.4 ", r.sass) and re.search(r"LDSM\.16\.MT88\.4 ", r.sass)
    assert r.spill_bytes == 0 and not r.warnings


@cuda.jit(launch_bounds=(32, 1))
def _pack_kernel(out, x):
    lo = x[0]
    hi = x[1]
    out[0] = pack_f16x2(lo, hi)
    out[1] = pack_bf16x2(lo, hi)


def test_pack_puts_lo_in_the_low_half():
    r = inspect_kernel(_pack_kernel, "void(uint32[::1], float32[::1])")
    # cvt's first source goes to the upper half: it must be hi (x[1]), the second lo (x[0])
    assert re.search(r"cvt\.rn\.bf16x2\.f32\s+%r\d+, %f\d+, %f\d+;", r.ptx)
    m = re.search(r"ld\.global\.f32\s+(%f\d+), \[%rd\d+\];\s+ld\.global\.f32\s+(%f\d+), \[%rd\d+\+4\];", r.ptx)
    lo, hi = m.group(1), m.group(2)
    assert re.search(rf"cvt\.rn\.f16x2\.f32\s+%r\d+, {hi}, {lo};", r.ptx), r.ptx
    assert re.search(rf"cvt\.rn\.bf16x2\.f32\s+%r\d+, {hi}, {lo};", r.ptx), r.ptx
    assert r.count("F2FP") >= 2  # SASS pack-convert


@cuda.jit(launch_bounds=(32, 1))
def _pack_fp8_kernel(out, bits, x):
    lo = x[0]
    hi = x[1]
    out[0] = pack_e4m3x2(lo, hi)
    out[1] = pack_e5m2x2(lo, hi)
    bits[0] = abs_bits(lo)


def test_fp8_pack_puts_lo_in_the_low_byte_and_saturates():
    r = inspect_kernel(_pack_fp8_kernel, "void(uint16[::1], uint32[::1], float32[::1])")
    m = re.search(r"ld\.global\.f32\s+(%f\d+), \[%rd\d+\];\s+ld\.global\.f32\s+(%f\d+), \[%rd\d+\+4\];", r.ptx)
    lo, hi = m.group(1), m.group(2)
    for t in ("e4m3x2", "e5m2x2"):
        assert re.search(rf"cvt\.rn\.satfinite\.{t}\.f32\s+%rs\d+, {hi}, {lo};", r.ptx), r.ptx
    assert "F2FP.SATFINITE.E4M3.F32.PACK_AB" in r.sass and "F2FP.SATFINITE.E5M2.F32.PACK_AB" in r.sass
    assert "and.b32 %r" in r.ptx and ", 0x7fffffff;" in r.ptx  # abs_bits


def test_stmatrix_wrong_arity_is_a_typing_error():
    @cuda.jit
    def k(out):
        stmatrix_x2(0, 1)
        out[0] = 0

    with pytest.raises(Exception, match=r"stmatrix_x2\(\) missing 1 required positional argument: 'r1'"):
        inspect_kernel(k, "void(uint32[::1])")
