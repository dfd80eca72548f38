"""A training step of a transformers model whose linears are numba_hopper's, against the stock model.

    python benchmarks/bench_train.py                  # every case: benchmarks/results/train-<gpu>.json
    python benchmarks/bench_train.py --quick          # qwen3-4b only (both token counts, both modes)
    python benchmarks/bench_train.py --models llama-3-8b --modes compiled --out train-8b.json

The models (random init, nothing downloaded; bf16 parameters, SDPA attention, 4 layers):
``qwen3-4b``, a ``Qwen3ForCausalLM`` at Qwen3-4B's widths (hidden 2560, MLP 9728, 32 heads of
128, 8 K/V heads, vocabulary 151936, tied embeddings); ``llama-3-8b``, a ``LlamaForCausalLM`` at
Llama-3-8B's (hidden 4096, MLP 14336, 32 heads, 8 K/V heads, vocabulary 128256); ``llama-2048``,
``benchmarks/bench_model.py``'s (hidden 2048, MLP 5632, 16 heads, vocabulary 32000). "ours" is a
copy of the stock model (the same weights) on which ``numba_hopper.torch.replace_linear`` put
every ``nn.Linear``, ``lm_head`` included, on numba_hopper's GEMMs, forward and backward (``--mlp
gated``: each SwiGLU MLP one operator instead, ``fuse_gated_mlps(fused_training=True)``), and
(``--loss fused``, the default) ``numba_hopper.torch.fuse_linear_cross_entropy`` its loss: the
head's GEMM and the cross-entropy over the vocabulary without float32 logits. ``--loss model``
leaves the model's loss as it is. ``numba_hopper.torch.fuse_rms_norms`` puts its RMSNorms on one
kernel each way in eager steps (compiled, Inductor fuses them on both sides; ``--norm model``
leaves the model's). Its optimizer is ``numba_hopper.torch.AdamW`` (``--optimizer
torch``: PyTorch's, as stock's). Its products run in the training tiles,
``gemm(config="sustained")`` (``--training-tiles default``: the burst-tuned ones).

A step: ``zero_grad(set_to_none=True)``, the forward with ``labels=input_ids`` (the model's own
loss), ``loss.backward()`` and the AdamW step (stock: ``torch.optim.AdamW(fused=True)``; both lr
1e-5), each model with its own optimizer. Cases: 2x1024 and 4x2048 tokens (sequences x length),
``eager`` and ``compiled`` (``torch.compile(model, dynamic=False)`` of both models: static
shapes, so a case never picks up another case's dynamic graphs). Each case builds its pair
afresh; the first step, from identical weights, checks ours against stock: the losses' relative
difference and layer 0's ``q_proj`` weight gradient's relative norm error (printed, not
asserted: bf16 all the way). Then warm-up steps, then ``--rounds`` rounds, each timing
``--steps`` steps of each model issued back to back between CUDA events, as a training loop
issues them (the host issues a step while the GPU finishes the one before; ``--steps 1`` times a
step alone, its last kernels' drain included), the order reversed every other round, the
garbage collector paused. ``ours_ms`` and ``ref_ms`` are medians of the time per step; ``ratio =
ref / ours`` is the median of the rounds' ratios (``paired_ratio``: the two sides of a round
share the clock, which moves under the power limit between rounds); ``ratio_of_medians`` is
there beside it, and ``rounds_ms`` has every round's two times per step (where the two ratios
disagree, the rounds are bimodal). The bar, printed: ours at 1.05x stock or better in every
case.

The results file is rewritten after each case, so a run stopped by a time limit keeps the cases
it finished. Split runs (``--models``, ``--tokens``, ``--modes``) need an ``--out`` each.
"""

from __future__ import annotations

import argparse
import copy
import gc
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_gemm import paired_ratio, print_table, save_results  # noqa: E402
from bench_model import _time_ms  # noqa: E402

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.torch import training  # noqa: E402

LAYERS = 4
# name: (transformers family, widths)
MODELS = {
    "qwen3-4b": ("Qwen3", dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "llama-3-8b": ("Llama", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                 num_key_value_heads=8, vocab_size=128256)),
    "llama-2048": ("Llama", dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16,
                                 num_key_value_heads=16, vocab_size=32000)),
}
TOKENS = {"2x1024": (2, 1024), "4x2048": (4, 2048)}  # sequences x length
MODES = ("eager", "compiled")
STEPS = 4  # steps per timed round
WARMUP = {"eager": 3, "compiled": 5}  # steps after the checked one; compiled: any recompile lands here
BAR = 1.05


def build_model(name, device="cuda"):
    """The stock model ``name`` of :data:`MODELS` in training mode: bf16, seeded random init, no KV cache."""
    import transformers

    family, widths = MODELS[name]
    config = getattr(transformers, f"{family}Config")(num_hidden_layers=LAYERS, use_cache=False,
                                                      attn_implementation="sdpa", **widths)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, f"{family}ForCausalLM")(config).to(torch.bfloat16)
    return model.train()


OPTIMIZERS = ("numba_hopper", "torch")


def optimizer(model, kind="torch"):
    """AdamW (lr 1e-5) on ``model``'s parameters: ``numba_hopper.torch.AdamW`` or PyTorch's fused one."""
    if kind == "numba_hopper":
        return nht.AdamW(model.parameters(), lr=1e-5)
    return torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)


def train_step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def _rel(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm()).item()


def check_first_step(sides, ids):
    """The first step of both sides from identical weights: the losses' relative difference and
    layer 0's ``q_proj`` weight gradient's relative norm error, taken before the optimizers step."""
    losses, grads = {}, {}
    for side, (module, run, opt) in sides.items():
        opt.zero_grad(set_to_none=True)
        loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        losses[side], grads[side] = loss.detach(), module.model.layers[0].self_attn.q_proj.weight.grad.clone()
    for _, _, opt in sides.values():
        opt.step()
    return _rel(losses["ours"], losses["ref"]), _rel(grads["ours"], grads["ref"])


def make_ours(stock, loss="fused", mlp="linears", norm="fused"):
    """Ours, a copy of ``stock`` (module doc): ``(model, MLPs fused, linears swapped, norms swapped)``."""
    ours = copy.deepcopy(stock)
    gated = nht.fuse_gated_mlps(ours, fused_training=True) if mlp == "gated" else 0
    swapped = nht.replace_linear(ours)
    if loss == "fused":
        nht.fuse_linear_cross_entropy(ours)
    norms = nht.fuse_rms_norms(ours) if norm == "fused" else 0
    return ours, gated, swapped, norms


def bench_case(model_name, tokens, mode, rounds, loss="fused", ours_optimizer="numba_hopper", mlp="linears",
               norm="fused", steps=STEPS):
    """One case's record: the pair built, checked, warmed up and timed in paired rounds."""
    stock = build_model(model_name)
    ours, gated, swapped, norms = make_ours(stock, loss, mlp, norm)
    sides = {}
    for side, module in (("ours", ours), ("ref", stock)):
        run = torch.compile(module, dynamic=False) if mode == "compiled" else module
        sides[side] = (module, run, optimizer(module, ours_optimizer if side == "ours" else "torch"))
    batch, seq = TOKENS[tokens]
    ids = torch.randint(0, stock.config.vocab_size, (batch, seq), device="cuda")
    loss_rel, grad_rel = check_first_step(sides, ids)

    def step(side):
        _, run, opt = sides[side]
        return lambda: train_step(run, opt, ids)

    def steps_back_to_back(side):
        one = step(side)
        return lambda: [one() for _ in range(steps)]

    for side in sides:
        for _ in range(WARMUP[mode]):
            step(side)()
    torch.cuda.synchronize()
    times = {"ours": [], "ref": []}
    gc.collect()
    gc.disable()  # as timeit does: a collection inside one side's step is not that side's cost
    try:
        for r in range(rounds):
            for side in (("ours", "ref") if r % 2 == 0 else ("ref", "ours")):
                times[side].append(_time_ms(steps_back_to_back(side)) / steps)
    finally:
        gc.enable()
    ours_ms, ref_ms = statistics.median(times["ours"]), statistics.median(times["ref"])
    return {"name": f"{model_name} {tokens} {mode}", "model": model_name, "tokens": tokens, "mode": mode, "loss": loss,
            "optimizer": ours_optimizer, "mlp": mlp, "gated_mlps": gated, "norm": norm, "norms": norms,
            "ours_ms": ours_ms, "ref_ms": ref_ms, "ratio": paired_ratio(times, "ref", "ours"),
            "ratio_of_medians": ref_ms / ours_ms, "loss_rel_diff": loss_rel, "grad_rel_error": grad_rel,
            "linears": swapped, "steps_per_round": steps,
            "rounds_ms": {side: [round(t, 3) for t in ts] for side, ts in times.items()}}


def _free():
    torch._dynamo.reset()  # the compiled graphs hold the models
    gc.collect()
    torch.cuda.empty_cache()


def print_bar(records):
    for mode in MODES:
        ratios = [r["ratio"] for r in records if r["mode"] == mode]
        if ratios:
            verdict = "meets" if min(ratios) >= BAR else "misses"
            print(f"bar ({mode}): training step >= {BAR}x stock in every case: {verdict} "
                  f"(lowest {min(ratios):.3f}, {len(ratios)} cases)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="qwen3-4b only (both token counts, both modes)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--tokens", nargs="+", choices=list(TOKENS), default=list(TOKENS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=STEPS, help="steps per round, issued back to back")
    p.add_argument("--loss", choices=("fused", "model"), default="fused",
                   help="ours: fuse_linear_cross_entropy (default) or the model's own loss")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="numba_hopper",
                   help="ours: numba_hopper.torch.AdamW (default) or torch's fused AdamW (stock always has torch's)")
    p.add_argument("--training-tiles", choices=("sustained", "default"), default="sustained",
                   help="ours' training products: gemm(config='sustained') (the library's choice) or the burst-tuned "
                        "default (numba_hopper.torch.training.GEMM_CONFIG = None)")
    p.add_argument("--mlp", choices=("linears", "gated"), default="linears",
                   help="ours: each MLP's three linears (default) or one operator (fuse_gated_mlps(fused_training=True))")
    p.add_argument("--norm", choices=("fused", "model"), default="fused",
                   help="ours: fuse_rms_norms (default) or the model's own RMSNorm operators")
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/train-<gpu>.json)")
    args = p.parse_args(argv)
    training.GEMM_CONFIG = "sustained" if args.training_tiles == "sustained" else None
    models = ["qwen3-4b"] if args.quick else args.models
    fields = {"models": {m: {"family": MODELS[m][0], "layers": LAYERS, **MODELS[m][1]} for m in models},
              "step": "zero_grad, forward with labels, backward, AdamW step; bf16, SDPA",
              "training_tiles": args.training_tiles,
              "rounds": args.rounds, "steps_per_round": args.steps, "records": []}
    records = fields["records"]
    for model_name in models:
        for tokens in args.tokens:
            for mode in args.modes:
                started = time.perf_counter()
                torch.cuda.reset_peak_memory_stats()
                r = bench_case(model_name, tokens, mode, args.rounds, args.loss, args.optimizer, args.mlp, args.norm,
                               args.steps)
                peak_gb = torch.cuda.max_memory_allocated() / 2**30
                _free()
                records.append(r)
                out = save_results("train", fields, args.out)
                print(f"{r['name']:28s} ours {r['ours_ms']:8.2f} ms  stock {r['ref_ms']:8.2f} ms  "
                      f"ratio {r['ratio']:.3f} (of medians {r['ratio_of_medians']:.3f})  "
                      f"loss rel. diff {r['loss_rel_diff']:.1e}  q_proj grad rel. error {r['grad_rel_error']:.1e}  "
                      f"peak {peak_gb:.1f} GiB  {time.perf_counter() - started:.0f} s", flush=True)
    print_table(records, [("name", "case", "s"), ("ours_ms", "ours ms", ".2f"), ("ref_ms", "stock ms", ".2f"),
                          ("ratio", "ratio", ".3f"), ("ratio_of_medians", "ratio of medians", ".3f"),
                          ("loss_rel_diff", "loss rel. diff", ".1e"), ("grad_rel_error", "grad rel. error", ".1e")],
                out)
    print_bar(records)


if __name__ == "__main__":
    main()
