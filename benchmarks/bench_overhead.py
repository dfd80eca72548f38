"""Host time per call, as users call it: numba_hopper.gemm vs torch in one process.

    python benchmarks/bench_overhead.py [--calls 300] [--rounds 30] [--out out.json]   # default: results/overhead-<gpu>.json

Cases (bf16, M = N = K = 256, so the host, not the GPU, sets the pace):

- "fresh pairs, no out=":      64 operand pairs cycled, ``gemm(a, b)`` vs ``torch.matmul(a, b)``;
- "fresh activation each call": a never-seen activation every call (``--calls`` of them made
  up front) times one weight, ``gemm(x, w)`` vs ``torch.matmul(x, w)``;
- "fresh pairs, bias+gelu_tanh": ``gemm(a, b, bias=bias, bias_dim=1, activation="gelu_tanh")``
  vs ``F.gelu(torch.addmm(bias, a, b), approximate="tanh")``;
- "out=, same operands":       ``gemm(a, b, out=c)`` vs ``torch.matmul(a, b, out=c)``;
- "torch op: linear, fresh x":  the PyTorch custom op path, ``numba_hopper.torch.linear(x, w)``
  (dispatcher, autograd key, ``numba_hopper::gemm``) vs ``F.linear(x, w)``, a new ``x`` each call;
- "compiled graph's call":      what a ``torch.compile`` graph's wrapper calls for a product,
  ours lowered (``numba_hopper.torch._lowering.numba_hopper_mm``) vs Inductor's
  ``extern_kernels.mm`` (``torch.mm(a, b, out=c)``), 64 operand pairs cycled into one ``out``.

Each figure is the host time of ``--calls`` back-to-back calls (no synchronization inside,
the garbage collector paused, as ``timeit`` does) divided by the count; the two libraries
alternate in ``--rounds`` rounds and each reports its median. ``ratio = torch_us / ours_us``
(above 1: our call is cheaper).

Blocking: with a sleep kernel queued on the stream, a call on operands allocated earlier
must return before the sleep ends; ``blocks`` records whether it did not, for a layout called
before (a ~0.5 s sleep). ``new_layout_blocks``: the first call of a layout whose kernel is
already loaded (its plan built while the sleep runs); ``new_kernel_blocks``: the first call
that compiles or loads a kernel, with a ~10 s sleep, longer than the compile.
"""

from __future__ import annotations

import argparse
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
import torch.nn.functional as F  # noqa: E402

import numba_hopper  # noqa: E402
import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.torch._lowering import numba_hopper_mm  # noqa: E402

N = 256
PAIRS = 64


def _host_us(fn, calls):
    torch.cuda.synchronize()
    gc.disable()  # as timeit does: a collection inside one side's block is not that side's cost
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    elapsed = time.perf_counter() - start
    gc.enable()
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _cases(calls):
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    pairs = [(randn(N, N), randn(N, N)) for _ in range(PAIRS)]
    bias = randn(N)
    weight = randn(N, N)
    xs = [randn(N, N) for _ in range(calls)]
    c = randn(N, N)
    a, b = pairs[0]
    return {
        "fresh pairs, no out=": (lambda i: numba_hopper.gemm(*pairs[i % PAIRS]),
                                 lambda i: torch.matmul(*pairs[i % PAIRS])),
        "fresh activation each call": (lambda i: numba_hopper.gemm(xs[i], weight),
                                       lambda i: torch.matmul(xs[i], weight)),
        "fresh pairs, bias+gelu_tanh": (
            lambda i: numba_hopper.gemm(*pairs[i % PAIRS], bias=bias, bias_dim=1, activation="gelu_tanh"),
            lambda i: F.gelu(torch.addmm(bias, *pairs[i % PAIRS]), approximate="tanh")),
        "out=, same operands": (lambda i: numba_hopper.gemm(a, b, out=c), lambda i: torch.matmul(a, b, out=c)),
        "torch op: linear, fresh x": (lambda i: nht.linear(xs[i], weight), lambda i: F.linear(xs[i], weight)),
        "compiled graph's call": (lambda i: numba_hopper_mm(*pairs[i % PAIRS], sustained=False, out=c),
                                  lambda i: torch.mm(*pairs[i % PAIRS], out=c)),
    }


def _check_results():
    """Each case's math against float64 once, before anything is timed."""
    a, b = (torch.randn(N, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    for out, want in ((numba_hopper.gemm(a, b), ref),
                      (numba_hopper.gemm(a, b, bias=bias, bias_dim=1, activation="gelu_tanh"),
                       F.gelu(ref + bias.double(), approximate="tanh"))):
        err = ((out.double() - want).norm() / want.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"relative error {err}")


def _blocks(operands, sleep_cycles=1_000_000_000, **kw):
    """Whether ``gemm(*operands, **kw)`` returns only after a sleep queued before it ended."""
    torch.cuda.synchronize()
    torch.cuda._sleep(sleep_cycles)
    gate = torch.cuda.Event()
    gate.record()
    numba_hopper.gemm(*operands, **kw)
    waited = gate.query()
    torch.cuda.synchronize()
    return waited


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/overhead-<gpu>.json)")
    args = p.parse_args(argv)
    _check_results()
    records = []
    for case, (ours, ref) in _cases(args.calls).items():
        _host_us(ours, args.calls)  # warm-up: plans, kernels, allocator pools
        _host_us(ref, args.calls)
        times = {"ours": [], "torch": []}
        for r in range(args.rounds):
            for name, fn in ((("ours", ours), ("torch", ref)) if r % 2 == 0 else (("torch", ref), ("ours", ours))):
                times[name].append(_host_us(fn, args.calls))
        ours_us, torch_us = statistics.median(times["ours"]), statistics.median(times["torch"])
        records.append({"case": case, "ours_us": ours_us, "torch_us": torch_us, "ratio": torch_us / ours_us})
        print(f"{case:30s} ours {ours_us:6.2f} us  torch {torch_us:6.2f} us  ratio {torch_us / ours_us:.3f}",
              flush=True)
    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    numba_hopper.gemm(randn(2048, 2048), randn(2048, 2048))
    blocks = _blocks([randn(2048, 2048), randn(2048, 2048)])
    new_layout_blocks = _blocks([randn(2048, 2048 + 64)[:, :2048], randn(2048, 2048)])  # same kernel, new stride
    new_kernel_blocks = _blocks([randn(1032, 520, dtype=torch.float16), randn(520, 264, dtype=torch.float16)],
                                sleep_cycles=20_000_000_000, out_dtype="f32")
    print(f"blocks: {blocks}  (a new layout: {new_layout_blocks}, a new kernel: {new_kernel_blocks})")

    out = save_results("overhead", {"shape": [N, N, N], "calls": args.calls, "rounds": args.rounds, "blocks": blocks,
                                    "new_layout_blocks": new_layout_blocks, "new_kernel_blocks": new_kernel_blocks,
                                    "records": records}, args.out)
    print_table(records, [("case", "case", "s"), ("ours_us", "ours us", ".2f"), ("torch_us", "torch us", ".2f"),
                          ("ratio", "ratio", ".3f")], out)


if __name__ == "__main__":
    main()
