"""The GEMM kernel's interface: its compile-time configuration, its shared-memory layout and
its run-time parameters.

- :class:`GemmConfig`: what a kernel is compiled for. The problem (dtypes, operand majors),
  the tiling (tile, ring depth, cluster, raster group) and the features compiled in: the
  mainloop's (fp8 block-wise scales, a gated second B), the scheduler's (stream-K, grouping)
  and the fused epilogue (:class:`~.epilogue_config.EpilogueConfig`).
- :class:`SharedLayout`: where each buffer sits in the kernel's dynamic shared memory.
- :class:`GemmParams`: the kernel's run-time arguments, one named record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from ..kit.barriers import NamedBarriers
from ..kit.layouts import EVICTION_PRIORITIES, OperandLayout, operand_layout, tma_box
from ..kit.pipeline import pipeline_barrier_bytes
from .epilogue_config import EpilogueConfig

__all__ = ["GemmConfig", "SharedLayout", "GemmParams", "Consumer", "BarrierIds", "WG_ROWS", "KBLOCK_BYTES",
           "KBLOCK_SCALE", "ACC_CHAINS", "EPI_ROWS", "EPI_BUF_BYTES", "ELEMENT_BYTES", "INPUT_BYTES", "FP8_DTYPES", "GROUPED_MODES",
           "CLUSTER_ORDERS", "PINGPONG_MAX_BLOCK_N", "TALL_MAX_BLOCK_N", "GATED_NS", "TILE_ID_SLOTS",
           "TILE_ID_RING_BYTES", "MAX_K_SEGMENTS"]

WG_ROWS = 64  # rows of one wgmma (M): a consumer warpgroup's 64-row block of the output tile
KBLOCK_BYTES = 128  # a k-block is one 128-byte swizzle row along K: 64 16-bit or 128 fp8 elements
ACC_CHAINS = 4  # wgmmas per k-block (k16 on 64 16-bit elements, k32 on 128 fp8 ones)
KBLOCK_SCALE = 128  # block-wise fp8 scales: one per 128 K (one fp8 k-block) and per 128 rows of B
EPI_ROWS = 64
EPI_BUF_BYTES = EPI_ROWS * 128  # one 128-byte-wide swizzled sub-tile
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "e4m3": 1, "e5m2": 1}  # outputs (and C, aux)
INPUT_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1, "e5m2": 1}
FP8_DTYPES = ("e4m3", "e5m2")
GROUPED_MODES = ("contiguous", "masked")
CLUSTER_ORDERS = ("launch", "gpc")
BLOCK_MS = (64, 128, 192, 256)
# 256-row tiles: two consumers of 128 rows, each issuing two 64-row wgmmas per k-step (cuBLAS's
# 256 x 128 "coopA" tiles); their accumulators, two 64 x block_n, fit up to 128 columns.
TALL_MAX_BLOCK_N = 128
BLOCK_NS = (8, 16, 32, 64, 112, 128, 144, 160, 176, 192, 224, 256)
NARROW_NS = (8, 16)  # tiles of column-major outputs (``out_major="M"``): a decode product's tokens
STREAM_K_MAX_BLOCK_N = 192
# k-blocks a lone promoting consumer runs between drains (GemmConfig.promotion_run). At 128x7168x16384
# per-tensor, runs of 4 and 8 ran 1.11x and 1.14x pairs, and runs of 16 1.017x runs of 8
# (python benchmarks/ab_versions.py --only "fp8 per-tensor 128", the shorter runs' package as the base;
# benchmarks/results/ab-fp8-promotion-h200.json, run_lengths).
LONE_CONSUMER_RUN = 16
# Promoted tile widths: the f32 sums double the accumulators, which fit in the consumers'
# registers up to 192 columns (96 + 96 per thread, no spills: SASS, CPU tests); a 256-wide tile
# accumulates each k-block in two 128-column halves (64 + 128).
BLOCK_SCALED_NS = (64, 128, 192, 256)
# A ping-pong consumer holds a 128 x block_n tile's accumulators: block_n f32 registers a thread.
PINGPONG_MAX_BLOCK_N = 192
# Gated tiles: each half (B's columns, B_up's) a multiple of the 64-column epilogue sub-tile.
GATED_NS = (128, 256)
SWIZZLE_ALIGN = 1024  # a 128B-swizzled tile starts on a 1024-byte boundary (the swizzle's period)
# A dynamic schedule's ring of tile ids: TILE_ID_SLOTS slots of a full and an empty mbarrier and a u32 id.
TILE_ID_SLOTS = 2
TILE_ID_RING_BYTES = TILE_ID_SLOTS * (8 + 8 + 4)
# Products a K-segmented kernel sums (GemmConfig.k_segments): the query, key and value
# projections' input gradient, the most a transformer layer sums.
MAX_K_SEGMENTS = 3


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time configuration of one GEMM kernel.

    ``a_major``: "K" (A row-major) or "M" (A column-major); ``b_major``: "K" (B
    column-major) or "N" (B row-major). The output is always row-major (the host swaps
    operands for a column-major output). ``debug``: bounded mbarrier waits that fill the
    kernel's debug record and trap on a hang (``numba_hopper.runtime.debug``); False compiles none
    of that code. ``epilogue``: None for a plain ``C = A @ B`` (the kernel has no epilogue
    code at all), or the fused epilogue to compile in. ``stream_k``: compile in the
    stream-K fix-up (tiles whose K loop several CTAs share, see ``kernels/scheduler.py``).
    ``in_dtype`` "e4m3"/"e5m2" (fp8): k = 32 wgmma, which reads K-major operands only (no
    transpose bits), so both majors must be "K"; ``b_dtype``: B's fp8 type where it differs
    from A's (None: ``in_dtype``; e4m3 x e5m2 products, as in FP8 training's backward pass).
    ``out_major``: "N" (the output D row-major) or "M" (column-major: the narrow tiles
    of a decode product computed swapped, ``out.T = b.T @ a.T`` with the few tokens as the
    kernel's N; only 64 x 8 or 64 x 16 tiles of a plain 16-bit product, whose epilogue
    writes each tile transposed and stores it with one TMA box).
    ``acc_chains``: 1, or 4 independent accumulators, one per wgmma of a k-block, summed
    after the K loop: a narrow tile's wgmmas are short, and chained on one accumulator
    each waits for the one before it (block_n <= 64, plain or fused, not block-wise scaled).
    ``epi_buffers``: output sub-tile buffers per consumer, 2 (a sub-tile is written while the
    previous one's TMA store still reads its buffer) or 1 (each waits for the one before: 16 KB
    less shared memory per consumer, a fourth ring slot for 192 x 192 tiles).
    ``grouped``: None, or the grouped GEMM's scheduler to compile in (``kernels/scheduler.py``):
    "contiguous" (the groups' rows one after another in a 2-D A and output, cut by
    cumulative ends) or "masked" (a 3-D A and output, the first ``masked_m[g]`` rows of
    group g valid); the group sizes are read on the device. Its block-wise scales (fp8)
    are B's (G, K/128, N/128) and A's (rows, K/128), or (G, M, K/128) masked.
    ``cluster_order``: which cluster takes which tile slot of the raster: "launch" (the
    cluster's index in the grid) or "gpc" (2-CTA clusters: slots in GPC-major order of the
    TPCs the clusters run on, claimed at the kernel's start; ``kernels/scheduler.py``).
    ``group_m``: the raster's groups of cluster-tile rows, each walked column by column
    (``kit.scheduler``'s grouped order); ``group_n``: 0, or the raster transposed: groups of
    ``group_n`` cluster-tile columns, each walked row by row, so that consecutive slots share
    A's row panel (in GPC order, the 2x1 clusters of a GPC then read the same A tiles together;
    ``kernels/scheduler.py``).
    ``pingpong``: the two consumers take whole 128-row tiles in turn, each issuing both 64-row
    halves' wgmmas, so that one's epilogue runs under the other's mainloop (CUTLASS's
    ``KernelTmaWarpSpecializedPingpong``); 16-bit or unpromoted fp8 products, with no C, gating or
    cluster, at most ``PINGPONG_MAX_BLOCK_N`` wide (a consumer holds the whole tile's accumulators).
    ``promoted``: fp8 two-level accumulation: the mainloop waits for each k-block's wgmmas (128
    K) and adds their product into an f32 register sum (``kernels/mainloop/promoted.py``), as
    cuBLASLt's default fp8 kernels promote (the tensor cores' fp8 accumulation keeps about 14
    bits); fp8 inputs, ``block_n`` in ``BLOCK_SCALED_NS``, no cluster. Without it an fp8
    product accumulates in the tensor cores throughout (``use_fast_accum=True``).
    ``block_scaled``: fp8 block-wise scales (one per 128 K of each row of A, one per 128 x 128
    block of B), multiplied into each k-block's promoted product (so it implies ``promoted``).
    ``gated``: ``act(A @ B) * (A @ B_up)``, the GLU of SwiGLU and GeGLU MLPs, with a second B:
    each tile's B slot holds ``block_n / 2`` rows of B and as many of B_up, so one wgmma tile
    computes both products side by side and the epilogue writes the ``block_n / 2`` gated
    columns (``out_block_n``), ``act`` being the epilogue's activation (none: the identity);
    16-bit inputs, a K-major B, ``block_n`` in ``GATED_NS``, no cluster or grouping, and no other
    epilogue term but ``aux`` (both products before the gating, B's beside B_up's: what a training
    backward reads), which leaves as the raw accumulator's sub-tiles through two tensor maps
    (``gated_aux``). Block-scaled and gated kernels compile the fused epilogue's store (the gating
    multiply is part of it; the block-scaled tiles' register budgets were fitted with it), so
    their ``epilogue`` is never None: ``EpilogueConfig()`` where none is given.
    ``a_evict``, ``b_evict``: the L2 priority of A's and B's tile loads ("normal", "first" or
    "last": :func:`numba_hopper.kit.layouts.make_tile_loads`), so that an operand the raster
    reads again stays in the L2 while the other streams through it.
    ``dynamic_schedule``: after its first tile, a cluster takes the next tile not yet taken
    (a global counter) instead of every ``ctas``-th one (``kernels/scheduler.py``): the tiles in
    flight then stay consecutive in the raster however far the CTAs' speeds drift apart over
    a long walk; plain cooperative kernels (no stream-K, grouping, ping-pong, promotion or GPC
    order).
    ``k_segments``: the product is a sum of that many (1 to ``MAX_K_SEGMENTS``) products
    ``A_i @ B_i`` of one output, whose K loops run as one: the producer loads k-block ``kb``
    from the pair whose segment holds it (``GemmParams.k_begins``), so the sum costs one
    epilogue and no pass over partial outputs (the gradient of an activation read by several
    linears, ``numba_hopper.gemm_sum``). Every pair has the majors ``a_major`` and ``b_major``;
    16-bit inputs, no stream-K, grouping, gating or block-wise scales, and a row-major output.
    """

    in_dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_major: str = "K"
    b_major: str = "N"
    block_m: int = 128
    block_n: int = 256
    stages: int = 4
    group_m: int = 8
    group_n: int = 0
    cluster_m: int = 1
    cluster_n: int = 1
    debug: bool = False
    stream_k: bool = False
    epilogue: EpilogueConfig | None = None
    grouped: str | None = None
    b_dtype: str | None = None
    out_major: str = "N"
    acc_chains: int = 1
    epi_buffers: int = 2
    cluster_order: str = "launch"
    pingpong: bool = False
    promoted: bool = False
    block_scaled: bool = False
    gated: bool = False
    a_evict: str = "normal"
    b_evict: str = "normal"
    dynamic_schedule: bool = False
    k_segments: int = 1

    def __post_init__(self):
        if self.block_scaled:
            object.__setattr__(self, "promoted", True)
        if (self.block_scaled or self.gated) and self.epilogue is None:
            object.__setattr__(self, "epilogue", EpilogueConfig())  # (the class doc says why)
        if self.in_dtype not in INPUT_BYTES:
            raise ValueError(f"in_dtype must be one of {tuple(INPUT_BYTES)}, got {self.in_dtype!r}")
        if self.b_dtype is not None and (self.b_dtype not in FP8_DTYPES or self.in_dtype not in FP8_DTYPES):
            raise ValueError(f"b_dtype is for fp8 products of mixed types; got {self.in_dtype} x {self.b_dtype}")
        if self.in_dtype in FP8_DTYPES and (self.a_major, self.b_major) != ("K", "K"):
            raise ValueError(f"fp8 wgmma reads K-major operands only: a_major and b_major must be 'K', got "
                             f"{self.a_major!r}, {self.b_major!r}")
        if self.out_dtype not in ELEMENT_BYTES:
            raise ValueError(f"out_dtype must be one of {tuple(ELEMENT_BYTES)}, got {self.out_dtype!r}")
        if self.a_major not in ("K", "M") or self.b_major not in ("K", "N"):
            raise ValueError(f"bad operand majors {self.a_major!r}, {self.b_major!r}")
        if self.block_m not in BLOCK_MS:
            raise ValueError(f"block_m must be one of {BLOCK_MS}, got {self.block_m}")
        if self.block_n not in BLOCK_NS:
            raise ValueError(f"block_n must be one of {BLOCK_NS}, got {self.block_n}")
        if self.out_major not in ("N", "M"):
            raise ValueError(f"out_major must be 'N' or 'M', got {self.out_major!r}")
        if (self.out_major == "M") != (self.block_n in NARROW_NS):
            raise ValueError(f"block_n in {NARROW_NS} goes with out_major = 'M' and only with it; got block_n = "
                             f"{self.block_n}, out_major = {self.out_major!r}")
        if self.out_major == "M" and (self.block_m != 64 or self.b_major != "K" or self.epilogue is not None
                                      or self.stream_k or self.cluster_size > 1
                                      or self.grouped is not None or ELEMENT_BYTES[self.out_dtype] != 2):
            # One consumer writes its 64 x 8/16 tile transposed (16-bit elements, 128-byte rows of
            # the output); B's box is block_n K-major rows.
            raise ValueError("out_major = 'M' runs plain 16-bit products with block_m = 64 and a K-major B, "
                             "without a cluster, stream_k or grouping")
        if self.block_n == 32 and self.block_m != 64:
            raise ValueError("block_n = 32 needs block_m = 64 (the narrow tile of skinny products)")
        if self.block_n % 64 and (self.epilogue is not None or self.cluster_m > 1):
            # Tiles 64 does not divide store 32- or 16-column sub-tiles (64- or 32-byte swizzle),
            # which the fused epilogue's C buffers do not follow, and their B boxes do not split
            # over 2 CTAs.
            raise ValueError(f"block_n = {self.block_n} runs without a fused epilogue or cluster_m = 2")
        if self.out_major == "N" and self.epi_cols * ELEMENT_BYTES[self.out_dtype] < 32:  # (the narrowest swizzle)
            raise ValueError(f"block_n = {self.block_n} cannot store {self.out_dtype} outputs: its 16-column "
                             "sub-tiles need 16-bit or wider elements")
        if self.cluster_m > 1 and self.b_major == "N" and -(-self.block_n // 64) % self.cluster_m:
            # each CTA of a cluster column loads an equal share of B's 64-wide boxes
            raise ValueError(f"cluster_m = {self.cluster_m} with a row-major B needs a multiple of "
                             f"{64 * self.cluster_m} columns per tile, got block_n = {self.block_n}")
        if self.block_m == 64 and (self.cluster_size > 1 or self.stream_k):
            raise ValueError("block_m = 64 runs without a cluster or stream_k")
        if self.block_m == 192 and self.block_n > 192:
            # At 512 threads ptxas compiles the kernel for 128 registers a thread, and a 64 x 256
            # wgmma's 128 accumulators need more (C7602).
            raise ValueError(f"block_m = 192 takes block_n <= 192, got {self.block_n}")
        if self.block_m == 192 and (self.stream_k or self.grouped is not None
                                    or (self.promoted and self.block_n > KBLOCK_SCALE)
                                    or (self.cluster_n > 1 and self.a_major == "M")):
            # Stream-K's partials are laid out for two consumers, the group walk divides by a
            # power of two, three consumers' promoted sums fit beside 128-column accumulators
            # only, and a column-major A tile's three 64-row boxes do not split over 2 CTAs.
            raise ValueError("block_m = 192 runs without stream_k, grouping, promotion over 128 columns "
                             "or, with a column-major A, cluster_n = 2")
        if self.block_m == 256 and (self.block_n > TALL_MAX_BLOCK_N or self.stream_k or self.grouped is not None
                                    or self.promoted or self.pingpong or self.has_c or self.gated):
            # A consumer stores both of its 64-row blocks from one set of C buffers, which hold
            # one block's C (as ping-pong's); stream-K's partials and the group walk are laid
            # out for 64-row consumers.
            raise ValueError(f"block_m = 256 runs unpromoted products at most {TALL_MAX_BLOCK_N} wide, without C, "
                             "gating, stream_k, grouping or pingpong")
        chained = self.acc_chains == ACC_CHAINS
        if not (self.acc_chains == 1 or chained and self.block_n <= 64 and not self.promoted):
            raise ValueError(f"acc_chains must be 1, or {ACC_CHAINS} with block_n <= 64 and no promotion; "
                             f"got {self.acc_chains} with block_n = {self.block_n}")
        if self.a_evict not in EVICTION_PRIORITIES or self.b_evict not in EVICTION_PRIORITIES:
            raise ValueError(f"a_evict and b_evict must be in {EVICTION_PRIORITIES}; got {self.a_evict!r}, "
                             f"{self.b_evict!r}")
        if self.dynamic_schedule and (self.stream_k or self.grouped is not None or self.pingpong or self.promoted
                                      or self.cluster_order != "launch"):
            raise ValueError("dynamic_schedule runs cooperative kernels without stream_k, grouping, pingpong, "
                             "promotion or cluster_order = 'gpc'")
        if self.epi_buffers not in (1, 2):
            raise ValueError(f"epi_buffers must be 1 or 2, got {self.epi_buffers}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
            raise ValueError(f"cluster_m and cluster_n must be 1 or 2, got {self.cluster_m}x{self.cluster_n}")
        if self.cluster_order not in CLUSTER_ORDERS:
            raise ValueError(f"cluster_order must be one of {CLUSTER_ORDERS}, got {self.cluster_order!r}")
        if self.cluster_order == "gpc" and self.cluster_size != 2:  # (a cluster's TPC names its GPC-major slot)
            raise ValueError(f"cluster_order = 'gpc' runs 2-CTA clusters, got {self.cluster_m}x{self.cluster_n}")
        if self.group_m < 1 or self.group_n < 0:
            raise ValueError(f"group_m must be >= 1 and group_n >= 0, got {self.group_m}, {self.group_n}")
        if self.group_n and self.grouped is not None:  # (the group walk has its own raster)
            raise ValueError("group_n runs ungrouped kernels")
        if self.stream_k and (self.cluster_size > 1 or self.epilogue is not None):
            raise ValueError("stream_k runs without a cluster or a fused epilogue")
        if self.promoted and (self.in_dtype not in FP8_DTYPES or self.block_n not in BLOCK_SCALED_NS):
            raise ValueError(f"promotion (and block-wise scales) needs fp8 inputs and block_n in {BLOCK_SCALED_NS}; "
                             f"got "
                             f"{self.in_dtype}, block_n = {self.block_n}")
        if self.promoted and self.block_n > KBLOCK_SCALE and self.epilogue and self.epilogue.column_bytes(self.block_n):
            # Beside 96 sums and 96 accumulators, the staged column terms' shared-memory
            # addresses (hoisted out of the tile loop) spill: 120 B with col_scale and a
            # column bias (SASS; either alone leaves 3 registers of 240).
            raise ValueError("promoted tiles over 128 wide run without column vectors (col_scale, "
                             "a column bias)")
        if self.promoted and self.block_n == 256 and (self.block_m != 128 or self.grouped is not None):
            # (the two-halves k-block is measured on dense 128-row tiles only)
            raise ValueError("promoted 256-wide tiles run with block_m = 128, ungrouped")
        if self.block_m == 192 and self.promoted and (ELEMENT_BYTES[self.out_dtype] == 1 or self.epilogue and (
                self.epilogue.fuses_more if self.block_scaled else not self.epilogue.scale_only)):
            # Three consumers get 160 registers each: 64 sums and 64 accumulators leave too few
            # for more epilogue terms (an fp8 output's amax spills 12 + 20 B); without B's block
            # scales in flight, the row and column scales fit (SASS).
            raise ValueError("promoted 192-row tiles run with a 16- or 32-bit output and no other epilogue "
                             "term than alpha, or without block-wise scales, the row and column scales")
        if self.promoted and self.cluster_size > 1:  # (measured slower where tried)
            raise ValueError("promoted products run without a cluster")
        if self.stream_k and self.block_n > STREAM_K_MAX_BLOCK_N:
            # 128 accumulators per thread leave no registers for a partial's loads: ptxas
            # issues all 32 float4 loads before the adds, and spills (SASS, CPU test).
            raise ValueError(f"stream_k needs block_n <= {STREAM_K_MAX_BLOCK_N}, got {self.block_n}")
        if self.pingpong and (self.block_m != 128 or self.block_n > PINGPONG_MAX_BLOCK_N or self.promoted
                              or self.has_c or self.gated or self.cluster_size > 1 or self.stream_k
                              or self.grouped is not None or self.out_major != "N" or self.acc_chains != 1):
            # A consumer stores both halves of its tile from one set of C buffers, which hold one
            # half's C; promoted sums beside both halves' accumulators would not fit its registers.
            raise ValueError(f"pingpong runs unpromoted products on 128-row tiles at most {PINGPONG_MAX_BLOCK_N} "
                             "wide, without C, gating, a cluster, stream_k or grouping")
        if not 1 <= self.k_segments <= MAX_K_SEGMENTS:
            raise ValueError(f"k_segments must be 1 to {MAX_K_SEGMENTS}, got {self.k_segments}")
        if self.k_segments > 1 and (self.in_dtype in FP8_DTYPES or self.stream_k or self.grouped is not None
                                    or self.gated or self.block_scaled or self.out_major != "N"):
            raise ValueError("k_segments > 1 runs 16-bit products with a row-major output, without stream_k, "
                             "grouping, gating or block-wise scales")
        if self.glu and (self.in_dtype in FP8_DTYPES or ELEMENT_BYTES[self.out_dtype] != 2 or self.stream_k
                         or self.grouped is not None or self.gated or self.k_segments > 1 or self.block_m == 256
                         or self.out_major != "N"):
            # (C's sub-tile buffers hold the gate's and up products, the output's buffers both gradients)
            raise ValueError("a GLU backward epilogue runs 16-bit products to a 16-bit row-major output, without "
                             "stream_k, grouping, gating, K segments or 256-row tiles")
        if self.gated:
            self._check_gated()
        if self.grouped is not None:
            self._check_grouped()

    def _check_gated(self):
        if (self.block_n not in GATED_NS or self.b_major != "K" or self.in_dtype in FP8_DTYPES
                or self.out_major != "N" or self.cluster_size > 1 or self.grouped is not None):
            raise ValueError(f"a gated kernel runs 16-bit products with a K-major B on tiles {GATED_NS} wide, "
                             "without a cluster or grouping")
        # (its store multiplies each gate by its up value, after the activation alone; aux keeps both)
        others = [f.name for f in dataclasses.fields(self.epilogue) if f.name not in ("activation", "aux_dtype")
                  and getattr(self.epilogue, f.name) != f.default]
        if others:
            raise ValueError(f"a gated kernel's epilogue fuses an activation and aux only; got {', '.join(others)}")

    def _check_grouped(self):
        if self.grouped not in GROUPED_MODES:
            raise ValueError(f"grouped must be None or one of {GROUPED_MODES}, got {self.grouped!r}")
        if self.cluster_size > 1 or self.stream_k:
            raise ValueError("grouped kernels run without a cluster or stream_k")
        e = self.epilogue
        if e is not None and (e.col_scale or e.c_dtype or e.bias or e.aux_dtype or e.user is not None
                              or e.transposed):
            raise ValueError("grouped kernels fuse only alpha, row_scale, fp8 block-wise scales and an activation")

    @property
    def b_type(self):
        """B's element type (``in_dtype`` unless ``b_dtype`` says otherwise)."""
        return self.b_dtype or self.in_dtype

    # --- the CTA ---
    @property
    def cluster_size(self):
        return self.cluster_m * self.cluster_n

    @property
    def consumer_rows(self):
        """Rows of the tile a consumer warpgroup computes: one wgmma's 64, or on 256-row tiles
        128 (two 64-row blocks, ``2 * cw`` and ``2 * cw + 1``)."""
        return 2 * WG_ROWS if self.block_m == 256 else WG_ROWS

    @property
    def consumers(self):
        """Consumer warpgroups: one per ``consumer_rows`` rows of the tile (ping-pong: two, each
        on whole tiles)."""
        return self.block_m // self.consumer_rows

    @property
    def threads(self):
        return 128 * (1 + self.consumers)

    @property
    def barrier_ids(self) -> "BarrierIds":
        """The kernel's named barriers (allocated by the kit's :class:`NamedBarriers`)."""
        ids = NamedBarriers()
        return BarrierIds(ids.allocate("consumer", self.consumers), ids.allocate("turns", self.consumers))

    @property
    def mma_depth(self):
        """k-blocks whose wgmmas a consumer keeps in flight behind the one it just issued
        (``wgmma.wait_group(mma_depth)``); each holds its ring slot until done, so the
        consumer holds ``mma_depth + 1`` slots and the producer loads into the rest. 2 on
        64-row tiles with a ring of 8 or more slots (64 x 64 and 64 x 128 tiles:
        64x10240x8192 +2%; on 5-stage 64 x 256 tiles it cost 6%), else 1. The narrow decode
        tiles (an accumulator per wgmma) keep 1: deeper measured no faster there. Promoted
        products wait for every k-block, or every pair (``mainloop/promoted.py``,
        ``promotes_in_pairs``)."""
        return 2 if self.block_m == 64 and self.stages >= 8 and self.acc_chains == 1 else 1

    @property
    def slot_readers(self):
        """Consumer warpgroups that read each ring slot: all of them, or with ``pingpong`` the one
        whose tile it holds."""
        return 1 if self.pingpong else self.consumers

    @property
    def tensormaps(self):
        """Tensor maps the kernel takes: A, B, the output D, then C with a residual, A's
        block-wise scales with those and B_up gated, then the other K segments' A and B, then a
        GLU backward's up products and second output, or a gated kernel's two products (``aux``)."""
        return 3 + self.has_c + self.block_scaled + self.gated + 2 * (self.k_segments - 1) + 2 * self.glu \
            + 2 * self.gated_aux

    @property
    def has_c(self):
        """Whether sub-tiles stream in beside the stores: a residual C, or a GLU backward's inputs."""
        return self.epilogue is not None and (self.epilogue.c_dtype is not None or self.epilogue.glu is not None)

    @property
    def c_dtype(self):
        """The dtype of those sub-tiles: C's, or a GLU backward's inputs' (the output's)."""
        return self.out_dtype if self.glu else self.epilogue.c_dtype

    @property
    def glu(self):
        """Whether the epilogue is a GLU backward (``EpilogueConfig.glu``): two inputs, two outputs."""
        return self.epilogue is not None and self.epilogue.glu is not None

    @property
    def gated_aux(self):
        """Whether a gated kernel also writes both products (``aux``): its accumulator's sub-tiles of
        B's columns to one tensor map, B_up's to another, before the gated sub-tiles."""
        return self.gated and self.epilogue.aux_dtype is not None

    @property
    def aux_box(self):
        """Box of a gated kernel's product maps: 64 rows of 128 bytes, one store's sub-tile."""
        return (1, EPI_ROWS, 128 // ELEMENT_BYTES[self.epilogue.aux_dtype])

    @property
    def out_block_n(self):
        """Output columns of a tile: ``block_n``, or half of it gated."""
        return self.block_n // 2 if self.gated else self.block_n

    @property
    def promotes_in_pairs(self):
        """Whether a promoting consumer issues its k-blocks two at a time into two
        accumulators and promotes the first while the second's wgmmas run
        (``mainloop/promoted.py``): tiles of at most 128 x 128, whose consumers have
        registers for a second accumulator (64 + 64 + 64 a thread), in a product whose epilogue
        only scales (``alpha``, ``row_scale``, ``col_scale``: no spills, SASS). Other epilogue
        terms (f32 output with all of them: 76 bytes; fp8 output, amax, bias and gelu: 8) or a
        grouped kernel's bookkeeping (64 x 128: spills; 128 x 128: B's scales pass through the
        wgmmas' registers, stalling each pair on their load) leave too few."""
        return (self.promoted and self.block_n <= KBLOCK_SCALE and self.consumers <= 2
                and self.grouped is None and (self.epilogue is None or self.epilogue.scale_only))

    @property
    def promotion_run(self):
        """k-blocks a pair-promoting consumer runs between two drains of its wgmmas
        (``mainloop/promoted.py``): ``LONE_CONSUMER_RUN`` for a lone consumer (64-row tiles)
        without block-wise scales, whose tensor cores idle at each drain, else 2 (B's scales
        load a pair ahead)."""
        return LONE_CONSUMER_RUN if self.promotes_in_pairs and self.consumers == 1 and not self.block_scaled else 2

    @property
    def overlaps_store(self):
        """Whether a consumer issues each tile's first k-block before it stores the previous
        tile, so the tensor cores run through the store (``gemm_sm90.py``), on tiles of two
        64-row consumers, or three at most 128 wide, ungrouped, without stream-K or ping-pong:

        - plain 16-bit outputs (no epilogue): the sums are converted to 16-bit pairs first, so
          the fresh accumulator takes the registers they leave (128 + 64 a thread at 256
          columns); a short K loop's store then no longer idles the tensor cores;
        - promoted products without block-wise scales (whose first k-block would need its
          scales) at most 128 wide, whose epilogue only scales (no C to load beside the store):
          the fresh accumulator takes the registers of a pair's second, or of three consumers'
          next k-block (``mainloop/promoted.py``). A 192-wide tile's split K loop compiles to a
          rolled loop of k-steps (SASS).

        A lone consumer's tile is mostly its CTA's only one, and its first run, split off, ran
        4-6% slower at 128x7168x16384 (promoted)."""
        plain = (not self.promoted and self.epilogue is None and self.out_dtype in ("bf16", "f16")
                 and self.out_major == "N" and self.acc_chains == 1 and (self.consumers == 2 or self.block_n <= 128))
        promoted = (self.promoted and not self.block_scaled and self.block_n <= 128
                    and (self.epilogue is None or self.epilogue.scale_only))
        return ((plain or promoted) and self.consumers > 1 and self.consumer_rows == WG_ROWS and not self.pingpong
                and self.grouped is None and not self.stream_k)

    @property
    def partial_bytes(self):
        """One consumer's stream-K partial tile: 64 x ``block_n`` f32 in fragment order."""
        return WG_ROWS * self.block_n * 4

    @property
    def block_k(self):
        """Elements of one k-block: a 128-byte swizzle row of ``in_dtype`` (64, or 128 for fp8)."""
        return KBLOCK_BYTES // INPUT_BYTES[self.in_dtype]

    # --- the ring's operand tiles (kit layouts) and their TMA boxes (numpy order, batch outermost) ---
    @property
    def a_layout(self) -> OperandLayout:
        """A's tile in a ring slot: ``block_m`` x ``block_k``, 128-byte swizzle, K-major (one box
        of ``block_m`` rows) or M-major (64 x 64 boxes along M)."""
        return operand_layout("K" if self.a_major == "K" else "MN", 128, self.in_dtype, mn=self.block_m,
                              k=self.block_k)

    @property
    def b_layout(self) -> OperandLayout:
        """B's tile in a ring slot as the wgmmas read it: ``block_n`` K-major rows (gated: B's
        ``block_n / 2`` then B_up's), or N-major whole 64-column boxes (160 columns take three;
        a 32-wide tile one box of 64-byte swizzle)."""
        if self.b_major == "K":
            return operand_layout("K", 128, self.b_type, mn=self.block_n, k=self.block_k)
        mn = self.block_n if self.block_n < 64 else -(-self.block_n // 64) * 64
        return operand_layout("MN", self.b_swizzle, self.b_type, mn=mn, k=self.block_k)

    @property
    def b_load_layout(self) -> OperandLayout:
        """What one of B's loads fills: the whole tile, or gated each half (B's rows, B_up's)."""
        if self.gated:
            return operand_layout("K", 128, self.b_type, mn=self.block_n // 2, k=self.block_k)
        return self.b_layout

    @property
    def a_box(self):
        """Box of A's tensor map: the part of an A tile one CTA of the cluster loads.

        CTAs of a cluster that share a tile row (same A tile) each load 1/cluster_n of it
        and multicast it to all of them.
        """
        return (1,) + tma_box(self.a_layout, self.cluster_n)

    @property
    def b_box(self):
        """Box of B's tensor map (gated: also B_up's, each half the tile's rows)."""
        return (1,) + tma_box(self.b_load_layout, 1 if self.gated else self.cluster_m)

    @property
    def b_swizzle(self):
        """B's swizzle span in bytes (its tensor map's and wgmma's): 128, or 64 for the
        32-wide boxes of an N-major B in 32-wide tiles."""
        return 64 if self.b_major == "N" and self.block_n == 32 else 128

    @property
    def c_box(self):
        """Box of the output's tensor map: one epilogue sub-tile (column-major outputs: a
        consumer's whole 64 x ``block_n`` tile, stored (N, M))."""
        if self.out_major == "M":
            return (1, self.block_n, WG_ROWS)
        return (1, EPI_ROWS, self.epi_cols)

    @property
    def epi_cols(self):
        """Columns of one epilogue sub-tile: 128 bytes of output elements, at most 32 where 64
        does not divide ``block_n`` (160, 224) and 16 where 32 does not (112, 144). A GLU
        backward's 32 (16-bit): a C buffer then holds both inputs' sub-tiles, and an output
        buffer both outputs'."""
        cols = 16 if self.block_n % 32 and self.out_major == "N" else 32 if self.out_block_n % 64 or self.glu else 64
        return min(128 // ELEMENT_BYTES[self.out_dtype], cols)

    @property
    def epi_swizzle(self):
        """Bytes of one sub-tile row, which is also the output tensor map's swizzle span
        (none for column-major outputs: each thread writes single elements)."""
        if self.out_major == "M":
            return 0
        return self.epi_cols * ELEMENT_BYTES[self.out_dtype]

    # --- shared memory ---
    @property
    def a_tile_bytes(self):
        return self.a_layout.tile_bytes

    @property
    def b_tile_bytes(self):
        """K-major: ``block_n`` rows of one k-block; N-major: whole 64-wide boxes (160 loads 192)."""
        return self.b_layout.tile_bytes

    @property
    def a_scales_box(self):
        """Rows of one TMA box of A's block-wise scales: the tile's, from the 16-byte boundary
        at or before its first row (a TMA box starts 16-byte aligned along its contiguous
        dimension, and a group of a grouped GEMM may start at any row), so 4 more."""
        return self.block_m + 4

    @property
    def a_scales_box_bytes(self):
        """Bytes one stage's box of A's scales brings (0 without block-wise scales)."""
        return 4 * self.a_scales_box if self.block_scaled else 0

    @property
    def a_scales_bytes(self):
        """One stage's slot of A's scales: its box, 128-byte aligned (0 without them)."""
        return -(-self.a_scales_box_bytes // 128) * 128

    @property
    def c_buf_bytes(self):
        """One residual-C sub-tile (64 x ``epi_cols`` of C's dtype; a GLU backward's, the gate's and
        the up products' sub-tiles); 0 without C."""
        return (1 + self.glu) * EPI_ROWS * self.epi_cols * ELEMENT_BYTES[self.c_dtype] if self.has_c else 0

    @property
    def layout(self) -> "SharedLayout":
        return SharedLayout.of(self)

    @property
    def shared_bytes(self):
        return self.layout.total


@dataclass(frozen=True)
class SharedLayout:
    """Byte offsets in the kernel's dynamic shared memory (from its 1024-aligned base).

    In order: the ring's A tiles, its B tiles, ``epi_buffers`` output sub-tile buffers per consumer,
    two residual-C sub-tile buffers per consumer, each consumer's staged column vectors,
    the ring's block-wise scales of A, the ring's barriers, the C buffers' barriers, with
    ``cluster_order = "gpc"`` the cluster's claimed slot (a u32 written by its claimer) and with
    ``dynamic_schedule`` the ring of tile ids (``kernels/scheduler.py``: ``TILE_ID_RING_BYTES``).
    """

    a: int
    b: int
    epi: int
    c: int
    vec: int
    vec_bytes: int
    a_scales: int
    barriers: int
    c_barriers: int
    cluster_slot: int
    tile_ids: int
    total: int

    @staticmethod
    def of(cfg: GemmConfig) -> "SharedLayout":
        b = cfg.stages * cfg.a_tile_bytes
        epi = b + cfg.stages * cfg.b_tile_bytes
        c = epi + cfg.epi_buffers * cfg.consumers * EPI_BUF_BYTES
        vec = c + 2 * cfg.consumers * cfg.c_buf_bytes
        vec_bytes = cfg.epilogue.column_bytes(cfg.block_n) if cfg.epilogue else 0
        a_scales = vec + cfg.consumers * vec_bytes
        barriers = a_scales + cfg.stages * cfg.a_scales_bytes
        c_barriers = barriers + pipeline_barrier_bytes(cfg.stages)
        cluster_slot = c_barriers + (2 * cfg.consumers * 8 if cfg.has_c else 0)
        tile_ids = cluster_slot + (8 if cfg.cluster_order == "gpc" else 0)
        total = tile_ids + (TILE_ID_RING_BYTES if cfg.dynamic_schedule else 0)
        # Swizzled tiles keep the swizzle's period; mbarriers are 8-byte aligned.
        assert cfg.a_tile_bytes % SWIZZLE_ALIGN == 0 and cfg.b_tile_bytes % SWIZZLE_ALIGN == 0, cfg
        assert b % SWIZZLE_ALIGN == 0 and epi % SWIZZLE_ALIGN == 0 and c % SWIZZLE_ALIGN == 0, cfg
        assert a_scales % 128 == 0 and barriers % 8 == 0, cfg  # (TMA writes 128-byte-aligned boxes)
        return SharedLayout(0, b, epi, c, vec, vec_bytes, a_scales, barriers, c_barriers, cluster_slot, tile_ids, total)


class GemmParams(NamedTuple):
    """The GEMM kernel's run-time arguments (one record; numba passes each field as its own
    kernel parameter).

    ``maps``: the 3-D TMA descriptors (batch outermost), passed by value
    (:class:`numba_hopper.runtime.tensormap.TensorMapArg`), of A, B, the output D and, with a
    residual, C, then A's block-wise scales if it has them, or B_up if gated (``cfg.tensormaps``
    in all). A gated kernel's ``N`` is twice the output's: its tiles' columns, B's and B_up's. A
    call at new addresses sets each map's ``value``. A and B have 128-byte swizzle and the boxes of
    ``cfg.a_box`` / ``cfg.b_box``; D the box ``cfg.c_box`` and ``cfg.epi_swizzle`` bytes of
    swizzle; C (row-major like D) the box ``(1, 64, c_box_cols(cfg))`` and that many
    elements' bytes of swizzle.

    The grid computes ``batches`` units: batch items (``a_batched``/``b_batched`` are 1, or 0
    for an operand broadcast over the batch) or, with ``k_split`` > 0, slices of ``k_split``
    k-blocks of one product whose partial sums go to batch ``b`` of D. ``dp_tiles``: tiles
    below it are data-parallel, the others stream-K (only with ``cfg.stream_k``, which also
    needs ``workspace``: the device address of ``gridDim.x * 2 * cfg.partial_bytes`` bytes
    of partials followed by ``gridDim.x * 2`` u32 flags, zero before the launch and left
    zero after it). ``debug_record``: the device address of a
    ``numba_hopper.runtime.debug.DebugRecord`` (read only if ``cfg.debug``).

    Grouped kernels (``cfg.grouped``): ``batches`` is the group count G and ``group_rows``
    the device address of G int32: the groups' cumulative row ends (contiguous: group g is
    rows ``[ends[g-1], ends[g])`` of the M rows) or their row counts (masked: the first
    ``group_rows[g]`` of the M rows of batch g); ``out_address`` is D's (where a tile that
    crosses its group's end stores its rows without TMA). Read only by grouped kernels.

    GPC-ordered kernels (``cfg.cluster_order = "gpc"``): ``tpc_order`` is the device address
    of the GPC-major rank of each TPC (u32, indexed by ``%smid // 2``:
    ``numba_hopper.matmul.placement``), and ``cluster_claims`` that of a u32 count of the
    clusters that claimed, then a u32 claim per tile slot, all zero before the launch and left
    zero after it (``numba_hopper.runtime.workspace``). Dynamically scheduled kernels
    (``cfg.dynamic_schedule``): ``cluster_claims`` is the address of two u32, the tiles taken
    after the first wave and the clusters done, zero before the launch and left zero after it.

    Block-scaled kernels (``cfg.block_scaled``): ``b_scales`` is B's block-wise scales, a float32
    device array of (ceil(K / 128), ceil(N / 128)), or (G, ceil(K / 128), ceil(N / 128)) grouped
    (0, unread, in other kernels); A's come through their tensor map.

    K-segmented kernels (``cfg.k_segments`` > 1): ``maps`` ends with the other segments' A and B,
    ``K`` is the segments' k-blocks times ``block_k``, and ``k_begins`` holds the first k-block
    of segments 1 and 2 (a segment's own k-blocks from 0; past the last segment: its end).
    """

    maps: tuple
    M: int
    N: int
    K: int
    batches: int
    a_batched: int
    b_batched: int
    k_split: int
    dp_tiles: int
    workspace: int
    debug_record: int
    group_rows: int = 0
    out_address: int = 0
    tpc_order: int = 0
    cluster_claims: int = 0
    b_scales: object = 0
    k_begins: tuple = (0, 0)


class BarrierIds(NamedTuple):
    """First ids of the kernel's named barriers: ``consumer``, one per consumer warpgroup
    (``consumer + cw``: its epilogue's sub-tile hand-offs, stream-K's partial sums), then
    ``turns``, one per consumer (the ordered barrier of consumers that take turns to issue
    wgmmas)."""

    consumer: int
    turns: int


class Consumer(NamedTuple):
    """A consumer thread's place in the CTA: warpgroup ``cw`` (0 to 2) of the consumers,
    thread ``t`` (0-127) in it, its ``lane``, the first of the two fragment rows it holds
    in its warpgroup's 64 (``row_in_wg``, and 8 below), and whether it is the warpgroup's
    ``leader`` (thread 0, which issues its TMA stores and C loads)."""

    cw: int
    t: int
    lane: int
    row_in_wg: int
    leader: bool
