"""Cross-entropy over 16-bit logits, one CTA per row: the loss kernel and its gradient kernel.

A language model's logits are as wide as its vocabulary (32k to 150k columns), so PyTorch's
``cross_entropy(logits.float(), target)`` moves them several times in float32 (the upcast, the
log-softmax, its backward, the cast of the gradient). These kernels read the 16-bit logits once
for the loss and once more for the gradient, which they write in the logits' dtype, keeping
float32 only in registers.

- ``loss_kernel(dtype)``: ``loss(logits, target, ignore_index, lse, rows)``: per row the
  log-sum-exp of its logits (float32) and ``rows[r] = lse[r] - logits[r, target[r]]`` (0 where
  ``target[r] == ignore_index``, NaN where the target is outside ``[0, V)``).
- ``grad_kernel(dtype)``: ``grad(logits, target, ignore_index, lse, d_rows, out)``:
  ``out[r, c] = d_rows[r] * (exp(logits[r, c] - lse[r]) - (c == target[r]))``, a zero row where
  the target is ``ignore_index``.

Arrays are numba arrays; 16-bit ones hold the element bits as ``int16`` (PyTorch's CUDA array
interface refuses bf16: pass ``t.view(torch.int16)``). Each of the ``THREADS`` threads walks the
row with a stride of ``THREADS`` columns: every load of a warp is one contiguous 64-byte span.
The exponentials are ``ex2.approx`` (relative error about 2^-22), the row's log ``math.log``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["THREADS", "loss_kernel", "grad_kernel"]

THREADS = 512  # 16 warps a row: a 151,936-wide vocabulary is 297 loads a thread
_WARPS = THREADS // 32
_LOG2E = np.float32(1.4426950408889634)
_LN2 = np.float32(0.6931471805599453)
_NEG_INF = np.float32(-np.inf)


def _to_f32(dtype):
    convert = nh.bf16_to_f32 if dtype == "bf16" else nh.f16_to_f32

    @cuda.jit(device=True, inline="always")
    def to_f32(bits):
        return convert(np.uint16(bits))

    return to_f32


@cuda.jit(device=True, inline="always")
def _merge(m, s, m2, s2):
    """Two partial (max, sum of exp2(x - max)) pairs of log2-scaled values as one."""
    hi = max(m, m2)
    if hi == _NEG_INF:  # both empty: no exp2(-inf - -inf)
        return hi, s + s2
    return hi, s * nh.ex2_approx_ftz(m - hi) + s2 * nh.ex2_approx_ftz(m2 - hi)


@functools.lru_cache(maxsize=None)
def loss_kernel(dtype: str):
    """The loss kernel of ``dtype`` ("bf16" or "f16") logits (module doc); grid: one CTA of
    ``THREADS`` per row."""
    to_f32 = _to_f32(dtype)

    @cuda.jit
    def loss(logits, target, ignore_index, lse, rows):
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        width = logits.shape[1]
        m, s = _NEG_INF, np.float32(0)
        for c in range(t, width, THREADS):  # online: one exp2 an element
            x = to_f32(logits[r, c]) * _LOG2E
            if x > m:
                s = s * nh.ex2_approx_ftz(m - x) + np.float32(1)
                m = x
            else:
                s += nh.ex2_approx_ftz(x - m)
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
                rows[r] = np.float32(0)
            elif label < 0 or label >= width:
                rows[r] = np.float32(np.nan)
            else:
                rows[r] = row_lse - to_f32(logits[r, label])

    return loss


@functools.lru_cache(maxsize=None)
def grad_kernel(dtype: str):
    """The gradient kernel of ``dtype`` ("bf16" or "f16") logits (module doc); grid: one CTA of
    ``THREADS`` per row."""
    to_f32 = _to_f32(dtype)
    from_f32 = nh.f32_to_bf16 if dtype == "bf16" else nh.f32_to_f16

    @cuda.jit
    def grad(logits, target, ignore_index, lse, d_rows, out):
        r = cuda.blockIdx.x
        label = target[r]
        scale = np.float32(0) if label == ignore_index else d_rows[r]
        shift = lse[r] * _LOG2E
        for c in range(cuda.threadIdx.x, logits.shape[1], THREADS):
            p = nh.ex2_approx_ftz(to_f32(logits[r, c]) * _LOG2E - shift)
            if c == label:
                p -= np.float32(1)
            out[r, c] = np.int16(from_f32(p * scale))

    return grad
