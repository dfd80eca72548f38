"""numba_hopper.gemm on fp8 (e4m3, TN) vs torch._scaled_mm (cuBLASLt), same process, same inputs.

Both calls take ``a`` (M, K) row-major and ``b = w.t()`` of a row-major (N, K) ``w``, the
same float32 scales, and return a new bf16 output: ``gemm(a, b, scale_a=, scale_b=)`` against
``torch._scaled_mm(a, b, scale_a=, scale_b=, out_dtype=torch.bfloat16)``. Scalings: "tensor"
(one-element scale tensors) and "rowwise" (M and N values; ``_scaled_mm`` takes them shaped
(M, 1) and (1, N)), and "blockwise" (DeepSeek-V3's 1 x 128 / 128 x 128: scale_a (M, K/128)
with strides (1, M), scale_b (K/128, N/128) with strides (1, K/128), the layouts
``_scaled_mm`` takes). Block-wise records also carry the error of the promotion
(``promoted_f32_error``: our block-wise kernel with unit scales and an f32 output, against
float64) and without it (``unpromoted_f32_error``: the per-tensor kernel, same operands).

``--out-dtype e4m3`` times fp8 outputs instead: ``gemm(..., out_dtype="e4m3", scale_out=s,
amax_out=amax)`` against ``_scaled_mm(..., out_dtype=torch.float8_e4m3fn, scale_result=s)``
(cuBLASLt computes no amax there: ours does more work).

The reference runs ``_scaled_mm``'s default (``use_fast_accum=False``: cuBLASLt promotes
the fp8 accumulator into f32, which this kernel does for block-wise scales only);
``--fast-accum`` times its unpromoted variant, the like-for-like one for the others.

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
import math

import torch

# (bench_gemm also puts the checkout on sys.path)
from bench_gemm import _config, interleaved_rounds, medians, paired_ratio, print_table, results_name, save_results
from numba_hopper import gemm

# (name, M, N, K): the issue's anchors, then DeepSeek-V3's projections at M = 128 and 4096.
SUITE = [("4096^3", 4096, 4096, 4096), ("8192^3", 8192, 8192, 8192), ("4096x7168x16384", 4096, 7168, 16384),
         ("128x7168x16384", 128, 7168, 16384)]
SUITE += [(f"dsv3 {M}x{N}x{K}", M, N, K) for M in (128, 4096)
          for N, K in ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))]
QUICK = ("4096^3", "128x7168x16384")
SCALINGS = ("tensor", "rowwise", "blockwise")


ROUNDING = {"bf16": 5e-3, "e4m3": 5e-2}  # the output's (e4m3: 3 mantissa bits, RMS about 2^-4 / sqrt(3))


def tolerance(K, scaling, out_dtype="bf16"):
    """Relative error bound of an fp8 product: the output's rounding plus fp8 wgmma's ~14-bit
    accumulation, which grows with K unless promoted every 128 K (block-wise;
    tests/test_fp8_gpu.py derives the terms)."""
    return ROUNDING[out_dtype] + (3e-4 if scaling == "blockwise" else 6.4e-7 * K)


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


def _promotion_errors(a, b):
    """f32-output errors against float64 of ``a @ b`` with and without the promotion."""
    K, N = b.shape
    ref = a.double() @ b.double()
    ones = (torch.ones(a.shape[0], -(-K // 128), device="cuda"), torch.ones(-(-K // 128), -(-N // 128), device="cuda"))
    return {"promoted_f32_error": _rel(gemm(a, b, scale_a=ones[0], scale_b=ones[1], out_dtype="f32"), ref),
            "unpromoted_f32_error": _rel(gemm(a, b, out_dtype="f32"), ref)}


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def bench_shape(M, N, K, scaling, rounds, l2_bytes, device_time=False, fast_accum=False, configs=("default",),
                out_dtype="bf16"):
    """Our TFLOP/s (the first of ``configs``: bench_gemm's names; all of them under
    ``configs_tflops``) and ``_scaled_mm``'s, timed in interleaved rounds."""
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

    def ours(config):
        return lambda a, b, s, t: gemm(a, b, scale_a=s[0], scale_b=s[1], config=config, **fp8_kw)

    fns = {name: ours(_config(name, "RC")) for name in configs}  # fp8 operands are K-major
    fns["ours"] = fns.pop(configs[0])
    fns["ref"] = (lambda a, b, s, t: torch._scaled_mm(a, b, scale_a=t[0], scale_b=t[1], use_fast_accum=fast_accum,
                                                      **ref_kw))

    a, b, s, t = sets[0]
    ref = _reference(a, b, *s) * (out_scale.item() if fp8_out else 1.0)
    errors = {name: _rel(fn(a, b, s, t), ref) for name, fn in fns.items()}
    if not max(e for name, e in errors.items() if name != "ref") < tolerance(K, scaling, out_dtype):
        raise AssertionError(f"{M}x{N}x{K} {scaling}: relative errors {errors}")
    extra = _promotion_errors(a, b) if scaling == "blockwise" else {}
    times = interleaved_rounds(fns, sets, rounds, "ref", device_time)
    med = medians(times)
    flops = 2.0 * M * N * K
    return {**extra, "ours_tflops": flops / med["ours"] / 1e9, "ref_tflops": flops / med["ref"] / 1e9,
            "ratio": paired_ratio(times, "ref", "ours"), "ratio_of_medians": med["ref"] / med["ours"],
            "rel_error": errors["ours"], "ref_rel_error": errors["ref"],
            "ours_ms": med["ours"], "ref_ms": med["ref"],
            **({"configs_tflops": {c: flops / med["ours" if c == configs[0] else c] / 1e9 for c in configs}}
               if len(configs) > 1 else {})}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=" and ".join(QUICK) + " only")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--device-time", action="store_true",
                   help="time the GPU alone (the host enqueues ahead during a sleep kernel)")
    p.add_argument("--fast-accum", action="store_true",
                   help="time _scaled_mm with use_fast_accum=True (no promotion of the fp8 accumulator, like ours) "
                        "rather than its default")
    p.add_argument("--configs", nargs="+", default=["default"],
                   help="our kernels (bench_gemm.py's names, e.g. default m64-n128 n64; n192 is the opt-in 128x192 "
                        "tile, which block-wise products never get by default); the first is the record's")
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
    scalings = args.scalings.split(",")
    records = []
    for name, M, N, K in suite:
        for scaling in scalings:
            try:
                r = bench_shape(M, N, K, scaling, args.rounds, l2, args.device_time, args.fast_accum, args.configs,
                                args.out_dtype)
            except (RuntimeError, NotImplementedError) as e:  # _scaled_mm refuses some scalings with fp8 outputs
                print(f"{name:24s} {scaling:8s} skipped: {str(e).splitlines()[0]}", flush=True)
                continue
            records.append({"name": name, "M": M, "N": N, "K": K, "scaling": scaling, "out_dtype": args.out_dtype,
                            **r})
            print(f"{name:24s} {scaling:8s} ours {r['ours_tflops']:7.1f}  _scaled_mm {r['ref_tflops']:7.1f} TFLOP/s"
                  f"  ratio {r['ratio']:.3f}  err {r['rel_error']:.2e}"
                  + "".join(f"  {c} {t:.1f}" for c, t in r.get("configs_tflops", {}).items()), flush=True)
    kind = results_name("fp8", args.out_dtype == "e4m3" and "e4m3-out", args.quick and "quick",
                        args.shapes and "shapes", args.scalings != ",".join(SCALINGS) and "-".join(scalings),
                        args.configs != ["default"] and "configs", args.fast_accum and "fast-accum",
                        args.device_time and "device")
    out = save_results(kind, {"timing": "device" if args.device_time else "wall (host call rate included)",
                              "calls": f"gemm(a, b, scale_a=, scale_b=) vs torch._scaled_mm(..., out_dtype="
                                       f"{args.out_dtype}, use_fast_accum={args.fast_accum}), e4m3 TN, fresh outputs"
                                       + (", scale_out/scale_result 0.25, our amax_out" if args.out_dtype == "e4m3"
                                          else ""),
                              "records": records}, args.out)
    for scaling in scalings:
        ratios = [r["ratio"] for r in records if r["scaling"] == scaling]
        if ratios:
            print(f"geomean ratio, {scaling}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    print_table(records, [("name", "shape", "s"), ("scaling", "scaling", "s"), ("ours_tflops", "ours TFLOP/s", ".1f"),
                          ("ref_tflops", "_scaled_mm TFLOP/s", ".1f"), ("ratio", "ratio", ".3f"),
                          ("rel_error", "rel. error", ".2e")], out)


if __name__ == "__main__":
    main()
