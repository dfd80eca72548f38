"""One warpgroup, one wgmma tile: C (64 x 128, f32) = A (64 x 64, f16) @ B (64 x 128, f16).

Both operands reach shared memory by TMA with 128-byte swizzle, K-major (A as stored,
row-major (M, K); B as its transpose, (N, K)), and wgmma reads them there (SS mode) through
matrix descriptors:

- start address; leading byte offset 16 (unused by swizzled K-major layouts); stride byte
  offset 1024 (8 rows of 128 bytes: one swizzle atom); swizzle mode 128 bytes;
- one ``wgmma.m64n128k16`` per 16 k: the next k16 slice starts 32 bytes further along the
  swizzled row, so only the start address moves.

The 128 threads hold C in registers: thread t (warp w, lane l) holds in register 4i + 2j + c
the element at row 16w + l//4 + 8j, column 8i + 2(l%4) + c.

References: PTX ISA 9.2, sections 9.7.15 (wgmma), 9.7.15.5.1.2.2 (Matrix Descriptor Format),
9.7.15.5.1.1.1 (Matrix Fragments for wgmma.mma_async.m64nNk16: the accumulator layout above)
and 9.7.9.25.5.2 (cp.async.bulk.tensor); CUDA Programming Guide, "Using the Tensor Memory
Accelerator (TMA)" (swizzle modes).

    python examples/02_wgmma_tile.py             # on a Hopper GPU
    python examples/02_wgmma_tile.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.tools.cli import run_example
from numba_hopper.runtime.launch import launch
from numba_hopper.runtime.tensormap import TensorMap

M, N, K = 64, 128, 64  # K = 64 f16 = one 128-byte swizzle row
A_ELEMS, B_ELEMS = M * K, N * K  # shared array sizes must be constants numba can read


@cuda.jit(launch_bounds=(128, 1))
def wgmma_tile(tmap_a, tmap_bt, c):
    a_s = cuda.shared.array(A_ELEMS, np.float16, alignment=1024)  # 128B swizzle: 1024-byte aligned
    b_s = cuda.shared.array(B_ELEMS, np.float16, alignment=1024)
    bar_storage = cuda.shared.array(1, np.uint64)
    bar = nh.shared_address(bar_storage)
    a, b = nh.shared_address(a_s), nh.shared_address(b_s)
    t = cuda.threadIdx.x
    if t == 0:
        nh.mbarrier_init(bar, 1)
        nh.fence_mbarrier_init()
    cuda.syncthreads()
    if t == 0:
        nh.fence_proxy_tensormap_acquire(tmap_a)
        nh.fence_proxy_tensormap_acquire(tmap_bt)
        nh.mbarrier_arrive_expect_tx(bar, (M + N) * K * 2)  # both loads complete on one barrier
        nh.tma_load_2d(a, tmap_a, 0, 0, bar)
        nh.tma_load_2d(b, tmap_bt, 0, 0, bar)
    nh.mbarrier_wait_parity(bar, 0)

    acc = nh.wgmma_accumulator(N, "f32")  # 64 f32 registers per thread
    nh.wgmma_fence()  # order earlier register/shared accesses before the async wgmmas
    for k in range(K // 16):
        da = nh.matrix_descriptor(a + 32 * k, 16, 1024, 128, 0)
        db = nh.matrix_descriptor(b + 32 * k, 16, 1024, 128, 0)
        # scale_d = 0 on the first step: D = A.B (the accumulator's old value is ignored)
        acc = nh.wgmma_mma_async(acc, da, db, 0 if k == 0 else 1, "f16", "f16", 1, 1, 0, 0)
    nh.wgmma_commit_group()
    nh.wgmma_wait_group(0)  # the accumulator registers are ready only now

    w, lane = t // 32, t % 32
    for r in range(N // 2):
        i, j, col = r // 4, (r // 2) % 2, r % 2
        c[16 * w + lane // 4 + 8 * j, 8 * i + 2 * (lane % 4) + col] = acc[r]


def main():
    rng = np.random.default_rng()
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    bt = cuda.to_device(np.ascontiguousarray(b.T))  # K-major B: (N, K) rows of 128 bytes
    d_a, c = cuda.to_device(a), cuda.to_device(np.full((M, N), np.nan, np.float32))
    tmap_a = TensorMap(d_a, (M, K), swizzle=128)
    tmap_bt = TensorMap(bt, (N, K), swizzle=128)
    launch(wgmma_tile, 1, 128, (tmap_a.device_ptr, tmap_bt.device_ptr, c))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.linalg.norm(c.copy_to_host() - ref) / np.linalg.norm(ref)
    print(f"wgmma m64n128k16 x 4 (SS, 128B swizzle): relative error vs float64 {err:.1e}: {'OK' if err < 1e-5 else 'FAILED'}")
    assert err < 1e-5


KERNELS = [(wgmma_tile, "void(int64, int64, float32[:, ::1])")]  # what --inspect compiles

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
