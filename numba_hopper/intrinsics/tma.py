"""TMA: bulk tensor copies between global and shared memory (PTX ``cp.async.bulk.tensor``).

Operands:

- ``tmap``: the generic (``uint64``) global address of a 128-byte ``CUtensorMap``,
  ``TensorMap.device_ptr`` on the host. Before a thread first issues TMA with a descriptor
  it runs ``fence_proxy_tensormap_acquire(tmap)`` (the descriptor was written by the host
  into global memory; the tensormap proxy must not see a stale copy).
- ``dst``/``src``: 32-bit shared-memory addresses (``shared_address(arr)``,
  ``dynamic_shared_base()``): 128-byte aligned, 1024-byte aligned for 128-byte swizzle.
- ``bar``: the 32-bit shared address of an mbarrier; a load signals ``complete_tx`` on it
  with the box's byte count (``TensorMap.box_bytes``), so the issuing side first does
  ``mbarrier_arrive_expect_tx(bar, box_bytes)``.
- ``c0, c1, ...``: signed 32-bit element coordinates of the box's first element, INNERMOST
  FIRST (``c0`` is the contiguous dimension, i.e. the column of a row-major matrix: the
  reverse of numpy's order). They may be negative or run past the tensor: out-of-bounds
  elements are filled on load (zero, or NaN if the map asks) and dropped on store.
  ``c0 * itemsize`` must be a multiple of 16 bytes (8 bf16 columns, 4 f32 columns): an H100
  faults with CUDA_ERROR_ILLEGAL_INSTRUCTION otherwise (checked). Outer coordinates are free.

Loads (``tma_load_Nd``) complete on the mbarrier; stores (``tma_store_Nd``) and the
reductions of ``tma_reduce`` are bulk async-group operations: commit them with
``bulk_commit_group()`` and wait with ``bulk_wait_group(n)`` (writes done) or
``bulk_wait_group_read(n)`` (shared memory may be reused). Shared memory written by
ordinary stores must be made visible to the async proxy (``fence_proxy_async()``) before a
TMA store reads it.

Multicast (``tma_load_multicast_Nd(dst, tmap, c.., bar, cta_mask)``) writes the box to the
same shared-memory offset in every CTA of the cluster whose bit is set in the 16-bit
``cta_mask`` (bit i = cluster rank i) and signals each of those CTAs' mbarrier at offset
``bar``. ``_cache_hint`` variants take a 64-bit L2 policy (``createpolicy_fractional``).

Every variant is its own ``def`` below, one per instruction and dimension (as CUTLASS's
``SM90_TMA_LOAD_1D`` .. ``SM90_TMA_LOAD_5D``), its PTX in the ``@ptx_asm`` above it.
"""

from ._ptx import Choice, Const, b64, in_range, ptx_asm, s32, u16, u32, u64

__all__ = [
    "tma_load_1d",
    "tma_load_2d",
    "tma_load_3d",
    "tma_load_4d",
    "tma_load_5d",
    "tma_load_1d_cache_hint",
    "tma_load_2d_cache_hint",
    "tma_load_3d_cache_hint",
    "tma_load_4d_cache_hint",
    "tma_load_5d_cache_hint",
    "tma_load_multicast_1d",
    "tma_load_multicast_2d",
    "tma_load_multicast_3d",
    "tma_load_multicast_4d",
    "tma_load_multicast_5d",
    "tma_load_multicast_1d_cache_hint",
    "tma_load_multicast_2d_cache_hint",
    "tma_load_multicast_3d_cache_hint",
    "tma_load_multicast_4d_cache_hint",
    "tma_load_multicast_5d_cache_hint",
    "tma_store_1d",
    "tma_store_2d",
    "tma_store_3d",
    "tma_store_4d",
    "tma_store_5d",
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "createpolicy_fractional",
]


# --- loads: global -> shared::cluster, completing on an mbarrier ---------------------------
@ptx_asm(
    "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    " [{dst}], [{tmap}, {{c0}}], [{bar}];"
)
def tma_load_1d(dst: u32, tmap: u64, c0: s32, bar: u32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 1D box at c0 into shared memory at
    ``dst``; completes on the mbarrier ``bar`` with the box's byte count.
    """


@ptx_asm(
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    " [{dst}], [{tmap}, {{c0}, {c1}}], [{bar}];"
)
def tma_load_2d(dst: u32, tmap: u64, c0: s32, c1: s32, bar: u32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 2D box at (c0, c1) (innermost first)
    into shared memory at ``dst``; completes on the mbarrier ``bar`` with the box's byte count.
    """


@ptx_asm(
    "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}}], [{bar}];"
)
def tma_load_3d(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, bar: u32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 3D box at (c0, c1, c2) (innermost
    first) into shared memory at ``dst``; completes on the mbarrier ``bar`` with the box's byte
    count.
    """


@ptx_asm(
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{bar}];"
)
def tma_load_4d(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, bar: u32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 4D box at (c0, c1, c2, c3) (innermost
    first) into shared memory at ``dst``; completes on the mbarrier ``bar`` with the box's byte
    count.
    """


@ptx_asm(
    "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{bar}];"
)
def tma_load_5d(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32, bar: u32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 5D box at (c0, c1, c2, c3, c4)
    (innermost first) into shared memory at ``dst``; completes on the mbarrier ``bar`` with the
    box's byte count.
    """


# --- loads with an L2 cache policy (createpolicy_fractional) -------------------------------
@ptx_asm(
    "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}}], [{bar}], {policy};"
)
def tma_load_1d_cache_hint(dst: u32, tmap: u64, c0: s32, bar: u32, policy: u64):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_1d`` with the 64-bit L2 cache
    policy ``policy`` (``createpolicy_fractional``).
    """


@ptx_asm(
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}}], [{bar}], {policy};"
)
def tma_load_2d_cache_hint(dst: u32, tmap: u64, c0: s32, c1: s32, bar: u32, policy: u64):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_2d`` with the 64-bit L2 cache
    policy ``policy`` (``createpolicy_fractional``).
    """


@ptx_asm(
    "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}}], [{bar}], {policy};"
)
def tma_load_3d_cache_hint(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, bar: u32, policy: u64):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_3d`` with the 64-bit L2 cache
    policy ``policy`` (``createpolicy_fractional``).
    """


@ptx_asm(
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{bar}], {policy};"
)
def tma_load_4d_cache_hint(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, bar: u32, policy: u64):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_4d`` with the 64-bit L2 cache
    policy ``policy`` (``createpolicy_fractional``).
    """


@ptx_asm(
    "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{bar}], {policy};"
)
def tma_load_5d_cache_hint(
    dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32, bar: u32, policy: u64
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_5d`` with the 64-bit L2 cache
    policy ``policy`` (``createpolicy_fractional``).
    """


# --- multicast loads: one box into every CTA of the cluster set in cta_mask ----------------
@ptx_asm(
    "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster"
    " [{dst}], [{tmap}, {{c0}}], [{bar}], {cta_mask};"
)
def tma_load_multicast_1d(dst: u32, tmap: u64, c0: s32, bar: u32, cta_mask: u16):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 1D box at c0 into shared memory
    offset ``dst`` of every CTA of the cluster whose bit is set in ``cta_mask`` (16-bit; bit i =
    %cluster_ctarank i), completing on the mbarrier at offset ``bar`` in each of them.
    """


@ptx_asm(
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster"
    " [{dst}], [{tmap}, {{c0}, {c1}}], [{bar}], {cta_mask};"
)
def tma_load_multicast_2d(dst: u32, tmap: u64, c0: s32, c1: s32, bar: u32, cta_mask: u16):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 2D box at (c0, c1) into shared memory
    offset ``dst`` of every CTA of the cluster whose bit is set in ``cta_mask`` (16-bit; bit i =
    %cluster_ctarank i), completing on the mbarrier at offset ``bar`` in each of them.
    """


@ptx_asm(
    "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}}], [{bar}], {cta_mask};"
)
def tma_load_multicast_3d(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, bar: u32, cta_mask: u16):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 3D box at (c0, c1, c2) into shared
    memory offset ``dst`` of every CTA of the cluster whose bit is set in ``cta_mask`` (16-bit;
    bit i = %cluster_ctarank i), completing on the mbarrier at offset ``bar`` in each of them.
    """


@ptx_asm(
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{bar}], {cta_mask};"
)
def tma_load_multicast_4d(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, bar: u32, cta_mask: u16):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 4D box at (c0, c1, c2, c3) into
    shared memory offset ``dst`` of every CTA of the cluster whose bit is set in ``cta_mask``
    (16-bit; bit i = %cluster_ctarank i), completing on the mbarrier at offset ``bar`` in each
    of them.
    """


@ptx_asm(
    "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{bar}], {cta_mask};"
)
def tma_load_multicast_5d(
    dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32, bar: u32, cta_mask: u16
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: load the 5D box at (c0, c1, c2, c3, c4) into
    shared memory offset ``dst`` of every CTA of the cluster whose bit is set in ``cta_mask``
    (16-bit; bit i = %cluster_ctarank i), completing on the mbarrier at offset ``bar`` in each
    of them.
    """


# --- multicast loads with an L2 cache policy -----------------------------------------------
@ptx_asm(
    "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster.L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}}], [{bar}], {cta_mask}, {policy};"
)
def tma_load_multicast_1d_cache_hint(dst: u32, tmap: u64, c0: s32, bar: u32, cta_mask: u16, policy: u64):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_multicast_1d`` with the 64-bit L2
    cache policy ``policy``.
    """


@ptx_asm(
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster.L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}}], [{bar}], {cta_mask}, {policy};"
)
def tma_load_multicast_2d_cache_hint(
    dst: u32, tmap: u64, c0: s32, c1: s32, bar: u32, cta_mask: u16, policy: u64
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_multicast_2d`` with the 64-bit L2
    cache policy ``policy``.
    """


@ptx_asm(
    "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster.L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}}], [{bar}], {cta_mask}, {policy};"
)
def tma_load_multicast_3d_cache_hint(
    dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, bar: u32, cta_mask: u16, policy: u64
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_multicast_3d`` with the 64-bit L2
    cache policy ``policy``.
    """


@ptx_asm(
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster.L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{bar}], {cta_mask}, {policy};"
)
def tma_load_multicast_4d_cache_hint(
    dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, bar: u32, cta_mask: u16, policy: u64
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_multicast_4d`` with the 64-bit L2
    cache policy ``policy``.
    """


@ptx_asm(
    "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    ".multicast::cluster.L2::cache_hint"
    " [{dst}], [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{bar}], {cta_mask}, {policy};"
)
def tma_load_multicast_5d_cache_hint(
    dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32, bar: u32, cta_mask: u16, policy: u64
):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: ``tma_load_multicast_5d`` with the 64-bit L2
    cache policy ``policy``.
    """


# --- stores: shared::cta -> global, a bulk async-group operation ---------------------------
@ptx_asm(
    "cp.async.bulk.tensor.1d.global.shared::cta.tile.bulk_group"
    " [{tmap}, {{c0}}], [{src}];"
)
def tma_store_1d(tmap: u64, src: u32, c0: s32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: store the 1D box at c0 from shared memory
    ``src`` to global memory (out-of-bounds elements are not written); a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}}], [{src}];"
)
def tma_store_2d(tmap: u64, src: u32, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: store the 2D box at (c0, c1) from shared
    memory ``src`` to global memory (out-of-bounds elements are not written); a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}}], [{src}];"
)
def tma_store_3d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: store the 3D box at (c0, c1, c2) from shared
    memory ``src`` to global memory (out-of-bounds elements are not written); a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{src}];"
)
def tma_store_4d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: store the 4D box at (c0, c1, c2, c3) from
    shared memory ``src`` to global memory (out-of-bounds elements are not written); a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{src}];"
)
def tma_store_5d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor: store the 5D box at (c0, c1, c2, c3, c4) from
    shared memory ``src`` to global memory (out-of-bounds elements are not written); a bulk
    async-group operation.
    """


# --- bulk async-groups: completion of stores and reductions ------------------------------
@ptx_asm("cp.async.bulk.commit_group;")
def bulk_commit_group():
    """PTX ISA 9.7.9.25.6.1 cp.async.bulk.commit_group: close the current bulk async-group
    (TMA stores/reductions, bulk_copy_s2g issued by this thread).
    """


@ptx_asm("cp.async.bulk.wait_group {n};")
def bulk_wait_group(n: Const(in_range(0, 63))):
    """PTX ISA 9.7.9.25.6.2 cp.async.bulk.wait_group: wait until at most ``n`` (a constant) of
    this thread's bulk async-groups are pending (their global writes done).
    """


@ptx_asm("cp.async.bulk.wait_group.read {n};")
def bulk_wait_group_read(n: Const(in_range(0, 63))):
    """PTX ISA 9.7.9.25.6.2 cp.async.bulk.wait_group: wait until at most ``n`` (a constant)
    bulk async-groups still read their shared-memory source (the source may then be reused).
    """


# --- L2 cache policies for the _cache_hint variants ---------------------------------------
_L2_PRIORITY = Choice("evict_first", "evict_last", "evict_normal", "evict_unchanged")


@ptx_asm("createpolicy.fractional.L2::{priority}.b64 {out}, 1.0;", pure=True)
def createpolicy_fractional(priority: _L2_PRIORITY) -> b64:
    """PTX ISA 9.7.9.18 createpolicy: a 64-bit L2 cache policy applying ``priority``
    ('evict_first', 'evict_last', 'evict_normal', 'evict_unchanged') to all accesses, for the
    _cache_hint TMA variants.
    """
