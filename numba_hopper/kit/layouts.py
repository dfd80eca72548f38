"""Shared-memory layouts by name: wgmma operand tiles and their descriptors, TMA swizzle
addressing, and the host arithmetic that places buffers in dynamic shared memory.

**Operand tiles.** A wgmma operand (A: M x K, B: N x K; "MN" below is M or N) lies in shared
memory as TMA leaves it: boxes whose contiguous dimension is one swizzle span of ``S`` bytes
(32, 64 or 128), rows of ``S`` bytes, swizzled within each 8-row atom of ``8S`` bytes.

- **K-major** (K contiguous: A row-major, B column-major; ``tnsp = 0``). A box is ``mn`` rows
  of ``S`` bytes of K; a tile of ``k`` elements is ``k*e/S`` such boxes one after another
  (``e``: element bytes)::

        box 0: K bytes [0, S)           box 1: K bytes [S, 2S)   ...
        row 0  |--- S bytes ---|        row 0  |--- S ---|
        ...   (8-row atoms, 8S bytes)   ...
        row mn-1                        row mn-1

  Descriptor: ``LBO = 16`` (unused), ``SBO = 8S`` (the next 8 rows). A wgmma consumes 32
  bytes of K (k16 for 16-bit types, k32 for fp8, k8 for tf32); k-step ``kk`` starts at byte
  ``(32kk // S) * mn*S + 32kk % S``: inside a box the start address moves along the swizzled
  row, which the hardware swizzles the same way as TMA did.
- **MN-major** (MN contiguous: A column-major, B row-major; ``tnsp = 1``; 16-bit types only).
  A box is ``k`` rows (K) of ``S`` bytes of MN; a tile is ``mn*e/S`` boxes along MN::

        box 0: MN bytes [0, S)          box 1: MN bytes [S, 2S)
        k row 0  |--- S bytes ---|      ...
        ...     (8 k rows: SBO = 8S)
        k row k-1

  Descriptor: ``LBO = k*S`` (the next box along MN), ``SBO = 8S`` (the next 8 k rows). A k16
  step is 16 k rows: ``16S`` bytes.

:func:`operand_layout` checks a layout and gives these numbers (an :class:`OperandLayout`);
:func:`make_descriptors` gives the device functions that build a descriptor and step it::

    A = operand_layout("K", 128, "bf16", mn=128, k=64)        # 128 x 64 bf16, SW128, K-major
    a_desc, a_loads = make_descriptors(A), make_tile_loads(A)
    a_loads.load(smem + stage * A.tile_bytes, tmap_a, m0, k0, full)   # its TMA boxes
    d = a_desc.advance(a_desc.at(smem), stage, A.tile_bytes)   # the slot's descriptor
    acc = nh.wgmma_mma_async(acc, a_desc.k_step(d, kk), ..., A.tnsp, ...)   # k-step kk

    # the tensor map's box (numpy order) and swizzle: A.box == (128, 64), A.swizzle

**Swizzle.** TMA stores byte ``o`` of a box (row-major, 1024-byte-aligned buffer) at
``o ^ (((o >> 7) & (S/16 - 1)) << 4)``: :func:`swizzle` (device) and :func:`swizzle_host`;
:func:`box_address` is the address of byte ``b`` of row ``r`` of a box of ``S``-byte rows.

**Placing buffers.** :class:`SmemPlan` adds buffers to dynamic shared memory with asserted
alignment and reports the total, refusing a plan over the device's 227 KB::

    plan = SmemPlan()
    A_OFF = plan.add("a", STAGES * A.tile_bytes, A.alignment)
    BARS = plan.add("barriers", ring.barrier_bytes, 8)
    SHARED_BYTES = plan.size          # launch(..., shared_mem=SHARED_BYTES)

PTX ISA 9.7.15.5.1.2 "Shared Memory Matrix Layout" (the canonical layouts and the matrix
descriptor), CUDA Programming Guide, "Using the Tensor Memory Accelerator (TMA)" (swizzle).
"""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple

import numpy as np
from numba import cuda

from ..intrinsics import (createpolicy_fractional, matrix_descriptor, tma_load_2d, tma_load_2d_cache_hint, tma_load_3d,
                          tma_load_3d_cache_hint, tma_load_multicast_2d, tma_load_multicast_2d_cache_hint,
                          tma_load_multicast_3d, tma_load_multicast_3d_cache_hint, tma_prefetch_2d, tma_prefetch_3d,
                          wgmma_accumulator, wgmma_commit_group, wgmma_fence, wgmma_fence_operand, wgmma_mma_async)

__all__ = [
    "OperandLayout",
    "operand_layout",
    "OperandDescriptors",
    "make_descriptors",
    "TileLoads",
    "make_tile_loads",
    "tma_box",
    "EVICTION_PRIORITIES",
    "Mma",
    "make_mma",
    "swizzle",
    "swizzle_host",
    "box_address",
    "make_box_address",
    "SmemPlan",
    "MAX_DYNAMIC_SHARED",
    "OPERAND_SWIZZLES",
    "ELEMENT_BYTES",
]

OPERAND_SWIZZLES = (32, 64, 128)
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "s8": 1, "u8": 1}
WGMMA_K_BYTES = 32  # K of one wgmma: 32 bytes of each row (k16 16-bit, k32 8-bit, k8 tf32)
MAX_DYNAMIC_SHARED = 232448  # bytes a CTA may opt into on H100/H200 (227 KB)


class OperandLayout(NamedTuple):
    """A wgmma operand tile in shared memory (:func:`operand_layout` builds and checks one).

    ``major`` "K" or "MN", ``swizzle`` S in bytes, ``dtype``, ``mn`` rows (M or N) and ``k``
    elements of K; derived: ``element_bytes``, ``tnsp`` (wgmma's transpose bit), ``box`` (the
    TMA box, numpy order), ``box_bytes``, ``boxes`` per tile, ``tile_bytes``, ``alignment`` (of
    the tile's start: the swizzle atom, ``8S``), ``lbo``/``sbo`` (descriptor byte offsets) and
    ``k_steps`` (wgmmas per tile along K). A named tuple, so a kernel reads its fields as
    constants (``A.tile_bytes``); the methods :meth:`k_offset` and :meth:`mn_offset` are for
    the host (compute a constant from them at module level).
    """

    major: str
    swizzle: int
    dtype: str
    mn: int
    k: int
    element_bytes: int
    tnsp: int
    box: tuple
    box_bytes: int
    boxes: int
    tile_bytes: int
    alignment: int
    lbo: int
    sbo: int
    k_steps: int

    def k_offset(self, kk: int) -> int:
        """Bytes from the tile's start to k-step ``kk``'s first element."""
        if self.major == "MN":
            return kk * 16 * self.swizzle
        along = kk * WGMMA_K_BYTES
        return (along // self.swizzle) * self.box_bytes + along % self.swizzle

    def mn_offset(self, rows: int) -> int:
        """Bytes from the tile's start to its row ``rows`` along MN (e.g. consumer warpgroup
        ``cw``'s 64 rows of an A tile: ``mn_offset(64 * cw)``)."""
        if self.major == "K":
            if rows % 8:
                raise ValueError(f"a K-major tile splits along MN at 8-row atoms; {rows} rows is not a multiple of 8")
            return rows * self.swizzle
        span = self.swizzle // self.element_bytes
        if rows % span:
            raise ValueError(f"an MN-major tile splits along MN at whole boxes of {span} elements; got {rows}")
        return rows // span * self.box_bytes


def operand_layout(major, swizzle, dtype, mn, k) -> OperandLayout:
    """Check and return the :class:`OperandLayout` of an ``mn`` x ``k`` operand tile.

    Rules (each error names the one broken and how to meet it): ``major`` "K" or "MN";
    ``swizzle`` 32, 64 or 128 (no-swizzle layouts need 8 x 16-byte core matrices that one
    TMA box does not produce); MN-major only for 16-bit types (wgmma transposes bf16/f16
    only); ``mn`` a multiple of 8; K-major: ``k`` whole swizzle spans (``k*e % S == 0``);
    MN-major: ``mn`` whole spans and ``k`` a multiple of 16 (one k16 step); a box is at most
    256 rows (TMA).
    """
    if major not in ("K", "MN"):
        raise ValueError(f"major must be 'K' (K contiguous: A row-major, B column-major) or 'MN' (M or N "
                         f"contiguous); got {major!r}")
    if swizzle not in OPERAND_SWIZZLES:
        raise ValueError(f"swizzle must be one of {OPERAND_SWIZZLES} bytes (the span a TMA box row covers); got "
                         f"{swizzle!r}. Without a swizzle wgmma needs 8 x 16-byte core matrices, which one TMA box "
                         "does not lay out: use 32")
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"dtype must be one of {tuple(ELEMENT_BYTES)}; got {dtype!r}")
    e = ELEMENT_BYTES[dtype]
    if major == "MN" and e != 2:
        raise ValueError(f"wgmma reads {dtype} operands K-major only (its transpose bit is for bf16/f16): use "
                         "major='K' and a tensor map over the transposed operand")
    if mn <= 0 or mn % 8:
        raise ValueError(f"mn must be a positive multiple of 8 (the 8-row swizzle atom); got {mn}")
    if major == "K" and (k <= 0 or k * e % swizzle):
        raise ValueError(f"a K-major tile holds whole swizzle spans of K: k * {e} bytes must be a multiple of "
                         f"{swizzle}; got k = {k} (use k = {swizzle // e} or a multiple, or a narrower swizzle)")
    if major == "MN" and (mn * e % swizzle or k <= 0 or k % 16):
        raise ValueError(f"an MN-major tile holds whole swizzle spans of MN (mn * {e} a multiple of {swizzle}) "
                         f"and whole k16 steps (k a multiple of 16); got mn = {mn}, k = {k}")
    box = (mn if major == "K" else k, swizzle // e)
    if box[0] > 256:
        raise ValueError(f"a TMA box has at most 256 rows; this layout's box is {box}: split the tile "
                         f"({'mn' if major == 'K' else 'k'} <= 256)")
    boxes = (k if major == "K" else mn) * e // swizzle
    return OperandLayout(major, swizzle, dtype, mn, k, e, int(major == "MN"), box, box[0] * swizzle, boxes, mn * k * e,
                         8 * swizzle, 16 if major == "K" else k * swizzle, 8 * swizzle, k * e // WGMMA_K_BYTES)


OperandDescriptors = namedtuple("OperandDescriptors", ["at", "k_step", "advance"])
OperandDescriptors.__doc__ = """Device functions of one :class:`OperandLayout`: ``at(addr)``, the
uint64 descriptor of the tile at shared address ``addr``; ``k_step(desc, kk)``, the descriptor
of k-step ``kk`` (``desc`` + the byte offset >> 4: one add when ``kk`` is a constant or an
unrolled loop's index); ``advance(desc, count, stride)``, the descriptor ``count`` times
``stride`` bytes further (``stride`` a compile-time multiple of 16: a ring slot is
``advance(d0, st.stage, tile_bytes)``, one multiply-add on slot 0's loop-invariant
descriptor; the address field counts 16-byte units and never carries within the 256 KiB
shared window)."""


def make_descriptors(layout: OperandLayout) -> OperandDescriptors:
    """The :class:`OperandDescriptors` of ``layout`` (module doc)."""
    LBO, SBO, SWIZZLE = layout.lbo, layout.sbo, layout.swizzle
    MN_MAJOR = layout.major == "MN"
    STEP16 = 16 * SWIZZLE // 16  # MN-major: a k16 step in 16-byte units
    BOX16 = layout.box_bytes // 16
    PER_BOX = SWIZZLE // WGMMA_K_BYTES  # K-major: k-steps per box
    ONE_BOX = layout.boxes == 1

    @cuda.jit(device=True, inline="always", forceinline=True)
    def at(addr):
        return matrix_descriptor(addr, LBO, SBO, SWIZZLE, 0)

    @cuda.jit(device=True, forceinline=True)
    def k_step(desc, kk):
        if MN_MAJOR:
            return desc + np.uint64(kk * STEP16)
        if ONE_BOX:  # (the same offsets, in the form LLVM unrolls a k-loop around best)
            return desc + np.uint64(kk * WGMMA_K_BYTES // 16)
        return desc + np.uint64((kk // PER_BOX) * BOX16 + (kk % PER_BOX) * (WGMMA_K_BYTES // 16))

    @cuda.jit(device=True, forceinline=True)
    def advance(desc, count, stride):
        return desc + np.uint64(count) * np.uint64(stride // 16)

    return OperandDescriptors(at, k_step, advance)


def tma_box(layout: OperandLayout, parts=1) -> tuple:
    """The TMA box (numpy order) that loads ``layout``'s tile, or one of ``parts`` equal parts
    of it shared by multicast: a K-major part is ``mn / parts`` rows (whole 8-row atoms) of
    each box, an MN-major part whole boxes (``boxes`` a multiple of ``parts``)."""
    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a positive int; got {parts!r}")
    if layout.major == "MN":
        if layout.boxes % parts:
            raise ValueError(f"an MN-major tile of {layout.boxes} boxes splits into whole boxes; {parts} parts do not")
        return layout.box
    if layout.mn % parts or layout.mn // parts % 8:
        raise ValueError(f"a K-major tile of {layout.mn} rows splits into parts of whole 8-row atoms; {parts} parts "
                         "do not")
    return layout.mn // parts, layout.box[1]


TileLoads = namedtuple("TileLoads", ["parts", "box", "load", "load_3d", "load_part", "load_part_3d", "prefetch",
                                     "prefetch_3d"])
TileLoads.__doc__ = """The TMA loads of one operand tile (:func:`make_tile_loads`): ``load(dst, tmap, mn0, k0,
bar)`` for a 2-D tensor map and ``load_3d(dst, tmap, mn0, k0, batch, bar)`` for a 3-D one (batch
outermost): the tile's boxes, box ``i`` to ``dst + i * box_bytes``, each completing on the
mbarrier ``bar`` (arm it for ``layout.tile_bytes``). In a cluster whose ``parts`` CTAs share the
tile, ``load_part(dst, tmap, mn0, k0, bar, part, mask)`` (and ``load_part_3d(..., batch, bar, part,
mask)``) loads this CTA's ``part`` of it and multicasts it to the CTAs in ``mask``, landing at
the same place in each and completing on each one's ``bar``; with ``parts == 1`` they are
``load`` and ``load_3d`` (``part`` and ``mask`` unused), so one call serves a kernel compiled with
or without a cluster. ``prefetch(tmap, mn0, k0)`` and ``prefetch_3d(tmap, mn0, k0, batch)`` bring
the tile's boxes into L2 (``cp.async.bulk.prefetch.tensor``: no shared memory, no barrier), for a
load that will come before the data could arrive (the first k-blocks of a kernel that waits on
the one before it). ``box``: the tensor map's box for these loads (numpy order: a K-major tile's
part is ``mn / parts`` rows)."""


EVICTION_PRIORITIES = ("normal", "first", "last")


def _hinted(plain, hinted, policy):
    """The TMA load ``plain``, or with ``policy`` (an L2 eviction priority) its ``.L2::cache_hint``
    form ``hinted``, which takes the policy as its last argument."""
    if policy is None:
        return plain

    @cuda.jit(device=True, forceinline=True)
    def load(*args):
        hinted(*(args + (createpolicy_fractional(policy),)))
    return load


def make_tile_loads(layout: OperandLayout, parts=1, evict="normal") -> TileLoads:
    """The :class:`TileLoads` of ``layout``: a K-major tile's boxes follow each other along
    K (coordinates ``(k0 + i * span, mn0)``, innermost first), an MN-major tile's along MN
    (``(mn0 + i * span, k0)``), ``span`` the box's ``swizzle / element_bytes`` elements.
    ``parts`` > 1 (CTAs sharing the tile by multicast): a K-major tile is split by rows, each
    part ``mn / parts`` rows (whole 8-row atoms) of every box; an MN-major tile by boxes.
    ``evict``: the L2 priority of the loaded lines, one of :data:`EVICTION_PRIORITIES`
    ("normal": loads without a cache hint; "first" / "last": the ``.L2::cache_hint`` loads with
    ``createpolicy.fractional.L2::evict_first`` / ``evict_last``, PTX ISA 9.7.9.18). An operand
    whose lines are read once is loaded "first" so that they leave the L2 before those of an
    operand read again and again ("last")."""
    if evict not in EVICTION_PRIORITIES:
        raise ValueError(f"evict must be one of {EVICTION_PRIORITIES}; got {evict!r}")
    BOXES, BOX_BYTES, SWIZZLE = layout.boxes, layout.box_bytes, layout.swizzle
    SPAN = SWIZZLE // layout.element_bytes
    K_MAJOR = layout.major == "K"
    box = tma_box(layout, parts)
    SHARED, PART_ROWS, PART_BOXES = parts, layout.mn // parts, BOXES // parts
    policy = None if evict == "normal" else "evict_" + evict
    box_2d = _hinted(tma_load_2d, tma_load_2d_cache_hint, policy)
    box_3d = _hinted(tma_load_3d, tma_load_3d_cache_hint, policy)
    multicast_2d = _hinted(tma_load_multicast_2d, tma_load_multicast_2d_cache_hint, policy)
    multicast_3d = _hinted(tma_load_multicast_3d, tma_load_multicast_3d_cache_hint, policy)

    # A K-major tile of one box (the usual: k spans the swizzle) takes no loop: LLVM keeps the
    # address arithmetic of a one-trip loop in 64 bits. (MN-major tiles keep theirs, whatever
    # the count.)
    @cuda.jit(device=True, forceinline=True)
    def load(dst, tmap, mn0, k0, bar):
        if not K_MAJOR:
            for i in range(BOXES):
                box_2d(dst + i * BOX_BYTES, tmap, mn0 + i * SPAN, k0, bar)
        elif BOXES == 1:
            box_2d(dst, tmap, k0, mn0, bar)
        else:
            for i in range(BOXES):
                box_2d(dst + i * BOX_BYTES, tmap, k0 + i * SPAN, mn0, bar)

    @cuda.jit(device=True, forceinline=True)
    def load_3d(dst, tmap, mn0, k0, batch, bar):
        if not K_MAJOR:
            for i in range(BOXES):
                box_3d(dst + i * BOX_BYTES, tmap, mn0 + i * SPAN, k0, batch, bar)
        elif BOXES == 1:
            box_3d(dst, tmap, k0, mn0, batch, bar)
        else:
            for i in range(BOXES):
                box_3d(dst + i * BOX_BYTES, tmap, k0 + i * SPAN, mn0, batch, bar)

    # A K-major part is rows part * PART_ROWS on of every box; an MN-major part, whole boxes.
    @cuda.jit(device=True, forceinline=True)
    def load_part(dst, tmap, mn0, k0, bar, part, mask):
        if SHARED == 1:
            load(dst, tmap, mn0, k0, bar)
        elif K_MAJOR and BOXES == 1:
            multicast_2d(dst + part * PART_ROWS * SWIZZLE, tmap, k0, mn0 + part * PART_ROWS, bar, mask)
        elif K_MAJOR:
            for i in range(BOXES):
                multicast_2d(dst + part * PART_ROWS * SWIZZLE + i * BOX_BYTES, tmap, k0 + i * SPAN,
                                      mn0 + part * PART_ROWS, bar, mask)
        else:
            for j in range(PART_BOXES):
                i = part * PART_BOXES + j
                multicast_2d(dst + i * BOX_BYTES, tmap, mn0 + i * SPAN, k0, bar, mask)

    @cuda.jit(device=True, forceinline=True)
    def load_part_3d(dst, tmap, mn0, k0, batch, bar, part, mask):
        if SHARED == 1:
            load_3d(dst, tmap, mn0, k0, batch, bar)
        elif K_MAJOR and BOXES == 1:
            multicast_3d(dst + part * PART_ROWS * SWIZZLE, tmap, k0, mn0 + part * PART_ROWS, batch, bar, mask)
        elif K_MAJOR:
            for i in range(BOXES):
                multicast_3d(dst + part * PART_ROWS * SWIZZLE + i * BOX_BYTES, tmap, k0 + i * SPAN,
                                      mn0 + part * PART_ROWS, batch, bar, mask)
        else:
            for j in range(PART_BOXES):
                i = part * PART_BOXES + j
                multicast_3d(dst + i * BOX_BYTES, tmap, mn0 + i * SPAN, k0, batch, bar, mask)

    @cuda.jit(device=True, forceinline=True)
    def prefetch(tmap, mn0, k0):
        if not K_MAJOR:
            for i in range(BOXES):
                tma_prefetch_2d(tmap, mn0 + i * SPAN, k0)
        elif BOXES == 1:
            tma_prefetch_2d(tmap, k0, mn0)
        else:
            for i in range(BOXES):
                tma_prefetch_2d(tmap, k0 + i * SPAN, mn0)

    @cuda.jit(device=True, forceinline=True)
    def prefetch_3d(tmap, mn0, k0, batch):
        if not K_MAJOR:
            for i in range(BOXES):
                tma_prefetch_3d(tmap, mn0 + i * SPAN, k0, batch)
        elif BOXES == 1:
            tma_prefetch_3d(tmap, k0, mn0, batch)
        else:
            for i in range(BOXES):
                tma_prefetch_3d(tmap, k0 + i * SPAN, mn0, batch)

    return TileLoads(parts, box, load, load_3d, load_part, load_part_3d, prefetch, prefetch_3d)


Mma = namedtuple("Mma", ["accumulator", "step", "k_block"])
Mma.__doc__ = """SS wgmmas over two :class:`OperandLayout` tiles (:func:`make_mma`): ``accumulator()``,
a zero f32 accumulator of N = the B tile's ``mn``, pinned in place (``wgmma_fence_operand``: unpinned,
ptxas may sink the zeroing into the wgmma loop and serialize its wgmmas, warning C7515);
``step(acc, a_desc, b_desc, kk, scale_d)``, the wgmma of k-step ``kk`` (``scale_d`` 0: overwrite
``acc``); ``k_block(acc, a_desc, b_desc, first)``, ``wgmma.fence``, every k-step of the tiles (the
first overwriting ``acc`` if ``first``) and ``wgmma.commit_group``: one group to wait for."""


def make_mma(a: OperandLayout, b: OperandLayout, n=None) -> Mma:
    """The :class:`Mma` of A tiles ``a`` and B tiles ``b`` (same dtype family and K extent).
    ``n``: the wgmma's N, the B tile's ``mn`` unless the tile is wider than the product (an
    MN-major tile of whole boxes: N = 160 reads the first 160 of a 192-wide tile); the
    accumulator, a ``wgmma_accumulator(n, "f32")`` tuple, gives it (``step`` and ``k_block``
    take any accumulator: a narrower one computes the tile's first columns). Types, transpose
    bits and k-steps come from the layouts; mismatches raise ``ValueError`` here."""
    if a.k != b.k or a.element_bytes != b.element_bytes:
        raise ValueError(f"A and B tiles must cover the same K with the same element size; got A {a.mn} x {a.k} "
                         f"{a.dtype}, B {b.mn} x {b.k} {b.dtype}")
    N = b.mn if n is None else n
    if not isinstance(N, int) or N % 8 or not 8 <= N <= min(256, b.mn):
        raise ValueError(f"a wgmma's N (the B tile's mn, or n) is a multiple of 8 in [8, 256], at most the B tile's "
                         f"{b.mn} rows; got {N}: split B")
    if a.mn % 64:
        raise ValueError(f"a wgmma's A is 64 rows (one warpgroup's): A tiles hold a multiple of 64; got {a.mn}")
    A_T, B_T, TA, TB, STEPS = a.dtype, b.dtype, a.tnsp, b.tnsp, a.k_steps
    da, db = make_descriptors(a), make_descriptors(b)

    @cuda.jit(device=True, forceinline=True)
    def accumulator():
        return wgmma_fence_operand(wgmma_accumulator(N, "f32"))

    @cuda.jit(device=True, forceinline=True)
    def step(acc, a_desc, b_desc, kk, scale_d):
        return wgmma_mma_async(acc, da.k_step(a_desc, kk), db.k_step(b_desc, kk), scale_d, A_T, B_T, 1, 1, TA, TB)

    @cuda.jit(device=True, forceinline=True)
    def k_block(acc, a_desc, b_desc, first):
        wgmma_fence()
        for kk in range(STEPS):
            acc = step(acc, a_desc, b_desc, kk, 0 if first and kk == 0 else 1)
        wgmma_commit_group()
        return acc

    return Mma(accumulator, step, k_block)


@cuda.jit(device=True, forceinline=True)
def swizzle(offset, span):
    """``offset`` (bytes from a 1024-byte-aligned box start) as TMA swizzles it with a
    ``span``-byte swizzle (0: unchanged): ``o ^ (((o >> 7) & (span/16 - 1)) << 4)``."""
    if span == 0:
        return offset
    return offset ^ (((offset >> 7) & (span // 16 - 1)) << 4)


def swizzle_host(offset, span):
    """Host twin of :func:`swizzle` (works on numpy arrays of offsets too)."""
    if span not in (0,) + OPERAND_SWIZZLES:
        raise ValueError(f"swizzle span must be 0, 32, 64 or 128; got {span}")
    if span == 0:
        return offset
    return offset ^ (((offset >> 7) & (span // 16 - 1)) << 4)


@cuda.jit(device=True, forceinline=True)
def box_address(base, row, byte, span):
    """Shared address of byte ``byte`` (< ``span``) of row ``row`` of a TMA box of
    ``span``-byte rows at ``base`` (1024-byte aligned), swizzled as TMA lays it out."""
    return base + swizzle(row * span + byte, span)


def make_box_address(span):
    """``address(base, row, byte)``: :func:`box_address` for a fixed ``span`` (32, 64 or 128),
    spelled per 16-byte chunk: chunk ``c`` of row ``r`` lies at chunk ``c ^ ((r >> s) & (span/16 -
    1))``, ``s`` = log2 of the rows in 128 bytes. The row's part is the same for every chunk of
    it, so a thread that writes several chunks of its rows computes it once (the tile store's
    form)."""
    if span not in OPERAND_SWIZZLES:
        raise ValueError(f"span must be one of {OPERAND_SWIZZLES} bytes; got {span!r}")
    MASK, ROW_SHIFT = span // 16 - 1, {128: 0, 64: 1, 32: 2}[span]

    @cuda.jit(device=True, forceinline=True)
    def address(base, row, byte):
        return base + row * span + (((byte >> 4) ^ ((row >> ROW_SHIFT) & MASK)) << 4) + (byte & 15)

    return address


class SmemPlan:
    """Buffers placed one after another in a kernel's dynamic shared memory (host side).

    ``add(name, nbytes, align)`` returns the buffer's byte offset from the dynamic base
    (which ``dynamic_shared_base()`` gives 1024-byte aligned), padded up to ``align`` (a
    power of two: 1024 for 128-byte-swizzled tiles, 128 for TMA boxes, 8 for mbarriers,
    16 for vectors); ``size`` is the bytes to launch with. Adding past ``limit``
    (:data:`MAX_DYNAMIC_SHARED`, the opt-in maximum of an H100/H200, less any static shared
    memory the kernel declares) raises ``ValueError`` listing the buffers, before any
    launch. ``offsets`` maps names to offsets; ``str(plan)`` shows the map.
    """

    def __init__(self, limit: int = MAX_DYNAMIC_SHARED):
        self.limit = limit
        self.offsets = {}
        self.sizes = {}
        self.size = 0

    def add(self, name: str, nbytes: int, align: int = 16) -> int:
        if name in self.offsets:
            raise ValueError(f"shared buffer {name!r} is already placed at {self.offsets[name]}")
        if not isinstance(align, int) or align < 1 or align & (align - 1) or align > 1024:
            raise ValueError(f"{name}: align must be a power of two in [1, 1024] (the dynamic base is 1024-byte "
                             f"aligned); got {align!r}")
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"{name}: nbytes must be a non-negative int; got {nbytes!r}")
        offset = -(-self.size // align) * align
        if offset + nbytes > self.limit:
            raise ValueError(f"{name} ({nbytes} bytes at offset {offset}) ends at {offset + nbytes} bytes, past the "
                             f"{self.limit} bytes of shared memory a CTA can have; placed so far: {self}. Use fewer "
                             "pipeline stages or smaller tiles")
        self.offsets[name] = offset
        self.sizes[name] = nbytes
        self.size = offset + nbytes
        return offset

    def __str__(self):
        parts = ", ".join(f"{n} {self.sizes[n]} B at {o}" for n, o in self.offsets.items())
        return f"SmemPlan({parts or 'empty'}; {self.size} bytes)"

    __repr__ = __str__
