"""Warp-specialized, persistent TMA + wgmma GEMM for sm_90a: ``C = A @ B``.

One CTA per SM, 384 threads in three warpgroups (seed 000, sections 7-9):

- warpgroup 0, the producer: gives registers back (``setmaxnreg.dec``); one elected
  thread walks the CTA's tiles and k-blocks, waits for a free ring slot and issues the TMA
  loads of an A tile (BM x 64) and a B tile (64 x BN) into it;
- warpgroups 1 and 2, the consumers: take registers (``setmaxnreg.inc``); each owns 64
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

Layouts: a K-major operand (A row-major, B column-major) is loaded as one box of 64
k-elements (128 bytes, the 128B swizzle span) by BM or BN rows. An MN-major operand
(A column-major, B row-major) is loaded as 64 x 64 boxes stacked along M/N and read by
wgmma with the transpose bit. Partial tiles need no code: TMA zero-fills loads outside
the tensor and clips stores.

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
from .scheduler import grouped_tile

__all__ = ["GemmConfig", "make_gemm_kernel", "GEMM_THREADS"]

GEMM_THREADS = 384
WG_ROWS = 64  # rows of the output tile per consumer warpgroup (wgmma M)
BLOCK_K = 64  # one 128-byte swizzle row of 16-bit elements
EPI_ROWS = 64
EPI_BUF_BYTES = EPI_ROWS * 128  # one 128-byte-wide swizzled sub-tile
# Register budgets after setmaxnreg (128 * producer + 256 * consumer <= 64K registers). The
# cluster producer also computes multicast masks and peer offsets: at 40 it spills.
REGS_NO_CLUSTER = (40, 232)
REGS_CLUSTER = (56, 224)
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4}


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time configuration of one GEMM kernel.

    ``a_major``: "K" (A row-major) or "M" (A column-major); ``b_major``: "K" (B
    column-major) or "N" (B row-major). The output is always row-major (the host swaps
    operands for a column-major output). ``debug``: bounded mbarrier waits that fill the
    kernel's debug record and trap on a hang (``numba_hopper.debug``); False compiles none
    of that code.
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

    def __post_init__(self):
        if self.in_dtype not in ("bf16", "f16"):
            raise ValueError(f"in_dtype must be 'bf16' or 'f16', got {self.in_dtype!r}")
        if self.out_dtype not in ELEMENT_BYTES:
            raise ValueError(f"out_dtype must be one of {tuple(ELEMENT_BYTES)}, got {self.out_dtype!r}")
        if self.a_major not in ("K", "M") or self.b_major not in ("K", "N"):
            raise ValueError(f"bad operand majors {self.a_major!r}, {self.b_major!r}")
        if self.block_m != 2 * WG_ROWS:
            raise ValueError("block_m must be 128 (two consumer warpgroups of 64 rows)")
        if self.block_n % 64 or not 64 <= self.block_n <= 256:
            raise ValueError(f"block_n must be 64, 128, 192 or 256, got {self.block_n}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if self.split_k < 1:
            raise ValueError(f"split_k must be >= 1, got {self.split_k}")
        if self.cluster_m not in (1, 2) or self.cluster_n not in (1, 2):
            raise ValueError(f"cluster_m and cluster_n must be 1 or 2, got {self.cluster_m}x{self.cluster_n}")

    @property
    def cluster_size(self):
        return self.cluster_m * self.cluster_n

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
        return (1, BLOCK_K, 64)

    @property
    def c_box(self):
        return (1, EPI_ROWS, self.epi_cols)

    # --- shared-memory layout (bytes from the 1024-aligned dynamic base) ---
    @property
    def a_tile_bytes(self):
        return self.block_m * BLOCK_K * 2

    @property
    def b_tile_bytes(self):
        return self.block_n * BLOCK_K * 2

    @property
    def epi_cols(self):
        """Columns of one epilogue sub-tile: 128 bytes of output elements."""
        return 128 // ELEMENT_BYTES[self.out_dtype]

    @property
    def b_offset(self):
        return self.stages * self.a_tile_bytes

    @property
    def epi_offset(self):
        return self.b_offset + self.stages * self.b_tile_bytes

    @property
    def barrier_offset(self):
        return self.epi_offset + 4 * EPI_BUF_BYTES  # 2 consumers x 2 buffers

    @property
    def shared_bytes(self):
        return self.barrier_offset + pipeline_barrier_bytes(self.stages)


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

    Arguments ``(tmap_a, tmap_b, tmap_c, M, N, K, batches, a_batched, b_batched, k_split,
    debug_record)``: ``tmap_*`` are device addresses of 3-D TMA descriptors
    (:mod:`numba_hopper.tensormap`), batch outermost: A and B with 128-byte swizzle and the
    boxes of ``cfg.a_box`` / ``cfg.b_box``, C with box ``cfg.c_box`` and 128-byte swizzle.
    The grid computes ``batches`` units: batch items (``a_batched``/``b_batched`` are 1, or
    0 for an operand broadcast over the batch) or, with ``k_split`` > 0, slices of
    ``k_split`` k-blocks of one product whose partial sums go to batch ``b`` of C.
    ``debug_record``: the device address of a ``numba_hopper.debug.DebugRecord`` (read
    only if ``cfg.debug``).
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
    B_BOXES = BN // 64
    # wgmma descriptors (128B swizzle). K-major: 8-row groups 1024 B apart (SBO), a k16 step
    # is 32 B along the swizzled row. MN-major: 64-element MN atoms one box apart (LBO),
    # 8-k groups 1024 B apart (SBO), a k16 step is 16 rows of 128 B.
    A_LBO, A_KSTEP = (16, 32) if A_K_MAJOR else (MN_BOX_BYTES, 2048)
    B_LBO, B_KSTEP = (16, 32) if B_K_MAJOR else (MN_BOX_BYTES, 2048)
    TNSP_A = 0 if A_K_MAJOR else 1
    TNSP_B = 0 if B_K_MAJOR else 1
    A_WG_OFF = WG_ROWS * 128  # consumer 1's 64 rows: 64 K-major rows, or the second M box
    EPI_COLS = cfg.epi_cols
    EPI_CHUNKS = BN // EPI_COLS
    CONSUMER_WARPS = 8  # empty-barrier arrivals per CTA: one per consumer warp
    CM, CN = cfg.cluster_m, cfg.cluster_n
    CLUSTER = CM * CN
    PRODUCER_REGS, CONSUMER_REGS = REGS_CLUSTER if CLUSTER > 1 else REGS_NO_CLUSTER
    # A CTA's slot is overwritten by multicasts from the CTAs of its tile row (A) and tile
    # column (B), so all of their consumers must release it: CM + CN - 1 CTAs' worth.
    EMPTY_ARRIVALS = CONSUMER_WARPS * (CM + CN - 1)
    A_PARTS = CN if A_K_MAJOR else 2  # M-major A is two 64-wide boxes
    B_PARTS = B_BOXES if not B_K_MAJOR else 1
    A_PART_BYTES = A_TILE // CN  # K-major: BM/CN rows of 128 B; M-major: CN=2 -> one box
    B_PART_BYTES = B_TILE // CM
    DEBUG = cfg.debug

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
        b_desc = nh.matrix_descriptor(smem + B_OFF + st.stage * B_TILE, B_LBO, 1024, 128, 0)
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
    def write_subtile(frag, buf, q, row_in_wg, lane):
        """Sub-tile ``q`` of this thread's accumulator fragment into swizzled ``buf``.

        Fragment of m64nNk16 (thread t, warp w = t // 32, lane l): register 4i + 2j + c
        holds row 16w + l//4 + 8j, column 8i + 2(l%4) + c. 128B swizzle: the 16-byte
        chunk ``c`` of row ``r`` lives at chunk ``c ^ (r % 8)``.
        """
        if OUT_T == "f32":
            for ii in range(4):  # 8-column groups of this 32-column sub-tile
                i = 4 * q + ii
                for j in range(2):
                    r = row_in_wg + 8 * j
                    byte = 32 * ii + 8 * (lane % 4)
                    addr = buf + r * 128 + (((byte // 16) ^ (r % 8)) * 16) + byte % 16
                    nh.st_shared_v2_f32(addr, frag[4 * i + 2 * j], frag[4 * i + 2 * j + 1])
        else:
            # stmatrix.x4: matrix m (its row addresses from lanes 8m..8m+7) is the 8x8 block
            # at rows 8*(m%2), columns 8*(m//2) of a 16x16 block = registers 8P+2m, 8P+2m+1.
            m = lane // 8
            r = (row_in_wg - lane // 4) + 8 * (m % 2) + lane % 8
            for p in range(4):  # 16-column groups of this 64-column sub-tile
                base = 8 * (4 * q + p)
                regs = (
                    pack(frag[base + 0], frag[base + 1]),
                    pack(frag[base + 2], frag[base + 3]),
                    pack(frag[base + 4], frag[base + 5]),
                    pack(frag[base + 6], frag[base + 7]),
                )
                chunk = 2 * p + m // 2
                addr = buf + r * 128 + ((chunk ^ (r % 8)) * 16)
                nh.stmatrix_x4(addr, regs[0], regs[1], regs[2], regs[3])

    pack = nh.pack_bf16x2 if OUT_T == "bf16" else nh.pack_f16x2

    @cuda.jit(launch_bounds=(GEMM_THREADS, 1))
    def gemm_kernel(tmap_a, tmap_b, tmap_c, M, N, K, batches, a_batched, b_batched, k_split, debug_record):
        tid = cuda.threadIdx.x
        wg = tid // 128
        smem = nh.dynamic_shared_base()
        bars = smem + BAR_OFF
        if tid == 0:
            pipeline_init(bars, S, EMPTY_ARRIVALS)
        # CTA (rm, rn) of a cluster computes output tile (CM*cm + rm, CN*cn + rn) of cluster
        # tile (cm, cn). Ranks run along M first: rank = rm + CM * rn.
        rank = nh.cluster_ctarank() if CLUSTER > 1 else 0
        rm = rank % CM
        rn = rank // CM
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

        tiles_m = (M + BM - 1) // BM
        tiles_n = (N + BN - 1) // BN
        # Cluster tiles cover CM x CN output tiles; a CTA whose tile falls past the edge
        # (odd tile count) still loads its share for its peers: its own part is zero-filled
        # by TMA and its store is clipped away.
        ctiles_m = (tiles_m + CM - 1) // CM
        ctiles_n = (tiles_n + CN - 1) // CN
        # Work units: batch items (A/B batch coordinate b * a_batched / b * b_batched), or
        # slices of K (k_split k-blocks each, unit b writing partial sums to batch b of C).
        per_batch = ctiles_m * ctiles_n
        num_tiles = batches * per_batch
        k_blocks = k_split if k_split else (K + BLOCK_K - 1) // BLOCK_K
        first_tile = cuda.blockIdx.x // CLUSTER
        tile_step = cuda.gridDim.x // CLUSTER

        if wg == 0:
            nh.setmaxnreg_dec(PRODUCER_REGS)
            if tid < 32 and nh.elect_sync():
                nh.fence_proxy_tensormap_acquire(tmap_a)
                nh.fence_proxy_tensormap_acquire(tmap_b)
                st = PipelineState(0, 0)
                tile = first_tile
                while tile < num_tiles:
                    b = tile // per_batch
                    cm, cn = grouped_tile(tile - b * per_batch, ctiles_m, ctiles_n, GROUP_M)
                    m0 = (CM * cm + rm) * BM
                    n0 = (CN * cn + rn) * BN
                    k_first = b * k_split
                    for kb in range(k_blocks):
                        # Debug builds bound the wait; release builds pass None (compiled out).
                        producer_acquire(bars, S, st, debug_site(debug_record, tile, kb) if DEBUG else None)
                        full = producer_commit(bars, st, STAGE_TX)
                        load_stage(smem, st, full, tmap_a, tmap_b, m0, n0, (k_first + kb) * BLOCK_K,
                                   b * a_batched, b * b_batched, rm, rn, a_mask, b_mask)
                        st = pipeline_advance(st, S)
                    tile += tile_step
        else:
            nh.setmaxnreg_inc(CONSUMER_REGS)
            cw = wg - 1
            t = tid - 128 * wg  # thread in the consumer warpgroup
            lane = t % 32
            row_in_wg = 16 * (t // 32) + lane // 4
            leader = t == 0
            if leader:
                nh.fence_proxy_tensormap_acquire(tmap_c)
            acc = nh.wgmma_accumulator(BN, "f32")
            st = PipelineState(0, 0)
            stores = 0
            tile = first_tile
            while tile < num_tiles:
                bc = tile // per_batch
                cm, cn = grouped_tile(tile - bc * per_batch, ctiles_m, ctiles_n, GROUP_M)
                m0 = (CM * cm + rm) * BM
                n0 = (CN * cn + rn) * BN
                prev = st
                for kb in range(k_blocks):
                    consumer_wait(bars, st, debug_site(debug_record, tile, kb) if DEBUG else None)
                    acc = mma_stage(acc, smem, st, cw, kb == 0)
                    nh.wgmma_wait_group(1)  # k-block kb-1 is done reading its slot
                    if kb > 0 and lane == 0:
                        release(bars, prev, rm, rn)
                    prev = st
                    st = pipeline_advance(st, S)
                nh.wgmma_wait_group(0)
                if k_blocks > 0 and lane == 0:
                    release(bars, prev, rm, rn)

                row0 = m0 + cw * WG_ROWS
                frag = nh.tuple_as_array(acc)
                for q in range(EPI_CHUNKS):
                    buf = smem + EPI_OFF + (2 * cw + stores % 2) * EPI_BUF_BYTES
                    if leader:
                        nh.bulk_wait_group_read(1)  # the store that last read buf is done
                    nh.named_barrier_sync(1 + cw, 128)
                    write_subtile(frag, buf, q, row_in_wg, lane)
                    nh.fence_proxy_async()
                    nh.named_barrier_sync(1 + cw, 128)
                    if leader:
                        nh.tma_store_3d(tmap_c, buf, n0 + q * EPI_COLS, row0, bc)
                        nh.bulk_commit_group()
                    stores += 1
                tile += tile_step
            if leader:
                nh.bulk_wait_group(0)
        if CLUSTER > 1:
            # No CTA may exit while a peer can still arrive on its barriers or multicast
            # into its shared memory.
            cuda.syncwarp()
            nh.cluster_sync()

    return gemm_kernel
