"""numba_hopper.torch in a real model, as PyTorch users run one: compiled, graph-replayed,
and trained, against the stock model in one process.

    python benchmarks/bench_torch.py [--rounds 20] [--out out.json]   # default: results/torch-<gpu>.json

The model is ``bench_model.py``'s Llama-style decoder (4 layers, hidden 2048, bf16). "ours"
is a copy (the same weights) with every ``nn.Linear`` swapped by
``numba_hopper.torch.replace_linear`` (29 per forward, custom ops ``numba_hopper::gemm``) and its
4 SwiGLU MLPs by ``numba_hopper.torch.fuse_gated_mlps`` (in inference the gate and up
projections and the SiLU-and-multiply are one gated GEMM; ``--unfused-mlps``: linears only).
The compiled forward gets the gated GEMM either way: Inductor's pass finds the unfused MLPs
(``numba_hopper.torch._post_grad``).

Cases (``ratio = torch_ms / ours_ms``, above 1: ours is faster):

- "compile forward, prefill 4x1024": ``torch.compile(model)`` (Inductor, default mode) of each
  model, forward under ``torch.no_grad()``;
- "graph forward, prefill 4x1024" / "graph forward, decode 8x1": each model's forward
  captured in a ``torch.cuda.CUDAGraph``, timed by ``replay()``;
- "train step, 4x1024": eager forward with the language-model loss, backward, and an AdamW
  step (the 29 linears' forward and both backward GEMMs on numba_hopper).

Each time is the median of ``--rounds`` CUDA-event timings of one call, after warm-up,
the two models alternating; the ratio is the median of the rounds' ratios (bench_gemm.py's
``paired_ratio``), ``ratio_of_medians`` the ratio of the two medians.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_gemm import paired_ratio, print_table, results_name, save_results  # noqa: E402
from bench_model import MODEL, _time_ms, build_model  # noqa: E402

import numba_hopper.torch as nht  # noqa: E402


def _ids(model, batch, seq):
    return torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")


def compiled_forward(model, batch, seq):
    compiled = torch.compile(model)
    ids = _ids(model, batch, seq)

    def run():
        with torch.no_grad():
            return compiled(input_ids=ids, use_cache=False).logits

    return run


def graph_forward(model, batch, seq):
    ids = _ids(model, batch, seq)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):  # warm up: kernels, plans, cuBLAS workspaces
            model(input_ids=ids, use_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits

    def run():
        graph.replay()
        return logits

    run.input_ids = ids  # every replay reads it: it lives as long as the graph
    return run


def train_step(model, batch, seq):
    model.train()
    ids = _ids(model, batch, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def run():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        return loss

    return run


CASES = [
    ("compile forward, prefill 4x1024", compiled_forward, 4, 1024),
    ("graph forward, prefill 4x1024", graph_forward, 4, 1024),
    ("graph forward, decode 8x1", graph_forward, 8, 1),
    ("train step, 4x1024", train_step, 4, 1024),
]


def bench(make, batch, seq, rounds, fuse_mlps):
    stock = build_model()
    ours = copy.deepcopy(stock)
    swapped = nht.replace_linear(ours), nht.fuse_gated_mlps(ours) if fuse_mlps else 0
    torch.manual_seed(1)
    runs = {False: make(stock, batch, seq)}
    torch.manual_seed(1)  # the same input ids
    runs[True] = make(ours, batch, seq)
    for ours_first in (True, False):
        for _ in range(3):
            _time_ms(runs[ours_first])
    times = {True: [], False: []}
    for r in range(rounds):
        for side in ((True, False) if r % 2 == 0 else (False, True)):
            times[side].append(_time_ms(runs[side]))
    return times[True], times[False], swapped


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/torch[-unfused]-<gpu>.json)")
    p.add_argument("--unfused-mlps", action="store_true", help="swap the linears only (no fuse_gated_mlps)")
    args = p.parse_args(argv)
    records = []
    for case, make, batch, seq in CASES:
        ours, stock, swapped = bench(make, batch, seq, args.rounds, not args.unfused_mlps)
        ours_ms, torch_ms = statistics.median(ours), statistics.median(stock)
        ratio = paired_ratio({"torch": stock, "ours": ours}, "torch", "ours")
        records.append({"case": case, "ours_ms": ours_ms, "torch_ms": torch_ms, "ratio": ratio,
                        "ratio_of_medians": torch_ms / ours_ms})
        print(f"{case:34s} ours {ours_ms:8.3f} ms  torch {torch_ms:8.3f} ms  ratio {ratio:.3f}"
              f" (of medians {torch_ms / ours_ms:.3f})  ({swapped[0]} linears swapped, {swapped[1]} MLPs fused)", flush=True)
        torch.cuda.empty_cache()
    ours = "replace_linear" + ("" if args.unfused_mlps else " + fuse_gated_mlps")
    kind = results_name("torch", args.unfused_mlps and "unfused")
    out = save_results(kind, {"model": MODEL, "torch": torch.__version__, "ours": ours, "records": records}, args.out)
    print_table(records, [("case", "case", "s"), ("ours_ms", "ours ms", ".3f"), ("torch_ms", "torch ms", ".3f"),
                          ("ratio", "ratio", ".3f")], out)


if __name__ == "__main__":
    main()
