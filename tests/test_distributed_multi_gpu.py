"""numba_hopper.torch.distributed over two Hopper GPUs (skipped with fewer): tensor parallelism
of a decoder and of transformers' Llama and Qwen3, forward and backward against one GPU; fused
inference; FSDP2 training against one GPU; the expert-parallel example, spawned and under
torchrun; operands on two GPUs. Each rank is a process of its own (NCCL), on its own GPU.
"""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
              pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")]

import torch.distributed as dist  # noqa: E402

import _distributed_cases as cases  # noqa: E402

WORLD = 2


def _transformers_models():
    try:
        import transformers
    except ImportError:
        return []
    return [name for name, cls in (("llama", "LlamaForCausalLM"), ("qwen3", "Qwen3ForCausalLM"))
            if hasattr(transformers, cls)]


def _rank_checks(rank, world, store):
    from torch.distributed.tensor import DeviceMesh

    torch.cuda.set_device(rank)  # first: numba_hopper launches in the context torch makes current
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world, device_id=device)
    mesh = DeviceMesh("cuda", list(range(world)))
    sizes = dict(hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512)
    x = cases.decoder_inputs(device, seq=64, hidden=256)
    results = {"tp": {}}
    results["tp"]["decoder"], results["comms"], _ = cases.tensor_parallel_errors(cases.decoder(device, **sizes), x,
                                                                                 mesh)
    results["fused"] = cases.fused_inference_errors(cases.decoder(device, **sizes), x, mesh)
    for name in _transformers_models():
        results["tp"][name] = cases.tensor_parallel_errors(cases.transformers_model(name, device),
                                                           cases.token_ids(device), mesh, forward=cases.logits)[0]
    if _transformers_models():
        batches = [cases.token_ids(device, batch=4, seed=s) for s in range(4)]
        results["fsdp"] = cases.fsdp_losses(cases.transformers_model("llama", device), batches, mesh,
                                            forward=cases.lm_loss, loss_fn=cases.identity)
    results["ep"] = cases.expert_parallel_example().check(1024, device)
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return cases.check_ranks(cases.spawn(WORLD, _rank_checks, tmp_path_factory.mktemp("ranks")))


def test_tensor_parallel_matches_one_gpu(ranks):
    for result in ranks:
        for model, errors in result["tp"].items():
            assert errors["tp"]["out"] < 3e-2 and errors["tp"]["grads"] < 1e-1, (model, errors)
            assert errors["tp"]["out"] <= 2 * errors["single"]["out"] + 2e-3, (model, errors)
            assert errors["tp"]["grads"] <= 2 * errors["single"]["grads"] + 5e-3, (model, errors)
        assert result["comms"] == {"all_reduce": 8}  # 2 layers: 2 forward, 2 backward each


def test_transformers_models_ran(ranks):
    if not _transformers_models():
        pytest.skip("transformers is not installed")
    assert set(_transformers_models()) <= set(ranks[0]["tp"])


def test_fused_inference_matches_one_gpu(ranks):
    for result in ranks:
        errors = result["fused"]
        assert errors["tp"] < 2e-2 and errors["tp"] <= 2 * errors["single"] + 2e-3, errors


def test_fsdp2_trains_as_one_gpu(ranks):
    if "fsdp" not in ranks[0]:
        pytest.skip("transformers is not installed")
    curves = ranks[0]["fsdp"]
    assert curves["single"][-1] < 0.9 * curves["single"][0], curves
    assert cases.worst_step_difference(curves) < 2e-2, curves


def test_expert_parallel_example(ranks):
    assert all(r["ep"] < 1e-2 for r in ranks), [r["ep"] for r in ranks]


def test_expert_parallel_example_under_torchrun():
    script = cases.ROOT / "examples" / "distributed" / "expert_parallel.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}", str(script),
                           "--tokens", "1024"], capture_output=True, text=True,
                          env={**os.environ, **cases.NO_MULTICAST}, timeout=600)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout + proc.stderr


def test_operands_on_two_gpus_raise_before_launch():
    """A plain tensor on GPU 1 among GPU 0's DTensors (``implicit_replication`` lets it in)
    reaches numba_hopper.gemm, which refuses it."""
    from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    from numba_hopper.errors import DeviceMismatchError

    os.environ.update(cases.NO_MULTICAST)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda", 0))
    try:
        import numba_hopper.torch.distributed  # noqa: F401

        mesh = DeviceMesh("cuda", [0])
        a = distribute_tensor(torch.randn(64, 128, dtype=torch.bfloat16, device="cuda:0"), mesh, [Replicate()])
        b = distribute_tensor(torch.randn(128, 256, dtype=torch.bfloat16, device="cuda:0"), mesh, [Shard(1)])
        with implicit_replication(), pytest.raises(DeviceMismatchError):
            torch.ops.numba_hopper.gemm(a, b, bias=torch.randn(256, dtype=torch.bfloat16, device="cuda:1"))
    finally:
        dist.destroy_process_group()
