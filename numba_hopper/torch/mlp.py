"""Gated MLPs (SwiGLU: ``down(silu(gate(x)) * up(x))``, as Llama, Mistral and Qwen2 define them) on one
gated GEMM: :class:`GatedMLP` and :func:`fuse_gated_mlps`.

In inference (no gradient needed) the gate and up products and the SiLU-and-multiply between them
are one kernel, ``numba_hopper.gemm(x, gate.weight.t(), up=up.weight.t(), activation="silu")``,
which writes only the gated output; eagerly, in a CUDA graph and traced. ``torch.compile`` of an
unfused MLP gets the same kernel from Inductor's pass (``_post_grad``).

When a gradient is needed the MLP runs its three linears, unless it was made with
``fused_training=True``: then the whole MLP is the operator ``numba_hopper::gated_mlp`` (eagerly,
one ``torch.autograd.Function`` with the same formula):

- forward, two kernels: the gated GEMM, which also keeps both products (``aux_out``: the
  backward reads them), then the down projection;
- backward, six GEMMs and nothing else: ``dy @ W_down`` with the gated unit's derivative in its
  epilogue (``numba_hopper.gemm_glu_backward``: it writes the gradients of both products, never
  ``dh``), ``dy^T h``, ``dx`` as two products into one output, and the two weights' gradients.

That is two launches and one autograd node forward where the linears take four and four, and
six launches backward where they take nine or more. Every product and gradient goes through TMA:
at Qwen3-4B's widths and 8192 tokens the forward's gated GEMM takes 1.25 ms against 1.33 for two
GEMMs and Inductor's SiLU-and-multiply, and ``dy @ W_down`` with the derivative 0.75 ms against
0.79 for the GEMM and Inductor's derivative (``python benchmarks/bench_gated_training.py``). It is
opt-in: a compiled step with the three linears gets both kernels from Inductor's post-grad pass
anyway (``_post_grad``).
"""

from __future__ import annotations

import torch

from ..matmul import api as _matmul
from . import ops, training
from .linear import Linear, linear

__all__ = ["GatedMLP", "fuse_gated_mlps", "gated_mlp"]

_TRAINED_DTYPES = (torch.bfloat16, torch.float16)


def _gated_mlp_impl(x, w_gate, w_up, w_down, b_down):
    """``(y, h, pre)``: the MLP's output, the gated activation and both products (gate's, up's)."""
    pre = x.new_empty((x.shape[0], 2 * w_gate.shape[0]))
    h = _matmul.gemm(x, w_gate.t(), up=w_up.t(), activation="silu", aux_out=pre)
    return _matmul.gemm(h, w_down.t(), bias=b_down), h, pre


def _gated_mlp_fake(x, w_gate, w_up, w_down, b_down):
    n = w_gate.shape[0]
    return x.new_empty((x.shape[0], w_down.shape[0])), x.new_empty((x.shape[0], n)), x.new_empty((x.shape[0], 2 * n))


def _gated_mlp_backward_impl(dy, x, w_gate, w_up, w_down, pre, h):
    """``(dx, d_gate_weight, d_up_weight, d_down_weight)``, the plain products in the training
    tiles (``training.GEMM_CONFIG``)."""
    n = w_gate.shape[0]
    d_gate, d_up = _matmul.gemm_glu_backward(dy, w_down, pre[:, :n], pre[:, n:])
    train = training.GEMM_CONFIG
    dx = _matmul.gemm(d_gate, w_gate, config=train)
    _matmul.gemm(d_up, w_up, c=dx, beta=1.0, out=dx)
    dw = [_matmul.gemm(d.t(), a, config=train) for d, a in ((d_gate, x), (d_up, x), (dy, h))]
    return dx, *dw


def _gated_mlp_backward_fake(dy, x, w_gate, w_up, w_down, pre, h):
    return x.new_empty(x.shape), w_gate.new_empty(w_gate.shape), w_up.new_empty(w_up.shape), \
        w_down.new_empty(w_down.shape)


def _setup(ctx, inputs, output):
    x, w_gate, w_up, w_down, b_down = inputs
    _, h, pre = output
    ctx.save_for_backward(x, w_gate, w_up, w_down, b_down, pre, h)
    ctx.mark_non_differentiable(h, pre)
    ctx.set_materialize_grads(False)  # (h's and pre's gradients: None, not zeros)


def _grads(ctx, dy, *_):
    x, w_gate, w_up, w_down, b_down, pre, h = ctx.saved_tensors
    if dy is None:
        return None, None, None, None, None
    if torch.is_grad_enabled():  # create_graph=True: through the unfused MLP's formulas
        return ops.differentiable_backward(ctx, dy, (x, w_gate, w_up, w_down, b_down), _unfused)
    dy = dy.contiguous()
    dx, dwg, dwu, dwd = _gated_mlp_backward(dy, x, w_gate, w_up, w_down, pre, h)
    db = dy.sum(0, dtype=torch.float32).to(b_down.dtype) if b_down is not None and ctx.needs_input_grad[4] else None
    return dx, dwg, dwu, dwd, db


def _unfused(x, w_gate, w_up, w_down, b_down):
    return linear(torch.nn.functional.silu(linear(x, w_gate)) * linear(x, w_up), w_down, b_down)


_MLP = "Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor? b_down"
_gated_mlp_op = ops.define_op("gated_mlp", f"({_MLP}) -> (Tensor, Tensor, Tensor)", _gated_mlp_impl,
                              _gated_mlp_fake, _grads, _setup)
_gated_mlp_backward_op = ops.define_op(
    "gated_mlp_backward", "(Tensor dy, Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor pre, Tensor h) "
    "-> (Tensor, Tensor, Tensor, Tensor)", _gated_mlp_backward_impl, _gated_mlp_backward_fake)
_GatedMlpFunction = ops.eager_function("_GatedMlpFunction", _gated_mlp_impl, _grads, _setup)


def _gated_mlp_backward(*inputs):
    return (_gated_mlp_backward_op if ops.tracing(inputs) else _gated_mlp_backward_impl)(*inputs)


def gated_mlp(x, w_gate, w_up, w_down, b_down=None):
    """``F.linear(silu(x @ w_gate.T) * (x @ w_up.T), w_down, b_down)`` for a 2-D ``x`` (tokens,
    hidden), differentiable: the operator ``numba_hopper::gated_mlp`` (module doc). 16-bit
    tensors of one dtype; weights row-major ``(out, in)`` as ``nn.Linear`` keeps them."""
    inputs = (x, w_gate, w_up, w_down, b_down)
    return ops.call_op(_gated_mlp_op, None, _GatedMlpFunction, _gated_mlp_impl, inputs, inputs)[0]


class GatedMLP(torch.nn.Module):
    """An MLP with Linear ``gate_proj``, ``up_proj`` (no bias) and ``down_proj``, and a SiLU ``act_fn``,
    run as one gated GEMM and the down projection. The same submodules, parameters and ``state_dict``
    keys as the module it is made from (:meth:`from_mlp`)."""

    def __init__(self, gate_proj, up_proj, down_proj, act_fn, fused_training=False):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = gate_proj, up_proj, down_proj, act_fn
        self.fused_training = fused_training

    @classmethod
    def from_mlp(cls, mlp, fused_training=False):
        return cls(mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn, fused_training).train(mlp.training)

    def forward(self, x):
        gate, up, down = self.gate_proj.weight, self.up_proj.weight, self.down_proj
        if ops.needs_grad((x, gate, up, down.weight, down.bias)):
            if self.fused_training and x.dim() >= 2 and x.dtype in _TRAINED_DTYPES \
                    and getattr(down, "activation", None) is None \
                    and all(t.dtype == x.dtype for t in (gate, up, down.weight)):
                y = gated_mlp(x.flatten(0, -2), gate, up, down.weight, down.bias)
                return y.view(*x.shape[:-1], y.shape[-1])
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        if x.dim() < 2:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        if ops.tracing((x, gate, up)):
            gated = ops.gated_mm(x.flatten(0, -2), gate.t(), up.t(), "silu").view(*x.shape[:-1], gate.shape[0])
        else:  # (numba_hopper.gemm reads x's leading dimensions as rows)
            gated = _matmul.gemm(x, gate.t(), up=up.t(), activation="silu")
        return self.down_proj(gated)


# torch's, and transformers' for hidden_act="silu" (a module whose forward is F.silu)
_SILU_CLASSES = ("SiLU", "SiLUActivation")


def _is_gated_mlp(m):
    linears = [getattr(m, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (not isinstance(m, GatedMLP) and all(isinstance(lin, torch.nn.Linear) for lin in linears)
            and linears[0].bias is None and linears[1].bias is None
            and linears[0].weight.shape == linears[1].weight.shape
            and type(getattr(m, "act_fn", None)).__name__ in _SILU_CLASSES)


def fuse_gated_mlps(model: torch.nn.Module, fused_training: bool = False) -> int:
    """Replace, in place, every SwiGLU MLP inside ``model`` (a module with ``gate_proj``,
    ``up_proj`` and ``down_proj`` Linears, the first two without bias, and a SiLU ``act_fn``:
    ``nn.SiLU`` or transformers' ``SiLUActivation``) by a :class:`GatedMLP` of the same
    submodules, its linears swapped for :class:`~numba_hopper.torch.Linear`; return how many.
    ``fused_training``: with a gradient too, the operator ``numba_hopper::gated_mlp`` (module
    doc) in place of the three linears."""
    fused = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_gated_mlp(child):
                for lin in ("gate_proj", "up_proj", "down_proj"):
                    if not isinstance(getattr(child, lin), Linear):
                        setattr(child, lin, Linear.from_linear(getattr(child, lin)))
                setattr(parent, name, GatedMLP.from_mlp(child, fused_training))
                fused += 1
    return fused
