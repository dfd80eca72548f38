"""Static persistent tile schedulers (device functions, also callable on the host).

A persistent CTA walks work items: whole tiles ``cta, cta + ctas, ...`` (data-parallel),
then, with stream-K, pieces of the K loops of the last tiles. These functions give a
CTA's items (a tile and a k-block range each) one after another, and map a linear tile id
to output-tile coordinates. Producer and consumers call the same functions on the same ids, so they agree
on every item without communicating.
"""

import functools
import operator

from numba import cuda

from .. import intrinsics as nh

__all__ = ["grouped_tile", "host_grouped_tile", "device_work_walk", "host_work_walk"]


def _grouped(div):
    """``grouped_tile`` with integer division ``div``."""

    def grouped_tile(tile, tiles_m, tiles_n, group_m):
        """Tile ``(pm, pn)`` of linear id ``tile`` in grouped (L2-friendly) order.

        Ids run down ``group_m`` tile-rows before moving one tile-column right, so a wave of
        CTAs reads ``group_m`` row panels of A and a few column panels of B instead of one row
        panel and every column panel (Triton's "grouped ordering").
        """
        per_group = group_m * tiles_n
        group = div(tile, per_group)
        first_m = group * group_m
        size_m = min(tiles_m - first_m, group_m)
        local = tile - group * per_group
        pn = div(local, size_m)
        return first_m + local - pn * size_m, pn

    return grouped_tile


# The device version divides in 32 bits (a 64-bit division is a subroutine call, whose
# return address spilled in the fused cluster kernel); host code and tests use the other.
grouped_tile = cuda.jit(device=True, forceinline=True)(_grouped(nh.div_u32))
host_grouped_tile = _grouped(operator.floordiv)


def _work_walk(div, stream_k, wrap):
    """``(first_item, next_item)`` with integer division ``div``, each function passed
    through ``wrap`` (``cuda.jit`` for device functions) as it is made."""

    @wrap
    def stream_k_start(cta, ctas, sk_iters):
        """First stream-K k-iteration of CTA ``cta``: ``sk_iters`` split into ``ctas`` equal runs."""
        return div(sk_iters * cta, ctas)

    @wrap
    def stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks):
        sk_iters = (num_tiles - dp_tiles) * k_blocks
        if not stream_k or sk_iters == 0:
            return num_tiles, 0, 0
        start = stream_k_start(cta, ctas, sk_iters)
        end = stream_k_start(cta + 1, ctas, sk_iters)
        rel = div(start, k_blocks)
        k_begin = start - rel * k_blocks
        return dp_tiles + rel, k_begin, min(k_blocks, k_begin + end - start)

    @wrap
    def first_item(cta, ctas, dp_tiles, num_tiles, k_blocks):
        """``(tile, k_begin, k_end)``: the first work item of CTA ``cta`` of ``ctas``.

        Tiles below ``dp_tiles`` are data-parallel: CTA c takes tiles c, c + ctas, ... with
        all ``k_blocks``. With ``stream_k``, the k-iterations of the other tiles (stream-K's
        hybrid, Osama et al. 2023) are split into ``ctas`` equal contiguous runs, one per
        CTA, cut at tile boundaries into items: a run starts with the end of one tile's K
        loop, may cover whole tiles, and ends with the start of another's. ``tile >=
        num_tiles``: no item. The caller keeps every run non-empty (stream-K iterations >=
        ``ctas``) and below 2^32.
        """
        if cta < dp_tiles:
            return cta, 0, k_blocks
        return stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks)

    @wrap
    def next_item(item, cta, ctas, dp_tiles, num_tiles, k_blocks):
        """The work item after ``item`` (see ``first_item``)."""
        tile = item[0]
        if tile < dp_tiles:
            if tile + ctas < dp_tiles:
                return tile + ctas, 0, k_blocks
            return stream_k_first(cta, ctas, dp_tiles, num_tiles, k_blocks)
        first = (tile + 1 - dp_tiles) * k_blocks
        end = stream_k_start(cta + 1, ctas, (num_tiles - dp_tiles) * k_blocks)
        if not stream_k or first >= end:
            return num_tiles, 0, 0
        return tile + 1, 0, min(k_blocks, end - first)

    return first_item, next_item


@functools.lru_cache(maxsize=None)
def device_work_walk(stream_k):
    """``(first_item, next_item)`` as device functions (32-bit division).

    Without ``stream_k`` the walk is the data-parallel one, ``tile += ctas``, with no
    division at all.
    """
    return _work_walk(nh.div_u32, stream_k, cuda.jit(device=True, forceinline=True))


def host_work_walk():
    """The stream-K walk as plain Python functions (tests, host-side planning)."""
    return _work_walk(operator.floordiv, True, lambda f: f)
