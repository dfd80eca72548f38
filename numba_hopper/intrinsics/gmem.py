"""Global memory through raw 64-bit addresses (``u64``), for data that is no numba array.

The GEMM's debug record is one: a host-mapped buffer whose address reaches the kernel as an
integer, so that the release kernel's parameters need no array. Stream-K's partial tiles
and their flags are others: a CTA stores its partial sums, then releases a flag at GPU
scope; the CTA that finishes the tile acquires the flag and reads the partials from L2.
The grouped GEMM's group sizes are a third (read by its scheduler), and the rows of an
output tile that ends inside it (stored from registers, 16 bytes a thread). The tile slots
that GPC-ordered clusters claim (compare-and-swap, and a counter of finished clusters) are
a fourth. Streaming kernels (the cross-entropy over a vocabulary's logits, the optimizer's
update) read and write 16 bytes a thread through the vector forms, and the ends of a row or
tensor that are no whole vector one 16-bit element at a time.
"""

from ._ptx import f32, ptx_asm, u16, u32, u64

__all__ = [
    "atom_cas_global_u32",
    "atom_add_acq_rel_gpu_u32",
    "st_global_u32",
    "st_release_gpu_u32",
    "ld_acquire_gpu_u32",
    "st_global_v4_f32",
    "ld_global_cg_v4_f32",
    "ld_global_u32",
    "prefetch_global_l2",
    "st_global_v4_u32",
    "ld_global_v4_u32",
    "ld_global_nc_v4_u32",
    "ld_global_u16",
    "ld_global_nc_u16",
    "st_global_u16",
]


@ptx_asm("atom.global.cas.b32 {out}, [{addr}], {compare}, {value};")
def atom_cas_global_u32(addr: u64, compare: u32, value: u32) -> u32:
    """PTX ISA 9.7.12.5 atom.cas: store ``value`` at ``addr`` if it holds ``compare``; return the
    old value (GPU scope).
    """


@ptx_asm("atom.acq_rel.gpu.global.add.u32 {out}, [{addr}], {value};")
def atom_add_acq_rel_gpu_u32(addr: u64, value: u32) -> u32:
    """PTX ISA 9.7.12.5 atom.add.acq_rel.gpu: add ``value`` to the u32 at ``addr``; return the old
    value. Release: this thread's earlier accesses are performed first; acquire: its later ones
    see what earlier releasers of ``addr`` did.
    """


@ptx_asm("st.volatile.global.u32 [{addr}], {value};")
def st_global_u32(addr: u64, value: u32):
    """PTX ISA 9.7.9.10 st.volatile.global: store ``value`` at ``addr`` (not cached away)."""


@ptx_asm("st.release.gpu.global.u32 [{addr}], {value};")
def st_release_gpu_u32(addr: u64, value: u32):
    """PTX ISA 9.7.9.10 st.release.gpu: store ``value`` at ``addr`` after every earlier memory
    access of this thread (and those ordered before it by a barrier) is visible GPU-wide.
    """


@ptx_asm("ld.acquire.gpu.global.u32 {out}, [{addr}];")
def ld_acquire_gpu_u32(addr: u64) -> u32:
    """PTX ISA 9.7.9.8 ld.acquire.gpu: load the u32 at ``addr``; later accesses see what the
    releasing thread's did.
    """


@ptx_asm("st.global.v4.f32 [{addr}], {{x}, {y}, {z}, {w}};")
def st_global_v4_f32(addr: u64, x: f32, y: f32, z: f32, w: f32):
    """PTX ISA 9.7.9.10 st: four float32 to a 16-byte-aligned global address."""


@ptx_asm("ld.global.cg.v4.f32 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ld_global_cg_v4_f32(addr: u64) -> tuple[f32, f32, f32, f32]:
    """PTX ISA 9.7.9.8 ld.cg: four float32 from a 16-byte-aligned global address, cached in L2
    only (never a stale L1 line).
    """


@ptx_asm("ld.global.u32 {out}, [{addr}];")
def ld_global_u32(addr: u64) -> u32:
    """PTX ISA 9.7.9.8 ld.global: the u32 at the 4-byte-aligned global address ``addr``."""


@ptx_asm("prefetch.global.L2 [{addr}];")
def prefetch_global_l2(addr: u64):
    """PTX ISA 9.7.9.15 prefetch.global.L2: bring the line of ``addr`` into L2. A hint: it reads no
    value into the thread, so it may run before griddepcontrol.wait on memory the previous
    kernel still writes."""


@ptx_asm("st.global.v4.u32 [{addr}], {{x}, {y}, {z}, {w}};")
def st_global_v4_u32(addr: u64, x: u32, y: u32, z: u32, w: u32):
    """PTX ISA 9.7.9.10 st: 16 bytes (four u32) to a 16-byte-aligned global address."""


@ptx_asm("ld.global.v4.u32 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ld_global_v4_u32(addr: u64) -> tuple[u32, u32, u32, u32]:
    """PTX ISA 9.7.9.8 ld.global: 16 bytes (four u32) from a 16-byte-aligned global address."""


@ptx_asm("ld.global.nc.L1::no_allocate.v4.u32 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ld_global_nc_v4_u32(addr: u64) -> tuple[u32, u32, u32, u32]:
    """PTX ISA 9.7.9.8 ld.global.nc: 16 bytes (four u32) from a 16-byte-aligned global address,
    through the read-only path without allocating in L1 (data read once, not written by this
    kernel).
    """


@ptx_asm("ld.global.u16 {out}, [{addr}];")
def ld_global_u16(addr: u64) -> u16:
    """PTX ISA 9.7.9.8 ld.global: the 16 bits at the 2-byte-aligned global address ``addr``."""


@ptx_asm("ld.global.nc.u16 {out}, [{addr}];")
def ld_global_nc_u16(addr: u64) -> u16:
    """PTX ISA 9.7.9.8 ld.global.nc: the 16 bits at the 2-byte-aligned global address ``addr``,
    through the read-only path (not written by this kernel).
    """


@ptx_asm("st.global.u16 [{addr}], {value};")
def st_global_u16(addr: u64, value: u16):
    """PTX ISA 9.7.9.10 st: 16 bits to a 2-byte-aligned global address."""
