"""wgmma intrinsics: the variant table, SASS for a sampling of variants, typing errors (CPU)."""

import itertools
import re
import subprocess
import tempfile

import pytest
from numba import cuda

from numba_hopper.intrinsics import (
    WGMMA_FAMILIES,
    dynamic_shared_base,
    matrix_descriptor,
    wgmma_accumulator,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_fence_operand,
    wgmma_mma_async,
    wgmma_mma_async_rs,
    wgmma_wait_group,
)
from numba_hopper.intrinsics.wgmma import wgmma_asm
from numba_hopper.tools.sass import find_tool, inspect_kernel

ACC_DTYPE = {"f32": "float32", "f16": "uint32", "s32": "int32"}


# --- the table against ptxas itself ------------------------------------------------


def _ptx_entry(i, n, k, dtype, at, bt, rs=False, ta=0, tb=0):
    """One .entry holding the intrinsic's own asm text, registers substituted for $i."""
    text, _ = wgmma_asm(n, k, dtype, at, bt, 1, 1, ta, tb, rs)
    nreg = n // (4 if dtype == "f16" else 2)
    acc = "%f" if dtype == "f32" else "%r"
    a_end = 2 * nreg + (4 if rs else 1)

    def reg(m):
        j = int(m.group(1))
        if j < nreg:
            return f"{acc}{j}"
        if j < a_end:
            return f"%a{j - 2 * nreg}" if rs else "%rd0"
        return "%rd1" if j == a_end else "%s"

    body = re.sub(r"\$(\d+)", reg, text)
    return (f".visible .entry v{i}() {{\n .reg .f32 %f<130>; .reg .b32 %r<130>; .reg .b32 %a<4>;"
            f" .reg .b32 %s; .reg .b64 %rd<2>;\n {body}\n ret;\n}}\n")


def _ptxas(entries):
    src = ".version 8.5\n.target sm_90a\n.address_size 64\n" + "".join(entries)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(src)
        f.flush()
        return subprocess.run([find_tool("ptxas"), "-arch=sm_90a", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True)


def _all_variants():
    for fam in WGMMA_FAMILIES:
        for acc in fam.accumulators:
            for at, bt in itertools.product(fam.types, fam.types):
                if fam.same_ab and at != bt:
                    continue
                for n in fam.n_values:
                    for rs in (False, True):
                        yield fam, n, acc, at, bt, rs


def test_every_table_variant_assembles():
    variants = list(_all_variants())
    assert len(variants) == 912
    entries = [_ptx_entry(i, n, fam.k, acc, at, bt, rs) for i, (fam, n, acc, at, bt, rs) in enumerate(variants)]
    # transposes, where the table allows them
    entries += [_ptx_entry(len(entries) + j, 64, 16, "f32", t, t, False, 1, 1) for j, t in enumerate(("f16", "bf16"))]
    out = _ptxas(entries)
    assert out.returncode == 0, out.stderr[:2000]


@pytest.mark.parametrize(
    "n, k, dtype, at, bt",
    [(n, 32, "s32", "s8", "s8") for n in (40, 56, 72, 136, 248)]  # integer N: multiples of 16 above 32
    + [(264, 16, "f32", "bf16", "bf16"), (256, 16, "f16", "bf16", "bf16"), (64, 8, "f16", "tf32", "tf32")],
)
def test_ptxas_rejects_what_the_table_leaves_out(n, k, dtype, at, bt):
    assert _ptxas([_ptx_entry(0, n, k, dtype, at, bt)]).returncode != 0
    fam = next(f for f in WGMMA_FAMILIES if at in f.types)
    assert n not in fam.n_values or dtype not in fam.accumulators


# --- numba kernels -------------------------------------------------------------------


def _ss_kernel(n, acc_t, at, bt, ta=0, tb=0, sa=1, sb=1):
    @cuda.jit(launch_bounds=(128, 1))
    def k(out, ktiles):
        base = dynamic_shared_base()
        acc = wgmma_accumulator(n, acc_t)
        for kt in range(ktiles):
            da = matrix_descriptor(base + kt * 32, 128, 256, 0, 0)
            db = matrix_descriptor(base + 32768 + kt * 32, 128, 256, 0, 0)
            wgmma_fence()
            acc = wgmma_mma_async(acc, da, db, kt, at, bt, sa, sb, ta, tb)
            wgmma_commit_group()
            wgmma_wait_group(0)
        for r in range(len(acc)):
            out[cuda.threadIdx.x * len(acc) + r] = acc[r]

    return k


def _rs_kernel(n, acc_t, at, bt, tb=0, sa=1):
    @cuda.jit(launch_bounds=(128, 1))
    def k(out, a_in, ktiles):
        base = dynamic_shared_base()
        t = cuda.threadIdx.x
        acc = wgmma_accumulator(n, acc_t)
        for kt in range(ktiles):
            a = (a_in[4 * t], a_in[4 * t + 1], a_in[4 * t + 2], a_in[4 * t + 3])
            db = matrix_descriptor(base + kt * 32, 128, 256, 0, 0)
            wgmma_fence()
            acc = wgmma_mma_async_rs(acc, a, db, 1, at, bt, sa, 1, tb)
            wgmma_commit_group()
            wgmma_wait_group(0)
        for r in range(len(acc)):
            out[t * len(acc) + r] = acc[r]

    return k


def test_m64n256k16_bf16_accumulator_in_a_loop_has_no_spills():
    r = inspect_kernel(_ss_kernel(256, "f32", "bf16", "bf16"), "void(float32[::1], int32)")
    assert re.search(r"HGMMA\.64x256x16\.F32\.BF16 ", r.sass), r.summary()
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in r.ptx
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert r.registers <= 168, r.summary()
    assert r.count("WARPGROUP.ARRIVE") >= 1 and r.count("WARPGROUP.DEPBAR") >= 1
    assert not r.warnings, r.warnings  # no C7517: accumulators are read after the wait


@pytest.mark.parametrize(
    "n, acc_t, at, bt, ta, tb, sa, sass",
    [
        (8, "f32", "f16", "f16", 0, 0, 1, r"HGMMA\.64x8x16\.F32 "),
        (64, "f16", "f16", "f16", 1, 1, -1, r"HGMMA\.64x64x16\.F16 .*tnspA\.tnspB"),
        (256, "f32", "bf16", "bf16", 0, 1, 1, r"HGMMA\.64x256x16\.F32\.BF16 .*tnspB"),
        (128, "f32", "tf32", "tf32", 0, 0, -1, r"HGMMA\.64x128x8\.F32\.TF32 "),
        (64, "f32", "e4m3", "e5m2", 0, 0, 1, r"QGMMA\.64x64x32\.F32\.E4M3\.E5M2 "),
        (160, "f16", "e5m2", "e4m3", 0, 0, 1, r"QGMMA\.64x160x32\.F16\.E5M2\.E4M3 "),
        (24, "s32", "s8", "u8", 0, 0, 1, r"IGMMA\.64x24x32\.S8\.U8 "),
        (256, "s32", "u8", "s8", 0, 0, 1, r"IGMMA\.64x256x32\.U8\.S8 "),
    ],
)
def test_ss_variants_compile_to_gmma(n, acc_t, at, bt, ta, tb, sa, sass):
    r = inspect_kernel(_ss_kernel(n, acc_t, at, bt, ta, tb, sa), f"void({ACC_DTYPE[acc_t]}[::1], int32)")
    assert re.search(sass, r.sass), [l for l in r.sass.splitlines() if "GMMA" in l][:2]
    assert r.spill_bytes == 0 and not r.warnings, r.summary()


@pytest.mark.parametrize(
    "n, acc_t, at, bt, tb, sass",
    [
        (64, "f32", "bf16", "bf16", 1, r"HGMMA\.64x64x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\]\.tnspB"),
        (16, "f16", "f16", "f16", 0, r"HGMMA\.64x16x16\.F16 R\d+, R\d+, gdesc"),
        (256, "f32", "tf32", "tf32", 0, r"HGMMA\.64x256x8\.F32\.TF32 R\d+, R\d+, gdesc"),
        (32, "f16", "e5m2", "e5m2", 0, r"QGMMA\.64x32x32\.F16\.E5M2\.E5M2 R\d+, R\d+, gdesc"),
        (256, "s32", "u8", "u8", 0, r"IGMMA\.64x256x32\.U8\.U8 R\d+, R\d+, gdesc"),
    ],
)
def test_rs_variants_compile_to_gmma_with_register_a(n, acc_t, at, bt, tb, sass):
    r = inspect_kernel(_rs_kernel(n, acc_t, at, bt, tb), f"void({ACC_DTYPE[acc_t]}[::1], uint32[::1], int32)")
    assert re.search(sass, r.sass), [l for l in r.sass.splitlines() if "GMMA" in l][:2]
    assert r.spill_bytes == 0 and not r.warnings, r.summary()


def test_accumulator_types_and_fence_operand():
    @cuda.jit(launch_bounds=(128, 1))
    def k(f32_out, f16_out, s32_out):
        a = wgmma_fence_operand(wgmma_accumulator(64, "f32"))
        b = wgmma_accumulator(64, "f16")
        c = wgmma_accumulator(24, "s32")
        f32_out[0] = len(a) + a[31]
        f16_out[0] = len(b) + b[15]
        s32_out[0] = len(c) + c[11]

    r = inspect_kernel(k, "void(float32[::1], uint32[::1], int32[::1])")
    # len 32 (+ an opaque value: fence_operand hides the zero), len 16 + 0, len 12 + 0
    assert re.search(r"add\.f32\s+%f\d+, %f\d+, 0f42000000;", r.ptx), r.ptx
    assert re.search(r"mov\.u32\s+%r\d+, 16;", r.ptx) and re.search(r"mov\.u32\s+%r\d+, 12;", r.ptx)


# --- typing errors ---------------------------------------------------------------------


def _compile_ss(*args, **kw):
    return inspect_kernel(_ss_kernel(*args, **kw), f"void({ACC_DTYPE[args[1]]}[::1], int32)")


@pytest.mark.parametrize(
    "args, kw, message",
    [
        ((40, "s32", "s8", "s8"), {}, r"N=40 is not valid for s8"),
        ((64, "f32", "e4m3", "e4m3"), {"ta": 1}, r"'tnsp_a' must be 0 or 1, and 1 \(transpose\) only for f16/bf16"),
        ((64, "f32", "tf32", "tf32"), {"tb": 1}, r"'tnsp_b' .* only for f16/bf16"),
        ((64, "f16", "bf16", "bf16"), {}, r"bf16 inputs take a f32 accumulator; got f16"),
        ((64, "f32", "s8", "s8"), {}, r"s8 inputs take a s32 accumulator; got f32"),
        ((64, "f32", "f16", "bf16"), {}, r"b_type must be one of \('f16',\)"),
        ((64, "s32", "s8", "u8"), {"sa": -1}, r"'scale_a' must be 1 \(integer wgmma has no negate\)"),
        ((64, "f32", "bf16", "bf16"), {"sb": 2}, r"'scale_b' must be 1 or -1"),
        ((64, "f32", "fp4", "fp4"), {}, r"a_type must be one of"),
    ],
)
def test_bad_wgmma_variants_are_typing_errors(args, kw, message):
    with pytest.raises(Exception, match=message):
        _compile_ss(*args, **kw)


def test_accumulator_of_the_wrong_type_is_a_typing_error():
    @cuda.jit(launch_bounds=(128, 1))
    def k(out):
        acc = (0.0, 0.0, 0.0, 0.0)  # float64
        acc = wgmma_mma_async(acc, 1, 2, 0, "bf16", "bf16", 1, 1, 0, 0)
        out[0] = acc[0]

    with pytest.raises(Exception, match="accumulator must be a UniTuple of float32"):
        inspect_kernel(k, "void(float64[::1])")


def test_run_time_type_string_is_a_typing_error():
    @cuda.jit(launch_bounds=(128, 1))
    def k(out, flag):
        acc = wgmma_accumulator(64, "f32")
        acc = wgmma_mma_async(acc, 1, 2, 0, "bf16", "bf16", flag, 1, 0, 0)
        out[0] = acc[0]

    with pytest.raises(Exception, match="'scale_a' must be a compile-time constant"):
        inspect_kernel(k, "void(float32[::1], int32)")


@pytest.mark.parametrize("src, message", [
    ("wgmma_wait_group(8)", r"wgmma_wait_group: 'n' must be in \[0, 7\]"),
    ("wgmma_accumulator(12, 'f32')", r"'n' must be a compile-time multiple of 8"),
    ("wgmma_accumulator(64, 'bf16')", r"'acc_type' must be a string literal 'f32', 'f16' or 's32'"),
])
def test_bad_helper_constants_are_typing_errors(src, message):
    ns = {"wgmma_wait_group": wgmma_wait_group, "wgmma_accumulator": wgmma_accumulator}
    exec(f"def k(out):\n    x = {src}\n    out[0] = 1\n", ns)
    with pytest.raises(Exception, match=message):
        inspect_kernel(cuda.jit(launch_bounds=(128, 1))(ns["k"]), "void(int32[::1])")
