"""First-call cost of numba_hopper's default kernels in a new process: cold (empty kernel cache), then warm.

    python benchmarks/first_call.py [--out PATH] [--no-prebuilt] [--cases NAME ...]
    python benchmarks/first_call.py --child NAME   # (what each new process runs) prints one JSON line

Cases (``CASES``): a bf16 gemm (2048^3); fp8 e4m3 gemm at 4096^3 with per-tensor, row-wise
and block-wise scales as ``torch._scaled_mm`` takes them (benchmarks/bench_fp8.py); a bf16
and an e4m3 block-wise contiguous grouped gemm (8 groups of 2048 rows, N 4096, K 7168:
DeepSeek-V3's expert up-projection, benchmarks/bench_grouped.py). Each case runs in two new
processes that share a fresh kernel cache directory: cold (the cache empty), then warm. Each times its first call
(torch's CUDA context already up, the inputs made) and its second, and measures the result's
relative error against float64 of the (dequantized) operands. A record: ``{name, process,
first_call_s, second_call_s, used_prebuilt, rel_error, kernel_sources, wrote_cache_entries}``,
where ``kernel_sources`` says where the kernels it looked up came from (the package's prebuilt
kernels, the user cache, or compiled) and ``wrote_cache_entries`` whether the process wrote any
cache entry (only after compiling). ``--no-prebuilt`` turns the prebuilt kernels off
(``NUMBA_HOPPER_PREBUILT=0``): the cold processes then measure the compile path. Results go to
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


def _full(scale, rows, cols):
    """A float32 scale (one element, (rows, 1) / (1, cols) vectors, or one per 128 x 128 block or
    1 x 128) as the float64 (rows, cols) matrix of the factors it applies."""
    s = scale.double().reshape(scale.shape if scale.dim() == 2 else (1, 1))
    s = s.repeat_interleave(-(-rows // s.shape[0]), 0)[:rows]
    return s.repeat_interleave(-(-cols // s.shape[1]), 1)[:, :cols]


def _fp8(torch, *shape, scale):
    return (torch.randn(*shape, device="cuda") * scale).to(torch.float8_e4m3fn)


def gemm_bf16(torch, nh):
    a, b = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return lambda: nh.gemm(a, b), a.double() @ b.double()


def gemm_fp8(torch, nh, scaling, n=4096):
    """e4m3 TN (``b = w.t()``), the bf16 output ``gemm`` makes by default."""
    a, b = _fp8(torch, n, n, scale=2), _fp8(torch, n, n, scale=0.5).t()
    kb = n // 128
    sa, sb = {"tensor": lambda: (torch.tensor(0.75, device="cuda"), torch.tensor(1.5, device="cuda")),
              "rowwise": lambda: (torch.rand(n, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5),
              "blockwise": lambda: ((torch.rand(kb, n, device="cuda") + 0.5).t(),
                                    (torch.rand(kb, kb, device="cuda") + 0.5).t())}[scaling]()
    ref = (a.double() * _full(sa, n, n)) @ (b.double() * _full(sb, n, n))
    return lambda: nh.gemm(a, b, scale_a=sa, scale_b=sb), ref


def grouped(torch, nh, fp8, G=8, rows=2048, N=4096, K=7168):
    """Contiguous groups; ``b`` the experts' (G, N, K) weights ``.transpose(1, 2)``; fp8: block-wise
    scales, each matrix column-major."""
    offsets = torch.arange(1, G + 1, device="cuda", dtype=torch.int32) * rows
    if not fp8:
        a = torch.randn(G * rows, K, device="cuda", dtype=torch.bfloat16)
        b = (torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5).transpose(1, 2)
        ref = torch.cat([a[g * rows:(g + 1) * rows].double() @ b[g].double() for g in range(G)])
        return lambda: nh.grouped_gemm(a, b, offsets), ref
    a, b = _fp8(torch, G * rows, K, scale=2), _fp8(torch, G, N, K, scale=0.5).transpose(1, 2)
    kb, nb = -(-K // 128), -(-N // 128)
    sa = (torch.rand(kb, G * rows, device="cuda") + 0.5).t()
    sb = (torch.rand(G, nb, kb, device="cuda") + 0.5).transpose(1, 2)
    ref = torch.cat([(a[g * rows:(g + 1) * rows].double() * _full(sa[g * rows:(g + 1) * rows], rows, K))
                     @ (b[g].double() * _full(sb[g], K, N)) for g in range(G)])
    return lambda: nh.grouped_gemm(a, b, offsets, scale_a=sa, scale_b=sb), ref


CASES = {
    "gemm-bf16": gemm_bf16,
    "gemm-fp8-tensor": lambda torch, nh: gemm_fp8(torch, nh, "tensor"),
    "gemm-fp8-rowwise": lambda torch, nh: gemm_fp8(torch, nh, "rowwise"),
    "gemm-fp8-blockwise": lambda torch, nh: gemm_fp8(torch, nh, "blockwise"),
    "grouped-bf16": lambda torch, nh: grouped(torch, nh, fp8=False),
    "grouped-fp8-blockwise": lambda torch, nh: grouped(torch, nh, fp8=True),
}


def child(name):
    import torch

    import numba_hopper as nh
    from numba_hopper.runtime import kernel_cache as _kernel_cache

    call, ref = CASES[name](torch, nh)
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "first_call_s": times[0], "second_call_s": times[1],
                      "used_prebuilt": _kernel_cache.kernel_sources["prebuilt"] > 0, "rel_error": err,
                      "kernel_sources": dict(_kernel_cache.kernel_sources),
                      "prebuilt_unused_because": _kernel_cache.prebuilt_status()}))


def _entries(directory):
    return {p.name: p.stat().st_mtime_ns for p in pathlib.Path(directory).glob("*.nbk")}


def run_case(name, no_prebuilt):
    """The cold and the warm record of case ``name``: two new processes, one fresh cache dir."""
    records = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_HOPPER_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        env.pop("NUMBA_HOPPER_PREBUILT", None)
        if no_prebuilt:
            env["NUMBA_HOPPER_PREBUILT"] = "0"
        for process in ("cold", "warm"):
            before = _entries(cache)
            proc = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{name} ({process}) failed:\n{proc.stderr}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            records.append({"name": name, "process": process, **r, "wrote_cache_entries": _entries(cache) != before})
    return records


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--child", metavar="NAME", choices=CASES)
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/first-call[-compile]-<gpu>.json)")
    p.add_argument("--no-prebuilt", action="store_true", help="compile instead of loading the prebuilt kernels")
    args = p.parse_args()
    if args.child:
        return child(args.child)
    records = []
    for name in args.cases:
        for r in run_case(name, args.no_prebuilt):
            records.append(r)
            sources = ", ".join(f"{n} {where}" for where, n in sorted(r["kernel_sources"].items())) or "none"
            print(f"{name:22s} {r['process']}: first call {r['first_call_s'] * 1e3:8.1f} ms, second "
                  f"{r['second_call_s'] * 1e3:6.2f} ms, kernels: {sources}, wrote cache entries: "
                  f"{r['wrote_cache_entries']}, rel error {r['rel_error']:.1e}", flush=True)
    unused = {r["prebuilt_unused_because"] for r in records} - {None}
    if unused and not args.no_prebuilt:
        print(f"prebuilt kernels not used: {'; '.join(sorted(unused))}")
    gpu = records[0]["gpu"]  # "NVIDIA H100 80GB HBM3": "h100", as bench_gemm.save_results names it
    name = f"first-call{'-compile' if args.no_prebuilt else ''}-{(gpu.split()[1:2] or [gpu])[0].lower()}.json"
    out = pathlib.Path(args.out or ROOT / "benchmarks" / "results" / name)
    out.write_text(json.dumps({"gpu": gpu, "prebuilt": not args.no_prebuilt, "records": records}, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
