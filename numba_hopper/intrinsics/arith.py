"""32-bit integer arithmetic that numba would widen.

numba types integer arithmetic as 64-bit, and a 64-bit division compiles to a subroutine
call whose calling convention makes a tight warp-specialized kernel spill. Index math that
fits in 32 bits can divide inline instead.
"""

from ._ptx import ptx_asm, u32

__all__ = ["div_u32"]


@ptx_asm("div.u32 {out}, {a}, {b};", pure=True)
def div_u32(a: u32, b: u32) -> u32:
    """PTX ISA 9.7.1.8 div.u32: ``a // b`` of the low 32 bits of each operand, inline."""
