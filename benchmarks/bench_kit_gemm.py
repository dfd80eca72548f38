"""The kit's persistent GEMM (examples/07_persistent_gemm.py) against cuBLAS (torch.matmul).

One process, both on the same bf16 operands, row-major A (M, K) and B (K, N), bf16 out:

- before timing, each shape's result is checked against a float64 product (relative error
  below 1e-2, output NaN-poisoned first);
- fresh operands: enough operand sets to exceed twice the L2 rotate, so no call finds its
  operands cached; both write into a preallocated C (``torch.matmul(a, b, out=c)``; the
  example's tensor maps are encoded once per set, as a prepared launch);
- CUDA events time ``reps`` calls in a row on the current stream; the two alternate in
  ``--rounds`` rounds (reversed every other round) so clock changes hit both; a ratio is
  the median over rounds of cuBLAS's time over ours in that round, TFLOP/s the medians.

It writes ``benchmarks/results/kit-gemm-h200.json`` (``--out`` to change): records
{name, M, N, K, ours_tflops, ref_tflops, ratio, lines}, ``lines`` the example's line count.

    python benchmarks/bench_kit_gemm.py                    # 4096^3 and 8192^3
    python benchmarks/bench_kit_gemm.py --shapes 4096x4096x4096 6144x6144x6144 --rounds 20
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import runpy
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "07_persistent_gemm.py"
DEFAULT_SHAPES = ("4096x4096x4096", "8192x8192x8192")
L2_BYTES = 60 * 2**20  # H200 (the H100 has 50 MB): twice this is rotated through


def _shape(text):
    m, n, k = (int(x) for x in text.lower().split("x"))
    return m, n, k


def _time(torch, fn, sets, reps):
    """Milliseconds per call of ``fn(*set)`` over ``reps`` calls rotating through ``sets``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        fn(*sets[i % len(sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def bench_shape(torch, prepare, M, N, K, rounds):
    """``(ours_tflops, ref_tflops, ratio, max_error)`` of one shape (module doc)."""
    set_bytes = 2 * (M * K + K * N + M * N)
    nsets = max(2, math.ceil(2 * L2_BYTES / set_bytes) + 1)
    sets = []
    for _ in range(nsets):
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        sets.append((a, b, c, prepare(a, b, c)))
    stream = torch.cuda.current_stream().cuda_stream
    error = 0.0
    for a, b, c, launch in sets[:2]:
        c.fill_(float("nan"))
        launch(stream)
        ref = a.double() @ b.double()
        error = max(error, ((c.double() - ref).norm() / ref.norm()).item())
    if not error < 1e-2:
        raise AssertionError(f"{M}x{N}x{K}: relative error {error} against float64")
    fns = {"ours": lambda a, b, c, launch: launch(stream), "cublas": lambda a, b, c, launch: torch.matmul(a, b, out=c)}
    for fn in fns.values():  # warm-up: clocks, cuBLAS's heuristics
        _time(torch, fn, sets, 3)
    reps = max(5, min(200, int(20 / max(_time(torch, fns["cublas"], sets, 5), 1e-3))))
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[name].append(_time(torch, fns[name], sets, reps))
    tflops = {name: 2.0 * M * N * K / (statistics.median(t) * 1e-3) / 1e12 for name, t in times.items()}
    ratio = statistics.median(c / o for c, o in zip(times["cublas"], times["ours"]))
    return tflops["ours"], tflops["cublas"], ratio, error


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="MxNxK shapes")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "kit-gemm-h200.json"))
    args = parser.parse_args(argv)
    import torch

    prepare = runpy.run_path(str(EXAMPLE))["prepare"]  # (not __main__: the example's check does not run)
    lines = len(EXAMPLE.read_text().splitlines())
    records = []
    for text in args.shapes:
        M, N, K = _shape(text)
        ours, ref, ratio, error = bench_shape(torch, prepare, M, N, K, args.rounds)
        records.append({"name": f"{M}x{N}x{K} bf16", "M": M, "N": N, "K": K, "ours_tflops": round(ours, 1),
                        "ref_tflops": round(ref, 1), "ratio": round(ratio, 3), "lines": lines})
        print(f"{M}x{N}x{K}: kit GEMM {ours:.0f} TFLOP/s, cuBLAS {ref:.0f} TFLOP/s, ratio {ratio:.3f} "
              f"(error {error:.1e})", flush=True)
    result = {"benchmark": "examples/07_persistent_gemm.py against torch.matmul (cuBLAS), bf16",
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "rounds": args.rounds, "records": records}
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
