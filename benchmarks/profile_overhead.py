"""Host time per numba_hopper.gemm call (small GEMM, steady state) and where it goes.

    python benchmarks/profile_overhead.py [--calls 2000]
"""

import argparse
import cProfile
import pathlib
import pstats
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from numba_hopper.gemm import gemm  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)
    for _ in range(10):
        gemm(a, b, out=c)
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    from cuda.core import launch as core_launch

    from numba_hopper import gemm as gemm_module
    from numba_hopper.launch import _core_stream

    plan = next(iter(gemm_module._plans.values()))
    stream = torch.cuda.current_stream().cuda_stream
    launch = plan.launch_for(stream)  # one cuLaunchKernelEx on pre-packed arguments
    core_stream = _core_stream(stream)
    parts = (("numba_hopper.gemm", lambda: gemm(a, b, out=c)), ("torch.matmul", lambda: torch.matmul(a, b, out=c)),
             ("  its cached plan", lambda: plan(stream)), ("  its prepared launch", lambda: launch(stream)),
             ("  cuda.core.launch", lambda: core_launch(core_stream, launch.config, launch.kernel, *launch.args)))
    for name, fn in parts:
        t = time.perf_counter()
        for _ in range(args.calls):
            fn()
        host = (time.perf_counter() - t) / args.calls
        torch.cuda.synchronize()
        print(f"{name:20s} host time per call: {host * 1e6:7.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        gemm(a, b, out=c)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
