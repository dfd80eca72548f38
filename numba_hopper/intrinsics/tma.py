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

Loads (``tma_load_Nd``) complete on the mbarrier; stores and reductions (``tma_store_Nd``,
``tma_reduce_{add,min,max}_Nd``) are bulk async-group operations: commit them with
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
    "tma_reduce_add_1d",
    "tma_reduce_add_2d",
    "tma_reduce_add_3d",
    "tma_reduce_add_4d",
    "tma_reduce_add_5d",
    "tma_reduce_min_1d",
    "tma_reduce_min_2d",
    "tma_reduce_min_3d",
    "tma_reduce_min_4d",
    "tma_reduce_min_5d",
    "tma_reduce_max_1d",
    "tma_reduce_max_2d",
    "tma_reduce_max_3d",
    "tma_reduce_max_4d",
    "tma_reduce_max_5d",
    "tma_prefetch_1d",
    "tma_prefetch_2d",
    "tma_prefetch_3d",
    "tma_prefetch_4d",
    "tma_prefetch_5d",
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "bulk_copy_g2s",
    "bulk_copy_g2s_multicast",
    "bulk_copy_s2g",
    "prefetch_tensormap",
    "fence_proxy_tensormap_acquire",
    "tensormap_replace_global_address",
    "tensormap_cp_fenceproxy",
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


# --- reductions into global memory: global[box] = add(global[box], shared) -----------------
@ptx_asm(
    "cp.reduce.async.bulk.tensor.1d.global.shared::cta.add.tile.bulk_group"
    " [{tmap}, {{c0}}], [{src}];"
)
def tma_reduce_add_1d(tmap: u64, src: u32, c0: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = add(global[box], shared
    ``src``) for the 1D box at c0, element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}}], [{src}];"
)
def tma_reduce_add_2d(tmap: u64, src: u32, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = add(global[box], shared
    ``src``) for the 2D box at (c0, c1), element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}}], [{src}];"
)
def tma_reduce_add_3d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = add(global[box], shared
    ``src``) for the 3D box at (c0, c1, c2), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{src}];"
)
def tma_reduce_add_4d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = add(global[box], shared
    ``src``) for the 4D box at (c0, c1, c2, c3), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{src}];"
)
def tma_reduce_add_5d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = add(global[box], shared
    ``src``) for the 5D box at (c0, c1, c2, c3, c4), element type from the tensor map; a bulk
    async-group operation.
    """


# --- reductions into global memory: global[box] = min(global[box], shared) -----------------
@ptx_asm(
    "cp.reduce.async.bulk.tensor.1d.global.shared::cta.min.tile.bulk_group"
    " [{tmap}, {{c0}}], [{src}];"
)
def tma_reduce_min_1d(tmap: u64, src: u32, c0: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = min(global[box], shared
    ``src``) for the 1D box at c0, element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.2d.global.shared::cta.min.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}}], [{src}];"
)
def tma_reduce_min_2d(tmap: u64, src: u32, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = min(global[box], shared
    ``src``) for the 2D box at (c0, c1), element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.3d.global.shared::cta.min.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}}], [{src}];"
)
def tma_reduce_min_3d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = min(global[box], shared
    ``src``) for the 3D box at (c0, c1, c2), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.4d.global.shared::cta.min.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{src}];"
)
def tma_reduce_min_4d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = min(global[box], shared
    ``src``) for the 4D box at (c0, c1, c2, c3), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.5d.global.shared::cta.min.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{src}];"
)
def tma_reduce_min_5d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = min(global[box], shared
    ``src``) for the 5D box at (c0, c1, c2, c3, c4), element type from the tensor map; a bulk
    async-group operation.
    """


# --- reductions into global memory: global[box] = max(global[box], shared) -----------------
@ptx_asm(
    "cp.reduce.async.bulk.tensor.1d.global.shared::cta.max.tile.bulk_group"
    " [{tmap}, {{c0}}], [{src}];"
)
def tma_reduce_max_1d(tmap: u64, src: u32, c0: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = max(global[box], shared
    ``src``) for the 1D box at c0, element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.2d.global.shared::cta.max.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}}], [{src}];"
)
def tma_reduce_max_2d(tmap: u64, src: u32, c0: s32, c1: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = max(global[box], shared
    ``src``) for the 2D box at (c0, c1), element type from the tensor map; a bulk async-group
    operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.3d.global.shared::cta.max.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}}], [{src}];"
)
def tma_reduce_max_3d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = max(global[box], shared
    ``src``) for the 3D box at (c0, c1, c2), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.4d.global.shared::cta.max.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}}], [{src}];"
)
def tma_reduce_max_4d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = max(global[box], shared
    ``src``) for the 4D box at (c0, c1, c2, c3), element type from the tensor map; a bulk
    async-group operation.
    """


@ptx_asm(
    "cp.reduce.async.bulk.tensor.5d.global.shared::cta.max.tile.bulk_group"
    " [{tmap}, {{c0}, {c1}, {c2}, {c3}, {c4}}], [{src}];"
)
def tma_reduce_max_5d(tmap: u64, src: u32, c0: s32, c1: s32, c2: s32, c3: s32, c4: s32):
    """PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor: global[box] = max(global[box], shared
    ``src``) for the 5D box at (c0, c1, c2, c3, c4), element type from the tensor map; a bulk
    async-group operation.
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


# --- non-tensor bulk copies ---------------------------------------------------------------
@ptx_asm(
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
    " [{dst}], [{src}], {nbytes}, [{bar}];"
)
def bulk_copy_g2s(dst: u32, src: u64, nbytes: u32, bar: u32):
    """PTX ISA 9.7.9.25.4.1 cp.async.bulk: copy ``nbytes`` (a multiple of 16) from global address
    ``src`` (u64, 16-byte aligned) to shared address ``dst`` (16-byte aligned); completes on the
    mbarrier ``bar``.
    """


@ptx_asm(
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
    " [{dst}], [{src}], {nbytes}, [{bar}], {cta_mask};"
)
def bulk_copy_g2s_multicast(dst: u32, src: u64, nbytes: u32, bar: u32, cta_mask: u16):
    """PTX ISA 9.7.9.25.4.1 cp.async.bulk: ``bulk_copy_g2s`` into every CTA of the cluster set in
    the 16-bit ``cta_mask``.
    """


@ptx_asm("cp.async.bulk.global.shared::cta.bulk_group [{dst}], [{src}], {nbytes};")
def bulk_copy_s2g(dst: u64, src: u32, nbytes: u32):
    """PTX ISA 9.7.9.25.4.1 cp.async.bulk: copy ``nbytes`` (a multiple of 16) from shared address
    ``src`` to global address ``dst`` (u64); a bulk async-group operation.
    """


# --- tensor maps: prefetch, proxy fences, updates on the device -----------------------------
@ptx_asm("prefetch.tensormap [{tmap}];")
def prefetch_tensormap(tmap: u64):
    """PTX ISA 9.7.9.15 prefetch: bring the tensor map at generic address ``tmap`` into the
    descriptor cache.
    """


@ptx_asm("fence.proxy.tensormap::generic.acquire.gpu [{tmap}], 128;")
def fence_proxy_tensormap_acquire(tmap: u64):
    """PTX ISA 9.7.13.4 membar/fence (fence.proxy.tensormap::generic): order this thread's later
    TMA uses of the 128-byte tensor map at ``tmap`` after its writes through the generic proxy
    (host copies included); run once per issuing thread before first use.
    """


@ptx_asm("tensormap.replace.tile.global_address.shared::cta.b1024.b64 [{tmap}], {address};")
def tensormap_replace_global_address(tmap: u32, address: u64):
    """PTX ISA 9.7.9.28 tensormap.replace: set the global address of the 128-byte tensor map at
    shared address ``tmap`` (128-byte aligned) to ``address`` (16-byte aligned). A weak
    generic-proxy write: publish the map with tensormap_cp_fenceproxy before TMA uses it.
    """


@ptx_asm(
    "{ .reg .u64 g; cvta.to.global.u64 g, {dst}; "
    "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned"
    " [g], [{src}], 128; }"
)
def tensormap_cp_fenceproxy(dst: u64, src: u32):
    """PTX ISA 9.7.13.16 tensormap.cp_fenceproxy: copy the 128-byte tensor map at shared address
    ``src`` to global address ``dst`` (both 128-byte aligned) and release it to the tensormap
    proxy. Warp-collective (.sync.aligned): every lane of the warp runs it with the same
    operands. A thread then runs fence_proxy_tensormap_acquire(dst) before its first TMA with
    the map.
    """


# --- L2 cache policies for the _cache_hint variants ---------------------------------------
_L2_PRIORITY = Choice("evict_first", "evict_last", "evict_normal", "evict_unchanged")


@ptx_asm("createpolicy.fractional.L2::{priority}.b64 {out}, 1.0;", pure=True)
def createpolicy_fractional(priority: _L2_PRIORITY) -> b64:
    """PTX ISA 9.7.9.18 createpolicy: a 64-bit L2 cache policy applying ``priority``
    ('evict_first', 'evict_last', 'evict_normal', 'evict_unchanged') to all accesses, for the
    _cache_hint TMA variants.
    """
