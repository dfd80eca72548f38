"""RMS normalization of 16-bit rows, forward and backward: ``numba_hopper.torch.rms_norm``'s kernels.

The arithmetic is transformers' ``LlamaRMSNorm`` (Qwen's, Mistral's and others' alike): in
float32, ``xhat = x / sqrt(mean(x^2) + eps)``, rounded to the rows' dtype, then
``y = weight * xhat``, rounded again. Eagerly, PyTorch runs that as eight operators forward and
about fifteen backward, each a pass over the rows; these kernels make one pass each way, float32
only in registers.

- ``forward_kernel(dtype, group, per_thread)``:
  ``forward(x, weight, y, rstd, rows, width, inv_width, eps)``: ``y`` and each row's
  ``rstd = rsqrt(mean(x^2) + eps)`` (``inv_width = 1 / width`` in float32, as PyTorch's mean
  scales its sum; ``rsqrt.approx``, as ``torch.rsqrt``).
- ``backward_kernel(dtype, group, per_thread)``:
  ``backward(dy, x, weight, rstd, dx, partials, rows, width, inv_width)``:
  ``dx = rstd * (g - xhat * mean(g * xhat))`` with ``g = dy * weight``, and in row
  ``blockIdx.x`` of ``partials`` (float32, one row per CTA) the CTA's share of the weight's
  gradient, ``sum(dy * xhat)`` over its rows (``xhat`` in float32: PyTorch's autograd
  multiplies by the rounded one, an error of its own).
- ``column_sum_kernel(dtype)``: ``column_sum(partials, out, width)``: ``out[c] = sum(partials[:, c])``,
  rounded to ``dtype``: the weight's gradient; a CTA for each 32 columns.

``x``, ``weight``, ``y``, ``dy``, ``dx`` and ``out`` are global addresses (``int``) of contiguous
rows of ``width`` elements, ``width`` a multiple of 8 and every address 16-byte aligned (the
caller's checks); ``rstd`` and ``partials`` are numba arrays. A row belongs to a group of
``group`` threads (a power of two), each holding ``per_thread`` 16-byte vectors of it in
registers, so the row is read once; a CTA of ``THREADS`` threads holds ``THREADS // group`` rows
at a time and strides over the rows by the grid. :func:`tiling` picks ``group`` and
``per_thread`` for a width. The row's sum is a butterfly over the group's lanes, then, for a
group wider than a warp, over its warps through shared memory.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["THREADS", "MAX_WIDTH", "tiling", "forward_kernel", "backward_kernel", "column_sum_kernel"]

THREADS = 256
VEC = 8  # 16-bit elements in a 16-byte access
PER_THREAD = 2  # vectors a thread keeps in registers, up to 4 for rows wider than a CTA's 2
MAX_WIDTH = THREADS * 4 * VEC  # 8192: a row in one CTA's registers
_WARPS = THREADS // 32
_ZERO = np.float32(0)
_ONE = np.float32(1)


def tiling(width: int) -> tuple[int, int]:
    """``(group, per_thread)`` for rows of ``width`` elements (a multiple of 8, at most
    :data:`MAX_WIDTH`): the narrowest power-of-two group, at most a CTA, whose threads hold the
    row in ``PER_THREAD`` vectors each (more, up to 4, in a CTA-wide group), at least a pair."""
    vectors = width // VEC
    group = min(THREADS, 1 << max(1, math.ceil(math.log2(max(1, -(-vectors // PER_THREAD))))))
    return group, -(-vectors // group)


def _conversions(dtype):
    """(16-bit bits to float32, float32 to 16-bit bits, packed pair to two float32, two float32 to a pair)."""
    if dtype == "bf16":
        return nh.bf16_to_f32, nh.f32_to_bf16, nh.unpack_bf16x2, nh.pack_bf16x2
    return nh.f16_to_f32, nh.f32_to_f16, nh.unpack_f16x2, nh.pack_f16x2


def _group_sum(group):
    """``total(v, scratch, parity)``: the sum of ``v`` over the calling thread's group (every
    thread of the CTA calls it, the same number of times). ``scratch``: a (2, ``_WARPS``)
    float32 shared array, its rows used by turns (``parity``), so one barrier a row suffices."""
    lanes = min(group, 32)
    offsets = tuple(lanes >> k for k in range(1, lanes.bit_length()))  # lanes/2 .. 1
    warps = group // 32  # the group's warps, when it spans more than one

    @cuda.jit(device=True, inline="always")
    def total(v, scratch, parity):
        for offset in offsets:
            v += cuda.shfl_xor_sync(0xFFFFFFFF, v, offset)
        if warps > 1:
            warp = cuda.threadIdx.x // 32
            if cuda.threadIdx.x % 32 == 0:
                scratch[parity, warp] = v
            cuda.syncthreads()
            first = warp - warp % warps
            v = _ZERO
            for w in range(warps):
                v += scratch[parity, first + w]
        return v

    return total


def _vectors(unpack, group, per_thread):
    """``keep(words, at, v0, v1, v2, v3)``: a 16-byte vector's four words into
    ``words[at:at + 4]``; ``load_weight(w, weight, lane, vectors)``: the weight's elements that
    the thread at ``lane`` of its group holds, in float32, into ``w`` (``per_thread`` vectors of 8)."""

    @cuda.jit(device=True, inline="always")
    def keep(words, at, v0, v1, v2, v3):
        words[at] = v0
        words[at + 1] = v1
        words[at + 2] = v2
        words[at + 3] = v3

    @cuda.jit(device=True, inline="always")
    def load_weight(w, weight, lane, vectors):
        for j in range(per_thread):
            if lane + j * group < vectors:
                v0, v1, v2, v3 = nh.ld_global_nc_v4_u32(np.uint64(weight + 16 * (lane + j * group)))
                at = j * VEC
                w[at], w[at + 1] = unpack(v0)
                w[at + 2], w[at + 3] = unpack(v1)
                w[at + 4], w[at + 5] = unpack(v2)
                w[at + 6], w[at + 7] = unpack(v3)

    return keep, load_weight


def _row_walk(dtype, group, per_thread):
    """What both row kernels build: ``_conversions(dtype)``, ``_vectors``' ``keep`` and
    ``load_weight``, ``_group_sum``'s ``total``, the rows a CTA holds at a time, and the sizes of
    a thread's float32 and 32-bit-word arrays of its vectors (constants, as local arrays need)."""
    conversions = _conversions(dtype)
    return (conversions, *_vectors(conversions[2], group, per_thread), _group_sum(group), THREADS // group,
            per_thread * VEC, per_thread * 4)


@functools.lru_cache(maxsize=None)
def forward_kernel(dtype: str, group: int, per_thread: int):
    """The forward of ``dtype`` ("bf16" or "f16") rows (module doc); block ``THREADS``."""
    conversions, keep, load_weight, total, rows_per_cta, floats, words = _row_walk(dtype, group, per_thread)
    to_f32, from_f32, unpack, pack = conversions
    pt = per_thread

    @cuda.jit(device=True, inline="always")
    def scaled(word, s, w, at):
        """A packed pair of ``x``: ``w * round(x * s)``, packed."""
        a, b = unpack(word)
        return pack(to_f32(from_f32(a * s)) * w[at], to_f32(from_f32(b * s)) * w[at + 1])

    @cuda.jit
    def forward(x, weight, y, rstd, rows, width, inv_width, eps):
        t = cuda.threadIdx.x
        lane = t % group
        vectors = width // VEC
        scratch = cuda.shared.array((2, _WARPS), np.float32)
        w = cuda.local.array(floats, np.float32)
        xs = cuda.local.array(words, np.uint32)
        load_weight(w, weight, lane, vectors)
        parity = 0
        first = cuda.blockIdx.x * rows_per_cta
        while first < rows:  # (a range with a runtime step divides in 64 bits)
            r = first + t // group
            squares = _ZERO
            for j in range(pt):
                c = lane + j * group
                if r < rows and c < vectors:
                    v0, v1, v2, v3 = nh.ld_global_nc_v4_u32(np.uint64(x + r * width * 2 + 16 * c))
                    keep(xs, j * 4, v0, v1, v2, v3)
                    for v in (v0, v1, v2, v3):
                        a, b = unpack(v)
                        squares += a * a + b * b
            s = nh.rsqrt_approx(total(squares, scratch, parity) * inv_width + eps)
            parity ^= 1
            if r < rows:
                for j in range(pt):
                    c = lane + j * group
                    if c < vectors:
                        at = j * VEC
                        nh.st_global_v4_u32(np.uint64(y + r * width * 2 + 16 * c),
                                            scaled(xs[j * 4], s, w, at), scaled(xs[j * 4 + 1], s, w, at + 2),
                                            scaled(xs[j * 4 + 2], s, w, at + 4), scaled(xs[j * 4 + 3], s, w, at + 6))
                if lane == 0:
                    rstd[r] = s
            first += cuda.gridDim.x * rows_per_cta

    return forward


@functools.lru_cache(maxsize=None)
def backward_kernel(dtype: str, group: int, per_thread: int):
    """The backward of ``dtype`` ("bf16" or "f16") rows (module doc); block ``THREADS``; the
    grid no larger than ``partials``' rows."""
    conversions, keep, load_weight, total, rows_per_cta, floats, words = _row_walk(dtype, group, per_thread)
    unpack, pack = conversions[2:]
    pt = per_thread

    @cuda.jit(device=True, inline="always")
    def pair_dot(xword, dword, w, at):
        """``sum(dy * w * x)`` over a packed pair."""
        a, b = unpack(xword)
        da, db = unpack(dword)
        return da * w[at] * a + db * w[at + 1] * b

    @cuda.jit(device=True, inline="always")
    def pair_grad(xword, dword, w, dw, at, s, mean):
        """A packed pair's ``dx``; adds its share of the weight's gradient to ``dw[at:at + 2]``."""
        a, b = unpack(xword)
        da, db = unpack(dword)
        a *= s
        b *= s
        dw[at] += da * a
        dw[at + 1] += db * b
        return pack(s * (da * w[at] - a * mean), s * (db * w[at + 1] - b * mean))

    @cuda.jit
    def backward(dy, x, weight, rstd, dx, partials, rows, width, inv_width):
        t = cuda.threadIdx.x
        lane = t % group
        vectors = width // VEC
        scratch = cuda.shared.array((2, _WARPS), np.float32)
        dw_cta = cuda.shared.array(MAX_WIDTH, np.float32)
        w = cuda.local.array(floats, np.float32)
        dw = cuda.local.array(floats, np.float32)
        xs = cuda.local.array(words, np.uint32)
        ds = cuda.local.array(words, np.uint32)
        load_weight(w, weight, lane, vectors)
        for i in range(floats):
            dw[i] = _ZERO
        for i in range(t, width, THREADS):
            dw_cta[i] = _ZERO
        parity = 0
        first = cuda.blockIdx.x * rows_per_cta
        while first < rows:  # (a range with a runtime step divides in 64 bits)
            r = first + t // group
            s = rstd[r] if r < rows else _ZERO
            dot = _ZERO
            for j in range(pt):
                c = lane + j * group
                if r < rows and c < vectors:
                    at = r * width * 2 + 16 * c
                    v0, v1, v2, v3 = nh.ld_global_nc_v4_u32(np.uint64(x + at))
                    keep(xs, j * 4, v0, v1, v2, v3)
                    v0, v1, v2, v3 = nh.ld_global_nc_v4_u32(np.uint64(dy + at))
                    keep(ds, j * 4, v0, v1, v2, v3)
                    for k in range(4):
                        dot += pair_dot(xs[j * 4 + k], ds[j * 4 + k], w, j * VEC + 2 * k)
            mean = total(dot, scratch, parity) * s * inv_width  # mean(g * xhat)
            parity ^= 1
            if r < rows:
                for j in range(pt):
                    c = lane + j * group
                    if c < vectors:
                        at = j * VEC
                        q = j * 4
                        nh.st_global_v4_u32(np.uint64(dx + r * width * 2 + 16 * c),
                                            pair_grad(xs[q], ds[q], w, dw, at, s, mean),
                                            pair_grad(xs[q + 1], ds[q + 1], w, dw, at + 2, s, mean),
                                            pair_grad(xs[q + 2], ds[q + 2], w, dw, at + 4, s, mean),
                                            pair_grad(xs[q + 3], ds[q + 3], w, dw, at + 6, s, mean))
            first += cuda.gridDim.x * rows_per_cta
        cuda.syncthreads()  # dw_cta zeroed
        for j in range(pt):
            c = lane + j * group
            if c < vectors:
                for e in range(VEC):
                    cuda.atomic.add(dw_cta, c * VEC + e, dw[j * VEC + e])
        cuda.syncthreads()
        for i in range(t, width, THREADS):
            partials[cuda.blockIdx.x, i] = dw_cta[i]

    return backward


@functools.lru_cache(maxsize=None)
def column_sum_kernel(dtype: str):
    """``column_sum(partials, out, width)`` (module doc); block ``THREADS``, a CTA for each 32
    columns: a warp's lanes are the columns, its warps take every eighth partial row, four at a
    time (independent loads), and shared memory adds the warps' sums."""
    from_f32 = _conversions(dtype)[1]

    @cuda.jit
    def column_sum(partials, out, width):
        lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        c = cuda.blockIdx.x * 32 + lane
        n = partials.shape[0]
        s0, s1, s2, s3 = _ZERO, _ZERO, _ZERO, _ZERO
        if c < width:
            p = warp
            while p + 3 * _WARPS < n:
                s0 += partials[p, c]
                s1 += partials[p + _WARPS, c]
                s2 += partials[p + 2 * _WARPS, c]
                s3 += partials[p + 3 * _WARPS, c]
                p += 4 * _WARPS
            while p < n:
                s0 += partials[p, c]
                p += _WARPS
        sums = cuda.shared.array((_WARPS, 32), np.float32)
        sums[warp, lane] = (s0 + s1) + (s2 + s3)
        cuda.syncthreads()
        if warp == 0 and c < width:
            s = _ZERO
            for w in range(_WARPS):
                s += sums[w, lane]
            nh.st_global_u16(np.uint64(out + 2 * c), from_f32(s))

    return column_sum
