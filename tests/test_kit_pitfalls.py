"""What ptxas and numba do to wgmma code, as docs/authoring/pitfalls.md describes it (CPU).

Each test compiles a pair of kernels, the trap and its fix, and checks the SASS or the error:
the page's evidence, rerun with ``pytest tests/test_kit_pitfalls.py``. A test here that starts
failing after a toolchain update means the page needs updating, not that the kit broke.
"""

import math
import pathlib
import re
import runpy

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import TypingError

from numba_hopper import intrinsics as nh
from numba_hopper.kit import a_operand, exp2_rows, make_wait_after, row_max, row_sum, scale_rows, wgmma_stages
from numba_hopper.tools.sass import inspect_kernel

SIG = "void(float32[:, ::1], int32)"
EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SC = np.float32(0.18)


def _codes(report):
    return sorted(set(re.findall(r"\((C\d{4})\)", " ".join(report.warnings))))


@cuda.jit(device=True, forceinline=True)
def _scores(d):
    """S = Q K^T of a 64 x 64 bf16 tile (SW128 K-major descriptors at ``d``), waited for."""
    s = nh.wgmma_fence_operand(nh.wgmma_accumulator(64, "f32"))
    nh.wgmma_fence()
    s = nh.wgmma_mma_async(s, d, d, 0, "bf16", "bf16", 1, 1, 0, 0)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    return nh.wgmma_fence_operand(s)


@cuda.jit(device=True, forceinline=True)
def _store(o, out):
    frag = nh.tuple_as_array(nh.wgmma_fence_operand(o))
    for r in range(32):
        out[cuda.threadIdx.x, r] = frag[r]


# --- converting P between RS wgmmas: a fence on every wgmma, silently --------------------------


@cuda.jit(launch_bounds=(128, 1))
def _convert_between(out, n):
    d = nh.matrix_descriptor(nh.dynamic_shared_base(), 16, 1024, 128, 0)
    p = nh.tuple_as_array(exp2_rows(_scores(d), SC, (np.float32(1), np.float32(2))))
    o = nh.wgmma_accumulator(64, "f32")
    nh.wgmma_fence()
    for kk in range(4):
        a = (nh.pack_bf16x2(p[8 * kk], p[8 * kk + 1]), nh.pack_bf16x2(p[8 * kk + 2], p[8 * kk + 3]),
             nh.pack_bf16x2(p[8 * kk + 4], p[8 * kk + 5]), nh.pack_bf16x2(p[8 * kk + 6], p[8 * kk + 7]))
        o = nh.wgmma_mma_async_rs(o, a, d + np.uint64(2 * kk), 1, "bf16", "bf16", 1, 1, 1)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    _store(o, out)


@cuda.jit(launch_bounds=(128, 1))
def _convert_before(out, n):
    d = nh.matrix_descriptor(nh.dynamic_shared_base(), 16, 1024, 128, 0)
    packed = nh.pack_tuple(exp2_rows(_scores(d), SC, (np.float32(1), np.float32(2))), "bf16")
    o = nh.wgmma_accumulator(64, "f32")
    nh.wgmma_fence()
    for kk in range(4):
        o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), d + np.uint64(2 * kk), 1, "bf16", "bf16", 1, 1, 1)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)
    _store(o, out)


def test_converting_between_rs_wgmmas_fences_each_one_without_a_warning():
    between, before = inspect_kernel(_convert_between, SIG), inspect_kernel(_convert_before, SIG)
    assert between.count("HGMMA") == before.count("HGMMA") == 5
    assert between.count("WARPGROUP.ARRIVE") == 5 and not between.warnings  # S's fence and one per RS wgmma
    assert before.count("WARPGROUP.ARRIVE") == 2 and not before.warnings  # S's, then one for the batch


# --- a wgmma input written while a wgmma reading it is in flight: C7513 ---------------------------


def _pv_loop(write_while_in_flight):
    @cuda.jit(launch_bounds=(128, 1))
    def kernel(out, n):
        d = nh.matrix_descriptor(nh.dynamic_shared_base(), 16, 1024, 128, 0)
        s = _scores(d)
        packed = nh.pack_tuple(s, "bf16")
        o = nh.wgmma_accumulator(64, "f32")
        for j in range(n):
            nh.wgmma_fence()
            for kk in range(4):
                o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), d + np.uint64(2 * kk), 1, "bf16", "bf16", 1, 1,
                                          1)
            nh.wgmma_commit_group()
            p = exp2_rows(s, SC, (np.float32(j), np.float32(j)))  # f32 math while P V runs: fine
            if write_while_in_flight:
                packed = nh.pack_tuple(p, "bf16")  # rewrites the A registers the wgmmas read
                nh.wgmma_wait_group(0)
            else:
                nh.wgmma_wait_group(0)
                packed = nh.pack_tuple(p, "bf16")
        _store(o, out)

    return kernel


def test_writing_rs_a_registers_in_flight_serializes_every_wgmma():
    trap, fix = inspect_kernel(_pv_loop(True), SIG), inspect_kernel(_pv_loop(False), SIG)
    assert _codes(trap) == ["C7513"] and trap.count("WARPGROUP.DEPBAR") == trap.count("HGMMA")
    assert not fix.warnings and fix.count("WARPGROUP.ARRIVE") == 2


@cuda.jit(launch_bounds=(128, 1))
def _rescale_in_flight(out, n):
    d = nh.matrix_descriptor(nh.dynamic_shared_base(), 16, 1024, 128, 0)
    o = nh.wgmma_accumulator(64, "f32")
    for j in range(n):
        nh.wgmma_fence()
        o = nh.wgmma_mma_async(o, d, d, 1, "bf16", "bf16", 1, 1, 0, 0)
        nh.wgmma_commit_group()
        o = scale_rows(o, (np.float32(0.5), np.float32(0.25)))  # reads the accumulator in flight
        nh.wgmma_wait_group(0)
    _store(o, out)


def test_reading_an_accumulator_in_flight_injects_a_wait():
    r = inspect_kernel(_rescale_in_flight, SIG)
    assert _codes(r) == ["C7514", "C7517"], r.warnings


def test_an_unpinned_fresh_accumulator_serializes_the_pipelined_example():
    """examples/05's k-loop with ``wgmma_accumulator`` in place of the pinned
    ``MMA.accumulator()``: ptxas moves the zeroing into the loop's wgmma stage (C7515)."""
    source = (EXAMPLES / "05_pipelined_gemm.py").read_text()
    assert "acc = MMA.accumulator()" in source
    unpinned = {"__name__": "unpinned_05"}
    exec(compile(source.replace("acc = MMA.accumulator()", 'acc = nh.wgmma_accumulator(BN, "f32")'), "unpinned_05",
                 "exec"), unpinned)
    pinned = runpy.run_path(str(EXAMPLES / "05_pipelined_gemm.py"))
    (trap, sig), = unpinned["KERNELS"]
    (fix, _), = pinned["KERNELS"]
    trap_report, fix_report = inspect_kernel(trap, sig), inspect_kernel(fix, sig)
    assert _codes(trap_report) == ["C7515"] and trap_report.count("WARPGROUP.ARRIVE") == 4
    assert not fix_report.warnings and fix_report.count("WARPGROUP.ARRIVE") == 1


# --- where the wait lands: ptxas moves WARPGROUP.DEPBAR up to the wgmmas it waits for ---------------


def _between(report, first, last, what):
    """SASS lines of ``what`` between the first ``first`` and the next ``last`` after it."""
    lines = [line for line in report.sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    start = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i in range(start, len(lines)) if last in lines[i])
    return sum(what in line for line in lines[start:end])


def _softmax_under_pv(pinned):
    """FlashAttention-3's order: S_{j+1} and P_j V_j issued, wait for S, softmax while P V runs,
    wait for P V (``pinned``: through ``make_wait_after``, which stores the row sums first)."""
    wait_after = make_wait_after(0)

    @cuda.jit(launch_bounds=(128, 1))
    def kernel(out, n):
        smem = nh.dynamic_shared_base()
        d = nh.matrix_descriptor(smem, 16, 1024, 128, 0)
        s = _scores(d)
        m = row_max(s, (np.float32(-np.inf), np.float32(-np.inf)))
        packed = nh.pack_tuple(exp2_rows(s, SC, (m[0] * SC, m[1] * SC)), "bf16")
        o = nh.wgmma_accumulator(64, "f32")
        l = (np.float32(0), np.float32(0))
        for j in range(n):
            nh.wgmma_fence()
            s = nh.wgmma_mma_async(nh.wgmma_accumulator(64, "f32"), d + np.uint64(j), d, 0, "bf16", "bf16", 1, 1, 0,
                                   0)
            nh.wgmma_commit_group()
            for kk in range(4):
                o = nh.wgmma_mma_async_rs(o, a_operand(packed, kk), d + np.uint64(2 * kk), 1, "bf16", "bf16", 1, 1,
                                          1)
            nh.wgmma_commit_group()
            nh.wgmma_wait_group(1)
            s = nh.wgmma_fence_operand(s)
            m_new = row_max(s, m)
            alpha = (nh.ex2_approx_ftz((m[0] - m_new[0]) * SC), nh.ex2_approx_ftz((m[1] - m_new[1]) * SC))
            p = exp2_rows(s, SC, (m_new[0] * SC, m_new[1] * SC))
            l = row_sum(p, (alpha[0] * l[0], alpha[1] * l[1]))
            if pinned:
                wait_after(smem + 32768, l[0], l[1])  # (an 8-byte slot nobody reads)
            else:
                nh.wgmma_wait_group(0)
            o = scale_rows(nh.wgmma_fence_operand(o), alpha)
            packed = nh.pack_tuple(p, "bf16")
            m = m_new
        _store(scale_rows(o, l), out)

    return kernel


def test_ptxas_hoists_the_wait_above_the_softmax_unless_pinned():
    """The PTX has the softmax between ``wait_group(1)`` and ``wait_group(0)``. In the SASS,
    ptxas puts both waits back to back after the wgmmas and every MUFU.EX2 of the loop after
    them; with the wait after a shared store of the row sums, the softmax stays between."""
    trap, fix = inspect_kernel(_softmax_under_pv(False), SIG), inspect_kernel(_softmax_under_pv(True), SIG)
    assert not trap.warnings and not fix.warnings
    ptx = trap.ptx[trap.ptx.index("wait_group.sync.aligned 1"):]
    assert ptx.index("ex2.approx.ftz.f32") < ptx.index("wait_group.sync.aligned 0")
    assert _between(trap, "DEPBAR.LE gsb0, 0x1", "DEPBAR.LE gsb0, 0x0", "MUFU.EX2") == 0, trap.summary()
    assert _between(fix, "DEPBAR.LE gsb0, 0x1", "DEPBAR.LE gsb0, 0x0", "MUFU.EX2") >= 32, fix.summary()
    loop = [stage for stage in wgmma_stages(fix.sass) if stage.wgmmas == 5]  # S and P V of an iteration
    assert loop and loop[0].count("MUFU.EX2") >= 32 and not loop[0].a_register_writes


# --- fastmath and -inf; numba's constant sizes ------------------------------------------------------


def _masked_max(fastmath):
    @cuda.jit(fastmath=fastmath)
    def kernel(x, out):
        t = cuda.threadIdx.x
        m = np.float32(-np.inf)
        for i in range(x.shape[0]):
            m = max(m, x[i, t])
        safe = np.float32(0) if m == np.float32(-np.inf) else m  # a row whose every key is masked
        out[t] = math.exp2(x[0, t] - safe)

    return kernel


def test_fastmath_deletes_the_minus_infinity_test():
    """``fastmath=True`` lets LLVM assume no value is infinite: the guard is folded away."""
    minus_inf = re.compile(r"setp\.\w+\.f32\s+%p\d+, %f\d+, 0fFF800000")
    sig = "void(float32[:, ::1], float32[::1])"
    assert minus_inf.search(inspect_kernel(_masked_max(False), sig).ptx)
    assert not minus_inf.search(inspect_kernel(_masked_max(True), sig).ptx)


BN = 256
HALF_BN = BN // 2


def test_local_array_sizes_must_be_constants_numba_can_read():
    def computed(out):
        buf = cuda.local.array(BN // 2, np.float32)  # an expression: typed as int64, not a constant
        buf[0] = 1
        out[0] = buf[0]

    def named(out):
        buf = cuda.local.array(HALF_BN, np.float32)  # a module-level name: a literal to numba
        buf[0] = 1
        out[0] = buf[0]

    with pytest.raises(TypingError, match=r"array\(int64, class\(float32\)\)"):
        cuda.compile_ptx(computed, "void(float32[::1])", cc=(9, 0, "a"))
    cuda.compile_ptx(named, "void(float32[::1])", cc=(9, 0, "a"))
