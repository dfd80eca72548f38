"""Global memory through raw 64-bit addresses (``u64``), for data that is no numba array.

The GEMM's debug record is one: a host-mapped buffer whose address reaches the kernel as an
integer, so that the release kernel's parameters need no array.
"""

from ._ptx import ptx_intrinsic

__all__ = ["atom_cas_global_u32", "st_global_u32"]

atom_cas_global_u32 = ptx_intrinsic(
    "atom_cas_global_u32",
    "atom.global.cas.b32 {out}, [{addr}], {compare}, {value};",
    result="u32",
    addr="u64",
    compare="u32",
    value="u32",
    doc="PTX ISA 9.7.12.5 atom.cas: store ``value`` at ``addr`` if it holds ``compare``; return "
    "the old value (GPU scope).",
)

st_global_u32 = ptx_intrinsic(
    "st_global_u32",
    "st.volatile.global.u32 [{addr}], {value};",
    addr="u64",
    value="u32",
    doc="PTX ISA 9.7.9.10 st.volatile.global: store ``value`` at ``addr`` (not cached away).",
)
