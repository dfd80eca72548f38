"""The custom operators ``torch.ops.numba_hopper.gemm``, ``gemm_aux`` and ``bmm``, and the
calls the rest of ``numba_hopper.torch`` makes through them.

The operators are defined with ``torch.library`` (schema, CPU/CUDA implementation, fake
implementation, autograd formula), so ``torch.compile`` and ``torch.export`` trace them with no
graph break and AOTAutograd builds their backward, whose GEMMs are these operators again.
They run :func:`numba_hopper.gemm` / :func:`numba_hopper.bmm` on PyTorch's current stream, so
``torch.cuda.graph`` captures them (warm up first: a first call compiles).

- ``gemm(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype)``:
  ``act(alpha * a @ b + beta * c + bias)``, a new row-major (M, N) tensor. ``bias`` as
  :func:`numba_hopper.gemm` takes it: 1-D or (1, N), one value per column (as ``torch.addmm``),
  whatever M and N are; (M, 1), or 1-D with ``bias_dim=0``, one per row.
- ``gemm_aux(...)``: the same, returning ``(out, pre)`` where ``pre`` is the value before the
  activation (written by the same kernel's epilogue): what the activation's backward reads.
  ``gemm`` with an activation has no backward; use ``gemm_aux`` (as ``linear`` does).
- ``bmm(a, b, out_dtype)``: (B, M, K) x (B, K, N), through :func:`numba_hopper.bmm`, which
  copies operands TMA cannot address (a row pitch or batch stride that is not a multiple of
  16 bytes, as in (10, 5, 10) bf16) into aligned scratch, one launch per operand.

Host time. Through the dispatcher, an operator with a Python autograd formula costs about
11 us more than the GEMM it runs (4 us without the formula; a no-op GEMM timed on the CPU). So the
module-level functions :func:`gemm`, :func:`gemm_aux` and :func:`bmm` call the operator only
while something traces (``torch.compile``, ``torch.export``, fake tensors); eagerly they
run the implementation directly, inside a ``torch.autograd.Function`` with the same formula
when a gradient is needed. Traced with grad mode off, they call ``gemm_no_grad`` and
``bmm_no_grad``: the same operators without the formula, which a compiled inference
graph then calls without the autograd layer's Python; a plain product calls ``mm(a, b, False)``,
which Inductor lowers to a direct call of ``numba_hopper.gemm(a, b, out=buf)``, as it calls
``extern_kernels.mm`` for ``aten.mm`` (``_lowering``). A training graph's plain products,
traced as ``gemm`` for the formula, become ``mm(a, b, sustained)`` in Inductor's post-grad pass.

A training step's products (the eager formulas' and a training graph's) run in the training
tiles of :mod:`numba_hopper.torch.training`.

The backward computes each gradient in its input's layout (a column-major ``b``, such as
``weight.t()``, gets a column-major gradient), so AccumulateGrad needs no layout copy.
"""

from __future__ import annotations

import re

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily  # private: as below
from torch.utils._python_dispatch import _get_current_dispatch_mode  # private: PyTorch has no public one

from ..matmul import api as _matmul
from ..matmul.heuristics import SUSTAINED
from ..errors import DtypeError, ShapeError
from . import _lowering, training

__all__ = ["gemm", "gemm_aux", "gated_mm", "bmm", "tracing", "needs_grad", "differentiable_backward", "DTYPE_NAMES",
           "ACTIVATION_BACKWARD"]

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}

_EPILOGUE = ("Tensor a, Tensor b, Tensor? c=None, Tensor? bias=None, float alpha=1., float beta=0., "
             "int? bias_dim=None, str? activation=None, ScalarType? out_dtype=None")
_lib = torch.library.Library("numba_hopper", "DEF")


# --- implementations -----------------------------------------------------------------------


def _gemm_impl(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None,
               aux_out=None, config=None):
    return _matmul.gemm(a, b, c=c, bias=bias, alpha=alpha, beta=beta if c is not None else 0.0,
                        bias_dim=bias_dim if bias is not None else None, activation=activation,
                        out_dtype=DTYPE_NAMES.get(out_dtype, out_dtype), aux_out=aux_out, config=config)


def _training_gemm_impl(*inputs):
    """``_gemm_impl`` for a product of a training step, in ``training.GEMM_CONFIG``'s tiles."""
    return _gemm_impl(*inputs, config=training.GEMM_CONFIG)


def _mm_impl(a, b, sustained):
    return _matmul.gemm(a, b, config=SUSTAINED if sustained else None)


def _mm_sum_impl(a, b, sustained):
    return _matmul.gemm_sum(tuple(zip(a, b)), config=SUSTAINED if sustained else None)


def _gemm_aux_impl(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    pre = _out_like(a, b, out_dtype)
    return _gemm_impl(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype, aux_out=pre), pre


def _bmm_impl(a, b, out_dtype=None):
    _check_3d(a, b)
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype or (out_dtype or a.dtype) not in DTYPE_NAMES:
        raise DtypeError(f"numba_hopper::bmm takes bf16 or fp16 a and b of one dtype and a bf16, fp16 or fp32 "
                         f"output; got {a.dtype}, {b.dtype} -> {out_dtype or a.dtype}")
    return _matmul.bmm(a, b, out_dtype=DTYPE_NAMES[out_dtype or a.dtype])


def _gated_mm_impl(a, b, up, activation):
    return _matmul.gemm(a, b, up=up, activation=activation)


def _gated_mm_fake(a, b, up, activation):
    return _out_like(a, b, None)


def _gated_mm_products_impl(a, b, up, activation):
    products = a.new_empty((a.shape[0], 2 * b.shape[1]))
    return _matmul.gemm(a, b, up=up, activation=activation, aux_out=products), products


def _gated_mm_products_fake(a, b, up, activation):
    return _out_like(a, b, None), a.new_empty((a.shape[0], 2 * b.shape[1]))


def _out_like(a, b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or a.dtype)


def _gemm_fake(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    _register_lowering()  # (a training graph's plain products become ``mm``)
    return _out_like(a, b, out_dtype)


def _gemm_aux_fake(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    return _out_like(a, b, out_dtype), _out_like(a, b, out_dtype)


def _mm_fake(a, b, sustained):
    _register_lowering()
    return _out_like(a, b, None)


def _mm_sum_fake(a, b, sustained):
    _register_lowering()
    return _out_like(a[0], b[0], None)


def _register_lowering():
    """Before Inductor lowers a graph that holds the operator (``register`` acts once)."""
    with unset_fake_temporarily():  # Inductor's modules, imported here, must not see fake tensors
        _lowering.register()


def _bmm_fake(a, b, out_dtype=None):
    _check_3d(a, b)
    return a.new_empty((max(a.shape[0], b.shape[0]), a.shape[1], b.shape[2]), dtype=out_dtype or a.dtype)


def _check_3d(a, b):
    if a.dim() != 3 or b.dim() != 3:
        raise ShapeError(f"numba_hopper::bmm takes 3-D tensors; got shapes {tuple(a.shape)} and {tuple(b.shape)}")


# --- autograd formulas (shared by the operators and the eager path) --------------------------


def _needs_grad(ctx, i):
    # The dispatcher drops trailing arguments left at their defaults: they need no gradient.
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _in_layout_of(x, compute):
    """``compute(transposed)``: the product for ``x``'s gradient, made in ``x``'s layout (a
    column-major ``x`` gets ``(product^T)^T``, computed row-major)."""
    if x.dim() == 2 and x.stride(0) == 1 and x.stride(1) != 1:
        return compute(True).t()
    return compute(False)


def _gemm_grads(ctx, d_pre):
    """Gradients of ``alpha * a @ b + beta * c + bias`` given that of the whole (``d_pre``)."""
    a, b = ctx.saved_tensors[:2]
    d_pre = d_pre.contiguous()
    da = db = dc = dbias = None
    # b's gradient (a linear's weight) before a's (its input), the order of PyTorch's compiled
    # backward, so that a step's products line up with stock's (profile_train.py --gemms).
    if _needs_grad(ctx, 1):
        g = d_pre.to(b.dtype)
        db = _in_layout_of(b, lambda t: _gradient_gemm(g.t(), a, ctx.alpha) if t
                           else _gradient_gemm(a.t(), g, ctx.alpha))
    if _needs_grad(ctx, 0):
        g = d_pre.to(a.dtype)
        da = _in_layout_of(a, lambda t: _gradient_gemm(b, g.t(), ctx.alpha) if t
                           else _gradient_gemm(g, b.t(), ctx.alpha))
    if _needs_grad(ctx, 2):
        dc = (ctx.beta * d_pre).to(ctx.c_dtype)
    if _needs_grad(ctx, 3):
        shape = ctx.bias_shape  # (numba_hopper.gemm's rule: 1-D by bias_dim, (1, N) per column, (M, 1) per row)
        per_row = ctx.bias_dim == 0 if len(shape) == 1 else shape != (1, d_pre.shape[1])
        dbias = d_pre.sum(dim=1 if per_row else 0, keepdim=len(shape) == 2, dtype=torch.float32).to(ctx.bias_dtype)
    return da, db, dc, dbias, None, None, None, None, None


ACTIVATION_BACKWARD = {
    "relu": lambda g, pre: torch.ops.aten.threshold_backward(g, pre, 0),
    "gelu": lambda g, pre: torch.ops.aten.gelu_backward(g, pre),
    "gelu_tanh": lambda g, pre: torch.ops.aten.gelu_backward(g, pre, approximate="tanh"),
    "silu": lambda g, pre: torch.ops.aten.silu_backward(g, pre),
    "sigmoid": lambda g, pre: torch.ops.aten.sigmoid_backward(g, torch.sigmoid(pre)),
}


def _gemm_aux_grads(ctx, d_out, d_pre):
    pre = ctx.saved_tensors[2]
    d = ACTIVATION_BACKWARD[ctx.activation](d_out, pre) if ctx.activation else d_out
    return _gemm_grads(ctx, d if d_pre is None else d + d_pre)


def _bmm_grads(ctx, d_out):
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


def _setup(ctx, inputs, *saved):
    a, b, c, bias, alpha, beta, bias_dim, activation, _ = inputs
    ctx.save_for_backward(a, b, *saved)
    ctx.alpha, ctx.beta, ctx.bias_dim, ctx.activation = alpha, beta, bias_dim, activation
    ctx.c_dtype = c.dtype if c is not None else None
    ctx.bias_dtype, ctx.bias_shape = (bias.dtype, tuple(bias.shape)) if bias is not None else (None, None)


def _setup_gemm(ctx, inputs, output):
    if inputs[7] is not None:
        raise RuntimeError("numba_hopper::gemm with an activation has no backward (its input is not kept); "
                           "use numba_hopper::gemm_aux, as numba_hopper.torch.linear does")
    _setup(ctx, inputs)


def _setup_gemm_aux(ctx, inputs, output):
    _setup(ctx, inputs, output[1])


def _setup_bmm(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])


# --- the operators -------------------------------------------------------------------------


def _no_defaults(arguments):
    """A schema's arguments without their default values."""
    return re.sub(r"=[^,]+", "", arguments)


def define_op(name, schema, impl, fake, grads=None, setup=None):
    """The operator ``numba_hopper::name``, with an autograd formula unless ``grads`` is None."""
    _lib.define(name + schema)
    for key in ("CPU", "CUDA"):  # CPU tensors reach numba_hopper, which refuses them with a TypeError
        _lib.impl(name, impl, key)
    torch.library.register_fake(f"numba_hopper::{name}", fake, lib=_lib)
    if grads is not None:
        torch.library.register_autograd(f"numba_hopper::{name}", grads, setup_context=setup, lib=_lib)
    return getattr(torch.ops.numba_hopper, name).default


_BMM = "Tensor a, Tensor b, ScalarType? out_dtype=None"
_gemm_op = define_op("gemm", f"({_EPILOGUE}) -> Tensor", _gemm_impl, _gemm_fake, _gemm_grads, _setup_gemm)
_gemm_aux_op = define_op("gemm_aux", f"({_EPILOGUE}) -> (Tensor, Tensor)", _gemm_aux_impl, _gemm_aux_fake,
                         _gemm_aux_grads, _setup_gemm_aux)
_bmm_op = define_op("bmm", f"({_BMM}) -> Tensor", _bmm_impl, _bmm_fake, _bmm_grads, _setup_bmm)
# The same operators without a formula, traced where grad mode is off (``torch.no_grad()``
# inference), for the host time of a compiled model, which calls each operator through the
# dispatcher: a Python autograd formula runs in Python on every call, gradient or not,
# because parameters carry the autograd dispatch key (about 8 us a call, on a CPU where the
# dispatcher's call of the implementation costs 4); and Inductor passes each argument that
# has a default by keyword, which costs 5 us more for this schema than passing it by
# position, so these schemas have no defaults (``call_op`` passes every argument).
_gemm_no_grad_op = define_op("gemm_no_grad", f"({_no_defaults(_EPILOGUE)}) -> Tensor", _gemm_impl, _gemm_fake)
_bmm_no_grad_op = define_op("bmm_no_grad", f"({_no_defaults(_BMM)}) -> Tensor", _bmm_impl, _bmm_fake)
# A plain product (a linear without bias) in such a graph, or in place of a training graph's plain
# ``gemm`` (``_post_grad.plain_products_to_mm``), also without a formula, which Inductor lowers to
# a direct call of numba_hopper.gemm (``_lowering``; ``sustained``: with config="sustained"): no
# dispatcher at all. Inductor's cache keys a graph by its operators, not by their lowerings, so
# the lowered operator has a name of its own: a numba_hopper without the lowering never gets a
# cached graph that needs it.
_mm_op = define_op("mm", "(Tensor a, Tensor b, bool sustained) -> Tensor", _mm_impl, _mm_fake)


# A sum of plain products, ``a[0] @ b[0] + a[1] @ b[1] + ...`` (``numba_hopper.gemm_sum``): put in
# place of a training graph's sum of ``mm`` (an input's gradient through several linears) by the
# post-grad pass, lowered like ``mm``.
_mm_sum_op = define_op("mm_sum", "(Tensor[] a, Tensor[] b, bool sustained) -> Tensor", _mm_sum_impl, _mm_sum_fake)


# A value that a compiled graph keeps in memory for its readers rather than letting Inductor
# recompute it inside each (``_post_grad.materialize_broadcast_trig``): lowered to the value itself,
# realized (``_lowering``). Only the post-grad pass puts it in a graph; its implementation copies.
define_op("materialized", "(Tensor x) -> Tensor", lambda x: x.clone(), lambda x: torch.empty_like(x))


# A gated unit's backward, ``(d_gate, d_up)`` at ``dh = a @ b`` (``numba_hopper.gemm_glu_backward``):
# put in place of a training graph's product and the SiLU-and-multiply derivative that reads it by
# the post-grad pass (``_post_grad.glu_backwards``).
def _mm_glu_backward_impl(a, b, gate, up, sustained):
    return _matmul.gemm_glu_backward(a, b, gate, up, config=SUSTAINED if sustained else None)


def _mm_glu_backward_fake(a, b, gate, up, sustained):
    _register_lowering()
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


define_op("mm_glu_backward", "(Tensor a, Tensor b, Tensor gate, Tensor up, bool sustained) -> (Tensor, Tensor)",
          _mm_glu_backward_impl, _mm_glu_backward_fake)


# A gated product, ``activation(a @ b) * (a @ up)`` (``numba_hopper.gemm(a, b, up=up)``): put in
# place of two ``mm`` and the gating math by the compiled inference graph's pass (``_lowering``).
_gated_mm_op = define_op("gated_mm", "(Tensor a, Tensor b, Tensor up, str activation) -> Tensor", _gated_mm_impl,
                         _gated_mm_fake)

# The same, keeping both products: ``(gated, products)``, ``products[:, :N] = a @ b`` and
# ``products[:, N:] = a @ up`` (``numba_hopper.gemm(..., aux_out=products)``): put in place of a
# training graph's two ``mm`` and the gating math, whose products its backward reads, by the
# post-grad pass (``_post_grad.fuse_gated_mlps``).
define_op("gated_mm_products", "(Tensor a, Tensor b, Tensor up, str activation) -> (Tensor, Tensor)",
          _gated_mm_products_impl, _gated_mm_products_fake)


def _gemm_no_grad(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype, sustained=False):
    if c is None and bias is None and alpha == 1.0 and activation is None and out_dtype is None:
        return _mm_op(a, b, sustained)
    return _gemm_no_grad_op(a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype)


def _training_gemm_no_grad(*inputs):
    """``_gemm_no_grad`` for a product of a training step (a backward graph's, traced with grad
    mode off), in ``training.GEMM_CONFIG``'s tiles."""
    return _gemm_no_grad(*inputs, sustained=training.GEMM_CONFIG == SUSTAINED)


def differentiable_backward(ctx, dy, inputs, forward):
    """A backward under ``create_graph=True`` (a double backward): ``forward(*inputs)`` run again
    and differentiated through the operators' formulas; None for each input that needs no
    gradient (and for the arguments after ``inputs``)."""
    wanted = [i for i, t in enumerate(inputs) if ctx.needs_input_grad[i]]
    grads = torch.autograd.grad(forward(*inputs), [inputs[i] for i in wanted], dy, create_graph=True)
    out = [None] * len(ctx.needs_input_grad)
    for i, g in zip(wanted, grads):
        out[i] = g
    return tuple(out)


def eager_function(name, impl, grads, setup):
    """The eager path's ``torch.autograd.Function``: ``impl`` with the operator's formula."""

    def forward(ctx, *inputs):
        output = impl(*inputs)
        setup(ctx, inputs, output)
        return output

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(grads)})


_GemmFunction = eager_function("_GemmFunction", _training_gemm_impl, _gemm_grads, _setup_gemm)
_GemmAuxFunction = eager_function("_GemmAuxFunction", _gemm_aux_impl, _gemm_aux_grads, _setup_gemm_aux)
_BmmFunction = eager_function("_BmmFunction", _bmm_impl, _bmm_grads, _setup_bmm)


def tracing(tensors):
    """Whether a call on ``tensors`` is being traced (``torch.compile``, ``torch.export``, fake or
    other tensor subclasses, a dispatch mode): such calls must go through the operators."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors if t is not None))


def needs_grad(tensors):
    """True when grad mode is on and any of ``tensors`` (None allowed) requires a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def call_op(op, no_grad_op, function, impl, inputs, tensors):
    """``op(*inputs)`` while tracing (``no_grad_op`` in grad mode off, if there is one); eagerly,
    ``impl`` (in ``function`` when a gradient is needed)."""
    if tracing(tensors):
        return (op if no_grad_op is None or torch.is_grad_enabled() else no_grad_op)(*inputs)
    if needs_grad(tensors):
        return function.apply(*inputs)
    return impl(*inputs)


def gemm(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    """``numba_hopper::gemm``: ``act(alpha * a @ b + beta * c + bias)``."""
    return call_op(_gemm_op, _gemm_no_grad, _GemmFunction, _gemm_impl,
                   (a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype), (a, b, c, bias))


def _gradient_gemm(a, b, alpha):
    """``gemm(a, b, alpha=alpha)`` for a gradient, in ``training.GEMM_CONFIG``'s tiles."""
    return call_op(_gemm_op, _training_gemm_no_grad, _GemmFunction, _training_gemm_impl,
                   (a, b, None, None, alpha, 0.0, None, None, None), (a, b))


def gemm_aux(a, b, c=None, bias=None, alpha=1.0, beta=0.0, bias_dim=None, activation=None, out_dtype=None):
    """``numba_hopper::gemm_aux``: ``(act(pre), pre)`` with ``pre = alpha * a @ b + beta * c + bias``."""
    return call_op(_gemm_aux_op, None, _GemmAuxFunction, _gemm_aux_impl,
                   (a, b, c, bias, alpha, beta, bias_dim, activation, out_dtype), (a, b, c, bias))


def gated_mm(a, b, up, activation):
    """``numba_hopper::gated_mm``: ``activation(a @ b) * (a @ up)``, for a trace (inference: it has no
    formula; eagerly, call ``numba_hopper.gemm(a, b, up=up, activation=activation)``)."""
    return _gated_mm_op(a, b, up, activation)


def bmm(a, b, out_dtype=None):
    """``numba_hopper::bmm``: ``a @ b`` for 3-D ``a`` and ``b`` (a batch of 1 broadcasts)."""
    return call_op(_bmm_op, _bmm_no_grad_op, _BmmFunction, _bmm_impl, (a, b, out_dtype), (a, b))
