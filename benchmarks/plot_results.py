"""Draw a benchmark results file: TFLOP/s of numba_hopper and cuBLAS per shape, and their ratio.

    python benchmarks/plot_results.py [RESULTS.json] [-o chart.png]
    python benchmarks/plot_results.py benchmarks/results/sweep-h100.json -o docs/sweep-h100.png   # the README's chart

A sweep file (``bench_sweep.py``, too many shapes for bars) is drawn as the ratio against
the product's size, one colour per model.

Default input: the newest GEMM suite baseline, ``benchmarks/results/gemm-<gpu>.json`` (by
modification time); default output: the input's name with ``.png``. Needs matplotlib (``pip install 'numba-hopper[plot]'``).
"""

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def newest_results() -> pathlib.Path:
    files = sorted((p for p in (ROOT / "benchmarks" / "results").glob("gemm-*.json") if p.stem.count("-") == 1),
                   key=lambda p: p.stat().st_mtime)  # gemm-<gpu>.json, not gemm-small-<gpu>.json and the like
    if not files:
        raise SystemExit("no benchmarks/results/gemm-<gpu>.json; run benchmarks/bench_gemm.py first")
    return files[-1]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(result: dict, out: pathlib.Path):
    plt = _pyplot()
    groups = {}
    for r in result["records"]:
        name = r["name"].split()[0] if "M=" in r["name"] else ("square" if r["name"].endswith("^3") else "layouts")
        groups.setdefault(name, []).append(r)
    fig, ax = plt.subplots(figsize=(10, 5))
    for name, rs in groups.items():
        ax.scatter([2 * r["M"] * r["N"] * r["K"] for r in rs], [r["ratio"] for r in rs], s=18, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(result["geomean_ratio"], color="tab:red", linestyle="--", linewidth=0.8,
               label=f"geomean {result['geomean_ratio']:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs of the product (2MNK)")
    ax.set_ylabel("numba_hopper / cuBLAS (fresh operands)")
    ax.set_title(f"gemm(a, b) vs torch.matmul(a, b), {len(result['records'])} bf16 shapes, {result['gpu']} "
                 f"({result['date']}, {result['commit']})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.axhline(0.95, color="gray", linestyle=":", linewidth=0.8, label="0.95")
    ax.legend(fontsize=8, ncols=3, loc="upper right")  # the corner the ratios leave empty
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot(result: dict, out: pathlib.Path):
    if "geomean_ratio" in result:
        return plot_sweep(result, out)
    plt = _pyplot()
    records = result["records"]
    names = [r["name"] for r in records]
    x = range(len(records))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(3, 1.3))
    width = 0.4
    top.bar([i - width / 2 for i in x], [r["ours_tflops"] for r in records], width, label="numba_hopper.gemm(a, b)")
    top.bar([i + width / 2 for i in x], [r["cublas_tflops"] for r in records], width,
            label="cuBLAS (torch.matmul(a, b))")
    top.set_ylabel("TFLOP/s")
    top.set_ylim(0, 1.15 * max(max(r["ours_tflops"], r["cublas_tflops"]) for r in records))  # room for the legend
    top.legend(loc="upper left", ncols=2)
    top.set_title(f"GEMM on {result['gpu']} ({result['date']}, commit {result['commit']})")
    top.grid(axis="y", alpha=0.3)
    bottom.bar(list(x), [r["ratio"] for r in records], 0.6, color="tab:green")
    bottom.axhline(1.0, color="black", linewidth=0.8)
    bottom.set_ylabel("ours / cuBLAS")
    bottom.set_ylim(0, max(1.2, max(r["ratio"] for r in records) * 1.05))
    bottom.grid(axis="y", alpha=0.3)
    bottom.set_xticks(list(x), names, rotation=35, ha="right", fontsize=8)  # names say dtype/layout if not bf16 RR
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results", nargs="?", type=pathlib.Path)
    p.add_argument("-o", "--output", type=pathlib.Path)
    args = p.parse_args()
    src = args.results or newest_results()
    out = args.output or src.with_suffix(".png")
    plot(json.loads(src.read_text()), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
