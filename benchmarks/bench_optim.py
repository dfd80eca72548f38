"""AdamW's step on a model's bf16 parameters: ``numba_hopper.torch.AdamW`` against PyTorch's fused
and foreach AdamW, in the same process.

    python benchmarks/bench_optim.py                  # benchmarks/results/optim-<gpu>.json
    python benchmarks/bench_optim.py --models llama-3-8b --rounds 20 --out optim.json

The parameters are those of ``bench_train.py``'s models (4 layers, bf16, the same shapes), each
optimizer with its own copy and random gradients; ``lr=1e-5``, ``weight_decay=0.01``. Each
optimizer's ``step()`` is timed between CUDA events, in alternating rounds after warm-up steps;
``ratio`` is fused's time over ours (the median of the rounds' ratios,
``bench_gemm.paired_ratio``), ``foreach_ratio`` foreach's. ``*_gbps``: the bytes a step must
move (read the parameter, gradient and both moments, write three: 14 bytes a bf16 element) over
its time. ``*_host_ms``: a step's host time, issued behind a GPU sleep (nothing waits on the GPU),
in alternating rounds of their own; ``host_ratio`` is fused's over ours (a step that is bound by
the host's call rate, as an eager step of a small model, takes its host time). Before timing,
ours and fused take three identical steps from identical state, and the relative difference of
their parameters is printed.
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
from bench_train import MODELS, build_model  # noqa: E402
from profile_compiled import host_ms  # noqa: E402

import numba_hopper.torch as nht  # noqa: E402

KW = dict(lr=1e-5, weight_decay=0.01)
OPTIMIZERS = {"ours": lambda ps: nht.AdamW(ps, **KW), "fused": lambda ps: torch.optim.AdamW(ps, fused=True, **KW),
              "foreach": lambda ps: torch.optim.AdamW(ps, foreach=True, **KW)}


def bench_model(name, rounds):
    shapes = [p.shape for p in build_model(name, device="meta").parameters()]
    torch.manual_seed(0)
    start = [torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    grads = [torch.randn_like(p) for p in start]
    sides = {}
    for side, make in OPTIMIZERS.items():
        ps = [torch.nn.Parameter(p.clone()) for p in start]
        for p, g in zip(ps, grads):
            p.grad = g
        sides[side] = (ps, make(ps))
    for _, opt in sides.values():
        for _ in range(3):
            opt.step()
    difference = max(((a.double() - b.double()).norm() / b.double().norm()).item()
                     for a, b in zip(sides["ours"][0], sides["fused"][0]))
    times = interleaved_rounds({side: opt.step for side, (_, opt) in sides.items()}, [()], rounds, "fused")
    ms = {k: statistics.median(v) for k, v in times.items()}
    host = {"ours": [], "fused": []}
    for r in range(rounds):
        for side in ("ours", "fused") if r % 2 == 0 else ("fused", "ours"):
            host[side].append(host_ms(sides[side][1].step))
    elements = sum(p.numel() for p in start)
    return {"name": name, "model": name, "parameters": elements, "tensors": len(start), "dtype": "bf16",
            "ours_ms": ms["ours"], "ref_ms": ms["fused"], "foreach_ms": ms["foreach"],
            "ratio": paired_ratio(times, "fused", "ours"), "foreach_ratio": paired_ratio(times, "foreach", "ours"),
            "ours_gbps": 14 * elements / ms["ours"] / 1e6, "ref_gbps": 14 * elements / ms["fused"] / 1e6,
            "ours_host_ms": statistics.median(host["ours"]), "ref_host_ms": statistics.median(host["fused"]),
            "host_ratio": paired_ratio(host, "fused", "ours"), "max_rel_difference": difference}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/optim-<gpu>.json)")
    args = p.parse_args(argv)
    fields = {"step": "AdamW step, bf16 parameters and state, lr 1e-5, weight decay 0.01", "rounds": args.rounds,
              "records": []}
    for name in args.models:
        fields["records"].append(bench_model(name, args.rounds))
        out = save_results("optim", fields, args.out)
        torch.cuda.empty_cache()
    print_table(fields["records"], [
        ("name", "model", "s"), ("parameters", "parameters", ",d"), ("ours_ms", "ours ms", ".2f"),
        ("ref_ms", "fused ms", ".2f"), ("ratio", "ratio", ".3f"), ("foreach_ratio", "vs foreach", ".3f"),
        ("ours_gbps", "ours GB/s", ".0f"), ("ref_gbps", "fused GB/s", ".0f"), ("ours_host_ms", "ours host ms", ".3f"),
        ("ref_host_ms", "fused host ms", ".3f"), ("host_ratio", "host ratio", ".3f"),
        ("max_rel_difference", "max rel. diff.", ".1e")], out)


if __name__ == "__main__":
    main()
