"""RMSNorm forward and backward: ours against transformers' operators and ``F.rms_norm``, eagerly,
in the same process.

    python benchmarks/bench_norm.py                  # benchmarks/results/norm-<gpu>.json
    python benchmarks/bench_norm.py --cases 8192x4096 --rounds 20 --out norm.json

A case is (rows, width) bf16 hidden states that require a gradient, a bf16 weight, and a
backward with a fixed upstream gradient: a training step's norm. The contenders:

- ours: ``numba_hopper.torch.rms_norm`` (one kernel forward, one backward and the weight
  gradient's column sum);
- ``transformers``: ``LlamaRMSNorm``'s operators, what an eager stock model runs;
- ``torch``: ``torch.nn.functional.rms_norm`` (PyTorch's fused kernels; it rounds once where
  transformers rounds twice).

Each step is timed between CUDA events in alternating rounds, back to back (``*_us``: what an
eager step sees, the host's issue time included where it is the longer) and behind a GPU sleep
that outlasts the issue (``*_gpu_us``: the kernels alone). ``ratio`` is transformers' time over
ours and ``torch_ratio`` ``F.rms_norm``'s (medians of the rounds' ratios); ``*_gbps``: the bytes
the step must move (x and y forward; x, dy and dx backward) over its GPU time. Each case first
checks the output and both gradients against float64 (relative norm errors).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
from bench_gemm import paired_ratio, print_table, save_results  # noqa: E402

import numba_hopper.torch as nht  # noqa: E402

EPS = 1e-6
SLEEP_CYCLES_PER_CALL = 1_000_000  # ~0.5 ms: longer than transformers' 23 operators take to issue
# (rows, width): the hidden states of Llama hidden 2048 at 2 x 1024 and 4 x 2048 tokens, Qwen3-4B
# and Llama-3-8B at 4 x 2048, and Qwen3-4B's per-head query norm (32 heads of 128)
CASES = ["2048x2048", "8192x2048", "8192x2560", "8192x4096", "262144x128"]


def transformers_norm(x, w):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


CONTENDERS = {"ours": lambda x, w: nht.rms_norm(x, w, EPS), "transformers": transformers_norm,
              "torch": lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)}


def _step(norm, x, w, dy):
    x.grad = w.grad = None
    norm(x, w).backward(dy)


def _timed_ms(fn, reps, device_time):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if device_time:
        torch.cuda._sleep(reps * SLEEP_CYCLES_PER_CALL)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _rounds(fns, rounds, device_time):
    for fn in fns.values():
        _timed_ms(fn, 3, device_time)
    reps = max(5, min(100, int(10 / max(_timed_ms(fns["transformers"], 5, device_time), 1e-3))))
    times = {k: [] for k in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            times[name].append(_timed_ms(fns[name], reps, device_time))
    return times


def _errors(norm, x, w, dy):
    """The output's, dx's and dw's relative norm errors against float64."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = norm(x, w)
    y.backward(dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    y64.backward(dy.double())
    return [((a.double() - b).norm() / b.norm()).item() for a, b in ((y, y64), (x.grad, x64.grad), (w.grad, w64.grad))]


def bench_case(case, rounds):
    rows, width = (int(v) for v in case.split("x"))
    torch.manual_seed(rows + width)
    x = (torch.randn(rows, width, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(width, device="cuda")).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(rows, width, device="cuda").to(torch.bfloat16)
    errors = {name: _errors(fn, x, w, dy) for name, fn in CONTENDERS.items()}
    fns = {name: (lambda fn=fn: _step(fn, x, w, dy)) for name, fn in CONTENDERS.items()}
    wall, gpu = _rounds(fns, rounds, False), _rounds(fns, rounds, True)
    us = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
    gpu_us = {k: statistics.median(v) * 1e3 for k, v in gpu.items()}
    moved = 5 * rows * width * x.element_size()
    record = {"name": case, "rows": rows, "width": width, "dtype": "bf16",
              "ratio": paired_ratio(wall, "transformers", "ours"), "torch_ratio": paired_ratio(wall, "torch", "ours"),
              "gpu_ratio": paired_ratio(gpu, "transformers", "ours"),
              "torch_gpu_ratio": paired_ratio(gpu, "torch", "ours")}
    for name in CONTENDERS:
        record.update({f"{name}_us": us[name], f"{name}_gpu_us": gpu_us[name],
                       f"{name}_gbps": moved / gpu_us[name] / 1e3,
                       f"{name}_errors": dict(zip(("y", "dx", "dw"), errors[name]))})
    return record


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=CASES, help="ROWSxWIDTH")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/norm-<gpu>.json)")
    args = p.parse_args(argv)
    fields = {"step": "rms_norm forward and backward of bf16 rows that require a gradient; bf16 weight",
              "rounds": args.rounds, "records": []}
    for case in args.cases:
        fields["records"].append(bench_case(case, args.rounds))
        out = save_results("norm", fields, args.out)
    print_table(fields["records"], [
        ("name", "rows x width", "s"), ("ours_us", "ours us", ".1f"), ("transformers_us", "transformers us", ".1f"),
        ("torch_us", "F.rms_norm us", ".1f"), ("ratio", "ratio", ".2f"), ("torch_ratio", "vs F.rms_norm", ".2f"),
        ("ours_gpu_us", "ours GPU us", ".1f"), ("torch_gpu_us", "F.rms_norm GPU us", ".1f"),
        ("ours_gbps", "ours GB/s", ".0f")], out)


if __name__ == "__main__":
    main()
