"""A float32 store through a raw 64-bit global address (``u64``).

:mod:`.gmem` stores 32-bit integers and vectors of four floats; a kernel that writes single
float32 results at computed addresses (attention's log-sum-exp, one per query row, into a
tensor that is no numba array) needs the scalar store, without a bit cast.
"""

from ._ptx import f32, ptx_asm, u64

__all__ = ["st_global_f32"]


@ptx_asm("st.global.f32 [{addr}], {value};")
def st_global_f32(addr: u64, value: f32):
    """PTX ISA 9.7.9.10 st: one float32 to a 4-byte-aligned global address."""
