"""An embedding's weight gradient: the looked-up rows' float32 gradients added into a 16-bit
table, one CTA per distinct id and column span, after a sort of the lookups by id.

- ``sort_lookups(ids, rows, position_bits, size, sorted_ids, order)``: the lookups' ids sorted
  stably in one CTA, one launch (its docstring).
- ``add_rows_kernel(dtype)``: ``add_rows(out, rows, width, sorted_ids, order, values)``: for each
  distinct id ``i`` of ``sorted_ids`` in ``[0, rows)``,
  ``out[i] = round(out[i] + sum(values[order[j]] for j where sorted_ids[j] == i))``, the sum in
  float32 over ``j`` ascending; ids outside ``[0, rows)`` add nothing.

``out`` is the global address (``int``) of a row-major (``rows``, ``width``) 16-bit table;
``sorted_ids`` (int32) are the lookups' ids sorted stably and ``order`` (int64) their positions,
so a repeated id sums its rows in the order of the lookups, whatever the run; ``values`` is the
(lookups, ``width``) float32 gradient. Grid: (lookups, ``column_spans(width)``) CTAs of
``THREADS``. The CTA at a sorted id's first position sums its segment; the others return at
once. Each thread sums ``COLUMNS`` columns, ``THREADS`` apart, of ``LOOKUPS`` of the id's rows
at a time, all their loads in flight together, and adds them in the lookups' order: an id
looked up ``k`` times (a frequent token: hundreds of times in a batch of text) costs its CTAs
``k / LOOKUPS`` dependent loads. Each touched element of ``out`` is read and rounded once.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["THREADS", "COLUMNS", "LOOKUPS", "SORT_THREADS", "SORT_CAPACITY", "column_spans", "sort_lookups",
           "add_rows_kernel"]

THREADS = 128
COLUMNS = 4  # columns a thread sums, THREADS apart
LOOKUPS = 4  # rows of one id a thread loads at once
_SPAN = THREADS * COLUMNS
_ZERO = np.float32(0)


SORT_THREADS = 1024
SORT_CAPACITY = 8192  # keys a CTA sorts: 32 KB of shared memory
_PAD = np.uint32(0xFFFFFFFF)


@cuda.jit
def sort_lookups(ids, rows, position_bits, size, sorted_ids, order):
    """One CTA of ``SORT_THREADS``: each lookup's key ``id << position_bits | position`` (an id
    outside ``[0, rows)`` as ``rows``, which ``add_rows`` skips) is unique, so a bitonic sort of
    the keys in shared memory (``size``, a power of two of at most ``SORT_CAPACITY``, padded with
    the largest key) is stable; ``sorted_ids`` (int32) and ``order`` (int64) get their ids and
    positions. One launch, where ``torch.sort`` and the ids' conversion took several launches and
    allocations, 0.2 ms of a compiled step's host time for a few thousand ids. Keys of more than
    32 bits, or more than ``SORT_CAPACITY`` lookups, take ``torch.sort`` (``torch._embedding_grad``)."""
    keys = cuda.shared.array(SORT_CAPACITY, np.uint32)
    t = cuda.threadIdx.x
    n = ids.shape[0]
    for i in range(t, size, SORT_THREADS):
        key = _PAD
        if i < n:
            row = ids[i]
            if row < 0 or row >= rows:
                row = rows
            key = np.uint32((row << position_bits) | i)
        keys[i] = key
    cuda.syncthreads()
    k = 2
    while k <= size:  # bitonic: runs of k sorted, alternately ascending and descending, then merged
        j = k >> 1
        while j > 0:
            for i in range(t, size, SORT_THREADS):
                partner = i ^ j
                if partner > i:
                    a, b = keys[i], keys[partner]
                    if ((i & k) == 0) == (a > b):
                        keys[i], keys[partner] = b, a
            cuda.syncthreads()
            j >>= 1
        k <<= 1
    position_mask = np.uint32((1 << position_bits) - 1)
    for i in range(t, n, SORT_THREADS):
        key = keys[i]
        sorted_ids[i] = np.int32(key >> np.uint32(position_bits))
        order[i] = np.int64(key & position_mask)


def column_spans(width: int) -> int:
    """The CTAs that share one id's row of ``width`` columns."""
    return -(-width // _SPAN)


@functools.lru_cache(maxsize=None)
def add_rows_kernel(dtype: str):
    """The kernel for a ``dtype`` ("bf16" or "f16") table (module doc)."""
    to_f32, to_16 = (nh.bf16_to_f32, nh.f32_to_bf16) if dtype == "bf16" else (nh.f16_to_f32, nh.f32_to_f16)

    @cuda.jit
    def add_rows(out, rows, width, sorted_ids, order, values):
        s = cuda.blockIdx.x
        row = sorted_ids[s]
        if row < 0 or row >= rows or (s > 0 and sorted_ids[s - 1] == row):
            return
        first = cuda.blockIdx.y * _SPAN + cuda.threadIdx.x
        n = sorted_ids.shape[0]
        acc = cuda.local.array(COLUMNS, np.float32)
        rows_in = cuda.local.array((LOOKUPS, COLUMNS), np.float32)
        lookup = cuda.local.array(LOOKUPS, np.int64)
        for k in range(COLUMNS):
            acc[k] = _ZERO
        j, more = s, True
        while more:  # LOOKUPS of the id's rows loaded together, added in order
            for u in range(LOOKUPS):
                lookup[u] = order[j + u] if j + u < n and sorted_ids[j + u] == row else -1
            for u in range(LOOKUPS):
                for k in range(COLUMNS):
                    c = first + k * THREADS
                    rows_in[u, k] = values[lookup[u], c] if lookup[u] >= 0 and c < width else _ZERO
            for u in range(LOOKUPS):
                for k in range(COLUMNS):
                    if lookup[u] >= 0:
                        acc[k] += rows_in[u, k]
            more = lookup[LOOKUPS - 1] >= 0
            j += LOOKUPS
        base = np.uint64(out + row * width * 2)
        for k in range(COLUMNS):
            c = first + k * THREADS
            if c < width:
                address = base + np.uint64(2 * c)
                nh.st_global_u16(address, to_16(to_f32(nh.ld_global_u16(address)) + acc[k]))

    return add_rows
