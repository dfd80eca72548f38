"""Where a training step's time goes, ours against stock (a ``bench_train.py`` case).

    python benchmarks/profile_train.py [--model qwen3-4b] [--tokens 2x1024] [--rounds 5] [--loss fused|model]
    python benchmarks/profile_train.py --model llama-2048 --cprofile 30
    python benchmarks/profile_train.py --model llama-3-8b --tokens 4x2048 --mode compiled
    python benchmarks/profile_train.py --model qwen3-4b --tokens 4x2048 --mode compiled --sustained 3
    python benchmarks/profile_train.py --model qwen3-4b --tokens 4x2048 --mode compiled --gaps 4
    python benchmarks/profile_train.py --model llama-2048 --tokens 4x2048 --mode compiled --gemms 4

For the stock model and ours (``bench_train.py``'s, with its ``--loss``, ``--mlp``, ``--norm`` and
``--optimizer``), eager or (``--mode compiled``) each under ``torch.compile(dynamic=False)``,
alternating, medians:

- ``host``: the step's host time, issued behind a GPU sleep (nothing waits on the GPU);
- ``device``: the step's GPU time behind that sleep (kernels back to back, no gap where the GPU
  waits for the host);
- ``sync``: one synchronized step, as ``bench_train.py`` times it;
- the kernel time per step (``torch.profiler``): GEMMs together, then the ``--kernels`` largest others.

If ``device`` is the gap, the kernels are slower; if ``sync`` exceeds ``device``, the GPU waited
for the host. (An eager transformers forward without an attention mask reads a device value
once, ``find_packed_sequence_indices``: there ``host`` includes the sleep.) ``--cprofile N``
then prints the N functions of most own host time a step of each side, in microseconds, with
their cumulative time and calls a step (``cProfile`` over ``PROFILED_STEPS`` steps, each behind a
GPU sleep; a wait for the GPU shows as the synchronizing call; Python functions read high, by
the profiler's own cost a call), for where ours spends the host's time. ``--sustained S`` runs each side's steps back to back for S seconds
(after one unmeasured run that warms the card up; ``SUSTAINED_ROUNDS`` alternating rounds,
medians) with ``nvidia-smi`` sampling board power and SM clock (``bench_sustained.py``'s
sampler): at the power limit a step's time is its energy over the limit, and a step that spends
more energy per cycle gets a lower clock, which slows every kernel in it, the ones both sides
share included. ``--gaps N`` profiles N steps of each side issued back to back and prints the
GPU's idle time between their kernels, and the longest gaps with the kernels on either side:
where the GPU waits for the host inside a training loop. ``--gemms N`` profiles N steps of each side
issued back to back and prints their GEMMs one by one, in the order the step issues them: each
position's median time on either side (from its start, or the previous kernel's end if it started
under that kernel's tail, as a programmatic dependent launch may), their ratio, and each kernel's
name and grid. Both sides' graphs issue the same products in the same order, so a row is one
product at the power limit, inside the step: which products cost ours its GEMM time there.
"""

import argparse
import collections
import cProfile
import json
import pathlib
import pstats
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_sustained import sustained_run  # noqa: E402
from bench_train import OPTIMIZERS, TOKENS, _time_ms, build_model, make_ours, optimizer, train_step  # noqa: E402
from profile_compiled import device_ms, host_ms, is_gemm, kernel_times  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402


SUSTAINED_ROUNDS = 4
PROFILED_STEPS = 10  # --cprofile: steps profiled a side
SLEEP_CYCLES = 200_000_000  # ~100 ms at the H200's clock: longer than a step's host time
GAP_US = 5  # idle intervals shorter than this are launch spacing, not waits


def profile_steps(step, steps):
    """``torch.profiler``'s record of ``steps`` steps issued back to back, behind one more step,
    so that the first ones do not start on an idle GPU."""
    step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof


def idle_gaps(step, steps):
    """``(idle us per step, [(gap us, kernel before, kernel after)] longest first)`` over
    :func:`profile_steps` (its GPU timestamps)."""
    prof = profile_steps(step, steps)
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps, end, last = [], spans[0][1], spans[0][2]
    for start, stop, name in spans[1:]:
        if start - end > GAP_US:
            gaps.append((start - end, last[:60], name[:60]))
        if stop > end:
            end, last = stop, name
    return sum(g[0] for g in gaps) / steps, sorted(gaps, reverse=True)


def step_gemms(step, steps):
    """:func:`gemm_times` of :func:`profile_steps` (its trace)."""
    prof = profile_steps(step, steps)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(pathlib.Path(f.name).read_text())["traceEvents"]
    return gemm_times([e for e in events if e.get("cat") == "kernel"], steps)


def gemm_times(kernels, steps):
    """Per GEMM of a step, in issue order: ``(median us over the steps, kernel name, grid)``, from
    the trace's kernel events of ``steps`` identical steps. A kernel's time runs from its start, or
    from the previous kernel's end where it started before that."""
    gemms, end = [], 0.0
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if is_gemm(e["name"]):
            gemms.append((e["ts"] + e["dur"] - max(e["ts"], end), e["name"], tuple(e["args"].get("grid", ()))))
        end = max(end, e["ts"] + e["dur"])
    per_step = len(gemms) // steps
    return [(statistics.median(gemms[s * per_step + i][0] for s in range(steps)), *gemms[i][1:])
            for i in range(per_step)]


def print_gemms(ours, stock):
    """The two sides' :func:`step_gemms` side by side, position by position."""
    if len(ours) != len(stock):
        print(f"(ours issues {len(ours)} GEMMs a step, stock {len(stock)}: positions may not match)")
    print("   #  ours us  stock us  stock/ours  ours' kernel (grid) | stock's kernel (grid)")
    for i, (o, s) in enumerate(zip(ours, stock)):
        print(f"{i:4d} {o[0]:8.1f} {s[0]:9.1f} {s[0] / o[0]:10.3f}  {o[1][:40]} {o[2]} | {s[1][:50]} {s[2]}")
    total_ours, total_stock = sum(o[0] for o in ours), sum(s[0] for s in stock)
    print(f"GEMMs a step: ours {total_ours / 1e3:.2f} ms, stock {total_stock / 1e3:.2f} ms, "
          f"stock/ours {total_stock / total_ours:.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--tokens", default="2x1024", choices=sorted(TOKENS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--loss", choices=("fused", "model"), default="fused")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    p.add_argument("--mlp", choices=("linears", "gated"), default="linears")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="numba_hopper", help="ours' AdamW")
    p.add_argument("--norm", choices=("fused", "model"), default="fused", help="ours' RMSNorms")
    p.add_argument("--sustained", type=float, default=0, metavar="S", help="S seconds of steps: power and clock")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print a step's N costliest functions")
    p.add_argument("--kernels", type=int, default=10, metavar="N", help="print the N costliest kernels beside the GEMMs")
    p.add_argument("--gaps", type=int, default=0, metavar="N", help="the GPU's idle time over N back-to-back steps")
    p.add_argument("--gemms", type=int, default=0, metavar="N", help="each GEMM's time over N back-to-back steps")
    args = p.parse_args()
    models = {"stock": build_model(args.model)}
    models["ours"] = make_ours(models["stock"], args.loss, args.mlp, args.norm)[0]
    batch, seq = TOKENS[args.tokens]
    ids = torch.randint(0, models["stock"].config.vocab_size, (batch, seq), device="cuda")
    steps = {}
    for name, model in models.items():
        opt = optimizer(model, args.optimizer if name == "ours" else "torch")
        run = torch.compile(model, dynamic=False) if args.mode == "compiled" else model
        steps[name] = lambda run=run, opt=opt: train_step(run, opt, ids)
        for _ in range(3 if args.mode == "eager" else 5):
            steps[name]()
    times = collections.defaultdict(list)
    for r in range(args.rounds):
        for name in ("ours", "stock") if r % 2 == 0 else ("stock", "ours"):
            times["host", name].append(host_ms(steps[name], SLEEP_CYCLES))
            times["device", name].append(device_ms(steps[name], SLEEP_CYCLES))
            times["sync", name].append(_time_ms(steps[name]))
    for kind in ("host", "device", "sync"):
        ours, stock = (statistics.median(times[kind, n]) for n in ("ours", "stock"))
        print(f"{kind:7s} ours {ours:8.3f} ms  stock {stock:8.3f} ms  stock/ours {stock / ours:.3f}")
    for name, step in steps.items():
        sums = kernel_times(step, 2, SLEEP_CYCLES)
        print(f"== {name}: kernel time per step {sum(sums.values()) / 1e3:.2f} ms")
        for kernel, us in sorted(sums.items(), key=lambda kv: -kv[1])[:args.kernels + 1]:
            print(f"   {us:9.1f} us  {kernel}")
    for name, step in steps.items() if args.gaps else ():
        idle, gaps = idle_gaps(step, args.gaps)
        print(f"== {name}: GPU idle {idle / 1e3:.3f} ms a step between kernels ({len(gaps)} gaps over {GAP_US} us)")
        for us, before, after in gaps[:args.kernels]:
            print(f"   {us:9.1f} us  after {before}  before {after}")
    if args.gemms:
        print_gemms(*(step_gemms(steps[name], args.gemms) for name in ("ours", "stock")))
    if args.sustained:
        reps = max(5, int(args.sustained * 1e3 / statistics.median(times["sync", "ours"])))
        sustained_run(steps["stock"], reps)  # (unmeasured: the card warms up)
        runs = collections.defaultdict(list)
        for r in range(SUSTAINED_ROUNDS):
            for name in ("ours", "stock") if r % 2 == 0 else ("stock", "ours"):
                runs[name].append(sustained_run(steps[name], reps))
        for name, rows in runs.items():
            ms, watts, mhz = (statistics.median(x[i] for x in rows) for i in range(3))
            print(f"sustained {name:5s} {ms:8.2f} ms a step  {watts:6.1f} W  {mhz:5.0f} MHz  "
                  f"J a step {watts * ms / 1e3:.2f}  Mcycles a step {ms * mhz / 1e3:.1f}")
    for name, step in steps.items() if args.cprofile else ():
        print(f"== {name}: host time a step by function, over {PROFILED_STEPS} steps (us; own time first)")
        profile = cProfile.Profile()
        for _ in range(PROFILED_STEPS):
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES)  # (nothing waits for the GPU)
            profile.runcall(step)
        torch.cuda.synchronize()
        rows = sorted(((own, cumulative, calls, f"{file}:{line}({function})")
                       for (file, line, function), (_, calls, own, cumulative, _) in pstats.Stats(profile).stats.items()),
                      reverse=True)
        for own, cumulative, calls, where in rows[:args.cprofile]:
            print(f"{own / PROFILED_STEPS * 1e6:9.1f} {cumulative / PROFILED_STEPS * 1e6:9.1f} "
                  f"{calls / PROFILED_STEPS:6.1f}  {where}")


if __name__ == "__main__":
    main()
