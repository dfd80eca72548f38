"""numba_hopper.attention against every SDPA backend of this PyTorch, and a transformers prefill.

    python benchmarks/bench_attention.py            # benchmarks/results/attention-<gpu>.json
    python benchmarks/bench_attention.py --quick    # seqlens 2k and 16k only
    python benchmarks/bench_attention.py --prefill-only
    python benchmarks/bench_attention.py --head-dims 64 --causal yes --seqlens 1024 2048 \
        --configs block_n=160,stages=3,early_q_release=false consumers=3,block_n=96,stages=3

Attention points: bf16, 16k tokens per batch (batch = 16384 / seqlen), seqlen 1k to 16k, head
dims 64, 128 and 256 with 32, 16 and 8 heads (hidden 2048), causal and not, and GQA 8:1 and 4:1
at head dim 128: q and the output are 64 MiB each, beyond the 50-60 MB L2. At each point the
kernels run in the same process on the same inputs: ours and SDPA forced to each backend
(``torch.nn.attention.sdpa_kernel``: flash, cuDNN, memory-efficient; a backend that refuses a
point is left out there), in interleaved rounds. A round times every implementation once, the
order reversed every other round, each over as many calls between CUDA events as take the
fastest about ``--window-ms`` (a short window reads the clock that the previous kernel's power
draw left: 5 calls, 2 ms at 2k tokens, moved ratios by up to 6%). Each figure is the median
over ``--rounds`` rounds; the fastest backend has the highest median. ``ratio``: ours over the
fastest backend, the median over rounds of the two timings' ratio in one round
(``paired_ratio``: the timings of a round share the clock, which moves under the power limit);
``ratio_of_medians`` is there beside it. Causal work counts the visible (query, key) pairs only.

Prefill: a ``LlamaForCausalLM`` (random init, nothing downloaded; 4 layers, hidden 2048, 16
heads of 128, 4 K/V heads, MLP 5632, vocabulary 32000, bf16) on 4 x 2048 tokens under
``torch.inference_mode()``: stock (transformers' SDPA attention), its attention routed to
numba_hopper (``register_transformers_attention``), and that plus every linear on
numba_hopper (``numba_hopper.torch.replace_linear``), eager and under ``torch.compile(dynamic=False)``;
``ratio``: stock's time over ours, paired the same way, over ``--prefill-rounds`` rounds
(attention is about a twentieth of the eager model's time, so its gain there is a percent or
less: ten rounds leave the ratio +-1%). Compiled on PyTorch before 2.14, stock's attention runs
with the causal mask that transformers' SDPA mask builder makes in a trace (every key of every
query, the masked ones included), where the backend's builder leaves it out.

``--configs``: kernel configurations (``AttentionConfig`` fields as ``name=value``, comma-separated;
the head dim is each point's) timed beside the tuned one at each point where they fit, through
``numba_hopper.attention(..., config=)``; each record's ``configs`` gives their TFLOP/s and
``vs_tuned``, the tuned kernel's time over theirs (paired). Such runs go to
``attention-configs-<gpu>.json``, runs of a subset of the points (``--seqlens``, ``--head-dims``,
``--causal``) to ``attention-subset-<gpu>.json``, ``--prefill-only`` to ``attention-prefill-<gpu>.json``.

The table printed last has FlashAttention-3's published H100 figures (bf16, non-causal, 16k
tokens: about 497, 648 and 756 TFLOP/s at head dims 64, 128, 256) beside ours: the H200 has the
H100's compute.
"""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from bench_gemm import paired_ratio, results_name, save_results  # noqa: E402

import numba_hopper  # noqa: E402

TOKENS = 16384
SEQLENS = (1024, 2048, 4096, 8192, 16384)
HEADS = {64: 32, 128: 16, 256: 8}
FA3_H100 = {64: 497, 128: 648, 256: 756}  # TFLOP/s, bf16, non-causal, 16k tokens (FlashAttention-3 paper)


def backends():
    """``{name: SDPBackend}`` of the SDPA backends this PyTorch has."""
    from torch.nn.attention import SDPBackend

    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
    return {n: getattr(SDPBackend, b) for n, b in names.items() if hasattr(SDPBackend, b)}


def flops(batch, heads, seqlen, head_dim, causal):
    pairs = seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen
    return 4.0 * batch * heads * pairs * head_dim


def _sdpa(backend, q, k, v, causal, gqa):
    from torch.nn.attention import sdpa_kernel

    def run():
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return run


def _time(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def interleaved(fns, rounds, window_ms):
    """``{name: [ms per call, per round]}``: each round times every function once, in the reverse
    order every other round (a function timed right after another one meets the clock and L2 it
    left), each over the calls that take the fastest ``window_ms``."""
    for fn in fns.values():  # warm-up: compile, plan, autotune
        fn()
    torch.cuda.synchronize()
    iters = max(1, round(window_ms / min(_time(fn, 1) for fn in fns.values())))
    times = {name: [] for name in fns}
    order = list(fns)
    gc.disable()
    try:
        for i in range(rounds):
            for name in (order if i % 2 == 0 else order[::-1]):
                times[name].append(_time(fns[name], iters))
    finally:
        gc.enable()
    return times


def parse_config(spec, head_dim):
    """The ``AttentionConfig`` of ``head_dim`` that ``spec`` (``"block_n=160,early_q_release=false"``)
    describes; ValueError where it does not fit."""
    from numba_hopper.attention import AttentionConfig

    def value(text):
        flag = text.strip().lower()
        return flag == "true" if flag in ("true", "false") else int(text)

    return AttentionConfig(head_dim, **{name.strip(): value(v) for name, _, v in
                                        (part.partition("=") for part in spec.split(","))})


@functools.lru_cache(maxsize=None)  # (each head dim's are asked for at precompile and at every point)
def point_configs(specs: tuple, head_dim):
    """``{spec: AttentionConfig}`` of the ``specs`` that fit at ``head_dim`` (the others said once)."""
    configs = {}
    for spec in specs:
        try:
            configs[spec] = parse_config(spec, head_dim)
        except ValueError as e:
            print(f"config {spec}: not at head dim {head_dim} ({e})".splitlines()[0][:160], flush=True)
    return configs


def bench_point(head_dim, heads, kv_heads, seqlen, causal, rounds, window_ms, specs=()):
    batch = TOKENS // seqlen
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, seqlen, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    gqa = kv_heads != heads
    fns = {"ours": lambda: numba_hopper.attention(q, k, v, causal=causal, causal_align="top_left")}
    configs = point_configs(tuple(specs), head_dim)
    for spec, cfg in configs.items():
        fns[spec] = lambda cfg=cfg: numba_hopper.attention(q, k, v, causal=causal, causal_align="top_left", config=cfg)
    for name, backend in backends().items():
        fn = _sdpa(backend, q, k, v, causal, gqa)
        try:
            fn()
        except RuntimeError:  # no kernel of this backend for this point
            continue
        fns[name] = fn
    times = interleaved(fns, rounds, window_ms)
    work = flops(batch, heads, seqlen, head_dim, causal)
    tflops = {name: work / statistics.median(t) / 1e9 for name, t in times.items()}
    refs = {n: f for n, f in tflops.items() if n != "ours" and n not in configs}
    best = max(refs, key=refs.get) if refs else None
    name = f"d{head_dim} h{heads}/{kv_heads} s{seqlen} {'causal' if causal else 'full'}"
    return {"name": name, "batch": batch, "heads": heads, "kv_heads": kv_heads, "seqlen_q": seqlen,
            "seqlen_k": seqlen, "head_dim": head_dim, "causal": causal, "dtype": "bf16",
            "ours_tflops": round(tflops["ours"], 1), "ref_tflops": round(refs[best], 1) if best else None,
            "ref_backend": best, "ratio": round(paired_ratio(times, best, "ours"), 3) if best else None,
            "ratio_of_medians": round(tflops["ours"] / refs[best], 3) if best else None,
            "backends_tflops": {n: round(f, 1) for n, f in refs.items()},
            **({"configs": {spec: {"tflops": round(tflops[spec], 1), "vs_tuned": round(paired_ratio(times, "ours", spec), 3)}
                            for spec in configs}} if configs else {})}


def points(seqlens=SEQLENS, head_dims=tuple(HEADS), causals=(False, True)):
    for head_dim in head_dims:
        for causal in causals:
            for seqlen in seqlens:
                yield head_dim, HEADS[head_dim], HEADS[head_dim], seqlen, causal
    if 128 in head_dims:
        for ratio in (8, 4):
            for causal in causals:
                for seqlen in seqlens:
                    yield 128, 16, 16 // ratio, seqlen, causal


def build_llama(attn_implementation):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
                         attn_implementation=attn_implementation)
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def bench_prefill(rounds, window_ms):
    """Stock vs attention on numba_hopper vs attention and linears on numba_hopper, eager and
    compiled."""
    import copy

    import numba_hopper.torch as nht

    name = nht.register_transformers_attention()
    stock = build_llama("sdpa")
    routed = copy.deepcopy(stock)
    routed.set_attn_implementation(name)
    both = copy.deepcopy(routed)
    nht.replace_linear(both)
    ids = torch.randint(0, 32000, (4, 2048), device="cuda")
    records = []
    for mode in ("eager", "compiled"):
        models = {"stock": stock, "attention": routed, "attention+linears": both}
        if mode == "compiled":
            models = {n: torch.compile(m, dynamic=False) for n, m in models.items()}
        with torch.inference_mode():
            logits = {n: m(input_ids=ids).logits.float() for n, m in models.items()}
            times = interleaved({n: (lambda m=m: m(input_ids=ids)) for n, m in models.items()}, rounds, window_ms)
        ref = logits["stock"]
        ms = {n: statistics.median(t) for n, t in times.items()}
        records += [{"name": f"llama prefill 4x2048 {mode}, {n}", "mode": mode, "ours_ms": round(ms[n], 3),
                     "ref_ms": round(ms["stock"], 3), "ratio": round(paired_ratio(times, "stock", n), 3),
                     "rel_error": ((logits[n] - ref).norm() / ref.norm()).item()} for n in models if n != "stock"]
    torch._dynamo.reset()
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--prefill-rounds", type=int, default=30,
                   help="the prefill's rounds (attention is a twentieth of its time: ten rounds leave +-1%%)")
    p.add_argument("--window-ms", type=float, default=20.0, help="a timing's length (the fastest function's)")
    p.add_argument("--quick", action="store_true", help="seqlens 2k and 16k only")
    p.add_argument("--seqlens", nargs="+", type=int, choices=SEQLENS, help="default: all (--quick: 2k and 16k)")
    p.add_argument("--head-dims", nargs="+", type=int, choices=tuple(HEADS), default=tuple(HEADS))
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    p.add_argument("--configs", nargs="+", default=(), metavar="FIELD=VALUE,...",
                   help="kernel configurations timed beside the tuned one (module docstring)")
    p.add_argument("--prefill-only", action="store_true")
    p.add_argument("--no-prefill", action="store_true")
    p.add_argument("--out", help="results file (default: benchmarks/results/attention-<gpu>.json)")
    args = p.parse_args(argv)
    from numba_hopper.attention import precompile, tuned_configs

    seqlens = args.seqlens or ((2048, 16384) if args.quick else SEQLENS)
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    # the bf16 kernels, compiled side by side in worker processes into the kernel cache
    variants = [cfg for d in args.head_dims for cfg in point_configs(tuple(args.configs), d).values()]
    precompile(list(dict.fromkeys(tuned_configs(("bf16",), tuple(args.head_dims)) + variants)))
    records, prefill = [], []
    if not args.prefill_only:
        for point in points(seqlens, args.head_dims, causals):
            r = bench_point(*point, args.rounds, args.window_ms, args.configs)
            records.append(r)
            print(f"{r['name']:32} ours {r['ours_tflops']:7.1f}  best {r['ref_backend']} {r['ref_tflops']}  "
                  f"ratio {r['ratio']}  {r['backends_tflops']}", flush=True)
    if not (args.no_prefill or args.configs):
        prefill = bench_prefill(args.prefill_rounds, args.window_ms)
    subset = args.seqlens or tuple(args.head_dims) != tuple(HEADS) or args.causal != "both"
    variant = "configs" if args.configs else "prefill" if args.prefill_only else "subset" if subset else None
    out = save_results(results_name("attention", variant), {"tokens_per_batch": TOKENS, "rounds": args.rounds,
                                     "prefill_rounds": args.prefill_rounds, "window_ms": args.window_ms,
                                     "fa3_h100_tflops": FA3_H100, "results": records, "prefill": prefill},
                       args.out)
    print("\n| point | ours TFLOP/s | best SDPA | TFLOP/s | ratio | FA3 H100 |\n|---|---|---|---|---|---|")
    for r in records:
        fa3 = FA3_H100[r["head_dim"]] if not r["causal"] and r["seqlen_q"] == TOKENS and r["kv_heads"] == r["heads"] \
            else ""
        print(f"| {r['name']} | {r['ours_tflops']} | {r['ref_backend']} | {r['ref_tflops']} | {r['ratio']} | {fa3} |")
    for r in records:
        for spec, c in r.get("configs", {}).items():
            print(f"{r['name']:28} {spec:48} {c['tflops']:7.1f} TFLOP/s, {c['vs_tuned']:.3f}x the tuned kernel")
    for r in prefill:
        print(f"| {r['name']} | {r['ours_ms']} ms | stock | {r['ref_ms']} ms | {r['ratio']} | err {r['rel_error']:.1e} |")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
