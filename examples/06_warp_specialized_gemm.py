"""A warp-specialized bf16 GEMM, one 128 x 256 tile per CTA: a producer warpgroup and two consumers.

Example 05 had one warpgroup load and compute; here the roles split (``kit.warpspec``):

- warpgroup 0, the producer, gives registers back (``setmaxnreg.dec`` to 40) and one elected
  thread streams the tile's k-blocks into a 4-slot ring (``kit.pipeline``), waiting only for
  free slots;
- warpgroups 1 and 2, the consumers, take the registers (``setmaxnreg.inc`` to 232: the
  launch gives each of the 384 threads 168) and each computes 64 rows of the tile with
  ``wgmma.m64n256k16``, 128 f32 accumulators a thread, releasing each slot once its wgmmas
  are done (lane 0 of each of the 8 consumer warps: ``consumer_arrivals=8``);
- the skeleton's ``body`` initializes the ring on thread 0, fences the inits
  (``fence.mbarrier_init``), synchronizes the CTA, dispatches the roles with the warp-uniform
  warpgroup index, and sets the register budget.

Each consumer stores its 64 x 256 rows through ``kit.epilogue`` (named barrier per consumer
from ``NamedBarriers``). Example 07 makes the CTAs persistent, so that a CTA's epilogue
overlaps its next tile's loads and mainloop.

    python examples/06_warp_specialized_gemm.py             # on a Hopper GPU
    python examples/06_warp_specialized_gemm.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda
from numba.cuda import types

from numba_hopper import intrinsics as nh
from numba_hopper.kit import (NamedBarriers, SmemPlan, make_descriptors, make_mma, make_ring, make_tile_loads,
                              make_tile_store, operand_layout, warp_specialization)
from numba_hopper.kit.host import TENSORMAP_ARG, launch, operand_tensor_map, tensor_map_arg
from numba_hopper.tools.cli import run_example

BM, BN, BK, STAGES, CONSUMERS = 128, 256, 64, 4, 2
A = operand_layout("K", 128, "bf16", mn=BM, k=BK)
B = operand_layout("MN", 128, "bf16", mn=BN, k=BK)
WS = warp_specialization(consumers=CONSUMERS, producer_regs=40)
RING = make_ring(STAGES, consumer_arrivals=4 * CONSUMERS, tx_bytes=A.tile_bytes + B.tile_bytes)
STORE = make_tile_store(BN, "bf16", buffers=2)
EPI = NamedBarriers().allocate("epilogue", CONSUMERS)
A_DESC, B_DESC, MMA = make_descriptors(A), make_descriptors(B), make_mma(A, B)
A_LOADS, B_LOADS = make_tile_loads(A), make_tile_loads(B)

PLAN = SmemPlan()
A_RING = PLAN.add("a", STAGES * A.tile_bytes, A.alignment)
B_RING = PLAN.add("b", STAGES * B.tile_bytes, B.alignment)
EPI_BUFS = PLAN.add("epilogue", CONSUMERS * STORE.buffer_bytes, 1024)
BARS = PLAN.add("barriers", RING.barrier_bytes, 8)
A_ROWS_64 = A.mn_offset(64)  # bytes from an A tile to its second consumer's rows


@cuda.jit(device=True, forceinline=True)
def tile_origin(N):
    tiles_n = (N + BN - 1) // BN
    return (cuda.blockIdx.x // tiles_n) * BM, (cuda.blockIdx.x % tiles_n) * BN


@cuda.jit(device=True, forceinline=True)
def init(args):
    RING.init(nh.dynamic_shared_base() + BARS)


@cuda.jit(device=True, forceinline=True)
def producer(args):
    map_a, map_b, _, N, K = args
    if cuda.threadIdx.x < 32 and nh.elect_sync():
        smem = nh.dynamic_shared_base()
        tmap_a, tmap_b = nh.tensormap_param_address(map_a), nh.tensormap_param_address(map_b)
        m0, n0 = tile_origin(N)
        st = RING.start()
        for kb in range(np.int32((K + BK - 1) // BK)):
            full = RING.acquire(smem + BARS, st)  # the slot is free; its full barrier expects tx_bytes
            A_LOADS.load(smem + A_RING + st.stage * A.tile_bytes, tmap_a, m0, kb * BK, full)
            B_LOADS.load(smem + B_RING + st.stage * B.tile_bytes, tmap_b, n0, kb * BK, full)
            st = RING.advance(st)


@cuda.jit(device=True, forceinline=True)
def consumer(cw, t, args):
    _, _, map_c, N, K = args
    smem = nh.dynamic_shared_base()
    a0, b0 = A_DESC.at(smem + A_RING + A_ROWS_64 * cw), B_DESC.at(smem + B_RING)
    k_blocks = np.int32((K + BK - 1) // BK)
    acc = MMA.accumulator()
    st = RING.start()
    previous = st
    for kb in range(k_blocks):
        RING.wait(smem + BARS, st)
        acc = MMA.k_block(acc, A_DESC.advance(a0, st.stage, A.tile_bytes), B_DESC.advance(b0, st.stage, B.tile_bytes),
                          kb == 0)
        nh.wgmma_wait_group(1)
        if kb > 0 and t % 32 == 0:
            RING.release(smem + BARS, previous)
        previous = st
        st = RING.advance(st)
    nh.wgmma_wait_group(0)  # (the last slots need no release: the CTA ends)
    m0, n0 = tile_origin(N)
    STORE.tile(acc, smem + EPI_BUFS + cw * STORE.buffer_bytes, t, EPI + cw, nh.tensormap_param_address(map_c),
               m0 + 64 * cw, n0, np.int32(0))
    STORE.drain(t)


BODY = WS.body(init, producer, consumer)


@cuda.jit(launch_bounds=WS.launch_bounds)
def warp_specialized_gemm(map_a, map_b, map_c, N, K):
    BODY((map_a, map_b, map_c, N, K))


def main():
    rng = np.random.default_rng()
    M, N, K = 500, 712, 1000  # partial tiles in every dimension (rows 16-byte aligned, as TMA needs)
    bits = lambda x: (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    value = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    a, b = bits(rng.standard_normal((M, K))), bits(rng.standard_normal((K, N)))
    c = cuda.to_device(np.full((M, N), 0x7FC0, np.uint16))  # NaN-poisoned
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)  # (alive until the kernel is done: the maps hold addresses)
    maps = (operand_tensor_map(d_a, A), operand_tensor_map(d_b, B),
            tensor_map_arg(c, STORE.box, swizzle=STORE.swizzle, dtype="bf16"))
    grid = -(-M // BM) * -(-N // BN)
    launch(warp_specialized_gemm, grid, WS.threads, (*maps, N, K), shared_mem=PLAN.size)
    ref = value(a) @ value(b)
    err = np.linalg.norm(value(c.copy_to_host()) - ref) / np.linalg.norm(ref)
    print(f"warp-specialized {BM}x{BN} GEMM {M}x{N}x{K}, registers {WS.producer_regs}/{WS.consumer_regs}: "
          f"relative error {err:.1e}: {'OK' if err < 1e-2 else 'FAILED'}")
    assert err < 1e-2


KERNELS = [(warp_specialized_gemm, (TENSORMAP_ARG, TENSORMAP_ARG, TENSORMAP_ARG, types.int64, types.int64))]

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
