"""numba_hopper.torch.distributed without a GPU: the sharding rules of the custom operators on
DTensors (which placements they produce, which they refuse), tensor parallelism and FSDP2 of a
model of ``nht.Linear`` layers against one device, and the expert-parallel example.

The GEMM is the float64 CPU stand-in (tests/_torch_double.py). Placements are checked with
torch's fake process group (``fake_pg``: real DTensor shapes on a world of several ranks in one
process, collectives that move nothing) and meta tensors; numbers with gloo, on one rank in
process and on two ranks in processes of their own.
"""

import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch has no torch.distributed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import _distributed_cases as cases  # noqa: E402
import _torch_double  # noqa: E402
import numba_hopper.torch as nht  # noqa: E402
import numba_hopper.torch.distributed as nhd  # noqa: E402

R, P, S0, S1, S2 = Replicate(), Partial(), Shard(0), Shard(1), Shard(2)
BF16 = torch.bfloat16
ops = torch.ops.numba_hopper


@pytest.fixture
def double(monkeypatch):
    _torch_double.install(monkeypatch)


@pytest.fixture
def gemm_calls(double, monkeypatch):
    """The stand-in's calls, as (a's shape, b's shape, whether gated), in order."""
    from numba_hopper.matmul import api

    calls, gemm = [], api.gemm

    def recording(a, b, *args, **kwargs):
        calls.append((tuple(a.shape), tuple(b.shape), kwargs.get("up") is not None))
        return gemm(a, b, *args, **kwargs)

    monkeypatch.setattr(api, "gemm", recording)
    return calls


@pytest.fixture
def fake_mesh():
    """``make(world=2)``: a DeviceMesh over a fake process group of ``world`` ranks (this one rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def make(world=2):
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        return DeviceMesh("cpu", list(range(world)))

    yield make
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def one_rank_mesh():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield DeviceMesh("cpu", [0])
    dist.destroy_process_group()


def meta(mesh, shape, *placements, dtype=BF16):
    """A DTensor of global ``shape`` with meta local shards (no data: placements and shapes only)."""
    if any(p.is_partial() for p in placements):
        return DTensor.from_local(torch.empty(shape, dtype=dtype, device="meta"), mesh, placements, run_check=False)
    return distribute_tensor(torch.empty(shape, dtype=dtype, device="meta"), mesh, placements)


def placement_error(excinfo):
    """The PlacementError raised, directly or as the cause of DTensor's RuntimeError."""
    err = excinfo.value
    err = err if isinstance(err, nhd.PlacementError) else err.__cause__
    assert isinstance(err, nhd.PlacementError), repr(excinfo.value)
    return str(err)


def test_import_numba_hopper_torch_leaves_torch_distributed_tensor_alone():
    import subprocess

    code = ("import sys, numba_hopper.torch; "
            "assert not {'torch.distributed.tensor', 'numba_hopper.torch.distributed'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- which placements the rules produce ------------------------------------------------------

A, B = (8, 16), (16, 12)  # (M, K) x (K, N)
GEMM_CASES = cases.GEMM_CASES


@pytest.mark.parametrize("op", ["gemm", "gemm_no_grad", "gemm_aux"])
@pytest.mark.parametrize("case", range(len(GEMM_CASES)))
def test_gemm_rules(fake_mesh, op, case):
    mesh = fake_mesh()
    shapes, placed, extra, expected = cases.gemm_case_shapes(case, A[0], A[1], B[1])
    args = {**{name: meta(mesh, shape, placed[name]) for name, shape in shapes.items()}, **extra}
    if op == "gemm_no_grad":  # (no defaults in its schema)
        defaults = dict(a=None, b=None, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=1, activation=None,
                        out_dtype=None)
        out = ops.gemm_no_grad(*(args.get(n, d) for n, d in defaults.items()))
    else:
        out = getattr(ops, op)(**args)
    for o in out if isinstance(out, tuple) else (out,):
        assert o.placements == (expected,)
        assert tuple(o.shape) == (A[0], B[1]) and o.dtype == extra.get("out_dtype", BF16)
        assert tuple(o.to_local().shape) == _local_shape((A[0], B[1]), expected, 2, 0)


def _local_shape(shape, placement, world, rank):
    if not placement.is_shard():
        return tuple(shape)
    chunks = torch.empty(shape, device="meta").chunk(world, placement.dim)
    return tuple(chunks[rank].shape) if rank < len(chunks) else (0,)


@pytest.mark.parametrize("pa, pb, expected", [(S1, S0, P), (R, S1, S1), (S0, R, S0)])
def test_mm_rules(fake_mesh, pa, pb, expected):
    mesh = fake_mesh()
    assert ops.mm(meta(mesh, A, pa), meta(mesh, B, pb), False).placements == (expected,)


@pytest.mark.parametrize("pa, pb, pup, expected", [(R, R, R, R), (S0, R, R, S0), (R, S1, S1, S1)])
def test_gated_mm_rules(fake_mesh, pa, pb, pup, expected):
    mesh = fake_mesh()
    out = ops.gated_mm(meta(mesh, A, pa), meta(mesh, B, pb), meta(mesh, B, pup), "silu")
    assert out.placements == (expected,) and tuple(out.shape) == (A[0], B[1])


@pytest.mark.parametrize("shapes, pa, pb, expected", [
    (((4, 8, 16), (4, 16, 12)), S0, S0, S0),
    (((4, 8, 16), (4, 16, 12)), S1, R, S1),
    (((4, 8, 16), (4, 16, 12)), R, S2, S2),
    (((4, 8, 16), (4, 16, 12)), S2, S1, P),
    (((1, 8, 16), (4, 16, 12)), R, S0, S0),  # a's batch of 1 broadcasts: it stays whole
    (((4, 8, 16), (1, 16, 12)), S0, R, S0),
])
@pytest.mark.parametrize("op", ["bmm", "bmm_no_grad"])
def test_bmm_rules(fake_mesh, op, shapes, pa, pb, expected):
    mesh = fake_mesh()
    out = getattr(ops, op)(meta(mesh, shapes[0], pa), meta(mesh, shapes[1], pb), None)
    assert out.placements == (expected,) and tuple(out.shape) == (4, 8, 12)


@pytest.mark.parametrize("placement, lse", [(S1, S1), (S0, S0), (R, R)])
@pytest.mark.parametrize("bshd_out", [False, True])
def test_attention_rules(fake_mesh, placement, lse, bshd_out):
    mesh = fake_mesh()
    q = meta(mesh, (2, 8, 32, 64), placement)
    k, v = meta(mesh, (2, 2, 48, 64), placement), meta(mesh, (2, 2, 48, 64), placement)  # grouped heads
    out, out_lse = ops.attention(q, k, v, True, "bottom_right", None, None, None, None, None, bshd_out)
    assert out.placements == (placement,) and out_lse.placements == (lse,)
    assert tuple(out.shape) == (2, 8, 32, 64) and tuple(out_lse.shape) == (2, 8, 32)
    assert tuple(out.to_local().shape) == _local_shape((2, 8, 32, 64), placement, 2, 0)


def test_packed_attention_shards_heads(fake_mesh):
    mesh = fake_mesh()
    q, k, v = (meta(mesh, (40, 4, 64), S1) for _ in range(3))
    cu = meta(mesh, (3,), R, dtype=torch.int32)
    out, lse = ops.attention(q, k, v, False, "bottom_right", None, cu, cu, 24, 24, False)
    assert out.placements == (S1,) and lse.placements == (S0,)  # lse: (heads, total)
    assert tuple(out.to_local().shape) == (40, 2, 64) and tuple(lse.to_local().shape) == (2, 40)


def test_rules_run_without_communication(fake_mesh):
    mesh = fake_mesh()
    with CommDebugMode() as comm:
        for case in range(len(GEMM_CASES)):
            shapes, placed, extra, _ = cases.gemm_case_shapes(case, A[0], A[1], B[1])
            ops.gemm(**{name: meta(mesh, shape, placed[name]) for name, shape in shapes.items()}, **extra)
    assert comm.get_total_counts() == 0


def test_two_dimensional_mesh(fake_mesh):
    """Rules apply per mesh dimension: rows on one, columns on the other."""
    fake_mesh(world=4)
    mesh = DeviceMesh("cpu", torch.arange(4).view(2, 2))
    out = ops.gemm(meta(mesh, A, S0, R), meta(mesh, B, R, S1))
    assert out.placements == (S0, S1) and tuple(out.to_local().shape) == (4, 6)


# --- what they refuse -------------------------------------------------------------------------

REFUSED = [  # (operator, arguments as (shape, placement) or values, what the error must say)
    ("gemm", [(A, S1), (B, S0)], {"activation": "gelu"}, "activation 'gelu' needs the complete sum over K"),
    ("gemm_aux", [(A, S1), (B, S0)], {"activation": "silu"}, "a row-wise layer takes no fused activation"),
    ("gemm", [(A, S1), (B, S1)], {}, "no sharding rule for a=S(1), b=S(1)"),
    ("gemm", [(A, S0), (B, S1)], {}, "no sharding rule for a=S(0), b=S(1)"),
    ("gemm", [(A, Partial("max")), (B, R)], {}, "no sharding rule for a=P(max)"),
    ("gemm", [(A, P), (B, S1)], {}, "no sharding rule for a=P(sum), b=S(1)"),
    ("gemm", [(A, S1), (B, S0)], {"bias": ((12,), S0)}, "bias=S(0)"),
    ("mm", [(A, S0), (B, S0), True], {}, "no sharding rule for a=S(0), b=S(0)"),
    ("gated_mm", [(A, S1), (B, S0), (B, S0), "silu"], {}, "the gated product is nonlinear"),
    ("bmm", [((4, 8, 16), S1), ((4, 16, 12), S2)], {}, "no sharding rule for a=S(1), b=S(2)"),
    ("attention", [((2, 4, 32, 64), S2), ((2, 4, 32, 64), S2), ((2, 4, 32, 64), S2)], {},
     "never the sequence or head_dim"),
    ("attention", [((2, 4, 32, 64), S1), ((2, 4, 32, 64), S0), ((2, 4, 32, 64), S0)], {}, "q=S(1), k=S(0)"),
    ("attention", [((2, 6, 32, 64), S1), ((2, 3, 32, 64), S1), ((2, 3, 32, 64), S1)], {},
     "3 key/value heads (for 6 query heads) do not split evenly into the 2 head shards"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[f"{c[0]}-{c[3][:24]}" for c in REFUSED])
def test_unsupported_placements_raise_placement_error(fake_mesh, case):
    mesh = fake_mesh()
    op, args, kwargs, message = case
    args = [meta(mesh, *a) if isinstance(a, tuple) else a for a in args]
    kwargs = {n: meta(mesh, *v) if isinstance(v, tuple) else v for n, v in kwargs.items()}
    with pytest.raises((nhd.PlacementError, RuntimeError)) as excinfo:  # (DTensor wraps it in a RuntimeError)
        getattr(ops, op)(*args, **kwargs)
    assert message in placement_error(excinfo)


def test_the_error_lists_the_rules(fake_mesh):
    mesh = fake_mesh()
    with pytest.raises((nhd.PlacementError, RuntimeError)) as excinfo:
        ops.gated_mm(meta(mesh, A, S1), meta(mesh, B, S0), meta(mesh, B, S0), "silu")
    assert placement_error(excinfo).endswith(
        "Its rules, output <- inputs: R <- a=R, b=R, up=R; S(0) <- a=S(0), b=R, up=R; S(1) <- a=R, b=S(1), up=S(1)")


def test_mixed_dtensor_and_tensor_raise(fake_mesh):
    mesh = fake_mesh()
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        ops.gemm(meta(mesh, A, R), torch.empty(B, dtype=BF16, device="meta"))


def test_dtensors_on_different_meshes_raise(fake_mesh):
    mesh = fake_mesh()
    other = DeviceMesh("cpu", [1])
    with pytest.raises(RuntimeError, match="cross-mesh|different meshes"):
        ops.gemm(meta(mesh, A, R), DTensor.from_local(torch.empty(B, dtype=BF16, device="meta"), other, [R]))


def test_cpu_shards_reach_the_kernels_check(fake_mesh):
    """Without the stand-in, CPU shards reach numba_hopper.gemm, which refuses them before launch."""
    mesh = fake_mesh()
    a = DTensor.from_local(torch.randn(A, dtype=BF16), mesh, [R])
    b = distribute_tensor(torch.randn(B, dtype=BF16), mesh, [S1])
    with pytest.raises(TypeError, match="not a CUDA device array"):
        ops.gemm(a, b)


# --- each rank's product is its part of the whole --------------------------------------------


@pytest.mark.parametrize("case", range(len(GEMM_CASES)))
def test_local_products_make_the_whole_product(double, case):
    """The ranks' outputs, joined or added as their placement says, are the float64 product:
    the rules pair each shard with the right pieces of the other operands."""
    assert cases.local_products_error(case, A[0], A[1], B[1], "cpu") < 1e-2


@pytest.mark.parametrize("placements, expected", [((S0, S0), S0), ((S1, R), S1), ((R, S2), S2), ((S2, S1), P)])
def test_local_batched_products_make_the_whole_product(double, placements, expected):
    assert cases.local_bmm_error(placements, expected, "cpu") < 1e-2


def attention_double(q, k, v, causal=False, causal_align="bottom_right", scale=None, cu_seqlens_q=None,
                     cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, return_lse=False, out=None):
    """numba_hopper.attention in float64 on the CPU (seqlen_q == seqlen_k, so either alignment),
    returning ``(out, lse)`` in its layouts."""
    if cu_seqlens_q is not None:  # packed: each sequence as a batch of one
        bounds = cu_seqlens_q.tolist()
        pieces = [attention_double(*(t[s:e].transpose(0, 1)[None] for t in (q, k, v)), causal, scale=scale)
                  for s, e in zip(bounds[:-1], bounds[1:])]
        return (torch.cat([o[0].transpose(0, 1) for o, _ in pieces]), torch.cat([lse[0] for _, lse in pieces], 1))
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    result = (torch.softmax(scores, -1) @ v).to(q.dtype)
    return (result if out is None else out.copy_(result)), torch.logsumexp(scores, -1).float()


@pytest.mark.parametrize("placement, packed", [(S0, False), (S1, False), (S1, True)])
def test_attention_on_shards_makes_the_whole_attention(monkeypatch, placement, packed):
    """Each rank's heads (grouped: 4 query heads to a key/value head) or batch, with a float64
    stand-in for the kernel: the joined outputs are the whole attention's."""
    import types

    monkeypatch.setattr("numba_hopper.torch.attention._api", types.SimpleNamespace(attention=attention_double))
    assert cases.local_attention_error(placement, "cpu", packed) < 1e-6


# --- parallel styles on nht.Linear -------------------------------------------------------------


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_colwise_rowwise_run_on_shards_without_all_gather(gemm_calls, fake_mesh):
    mesh = fake_mesh()
    torch.manual_seed(0)
    model = TwoLayers().to(BF16)
    assert nht.replace_linear(model) == 2
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert tuple(model.up.weight.to_local().shape) == (32, 32) and tuple(model.down.weight.to_local().shape) == (32, 32)
    x = torch.randn(3, 5, 32, dtype=BF16, requires_grad=True)
    with CommDebugMode() as comm:
        model(x).float().sum().backward()
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    assert counts == {"all_reduce": 2}  # the row-wise output, the column-wise input's gradient
    # 2 products forward, 4 backward, each with a 32 x 32 weight shard (the weights are 32 x 64)
    assert len(gemm_calls) == 6
    assert all(max(a + b) == 32 for a, b, _ in gemm_calls[:2]) and all(64 not in a + b for a, b, _ in gemm_calls)


def test_decoder_plan_collectives(double, fake_mesh):
    mesh = fake_mesh()
    model = cases.decoder("cpu")
    errors, comms, shapes = cases.tensor_parallel_errors(model, cases.decoder_inputs("cpu"), mesh)
    layers = len(model.model.layers)
    assert comms == {"all_reduce": 4 * layers}  # forward: o_proj, down_proj; backward: attention, MLP inputs
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == ((32, 64), (64, 64))
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == ((16, 64), (32, 64))
    assert shapes["model.layers.0.mlp.down_proj.weight"] == ((64, 48), (64, 96))
    assert shapes["model.layers.0.mlp.down_proj.bias"] == ((64,), (64,))
    assert shapes["model.layers.0.self_attn.q_proj.bias"] == ((32,), (64,))


def test_decoder_plan_sums_the_head_norms_gradients(double, fake_mesh):
    """Qwen3's per-head query and key norms see a rank's heads: one all-reduce each of their
    weights' gradients, on top of the plan's four a layer."""
    model = cases.decoder("cpu", head_norms=True)
    _, comms, shapes = cases.tensor_parallel_errors(model, cases.decoder_inputs("cpu"), fake_mesh())
    assert comms == {"all_reduce": 6 * len(model.model.layers)}
    assert "model.layers.0.self_attn.q_norm.weight" not in shapes  # (plain, replicated tensors)


def test_decoder_plan_refuses_a_norm_over_all_heads(fake_mesh):
    model = cases.decoder("cpu", head_norms=True)
    model.model.layers[0].self_attn.q_norm = torch.nn.RMSNorm(64)  # over the 4 heads of 16 (as OLMo2's)
    nht.replace_linear(model)
    with pytest.raises(ValueError, match="q_norm normalizes 64 features, not one head's 16"):
        parallelize_module(model, fake_mesh(), nhd.decoder_tp_plan())


def test_fused_gated_mlp_runs_its_gated_product_on_the_shards(gemm_calls, fake_mesh):
    mesh = fake_mesh()
    model = cases.decoder("cpu")
    assert nht.fuse_gated_mlps(model) == 2
    nht.replace_linear(model)
    parallelize_module(model, mesh, nhd.decoder_tp_plan())
    with torch.no_grad(), CommDebugMode() as comm:
        model(cases.decoder_inputs("cpu"))
    gated = [(a, b) for a, b, is_gated in gemm_calls if is_gated]
    assert gated == [((16, 64), (64, 48))] * 2  # one a layer, on the gate and up weights' shards (96 / 2)
    assert len(gemm_calls) == 2 * 6  # q, k, v, o, the gated product, down
    assert {str(op).split(".")[-1] for op in comm.get_comm_counts()} == {"all_reduce"}


def test_tensor_parallel_matches_one_device_on_one_rank(double, one_rank_mesh):
    errors, comms, _ = cases.tensor_parallel_errors(cases.decoder("cpu"), cases.decoder_inputs("cpu"), one_rank_mesh)
    assert errors["tp"]["out"] < 1e-2 and errors["tp"]["grads"] < 2e-2, errors
    assert errors["tp"]["out"] <= 1.5 * errors["single"]["out"] + 1e-3, errors


def test_fsdp2_trains_as_one_device_on_one_rank(double, one_rank_mesh):
    batches = [cases.decoder_inputs("cpu", batch=4, seed=s) for s in range(4)]
    curves = cases.fsdp_losses(cases.decoder("cpu"), batches, one_rank_mesh)
    assert curves["single"][-1] < 0.9 * curves["single"][0], curves  # it trains
    assert cases.worst_step_difference(curves) < 1e-3, curves


# --- the expert-parallel example --------------------------------------------------------------


def grouped_gemm_double(a, b, offsets, *, row_scale=None, activation=None, out_dtype=None):
    """numba_hopper.grouped_gemm's contiguous layout in float64 on the CPU."""
    assert activation is None and out_dtype is None and offsets.dtype == torch.int32
    out, start = torch.empty(a.shape[0], b.shape[2], dtype=a.dtype), 0
    for g, end in enumerate(offsets.tolist()):
        y = a[start:end].double() @ b[g].double()
        out[start:end] = y * row_scale[start:end, None].double() if row_scale is not None else y
        start = end
    return out


def test_expert_parallel_example_on_one_rank(one_rank_mesh, monkeypatch):
    monkeypatch.setattr("numba_hopper.grouped_gemm", grouped_gemm_double)
    example = cases.expert_parallel_example()
    assert example.check(256, torch.device("cpu")) < 1e-2


# --- two ranks, each in a process of its own (gloo) ------------------------------------------


def _two_rank_checks(rank, world, store):
    """Tensor parallelism, FSDP2 and the expert-parallel example on ``world`` CPU ranks."""
    import numba_hopper

    _torch_double.install(pytest.MonkeyPatch())
    numba_hopper.grouped_gemm = grouped_gemm_double
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    mesh = DeviceMesh("cpu", list(range(world)))
    results = {}
    results["tp"], results["tp_comms"], _ = cases.tensor_parallel_errors(
        cases.decoder("cpu"), cases.decoder_inputs("cpu"), mesh)
    results["tp_head_norms"] = cases.tensor_parallel_errors(cases.decoder("cpu", head_norms=True),
                                                            cases.decoder_inputs("cpu"), mesh)[0]
    results["fused"] = cases.fused_inference_errors(cases.decoder("cpu"), cases.decoder_inputs("cpu"), mesh)
    batches = [cases.decoder_inputs("cpu", batch=4, seed=s) for s in range(4)]
    results["fsdp"] = cases.fsdp_losses(cases.decoder("cpu"), batches, mesh)
    results["ep"] = cases.expert_parallel_example().check(128, torch.device("cpu"))
    return results


@pytest.mark.long
def test_two_ranks(tmp_path):
    """One spawn of two ranks for all four checks (each rank's process takes seconds to start)."""
    ranks = cases.check_ranks(cases.spawn(2, _two_rank_checks, tmp_path))
    for result in ranks:
        for errors in (result["tp"], result["tp_head_norms"]):  # tensor parallelism against one device
            assert errors["tp"]["out"] < 1e-2 and errors["tp"]["grads"] < 2e-2, errors
            assert errors["tp"]["out"] <= 2 * errors["single"]["out"] + 2e-3, errors
        assert result["tp_comms"] == {"all_reduce": 8}
        errors = result["fused"]  # inference with fused gated MLPs against one device
        assert errors["tp"] < 1e-2 and errors["tp"] <= 2 * errors["single"] + 2e-3, errors
        assert result["ep"] < 1e-2, result["ep"]  # the expert-parallel example against float64
    curves = ranks[0]["fsdp"]  # FSDP2 against one device, 20 steps
    assert curves["single"][-1] < 0.9 * curves["single"][0], curves
    assert cases.worst_step_difference(curves) < 1e-2, curves
    assert ranks[1]["fsdp"]["fsdp"] == curves["fsdp"]  # (the ranks report the same averaged loss)
