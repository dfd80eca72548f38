"""Reliability on the H100: debug mode, random shapes, NaN/Inf, determinism, load."""

import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import numba_hopper.matmul.plan_cache as plan_cache
from numba_hopper.runtime import tensormap
from numba_hopper import gemm

from test_gemm_gpu import _check

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402

pytestmark = pytest.mark.gpu
HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


# --- debug mode ------------------------------------------------------------------------


@pytest.mark.parametrize("mode,expected", [
    ("short", "HANG producer 0 0 2"),  # empty[0] never completes: the producer's 2nd pass
    ("tx", "HANG consumer 0 0 0"),  # full[0] waits for 16 bytes that never come
    ("ok", "OK"),
])
def test_broken_pipeline_raises_instead_of_hanging(mode, expected):
    proc = subprocess.run([sys.executable, str(HERE / "_broken_pipeline.py"), mode], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout.startswith(expected), (proc.stdout, proc.stderr[-2000:])


@pytest.mark.parametrize("mode", ["tx", "ok"])
def test_after_a_hang_the_process_is_as_the_exception_says(mode):
    """The trap leaves the CUDA context unusable: the exception says so and what to do, and in
    that process CUDA calls do fail afterwards (a healthy run's context stays usable)."""
    proc = subprocess.run([sys.executable, str(HERE / "_broken_pipeline.py"), mode], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    lines = proc.stdout.splitlines()
    if mode == "ok":
        assert lines == ["OK", "CONTEXT usable"], (proc.stdout, proc.stderr[-2000:])
        return
    assert lines[0].startswith("HANG") and len(lines) == 3, (proc.stdout, proc.stderr[-2000:])
    message = lines[1]
    assert "CUDA context unusable" in message and "Restart the process" in message, message
    assert "process of its own" in message, message  # how to debug a hang and carry on
    assert lines[2].startswith("CONTEXT unusable"), lines[2]


def test_debug_gemm_is_correct(torch, monkeypatch):
    from numba_hopper.runtime import debug

    monkeypatch.setattr(debug, "DEFAULT", True)
    for M, N, K, layout in ((129, 257, 77, "RR"), (1000, 7, 300, "CC"), (2048, 2048, 1024, "RC")):
        _check(torch, M, N, K, layout=layout)


# --- random shapes, layouts and dtypes ------------------------------------------------------

RAGGED = sorted({t * k + d for t in (128, 256) for k in (1, 2, 3) for d in (-1, 0, 1)})
DIM = st.one_of(st.integers(1, 300), st.sampled_from(RAGGED))


@settings(max_examples=40, deadline=None, derandomize=False)
@given(M=DIM, N=DIM, K=DIM, layout=st.sampled_from(["RR", "RC", "CR", "CC"]),
       dtype=st.sampled_from(["bf16", "f16"]), out_dtype=st.sampled_from(["bf16", "f16", "f32"]),
       out_major=st.sampled_from(["R", "C"]))
def test_random_problems(torch, M, N, K, layout, dtype, out_dtype, out_major):
    _check(torch, M, N, K, dtype, out_dtype, layout, out_major)


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
def test_nan_and_inf_propagate_like_float64(torch, out_dtype):
    M, N, K = 300, 270, 200
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    a[5, 17] = float("inf")
    a[9, 3] = float("-inf")
    a[200, 150] = float("nan")
    b[40, 260] = float("inf")
    b[7, 100] = float("nan")
    out = gemm(a, b, out_dtype=out_dtype)
    ref = a.double() @ b.double()
    got = out.double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    assert torch.equal(torch.sign(got[torch.isinf(ref)]), torch.sign(ref[torch.isinf(ref)]))
    finite = torch.isfinite(ref)
    assert ((got[finite] - ref[finite]).norm() / ref[finite].norm()).item() < 1e-2


# --- determinism ---------------------------------------------------------------------------


@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (4096, 4096, 4096), (129, 4000, 3001)])
def test_bitwise_deterministic(torch, M, N, K):
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
    first = gemm(a, b, out_dtype="f32")
    for _ in range(3):
        again = gemm(a, b, out_dtype="f32")
        assert torch.equal(first.view(torch.int32), again.view(torch.int32))


# --- load ------------------------------------------------------------------------------------


@pytest.mark.serial  # it reads the device's free memory, which other test processes change
def test_two_threads_two_streams_many_shapes_memory_stable(torch):
    # The same two threads, each on its own stream, in every pass: PyTorch gives each new
    # (thread's cuBLAS handle, stream) pair its own workspace (32 MiB on Hopper) for the
    # reference matmuls, which is not ours to measure.
    import queue

    streams = [torch.cuda.Stream() for _ in range(2)]
    done = queue.Queue()

    def work(stream, passes):
        while (job := passes.get()) is not None:
            seed, calls = job
            rng = np.random.default_rng(seed)
            errors = []
            try:
                with torch.cuda.stream(stream):
                    for _ in range(calls):
                        M, N, K = (int(x) for x in rng.integers(1, 700, 3))
                        a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
                        b = torch.randn(K, N, device="cuda").to(torch.bfloat16)
                        if rng.random() < 0.5:
                            a = a.t().contiguous().t()
                        out = torch.full((M, N), float("nan"), device="cuda")
                        gemm(a, b, out=out)
                        ref = a.double() @ b.double()
                        err = ((out.double() - ref).norm() / ref.norm()).item()
                        if not err < 1e-4:
                            errors.append((M, N, K, err))
                stream.synchronize()
            except Exception as exc:  # reported by the main thread
                errors.append(repr(exc))
            done.put(errors)

    inboxes = [queue.Queue() for _ in streams]
    threads = [threading.Thread(target=work, args=(stream, inbox), daemon=True) for stream, inbox in zip(streams, inboxes)]
    for t in threads:
        t.start()

    def run(calls):
        for seed, inbox in zip(np.random.SeedSequence().generate_state(2), inboxes):
            inbox.put((seed, calls))
        errors = done.get() + done.get()
        torch.cuda.synchronize()
        assert not errors, errors[:5]

    try:
        # Warm up with as many calls as are measured: every kernel variant these shapes need
        # is compiled and loaded (module memory is not a leak), the plan cache at its bound.
        run(200)
        torch.cuda.empty_cache()
        free_before, _ = torch.cuda.mem_get_info()
        run(200)  # 400 calls of fresh shapes: more than the plan cache holds
        torch.cuda.empty_cache()
        free_after, _ = torch.cuda.mem_get_info()
    finally:
        for inbox in inboxes:
            inbox.put(None)
    assert len(plan_cache.plans) <= plan_cache.PLAN_CACHE_SIZE
    info = tensormap.cache_info()
    assert info["size"] <= info["maxsize"]
    # Plans and descriptors are bounded; what is left is allocator slack.
    assert free_before - free_after < 64 << 20, (free_before - free_after) / 2**20
