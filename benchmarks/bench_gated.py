"""A gated MLP's first half, ``silu(x @ W_gate.T) * (x @ W_up.T)`` (SwiGLU), in one gated GEMM vs
the stock torch.compile of it, same process.

    python benchmarks/bench_gated.py [--rounds 11] [--out out.json]   # default: results/gated-<gpu>.json

- "ours": ``numba_hopper.gemm(x, w_gate.t(), up=w_up.t(), activation="silu")``, as the compiled
  model calls it (``numba_hopper.torch._post_grad``): one kernel, the gated (M, N) output written;
- "torch": ``torch.compile`` of ``F.silu(x @ w_gate.t()) * (x @ w_up.t())``: two cuBLAS GEMMs,
  each writing its (M, N) product, then Inductor's fused SiLU-and-multiply kernel reading both.

Fresh activations (input sets rotated past twice the L2) and a new output per call; each
contender is checked against float64 first. Method as bench_gemm.py: interleaved rounds, CUDA
events; ``ratio = torch_ms / ours_ms`` is the median of the rounds' paired ratios.
Shapes: the MLPs of bench_model.py's Llama-style model (hidden 2048, MLP 5632), Llama-3-8B
(4096, 14336) and Qwen2.5-7B (3584, 18944) at a prefill's rows.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_gemm import interleaved_rounds, medians, paired_ratio, print_table, save_results  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from numba_hopper import gemm  # noqa: E402

SHAPES = [("model MLP", 4096, 5632, 2048), ("llama3-8b MLP", 1024, 14336, 4096), ("llama3-8b MLP", 4096, 14336, 4096),
          ("qwen2.5-7b MLP", 4096, 18944, 3584), ("llama3-8b MLP", 128, 14336, 4096)]


def ours(x, wg, wu):
    return gemm(x, wg.t(), up=wu.t(), activation="silu")


def swiglu(x, wg, wu):
    return F.silu(x @ wg.t()) * (x @ wu.t())


def bench(M, N, K, rounds, l2_bytes, stock):
    weights = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(2)]
    nsets = max(2, math.ceil(2 * l2_bytes / (2 * M * K + 2 * M * N)) + 1)
    sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), *weights) for _ in range(nsets)]
    x, wg, wu = (t.double() for t in sets[0])
    ref = F.silu(x @ wg.t()) * (x @ wu.t())
    errors = {}
    for name, fn in (("ours", ours), ("torch", stock)):
        got = fn(*sets[0])
        errors[name] = ((got.double() - ref).norm() / ref.norm()).item()
        if not errors[name] < 1e-2:
            raise AssertionError(f"{name} {M}x{N}x{K}: relative error {errors[name]}")
    times = interleaved_rounds({"ours": ours, "torch": stock}, sets, rounds, "torch")
    med = medians(times)
    return {"ours_ms": med["ours"], "torch_ms": med["torch"], "ratio": paired_ratio(times, "torch", "ours"),
            "ratio_of_medians": med["torch"] / med["ours"], "rel_error": errors["ours"],
            "torch_rel_error": errors["torch"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/gated-<gpu>.json)")
    args = p.parse_args(argv)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stock = torch.compile(swiglu)
    records = []
    for name, M, N, K in SHAPES:
        r = bench(M, N, K, args.rounds, l2, stock)
        records.append({"name": name, "M": M, "N": N, "K": K, **r})
        print(records[-1], flush=True)
    ratios = [r["ratio"] for r in records]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    out = save_results("gated", {"call": "gemm(x, w_gate.t(), up=w_up.t(), activation='silu'), fresh x and output",
                                 "reference": "torch.compile(silu(x @ w_gate.t()) * (x @ w_up.t()))",
                                 "geomean": geomean, "records": records}, args.out)
    print_table(records, [("name", "MLP", "s"), ("M", "M", "d"), ("N", "N", "d"), ("K", "K", "d"),
                          ("ours_ms", "ours ms", ".4f"), ("torch_ms", "torch ms", ".4f"), ("ratio", "ratio", ".3f")], out)
    print(f"geomean {geomean:.3f}")


if __name__ == "__main__":
    main()
