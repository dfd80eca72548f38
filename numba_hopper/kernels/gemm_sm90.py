"""Warp-specialized, persistent TMA + wgmma GEMM for sm_90a: ``C = A @ B``.

One CTA per SM, 384 threads in three warpgroups (seed 000, sections 7-9), or 256 in two
for 64-row tiles:

- warpgroup 0, the producer: gives registers back (``setmaxnreg.dec``, next to two
  consumers); one elected thread walks the CTA's tiles and k-blocks, waits for a free ring
  slot and issues the TMA loads of an A tile (BM x 64) and a B tile (64 x BN) into it;
- warpgroups 1 and 2 (just 1 when BM = 64), the consumers: take registers
  (``setmaxnreg.inc``; a single consumer has them all from the start); each owns 64
  rows of the BM x BN output tile and accumulates them in registers with
  ``wgmma.m64nBNk16`` (128 f32 per thread for BN = 256). A slot is released one k-block
  late, once ``wgmma.wait_group 1`` says the wgmmas that read it are done, so the tensor
  cores always have the next k-block queued.
- epilogue, per consumer: accumulators -> output dtype -> shared memory (``stmatrix``,
  128-byte-swizzled like the store's tensor map, so the writes are bank-conflict free)
  -> ``fence.proxy.async`` -> one thread issues a TMA store of a 64 x 64 (16-bit) or
  64 x 32 (f32) sub-tile. Two sub-tile buffers per consumer alternate, so a store drains
  while the next sub-tile is written, and the last stores of a tile drain while the next
  tile's main loop runs; the producer is meanwhile already loading that next tile.
- fused epilogue (``GemmConfig.epilogue``, see kernels/epilogue.py): the f32 values go
  through scales, ``beta * C``, bias, activation and a user function before packing. The
  row and column vectors are loaded when a tile's main loop starts and the column terms
  staged in shared memory after it, so the epilogue reads each with one shared load. C
  comes in by TMA, one sub-tile (64 rows x ``epi_cols``) at a time into two buffers per
  consumer, each with its own mbarrier: the consumer's leader issues the loads of a tile's
  first two sub-tiles as its main loop starts, and that of sub-tile q + 2 as soon as
  sub-tile q has been read.

Layouts: a K-major operand (A row-major, B column-major) is loaded as one box of 64
k-elements (128 bytes, the 128B swizzle span) by BM or BN rows. An MN-major operand
(A column-major, B row-major) is loaded as 64 x 64 boxes stacked along M/N and read by
wgmma with the transpose bit (a 32-wide B tile: one 64 x 32 box with 64-byte swizzle).
Partial tiles need no code: TMA zero-fills loads outside the tensor and clips stores.

``make_gemm_kernel(config)`` builds (and caches) one kernel per :class:`GemmConfig`; every
config value is a compile-time constant of that kernel.
"""

from __future__ import annotations

import functools
import dataclasses
from dataclasses import dataclass

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..pipeline import (
    PipelineState,
    consumer_release,
    consumer_release_in,
    consumer_wait,
    debug_site,
    pipeline_advance,
    pipeline_barrier_bytes,
    pipeline_init,
    producer_acquire,
    producer_commit,
)
from .descriptors import publish_tensormap, tensormap_slot
from .epilogue import EpilogueConfig, make_epilogue
from .scheduler import device_work_walk, grouped_tile

__all__ = ["GemmConfig", "EpilogueConfig", "make_gemm_kernel", "c_box_cols"]

WG_ROWS = 64  # rows of the output tile per consumer warpgroup (wgmma M)
BLOCK_K = 64  # one 128-byte swizzle row of 16-bit elements
EPI_ROWS = 64
EPI_BUF_BYTES = EPI_ROWS * 128  # one 128-byte-wide swizzled sub-tile
# Register budgets after setmaxnreg (128 * producer + 256 * consumer <= 64K registers). The
# cluster producer also computes multicast masks and peer offsets: at 40 it spills.
REGS_NO_CLUSTER = (40, 232)
REGS_CLUSTER = (56, 224)
# A fused epilogue keeps more values live in the consumers: give them the registers the
# producer can spare (measured: bias+gelu_tanh+c spills 96 B at 40/232, none at 24/240).
REGS_FUSED = (24, 240)
REGS_FUSED_CLUSTER = (40, 232)
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}
BLOCK_MS = (64, 128)
BLOCK_NS = (32, 64, 128, 160, 192, 256)
STREAM_K_MAX_BLOCK_N = 192


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time configuration of one GEMM kernel.

    ``a_major``: "K" (A row-major) or "M" (A column-major); ``b_major``: "K" (B
    column-major) or "N" (B row-major). The output is always row-major (the host swaps
    operands for a column-major output). ``debug``: bounded mbarrier waits that fill the
    kernel's debug record and trap on a hang (``numba_hopper.debug``); False compiles none
    of that code. ``epilogue``: None for a plain ``C = A @ B`` (the kernel has no epilogue
    code at all), or the fused epilogue to compile in. ``stream_k``: compile in the
    stream-K fix-up (tiles whose K loop several CTAs share, see ``scheduler.device_work_walk``).
    """

    in_dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_major: str = "K"
    b_major: str = "N"
    block_m: int = 128
    block_n: int = 256
    stages: int = 4
    group_m: int = 8
    cluster_m: int = 1
    cluster_n: int = 1
    debug: bool = False
    split_k: int = 1  # host side: K slices summed by a second kernel (not a kernel parameter)
    stream_k: bool = False
    epilogue: EpilogueConfig | None = None

    def __post_init__(self):
        if self.in_dtype not in ("bf16", "f16"):
            raise ValueError(f"in_dtype must be 'bf16' or 'f16', got {self.in_dtype!r}")
        if self.out_dtype not in ELEMENT_BYTES:
            raise ValueError(f"out_dtype must be one of {tuple(ELEMENT_BYTES)}, got {self.out_dtype!r}")
        if self.a_major not in ("K", "M") or self.b_major not in ("K", "N"):
            raise ValueError(f"bad operand majors {self.a_major!r}, {self.b_major!r}")
        if self.block_m not in BLOCK_MS:
            raise ValueError(f"block_m must be one of {BLOCK_MS} (consumer warpgroups of 64 rows), got {self.block_m}")
        if self.block_n not in BLOCK_NS:
            raise ValueError(f"block_n must be one of {BLOCK_NS}, got {self.block_n}")
        if self.block_n == 32 and self.block_m != 64:
            raise ValueError("block_n = 32 needs block_m = 64 (the narrow tile of skinny products)")
        if self.block_n % 64 and (self.epilogue is not None or self.cluster_m > 1):
            # A 160- or 32-wide tile stores 32-column sub-tiles (64-byte swizzle), which the fused
            # epilogue's C buffers do not follow, and its B boxes do not split over 2 CTAs.
            raise ValueError(f"block_n = {self.block_n} runs without a fused epilogue or cluster_m = 2")
        if self.block_m == 64 and (self.cluster_size > 1 or self.stream_k):
            raise ValueError("block_m = 64 runs without a cluster or stream_k")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")
        if self.split_k > 1 and self.epilogue is not None:  # slices write partial sums, not outputs
            raise ValueError("split_k > 1 cannot run a fused epilogue")
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
            raise ValueError(f"cluster_m and cluster_n must be 1 or 2, got {self.cluster_m}x{self.cluster_n}")
        if self.stream_k and (self.cluster_size > 1 or self.split_k > 1 or self.epilogue is not None):
            raise ValueError("stream_k runs without a cluster, split_k or a fused epilogue")
        if self.stream_k and self.block_n > STREAM_K_MAX_BLOCK_N:
            # 128 accumulators per thread leave no registers for a partial's loads: ptxas
            # issues all 32 float4 loads before the adds, and spills (SASS, CPU test).
            raise ValueError(f"stream_k needs block_n <= {STREAM_K_MAX_BLOCK_N}, got {self.block_n}")

    @property
    def tensormaps(self):
        """Tensor maps the kernel publishes per CTA: A, B, the output D and, with a residual, C."""
        return 4 if self.epilogue is not None and self.epilogue.c_dtype is not None else 3

    @property
    def cluster_size(self):
        return self.cluster_m * self.cluster_n

    @property
    def consumers(self):
        """Consumer warpgroups: one per 64 rows of the tile."""
        return self.block_m // WG_ROWS

    @property
    def threads(self):
        return 128 * (1 + self.consumers)

    @property
    def partial_bytes(self):
        """One consumer's stream-K partial tile: 64 x ``block_n`` f32 in fragment order."""
        return WG_ROWS * self.block_n * 4

    # --- TMA boxes (numpy order, batch outermost) ---
    @property
    def a_box(self):
        """Box of A's tensor map: the part of an A tile one CTA of the cluster loads.

        CTAs of a cluster that share a tile row (same A tile) each load 1/cluster_n of it
        and multicast it to all of them.
        """
        if self.a_major == "K":
            return (1, self.block_m // self.cluster_n, BLOCK_K)
        return (1, BLOCK_K, 64)

    @property
    def b_box(self):
        if self.b_major == "K":
            return (1, self.block_n // self.cluster_m, BLOCK_K)
        return (1, BLOCK_K, min(self.block_n, 64))

    @property
    def b_swizzle(self):
        """B's swizzle span in bytes (its tensor map's and wgmma's): 128, or 64 for the
        32-wide boxes of an N-major B in 32-wide tiles."""
        return 64 if self.b_major == "N" and self.block_n == 32 else 128

    @property
    def c_box(self):
        return (1, EPI_ROWS, self.epi_cols)

    # --- shared-memory layout (bytes from the 1024-aligned dynamic base) ---
    @property
    def a_tile_bytes(self):
        return self.block_m * BLOCK_K * 2

    @property
    def b_tile_bytes(self):
        """K-major: ``block_n`` rows of 64 k; N-major: whole 64-wide boxes (160 loads 192)."""
        if self.b_major == "K" or self.block_n < 64:
            return self.block_n * BLOCK_K * 2
        return -(-self.block_n // 64) * 64 * BLOCK_K * 2

    @property
    def epi_cols(self):
        """Columns of one epilogue sub-tile: 128 bytes of output elements (64 bytes, 32 16-bit
        columns, when 64 does not divide ``block_n``)."""
        return min(128 // ELEMENT_BYTES[self.out_dtype], 32 if self.block_n % 64 else 64)

    @property
    def epi_swizzle(self):
        """Bytes of one sub-tile row, which is also the output tensor map's swizzle span."""
        return self.epi_cols * ELEMENT_BYTES[self.out_dtype]

    @property
    def b_offset(self):
        return self.stages * self.a_tile_bytes

    @property
    def epi_offset(self):
        return self.b_offset + self.stages * self.b_tile_bytes

    @property
    def c_offset(self):
        return self.epi_offset + 2 * self.consumers * EPI_BUF_BYTES  # 2 buffers per consumer

    @property
    def c_buf_bytes(self):
        """One C sub-tile (64 x ``epi_cols`` of C's dtype); 0 without C."""
        c_dtype = self.epilogue and self.epilogue.c_dtype
        return EPI_ROWS * self.epi_cols * ELEMENT_BYTES[c_dtype] if c_dtype else 0

    @property
    def vec_offset(self):
        """Each consumer's staged column vectors (bias, scales) of the fused epilogue."""
        return self.c_offset + 2 * self.consumers * self.c_buf_bytes

    @property
    def vec_bytes(self):
        return self.epilogue.column_bytes(self.block_n) if self.epilogue else 0

    @property
    def barrier_offset(self):
        return self.vec_offset + self.consumers * self.vec_bytes

    @property
    def shared_bytes(self):
        c_barriers = 2 * self.consumers * 8 if self.c_buf_bytes else 0
        return self.barrier_offset + pipeline_barrier_bytes(self.stages) + c_barriers


def max_stages(in_dtype="bf16", out_dtype="bf16", block_n=256, shared_limit=227 * 1024, **kw):
    """The deepest ring that fits in ``shared_limit`` bytes (host-side helper)."""
    stages = 2
    while GemmConfig(in_dtype, out_dtype, block_n=block_n, stages=stages + 1, **kw).shared_bytes <= shared_limit:
        stages += 1
    return stages


def make_gemm_kernel(cfg: GemmConfig):
    """The ``@cuda.jit`` kernel for ``cfg`` (compiled once per kernel-relevant config)."""
    return _build_gemm_kernel(dataclasses.replace(cfg, split_k=1))


@functools.lru_cache(maxsize=None)
def _build_gemm_kernel(cfg: GemmConfig):
    """The ``@cuda.jit`` kernel for ``cfg``.

    Arguments ``(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split,
    dp_tiles, workspace, debug_record)``: ``maps`` holds the 16 words of a 3-D TMA descriptor
    template (:func:`numba_hopper.tensormap.encode_template`, batch outermost) for each of
    A, B and the output D, and ``addresses`` their global addresses; the kernel patches
    them in and publishes the maps to ``slots`` (``cfg.tensormaps`` 128-byte slots per CTA,
    :mod:`.descriptors`). A and B have 128-byte swizzle and the boxes of ``cfg.a_box`` /
    ``cfg.b_box``, D the box ``cfg.c_box`` and ``cfg.epi_swizzle`` bytes of swizzle.
    The grid computes ``batches`` units: batch items (``a_batched``/``b_batched`` are 1, or
    0 for an operand broadcast over the batch) or, with ``k_split`` > 0, slices of
    ``k_split`` k-blocks of one product whose partial sums go to batch ``b`` of C.
    ``dp_tiles``: tiles below it are data-parallel, the others stream-K (only with
    ``cfg.stream_k``, which also needs ``workspace``: the device address of
    ``gridDim.x * 2 * cfg.partial_bytes`` bytes of partials followed by ``gridDim.x * 2``
    u32 flags, zero before the launch and left zero after it). ``debug_record``: the device
    address of a ``numba_hopper.debug.DebugRecord`` (read only if ``cfg.debug``).

    With ``cfg.epilogue`` the kernel takes a fourteenth argument, the epilogue tuple laid out
    by ``cfg.epilogue.arg_names``. With a residual C, ``maps`` and ``addresses`` have a
    fourth entry: C (row-major like the output, batch outermost) with box
    ``(1, 64, c_box_cols(cfg))`` and ``c_box_cols(cfg) * itemsize`` bytes of swizzle (128,
    or 64 for a 16-bit C next to an f32 output).
    """
    BM, BN, S, GROUP_M = cfg.block_m, cfg.block_n, cfg.stages, cfg.group_m
    IN_T = cfg.in_dtype
    OUT_T = cfg.out_dtype
    A_K_MAJOR = cfg.a_major == "K"
    B_K_MAJOR = cfg.b_major == "K"
    A_TILE, B_TILE = cfg.a_tile_bytes, cfg.b_tile_bytes
    STAGE_TX = A_TILE + B_TILE
    B_OFF, EPI_OFF, BAR_OFF = cfg.b_offset, cfg.epi_offset, cfg.barrier_offset
    MN_BOX_BYTES = 64 * 128  # a 64 x 64 box of an MN-major operand
    B_BOXES = -(-BN // 64)
    B_SWIZZLE = cfg.b_swizzle
    # wgmma descriptors (128B swizzle). K-major: 8-row groups 1024 B apart (SBO), a k16 step
    # is 32 B along the swizzled row. MN-major: 64-element MN atoms one box apart (LBO),
    # 8-k groups 1024 B apart (SBO), a k16 step is 16 rows of 128 B; with 64B swizzle (one
    # 32-element atom) rows are 64 B: SBO 512, a k16 step 1024 B.
    A_LBO, A_KSTEP = (16, 32) if A_K_MAJOR else (MN_BOX_BYTES, 2048)
    B_LBO, B_KSTEP = (16, 32) if B_K_MAJOR else (MN_BOX_BYTES, 16 * B_SWIZZLE)
    B_SBO = 8 * B_SWIZZLE
    TNSP_A = 0 if A_K_MAJOR else 1
    TNSP_B = 0 if B_K_MAJOR else 1
    A_WG_OFF = WG_ROWS * 128  # consumer 1's 64 rows: 64 K-major rows, or the second M box
    EPI_COLS = cfg.epi_cols
    EPI_CHUNKS = BN // EPI_COLS
    EPI_ROW_BYTES = cfg.epi_swizzle
    EPI_GROUPS = EPI_COLS // 16  # stmatrix 16-column groups of a 16-bit sub-tile
    CONSUMERS, THREADS = cfg.consumers, cfg.threads
    CONSUMER_WARPS = 4 * CONSUMERS  # empty-barrier arrivals per CTA: one per consumer warp
    CM, CN = cfg.cluster_m, cfg.cluster_n
    CLUSTER = CM * CN
    if cfg.epilogue is None:
        PRODUCER_REGS, CONSUMER_REGS = REGS_CLUSTER if CLUSTER > 1 else REGS_NO_CLUSTER
    else:
        PRODUCER_REGS, CONSUMER_REGS = REGS_FUSED_CLUSTER if CLUSTER > 1 else REGS_FUSED
    # A CTA's slot is overwritten by multicasts from the CTAs of its tile row (A) and tile
    # column (B), so all of their consumers must release it: CM + CN - 1 CTAs' worth.
    EMPTY_ARRIVALS = CONSUMER_WARPS * (CM + CN - 1)
    A_PARTS = CN if A_K_MAJOR else CONSUMERS  # M-major A is 64-wide boxes
    A_PART_BYTES = A_TILE // CN  # K-major: BM/CN rows of 128 B; M-major: CN=2 -> one box
    B_PART_BYTES = B_TILE // CM
    DEBUG = cfg.debug
    EPI = cfg.epilogue
    FUSED = EPI is not None
    HAS_C = FUSED and EPI.c_dtype is not None
    C_OFF, C_BUF = cfg.c_offset, cfg.c_buf_bytes
    C_BAR_OFF = BAR_OFF + pipeline_barrier_bytes(S)
    C_ITEM = ELEMENT_BYTES[EPI.c_dtype] if HAS_C else 2
    C_BOX_COLS = c_box_cols(cfg) if HAS_C else EPI_COLS
    C_BOX_ROW = C_BOX_COLS * C_ITEM  # bytes: the box row is also its swizzle span
    C_BOX_BYTES = EPI_ROWS * C_BOX_ROW
    C_BOXES = EPI_COLS // C_BOX_COLS
    C_SWIZZLE_MASK = C_BOX_ROW // 16 - 1
    C_LIKE_OUT = C_ITEM == ELEMENT_BYTES[OUT_T]  # C's buffer is laid out as the output's
    MAPS = cfg.tensormaps  # A, B, D[, C]
    tile_terms, stage_columns, column_terms, apply = make_epilogue(EPI, BN) if FUSED else (None,) * 4
    VEC_OFF, VEC_BYTES = cfg.vec_offset, cfg.vec_bytes
    unpack = nh.unpack_bf16x2 if HAS_C and EPI.c_dtype == "bf16" else nh.unpack_f16x2
    STREAM_K = cfg.stream_k
    PARTIAL_BYTES = cfg.partial_bytes
    PARTIAL_QUADS = BN // 8  # float4s per thread: 4 * PARTIAL_QUADS = BN / 2 accumulators
    first_item, next_item = device_work_walk(STREAM_K)

    @cuda.jit(device=True, forceinline=True)
    def cta_coords():
        """``(rm, rn)``: this CTA's place in its cluster. Ranks run along M first: rank = rm + CM * rn."""
        rank = nh.cluster_ctarank() if CLUSTER > 1 else 0
        return rank % CM, rank // CM

    @cuda.jit(device=True, forceinline=True)
    def tile_walk(M, N, batches):
        """``(ctiles_m, ctiles_n, per_batch, num_tiles)``: the cluster tiles the CTAs walk.

        Cluster tiles cover CM x CN output tiles; a CTA whose tile falls past the edge (odd
        tile count) still loads its share for its peers: its own part is zero-filled by TMA
        and its store is clipped away. Work units: batch items, or slices of K.
        """
        ctiles_m = ((M + BM - 1) // BM + CM - 1) // CM
        ctiles_n = ((N + BN - 1) // BN + CN - 1) // CN
        per_batch = ctiles_m * ctiles_n
        return ctiles_m, ctiles_n, per_batch, batches * per_batch

    @cuda.jit(device=True, forceinline=True)
    def tile_origin(tile, per_batch, ctiles_m, ctiles_n, rm, rn):
        """``(batch, m0, n0)`` of this CTA's output tile in the CTA's ``tile``-th cluster tile.

        A fused kernel runs one product (gemm() neither batches nor splits K with an
        epilogue): batch 0, without the division.
        """
        b = 0 if FUSED else nh.div_u32(tile, per_batch)
        cm, cn = grouped_tile(tile - b * per_batch, ctiles_m, ctiles_n, GROUP_M)
        return b, (CM * cm + rm) * BM, (CN * cn + rn) * BN

    @cuda.jit(device=True, forceinline=True)
    def load_stage(smem, st, full, tmap_a, tmap_b, m0, n0, k0, ba, bb, rm, rn, a_mask, b_mask):
        """Issue this CTA's TMA loads of one k-block: its share of the A and B tiles.

        Without a cluster that is all of both. In a cluster, CTA (rm, rn) loads part rn of
        its A tile and part rm of its B tile, each multicast to every CTA that needs it.
        """
        a_dst = smem + st.stage * A_TILE
        b_dst = smem + B_OFF + st.stage * B_TILE
        if CN == 1:
            if A_K_MAJOR:
                nh.tma_load_3d(a_dst, tmap_a, k0, m0, ba, full)
            else:
                for i in range(A_PARTS):
                    nh.tma_load_3d(a_dst + i * MN_BOX_BYTES, tmap_a, m0 + 64 * i, k0, ba, full)
        elif A_K_MAJOR:
            rows = BM // CN
            nh.tma_load_multicast_3d(a_dst + rn * A_PART_BYTES, tmap_a, k0, m0 + rn * rows, ba, full, a_mask)
        else:
            nh.tma_load_multicast_3d(a_dst + rn * MN_BOX_BYTES, tmap_a, m0 + 64 * rn, k0, ba, full, a_mask)
        if CM == 1:
            if B_K_MAJOR:
                nh.tma_load_3d(b_dst, tmap_b, k0, n0, bb, full)
            else:
                for i in range(B_BOXES):
                    nh.tma_load_3d(b_dst + i * MN_BOX_BYTES, tmap_b, n0 + 64 * i, k0, bb, full)
        elif B_K_MAJOR:
            rows = BN // CM
            nh.tma_load_multicast_3d(b_dst + rm * B_PART_BYTES, tmap_b, k0, n0 + rm * rows, bb, full, b_mask)
        else:
            for i in range(B_BOXES // CM):
                box = rm * (B_BOXES // CM) + i
                nh.tma_load_multicast_3d(b_dst + box * MN_BOX_BYTES, tmap_b, n0 + 64 * box, k0, bb, full, b_mask)

    @cuda.jit(device=True, forceinline=True)
    def release(bars, st, rm, rn):
        """Give slot ``st`` back to every producer that multicasts into it (this warp's arrival)."""
        if CLUSTER == 1:
            consumer_release(bars, S, st)
        else:
            for r in range(CLUSTER):
                if r % CM == rm or r // CM == rn:
                    consumer_release_in(bars, S, st, r)

    @cuda.jit(device=True, forceinline=True)
    def mma_stage(acc, smem, st, cw, first):
        a_desc = nh.matrix_descriptor(smem + st.stage * A_TILE + cw * A_WG_OFF, A_LBO, 1024, 128, 0)
        b_desc = nh.matrix_descriptor(smem + B_OFF + st.stage * B_TILE, B_LBO, B_SBO, B_SWIZZLE, 0)
        nh.wgmma_fence()
        for kk in range(BLOCK_K // 16):
            scale_d = 0 if first and kk == 0 else 1
            acc = nh.wgmma_mma_async(
                acc,
                a_desc + np.uint64(kk * A_KSTEP // 16),
                b_desc + np.uint64(kk * B_KSTEP // 16),
                scale_d, IN_T, IN_T, 1, 1, TNSP_A, TNSP_B,
            )
        nh.wgmma_commit_group()
        return acc

    @cuda.jit(device=True, forceinline=True)
    def publish_partial(frag, workspace, slot, t, leader, cw):
        """Stream-K: store this consumer's partial sums to ``slot`` and raise its flag.

        Fragment order (float4 q of thread t at ``16 * (128 q + t)``): every store of a warp
        is 512 contiguous bytes, and the reader uses the same layout, so nothing is shuffled.
        The warpgroup's barrier orders every thread's stores before the leader's release.
        """
        base = workspace + slot * PARTIAL_BYTES + 16 * t
        for q in range(PARTIAL_QUADS):
            nh.st_global_v4_f32(base + 2048 * q, frag[4 * q], frag[4 * q + 1], frag[4 * q + 2], frag[4 * q + 3])
        nh.named_barrier_sync(1 + cw, 128)
        if leader:
            nh.st_release_gpu_u32(workspace + cuda.gridDim.x * 2 * PARTIAL_BYTES + 4 * slot, 1)

    @cuda.jit(device=True, forceinline=True)
    def add_partial(frag, workspace, slot, t, leader, cw):
        """Stream-K: add the partial sums in ``slot`` (the next CTA's), once they are there.

        The next CTA's run holds the rest of this tile's K loop; it published its partial
        (after adding its own next CTA's, if the tile goes on) before it could wait on this
        CTA, so the wait ends while every CTA is resident. Each tile's sum is taken in the
        same order on every run, so results are deterministic. The flag goes back to zero
        for the next launch.
        """
        flag = workspace + cuda.gridDim.x * 2 * PARTIAL_BYTES + 4 * slot
        if leader:
            while nh.ld_acquire_gpu_u32(flag) == 0:
                pass
            nh.st_global_u32(flag, 0)
        nh.named_barrier_sync(1 + cw, 128)
        base = workspace + slot * PARTIAL_BYTES + 16 * t
        for q in range(PARTIAL_QUADS):
            p = nh.ld_global_cg_v4_f32(base + 2048 * q)
            for e in range(4):
                frag[4 * q + e] += p[e]

    @cuda.jit(device=True, forceinline=True)
    def c_pair(cbuf, r, col):
        """C at (row ``r``, columns ``col``, ``col`` + 1) of the sub-tile in ``cbuf``, as f32."""
        byte = col * C_ITEM
        off = (byte // C_BOX_ROW) * C_BOX_BYTES + r * C_BOX_ROW + byte % C_BOX_ROW
        addr = cbuf + (off ^ (((off >> 7) & C_SWIZZLE_MASK) << 4))  # the TMA swizzle
        if C_ITEM == 4:
            return nh.ld_shared_v2_f32(addr)
        return unpack(nh.ld_shared_u32(addr))

    @cuda.jit(device=True, forceinline=True)
    def c_f32_pair(buf, addr, r, col, at):
        """C's pair at sub-tile (``r``, ``col``) for an f32 output pair stored at ``addr``."""
        if C_LIKE_OUT:  # the same offset in C's buffer
            return nh.ld_shared_v2_f32(addr + at[0])
        return c_pair(buf + at[0], r, col)

    @cuda.jit(device=True, forceinline=True)
    def c_quad(buf, addr, r, col, at):
        """C's four pairs of one stmatrix.x4 (pair x = 2h + j at (r + 8j, col + 8h))."""
        if C_LIKE_OUT:  # ldmatrix.x4 at stmatrix's addresses returns its registers
            regs = nh.ldmatrix_x4(addr + at[0])
            return unpack(regs[0]), unpack(regs[1]), unpack(regs[2]), unpack(regs[3])
        cbuf = buf + at[0]
        return (c_pair(cbuf, r, col), c_pair(cbuf, r + 8, col),
                c_pair(cbuf, r, col + 8), c_pair(cbuf, r + 8, col + 8))

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row_in_wg, j, col, c, ct, at):
        """Registers ``k``, ``k + 1`` (sub-tile row ``row_in_wg + 8j``, columns ``col``, ``col`` + 1), as stored.

        ``c``: C's f32 pair there (if any); ``ct``: the two columns' terms (:func:`columns`);
        ``at``: ``(C buffer - output buffer, row0, col0, M, N, ep, row terms of row0 +
        row_in_wg and of 8 rows down, staged column terms)`` of a fused epilogue (row0,
        col0: the sub-tile's first output row and column), ``()`` for a plain GEMM.
        """
        if not FUSED:
            return frag[k], frag[k + 1]
        row, col = at[1] + row_in_wg + 8 * j, at[2] + col
        M, N, ep = at[3], at[4], at[5]
        rt = at[6] if j == 0 else at[7]
        return (apply(frag[k], c[0], rt, ct[0], row, col, M, N, ep),
                apply(frag[k + 1], c[1], rt, ct[1], row, col + 1, M, N, ep))

    @cuda.jit(device=True, forceinline=True)
    def columns(q, col, at):
        """The staged terms of sub-tile ``q``'s columns ``col`` and ``col + 1`` (fused only)."""
        return column_terms(at[8], q * EPI_COLS + col) if FUSED else (0, 0)

    @cuda.jit(device=True, forceinline=True)
    def write_subtile(frag, buf, q, row_in_wg, lane, at):
        """Sub-tile ``q`` of this thread's accumulator fragment into swizzled ``buf``.

        Fragment of m64nNk16 (thread t, warp w = t // 32, lane l): register 4i + 2j + c
        holds row 16w + l//4 + 8j, column 8i + 2(l%4) + c. 128B swizzle: the 16-byte
        chunk ``c`` of row ``r`` lives at chunk ``c ^ (r % 8)`` (64B: ``c ^ ((r // 2) % 4)``).
        A fused epilogue (:func:`pair`) maps each pair of values on the way.
        """
        if OUT_T == "f32":
            for ii in range(4):  # 8-column groups of this 32-column sub-tile
                i = 4 * q + ii
                for j in range(2):
                    r = row_in_wg + 8 * j
                    byte = 32 * ii + 8 * (lane % 4)
                    addr = buf + r * 128 + (((byte // 16) ^ (r % 8)) * 16) + byte % 16
                    col = 8 * ii + 2 * (lane % 4)
                    k = 4 * i + 2 * j
                    c = c_f32_pair(buf, addr, r, col, at) if HAS_C else (frag[k], frag[k])
                    v0, v1 = pair(frag, k, row_in_wg, j, col, c, columns(q, col, at), at)
                    nh.st_shared_v2_f32(addr, v0, v1)
        else:
            # stmatrix.x4: matrix m (its row addresses from lanes 8m..8m+7) is the 8x8 block
            # at rows 8*(m%2), columns 8*(m//2) of a 16x16 block = registers 8P+2m, 8P+2m+1.
            m = lane // 8
            r = (row_in_wg - lane // 4) + 8 * (m % 2) + lane % 8
            for p in range(EPI_GROUPS):  # 16-column groups of this sub-tile
                base = 8 * (EPI_GROUPS * q + p)
                chunk = 2 * p + m // 2
                if EPI_ROW_BYTES == 128:
                    addr = buf + r * 128 + ((chunk ^ (r % 8)) * 16)
                else:  # 64-byte swizzle: chunk c of row r lives at chunk c ^ ((r // 2) % 4)
                    addr = buf + r * 64 + ((chunk ^ ((r // 2) % 4)) * 16)
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
                nh.stmatrix_x4(addr, regs[0], regs[1], regs[2], regs[3])

    pack = nh.pack_bf16x2 if OUT_T == "bf16" else nh.pack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def load_c(smem, cw, s, tmap, row0, col0, bc):
        """(Leader) start loading C's 64 x EPI_COLS sub-tile at (``row0``, ``col0``) as sub-tile
        ``s`` of this consumer's sequence: into buffer s % 2, completing phase s // 2 of that
        buffer's mbarrier."""
        slot = 2 * cw + s % 2
        bar = smem + C_BAR_OFF + 8 * slot
        nh.mbarrier_arrive_expect_tx(bar, C_BUF)
        for box in range(C_BOXES):
            nh.tma_load_3d(smem + C_OFF + slot * C_BUF + box * C_BOX_BYTES, tmap, col0 + box * C_BOX_COLS, row0, bc,
                           bar)

    @cuda.jit(device=True, forceinline=True)
    def epilogue_subtile(q, stores, args):
        """Sub-tile ``q`` of a tile (the CTA's ``stores``-th) to global memory; ``stores + 1``."""
        frag, smem, cw, leader, row_in_wg, lane, n0, row0, bc, tmap_d, tmap_c, M, N, ep, terms = args
        buf = smem + EPI_OFF + (2 * cw + stores % 2) * EPI_BUF_BYTES
        if leader:
            nh.bulk_wait_group_read(1)  # the store that last read buf is done
        nh.named_barrier_sync(1 + cw, 128)
        at = ()
        if FUSED:
            slot = 2 * cw + stores % 2
            if HAS_C:
                nh.mbarrier_wait_parity(smem + C_BAR_OFF + 8 * slot, (stores // 2) % 2)
            at = (smem + C_OFF + slot * C_BUF - buf, row0, n0 + q * EPI_COLS, M, N, ep, terms[0], terms[1],
                  smem + VEC_OFF + cw * VEC_BYTES)
        write_subtile(frag, buf, q, row_in_wg, lane, at)
        nh.fence_proxy_async()
        nh.named_barrier_sync(1 + cw, 128)
        if leader:
            nh.tma_store_3d(tmap_d, buf, n0 + q * EPI_COLS, row0, bc)
            nh.bulk_commit_group()
        if HAS_C and leader and q + 2 < EPI_CHUNKS:  # every thread has read C sub-tile q: refill its buffer
            load_c(smem, cw, stores + 2, tmap_c, row0, n0 + (q + 2) * EPI_COLS, bc)
        return stores + 1

    # q must be a constant in each sub-tile's code: LLVM leaves a loop over a fused epilogue
    # rolled, and a run-time q would index the fragment, moving it to local memory. The
    # plain kernel keeps its loop (LLVM unrolls it), so it compiles as it did before fusion.
    epilogue = (unrolled if FUSED else looped)(epilogue_subtile, EPI_CHUNKS)

    @cuda.jit(device=True, forceinline=True)
    def gemm_body(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split, dp_tiles, workspace,
                  debug_record, ep):
        tid = cuda.threadIdx.x
        wg = tid // 128
        smem = nh.dynamic_shared_base()
        bars = smem + BAR_OFF
        if tid == 0:
            if HAS_C:
                for slot in range(2 * CONSUMERS):
                    nh.mbarrier_init(smem + C_BAR_OFF + 8 * slot, 1)
            pipeline_init(bars, S, EMPTY_ARRIVALS)
        # Two producer warps publish this launch's tensor maps (scratch: the epilogue buffers,
        # unused until after the barrier below): warp 0 the producer's, warp 1 the epilogue's.
        tmap_a, tmap_b = tensormap_slot(slots, MAPS, 0), tensormap_slot(slots, MAPS, 1)
        tmap_d, tmap_c = tensormap_slot(slots, MAPS, 2), tensormap_slot(slots, MAPS, MAPS - 1)
        scratch = smem + EPI_OFF
        if tid < 32:
            publish_tensormap(maps[0], addresses[0], scratch, tmap_a)
            publish_tensormap(maps[1], addresses[1], scratch + 128, tmap_b)
        elif tid < 64:
            publish_tensormap(maps[2], addresses[2], scratch + 256, tmap_d)
            if HAS_C:
                publish_tensormap(maps[MAPS - 1], addresses[MAPS - 1], scratch + 384, tmap_c)
        # CTA (rm, rn) of a cluster computes output tile (CM*cm + rm, CN*cn + rn) of cluster
        # tile (cm, cn).
        rm, rn = cta_coords()
        a_mask = 0  # ranks sharing this CTA's A tile (same rm) / B tile (same rn)
        b_mask = 0
        for j in range(CN):
            a_mask |= 1 << (rm + CM * j)
        for i in range(CM):
            b_mask |= 1 << (i + CM * rn)
        if CLUSTER > 1:
            nh.cluster_sync()  # every barrier of the cluster is initialized before any use
        else:
            cuda.syncthreads()

        # Work units: batch items (A/B batch coordinate b * a_batched / b * b_batched), or
        # slices of K (k_split k-blocks each, unit b writing partial sums to batch b of C).
        ctiles_m, ctiles_n, per_batch, num_tiles = tile_walk(M, N, batches)
        k_blocks = k_split if k_split else (K + BLOCK_K - 1) // BLOCK_K
        cta = cuda.blockIdx.x // CLUSTER
        ctas = cuda.gridDim.x // CLUSTER
        if not STREAM_K:
            dp_tiles = num_tiles

        if wg == 0:
            if CONSUMERS == 2:
                nh.setmaxnreg_dec(PRODUCER_REGS)
            if tid < 32 and nh.elect_sync():
                nh.fence_proxy_tensormap_acquire(tmap_a)
                nh.fence_proxy_tensormap_acquire(tmap_b)
                st = PipelineState(0, 0)
                item = first_item(cta, ctas, dp_tiles, num_tiles, k_blocks)
                while item[0] < num_tiles:
                    tile, k_begin, k_end = item
                    b, m0, n0 = tile_origin(tile, per_batch, ctiles_m, ctiles_n, rm, rn)
                    k_first = b * k_split
                    for kb in range(k_begin, k_end):
                        # Debug builds bound the wait; release builds pass None (compiled out).
                        producer_acquire(bars, S, st, debug_site(debug_record, tile, kb) if DEBUG else None)
                        full = producer_commit(bars, st, STAGE_TX)
                        load_stage(smem, st, full, tmap_a, tmap_b, m0, n0, (k_first + kb) * BLOCK_K,
                                   b * a_batched, b * b_batched, rm, rn, a_mask, b_mask)
                        st = pipeline_advance(st, S)
                    item = next_item(item, cta, ctas, dp_tiles, num_tiles, k_blocks)
        else:
            if CONSUMERS == 2:
                nh.setmaxnreg_inc(CONSUMER_REGS)
            cw = wg - 1
            t = tid - 128 * wg  # thread in the consumer warpgroup
            lane = t % 32
            row_in_wg = 16 * (t // 32) + lane // 4
            leader = t == 0
            if leader:
                nh.fence_proxy_tensormap_acquire(tmap_d)
            if HAS_C and leader:
                nh.fence_proxy_tensormap_acquire(tmap_c)
            acc = nh.wgmma_accumulator(BN, "f32")
            st = PipelineState(0, 0)
            stores = 0
            item = first_item(cta, ctas, dp_tiles, num_tiles, k_blocks)
            while item[0] < num_tiles:
                tile, k_begin, k_end = item
                bc, m0, n0 = tile_origin(tile, per_batch, ctiles_m, ctiles_n, rm, rn)
                # The epilogue's row and column terms, loaded now so that they land during the main loop.
                terms = tile_terms(m0 + cw * WG_ROWS + row_in_wg, n0, t, M, N, ep) if FUSED else ()
                if HAS_C and leader:  # C's first two sub-tiles land during the main loop
                    for q in range(min(2, EPI_CHUNKS)):
                        load_c(smem, cw, stores + q, tmap_c, m0 + cw * WG_ROWS, n0 + q * EPI_COLS, bc)
                prev = st
                for kb in range(k_begin, k_end):
                    consumer_wait(bars, st, debug_site(debug_record, tile, kb) if DEBUG else None)
                    acc = mma_stage(acc, smem, st, cw, kb == k_begin)
                    nh.wgmma_wait_group(1)  # k-block kb-1 is done reading its slot
                    if kb > k_begin and lane == 0:
                        release(bars, prev, rm, rn)
                    prev = st
                    st = pipeline_advance(st, S)
                nh.wgmma_wait_group(0)
                if k_end > k_begin and lane == 0:
                    release(bars, prev, rm, rn)

                frag = nh.tuple_as_array(acc)
                if STREAM_K and k_end < k_blocks:  # the next CTA did the rest of the K loop
                    add_partial(frag, workspace, 2 * (cta + 1) + cw, t, leader, cw)
                if STREAM_K and k_begin > 0:  # and the previous CTA finishes the tile
                    publish_partial(frag, workspace, 2 * cta + cw, t, leader, cw)
                else:
                    row0 = m0 + cw * WG_ROWS
                    if FUSED:  # the previous epilogue's reads are behind its last barrier
                        stage_columns(smem + VEC_OFF + cw * VEC_BYTES, t, terms[2])
                    stores = epilogue(stores, (frag, smem, cw, leader, row_in_wg, lane, n0, row0, bc, tmap_d,
                                               tmap_c, M, N, ep, terms))
                item = next_item(item, cta, ctas, dp_tiles, num_tiles, k_blocks)
            if leader:
                nh.bulk_wait_group(0)
        if CLUSTER > 1:
            # No CTA may exit while a peer can still arrive on its barriers or multicast
            # into its shared memory.
            cuda.syncwarp()
            nh.cluster_sync()

    if not FUSED:
        @cuda.jit(launch_bounds=(THREADS, 1))
        def gemm_kernel(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split, dp_tiles,
                        workspace, debug_record):
            gemm_body(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split, dp_tiles,
                      workspace, debug_record, ())

        return gemm_kernel

    @cuda.jit(launch_bounds=(THREADS, 1))
    def gemm_kernel(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split, dp_tiles, workspace,
                    debug_record, ep):
        gemm_body(maps, addresses, slots, M, N, K, batches, a_batched, b_batched, k_split, dp_tiles, workspace,
                  debug_record, ep)

    return gemm_kernel


def unrolled(step, n):
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


def looped(step, n):
    """``run(x, args)`` as :func:`unrolled`, as a plain loop (left to LLVM to unroll)."""

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


def c_box_cols(cfg: GemmConfig):
    """Columns of one TMA box of the residual C: ``epi_cols``, at most 128 bytes of them."""
    return min(cfg.epi_cols, 128 // ELEMENT_BYTES[cfg.epilogue.c_dtype])
