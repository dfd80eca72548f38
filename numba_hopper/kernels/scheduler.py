"""Static persistent tile schedulers (device functions, also callable on the host).

A persistent CTA walks linear tile ids ``blockIdx.x, blockIdx.x + gridDim.x, ...``; these
functions map a linear id to output-tile coordinates. Producer and consumers call the same
function on the same ids, so they agree on every tile without communicating.
"""

from numba import cuda

__all__ = ["grouped_tile"]


def _grouped_tile(tile, tiles_m, tiles_n, group_m):
    """Tile ``(pm, pn)`` of linear id ``tile`` in grouped (L2-friendly) order.

    Ids run down ``group_m`` tile-rows before moving one tile-column right, so a wave of
    CTAs reads ``group_m`` row panels of A and a few column panels of B instead of one row
    panel and every column panel (Triton's "grouped ordering").
    """
    per_group = group_m * tiles_n
    group = tile // per_group
    first_m = group * group_m
    size_m = min(tiles_m - first_m, group_m)
    local = tile - group * per_group
    return first_m + local % size_m, local // size_m


# Host code and tests call ``grouped_tile.py_func``.
grouped_tile = cuda.jit(device=True, forceinline=True)(_grouped_tile)
