"""The online softmax of one consumer warpgroup's 64 query rows, on wgmma accumulator fragments.

A consumer thread holds two rows of the score block ``S = Q K^T`` (``block_n`` columns; see
:mod:`numba_hopper.kit.fragments` for which registers) and, for each row, the running maximum
``m`` of its raw scores, the running sum ``l`` of this thread's share of ``exp`` (completed over
the quad only once, at the end) and the output accumulator ``O``. A block updates them as
(FlashAttention-2/3, base 2 with the scale folded in: ``c = scale * log2(e)``)::

    m' = max(m, rowmax(S))
    corr = 2 ** ((m - m') c)                     (0 while m = -inf)
    P = 2 ** (S c - m' c)                        (one FFMA + MUFU.EX2 an element, or a share
                                                  of them on the FMA pipe: ex2_fma)
    l' = l corr + rowsum(P),   O' = O corr + P V

A masked block first sets the scores of hidden keys to ``-inf`` (:func:`make_mask`). A row
whose keys so far are all hidden has ``m' = -inf``; the masked step then takes 0 in its place
(``check_inf``) so that ``2 ** (-inf - -inf)`` never happens: its ``P`` is 0 and so are ``l``
and ``O``. At the end (:func:`finalize`) ``O / l`` is the output and ``m scale + ln l`` the
natural log-sum-exp of the scaled scores; a row that saw no key gets ``O = 0`` and ``lse = -inf``
(FlashAttention's convention).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..kit.fragments import make_exp2_rows, quad_sum, row_max, thread_row_sum, thread_rows
from .config import WG_ROWS

__all__ = ["make_mask", "make_online_step", "finalize", "NEG_INF"]

NEG_INF = np.float32(-np.inf)


def make_mask(block_n, block_m):
    """``mask(s, w, cw, t, n)``: the score block of key block ``n`` with every key that query
    row ``i`` may not see set to ``-inf``: keys ``>= seqlen_k`` and keys ``> i + w.diag``
    (:mod:`.scheduler`). Per row one limit, per register one compare and select
    (``col >= limit - 2 (t % 4)``, the column a constant of the register)."""

    @cuda.jit(device=True, forceinline=True)
    def mask(s, w, cw, t, n):
        frag = nh.tuple_as_array(s)
        r0, r1 = thread_rows(t)
        first_row = np.int32(w.m_block * block_m + cw * WG_ROWS)
        key0 = np.int32(n * block_n + 2 * (t % 4))  # the key of this thread's column 0
        lim0 = np.int32(min(w.seqlen_k, first_row + r0 + w.diag + 1) - key0)
        lim1 = np.int32(min(w.seqlen_k, first_row + r1 + w.diag + 1) - key0)
        for i in range(block_n // 8):
            for c in range(2):
                col = np.int32(8 * i + c)
                if col >= lim0:
                    frag[4 * i + c] = NEG_INF
                if col >= lim1:
                    frag[4 * i + 2 + c] = NEG_INF
        return nh.array_as_tuple(frag, s)

    return mask


@cuda.jit(device=True, forceinline=True)
def _finite(m):
    """``m``, or 0 where it is ``-inf`` (a row with no visible key yet)."""
    return np.float32(0) if m == NEG_INF else m


def make_online_step(exp2_fma_eighths: int = 0):
    """``online_step(s, m, l, scale_log2, check_inf)``: one block's update (module doc):
    ``(P, m', l', corr)`` for scores ``s``, the running maxima ``m`` and this thread's partial
    sums ``l`` (two-row tuples). ``P`` (f32, in ``s``'s registers) still needs packing for the
    P V wgmma; ``corr`` rescales ``O``. ``check_inf`` (a compile-time bool): the block may hold
    a row with no visible key. ``exp2_fma_eighths``: the share of ``P``'s exponentials computed
    on the FMA pipe (:func:`numba_hopper.kit.fragments.make_exp2_rows`)."""
    exp2_rows = make_exp2_rows(exp2_fma_eighths)

    @cuda.jit(device=True, forceinline=True)
    def online_step(s, m, l, scale_log2, check_inf):
        m_new = row_max(s, m)
        if check_inf:
            base = (_finite(m_new[0]), _finite(m_new[1]))
        else:
            base = m_new
        corr = (nh.ex2_approx_ftz((m[0] - base[0]) * scale_log2), nh.ex2_approx_ftz((m[1] - base[1]) * scale_log2))
        p = exp2_rows(s, scale_log2, (base[0] * scale_log2, base[1] * scale_log2))
        l = thread_row_sum(p, (l[0] * corr[0], l[1] * corr[1]))
        return p, m_new, l, corr

    return online_step


@cuda.jit(device=True, forceinline=True)
def _row_result(m, l, scale):
    """``(1 / l, m scale + ln l)`` of one row (``l``: the full row sum, >= 1 when the row saw a
    key: its maximum contributes 2**0); ``(0, -inf)`` when it saw none (``l = 0``). The
    reciprocal is ``rcp.approx`` (1 ulp): a precise division is a subroutine call."""
    if l == np.float32(0):
        return np.float32(0), NEG_INF
    return nh.rcp_approx_ftz(l), np.float32(m * scale + math.log(l))


@cuda.jit(device=True, forceinline=True)
def finalize(m, l, scale):
    """``((1/l0, 1/l1), (lse0, lse1))`` of the thread's two rows from the running maxima and
    partial sums (completed over the quad here)."""
    a = _row_result(m[0], quad_sum(l[0]), scale)
    b = _row_result(m[1], quad_sum(l[1]), scale)
    return (a[0], b[0]), (a[1], b[1])
