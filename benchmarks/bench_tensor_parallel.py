"""Tensor parallelism on numba_hopper's kernels against stock PyTorch: a Llama-style model split
over the GPUs of one host, in tokens per second.

    python benchmarks/bench_tensor_parallel.py                   # every GPU of the host (2 or more)
    python benchmarks/bench_tensor_parallel.py --gpus 2 [--rounds 20] [--out out.json]
    torchrun --nproc-per-node=2 benchmarks/bench_tensor_parallel.py

The model: transformers' ``LlamaForCausalLM`` (random init, nothing downloaded) with Llama 3
8B's layer: 4 layers, hidden 4096, MLP 14336, 32 query and 8 key/value heads of 128,
vocabulary 32000, bf16, SDPA attention. Both sides get the same weights and the same plan,
``numba_hopper.torch.distributed.decoder_tp_plan()`` over all the ranks (attention and MLP
split by heads and columns, one all-reduce after each; embedding, norms and ``lm_head``
replicated). "ours" swaps every linear for ``numba_hopper.torch.Linear`` first, so each rank's
products are numba_hopper GEMMs on its shards; "stock" runs DTensor's own ``mm``/``addmm``
(cuBLAS) on the same shards. The communication is the same on both sides.

Modes: ``prefill`` (4 sequences x 2048 tokens, forward, ``torch.no_grad()``), ``decode`` (32
sequences x 1 token, forward, no cache) and ``train`` (2 x 2048 tokens, forward and backward of
the language-model loss). A step is timed with CUDA events on every rank, between barriers,
and counts as its slowest rank's time; the sides alternate in rounds, after warm-up steps, and
each figure is the median over the rounds. ``ratio = ref_ms / ours_ms`` (above 1: ours is
faster); ``*_tokens_per_s`` are the tokens of a step over its time. ``rel_error`` compares the
two sides' prefill logits (relative norm error).

Writes ``benchmarks/results/tp-<gpu>.json`` (``--out`` to write elsewhere): one record per mode,
{name, gpus, mode, ours_ms, ref_ms, ratio, tokens, ours_tokens_per_s, ref_tokens_per_s,
rel_error}. Needs 2 or more GPUs and ``transformers``.
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import statistics
import sys
import tempfile

# NCCL's NVLink SHARP (NVLS) stays off unless the environment turns it on: it reserves memory on
# every GPU, and ours and stock run the same all-reduces either way.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MODEL = ("LlamaForCausalLM, 4 layers, hidden 4096, MLP 14336, 32 heads (8 key/value) of 128, vocab 32000, bf16, "
         "random init, decoder_tp_plan")
MODES = [("prefill", 4, 2048), ("decode", 32, 1), ("train", 2, 2048)]  # (mode, sequences, tokens each)


def build_models(device):
    """``(ours, stock)``: the same random weights, each parallelized over every rank."""
    from torch.distributed.tensor import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers import LlamaConfig, LlamaForCausalLM

    import numba_hopper.torch as nht
    import numba_hopper.torch.distributed as nhd

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        stock = LlamaForCausalLM(config).to(torch.bfloat16)
    ours = copy.deepcopy(stock)
    nht.replace_linear(ours)
    mesh = DeviceMesh("cuda", list(range(dist.get_world_size())))
    for model in (ours, stock):
        parallelize_module(model, mesh, nhd.decoder_tp_plan())
    return ours, stock


def step(model, mode, ids):
    if mode == "train":
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)
        return None
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def slowest_ms(fn, device):
    """``fn()``'s time on this rank, CUDA events between barriers; the slowest rank's."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    start.record()
    fn()
    end.record()
    end.synchronize()
    ms = torch.tensor(start.elapsed_time(end), device=device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def bench_mode(models, mode, batch, seq, rounds, device):
    ids = torch.randint(0, 32000, (batch, seq), device=device, generator=torch.Generator(device).manual_seed(1))
    times = {"ours": [], "ref": []}
    for side in ("ours", "ref"):
        for _ in range(3):
            slowest_ms(lambda: step(models[side], mode, ids), device)
    for r in range(rounds):
        for side in (("ours", "ref") if r % 2 == 0 else ("ref", "ours")):
            times[side].append(slowest_ms(lambda: step(models[side], mode, ids), device))
    ours_ms, ref_ms = statistics.median(times["ours"]), statistics.median(times["ref"])
    rel_error = None
    if mode == "prefill":
        got, ref = step(models["ours"], mode, ids).double(), step(models["ref"], mode, ids).double()
        rel_error = ((got - ref).norm() / ref.norm()).item()
    tokens = batch * seq
    return {"name": f"{mode} {batch}x{seq}", "gpus": dist.get_world_size(), "mode": mode, "ours_ms": ours_ms,
            "ref_ms": ref_ms, "ratio": ref_ms / ours_ms, "tokens": tokens,
            "ours_tokens_per_s": tokens / ours_ms * 1e3, "ref_tokens_per_s": tokens / ref_ms * 1e3,
            "rel_error": rel_error}


def run(rank, world, args, init_method, gpu=None):
    """One rank, on GPU ``gpu`` (default: ``rank``)."""
    device = torch.device("cuda", rank if gpu is None else gpu)
    torch.cuda.set_device(device)  # first: numba_hopper launches in the CUDA context torch makes current
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=device)
    try:
        ours, stock = build_models(device)
        records = []
        for mode, batch, seq in MODES:
            record = bench_mode({"ours": ours, "ref": stock}, mode, batch, seq, args.rounds, device)
            if record["rel_error"] is not None and record["rel_error"] > 5e-2:
                raise AssertionError(f"{mode}: ours and stock logits differ by {record['rel_error']:.2e}")
            records.append(record)
            if rank == 0:
                print(f"{record['name']:14s} {world} GPUs  ours {record['ours_ms']:8.3f} ms  stock "
                      f"{record['ref_ms']:8.3f} ms  ratio {record['ratio']:.3f}  "
                      f"{record['ours_tokens_per_s']:,.0f} vs {record['ref_tokens_per_s']:,.0f} tokens/s", flush=True)
        if rank == 0:
            from bench_gemm import print_table, save_results

            out = save_results("tp", {"model": MODEL, "records": records}, args.out)
            print_table(records, [("name", "case", "s"), ("gpus", "GPUs", "d"), ("ours_ms", "ours ms", ".3f"),
                                  ("ref_ms", "stock ms", ".3f"), ("ratio", "ratio", ".3f"),
                                  ("ours_tokens_per_s", "ours tokens/s", ",.0f"),
                                  ("ref_tokens_per_s", "stock tokens/s", ",.0f")], out)
    finally:
        dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, help="how many GPUs (default: all); under torchrun, its world")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", "--json", dest="out", metavar="PATH",
                   help="results file (default: benchmarks/results/tp-<gpu>.json)")
    args = p.parse_args(argv)
    if "RANK" in os.environ:  # torchrun: this process is one rank
        world = int(os.environ["WORLD_SIZE"])
        if world < 2:
            sys.exit(f"bench_tensor_parallel.py needs 2 or more ranks (GPUs); torchrun started {world}")
        return run(int(os.environ["RANK"]), world, args, "env://", int(os.environ["LOCAL_RANK"]))
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = args.gpus or available
    if world < 2 or world > available:
        sys.exit(f"bench_tensor_parallel.py needs 2 or more GPUs; this host has {available}"
                 + (f", not the {world} asked for" if args.gpus else ""))
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(run, args=(world, args, f"file://{tmp}/store"), nprocs=world)


if __name__ == "__main__":
    main()
