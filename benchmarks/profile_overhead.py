"""Where the host time of a numba_hopper.gemm call goes (small GEMM, fresh operands).

    python benchmarks/profile_overhead.py [--calls 2000]

Prints the host time per call of ``gemm(a, b)``, of its parts measured alone (the plan's
launch, the output allocation) and of ``torch.matmul(a, b)``, then a cProfile of the calls.
``bench_overhead.py`` gives the figures that count; this finds what to cut.
"""

import argparse
import cProfile
import pathlib
import pstats
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import numba_hopper  # noqa: E402
from numba_hopper.matmul import plan_cache  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    pairs = [(torch.randn(256, 256, device="cuda", dtype=torch.bfloat16),
              torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)) for _ in range(64)]
    a, b = pairs[0]
    c = numba_hopper.gemm(a, b)
    plan = next(iter(plan_cache.plans.values())).plan
    stream = torch.cuda.current_stream().cuda_stream
    values = [0, a.data_ptr(), b.data_ptr(), c.data_ptr()]
    launch, binds = plan._steps[0]
    parts = (("numba_hopper.gemm(a, b)", lambda i: numba_hopper.gemm(*pairs[i % 64])),
             ("torch.matmul(a, b)", lambda i: torch.matmul(*pairs[i % 64])),
             ("  plan(stream, values)", lambda i: plan(stream, values)),
             ("  its GEMM launch", lambda i: launch(stream, values, binds)),  # (a plan without scratch)
             ("  torch.empty", lambda i: torch.empty((256, 256), dtype=torch.bfloat16, device=a.device)))
    for name, fn in parts:
        fn(0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(args.calls):
            fn(i)
        host = (time.perf_counter() - t) / args.calls
        torch.cuda.synchronize()
        print(f"{name:28s} host time per call: {host * 1e6:7.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for i in range(args.calls):
        numba_hopper.gemm(*pairs[i % 64])
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
