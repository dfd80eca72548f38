"""wgmma: warpgroup matrix multiply-accumulate (PTX ISA 9.7.15).

One ``wgmma.mma_async`` computes D(64xN) = A(64xK) * B(KxN) (+ D) for the 128 threads of a
warpgroup. B is always in shared memory (a matrix descriptor, see ``matrix_descriptor``);
A is in shared memory (``wgmma_mma_async``, "SS") or in registers (``wgmma_mma_async_rs``,
"RS": four ``uint32`` per thread). The accumulator D is a numba tuple held in registers,
passed in and returned updated; its type fixes N and the accumulator type:

==========================  =========  ====================================
accumulator                 N          used with
==========================  =========  ====================================
``UniTuple(float32, N/2)``  2 * len    any floating type ("f32" accumulator)
``UniTuple(uint32, N/4)``   4 * len    f16, e4m3, e5m2 ("f16": packed half2)
``UniTuple(int32, N/2)``    2 * len    s8, u8 ("s32")
==========================  =========  ====================================

``wgmma_accumulator(n, "f32" | "f16" | "s32")`` makes a zero one. Register ``r`` of the f32
(or s32) accumulator of thread ``t`` (warp ``w = t // 32``, lane ``l = t % 32``) holds
``D[16*w + l//4 + 8*((r >> 1) & 1), 8*(r >> 2) + 2*(l % 4) + (r & 1)]``; f16 packs the
pairs ``r = 2q, 2q+1`` into register ``q`` (low half first).

Order of a step: ``wgmma_fence()`` (before the first wgmma that touches registers written
by ordinary code), the wgmmas, ``wgmma_commit_group()``, ``wgmma_wait_group(0)``; read the
accumulator only after the wait (ptxas otherwise inserts one: warning C7517).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir
from numba.cuda import types

from ._ptx import Const, const_value, emit_asm, in_range, literal_intrinsic, ptx_asm

__all__ = [
    "wgmma_fence",
    "wgmma_commit_group",
    "wgmma_wait_group",
    "wgmma_mma_async",
    "wgmma_mma_async_rs",
    "wgmma_accumulator",
    "wgmma_fence_operand",
    "WGMMA_FAMILIES",
    "wgmma_shape",
    "wgmma_asm",
]

@ptx_asm("wgmma.fence.sync.aligned;")
def wgmma_fence():
    """PTX ISA 9.7.15 wgmma.fence: order prior register accesses before the next
    wgmma.mma_async.
    """


@ptx_asm("wgmma.commit_group.sync.aligned;")
def wgmma_commit_group():
    """PTX ISA 9.7.15 wgmma.commit_group: close the current group of wgmma.mma_async."""


@ptx_asm("wgmma.wait_group.sync.aligned {n};")
def wgmma_wait_group(n: Const(in_range(0, 7))):
    """PTX ISA 9.7.15 wgmma.wait_group: wait until at most ``n`` (0..7) groups are pending."""


# --- the variant table (PTX ISA 9.7.15.5.2 wgmma.mma_async) ---------------------------


@dataclass(frozen=True)
class WgmmaFamily:
    """One operand-type family of wgmma.mma_async."""

    name: str
    types: tuple  # A/B element types of the family
    k: int  # K of m64nNk{K} (32 bytes of A/B per row)
    n_values: tuple  # valid N
    accumulators: tuple  # "f32", "f16", "s32"
    same_ab: bool  # A and B must have the same type
    transpose: bool  # imm-trans-a/b exist (descriptor operands only)
    scale: bool  # imm-scale-a/b (negate) exist


_N_FLOAT = tuple(range(8, 257, 8))
_N_INT = (8, 16, 24) + tuple(range(32, 257, 16))

WGMMA_FAMILIES = (
    WgmmaFamily("f16", ("f16",), 16, _N_FLOAT, ("f32", "f16"), True, True, True),
    WgmmaFamily("bf16", ("bf16",), 16, _N_FLOAT, ("f32",), True, True, True),
    WgmmaFamily("tf32", ("tf32",), 8, _N_FLOAT, ("f32",), True, False, True),
    WgmmaFamily("fp8", ("e4m3", "e5m2"), 32, _N_FLOAT, ("f32", "f16"), False, False, True),
    WgmmaFamily("int8", ("s8", "u8"), 32, _N_INT, ("s32",), False, False, False),
)
_FAMILY_OF = {t: f for f in WGMMA_FAMILIES for t in f.types}
# accumulator element type -> (kind, N per register, LLVM type, constraint, PTX dtype)
_ACC = {
    types.float32: ("f32", 2, ir.FloatType(), "f", "f32"),
    types.int32: ("s32", 2, ir.IntType(32), "r", "s32"),
    types.uint32: ("f16", 4, ir.IntType(32), "r", "f16"),
}
_ACC_ELEM = {kind: ty for ty, (kind, *_rest) in _ACC.items()}


def wgmma_shape(a_type, b_type, acc_type, n):
    """Check one wgmma variant; return its K, or raise ValueError naming what is wrong."""
    fam = _FAMILY_OF.get(a_type)
    if fam is None:
        raise ValueError(f"a_type must be one of {sorted(_FAMILY_OF)}; got {a_type!r}")
    if b_type not in fam.types or (fam.same_ab and b_type != a_type):
        allowed = (a_type,) if fam.same_ab else fam.types
        raise ValueError(f"b_type must be one of {allowed} with a_type {a_type!r}; got {b_type!r}")
    if acc_type not in fam.accumulators:
        raise ValueError(f"{a_type} inputs take a {' or '.join(fam.accumulators)} accumulator; got {acc_type}")
    if n not in fam.n_values:
        which = "8..256 in steps of 8" if fam.n_values is _N_FLOAT else "8, 16, 24, then 32..256 in steps of 16"
        raise ValueError(f"N={n} is not valid for {a_type} (N must be {which})")
    return fam.k


def wgmma_asm(n, k, dtype, a_type, b_type, scale_a=1, scale_b=1, tnsp_a=0, tnsp_b=0, rs=False):
    """Inline-asm text and constraints of one (already checked) wgmma.mma_async variant.

    Operands: ``$0..$L-1`` accumulator outputs, ``$L..$2L-1`` the same registers tied as
    inputs, then A (a descriptor, or 4 registers in RS mode), B's descriptor, scale-d.
    """
    fam = _FAMILY_OF[a_type]
    nreg = n // (4 if dtype == "f16" else 2)
    letter = "f" if dtype == "f32" else "r"
    slot = 2 * nreg
    d = ", ".join(f"${i}" for i in range(nreg))
    if rs:
        a_txt = "{" + ", ".join(f"${slot + i}" for i in range(4)) + "}"
        slot += 4
    else:
        a_txt = f"${slot}"
        slot += 1
    imm = ""
    if fam.scale:
        imm += f", {scale_a}, {scale_b}"
    if fam.transpose:
        imm += f", {tnsp_b}" if rs else f", {tnsp_a}, {tnsp_b}"
    ptx = (
        f"{{ .reg .pred p; setp.ne.b32 p, ${slot + 1}, 0; "
        f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dtype}.{a_type}.{b_type} "
        f"{{{d}}}, {a_txt}, ${slot}, p{imm}; }}"
    )
    constraints = ",".join(
        ["=" + letter] * nreg + [str(i) for i in range(nreg)] + (["r"] * 4 if rs else ["l"]) + ["l", "r"]
    )
    return ptx, constraints


def _accumulator_info(acc):
    if not isinstance(acc, types.UniTuple) or acc.dtype not in _ACC:
        raise TypeError(
            "the accumulator must be a UniTuple of float32 (f32, N/2 values), uint32 (packed f16, "
            f"N/4) or int32 (s32, N/2), e.g. from wgmma_accumulator(n, 'f32'); got {acc}"
        )
    kind, per_reg, llty, letter, dtype = _ACC[acc.dtype]
    return kind, acc.count * per_reg, llty, letter, dtype


def _literal(ty, what, name):
    v = const_value(ty)
    if v is None:
        raise TypeError(f"{name}: '{what}' must be a compile-time constant; got {ty}")
    return v


def _wgmma_typer(name, acc, a, desc_b, scale_d, a_type, b_type, scale_a, scale_b, tnsp_a, tnsp_b):
    """Shared typer of the SS (``a`` a descriptor) and RS (``a`` 4 registers, tnsp_a None) forms."""
    rs = tnsp_a is None
    kind, n, llty, letter, dtype = _accumulator_info(acc)
    at, bt = _literal(a_type, "a_type", name), _literal(b_type, "b_type", name)
    sa, sb = _literal(scale_a, "scale_a", name), _literal(scale_b, "scale_b", name)
    ta = 0 if rs else _literal(tnsp_a, "tnsp_a", name)
    tb = _literal(tnsp_b, "tnsp_b", name)
    try:
        k = wgmma_shape(at, bt, kind, n)
    except ValueError as e:
        raise TypeError(f"{name}: {e}") from None
    fam = _FAMILY_OF[at]
    for what, v in (("scale_a", sa), ("scale_b", sb)):
        if v not in (1, -1) or (v == -1 and not fam.scale):
            ok = "1 or -1" if fam.scale else "1 (integer wgmma has no negate)"
            raise TypeError(f"{name}: '{what}' must be {ok}; got {v}")
    for what, v in (("tnsp_a", ta), ("tnsp_b", tb)):
        if v not in (0, 1) or (v == 1 and not fam.transpose):
            raise TypeError(
                f"{name}: '{what}' must be 0 or 1, and 1 (transpose) only for f16/bf16; got {v} for {at}"
            )
    if rs:
        if not (isinstance(a, types.BaseTuple) and len(a) == 4 and all(isinstance(t, types.Integer) for t in a)):
            raise TypeError(f"{name}: 'a_regs' must be a tuple of 4 integers (uint32 A fragment); got {a}")
    elif not isinstance(a, types.Integer):
        raise TypeError(f"{name}: 'desc_a' must be an integer (uint64 descriptor); got {a}")
    if not isinstance(desc_b, types.Integer):
        raise TypeError(f"{name}: 'desc_b' must be an integer (uint64 descriptor); got {desc_b}")
    if not isinstance(scale_d, (types.Integer, types.Boolean)):
        raise TypeError(f"{name}: 'scale_d' must be an integer (0: D = A*B, else D += A*B); got {scale_d}")

    nreg = acc.count
    ptx, constraints = wgmma_asm(n, k, dtype, at, bt, sa, sb, ta, tb, rs)
    out_struct = ir.LiteralStructType([llty] * nreg)

    def codegen(context, builder, sig, args):
        acc_v, a_v, b_v, sd_v = args[:4]
        ins = [builder.extract_value(acc_v, i) for i in range(nreg)]
        if rs:
            ins += [context.cast(builder, builder.extract_value(a_v, i), sig.args[1][i], types.uint32)
                    for i in range(4)]
        else:
            ins.append(context.cast(builder, a_v, sig.args[1], types.uint64))
        ins.append(context.cast(builder, b_v, sig.args[2], types.uint64))
        ins.append(context.cast(builder, sd_v, sig.args[3], types.uint32))
        res = emit_asm(builder, ptx, constraints, ins, out_struct)
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(res, i) for i in range(nreg)])

    argtys = [acc, a, types.unliteral(desc_b), types.unliteral(scale_d), a_type, b_type, scale_a, scale_b]
    if not rs:
        argtys[1] = types.unliteral(a)
        argtys.append(tnsp_a)
    argtys.append(tnsp_b)
    return acc(*argtys), codegen


@literal_intrinsic
def wgmma_mma_async(typingctx, acc, desc_a, desc_b, scale_d, a_type, b_type, scale_a, scale_b, tnsp_a, tnsp_b):
    """SS wgmma: ``acc = A(smem, desc_a) @ B(smem, desc_b) (+ acc if scale_d)``; returns acc.

    PTX ISA 9.7.15.5.2 ``wgmma.mma_async.sync.aligned.m64n{N}k{K}.{d}.{a}.{b} d, a-desc,
    b-desc, p, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b`` (the imm operands only
    where the type has them). ``a_type``/``b_type``: "f16", "bf16", "tf32", "e4m3", "e5m2",
    "s8", "u8" (literals); ``scale_d`` run-time (0: overwrite); ``scale_a``/``scale_b`` 1 or
    -1 (negate; floating types only); ``tnsp_a``/``tnsp_b`` 0 (K-major) or 1 (MN-major;
    f16/bf16 only). N and the accumulator type come from ``acc`` (module docstring).
    """
    return _wgmma_typer("wgmma_mma_async", acc, desc_a, desc_b, scale_d, a_type, b_type, scale_a, scale_b,
                        tnsp_a, tnsp_b)


@literal_intrinsic
def wgmma_mma_async_rs(typingctx, acc, a_regs, desc_b, scale_d, a_type, b_type, scale_a, scale_b, tnsp_b):
    """RS wgmma: A from registers (``a_regs``: 4 uint32 per thread, any integer tuple), B from smem.

    PTX ISA 9.7.15.5.2 ``wgmma.mma_async ... d, {a0, a1, a2, a3}, b-desc, p, imm-scale-a,
    imm-scale-b, imm-trans-b``. A's fragment layout is PTX ISA 9.7.15.5.1.1 (the same as
    ``ldmatrix_x4`` of the 64xK tile, one 16-row slice per warp). Otherwise as
    ``wgmma_mma_async``.
    """
    return _wgmma_typer("wgmma_mma_async_rs", acc, a_regs, desc_b, scale_d, a_type, b_type, scale_a, scale_b,
                        None, tnsp_b)


@literal_intrinsic
def wgmma_accumulator(typingctx, n, acc_type):
    """A zero accumulator for N = ``n``: ``acc_type`` "f32" (n/2 float32), "f16" (n/4 uint32,
    packed half2) or "s32" (n/2 int32). ``n``, ``acc_type`` literals."""
    nv, kind = const_value(n), const_value(acc_type)
    if kind not in _ACC_ELEM:
        raise TypeError(f"wgmma_accumulator: 'acc_type' must be a string literal 'f32', 'f16' or 's32'; got {acc_type}")
    if not isinstance(nv, int) or isinstance(nv, bool) or not (8 <= nv <= 256) or nv % 8:
        raise TypeError(f"wgmma_accumulator: 'n' must be a compile-time multiple of 8 in [8, 256]; got {n}")
    elem = _ACC_ELEM[kind]
    tupty = types.UniTuple(elem, nv // _ACC[elem][1])

    def codegen(context, builder, sig, args):
        zero = context.get_constant(elem, 0)
        return context.make_tuple(builder, tupty, [zero] * tupty.count)

    return tupty(n, acc_type), codegen


@literal_intrinsic
def wgmma_fence_operand(typingctx, acc):
    """Pin ``acc`` in place (empty volatile asm reading and writing each register; CUTLASS
    ``warpgroup_fence_operand``): keeps the compiler from moving accumulator reads or writes
    across the surrounding wgmma_fence / wait_group. Returns ``acc``."""
    if not isinstance(acc, types.UniTuple) or acc.dtype not in _ACC:
        raise TypeError(f"wgmma_fence_operand: expected a wgmma accumulator tuple; got {acc}")
    _, _, llty, letter, _ = _ACC[acc.dtype]
    nreg = acc.count
    constraints = ",".join(["=" + letter] * nreg + [str(i) for i in range(nreg)])

    def codegen(context, builder, sig, args):
        ins = [builder.extract_value(args[0], i) for i in range(nreg)]
        out_ty = ir.LiteralStructType([llty] * nreg) if nreg > 1 else llty
        res = emit_asm(builder, "", constraints, ins, out_ty)
        outs = [builder.extract_value(res, i) for i in range(nreg)] if nreg > 1 else [res]
        return context.make_tuple(builder, acc, outs)

    return acc(acc), codegen
