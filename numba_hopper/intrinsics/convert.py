"""16-bit and fp8 float conversions and hardware fast math, for GEMM epilogues.

numba has no bf16 type: bf16 and f16 values travel as their ``uint16`` bits (``u16``)
or as two packed in a ``uint32`` (the low half is the element with the lower address,
as ``pack_bf16x2`` writes it); two fp8 values travel packed in a ``uint16`` the same way.
Conversions round to nearest even.
"""

from ._ptx import b32, f32, ptx_asm, u16, u32

__all__ = [
    "bf16_to_f32",
    "f16_to_f32",
    "f32_to_bf16",
    "f32_to_f16",
    "unpack_bf16x2",
    "unpack_f16x2",
    "pack_e4m3x2",
    "pack_e5m2x2",
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
