"""An embedding's weight gradient: the looked-up rows' float32 gradients added into a 16-bit
table, one CTA per distinct id and column span, after a sort of the lookups by id.

- ``sort_lookups_kernel(slots)``: ``sort_lookups(ids, rows, position_bits, sorted_ids, order)``,
  the lookups' ids sorted stably in one CTA, one launch (its docstring).
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

__all__ = ["THREADS", "COLUMNS", "LOOKUPS", "SORT_THREADS", "SORT_CAPACITY", "column_spans", "sort_slots",
           "sort_lookups_kernel", "add_rows_kernel"]

THREADS = 128
COLUMNS = 4  # columns a thread sums, THREADS apart
LOOKUPS = 4  # rows of one id a thread loads at once
_SPAN = THREADS * COLUMNS
_ZERO = np.float32(0)


SORT_THREADS = 1024
SORT_CAPACITY = 8192  # keys a CTA sorts: 32 KB of shared memory
_PAD = np.uint32(0xFFFFFFFF)
_ALL_LANES = 0xFFFFFFFF


def sort_slots(n: int) -> int:
    """Keys each of ``sort_lookups_kernel``'s threads holds for ``n`` lookups: the smallest power
    of two that covers them (at most ``SORT_CAPACITY / SORT_THREADS``)."""
    slots = 1
    while SORT_THREADS * slots < n:
        slots *= 2
    return slots


@cuda.jit(device=True, forceinline=True)
def _kept(key, other, smaller):
    """What a compare-exchange leaves at a key: the smaller of it and its partner, or the larger."""
    return min(key, other) if smaller else max(key, other)


@functools.lru_cache(maxsize=None)
def sort_lookups_kernel(slots: int):
    """``sort_lookups(ids, rows, position_bits, sorted_ids, order)``, one CTA of ``SORT_THREADS``
    that sorts ``SORT_THREADS * slots`` keys (:func:`sort_slots`)."""
    SIZE = SORT_THREADS * slots
    SHARED_KEYS = SIZE + SIZE // 32  # (padded: ``padded``)
    WARP_KEYS = 32 * slots  # a warp's keys

    def in_registers(span):
        """The compare-exchanges of keys ``span`` apart among a thread's own: a constant, so its
        keys stay in registers (none where ``span`` >= ``slots``: warps exchange those)."""

        @cuda.jit(device=True, forceinline=True)
        def exchange(held, first, k):
            for r in range(slots if span < slots else 0):
                if (r & span) == 0:
                    ascending = ((first | r) & k) == 0
                    low, high = min(held[r], held[r + span]), max(held[r], held[r + span])
                    held[r], held[r + span] = (low, high) if ascending else (high, low)

        return exchange

    exchange_4, exchange_2, exchange_1 = (in_registers(span) for span in (4, 2, 1))

    @cuda.jit(device=True, forceinline=True)
    def padded(i):
        """Shared-memory index of key ``i``: a word of padding every 32 keys, so a warp's
        accesses to ``slots``-apart keys fall in distinct banks."""
        return i + (i >> 5)

    @cuda.jit
    def sort_lookups(ids, rows, position_bits, sorted_ids, order):
        """Each lookup's key ``id << position_bits | position`` (an id outside ``[0, rows)`` as
        ``rows``, which ``add_rows`` skips) is unique, so a bitonic sort of the keys (padded with
        the largest) is stable; ``sorted_ids`` (int32) and ``order`` (int64) get their ids and
        positions. One launch, where ``torch.sort`` and the ids' conversion took several launches
        and allocations, 0.2 ms of a compiled step's host time for a few thousand ids. Thread
        ``t`` holds keys ``slots * t`` to ``slots * t + slots - 1`` in registers: it exchanges
        keys with itself in registers, with its warp by shuffles, and with other warps through
        shared memory."""
        keys = cuda.shared.array(SHARED_KEYS, np.uint32)
        held = cuda.local.array(slots, np.uint32)
        t = cuda.threadIdx.x
        first = t * slots
        n = ids.shape[0]
        for r in range(slots):
            i = first + r
            key = _PAD
            if i < n:
                row = ids[i]
                if row < 0 or row >= rows:
                    row = rows
                key = np.uint32((row << position_bits) | i)
            held[r] = key
        k = 2
        while k <= SIZE:  # runs of k sorted, alternately ascending and descending, then merged
            j = k >> 1
            while j > 0:
                # Past a thread's own keys, whether each of them keeps the smaller (it is the lower
                # of its pair in an ascending run, or the higher in a descending one) is the
                # thread's: key i's bits of j and k are those of ``first``.
                smaller = ((first & j) == 0) == ((first & k) == 0)
                if j >= WARP_KEYS:
                    for r in range(slots):
                        keys[padded(first + r)] = held[r]
                    cuda.syncthreads()
                    for r in range(slots):
                        held[r] = _kept(held[r], keys[padded((first + r) ^ j)], smaller)
                    cuda.syncthreads()  # (read before the next step's writes)
                elif j >= slots:
                    lanes = j // slots
                    for r in range(slots):
                        other = np.uint32(cuda.shfl_xor_sync(_ALL_LANES, np.int32(held[r]), lanes))  # (32-bit ints)
                        held[r] = _kept(held[r], other, smaller)
                elif j == 4:
                    exchange_4(held, first, k)
                elif j == 2:
                    exchange_2(held, first, k)
                else:
                    exchange_1(held, first, k)
                j >>= 1
            k <<= 1
        position_mask = np.uint32((1 << position_bits) - 1)
        for r in range(slots):
            i = first + r
            if i < n:
                sorted_ids[i] = np.int32(held[r] >> np.uint32(position_bits))
                order[i] = np.int64(held[r] & position_mask)

    return sort_lookups


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
