"""numba_hopper.gemm on fp8 (e4m3, TN) vs torch._scaled_mm (cuBLASLt), same process, same inputs.

Both calls take ``a`` (M, K) row-major and ``b = w.t()`` of a row-major (N, K) ``w``, the
same float32 scales, and return a new bf16 output: ``gemm(a, b, scale_a=, scale_b=)`` against
``torch._scaled_mm(a, b, scale_a=, scale_b=, out_dtype=torch.bfloat16)``. Scalings: "tensor"
(one-element scale tensors) and "rowwise" (M and N values; ``_scaled_mm`` takes them shaped
(M, 1) and (1, N)), and "blockwise" (DeepSeek-V3's 1 x 128 / 128 x 128: scale_a (M, K/128)
with strides (1, M), scale_b (K/128, N/128) with strides (1, K/128), the layouts
``_scaled_mm`` takes).

Like with like: each point runs in the accumulation pairings of ``--accumulate``:
"promoted" (our default, which adds each 128-deep k-block's sum into f32 registers) against
``_scaled_mm``'s default (``use_fast_accum=False``: cuBLASLt promotes too), and "fast"
(``use_fast_accum=True`` on both sides: the tensor cores' fp8 accumulator throughout;
per-tensor and row-wise only: block-wise products always promote). Each record carries both
libraries' relative errors against float64 of the dequantized operands with an f32 output
(``ours_error``, ``ref_error``: the accumulation's error, which a bf16 output's rounding
would hide) and with the timed output (``ours_out_error``, ``ref_out_error``).

``--out-dtype e4m3`` times fp8 outputs instead: ``gemm(..., out_dtype="e4m3", scale_out=s,
amax_out=amax)`` against ``_scaled_mm(..., out_dtype=torch.float8_e4m3fn, scale_result=s)``
(cuBLASLt computes no amax there: ours does more work).

Method: bench_gemm.py's (docs/performance.md), with its helpers: input sets rotated to
exceed twice the L2, CUDA events over ``reps`` calls, rounds interleaved and reversed every
other round, the median over rounds (a ratio: of the rounds' ratios, ``paired_ratio``), a
warm-up first. Each shape and scaling is checked against a float64 reference of the
dequantized operands before it is timed.

    python benchmarks/bench_fp8.py            # the suite: benchmarks/results/fp8-<gpu>.json
    python benchmarks/bench_fp8.py --device-time --rounds 7   # the steady state: fp8-device-<gpu>.json
    python benchmarks/bench_fp8.py --quick    # 4096^3 and 128x7168x16384 only (fp8-quick-<gpu>.json)
    python benchmarks/bench_fp8.py --out out.json --rounds 10
    python benchmarks/bench_fp8.py --scalings blockwise --configs default n192   # the opt-in 128x192 tile
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch

# (bench_gemm also puts the checkout on sys.path)
from bench_gemm import _call_options, interleaved_rounds, medians, paired_ratio, print_table, results_name, save_results
from numba_hopper import gemm

# (name, M, N, K): the issue's anchors, then DeepSeek-V3's projections at M = 128 and 4096.
SUITE = [("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192), ("4096x7168x16384", 4096, 7168, 16384),
         ("128x7168x16384", 128, 7168, 16384)]
SUITE += [(f"dsv3 {M}x{N}x{K}", M, N, K) for M in (128, 4096)
          for N, K in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))]
QUICK = ("4096^3", "128x7168x16384")
SCALINGS = ("tensor", "rowwise", "blockwise")


ROUNDING = {"bf16": 5e-3, "e4m3": 5e-2}  # the output's (e4m3: 3 mantissa bits, RMS about 2^-4 / sqrt(3))


def tolerance(K, fast, out_dtype="bf16"):
    """Relative error bound of an fp8 product: the output's rounding plus fp8 wgmma's ~14-bit
    accumulation, which grows with K unless promoted every 128 K (tests/test_fp8_gpu.py
    derives the terms)."""
    return ROUNDING[out_dtype] + (6.4e-7 * K if fast else 3e-4)


def _operands(M, N, K):
    a = (torch.randn(M, K, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    return a, w.t()


def _scales(scaling, M, N, K):
    """``(ours, theirs)``: gemm's scale_a/scale_b and the same values as _scaled_mm takes them."""
    if scaling == "tensor":
        sa, sb = torch.tensor(0.75, device="cuda"), torch.tensor(1.5, device="cuda")
        return (sa, sb), (sa, sb)
    if scaling == "blockwise":
        kb, nb = -(-K // 128), -(-N // 128)
        sa, sb = (torch.rand(kb, M, device="cuda") + 0.5).t(), (torch.rand(nb, kb, device="cuda") + 0.5).t()
        return (sa, sb), (sa, sb)
    sa, sb = torch.rand(M, device="cuda") + 0.5, torch.rand(N, device="cuda") + 0.5
    return (sa, sb), (sa[:, None].contiguous(), sb[None, :].contiguous())


def _reference(a, b, sa, sb):
    """float64 ``(scale_a * a) @ (b * scale_b)``, block-wise scales expanded to elements."""
    K, N = b.shape
    sa, sb = sa.double(), sb.double()
    if sa.dim() == 1:
        sa, sb = sa[:, None], sb[None, :]
    elif sa.dim() == 2 and (sa.shape[1] > 1 or sb.shape != (1, N)):  # block-wise
        sa = sa.repeat_interleave(128, 1)[:, :K]
        sb = sb.repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
    return (a.double() * sa) @ (b.double() * sb)


def _f32_errors(a, b, s, t, ref, fast):
    """``(ours, _scaled_mm's)`` relative errors against float64 with an f32 output (None where
    ``_scaled_mm`` refuses one)."""
    ours = _rel(gemm(a, b, scale_a=s[0], scale_b=s[1], out_dtype="f32", use_fast_accum=fast), ref)
    try:
        theirs = _rel(torch._scaled_mm(a, b, scale_a=t[0], scale_b=t[1], out_dtype=torch.float32,
                                       use_fast_accum=fast), ref)
    except (RuntimeError, NotImplementedError):
        theirs = None
    return ours, theirs


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def bench_shape(M, N, K, scaling, accumulate, rounds, l2_bytes, device_time=False, configs=("default",),
                out_dtype="bf16"):
    """Our TFLOP/s (the first of ``configs``: bench_gemm's names; all of them under
    ``configs_tflops``) and ``_scaled_mm``'s, both with ``accumulate``'s accumulation, timed in
    interleaved rounds."""
    fast = accumulate == "fast"
    fp8_out = out_dtype == "e4m3"
    set_bytes = M * K + K * N + (1 if fp8_out else 2) * M * N  # fp8 operands and the output
    nsets = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    sets = []
    for _ in range(nsets):
        a, b = _operands(M, N, K)
        ours, theirs = _scales(scaling, M, N, K)
        sets.append((a, b, ours, theirs))

    out_scale, amax = torch.tensor(0.25, device="cuda"), torch.zeros(1, device="cuda")
    fp8_kw = {"out_dtype": "e4m3", "scale_out": out_scale, "amax_out": amax} if fp8_out else {}
    ref_kw = {"out_dtype": torch.float8_e4m3fn, "scale_result": out_scale} if fp8_out else {"out_dtype": torch.bfloat16}

    def ours(options):
        return lambda a, b, s, t: gemm(a, b, scale_a=s[0], scale_b=s[1], use_fast_accum=fast, **options, **fp8_kw)

    fns = {name: ours(_call_options(name, "RC")) for name in configs}  # fp8 operands are K-major
    fns["ours"] = fns.pop(configs[0])
    fns["ref"] = (lambda a, b, s, t: torch._scaled_mm(a, b, scale_a=t[0], scale_b=t[1], use_fast_accum=fast,
                                                      **ref_kw))

    a, b, s, t = sets[0]
    ref = _reference(a, b, *s) * (out_scale.item() if fp8_out else 1.0)
    errors = {name: _rel(fn(a, b, s, t), ref) for name, fn in fns.items()}
    if not max(e for name, e in errors.items() if name != "ref") < tolerance(K, fast, out_dtype):
        raise AssertionError(f"{M}x{N}x{K} {scaling} {accumulate}: relative errors {errors}")
    ours_error, ref_error = _f32_errors(a, b, s, t, _reference(a, b, *s), fast)
    times = interleaved_rounds(fns, sets, rounds, "ref", device_time)
    med = medians(times)
    flops = 2.0 * M * N * K
    return {"ours_tflops": flops / med["ours"] / 1e9, "ref_tflops": flops / med["ref"] / 1e9,
            "ratio": paired_ratio(times, "ref", "ours"), "ratio_of_medians": med["ref"] / med["ours"],
            "ours_error": ours_error, "ref_error": ref_error,
            "ours_out_error": errors["ours"], "ref_out_error": errors["ref"],
            "ours_ms": med["ours"], "ref_ms": med["ref"],
            **({"configs_tflops": {c: flops / med["ours" if c == configs[0] else c] / 1e9 for c in configs}}
               if len(configs) > 1 else {})}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=" and ".join(QUICK) + " only")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--device-time", action="store_true",
                   help="time the GPU alone (the host enqueues ahead during a sleep kernel)")
    p.add_argument("--accumulate", default="promoted,fast",
                   help="comma-separated pairings: promoted (the defaults), fast (use_fast_accum=True on both sides)")
    p.add_argument("--configs", nargs="+", default=["default"],
                   help="our kernels (bench_gemm.py's names, e.g. default m64-n128 n64 m128-n128-s2; n192 is the "
                        "opt-in 128x192 tile, which block-wise products never get by default); the first is the "
                        "record's")
    p.add_argument("--shapes", nargs="+", help="names from the suite (default: all, or --quick's)")
    p.add_argument("--scalings", default=",".join(SCALINGS), help="comma-separated subset of " + ", ".join(SCALINGS))
    p.add_argument("--out-dtype", choices=("bf16", "e4m3"), default="bf16",
                   help="e4m3: fp8 outputs with an output scale (and our amax) on both sides")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/<name>-<gpu>.json, the name saying what ran)")
    args = p.parse_args(argv)

    names = args.shapes or (QUICK if args.quick else None)
    suite = [s for s in SUITE if names is None or s[0] in names]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    scalings, pairings = args.scalings.split(","), args.accumulate.split(",")
    records = []
    for (name, M, N, K), scaling, accumulate in itertools.product(suite, scalings, pairings):
        if scaling == "blockwise" and accumulate == "fast":  # (always promoted)
            continue
        try:
            r = bench_shape(M, N, K, scaling, accumulate, args.rounds, l2, args.device_time, args.configs,
                            args.out_dtype)
        except (RuntimeError, NotImplementedError) as e:  # _scaled_mm refuses some scalings with fp8 outputs
            print(f"{name:24s} {scaling:8s} {accumulate:8s} skipped: {str(e).splitlines()[0]}", flush=True)
            continue
        records.append({"name": name, "M": M, "N": N, "K": K, "scaling": scaling, "accumulate": accumulate,
                        "out_dtype": args.out_dtype, **r})
        print(f"{name:24s} {scaling:8s} {accumulate:8s} ours {r['ours_tflops']:7.1f}  _scaled_mm "
              f"{r['ref_tflops']:7.1f} TFLOP/s  ratio {r['ratio']:.3f}  f32 err {r['ours_error']:.2e} vs "
              f"{r['ref_error'] if r['ref_error'] is None else format(r['ref_error'], '.2e')}"
              + "".join(f"  {c} {t:.1f}" for c, t in r.get("configs_tflops", {}).items()), flush=True)
    kind = results_name("fp8", args.out_dtype == "e4m3" and "e4m3-out", args.quick and "quick",
                        args.shapes and "shapes", args.scalings != ",".join(SCALINGS) and "-".join(scalings),
                        args.configs != ["default"] and "configs",
                        args.accumulate != "promoted,fast" and args.accumulate.replace(",", "-"),
                        args.device_time and "device")
    out = save_results(kind, {"timing": "device" if args.device_time else "wall (host call rate included)",
                              "calls": f"gemm(a, b, scale_a=, scale_b=, use_fast_accum=) vs torch._scaled_mm(..., "
                                       f"out_dtype={args.out_dtype}, use_fast_accum=), the same accumulation on both "
                                       "sides, e4m3 TN, fresh outputs"
                                       + (", scale_out/scale_result 0.25, our amax_out" if args.out_dtype == "e4m3"
                                          else ""),
                              "records": records}, args.out)
    for scaling, accumulate in itertools.product(scalings, pairings):
        ratios = [r["ratio"] for r in records if (r["scaling"], r["accumulate"]) == (scaling, accumulate)]
        if ratios:
            print(f"geomean ratio, {scaling}, {accumulate}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}"
                  f" (lowest {min(ratios):.3f})")
    shown = [{**r, "ref_error": float("nan") if r["ref_error"] is None else r["ref_error"]} for r in records]
    print_table(shown, [("name", "shape", "s"), ("scaling", "scaling", "s"), ("accumulate", "accumulate", "s"),
                          ("ours_tflops", "ours TFLOP/s", ".1f"), ("ref_tflops", "_scaled_mm TFLOP/s", ".1f"),
                          ("ratio", "ratio", ".3f"), ("ours_error", "ours f32 err", ".2e"),
                          ("ref_error", "cuBLASLt f32 err", ".2e")], out)


if __name__ == "__main__":
    main()
