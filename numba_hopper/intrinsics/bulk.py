"""Non-tensor bulk copies (PTX ``cp.async.bulk``) and the tensor-map operations TMA needs
on the device: the address of a by-value tensor map, descriptor prefetch, the tensormap
proxy fence, ``tensormap.replace`` and ``tensormap.cp_fenceproxy`` (to build tensor maps
on the device).
"""

from numba.cuda import types

from .._numba_internals import ByValueParam
from ._ptx import intrinsic, ptx_asm, u16, u32, u64

__all__ = [
    "bulk_copy_g2s",
    "bulk_copy_g2s_multicast",
    "bulk_copy_s2g",
    "tensormap_param_address",
    "prefetch_tensormap",
    "fence_proxy_tensormap_acquire",
    "tensormap_replace_global_address",
    "tensormap_cp_fenceproxy",
]


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
@intrinsic
def tensormap_param_address(typingctx, tmap):
    """u64 generic address of a tensor map the kernel takes by value (a ``TensorMapArg``
    argument, ``numba_hopper.runtime.tensormap``): what the TMA intrinsics take. NVVM emits
    ``mov.b64`` of the parameter and ``cvta.param.u64`` (PTX ISA 5.1.6.1, kernel parameters
    with the grid_constant attribute). The launch wrote the map, so no proxy fence is needed.
    """
    if not isinstance(tmap, ByValueParam):
        raise TypeError(f"tensormap_param_address: expected a by-value tensor map parameter, got {tmap}")
    return types.uint64(tmap), lambda context, builder, sig, args: args[0]


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
