"""numba_hopper.torch.linear_cross_entropy without a GPU: its two kernels' SASS, the checks
that run before launch, its traced form and its autograd formula's refusal of a second
derivative.

    python -m pytest -q -n 0 tests/test_loss_cpu.py
"""

import pytest

from numba_hopper.kernels.cross_entropy import grad_kernel, loss_kernel
from numba_hopper.tools.sass import inspect_kernel

LOSS_SIG = "void(int64, int64, int64[::1], int64, float32[::1], float32[::1])"
GRAD_SIG = "void(int64, int64, int64, int64[::1], int64, float32[::1], float32[::1])"


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_kernels_compile_without_spills(dtype):
    loss = inspect_kernel(loss_kernel(dtype), LOSS_SIG)
    grad = inspect_kernel(grad_kernel(dtype), GRAD_SIG)
    for r in (loss, grad):
        assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
        assert "CALL" not in r.sass, r.summary()
        # a row's body moves 16 bytes a load; its unaligned ends one element at a time
        assert r.count("LDG.E.NA.128.CONSTANT") >= 1 and r.count("LDG.E.U16.CONSTANT") >= 1, r.summary()
    assert loss.count("MUFU.EX2") >= 8 and grad.count("MUFU.EX2") >= 8  # one an element of a vector
    assert loss.count("SHFL.BFLY") >= 10 and loss.count("BAR.SYNC") >= 1  # the row's reduction
    assert grad.count("STG.E.128") >= 1 and grad.count("STG.E.U16") >= 1  # the gradient in 16 bits


torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.errors import DtypeError, ShapeError  # noqa: E402


@pytest.mark.parametrize("x, w, t, reduction, error", [
    (torch.zeros(4, 8), torch.zeros(16, 8), torch.zeros(4, dtype=torch.long), "mean", DtypeError),
    (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.float16),
     torch.zeros(4, dtype=torch.long), "mean", DtypeError),
    (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16),
     torch.zeros(4), "mean", DtypeError),
    (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(16, 4, dtype=torch.bfloat16),
     torch.zeros(4, dtype=torch.long), "mean", ShapeError),
    (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16),
     torch.zeros(5, dtype=torch.long), "mean", ShapeError),
    (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(16, 8, dtype=torch.bfloat16),
     torch.zeros(4, dtype=torch.long), "max", ValueError),
], ids=["f32", "mixed", "float-target", "H", "target-shape", "reduction"])
def test_bad_input_is_refused_before_launch(x, w, t, reduction, error):
    with pytest.raises(error):
        nht.linear_cross_entropy(x, w, t, reduction=reduction)


def test_fuse_refuses_a_model_without_a_linear_head():
    class NoHead(torch.nn.Module):
        def get_output_embeddings(self):
            return None

    with pytest.raises(TypeError, match="lm_head"):
        nht.fuse_linear_cross_entropy(NoHead())


def test_traced_calls_are_the_operators():
    """Traced (fake tensors, as torch.compile traces), the loss and its gradients are the GEMM
    operator and the two cross-entropy operators, with their output shapes."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, w, t):
        loss = nht.linear_cross_entropy(x, w, t)
        return (loss, *torch.autograd.grad(loss, (x, w)))

    x = torch.randn(2, 5, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 40, (2, 5))
    graph = make_fx(step, tracing_mode="fake")(x, w, t)
    ops = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert {"numba_hopper.gemm.default", "numba_hopper.cross_entropy_rows.default",
            "numba_hopper.cross_entropy_grad.default"} <= ops, ops
    outputs = [node for node in graph.graph.nodes if node.op == "output"][0].args[0]
    assert [tuple(o.meta["val"].shape) for o in outputs] == [(), (2, 5, 16), (40, 16)]


def test_fused_model_keeps_its_own_forward_without_a_gradient():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=50, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 50, (1, 6))
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids)
    fused = nht.fuse_linear_cross_entropy(model)
    assert fused is model
    with torch.no_grad():  # no gradient: the model's own forward, logits included
        got = model(input_ids=ids, labels=ids)
        assert torch.equal(got.logits, ref.logits) and torch.equal(got.loss, ref.loss)
        assert model(input_ids=ids).logits.shape == (1, 6, 50)


def test_a_second_derivative_is_refused(monkeypatch):
    """A create_graph=True backward raises (the gradient kernel has no derivative) rather than
    returning a gradient that is silently not differentiable. (On the CPU: the GEMMs are
    ``tests/_torch_double``'s, the loss kernel does not run.)"""
    import _torch_double
    from numba_hopper.torch import loss

    _torch_double.install(monkeypatch)
    monkeypatch.setattr(loss, "launch", lambda *args: None)
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16, 8, dtype=torch.bfloat16, requires_grad=True)
    value = nht.linear_cross_entropy(x, w, torch.zeros(4, dtype=torch.long), reduction="sum")
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(value, x, create_graph=True)
    dx, dw = torch.autograd.grad(value, (x, w))  # a first derivative goes on as before
    assert dx.shape == x.shape and dw.shape == w.shape
