"""Fused epilogues vs the unfused torch sequence and vs our plain GEMM, same process.

    python benchmarks/bench_epilogue.py                # 4096^3 and 8192^3, both fusions
    python benchmarks/bench_epilogue.py --json out.json
    python benchmarks/bench_epilogue.py --configs default n256   # our kernels as in bench_gemm.py

Fusions (bf16 in and out, bias per column, row-major):

- "bias+gelu_tanh":  gemm(a, b, bias=bias, bias_dim=1, activation="gelu_tanh")
  vs torch.addmm(bias, a, b, out=out) then F.gelu(out, approximate="tanh");
- "bias+residual":   gemm(a, b, bias=bias, bias_dim=1, c=c, beta=1.0)
  vs torch.addmm(bias, a, b, out=out) then out.add_(c).

Method as bench_gemm.py (whose helpers this imports): input sets rotated past twice the
L2, CUDA-event timing of back-to-back calls, each fusion checked against float64 first.
Each round times the three contenders as a palindrome (ours, torch, plain, plain, torch,
ours; reversed every other round), so a clock drift within the round cancels from the
ratios; ``ratio`` (torch unfused / fused) and ``vs_plain`` (fused / plain) are medians of
the per-round ratios (quartiles beside them), the millisecond figures medians of times.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench_gemm import ROOT, _config, _operand, _time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from numba_hopper.gemm import gemm  # noqa: E402
from numba_hopper.kernels.epilogue import EpilogueConfig  # noqa: E402
from numba_hopper.kernels.gemm_sm90 import max_stages  # noqa: E402

SHAPES = [("4096^3", 4096), ("8192^3", 8192)]


def _fused_config(name, c_dtype):
    """``name`` as bench_gemm.py spells kernels, its ring as deep as the epilogue's buffers allow."""
    cfg = _config(name)
    if cfg is None:
        return None
    ecfg = EpilogueConfig(c_dtype=c_dtype, bias="col", bias_dtype="bf16")
    kw = {f: getattr(cfg, f) for f in ("block_m", "cluster_m", "cluster_n")}
    return dataclasses.replace(cfg, stages=max_stages("bf16", "bf16", cfg.block_n, epilogue=ecfg, **kw))


def _fusions(name):
    gelu_cfg, residual_cfg = _fused_config(name, None), _fused_config(name, "bf16")

    def ours_gelu(a, b, bias, c, out):
        gemm(a, b, out=out, bias=bias, bias_dim=1, activation="gelu_tanh", config=gelu_cfg)

    def torch_gelu(a, b, bias, c, out):
        torch.addmm(bias, a, b, out=out)
        F.gelu(out, approximate="tanh")

    def ref_gelu(a, b, bias, c):
        return F.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")

    def ours_residual(a, b, bias, c, out):
        gemm(a, b, out=out, bias=bias, bias_dim=1, c=c, beta=1.0, config=residual_cfg)

    def torch_residual(a, b, bias, c, out):
        torch.addmm(bias, a, b, out=out)
        out.add_(c)

    def ref_residual(a, b, bias, c):
        return a.double() @ b.double() + bias.double() + c.double()

    return [("bias+gelu_tanh", ours_gelu, torch_gelu, ref_gelu),
            ("bias+residual", ours_residual, torch_residual, ref_residual)]


def bench(n, fusion, rounds, l2_bytes, cfg=None):
    name, ours, unfused, ref_fn = fusion

    def plain(a, b, bias, c, out):
        gemm(a, b, out=out, config=cfg)

    set_bytes = 2 * (3 * n * n + n) + 2 * n * n
    nsets = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    sets = [(_operand(n, n, "bf16", "R"), _operand(n, n, "bf16", "R"), torch.randn(n, device="cuda").bfloat16(),
             _operand(n, n, "bf16", "R"), torch.empty(n, n, device="cuda", dtype=torch.bfloat16))
            for _ in range(nsets)]
    a, b, bias, c, out = sets[0]
    ours(a, b, bias, c, out)
    ref = ref_fn(a, b, bias, c)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"{name} {n}^3: relative error {err}")
    fns = {"ours": ours, "torch": unfused, "plain": plain}
    for fn in fns.values():
        _time(fn, sets, 3)
    reps = max(5, min(200, int(20 / max(_time(unfused, sets, 5), 1e-3))))
    times, vs_torch, vs_plain = {k: [] for k in fns}, [], []
    for r in range(rounds):
        # A palindrome (ours, torch, plain, plain, torch, ours): a linear clock drift within
        # the round cancels out of each contender's mean, so each round gives two ratios.
        order = ["ours", "torch", "plain"] if r % 2 == 0 else ["plain", "torch", "ours"]
        t = {k: [] for k in fns}
        for k in order + order[::-1]:
            t[k].append(_time(fns[k], sets, reps))
        mean = {k: sum(v) / 2 for k, v in t.items()}
        for k in fns:
            times[k].append(mean[k])
        vs_torch.append(mean["torch"] / mean["ours"])
        vs_plain.append(mean["ours"] / mean["plain"])
    med = {k: statistics.median(v) for k, v in times.items()}
    flops = 2.0 * n ** 3
    return {"ours_tflops": flops / med["ours"] / 1e9, "cublas_tflops": flops / med["torch"] / 1e9,
            "ratio": statistics.median(vs_torch), "rel_error": err, "ours_ms": med["ours"],
            "cublas_ms": med["torch"], "plain_ms": med["plain"], "vs_plain": statistics.median(vs_plain),
            "ratio_quartiles": statistics.quantiles(vs_torch, n=4),
            "vs_plain_quartiles": statistics.quantiles(vs_plain, n=4)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--configs", nargs="*", default=["default"], help="our kernels, named as in bench_gemm.py")
    p.add_argument("--json", help="results file (default benchmarks/results/epilogue-<date>.json)")
    args = p.parse_args(argv)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    records = []
    for shape, n in SHAPES:
        for config in args.configs:
            for fusion in _fusions(config):
                r = bench(n, fusion, args.rounds, l2, _config(config))
                label = f"{shape} {fusion[0]}" + ("" if config == "default" else f" [{config}]")
                records.append({"name": label, "M": n, "N": n, "K": n, "batch": 1, "dtype": "bf16",
                                "layout": "RR", "config": config, **r})
                print(f"{label:32s} fused {r['ours_ms']:.4f} ms  torch unfused {r['cublas_ms']:.4f} ms"
                      f"  plain {r['plain_ms']:.4f} ms  speedup {r['ratio']:.3f}x"
                      f" (IQR {r['ratio_quartiles'][0]:.3f}-{r['ratio_quartiles'][2]:.3f})"
                      f"  vs plain {r['vs_plain']:.3f}"
                      f" (IQR {r['vs_plain_quartiles'][0]:.3f}-{r['vs_plain_quartiles'][2]:.3f})",
                      flush=True)
    result = {"gpu": props.name, "date": datetime.date.today().isoformat(),
              "baseline": "cublas_* fields: the unfused torch sequence (addmm + gelu / add_)", "records": records}
    out = pathlib.Path(args.json or ROOT / "benchmarks" / "results" / f"epilogue-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
