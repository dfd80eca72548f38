"""The GEMM's epilogue: accumulators to the output, with the fused math on the way.

The store (:func:`make_epilogue`), per consumer warpgroup and output tile: accumulators
-> output dtype -> shared memory (``stmatrix``, 128-byte-swizzled like the output's tensor
map, so the writes are bank-conflict free; 8-byte stores for f32, 2-byte ones for fp8 pairs)
-> ``fence.proxy.async`` -> one thread issues a TMA store of a 64 x 64 (16-bit, fp8) or
64 x 32 (f32) sub-tile. Two sub-tile buffers per consumer alternate, so a store drains while
the next sub-tile is written, and the last stores of a tile drain while the next tile's main
loop runs (``cfg.epi_buffers`` = 1: one buffer, each sub-tile waits until the store before it
has read it). TMA clips stores outside the tensor, so partial tiles need no code.

Grouped kernels (``cfg.grouped``): a tile's rows may run past its group's end
(``GroupTile.row_end``), into the next group's rows of the same output, which TMA would not
clip (it clips at the tensor's bounds only). A consumer whose 64 rows all lie before the end
stores them as above; one whose rows cross it writes its sub-tiles to shared memory the same
way, then its 128 threads copy the rows before the end to global memory, 16 bytes each
(coalesced: 8 threads per 128-byte row); one whose rows all lie past the end stores nothing.
That keeps the TMA path for every full warpgroup and costs the few boundary tiles a
copy through registers. The alternative, a tensor map per group rewritten on the device
(``tensormap.replace`` of its row count), would need every CTA to patch and fence a map
whenever its group changes, with TMA stores of the old map possibly still in flight.

The fused math, for each in-bounds element (row r, column c) of the kernel's row-major
output tile:

    v = acc * alpha * row_scale[r] * col_scale[c]      (each factor only if asked)
    v = v + beta * C[r, c] + bias[r or c]              (likewise)
    aux[r, c] = v                                      (the pre-activation value, if asked)
    v = activation(v)
    v = user(v, r, c, *user_args)                      (a @cuda.jit(device=True) function)
    amax = max(amax, |v|)                              (if asked)
    v = v * out_scale                                  (if asked; fp8 outputs saturate)

A gated kernel (``cfg.gated``: ``act(A @ B) * (A @ B_up)``, the GLU of SwiGLU and GeGLU MLPs)
has only the activation and ``aux``: the kernel's tile is B's ``block_n / 2`` columns then B_up's,
so register ``k`` of a thread's fragment (column ``col``) and register ``k + block_n / 4`` (column
``col + block_n / 2``) are the same output element's two products, and the store writes
``activation(acc[k]) * acc[k + block_n / 4]`` to the tile's ``block_n / 2`` output columns.
With ``aux`` (both products, ``aux[:, :N]`` and ``aux[:, N:]``) it first stores the accumulator
as it is, sub-tile by sub-tile through the output's buffers and TMA: B's columns through one
tensor map, B_up's through another, each clipped at N.

``amax`` is a thread's running maximum over every tile it stores, kept as the bits of
``|v|`` (which order as the floats do, NaN highest); at the end each warp reduces it
(``redux.sync``) and one lane raises the global value with an atomic max: one atomic per
warp per CTA, not per element or tile.

Every feature is a compile-time flag of :class:`EpilogueConfig`, so a kernel carries only
the code it uses; the run-time values reach the kernel as one :class:`EpilogueArgs`. The
row and column vectors are loaded when a tile's main loop starts and the column terms
staged in shared memory after it, so the store reads each with one shared load; the
residual C streams in beside the stores (:mod:`.residual`).

Column-major outputs (``cfg.out_major == "M"``: the 64 x 8 or 64 x 16 tiles of a decode
product computed swapped) take a path of their own: each thread writes its fragment's
elements transposed, one 16-bit store each, into an unswizzled buffer of ``block_n``
128-byte rows (the output's rows are the kernel's columns), and the leader stores it with
one TMA box. Such tiles are small, so the single buffer per consumer costs little.

Coordinates are the KERNEL's: for a column-major output the host runs the kernel on the
transposed problem and passes transposed operands, swapped scales and the bias along the
other dimension; ``transposed`` then swaps (row, col) back for the user's function.
16-bit vectors and ``aux`` travel as their ``uint16`` bits (numba has no bf16).

The parts: :mod:`.math` (the per-element math), :mod:`.residual` (C's loads and reads),
:mod:`.fragment` (a fragment's values into a swizzled sub-tile), :mod:`.store` (sub-tiles to
global memory); :func:`make_epilogue` puts them together.
"""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ... import intrinsics as nh
from ..epilogue_config import ACTIVATIONS, EpilogueArgs, EpilogueConfig, epilogue_argument_type
from ..gemm_config import ELEMENT_BYTES, WG_ROWS
from .fragment import make_fused_pairs
from .math import NO_AMAX, epilogue_math
from .residual import c_box_cols, make_residual
from .store import EpilogueState, GuardedArgs, TileArgs, make_subtile_stores

__all__ = ["EpilogueConfig", "EpilogueArgs", "ACTIVATIONS", "Epilogue", "EpilogueState", "make_epilogue",
           "epilogue_argument_type", "c_box_cols"]

Epilogue = namedtuple("Epilogue", ["init", "start", "begin_tile", "hold", "store_tile", "drain"])


def make_epilogue(cfg) -> Epilogue:
    """The epilogue of the GEMM kernel of ``cfg`` (:class:`~numba_hopper.kernels.gemm_config.GemmConfig`):
    an :class:`Epilogue` of device functions, for one consumer warpgroup ``c``
    (:class:`~numba_hopper.kernels.gemm_config.Consumer`).

    - ``init(smem)``: (one thread, before the block's barrier) C's mbarriers, if any;
    - ``start() -> state``: a consumer's :class:`EpilogueState` before its first tile;
    - ``begin_tile(smem, c, tile, rows, state, maps, params, ep) -> terms``: as the tile's main
      loop starts, the loads of the row and column terms of its 64-row block ``rows`` (the
      consumer's own, ``c.cw``, or with ping-pong either) and of its first C sub-tiles;
    - ``hold(acc) -> held``: the accumulator tuple ``acc`` as a consumer holds it to store it
      (with ``cfg.overlaps_store``, a plain 16-bit output's as packed pairs: half the
      registers, while the next tile's first k-block runs);
    - ``store_tile(frag, smem, c, tile, rows, state, maps, params, ep, terms) -> state``: the
      tile's 64-row block ``rows`` (the consumer's own, ``c.cw``, or with
      ping-pong either) from ``frag`` (``tuple_as_array`` of the accumulator, or of ``hold``'s
      tuple) to global memory;
    - ``drain(c, state, ep)``: wait for the consumer's last stores; with ``amax``, raise
      ``ep.amax`` to the warp's largest ``|value|``.
    """
    BN = cfg.out_block_n
    GATED = cfg.gated
    GROUPED, MASKED = cfg.grouped is not None, cfg.grouped == "masked"
    D_BATCHED = cfg.grouped != "contiguous"  # a contiguous grouped output is one matrix
    OUT_BYTES = ELEMENT_BYTES[cfg.out_dtype]
    EPI = cfg.epilogue
    FUSED, HAS_C = EPI is not None, cfg.has_c
    AMAX = FUSED and EPI.amax
    EPI_COLS = cfg.epi_cols
    EPI_CHUNKS = BN // EPI_COLS
    COL_MAJOR = cfg.out_major == "M"
    VEC_OFF, VEC_BYTES = cfg.layout.vec, cfg.layout.vec_bytes
    init_c, load_c, c_f32_pair, c_quad, up_quad = make_residual(cfg) if HAS_C else (None,) * 5
    # (a gated kernel stores aux from the accumulator: make_subtile_stores)
    tile_terms, stage_columns, column_terms, apply = (epilogue_math(EPI, BN, aux_elements=not GATED) if FUSED
                                                      else (None,) * 4)
    fused = make_fused_pairs(cfg, column_terms, apply, c_f32_pair, c_quad, up_quad)
    hold, subtiles, guarded_subtiles, store_transposed = make_subtile_stores(cfg, fused, load_c)

    @cuda.jit(device=True, forceinline=True)
    def init(smem):
        if HAS_C:
            init_c(smem)

    @cuda.jit(device=True, forceinline=True)
    def start():
        return EpilogueState(0, NO_AMAX)

    @cuda.jit(device=True, forceinline=True)
    def begin_tile(smem, c, tile, rows, state, maps, p, ep):
        row0 = tile.m0 + rows * WG_ROWS
        if MASKED:  # row vectors are (G, M) in one: group g's rows start at g * M
            terms = tile_terms(tile.batch * p.M + row0 + c.row_in_wg, tile.n0, c.t, p.batches * p.M, p.N,
                               ep) if FUSED else ()
        else:
            terms = tile_terms(row0 + c.row_in_wg, tile.n0, c.t, p.M, p.N, ep) if FUSED else ()
        if HAS_C and c.leader:  # C's first two sub-tiles land during the main loop
            for q in range(min(2, EPI_CHUNKS)):
                load_c(smem, c.cw, state.stores + q, maps, row0, tile.n0 + q * EPI_COLS, tile.batch)
        return terms

    @cuda.jit(device=True, forceinline=True)
    def store_tile(frag, smem, c, tile, rows, state, maps, p, ep, terms):
        if FUSED:  # the previous tile's reads of the staged columns are behind its last barrier
            stage_columns(smem + VEC_OFF + c.cw * VEC_BYTES, c.t, terms[2])
        row0 = tile.m0 + rows * WG_ROWS
        if COL_MAJOR:
            return store_transposed(frag, smem, c, row0, tile.n0, tile.batch, maps.d, state)
        if not GROUPED:
            n0 = tile.n0 // 2 if GATED else tile.n0  # (gated: the kernel's columns are B's and B_up's)
            return subtiles(state, TileArgs(frag, smem, c, row0, n0, tile.batch, maps, p.M, p.N, ep, terms))
        batch = tile.batch if D_BATCHED else 0
        rows = tile.row_end - row0  # the same for the whole warpgroup: its barriers agree
        if rows >= WG_ROWS:
            return subtiles(state, TileArgs(frag, smem, c, row0, tile.n0, batch, maps, p.M, p.N, ep, terms))
        if rows > 0:
            d = p.out_address + batch * p.M * p.N * OUT_BYTES
            return guarded_subtiles(state, GuardedArgs(frag, smem, c, row0, tile.n0, batch, maps, p.M, p.N, ep,
                                                       terms, rows, d))
        return state

    @cuda.jit(device=True, forceinline=True)
    def drain(c, state, ep):
        if c.leader:
            nh.bulk_wait_group(0)
        if AMAX:  # one atomic per warp (module doc)
            m = nh.redux_sync_max_u32(state.amax)
            if c.lane == 0:
                cuda.atomic.max(ep.amax, 0, m)

    return Epilogue(init, start, begin_tile, hold, store_tile, drain)
