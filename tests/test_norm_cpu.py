"""numba_hopper.torch.rms_norm without a GPU: its kernels' SASS for every tiling a width gets, the
tilings, the checks that run first, the operators it runs on CPU tensors and in a trace, and which
modules fuse_rms_norms swaps.

    python -m pytest -q -n 0 tests/test_norm_cpu.py
"""

import pytest

from numba_hopper.kernels.rms_norm import MAX_WIDTH, backward_kernel, column_sum_kernel, forward_kernel, tiling
from numba_hopper.tools.sass import inspect_kernel

FORWARD_SIG = "void(int64, int64, int64, float32[::1], int64, int64, float32, float32)"
BACKWARD_SIG = "void(int64, int64, int64, float32[::1], int64, float32[:, ::1], int64, int64, float32)"


def test_tilings():
    """Groups of threads as narrow as hold a row in two vectors a thread (a pair at least), up to
    a CTA; four vectors a thread in a CTA-wide group."""
    assert [tiling(w) for w in (8, 128, 2048, 2560, 4096, 8192, 136)] == [
        (2, 1), (8, 2), (128, 2), (256, 2), (256, 2), (256, 4), (16, 2)]
    assert MAX_WIDTH == 8192


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("width", [8, 128, 2048, 8192])
def test_kernels_compile_without_spills(width, dtype):
    group, per_thread = tiling(width)
    forward = inspect_kernel(forward_kernel(dtype, group, per_thread), FORWARD_SIG)
    backward = inspect_kernel(backward_kernel(dtype, group, per_thread), BACKWARD_SIG)
    for r in (forward, backward):
        assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()  # the row in registers
        assert "CALL" not in r.sass, r.summary()
        assert r.count("SHFL.BFLY") >= min(group, 32).bit_length() - 1, r.summary()  # the group's butterfly
    # a row is read once, 16 bytes a load, and written 16 bytes a store
    assert forward.count("LDG.E.NA.128.CONSTANT") == per_thread + per_thread, forward.summary()  # weight, x
    assert backward.count("LDG.E.NA.128.CONSTANT") == 3 * per_thread, backward.summary()  # weight, x, dy
    assert forward.count("STG.E.128") == per_thread and backward.count("STG.E.128") == per_thread
    assert (forward.count("BAR.SYNC") >= 1) == (group > 32)  # a group wider than a warp: its warps' sum
    assert backward.count("ATOMS.CAST.SPIN") >= 1  # the CTA's weight gradient (shared float adds)
    column = inspect_kernel(column_sum_kernel(dtype), "void(float32[:, ::1], int64, int64)")
    assert column.spill_bytes == 0 and column.count("STG.E.U16") == 1
    assert column.count("LDG.E") >= 5, column.summary()  # four partial rows at a time, then one


torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.errors import ShapeError  # noqa: E402


def operators(x, w, eps=1e-6):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("x, w, error", [
    (torch.zeros(4, 8), torch.zeros(4), ShapeError),
    (torch.zeros(4, 8), torch.zeros(1, 8), ShapeError),
    (torch.zeros(()), torch.zeros(1), ShapeError),
    (torch.zeros(4, 8), [1.0] * 8, TypeError),
], ids=["width", "2-D weight", "scalar x", "list weight"])
def test_bad_input_is_refused(x, w, error):
    with pytest.raises(error):
        nht.rms_norm(x, w)


def test_cpu_tensors_run_the_operators():
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(64, dtype=torch.bfloat16, requires_grad=True)
    y = nht.rms_norm(x, w, 1e-5)
    assert torch.equal(y, operators(x, w, 1e-5))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_traced_calls_are_the_operators():
    """Traced (fake tensors, as torch.compile traces), the norm is PyTorch's operators, which
    Inductor fuses with its neighbours."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    w = torch.randn(16, dtype=torch.bfloat16)
    graph = make_fx(lambda x, w: nht.rms_norm(x, w), tracing_mode="fake")(x, w)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert "aten.rsqrt.default" in targets and not any("numba_hopper" in t for t in targets), targets


def test_fuse_swaps_llama_arithmetic_norms_only():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(32, eps=1e-5)
    model = torch.nn.ModuleDict({"norm": norm, "ln": torch.nn.LayerNorm(32),
                                 "inner": torch.nn.Sequential(LlamaRMSNorm(32))})
    gemma = getattr(transformers.models, "gemma", None)
    if gemma is not None:
        model["gemma"] = gemma.modeling_gemma.GemmaRMSNorm(32)  # (1 + weight), eps: another arithmetic
    assert nht.fuse_rms_norms(model) == 2
    assert isinstance(model["norm"], nht.RMSNorm) and isinstance(model["inner"][0], nht.RMSNorm)
    assert model["norm"].weight is norm.weight and model["norm"].variance_epsilon == 1e-5
    assert isinstance(model["ln"], torch.nn.LayerNorm)
    assert nht.fuse_rms_norms(model) == 0
    x = torch.randn(4, 32)
    assert torch.equal(model["norm"](x), norm(x))
