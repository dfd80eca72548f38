"""A value the compiler cannot see through: keeping loop-invariant address math in the loop.

LLVM hoists every loop-invariant computation out of a loop, however many registers its results
then occupy for the whole loop: a persistent kernel's epilogue addresses (one per ``stmatrix``
of a tile, each the same for every tile) end up computed before the tile loop and held, or
spilled, through the mainloop. Passing the address's base through :func:`opaque_u32` inside the
loop stops that: the ``mov`` is a volatile asm statement, which LLVM neither hoists nor folds, so
what depends on it is computed where it is used. ptxas sees an ordinary ``mov`` and removes it.
"""

from ._ptx import ptx_asm, u32

__all__ = ["opaque_u32"]


@ptx_asm("mov.b32 {out}, {x};")
def opaque_u32(x: u32) -> u32:
    """PTX ISA 9.7.9.1 mov: ``x``, as a value LLVM cannot hoist out of a loop or fold (a volatile
    asm statement); free once ptxas has removed the ``mov``."""
