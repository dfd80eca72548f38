"""A real model's forward with every linear layer through numba_hopper, against stock PyTorch.

    python benchmarks/bench_model.py [--rounds 20] [--out out.json]   # default: results/model-<gpu>.json

The model: a Llama-style decoder built with ``transformers`` (``LlamaForCausalLM``, random
init, nothing downloaded): 4 layers, hidden 2048, MLP 5632, 16 heads, vocabulary 32000,
bf16, SDPA attention. "ours" is a copy of that model (the same weights) with the ``forward`` of every
``nn.Linear`` (q, k, v, o, gate, up, down, lm_head: 29 per forward) replaced by
``numba_hopper.gemm(x, weight.t())`` on the (batch, tokens, in) activation: the weight is read
in place (a column-major B, no copy), the activation's leading dimensions are the rows, and each
call gets a fresh activation and allocates its output, as a model does.

Cases: prefill (4 sequences x 1024 tokens) and decode (8 sequences x 1 token, no cache).
Both forwards run under ``torch.inference_mode()``, timed with CUDA events around one forward,
warmed up, in alternating rounds, the garbage collector paused; each figure is the median.
``ratio = torch_ms / ours_ms``; ``rel_error`` compares the two models' logits (relative norm
error of the difference).
"""

from __future__ import annotations

import argparse
import copy
import gc
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_gemm import print_table, save_results  # noqa: E402

import numba_hopper  # noqa: E402

CASES = [("prefill 4x1024", 4, 1024), ("decode 8x1", 8, 1)]
MODEL = "LlamaForCausalLM, 4 layers, hidden 2048, MLP 5632, 16 heads, vocab 32000, bf16, random init"


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return model.eval()


CALLS = [0]  # numba_hopper.gemm calls made by the routed linears


def _gemm_forward(linear):
    weight_t = linear.weight.t()  # (in, out), column-major: the kernel's K-major B

    def forward(x):
        CALLS[0] += 1
        if linear.bias is None:
            return numba_hopper.gemm(x, weight_t)
        return numba_hopper.gemm(x, weight_t, bias=linear.bias, bias_dim=1)

    return forward


def route_linears(model):
    """Send every ``nn.Linear`` of ``model`` through numba_hopper; return how many there are."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for module in linears:
        module.forward = _gemm_forward(module)
    return len(linears)


def _time_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench_case(models, batch, seq, rounds):
    ids = torch.randint(0, models[False].config.vocab_size, (batch, seq), device="cuda")

    def run(ours):
        return models[ours](input_ids=ids).logits

    with torch.inference_mode():
        ref = run(False)
        calls = CALLS[0]
        got = run(True)
        calls = CALLS[0] - calls
        rel_error = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
        times = {True: [], False: []}
        for ours in (True, False):
            for _ in range(3):
                _time_ms(lambda: run(ours))
        gc.collect()
        gc.disable()  # as timeit does: a collection inside one side's forward is not that side's cost
        for r in range(rounds):
            for ours in ((True, False) if r % 2 == 0 else (False, True)):
                times[ours].append(_time_ms(lambda: run(ours)))
        gc.enable()
    return statistics.median(times[True]), statistics.median(times[False]), rel_error, calls


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/model-<gpu>.json)")
    args = p.parse_args(argv)
    stock = build_model()
    ours = copy.deepcopy(stock)
    linears = route_linears(ours)
    records = []
    for case, batch, seq in CASES:
        ours_ms, torch_ms, rel_error, calls = bench_case({True: ours, False: stock}, batch, seq, args.rounds)
        if calls != linears:
            raise AssertionError(f"{case}: {calls} numba_hopper calls in a forward, not one per linear ({linears})")
        records.append({"case": case, "ours_ms": ours_ms, "torch_ms": torch_ms, "ratio": torch_ms / ours_ms,
                        "rel_error": rel_error, "gemm_calls": calls})
        print(f"{case:16s} ours {ours_ms:8.3f} ms  torch {torch_ms:8.3f} ms  ratio {torch_ms / ours_ms:.3f}"
              f"  logits rel. error {rel_error:.2e}", flush=True)
    out = save_results("model", {"model": MODEL, "linears_per_forward": linears, "records": records}, args.out)
    print_table(records, [("case", "case", "s"), ("ours_ms", "ours ms", ".3f"), ("torch_ms", "torch ms", ".3f"),
                          ("ratio", "ratio", ".3f"), ("rel_error", "logits rel. error", ".1e")], out)


if __name__ == "__main__":
    main()
