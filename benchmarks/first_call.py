"""First-call cost of numba_hopper.gemm in a new process: cold (empty kernel cache), then warm.

    python benchmarks/first_call.py [--out PATH] [--no-prebuilt]  # two new processes, one fresh cache dir
    python benchmarks/first_call.py --child   # (what each of them runs) prints one JSON line

Each child times its first gemm call (2048^3 bf16; torch's CUDA context already up) and its
second; the parent reports both, where the child's kernels came from (the package's prebuilt
kernels, the user cache, or compiled) and whether it wrote any cache entry (only after
compiling). ``--no-prebuilt`` turns the prebuilt kernels off (``NUMBA_HOPPER_PREBUILT=0``):
the cold child then measures the compile path. Results go to
``benchmarks/results/first-call-<gpu>.json`` (``first-call-compile-<gpu>.json`` with
``--no-prebuilt``; ``--out`` to write elsewhere).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def child():
    import torch

    from numba_hopper import gemm
    from numba_hopper.runtime import kernel_cache as _kernel_cache

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = gemm(a, b)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "first_call_s": times[0], "second_call_s": times[1],
                      "rel_error": err,
                      "used_prebuilt": _kernel_cache.kernel_sources["prebuilt"] > 0,
                      "kernel_sources": dict(_kernel_cache.kernel_sources),
                      "prebuilt_unused_because": _kernel_cache.prebuilt_status()}))


def _entries(directory):
    return {p.name: p.stat().st_mtime_ns for p in pathlib.Path(directory).glob("*.nbk")}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", action="store_true")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/first-call[-compile]-<gpu>.json)")
    p.add_argument("--no-prebuilt", action="store_true", help="compile instead of loading the prebuilt kernels")
    args = p.parse_args()
    if args.child:
        return child()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_HOPPER_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        env.pop("NUMBA_HOPPER_PREBUILT", None)
        if args.no_prebuilt:
            env["NUMBA_HOPPER_PREBUILT"] = "0"
        runs = {}
        for name in ("cold", "warm"):
            before = _entries(cache)
            proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True)
            runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name]["wrote_cache_entries"] = _entries(cache) != before
    for name, r in runs.items():
        sources = ", ".join(f"{n} {where}" for where, n in sorted(r["kernel_sources"].items())) or "none"
        print(f"{name}: first call {r['first_call_s'] * 1e3:9.1f} ms, second {r['second_call_s'] * 1e3:6.2f} ms, "
              f"kernels: {sources}, wrote cache entries: {r['wrote_cache_entries']}, rel error {r['rel_error']:.1e}")
    if runs["cold"]["prebuilt_unused_because"]:
        print(f"prebuilt kernels not used: {runs['cold']['prebuilt_unused_because']}")
    gpu = runs["cold"]["gpu"]  # "NVIDIA H100 80GB HBM3": "h100", as bench_gemm.save_results names it
    name = f"first-call{'-compile' if args.no_prebuilt else ''}-{(gpu.split()[1:2] or [gpu])[0].lower()}.json"
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / name)
    out.write_text(json.dumps(runs, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
