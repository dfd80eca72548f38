"""A pipelined bf16 GEMM tile by tile, one warpgroup per CTA: C = A @ B with the kit's parts.

Each CTA computes one 64 x 256 tile of C (bf16, f32 accumulation) from A (M, K) and B (K, N),
both row-major. Its 128 threads are one warpgroup that both loads and computes:

- ``kit.layouts`` names the shared tiles: A's 64 x 64 k-block K-major with 128-byte swizzle
  (one TMA box), B's 64 x 256 k-block N-major (four 64 x 64 boxes, read by wgmma with the
  transpose bit), their descriptors and k-steps (``make_mma``);
- ``kit.pipeline`` is the ring: ``STAGES`` slots, each with a ``full`` barrier the TMA loads
  complete and an ``empty`` barrier that the four warps release (``consumer_arrivals=4``:
  lane 0 of each);
- thread 0 first fills ``STAGES - 1`` slots; then for each k-block every thread waits for its
  slot, the warpgroup issues four ``wgmma.m64n256k16``, waits until at most one k-block's
  wgmmas are in flight (``wait_group(1)``), releases the previous slot, and thread 0 refills
  a slot ``STAGES - 1`` k-blocks ahead, so loads overlap the wgmmas;
- ``kit.epilogue`` stores the tile: bf16 pairs, ``stmatrix`` into a 128-byte-swizzled buffer,
  one TMA store per 64 columns.

What this leaves on the table (examples 06 and 07): the loads are issued by a thread that also
computes, and each CTA pays its own prologue and epilogue.

    python examples/05_pipelined_gemm.py             # on a Hopper GPU
    python examples/05_pipelined_gemm.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda
from numba.cuda import types

from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, SmemPlan, make_descriptors, make_mma, make_ring, make_tile_loads,
                              make_tile_store, operand_layout)
from numba_hopper.kit.host import TENSORMAP_ARG, launch, operand_tensor_map, tensor_map_arg
from numba_hopper.tools.cli import run_example

BM, BN, BK, STAGES = 64, 256, 64, 4
A = operand_layout("K", 128, "bf16", mn=BM, k=BK)
B = operand_layout("MN", 128, "bf16", mn=BN, k=BK)
RING = make_ring(STAGES, consumer_arrivals=4, tx_bytes=A.tile_bytes + B.tile_bytes)
STORE = make_tile_store(BN, "bf16", buffers=1)
EPI = NamedBarriers().allocate("epilogue")
A_DESC, B_DESC, MMA = make_descriptors(A), make_descriptors(B), make_mma(A, B)
A_LOADS, B_LOADS = make_tile_loads(A), make_tile_loads(B)

PLAN = SmemPlan()
A_RING = PLAN.add("a", STAGES * A.tile_bytes, A.alignment)
B_RING = PLAN.add("b", STAGES * B.tile_bytes, B.alignment)
OUT = PLAN.add("out", STORE.buffer_bytes, 1024)
BARS = PLAN.add("barriers", RING.barrier_bytes, 8)


@cuda.jit(device=True, forceinline=True)
def load(smem, st, tmap_a, tmap_b, m0, n0, kb):
    """Thread 0: wait for slot ``st`` to be free, then load k-block ``kb`` of the tile into it."""
    full = RING.acquire(smem + BARS, st)
    A_LOADS.load(smem + A_RING + st.stage * A.tile_bytes, tmap_a, m0, kb * BK, full)
    B_LOADS.load(smem + B_RING + st.stage * B.tile_bytes, tmap_b, n0, kb * BK, full)


@cuda.jit(launch_bounds=(128, 1))
def pipelined_gemm(map_a, map_b, map_c, N, K):
    smem = nh.dynamic_shared_base()
    tmap_a, tmap_b = nh.tensormap_param_address(map_a), nh.tensormap_param_address(map_b)
    t = np.int32(cuda.threadIdx.x)
    tiles_n = (N + BN - 1) // BN
    m0, n0 = (cuda.blockIdx.x // tiles_n) * BM, (cuda.blockIdx.x % tiles_n) * BN
    k_blocks = np.int32((K + BK - 1) // BK)
    if t == 0:
        RING.init(smem + BARS)  # (fences its inits: fence.mbarrier_init)
    cuda.syncthreads()

    loads = RING.start()  # thread 0's producer state, STAGES - 1 slots ahead
    if t == 0:
        for kb in range(min(STAGES - 1, k_blocks)):
            load(smem, loads, tmap_a, tmap_b, m0, n0, kb)
            loads = RING.advance(loads)
    acc = MMA.accumulator()
    a0, b0 = A_DESC.at(smem + A_RING), B_DESC.at(smem + B_RING)
    st = RING.start()
    previous = st
    for kb in range(k_blocks):
        RING.wait(smem + BARS, st)
        acc = MMA.k_block(acc, A_DESC.advance(a0, st.stage, A.tile_bytes), B_DESC.advance(b0, st.stage, B.tile_bytes),
                          kb == 0)
        nh.wgmma_wait_group(1)  # k-block kb - 1's wgmmas are done: its slot can be refilled
        if kb > 0 and t % 32 == 0:
            RING.release(smem + BARS, previous)
        if t == 0 and kb + STAGES - 1 < k_blocks:
            load(smem, loads, tmap_a, tmap_b, m0, n0, kb + STAGES - 1)
            loads = RING.advance(loads)
        previous = st
        st = RING.advance(st)
    nh.wgmma_wait_group(0)
    STORE.tile(acc, smem + OUT, t, EPI, nh.tensormap_param_address(map_c), m0, n0, np.int32(0))
    STORE.drain(t)


def main():
    rng = np.random.default_rng()
    M, N, K = 300, 712, 1000  # partial tiles in every dimension (rows 16-byte aligned, as TMA needs)
    bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    value = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    a, b = bits(rng.standard_normal((M, K))), bits(rng.standard_normal((K, N)))
    c = cuda.to_device(np.full((M, N), 0x7FC0, np.uint16))  # NaN-poisoned
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)  # (alive until the kernel is done: the maps hold addresses)
    maps = (operand_tensor_map(d_a, A), operand_tensor_map(d_b, B),
            tensor_map_arg(c, STORE.box, swizzle=STORE.swizzle, dtype="bf16"))
    grid = -(-M // BM) * -(-N // BN)
    launch(pipelined_gemm, grid, 128, (*maps, N, K), shared_mem=PLAN.size)
    ref = value(a) @ value(b)
    err = np.linalg.norm(value(c.copy_to_host()) - ref) / np.linalg.norm(ref)
    print(f"pipelined {BM}x{BN} GEMM {M}x{N}x{K}, {STAGES}-slot ring: relative error {err:.1e}: "
          f"{'OK' if err < 1e-2 else 'FAILED'}")
    assert err < 1e-2


KERNELS = [(pipelined_gemm, (TENSORMAP_ARG, TENSORMAP_ARG, TENSORMAP_ARG, types.int64, types.int64))]

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
