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

__all__ = ["THREADS", "loss_kernel", "grad_kernel"]

THREADS = 512  # 16 warps a row: a 151,936-wide vocabulary is 37 vectors a thread
VEC = 8  # 16-bit elements in a 16-byte access
_WARPS = THREADS // 32
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
    def prob(x, shift, scale, hit):
        """``scale * (exp(x - lse) - hit)`` with ``shift = lse * log2(e)``."""
        p = nh.ex2_approx_ftz(x * _LOG2E - shift)
        if hit:
            p -= _ONE
        return p * scale

    @cuda.jit(device=True, inline="always")
    def one(base, out_base, c, label, shift, scale):
        x = to_f32(nh.ld_global_nc_u16(np.uint64(base + 2 * c)))
        nh.st_global_u16(np.uint64(out_base + 2 * c), from_f32(prob(x, shift, scale, c == label)))

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
                                pack(prob(x0, shift, scale, k == 0), prob(x1, shift, scale, k == 1)),
                                pack(prob(x2, shift, scale, k == 2), prob(x3, shift, scale, k == 3)),
                                pack(prob(x4, shift, scale, k == 4), prob(x5, shift, scale, k == 5)),
                                pack(prob(x6, shift, scale, k == 6), prob(x7, shift, scale, k == 7)))

    return grad
