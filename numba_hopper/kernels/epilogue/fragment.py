"""A consumer's accumulator fragment to a swizzled output sub-tile in shared memory, through
the fused math: :func:`make_subtile_writer`."""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ... import intrinsics as nh
from ..gemm_config import ELEMENT_BYTES, FP8_DTYPES
from .math import NO_AMAX, ONE, PACK

__all__ = ["SubtileWriter", "make_subtile_writer"]

SubtileWriter = namedtuple("SubtileWriter", ["write", "swizzled", "out_scale"])


def make_subtile_writer(cfg, column_terms, apply, c_f32_pair, c_quad) -> SubtileWriter:
    """Device functions that write sub-tiles of the kernel of ``cfg``'s output:

    - ``write(frag, buf, q, row_in_wg, lane, at) -> amax bits``: sub-tile ``q`` of this
      thread's fragment into the swizzled buffer ``buf``;
    - ``swizzled(buf, r, byte)``: where TMA's swizzle puts byte ``byte`` of sub-tile row ``r``;
    - ``out_scale(ep)``: the output's last factor (1 without one).

    ``column_terms``, ``apply``: the fused math's (:func:`~.math.epilogue_math`; None
    unfused); ``c_f32_pair``, ``c_quad``: the residual's reads (:func:`~.residual.make_residual`;
    None without C). ``at``, a sub-tile's coordinates and terms (``store._Subtile``), is None
    unfused.
    """
    OUT_T = cfg.out_dtype
    GATED = cfg.gated
    UP_REGS = cfg.block_n // 4  # (gated) a fragment's B_up registers follow its B registers
    OUT_BYTES = ELEMENT_BYTES[OUT_T]
    FP8_OUT = OUT_T in FP8_DTYPES
    EPI = cfg.epilogue
    FUSED, HAS_C = EPI is not None, cfg.has_c
    AMAX = FUSED and EPI.amax
    SCALE_OUT, SCALE_OUT_ARRAY = FUSED and EPI.out_scale is not None, FUSED and EPI.out_scale == "array"
    EPI_COLS = cfg.epi_cols
    EPI_ROW_BYTES = cfg.epi_swizzle or 128  # (column-major outputs: unswizzled 128-byte rows)
    EPI_GROUPS = EPI_COLS // 16  # stmatrix 16-column groups of a 16-bit sub-tile
    COL_GROUPS = EPI_COLS // 8  # 8-column groups of a sub-tile
    SWIZZLE_MASK = EPI_ROW_BYTES // 16 - 1
    ROW_SHIFT = {128: 0, 64: 1, 32: 2}[EPI_ROW_BYTES]  # log2 of the rows in 128 bytes
    pack = PACK.get(OUT_T)

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row_in_wg, j, col, c, ct, at):
        """Registers ``k``, ``k + 1`` (sub-tile row ``row_in_wg + 8j``, columns ``col``, ``col`` + 1), as
        stored, and the bits of the larger of their in-bounds ``|value|`` (before the output
        scale; 0 without ``amax``).

        ``c``: C's f32 pair there (if any); ``ct``: the two columns' terms (:func:`columns`);
        ``at``: the sub-tile's ``_Subtile`` (None without a fused epilogue).
        """
        if not FUSED:
            return frag[k], frag[k + 1], NO_AMAX
        row, col = at.row0 + row_in_wg + 8 * j, at.col0 + col
        rt = at.row_terms if j == 0 else at.row_terms_8
        v0 = apply(frag[k], c[0], rt, ct[0], row, col, at.M, at.N, at.ep)
        v1 = apply(frag[k + 1], c[1], rt, ct[1], row, col + 1, at.M, at.N, at.ep)
        if GATED:
            v0, v1 = v0 * frag[k + UP_REGS], v1 * frag[k + 1 + UP_REGS]
        m = NO_AMAX
        if AMAX and row < at.M:  # the padding of partial tiles holds bias and C terms too
            m = max(nh.abs_bits(v0) if col < at.N else NO_AMAX, nh.abs_bits(v1) if col + 1 < at.N else NO_AMAX)
        if SCALE_OUT:
            v0, v1 = v0 * at.out_scale, v1 * at.out_scale
        return v0, v1, m

    @cuda.jit(device=True, forceinline=True)
    def out_scale(ep):
        if SCALE_OUT_ARRAY:
            return ep.out_scale[0]
        return ep.out_scale if SCALE_OUT else ONE

    @cuda.jit(device=True, forceinline=True)
    def swizzled(buf, r, byte):
        """The address of byte ``byte`` of row ``r`` of an output sub-tile in ``buf``, as TMA
        swizzles it: 16-byte chunk c at chunk c ^ ((r >> ROW_SHIFT) & SWIZZLE_MASK), the row
        bits above 128 bytes (the row's part is the same for every chunk a thread writes)."""
        return buf + r * EPI_ROW_BYTES + (((byte >> 4) ^ ((r >> ROW_SHIFT) & SWIZZLE_MASK)) << 4) + (byte & 15)

    @cuda.jit(device=True, forceinline=True)
    def columns(q, col, at):
        """The staged terms of sub-tile ``q``'s columns ``col`` and ``col + 1`` (fused only)."""
        return column_terms(at.columns, q * EPI_COLS + col) if FUSED else (0, 0)

    @cuda.jit(device=True, forceinline=True)
    def write_subtile(frag, buf, q, row_in_wg, lane, at):
        """Sub-tile ``q`` of this thread's accumulator fragment into swizzled ``buf``.

        Fragment of m64nNk16 (thread t, warp w = t // 32, lane l): register 4i + 2j + c
        holds row 16w + l//4 + 8j, column 8i + 2(l%4) + c. 128B swizzle: the 16-byte
        chunk ``c`` of row ``r`` lives at chunk ``c ^ (r % 8)`` (64B: ``c ^ ((r // 2) % 4)``,
        32B: ``c ^ ((r // 4) % 2)``: :func:`swizzled`). A fused epilogue (:func:`pair`) maps
        each pair of values on the way. Returns the bits of the largest in-bounds ``|value|``
        (0 without ``amax``).
        """
        amax = NO_AMAX
        if OUT_T == "f32" or FP8_OUT:  # a pair is 8 or 2 bytes, stored at its place in the swizzled row
            for ii in range(COL_GROUPS):
                i = COL_GROUPS * q + ii
                for j in range(2):
                    r = row_in_wg + 8 * j
                    col = 8 * ii + 2 * (lane % 4)
                    addr = swizzled(buf, r, col * OUT_BYTES)
                    k = 4 * i + 2 * j
                    c = c_f32_pair(buf, addr, r, col, at) if HAS_C else (frag[k], frag[k])
                    v0, v1, m = pair(frag, k, row_in_wg, j, col, c, columns(q, col, at), at)
                    amax = max(amax, m)
                    if FP8_OUT:
                        nh.st_shared_u16(addr, pack(v0, v1))
                    else:
                        nh.st_shared_v2_f32(addr, v0, v1)
        else:
            # stmatrix.x4: matrix m (its row addresses from lanes 8m..8m+7) is the 8x8 block
            # at rows 8*(m%2), columns 8*(m//2) of a 16x16 block = registers 8P+2m, 8P+2m+1.
            m = lane // 8
            r = (row_in_wg - lane // 4) + 8 * (m % 2) + lane % 8
            for p in range(EPI_GROUPS):  # 16-column groups of this sub-tile
                base = 8 * (EPI_GROUPS * q + p)
                chunk = 2 * p + m // 2
                addr = swizzled(buf, r, 16 * chunk)
                col = 16 * p + 2 * (lane % 4)
                f = (frag[base], frag[base])
                c = c_quad(buf, addr, row_in_wg, col, at) if HAS_C else (f, f, f, f)
                # register pair x = 2h + j: row row_in_wg + 8j, column col + 8h
                ct0, ct1 = columns(q, col, at), columns(q, col + 8, at)
                v = (
                    pair(frag, base + 0, row_in_wg, 0, col, c[0], ct0, at),
                    pair(frag, base + 2, row_in_wg, 1, col, c[1], ct0, at),
                    pair(frag, base + 4, row_in_wg, 0, col + 8, c[2], ct1, at),
                    pair(frag, base + 6, row_in_wg, 1, col + 8, c[3], ct1, at),
                )
                regs = (
                    pack(v[0][0], v[0][1]),
                    pack(v[1][0], v[1][1]),
                    pack(v[2][0], v[2][1]),
                    pack(v[3][0], v[3][1]),
                )
                amax = max(amax, v[0][2], v[1][2], v[2][2], v[3][2])
                nh.stmatrix_x4(addr, regs[0], regs[1], regs[2], regs[3])
        return amax

    return SubtileWriter(write_subtile, swizzled, out_scale)
