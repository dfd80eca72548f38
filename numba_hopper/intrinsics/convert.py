"""16-bit and fp8 float conversions and hardware fast math, for GEMM epilogues.

numba has no bf16 type: bf16 and f16 values travel as their ``uint16`` bits (``u16``)
or as two packed in a ``uint32`` (the low half is the element with the lower address,
as ``pack_bf16x2`` writes it); two fp8 values travel packed in a ``uint16`` the same way.
Conversions round to nearest even.
"""

from llvmlite import ir
from numba.cuda import types

from ._ptx import b32, const_value, emit_asm, f32, literal_intrinsic, ptx_asm, u16, u32

__all__ = [
    "bf16_to_f32",
    "f16_to_f32",
    "f32_to_bf16",
    "f32_to_f16",
    "unpack_bf16x2",
    "unpack_f16x2",
    "pack_e4m3x2",
    "pack_e5m2x2",
    "pack_e4m3x4",
    "pack_e5m2x4",
    "pack_tuple",
    "abs_bits",
    "tanh_approx",
]


@ptx_asm("cvt.f32.bf16 {out}, {x};", pure=True)
def bf16_to_f32(x: u16) -> f32:
    """PTX ISA 9.7.9.21 cvt: the bf16 bits ``x`` as a float32 (exact)."""


@ptx_asm("cvt.f32.f16 {out}, {x};", pure=True)
def f16_to_f32(x: u16) -> f32:
    """PTX ISA 9.7.9.21 cvt: the f16 bits ``x`` as a float32 (exact)."""


@ptx_asm("cvt.rn.bf16.f32 {out}, {x};", pure=True)
def f32_to_bf16(x: f32) -> u16:
    """PTX ISA 9.7.9.21 cvt: a float32 to bf16 bits (round to nearest even)."""


@ptx_asm("cvt.rn.f16.f32 {out}, {x};", pure=True)
def f32_to_f16(x: f32) -> u16:
    """PTX ISA 9.7.9.21 cvt: a float32 to f16 bits (round to nearest even)."""


@ptx_asm(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {x}; "
    "cvt.f32.bf16 {out0}, lo; cvt.f32.bf16 {out1}, hi; }",
    pure=True,
)
def unpack_bf16x2(x: b32) -> tuple[f32, f32]:
    """PTX ISA 9.7.9.21 cvt: a packed bf16x2 to (low, high) float32."""


@ptx_asm(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, {x}; "
    "cvt.f32.f16 {out0}, lo; cvt.f32.f16 {out1}, hi; }",
    pure=True,
)
def unpack_f16x2(x: b32) -> tuple[f32, f32]:
    """PTX ISA 9.7.9.21 cvt: a packed f16x2 to (low, high) float32."""


# cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, a, b puts a (the FIRST source) in the UPPER byte of d.
@ptx_asm("cvt.rn.satfinite.e4m3x2.f32 {out}, {hi}, {lo};", pure=True)
def pack_e4m3x2(lo: f32, hi: f32) -> u16:
    """PTX ISA 9.7.9.21 cvt: two float32 to packed e4m3 (round to nearest even, saturated to
    +-448: e4m3 has no infinity, a NaN stays NaN); ``lo`` in bits 0-7."""


@ptx_asm("cvt.rn.satfinite.e5m2x2.f32 {out}, {hi}, {lo};", pure=True)
def pack_e5m2x2(lo: f32, hi: f32) -> u16:
    """PTX ISA 9.7.9.21 cvt: two float32 to packed e5m2 (round to nearest even, saturated to
    +-57344); ``lo`` in bits 0-7."""


@ptx_asm("{ .reg .b32 t; mov.b32 t, {x}; and.b32 {out}, t, 0x7fffffff; }", pure=True)
def abs_bits(x: f32) -> u32:
    """PTX ISA 9.7.9.1 mov, 9.7.8.1 and: the bits of ``|x|``. Non-negative floats order as their
    bits (a NaN above infinity), so an integer max of them is a float max that keeps NaNs."""


@ptx_asm("tanh.approx.f32 {out}, {x};", pure=True)
def tanh_approx(x: f32) -> f32:
    """PTX ISA 9.7.3 Floating-Point Instructions: tanh (tanh.approx.f32): one MUFU.TANH; maximum
    relative error about 2^-11.
    """


@ptx_asm(
    "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, {x1}, {x0}; "
    "cvt.rn.satfinite.e4m3x2.f32 hi, {x3}, {x2}; mov.b32 {out}, {lo, hi}; }",
    pure=True,
)
def pack_e4m3x4(x0: f32, x1: f32, x2: f32, x3: f32) -> u32:
    """PTX ISA 9.7.9.21 cvt: four float32 to four e4m3 in one uint32, ``x0`` in bits 0-7 (the
    order of four consecutive fp8 elements in memory and in a k32 wgmma A register)."""


@ptx_asm(
    "{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, {x1}, {x0}; "
    "cvt.rn.satfinite.e5m2x2.f32 hi, {x3}, {x2}; mov.b32 {out}, {lo, hi}; }",
    pure=True,
)
def pack_e5m2x4(x0: f32, x1: f32, x2: f32, x3: f32) -> u32:
    """PTX ISA 9.7.9.21 cvt: four float32 to four e5m2 in one uint32, ``x0`` in bits 0-7."""


# dtype -> (float32 values per uint32, the cvt of one uint32's worth)
_PACK_TUPLE = {
    "bf16": (2, "cvt.rn.bf16x2.f32 $0, $2, $1;"),
    "f16": (2, "cvt.rn.f16x2.f32 $0, $2, $1;"),
    "e4m3": (4, "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }"),
    "e5m2": (4, "{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e5m2x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }"),
}


@literal_intrinsic
def pack_tuple(typingctx, values, dtype):
    """A float32 tuple (a wgmma f32 accumulator) converted to packed ``dtype``: for "bf16" and
    "f16" ``UniTuple(uint32, n/2)``, register ``q`` holding ``values[2q]`` (bits 0-15) and
    ``values[2q+1]``; for "e4m3" and "e5m2" ``UniTuple(uint32, n/4)``, register ``q`` holding
    ``values[4q .. 4q+3]`` (bits 0-7 first). Round to nearest even (fp8: saturated to the
    largest finite value). One ``cvt`` per 16-bit pair, two per four fp8 (PTX ISA 9.7.9.21
    cvt); the result type needs no witness tuple. ``dtype``: a string literal."""
    kind = const_value(dtype)
    if kind not in _PACK_TUPLE:
        raise TypeError(f"pack_tuple: 'dtype' must be a string literal, one of {tuple(_PACK_TUPLE)}; got {dtype}")
    per, ptx = _PACK_TUPLE[kind]
    if not (isinstance(values, types.UniTuple) and values.dtype == types.float32):
        raise TypeError(f"pack_tuple: 'values' must be a UniTuple of float32 (a wgmma f32 accumulator); got {values}")
    if values.count % per:
        raise TypeError(f"pack_tuple: {kind} packs {per} values per uint32, so the tuple's length must be a "
                        f"multiple of {per}; got {values.count}")
    out = types.UniTuple(types.uint32, values.count // per)
    constraints = "=r," + ",".join(["f"] * per)

    def codegen(context, builder, sig, args):
        items = [builder.extract_value(args[0], i) for i in range(values.count)]
        regs = [emit_asm(builder, ptx, constraints, items[per * q:per * q + per], ir.IntType(32), side_effect=False)
                for q in range(out.count)]
        return context.make_tuple(builder, out, regs)

    return out(values, dtype), codegen
