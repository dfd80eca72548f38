"""The inspection toolchain itself: PTX, cubin from numba's LTO link, SASS, resources."""

import numpy as np
import pytest
from numba import cuda

from numba_hopper.intrinsics import ptx_intrinsic
from numba_hopper.tools.sass import ToolNotFoundError, find_tool, inspect_kernel

wgmma_fence_raw = ptx_intrinsic("wgmma_fence_raw", "wgmma.fence.sync.aligned;")


@cuda.jit(launch_bounds=(128, 1))
def _fence_kernel(x):
    wgmma_fence_raw()
    x[cuda.threadIdx.x] = 1.0


def test_sm90a_only_instruction_reaches_sass():
    r = inspect_kernel(_fence_kernel, "void(float32[::1])")
    assert ".target sm_90a" in r.ptx
    assert "wgmma.fence.sync.aligned" in r.ptx
    assert r.count("WARPGROUP.ARRIVE") == 1  # SASS spelling of wgmma.fence
    assert "key SASS: WARPGROUP.ARRIVE x1" in r.summary()  # the README's snippet prints it
    assert r.spill_bytes == 0 and r.stack_frame == 0
    assert 0 < r.registers <= 255
    assert r.cubin[:4] == b"\x7fELF"


@cuda.jit
def _spilling_kernel(x, n):
    # A thread-local array indexed at run time must live in local memory (stack frame), and
    # with max_registers=16 the live values below cannot all stay in registers.
    tmp = cuda.local.array(64, np.float32)
    for i in range(64):
        tmp[i] = x[i] * n
    acc = 0.0
    for i in range(64):
        acc += tmp[(i * n) % 64] * x[(i + n) % 64]
    x[0] = acc


def test_report_flags_local_memory_and_spills():
    spilling = cuda.jit(max_registers=16)(_spilling_kernel.py_func)
    r = inspect_kernel(spilling, "void(float32[::1], int32)")
    assert r.stack_frame > 0
    assert r.count("STL") > 0 and r.count("LDL") > 0


def test_report_counts_spill_bytes():
    # 64 accumulators live across a run-time loop under a 32-register cap: ptxas must spill.
    spilling = cuda.jit(max_registers=32)(_many_live_values.py_func)
    r = inspect_kernel(spilling, "void(float32[::1], int32)")
    assert r.spill_bytes > 0, r.link_log
    assert "spill" in r.summary()
    roomy = inspect_kernel(cuda.jit(_many_live_values.py_func), "void(float32[::1], int32)")
    assert roomy.spill_bytes == 0


@cuda.jit
def _many_live_values(x, n):
    # Per-thread values (thread-dependent addresses keep them out of uniform registers);
    # constant indices only, so the array is promoted to 64 live registers.
    t = cuda.threadIdx.x * 64
    acc = cuda.local.array(64, np.float32)
    for i in range(64):
        acc[i] = x[t + i]
    for j in range(n):
        w = x[t + j]
        for i in range(64):
            acc[i] = acc[i] * w + acc[(i + 1) % 64]
    for i in range(64):
        x[t + i] = acc[i]


def test_missing_tool_is_a_clear_error():
    with pytest.raises(ToolNotFoundError, match="numba-hopper\\[inspect\\]"):
        find_tool("definitely-not-a-cuda-tool")
