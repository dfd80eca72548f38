"""What a call's scratch costs: host and device time per call of plans that take scratch.

    python benchmarks/bench_scratch.py [--calls 300] [--rounds 20] [--cases NAME,...] [--allocator]
                                       [--out out.json]   # default: results/scratch-<gpu>.json

Scratch (``numba_hopper.runtime.workspace``) is taken and given back in each call's stream
order: one ``cuMemAllocFromPoolAsync`` and one ``cuMemFreeAsync`` per call, and one
``cuMemsetD8Async`` of the cluster claims for GPC-ordered kernels. Cases, bf16 in and out,
each with ``out=`` given:

- "no scratch":      256 x 256 x 256, the plain kernel (the reference: no allocator call);
- "aligned copy":    256 x 256 x 250, ``a``'s rows of 500 bytes copied into aligned scratch;
- "split-K decode":  1 x 4096 x 8192, ``split_k=4`` with ``GemmConfig(block_m=64, block_n=128)``;
- "stream-K":        1024 x 1024 x 4096, ``GemmConfig(block_n=128, stream_k=True)`` (partials, flags);
- "GPC claims":      512 x 3584 x 2048, ``GemmConfig(block_n=112, cluster_n=2, cluster_order="gpc")``.

``host_us``: the host time of ``--calls`` back-to-back calls divided by the count (median of
``--rounds``); ``device_us``: CUDA events around as many calls on one stream, divided by the
count. Each case's result is checked against float64 first. ``--cases``: a comma-separated
subset. ``--allocator``: also the host time of the allocator's calls alone, per call: 1 MiB
taken and given back, and the same with the claims zeroed.
"""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_gemm import print_table, save_results  # noqa: E402

from numba_hopper import GemmConfig, gemm  # noqa: E402
from numba_hopper.runtime import workspace  # noqa: E402

CASES = {  # M, N, K, gemm's keywords
    "no scratch": (256, 256, 256, {}),
    "aligned copy": (256, 256, 250, {}),
    "split-K decode": (1, 4096, 8192, dict(config=GemmConfig(block_m=64, block_n=128), split_k=4)),
    "stream-K": (1024, 1024, 4096, dict(config=GemmConfig(block_n=128, stream_k=True))),
    "GPC claims": (512, 3584, 2048, dict(config=GemmConfig(block_n=112, cluster_n=2, cluster_order="gpc", stages=6))),
}


def _call(M, N, K, kw):
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out, **kw)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{M}x{N}x{K}: relative error {err}")
    return lambda: gemm(a, b, out=out, **kw)


def _host_us(fn, calls):
    torch.cuda.synchronize()
    gc.disable()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    gc.enable()
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _device_us(fn, calls):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1e3


def _scratch_round_trip(stream, zero_claims):
    workspace.free_scratch(workspace.alloc_scratch(torch.cuda.current_device(), stream, 1 << 20, zero_claims), stream)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--cases", type=lambda s: s.split(","), default=list(CASES), help="a comma-separated subset")
    p.add_argument("--allocator", action="store_true", help="also time the allocator's calls alone")
    p.add_argument("--out", metavar="PATH", help="results file (default: benchmarks/results/scratch-<gpu>.json)")
    args = p.parse_args(argv)
    records = []
    for case in args.cases:
        shape = CASES[case]
        fn = _call(*shape)
        _host_us(fn, args.calls)  # warm-up
        host = statistics.median(_host_us(fn, args.calls) for _ in range(args.rounds))
        device = statistics.median(_device_us(fn, args.calls) for _ in range(args.rounds))
        records.append({"case": case, "shape": "x".join(map(str, shape[:3])), "host_us": host, "device_us": device})
        print(f"{case:16s} host {host:7.2f} us  device {device:8.2f} us", flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    for case, zero_claims in (("alloc + free", False), ("alloc + claims + free", True)) if args.allocator else ():
        fn = functools.partial(_scratch_round_trip, stream, zero_claims)
        _host_us(fn, args.calls)
        host = statistics.median(_host_us(fn, args.calls) for _ in range(args.rounds))
        records.append({"case": case, "shape": "1 MiB", "host_us": host, "device_us": float("nan")})
        print(f"{case:16s} host {host:7.2f} us", flush=True)
    out = save_results("scratch", {"calls": args.calls, "rounds": args.rounds, "records": records}, args.out)
    print_table(records, [("case", "case", "s"), ("shape", "M x N x K", "s"), ("host_us", "host us/call", ".2f"),
                          ("device_us", "device us/call", ".2f")], out)


if __name__ == "__main__":
    main()
