"""Checks shared by the CPU (stand-in GEMM) and GPU tests of ``numba_hopper.torch``."""

from __future__ import annotations

import copy

import torch

import numba_hopper.torch as nht

OPS = {"mm": nht.mm, "addmm": nht.addmm, "bmm": nht.bmm, "baddbmm": nht.baddbmm, "matmul": nht.matmul}
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_error(got, ref):
    """Relative norm error against a float64 reference (absolute where the reference is 0)."""
    diff = (got.double() - ref.double()).norm().item()
    scale = ref.double().norm().item()
    return diff / scale if scale else diff


def opinfo_samples(device, dtype, requires_grad):
    """``(name, op, sample)`` for PyTorch's OpInfo samples of mm, addmm, bmm, baddbmm, matmul."""
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if op.name in OPS:
            for sample in op.sample_inputs(device, dtype, requires_grad=requires_grad):
                yield f"{op.name}.{op.variant_test_name or 'default'}", op, sample


def check_all_samples(device, dtype, requires_grad):
    """:func:`check_sample` on every OpInfo sample; every op must have samples, none refused."""
    seen = {}
    for name, op, sample in opinfo_samples(device, dtype, requires_grad):
        try:
            check_sample(op, sample, dtype)
        except Exception as e:
            raise AssertionError(f"{name} sample {sample}: {e!r}") from e
        seen[op.name] = seen.get(op.name, 0) + 1
    assert set(seen) == set(OPS), seen


def _double_leaf(t):
    return t.detach().double().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t


def check_sample(op, sample, dtype):
    """Run one OpInfo sample through numba_hopper.torch and torch; raise AssertionError on a
    wrong shape, dtype, value or gradient. The reference is torch's op in float64."""
    ours = OPS[op.name]
    inputs = [sample.input, *sample.args]
    got = ours(*inputs, **sample.kwargs)
    expected = op(*inputs, **sample.kwargs)
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape, got.dtype)
    ref_inputs = [_double_leaf(t) for t in inputs]
    ref = op(*ref_inputs, **sample.kwargs)
    err = rel_error(got, ref)
    assert err < TOLERANCE[dtype], f"forward rel. error {err:.2e}"
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves or got.numel() == 0:
        return
    grad_out = torch.randn_like(got)
    grads = torch.autograd.grad(got, leaves, grad_out, allow_unused=True)
    ref_leaves = [r for t, r in zip(inputs, ref_inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
    ref_grads = torch.autograd.grad(ref, ref_leaves, grad_out.double(), allow_unused=True)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        if r is None or (g is None and r.numel() == 0):  # an empty gradient has no values to compare
            continue
        assert g is not None and g.shape == r.shape, f"gradient {i}: {None if g is None else g.shape} vs {r.shape}"
        err = rel_error(g, r)
        assert err < TOLERANCE[dtype], f"gradient {i} rel. error {err:.2e}"


class MLP(torch.nn.Module):
    """Linear + gelu_tanh, Linear, and a batched matmul: the model the compile and graph tests use."""

    def __init__(self, dim, hidden, device, dtype):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden, device=device, dtype=dtype)
        self.down = torch.nn.Linear(hidden, dim, bias=False, device=device, dtype=dtype)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x), approximate="tanh")
        y = self.down(h)
        return y + torch.matmul(y, y.transpose(-1, -2)) @ x / x.shape[-1]


class OurMLP(MLP):
    def __init__(self, stock):
        torch.nn.Module.__init__(self)
        self.up = nht.Linear.from_linear(stock.up, activation="gelu_tanh")
        self.down = nht.Linear.from_linear(stock.down)

    def forward(self, x):
        y = self.down(self.up(x))
        return y + nht.matmul(nht.matmul(y, y.transpose(-1, -2)), x) / x.shape[-1]


def models(device, dtype, dim=64, hidden=96):
    torch.manual_seed(0)
    stock = MLP(dim, hidden, device, dtype)
    return stock, OurMLP(copy.deepcopy(stock))


def training_losses(model, device, dtype, steps=40):
    """Losses of a short AdamW regression run (the same data for every model)."""
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(4, 33, 64, device=device, dtype=dtype, generator=gen)
    target = torch.randn(4, 33, 64, device=device, dtype=dtype, generator=gen) * 0.5
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), target.float())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
