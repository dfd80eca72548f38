"""Tensor maps built on the device from host templates, so a new pointer costs the host nothing.

The host encodes one descriptor per operand layout (``numba_hopper.tensormap.encode_template``)
and passes its 16 words as kernel arguments, with the operand's address beside them. Each
CTA rewrites the address and publishes the result to its own 128-byte slot in global memory,
where TMA can read it (the PTX ISA allows tensor maps in param, const or global memory, and
numba-cuda has no 64-byte-aligned by-value parameters)::

    template --st.shared--> smem --tensormap.replace (address)--> smem
        --tensormap.cp_fenceproxy (warp, release)--> global slot
        --fence.proxy.tensormap::generic.acquire (each issuing thread)--> TMA

A slot belongs to one CTA of one launch; launches that may overlap in time need different
slot arrays (the host gives each stream its own, and a graph capture its own).
"""

from __future__ import annotations

from numba import cuda

from .. import intrinsics as nh

__all__ = ["TENSORMAP_BYTES", "publish_tensormap", "tensormap_slot"]

TENSORMAP_BYTES = 128  # .b1024; tensormap.replace and cp_fenceproxy want 128-byte alignment


@cuda.jit(device=True, forceinline=True)
def tensormap_slot(slots, maps, i):
    """Global address of this CTA's slot for map ``i`` of ``maps`` per CTA."""
    return slots + (cuda.blockIdx.x * maps + i) * TENSORMAP_BYTES


@cuda.jit(device=True, forceinline=True)
def publish_tensormap(words, address, scratch, slot):
    """(Whole warp) the template ``words`` with its global address set to ``address``, into
    ``slot``. ``scratch``: 128 free bytes of shared memory, 128-byte aligned.

    Threads that then issue TMA with ``slot`` run ``fence_proxy_tensormap_acquire(slot)``
    first, after a barrier with this warp if they are not in it.
    """
    if cuda.laneid == 0:
        for i in range(8):
            nh.st_shared_v2_u64(scratch + 16 * i, words[2 * i], words[2 * i + 1])
        nh.tensormap_replace_global_address(scratch, address)
    cuda.syncwarp()
    nh.tensormap_cp_fenceproxy(slot, scratch)
