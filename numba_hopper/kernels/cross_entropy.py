"""Cross-entropy over 16-bit logits, one CTA per row: the loss kernel and its gradient kernel.

A language model's logits are as wide as its vocabulary (32k to 150k columns), so PyTorch's
``cross_entropy(logits.float(), target)`` moves them several times in float32 (the upcast, the
log-softmax, its backward, the cast of the gradient). These kernels read the 16-bit logits once
for the loss and once more for the gradient, which they write in the logits' dtype, keeping
float32 only in registers.

- ``loss_kernel(dtype)``: ``loss(logits, width, target, ignore_index, lse, rows)``:
  per row the log-sum-exp of its logits (float32) and ``rows[r] = lse[r] - logits[r, target[r]]``
  (0 where ``target[r] == ignore_index``, NaN where the target is outside ``[0, width)``).
- ``grad_kernel(dtype)``: ``grad(logits, out, width, target, ignore_index, lse, d_rows)``:
  ``out[r, c] = d_rows[r] * (exp(logits[r, c] - lse[r]) - (c == target[r]))``, a zero row
  where the target is ``ignore_index``.

``logits`` and ``out`` are the global addresses of row-major (rows, ``width``) arrays
(``int``), 16-byte aligned (the caller's checks: a row is then aligned alike in both);
``target``, ``lse``, ``rows`` and ``d_rows`` are numba arrays. Both kernels are bound by memory
bandwidth: each thread moves 16 bytes (eight elements) a load or store, the vector loads of a
row starting at its first 16-byte-aligned element; the up to seven elements before it and
after the last whole vector go one at a time. The loss kernel keeps an online
(maximum, sum) pair a thread and rescales it once a vector, by the vector's maximum. The
exponentials are ``ex2.approx`` (relative error about 2^-22), the row's log ``math.log2``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["THREADS", "MAX_CLUSTER", "loss_kernel", "grad_kernel", "loss_grad_kernel", "loss_grad_cluster"]

THREADS = 512  # 16 warps a row: a 151,936-wide vocabulary is 37 vectors a thread
VEC = 8  # 16-bit elements in a 16-byte access
_WARPS = THREADS // 32
HELD = 8  # vectors a thread of the loss-and-gradient kernel holds in registers
_HELD_WORDS = 4 * HELD
MAX_CLUSTER = 8  # the portable cluster size: rows up to 8 * THREADS * HELD vectors wide
_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_NEG_INF = np.float32(-np.inf)
_ONE = np.float32(1)
_ZERO = np.float32(0)


@cuda.jit(device=True, inline="always")
def _row_span(address, r, width):
    """Row ``r``'s address, the elements before its first 16-byte-aligned one (at most
    ``width``), and how many whole vectors follow them."""
    base = address + r * width * 2
    head = min(((16 - (base & 15)) & 15) >> 1, width)
    return base, head, (width - head) // VEC


@cuda.jit(device=True, inline="always")
def _merge(m, s, m2, s2):
    """Two partial (max, sum of exp2(x - max)) pairs of log2-scaled values as one."""
    hi = max(m, m2)
    if hi == _NEG_INF:  # both empty: no exp2(-inf - -inf)
        return hi, s + s2
    return hi, s * nh.ex2_approx_ftz(m - hi) + s2 * nh.ex2_approx_ftz(m2 - hi)


@cuda.jit(device=True, inline="always")
def _prob(x, shift, scale, hit):
    """``scale * (exp(x - lse) - hit)`` with ``shift = lse * log2(e)``."""
    p = nh.ex2_approx_ftz(x * _LOG2E - shift)
    if hit:
        p -= _ONE
    return p * scale


def _element_conversions(dtype):
    """(16-bit bits to float32, packed pair to two float32, two float32 to a packed pair)."""
    if dtype == "bf16":
        return nh.bf16_to_f32, nh.unpack_bf16x2, nh.pack_bf16x2
    return nh.f16_to_f32, nh.unpack_f16x2, nh.pack_f16x2


@functools.lru_cache(maxsize=None)
def loss_kernel(dtype: str):
    """The loss kernel of ``dtype`` ("bf16" or "f16") logits (module doc); grid: one CTA of
    ``THREADS`` per row."""
    to_f32, unpack, _ = _element_conversions(dtype)

    @cuda.jit(device=True, inline="always")
    def load(address):
        return to_f32(nh.ld_global_nc_u16(np.uint64(address))) * _LOG2E

    @cuda.jit
    def loss(logits, width, target, ignore_index, lse, rows):
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        base, head, vectors = _row_span(logits, r, width)
        m, s = _NEG_INF, _ZERO
        if t < head:
            m, s = load(base + 2 * t), _ONE
        c = head + vectors * VEC + t  # the tail: fewer than VEC elements
        if c < width:
            m, s = _merge(m, s, load(base + 2 * c), _ONE)
        body = base + 2 * head
        for v in range(t, vectors, THREADS):
            w0, w1, w2, w3 = nh.ld_global_nc_v4_u32(np.uint64(body + 16 * v))
            x0, x1 = unpack(w0)
            x2, x3 = unpack(w1)
            x4, x5 = unpack(w2)
            x6, x7 = unpack(w3)
            top = max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7))) * _LOG2E
            if top > m:
                s *= nh.ex2_approx_ftz(m - top)  # (0 while m is -inf: s is 0 then)
                m = top
            if m != _NEG_INF:  # (every element so far -inf: nothing to add)
                s += ((nh.ex2_approx_ftz(x0 * _LOG2E - m) + nh.ex2_approx_ftz(x1 * _LOG2E - m))
                      + (nh.ex2_approx_ftz(x2 * _LOG2E - m) + nh.ex2_approx_ftz(x3 * _LOG2E - m))
                      + (nh.ex2_approx_ftz(x4 * _LOG2E - m) + nh.ex2_approx_ftz(x5 * _LOG2E - m))
                      + (nh.ex2_approx_ftz(x6 * _LOG2E - m) + nh.ex2_approx_ftz(x7 * _LOG2E - m)))
        for offset in (16, 8, 4, 2, 1):
            m, s = _merge(m, s, cuda.shfl_xor_sync(0xFFFFFFFF, m, offset),
                          cuda.shfl_xor_sync(0xFFFFFFFF, s, offset))
        part_m = cuda.shared.array(_WARPS, np.float32)
        part_s = cuda.shared.array(_WARPS, np.float32)
        if t % 32 == 0:
            part_m[t // 32] = m
            part_s[t // 32] = s
        cuda.syncthreads()
        if t == 0:
            m, s = part_m[0], part_s[0]
            for w in range(1, _WARPS):
                m, s = _merge(m, s, part_m[w], part_s[w])
            row_lse = (m + math.log2(s)) * _LN2
            lse[r] = row_lse
            label = target[r]
            if label == ignore_index:
                rows[r] = _ZERO
            elif label < 0 or label >= width:
                rows[r] = np.float32(np.nan)
            else:
                rows[r] = row_lse - to_f32(nh.ld_global_nc_u16(np.uint64(base + 2 * label)))

    return loss


@functools.lru_cache(maxsize=None)
def grad_kernel(dtype: str):
    """The gradient kernel of ``dtype`` ("bf16" or "f16") logits (module doc); grid: one CTA of
    ``THREADS`` per row."""
    to_f32, unpack, pack = _element_conversions(dtype)
    from_f32 = nh.f32_to_bf16 if dtype == "bf16" else nh.f32_to_f16

    @cuda.jit(device=True, inline="always")
    def one(base, out_base, c, label, shift, scale):
        x = to_f32(nh.ld_global_nc_u16(np.uint64(base + 2 * c)))
        nh.st_global_u16(np.uint64(out_base + 2 * c), from_f32(_prob(x, shift, scale, c == label)))

    @cuda.jit
    def grad(logits, out, width, target, ignore_index, lse, d_rows):
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        label = target[r]
        scale = _ZERO if label == ignore_index else d_rows[r]
        shift = lse[r] * _LOG2E
        base, head, vectors = _row_span(logits, r, width)
        out_base = out + r * width * 2
        if t < head:
            one(base, out_base, t, label, shift, scale)
        c = head + vectors * VEC + t
        if c < width:
            one(base, out_base, c, label, shift, scale)
        body, out_body = base + 2 * head, out_base + 2 * head
        for v in range(t, vectors, THREADS):
            w0, w1, w2, w3 = nh.ld_global_nc_v4_u32(np.uint64(body + 16 * v))
            k = label - head - v * VEC  # the label's place in this vector, if in [0, VEC)
            x0, x1 = unpack(w0)
            x2, x3 = unpack(w1)
            x4, x5 = unpack(w2)
            x6, x7 = unpack(w3)
            nh.st_global_v4_u32(np.uint64(out_body + 16 * v),
                                pack(_prob(x0, shift, scale, k == 0), _prob(x1, shift, scale, k == 1)),
                                pack(_prob(x2, shift, scale, k == 2), _prob(x3, shift, scale, k == 3)),
                                pack(_prob(x4, shift, scale, k == 4), _prob(x5, shift, scale, k == 5)),
                                pack(_prob(x6, shift, scale, k == 6), _prob(x7, shift, scale, k == 7)))

    return grad


def loss_grad_cluster(width: int) -> int:
    """The CTAs (one cluster) of :func:`loss_grad_kernel` that hold a row of ``width`` logits
    between them, or 0 for a row wider than ``MAX_CLUSTER`` of them hold."""
    vectors = -(-width // VEC)  # at least the row's whole vectors
    ctas = max(1, -(-vectors // (THREADS * HELD)))
    return ctas if ctas <= MAX_CLUSTER else 0


@functools.lru_cache(maxsize=None)
def loss_grad_kernel(dtype: str):
    """The loss and its gradient of ``dtype`` ("bf16" or "f16") logits in one pass, in place:
    ``loss_grad(logits, width, target, ignore_index, scale, lse, rows)`` writes ``lse`` and
    ``rows`` as the loss kernel does and overwrites each row of logits with
    ``scale[0] * (exp(logits - lse) - onehot(target))`` (a zero row where the target is
    ``ignore_index``). Grid: a cluster of :func:`loss_grad_cluster` CTAs of ``THREADS`` per row.

    Each thread holds ``HELD`` vectors of its CTA's part of the row in registers from the load
    to the store, so the logits are read from memory once (the two-kernel path reads them once
    for the loss and again for the gradient). The CTAs exchange their (maximum, sum) pairs
    through distributed shared memory. Loads are coherent (``ld.global``, not ``.nc``): the
    kernel writes what it read."""
    to_f32, unpack, pack = _element_conversions(dtype)
    from_f32 = nh.f32_to_bf16 if dtype == "bf16" else nh.f32_to_f16
    empty = np.uint32(0xFF80FF80 if dtype == "bf16" else 0xFC00FC00)  # two -inf: nothing to a row's sum

    @cuda.jit(device=True, inline="always")
    def load(address):
        return to_f32(nh.ld_global_u16(np.uint64(address)))

    @cuda.jit(device=True, inline="always")
    def vector_max(w0, w1, w2, w3):
        x0, x1 = unpack(w0)
        x2, x3 = unpack(w1)
        x4, x5 = unpack(w2)
        x6, x7 = unpack(w3)
        return max(max(max(x0, x1), max(x2, x3)), max(max(x4, x5), max(x6, x7)))

    @cuda.jit(device=True, inline="always")
    def pair_sum(w, m):
        """``exp2(x * log2(e) - m)`` summed over the packed pair ``w``."""
        x0, x1 = unpack(w)
        return nh.ex2_approx_ftz(x0 * _LOG2E - m) + nh.ex2_approx_ftz(x1 * _LOG2E - m)

    @cuda.jit(device=True, inline="always")
    def pair_grad(w, shift, scale, k):
        """The packed pair ``w``'s gradient; ``k``: the target's place in it, if 0 or 1."""
        x0, x1 = unpack(w)
        return pack(_prob(x0, shift, scale, k == 0), _prob(x1, shift, scale, k == 1))

    @cuda.jit
    def loss_grad(logits, width, target, ignore_index, scale, lse, rows):
        rank = nh.cluster_ctarank()
        ranks = nh.cluster_nctarank()
        r = cuda.blockIdx.x // ranks
        t = cuda.threadIdx.x
        base, head, vectors = _row_span(logits, r, width)
        body = base + 2 * head
        first = rank * (THREADS * HELD) + t  # this thread's first vector; then every THREADS-th
        held = cuda.local.array(_HELD_WORDS, np.uint32)
        top = _NEG_INF
        for j in range(HELD):
            v = first + j * THREADS
            w0 = w1 = w2 = w3 = empty
            if v < vectors:
                w0, w1, w2, w3 = nh.ld_global_v4_u32(np.uint64(body + 16 * v))
            held[4 * j], held[4 * j + 1], held[4 * j + 2], held[4 * j + 3] = w0, w1, w2, w3
            top = max(top, vector_max(w0, w1, w2, w3))
        # the row's unaligned ends, one element a thread: the first CTA's head, the last one's tail
        in_head = rank == 0 and t < head
        tail = head + vectors * VEC + t
        in_tail = rank == ranks - 1 and tail < width
        hx = load(base + 2 * t) if in_head else _NEG_INF
        tx = load(base + 2 * tail) if in_tail else _NEG_INF
        m = max(top, max(hx, tx)) * _LOG2E
        s = _ZERO
        if m != _NEG_INF:  # (every element -inf: nothing to add)
            for j in range(HELD):
                s += (pair_sum(held[4 * j], m) + pair_sum(held[4 * j + 1], m)) + (
                    pair_sum(held[4 * j + 2], m) + pair_sum(held[4 * j + 3], m))
            s += nh.ex2_approx_ftz(hx * _LOG2E - m) + nh.ex2_approx_ftz(tx * _LOG2E - m)
        for offset in (16, 8, 4, 2, 1):
            m, s = _merge(m, s, cuda.shfl_xor_sync(0xFFFFFFFF, m, offset), cuda.shfl_xor_sync(0xFFFFFFFF, s, offset))
        parts = cuda.shared.array((2, _WARPS), np.float32)
        pair = cuda.shared.array(2, np.float32)  # this CTA's (max, sum), read by the cluster
        shift = cuda.shared.array(1, np.float32)
        if t % 32 == 0:
            parts[0, t // 32] = m
            parts[1, t // 32] = s
        label = target[r]
        valid = label >= 0 and label < width
        picked = _ZERO  # the target's logit, read before any CTA of the cluster overwrites the row
        if rank == 0 and t == 0 and valid:
            picked = load(base + 2 * label)
        cuda.syncthreads()
        if t == 0:
            m, s = parts[0, 0], parts[1, 0]
            for w in range(1, _WARPS):
                m, s = _merge(m, s, parts[0, w], parts[1, w])
            pair[0] = m
            pair[1] = s
        nh.cluster_arrive()
        nh.cluster_wait()  # every CTA's pair written, every CTA's loads done
        if t < 32:
            m, s = _NEG_INF, _ZERO
            if t < ranks:
                peer = nh.mapa(nh.shared_address(pair), np.uint32(t))
                m, s = nh.ld_shared_cluster_f32(peer), nh.ld_shared_cluster_f32(peer + np.uint32(4))
            for offset in (4, 2, 1):  # (a cluster has at most 8 CTAs)
                m, s = _merge(m, s, cuda.shfl_xor_sync(0xFFFFFFFF, m, offset),
                              cuda.shfl_xor_sync(0xFFFFFFFF, s, offset))
            if t == 0:
                shift[0] = m + math.log2(s)
        nh.cluster_arrive()  # this CTA is done reading the others' pairs (they exit after the wait below)
        cuda.syncthreads()
        row_shift = shift[0]
        if rank == 0 and t == 0:
            row_lse = row_shift * _LN2
            lse[r] = row_lse
            if label == ignore_index:
                rows[r] = _ZERO
            elif not valid:
                rows[r] = np.float32(np.nan)
            else:
                rows[r] = row_lse - picked
        k = _ZERO if label == ignore_index else scale[0]
        for j in range(HELD):
            v = first + j * THREADS
            if v < vectors:
                at = label - head - v * VEC  # the target's place in this vector, if in [0, VEC)
                nh.st_global_v4_u32(np.uint64(body + 16 * v), pair_grad(held[4 * j], row_shift, k, at),
                                    pair_grad(held[4 * j + 1], row_shift, k, at - 2),
                                    pair_grad(held[4 * j + 2], row_shift, k, at - 4),
                                    pair_grad(held[4 * j + 3], row_shift, k, at - 6))
        if in_head:
            nh.st_global_u16(np.uint64(base + 2 * t), from_f32(_prob(hx, row_shift, k, t == label)))
        if in_tail:
            nh.st_global_u16(np.uint64(base + 2 * tail), from_f32(_prob(tx, row_shift, k, tail == label)))
        nh.cluster_wait()

    return loss_grad
