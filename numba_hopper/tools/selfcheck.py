"""What ``python -m numba_hopper`` runs on a Hopper GPU: the GEMM on random data, checked
against a float64 reference, and timed (against cuBLAS when PyTorch is installed)."""

from __future__ import annotations

import numpy as np

SHAPES = [(4096, 4096, 4096), (1000, 1000, 1000), (129, 7, 300)]


def _bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _time_ms(fn, reps=20):
    from numba import cuda

    fn()
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / reps


def run_selfcheck() -> int:
    from numba import cuda

    from ..matmul.api import gemm

    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng()
    failed = 0
    print(f"{'M x N x K':>18} {'rel err':>9} {'ours TFLOP/s':>13} {'cuBLAS TFLOP/s':>15}")
    for M, N, K in SHAPES:
        a = _bf16(rng.standard_normal((M, K), dtype=np.float32))
        b = _bf16(rng.standard_normal((K, N), dtype=np.float32))
        da, db = cuda.to_device(a), cuda.to_device(b)
        out = cuda.to_device(np.full((M, N), np.nan, dtype=np.float32))
        gemm(da, db, out, dtype="bf16")
        ref = _f32(a).astype(np.float64) @ _f32(b).astype(np.float64)
        got = out.copy_to_host()
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref) if np.isfinite(got).all() else np.inf
        ok = err < 1e-4
        failed += not ok
        flops = 2.0 * M * N * K
        out16 = cuda.device_array((M, N), dtype=np.uint16)
        ours = flops / _time_ms(lambda: gemm(da, db, out16, dtype="bf16", out_dtype="bf16")) / 1e9
        theirs = "-"
        if torch is not None:
            ta = torch.as_tensor(_f32(a), device="cuda").to(torch.bfloat16)
            tb = torch.as_tensor(_f32(b), device="cuda").to(torch.bfloat16)
            tc = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            theirs = f"{flops / _time_ms(lambda: torch.matmul(ta, tb, out=tc)) / 1e9:.1f}"
        print(f"{M:>6}x{N:>5}x{K:>5} {err:9.2e} {ours:13.1f} {theirs:>15} {'ok' if ok else 'FAILED'}")
    print("bf16 inputs; checked with fp32 output, timed with bf16 output; quick timings (20 calls, no input rotation): "
          "benchmarks/bench_gemm.py measures properly.")
    return 1 if failed else 0
