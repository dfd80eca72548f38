"""Sustained load: throughput, SM clock and board power of each kernel choice and cuBLAS.

    python benchmarks/bench_sustained.py --shapes 8192x28672x4096:RC --configs default n256-2x1
    python benchmarks/bench_sustained.py --shapes 4096x7168x16384 --fp8 blockwise   # vs torch._scaled_mm
    python benchmarks/bench_sustained.py --suite train --out sustained   # benchmarks/results/sustained-<gpu>.json

Under seconds of back-to-back GEMMs an H100 or H200 runs at its power limit, and a kernel that
spends more energy per FLOP (for one, more reads from the L2) gets a lower clock. Each
contender runs ``--seconds`` of ``out=`` calls (``--fp8``: a new output per call, both sides)
on the same operands while ``nvidia-smi`` samples power and SM clock every 50 ms (reads only;
the instantaneous power where the driver reports it, else its average). Each 16-bit contender's
output is first checked against float64 (``rel_error``). One unmeasured run brings the card to
its working temperature, then contenders alternate over ``--rounds``, and each figure is the
median. ``TFLOP/s per MHz`` separates the kernel's efficiency per cycle from the clock it gets;
``J/TFLOP`` is board energy per unit of work. ``--suite train``: the largest products of
``bench_train.py``'s 4 x 2048-token steps, in their autograd layouts.
"""

import argparse
import functools
import pathlib
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_fp8 import _operands as fp8_operands, _scales as fp8_scales  # noqa: E402
from bench_gemm import (TRAIN_MODELS, _config, _operand, _parse_shape, linear_products, print_table,  # noqa: E402
                        save_results)

import numba_hopper  # noqa: E402


@functools.lru_cache(maxsize=None)
def _power_field():
    """``power.draw.instant`` where this nvidia-smi has it (``power.draw`` may be a 1 s average,
    which would mix a contender's power with the pause before it)."""
    probe = subprocess.run(["nvidia-smi", "--query-gpu=power.draw.instant", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    try:
        float(probe.stdout.split()[0])
        return "power.draw.instant"
    except (IndexError, ValueError):
        return "power.draw"


TRAIN_TOKENS = 8192  # bench_train.py's 4 x 2048


def _train_shapes():
    """The largest products of ``bench_train.py``'s 4 x 2048-token steps (``bench_gemm.TRAIN_MODELS``):
    each model's MLP gate/up projection and the largest LM head, forward, dX and dW."""
    linears = [(hidden, mlp) for _, _, hidden, _, _, mlp, _ in TRAIN_MODELS]
    linears.append(max(((hidden, vocab) for _, _, hidden, _, _, _, vocab in TRAIN_MODELS), key=lambda w: w[0] * w[1]))
    return [f"{M}x{N}x{K}:{layout}" for fan_in, fan_out in linears
            for _, M, N, K, layout in linear_products(TRAIN_TOKENS, fan_in, fan_out)]


TRAIN_SHAPES = _train_shapes()


def _sample(stop, samples):
    """(watts, MHz) from nvidia-smi every 50 ms until ``stop`` is set."""
    proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={_power_field()},clocks.sm", "--format=csv,noheader,nounits",
                             "-lms", "50"], stdout=subprocess.PIPE, text=True)
    while not stop.is_set():
        try:
            samples.append(tuple(float(x) for x in proc.stdout.readline().split(",")))
        except ValueError:
            pass
    proc.terminate()


def checked_error(fn, out, ref):
    """The relative norm error of ``fn()``, which writes ``out``, against the float64 ``ref``,
    ``out`` poisoned (NaN) first; an error of 1e-2 or more raises."""
    out.fill_(float("nan"))
    fn()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    if not err < 1e-2:
        raise AssertionError(f"relative error {err} against float64")
    return err


def sustained_run(fn, reps):
    """(ms per call, mean watts, mean MHz) over ``reps`` calls, after the power ramp."""
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=_sample, args=(stop, samples))
    sampler.start()
    time.sleep(0.2)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    stop.set()
    sampler.join()
    steady = samples[len(samples) // 4:]
    return start.elapsed_time(end) / reps, statistics.mean(s[0] for s in steady), statistics.mean(s[1] for s in steady)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", help="MxNxK[:layout] (bf16)")
    p.add_argument("--suite", choices=["train"], help="the training steps' largest products (TRAIN_SHAPES)")
    p.add_argument("--fp8", choices=("tensor", "rowwise", "blockwise"),
                   help="e4m3 TN operands with these scales (bench_fp8.py's), against torch._scaled_mm")
    p.add_argument("--configs", nargs="+", default=["default"], help="as bench_gemm.py's --configs")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=1.2)
    p.add_argument("--out", metavar="KIND_OR_PATH",
                   help="write the records: a name (benchmarks/results/<name>-<gpu>.json) or a .json path")
    args = p.parse_args()
    shapes = (args.shapes or []) + (TRAIN_SHAPES if args.suite == "train" else [])
    if not shapes:
        p.error("give --shapes or --suite")
    records = []
    for shape in shapes:
        _, M, N, K, dtype, layout = _parse_shape(shape)
        if args.fp8:  # a new bf16 output per call on both sides, as bench_fp8.py
            layout = "RC"
            a, b = fp8_operands(M, N, K)
            errors = {}  # (bench_fp8.py checks these products)
            (sa, sb), (ra, rb) = fp8_scales(args.fp8, M, N, K)
            fns = {"scaled_mm": lambda: torch._scaled_mm(a, b, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)}
            for name in args.configs:
                fns[name] = lambda cfg=_config(name, layout): numba_hopper.gemm(a, b, scale_a=sa, scale_b=sb, config=cfg)
        else:
            a, b = _operand(M, K, dtype, layout[0]), _operand(K, N, dtype, layout[1])
            c = torch.empty(M, N, device="cuda", dtype=a.dtype)
            fns = {"cublas": lambda: torch.matmul(a, b, out=c)}
            ref = a.double() @ b.double()
            errors = {"cublas": checked_error(fns["cublas"], c, ref)}
            for name in args.configs:
                try:
                    cfg = _config(name, layout)
                except ValueError as e:  # a config that does not take this layout
                    print(f"{shape} {name}: skipped ({e})")
                    continue
                fns[name] = lambda cfg=cfg: numba_hopper.gemm(a, b, out=c, config=cfg)
                errors[name] = checked_error(fns[name], c, ref)
            del ref
        reference = fns[next(iter(fns))]
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        reference()
        torch.cuda.synchronize()
        reps = max(20, int(args.seconds / (time.perf_counter() - t)))
        sustained_run(reference, reps)  # (unmeasured: the card warms up)
        rows = {name: [] for name in fns}
        for r in range(args.rounds):
            for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                rows[name].append(sustained_run(fns[name], reps))
                time.sleep(0.3)
        ref_tflops = None
        for name, runs in rows.items():
            ms, watts, mhz = (statistics.median(x[i] for x in runs) for i in range(3))
            tflops = 2 * M * N * K / ms / 1e9
            ref_tflops = ref_tflops or tflops  # (the library's call runs first)
            records.append({"name": f"{shape} {name}", "M": M, "N": N, "K": K, "layout": layout, "fp8": args.fp8,
                            "kernel": name, "tflops": tflops, "ratio": tflops / ref_tflops, "watts": watts, "mhz": mhz,
                            "tflops_per_mhz": tflops / mhz, "j_per_tflop": watts / tflops,
                            "rel_error": errors.get(name)})
            print(f"{shape} {name:12s} {tflops:7.1f} TFLOP/s  {watts:6.1f} W  {mhz:5.0f} MHz  "
                  f"TFLOP/s per MHz {tflops / mhz:.4f}  J/TFLOP {watts / tflops:.3f}", flush=True)
        if args.out:  # (after each shape: a run stopped by a time limit keeps the shapes it finished)
            kind, path = (None, args.out) if args.out.endswith(".json") else (args.out, None)
            out = save_results(kind, {"power": _power_field(), "seconds": args.seconds, "rounds": args.rounds,
                                      "records": records}, path)
    if args.out:
        print_table(records, [("name", "case", "s"), ("tflops", "TFLOP/s", ".1f"), ("ratio", "vs reference", ".3f"),
                              ("watts", "W", ".0f"), ("mhz", "MHz", ".0f"), ("tflops_per_mhz", "TFLOP/s per MHz", ".4f"),
                              ("j_per_tflop", "J/TFLOP", ".3f")], out)


if __name__ == "__main__":
    main()
