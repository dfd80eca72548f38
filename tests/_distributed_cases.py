"""Checks shared by the distributed tests (tests/test_distributed_*.py): a small Llama-style
decoder, tensor parallelism and FSDP2 against one device, the expert-parallel example, and a
launcher of ranks in processes of their own.

Every check takes the device and a process group already made, and returns numbers (relative
errors, counts) for the test to judge, so one body serves the CPU (gloo, the float64 stand-in
GEMM of ``_torch_double``) and the GPUs (NCCL, the kernels).
"""

from __future__ import annotations

import copy
import importlib.util
import os
import pathlib
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard

R, P, S0, S1 = Replicate(), Partial(), Shard(0), Shard(1)
BF16 = torch.bfloat16

ROOT = pathlib.Path(__file__).resolve().parents[1]
# NVLink multicast stays off in every process these tests start
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def rel_error(got, ref):
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    ref = ref.full_tensor() if hasattr(ref, "full_tensor") else ref
    diff, scale = (got.double() - ref.double()).norm().item(), ref.double().norm().item()
    return diff / scale if scale else diff


# --- numba_hopper::gemm on placed operands ---------------------------------------------------

# (a, b, other tensors {name: (shape: "M", "N", "MN", "1N" or "M1", placement)}, other arguments) -> output
GEMM_CASES = [
    (R, R, {}, {}, R),
    (S0, R, {}, {}, S0),
    (R, S1, {}, {}, S1),
    (S1, S0, {}, {}, P),
    (P, R, {}, {}, P),
    (R, P, {}, {}, P),
    (R, S0, {}, {}, P),  # a replicated a is cut along K: no communication
    (R, S1, {"bias": ("N", S0)}, {}, S1),  # a bias per column, sharded with the columns
    (S0, R, {"bias": ("N", R)}, {}, S0),
    (S1, S0, {"bias": ("N", R)}, {}, P),  # the replicated bias becomes a partial value
    (S0, R, {"bias": ("M", S0)}, {"bias_dim": 0}, S0),  # a bias per row, sharded with the rows
    (R, S1, {"bias": ("M", R)}, {"bias_dim": 0}, S1),
    (R, S1, {"bias": ("1N", S1)}, {}, S1),  # 2-D biases: (1, N) per column, (M, 1) per row
    (S0, R, {"bias": ("M1", S0)}, {}, S0),
    (S1, S0, {"bias": ("M1", R)}, {}, P),
    (R, S1, {"c": ("MN", S1)}, {"beta": 0.5}, S1),
    (S1, S0, {"c": ("MN", P)}, {"beta": 0.5}, P),
    (R, S1, {}, {"activation": "silu"}, S1),
    (S0, R, {}, {"out_dtype": torch.float32}, S0),
]


def gemm_case_shapes(case, m, k, n):
    """``({name: shape}, {name: placement}, other arguments, output placement)`` of a GEMM_CASES entry."""
    pa, pb, tensors, extra, expected = GEMM_CASES[case]
    sizes = {"M": (m,), "N": (n,), "MN": (m, n), "1N": (1, n), "M1": (m, 1)}
    shapes = {"a": (m, k), "b": (k, n), **{name: sizes[s] for name, (s, _) in tensors.items()}}
    return shapes, {"a": pa, "b": pb, **{name: p for name, (_, p) in tensors.items()}}, extra, expected


def _placed(full, placement, mesh, rank):
    """``full`` placed as rank ``rank`` holds it: its chunk, or for a partial sum ``full / ranks``."""
    world = mesh.size()
    local = (full.chunk(world, placement.dim)[rank].contiguous() if placement.is_shard()
             else full / world if placement.is_partial() else full)
    return DTensor.from_local(local, mesh, [placement], run_check=False, shape=full.shape, stride=full.stride())


def _whole(locals_, placement):
    """What the ranks' local outputs make together: the shards joined, the partial sums added."""
    if placement.is_shard():
        return torch.cat(locals_, placement.dim)
    if placement.is_partial():
        return sum(t.double() for t in locals_)
    assert all(torch.equal(t, locals_[0]) for t in locals_)
    return locals_[0]


def on_fake_ranks(device, fn, world=2):
    """``[fn(mesh, rank) for each rank]``, each rank in turn on a fake process group of ``world``
    ranks (real shard shapes and layouts, collectives that move nothing)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    results = []
    for rank in range(world):
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            results.append(fn(DeviceMesh(torch.device(device).type, list(range(world))), rank))
        finally:
            dist.destroy_process_group()
    return results


def local_products_error(case, m, k, n, device):
    """Each of 2 ranks runs ``numba_hopper::gemm`` on its pieces of fresh operands placed as
    GEMM_CASES[case] says; their outputs, joined or added as the output's placement says,
    against the float64 product: the relative error. Asserts the output's placement."""
    shapes, placed, extra, expected = gemm_case_shapes(case, m, k, n)
    g = torch.Generator().manual_seed(case)
    full = {name: torch.randn(shape, generator=g).to(device, BF16) for name, shape in shapes.items()}

    def run(mesh, rank):
        out = torch.ops.numba_hopper.gemm(**{n_: _placed(t, placed[n_], mesh, rank) for n_, t in full.items()},
                                          **extra)
        assert out.placements == (expected,), (out.placements, expected)
        return out.to_local()

    locals_ = on_fake_ranks(device, run)
    acc = full["a"].double() @ full["b"].double()
    if "c" in full:
        acc = acc + extra["beta"] * full["c"].double()
    if "bias" in full:
        bias = full["bias"].double()
        acc = acc + (bias[:, None] if bias.dim() == 1 and extra.get("bias_dim") == 0 else bias)
    if extra.get("activation"):
        acc = F.silu(acc)
    return rel_error(_whole(locals_, expected), acc)


def local_bmm_error(placements, expected, device, shapes=((4, 40, 64), (4, 64, 48))):
    """As :func:`local_products_error` for ``numba_hopper::bmm`` with ``placements`` of (a, b)."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g).to(device, BF16) for s in shapes)

    def run(mesh, rank):
        out = torch.ops.numba_hopper.bmm(_placed(a, placements[0], mesh, rank), _placed(b, placements[1], mesh, rank))
        assert out.placements == (expected,), (out.placements, expected)
        return out.to_local()

    return rel_error(_whole(on_fake_ranks(device, run), expected), a.double() @ b.double())


def local_attention_error(placement, device, packed=False):
    """``numba_hopper::attention`` (causal; 8 query and 2 key/value heads of 64) on q, k, v
    sharded as ``placement`` (batch or heads), each of 2 ranks in turn: the joined outputs
    against the operator on the whole tensors (the same kernel: no rounding apart)."""
    g = torch.Generator().manual_seed(0)
    lead, seq = ((128,), ()) if packed else ((2,), (96,))  # packed: sequences of 70 and 58 tokens in 128 rows
    q = torch.randn(*lead, 8, *seq, 64, generator=g).to(device, BF16)
    k, v = (torch.randn(*lead, 2, *seq, 64, generator=g).to(device, BF16) for _ in range(2))
    cu = torch.tensor([0, 70, 128], dtype=torch.int32, device=device)

    def attention(q, k, v, cu):
        seqlens = (cu, cu, 70, 70) if packed else (None,) * 4
        return torch.ops.numba_hopper.attention(q, k, v, True, "bottom_right", None, *seqlens, False)[0]

    def run(mesh, rank):
        out = attention(*(_placed(t, placement, mesh, rank) for t in (q, k, v)), DTensor.from_local(cu, mesh, [R]))
        assert out.placements == (placement,), out.placements
        return out.to_local()

    return rel_error(_whole(on_fake_ranks(device, run), placement), attention(q, k, v, cu))


# --- a decoder with transformers' module names ------------------------------------------------


class Attention(torch.nn.Module):
    """Causal self-attention with grouped key/value heads; the head count comes from the
    projections' outputs (``view(..., -1, head_dim)``), as in transformers' models. With
    ``head_norms``, Qwen3's per-head RMSNorms of the queries and keys (``q_norm``, ``k_norm``)."""

    def __init__(self, hidden, heads, kv_heads, head_dim, bias, head_norms=False):
        super().__init__()
        self.head_dim = head_dim
        self.q_norm = torch.nn.RMSNorm(head_dim) if head_norms else None
        self.k_norm = torch.nn.RMSNorm(head_dim) if head_norms else None
        self.q_proj = torch.nn.Linear(hidden, heads * head_dim, bias=bias)
        # (no key bias: it adds one value to all of a query's scores, which the softmax ignores, so its
        # gradient is 0 and a bf16 one is rounding alone, which no relative error can judge)
        self.k_proj = torch.nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = torch.nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = torch.nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, hidden_states):
        b, s, _ = hidden_states.shape
        q, k, v = (p(hidden_states).view(b, s, -1, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(torch.nn.Module):
    def __init__(self, hidden, ffn, bias):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.up_proj = torch.nn.Linear(hidden, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, hidden, bias=bias)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, hidden, heads, kv_heads, head_dim, ffn, bias, head_norms):
        super().__init__()
        self.input_layernorm = torch.nn.RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, bias, head_norms)
        self.post_attention_layernorm = torch.nn.RMSNorm(hidden)
        self.mlp = MLP(hidden, ffn, bias)

    def forward(self, x):
        x = x + self.self_attn(hidden_states=self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(torch.nn.Module):
    """Decoder layers on hidden states (no embedding), under ``model.layers`` as in transformers;
    with ``bias``, the query, value and down projections have biases; with ``head_norms``, the
    attention normalizes each query and key head (Qwen3)."""

    def __init__(self, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, bias=True, head_norms=False):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(Layer(hidden, heads, kv_heads, head_dim, ffn, bias, head_norms)
                                                for _ in range(layers))

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x


def decoder(device, dtype=torch.bfloat16, seed=0, **sizes):
    torch.manual_seed(seed)
    return Decoder(**sizes).to(device, dtype)


def decoder_inputs(device, batch=2, seq=8, hidden=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, hidden, generator=g).to(device, torch.bfloat16)


def hidden_output(model, x):
    return model(x)


def square_loss(out):
    return out.float().square().mean()


def transformers_model(name, device, seed=0):
    """A small random-init transformers causal LM, ``"llama"`` or ``"qwen3"``, in bf16: 2 layers,
    hidden 512, MLP 1024, 8 query and 4 key/value heads of 64, vocabulary 1024, SDPA attention."""
    import transformers

    config_class, model_class = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                                 "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[name]
    config = getattr(transformers, config_class)(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, vocab_size=1024, max_position_embeddings=512, tie_word_embeddings=False,
        attn_implementation="sdpa")
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config).to(device, BF16)


def token_ids(device, batch=2, seq=64, vocab=1024, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def lm_loss(model, ids):
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def identity(x):
    return x


# --- tensor parallelism against one device --------------------------------------------------


def tensor_parallel_errors(model, x, mesh, forward=hidden_output, loss_fn=square_loss):
    """Forward and backward of ``model`` three ways: on ``numba_hopper.torch`` on one device,
    the same parallelized over ``mesh`` with ``decoder_tp_plan``, and stock PyTorch in float64.
    Returns ``{"single"|"tp": {"out": error, "grads": the worst error of the gradients (the
    parameters' and a floating-point input's)}}`` against float64,
    the collectives the parallel model made (``{name: count}``) and its sharded weights' local
    and global shapes."""
    import numba_hopper.torch as nht
    import numba_hopper.torch.distributed as nhd
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    ref = copy.deepcopy(model).double()
    single, parallel = copy.deepcopy(model), copy.deepcopy(model)
    nht.replace_linear(single)
    nht.replace_linear(parallel)
    parallelize_module(parallel, mesh, nhd.decoder_tp_plan())
    ref_out = _forward_backward(ref, x.double() if x.is_floating_point() else x, forward, loss_fn)
    errors = {"single": _errors(single, ref, _forward_backward(single, x, forward, loss_fn), ref_out)}
    with CommDebugMode() as comm, warnings.catch_warnings():
        # (its module tracker's backward hooks warn about a module called with keyword inputs only)
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        out = _forward_backward(parallel, x, forward, loss_fn)
    errors["tp"] = _errors(parallel, ref, out, ref_out)
    shapes = {name: (tuple(p.to_local().shape), tuple(p.shape)) for name, p in parallel.named_parameters()
              if hasattr(p, "to_local")}
    return errors, {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}, shapes


def _forward_backward(model, x, forward, loss_fn):
    """``(output, the input's gradient or None)``, the parameters' gradients accumulated."""
    x = x.detach().requires_grad_() if x.is_floating_point() else x
    out = forward(model, x)
    loss_fn(out).backward()
    return out.detach(), x.grad


def _errors(model, ref, got, want):
    grads = [rel_error(p.grad, r.grad) for p, r in zip(model.parameters(), ref.parameters(), strict=True)]
    if got[1] is not None:
        grads.append(rel_error(got[1], want[1]))
    return {"out": rel_error(got[0], want[0]), "grads": max(grads)}


def fused_inference_errors(model, x, mesh, forward=hidden_output):
    """Inference (no gradient) of ``model`` with its SwiGLU MLPs fused (``fuse_gated_mlps``: one
    gated GEMM each), on one device and parallelized over ``mesh``, against stock PyTorch in
    float64: ``{"single": error, "tp": error}``."""
    import numba_hopper.torch as nht
    import numba_hopper.torch.distributed as nhd
    from torch.distributed.tensor.parallel import parallelize_module

    ref = copy.deepcopy(model).double()
    single, parallel = copy.deepcopy(model), copy.deepcopy(model)
    for m in (single, parallel):
        nht.fuse_gated_mlps(m)
        nht.replace_linear(m)
    parallelize_module(parallel, mesh, nhd.decoder_tp_plan())
    with torch.no_grad():
        want = forward(ref, x.double() if x.is_floating_point() else x)
        return {"single": rel_error(forward(single, x), want), "tp": rel_error(forward(parallel, x), want)}


# --- FSDP2 against one device ---------------------------------------------------------------


def fsdp_losses(model, batches, mesh, forward=hidden_output, loss_fn=square_loss, steps=20, lr=1e-3):
    """``steps`` AdamW steps of ``model`` on ``numba_hopper.torch`` on one device (the whole of
    each batch) and under FSDP2 over ``mesh`` (each rank its share of the batch, the gradients
    averaged): the two loss curves, the FSDP2 one averaged over the ranks."""
    import numba_hopper.torch as nht
    from torch.distributed.fsdp import fully_shard

    single, sharded = copy.deepcopy(model), copy.deepcopy(model)
    nht.replace_linear(single)
    nht.replace_linear(sharded)
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    rank, world = mesh.get_local_rank(), mesh.size()
    curves = {}
    for name, m in (("single", single), ("fsdp", sharded)):
        opt = torch.optim.AdamW(m.parameters(), lr=lr)
        curve = []
        for step in range(steps):
            batch = batches[step % len(batches)]
            if name == "fsdp":
                batch = batch.chunk(world)[rank]
            loss = loss_fn(forward(m, batch))
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss = loss.detach()
            if name == "fsdp":
                dist.all_reduce(loss, group=mesh.get_group())  # (gloo has no ReduceOp.AVG)
                loss /= world
            curve.append(loss.item())
        curves[name] = curve
    return curves


def worst_step_difference(curves):
    return max(abs(a - b) / abs(b) for a, b in zip(curves["fsdp"], curves["single"], strict=True))


# --- the expert-parallel example ------------------------------------------------------------


def expert_parallel_example():
    """``examples/distributed/expert_parallel.py`` as a module (its ``main`` not run)."""
    path = ROOT / "examples" / "distributed" / "expert_parallel.py"
    spec = importlib.util.spec_from_file_location("expert_parallel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- ranks in processes of their own ----------------------------------------------------------


def spawn(world, worker, tmp_path, *args):
    """Run ``worker(rank, world, store_path, *args)`` in ``world`` new processes
    (``torch.multiprocessing.spawn``) and return what each returned (the traceback's text if
    it raised). ``store_path``: a file for ``init_method="file://..."``."""
    import torch.multiprocessing as mp

    saved = {k: os.environ.get(k) for k in NO_MULTICAST}
    os.environ.update(NO_MULTICAST)  # (the processes inherit the environment)
    try:
        mp.spawn(_run_rank, args=(world, worker, str(tmp_path / "store"), str(tmp_path), args), nprocs=world)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _run_rank(rank, world, worker, store, out_dir, args):
    os.environ.update(NO_MULTICAST)
    try:
        result = worker(rank, world, store, *args)
    except Exception:
        result = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    torch.save(result, pathlib.Path(out_dir) / f"rank{rank}.pt")


def check_ranks(results):
    """The ranks' results, failing with a rank's traceback if one raised."""
    for rank, result in enumerate(results):
        if isinstance(result, str):
            raise AssertionError(f"rank {rank} raised:\n{result}")
    return results
