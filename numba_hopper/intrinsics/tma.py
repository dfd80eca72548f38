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
"""

from ._ptx import Choice, Const, in_range, ptx_intrinsic

__all__ = [
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

_SEC_TENSOR = "PTX ISA 9.7.9.25.5.2 cp.async.bulk.tensor"
_SEC_REDUCE = "PTX ISA 9.7.9.25.5.3 cp.reduce.async.bulk.tensor"
_SEC_PREFETCH_TENSOR = "PTX ISA 9.7.9.25.5.4 cp.async.bulk.prefetch.tensor"
_SEC_BULK = "PTX ISA 9.7.9.25.4.1 cp.async.bulk"

REDUCE_OPS = ("add", "min", "max")


def _coords(n):
    names = [f"c{i}" for i in range(n)]
    return names, "{" + ", ".join("{%s}" % c for c in names) + "}"


def _export(fn, name):
    globals()[name] = fn
    __all__.append(name)


for _n in range(1, 6):
    _names, _tuple = _coords(_n)
    _cs = {c: "s32" for c in _names}
    _load = f"cp.async.bulk.tensor.{_n}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
    _operands = "[{dst}], [{tmap}, " + _tuple + "], [{bar}]"
    _export(
        ptx_intrinsic(
            f"tma_load_{_n}d",
            f"{_load} {_operands};",
            doc=f"{_SEC_TENSOR}: load one {_n}D box (coordinates innermost first) into shared memory; "
            "completes on mbarrier `bar` with the box's byte count.",
            dst="u32", tmap="u64", **_cs, bar="u32",
        ),
        f"tma_load_{_n}d",
    )
    _export(
        ptx_intrinsic(
            f"tma_load_{_n}d_cache_hint",
            f"{_load}.L2::cache_hint {_operands}, {{policy}};",
            doc=f"{_SEC_TENSOR}: tma_load_{_n}d with a 64-bit L2 cache policy (createpolicy).",
            dst="u32", tmap="u64", **_cs, bar="u32", policy="u64",
        ),
        f"tma_load_{_n}d_cache_hint",
    )
    _export(
        ptx_intrinsic(
            f"tma_load_multicast_{_n}d",
            f"{_load}.multicast::cluster {_operands}, {{cta_mask}};",
            doc=f"{_SEC_TENSOR}: load one {_n}D box into shared memory offset `dst` of every CTA of the "
            "cluster whose bit is set in `cta_mask` (16-bit; bit i = %cluster_ctarank i), completing "
            "on the mbarrier at offset `bar` in each of them.",
            dst="u32", tmap="u64", **_cs, bar="u32", cta_mask="u16",
        ),
        f"tma_load_multicast_{_n}d",
    )
    _export(
        ptx_intrinsic(
            f"tma_load_multicast_{_n}d_cache_hint",
            f"{_load}.multicast::cluster.L2::cache_hint {_operands}, {{cta_mask}}, {{policy}};",
            doc=f"{_SEC_TENSOR}: tma_load_multicast_{_n}d with a 64-bit L2 cache policy.",
            dst="u32", tmap="u64", **_cs, bar="u32", cta_mask="u16", policy="u64",
        ),
        f"tma_load_multicast_{_n}d_cache_hint",
    )
    _export(
        ptx_intrinsic(
            f"tma_store_{_n}d",
            f"cp.async.bulk.tensor.{_n}d.global.shared::cta.tile.bulk_group [{{tmap}}, {_tuple}], [{{src}}];",
            doc=f"{_SEC_TENSOR}: store one {_n}D box from shared memory `src` to global memory "
            "(out-of-bounds elements are not written); a bulk async-group operation.",
            tmap="u64", src="u32", **_cs,
        ),
        f"tma_store_{_n}d",
    )
    for _op in REDUCE_OPS:
        _export(
            ptx_intrinsic(
                f"tma_reduce_{_op}_{_n}d",
                f"cp.reduce.async.bulk.tensor.{_n}d.global.shared::cta.{_op}.tile.bulk_group "
                f"[{{tmap}}, {_tuple}], [{{src}}];",
                doc=f"{_SEC_REDUCE}: global[box] = {_op}(global[box], shared `src`), element type from "
                "the tensor map; a bulk async-group operation.",
                tmap="u64", src="u32", **_cs,
            ),
            f"tma_reduce_{_op}_{_n}d",
        )
    _export(
        ptx_intrinsic(
            f"tma_prefetch_{_n}d",
            f"cp.async.bulk.prefetch.tensor.{_n}d.L2.global.tile [{{tmap}}, {_tuple}];",
            doc=f"{_SEC_PREFETCH_TENSOR}: prefetch one {_n}D box into L2.",
            tmap="u64", **_cs,
        ),
        f"tma_prefetch_{_n}d",
    )

bulk_commit_group = ptx_intrinsic(
    "bulk_commit_group",
    "cp.async.bulk.commit_group;",
    doc="PTX ISA 9.7.9.25.6.1 cp.async.bulk.commit_group: close the current bulk async-group "
    "(TMA stores/reductions, bulk_copy_s2g issued by this thread).",
)

bulk_wait_group = ptx_intrinsic(
    "bulk_wait_group",
    "cp.async.bulk.wait_group {n};",
    doc="PTX ISA 9.7.9.25.6.2 cp.async.bulk.wait_group: wait until at most `n` (a constant) of "
    "this thread's bulk async-groups are pending (their global writes done).",
    n=Const(in_range(0, 63)),
)

bulk_wait_group_read = ptx_intrinsic(
    "bulk_wait_group_read",
    "cp.async.bulk.wait_group.read {n};",
    doc="PTX ISA 9.7.9.25.6.2 cp.async.bulk.wait_group: wait until at most `n` (a constant) "
    "bulk async-groups still read their shared-memory source (the source may then be reused).",
    n=Const(in_range(0, 63)),
)

bulk_copy_g2s = ptx_intrinsic(
    "bulk_copy_g2s",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{dst}], [{src}], {nbytes}, [{bar}];",
    doc=f"{_SEC_BULK}: copy `nbytes` (a multiple of 16) from global address `src` (u64, 16-byte "
    "aligned) to shared address `dst` (16-byte aligned); completes on mbarrier `bar`.",
    dst="u32", src="u64", nbytes="u32", bar="u32",
)

bulk_copy_g2s_multicast = ptx_intrinsic(
    "bulk_copy_g2s_multicast",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
    "[{dst}], [{src}], {nbytes}, [{bar}], {cta_mask};",
    doc=f"{_SEC_BULK}: bulk_copy_g2s into every CTA of the cluster set in the 16-bit `cta_mask`.",
    dst="u32", src="u64", nbytes="u32", bar="u32", cta_mask="u16",
)

bulk_copy_s2g = ptx_intrinsic(
    "bulk_copy_s2g",
    "cp.async.bulk.global.shared::cta.bulk_group [{dst}], [{src}], {nbytes};",
    doc=f"{_SEC_BULK}: copy `nbytes` (a multiple of 16) from shared address `src` to global "
    "address `dst` (u64); a bulk async-group operation.",
    dst="u64", src="u32", nbytes="u32",
)

prefetch_tensormap = ptx_intrinsic(
    "prefetch_tensormap",
    "prefetch.tensormap [{tmap}];",
    doc="PTX ISA 9.7.9.15 prefetch: bring the tensor map at generic address `tmap` into the "
    "descriptor cache.",
    tmap="u64",
)

fence_proxy_tensormap_acquire = ptx_intrinsic(
    "fence_proxy_tensormap_acquire",
    "fence.proxy.tensormap::generic.acquire.gpu [{tmap}], 128;",
    doc="PTX ISA 9.7.13.4 membar/fence (fence.proxy.tensormap::generic): order this thread's "
    "later TMA uses of the 128-byte tensor map at `tmap` after its writes through the generic "
    "proxy (host copies included); run once per issuing thread before first use.",
    tmap="u64",
)

tensormap_replace_global_address = ptx_intrinsic(
    "tensormap_replace_global_address",
    "tensormap.replace.tile.global_address.shared::cta.b1024.b64 [{tmap}], {address};",
    doc="PTX ISA 9.7.9.28 tensormap.replace: set the global address of the 128-byte tensor map "
    "at shared address `tmap` (128-byte aligned) to `address` (16-byte aligned). A weak "
    "generic-proxy write: publish the map with tensormap_cp_fenceproxy before TMA uses it.",
    tmap="u32", address="u64",
)

tensormap_cp_fenceproxy = ptx_intrinsic(
    "tensormap_cp_fenceproxy",
    "{ .reg .u64 g; cvta.to.global.u64 g, {dst}; "
    "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [g], [{src}], 128; }",
    doc="PTX ISA 9.7.13.16 tensormap.cp_fenceproxy: copy the 128-byte tensor map at shared "
    "address `src` to global address `dst` (both 128-byte aligned) and release it to the "
    "tensormap proxy. Warp-collective (.sync.aligned): every lane of the warp runs it with the "
    "same operands. A thread then runs fence_proxy_tensormap_acquire(dst) before its first "
    "TMA with the map.",
    dst="u64", src="u32",
)

createpolicy_fractional = ptx_intrinsic(
    "createpolicy_fractional",
    "createpolicy.fractional.L2::{priority}.b64 {out}, 1.0;",
    result="b64",
    pure=True,
    doc="PTX ISA 9.7.9.18 createpolicy: a 64-bit L2 cache policy applying `priority` "
    "('evict_first', 'evict_last', 'evict_normal', 'evict_unchanged') to all accesses, for the "
    "_cache_hint TMA variants.",
    priority=Choice("evict_first", "evict_last", "evict_normal", "evict_unchanged"),
)

del _n, _names, _tuple, _cs, _load, _operands, _op
