"""A consumer's output sub-tiles from shared memory to global memory: TMA stores, the grouped
kernels' guarded copies, and the column-major outputs' transposed tiles
(:func:`make_subtile_stores`)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import cuda

from ... import intrinsics as nh
from ...intrinsics import f32_to_bf16, f32_to_f16
from ...kit.barriers import warpgroup_sync
from ...kit.epilogue import make_tile_store
from ...kit.fragments import acc_col
from ..gemm_config import ELEMENT_BYTES, EPI_BUF_BYTES, EPI_ROWS

__all__ = ["EpilogueState", "TileArgs", "GuardedArgs", "SubtileStores", "make_subtile_stores"]

EpilogueState = namedtuple("EpilogueState", ["stores", "amax"])
EpilogueState.__doc__ = """A consumer's epilogue across its tiles: ``stores``, its sub-tile stores so far
(they pick the buffers and their phases), and ``amax``, the bits of the largest ``|value|``
it has stored (0 unless the epilogue tracks it)."""
# What a sub-tile's store reads besides the fragment (the fused epilogue hooks' context): the
# distance from the output buffer to C's, the sub-tile's first output row and column, the row
# terms of rows row_in_wg and row_in_wg + 8, the staged column terms, the output scale.
_Subtile = namedtuple("_Subtile", ["c_offset", "row0", "col0", "M", "N", "ep", "row_terms", "row_terms_8", "columns",
                                   "out_scale"])
# One tile's store, passed through the unrolled sub-tile steps.
TileArgs = namedtuple("TileArgs", ["frag", "smem", "c", "row0", "n0", "batch", "maps", "M", "N", "ep", "terms"])
# A grouped tile's store through registers: ``rows`` of its 64 to write, at ``d`` (the first
# element of the output matrix, row-major with N columns).
GuardedArgs = namedtuple("GuardedArgs", TileArgs._fields + ("rows", "d"))

SubtileStores = namedtuple("SubtileStores", ["hold", "subtiles", "guarded_subtiles", "transposed"])


def make_subtile_stores(cfg, fused, load_c) -> SubtileStores:
    """Device functions that store a consumer's tile of the kernel of ``cfg``, one sub-tile at a
    time, through the kit's tile store (:func:`~numba_hopper.kit.epilogue.make_tile_store`, with
    the fused epilogue's hooks ``fused``, a :class:`~.fragment.FusedPairs`):

    - ``hold(acc) -> held``: a tile's accumulator tuple as a consumer holds it to store it
      (``tuple_as_array(held)`` is the stores' fragment): ``acc``, or (``cfg.overlaps_store``
      with a plain 16-bit output) its packed 16-bit pairs, in half the registers, while the
      next tile's first k-block fills a fresh accumulator;
    - ``subtiles(state, ts: TileArgs) -> state``: each sub-tile written to one of the consumer's
      ``epi_buffers`` buffers, then stored by one TMA store (TMA clips what lies outside the
      tensor); with C, each C sub-tile's buffer is refilled (``load_c``) once every thread has
      read it; a GLU backward writes both gradients' sub-tiles into one buffer and stores each
      to its output; a gated kernel with ``aux`` (``cfg.gated_aux``) first stores the raw
      accumulator, B's columns to one product's map and B_up's to the other, sub-tile by sub-tile
      through the same buffers, then the gated sub-tiles;
    - ``guarded_subtiles(state, gs: GuardedArgs) -> state``: (grouped kernels) the same
      sub-tiles' first ``gs.rows`` rows, copied by every thread, 16 bytes each;
    - ``transposed(frag, smem, c, row0, n0, batch, tmap_d, state) -> state``: (column-major
      outputs) the consumer's whole tile in one TMA box.

    ``ts.maps``: the kernel's ``TensorMaps``.
    """
    BN, OUT_T = cfg.out_block_n, cfg.out_dtype
    OWN_BARRIER = cfg.barrier_ids.consumer  # (+ cw: each consumer warpgroup's own)
    GROUPED = cfg.grouped is not None
    OUT_BYTES = ELEMENT_BYTES[OUT_T]
    FUSED, HAS_C = cfg.epilogue is not None, cfg.has_c
    EPI_COLS = cfg.epi_cols
    EPI_CHUNKS = BN // EPI_COLS
    ROW_CHUNKS = (cfg.epi_swizzle or 128) // 16  # 16-byte chunks of a sub-tile row
    CHUNK_COLS = 16 // ELEMENT_BYTES[OUT_T]
    layout = cfg.layout
    EPI_OFF, VEC_OFF, VEC_BYTES = layout.epi, layout.vec, layout.vec_bytes
    EPI_BUFS = cfg.epi_buffers
    C_OFF, C_BAR_OFF, C_BUF = layout.c, layout.c_barriers, cfg.c_buf_bytes
    out_scale = fused.out_scale
    to_bits = f32_to_bf16 if OUT_T == "bf16" else f32_to_f16
    HELD_PACKED = cfg.overlaps_store and not cfg.promoted  # (plain 16-bit: GemmConfig.overlaps_store)
    GLU = cfg.glu
    UP_OUT = EPI_ROWS * EPI_COLS * OUT_BYTES  # (GLU) the up products' gradient, after the gate's
    PRODUCTS = cfg.gated_aux
    if PRODUCTS:  # (the raw accumulator, no hooks: B's block_n / 2 columns, then B_up's)
        AUX_COLS = cfg.aux_box[2]
        PRODUCT_CHUNKS = cfg.out_block_n // AUX_COLS  # sub-tiles of each product
        raw = make_tile_store(cfg.block_n, cfg.epilogue.aux_dtype, EPI_BUFS, cols=AUX_COLS)
        assert raw.buffer_bytes <= EPI_BUFS * EPI_BUF_BYTES, cfg
    if cfg.out_major == "N":
        store = make_tile_store(BN, OUT_T, EPI_BUFS, cols=EPI_COLS, epilogue=fused.hooks,
                                second_output=UP_OUT if GLU else None)
        acquire, write, commit_3d, address = store.acquire, store.write, store.commit_3d, store.address
        convert, write_converted = store.convert, store.write_converted
        assert store.span == cfg.epi_swizzle and store.buffer_bytes <= EPI_BUFS * EPI_BUF_BYTES, cfg

    @cuda.jit(device=True, forceinline=True)
    def hold(acc):
        if HELD_PACKED:
            return convert(acc)
        return acc

    @cuda.jit(device=True, forceinline=True)
    def store_transposed(frag, smem, c, row0, n0, batch, tmap_d, state):
        """(Column-major output) the consumer's 64 x BN tile: element (r, col) of the fragment
        (register 4i + 2j + h: r = row_in_wg + 8j, col = 8i + 2(lane % 4) + h) to byte
        128 col + 2 r of the buffer, then one TMA store of the (BN, 64) box."""
        buf = smem + EPI_OFF + c.cw * EPI_BUF_BYTES
        if c.leader:
            nh.bulk_wait_group_read(0)  # the previous tile's store has read the buffer
        warpgroup_sync(OWN_BARRIER + c.cw)
        for i in range(BN // 8):
            for j in range(2):
                for h in range(2):
                    r = 4 * i + 2 * j + h
                    nh.st_shared_u16(buf + 128 * acc_col(c.lane, r) + 2 * (c.row_in_wg + 8 * j), to_bits(frag[r]))
        nh.fence_proxy_async()
        warpgroup_sync(OWN_BARRIER + c.cw)
        if c.leader:
            nh.tma_store_3d(tmap_d, buf, row0, n0, batch)
            nh.bulk_commit_group()
        return EpilogueState(state.stores + 1, state.amax)

    @cuda.jit(device=True, forceinline=True)
    def store_subtile(q, state, ts):
        """Sub-tile ``q`` of a tile (the consumer's ``state.stores``-th) to global memory; the next state."""
        c, smem, stores = ts.c, ts.smem, state.stores
        buf = smem + EPI_OFF + (EPI_BUFS * c.cw + stores % EPI_BUFS) * EPI_BUF_BYTES
        acquire(c.leader, OWN_BARRIER + c.cw)
        at = None
        if FUSED:
            slot = 2 * c.cw + stores % 2
            if HAS_C:
                nh.mbarrier_wait_parity(smem + C_BAR_OFF + 8 * slot, (stores // 2) % 2)
            at = _Subtile(smem + C_OFF + slot * C_BUF - buf, ts.row0, ts.n0 + q * EPI_COLS, ts.M, ts.N, ts.ep,
                          ts.terms[0], ts.terms[1], smem + VEC_OFF + c.cw * VEC_BYTES, out_scale(ts.ep))
        if HELD_PACKED:
            write_converted(ts.frag, buf, q, c.t)
            amax = state.amax
        else:
            amax = write(ts.frag, buf, q, c.row_in_wg, c.lane, at)
        col0 = ts.n0 + q * EPI_COLS
        if GLU:  # both sub-tiles, one commit group
            nh.fence_proxy_async()
            warpgroup_sync(OWN_BARRIER + c.cw)
            if c.leader:
                nh.tma_store_3d(ts.maps.d, buf, col0, ts.row0, ts.batch)
                nh.tma_store_3d(ts.maps.glu[1], buf + UP_OUT, col0, ts.row0, ts.batch)
                nh.bulk_commit_group()
        else:
            commit_3d(buf, c.leader, OWN_BARRIER + c.cw, ts.maps.d, col0, ts.row0, ts.batch)
        if HAS_C and c.leader and q + 2 < EPI_CHUNKS:  # every thread has read C sub-tile q: refill its buffer
            load_c(smem, c.cw, stores + 2, ts.maps, ts.row0, ts.n0 + (q + 2) * EPI_COLS, ts.batch)
        return EpilogueState(stores + 1, max(state.amax, amax))

    @cuda.jit(device=True, forceinline=True)
    def store_product(q, state, ts):
        """Sub-tile ``q`` of the raw accumulator (a gated kernel's: B's product, then B_up's) to
        its product's tensor map; the next state."""
        c, stores = ts.c, state.stores
        buf = ts.smem + EPI_OFF + (EPI_BUFS * c.cw + stores % EPI_BUFS) * EPI_BUF_BYTES
        raw.acquire(c.leader, OWN_BARRIER + c.cw)
        raw.write(ts.frag, buf, q, c.row_in_wg, c.lane, None)
        tmap = ts.maps.aux[1] if q >= PRODUCT_CHUNKS else ts.maps.aux[0]
        raw.commit_3d(buf, c.leader, OWN_BARRIER + c.cw, tmap, ts.n0 + (q % PRODUCT_CHUNKS) * AUX_COLS, ts.row0,
                      ts.batch)
        return EpilogueState(stores + 1, state.amax)

    @cuda.jit(device=True, forceinline=True)
    def store_subtile_guarded(q, state, ts):
        """Sub-tile ``q`` as :func:`store_subtile`, but only its first ``ts.rows`` rows, copied
        from the swizzled buffer to global memory by every thread (grouped kernels)."""
        c, smem, stores = ts.c, ts.smem, state.stores
        buf = smem + EPI_OFF + (EPI_BUFS * c.cw + stores % EPI_BUFS) * EPI_BUF_BYTES
        if c.leader:
            nh.bulk_wait_group_read(0)  # no TMA store of this consumer still reads either buffer
        warpgroup_sync(OWN_BARRIER + c.cw)
        at = None
        if FUSED:
            at = _Subtile(0, ts.row0, ts.n0 + q * EPI_COLS, ts.M, ts.N, ts.ep, ts.terms[0], ts.terms[1],
                          smem + VEC_OFF + c.cw * VEC_BYTES, out_scale(ts.ep))
        amax = write(ts.frag, buf, q, c.row_in_wg, c.lane, at)
        warpgroup_sync(OWN_BARRIER + c.cw)  # the sub-tile is in shared memory
        col0 = ts.n0 + q * EPI_COLS
        for i in range(ROW_CHUNKS // 2):  # 64 rows x ROW_CHUNKS 16-byte chunks over 128 threads
            idx = c.t + 128 * i
            r = idx // ROW_CHUNKS
            k = idx % ROW_CHUNKS
            col = col0 + k * CHUNK_COLS
            if r < ts.rows and col < ts.N:  # N is a multiple of CHUNK_COLS (the host checks)
                v = nh.ld_shared_v4_u32(address(buf, r, 16 * k))
                nh.st_global_v4_u32(ts.d + np.uint64(((ts.row0 + r) * ts.N + col) * OUT_BYTES), v[0], v[1], v[2], v[3])
        return EpilogueState(stores + 1, max(state.amax, amax))

    # q must be a constant in each sub-tile's code: LLVM leaves a loop over a fused epilogue
    # rolled, and a run-time q would index the fragment, moving it to local memory. The
    # plain kernel keeps its loop (LLVM unrolls it).
    subtiles = (_unrolled if FUSED else _looped)(store_subtile, EPI_CHUNKS)
    if PRODUCTS:
        subtiles = _products_then(_unrolled(store_product, 2 * PRODUCT_CHUNKS), subtiles)
    guarded_subtiles = (_unrolled if FUSED else _looped)(store_subtile_guarded, EPI_CHUNKS) if GROUPED else None
    return SubtileStores(hold, subtiles, guarded_subtiles, store_transposed)


def _products_then(products, subtiles):
    """``run(state, ts)``: ``products``, then ``subtiles``."""

    @cuda.jit(device=True, forceinline=True)
    def run(state, ts):
        return subtiles(products(state, ts), ts)

    return run


def _unrolled(step, n):
    """Device function ``run(x, args)``: ``x = step(q, x, args)`` for q = 0, ..., n - 1.

    Each call has its own q, a compile-time constant (closure constants), so the steps are
    unrolled whatever LLVM's unroller thinks of their size.
    """

    @cuda.jit(device=True, forceinline=True)
    def run(x, args):
        return x

    for q in range(n):
        run = _then(run, step, q)
    return run


def _looped(step, n):
    """``run(x, args)`` as :func:`_unrolled`, as a plain loop (left to LLVM to unroll)."""

    @cuda.jit(device=True, forceinline=True)
    def run(x, args):
        for q in range(n):
            x = step(q, x, args)
        return x

    return run


def _then(run, step, Q):
    @cuda.jit(device=True, forceinline=True)
    def run_then_step(x, args):
        return step(Q, run(x, args), args)

    return run_then_step
