"""A producer/consumer ring buffer with numba_hopper.kit.pipeline: row sums of a 32 x 4096 matrix.

Warp 0 is the producer: one elected thread streams the matrix through a 4-slot ring in
32 x 32 float32 chunks with TMA. Warp 1 is the consumer: lane r adds up row r of each chunk.
``make_ring`` gives each slot two mbarriers (``RING.init``):

- ``full``: the producer arms it for the chunk's bytes (``RING.acquire``, after waiting for
  the slot to be free) and the TMA load completes it; the consumer waits on it
  (``RING.wait``);
- ``empty``: the consumer arrives on it once the chunk is read (``RING.release``, one of
  ``consumer_arrivals``: here lane 0 of the consumer warp); the producer waits on it before
  reusing the slot.

128 chunks pass through 4 slots, so every slot is reused 32 times: the phase bit in
``PipelineState`` flips each time the ring wraps, which is what the waits check.

References: PTX ISA 9.2, sections 9.7.13.15 (mbarrier; its phases in 9.7.13.15.4),
9.7.9.25.5.2 (cp.async.bulk.tensor) and 9.7.9.25.2 (the async proxy: why the consumer
fences before it frees a slot); CUDA Programming Guide, "Producer-Consumer Pattern Using
Barriers" (in "Asynchronous Barriers").

    python examples/03_pipeline.py             # on a Hopper GPU
    python examples/03_pipeline.py --inspect   # anywhere: compile for sm_90a, print the SASS summary
"""

import numpy as np
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.tools.cli import run_example
from numba_hopper.runtime.launch import launch
from numba_hopper.kit.pipeline import make_ring
from numba_hopper.runtime.tensormap import TensorMap

STAGES = 4
ROWS, COLS = 32, 32  # one chunk: 32 rows of 128 bytes
CHUNK_BYTES = ROWS * COLS * 4
RING_ELEMS = STAGES * ROWS * COLS  # shared array sizes must be constants numba can read
RING = make_ring(STAGES, consumer_arrivals=1, tx_bytes=CHUNK_BYTES)  # one release per slot: lane 0 of warp 1
BARRIERS = RING.barrier_bytes // 8  # full[STAGES], empty[STAGES]: one uint64 each


@cuda.jit
def row_sums(tmap, chunks, out):
    ring = cuda.shared.array(RING_ELEMS, np.float32, alignment=128)
    bar_storage = cuda.shared.array(BARRIERS, np.uint64)
    bars = nh.shared_address(bar_storage)
    warp, lane = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
    if cuda.threadIdx.x == 0:
        RING.init(bars)
    cuda.syncthreads()

    st = RING.start()
    if warp == 0:
        if nh.elect_sync():  # one thread of the warp issues every load
            nh.fence_proxy_tensormap_acquire(tmap)
            for k in range(chunks):
                full = RING.acquire(bars, st)  # slot free (the first pass never waits); full armed
                nh.tma_load_2d(nh.shared_address(ring) + st.stage * CHUNK_BYTES, tmap, k * COLS, 0, full)
                st = RING.advance(st)
    else:
        total = np.float32(0)
        for k in range(chunks):
            RING.wait(bars, st)  # chunk k has landed in slot st.stage
            row = st.stage * ROWS * COLS + lane * COLS
            for col in range(COLS):
                total += ring[row + col]
            # Our reads went through the generic proxy; the refill (TMA) writes through the
            # async proxy. fence.proxy.async orders the two, and waits for the reads (these
            # 32-way bank-conflicted loads are slow): without it slots were refilled under them.
            nh.fence_proxy_async()
            cuda.syncwarp()
            if lane == 0:
                RING.release(bars, st)
            st = RING.advance(st)
        out[lane] = total


def main():
    x = np.random.default_rng().standard_normal((ROWS, 4096), dtype=np.float32)
    d_x, out = cuda.to_device(x), cuda.to_device(np.full(ROWS, np.nan, np.float32))
    tmap = TensorMap(d_x, (ROWS, COLS))
    launch(row_sums, 1, 64, (tmap.device_ptr, x.shape[1] // COLS, out))
    ref = x.astype(np.float64).sum(axis=1)
    err = np.linalg.norm(out.copy_to_host() - ref) / np.linalg.norm(ref)
    print(f"{x.shape[1] // COLS} chunks through a {STAGES}-slot TMA ring: row sums relative error {err:.1e}: "
          f"{'OK' if err < 1e-5 else 'FAILED'}")
    assert err < 1e-5


KERNELS = [(row_sums, "void(int64, int64, float32[::1])")]  # what --inspect compiles

if __name__ == "__main__":
    run_example(main, KERNELS, __doc__)
