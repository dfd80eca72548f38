"""TMA tile copy: global -> shared memory (completion on an mbarrier) -> global.

Each CTA moves one 32 x 32 float32 tile of a 100 x 200 matrix:

1. thread 0 initializes an mbarrier that expects ONE arrival;
2. it arrives with ``expect_tx`` (the box's byte count) and issues the TMA load, which
   counts those bytes down as they land (``complete_tx``);
3. every thread waits for phase 0 of the barrier: both the arrival and the bytes are in;
4. the threads double the tile in shared memory, make their ordinary stores visible to
   the async proxy (``fence.proxy.async``) and thread 0 stores the tile back with TMA.

Edge tiles need no code: TMA zero-fills loads past the matrix and drops stores past it.

References: PTX ISA 9.2, sections 9.7.13.15 (mbarrier; expect-tx and complete-tx in
9.7.13.15.5), 9.7.9.25.5.2 (cp.async.bulk.tensor) and 9.7.9.25.2 (the async proxy); CUDA
Programming Guide, "Using the Tensor Memory Accelerator (TMA)".

    python examples/01_tma_copy.py             # on a Hopper GPU
    python examples/01_tma_copy.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.tools.cli import run_example
from numba_hopper.runtime.launch import launch
from numba_hopper.runtime.tensormap import TensorMap

ROWS, COLS = 32, 32  # one box: 32 rows of 128 bytes
TILE_BYTES = ROWS * COLS * 4


@cuda.jit
def tma_copy(tmap_src, tmap_dst, tiles_n):
    tile = cuda.shared.array((ROWS, COLS), np.float32, alignment=128)  # TMA needs 128-byte alignment
    bar_storage = cuda.shared.array(1, np.uint64)
    bar = nh.shared_address(bar_storage)  # mbarriers and TMA take 32-bit shared addresses
    row0 = (cuda.blockIdx.x // tiles_n) * ROWS
    col0 = (cuda.blockIdx.x % tiles_n) * COLS
    if cuda.threadIdx.x == 0:
        nh.mbarrier_init(bar, 1)
        nh.fence_mbarrier_init()  # the init must be visible before TMA signals the barrier
    cuda.syncthreads()  # nobody waits on an uninitialized barrier
    if cuda.threadIdx.x == 0:
        nh.fence_proxy_tensormap_acquire(tmap_src)  # the host wrote the descriptors
        nh.fence_proxy_tensormap_acquire(tmap_dst)
        nh.mbarrier_arrive_expect_tx(bar, TILE_BYTES)
        nh.tma_load_2d(nh.shared_address(tile), tmap_src, col0, row0, bar)  # innermost coordinate first
    nh.mbarrier_wait_parity(bar, 0)

    for i in range(cuda.threadIdx.x, ROWS * COLS, cuda.blockDim.x):
        tile[i // COLS, i % COLS] *= 2
    nh.fence_proxy_async()  # generic-proxy stores -> visible to the TMA store (async proxy)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        nh.tma_store_2d(tmap_dst, nh.shared_address(tile), col0, row0)
        nh.bulk_commit_group()
        nh.bulk_wait_group_read(0)  # shared memory must outlive the store's reads


def main():
    src = np.random.default_rng().standard_normal((100, 200), dtype=np.float32)
    d_src, d_dst = cuda.to_device(src), cuda.to_device(np.full_like(src, np.nan))
    t_src, t_dst = TensorMap(d_src, (ROWS, COLS)), TensorMap(d_dst, (ROWS, COLS))
    tiles_m, tiles_n = -(-src.shape[0] // ROWS), -(-src.shape[1] // COLS)
    launch(tma_copy, tiles_m * tiles_n, 128, (t_src.device_ptr, t_dst.device_ptr, tiles_n))
    ok = np.array_equal(d_dst.copy_to_host(), 2 * src)
    print(f"TMA copy of a {src.shape} float32 matrix in {tiles_m * tiles_n} tiles, dst == 2 * src: {'OK' if ok else 'FAILED'}")
    assert ok


KERNELS = [(tma_copy, "void(int64, int64, int64)")]  # what --inspect compiles: (kernel, argument types)

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
