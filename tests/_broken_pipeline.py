"""A deliberately broken pipeline, run as a script by test_reliability_gpu.py.

``python tests/_broken_pipeline.py MODE`` runs one thread through pipeline.py with debug
sites: ``short`` inits the empty barriers for 2 consumer arrivals but releases once (the
producer's second pass over slot 0 times out), ``tx`` arms a full barrier for 16 bytes that
never come (the consumer's first wait times out), ``ok`` is healthy. It prints ``HANG role
slot phase k_block`` and the exception's message, or ``OK``; then ``CONTEXT usable`` if CUDA
calls still work in the process (a copy to the device and back, a context synchronization),
else ``CONTEXT unusable`` and why. A trap kills the CUDA context, hence a process of its own.
"""

import sys

import numpy as np
from cuda.bindings import driver
from numba import cuda

from numba_hopper import intrinsics as nh
from numba_hopper.runtime.debug import DebugRecord
from numba_hopper.errors import PipelineHangError
from numba_hopper.kit.pipeline import (
    consumer_release,
    consumer_wait,
    debug_site,
    pipeline_advance,
    pipeline_init,
    pipeline_start,
    producer_acquire,
    producer_commit,
)

STAGES = 2
BARRIERS = 2 * STAGES  # a constant for cuda.shared.array
MODES = {"ok": (1, 0), "short": (2, 0), "tx": (1, 16)}  # (empty arrivals, tx bytes per slot)


@cuda.jit(launch_bounds=(32, 1))
def one_thread_pipeline(record, arrivals, tx_bytes, k_blocks):
    bars = nh.shared_address(cuda.shared.array(BARRIERS, np.uint64))
    if cuda.threadIdx.x == 0:
        pipeline_init(bars, STAGES, arrivals)
        st = pipeline_start()
        for kb in range(k_blocks):
            producer_acquire(bars, STAGES, st, debug_site(record, 0, kb))
            producer_commit(bars, st, tx_bytes)
            consumer_wait(bars, st, debug_site(record, 0, kb))
            consumer_release(bars, STAGES, st)
            st = pipeline_advance(st, STAGES)


def context_state():
    """``CONTEXT usable``, or ``CONTEXT unusable`` and the first failure of a few CUDA calls."""
    try:
        if not (cuda.to_device(np.arange(4)).copy_to_host() == np.arange(4)).all():
            return "CONTEXT unusable: a round trip through the device changed the data"
    except Exception as exc:
        return f"CONTEXT unusable: {exc!r}"
    (err,) = driver.cuCtxSynchronize()
    return "CONTEXT usable" if err == driver.CUresult.CUDA_SUCCESS else f"CONTEXT unusable: {err}"


if __name__ == "__main__":
    record = DebugRecord()
    one_thread_pipeline[1, 32](record.address, *MODES[sys.argv[1]], 8)
    try:
        record.synchronize(0)
        print("OK")
    except PipelineHangError as e:
        print("HANG", e.role, e.slot, e.phase, e.k_block)
        print(e)
    print(context_state())
