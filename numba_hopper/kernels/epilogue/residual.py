"""The residual ``C`` of ``beta * C``: its TMA loads into two sub-tile buffers per consumer, and
the reads of its values beside the output's.

C comes in by TMA, one sub-tile (64 rows x ``epi_cols``) at a time into two buffers per
consumer, each with its own mbarrier: the consumer's leader issues the loads of a tile's
first two sub-tiles as its main loop starts, and that of sub-tile q + 2 as soon as sub-tile q
has been read. A box is at most 128 bytes wide (the TMA swizzle span): a sub-tile of wider C
elements than the output's takes two. A GLU backward's buffer holds the gate's products'
sub-tile, then the up products' (``EpilogueConfig.glu``), both under the buffer's mbarrier.
"""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ... import intrinsics as nh
from ...kit.layouts import swizzle
from ..gemm_config import ELEMENT_BYTES, EPI_ROWS

__all__ = ["Residual", "make_residual", "c_box_cols"]

Residual = namedtuple("Residual", ["init", "load", "f32_pair", "quad", "up_quad"])


def c_box_cols(cfg):
    """Columns of one TMA box of the residual C: ``cfg.epi_cols``, at most 128 bytes of them."""
    return min(cfg.epi_cols, 128 // ELEMENT_BYTES[cfg.c_dtype])


def make_residual(cfg) -> Residual:
    """The residual C of the kernel of ``cfg`` (which has one: ``cfg.has_c``), as device functions:

    - ``init(smem)``: (one thread) the C buffers' mbarriers;
    - ``load(smem, cw, s, maps, row0, col0, bc)``: (the leader) start loading C's 64 x
      ``epi_cols`` sub-tile at (``row0``, ``col0``) of batch ``bc`` as sub-tile ``s`` of consumer
      ``cw``'s sequence: into buffer s % 2, completing phase s // 2 of that buffer's mbarrier
      (``maps``: the kernel's ``TensorMaps``; a GLU backward's up products' sub-tile too);
    - ``f32_pair(buf, addr, r, col, at)``: C's pair at sub-tile (``r``, ``col``) for an f32
      output pair stored at ``addr`` of the output sub-tile buffer ``buf``;
    - ``quad(buf, addr, r, col, at)``: C's four pairs of one stmatrix.x4 (pair x = 2h + j at
      (r + 8j, col + 8h)); ``up_quad``: the same of a GLU backward's up products.

    The reads find C's buffer ``at.c_offset`` bytes from the output's.
    """
    CONSUMERS, EPI_COLS = cfg.consumers, cfg.epi_cols
    layout = cfg.layout
    C_OFF, C_BAR_OFF, C_BUF = layout.c, layout.c_barriers, cfg.c_buf_bytes
    C_ITEM = ELEMENT_BYTES[cfg.c_dtype]
    C_BOX_COLS = c_box_cols(cfg)
    C_BOX_ROW = C_BOX_COLS * C_ITEM  # bytes: the box row is also its swizzle span
    C_BOX_BYTES = EPI_ROWS * C_BOX_ROW
    C_BOXES = EPI_COLS // C_BOX_COLS
    GLU = cfg.glu
    UP_OFF = C_BUF // 2  # (GLU) the up products' sub-tile, after the gate's
    C_LIKE_OUT = C_ITEM == ELEMENT_BYTES[cfg.out_dtype]  # C's buffer is laid out as the output's
    unpack = nh.unpack_bf16x2 if cfg.c_dtype == "bf16" else nh.unpack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def init(smem):
        for slot in range(2 * CONSUMERS):
            nh.mbarrier_init(smem + C_BAR_OFF + 8 * slot, 1)

    @cuda.jit(device=True, forceinline=True)
    def load(smem, cw, s, maps, row0, col0, bc):
        slot = 2 * cw + s % 2
        bar = smem + C_BAR_OFF + 8 * slot
        buf = smem + C_OFF + slot * C_BUF
        nh.mbarrier_arrive_expect_tx(bar, C_BUF)
        if GLU:  # (one box each: C_BOX_COLS = EPI_COLS)
            nh.tma_load_3d(buf, maps.c, col0, row0, bc, bar)
            nh.tma_load_3d(buf + UP_OFF, maps.glu[0], col0, row0, bc, bar)
        else:
            for box in range(C_BOXES):
                nh.tma_load_3d(buf + box * C_BOX_BYTES, maps.c, col0 + box * C_BOX_COLS, row0, bc, bar)

    @cuda.jit(device=True, forceinline=True)
    def c_pair(cbuf, r, col):
        """C at (row ``r``, columns ``col``, ``col`` + 1) of the sub-tile in ``cbuf``, as f32."""
        byte = col * C_ITEM
        off = (byte // C_BOX_ROW) * C_BOX_BYTES + r * C_BOX_ROW + byte % C_BOX_ROW
        addr = cbuf + swizzle(off, C_BOX_ROW)
        if C_ITEM == 4:
            return nh.ld_shared_v2_f32(addr)
        return unpack(nh.ld_shared_u32(addr))

    @cuda.jit(device=True, forceinline=True)
    def f32_pair(buf, addr, r, col, at):
        if C_LIKE_OUT:  # the same offset in C's buffer
            return nh.ld_shared_v2_f32(addr + at.c_offset)
        return c_pair(buf + at.c_offset, r, col)

    @cuda.jit(device=True, forceinline=True)
    def quad(buf, addr, r, col, at):
        if C_LIKE_OUT:  # ldmatrix.x4 at stmatrix's addresses returns its registers
            regs = nh.ldmatrix_x4(addr + at.c_offset)
            return unpack(regs[0]), unpack(regs[1]), unpack(regs[2]), unpack(regs[3])
        cbuf = buf + at.c_offset
        return (c_pair(cbuf, r, col), c_pair(cbuf, r + 8, col),
                c_pair(cbuf, r, col + 8), c_pair(cbuf, r + 8, col + 8))

    @cuda.jit(device=True, forceinline=True)
    def up_quad(buf, addr, r, col, at):
        regs = nh.ldmatrix_x4(addr + at.c_offset + UP_OFF)  # (C_LIKE_OUT: 16-bit, as the output)
        return unpack(regs[0]), unpack(regs[1]), unpack(regs[2]), unpack(regs[3])

    assert not GLU or (C_LIKE_OUT and C_BOXES == 1), cfg
    return Residual(init, load, f32_pair, quad, up_quad)
