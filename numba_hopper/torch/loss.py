"""A language model's head and its cross-entropy loss as one differentiable call.

``cross_entropy(lm_head(h).float(), target)``, as transformers' causal LM loss computes it,
moves the (tokens, vocabulary) logits several times in float32: the upcast, the log-softmax,
its backward and the gradient's cast back (at a 151,936-word vocabulary and 2,048 tokens, 1.2 GB
a pass). :func:`linear_cross_entropy` computes the logits with :func:`numba_hopper.gemm` and the
loss and its gradient with two kernels that read the 16-bit logits once each
(:mod:`numba_hopper.kernels.cross_entropy`): float32 only in registers, the same arithmetic.
:func:`fuse_linear_cross_entropy` makes a transformers causal LM's training forward use it.

The two kernels are the custom operators ``numba_hopper::cross_entropy_rows`` (per-row losses
and log-sum-exps, with an autograd formula) and ``numba_hopper::cross_entropy_grad`` (the
logits' gradient), defined like :mod:`.ops`' (fake implementations for ``torch.compile``;
eagerly, a ``torch.autograd.Function`` without the dispatcher).
"""

from __future__ import annotations

import torch

from ..errors import DeviceMismatchError, DtypeError, ShapeError
from ..kernels.cross_entropy import THREADS, grad_kernel, loss_kernel
from . import ops
from ._launch import KERNEL_DTYPES, launch

__all__ = ["linear_cross_entropy", "fuse_linear_cross_entropy"]

_REDUCTIONS = ("mean", "sum", "none")


def linear_cross_entropy(x, weight, target, *, ignore_index: int = -100, reduction: str = "mean"):
    """``F.cross_entropy((x @ weight.T).float(), target, ignore_index=, reduction=)``.

    ``x``: (..., H) bf16 or fp16; ``weight``: (V, H) of the same dtype (an ``nn.Linear``'s, no
    bias); ``target``: integer class indices shaped ``x.shape[:-1]``. Differentiable in ``x``
    and ``weight`` (once). The logits are rounded to ``x``'s dtype, as a 16-bit ``nn.Linear``
    rounds them, and never returned; the softmax runs in float32. A target outside ``[0, V)``
    that is not ``ignore_index`` gives a NaN loss (PyTorch raises a device-side assert).
    ``reduction``: "mean" (over the targets that are not ``ignore_index``: NaN if there are
    none, as PyTorch), "sum" or "none" (a float32 loss per position, 0 where ignored).

    ``torch.compile`` traces it as the operators ``numba_hopper::gemm`` (the logits),
    ``numba_hopper::cross_entropy_rows`` and, in the backward, ``numba_hopper::cross_entropy_grad``.
    Raises before launch (``numba_hopper.errors``) for other dtypes, mismatched shapes or devices,
    and an unknown ``reduction``.
    """
    _check(x, weight, target, reduction)
    logits = ops.gemm(x.reshape(-1, x.shape[-1]), weight.t())
    inputs = (logits, target.reshape(-1), int(ignore_index))
    rows, _ = ops.call_op(_rows_op, None, _RowsFunction, _rows_impl, inputs, (logits,))
    if reduction == "none":
        return rows.view(target.shape)
    if reduction == "sum":
        return rows.sum()
    return rows.sum() / (target != ignore_index).sum()


def _check(x, weight, target, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    if x.dtype not in KERNEL_DTYPES or weight.dtype != x.dtype:
        raise DtypeError(f"linear_cross_entropy takes bf16 or fp16 x and weight of one dtype; got x {x.dtype}, "
                         f"weight {weight.dtype}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        raise DtypeError(f"target must hold integer class indices; got {target.dtype}")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"x (..., H) and weight (V, H) must share H; got x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}")
    if tuple(target.shape) != tuple(x.shape[:-1]):
        raise ShapeError(f"target must be shaped like x without its last dimension, {tuple(x.shape[:-1])}; got "
                         f"{tuple(target.shape)}")
    if not (x.device == weight.device == target.device):
        raise DeviceMismatchError(f"x, weight and target must be on one device; got {x.device}, {weight.device}, "
                                  f"{target.device}")


def _streamable(logits):
    """``logits`` contiguous and starting on 16 bytes, as the head's GEMM writes them (the
    kernels' vector accesses need a row's alignment to be the gradient's): copied if not."""
    if logits.is_contiguous() and logits.data_ptr() % 16 == 0:
        return logits
    return logits.clone(memory_format=torch.contiguous_format)


# --- the operators: per-row losses (and log-sum-exps) of 16-bit logits, and their gradient ----


def _rows_impl(logits, target, ignore_index):
    n = logits.shape[0]
    rows = logits.new_empty(n, dtype=torch.float32)
    lse = logits.new_empty(n, dtype=torch.float32)
    if n and logits.shape[1]:
        logits = _streamable(logits)
        launch(loss_kernel(KERNEL_DTYPES[logits.dtype]), logits.device, n, THREADS, logits.data_ptr(), logits.shape[1],
               target, ignore_index, lse, rows)
    else:  # no rows, or no classes (every loss NaN, as PyTorch)
        rows.fill_(float("nan"))
    return rows, lse


def _rows_fake(logits, target, ignore_index):
    n = logits.shape[0]
    return logits.new_empty(n, dtype=torch.float32), logits.new_empty(n, dtype=torch.float32)


def _grad_impl(logits, target, ignore_index, lse, d_rows):
    if not logits.numel():
        return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    logits = _streamable(logits)
    grad = torch.empty_like(logits)  # (contiguous, as logits now are)
    launch(grad_kernel(KERNEL_DTYPES[logits.dtype]), logits.device, logits.shape[0], THREADS, logits.data_ptr(),
           grad.data_ptr(), logits.shape[1], target, ignore_index, lse, d_rows.float().contiguous())
    return grad


def _grad_fake(logits, target, ignore_index, lse, d_rows):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


def _rows_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], output[1])
    ctx.ignore_index = inputs[2]


def _rows_grads(ctx, d_rows, d_lse):
    """The logits' gradient from the rows' (the log-sum-exps are internal: no gradient)."""
    logits, target, lse = ctx.saved_tensors
    inputs = (logits, target, ctx.ignore_index, lse, d_rows)
    if ops.tracing((logits, d_rows)):
        return _grad_op(*inputs), None, None
    if torch.is_grad_enabled():  # a create_graph=True backward: the gradient kernel has no derivative
        raise RuntimeError("linear_cross_entropy is differentiable once: a backward with create_graph=True "
                           "would need the derivative of its gradient kernel")
    return _grad_impl(*inputs), None, None


_rows_op = ops.define_op("cross_entropy_rows", "(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)",
                         _rows_impl, _rows_fake, _rows_grads, _rows_setup)
_grad_op = ops.define_op("cross_entropy_grad",
                         "(Tensor logits, Tensor target, int ignore_index, Tensor lse, Tensor d_rows) -> Tensor",
                         _grad_impl, _grad_fake)
_RowsFunction = ops.eager_function("_RowsFunction", _rows_impl, _rows_grads, _rows_setup)


def fuse_linear_cross_entropy(model):
    """Make ``model``, a transformers causal LM (``model.model`` the decoder, ``lm_head`` a
    bias-free linear), compute its training loss with :func:`linear_cross_entropy`, in place.

    A forward with ``labels`` while gradients are enabled then returns the loss of
    transformers' ``ForCausalLMLoss`` (labels shifted by one, ``ignore_index`` -100 unless given,
    ``num_items_in_batch`` or the mean) and no logits (``logits`` is None: they are never
    materialized in float32 or returned), eagerly and under ``torch.compile``. Any other forward
    (no labels, ``torch.no_grad()``, ``logits_to_keep``) is the model's own. Returns ``model``.
    """
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or not hasattr(model, "model"):
        raise TypeError(f"fuse_linear_cross_entropy takes a causal LM with a bias-free linear lm_head and a "
                        f"decoder in .model; got {type(model).__name__}")
    original = model.forward

    def forward(*args, labels=None, logits_to_keep=0, **kwargs):
        if args or labels is None or logits_to_keep or not torch.is_grad_enabled():
            return original(*args, labels=labels, logits_to_keep=logits_to_keep, **kwargs)
        from transformers.modeling_outputs import CausalLMOutputWithPast

        num_items = kwargs.pop("num_items_in_batch", None)
        ignore_index = kwargs.pop("ignore_index", -100)
        shift_labels = kwargs.pop("shift_labels", None)
        outputs = model.model(**kwargs)
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        hidden, weight = outputs.last_hidden_state, model.get_output_embeddings().weight
        target = shift_labels.to(hidden.device)
        if num_items is None:
            loss = linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index)
        else:
            loss = linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index,
                                        reduction="sum") / torch.as_tensor(num_items, device=hidden.device)
        return CausalLMOutputWithPast(loss=loss, logits=None, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions)

    model.forward = forward
    return model
