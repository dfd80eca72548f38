"""ldmatrix / stmatrix (PTX ISA 9.7.14.5.15-16) and packing two floats into one register.

Warp-collective 8x8 matrices of 16-bit elements between registers and shared memory.
Each lane passes its own row address (a 32-bit ``.shared::cta`` address, 16-byte aligned):
lanes 0-7 address the 8 rows of matrix 0, lanes 8-15 those of matrix 1, and so on (x1 uses
lanes 0-7, x2 lanes 0-15; the other lanes' addresses are ignored but must be valid to pass).
Register ``i`` of lane ``l`` holds the two 16-bit elements ``(l // 4, 2 * (l % 4) + {0, 1})``
of matrix ``i`` (low half first); ``_trans`` variants hold the transposed matrix instead.
"""

from ._ptx import ptx_intrinsic

__all__ = [
    "ldmatrix_x1",
    "ldmatrix_x2",
    "ldmatrix_x4",
    "ldmatrix_x1_trans",
    "ldmatrix_x2_trans",
    "ldmatrix_x4_trans",
    "stmatrix_x1",
    "stmatrix_x2",
    "stmatrix_x4",
    "stmatrix_x1_trans",
    "stmatrix_x2_trans",
    "stmatrix_x4_trans",
    "pack_bf16x2",
    "pack_f16x2",
]


def _ldmatrix(num, trans):
    t = ".trans" if trans else ""
    regs = ", ".join("{out%d}" % i for i in range(num))
    return ptx_intrinsic(
        f"ldmatrix_x{num}{'_trans' if trans else ''}",
        f"ldmatrix.sync.aligned.m8n8.x{num}{t}.shared::cta.b16 {{{regs}}}, [{{addr}}];",
        result=("u32", num),
        addr="u32",
        doc=f"PTX ISA 9.7.14.5.15 ldmatrix: load {num} 8x8 b16 matrices{' transposed' if trans else ''}; "
        f"returns a UniTuple of {num} uint32.",
    )


def _stmatrix(num, trans):
    t = ".trans" if trans else ""
    names = [f"r{i}" for i in range(num)]
    regs = ", ".join("{%s}" % n for n in names)
    return ptx_intrinsic(
        f"stmatrix_x{num}{'_trans' if trans else ''}",
        f"stmatrix.sync.aligned.m8n8.x{num}{t}.shared::cta.b16 [{{addr}}], {{{regs}}};",
        addr="u32",
        doc=f"PTX ISA 9.7.14.5.16 stmatrix: store {num} 8x8 b16 matrices{' transposed' if trans else ''} "
        f"from {num} uint32 per lane.",
        **{n: "b32" for n in names},
    )


ldmatrix_x1 = _ldmatrix(1, False)
ldmatrix_x2 = _ldmatrix(2, False)
ldmatrix_x4 = _ldmatrix(4, False)
ldmatrix_x1_trans = _ldmatrix(1, True)
ldmatrix_x2_trans = _ldmatrix(2, True)
ldmatrix_x4_trans = _ldmatrix(4, True)

stmatrix_x1 = _stmatrix(1, False)
stmatrix_x2 = _stmatrix(2, False)
stmatrix_x4 = _stmatrix(4, False)
stmatrix_x1_trans = _stmatrix(1, True)
stmatrix_x2_trans = _stmatrix(2, True)
stmatrix_x4_trans = _stmatrix(4, True)

# cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a (the FIRST source) in the UPPER half of d.
pack_bf16x2 = ptx_intrinsic(
    "pack_bf16x2",
    "cvt.rn.bf16x2.f32 {out}, {hi}, {lo};",
    result="u32",
    pure=True,
    lo="f32",
    hi="f32",
    doc="PTX ISA 9.7.9.21 cvt: two float32 to a packed bf16x2 (round to nearest even); ``lo`` in bits "
    "0-15, ``hi`` in bits 16-31.",
)

pack_f16x2 = ptx_intrinsic(
    "pack_f16x2",
    "cvt.rn.f16x2.f32 {out}, {hi}, {lo};",
    result="u32",
    pure=True,
    lo="f32",
    hi="f32",
    doc="PTX ISA 9.7.9.21 cvt: two float32 to a packed f16x2 (round to nearest even); ``lo`` in bits "
    "0-15, ``hi`` in bits 16-31.",
)
