"""The kernel a GEMM gets: tile shape, cluster, pipeline depth, K splits, stream-K schedule.

Every rule here is fitted to device timings on the H100 by the benchmark its table names
(``benchmarks/``, against cuBLAS); each function is pure host arithmetic, so the CPU tests pin
the choices down.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from ..runtime.arrays import leading_dim, tma_addressable, transpose
from ..kernels.epilogue_config import EpilogueConfig
from ..kernels.gemm_config import ELEMENT_BYTES, FP8_DTYPES, KBLOCK_BYTES, KBLOCK_SCALE, GemmConfig
from ..runtime.launch import device_limits

__all__ = ["TILE_COST", "K_MAJOR_WIDTHS", "GROUPED_SLOW_WIDTHS", "SK_MIN_ITERS", "tile_shape", "small_m_tiling", "narrow_tokens", "swappable", "narrow_config", "promoted_tile", "stream_k_schedule",
           "cluster_pays", "GPC_MIN_K", "gpc_clusters_pay", "rows_straddle_sectors", "straddling_tile", "PINGPONG_TILE_COST", "PINGPONG_MAX_K_BLOCKS", "pingpong_width", "EPILOGUE_PINGPONG_WIDTH", "EPILOGUE_PINGPONG_TILE_COST", "epilogue_pingpong_pays", "SUSTAINED", "SUSTAINED_MIN_WAVES", "SUSTAINED_MIN_FILL", "SUSTAINED_GPC_COLUMNS", "sustained_clusters_pay", "choose_config", "grouped_config", "split_count", "max_stages"]

# Relative time per output column of a 128-row tile, up to and over MANY_WAVES waves (tile_shape):
# python benchmarks/bench_gemm.py --device-time --configs n112 n128 n144 n160 n192 n224 n256 --shapes 1792x1280x4096 \
#     1024x3584x3584:RC 1024x4608x3584:RC 512x3584x18944:RC 512x14336x4096:RC 8192x8192x28672:RC 16384x57344x8192:RC
MANY_WAVES = 16
TILE_COST = {256: 1.0, 224: 1.06, 192: 1.075, 160: 1.15, 144: 1.2, 128: 1.065, 112: 1.15, 64: 1.52}
TILE_COST_MANY_WAVES = {**TILE_COST, 224: 1.03, 192: 1.005, 144: 1.3, 128: 1.25, 112: 1.35}
K_MAJOR_WIDTHS = (224, 144, 112)
# Ping-pong tiles' relative time per column (pingpong_width):
# python benchmarks/bench_gemm.py --device-time --configs default n128-pp n176-pp --shapes 4096x4096x4096 \
#     4096x5632x2048 4096x4096x1024 1024x14336x4096:RC 512x10240x8192:RC
PINGPONG_TILE_COST = {176: 1.0, 128: 1.0}
PINGPONG_MAX_K_BLOCKS = 128
# Ping-pong tiles of unpromoted fp8 and fused 16-bit products (epilogue_pingpong_pays): their width,
# and their relative time per column against TILE_COST's cooperative tiles
# (benchmarks/results/fp8-fast-pingpong-h200.json, epilogue-pingpong-h200.json):
# python benchmarks/bench_fp8.py --accumulate fast --configs n128-pp n256 n192 --shapes 4096^3 8192^3 \
#     "dsv3 4096x7168x2048" "dsv3 4096x2112x7168" "dsv3 4096x24576x1536" "dsv3 4096x4096x7168" 4096x7168x16384
# python benchmarks/bench_epilogue.py --fusions bias+gelu_tanh --configs default n256 n192 n128 --shapes \
#     4096x4096x4096 8192x8192x8192 4096x5632x2048 8192x14336x4096
EPILOGUE_PINGPONG_WIDTH = 128
EPILOGUE_PINGPONG_TILE_COST = 0.98
# Widths grouped kernels skip (5-9% slower than 256): python benchmarks/bench_grouped.py --configs n192 n256 --device-time
GROUPED_SLOW_WIDTHS = (192,)
# Streaming rates of B (GB/s) per busy SM by width of 64-row tiles, and at most all together (small_m_tiling):
# python benchmarks/bench_gemm.py --shapes 1x3584x18944:RC 1x4096x14336:RC --configs m64-n64 m64-n128 m64-n256 --device-time
SMALL_M = 128
SM_STREAM_GBPS = {128: 58, 256: 85, 64: 34}  # in order of preference between equal estimates
HBM_STREAM_GBPS = 2600
# The fewest k-blocks a stream-K CTA gets (more CTAs would only add fix-ups).
SK_MIN_ITERS = 4


def _ceil(a, b):
    return -(-a // b)


def tile_shape(M, N, K, units, sms, fused=False, block_k=64, k_major_widths=False, grouped=False, a_lines=True):
    """``(block_m, block_n)``: the tile with the shortest estimated run.

    M <= SMALL_M: 64-row tiles (the width :func:`small_m_tiling` picks); at M = 128 two of
    them give twice the CTAs to a product that streams B (128x4096x4096: 0.95x cuBLAS with
    64x128 tiles, 0.92x with 128x64), unless a wave of 64 x 128 tiles leaves many SMs idle
    (``ROWS_TOGETHER_MAX_TILES``) and A's rows start on 128-byte lines (``a_lines``): then
    128 x 64 ones. Otherwise 128 rows, and the width of the fewest
    waves x width x tile cost: wave quantization decides. 1792x1280 takes 112 tiles of
    128x160 (one wave on 132 SMs) rather than 70 of 128x256 (one wave of slower tiles);
    8192^3 takes 128x192 (21 waves) over 128x256 (16 waves, fuller). Ties go to the wider
    tile. Up to ``MANY_WAVES`` waves a narrower tile pays for reading A from shared memory for
    fewer columns of MMA; over many, 128-wide tiles fall behind and 192-wide ones keep up with
    256-wide ones (``TILE_COST_MANY_WAVES``). 224-, 144- and 112-wide tiles fill a wave where N
    is a multiple of 7 x 512 or 9 x 512 (3584, 4608, 14336: Qwen, Mixtral), with a K-major B only
    (``K_MAJOR_WIDTHS``: an N-major B loads whole 64-wide boxes, 224 loads 256). A fused
    epilogue runs only widths 64 divides. ``k_major_widths``: whether ``K_MAJOR_WIDTHS`` may run. ``block_k``: elements per k-block (64, or 128 for unpromoted
    fp8 products, which take these tiles or :func:`epilogue_pingpong_pays`'s). ``grouped``: a grouped kernel's tile,
    never one of ``GROUPED_SLOW_WIDTHS``.
    """
    if M <= SMALL_M:
        block_n = small_m_tiling(M, N, K, units, sms, can_split=_splits_small_m(M, units, fused), block_k=block_k)[0]
        if a_lines and _rows_together(M, N, K, units, sms, fused, block_k, block_n):
            return 128, 64
        return 64, block_n

    widths = [bn for bn in sorted(TILE_COST, reverse=True)
              if not (fused and bn % 64) and (k_major_widths or bn not in K_MAJOR_WIDTHS)
              and not (grouped and bn in GROUPED_SLOW_WIDTHS)]
    return 128, min(widths, key=lambda bn: _tile_time(M, N, units, sms, bn))


def pingpong_width(M, N, k_blocks, units, sms, block_n, k_major_b):
    """The width of ping-pong tiles (``PINGPONG_TILE_COST``) for a plain 16-bit product whose
    cooperative tile is 128 x ``block_n``, or None: the fewest waves x width x cost, where that
    is no more than the cooperative tile's :func:`_tile_time`, with at least two tiles a CTA (a
    CTA's second tile hides its first's epilogue), at most ``MANY_WAVES`` waves (unmeasured
    beyond) and at most ``PINGPONG_MAX_K_BLOCKS`` k-blocks (the overlap pays where the epilogue
    is a noticeable part of a tile: over K of 18944-28672 ping-pong tiles measured 0.89-1.00x
    cuBLAS against 0.99-1.09x). 176 wide with a K-major B only (an N-major B loads whole 64-wide
    boxes); 160- and 192-wide ping-pong tiles measured slower than either."""
    best, best_time = None, _tile_time(M, N, units, sms, block_n)
    for bn, cost in PINGPONG_TILE_COST.items():
        tiles = units * _ceil(M, 128) * _ceil(N, bn)
        waves = _ceil(tiles, sms)
        if (bn % 64 and not k_major_b) or tiles < 2 * sms or waves > MANY_WAVES or k_blocks > PINGPONG_MAX_K_BLOCKS:
            continue
        time = waves * bn * cost
        if time < best_time or (best is None and time == best_time):  # a tie with the cooperative tile: ping-pong
            best, best_time = bn, time
    return best


def epilogue_pingpong_pays(M, N, units, sms, block_n):
    """Whether an unpromoted fp8 product (``use_fast_accum=True``) or a fused 16-bit one, without C,
    whose cooperative tile is 128 x ``block_n`` takes 128 x ``EPILOGUE_PINGPONG_WIDTH`` ping-pong
    tiles: where they give each CTA two tiles or more and their waves x width x
    ``EPILOGUE_PINGPONG_TILE_COST`` is at most the cooperative tile's :func:`_tile_time`. In the
    cooperative kernel the tensor cores idle while both consumers store a tile; ping-pong runs one
    consumer's epilogue under the other's main loop (as CUTLASS's
    ``KernelTmaWarpSpecializedPingpongFP8FastAccum``, PyTorch's row-wise fp8 kernel, does). That
    pays most where the epilogue is a large share of a tile's run: an fp8 k-block takes half a
    16-bit one's time, and a fused epilogue computes on every element. Measured on the H200
    against the cooperative tile: fp8 per-tensor / row-wise +5 / +9% at 4096^3, +1 / +4% at
    8192^3, +14 / +20% at 4096x7168x2048, +20 / +29% at 4096x24576x1536, and -9 / -8% at
    4096x2112x7168, whose 128-wide tiles take 4.1 waves against 2.7 of 192-wide ones (the
    estimate keeps the cooperative tile there); bf16 with a bias and gelu_tanh, 5% less time at
    4096^3 and 8192^3, 14% at 4096x5632x2048, 7% at 8192x14336x4096: the fused product at
    0.95-1.00x the plain one's time, against 1.03-1.08x in the cooperative tiles."""
    tiles = units * _ceil(M, 128) * _ceil(N, EPILOGUE_PINGPONG_WIDTH)
    pingpong = _ceil(tiles, sms) * EPILOGUE_PINGPONG_WIDTH * EPILOGUE_PINGPONG_TILE_COST
    return tiles >= 2 * sms and pingpong <= _tile_time(M, N, units, sms, block_n)


def _tile_time(M, N, units, sms, bn):
    """Estimated run time of ``units`` products of M x N in 128 x ``bn`` tiles: waves x width x
    the width's cost per column."""
    waves = _ceil(units * _ceil(M, 128) * _ceil(N, bn), sms)
    return waves * bn * (TILE_COST_MANY_WAVES if waves > MANY_WAVES else TILE_COST)[bn]


# Decode products of at most NARROW_M rows (tokens) run swapped (narrow_tokens), with an
# accumulator per wgmma of a k-block and a ring of NARROW_STAGES:
# python benchmarks/bench_gemm.py --shapes 8x2048x5632:RC 16x4096x14336:RC --configs default m64-n8-swap-a4-p12 m64-n16-swap-a1 --device-time
NARROW_M = 16
NARROW_ACC_CHAINS = 4
NARROW_STAGES = 12


def narrow_tokens(M, N, K, sms, block_k=64):
    """``block_n`` (8 or 16) of a plain product of M <= NARROW_M rows computed swapped,
    ``out.T = b.T @ a.T``: the weight's rows on the 64-row side and the tokens on wgmma's
    narrow N, so a k-block moves 64 x 8 or 64 x 16 of A through TMA and wgmma instead of 64
    x 64 (mostly zero-filled rows), as cuBLAS's decode kernels do. Measured on the H100: 9-18%
    less device time than 64 x 64 tiles at 8-16 x 2048-5632 x 2048-5632, 8% less than 64 x 128
    tiles at 1x6144x4096 and 16x57344x8192; at M = 32 the swapped 64 x 16 tiles lose (0.86x vs
    1.02x cuBLAS). The swapped kernel has no K slices, and one launch streams K as fast as the
    64-row tiling's two slices and their reduce: 4-24% less time at six of seven such shapes
    (8x2048x8192, 16x3584x18944; 4% more at 16x5120x13824). None where that tiling takes four
    slices (8x2048x16384: 2% more time swapped). The short 64 x 8 and 64 x 16 wgmmas, chained on
    one accumulator, each wait for the last: four accumulators (``NARROW_ACC_CHAINS``) took 1-8%
    less device time. A ring of ``NARROW_STAGES`` rather than the 21-23 k-blocks that fit ran
    0.4-7% faster (every slot holds a load in flight either way); 8 lost at long K.
    """
    if M > NARROW_M:
        return None
    if small_m_tiling(M, N, K, 1, sms, can_split=_splits_small_m(M, 1, False), block_k=block_k)[1] > 2:
        return None
    return 8 if M <= 8 else 16


def swappable(va, vb, vo):
    """Whether a plain product ``vo = va @ vb`` can run swapped, as a column-major kernel:
    16-bit, with the tokens (``va``) and the output row-major and TMA-addressable (the kernel
    reads ``va`` as its K-major B and stores the output without a copy)."""
    return (va.dtype in ("bf16", "f16") and vb.dtype == va.dtype and vo.dtype in ("bf16", "f16")
            and tma_addressable(va, row_major=True) and tma_addressable(vo, row_major=True))


def narrow_config(va, vb, vo, limits):
    """The column-major kernel of a plain product ``vo = va @ vb`` computed swapped, where it
    is :func:`swappable` and :func:`narrow_tokens` takes it, or None. (The caller checks that
    the call has no epilogue or config.)"""
    if not swappable(va, vb, vo):
        return None
    (M, K), N = va.shape, vb.shape[1]
    block_n = narrow_tokens(M, N, K, limits.sm_count)
    if block_n is None:
        return None
    kw = dict(block_m=64, b_major="K", out_major="M", acc_chains=NARROW_ACC_CHAINS)
    stages = min(NARROW_STAGES, max_stages(va.dtype, vo.dtype, block_n, limits.max_shared_per_block_optin, **kw))
    return GemmConfig(block_n=block_n, stages=stages, **kw)


# Where 128 x 64 tiles replace 64 x 128 ones at M = 112-128 (_rows_together):
# python benchmarks/bench_gemm.py --shapes 128x4608x3584 128x6144x4096 --configs default m64-n128 m128-n64 --device-time
ROWS_TOGETHER_MAX_TILES = 80
ROWS_TOGETHER_MIN_K = 3072


def _rows_together(M, N, K, units, sms, fused, block_k, block_n):
    """Whether the 64 x 128 tiles of a product at M = 112-128 give way to 128 x 64 ones: where one
    wave of them leaves a third of the SMs or more idle, each busy SM's streaming rate bounds the
    product, and a 128 x 64 tile (the two row tiles' consumers in one CTA, A read once per column
    of B) streams faster, from K = ``ROWS_TOGETHER_MIN_K`` on (measured +0.7 to +10% at 68-80
    tiles, -3% at 96), unless A's rows straddle 128-byte lines (each CTA then reads all of them)."""
    return (M >= SMALL_M - 16 and units == 1 and not fused and block_k == 64 and block_n == 128
            and K >= ROWS_TOGETHER_MIN_K and 2 * _ceil(N, 128) <= min(ROWS_TOGETHER_MAX_TILES, sms))


def _splits_small_m(M, units, fused):
    """Whether a 64-row tiling may split K: a single product (batches do not split) with no
    fused epilogue, and M <= 64, whose fp32 partials are a few rows."""
    return M <= 64 and units == 1 and not fused


def small_m_tiling(M, N, K, units, sms, can_split, block_k=64):
    """``(block_n, K slices)`` of 64-row tiles with the shortest estimated streaming time.

    Each wave of work units (tiles x slices) streams its share of B at its SMs' rate, capped
    by HBM's rate times the tiles that share each column of B (from L2); a partial last wave
    of few units runs at their own rate. So at M = 128 the wave-filling 64 x 64 tiles win
    where the cap made 64 x 128 ones tie (128x4096x4096: 0.99x cuBLAS vs 0.92x). Slices (2
    or 4, >= 64 k-blocks each) add units when ``can_split``. Within 1%, the first width of
    ``SM_STREAM_GBPS`` and fewer slices win: 1x4096x14336 takes 64x128 tiles in two slices
    (0.91x cuBLAS; unsplit 64x64: 0.72x), 1x3584x3584 takes 64x64 tiles (56 busy SMs stream
    faster than 28 of 64x128), 128x10240x8192 64x256 (80 tiles, where 160 of 64x128 leave a
    wave of 28: 0.94x vs 0.77x). ``block_k``: elements per k-block (128 bytes of K).
    """
    k_blocks = _ceil(K, block_k)
    # The row tiles of one column of B (M = 128: two) read it together, so DRAM serves it once
    # and L2 the rest: HBM caps the rate of the unique bytes.
    hbm_share = HBM_STREAM_GBPS * _ceil(M, 64)
    best, best_time = None, float("inf")
    for bn, per_sm in SM_STREAM_GBPS.items():
        tiles = units * _ceil(M, 64) * _ceil(N, bn)
        for slices in (1, 2, 4) if can_split else (1,):
            if slices > 1 and k_blocks < 64 * slices:
                break
            work, unit_bytes = tiles * slices, bn / slices  # bytes in units of K x 2 (one tile-row of B)
            full, last = divmod(work, sms)
            time = sum(n * unit_bytes / min(hbm_share, n * per_sm) for n in (sms,) * full + (last,) if n)
            if time < 0.99 * best_time:
                best, best_time = (bn, slices), time
    return best


# Block-wise scaled fp8 tiles' relative time (promoted_tile), paired, unpaired and from LONG_K_BLOCKS on:
# python benchmarks/bench_fp8.py --scalings blockwise --device-time --configs m128-n128-p5 m128-n64-p7 m64-n128-p8 \
#     m128-n192-p4 m128-n256-p4 m192-n128-p4
BLOCK_SCALED_TILE_COST = {(128, 256): 1.96, (192, 128): 1.44, (128, 128): 1.0, (128, 64): 0.75, (64, 128): 0.67,
                          (128, 192): 1.47}
UNPAIRED_BLOCK_SCALED_TILE_COST = {(128, 256): 1.74, (192, 128): 1.23, (128, 128): 1.0, (128, 64): 0.7,
                                   (64, 128): 0.8, (128, 192): 1.34}
LONG_K_BLOCKS = 48
LONG_K_BLOCK_SCALED_TILE_COST = {**BLOCK_SCALED_TILE_COST, (128, 256): 2.06}
# Output buffers per consumer of a paired 128 x 128 block-scaled tile (one buys the ring a sixth slot beside
# A's scales): python benchmarks/bench_fp8.py --scalings blockwise --device-time --configs m128-n128-e1-p6 m128-n128-e2-p5
# Without the scales the ring has six slots either way, and two buffers ran -1 to +4% against one (mean +1%):
# benchmarks/results/fp8-promoted-tiles-h200.json.
PAIRED_TILE_EPI_BUFFERS = 1
# Without block-wise scales (per-tensor and row-wise promotion) a 128 x 256 tile costs 2.04-2.10 paired
# 128 x 128 ones at 16-64 k-blocks (fp8-promoted-tiles-h200.json, its commands; 8192^3: python
# benchmarks/bench_fp8.py --scalings tensor --accumulate promoted --shapes 8192^3 --configs m128-n128 m128-n256).
UNSCALED_WIDE_TILE_COST = 2.08
# A 192 x 128 tile costs 1.45-1.46 of them without the scales too (8192^3, 4096x2112x7168:
# fp8-promoted-tiles-h200.json, tall_tiles), BLOCK_SCALED_TILE_COST's 1.44.


def promoted_tile(M, N, K, sms, units=1, wide=True, tall=False, paired=True, block_scales=True):
    """``(block_m, block_n)`` of ``units`` promoted fp8 products of M x N x K (block-wise scaled
    unless ``block_scales`` is False): the fewest
    waves x tile cost (ties to the first, the largest tile). ``wide``: whether tiles over 128
    wide may run (not with column vectors in the epilogue, nor in grouped products); ``tall``:
    whether 192-row ones may (a 16- or 32-bit output, and no epilogue term but alpha or, without
    block-wise scales, the row and column scales);
    ``paired``: whether tiles of at most 128 x 128 promote k-blocks in pairs
    (``GemmConfig.promotes_in_pairs``). Per FLOP the three largest tiles cost about the same, so
    the fewest waves win; a 64-row tile (one consumer) costs 1.34x a 128 x 128 one per FLOP and
    wins only a wave; unpaired, its one consumer idles the tensor cores while it promotes.
    Against paired 128 x 128 tiles a 128 x 256 one costs more the longer K runs (1.83-1.93 at 16
    k-blocks, 2.0-2.06 from 56 on): ``LONG_K_BLOCK_SCALED_TILE_COST``; without ``block_scales``
    (per-tensor and row-wise promotion, no scale loads in the pairs) ``UNSCALED_WIDE_TILE_COST``."""
    long_k = _ceil(K, KBLOCK_SCALE) >= LONG_K_BLOCKS
    costs = (LONG_K_BLOCK_SCALED_TILE_COST if long_k else BLOCK_SCALED_TILE_COST) if paired else \
        UNPAIRED_BLOCK_SCALED_TILE_COST
    if paired and not block_scales:
        costs = {**costs, (128, 256): UNSCALED_WIDE_TILE_COST}

    def estimate(tile):
        return _ceil(units * _ceil(M, tile[0]) * _ceil(N, tile[1]), sms) * costs[tile]

    return min((t for t in costs if (wide or t[1] <= 128) and (tall or t[0] <= 128)), key=estimate)


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
    Measured on the H100: +4.5% at 16384x4096x4096 (15.5 tiles per CTA), even at 8192^3, but
    -2.5% at 4096^3 (3.9), -5% at 6144^3 (8.7), -3% at 8192x8192x1024, -10% at 4096x4096x512.
    With B stored (N, K) (``x @ W.T``) it lost on every large shape of ``bench_sweep.py``:
    0.75x vs 0.98x cuBLAS at 8192x8192x28672, 0.77x vs 0.99x at 16384x57344x8192.
    """
    return b_major == "N" and tiles >= 12 * sms and K >= 2048


# The shortest K loop of GPC-ordered 1x2 clusters (gpc_clusters_pay):
# python benchmarks/bench_gemm.py --shapes 512x3584x18944:RC 512x4096x14336:RC --configs default n112-1x2-gpc n128-1x2-gpc --device-time
GPC_MIN_K = 8192


def gpc_clusters_pay(tiles_m, tiles_n, K, block_n, sms):
    """Whether a plain 16-bit product's 128-row tiles run faster in GPC-ordered 1x2 clusters
    (the two CTAs of a tile row share its A tile through multicast, and the clusters of a GPC
    take neighbouring cluster tiles, whose B reads the L2 request coalescer merges): tiles
    under 128 wide whose cluster tiles fill one wave of 2-CTA clusters at least three quarters
    full, over a K of at least ``GPC_MIN_K``. The cluster halves the loads of A, which dominate
    only in tiles narrower than tall (measured 128 x 112 at 512x3584x18944: 0.90 -> 0.96x cuBLAS;
    128 x 128 at 512x4096x14336: 0.98 -> 0.96x); over several waves they gained nothing."""
    slots = tiles_m * _ceil(tiles_n, 2)
    return block_n < 128 and tiles_n >= 2 and 3 * (sms // 2) <= 4 * slots <= 4 * (sms // 2) and K >= GPC_MIN_K


def rows_straddle_sectors(v, row_major):
    """Whether TMA reads ``v`` (row-major, or its transpose) in rows that start 16 bytes into a
    32-byte sector: a leading dimension of 16 (mod 32) bytes, as 1000, 3000 or 5000 bf16 columns.
    Such operands load at about half the rate (3000^3: 0.63x cuBLAS, 5000^3: 0.51x), where
    pitches of 32, 64 or 96 (mod 128) bytes cost nothing (2000^3, 4000^3, 6000^3: 0.96x)."""
    w = v if row_major else transpose(v)
    return w.shape[0] > 1 and leading_dim(w) * v.itemsize % 32 != 0


# The time of a clustered 192 x 192 tile in 128 x 128 ones, where both operands' rows straddle sectors:
# python benchmarks/bench_gemm.py --shapes 3000x3000x3000 7000x7000x7000 --configs 2x2-m128-n128 1x2-m192-n192-e1 --device-time
STRADDLING_192_COST = 1.97


def straddling_tile(M, N, units, sms, a_straddles, b_straddles, a_major="K", b_major="N", plain=False):
    """The clustered tile (``GemmConfig`` fields) of 16-bit products whose operand rows straddle
    sectors (:func:`rows_straddle_sectors`), or None. Multicast halves each CTA's loads of the
    operand its cluster shares (measured on the H100, device time against cuBLAS):

    - both: a 2x2 cluster of 128 x 128 tiles, each CTA loading half of its A and of its B tile
      (3000^3 0.64 -> 0.90x, 5000^3 0.51 -> 0.90x, 512x3000x3000 ``x @ W.T`` 0.71 -> 1.17x;
      2x1 and 1x2 clusters, halving one operand's loads, 0.65-0.88x); or, for a plain product
      whose 192 x 192 tiles take fewer waves x ``STRADDLING_192_COST`` than these take waves,
      192 x 192 tiles with one output buffer per consumer (a fourth ring slot) in a 1x2 or 2x1
      cluster, whichever pads the grid to fewer waves (8192x5000x5000: 2x1 9 waves 0.96-0.98x,
      1x2 10 waves 0.87x). A column-major A's 192-row boxes do not split over a 1x2 cluster, nor
      a row-major B's 192-column ones over a 2x1;
    - B's alone: a 2x1 cluster sharing B, 256 or 128 wide by wave quantization (4096x1000x4096
      0.77 -> 0.99x, 8192x3000x4096 0.86 -> 1.07x, 2048x1000x4096 0.72 -> 0.86x in 128-wide tiles);
    - A's alone: none (4096x4096x3000 ran at 0.99x unclustered).

    None where the 128 x 128 tiles would be few enough for :func:`split_count` to split K.
    """
    if 4 * units * _ceil(M, 128) * _ceil(N, 128) <= sms or not b_straddles:
        return None
    if a_straddles:
        def waves(tile, cluster):  # a cluster's CTAs all take a tile slot, with a tile or not
            slots = (c * _ceil(_ceil(n, tile), c) for n, c in zip((M, N), cluster))
            return _ceil(units * math.prod(slots), sms)

        clusters = [c for c, fits in (((1, 2), a_major == "K"), ((2, 1), b_major == "K")) if fits]
        if plain and clusters:
            cluster = min(clusters, key=lambda c: waves(192, c))  # (1x2 on a tie)
            if waves(192, cluster) * STRADDLING_192_COST < waves(128, (2, 2)):
                return dict(block_m=192, block_n=192, cluster_m=cluster[0], cluster_n=cluster[1], epi_buffers=1)
        return dict(block_m=128, block_n=128, cluster_m=2, cluster_n=2)
    return dict(block_m=128, block_n=min((256, 128), key=lambda bn: _tile_time(M, N, units, sms, bn)), cluster_m=2)


@functools.lru_cache(maxsize=1024)  # (pure; asked the same by every plan, and ~10^5 times by tools.prebuild's walk)
def max_stages(in_dtype="bf16", out_dtype="bf16", block_n=256, shared_limit=227 * 1024, **kw):
    """The deepest ring of a :class:`GemmConfig` (``kw``: its other fields) that fits in
    ``shared_limit`` bytes of shared memory."""
    stages = 2
    while GemmConfig(in_dtype, out_dtype, block_n=block_n, stages=stages + 1, **kw).shared_bytes <= shared_limit:
        stages += 1
    return stages


def _tiling(va, vb, vo, a_major, b_major, epilogue, promoted, block_scaled, units, limits, sustained=False):
    """:func:`choose_config`'s default tiling (a :class:`GemmConfig` of tile and cluster) of an
    ungated product; ``promoted``: fp8 two-level accumulation (``block_scaled`` or not), whose
    tiles :func:`promoted_tile` chooses; ``sustained``: :func:`sustained_clusters_pay`'s."""
    M, N = vo.shape
    plain_16bit = epilogue is None and va.itemsize == 2 and vo.itemsize > 1  # what K_MAJOR_WIDTHS ran
    if promoted:
        terms = epilogue or EpilogueConfig()
        paired = terms.scale_only  # (GemmConfig.promotes_in_pairs)
        tall = (not terms.fuses_more if block_scaled else terms.scale_only) and ELEMENT_BYTES[vo.dtype] > 1
        block_m, block_n = promoted_tile(M, N, va.shape[1], limits.sm_count, wide=not terms.column_bytes(192),
                                         tall=tall, paired=paired, block_scales=block_scaled)
        if paired and block_scaled and (block_m, block_n) == (128, 128):
            return GemmConfig(block_m=block_m, block_n=block_n, epi_buffers=PAIRED_TILE_EPI_BUFFERS)
    else:
        a_row_bytes = leading_dim(va if a_major == "K" else transpose(va)) * va.itemsize
        block_m, block_n = tile_shape(M, N, va.shape[1], units, limits.sm_count, fused=epilogue is not None,
                                      block_k=KBLOCK_BYTES // va.itemsize,
                                      k_major_widths=b_major == "K" and plain_16bit, a_lines=a_row_bytes % 128 == 0)
    base = GemmConfig(block_m=block_m, block_n=block_n)
    tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
    if block_m == 128 and block_n == 256 and tiles_n >= 2 and cluster_pays(units * tiles_m * tiles_n, va.shape[1], b_major, limits.sm_count):
        base = dataclasses.replace(base, cluster_n=2)
    plain_16bit_out = epilogue is None and va.itemsize == 2 and ELEMENT_BYTES[vo.dtype] == 2
    if block_m == 128 and plain_16bit_out and gpc_clusters_pay(units * tiles_m, tiles_n, va.shape[1], block_n, limits.sm_count):
        base = dataclasses.replace(base, cluster_n=2, cluster_order="gpc")
    straddling = block_m == 128 and M > SMALL_M and va.itemsize == 2 and straddling_tile(  # 16-bit: where it was measured
        M, N, units, limits.sm_count, rows_straddle_sectors(va, a_major == "K"), rows_straddle_sectors(vb, b_major == "N"),
        a_major, b_major, plain=plain_16bit_out)
    if straddling:
        base = GemmConfig(a_major=a_major, b_major=b_major, **straddling)
    elif block_m == 128 and plain_16bit and base.cluster_size == 1:
        width = pingpong_width(M, N, _ceil(va.shape[1], KBLOCK_BYTES // va.itemsize), units, limits.sm_count, block_n,
                               b_major == "K")
        if width:
            base = GemmConfig(block_n=width, pingpong=True)
    elif block_m == 128 and (va.itemsize == 1 or epilogue is not None) and not promoted and base.cluster_size == 1 \
            and not (epilogue and (epilogue.c_dtype or epilogue.glu)) \
            and epilogue_pingpong_pays(M, N, units, limits.sm_count, block_n):
        base = GemmConfig(block_n=EPILOGUE_PINGPONG_WIDTH, pingpong=True)
    if sustained and plain_16bit_out and not straddling and base.block_m == 128 and base.cluster_order == "launch" \
            and sustained_clusters_pay(M, N, a_major, b_major, base.pingpong, units, limits.sm_count):
        if dynamic_schedule_pays(M, N, units, limits.sm_count):
            base = GemmConfig(block_m=128, block_n=256, cluster_m=2, dynamic_schedule=True)
        else:
            base = GemmConfig(block_m=128, block_n=256, cluster_m=2, cluster_order="gpc", group_n=SUSTAINED_GPC_COLUMNS)
    return base


# ``gemm(config=SUSTAINED)``: the default's choice for products run back to back at the power limit.
SUSTAINED = "sustained"
# 2x1 clusters under sustained load: from two waves of them (under two, 1.9 waves ran as the
# default), that keep at least this fraction of their slots busy (waves over whole waves). The
# idle slots of a last wave cost time that the clusters' saved energy does not buy back: at 2.4
# waves (81% busy) they ran 7-8% slower than ping-pong tiles, at 2.7 (89%) 4-5% faster
# (benchmarks/results/sustained-fill-h200.json).
SUSTAINED_MIN_WAVES = 2
SUSTAINED_MIN_FILL = 0.85
# The training tiles' static walk: 2x1 clusters in GPC order over the raster walked row by row in
# groups of this many cluster-tile columns, about a GPC's clusters (8-9 on an H100 or H200), so that
# the clusters of a GPC share A's row panel and the L2 request coalescer merges their reads of it
# (kernels/scheduler.py). At the power limit the training steps' products in these tiles ran 1.2%
# faster by mean than in launch order, 11 of 13 faster (benchmarks/results/sustained-rows-h200.json).
SUSTAINED_GPC_COLUMNS = 8


def sustained_clusters_pay(M, N, a_major, b_major, pingpong, units, sms):
    """Whether a plain 16-bit product run back to back at the board's power limit (a training
    step: ``gemm(config="sustained")``) takes 128 x 256 tiles in 2x1 clusters in place of the
    burst-tuned default's 128-row tiles (``pingpong``: the default's are ping-pong tiles): at
    least ``SUSTAINED_MIN_WAVES`` waves of clusters that keep at least ``SUSTAINED_MIN_FILL`` of
    their slots busy, in place of ping-pong tiles in any layout, of any other 128-row tile
    (unclustered, or 1x2 clusters in launch order) in a forward (``x @ W.T``: both operands
    K-major) or weight-gradient (``dY.T @ X``: A M-major, B N-major) product. The cluster
    multicasts each B tile to its two CTAs, which halves B's reads from the L2 and the energy
    they cost; at the power limit energy is clock. In place of ping-pong tiles, which read the
    most from the L2 per FLOP, forward, ``dX`` and weight-gradient products ran 0.5-5% faster
    (``benchmarks/results/sustained-fill-h200.json``); in place of the others, forward and
    weight-gradient products 1-4% faster (``sustained-h200.json``, ``sustained-2x1-h200.json``),
    ``dX`` ones from 0.7% slower to 2% faster (those and ``sustained-fill-h200.json``), so those
    keep theirs. In bursts forward and weight-gradient products ran 1-4% slower in them."""
    slots = units * 2 * _ceil(M, 256) * _ceil(N, 256)  # (a cluster takes two tile slots, with two tiles or one)
    waves = slots / sms
    forward_or_dw = (a_major, b_major) in (("K", "K"), ("M", "N"))
    return (pingpong or forward_or_dw) and waves >= SUSTAINED_MIN_WAVES and \
        waves / math.ceil(waves) >= SUSTAINED_MIN_FILL


# Waves of 2x1 clusters from which the training tiles take their tiles dynamically: the output
# layer's products (90-288 waves at 8192 tokens) ran 0.9-2.1% faster so, MLP products of 6-27
# waves within 0.6% either way (benchmarks/results/sustained-dynamic-h200.json).
DYNAMIC_MIN_WAVES = 48


def dynamic_schedule_pays(M, N, units, sms):
    """Whether the training tiles' 2x1 clusters of 128 x 256 tiles take each tile after the
    first wave off a counter (``GemmConfig.dynamic_schedule``) rather than every clusters-th
    one: over ``DYNAMIC_MIN_WAVES`` waves or more the static walk's CTAs drift apart, the tiles
    in flight spread over the raster, and the shared operand panels are read from DRAM again
    (1.5-2.4x the bytes at the output layer's products, ``gemm-traffic-h200.json``); at the
    power limit those reads are clock."""
    return units * _ceil(M, 256) * _ceil(N, 256) >= DYNAMIC_MIN_WAVES * (sms // 2)


def gated_tile(M, N, K, units, sms):
    """The tile of a gated product (``gemm(..., up=)``): :func:`tile_shape`'s rows for its kernel's
    2N columns (B's and B_up's), 256 columns wide on 128-row tiles (a 128 x 128 output tile, as a
    fused 128 x 256 product's), else 128."""
    block_m, _ = tile_shape(M, 2 * N, K, units, sms, fused=True)
    return GemmConfig(block_m=block_m, block_n=256 if block_m == 128 else 128)


def choose_config(va, vb, vo, config, debug, epilogue=None, units=1, limits=None, block_scaled=False, gated=False,
                  promoted=False, sustained=False):
    """The kernel for these operands: ``config``'s tiling, or the default heuristic's, with
    the call's fused ``epilogue`` and mainloop features (``promoted``: fp8 two-level
    accumulation; ``block_scaled``: fp8 block-wise scales, promoted; ``gated``: a second B, ``up``).

    Default: the tile :func:`tile_shape` picks for ``units`` products, the deepest ring
    that fits, and a 1x2 cluster of 128x256 tiles where :func:`cluster_pays`, or of narrower
    tiles in GPC order where :func:`gpc_clusters_pay`; else, for a plain 16-bit product,
    ping-pong tiles where :func:`pingpong_width` takes them, for an unpromoted fp8 or a fused
    16-bit one without C where :func:`epilogue_pingpong_pays`; :func:`promoted_tile`'s and
    :func:`gated_tile`'s for those features. ``sustained``: the tiles of products run back to back at the
    power limit (:func:`sustained_clusters_pay`). ``limits``: the device's
    :class:`~numba_hopper.runtime.launch.DeviceLimits` (None: ask the driver about ``vo``'s device).
    """
    promoted = promoted or block_scaled
    if (block_scaled or gated) and epilogue is None:  # (as GemmConfig has it)
        epilogue = EpilogueConfig()
    # fp8 operands are K-major (the caller checked): a (1, K) or (K, 1) view would pass both tests.
    fp8 = va.dtype in FP8_DTYPES
    a_major = "K" if fp8 or tma_addressable(va, row_major=True) else "M"
    # (a column-major output's narrow B is the tokens, K-major: a (K, 1) view passes both tests)
    narrow = config is not None and config.out_major == "M"
    # (gated: B and B_up column-major, the caller checked)
    b_major = "N" if not (fp8 or narrow or gated) and tma_addressable(vb, row_major=True) else "K"
    limits = limits or device_limits(vo.device)
    if config is None:
        M, N = vo.shape
        if gated:
            base = gated_tile(M, N, va.shape[1], units, limits.sm_count)
        else:
            base = _tiling(va, vb, vo, a_major, b_major, epilogue, promoted, block_scaled, units, limits, sustained)
        stages = max_stages(va.dtype, vo.dtype, base.block_n, limits.max_shared_per_block_optin,
                            a_major=a_major, b_major=b_major, block_m=base.block_m, epi_buffers=base.epi_buffers,
                            epilogue=epilogue, promoted=promoted, block_scaled=block_scaled, gated=gated)
    else:
        base, stages = config, config.stages
    cfg = dataclasses.replace(base, in_dtype=va.dtype, b_dtype=vb.dtype if vb.dtype != va.dtype else None,
                              out_dtype=vo.dtype, a_major=a_major, b_major=b_major, stages=stages, debug=debug,
                              epilogue=epilogue, promoted=promoted, block_scaled=block_scaled, gated=gated)
    if cfg.shared_bytes > limits.max_shared_per_block_optin:
        raise ValueError(f"config needs {cfg.shared_bytes} bytes of shared memory with these operands, more than "
                         f"the device's {limits.max_shared_per_block_optin}: give it fewer stages")
    return cfg


def grouped_config(ma, mb, mo, mode, groups, config, debug, epilogue=None, limits=None, block_scaled=False,
                   promoted=False):
    """The kernel of a grouped GEMM (:func:`choose_config`'s, with ``grouped=mode``).

    The group sizes are on the device, so the tile is chosen for their mean (contiguous:
    ``rows / groups``) or their bound (masked: M per group) as :func:`tile_shape` chooses
    it for ``groups`` products of that many rows: 64-row tiles for groups of <= 128 rows,
    where a 128-row tile would be mostly padding. Promoted fp8 groups (block-wise scaled or not) take
    :func:`promoted_tile`'s (at most 128 wide: 192-wide grouped tiles are unmeasured)
    for ``groups`` such products. 16-bit groups never take ``GROUPED_SLOW_WIDTHS`` (H100 timings).
    """
    limits = limits or device_limits(mo.device)
    promoted = promoted or block_scaled
    if config is None:
        M, N = mo.shape
        rows = M if mode == "masked" else max(1, _ceil(M, groups))
        if promoted:
            block_m, block_n = promoted_tile(rows, N, ma.shape[1], limits.sm_count, units=groups, wide=False, paired=False)
        else:
            block_m, block_n = tile_shape(rows, N, ma.shape[1], groups, limits.sm_count, fused=epilogue is not None,
                                          block_k=KBLOCK_BYTES // ma.itemsize, grouped=True)
        # fp8 B is K-major (the caller checked): a (1, K) or (K, 1) view would pass both tests.
        b_major = "N" if ma.dtype not in FP8_DTYPES and tma_addressable(mb, row_major=True) else "K"
        config = GemmConfig(block_m=block_m, block_n=block_n, stages=max_stages(
            ma.dtype, mo.dtype, block_n, limits.max_shared_per_block_optin, a_major="K", b_major=b_major,
            block_m=block_m, epilogue=epilogue, promoted=promoted, block_scaled=block_scaled))
    cfg = choose_config(ma, mb, mo, config, debug, epilogue, limits=limits, block_scaled=block_scaled,
                        promoted=promoted)
    return dataclasses.replace(cfg, grouped=mode)


def split_count(cfg, M, N, K, sms):
    """K slices for a product with too few output tiles to fill the GPU (1: no split).

    Each slice writes fp32 partials that a second kernel sums in a fixed order, so the
    result is deterministic. 64-row tiles (M <= SMALL_M) split as :func:`small_m_tiling`
    estimates. Otherwise the workspace round
    trip and the second launch cost more than idle SMs unless most SMs would idle and K is
    long: measured, two slices lost at 1024^3 (0.47x vs 0.67x cuBLAS),
    and at 64x4096x4096 with 128x64 tiles (64 tiles on 132 SMs; 0.52x vs 0.61x). So: at most
    a quarter of the SMs busy, >= 128 k-blocks, >= 32 per slice.
    """
    if cfg.block_m == 64 and M <= SMALL_M:
        block_n, slices = small_m_tiling(M, N, K, 1, sms, can_split=_splits_small_m(M, 1, False),
                                         block_k=cfg.block_k)
        return slices if block_n == cfg.block_n else 1
    tiles = _ceil(M, cfg.block_m) * _ceil(N, cfg.block_n)
    k_blocks = _ceil(K, cfg.block_k)
    if 4 * tiles > sms or k_blocks < 128:
        return 1
    return max(1, min(sms // tiles, k_blocks // 32, 16))
