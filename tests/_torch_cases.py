"""Checks shared by the CPU (stand-in GEMM) and GPU tests of ``numba_hopper.torch``."""

from __future__ import annotations

import copy

import torch

import numba_hopper.torch as nht

OPS = {"mm": nht.mm, "addmm": nht.addmm, "bmm": nht.bmm, "baddbmm": nht.baddbmm, "matmul": nht.matmul}
RAW_OPS = ("mm", "addmm", "bmm", "baddbmm")  # the OpInfo ops the raw API (numba_hopper.gemm, bmm) computes
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_error(got, ref):
    """Relative norm error against a float64 reference (absolute where the reference is 0)."""
    diff = (got.double() - ref.double()).norm().item()
    scale = ref.double().norm().item()
    return diff / scale if scale else diff


def opinfo_samples(device, dtype, requires_grad, names=tuple(OPS)):
    """``(name, op, sample)`` for PyTorch's OpInfo samples of the ops ``names``."""
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if op.name in names:
            for sample in op.sample_inputs(device, dtype, requires_grad=requires_grad):
                yield f"{op.name}.{op.variant_test_name or 'default'}", op, sample


def sample_counts(device, dtype, requires_grad, raw=False):
    """Run every OpInfo sample through ``numba_hopper.torch`` (:func:`check_sample`) or, ``raw``,
    those of ``RAW_OPS`` through the raw API (:func:`check_raw_sample`, forward only); return
    ``({op: {"samples": n, "refused": n, "wrong": n}}, failures)``: a refusal is an exception
    raised by the call, a wrong answer a failed check of its result."""
    counts, failures = {}, []
    names, check = (RAW_OPS, check_raw_sample) if raw else (tuple(OPS), check_sample)
    for name, op, sample in opinfo_samples(device, dtype, requires_grad and not raw, names):
        row = counts.setdefault(op.name, {"samples": 0, "refused": 0, "wrong": 0})
        row["samples"] += 1
        try:
            check(op, sample, dtype)
        except AssertionError as e:
            row["wrong"] += 1
            failures.append(f"{name} sample {sample}: {e}")
        except Exception as e:  # noqa: BLE001 (any exception is a refusal, counted)
            row["refused"] += 1
            failures.append(f"{name} sample {sample}: {e!r}")
    return counts, failures


def check_all_samples(device, dtype, requires_grad, raw=False):
    """:func:`sample_counts`, printed; every op must have samples, none refused or wrong."""
    counts, failures = sample_counts(device, dtype, requires_grad, raw)
    path = "numba_hopper.gemm/bmm" if raw else "numba_hopper.torch"
    print(f"OpInfo samples through {path}, {dtype}, requires_grad={requires_grad and not raw}: {counts}")
    assert not failures, f"{len(failures)} of {sum(r['samples'] for r in counts.values())}: {failures[:5]}"
    assert set(counts) == set(RAW_OPS if raw else OPS), counts
    return counts


def raw_call(name, inputs, kwargs):
    """An OpInfo sample of ``name`` through the raw API, looked up in ``numba_hopper.matmul.api``
    at call time (so the CPU stand-in applies): ``mm`` is ``gemm(a, b)``; ``addmm`` is ``gemm``
    with its ``input`` as the bias (N values, (1, N), or (M, 1), when ``beta == 1``),
    else as ``c`` (broadcast to (M, N): a stride-0 view is copied) with ``alpha`` and ``beta``;
    ``bmm`` is ``bmm``; ``baddbmm`` is ``bmm`` into f32 and ``alpha * p + beta * input`` by torch,
    as ``numba_hopper.torch.baddbmm`` computes it."""
    from numba_hopper.matmul import api

    if name in ("mm", "bmm"):
        return getattr(api, "gemm" if name == "mm" else "bmm")(*inputs)
    inp, x, y = inputs
    alpha, beta = kwargs.get("alpha", 1), kwargs.get("beta", 1)
    if name == "addmm":
        m, n = x.shape[0], y.shape[1]
        if beta == 1 and tuple(inp.shape) in ((n,), (1, n), (m, 1)):
            return api.gemm(x, y, bias=inp, alpha=alpha)
        return api.gemm(x, y, c=inp.expand(m, n), alpha=alpha, beta=beta)
    product = alpha * api.bmm(x, y, out_dtype="f32")
    return (product if beta == 0 else product + beta * inp.float()).to(x.dtype)


def check_raw_sample(op, sample, dtype):
    """Run one OpInfo sample through the raw API (:func:`raw_call`) and torch; raise
    AssertionError on a wrong shape, dtype or value (against torch's op in float64)."""
    inputs = [sample.input, *sample.args]
    with torch.no_grad():
        got = raw_call(op.name, inputs, sample.kwargs)
        expected = op(*inputs, **sample.kwargs)
        ref = op(*[_double_leaf(t) for t in inputs], **sample.kwargs)
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape, got.dtype)
    err = rel_error(got, ref)
    assert err < TOLERANCE[dtype], f"forward rel. error {err:.2e}"


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


class SwiGLU(torch.nn.Module):
    """A Llama MLP, ``down(silu(gate(x)) * up(x))``, whose down projection may have a bias."""

    def __init__(self, hidden, inner, device, dtype, bias=False):
        super().__init__()
        self.gate_proj, self.up_proj = (torch.nn.Linear(hidden, inner, False, device, dtype) for _ in range(2))
        self.down_proj = torch.nn.Linear(inner, hidden, bias, device, dtype)
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def gated_mlp_errors(device, dtype, shape, hidden=64, inner=96, bias=False, compiled=False):
    """``fuse_gated_mlps(fused_training=True)``' training path against the stock MLP in float64 on one fresh batch of
    ``shape`` (..., hidden): ``{"y": error, "x": error, parameter name: error}``. ``compiled``:
    through ``torch.compile(fullgraph=True)``."""
    torch.manual_seed(sum(shape))
    model = torch.nn.Sequential(SwiGLU(hidden, inner, device, dtype, bias))
    ref = copy.deepcopy(model).double()
    assert nht.fuse_gated_mlps(model, fused_training=True) == 1
    x = torch.randn(*shape, device=device, dtype=dtype).requires_grad_()
    xr = x.detach().double().requires_grad_()
    y = (torch.compile(model, fullgraph=True) if compiled else model)(x)
    yr = ref(xr)
    dy = torch.randn_like(yr)
    y.backward(dy.to(dtype))
    yr.backward(dy)
    errors = {"y": rel_error(y, yr), "x": rel_error(x.grad, xr.grad)}
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        errors[name] = rel_error(p.grad, r.grad)
    return errors
