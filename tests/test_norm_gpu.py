"""numba_hopper.torch.rms_norm and fuse_rms_norms on a Hopper GPU: the output and both gradients
against float64 and against transformers' operators at equal accuracy, ragged row counts, every
tiling of a row, both dtypes, the inputs that run the operators, and transformers models.

    python -m pytest -q -n 0 tests/test_norm_gpu.py
"""

import copy

import pytest

torch = pytest.importorskip("torch")

import numba_hopper.torch as nht  # noqa: E402
from numba_hopper.kernels.rms_norm import tiling  # noqa: E402

pytestmark = pytest.mark.gpu

EPS = 1e-6


def rel_error(got, ref):
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def operators(x, w, eps=EPS):  # transformers' LlamaRMSNorm.forward
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def float64(x, w, eps=EPS):
    h = x.double()
    return w.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def poison_allocator(*like):
    """Free NaN-filled blocks of these sizes, which the caching allocator hands out next: an
    element a kernel fails to write reads NaN."""
    blocks = [torch.full_like(t, float("nan")) for t in like]
    del blocks


def run(fn, x, w, dy):
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    poison_allocator(x, x, w)
    y = fn(x, w)
    y.backward(dy)
    return y.detach(), x.grad, w.grad


def inputs(shape, dtype, seed=0):
    torch.manual_seed(seed)
    x = (torch.randn(shape, device="cuda") * 3 + 0.5).to(dtype)
    w = (1 + 0.2 * torch.randn(shape[-1], device="cuda")).to(dtype)
    dy = torch.randn(shape, device="cuda").to(dtype)
    return x, w, dy


# widths: one vector; a group below a warp; a warp; several warps; 2.5 vectors a thread's
# worth (Qwen3-4B); CTA-wide groups with 2 and 4 vectors a thread; 17 vectors (ragged)
WIDTHS = [8, 128, 512, 2048, 2560, 4096, 8192, 136]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", [1, 7, 127, 129, 1000])
def test_output_and_gradients_match_float64_as_closely_as_the_operators(rows, width, dtype):
    x, w, dy = inputs((rows, width), dtype, seed=rows + width)
    y, dx, dw = run(nht.rms_norm, x, w, dy)
    ty, tdx, tdw = run(operators, x, w, dy)
    x64, w64 = (t.double().requires_grad_() for t in (x, w))
    ry = float64(x64, w64)
    rdx, rdw = torch.autograd.grad(ry, (x64, w64), dy.double())
    assert not y.isnan().any() and not dx.isnan().any() and not dw.isnan().any()
    assert y.dtype == dx.dtype == dw.dtype == dtype and dx.shape == x.shape and dw.shape == w.shape
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    # the forward's arithmetic and roundings are the operators': equal but for rsqrt's last bit
    assert rel_error(y, ty) < ulp / 4, (rel_error(y, ty), tiling(width))
    assert rel_error(y, ry) <= 1.05 * rel_error(ty, ry) + 1e-6
    # the gradients in float32 throughout, each rounded once: at least as close as the operators'
    # (up to a rounding's chance in few elements), and at the correctly rounded result's error
    for got, ops, ref in ((dx, tdx, rdx), (dw, tdw, rdw)):
        assert rel_error(got, ref) <= 1.05 * rel_error(ops, ref) + ulp / ref.numel() ** 0.5, (
            rel_error(got, ref), rel_error(ops, ref))
        assert rel_error(got, ref) <= 1.05 * rel_error(ref.to(dtype), ref) + 1e-6


def test_large_rows_and_leading_dimensions():
    """A training step's shapes: (batch, sequence, hidden), and Qwen3's per-head norms over
    (batch, sequence, heads, 128), 262,144 rows."""
    for shape in [(4, 2048, 4096), (4, 2048, 32, 128)]:
        x, w, dy = inputs(shape, torch.bfloat16)
        y, dx, dw = run(nht.rms_norm, x, w, dy)
        ty, tdx, tdw = run(operators, x, w, dy)
        assert y.shape == dx.shape == shape
        assert rel_error(y, ty) < 2.0 ** -10 and rel_error(dx, tdx) < 2.0 ** -7 and rel_error(dw, tdw) < 2.0 ** -7


def test_strided_x_and_a_frozen_weight():
    x, w, dy = inputs((64, 3, 256), torch.bfloat16)
    xt = x.detach().transpose(0, 1).requires_grad_()  # not contiguous: copied for the kernels
    y = nht.rms_norm(xt, w)
    y.backward(dy.transpose(0, 1))
    assert rel_error(y, operators(xt.detach(), w)) < 2.0 ** -10
    ref = xt.detach().clone().requires_grad_()
    operators(ref, w).backward(dy.transpose(0, 1))
    assert rel_error(xt.grad, ref.grad) < 2.0 ** -7


@pytest.mark.parametrize("case", ["width 12", "f32", "mixed", "empty", "no grad"])
def test_inputs_the_kernels_do_not_take_run_the_operators(case):
    dtype, width, rows = torch.bfloat16, 256, 5
    if case == "width 12":
        width = 12
    x, w, dy = inputs((rows, width), torch.float32 if case == "f32" else dtype)
    if case == "mixed":
        w = w.float()
    if case == "empty":
        x, dy = x[:0], dy[:0]
    if case == "no grad":
        with torch.no_grad():
            assert rel_error(nht.rms_norm(x, w), operators(x, w)) < 2.0 ** -10
        return
    y, dx, dw = run(nht.rms_norm, x, w, dy)
    ty, tdx, tdw = run(operators, x, w, dy)
    assert y.dtype == ty.dtype and y.shape == ty.shape
    if case != "empty":
        assert rel_error(y, ty) < 2.0 ** -10 and rel_error(dx, tdx) < 2.0 ** -7 and rel_error(dw, tdw) < 2.0 ** -7


def test_second_derivative():
    x, w, dy = inputs((16, 64), torch.float32)
    x, w = x.to(torch.bfloat16).requires_grad_(), w.to(torch.bfloat16).requires_grad_()
    (gx,) = torch.autograd.grad(nht.rms_norm(x, w), x, dy.to(torch.bfloat16), create_graph=True)
    (ggw,) = torch.autograd.grad(gx.float().square().sum(), w)
    x2, w2 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (rx,) = torch.autograd.grad(float64(x2, w2), x2, dy.double(), create_graph=True)
    (rgw,) = torch.autograd.grad(rx.square().sum(), w2)
    assert rel_error(ggw, rgw) < 0.05


@pytest.mark.parametrize("family", ["Llama", "Qwen3"])
def test_fused_norms_in_a_transformers_model(family):
    """A small model's loss and gradients with its norms swapped against the stock model's, and the
    number swapped (Qwen3 normalizes each head's queries and keys too)."""
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, f"{family}Config")(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, head_dim=64, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        stock = getattr(transformers, f"{family}ForCausalLM")(config).to(torch.bfloat16).train()
    ours = copy.deepcopy(stock)
    assert nht.fuse_rms_norms(ours) == (5 if family == "Llama" else 9)
    assert nht.fuse_rms_norms(ours) == 0
    ids = torch.randint(0, 1000, (2, 64), device="cuda")
    losses, grads = [], []
    for model in (stock, ours):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(model.model.layers[0].input_layernorm.weight.grad)
    assert abs(losses[0] - losses[1]) < 1e-2 * abs(losses[0])
    assert rel_error(grads[1], grads[0]) < 0.02


def test_the_norm_never_waits_for_the_gpu():
    x, w, dy = inputs((512, 2048), torch.bfloat16)
    x.requires_grad_()
    w.requires_grad_()  # the weight gradient's column sum too
    nht.rms_norm(x, w).backward(dy)  # first call: compile and prepare
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the GPU busy for ~0.1 s
    torch.cuda.set_sync_debug_mode("error")
    try:
        nht.rms_norm(x, w).backward(dy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
