"""TMA reductions and L2 prefetch of tensor boxes (PTX ``cp.reduce.async.bulk.tensor``,
``cp.async.bulk.prefetch.tensor``).

Operands as in :mod:`.tma`. A reduction combines a shared-memory box with the global tensor
element-wise (``op``: add, min or max) and is a bulk async-group operation: commit it with
``bulk_commit_group()`` and wait with ``bulk_wait_group(n)``. A prefetch brings a box into
L2 and completes on nothing.
"""

from ._ptx import Choice, ptx_asm, s32, u32, u64

__all__ = [
    "tma_reduce_1d",
    "tma_reduce_2d",
    "tma_reduce_3d",
    "tma_reduce_4d",
    "tma_reduce_5d",
    "tma_prefetch_1d",
    "tma_prefetch_2d",
    "tma_prefetch_3d",
    "tma_prefetch_4d",
    "tma_prefetch_5d",
]


# --- reductions into global memory: global[box] = op(global[box], shared) ------------------
_REDUCE_OP = Choice("add", "min", "max")


@ptx_asm(
    "cp.reduce.async.bulk.tensor.1d.global.shared::cta.{op}.tile.bulk_group"
    " [{tmap}, {{c0}}], [{src}];"
)
def tma_reduce_1d(op: _REDUCE_OP, tmap: u64, src: u32, c0: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = ``op``(global[box], shared
    ``src``) for the 1D box at c0; ``op``: 'add', 'min' or 'max' (a literal), the element
    type from the tensor map; a bulk async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.2d.global.shared::cta.{op}.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}}], [{src}];"
)
def tma_reduce_2d(op: _REDUCE_OP, tmap: u64, src: u32, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = ``op``(global[box], shared
    ``src``) for the 2D box at (c0, c1); ``op``: 'add', 'min' or 'max' (a literal), the
    element type from the tensor map; a bulk async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.3d.global.shared::cta.{op}.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}}], [{src}];"
)
def tma_reduce_3d(op: _REDUCE_OP, tmap: u64, src: u32, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = ``op``(global[box], shared
    ``src``) for the 3D box at (c0, c1, c2); ``op``: 'add', 'min' or 'max' (a literal), the
    element type from the tensor map; a bulk async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.4d.global.shared::cta.{op}.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{src}];"
)
def tma_reduce_4d(op: _REDUCE_OP, tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = ``op``(global[box], shared
    ``src``) for the 4D box at (c0, c1, c2, c3); ``op``: 'add', 'min' or 'max' (a literal), the
    element type from the tensor map; a bulk async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.5d.global.shared::cta.{op}.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{src}];"
)
def tma_reduce_5d(op: _REDUCE_OP, tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = ``op``(global[box], shared
    ``src``) for the 5D box at (c0, c1, c2, c3, c4); ``op``: 'add', 'min' or 'max' (a literal), the
    element type from the tensor map; a bulk async-group operation.
    """


# --- prefetch into L2 ----------------------------------------------------------------------
@ptx_asm(
    "cp.async.bulk.prefetch.tensor.1d.L2.global.tile"
    " [{tmap}, {{c0}}];"
)
def tma_prefetch_1d(tmap: u64, c0: s32):
    """PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor: prefetch the 1D box at c0 into L2."""


@ptx_asm(
    "cp.async.bulk.prefetch.tensor.2d.L2.global.tile"
    " [{tmap}, {{c0}, {c1}}];"
)
def tma_prefetch_2d(tmap: u64, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor: prefetch the 2D box at (c0, c1) into
    L2.
    """


@ptx_asm(
    "cp.async.bulk.prefetch.tensor.3d.L2.global.tile"
    " [{tmap}, {{c0}, {c1}, {c2}}];"
)
def tma_prefetch_3d(tmap: u64, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor: prefetch the 3D box at (c0, c1, c2)
    into L2.
    """


@ptx_asm(
    "cp.async.bulk.prefetch.tensor.4d.L2.global.tile"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}];"
)
def tma_prefetch_4d(tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor: prefetch the 4D box at (c0, c1, c2,
    c3) into L2.
    """


@ptx_asm(
    "cp.async.bulk.prefetch.tensor.5d.L2.global.tile"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}];"
)
def tma_prefetch_5d(tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor: prefetch the 5D box at (c0, c1, c2,
    c3, c4) into L2.
    """
