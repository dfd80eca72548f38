"""16-bit float conversions and hardware fast math, for GEMM epilogues.

numba has no bf16 type: bf16 and f16 values travel as their ``uint16`` bits (``u16``)
or as two packed in a ``uint32`` (the low half is the element with the lower address,
as ``pack_bf16x2`` writes it). Conversions round to nearest even.
"""

from ._ptx import ptx_intrinsic

__all__ = [
    "bf16_to_f32",
    "f16_to_f32",
    "f32_to_bf16",
    "f32_to_f16",
    "unpack_bf16x2",
    "unpack_f16x2",
    "tanh_approx",
]


def _to_f32(name, ty):
    return ptx_intrinsic(
        name, f"cvt.f32.{ty} {{out}}, {{x}};", result="f32", pure=True, x="u16",
        doc=f"PTX ISA 9.7.9.21 cvt: the {ty} bits ``x`` as a float32 (exact).",
    )


def _from_f32(name, ty):
    return ptx_intrinsic(
        name, f"cvt.rn.{ty}.f32 {{out}}, {{x}};", result="u16", pure=True, x="f32",
        doc=f"PTX ISA 9.7.9.21 cvt: a float32 to {ty} bits (round to nearest even).",
    )


def _unpack(name, ty):
    return ptx_intrinsic(
        name,
        f"{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, {{x}}; cvt.f32.{ty} {{out0}}, lo; cvt.f32.{ty} {{out1}}, hi; }}",
        result=("f32", 2), pure=True, x="b32",
        doc=f"PTX ISA 9.7.9.21 cvt: a packed {ty}x2 to (low, high) float32.",
    )


bf16_to_f32 = _to_f32("bf16_to_f32", "bf16")
f16_to_f32 = _to_f32("f16_to_f32", "f16")
f32_to_bf16 = _from_f32("f32_to_bf16", "bf16")
f32_to_f16 = _from_f32("f32_to_f16", "f16")
unpack_bf16x2 = _unpack("unpack_bf16x2", "bf16")
unpack_f16x2 = _unpack("unpack_f16x2", "f16")

tanh_approx = ptx_intrinsic(
    "tanh_approx", "tanh.approx.f32 {out}, {x};", result="f32", pure=True, x="f32",
    doc="PTX ISA tanh.approx.f32 (floating-point instructions): one MUFU.TANH; max relative error about 2^-11.",
)
