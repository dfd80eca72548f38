"""Programmatic dependent launch, on and off: a Llama-style layer chain replayed from CUDA graphs.

    python benchmarks/bench_pdl.py [--rounds 15] [--out out.json]   # default: results/pdl-<gpu>.json

Four layers of hidden 2048 / MLP 5632 projections (q, k, v, o, gate, up, down: the GEMMs of
``bench_model.py``'s model, with its residual adds and SiLU between them, no attention) at
M = 8 (decode) and M = 4096 (prefill), each captured with our GEMMs launched as programmatic
dependents (``_plan.DEPENDENT_LAUNCH = "all"``), without (``"none"``), and with
``torch.matmul``; the three graphs replay in interleaved rounds, CUDA events, medians.
Records ``{case, M, us_per_forward, ratio}`` with ``ratio = torch / case``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_gemm import print_table, save_results  # noqa: E402

import numba_hopper  # noqa: E402
from numba_hopper.matmul import api as matmul  # noqa: E402
from numba_hopper.matmul import plan as _plan  # noqa: E402

HIDDEN, MLP, LAYERS = 2048, 5632, 4


def _weights():
    def weight(out_features, in_features):  # (out, in) as nn.Linear keeps it, scaled to keep x's magnitude
        return torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / in_features**0.5

    return [{name: weight(*shape).t() for name, shape in (
        ("q", (HIDDEN, HIDDEN)), ("k", (HIDDEN, HIDDEN)), ("v", (HIDDEN, HIDDEN)), ("o", (HIDDEN, HIDDEN)),
        ("gate", (MLP, HIDDEN)), ("up", (MLP, HIDDEN)), ("down", (HIDDEN, MLP)))} for _ in range(LAYERS)]


def _forward(x, layers, mm):
    for w in layers:
        mm(x, w["q"]), mm(x, w["k"])
        x = x + mm(mm(x, w["v"]), w["o"])
        x = x + mm(F.silu(mm(x, w["gate"])) * mm(x, w["up"]), w["down"])
    return x


def _graph(x, layers, mm, dependent):
    _plan.DEPENDENT_LAUNCH = dependent  # read when a plan is built: build them again
    matmul.clear_plans()
    for _ in range(2):
        _forward(x, layers, mm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _forward(x, layers, mm)
    return graph, out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/pdl-<gpu>.json)")
    args = p.parse_args(argv)
    layers, records, default = _weights(), [], _plan.DEPENDENT_LAUNCH
    for M in (8, 4096):
        x = torch.randn(M, HIDDEN, device="cuda", dtype=torch.bfloat16)
        graphs = {f"numba_hopper, dependent launches: {mode}": _graph(x, layers, numba_hopper.gemm, mode)
                  for mode in ("all", "none")}
        graphs["torch"] = _graph(x, layers, torch.matmul, "none")
        for graph, _ in graphs.values():
            graph.replay()
        ref = graphs["torch"][1].double()
        for case, (_, out) in graphs.items():
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if not err < 5e-2:  # bf16 rounding through 28 products and their residual adds
                raise AssertionError(f"{case}: relative error {err} against torch's forward")
        replays = 20 if M == 8 else 3
        times = {case: [] for case in graphs}
        for _ in range(args.rounds):
            for case, (graph, _) in graphs.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(replays):
                    graph.replay()
                end.record()
                end.synchronize()
                times[case].append(start.elapsed_time(end) / replays * 1e3)
        med = {case: statistics.median(t) for case, t in times.items()}
        records += [{"case": case, "M": M, "us_per_forward": t, "ratio": med["torch"] / t} for case, t in med.items()]
    _plan.DEPENDENT_LAUNCH = default
    out = save_results("pdl", {"model": f"{LAYERS} layers, hidden {HIDDEN}, MLP {MLP}, bf16, no attention",
                               "records": records}, args.out)
    print_table(records, (("case", "case", "s"), ("M", "M", "d"), ("us_per_forward", "us per forward", ".1f"),
                          ("ratio", "torch / case", ".3f")), out)


if __name__ == "__main__":
    main()
