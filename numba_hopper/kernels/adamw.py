"""AdamW's update of many 16-bit tensors in one launch (``numba_hopper.torch.AdamW``'s kernel).

``adamw_kernel(dtype)`` ("bf16" or "f16"): ``adamw(meta, lr, lr_decay, beta1, beta2, eps)``
updates every tensor ``meta`` lists, with PyTorch's fused AdamW arithmetic in float32 (its
``fused_adam_utils.cuh``; state in the parameter's dtype)::

    p -= lr_decay * p                      # lr_decay = lr * weight_decay
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p -= lr / (1 - beta1**step) * m / (sqrt(v) / sqrt(1 - beta2**step) + eps)

``meta`` is an int64 array, a row per tensor: the global addresses of the parameter, its
gradient, ``m`` and ``v`` (each contiguous and 16-byte aligned: the caller's checks), the
element count, the first chunk of the tensor, and its step. The grid has a CTA per chunk of
``CHUNK`` elements of each tensor in turn; a CTA finds its tensor by a binary search over the
rows' first chunks. The update is bound by memory bandwidth (it reads 8 and writes 6 bytes an
element): each thread moves 16 bytes (eight elements) a load or store, two vectors of each
tensor, both loaded before either is stored, and a tensor's last elements that are no whole
vector go one at a time: a thread has 128 bytes of loads in flight before its first store, where
one vector at a time had 64. On an H200 that moves 4.1 TB/s at Llama-3-8B's widths (``benchmarks/bench_optim.py``),
where CTAs of 256 threads that each updated four vectors in turn moved 3.9-4.0 and a copy moves
4.26.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda

from .. import intrinsics as nh

__all__ = ["THREADS", "CHUNK", "META_COLUMNS", "PARAM", "GRAD", "EXP_AVG", "EXP_AVG_SQ", "NUMEL", "FIRST_CHUNK", "STEP",
           "adamw_kernel"]

THREADS = 128
VEC = 8  # 16-bit elements in a 16-byte access
CHUNK = THREADS * VEC * 2  # elements a CTA updates: two vectors a thread
PARAM, GRAD, EXP_AVG, EXP_AVG_SQ, NUMEL, FIRST_CHUNK, STEP = range(7)  # meta's columns
META_COLUMNS = 7
_ONE = np.float32(1)


@functools.lru_cache(maxsize=None)
def adamw_kernel(dtype: str):
    """The update of ``dtype`` ("bf16" or "f16") tensors (module doc); grid: one CTA of
    ``THREADS`` per chunk."""
    if dtype == "bf16":
        to_f32, from_f32, unpack, pack = nh.bf16_to_f32, nh.f32_to_bf16, nh.unpack_bf16x2, nh.pack_bf16x2
    else:
        to_f32, from_f32, unpack, pack = nh.f16_to_f32, nh.f32_to_f16, nh.unpack_f16x2, nh.pack_f16x2

    @cuda.jit(device=True, inline="always")
    def update(p, g, m, v, k):
        """One element: ``k`` = (lr_decay, beta1, 1 - beta1, beta2, 1 - beta2, step_size,
        bias_correction2_sqrt, eps); returns the new (p, m, v)."""
        p -= k[0] * p
        m = k[1] * m + k[2] * g
        v = k[3] * v + k[4] * g * g
        return p - k[5] * m / (math.sqrt(v) / k[6] + k[7]), m, v

    @cuda.jit(device=True, inline="always")
    def update_pairs(pw, gw, mw, vw, k):
        """Two packed elements of each of p, g, m, v; returns the packed new (p, m, v)."""
        p0, p1 = unpack(pw)
        g0, g1 = unpack(gw)
        m0, m1 = unpack(mw)
        v0, v1 = unpack(vw)
        p0, m0, v0 = update(p0, g0, m0, v0, k)
        p1, m1, v1 = update(p1, g1, m1, v1, k)
        return pack(p0, p1), pack(m0, m1), pack(v0, v1)

    @cuda.jit(device=True, inline="always")
    def load(p_at, g_at, m_at, v_at, at):
        """The vector at byte ``at`` of the parameter, gradient and moments."""
        return (nh.ld_global_v4_u32(np.uint64(p_at + at)), nh.ld_global_nc_v4_u32(np.uint64(g_at + at)),
                nh.ld_global_v4_u32(np.uint64(m_at + at)), nh.ld_global_v4_u32(np.uint64(v_at + at)))

    @cuda.jit(device=True, inline="always")
    def store_updated(p_at, m_at, v_at, at, x, k):
        """``x``, a :func:`load`'s vectors, updated and stored."""
        p, g, m, v = x
        p0, m0, v0 = update_pairs(p[0], g[0], m[0], v[0], k)
        p1, m1, v1 = update_pairs(p[1], g[1], m[1], v[1], k)
        p2, m2, v2 = update_pairs(p[2], g[2], m[2], v[2], k)
        p3, m3, v3 = update_pairs(p[3], g[3], m[3], v[3], k)
        nh.st_global_v4_u32(np.uint64(p_at + at), p0, p1, p2, p3)
        nh.st_global_v4_u32(np.uint64(m_at + at), m0, m1, m2, m3)
        nh.st_global_v4_u32(np.uint64(v_at + at), v0, v1, v2, v3)

    @cuda.jit
    def adamw(meta, lr, lr_decay, beta1, beta2, eps):
        chunk = cuda.blockIdx.x
        lo, hi = 0, meta.shape[0] - 1
        while lo < hi:  # the last tensor whose first chunk is at most this one
            mid = (lo + hi + 1) // 2
            if meta[mid, FIRST_CHUNK] <= chunk:
                lo = mid
            else:
                hi = mid - 1
        p_at, g_at, m_at, v_at = meta[lo, PARAM], meta[lo, GRAD], meta[lo, EXP_AVG], meta[lo, EXP_AVG_SQ]
        n = meta[lo, NUMEL]
        step = np.float32(meta[lo, STEP])
        k = (lr_decay, beta1, _ONE - beta1, beta2, _ONE - beta2, lr / (_ONE - beta1 ** step),
             math.sqrt(_ONE - beta2 ** step), eps)
        first = (chunk - meta[lo, FIRST_CHUNK]) * CHUNK + cuda.threadIdx.x * VEC
        second = first + THREADS * VEC
        if second + VEC <= n:  # both whole vectors
            a = load(p_at, g_at, m_at, v_at, 2 * first)
            b = load(p_at, g_at, m_at, v_at, 2 * second)
            store_updated(p_at, m_at, v_at, 2 * first, a, k)
            store_updated(p_at, m_at, v_at, 2 * second, b, k)
            return
        for i in range(first, min(second + VEC, n), THREADS * VEC):  # the tensor's end
            if i + VEC <= n:
                store_updated(p_at, m_at, v_at, 2 * i, load(p_at, g_at, m_at, v_at, 2 * i), k)
            else:
                for j in range(i, n):  # its last, partial vector
                    at = 2 * j
                    p, m, v = update(to_f32(nh.ld_global_u16(np.uint64(p_at + at))),
                                     to_f32(nh.ld_global_nc_u16(np.uint64(g_at + at))),
                                     to_f32(nh.ld_global_u16(np.uint64(m_at + at))),
                                     to_f32(nh.ld_global_u16(np.uint64(v_at + at))), k)
                    nh.st_global_u16(np.uint64(p_at + at), from_f32(p))
                    nh.st_global_u16(np.uint64(m_at + at), from_f32(m))
                    nh.st_global_u16(np.uint64(v_at + at), from_f32(v))

    return adamw
