"""``linear`` and ``Linear``: ``nn.Linear`` on numba_hopper's GEMM, forward and backward.

The forward is one kernel: ``act(x @ weight.T + bias)``, the weight read in place (a
column-major B). When a gradient is needed and there is an activation, the same kernel also
writes the value before the activation, which the activation's backward reads. The backward
runs dX = dY W and dW = dY^T X on numba_hopper's GEMMs, and db = sum(dY) with torch.

Traced (``torch.compile``, ``torch.export``), a linear is the custom operators of
:mod:`numba_hopper.torch.ops` (``numba_hopper::gemm_aux`` where there is an activation to
differentiate). Eagerly with a gradient, it is one ``torch.autograd.Function`` whose forward
and backward call :func:`numba_hopper.gemm` directly: no reshape, transpose or operator layer
of its own in the autograd graph (which took a quarter of a linear's host time, forward and
backward: ``python benchmarks/bench_overhead.py``).
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..matmul import api as _matmul
from . import ops, training

__all__ = ["linear", "Linear", "replace_linear"]


def linear(x, weight, bias=None, activation=None):
    """``act(torch.nn.functional.linear(x, weight, bias))`` with ``activation`` None, "relu",
    "gelu", "gelu_tanh", "silu" or "sigmoid"; ``x`` (..., in), ``weight`` (out, in), bf16/fp16."""
    tensors = (x, weight, bias)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
            and (bias is None or isinstance(bias, torch.Tensor))):
        raise TypeError(f"linear: expected Tensor arguments, got {', '.join(type(t).__name__ for t in tensors)}")
    if weight.dim() != 2:
        if weight.dim() == 1:  # F.linear's 1-D weight: one output feature, squeezed
            b = None if bias is None else bias.reshape(1)
            return linear(x, weight.unsqueeze(0), b, activation).squeeze(-1)
        raise ShapeError(f"linear: weight must be (out, in) or (in,); got shape {tuple(weight.shape)}")
    needs_grad = ops.needs_grad(tensors)
    if x.dim() > 1 and not needs_grad and not ops.tracing(tensors):
        # Eager inference: numba_hopper.gemm reads x's leading dimensions as rows, so no
        # reshape either side (host time: this is F.linear's place).
        return _matmul.gemm(x, weight.t(), bias=bias, activation=activation)
    if x.dim() > 1 and needs_grad and not ops.tracing(tensors):
        return _LinearFunction.apply(x, weight, bias, activation)
    return _linear_ops(x, weight, bias, activation, needs_grad)


def _linear_ops(x, weight, bias, activation, needs_grad):
    """The linear as the custom operators (what a trace records), differentiable through their
    autograd formulas."""
    x2 = x.flatten(0, -2) if x.dim() > 1 else x.unsqueeze(0)
    if activation is not None and needs_grad:
        y, _ = ops.gemm_aux(x2, weight.t(), bias=bias, activation=activation)
    else:
        y = ops.gemm(x2, weight.t(), bias=bias, activation=activation)
    return y.view(*x.shape[:-1], weight.shape[0])


class _LinearFunction(torch.autograd.Function):
    """The eager linear with a gradient: ``x`` (..., in) read as rows, the pre-activation
    kept (written by the forward's kernel) only where there is an activation; its products in
    ``training.GEMM_CONFIG``'s tiles."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation):
        pre = x.new_empty((*x.shape[:-1], weight.shape[0])) if activation is not None else None
        y = _matmul.gemm(x, weight.t(), bias=bias, activation=activation, aux_out=pre,
                         config=training.GEMM_CONFIG)
        ctx.save_for_backward(x, weight, bias, pre)
        ctx.activation = activation
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, pre = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: through the operators' formulas
            return ops.differentiable_backward(
                ctx, dy, (x, weight, bias), lambda *xwb: _linear_ops(*xwb, ctx.activation, needs_grad=True))
        d = ops.ACTIVATION_BACKWARD[ctx.activation](dy, pre) if ctx.activation else dy
        d2 = d.contiguous().view(-1, weight.shape[0])
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        config = training.GEMM_CONFIG
        dx = _matmul.gemm(d2, weight, config=config).view(x.shape) if need_x else None
        dw = _matmul.gemm(d2.t(), x.reshape(-1, x.shape[-1]), config=config) if need_w else None  # (out, in), row-major
        db = d2.sum(0).to(bias.dtype) if need_b else None
        return dx, dw, db, None


class Linear(torch.nn.Linear):
    """A drop-in ``nn.Linear`` (the same parameters and ``state_dict``) whose forward and
    backward run on numba_hopper, with an optional fused ``activation``."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, activation=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self):
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")

    @classmethod
    def from_linear(cls, module: torch.nn.Linear, activation=None):
        """A ``Linear`` sharing ``module``'s parameters (the same tensors: an optimizer built
        on the old module keeps working)."""
        new = cls(module.in_features, module.out_features, bias=module.bias is not None, device="meta",
                  activation=activation)
        new.weight, new.bias = module.weight, module.bias
        return new.train(module.training)


def replace_linear(model: torch.nn.Module) -> int:
    """Swap every ``nn.Linear`` inside ``model`` for a :class:`Linear` sharing its parameters,
    in place; return how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and not isinstance(child, Linear):
                setattr(parent, name, Linear.from_linear(child))
                swapped += 1
    return swapped
