"""Two versions of numba_hopper in one process, old and new alternating: did a change move speed?

A restructure that must not change the kernels (same SASS) should not change speed either; this
is its GPU check. The other version is a copy of the package imported under another name, so
both run in one process on the same inputs, timed against the same reference in interleaved
rounds (``bench_gemm.interleaved_rounds``), the user's call pattern (fresh operands, a new output
per call). Each case reports both versions' ratio against the reference and new/old.

    python benchmarks/ab_versions.py --make-base REF          # copy a git ref's package to .ab/
    python benchmarks/ab_versions.py                         # time .ab/'s copy against this tree's
    python benchmarks/ab_versions.py --train                 # ... on a training step's products
    python benchmarks/ab_versions.py --shapes 8192x2048x2048:RR   # ... on these, as a step issues them
    python benchmarks/ab_versions.py --train --sustained 0.8 --rounds 4   # ... at the power limit

``--sustained SECONDS`` times each version and the reference for that long at a stretch
(``bench_sustained.py``'s method: at the power limit, where a product's rate is set by its energy
per FLOP), in rounds of alternating order, and adds each side's mean power and SM clock.

Writes ``benchmarks/results/ab-<gpu>.json`` (``--sustained``: ``ab-sustained-<gpu>.json``;
``--out`` to change): records {name, M, N, K, base, base_ratio, new_ratio, new_over_base}, with
``--sustained`` also {ref,base,new}_{watts,mhz}.
"""

from __future__ import annotations

import argparse
import importlib
import io
import math
import pathlib
import re
import statistics
import subprocess
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASE_DIR = ROOT / ".ab"
BASE_NAME = "numba_hopper_base"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def make_base(ref: str, out: pathlib.Path = BASE_DIR):
    """Extract ``ref``'s ``numba_hopper/`` as the package ``numba_hopper_base`` under ``out``."""
    data = subprocess.run(["git", "archive", ref, "numba_hopper"], cwd=ROOT, check=True, capture_output=True).stdout
    target = out / BASE_NAME
    if target.exists():
        import shutil

        shutil.rmtree(target)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                text = tar.extractfile(member).read().decode()
                # absolute self-references (imports, module paths in strings), not torch op names
                text = re.sub(r"\bnumba_hopper\b(?!::)", BASE_NAME, text)
                path = out / (BASE_NAME + member.name[len("numba_hopper"):])
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True, text=True)
    (out / "REF").write_text(commit.stdout)


def cases(torch):
    """``(name, M, N, K, make_inputs(), call(module, inputs), reference(inputs))``: the GEMM's
    main paths (plain, fused, fp8 per-tensor and block-wise, decode, gated, grouped)."""
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    dev = "cuda"

    def plain(M, N, K):
        return (lambda: (torch.randn(M, K, device=dev, dtype=bf16), torch.randn(K, N, device=dev, dtype=bf16)),
                lambda nh, x: nh.gemm(*x), lambda x: torch.matmul(*x))

    def linear_gelu(M, N, K):
        def make():
            return (torch.randn(M, K, device=dev, dtype=bf16), torch.randn(N, K, device=dev, dtype=bf16),
                    torch.randn(N, device=dev, dtype=bf16))
        return (make, lambda nh, x: nh.gemm(x[0], x[1].t(), bias=x[2], bias_dim=1, activation="gelu_tanh"),
                lambda x: torch.nn.functional.gelu(torch.nn.functional.linear(*x), approximate="tanh"))

    def fp8(M, N, K, blockwise):
        def make():
            a = torch.randn(M, K, device=dev).to(e4m3)
            b = torch.randn(N, K, device=dev).to(e4m3)
            if blockwise:
                sa = torch.rand(K // 128, M, device=dev).t()
                sb = torch.rand(N // 128, K // 128, device=dev)
                return a, b, sa, sb
            return a, b, torch.tensor(0.5, device=dev), torch.tensor(2.0, device=dev)

        def ours(nh, x):
            sb = x[3].t() if blockwise else x[3]
            return nh.gemm(x[0], x[1].t(), scale_a=x[2], scale_b=sb)

        def ref(x):
            sb = x[3].t() if blockwise else x[3]
            return torch._scaled_mm(x[0], x[1].t(), scale_a=x[2], scale_b=sb, out_dtype=bf16)
        return make, ours, ref

    def gated(M, N, K):
        def make():
            return (torch.randn(M, K, device=dev, dtype=bf16), torch.randn(N, K, device=dev, dtype=bf16),
                    torch.randn(N, K, device=dev, dtype=bf16))
        return (make, lambda nh, x: nh.gemm(x[0], x[1].t(), up=x[2].t(), activation="silu"),
                lambda x: torch.nn.functional.silu(x[0] @ x[1].t()) * (x[0] @ x[2].t()))

    return [
        ("4096^3", 4096, 4096, 4096, *plain(4096, 4096, 4096)),
        ("8192^3", 8192, 8192, 8192, *plain(8192, 8192, 8192)),
        ("8x4096x4096 decode", 8, 4096, 4096, *plain(8, 4096, 4096)),
        ("512x4096x4096", 512, 4096, 4096, *plain(512, 4096, 4096)),
        ("linear+gelu 4096x11008x4096", 4096, 11008, 4096, *linear_gelu(4096, 11008, 4096)),
        ("fp8 per-tensor 4096^3", 4096, 4096, 4096, *fp8(4096, 4096, 4096, False)),
        ("fp8 per-tensor 8192^3", 8192, 8192, 8192, *fp8(8192, 8192, 8192, False)),
        ("fp8 per-tensor 4096x7168x2048", 4096, 7168, 2048, *fp8(4096, 7168, 2048, False)),
        ("fp8 per-tensor 4096x2112x7168", 4096, 2112, 7168, *fp8(4096, 2112, 7168, False)),
        ("fp8 per-tensor 128x7168x16384", 128, 7168, 16384, *fp8(128, 7168, 16384, False)),
        ("fp8 per-tensor 128x4096x7168", 128, 4096, 7168, *fp8(128, 4096, 7168, False)),
        ("fp8 block-wise 4096x4096x7168", 4096, 4096, 7168, *fp8(4096, 4096, 7168, True)),
        ("gated 4096x5632x2048", 4096, 5632, 2048, *gated(4096, 5632, 2048)),
    ]


def train_cases(torch, shapes=None):
    """Plain bf16 products as a training step issues them (``config="sustained"``), fresh
    operands each call: ``shapes`` (``MxNxK[:layout]``, as ``bench_gemm.py --shapes`` takes
    them), else the training steps' products in autograd's layouts (``bench_gemm.py --suite
    train``)."""
    from bench_gemm import TRAIN_SUITE, _operand, _parse_shape

    def plain(M, N, K, layout):
        return (lambda: (_operand(M, K, "bf16", layout[0]), _operand(K, N, "bf16", layout[1])),
                lambda nh, x: nh.gemm(*x, config="sustained"), lambda x: torch.matmul(*x))

    suite = [_parse_shape(s) for s in shapes] if shapes else TRAIN_SUITE
    return [(f"{name} {M}x{N}x{K}:{layout}" if not shapes else name, M, N, K, *plain(M, N, K, layout))
            for name, M, N, K, _, layout in suite]


def sustained_rounds(fns, inputs, seconds, rounds):
    """``--sustained``: each side run for ``seconds`` at a stretch, ``rounds`` times, base and new
    in alternating order, the reference after them; the ratios are medians of the rounds'."""
    from bench_sustained import sustained_run

    calls = {k: (lambda f=f: f(*inputs)) for k, f in fns.items()}
    reps = max(10, int(seconds * 1000 / sustained_run(calls["ref"], 20)[0]))
    sustained_run(calls["new"], reps)  # the card at its power limit before the first round
    runs = {k: [] for k in calls}
    for r in range(rounds):
        for k in (("base", "new") if r % 2 == 0 else ("new", "base")) + ("ref",):
            runs[k].append(sustained_run(calls[k], reps))

    def ratio(num, den):
        return round(statistics.median(n[0] / d[0] for n, d in zip(runs[num], runs[den])), 4)

    rec = dict(base_ratio=ratio("ref", "base"), new_ratio=ratio("ref", "new"), new_over_base=ratio("base", "new"))
    for k, v in runs.items():
        rec[f"{k}_watts"] = round(statistics.median(x[1] for x in v), 1)
        rec[f"{k}_mhz"] = round(statistics.median(x[2] for x in v))
    return rec


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--make-base", metavar="REF", help="copy REF's package to .ab/ and exit")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--only", nargs="*", help="substrings of the case names to run")
    p.add_argument("--train", action="store_true", help="the training steps' products in place of the cases")
    p.add_argument("--shapes", nargs="*", help="plain products MxNxK[:layout] as a training step issues them, "
                                                "in place of the cases")
    p.add_argument("--sustained", type=float, metavar="SECONDS",
                   help="time each side for SECONDS at a stretch, at the power limit (see the module doc)")
    p.add_argument("--out", help="results file (default: benchmarks/results/ab-<gpu>.json)")
    args = p.parse_args(argv)
    if args.make_base:
        make_base(args.make_base)
        print(f"{args.make_base}'s package is {BASE_DIR / BASE_NAME}")
        return
    import torch

    from bench_gemm import interleaved_rounds, paired_ratio, save_results

    sys.path.insert(0, str(BASE_DIR))
    base = importlib.import_module(BASE_NAME)
    new = importlib.import_module("numba_hopper")
    ref_name = (BASE_DIR / "REF").read_text().strip()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    records = []
    chosen = train_cases(torch, args.shapes) if args.train or args.shapes else cases(torch)
    for name, M, N, K, make, call, reference in chosen:
        if args.only and not any(s in name for s in args.only):
            continue
        first = make()
        want = reference(first).double()
        for label, module in (("base", base), ("new", new)):
            got = call(module, first).double()
            err = ((got - want).norm() / want.norm()).item()
            if not err < 3e-2:
                raise AssertionError(f"{name}: {label} relative error {err:.2e}")
        fns = {"ref": lambda *x: reference(x), "base": lambda *x: call(base, x), "new": lambda *x: call(new, x)}
        rec = dict(name=name, M=M, N=N, K=K, base=ref_name)
        if args.sustained:
            rec.update(sustained_rounds(fns, first, args.sustained, args.rounds))
        else:  # fresh operands each call: sets that exceed the L2 twice over
            nbytes = sum(t.numel() * t.element_size() for t in first)
            sets = [first] + [make() for _ in range(max(1, math.ceil(2 * l2 / nbytes)))]
            times = interleaved_rounds(fns, sets, args.rounds, "ref")
            rec.update(base_ratio=round(paired_ratio(times, "ref", "base"), 4),
                       new_ratio=round(paired_ratio(times, "ref", "new"), 4),
                       new_over_base=round(paired_ratio(times, "base", "new"), 4))
        records.append(rec)
        print(f"{name:44} base {rec['base_ratio']:.3f}  new {rec['new_ratio']:.3f}  new/base {rec['new_over_base']:.3f}",
              flush=True)
    command = " ".join(["python", "benchmarks/ab_versions.py", *(sys.argv[1:] if argv is None else argv)])
    fields = {"rounds": args.rounds, "sustained_seconds": args.sustained, "command": command, "records": records}
    path = save_results("ab-sustained" if args.sustained else "ab", fields, args.out)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
