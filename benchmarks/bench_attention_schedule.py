"""Causal attention's balanced schedule against the paired walk it replaces, and against cuDNN.

    python benchmarks/bench_attention_schedule.py   # benchmarks/results/attention-schedule-<gpu>.json

A dense causal launch takes a host-computed balanced schedule (``numba_hopper.attention.scheduler``:
single tiles given out longest first, each to the CTA free first in a cost model); a packed
batch, or a launch of over ``api.MAX_SCHEDULED_TILES`` tiles, takes the paired walk (two tiles
of equal total work per item, dealt round-robin). Setting ``MAX_SCHEDULED_TILES`` to 0 sends
every launch down the paired walk (a plan each), so both run here on the same inputs, beside
SDPA's cuDNN backend, in bench_attention.py's interleaved rounds (bf16, 16k tokens a batch).
``ratio``: the paired walk's time over the balanced schedule's (median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import importlib
import statistics

from bench_attention import HEADS, TOKENS, _sdpa, backends, flops, interleaved
from bench_gemm import paired_ratio, results_name, save_results

import numba_hopper

api = importlib.import_module("numba_hopper.attention.api")  # (numba_hopper.attention is the function)
POINTS = [(d, HEADS[d], HEADS[d], s) for d in HEADS for s in (1024, 2048, 4096, 16384)] + [(128, 16, 2, 2048)]


def bench_point(head_dim, heads, kv_heads, seqlen, rounds, window_ms):
    import torch

    batch = TOKENS // seqlen
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, kv_heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def balanced():
        return numba_hopper.attention(q, k, v, causal=True)

    def paired():
        default, api.MAX_SCHEDULED_TILES = api.MAX_SCHEDULED_TILES, 0
        try:
            return numba_hopper.attention(q, k, v, causal=True)
        finally:
            api.MAX_SCHEDULED_TILES = default

    torch.testing.assert_close(balanced(), paired(), rtol=0, atol=0)  # the same tiles, computed alike
    fns = {"balanced": balanced, "paired": paired, "cudnn": _sdpa(backends()["cudnn"], q, k, v, True, kv_heads != heads)}
    times = interleaved(fns, rounds, window_ms)
    work = flops(batch, heads, seqlen, head_dim, True)
    tflops = {name: round(work / statistics.median(t) / 1e9, 1) for name, t in times.items()}
    return {"name": f"d{head_dim} h{heads}/{kv_heads} s{seqlen} causal", "batch": batch, "heads": heads,
            "kv_heads": kv_heads, "seqlen_q": seqlen, "seqlen_k": seqlen, "head_dim": head_dim, "causal": True,
            "dtype": "bf16", **{f"{name}_tflops": f for name, f in tflops.items()},
            "ratio": round(paired_ratio(times, "paired", "balanced"), 3),
            "balanced_vs_cudnn": round(paired_ratio(times, "cudnn", "balanced"), 3),
            "paired_vs_cudnn": round(paired_ratio(times, "cudnn", "paired"), 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--window-ms", type=float, default=20.0)
    p.add_argument("--out", help="results file (default: benchmarks/results/attention-schedule-<gpu>.json)")
    args = p.parse_args(argv)
    print("| point | balanced TFLOP/s | paired | cuDNN | balanced / paired | balanced / cuDNN |\n|---|---|---|---|---|---|")
    records = []
    for point in POINTS:
        r = bench_point(*point, args.rounds, args.window_ms)
        records.append(r)
        print(f"| {r['name']} | {r['balanced_tflops']} | {r['paired_tflops']} | {r['cudnn_tflops']} | {r['ratio']} | "
              f"{r['balanced_vs_cudnn']} |", flush=True)
    out = save_results(results_name("attention", "schedule"), {"tokens_per_batch": TOKENS, "rounds": args.rounds,
                                                               "window_ms": args.window_ms, "results": records}, args.out)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
