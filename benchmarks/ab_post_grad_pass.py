"""Ours' compiled training step with one of the post-grad pass's rewrites, against the same step
without it, in one process.

    python benchmarks/ab_post_grad_pass.py sum_products llama-2048 qwen3-4b
    python benchmarks/ab_post_grad_pass.py glu_backwards llama-2048 llama-3-8b
    python benchmarks/ab_post_grad_pass.py fuse_gated_mlps llama-2048

The rewrite is a function of ``numba_hopper.torch._post_grad``: ``sum_products`` (a sum of two or
three products becomes one ``numba_hopper.gemm_sum``), ``glu_backwards`` (a gated MLP's
SiLU-and-multiply derivative goes into the epilogue of ``dy @ W_down``,
``numba_hopper.gemm_glu_backward``), ``fuse_gated_mlps`` (the gate and up products and the
SiLU-and-multiply become one gated GEMM that keeps both products), or another. For each model
(``bench_train.py``'s, at 4 x 2048 tokens): two copies of ours (``bench_train.make_ours``), each
compiled with its own Inductor backend (Dynamo would otherwise give the second copy the first
one's graphs) and caches off, one with the rewrite and one with it left out. Then 8 rounds, the
order reversed every other round, each timing a long run of steps back to back at the power limit
(``bench_sustained.sustained_run``: the time per step, the board's watts and SM clock). Printed: the rewrites made per compiled graph,
each copy's medians, and ``without / with``, the median of the rounds' ratios.
"""

import collections
import statistics
import sys

import torch
from torch._inductor.compile_fx import compile_fx

from bench_sustained import sustained_run
from bench_train import TOKENS, build_model, make_ours, optimizer, train_step
from numba_hopper.torch import _post_grad

torch._inductor.config.force_disable_caches = True  # (a cached graph runs no pass)
torch._functorch.config.enable_autograd_cache = False
ROUNDS = 8


def main(rewrite, models):
    real, counts = getattr(_post_grad, rewrite), []
    for model_name in models:
        stock = build_model(model_name)
        batch, seq = TOKENS["4x2048"]
        ids = torch.randint(0, stock.config.vocab_size, (batch, seq), device="cuda")
        steps = {}
        for name, fn in (("without", lambda g: 0), ("with", lambda g: counts.append(real(g)) or counts[-1])):
            setattr(_post_grad, rewrite, fn)  # (read when the graphs compile: the warm-up's first step)
            model = make_ours(stock)[0]
            opt = optimizer(model, "numba_hopper")
            run = torch.compile(model, dynamic=False, backend=lambda gm, ex: compile_fx(gm, ex))
            steps[name] = lambda run=run, opt=opt: train_step(run, opt, ids)
            for _ in range(5):
                steps[name]()
        setattr(_post_grad, rewrite, real)
        print(model_name, f"{rewrite} per graph:", counts, flush=True)
        counts.clear()
        torch.cuda.synchronize()
        del stock
        reps = 80 if model_name == "llama-2048" else 20
        sustained_run(steps["without"], reps)  # (the power ramp)
        runs = collections.defaultdict(list)
        for r in range(ROUNDS):
            for name in (("without", "with") if r % 2 == 0 else ("with", "without")):
                runs[name].append(sustained_run(steps[name], reps))
        for name, rows in runs.items():
            ms, watts, mhz = (statistics.median(x[i] for x in rows) for i in range(3))
            print(f"{model_name} {name}: {ms:8.2f} ms a step  {watts:6.1f} W  {mhz:5.0f} MHz", flush=True)
        ratios = [a[0] / b[0] for a, b in zip(runs["without"], runs["with"])]
        print(f"{model_name} without / with: median {statistics.median(ratios):.4f}  "
              f"{['%.3f' % r for r in ratios]}", flush=True)
        del steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sum_products", sys.argv[2:] or ["llama-2048"])
