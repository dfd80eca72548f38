"""numba_hopper.gemm vs cuBLAS (torch.matmul), same process, same inputs.

The headline is the call users make: ``gemm(a, b)`` against ``torch.matmul(a, b)``, fresh
operands (the input sets rotate) and a new output every call. The second column is the
steady state with ``out=``: ``gemm(a, b, out=c)`` against ``torch.matmul(a, b, out=c)``.

Method (docs/performance.md, "How a ratio is taken"): for each shape, enough input sets to
exceed twice the L2 are rotated so no call reads a cached operand; CUDA events time ``reps`` calls in a row; the
contenders alternate in rounds (reversed every other round) so clock sag under the H100's
power limit hits all alike; times are medians over rounds, and a ratio is the median of
the rounds' ratios (``paired_ratio``: the clock's swing between rounds cancels). Every
shape is checked against float64 before it is timed, on both call forms.

    python benchmarks/bench_gemm.py                 # the full suite: benchmarks/results/gemm-<gpu>.json
    python benchmarks/bench_gemm.py --quick         # 4096^3 and 8192^3 only (gemm-quick-<gpu>.json)
    python benchmarks/bench_gemm.py --shapes 4096x4096x4096 --out out.json
    python benchmarks/bench_gemm.py --quick --configs default 2x1 1x2 2x2   # cluster variants

Each run writes ``benchmarks/results/<name>-<gpu>.json`` (``--out`` to write elsewhere), the
name saying what ran (``gemm``, ``gemm-small``, ``gemm-device``, ``gemm-quick-configs``, ...),
so a rerun replaces the baseline it measures again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from numba_hopper import GemmConfig, bmm, gemm  # noqa: E402
from numba_hopper.matmul.heuristics import SUSTAINED, max_stages  # noqa: E402

# (name, M, N, K, dtype, layout)
SUITE = [
    ("1024^3", 1024, 1024, 1024, "bf16", "RR"),
    ("2048^3", 2048, 2048, 2048, "bf16", "RR"),
    ("4096^3", 4096, 4096, 4096, "bf16", "RR"),
    ("6144^3", 6144, 6144, 6144, "bf16", "RR"),
    ("8192^3", 8192, 8192, 8192, "bf16", "RR"),
    ("8192x8192x1024", 8192, 8192, 1024, "bf16", "RR"),
    ("4096x4096x512", 4096, 4096, 512, "bf16", "RR"),
    ("16384x4096x4096", 16384, 4096, 4096, "bf16", "RR"),
    ("1792x1280x4096 (140 tiles)", 1792, 1280, 4096, "bf16", "RR"),
    ("1920x1280x4096 (150 tiles)", 1920, 1280, 4096, "bf16", "RR"),
    ("1000^3", 1000, 1000, 1000, "bf16", "RR"),
    ("4096^3 fp16", 4096, 4096, 4096, "f16", "RR"),
    ("4096^3 RC", 4096, 4096, 4096, "bf16", "RC"),
    ("4096^3 CR", 4096, 4096, 4096, "bf16", "CR"),
    ("4096^3 CC", 4096, 4096, 4096, "bf16", "CC"),
]
# Small, skinny and batched products, partial last waves (--suite small).
SMALL_SUITE = [
    ("128x8192x8192", 128, 8192, 8192, "bf16", "RR"),
    ("64x4096x4096", 64, 4096, 4096, "bf16", "RR"),
    ("256x14336x4096", 256, 14336, 4096, "bf16", "RR"),
    ("16384x128x4096", 16384, 128, 4096, "bf16", "RR"),
    ("1024^3", 1024, 1024, 1024, "bf16", "RR"),
    ("1792x1280x4096 (140 tiles)", 1792, 1280, 4096, "bf16", "RR"),
    ("1920x1280x4096 (150 tiles)", 1920, 1280, 4096, "bf16", "RR"),
    ("32x(1024x1024x128)", 1024, 1024, 128, "bf16", "RR", 32),
    ("8x(4096x4096x4096)", 4096, 4096, 4096, "bf16", "RR", 8),
]
# A training step's products (--suite train): each linear's forward (x @ W^T: RC), dX (dY @ W: RR)
# and dW (dY^T @ X: CR), bench_train.py's Llama-3-8B at 4 x 2048 tokens and Qwen3-4B at 2 x 1024.
# (model, tokens, hidden, q width, kv width, MLP width, vocabulary)
TRAIN_MODELS = [("llama-3-8b", 8192, 4096, 4096, 1024, 14336, 128256),
                ("qwen3-4b", 2048, 2560, 4096, 1024, 9728, 151936)]


def linear_products(tokens, fan_in, fan_out):
    """A linear's products in autograd's layouts, ``(name, M, N, K, layout)``: the forward
    ``x @ W.T``, ``dX = dY @ W`` and ``dW = dY.T @ x`` (K = the tokens)."""
    return (("fwd", tokens, fan_out, fan_in, "RC"), ("dX", tokens, fan_in, fan_out, "RR"),
            ("dW", fan_out, fan_in, tokens, "CR"))


def _train_suite():
    """:data:`TRAIN_MODELS`' products, each shape and layout once (Llama's o is its q)."""
    suite, seen = [], set()
    for model, tokens, hidden, q, kv, mlp, vocab in TRAIN_MODELS:
        linears = [("q", hidden, q), ("k/v", hidden, kv), ("o", q, hidden), ("gate/up", hidden, mlp),
                   ("down", mlp, hidden), ("lm_head", hidden, vocab)]
        for linear, fan_in, fan_out in linears:
            for product, M, N, K, layout in linear_products(tokens, fan_in, fan_out):
                if (M, N, K, layout) not in seen:
                    seen.add((M, N, K, layout))
                    suite.append((f"{model} {linear} {product}", M, N, K, "bf16", layout))
    return suite


TRAIN_SUITE = _train_suite()
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}


def _operand(rows, cols, dtype, major, batch=1):
    lead = (batch,) if batch > 1 else ()
    if major == "R":
        return torch.randn(*lead, rows, cols, device="cuda", dtype=TORCH_DTYPE[dtype])
    return torch.randn(*lead, cols, rows, device="cuda", dtype=TORCH_DTYPE[dtype]).transpose(-1, -2)


def _time(fn, sets, reps, device_time=False):
    """Milliseconds per call over ``reps`` calls rotating through ``sets``.

    With ``device_time`` the stream first sleeps for longer than the host needs to enqueue
    the ``reps`` calls, so the events time back-to-back kernels, with no gaps where the GPU
    waits for the host (small products are otherwise timed at the host's call rate).
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if device_time:
        torch.cuda._sleep(reps * 100_000)  # ~50 us of host time per call at ~2 GHz
    start.record()
    for i in range(reps):
        fn(*sets[i % len(sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def interleaved_rounds(fns, sets, rounds, reference, device_time=False):
    """Seconds per call of each of ``fns`` (name -> fn(*set)) in each round, as lists: a
    warm-up (compile, clocks), reps chosen so one timing of ``reference`` lasts ~20 ms, then
    ``rounds`` rounds that time every contender once, in reversed order every other round."""
    for fn in fns.values():
        _time(fn, sets, 3, device_time)
    est = _time(fns[reference], sets, 5, device_time)
    reps = max(5, min(200, int(20 / max(est, 1e-3))))
    times = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            times[name].append(_time(fns[name], sets, reps, device_time))
    return times


def medians(times):
    """Each contender's median over the rounds of :func:`interleaved_rounds`' ``times``."""
    return {k: statistics.median(v) for k, v in times.items()}


def interleaved_medians(fns, sets, rounds, reference, device_time=False):
    """Median seconds per call of each of ``fns`` over :func:`interleaved_rounds`."""
    return medians(interleaved_rounds(fns, sets, rounds, reference, device_time))


def paired_ratio(times, reference, name):
    """``reference``'s time over ``name``'s: the median over rounds of the two timings' ratio in
    one round. Under the H100's power limit a shape's per-round times swing 20-30% as the clock
    moves, and the two timings of a round, tens of ms apart, share the clock: their ratio
    cancels the swing, where the ratio of each side's median keeps part of it (5-round ratios
    of medians spread 0.91-0.96 at 512x4096x14336, whose paired ratios read 1.00-1.03)."""
    return statistics.median(r / n for r, n in zip(times[reference], times[name]))


def _config(name, layout="RR"):
    """The ``GemmConfig`` of :func:`_call_options` (None: ``default``), for calls that take no
    ``split_k``."""
    options = _call_options(name, layout)
    if "split_k" in options:
        raise ValueError(f"{name!r} splits K (gemm's split_k): this benchmark runs no split")
    return options["config"]


def _call_options(name, layout="RR"):
    """``gemm``'s keywords ``config`` and, where ``name`` has an ``s`` part, ``split_k``, for
    ``default`` (the library's choice), ``sustained`` (its choice for products run back to back at the power
    limit: ``config="sustained"``) or a kernel spelled as dash-separated parts:
    a cluster shape ``MxN`` (``2x1``), ``m<block_m>`` (``m64``), ``n<block_n>`` (``n192``), ``s<K slices>`` (``s4``),
    ``p<pipeline stages>`` (``p3``), ``g<tile-rows per raster group>`` (``g16``), ``w<tile-columns per
    row-walked raster group>`` (``2x1-gpc-w8``), ``sk`` (stream-K),
    ``swap`` (the product computed swapped, a column-major output tile: ``m64-n8-swap``), ``gpc`` (clusters in
    GPC order: ``n112-1x2-gpc``), ``pp`` (ping-pong consumers: ``n176-pp``), ``a<accumulators>``
    (``a4``), ``e<output buffers per consumer>`` (``e1``), ``af``/``al`` and ``bf``/``bl`` (A's or B's loads at L2
    priority evict_first / evict_last: ``2x1-al-bf``), ``dyn`` (the dynamic schedule: ``2x1-dyn``); e.g. ``n128-s2``, ``n192-sk``. Unnamed parts keep GemmConfig's defaults (128x256 tiles, no cluster,
    no split, no stream-K, the deepest ring that fits). ``layout``: the operands' (``RC``: A row-major, B
    column-major), whose majors the config is checked with.
    """
    if name in ("default", SUSTAINED):
        return {"config": None if name == "default" else SUSTAINED}
    kw = {"a_major": "K" if layout[0] == "R" else "M", "b_major": "N" if layout[1] == "R" else "K"}
    parts = {"m": "block_m", "n": "block_n", "s": "split_k", "p": "stages", "g": "group_m", "a": "acc_chains",
             "e": "epi_buffers", "w": "group_n"}
    for part in name.split("-"):
        if "x" in part:
            kw["cluster_m"], kw["cluster_n"] = (int(x) for x in part.split("x"))
        elif part == "sk":
            kw["stream_k"] = True
        elif part == "swap":
            kw["out_major"] = "M"
        elif part == "gpc":
            kw["cluster_order"] = "gpc"
        elif part == "pp":
            kw["pingpong"] = True
        elif part == "dyn":
            kw["dynamic_schedule"] = True
        elif part in ("af", "al", "bf", "bl"):
            kw[part[0] + "_evict"] = {"f": "first", "l": "last"}[part[1]]
        elif part[0] in parts and part[1:].isdigit():
            kw[parts[part[0]]] = int(part[1:])
        else:
            raise ValueError(f"bad config part {part!r} in {name!r}")
    split_k = kw.pop("split_k", None)
    if "stages" not in kw:
        kw["stages"] = max_stages("bf16", "f32" if (split_k or 1) > 1 else "bf16", **kw)
    return {"config": GemmConfig(**kw), **({"split_k": split_k} if split_k else {})}


def bench_shape(M, N, K, dtype, layout, rounds, l2_bytes, configs=("default",), batch=1, device_time=False):
    """TFLOP/s of each of our ``configs`` and of cuBLAS, timed in interleaved rounds
    (``device_time``: the GPU's work alone, not the host's call rate; see ``_time``)."""
    set_bytes = 2 * batch * (M * K + K * N + M * N)
    nsets = max(2, math.ceil(2 * l2_bytes / set_bytes) + 1)
    lead = (batch,) if batch > 1 else ()
    sets = [(_operand(M, K, dtype, layout[0], batch), _operand(K, N, dtype, layout[1], batch),
             torch.empty(*lead, M, N, device="cuda", dtype=TORCH_DTYPE[dtype])) for _ in range(nsets)]

    ours = bmm if batch > 1 else gemm
    cublas = torch.bmm if batch > 1 else torch.matmul
    fns = {"cublas": lambda a, b, c: cublas(a, b), "cublas out=": lambda a, b, c: cublas(a, b, out=c)}
    for name in configs:
        options = _call_options(name, layout)  # (bmm takes no split_k)
        fns[name] = lambda a, b, c, options=options: ours(a, b, **options)
        fns[f"{name} out="] = lambda a, b, c, options=options: ours(a, b, out=c, **options)

    a, b, c = sets[0]
    ref = a.double() @ b.double()
    errors = {}
    for name in configs:
        c.fill_(float("nan"))
        fns[f"{name} out="](a, b, c)
        for form, got in (("fresh", fns[name](a, b, None)), ("out=", c)):
            err = ((got.double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                raise AssertionError(f"{M}x{N}x{K} {dtype} {layout} {name} ({form}): relative error {err}")
            errors[name] = max(errors.get(name, 0.0), err)
    times = interleaved_rounds(fns, sets, rounds, "cublas", device_time)
    med = medians(times)
    flops = 2.0 * batch * M * N * K
    return {
        name: {
            "ours_tflops": flops / med[name] / 1e9,
            "cublas_tflops": flops / med["cublas"] / 1e9,
            "ratio": paired_ratio(times, "cublas", name),
            "ratio_of_medians": med["cublas"] / med[name],
            "rel_error": errors[name],
            "ours_ms": med[name],
            "cublas_ms": med["cublas"],
            "out_ours_tflops": flops / med[f"{name} out="] / 1e9,
            "out_cublas_tflops": flops / med["cublas out="] / 1e9,
            "out_ratio": paired_ratio(times, "cublas out=", f"{name} out="),
        }
        for name in configs
    }


def current_commit():
    """``GIT_COMMIT`` if set (a copy of the tree without its history, as on the device
    machine), else the checkout's short HEAD."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() or "unknown"


def results_name(kind, *variant):
    """``kind`` and the parts of ``variant`` that are set, dash-joined: what a results file is
    named after (``results_name("gemm", "small", None, "device")`` is ``"gemm-small-device"``)."""
    return "-".join([kind, *(part for part in variant if part)])


def save_results(kind, fields, path=None):
    """Write ``{gpu, date, commit, **fields}`` as JSON to ``path`` (default: the baseline
    ``benchmarks/results/<kind>-<gpu>.json``, which a rerun of the same benchmark replaces);
    return the path."""
    device = torch.cuda.get_device_name()  # "NVIDIA H100 80GB HBM3": "h100" in the file name
    result = {"gpu": device, "date": datetime.date.today().isoformat(), "commit": current_commit(), **fields}
    gpu = (device.split()[1:2] or [device])[0].lower()
    out = pathlib.Path(path or ROOT / "benchmarks" / "results" / f"{kind}-{gpu}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


def print_table(records, columns, out):
    """Print ``records`` as a markdown table of ``columns`` (``(key, header, format)``), then
    where the results file went."""
    print("\n| " + " | ".join(h for _, h, _ in columns) + " |\n|" + "---|" * len(columns))
    for r in records:
        print("| " + " | ".join(format(r[k], f) for k, _, f in columns) + " |")
    print(f"results: {out}")


def _parse_shape(s):
    """``MxNxK`` or ``MxNxK:LAYOUT`` (``RR``, ``RC``, ``CR``, ``CC``; bf16)."""
    dims, _, layout = s.partition(":")
    m, n, k = (int(x) for x in dims.lower().split("x"))
    return (s, m, n, k, "bf16", layout or "RR")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="4096^3 and 8192^3 only")
    p.add_argument("--suite", choices=["large", "small", "train"], default="large",
                   help="large: squares, partial waves, layouts; small: skinny, partial-wave and batched shapes; "
                        "train: a training step's products in their autograd layouts")
    p.add_argument("--shapes", nargs="*", help="MxNxK[:layout] shapes (bf16, layout RR by default), not the suite")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--configs", nargs="*", default=["default"],
                   help="our variants to time: 'default' and/or kernels like 2x1, 1x2, n192, n128-s2")
    p.add_argument("--device-time", action="store_true",
                   help="time the GPU alone (the host enqueues ahead during a sleep kernel)")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/<name>-<gpu>.json, the name saying what ran)")
    args = p.parse_args(argv)

    suite = [_parse_shape(s) for s in args.shapes] if args.shapes else \
        {"large": SUITE, "small": SMALL_SUITE, "train": TRAIN_SUITE}[args.suite]
    if args.quick:
        suite = [s for s in SUITE if s[0] in ("4096^3", "8192^3")]
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    records = []
    for name, M, N, K, dtype, layout, *batch in suite:
        batch = batch[0] if batch else 1
        results = bench_shape(M, N, K, dtype, layout, args.rounds, l2, args.configs, batch, args.device_time)
        for config, r in results.items():
            label = name if config == "default" else f"{name} [{config}]"
            records.append({"name": label, "M": M, "N": N, "K": K, "batch": batch, "dtype": dtype,
                            "layout": layout, "config": config, **r})
            print(f"{label:40s} ours {r['ours_tflops']:7.1f}  cuBLAS {r['cublas_tflops']:7.1f} TFLOP/s"
                  f"  ratio {r['ratio']:.3f}  (out=: {r['out_ratio']:.3f})", flush=True)
    kind = results_name("gemm", args.suite != "large" and args.suite, args.quick and "quick", args.shapes and "shapes",
                        args.configs != ["default"] and "configs", args.device_time and "device")
    out = save_results(kind, {"timing": "device" if args.device_time else "wall (host call rate included)",
                              "calls": "ratio: gemm(a, b) vs torch.matmul(a, b), fresh operands and outputs; "
                                       "out_ratio: both with out= (steady state)", "records": records}, args.out)

    print("\n| shape | ours TFLOP/s | cuBLAS TFLOP/s | ratio (fresh) | ratio (out=) |\n|---|---|---|---|---|")
    for r in records:
        print(f"| {r['name']} | {r['ours_tflops']:.1f} | {r['cublas_tflops']:.1f} | {r['ratio']:.3f} "
              f"| {r['out_ratio']:.3f} |")
    for config in args.configs:
        for field in ("ratio", "out_ratio"):
            big = [r[field] for r in records if r["config"] == config and min(r["M"], r["N"], r["K"]) >= 2048]
            if big:
                print(f"geomean {field} (M,N,K >= 2048), {config}: {math.exp(sum(map(math.log, big)) / len(big)):.3f}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
