"""Sustained load: throughput, SM clock and board power of each kernel choice and cuBLAS.

    python benchmarks/bench_sustained.py --shapes 8192x28672x4096:RC --configs default n256-2x1
    python benchmarks/bench_sustained.py --shapes 4096x7168x16384 --fp8 blockwise   # vs torch._scaled_mm

Under seconds of back-to-back GEMMs the H100 runs at its power limit, and a kernel that spends
more energy per cycle (more L2 and shared-memory traffic per FLOP) gets a lower clock. Each
contender runs ``--seconds`` of ``out=`` calls (``--fp8``: a new output per call, both sides)
on the same operands while ``nvidia-smi`` samples power and SM clock every 50 ms (reads
only); contenders alternate over ``--rounds``,
and each figure is the median. ``TFLOP/s per MHz`` separates the kernel's efficiency per cycle
from the clock it gets; ``J/TFLOP`` is board energy per unit of work.
"""

import argparse
import pathlib
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_fp8 import _operands as fp8_operands, _scales as fp8_scales  # noqa: E402
from bench_gemm import _config, _operand, _parse_shape  # noqa: E402

import numba_hopper  # noqa: E402


def _sample(stop, samples):
    """(watts, MHz) from nvidia-smi every 50 ms until ``stop`` is set."""
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=power.draw,clocks.sm", "--format=csv,noheader,nounits",
                             "-lms", "50"], stdout=subprocess.PIPE, text=True)
    while not stop.is_set():
        try:
            samples.append(tuple(float(x) for x in proc.stdout.readline().split(",")))
        except ValueError:
            pass
    proc.terminate()


def _run(fn, reps):
    """(ms per call, mean watts, mean MHz) over ``reps`` calls, after the power ramp."""
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=_sample, args=(stop, samples))
    sampler.start()
    time.sleep(0.2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    stop.set()
    sampler.join()
    steady = samples[len(samples) // 4:]
    return start.elapsed_time(end) / reps, statistics.mean(s[0] for s in steady), statistics.mean(s[1] for s in steady)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", required=True, help="MxNxK[:layout] (bf16)")
    p.add_argument("--fp8", choices=("tensor", "rowwise", "blockwise"),
                   help="e4m3 TN operands with these scales (bench_fp8.py's), against torch._scaled_mm")
    p.add_argument("--configs", nargs="+", default=["default"], help="as bench_gemm.py's --configs")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.2)
    args = p.parse_args()
    for shape in args.shapes:
        _, M, N, K, dtype, layout = _parse_shape(shape)
        if args.fp8:  # a new bf16 output per call on both sides, as bench_fp8.py
            layout = "RC"
            a, b = fp8_operands(M, N, K)
            (sa, sb), (ra, rb) = fp8_scales(args.fp8, M, N, K)
            fns = {"scaled_mm": lambda: torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)}
            for name in args.configs:
                fns[name] = lambda cfg=_config(name, layout): numba_hopper.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg)
        else:
            a, b = _operand(M, K, dtype, layout[0]), _operand(K, N, dtype, layout[1])
            c = torch.empty(M, N, device="cuda", dtype=a.dtype)
            fns = {"cublas": lambda: torch.matmul(a, b, out=c)}
            for name in args.configs:
                fns[name] = lambda cfg=_config(name, layout): numba_hopper.gemm(a, b, out=c, config=cfg)
        reference = fns[next(iter(fns))]
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        reference()
        torch.cuda.synchronize()
        reps = max(20, int(args.seconds / (time.perf_counter() - t)))
        rows = {name: [] for name in fns}
        for r in range(args.rounds):
            for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                rows[name].append(_run(fns[name], reps))
                time.sleep(0.3)
        for name, runs in rows.items():
            ms, watts, mhz = (statistics.median(x[i] for x in runs) for i in range(3))
            tflops = 2 * M * N * K / ms / 1e9
            print(f"{shape} {name:12s} {tflops:7.1f} TFLOP/s  {watts:6.1f} W  {mhz:5.0f} MHz  "
                  f"TFLOP/s per MHz {tflops / mhz:.4f}  J/TFLOP {watts / tflops:.3f}", flush=True)


if __name__ == "__main__":
    main()
