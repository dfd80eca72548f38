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

# Relative time per output column of a 128-row tile, fitted to the shape sweep
# (benchmarks/NOTES.md, issue 22): 192-wide tiles run as fast as 256-wide ones; 160-wide and
# 128-wide ones run slower, the more so the longer the run (their smaller tiles read more
# per flop), so at many waves 128 columns cost 1.2-1.7x; one wave of them pays ~1.05x.
TILE_COST = {256: 1.0, 192: 1.0, 160: 1.1, 128: 1.25, 64: 1.52}
# 64-row tiles (M <= SMALL_M) stream B and do little math: 128 columns move as many bytes
# per k-block as the pipeline keeps in flight, 64 columns too few (0.72-0.85x where 128 gave
# 0.81-0.95x), so only these two widths compete, 128 at the same cost as 256.
SMALL_M = 128
SMALL_M_TILE_COST = {256: 1.0, 128: 1.0}
# The fewest k-blocks a stream-K CTA gets (more CTAs would only add fix-ups).
SK_MIN_ITERS = 4


def tile_shape(M, N, units, sms, fused=False):
    """``(block_m, block_n)``: the tile with the shortest estimated run.

    Rows: 64 when M <= SMALL_M, where a 128-row tile would be mostly padding, or (M = 128)
    where two 64-row tiles give twice the CTAs for a product that streams B (measured at
    128x4096x4096: 0.95x cuBLAS with 64x128 tiles, 0.92x with 128x64). Width: waves of
    tiles x width x tile cost; wave quantization decides: 1792x1280 takes 112 tiles of
    128x160 (one wave on 132 SMs) rather than 70 of 128x256 (also one wave, of slower
    tiles); 5120^3 takes 128x192 (9 waves) over 128x256 (7 waves, the last 6% full). Ties
    go to the wider tile. A fused epilogue has no 160-wide kernel.
    """
    block_m, cost = (64, SMALL_M_TILE_COST) if M <= SMALL_M else (128, TILE_COST)

    def estimate(bn):
        tiles = units * -(-M // block_m) * -(-N // bn)
        return -(-tiles // sms) * bn * cost[bn]

    return block_m, min((bn for bn in sorted(cost, reverse=True) if not (fused and bn % 64)), key=estimate)


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


def cluster_pays(tiles, K, b_major, sms):
    """Whether a 1x2 cluster (the two CTAs of a tile row share their A tile through multicast)
    beats single CTAs: only with many tiles per CTA, a long K loop and B stored (K, N).
    Measured (session 4, benchmarks/NOTES.md): +4.5% at 16384x4096x4096 (15.5 tiles per CTA),
    even at 8192^3, but -2.5% at 4096^3 (3.9), -5% at 6144^3 (8.7), -3% at 8192x8192x1024,
    -10% at 4096x4096x512. With B stored (N, K) (``x @ W.T``) it lost on every large shape of
    the issue-22 sweep: 0.75x vs 0.98x cuBLAS at 8192x8192x28672, 0.77x vs 0.99x at
    16384x57344x8192.
    """
    return b_major == "N" and tiles >= 12 * sms and K >= 2048


def choose_config(va, vb, vo, config, debug, epilogue=None, units=1, limits=None):
    """The kernel for these operands: ``config``'s tiling, or the default heuristic's.

    Default: the tile :func:`tile_shape` picks for ``units`` products, the deepest ring
    that fits, and a 1x2 cluster of 128x256 tiles (the only clustered tile measured) where
    :func:`cluster_pays`. ``limits``: the device's
    :class:`~numba_hopper.launch.DeviceLimits` (None: ask the driver about ``vo``'s device).
    """
    a_major = "K" if tma_addressable(va, row_major=True) else "M"
    b_major = "N" if tma_addressable(vb, row_major=True) else "K"
    limits = limits or device_limits(vo.device)
    if config is None:
        M, N = vo.shape
        block_m, block_n = tile_shape(M, N, units, limits.sm_count, fused=epilogue is not None)
        base = GemmConfig(block_m=block_m, block_n=block_n)
        tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
        if block_n == 256 and tiles_n >= 2 and cluster_pays(units * tiles_m * tiles_n, va.shape[1], b_major, limits.sm_count):
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
    k-blocks, >= 32 per slice. With M <= 64 the partials are a few rows, so half the SMs
    idle is enough, given >= 192 k-blocks: 1x4096x14336 went from 0.72x to 0.92x with two
    slices, while 16x8192x8192 (128 k-blocks) lost (0.86x vs 0.94x).
    """
    tiles = -(-M // cfg.block_m) * -(-N // cfg.block_n)
    k_blocks = -(-K // 64)
    few_tiles = 4 * tiles <= sms and k_blocks >= 128
    few_rows = M <= 64 and 2 * tiles <= sms and k_blocks >= 192
    if not (few_tiles or few_rows):
        return 1
    return max(1, min(sms // tiles, k_blocks // 32, 16))
