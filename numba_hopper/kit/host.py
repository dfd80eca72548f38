"""Host side of a kit kernel: tensor maps passed by value, the persistent grid, and launch
with clusters and more than 48 KB of shared memory.

**Tensor maps by value.** A kernel parameter of numba type
:data:`~numba_hopper.runtime.tensormap.TENSORMAP_ARG` receives a 128-byte ``CUtensorMap`` by
value (CUDA C++'s ``const __grid_constant__ CUtensorMap``): no device copy, no proxy fence,
and a new address per call costs one host store. In the kernel,
``nh.tensormap_param_address(tmap)`` is what the TMA intrinsics take::

    a_map = tensor_map_arg(a, box=A.box, swizzle=A.swizzle, dtype="bf16")  # any rank 1-5
    launch(kernel, grid, block, (a_map, ...), shared_mem=plan.size)
    # kernel: tmap = nh.tensormap_param_address(a_map); nh.tma_load_2d(dst, tmap, k0, m0, full)
    # signature for inspect_kernel: TENSORMAP_ARG in the argument types

:func:`operand_tensor_map` derives the box and swizzle from an
:class:`~numba_hopper.kit.layouts.OperandLayout` (leading dimensions get box extent 1: a 3-D
``(batch, rows, cols)`` array is loaded with ``tma_load_3d(dst, tmap, c0, row, batch, bar)``,
coordinates innermost first). Every driver constraint (16-byte aligned base and strides, box
<= 256 per dimension, the inner box within the swizzle span, ...) is checked before encoding
and raises ``ValueError`` naming it (``numba_hopper.runtime.tensormap.validate_tiled``).
``TensorMapArg.value`` is the global address: set it to point the same layout at new data.

**Launch.** :func:`~numba_hopper.runtime.launch.launch` (re-exported here) launches with a
cluster (``cluster=2`` or ``(2, 1)``; ``grid`` counts CTAs) and opts the kernel into more than
48 KB of dynamic shared memory (numba does not): ``shared_mem=plan.size``. It checks the
configuration against the device first. A kernel that takes a ``TensorMapArg`` must be
launched through it (numba's ``kernel[grid, block]`` does not pass by-value parameters).

**Persistent grid.** :func:`persistent_grid` is one CTA per SM (rounded down to whole
clusters), or fewer when there are fewer tiles.
"""

from __future__ import annotations

from ..runtime.arrays import device_view
from ..runtime.launch import device_limits, launch, prepare_launch
from ..runtime.tensormap import TENSORMAP_ARG, TensorMapArg, encode_template
from .layouts import OperandLayout, tma_box

__all__ = ["tensor_map_arg", "operand_tensor_map", "persistent_grid", "launch", "prepare_launch", "TENSORMAP_ARG",
           "TensorMapArg"]


def tensor_map_arg(array, box, *, swizzle=0, dtype=None, oob_fill="zero", l2_promotion=0) -> TensorMapArg:
    """A by-value tensor map of ``array`` (numba, CuPy or PyTorch, rank 1-5) with ``box``
    (numpy order) and ``swizzle`` bytes; ``dtype`` re-reads the elements (``"bf16"`` over a
    uint16 array). Raises ``ValueError`` naming a broken TMA constraint."""
    template = encode_template(array, box, swizzle=swizzle, oob_fill=oob_fill, l2_promotion=l2_promotion, dtype=dtype)
    return TensorMapArg(template, template.params.address)


def operand_tensor_map(array, layout: OperandLayout, *, dtype=None, parts=1) -> TensorMapArg:
    """:func:`tensor_map_arg` of a wgmma operand stored as ``layout`` says: the box
    ``layout.box`` (outer dimensions 1) and ``layout.swizzle``. The array's innermost
    dimension is the layout's contiguous one (K for a K-major layout, M or N for MN-major);
    its elements are read as ``layout.dtype`` unless ``dtype`` says otherwise. ``parts``: the
    CTAs that share each tile by multicast (``make_tile_loads(layout, parts)``; the box is
    ``tma_box(layout, parts)``: a K-major tile's part is ``mn / parts`` rows)."""
    view = device_view(array, dtype or {"s8": "i8"}.get(layout.dtype, layout.dtype))  # (raises on a size mismatch)
    if view.ndim < 2:
        raise ValueError(f"an operand tensor map needs a 2-D or higher array; got shape {view.shape}")
    box = (1,) * (view.ndim - 2) + tma_box(layout, parts)
    return tensor_map_arg(view, box, swizzle=layout.swizzle)


def persistent_grid(num_tiles, cluster_size=1, device=0) -> int:
    """CTAs for a persistent launch: the device's SM count rounded down to whole clusters,
    at most ``num_tiles`` rounded up to whole clusters (at least one cluster)."""
    if num_tiles < 0 or cluster_size < 1:
        raise ValueError(f"num_tiles >= 0 and cluster_size >= 1 required; got {num_tiles}, {cluster_size}")
    sms = device_limits(device).sm_count // cluster_size * cluster_size
    wanted = -(-num_tiles // cluster_size) * cluster_size
    return max(cluster_size, min(sms, wanted))
