"""A 2-CTA cluster sharing loads with TMA multicast.

Each cluster of two CTAs needs the same 64 x 32 float32 tile in both CTAs' shared memory.
Instead of both loading all of it, CTA rank r loads rows [32r, 32r + 32) once and
multicasts them to both CTAs (``cta_mask = 0b11``): the data lands at the same
shared-memory offset in each CTA and each CTA's mbarrier (at the same offset) receives the
bytes. So every CTA's barrier expects the WHOLE tile, though it issued half.

Before anyone multicasts, every barrier of the cluster must be initialized: a cluster-wide
barrier (``cluster_sync``), not ``syncthreads``, orders that.

References: PTX ISA 9.2, sections 9.7.9.25.5.2 (cp.async.bulk.tensor, ``.multicast::cluster``
and its ``ctaMask``), 9.7.13.3 (barrier.cluster) and 9.7.13.15 (mbarrier); CUDA Programming
Guide, "Thread Block Clusters".

    python examples/04_cluster_multicast.py             # on a Hopper GPU
    python examples/04_cluster_multicast.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.tools.cli import run_example
from numba_hopper.runtime.launch import launch
from numba_hopper.runtime.tensormap import TensorMap

CLUSTER = 2
HALF, COLS = 32, 32  # the box each CTA loads: 32 rows of 128 bytes
HALF_BYTES = HALF * COLS * 4
TILE_ROWS = CLUSTER * HALF  # (shared array shapes must be constants numba can read)


@cuda.jit
def multicast_tile(tmap, out):
    tile = cuda.shared.array((TILE_ROWS, COLS), np.float32, alignment=128)
    bar_storage = cuda.shared.array(1, np.uint64)
    bar = nh.shared_address(bar_storage)
    rank = nh.cluster_ctarank()  # 0 or 1 within the cluster
    row0 = (cuda.blockIdx.x // CLUSTER) * TILE_ROWS  # this cluster's tile
    if cuda.threadIdx.x == 0:
        nh.mbarrier_init(bar, 1)
        nh.fence_mbarrier_init()
    nh.cluster_sync()  # both CTAs' barriers exist before either CTA's multicast signals them
    if cuda.threadIdx.x == 0:
        # The partner's half may land before this arrival: the transaction count may run
        # below zero for a while; the phase cannot complete until this arrival is in too.
        nh.mbarrier_arrive_expect_tx(bar, CLUSTER * HALF_BYTES)
        nh.fence_proxy_tensormap_acquire(tmap)
        dst = nh.shared_address(tile) + rank * HALF_BYTES
        nh.tma_load_multicast_2d(dst, tmap, 0, row0 + rank * HALF, bar, 0b11)
    nh.mbarrier_wait_parity(bar, 0)  # both halves are here, ours and the partner's

    for i in range(cuda.threadIdx.x, TILE_ROWS * COLS, cuda.blockDim.x):
        out[cuda.blockIdx.x, i // COLS, i % COLS] = tile[i // COLS, i % COLS]
    nh.cluster_sync()  # no CTA exits while its partner may still touch the cluster


def main():
    a = np.random.default_rng().standard_normal((128, COLS), dtype=np.float32)
    clusters = a.shape[0] // TILE_ROWS  # one tile each
    grid = clusters * CLUSTER  # grid counts CTAs
    out = cuda.to_device(np.full((grid, TILE_ROWS, COLS), np.nan, np.float32))
    tmap = TensorMap(cuda.to_device(a), (HALF, COLS))
    launch(multicast_tile, grid, 128, (tmap.device_ptr, out), cluster=CLUSTER)
    got = out.copy_to_host()
    tiles = a.reshape(clusters, TILE_ROWS, COLS)
    ok = all(np.array_equal(got[b], tiles[b // CLUSTER]) for b in range(grid))
    print(f"{clusters} clusters of {CLUSTER} CTAs, each CTA loaded half a tile and holds all of it: "
          f"{'OK' if ok else 'FAILED'}")
    assert ok


KERNELS = [(multicast_tile, "void(int64, float32[:, :, ::1])")]  # what --inspect compiles

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
