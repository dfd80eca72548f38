"""``rms_norm``, ``RMSNorm`` and ``fuse_rms_norms``: transformers' RMSNorm, one kernel each way.

transformers' ``LlamaRMSNorm`` (and Qwen's, Mistral's and others' alike) is, in PyTorch
operators, ``weight * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)``:
eagerly eight kernels forward and about fifteen backward, each a pass over the hidden states, most
in float32, and each an operator's host time (`python benchmarks/bench_norm.py`). :func:`rms_norm`
computes the same arithmetic, with its two roundings, in one kernel forward and one (with a
small column sum for the weight's gradient) backward
(:mod:`numba_hopper.kernels.rms_norm`), and :func:`fuse_rms_norms` puts it in a model.

Under ``torch.compile`` (and any other trace) it is the operators above, which Inductor fuses into
its own kernels together with the residual additions around them. Inputs the kernels do not
take (other dtypes, a weight of another dtype, rows whose width is not a multiple of 8 or is
above ``MAX_WIDTH``, CPU tensors) run the same operators eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DeviceMismatchError, ShapeError
from ..kernels.rms_norm import MAX_WIDTH, THREADS, backward_kernel, column_sum_kernel, forward_kernel, tiling
from ..runtime.launch import device_limits
from ..runtime.operands import current_torch_stream
from . import ops
from ._launch import KERNEL_DTYPES, prepare

__all__ = ["rms_norm", "RMSNorm", "fuse_rms_norms"]

_FORWARD_CTAS_PER_SM = 2048 // THREADS  # enough to fill an SM; the grid strides over the rest
_BACKWARD_CTAS_PER_SM = 2  # each CTA adds a row of float32 partial sums for the weight's gradient


def rms_norm(x, weight, eps: float = 1e-6):
    """``weight * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)``,
    transformers' ``LlamaRMSNorm``; ``x`` (..., H), ``weight`` (H,). Differentiable in both (a
    second derivative through those operators).

    bf16/fp16 CUDA ``x`` and ``weight`` of one dtype, with H a multiple of 8 up to 8192, run the
    kernels; anything else, or a traced call, runs the operators. Raises ``ShapeError`` for a
    weight that is not (H,), ``DeviceMismatchError`` for tensors on two devices.
    """
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        raise TypeError(f"rms_norm: expected Tensor arguments, got {type(x).__name__}, {type(weight).__name__}")
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ShapeError(f"rms_norm: weight must be (H,) for x (..., H); got x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}")
    if x.device != weight.device:
        raise DeviceMismatchError(f"rms_norm: x and weight must be on one device; got {x.device}, {weight.device}")
    if ops.tracing((x, weight)) or not _runs_kernels(x, weight):
        return _operators(x, weight, eps)
    if ops.needs_grad((x, weight)):
        return _RMSNormFunction.apply(x, weight, float(eps))
    return _forward(x, weight, eps)[0]


def _operators(x, weight, eps):
    """transformers' arithmetic in PyTorch operators."""
    h = x.float()
    return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _runs_kernels(x, weight):
    width = x.shape[-1]
    return (x.is_cuda and x.dtype in KERNEL_DTYPES and weight.dtype == x.dtype and width % 8 == 0
            and 0 < width <= MAX_WIDTH and x.numel() > 0)


def _streamable(t):
    """``t`` contiguous and starting on 16 bytes, as the kernels' vector accesses need (copied if not)."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


class _Plan:
    """One row layout's launches, prepared at its first forward and backward: what a call
    would otherwise work out again (tilings, grids, kernels, argument layouts)."""

    __slots__ = ("rows", "width", "inv_width", "device", "stream", "forward", "backward", "column_sum",
                 "forward_grid", "backward_grid", "kernel_args")

    def __init__(self, x):
        self.width = x.shape[-1]
        self.rows = x.numel() // self.width
        self.inv_width = np.float32(1 / self.width)
        self.device = x.device
        self.stream = current_torch_stream(x.get_device())
        group, per_thread = tiling(self.width)
        self.kernel_args = (KERNEL_DTYPES[x.dtype], group, per_thread)
        ctas = -(-self.rows // (THREADS // group))
        sms = device_limits(x.get_device()).sm_count
        self.forward_grid = min(ctas, sms * _FORWARD_CTAS_PER_SM)
        self.backward_grid = min(ctas, sms * _BACKWARD_CTAS_PER_SM)
        self.forward = self.backward = self.column_sum = None


_PLANS = {}  # (shape, dtype, device index) -> _Plan


def _plan(x):
    key = (x.shape, x.dtype, x.get_device())
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= 256:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(x)
    return plan


def _forward(x, weight, eps):
    """``(y, rstd)``: the normalized rows and each row's float32 ``rsqrt(mean(x^2) + eps)``."""
    x, weight = _streamable(x), _streamable(weight)
    plan = _plan(x)
    y = torch.empty_like(x)
    rstd = x.new_empty(plan.rows, dtype=torch.float32)
    args = (x.data_ptr(), weight.data_ptr(), y.data_ptr(), rstd, plan.rows, plan.width, plan.inv_width,
            np.float32(eps))
    if plan.forward is None:  # prepared with rstd as an array (its layout), called with its address
        plan.forward = prepare(forward_kernel(*plan.kernel_args), plan.device, plan.forward_grid, THREADS, *args)
    plan.forward(plan.stream(), *args[:3], rstd.data_ptr(), *args[4:])
    return y, rstd


def _backward(dy, x, weight, rstd, weight_grad):
    """``(dx, dw)`` (``dw`` None unless ``weight_grad``)."""
    dy, x, weight = _streamable(dy), _streamable(x), _streamable(weight)
    plan = _plan(x)
    dx = torch.empty_like(x)
    partials = x.new_empty((plan.backward_grid, plan.width), dtype=torch.float32)
    args = (dy.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd, dx.data_ptr(), partials, plan.rows, plan.width,
            plan.inv_width)
    if plan.backward is None:  # (the float32 arrays as in _forward)
        plan.backward = prepare(backward_kernel(*plan.kernel_args), plan.device, plan.backward_grid, THREADS, *args)
        plan.column_sum = prepare(column_sum_kernel(plan.kernel_args[0]), plan.device, -(-plan.width // 32), THREADS,
                                  partials, 0, plan.width)
    stream = plan.stream()
    plan.backward(stream, *args[:3], rstd.data_ptr(), args[4], partials.data_ptr(), *args[6:])
    if not weight_grad:
        return dx, None
    dw = torch.empty_like(weight)
    plan.column_sum(stream, partials.data_ptr(), dw.data_ptr(), plan.width)
    return dx, dw


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        x = _streamable(x)  # saved as the kernels read it, so the backward reads it without a copy
        y, rstd = _forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: through the operators
            return ops.differentiable_backward(ctx, dy, (x, weight), lambda x, w: _operators(x, w, ctx.eps))
        dx, dw = _backward(dy, x, weight, rstd, ctx.needs_input_grad[1])
        return (dx if ctx.needs_input_grad[0] else None), dw, None


class RMSNorm(torch.nn.Module):
    """transformers' ``LlamaRMSNorm`` on :func:`rms_norm`: the same parameter (``weight``),
    attribute (``variance_epsilon``) and ``state_dict``."""

    def __init__(self, hidden_size, eps=1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"

    @classmethod
    def from_module(cls, module):
        """An ``RMSNorm`` sharing ``module``'s ``weight`` (the same tensor: an optimizer built on
        the old module keeps working)."""
        new = cls(module.weight.shape[0], module.variance_epsilon, device="meta")
        new.weight = module.weight
        return new.train(module.training)


def _is_rms_norm(module):
    """An RMSNorm with LlamaRMSNorm's arithmetic: its class named ``*RMSNorm``, a 1-D ``weight``
    and a ``variance_epsilon`` (Gemma's, ``(1 + weight)`` with an ``eps``, is not one)."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("RMSNorm") and not isinstance(module, RMSNorm)
            and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float))


def fuse_rms_norms(model: torch.nn.Module) -> int:
    """Swap every RMSNorm inside ``model`` with LlamaRMSNorm's arithmetic (Llama, Qwen2, Qwen3,
    Mistral: the hidden states' norms and Qwen3's per-head query and key norms) for an
    :class:`RMSNorm` sharing its weight, in place; return how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_rms_norm(child):
                setattr(parent, name, RMSNorm.from_module(child))
                swapped += 1
    return swapped
