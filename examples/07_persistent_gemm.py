"""A persistent, warp-specialized bf16 GEMM from the kit's public parts: C = A @ B.

A (M, K) and B (K, N) are row-major bf16, C (M, N) row-major bf16, f32 accumulation. One CTA
per SM walks 128 x 256 output tiles in grouped order (``kit.scheduler``). Its three
warpgroups (``kit.warpspec``):

- the producer (40 registers after ``setmaxnreg``): one elected thread streams each tile's
  64-wide k-blocks of A (one 128 x 64 box, K-major) and B (four 64 x 64 boxes, N-major)
  through a 4-slot TMA ring (``kit.pipeline``);
- two consumers (232 registers), each owning 64 rows of the tile: per k-block, four
  ``wgmma.m64n256k16`` on the slot's tiles (descriptors from ``kit.layouts``, slot 0's
  advanced by whole slots), ``wgmma.wait_group(1)`` so the next k-block's wgmmas are queued
  before the previous slot is released, then the tile to C through ``stmatrix``, a swizzled
  shared buffer (two per consumer) and a TMA store (``kit.epilogue``), which drains while the
  next tile's mainloop runs.

The loop state is 32-bit (numba's default 64-bit integers cost each k-block a few
instructions) and the warpgroup index is warp-uniform (``warpgroup_index``), so the
consumers' descriptors stay in uniform registers. Partial tiles need no code: TMA zero-fills
loads past the matrices and drops stores past C.

    python examples/07_persistent_gemm.py             # on a Hopper GPU: checks a ragged product
    python examples/07_persistent_gemm.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
    python benchmarks/bench_kit_gemm.py               # against torch.matmul (cuBLAS)
"""

import numpy as np
from numba import cuda
from numba.cuda import types

from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, SmemPlan, make_descriptors, make_mma, make_ring, make_tile_loads,
                              make_tile_scheduler, make_tile_store, operand_layout, warp_specialization)
from numba_hopper.kit.host import TENSORMAP_ARG, operand_tensor_map, persistent_grid, prepare_launch, tensor_map_arg
from numba_hopper.tools.cli import run_example

BM, BN, BK, STAGES, CONSUMERS, GROUP_M = 128, 256, 64, 4, 2, 8
A = operand_layout("K", 128, "bf16", mn=BM, k=BK)  # a 128 x 64 tile: one box, rows of 128 bytes of K
B = operand_layout("MN", 128, "bf16", mn=BN, k=BK)  # 64 k rows x 256 columns: four 64 x 64 boxes
WS = warp_specialization(consumers=CONSUMERS, producer_regs=40)  # 384 threads: 40 / 232 registers
# each slot is released by lane 0 of every consumer warp: 4 arrivals per consumer warpgroup
RING = make_ring(STAGES, consumer_arrivals=4 * CONSUMERS, tx_bytes=A.tile_bytes + B.tile_bytes)
STORE = make_tile_store(BN, "bf16", buffers=2)
SCHED = make_tile_scheduler(BM, BN, raster="grouped", group_m=GROUP_M)
EPI = NamedBarriers().allocate("epilogue", CONSUMERS)  # one named barrier per consumer warpgroup
A_DESC, B_DESC = make_descriptors(A), make_descriptors(B)
A_LOADS, B_LOADS = make_tile_loads(A), make_tile_loads(B)
MMA = make_mma(A, B)  # a k-block: wgmma.fence, four m64n256k16 (transposed B), commit

PLAN = SmemPlan()
A_RING = PLAN.add("a", STAGES * A.tile_bytes, A.alignment)
B_RING = PLAN.add("b", STAGES * B.tile_bytes, B.alignment)
EPI_BUFS = PLAN.add("epilogue", CONSUMERS * STORE.buffer_bytes, 1024)
BARS = PLAN.add("barriers", RING.barrier_bytes, 8)
A_ROWS_64 = A.mn_offset(64)  # bytes from an A tile to its second consumer's 64 rows


@cuda.jit(device=True, forceinline=True)
def init(args):
    smem = nh.dynamic_shared_base()
    RING.init(smem + BARS)
    for m in args[:3]:
        nh.prefetch_tensormap(nh.tensormap_param_address(m))


@cuda.jit(device=True, forceinline=True)
def producer(args):
    map_a, map_b, _, M, N, K = args
    if cuda.threadIdx.x < 32 and nh.elect_sync():
        smem = nh.dynamic_shared_base()
        tmap_a, tmap_b = nh.tensormap_param_address(map_a), nh.tensormap_param_address(map_b)
        k_blocks = np.int32((K + BK - 1) // BK)
        work = SCHED.work(M, N, 1)
        st = RING.start()
        tile = SCHED.first()
        while tile < work.num_tiles:
            t = SCHED.origin(work, tile)
            for kb in range(k_blocks):
                full = RING.acquire(smem + BARS, st)
                A_LOADS.load(smem + A_RING + st.stage * A.tile_bytes, tmap_a, t.m0, kb * BK, full)
                B_LOADS.load(smem + B_RING + st.stage * B.tile_bytes, tmap_b, t.n0, kb * BK, full)
                st = RING.advance(st)
            tile = SCHED.next(tile)


@cuda.jit(device=True, forceinline=True)
def consumer(cw, t, args):
    _, _, map_c, M, N, K = args
    smem = nh.dynamic_shared_base()
    bars, tmap_c = smem + BARS, nh.tensormap_param_address(map_c)
    a0 = A_DESC.at(smem + A_RING + A_ROWS_64 * cw)  # this warpgroup's 64 rows, slot 0
    b0 = B_DESC.at(smem + B_RING)
    epi_buf = smem + EPI_BUFS + cw * STORE.buffer_bytes
    lane = np.int32(t % 32)
    k_blocks = np.int32((K + BK - 1) // BK)
    work = SCHED.work(M, N, 1)
    st = RING.start()
    stores = np.int32(0)
    tile = SCHED.first()
    while tile < work.num_tiles:
        origin = SCHED.origin(work, tile)
        acc = MMA.accumulator()
        previous = st
        for kb in range(k_blocks):
            RING.wait(bars, st)
            a_desc = A_DESC.advance(a0, st.stage, A.tile_bytes)  # slot 0's descriptors, whole slots on
            acc = MMA.k_block(acc, a_desc, B_DESC.advance(b0, st.stage, B.tile_bytes), kb == 0)
            nh.wgmma_wait_group(1)  # the previous k-block's wgmmas are done reading their slot
            if kb > 0 and lane == 0:
                RING.release(bars, previous)
            previous = st
            st = RING.advance(st)
        nh.wgmma_wait_group(0)
        if k_blocks > 0 and lane == 0:
            RING.release(bars, previous)
        stores = STORE.tile(acc, epi_buf, t, EPI + cw, tmap_c, origin.m0 + 64 * cw, origin.n0, stores)
        tile = SCHED.next(tile)
    STORE.drain(t)


BODY = WS.body(init, producer, consumer)


@cuda.jit(launch_bounds=WS.launch_bounds)
def persistent_gemm(map_a, map_b, map_c, M, N, K):
    BODY((map_a, map_b, map_c, np.uint32(M), np.uint32(N), np.uint32(K)))


def prepare(a, b, c):
    """The launch of ``c = a @ b`` on device arrays (bf16 bits in uint16, or bf16 torch tensors),
    tensor maps encoded once: call it with a stream (None: the default stream). Nothing is copied."""
    M, K = a.shape
    N = b.shape[1]
    maps = (operand_tensor_map(a, A), operand_tensor_map(b, B),
            tensor_map_arg(c, STORE.box, swizzle=STORE.swizzle, dtype="bf16"))
    tiles = -(-M // BM) * -(-N // BN)
    return prepare_launch(persistent_gemm, persistent_grid(tiles), WS.threads, (*maps, M, N, K), shared_mem=PLAN.size)


def main():
    rng = np.random.default_rng()
    M, N, K = 1000, 1496, 776  # partial tiles in every dimension (rows 16-byte aligned, as TMA needs)
    bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    a, b = bits(rng.standard_normal((M, K))), bits(rng.standard_normal((K, N)))
    value = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    c = cuda.to_device(np.full((M, N), 0x7FC0, np.uint16))  # NaN-poisoned
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)  # (alive until the kernel is done: the maps hold addresses)
    prepare(d_a, d_b, c)()
    ref = value(a) @ value(b)
    err = np.linalg.norm(value(c.copy_to_host()) - ref) / np.linalg.norm(ref)
    print(f"persistent {BM}x{BN} GEMM {M}x{N}x{K}, {PLAN.size} B of shared memory: relative error {err:.1e}: "
          f"{'OK' if err < 1e-2 else 'FAILED'}")
    assert err < 1e-2


SIGNATURE = (TENSORMAP_ARG, TENSORMAP_ARG, TENSORMAP_ARG, types.int64, types.int64, types.int64)
KERNELS = [(persistent_gemm, SIGNATURE)]  # what --inspect compiles

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
