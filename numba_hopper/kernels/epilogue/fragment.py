"""The fused epilogue's hooks into the kit's tile store (:class:`~numba_hopper.kit.epilogue.TileEpilogue`):
each pair of a consumer's accumulator through the fused math on its way to the output sub-tile
(:func:`make_fused_pairs`)."""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ... import intrinsics as nh
from ...kit.epilogue import TileEpilogue
from ..gemm_config import ELEMENT_BYTES
from .math import NO_AMAX, ONE, ZERO, glu_backward

__all__ = ["FusedPairs", "make_fused_pairs"]

FusedPairs = namedtuple("FusedPairs", ["hooks", "out_scale"])


def make_fused_pairs(cfg, column_terms, apply, c_f32_pair, c_quad, up_quad) -> FusedPairs:
    """The hooks of the kernel of ``cfg``'s fused epilogue, and its output scale:

    - ``hooks``: the :class:`TileEpilogue` the tile store writes every pair through (None
      without a fused epilogue): ``gather`` reads what a stored group needs besides the
      accumulator, C's values at the output's place (``c_f32_pair``, or ``c_quad`` for a whole
      ``stmatrix.x4``: :func:`~.residual.make_residual`) and the staged column terms
      (``column_terms``), ``pair`` applies the fused math (``apply``,
      :func:`~.math.epilogue_math`) to a pair, gates it, tracks its ``|value|`` for ``amax`` and
      scales it; a GLU backward's ``gather`` reads the gate's and up products (``c_quad``,
      ``up_quad``) and its ``pair`` returns both gradients (:func:`~.math.glu_backward`);
    - ``out_scale(ep)``: the output's last factor (1 without one).

    The hooks' context is a sub-tile's coordinates and terms (``store._Subtile``).
    """
    GATED = cfg.gated
    UP_REGS = cfg.block_n // 4  # (gated) a fragment's B_up registers follow its B registers
    STMATRIX = ELEMENT_BYTES[cfg.out_dtype] == 2
    EPI = cfg.epilogue
    FUSED, HAS_C = EPI is not None, cfg.has_c
    AMAX = FUSED and EPI.amax
    SCALE_OUT, SCALE_OUT_ARRAY = FUSED and EPI.out_scale is not None, FUSED and EPI.out_scale == "array"
    EPI_COLS = cfg.epi_cols
    NO_C = (ZERO, ZERO)
    GLU = cfg.glu
    glu_grads = glu_backward(EPI.glu) if GLU else None

    @cuda.jit(device=True, forceinline=True)
    def out_scale(ep):
        if SCALE_OUT_ARRAY:
            return ep.out_scale[0]
        return ep.out_scale if SCALE_OUT else ONE

    if not FUSED:
        return FusedPairs(None, out_scale)

    @cuda.jit(device=True, forceinline=True)
    def columns(q, col, at):
        """The staged terms of sub-tile ``q``'s columns ``col`` and ``col + 1``."""
        return column_terms(at.columns, q * EPI_COLS + col)

    @cuda.jit(device=True, forceinline=True)
    def gather(buf, addr, row, col, q, at):
        """Each pair's ``(c, column terms)``: C's f32 pair there (if any) and its columns' terms
        (a GLU backward's: the gate's and up products' pairs)."""
        if GLU:
            g, u = c_quad(buf, addr, row, col, at), up_quad(buf, addr, row, col, at)
            return (g[0], u[0]), (g[1], u[1]), (g[2], u[2]), (g[3], u[3])
        if STMATRIX:  # pair x = 2h + j of the block: row + 8j, col + 8h
            c = c_quad(buf, addr, row, col, at) if HAS_C else (NO_C, NO_C, NO_C, NO_C)
            ct0, ct1 = columns(q, col, at), columns(q, col + 8, at)
            return (c[0], ct0), (c[1], ct0), (c[2], ct1), (c[3], ct1)
        c = c_f32_pair(buf, addr, row, col, at) if HAS_C else NO_C
        return c, columns(q, col, at)

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row_in_wg, j, col, item, at):
        """Registers ``k``, ``k + 1`` (sub-tile row ``row_in_wg + 8j``, columns ``col``, ``col`` + 1), as
        stored, and the bits of the larger of their in-bounds ``|value|`` (before the output
        scale; 0 without ``amax``)."""
        if GLU:  # (dg0, dg1, -, du0, du1)
            g, u = item
            dg0, du0 = glu_grads(frag[k], g[0], u[0])
            dg1, du1 = glu_grads(frag[k + 1], g[1], u[1])
            return dg0, dg1, NO_AMAX, du0, du1
        c, ct = item
        row, col = at.row0 + row_in_wg + 8 * j, at.col0 + col
        rt = at.row_terms if j == 0 else at.row_terms_8
        n = at.N // 2 if GATED else at.N  # (gated: the kernel's N is the output's twice)
        v0 = apply(frag[k], c[0], rt, ct[0], row, col, at.M, n, at.ep)
        v1 = apply(frag[k + 1], c[1], rt, ct[1], row, col + 1, at.M, n, at.ep)
        if GATED:
            v0, v1 = v0 * frag[k + UP_REGS], v1 * frag[k + 1 + UP_REGS]
        m = NO_AMAX
        if AMAX and row < at.M:  # the padding of partial tiles holds bias and C terms too
            m = max(nh.abs_bits(v0) if col < at.N else NO_AMAX, nh.abs_bits(v1) if col + 1 < at.N else NO_AMAX)
        if SCALE_OUT:
            v0, v1 = v0 * at.out_scale, v1 * at.out_scale
        return v0, v1, m

    return FusedPairs(TileEpilogue(gather, pair), out_scale)
