"""A CPU stand-in for ``numba_hopper.gemm`` / ``gemm_sum`` / ``gemm_glu_backward`` / ``bmm`` on PyTorch
tensors, for testing the PyTorch layer (``numba_hopper.torch``) and the raw API's contract without a GPU.

A call runs the real ``numba_hopper.gemm`` / ``bmm`` on its CPU tensors, seen as device 0:
every check, the output it makes, and the plan it would run, built for an H100's limits
(``tools.prebuild.H100``) and kept in :data:`PLANS` instead of launched. Then it computes the
result in float64 and writes it where the kernel would (``out``, ``aux_out``). So whatever the
real API refuses (a dtype, a shape, a bias that fits neither side, ...), the stand-in refuses
the same way, and the PyTorch layer gets the real API's outputs. Install it with
:func:`install`.
"""

from __future__ import annotations

import math

import torch

from numba_hopper.matmul import api, heuristics, plan as _plan, plan_cache
from numba_hopper.runtime import arrays
from numba_hopper.tools import prebuild

_ACT = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
}
_REAL_GEMM, _REAL_GEMM_SUM, _REAL_BMM, _REAL_FROM_TORCH = api.gemm, api.gemm_sum, api.bmm, arrays._from_torch
_REAL_GLU_BACKWARD = api.gemm_glu_backward
PLANS = []  # the plan of each call, in order (the latest last)


class _OnDevice0:
    """A CPU tensor as the CUDA tensor on device 0 that ``arrays._from_torch`` reads."""

    device = torch.device("cuda", 0)

    def __init__(self, t):
        self._t = t

    def __getattr__(self, name):
        return getattr(self._t, name)


def _from_torch(t, dtype):
    return _REAL_FROM_TORCH(_OnDevice0(t) if t.device.type == "cpu" else t, dtype)


def _reference(a, b, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None, up=None, **_):
    """``(out, pre)`` in float64: the fused epilogue and the value before the activation."""
    m, n = math.prod(a.shape[:-1]), b.shape[-1]
    a2 = a.detach().double().reshape(m, a.shape[-1])
    if up is not None:
        gate, up = a2 @ b.double(), a2 @ up.double()
        return _ACT[activation](gate) * up, torch.cat([gate, up], dim=1)
    acc = alpha * (a2 @ b.double())
    if c is not None and beta != 0:
        acc = acc + beta * c.double().reshape(m, n)
    if bias is not None:  # numba_hopper's rule: 1-D by bias_dim (per column by default), or (M, 1) / (1, N)
        v = bias.double()
        acc = acc + (v if v.dim() == 2 else v[:, None] if bias_dim == 0 else v[None, :])
    return _ACT[activation](acc), acc


def gemm(a, b, out=None, **kw):
    """``numba_hopper.gemm``'s checks and plan (recorded), then the product in float64."""
    result = _REAL_GEMM(a, b, out, stream=0, **kw)
    value, pre = _reference(a, b, **kw)
    if kw.get("aux_out") is not None:
        kw["aux_out"].copy_(pre.reshape(kw["aux_out"].shape))
    return result.copy_(value.reshape(result.shape))


def gemm_sum(pairs, out=None, **kw):
    """``numba_hopper.gemm_sum``'s checks and plan (recorded), then the sum in float64."""
    result = _REAL_GEMM_SUM(pairs, out, stream=0, **kw)
    return result.copy_(sum(a.detach().double() @ b.detach().double() for a, b in pairs))


def gemm_glu_backward(a, b, gate, up, out=None, out_up=None, **kw):
    """``numba_hopper.gemm_glu_backward``'s checks and plan (recorded), then both gradients in float64."""
    d_gate, d_up = _REAL_GLU_BACKWARD(a, b, gate, up, out, out_up, stream=0, **kw)
    dh, g, u = a.detach().double() @ b.detach().double(), gate.double(), up.double()
    s = torch.sigmoid(g)
    return d_gate.copy_(dh * u * s * (1 + g * (1 - s))), d_up.copy_(dh * g * s)


def bmm(a, b, out=None, **kw):
    """``numba_hopper.bmm``'s checks and plan (recorded), then the product in float64."""
    result = _REAL_BMM(a, b, out, stream=0, **kw)
    return result.copy_(a.detach().double() @ b.detach().double())


def install(monkeypatch):
    """Route ``numba_hopper.matmul.api.gemm`` / ``gemm_sum`` / ``gemm_glu_backward`` / ``bmm`` (what
    ``numba_hopper.torch`` calls, and what tests of the raw API call through ``api``) to this stand-in
    for the test."""
    monkeypatch.setattr(arrays, "_from_torch", _from_torch)
    monkeypatch.setattr(plan_cache, "hopper_device_reason", lambda: None)
    monkeypatch.setattr(plan_cache, "current_torch_stream", lambda device: lambda: 0)
    for module in (_plan, heuristics):
        monkeypatch.setattr(module, "device_limits", lambda device=0: prebuild.H100)
    monkeypatch.setattr(_plan.Plan, "__call__", lambda plan, stream, values: PLANS.append(plan))
    plans = {}  # this test's plans (their tensors are the CPU's), apart from the process's
    monkeypatch.setattr(plan_cache, "plans", plans)
    monkeypatch.setattr(api, "plans", plans)
    PLANS.clear()
    monkeypatch.setattr(api, "gemm", _no_grad(gemm))
    monkeypatch.setattr(api, "gemm_sum", _no_grad(gemm_sum))
    monkeypatch.setattr(api, "gemm_glu_backward", _no_grad(gemm_glu_backward))
    monkeypatch.setattr(api, "bmm", _no_grad(bmm))


def _no_grad(fn):
    """``fn`` recording no autograd graph, as the GPU kernels record none: gradients must come
    from ``numba_hopper.torch``'s formulas."""
    return torch.no_grad()(fn)
