"""numba_hopper.torch.distributed on one Hopper GPU: the kernels on DTensor shards, tensor
parallelism and FSDP2 on a one-rank NCCL mesh against one device (transformers' Llama and
Qwen3 where transformers is installed), the expert-parallel example, and mixed devices.

The shards' products run on a fake process group of two ranks (each rank in turn, on the one
GPU): real shard shapes and layouts, no communication.
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.distributed.is_available():
    pytest.skip("this PyTorch has no torch.distributed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor  # noqa: E402

import _distributed_cases as cases  # noqa: E402
import numba_hopper.torch.distributed  # noqa: E402, F401  (the sharding rules)

M, K, N = 127, 192, 256  # a ragged M; shards of K and N stay 16-byte multiples


@pytest.fixture
def mesh():
    """A one-rank mesh on GPU 0 (NCCL, and gloo for CPU tensors)."""
    os.environ.update(cases.NO_MULTICAST)
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1, store=dist.HashStore(),
                            device_id=torch.device("cuda", 0))
    yield DeviceMesh("cuda", [0])
    dist.destroy_process_group()


@pytest.mark.parametrize("case", range(len(cases.GEMM_CASES)))
def test_local_products_make_the_whole_product(case):
    assert cases.local_products_error(case, M, K, N, "cuda") < 1e-2


@pytest.mark.parametrize("placements, expected", [
    ((Shard(0), Shard(0)), Shard(0)), ((Shard(1), Replicate()), Shard(1)), ((Replicate(), Shard(2)), Shard(2)),
    ((Shard(2), Shard(1)), Partial())])
def test_local_batched_products_make_the_whole_product(placements, expected):
    assert cases.local_bmm_error(placements, expected, "cuda") < 1e-2


@pytest.mark.parametrize("placement, packed", [(Shard(0), False), (Shard(1), False), (Shard(1), True)])
def test_attention_on_shards_makes_the_whole_attention(placement, packed):
    assert cases.local_attention_error(placement, "cuda", packed) < 1e-3


def _decoder():
    sizes = dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512)
    return cases.decoder("cuda", **sizes), cases.decoder_inputs("cuda", seq=64, hidden=256)


def test_tensor_parallel_matches_one_device(mesh):
    errors, comms, _ = cases.tensor_parallel_errors(*_decoder(), mesh)
    assert errors["tp"]["out"] < 2e-2 and errors["tp"]["grads"] < 5e-2, errors
    assert errors["tp"]["out"] <= 1.5 * errors["single"]["out"] + 1e-3, errors


def test_fused_inference_matches_one_device(mesh):
    errors = cases.fused_inference_errors(*_decoder(), mesh)
    assert errors["tp"] < 2e-2 and errors["tp"] <= 1.5 * errors["single"] + 1e-3, errors


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_transformers_tensor_parallel_matches_one_device(mesh, name):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[name]):
        pytest.skip(f"this transformers has no {name}")
    errors, _, _ = cases.tensor_parallel_errors(cases.transformers_model(name, "cuda"), cases.token_ids("cuda"), mesh,
                                                forward=cases.logits)
    assert errors["tp"]["out"] < 3e-2 and errors["tp"]["grads"] < 1e-1, errors
    assert errors["tp"]["out"] <= 1.5 * errors["single"]["out"] + 1e-3, errors


def test_fsdp2_trains_as_one_device(mesh):
    pytest.importorskip("transformers")
    batches = [cases.token_ids("cuda", batch=4, seed=s) for s in range(4)]
    curves = cases.fsdp_losses(cases.transformers_model("llama", "cuda"), batches, mesh, forward=cases.lm_loss,
                               loss_fn=cases.identity)
    assert curves["single"][-1] < 0.9 * curves["single"][0], curves
    assert cases.worst_step_difference(curves) < 1e-2, curves


def test_expert_parallel_example(mesh):
    assert cases.expert_parallel_example().check(1024, torch.device("cuda", 0)) < 1e-2


def test_expert_parallel_example_script():
    script = cases.ROOT / "examples" / "distributed" / "expert_parallel.py"
    proc = subprocess.run([sys.executable, str(script), "--tokens", "512"], capture_output=True, text=True,
                          env={**os.environ, **cases.NO_MULTICAST}, timeout=600)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout + proc.stderr


# --- mixed devices -----------------------------------------------------------------------------


def test_gpu_and_cpu_dtensors_raise(mesh):
    a = distribute_tensor(torch.randn(M, K, dtype=torch.bfloat16, device="cuda"), mesh, [Replicate()])
    b = distribute_tensor(torch.randn(K, N, dtype=torch.bfloat16), DeviceMesh("cpu", [0]), [Shard(1)])
    with pytest.raises(RuntimeError, match="cross-mesh|different meshes"):
        torch.ops.numba_hopper.gemm(a, b)


def test_a_cpu_operand_among_gpu_shards_raises_before_launch(mesh):
    from torch.distributed.tensor.experimental import implicit_replication

    a = distribute_tensor(torch.randn(M, K, dtype=torch.bfloat16, device="cuda"), mesh, [Replicate()])
    b = distribute_tensor(torch.randn(K, N, dtype=torch.bfloat16, device="cuda"), mesh, [Shard(1)])
    with implicit_replication(), pytest.raises(TypeError, match="not a CUDA device array"):
        torch.ops.numba_hopper.gemm(a, b, bias=torch.randn(N, dtype=torch.bfloat16))
    assert isinstance(torch.ops.numba_hopper.gemm(a, b), DTensor)  # (the same call on one device runs)
