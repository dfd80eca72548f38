"""Expert parallelism: a mixture-of-experts layer whose experts are spread over the ranks, the
tokens sent to them with PyTorch's all-to-all, each rank's experts run by
``numba_hopper.grouped_gemm``.

The layer: a replicated router picks ``TOP_K`` of ``EXPERTS`` SwiGLU experts per token
(``down(silu(gate(x)) * up(x))``) and weights them (softmax over the chosen logits). Rank r
owns experts ``r * E/W`` to ``(r + 1) * E/W - 1`` of the W ranks. Each rank, for its own tokens:

1. dispatch: sort the (token, expert) pairs by expert, hence by the rank that owns it; swap the
   per-expert counts with ``all_to_all_single`` (the sizes of the next exchange), then send each
   pair's token row and router weight to its expert's rank (``all_to_all_single`` again);
2. experts: order the rows received by local expert (they arrive by source rank), then two
   grouped GEMMs over the local experts, whose group sizes (``offsets``) stay on the GPU: the
   gate and up products as one (a [gate | up] weight per expert), then, after SiLU-and-multiply,
   the down product with the router weight as its fused ``row_scale``;
3. combine: send each result row back to its token's rank (the reverse ``all_to_all_single``)
   and add the TOP_K weighted rows of each token.

Only the all-to-all sizes reach the host (``all_to_all_single`` takes its split sizes as Python
integers). Every rank builds every expert's weights from one seed, keeps its own experts, and
checks its tokens' output against a float64 evaluation of the whole layer on one device.

    torchrun --nproc-per-node=2 examples/distributed/expert_parallel.py   # 2 GPUs, 4 experts each
    python examples/distributed/expert_parallel.py                        # one GPU: a world of one

NCCL's NVLink multicast (NVLS) is left off unless the environment sets it
(``NCCL_NVLS_ENABLE``): the exchange is a plain all-to-all, which does not use it.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import numba_hopper  # noqa: E402

HIDDEN, FFN, EXPERTS, TOP_K, TOKENS = 1024, 512, 8, 2, 2048


def expert_weights(experts, hidden, ffn, device, dtype=torch.bfloat16, seed=0):
    """Every expert's ``(gate_up, down)``, the same on every rank: (E, 2F, H) and (E, H, F), the
    (out, in) layout of ``nn.Linear`` weights, and the router (H, E), float32."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(experts, 2 * ffn, hidden, generator=g) / hidden ** 0.5
    down = torch.randn(experts, hidden, ffn, generator=g) / ffn ** 0.5
    router = torch.randn(hidden, experts, generator=g)
    return gate_up.to(device, dtype), down.to(device, dtype), router.to(device)


def route(x, router, top_k):
    """``(experts, weights)``, each (T, top_k): the chosen experts and their float32 weights."""
    logits, experts = torch.topk(x.float() @ router, top_k, dim=-1)
    return experts, torch.softmax(logits, dim=-1)


def dispatch(x, experts, weights, num_experts, group=None):
    """Send each (token, expert) pair to the expert's rank. Returns the rows received, ordered
    by local expert, their router weights, the local experts' cumulative row counts (int32, on
    the device) and what :func:`combine` needs to send the results back."""
    world = dist.get_world_size(group)
    local = num_experts // world
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)  # pairs by expert, so by destination rank
    counts = torch.bincount(flat, minlength=num_experts)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=group)  # received[s * local + e]: from rank s, for expert e
    send_sizes = counts.view(world, local).sum(1).tolist()
    recv_sizes = received.view(world, local).sum(1).tolist()
    token = order // experts.shape[1]
    rows = x.new_empty((sum(recv_sizes), x.shape[1]))
    dist.all_to_all_single(rows, x[token], recv_sizes, send_sizes, group=group)
    scale = weights.new_empty(rows.shape[0])
    dist.all_to_all_single(scale, weights.flatten()[order], recv_sizes, send_sizes, group=group)
    # rows arrive by source rank, then expert: order them by expert for the grouped GEMMs
    local_expert = torch.arange(local, device=x.device).repeat(world).repeat_interleave(received,
                                                                                      output_size=rows.shape[0])
    by_expert = torch.argsort(local_expert, stable=True)
    offsets = torch.cumsum(received.view(world, local).sum(0), 0, dtype=torch.int32)
    return rows[by_expert], scale[by_expert], offsets, (token, by_expert, send_sizes, recv_sizes)


def run_experts(rows, scale, offsets, gate_up, down):
    """The local experts on their rows: ``scale * down(silu(gate) * up)``, two grouped GEMMs.
    ``gate_up`` (E_local, 2F, H) and ``down`` (E_local, H, F) are read in place as the
    column-major (K, N) matrices their transposes are."""
    if rows.shape[0] == 0:  # no pair came to this rank's experts
        return rows.new_empty((0, down.shape[1]))
    h = numba_hopper.grouped_gemm(rows, gate_up.transpose(1, 2), offsets)
    ffn = down.shape[2]
    h = F.silu(h[:, :ffn]) * h[:, ffn:]
    return numba_hopper.grouped_gemm(h, down.transpose(1, 2), offsets, row_scale=scale)


def combine(y, plan, tokens, group=None):
    """Send the expert outputs back to their tokens' ranks and sum each token's rows."""
    token, by_expert, send_sizes, recv_sizes = plan
    back = torch.empty_like(y)
    back[by_expert] = y  # the order the rows arrived in
    out = y.new_empty((token.shape[0], y.shape[1]))
    dist.all_to_all_single(out, back, send_sizes, recv_sizes, group=group)
    total = torch.zeros((tokens, y.shape[1]), dtype=torch.float32, device=y.device)
    return total.index_add_(0, token, out.float()).to(y.dtype)


def moe_forward(x, router, gate_up, down, top_k, group=None):
    """The layer on this rank's tokens ``x`` (T, H); ``gate_up``, ``down``: this rank's experts."""
    num_experts = router.shape[1]
    experts, weights = route(x, router, top_k)
    rows, scale, offsets, plan = dispatch(x, experts, weights, num_experts, group)
    return combine(run_experts(rows, scale, offsets, gate_up, down), plan, x.shape[0], group)


def reference(x, router, gate_up, down, top_k):
    """The layer in float64 on one device, every expert's weights given."""
    experts, weights = route(x, router, top_k)
    xd, out = x.double(), torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(router.shape[1]):
        token, slot = torch.nonzero(experts == e, as_tuple=True)
        h = xd[token] @ gate_up[e].double().t()
        ffn = down.shape[2]
        y = (F.silu(h[:, :ffn]) * h[:, ffn:]) @ down[e].double().t()
        out.index_add_(0, token, weights[token, slot].double()[:, None] * y)
    return out


def check(tokens, device, group=None, seed=0):
    """Run the layer on this rank's ``tokens`` and return its relative error against the reference."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if EXPERTS % world:
        raise ValueError(f"{EXPERTS} experts do not split evenly over {world} ranks")
    gate_up, down, router = expert_weights(EXPERTS, HIDDEN, FFN, device, seed=seed)
    mine = slice(rank * EXPERTS // world, (rank + 1) * EXPERTS // world)
    g = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own tokens
    x = torch.randn(tokens, HIDDEN, generator=g).to(device, torch.bfloat16)
    got = moe_forward(x, router, gate_up[mine].contiguous(), down[mine].contiguous(), TOP_K, group)
    ref = reference(x, router, gate_up, down, TOP_K)
    return ((got.double() - ref).norm() / ref.norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=TOKENS, help="tokens per rank")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("expert_parallel.py needs CUDA GPUs (a Hopper GPU per rank)")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    # numba_hopper launches in the CUDA context current on the calling thread: torch's device
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=device)
    try:
        error = check(args.tokens, device)
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        if dist.get_rank() == 0:
            print(f"{dist.get_world_size()} rank(s), {EXPERTS} experts, top {TOP_K}, {args.tokens} tokens per rank: "
                  f"relative error against float64 per rank {', '.join(f'{e:.1e}' for e in errors)}")
        assert max(errors) < 1e-2, errors
        if dist.get_rank() == 0:
            print("OK")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
