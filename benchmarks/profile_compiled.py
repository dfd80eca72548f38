"""Where the compiled prefill's time goes: host or GPU (``bench_torch.py``'s first case).

    python benchmarks/profile_compiled.py [--rounds 15]

For ``torch.compile`` of the stock model and of ours (``replace_linear``), prefill 4x1024
under ``torch.no_grad()``, alternating, medians:

- graph breaks (``torch._dynamo.explain``);
- ``host``: the forward's host time, issued behind a ~15 ms GPU sleep (nothing waits);
- ``device``: the forward's GPU time, timed by CUDA events behind that sleep (the kernels run
  back to back, with no gap where the GPU waits for the host);
- ``sync``: one synchronized forward, as ``bench_torch.py`` times it;
- the kernel time per forward by kernel, GEMMs together (``torch.profiler``).
"""

import argparse
import collections
import copy
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_model import _time_ms, build_model  # noqa: E402
from bench_torch import compiled_forward  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import numba_hopper.torch as nht  # noqa: E402

SLEEP_CYCLES = 30_000_000  # ~15 ms at the H100's clock


def host_ms(run, cycles=SLEEP_CYCLES):
    torch.cuda.synchronize()
    torch.cuda._sleep(cycles)
    t = time.perf_counter()
    run()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt * 1e3


def device_ms(run, cycles=SLEEP_CYCLES):
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def is_gemm(kernel):
    """Whether a kernel's name is a GEMM's: ours, or cuBLAS's."""
    return any(s in kernel.lower() for s in ("gemm", "nvjet", "xmma", "cutlass"))


def kernel_times(run, forwards=3, cycles=SLEEP_CYCLES):
    """Microseconds of GPU time per call of ``run`` by kernel name (GEMMs as one entry)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            torch.cuda._sleep(cycles)
            run()
            torch.cuda.synchronize()
    sums = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "spin_kernel" not in e.name:
            sums["GEMMs" if is_gemm(e.name) else e.name[:70]] += e.device_time_total / forwards
    return sums


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    models = {"stock": build_model()}
    models["ours"] = copy.deepcopy(models["stock"])
    nht.replace_linear(models["ours"])
    runs = {}
    for name, model in models.items():
        torch.manual_seed(1)  # the same input ids
        runs[name] = compiled_forward(model, 4, 1024)
        for _ in range(4):
            runs[name]()
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")
    for name, model in models.items():
        with torch.no_grad():
            ex = torch._dynamo.explain(model)(input_ids=ids, use_cache=False)
        print(f"{name}: {ex.graph_count} graphs, {ex.graph_break_count} breaks")

    times = collections.defaultdict(list)
    for r in range(args.rounds):
        for name in ("ours", "stock") if r % 2 == 0 else ("stock", "ours"):
            for kind, timer in (("host", host_ms), ("device", device_ms), ("sync", _time_ms)):
                times[kind, name].append(timer(runs[name]))
    for kind in ("host", "device", "sync"):
        ours, stock = (statistics.median(times[kind, n]) for n in ("ours", "stock"))
        print(f"{kind:7s} ours {ours:7.3f} ms  stock {stock:7.3f} ms  stock/ours {stock / ours:.3f}")
    for name, run in runs.items():
        sums = kernel_times(run)
        print(f"== {name}: kernel time per forward {sum(sums.values()):.1f} us")
        for kernel, us in sorted(sums.items(), key=lambda kv: -kv[1])[:8]:
            print(f"   {us:8.1f} us  {kernel}")


if __name__ == "__main__":
    main()
