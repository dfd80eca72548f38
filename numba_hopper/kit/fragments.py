"""wgmma register fragments: where each register's element sits, row reductions, and an f32
accumulator turned into the A operand of the next wgmma (RS mode).

The accumulator of ``wgmma.m64nNk*`` (f32 or s32: ``N/2`` registers a thread) is spread over
the warpgroup's 128 threads (PTX ISA 9.7.15.5.1.1, "Register fragments"). Thread ``t`` (warp
``w = t // 32``, lane ``l = t % 32``) holds in register ``r = 4i + 2j + c``::

    row(t, r) = 16w + l//4 + 8j          (j = (r >> 1) & 1: the thread's first or second row)
    col(t, r) = 8i + 2(l%4) + c          (i = r >> 2: the 8-column group; c = r & 1)

           cols 0-1   2-3    4-5    6-7  |  8-9  ...            (registers of warp 0)
    row 0  T0 r0,1   T1     T2     T3    |  T0 r4,5  T1 ...
    row 1  T4        T5     T6     T7    |  T4
    ...
    row 7  T28       T29    T30    T31   |  T28
    row 8  T0 r2,3   T1     T2     T3    |  T0 r6,7  ...
    ...
    row 15 T28 ...                                              (warps 1-3: rows 16-63)

So a thread holds two rows, ``thread_rows(t) = (16w + l//4, 16w + l//4 + 8)``, and the four
lanes of a quad (``l//4`` equal) share them: a full row reduction is the thread's registers
of that row, then two butterfly shuffles in the quad (:func:`quad_max`, :func:`quad_sum`).
An f16 accumulator (``wgmma_accumulator(n, "f16")``) packs registers ``2q, 2q+1`` into
register ``q``, low half first.

**The accumulator as the A operand.** An RS wgmma (``wgmma_mma_async_rs``) takes A as four
uint32 a thread per k16 slice (16-bit types) whose layout is the accumulator's, two columns
to a register: register ``m`` of slice ``kk`` holds columns ``16kk + 8(m//2) + 2(l%4) + {0,
1}`` of row ``16w + l//4 + 8(m%2)``, which are accumulator registers ``8kk + 2m`` and ``8kk +
2m + 1``. So ``packed = pack_tuple(acc, "bf16")`` (one ``cvt.rn.bf16x2.f32`` per pair) gives
slice ``kk``'s operand as ``packed[4kk .. 4kk+3]`` (:func:`a_operand`): ``P @ V`` of attention
is ``wgmma_mma_async_rs(o, a_operand(packed, kk), v_desc(kk), ...)`` for each ``kk``. fp8
(k32 slices) needs four consecutive columns a register, which a thread does not hold:
:func:`make_a_operand_fp8` exchanges pairs within the quad (two ``SHFL`` and a ``PRMT`` a
register).

Convert the whole accumulator before the first RS wgmma that reads it, then
``wgmma_fence()``: a conversion between two RS wgmmas of one group writes registers that a
wgmma in flight may read, and ptxas then waits for each wgmma before the next (the pitfalls
page of the authoring guide shows the SASS).

Device functions (``t``: the thread's index in its warpgroup, 0-127; ``acc``: a wgmma f32
accumulator tuple; two-row results are ``(row0, row1)`` tuples)::

    r0, r1 = thread_rows(t)
    m = row_max(acc, m)                     # running max of each row, over the quad
    p = exp2_rows(acc, scale, (m[0] * scale, m[1] * scale))   # 2**(acc*scale - m*scale)
    l = row_sum(p, l)                       # running sums (full rows)
    o = scale_rows(o, (c0, c1))             # rescale an output accumulator row by row
    s = mask_cols(s, t, seq_end - n0, -inf) # columns past the sequence: -inf
    packed = nh.pack_tuple(p, "bf16")       # UniTuple(uint32, n/4): A registers of P
    a = a_operand(packed, kk)               # slice kk's four registers
    q = make_a_loader(Q)(q_tile, t, kk)     # or A from a shared K-major tile, by ldmatrix

Host twins for tests and reasoning: :func:`accumulator_coords`, :func:`a_operand_coords`.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..intrinsics import (array_as_tuple, byte_perm, ex2_approx_ftz, ex2_fma, fmax, ldmatrix_x4, pack_e4m3x4,
                          pack_e5m2x4, tuple_as_array)
from .layouts import OperandLayout, box_address

__all__ = [
    "acc_row",
    "acc_col",
    "thread_rows",
    "row_half",
    "quad_max",
    "quad_sum",
    "row_max",
    "row_sum",
    "thread_row_sum",
    "scale_rows",
    "exp2_rows",
    "make_exp2_rows",
    "mask_cols",
    "a_operand",
    "make_a_operand_fp8",
    "x4_lane_offset",
    "make_a_loader",
    "accumulator_coords",
    "a_operand_coords",
    "FP8_A_DTYPES",
]

FULL_MASK = 0xFFFFFFFF
FP8_A_DTYPES = ("e4m3", "e5m2")


@cuda.jit(device=True, forceinline=True)
def acc_row(t, r):
    """Row (0-63) of register ``r`` of warpgroup thread ``t``: ``16(t//32) + (t%32)//4 + 8((r>>1)&1)``."""
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((r >> 1) & 1)


@cuda.jit(device=True, forceinline=True)
def acc_col(t, r):
    """Column of register ``r`` of warpgroup thread ``t``: ``8(r>>2) + 2(t%4) + (r&1)``."""
    return 8 * (r >> 2) + 2 * (t % 4) + (r & 1)


@cuda.jit(device=True, forceinline=True)
def thread_rows(t):
    """The two rows warpgroup thread ``t`` holds: ``(16(t//32) + (t%32)//4, that + 8)``."""
    r0 = 16 * (t // 32) + (t % 32) // 4
    return r0, r0 + 8


@cuda.jit(device=True, forceinline=True)
def row_half(r):
    """Which of the thread's two rows register ``r`` is in: ``(r >> 1) & 1``."""
    return (r >> 1) & 1


@cuda.jit(device=True, forceinline=True)
def quad_max(x):
    """The maximum of ``x`` over the four lanes of this lane's quad (two SHFL.BFLY, FMNMX)."""
    x = fmax(x, cuda.shfl_xor_sync(FULL_MASK, x, 1))
    return fmax(x, cuda.shfl_xor_sync(FULL_MASK, x, 2))


@cuda.jit(device=True, forceinline=True)
def quad_sum(x):
    """The sum of ``x`` over the four lanes of this lane's quad (two SHFL.BFLY, FADD)."""
    x += cuda.shfl_xor_sync(FULL_MASK, x, 1)
    return x + cuda.shfl_xor_sync(FULL_MASK, x, 2)


@cuda.jit(device=True, forceinline=True)
def _thread_row_max(acc, init):
    frag = tuple_as_array(acc)
    m0, m1 = init
    for i in range(len(acc) // 4):
        m0 = fmax(m0, fmax(frag[4 * i], frag[4 * i + 1]))
        m1 = fmax(m1, fmax(frag[4 * i + 2], frag[4 * i + 3]))
    return m0, m1


@cuda.jit(device=True, forceinline=True)
def row_max(acc, init):
    """``(max(init[0], row r0 of acc), max(init[1], row r1))`` over whole rows (the quad's
    registers too): a running row maximum. Start it at ``-inf`` (``fmax`` is exact there)."""
    m0, m1 = _thread_row_max(acc, init)
    return quad_max(m0), quad_max(m1)


@cuda.jit(device=True, forceinline=True)
def thread_row_sum(acc, init):
    """``init`` plus the sums of this thread's registers of its two rows (no shuffles: the
    quad's other lanes hold the rest of each row; :func:`quad_sum` completes it)."""
    frag = tuple_as_array(acc)
    s0, s1 = init
    for i in range(len(acc) // 4):
        s0 += frag[4 * i] + frag[4 * i + 1]
        s1 += frag[4 * i + 2] + frag[4 * i + 3]
    return s0, s1


@cuda.jit(device=True, forceinline=True)
def row_sum(acc, init):
    """``init`` plus the sums of the two rows of ``acc`` (whole rows: ``init`` once per row,
    not per lane, so pass the previous full sums)."""
    s0, s1 = thread_row_sum(acc, (np.float32(0), np.float32(0)))
    return init[0] + quad_sum(s0), init[1] + quad_sum(s1)


@cuda.jit(device=True, forceinline=True)
def scale_rows(acc, scales):
    """``acc`` with the registers of row ``j`` multiplied by ``scales[j]``."""
    frag = tuple_as_array(acc)
    for i in range(len(acc) // 4):
        frag[4 * i] *= scales[0]
        frag[4 * i + 1] *= scales[0]
        frag[4 * i + 2] *= scales[1]
        frag[4 * i + 3] *= scales[1]
    return array_as_tuple(frag, acc)


def make_exp2_rows(fma_eighths: int = 0):
    """``exp2_rows(acc, scale, bias)``: ``2 ** (acc * scale - bias[j])`` for the registers of
    row ``j``, one FFMA and one MUFU.EX2 each (:func:`~numba_hopper.intrinsics.ex2_approx_ftz`;
    ``2**-inf = 0``, so a row whose ``bias`` is ``+inf`` (all masked) gives zeros, and one whose
    max is ``-inf`` gives NaN unless ``bias`` is made finite first). Softmax: ``scale =
    log2(e) * softmax_scale``, ``bias = row_max * scale``.

    ``fma_eighths`` of the 8-column groups (spread evenly) take
    :func:`~numba_hopper.intrinsics.ex2_fma` instead: a cubic on the FMA pipe, for a kernel
    whose MUFU is its busiest unit. Their exponent must be ``<= 0`` (scores minus their row's
    maximum)."""
    if not 0 <= fma_eighths <= 8:
        raise ValueError(f"fma_eighths must be in [0, 8]; got {fma_eighths}")

    @cuda.jit(device=True, forceinline=True)
    def exp2_rows(acc, scale, bias):
        """``2 ** (acc * scale - bias[j])`` for the registers of row ``j``
        (:func:`make_exp2_rows`; this module's ``exp2_rows``: all on the MUFU)."""
        frag = tuple_as_array(acc)
        for i in range(len(acc) // 4):
            if i * fma_eighths % 8 < fma_eighths:
                frag[4 * i] = ex2_fma(frag[4 * i] * scale - bias[0])
                frag[4 * i + 1] = ex2_fma(frag[4 * i + 1] * scale - bias[0])
                frag[4 * i + 2] = ex2_fma(frag[4 * i + 2] * scale - bias[1])
                frag[4 * i + 3] = ex2_fma(frag[4 * i + 3] * scale - bias[1])
            else:
                frag[4 * i] = ex2_approx_ftz(frag[4 * i] * scale - bias[0])
                frag[4 * i + 1] = ex2_approx_ftz(frag[4 * i + 1] * scale - bias[0])
                frag[4 * i + 2] = ex2_approx_ftz(frag[4 * i + 2] * scale - bias[1])
                frag[4 * i + 3] = ex2_approx_ftz(frag[4 * i + 3] * scale - bias[1])
        return array_as_tuple(frag, acc)

    return exp2_rows


exp2_rows = make_exp2_rows()


@cuda.jit(device=True, forceinline=True)
def mask_cols(acc, t, limit, value):
    """``acc`` with every register whose column (:func:`acc_col`) is ``>= limit`` set to
    ``value`` (``-inf`` before a softmax: the key columns past the sequence's end, which TMA
    filled with zeros). ``limit`` may be run-time; ``limit >= n`` changes nothing."""
    frag = tuple_as_array(acc)
    c0 = 2 * (t % 4)
    for i in range(len(acc) // 4):
        for e in range(4):
            if 8 * i + c0 + (e & 1) >= limit:
                frag[4 * i + e] = value
    return array_as_tuple(frag, acc)


@cuda.jit(device=True, forceinline=True)
def a_operand(packed, kk):
    """The four A registers of k16 slice ``kk`` of a packed 16-bit fragment (``packed =
    pack_tuple(acc, "bf16" or "f16")``, or an f16 accumulator): ``packed[4kk .. 4kk+3]``.
    ``kk`` may be a loop index: the tuple goes through a local array that the unrolled loop
    keeps in registers."""
    regs = tuple_as_array(packed)
    return regs[4 * kk], regs[4 * kk + 1], regs[4 * kk + 2], regs[4 * kk + 3]


def make_a_operand_fp8(dtype):
    """``a_operand_fp8(acc, kk, lane)``: the four A registers of k32 slice ``kk`` of an f32
    accumulator, converted to fp8 ``dtype`` ("e4m3" or "e5m2"), for a k32 RS wgmma
    (``wgmma_mma_async_rs(..., "e4m3", ...)``; B must then be K-major fp8 too).

    Register ``m`` of the slice holds columns ``32kk + 16(m//2) + 4(l%4) + {0..3}`` of row
    ``16w + l//4 + 8(m%2)`` (PTX ISA, k32 A fragment). Lane ``q = l%4`` of a quad holds, of
    each 8-column group, columns ``2q, 2q+1``; the four it needs lie with lanes ``2(q%2)``
    and ``2(q%2)+1`` of the group ``2(m//2) + q//2``. Each lane packs its pairs of the groups
    ``2h, 2h+1`` into one uint32 (:func:`~numba_hopper.intrinsics.pack_e4m3x4`), reads the
    two lanes' words (two SHFL) and keeps the half of each its own columns need (PRMT).
    ``lane``: this thread's lane (``t % 32``).

    A kernel that may reorder K (``P @ V`` sums over it) can skip the shuffles: a lane's own
    four values of a group pair, packed in place, are A's registers for K permuted within
    each 16 columns as ``2q+c -> 4q+c``, ``8+2q+c -> 4q+2+c``; V's rows must then be loaded
    in that order.
    """
    if dtype not in FP8_A_DTYPES:
        raise ValueError(f"fp8 A operands are {FP8_A_DTYPES}; got {dtype!r} (16-bit A operands: pack_tuple and "
                         "a_operand)")
    pack4 = pack_e4m3x4 if dtype == "e4m3" else pack_e5m2x4

    @cuda.jit(device=True, forceinline=True)
    def words(frag, kk, j, h):
        """This lane's pairs of row j in groups 2h and 2h+1 of slice kk, as four fp8 bytes."""
        base = 16 * kk + 8 * h + 2 * j
        return pack4(frag[base], frag[base + 1], frag[base + 4], frag[base + 5])

    @cuda.jit(device=True, forceinline=True)
    def exchange(x, src, selector):
        word = np.int32(x)  # (numba shuffles signed and float words only: the same bits)
        return byte_perm(cuda.shfl_sync(FULL_MASK, word, src), cuda.shfl_sync(FULL_MASK, word, src + 1), selector)

    @cuda.jit(device=True, forceinline=True)
    def a_operand_fp8(acc, kk, lane):
        frag = tuple_as_array(acc)
        q = lane % 4
        src = lane - q + 2 * (q % 2)
        selector = 0x5410 if q < 2 else 0x7632  # group 2h (low halves) or 2h + 1 (high)
        return (exchange(words(frag, kk, 0, 0), src, selector), exchange(words(frag, kk, 1, 0), src, selector),
                exchange(words(frag, kk, 0, 1), src, selector), exchange(words(frag, kk, 1, 1), src, selector))

    return a_operand_fp8


@cuda.jit(device=True, inline="always", forceinline=True)
def x4_lane_offset(lane):
    """``(row, col)`` in a 16 x 16 block of 16-bit elements that ``lane`` addresses for
    ``ldmatrix_x4`` / ``stmatrix_x4`` so that their four registers are a packed fragment's
    ``packed[4p .. 4p+3]`` (the block of columns ``16p .. 16p+15`` of the warp's 16 rows):
    matrix ``m = lane // 8`` is rows ``8(m%2) ..``, columns ``8(m//2) ..``, so
    ``row = 8((lane//8)%2) + lane%8``, ``col = 8(lane//16)``. The same registers are a k16 A
    operand: ``ldmatrix_x4`` of a K-contiguous 16-bit tile so addressed gives
    ``wgmma_mma_async_rs``'s A."""
    m = lane // 8
    return 8 * (m % 2) + lane % 8, 8 * (m // 2)


def make_a_loader(layout: OperandLayout):
    """``load(tile, t, kk)``: the four RS A registers of k16 slice ``kk`` of a 64-row, K-major,
    16-bit operand tile in shared memory (``tile``: the address of the warpgroup's 64 rows, as
    ``layout`` lays them out: TMA boxes of ``layout.swizzle``-byte rows), by one
    ``ldmatrix.x4`` a thread: warp ``w`` loads rows ``16w ..``, lane addresses from
    :func:`x4_lane_offset`, each 16-byte row chunk where the swizzle put it. Keeps an
    operand that every k-loop iteration reuses (attention's Q) in registers."""
    if layout.major != "K" or layout.element_bytes != 2:
        raise ValueError(f"ldmatrix loads A from a K-major 16-bit tile; got a {layout.major}-major {layout.dtype} "
                         "layout (load MN-major tiles with ldmatrix_x4_trans, fp8 ones with plain shared loads)")
    SPAN, BOX_BYTES = layout.swizzle, layout.box_bytes

    @cuda.jit(device=True, forceinline=True)
    def load(tile, t, kk):
        r, c = x4_lane_offset(t % 32)
        byte = 32 * kk + 2 * c  # slice kk's first byte of K, and this lane's 8-column half
        return ldmatrix_x4(box_address(tile + (byte // SPAN) * BOX_BYTES, 16 * (t // 32) + r, byte % SPAN, SPAN))

    return load


def accumulator_coords(n, dtype="f32"):
    """Host twin of the layout: ``(rows, cols)``, int arrays of shape (128, registers): the
    row and column of each register of each warpgroup thread of an ``m64n{n}`` accumulator.
    ``dtype`` "f32"/"s32" (``n/2`` registers) or "f16" (``n/4`` packed registers: the column
    of the low half; the high half is the next column)."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma N is a multiple of 8 in [8, 256]; got {n}")
    if dtype not in ("f32", "s32", "f16"):
        raise ValueError(f"accumulator dtype is 'f32', 's32' or 'f16'; got {dtype!r}")
    t = np.arange(128)[:, None]
    w, lane = t // 32, t % 32
    if dtype == "f16":
        q = np.arange(n // 4)[None, :]
        return 16 * w + lane // 4 + 8 * (q & 1), 8 * (q >> 1) + 2 * (lane % 4)
    r = np.arange(n // 2)[None, :]
    return 16 * w + lane // 4 + 8 * ((r >> 1) & 1), 8 * (r >> 2) + 2 * (lane % 4) + (r & 1)


def a_operand_coords(dtype="bf16"):
    """Host twin of an RS A operand's layout: ``(rows, cols)`` of shape (128, 4, e), the row
    and column (within the slice) of element ``e`` (from bit 0) of register ``m`` of each
    warpgroup thread: 2 elements a register for 16-bit types (k16), 4 for fp8 (k32)."""
    per = {"bf16": 2, "f16": 2, "e4m3": 4, "e5m2": 4}.get(dtype)
    if per is None:
        raise ValueError(f"RS A operands are bf16, f16, e4m3 or e5m2; got {dtype!r}")
    t = np.arange(128)[:, None, None]
    m = np.arange(4)[None, :, None]
    e = np.arange(per)[None, None, :]
    w, lane = t // 32, t % 32
    rows = 16 * w + lane // 4 + 8 * (m % 2) + 0 * e
    cols = 4 * per * (m // 2) + per * (lane % 4) + e
    return rows, cols
