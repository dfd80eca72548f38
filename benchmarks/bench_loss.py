"""The cross-entropy over a language model's 16-bit logits, forward and backward: ours against
PyTorch's, compiled and eager, in the same process.

    python benchmarks/bench_loss.py                  # benchmarks/results/loss-<gpu>.json
    python benchmarks/bench_loss.py --cases 8192x128256 --rounds 20 --out loss.json

A case is (tokens, vocabulary) bf16 logits that require a gradient, int64 targets (a tenth
``-100``, ignored), and the mean loss's backward:

- ours: ``numba_hopper::cross_entropy_rows`` (the loss kernel), the mean over the kept targets,
  and its backward (``numba_hopper::cross_entropy_grad``, the gradient kernel): what
  ``numba_hopper.torch.linear_cross_entropy`` runs after the head's GEMM;
- ``compiled``: ``torch.compile`` of transformers' loss, ``F.cross_entropy(logits.float(),
  target)`` (Inductor fuses the upcast, the log-softmax and its backward into two kernels): what
  a compiled stock model runs;
- ``eager``: the same function, uncompiled.

Each side's step is timed between CUDA events, in alternating rounds; ``ratio`` is compiled's
time over ours (the median of the rounds' ratios, ``bench_gemm.paired_ratio``), ``eager_ratio``
eager's. ``ours_loss_ms`` and ``ours_grad_ms`` time the two kernels alone (the operators called
directly), and ``*_gbps`` their memory throughput: the loss kernel reads the logits once, the
gradient kernel reads them and writes the gradient. Every case first checks ours against
float64 (the loss and the gradient, relative norm error, printed beside compiled's).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
from bench_gemm import interleaved_rounds, paired_ratio, print_table, save_results  # noqa: E402

import numba_hopper.torch  # noqa: E402,F401  (registers the numba_hopper:: operators)

F = torch.nn.functional
IGNORE = -100
# (tokens, vocabulary): Llama-2 hidden 2048, Qwen3 and Llama-3 at 2 x 1024 and 4 x 2048 tokens
CASES = ["2048x32000", "2048x151936", "8192x128256", "8192x151936"]


def ours(logits, target):
    rows, _ = torch.ops.numba_hopper.cross_entropy_rows(logits, target, IGNORE)
    return rows.sum() / (target != IGNORE).sum()


def stock(logits, target):
    return F.cross_entropy(logits.float(), target, ignore_index=IGNORE)


def _step(loss_fn, logits, target):
    logits.grad = None
    loss_fn(logits, target).backward()


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def _errors(loss_fn, logits, target):
    """The loss's and the gradient's relative error against float64."""
    x = logits.detach().requires_grad_()
    loss = loss_fn(x, target)
    loss.backward()
    x64 = logits.detach().double().requires_grad_()
    ref = F.cross_entropy(x64, target, ignore_index=IGNORE)
    ref.backward()
    return _rel(loss.detach().reshape(1), ref.detach().reshape(1)), _rel(x.grad, x64.grad)


def bench_case(case, rounds):
    tokens, vocab = (int(v) for v in case.split("x"))
    torch.manual_seed(tokens + vocab)
    logits = (torch.randn(tokens, vocab, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    target[torch.rand(tokens, device="cuda") < 0.1] = IGNORE
    compiled = torch.compile(stock, dynamic=False)
    errors = {name: _errors(fn, logits, target) for name, fn in (("ours", ours), ("compiled", compiled))}
    fns = {"ours": lambda: _step(ours, logits, target), "compiled": lambda: _step(compiled, logits, target),
           "eager": lambda: _step(stock, logits, target)}
    times = interleaved_rounds(fns, [()], rounds, "compiled")
    rows, lse = torch.ops.numba_hopper.cross_entropy_rows(logits, target, IGNORE)
    d_rows = torch.full_like(rows, 1 / tokens)
    kernels = {"loss": lambda: torch.ops.numba_hopper.cross_entropy_rows(logits, target, IGNORE),
               "grad": lambda: torch.ops.numba_hopper.cross_entropy_grad(logits, target, IGNORE, lse, d_rows)}
    alone = {k: statistics.median(v) for k, v in interleaved_rounds(kernels, [()], rounds, "loss").items()}
    size = logits.numel() * logits.element_size()
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {"name": case, "tokens": tokens, "vocab": vocab, "dtype": "bf16",
            "ours_ms": ms["ours"], "ref_ms": ms["compiled"], "eager_ms": ms["eager"],
            "ratio": paired_ratio(times, "compiled", "ours"), "eager_ratio": paired_ratio(times, "eager", "ours"),
            "ours_loss_ms": alone["loss"], "ours_grad_ms": alone["grad"],
            "ours_loss_gbps": size / alone["loss"] / 1e6, "ours_grad_gbps": 2 * size / alone["grad"] / 1e6,
            "ours_loss_error": errors["ours"][0], "ours_grad_error": errors["ours"][1],
            "ref_loss_error": errors["compiled"][0], "ref_grad_error": errors["compiled"][1]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=CASES, help="TOKENSxVOCAB")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/loss-<gpu>.json)")
    args = p.parse_args(argv)
    fields = {"step": "mean cross-entropy of bf16 logits, forward and backward; a tenth of the targets ignored",
              "rounds": args.rounds, "records": []}
    for case in args.cases:
        fields["records"].append(bench_case(case, args.rounds))
        out = save_results("loss", fields, args.out)
        torch.compiler.reset()
    print_table(fields["records"], [
        ("name", "tokens x vocab", "s"), ("ours_ms", "ours ms", ".3f"), ("ref_ms", "compiled ms", ".3f"),
        ("ratio", "ratio", ".3f"), ("eager_ratio", "vs eager", ".3f"), ("ours_loss_gbps", "loss GB/s", ".0f"),
        ("ours_grad_gbps", "grad GB/s", ".0f"), ("ours_grad_error", "ours grad err", ".1e"),
        ("ref_grad_error", "compiled grad err", ".1e")], out)


if __name__ == "__main__":
    main()
