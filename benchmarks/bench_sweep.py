"""The shape sweep: numba_hopper.gemm against cuBLAS on the GEMMs of real models.

Each shape is timed as users call it, ``gemm(a, b)`` against ``torch.matmul(a, b)`` with
fresh operands and a new output every call (``ratio``; host time included, as a model's
forward sees it), then both with ``out=`` (``out_ratio``). Method as in bench_gemm.py: one
process, 11 interleaved rounds, inputs rotated past the L2, medians (a ratio: of the rounds'
ratios, ``paired_ratio``), every shape checked against float64 first. Shapes whose cuBLAS
call takes under 50 us are also timed on the device alone (``device_ratio``: the host
enqueues ahead), which separates kernel speed from host cost.

Shapes: the QKV, O, gate/up and down projections of Llama-3 8B and 70B and Qwen2.5 7B (x @
W.T, W stored (N, K) as nn.Linear keeps it: layout RC) and Mixtral 8x7B's expert
projection, at M from 1 to 16384; square sizes; and the four layouts on a subset.

    python benchmarks/bench_sweep.py                      # all, then the first-call time: results/sweep-<gpu>.json
    python benchmarks/bench_sweep.py --models llama3-8b --ms 1 4096
    python benchmarks/bench_sweep.py --out out.json
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys
import tempfile

from bench_gemm import ROOT, bench_shape, print_table, results_name, save_results

import torch

# Projections (name, N, K) of each model's decoder layer, N as the fused weight has it.
MODELS = {
    "llama3-8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
    "llama3-70b": [("qkv", 10240, 8192), ("o", 8192, 8192), ("gate_up", 57344, 8192), ("down", 8192, 28672)],
    "qwen2.5-7b": [("qkv", 4608, 3584), ("o", 3584, 3584), ("gate_up", 37888, 3584), ("down", 3584, 18944)],
    # Attention and down projections as Llama-3 8B; one expert's gate (M: tokens per expert).
    "mixtral-8x7b": [("expert_gate", 14336, 4096)],
}
MS = [1, 16, 64, 128, 512, 1024, 2048, 4096, 8192, 16384]
SQUARES = [1024, 2048, 3000, 4096, 5120, 6144, 7168, 8192]
# The layouts subset: (name, M, N, K), each in RR, RC, CR and CC.
LAYOUT_SHAPES = [("4096^3", 4096, 4096, 4096), ("llama3-8b qkv M=2048", 2048, 6144, 4096),
                 ("llama3-8b down M=128", 128, 4096, 14336)]
DEVICE_TIME_BELOW_MS = 0.05


def sweep_shapes(models, ms):
    """(name, M, N, K, layout) of the sweep."""
    shapes = [(f"{model} {proj} M={M}", M, N, K, "RC") for model in models for proj, N, K in MODELS[model]
              for M in ms]
    shapes += [(f"{s}^3", s, s, s, "RR") for s in SQUARES]
    shapes += [(f"{name} {layout}", M, N, K, layout) for name, M, N, K in LAYOUT_SHAPES
               for layout in ("RR", "RC", "CR", "CC")]
    return shapes


def first_call_s():
    """The cold first call (benchmarks/first_call.py: a new process, an empty kernel cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "first_call.json"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_call.py"), "--out", str(path), "--cases",
                        "gemm-bf16"], check=True)
        return json.loads(path.read_text())["records"][0]["first_call_s"]  # (the cold process's)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--ms", nargs="*", type=int, default=MS)
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--no-first-call", action="store_true", help="skip the cold first-call measurement")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/sweep[-subset]-<gpu>.json)")
    args = p.parse_args(argv)

    cold = None if args.no_first_call else first_call_s()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    records = []
    for name, M, N, K, layout in sweep_shapes(args.models, args.ms):
        r = bench_shape(M, N, K, "bf16", layout, args.rounds, l2)["default"]
        record = {"name": name, "M": M, "N": N, "K": K, "layout": layout, "ours_tflops": r["ours_tflops"],
                  "cublas_tflops": r["cublas_tflops"], "ratio": r["ratio"], "ratio_of_medians": r["ratio_of_medians"],
                  "out_ratio": r["out_ratio"],
                  "ours_ms": r["ours_ms"], "cublas_ms": r["cublas_ms"], "rel_error": r["rel_error"]}
        if r["cublas_ms"] < DEVICE_TIME_BELOW_MS:
            record["device_ratio"] = bench_shape(M, N, K, "bf16", layout, args.rounds, l2,
                                                 device_time=True)["default"]["ratio"]
        records.append(record)
        print(f"{name:34s} {M:6d}x{N:6d}x{K:6d} {layout}  ours {r['ours_tflops']:7.1f}  cuBLAS "
              f"{r['cublas_tflops']:7.1f} TFLOP/s  ratio {r['ratio']:.3f}  out= {r['out_ratio']:.3f}"
              + (f"  device {record['device_ratio']:.3f}" if "device_ratio" in record else ""), flush=True)

    ratios = [r["ratio"] for r in records]
    summary = {
        "geomean_ratio": geomean(ratios),
        "geomean_out_ratio": geomean([r["out_ratio"] for r in records]),
        "min_ratio_m_ge_64": min((r["ratio"] for r in records if r["M"] >= 64), default=None),
        "min_ratio_m_lt_64": min((r["ratio"] for r in records if r["M"] < 64), default=None),
    }
    kind = results_name("sweep", (args.models != list(MODELS) or args.ms != MS) and "subset")
    out = save_results(kind, {"calls": "ratio: gemm(a, b) vs torch.matmul(a, b), fresh operands and outputs, "
                                       "host time included; out_ratio: both with out=; device_ratio: fresh, "
                                       "device time only", "dtype": "bf16", "first_call_s": cold, **summary,
                              "records": records}, args.out)
    print_table(records, [("name", "shape", "s"), ("ours_tflops", "ours TFLOP/s", ".1f"),
                          ("cublas_tflops", "cuBLAS TFLOP/s", ".1f"), ("ratio", "ratio", ".3f"),
                          ("out_ratio", "out= ratio", ".3f")], out)
    print(f"{len(records)} shapes; geomean ratio {summary['geomean_ratio']:.3f} (out= {summary['geomean_out_ratio']:.3f}); "
          f"min M>=64 {summary['min_ratio_m_ge_64']}; min M<64 {summary['min_ratio_m_lt_64']}; first call {cold} s")


if __name__ == "__main__":
    main()
