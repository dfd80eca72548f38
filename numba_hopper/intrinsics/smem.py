"""Shared memory: 32-bit shared addresses, dynamic shared memory, wgmma matrix descriptors.

Every shared-memory operand of the Hopper intrinsics (mbarriers, TMA destinations, wgmma
tiles, ldmatrix/stmatrix rows) is a 32-bit ``.shared::cta`` address (``uint32``):

- ``shared_address(arr)``: the address of ``arr[0...]`` for a ``cuda.shared.array`` (or a
  slice of one);
- ``dynamic_shared_base()``: the address of dynamic shared memory, 1024-byte aligned
  (the alignment 128-byte swizzled TMA/wgmma tiles need);
- ``shared_array(byte_offset, shape, dtype)``: a typed array view into dynamic shared
  memory, to carve it up;
- ``matrix_descriptor(...)``: the 64-bit wgmma matrix descriptor of a tile (device function;
  ``matrix_descriptor_host`` is the same code for the host, with argument checks).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import cuda
from numba.cuda import types

from ._ptx import f32, intrinsic, literal_intrinsic, ptx_asm, u16, u32, u64

__all__ = [
    "shared_address",
    "dynamic_shared_base",
    "shared_array",
    "ld_shared_u32",
    "ld_shared_f32",
    "ld_shared_v2_f32",
    "ld_shared_v4_u32",
    "st_shared_u16",
    "st_shared_u32",
    "st_shared_v2_f32",
    "st_shared_v2_u64",
    "matrix_descriptor",
    "matrix_descriptor_host",
    "SWIZZLE_CODES",
]

_ADDRSPACE_SHARED = 3
_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
DYNAMIC_SMEM_SYMBOL = "__numba_hopper_dynamic_smem"
DYNAMIC_SMEM_ALIGN = 1024


@intrinsic
def shared_address(typingctx, arr):
    """uint32 ``.shared::cta`` address of the first element of a shared array (or slice).

    The array must live in shared memory (``cuda.shared.array`` or ``shared_array``);
    for any other array the result is meaningless. LLVM: addrspacecast to addrspace(3),
    then ptrtoint to i32.
    """
    if not isinstance(arr, types.Array):
        raise TypeError(f"shared_address: expected a shared array, got {arr}")

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        shared = builder.addrspacecast(data, ir.PointerType(data.type.pointee, _ADDRSPACE_SHARED))
        return builder.ptrtoint(shared, _I32)

    return types.uint32(arr), codegen


def _dynamic_smem(builder):
    """The module's ``.extern .shared .align 1024 .b8 __numba_hopper_dynamic_smem[]``."""
    module = builder.module
    try:
        return module.get_global(DYNAMIC_SMEM_SYMBOL)
    except KeyError:
        gv = ir.GlobalVariable(module, ir.ArrayType(_I8, 0), DYNAMIC_SMEM_SYMBOL, _ADDRSPACE_SHARED)
        gv.linkage = "external"
        gv.align = DYNAMIC_SMEM_ALIGN
        return gv


def _dynamic_smem_ptr(builder):
    """i8 addrspace(3)* to the start of dynamic shared memory."""
    return builder.bitcast(_dynamic_smem(builder), ir.PointerType(_I8, _ADDRSPACE_SHARED))


@intrinsic
def dynamic_shared_base(typingctx):
    """uint32 ``.shared::cta`` address of dynamic shared memory (1024-byte aligned).

    Declares ``.extern .shared .align 1024 .b8 __numba_hopper_dynamic_smem[]``; all extern
    shared arrays of a kernel (numba's ``cuda.shared.array(0, ...)`` too) start at the same
    address, after the static shared memory, padded to the largest alignment.
    """

    def codegen(context, builder, sig, args):
        return builder.ptrtoint(_dynamic_smem_ptr(builder), _I32)

    return types.uint32(), codegen


def _literal_shape(shape):
    if isinstance(shape, types.IntegerLiteral):
        return (shape.literal_value,)
    if isinstance(shape, types.BaseTuple) and all(isinstance(s, types.IntegerLiteral) for s in shape):
        return tuple(s.literal_value for s in shape)
    return None


def _numba_dtype(dtype):
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    return None


@literal_intrinsic
def shared_array(typingctx, byte_offset, shape, dtype):
    """A C-contiguous array of ``shape``/``dtype`` at ``dynamic_shared_base() + byte_offset``.

    ``shape`` (an int or a tuple of ints) and ``dtype`` (e.g. ``np.float32``) are
    compile-time constants; ``byte_offset`` may be a run-time integer. Nothing checks that
    the view fits in the dynamic shared memory the kernel is launched with, nor that
    ``byte_offset`` is aligned for ``dtype``.
    """
    if not isinstance(byte_offset, types.Integer):
        raise TypeError(f"shared_array: byte_offset must be an integer, got {byte_offset}")
    dims = _literal_shape(shape)
    if dims is None:
        raise TypeError(f"shared_array: shape must be a compile-time int or tuple of ints, got {shape}")
    if not dims or any(d <= 0 for d in dims):
        raise TypeError(f"shared_array: shape must be positive, got {dims}")
    elem = _numba_dtype(dtype)
    if elem is None:
        raise TypeError(f"shared_array: dtype must be a NumPy/numba scalar type, got {dtype}")
    arrty = types.Array(elem, len(dims), "C")

    def codegen(context, builder, sig, args):
        offset = context.cast(builder, args[0], sig.args[0], types.intp)
        ptr = builder.gep(_dynamic_smem_ptr(builder), [offset])
        generic = builder.addrspacecast(ptr, ir.PointerType(_I8))
        itemsize = context.get_abi_sizeof(context.get_data_type(elem))
        strides, stride = [], itemsize
        for d in reversed(dims):
            strides.insert(0, stride)
            stride *= d
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(
            ary,
            data=builder.bitcast(generic, ary.data.type),
            shape=[context.get_constant(types.intp, d) for d in dims],
            strides=[context.get_constant(types.intp, s) for s in strides],
            itemsize=context.get_constant(types.intp, itemsize),
            meminfo=None,
        )
        return ary._getvalue()

    return arrty(types.unliteral(byte_offset), shape, dtype), codegen


@ptx_asm("ld.shared::cta.u32 {out}, [{addr}];")
def ld_shared_u32(addr: u32) -> u32:
    """PTX ISA 9.7.9.8 ld: 32-bit load from a .shared::cta address."""


@ptx_asm("ld.shared::cta.f32 {out}, [{addr}];")
def ld_shared_f32(addr: u32) -> f32:
    """PTX ISA 9.7.9.8 ld: one f32 from shared memory."""


@ptx_asm("ld.shared::cta.v2.f32 {{out0}, {out1}}, [{addr}];")
def ld_shared_v2_f32(addr: u32) -> tuple[f32, f32]:
    """PTX ISA 9.7.9.8 ld: two float32 from an 8-byte-aligned .shared::cta address."""


@ptx_asm("ld.shared::cta.v4.u32 {{out0}, {out1}, {out2}, {out3}}, [{addr}];")
def ld_shared_v4_u32(addr: u32) -> tuple[u32, u32, u32, u32]:
    """PTX ISA 9.7.9.8 ld: 16 bytes (four u32) from a 16-byte-aligned .shared::cta address."""


@ptx_asm("st.shared::cta.u16 [{addr}], {value};")
def st_shared_u16(addr: u32, value: u16):
    """PTX ISA 9.7.9.10 st: 16-bit store to a .shared::cta address."""


@ptx_asm("st.shared::cta.u32 [{addr}], {value};")
def st_shared_u32(addr: u32, value: u32):
    """PTX ISA 9.7.9.10 st: 32-bit store to a .shared::cta address."""


@ptx_asm("st.shared::cta.v2.u64 [{addr}], {{x}, {y}};")
def st_shared_v2_u64(addr: u32, x: u64, y: u64):
    """PTX ISA 9.7.9.10 st: two uint64 to a 16-byte-aligned .shared::cta address."""


@ptx_asm("st.shared::cta.v2.f32 [{addr}], {{x}, {y}};")
def st_shared_v2_f32(addr: u32, x: f32, y: f32):
    """PTX ISA 9.7.9.10 st: two float32 to an 8-byte-aligned .shared::cta address."""


# --- wgmma matrix descriptor (PTX ISA 9.7.15.5.1.2.2 "Matrix Descriptor Format") ---------
#
#   bits  0-13  start address >> 4        bits 16-29  leading dimension byte offset >> 4
#   bits 32-45  stride dimension byte offset >> 4
#   bits 49-51  matrix base offset        bits 62-63  swizzle: 0 none, 1 128B, 2 64B, 3 32B

SWIZZLE_CODES = {0: 0, 128: 1, 64: 2, 32: 3}
# swizzle code packed 2 bits per (swizzle_bytes >> 4): index 0 -> 0, 2 -> 3, 4 -> 2, 8 -> 1.
_SWIZZLE_TABLE = (3 << 4) | (2 << 8) | (1 << 16)


def _matrix_descriptor(start_address, leading_byte_offset, stride_byte_offset, swizzle_bytes, base_offset):
    # Shared by host and device: numpy uint64 arithmetic only, no branches.
    m14 = np.uint64(0x3FFF)
    desc = (np.uint64(start_address) >> np.uint64(4)) & m14
    desc |= ((np.uint64(leading_byte_offset) >> np.uint64(4)) & m14) << np.uint64(16)
    desc |= ((np.uint64(stride_byte_offset) >> np.uint64(4)) & m14) << np.uint64(32)
    desc |= (np.uint64(base_offset) & np.uint64(7)) << np.uint64(49)
    shift = (np.uint64(swizzle_bytes) >> np.uint64(4)) << np.uint64(1)
    desc |= ((np.uint64(_SWIZZLE_TABLE) >> shift) & np.uint64(3)) << np.uint64(62)
    return desc


matrix_descriptor = cuda.jit(device=True, inline="always")(_matrix_descriptor)
matrix_descriptor.__doc__ = """uint64 wgmma matrix descriptor (device function).

``matrix_descriptor(start_address, leading_byte_offset, stride_byte_offset, swizzle_bytes,
base_offset)``: start address and byte offsets in bytes (multiples of 16; the shared window
is 256 KiB, 18 bits), ``swizzle_bytes`` in {0, 32, 64, 128}, ``base_offset`` 0..7. PTX ISA
9.7.15.5.1.2.2. Branch-free; folds to a few ALU ops when the offsets are constants.

To step a descriptor along K, add the byte step >> 4 as a uint64 (``desc + np.uint64(2)``
for 32 bytes): in numba, ``uint64 + int`` is a float64.
"""


def matrix_descriptor_host(start_address, leading_byte_offset, stride_byte_offset, swizzle_bytes=0, base_offset=0):
    """Host twin of ``matrix_descriptor`` (same code), with argument checks; returns an int."""
    if swizzle_bytes not in SWIZZLE_CODES:
        raise ValueError(f"swizzle_bytes must be one of {sorted(SWIZZLE_CODES)}; got {swizzle_bytes}")
    for name, v in (("start_address", start_address), ("leading_byte_offset", leading_byte_offset),
                    ("stride_byte_offset", stride_byte_offset)):
        if not 0 <= v < (1 << 18) or v % 16:
            raise ValueError(f"{name} must be a multiple of 16 in [0, 2**18); got {v}")
    if not 0 <= base_offset <= 7:
        raise ValueError(f"base_offset must be in [0, 7]; got {base_offset}")
    return int(_matrix_descriptor(start_address, leading_byte_offset, stride_byte_offset, swizzle_bytes, base_offset))
