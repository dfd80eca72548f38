"""The custom operators: ``torch.ops.numba_hopper.gemm``, ``gemm_aux`` and ``bmm``.

Registered with ``torch.library.custom_op``, each with a fake (meta) implementation, so that
``torch.compile`` traces through them with no graph break and AOTAutograd can build their
backward; each has its autograd formula (``register_autograd``), whose GEMMs are these ops
again. They run :func:`numba_hopper.gemm` / :func:`numba_hopper.bmm` on PyTorch's current
stream, so ``torch.cuda.graph`` captures them (warm up first: a first call compiles).

- ``gemm(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype)``:
  ``act(alpha * a @ b + beta * c + bias)``, a new row-major (M, N) tensor.
- ``gemm_aux(...)``: the same, returning ``(out, pre)`` where ``pre`` is the value before the
  activation (written by the same kernel's epilogue): what the activation's backward reads.
  ``gemm`` with an activation has no backward; :func:`numba_hopper.torch.linear` calls
  ``gemm_aux`` when a gradient is needed.
- ``bmm(a, b, out_dtype)``: (B, M, K) x (B, K, N). Operands TMA cannot address (a row pitch or
  batch stride that is not a multiple of 16 bytes, as in (10, 5, 10) bf16) are first copied
  into padded tensors, and an N whose row is not a multiple of 16 bytes computes into a padded
  output then copies out: up to three extra copies, each one read and one write of that
  operand (torch.bmm makes none).

The backward computes each gradient in its input's layout (a column-major ``b``, such as
``weight.t()``, gets a column-major gradient), so AccumulateGrad needs no layout copy.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import matmul as _matmul
from ..errors import ShapeError

__all__ = ["gemm", "gemm_aux", "bmm", "DTYPE_NAMES"]

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _core_gemm(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype, aux_out=None):
    return _matmul.gemm(a, b, c=c, bias=bias, alpha=alpha, beta=beta if c is not None else 0.0,
                        bias_dim=bias_dim if bias is not None else None, activation=activation,
                        out_dtype=DTYPE_NAMES.get(out_dtype, out_dtype), aux_out=aux_out)


def _out_like(a, b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


@torch.library.custom_op("numba_hopper::gemm", mutates_args=())
def gemm(a: Tensor, b: Tensor, c: Optional[Tensor] = None, bias: Optional[Tensor] = None, alpha: float = 1.0,
         beta: float = 0.0, bias_dim: int = 1, activation: Optional[str] = None,
         out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return _core_gemm(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype)


@torch.library.custom_op("numba_hopper::gemm_aux", mutates_args=())
def gemm_aux(a: Tensor, b: Tensor, c: Optional[Tensor] = None, bias: Optional[Tensor] = None,
             alpha: float = 1.0, beta: float = 0.0, bias_dim: int = 1, activation: Optional[str] = None,
             out_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    pre = _out_like(a, b, out_dtype)
    return _core_gemm(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype, aux_out=pre), pre


@gemm.register_fake
def _gemm_fake(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=1, activation=None, out_dtype=None):
    return _out_like(a, b, out_dtype)


@gemm_aux.register_fake
def _gemm_aux_fake(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=1, activation=None, out_dtype=None):
    return _out_like(a, b, out_dtype), _out_like(a, b, out_dtype)


@torch.library.custom_op("numba_hopper::bmm", mutates_args=())
def bmm(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    _check_3d(a, b)
    a, b = _addressable(a), _addressable(b)
    batch, m, n = max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2]
    dtype = out_dtype or a.dtype
    row_bytes = n * torch.finfo(dtype).bits // 8
    if row_bytes % 16 == 0:
        return _matmul.bmm(a, b, out_dtype=DTYPE_NAMES[dtype])
    padded = a.new_empty((batch, m, _padded(n, dtype)), dtype=dtype)[..., :n]
    _matmul.bmm(a, b, out=padded)
    return padded.contiguous()


@bmm.register_fake
def _bmm_fake(a, b, out_dtype=None):
    _check_3d(a, b)
    return a.new_empty((max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2]), dtype=out_dtype or a.dtype)


def _check_3d(a, b):
    if a.dim() != 3 or b.dim() != 3:
        raise ShapeError(f"numba_hopper::bmm takes 3-D tensors; got shapes {tuple(a.shape)} and {tuple(b.shape)}")


def _padded(n, dtype):
    per_16_bytes = 128 // torch.finfo(dtype).bits
    return -(-max(n, 1) // per_16_bytes) * per_16_bytes


def _addressable(t):
    """``t`` if TMA can read its matrices (16-byte base, row pitch and batch stride, unit stride
    along rows or columns), else a padded row-major copy."""
    size = t.element_size()
    s_batch, s_row, s_col = t.stride()
    pitch = s_row if s_col == 1 else s_col if s_row == 1 else None
    if (pitch is not None and t.data_ptr() % 16 == 0 and pitch * size % 16 == 0
            and (t.shape[0] == 1 or s_batch * size % 16 == 0)):
        return t
    copy = t.new_empty((*t.shape[:2], _padded(t.shape[2], t.dtype)))[..., :t.shape[2]]
    return copy.copy_(t)


# --- autograd -------------------------------------------------------------------------------


def _in_layout_of(x, compute):
    """``compute(transposed)``: the product for ``x``'s gradient, made in ``x``'s layout (a
    column-major ``x`` gets ``(product^T)^T``, computed row-major)."""
    if x.dim() == 2 and x.stride(0) == 1 and x.stride(1) != 1:
        return compute(True).t()
    return compute(False)


def _needs_grad(ctx, i):
    # The dispatcher drops trailing arguments left at their defaults: they need no gradient.
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _gemm_grads(ctx, d_pre):
    """Gradients of ``alpha * a @ b + beta * c + bias`` given that of the whole (``d_pre``)."""
    a, b = ctx.saved_tensors[:2]
    d_pre = d_pre.contiguous()
    da = db = dc = dbias = None
    if _needs_grad(ctx, 0):
        g = d_pre.to(a.dtype)
        da = _in_layout_of(a, lambda t: gemm(b, g.t(), alpha=ctx.alpha) if t else gemm(g, b.t(), alpha=ctx.alpha))
    if _needs_grad(ctx, 1):
        g = d_pre.to(b.dtype)
        db = _in_layout_of(b, lambda t: gemm(g.t(), a, alpha=ctx.alpha) if t else gemm(a.t(), g, alpha=ctx.alpha))
    if _needs_grad(ctx, 2):
        dc = (ctx.beta * d_pre).to(ctx.c_dtype)
    if _needs_grad(ctx, 3):
        dbias = d_pre.sum(dim=0 if ctx.bias_dim == 1 else 1, dtype=torch.float32).to(ctx.bias_dtype)
    return da, db, dc, dbias, None, None, None, None, None


def _setup(ctx, inputs, *saved):
    a, b, c, bias, alpha, beta, bias_dim, activation, _ = inputs
    ctx.save_for_backward(a, b, *saved)
    ctx.alpha, ctx.beta, ctx.bias_dim, ctx.activation = alpha, beta, bias_dim, activation
    ctx.c_dtype = c.dtype if c is not None else None
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _setup_gemm(ctx, inputs, output):
    if inputs[7] is not None:
        raise RuntimeError("numba_hopper::gemm with an activation has no backward (its input is not kept); "
                           "use numba_hopper::gemm_aux, as numba_hopper.torch.linear does")
    _setup(ctx, inputs)


def _setup_gemm_aux(ctx, inputs, output):
    _setup(ctx, inputs, output[1])


_ACTIVATION_BACKWARD = {
    "relu": lambda g, pre: torch.ops.aten.threshold_backward(g, pre, 0),
    "gelu": lambda g, pre: torch.ops.aten.gelu_backward(g, pre),
    "gelu_tanh": lambda g, pre: torch.ops.aten.gelu_backward(g, pre, approximate="tanh"),
    "silu": lambda g, pre: torch.ops.aten.silu_backward(g, pre),
    "sigmoid": lambda g, pre: torch.ops.aten.sigmoid_backward(g, torch.sigmoid(pre)),
}


def _gemm_aux_backward(ctx, d_out, d_pre):
    pre = ctx.saved_tensors[2]
    d = _ACTIVATION_BACKWARD[ctx.activation](d_out, pre) if ctx.activation else d_out
    return _gemm_grads(ctx, d if d_pre is None else d + d_pre)


def _bmm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])


def _bmm_backward(ctx, d_out):
    a, b = ctx.saved_tensors
    d_out = d_out.contiguous()
    da = bmm(d_out.to(a.dtype), b.transpose(1, 2)) if _needs_grad(ctx, 0) else None
    db = bmm(a.transpose(1, 2), d_out.to(b.dtype)) if _needs_grad(ctx, 1) else None
    # A broadcast operand (batch 1 against B) gets the sum of the batch's gradients.
    if da is not None and a.shape[0] != da.shape[0]:
        da = da.sum(0, keepdim=True)
    if db is not None and b.shape[0] != db.shape[0]:
        db = db.sum(0, keepdim=True)
    return da, db, None


gemm.register_autograd(_gemm_grads, setup_context=_setup_gemm)
gemm_aux.register_autograd(_gemm_aux_backward, setup_context=_setup_gemm_aux)
bmm.register_autograd(_bmm_backward, setup_context=_bmm_setup)
