"""numba_hopper.grouped_gemm vs torch._grouped_mm (bf16) and vs torch._scaled_mm per group (fp8
e4m3, block-wise scales), same process, same inputs.

Contiguous (mixture-of-experts prefill): ``a`` (rows, K), the experts' weights ``b`` as a
(G, N, K) tensor's ``.transpose(1, 2)`` (the layout ``torch._grouped_mm`` takes), int32
cumulative ``offsets``; both return a new (rows, N) bf16 output. Shapes: DeepSeek-V3's expert
projections (up: N = 4096, K = 7168; down: N = 7168, K = 2048) at G = 8 and 32, Mixtral's
(G = 8, N = 14336, K = 4096); each with balanced groups and skewed ones (one group of 0 rows,
one of 10x the others', the same total rows).

Masked (decoding, DeepGEMM's layout): ``a`` (G, M, K) with ``masked_m[g]`` valid rows, G = 16,
M = 256, ``masked_m`` drawn from 0..256. The reference is a loop of ``torch.mm`` over each
group's valid rows (``out=`` slices of one (G, M, N) output; its sizes are known to the
host here, which a real decode step would have to synchronize for). TFLOP/s count valid
rows only, for both.

FP8 (dtype "e4m3", DeepSeek-V3's recipe): the DeepSeek-V3 shapes above and the masked decode
ones, with block-wise scales (scale_a 1 x 128 in torch's strides, (rows, K/128) or (G, M, K/128);
scale_b (G, K/128, N/128), each group's 128 x 128 blocks). The reference is a Python loop of
``torch._scaled_mm(a_g, b_g, scale_a=sa_g, scale_b=sb_g, out_dtype=torch.bfloat16)`` over the
non-empty groups, with the same scales laid out as it asks (sa_g (M_g, K/128) strides (1, M_g),
sb_g (K/128, N/128) strides (1, K/128), built before timing); where this PyTorch refuses, the
record keeps its error (``ref_error``) and no reference time. Errors against float64 of the
dequantized operands; the check bound is the block-wise one (5e-3 + 3e-4).

Method: bench_gemm.py's (docs/performance.md), with its helpers: input sets rotated to exceed
twice the L2, CUDA events over ``reps`` calls, rounds interleaved and reversed every other
round, the median over rounds, a warm-up first. Each case is checked against float64 on a
sample (three groups, the first 512 columns) before it is timed.

    python benchmarks/bench_grouped.py            # the suite: benchmarks/results/grouped-<gpu>.json
    python benchmarks/bench_grouped.py --quick    # one contiguous and one masked case of each dtype
    python benchmarks/bench_grouped.py --out out.json --rounds 10
    python benchmarks/bench_grouped.py --dtypes e4m3   # the fp8 cases only
    python benchmarks/bench_grouped.py --dtypes e4m3 --configs default n192   # our tile choice vs 128x192
"""

from __future__ import annotations

import argparse
import itertools
import math

import torch

# (bench_gemm also puts the checkout on sys.path)
from bench_gemm import _config, interleaved_medians, print_table, results_name, save_results
from numba_hopper import grouped_gemm

# (name, G, rows per group, N, K)
CONTIGUOUS = [
    ("dsv3 up G=8", 8, 2048, 4096, 7168),
    ("dsv3 down G=8", 8, 2048, 7168, 2048),
    ("dsv3 up G=32", 32, 512, 4096, 7168),
    ("dsv3 down G=32", 32, 512, 7168, 2048),
    ("mixtral up G=8", 8, 2048, 14336, 4096),
]
# (name, G, M, N, K)
MASKED = [("decode up G=16", 16, 256, 4096, 7168), ("decode down G=16", 16, 256, 7168, 2048)]
QUICK = ("dsv3 up G=8", "decode up G=16")
# fp8: the DeepSeek-V3 cases (mixtral's weights are bf16)
FP8_CONTIGUOUS = [c for c in CONTIGUOUS if c[0].startswith("dsv3")]
SAMPLE_COLS = 512
FP8_TOL = 5e-3 + 3e-4  # tests/test_fp8_gpu.py's block_tolerance("bf16")


def group_sizes(G, per_group, skewed):
    """Balanced: ``per_group`` each. Skewed, the same total: group 0 empty, group 1 ten times the
    others (G >= 3)."""
    if not skewed:
        return [per_group] * G
    unit = G * per_group // (G - 2 + 10)
    sizes = [0, 10 * unit] + [unit] * (G - 2)
    sizes[-1] += G * per_group - sum(sizes)
    return sizes


def _weights(G, N, K):
    return (torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5).transpose(1, 2)


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def _sample_error(out, a_rows, b, groups):
    """Relative error of ``out``'s rows of ``groups`` (``[(g, row slice of a, row slice of out)]``),
    first SAMPLE_COLS columns, against float64."""
    got = torch.cat([out[o][:, :SAMPLE_COLS] for _, _, o in groups])
    ref = torch.cat([a_rows[s].double() @ b[g][:, :SAMPLE_COLS].double() for g, s, _ in groups])
    return _rel(got, ref)


def _nsets(set_bytes, l2_bytes):
    return max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)


def bench_contiguous(G, per_group, N, K, skewed, rounds, l2_bytes, device_time, configs=("default",)):
    sizes = group_sizes(G, per_group, skewed)
    rows = sum(sizes)
    ends = list(itertools.accumulate(sizes))
    offsets = torch.tensor(ends, device="cuda", dtype=torch.int32)
    sets = [(torch.randn(rows, K, device="cuda", dtype=torch.bfloat16), _weights(G, N, K), offsets)
            for _ in range(_nsets(2 * (rows * K + G * N * K + rows * N), l2_bytes))]
    fns = _ours(lambda config: lambda a, b, o: grouped_gemm(a, b, o, config=config), configs)
    if hasattr(torch, "_grouped_mm"):
        ref_name = "torch._grouped_mm"
        fns["ref"] = lambda a, b, o: torch._grouped_mm(a, b, offs=o)
    else:  # an older PyTorch: one torch.mm per group, the sizes known to the host
        ref_name = "torch.mm loop"

        def loop(a, b, o):
            out = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
            for g, (s, e) in enumerate(zip([0] + ends[:-1], ends)):
                if e > s:
                    torch.mm(a[s:e], b[g], out=out[s:e])
            return out

        fns["ref"] = loop
    a, b, o = sets[0]
    nonempty = [g for g in range(G) if sizes[g]]
    sample = [(g, slice(ends[g] - sizes[g], ends[g]), slice(ends[g] - sizes[g], ends[g]))
              for g in sorted({nonempty[0], nonempty[-1], max(nonempty, key=sizes.__getitem__)})]
    errors = {name: _sample_error(fn(a, b, o), a, b, sample) for name, fn in fns.items()}
    if not max(e for name, e in errors.items() if name != "ref") < 1e-2:
        raise AssertionError(f"contiguous G={G} {N}x{K}: relative errors {errors}")
    med = interleaved_medians(fns, sets, rounds, "ref", device_time)
    return _record(2.0 * rows * N * K, med, errors, ref_name, sizes, configs)


def bench_masked(G, M, N, K, rounds, l2_bytes, device_time, seed=0, configs=("default",)):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, M + 1, (G,), generator=gen).tolist()
    masked_m = torch.tensor(counts, device="cuda", dtype=torch.int32)
    sets = [(torch.randn(G, M, K, device="cuda", dtype=torch.bfloat16), _weights(G, N, K), masked_m)
            for _ in range(_nsets(2 * (G * M * K + G * N * K + G * M * N), l2_bytes))]

    def loop(a, b, m):
        out = torch.empty(G, M, N, device="cuda", dtype=torch.bfloat16)
        for g, c in enumerate(counts):
            if c:
                torch.mm(a[g, :c], b[g], out=out[g, :c])
        return out

    fns = {**_ours(lambda config: lambda a, b, m: grouped_gemm(a, b, masked_m=m, config=config), configs), "ref": loop}
    a, b, m = sets[0]
    nonempty = [g for g in range(G) if counts[g]]
    sample = [(g, (g, slice(0, counts[g])), (g, slice(0, counts[g]))) for g in nonempty[:3]]
    errors = {name: _sample_error(fn(a, b, m), a, b, sample) for name, fn in fns.items()}
    if not max(e for name, e in errors.items() if name != "ref") < 1e-2:
        raise AssertionError(f"masked G={G} {N}x{K}: relative errors {errors}")
    med = interleaved_medians(fns, sets, rounds, "ref", device_time)
    return _record(2.0 * sum(counts) * N * K, med, errors, "torch.mm loop over the valid rows", counts, configs)


def _fp8(x):
    return x.to(torch.float8_e4m3fn)


def _fp8_weights(G, N, K):
    return _fp8(torch.randn(G, N, K, device="cuda") * 0.5).transpose(1, 2)


def _col_major(shape):
    """Positive float32 scales of ``shape`` with each matrix column-major (torch's strides)."""
    return (torch.rand(*shape[:-2], shape[-1], shape[-2], device="cuda") + 0.5).transpose(-1, -2)


def _dequantized(x, scales, axis):
    """float64 ``x`` times its scales spread over 128-long blocks: along K (``axis`` 1, A's
    1 x 128) or along K and N (``axis`` None, B's 128 x 128)."""
    if axis == 1:
        full = scales.double().repeat_interleave(128, 1)[:, :x.shape[1]]
    else:
        full = scales.double().repeat_interleave(128, 0)[:x.shape[0]].repeat_interleave(128, 1)[:, :x.shape[1]]
    return x.double() * full


def _fp8_sample_error(out, a, b, sa, sb, groups):
    """:func:`_sample_error` for block-wise fp8: ``groups`` is ``[(g, rows of a and sa, rows of out)]``."""
    got = torch.cat([out[o][:, :SAMPLE_COLS] for _, _, o in groups])
    cols, blocks = slice(0, SAMPLE_COLS), slice(0, SAMPLE_COLS // 128)
    ref = torch.cat([_dequantized(a[s], sa[s], 1) @ _dequantized(b[g][:, cols], sb[g][:, blocks], None)
                     for g, s, _ in groups])
    return _rel(got, ref)


def bench_fp8(layout, G, rows_or_m, N, K, skewed, rounds, l2_bytes, device_time, seed=0, configs=("default",)):
    """One fp8 block-wise case: contiguous (``rows_or_m`` rows per group, ``skewed`` sizes) or
    masked (M = ``rows_or_m``, counts drawn from 0..M). Returns the record's timing fields."""
    kb, nb = -(-K // 128), -(-N // 128)
    if layout == "contiguous":
        sizes = group_sizes(G, rows_or_m, skewed)
        rows, ends = sum(sizes), list(itertools.accumulate(sizes))
        offsets = torch.tensor(ends, device="cuda", dtype=torch.int32)
        spans = [(g, slice(e - n, e), slice(e - n, e)) for g, (n, e) in enumerate(zip(sizes, ends)) if n]
        a_shape, sa_shape, out_shape = (rows, K), (rows, kb), (rows, N)
        flops = 2.0 * rows * N * K
    else:
        gen = torch.Generator().manual_seed(seed)
        sizes = torch.randint(0, rows_or_m + 1, (G,), generator=gen).tolist()
        offsets = torch.tensor(sizes, device="cuda", dtype=torch.int32)
        spans = [(g, (g, slice(0, c)), (g, slice(0, c))) for g, c in enumerate(sizes) if c]
        a_shape, sa_shape, out_shape = (G, rows_or_m, K), (G, rows_or_m, kb), (G, rows_or_m, N)
        flops = 2.0 * sum(sizes) * N * K
    set_bytes = torch.Size(a_shape).numel() + G * N * K + 2 * torch.Size(out_shape).numel()  # fp8 in, bf16 out
    sets = []
    for _ in range(_nsets(set_bytes, l2_bytes)):
        sa, sb = _col_major(sa_shape), _col_major((G, kb, nb))
        # the reference's per-group scales, in torch._scaled_mm's strides, made once
        per_group = [(g, rows, orows, sa[rows].t().contiguous().t(), sb[g].t().contiguous().t())
                     for g, rows, orows in spans]
        sets.append((_fp8(torch.randn(*a_shape, device="cuda") * 2), _fp8_weights(G, N, K), offsets, sa, sb,
                     per_group))
    masked = layout == "masked"

    def ours(config):
        def call(a, b, o, sa, sb, _):
            return grouped_gemm(a, b, masked_m=o, scale_a=sa, scale_b=sb, config=config) if masked else \
                grouped_gemm(a, b, o, scale_a=sa, scale_b=sb, config=config)
        return call

    def ref(a, b, o, sa, sb, per_group):
        out = torch.empty(*out_shape, device="cuda", dtype=torch.bfloat16)
        for g, rows, orows, sa_g, sb_g in per_group:
            out[orows] = torch._scaled_mm(a[rows], b[g], scale_a=sa_g, scale_b=sb_g, out_dtype=torch.bfloat16)
        return out

    a, b, o, sa, sb, per_group = sets[0]
    largest = max(range(len(spans)), key=lambda i: sizes[spans[i][0]])
    sample = [spans[i] for i in sorted({0, len(spans) - 1, largest})]
    fns = _ours(ours, configs)
    errors = {name: _fp8_sample_error(fn(*sets[0]), a, b, sa, sb, sample) for name, fn in fns.items()}
    if not max(errors.values()) < FP8_TOL:
        raise AssertionError(f"fp8 {layout} G={G} {N}x{K}: relative errors {errors}")
    errors["ref"], ref_error = None, None
    try:
        errors["ref"] = _fp8_sample_error(ref(*sets[0]), a, b, sa, sb, sample)
        fns["ref"] = ref
    except (RuntimeError, NotImplementedError, TypeError) as e:  # this PyTorch refuses block-wise scales
        ref_error = f"{type(e).__name__}: {e}"
    med = interleaved_medians(fns, sets, rounds, "ref" if "ref" in fns else "ours", device_time)
    record = _record(flops, med, errors, "torch._scaled_mm loop over the non-empty groups", sizes, configs)
    return {**record, "ref_error": ref_error} if ref_error else record


def _ours(call, configs):
    """``{name: fn}`` of our kernels: ``call(config)`` for each of ``configs`` (bench_gemm's
    names), the first named "ours"."""
    fns = {name: call(_config(name, "RC")) for name in configs}  # b[g] column-major, as the suite passes it
    fns["ours"] = fns.pop(configs[0])
    return fns


def _record(flops, med, errors, ref_name, sizes, configs):
    """The timing fields of a record (the reference's None when it was not timed); with more
    than one of ``configs``, each one's TFLOP/s under ``configs_tflops``."""
    ref = med.get("ref")
    extra = {"configs_tflops": {c: flops / med["ours" if i == 0 else c] / 1e9 for i, c in enumerate(configs)}} \
        if len(configs) > 1 else {}
    return {"ours_tflops": flops / med["ours"] / 1e9, "ref_tflops": ref and flops / ref / 1e9,
            "ratio": ref and ref / med["ours"], "rel_error": errors["ours"], "ref_rel_error": errors["ref"],
            "ours_ms": med["ours"], "ref_ms": ref, "reference": ref_name, "sizes": sizes, **extra}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=" and ".join(QUICK) + " (balanced) only")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--device-time", action="store_true",
                   help="time the GPU alone (the host enqueues ahead during a sleep kernel)")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/<name>-<gpu>.json, the name saying what ran)")
    p.add_argument("--dtypes", nargs="*", choices=["bf16", "e4m3"], default=["bf16", "e4m3"],
                   help="bf16 cases (vs torch._grouped_mm / a torch.mm loop) and/or fp8 block-wise ones "
                        "(vs a torch._scaled_mm loop)")
    p.add_argument("--configs", nargs="+", default=["default"],
                   help="our kernels, named as in bench_gemm.py (the first is 'ours'; e.g. default n192)")
    args = p.parse_args(argv)

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    records = []

    def done(r):
        records.append(r)
        ref = "refused" if r["ratio"] is None else f"{r['ref_tflops']:7.1f}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"{r['name']:32s} {r['layout']:10s} {r['dtype']:5s} ours {r['ours_tflops']:7.1f}  ref {ref} TFLOP/s"
              f"  ratio {ratio}  err {r['rel_error']:.2e}" + (f"  ({r['ref_error']})" if r.get("ref_error") else "")
              + "".join(f"  {c} {t:.1f}" for c, t in r.get("configs_tflops", {}).items()), flush=True)

    for dtype in args.dtypes:
        for name, G, per_group, N, K in CONTIGUOUS if dtype == "bf16" else FP8_CONTIGUOUS:
            if args.quick and name not in QUICK:
                continue
            for skewed in (False,) if args.quick else (False, True):
                if dtype == "bf16":
                    r = bench_contiguous(G, per_group, N, K, skewed, args.rounds, l2, args.device_time,
                                         configs=args.configs)
                else:
                    r = bench_fp8("contiguous", G, per_group, N, K, skewed, args.rounds, l2, args.device_time,
                                  configs=args.configs)
                done({"name": f"{name} {'skewed' if skewed else 'balanced'}", "layout": "contiguous", "dtype": dtype,
                      "groups": G, "N": N, "K": K, **r})
        for name, G, M, N, K in MASKED:
            if args.quick and name not in QUICK:
                continue
            if dtype == "bf16":
                r = bench_masked(G, M, N, K, args.rounds, l2, args.device_time, configs=args.configs)
            else:
                r = bench_fp8("masked", G, M, N, K, False, args.rounds, l2, args.device_time, configs=args.configs)
            done({"name": name, "layout": "masked", "dtype": dtype, "groups": G, "M": M, "N": N, "K": K, **r})
    kind = results_name("grouped", args.quick and "quick", args.dtypes != ["bf16", "e4m3"] and "-".join(args.dtypes),
                        args.configs != ["default"] and "configs", args.device_time and "device")
    out = save_results(kind, {"timing": "device" if args.device_time else "wall (host call rate included)",
                              "calls": "bf16: grouped_gemm(a, b, offsets) vs torch._grouped_mm(a, b, offs=) "
                                       "(contiguous); grouped_gemm(a, b, masked_m=) vs a torch.mm loop over the "
                                       "valid rows (masked); e4m3: grouped_gemm(..., scale_a=, scale_b=) "
                                       "block-wise vs a torch._scaled_mm loop over the non-empty groups; "
                                       "b[g] column-major, fresh outputs",
                              "records": records}, args.out)
    for dtype in args.dtypes:
        ratios = [r["ratio"] for r in records if r["dtype"] == dtype and r["ratio"] is not None]
        if ratios:
            print(f"{dtype} geomean ratio: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    shown = [{**r, "ref_tflops": r["ref_tflops"] or float("nan"), "ratio": r["ratio"] or float("nan")} for r in records]
    print_table(shown, [("name", "case", "s"), ("layout", "layout", "s"), ("dtype", "dtype", "s"),
                        ("ours_tflops", "ours TFLOP/s", ".1f"), ("ref_tflops", "reference TFLOP/s", ".1f"),
                        ("ratio", "ratio", ".3f"), ("rel_error", "rel. error", ".2e")], out)


if __name__ == "__main__":
    main()
