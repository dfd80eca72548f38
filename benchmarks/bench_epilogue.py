"""Fused epilogues vs the unfused torch sequence and vs our plain GEMM, same process.

    python benchmarks/bench_epilogue.py                # 4096^3 and 8192^3, both fusions: results/epilogue-<gpu>.json
    python benchmarks/bench_epilogue.py --out out.json
    python benchmarks/bench_epilogue.py --configs default n256   # our kernels as in bench_gemm.py
    python benchmarks/bench_epilogue.py --fusions bias+gelu_tanh --shapes 4096x5632x2048 --configs default n128-pp

Fusions (bf16 in and out, bias per column, row-major), called as users call them, with
fresh operands (the input sets rotate) and a new output per call:

- "bias+gelu_tanh":  gemm(a, b, bias=bias, bias_dim=1, activation="gelu_tanh")
  vs F.gelu(torch.addmm(bias, a, b), approximate="tanh");
- "bias+residual":   gemm(a, b, bias=bias, bias_dim=1, c=c, beta=1.0)
  vs torch.addmm(bias, a, b).add_(c).

The second column (``out_*``) is the steady state with ``out=`` on both sides (addmm into
``out``, then the elementwise op in place).

Method as bench_gemm.py (whose helpers this imports): input sets rotated past twice the
L2, CUDA-event timing of back-to-back calls, each fusion checked against float64 first.
Each round times the contenders as a palindrome (ours, torch, plain, ..., plain, torch,
ours; reversed every other round), so a clock drift within the round cancels from the
ratios; ``ratio`` (torch unfused / fused) and ``vs_plain`` (fused / our plain GEMM) are
medians of the per-round ratios (quartiles beside them), the millisecond figures medians of
times.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_gemm import _config, _operand, _time, results_name, save_results  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from numba_hopper import gemm  # noqa: E402
from numba_hopper.kernels.epilogue import EpilogueConfig  # noqa: E402
from numba_hopper.matmul.heuristics import max_stages  # noqa: E402

SHAPES = [("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192)]
FUSIONS = ("bias+gelu_tanh", "bias+residual")


def _fused_config(name, c_dtype):
    """``name`` as bench_gemm.py spells kernels, its ring as deep as the epilogue's buffers allow."""
    cfg = _config(name)
    if cfg is None:
        return None
    ecfg = EpilogueConfig(c_dtype=c_dtype, bias="col", bias_dtype="bf16")
    kw = {f: getattr(cfg, f) for f in ("block_m", "cluster_m", "cluster_n")}
    return dataclasses.replace(cfg, stages=max_stages("bf16", "bf16", cfg.block_n, epilogue=ecfg, **kw))


def _fusions(name):
    """``(fusion, ours, torch unfused, float64 reference)``; each call form takes
    ``(a, b, bias, c, out)`` and makes its own output when ``out`` is None."""
    gelu_cfg, residual_cfg = _fused_config(name, None), _fused_config(name, "bf16")

    def ours_gelu(a, b, bias, c, out):
        return gemm(a, b, out=out, bias=bias, bias_dim=1, activation="gelu_tanh", config=gelu_cfg)

    def torch_gelu(a, b, bias, c, out):
        return F.gelu(torch.addmm(bias, a, b, out=out), approximate="tanh")

    def ref_gelu(a, b, bias, c):
        return F.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")

    def ours_residual(a, b, bias, c, out):
        return gemm(a, b, out=out, bias=bias, bias_dim=1, c=c, beta=1.0, config=residual_cfg)

    def torch_residual(a, b, bias, c, out):
        return torch.addmm(bias, a, b, out=out).add_(c)

    def ref_residual(a, b, bias, c):
        return a.double() @ b.double() + bias.double() + c.double()

    return [("bias+gelu_tanh", ours_gelu, torch_gelu, ref_gelu),
            ("bias+residual", ours_residual, torch_residual, ref_residual)]


def _median_ratios(times, num, den):
    ratios = [n / d for n, d in zip(times[num], times[den])]
    return statistics.median(ratios), statistics.quantiles(ratios, n=4)


def bench(M, N, K, fusion, rounds, l2_bytes, cfg=None):
    name, ours, unfused, ref_fn = fusion

    def plain(a, b, bias, c, out):
        return gemm(a, b, out=out, config=cfg)

    set_bytes = 2 * (M * K + K * N + 2 * M * N + N) + 2 * M * N
    nsets = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    sets = [(_operand(M, K, "bf16", "R"), _operand(K, N, "bf16", "R"), torch.randn(N, device="cuda").bfloat16(),
             _operand(M, N, "bf16", "R"), torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
            for _ in range(nsets)]
    a, b, bias, c, out = sets[0]
    ref = ref_fn(a, b, bias, c)
    out.fill_(float("nan"))
    ours(a, b, bias, c, out)
    err = max(((got.double() - ref).norm() / ref.norm()).item() for got in (out, ours(a, b, bias, c, None)))
    if not err < 1e-2:
        raise AssertionError(f"{name} {M}x{N}x{K}: relative error {err}")
    # Fresh: each contender makes its output; out=: each writes the set's output.
    fns = {}
    for key, fn in (("ours", ours), ("torch", unfused), ("plain", plain)):
        fns[key] = lambda a, b, bias, c, out, fn=fn: fn(a, b, bias, c, None)
        fns[f"{key} out="] = fn
    for fn in fns.values():
        _time(fn, sets, 3)
    reps = max(5, min(200, int(20 / max(_time(fns["torch"], sets, 5), 1e-3))))
    times = {k: [] for k in fns}
    for r in range(rounds):
        # A palindrome: a linear clock drift within the round cancels out of each
        # contender's mean.
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        t = {k: [] for k in fns}
        for k in order + order[::-1]:
            t[k].append(_time(fns[k], sets, reps))
        for k in fns:
            times[k].append(sum(t[k]) / 2)
    med = {k: statistics.median(v) for k, v in times.items()}
    flops = 2.0 * M * N * K
    ratio, ratio_q = _median_ratios(times, "torch", "ours")
    vs_plain, vs_plain_q = _median_ratios(times, "ours", "plain")
    out_ratio, out_ratio_q = _median_ratios(times, "torch out=", "ours out=")
    out_vs_plain, _ = _median_ratios(times, "ours out=", "plain out=")
    return {"ours_tflops": flops / med["ours"] / 1e9, "cublas_tflops": flops / med["torch"] / 1e9,
            "ratio": ratio, "rel_error": err, "ours_ms": med["ours"], "cublas_ms": med["torch"],
            "plain_ms": med["plain"], "vs_plain": vs_plain, "ratio_quartiles": ratio_q,
            "vs_plain_quartiles": vs_plain_q, "out_ratio": out_ratio, "out_ratio_quartiles": out_ratio_q,
            "out_vs_plain": out_vs_plain, "out_ours_ms": med["ours out="], "out_cublas_ms": med["torch out="]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--configs", nargs="*", default=["default"], help="our kernels, named as in bench_gemm.py")
    p.add_argument("--shapes", nargs="*", help="MxNxK shapes (default: 4096^3 and 8192^3)")
    p.add_argument("--fusions", nargs="*", choices=FUSIONS, default=list(FUSIONS))
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/epilogue[-configs]-<gpu>.json)")
    args = p.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    shapes = [(s, *(int(x) for x in s.split("x"))) for s in args.shapes] if args.shapes else SHAPES
    records = []
    for shape, M, N, K in shapes:
        for config in args.configs:
            for fusion in (f for f in _fusions(config) if f[0] in args.fusions):
                r = bench(M, N, K, fusion, args.rounds, l2, _config(config))
                label = f"{shape} {fusion[0]}" + ("" if config == "default" else f" [{config}]")
                records.append({"name": label, "M": M, "N": N, "K": K, "batch": 1, "dtype": "bf16",
                                "layout": "RR", "config": config, **r})
                print(f"{label:32s} fused {r['ours_ms']:.4f} ms  torch unfused {r['cublas_ms']:.4f} ms"
                      f"  plain {r['plain_ms']:.4f} ms  speedup {r['ratio']:.3f}x"
                      f" (IQR {r['ratio_quartiles'][0]:.3f}-{r['ratio_quartiles'][2]:.3f})"
                      f"  vs plain {r['vs_plain']:.3f}  out=: speedup {r['out_ratio']:.3f}x,"
                      f" vs plain {r['out_vs_plain']:.3f}", flush=True)
    kind = results_name("epilogue", args.shapes and "shapes", args.configs != ["default"] and "configs")
    out = save_results(kind, {"baseline": "cublas_* fields: the unfused torch sequence (addmm + gelu / add_)",
                              "calls": "ratio, vs_plain: fresh operands and outputs; out_*: both with out=",
                              "records": records}, args.out)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
