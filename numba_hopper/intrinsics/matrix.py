"""ldmatrix / stmatrix (PTX ISA 9.7.14.5.15-16) and packing two floats into one register.

Warp-collective 8x8 matrices of 16-bit elements between registers and shared memory.
Each lane passes its own row address (a 32-bit ``.shared::cta`` address, 16-byte aligned):
lanes 0-7 address the 8 rows of matrix 0, lanes 8-15 those of matrix 1, and so on (x1 uses
lanes 0-7, x2 lanes 0-15; the other lanes' addresses are ignored but must be valid to pass).
Register ``i`` of lane ``l`` holds the two 16-bit elements ``(l // 4, 2 * (l % 4) + {0, 1})``
of matrix ``i`` (low half first); ``_trans`` variants hold the transposed matrix instead.
"""

from ._ptx import b32, f32, ptx_asm, u32

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


@ptx_asm("ldmatrix.sync.aligned.m8n8.x1.shared::cta.b16 {{out0}}, [{addr}];")
def ldmatrix_x1(addr: u32) -> tuple[u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load one 8x8 b16 matrix; returns a UniTuple of one uint32."""


@ptx_asm("ldmatrix.sync.aligned.m8n8.x2.shared::cta.b16 {{out0}, {out1}}, [{addr}];")
def ldmatrix_x2(addr: u32) -> tuple[u32, u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load two 8x8 b16 matrices; returns a UniTuple of two uint32."""


@ptx_asm("ldmatrix.sync.aligned.m8n8.x4.shared::cta.b16 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ldmatrix_x4(addr: u32) -> tuple[u32, u32, u32, u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load four 8x8 b16 matrices; returns a UniTuple of four uint32."""


@ptx_asm("ldmatrix.sync.aligned.m8n8.x1.trans.shared::cta.b16 {{out0}}, [{addr}];")
def ldmatrix_x1_trans(addr: u32) -> tuple[u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load one 8x8 b16 matrix transposed; returns a UniTuple of one
    uint32.
    """


@ptx_asm("ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {{out0}, {out1}}, [{addr}];")
def ldmatrix_x2_trans(addr: u32) -> tuple[u32, u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load two 8x8 b16 matrices transposed; returns a UniTuple of two
    uint32.
    """


@ptx_asm("ldmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ldmatrix_x4_trans(addr: u32) -> tuple[u32, u32, u32, u32]:
    """PTX ISA 9.7.14.5.15 ldmatrix: load four 8x8 b16 matrices transposed; returns a UniTuple of four
    uint32.
    """


@ptx_asm("stmatrix.sync.aligned.m8n8.x1.shared::cta.b16 [{addr}], {{r0}};")
def stmatrix_x1(addr: u32, r0: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store one 8x8 b16 matrix from one uint32 per lane."""


@ptx_asm("stmatrix.sync.aligned.m8n8.x2.shared::cta.b16 [{addr}], {{r0}, {r1}};")
def stmatrix_x2(addr: u32, r0: b32, r1: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store two 8x8 b16 matrices from two uint32 per lane."""


@ptx_asm("stmatrix.sync.aligned.m8n8.x4.shared::cta.b16 [{addr}], {{r0}, {r1}, {r2}, {r3}};")
def stmatrix_x4(addr: u32, r0: b32, r1: b32, r2: b32, r3: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store four 8x8 b16 matrices from four uint32 per lane."""


@ptx_asm("stmatrix.sync.aligned.m8n8.x1.trans.shared::cta.b16 [{addr}], {{r0}};")
def stmatrix_x1_trans(addr: u32, r0: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store one 8x8 b16 matrix transposed from one uint32 per lane."""


@ptx_asm("stmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 [{addr}], {{r0}, {r1}};")
def stmatrix_x2_trans(addr: u32, r0: b32, r1: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store two 8x8 b16 matrices transposed from two uint32 per lane."""


@ptx_asm("stmatrix.sync.aligned.m8n8.x4.trans.shared::cta.b16 [{addr}], {{r0}, {r1}, {r2}, {r3}};")
def stmatrix_x4_trans(addr: u32, r0: b32, r1: b32, r2: b32, r3: b32):
    """PTX ISA 9.7.14.5.16 stmatrix: store four 8x8 b16 matrices transposed from four uint32 per lane."""


# cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a (the FIRST source) in the UPPER half of d.
@ptx_asm("cvt.rn.bf16x2.f32 {out}, {hi}, {lo};", pure=True)
def pack_bf16x2(lo: f32, hi: f32) -> u32:
    """PTX ISA 9.7.9.21 cvt: two float32 to a packed bf16x2 (round to nearest even); ``lo`` in bits
    0-15, ``hi`` in bits 16-31.
    """


@ptx_asm("cvt.rn.f16x2.f32 {out}, {hi}, {lo};", pure=True)
def pack_f16x2(lo: f32, hi: f32) -> u32:
    """PTX ISA 9.7.9.21 cvt: two float32 to a packed f16x2 (round to nearest even); ``lo`` in bits
    0-15, ``hi`` in bits 16-31.
    """
