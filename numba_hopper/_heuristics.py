"""The kernel a GEMM gets: tile shape, cluster, pipeline depth, K splits, stream-K schedule.

Every rule here was fitted to timings on the H100 (benchmarks/NOTES.md names them); each
function is pure host arithmetic, so the CPU tests pin the choices down.
"""

from __future__ import annotations

import dataclasses

from ._arrays import tma_addressable
from .kernels.gemm_sm90 import GemmConfig, max_stages
from .launch import device_limits

__all__ = ["TILE_COST", "SK_MIN_ITERS", "tile_shape", "stream_k_schedule", "cluster_pays", "choose_config",
           "split_count"]

# Relative time per output column of a tile, from benchmarks/NOTES.md (1792x1280x4096, one
# wave each): a narrower tile reads A from shared memory for fewer columns of MMA.
TILE_COST = {256: 1.0, 192: 1.075, 160: 1.07, 128: 1.065, 64: 1.52}
# The fewest k-blocks a stream-K CTA gets (more CTAs would only add fix-ups).
SK_MIN_ITERS = 4


def tile_shape(M, N, units, sms, fused=False):
    """``(block_m, block_n)``: the tile with the shortest estimated run.

    Rows: 64 when M <= 64, where half of a 128-row tile would be padding (measured at
    64x4096x4096: 0.94x cuBLAS with 64x64 tiles, 0.58x with 128x64). Width: waves of tiles x
    width x tile cost; wave quantization decides: 1792x1280 takes 112 tiles of 128x160 (one
    wave on 132 SMs) rather than 70 of 128x256 (also one wave, of slower tiles); a skinny
    128x8192 takes 128 tiles of 128x64 rather than leaving 100 SMs idle with 32 tiles of
    128x256. Ties go to the wider tile. A fused epilogue has no 160-wide kernel.
    """
    def estimate(bn):
        tiles = units * -(-M // 128) * -(-N // bn)
        return -(-tiles // sms) * bn * TILE_COST[bn]

    return 64 if M <= 64 else 128, min((bn for bn in TILE_COST if not (fused and bn % 64)), key=estimate)


def stream_k_schedule(tiles, k_blocks, sms):
    """``(grid, dp_tiles)`` of a stream-K launch of ``tiles`` tiles of ``k_blocks`` each.

    With at least one full wave, all but the last full wave are data-parallel and the last
    full wave plus the partial one are stream-K: every CTA gets one to two tiles' worth of
    k-iterations, so a tile is shared by at most three CTAs. With less than one wave, all
    tiles are stream-K, over at most as many CTAs as leave each ``SK_MIN_ITERS``.
    """
    full = tiles // sms
    if full == 0:
        return max(1, min(sms, tiles * k_blocks // SK_MIN_ITERS)), 0
    return sms, (full - 1) * sms


def cluster_pays(tiles, K, sms):
    """Whether a 1x2 cluster (the two CTAs of a tile row share their A tile through multicast)
    beats single CTAs: only with many tiles per CTA and a long K loop. Measured (session 4,
    benchmarks/NOTES.md): +4.5% at 16384x4096x4096 (15.5 tiles per CTA), even at 8192^3, but
    -2.5% at 4096^3 (3.9), -5% at 6144^3 (8.7), -3% at 8192x8192x1024, -10% at 4096x4096x512.
    """
    return tiles >= 12 * sms and K >= 2048


def choose_config(va, vb, vo, config, debug, epilogue=None, units=1):
    """The kernel for these operands: ``config``'s tiling, or the default heuristic's.

    Default: the tile :func:`tile_shape` picks for ``units`` products, the deepest ring
    that fits, and a 1x2 cluster where :func:`cluster_pays`.
    """
    a_major = "K" if tma_addressable(va, row_major=True) else "M"
    b_major = "N" if tma_addressable(vb, row_major=True) else "K"
    limits = device_limits(vo.device)
    if config is None:
        M, N = vo.shape
        block_m, block_n = tile_shape(M, N, units, limits.sm_count, fused=epilogue is not None)
        base = GemmConfig(block_m=block_m, block_n=block_n)
        tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
        if block_m == 128 and tiles_n >= 2 and cluster_pays(units * tiles_m * tiles_n, va.shape[1], limits.sm_count):
            base = dataclasses.replace(base, cluster_n=2)
        stages = max_stages(va.dtype, vo.dtype, base.block_n, limits.max_shared_per_block_optin,
                            a_major=a_major, b_major=b_major, block_m=base.block_m, epilogue=epilogue)
    else:
        base, stages = config, config.stages
    cfg = dataclasses.replace(base, in_dtype=va.dtype, out_dtype=vo.dtype, a_major=a_major,
                              b_major=b_major, stages=stages, debug=debug, epilogue=epilogue)
    if cfg.shared_bytes > limits.max_shared_per_block_optin:
        raise ValueError(f"config needs {cfg.shared_bytes} bytes of shared memory with these operands, more than "
                         f"the device's {limits.max_shared_per_block_optin}: give it fewer stages")
    return cfg


def split_count(cfg, M, N, K, sms):
    """K slices for a product with too few output tiles to fill the GPU (1: no split).

    Each slice writes fp32 partials that a second kernel sums in a fixed order, so the
    result is deterministic. The workspace round trip and the second launch cost more than
    idle SMs unless most SMs would idle and K is long: measured (benchmarks/NOTES.md), two
    slices lost at 1024^3 (0.47x vs 0.67x cuBLAS), and at 64x4096x4096 with 128x64 tiles
    (64 tiles on 132 SMs; 0.52x vs 0.61x). So: at most a quarter of the SMs busy, >= 128
    k-blocks, >= 32 per slice.
    """
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    k_blocks = -(-K // 64)
    if 4 * tiles > sms or k_blocks < 128:
        return 1
    return max(1, min(sms // tiles, k_blocks // 32, 16))
