"""``AdamW``: ``torch.optim.AdamW`` for 16-bit CUDA parameters, one kernel launch a step.

AdamW's step reads each parameter's value, gradient and two moments and writes three of them
back: 14 bytes an element in bf16, so a 2-billion-parameter model's step moves 27 GB and is
bound by memory bandwidth. PyTorch's fused AdamW (``fused=True``) runs it at about half of an
H200's HBM rate; :class:`AdamW` runs the same arithmetic (float32 in registers, the state in
the parameter's dtype) in one launch of :func:`numba_hopper.kernels.adamw.adamw_kernel` per
parameter group and dtype, 16 bytes a thread per access
(``python benchmarks/bench_optim.py``; in a training step, ``benchmarks/bench_train.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DeviceMismatchError, DtypeError, LayoutError
from ..kernels.adamw import (CHUNK, EXP_AVG, EXP_AVG_SQ, FIRST_CHUNK, GRAD, META_COLUMNS, NUMEL, PARAM, STEP,
                             THREADS, adamw_kernel)
from ._launch import KERNEL_DTYPES, launch

__all__ = ["AdamW"]


class AdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay, maximize=)`` for bf16 and fp16
    parameters on a CUDA device, each contiguous and 16-byte aligned (as PyTorch allocates
    them): the same update, to float32 rounding (the moments kept in the parameter's dtype, as
    PyTorch keeps them), and the same ``state_dict`` (``step``, ``exp_avg``, ``exp_avg_sq`` per
    parameter; it loads into ``torch.optim.AdamW`` and back).

    Each ``step()`` updates the parameters of a group that have a gradient, per dtype in one
    kernel launch, without waiting for the GPU. The launch's table of addresses is checked and
    built on the first step and reused while the group's parameters, their data and their
    states stay the same tensors; each step fills in the gradients' addresses and the step
    counts, which live on the host. So a step cannot be captured in a CUDA graph (as
    ``torch.optim.AdamW(capturable=True)`` can). Not supported (raises before any update):
    ``amsgrad``, a tensor ``lr``, sparse gradients, other dtypes or devices, and parameters
    that are views not starting on 16 bytes or not contiguous. A gradient not contiguous is
    copied first.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False):
        if amsgrad:
            raise ValueError("numba_hopper.torch.AdamW has no amsgrad; use torch.optim.AdamW")
        if isinstance(lr, torch.Tensor):
            raise ValueError("numba_hopper.torch.AdamW takes a float lr")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        self._launches = {}  # group index -> (its parameters with a gradient, their launches: _Launch)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False,
                                      maximize=maximize))
        for group in self.param_groups:
            for p in group["params"]:
                _check_param(p)

    def add_param_group(self, param_group):
        self._launches.clear()
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            _check_param(p)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._launches = {}

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step of every parameter with a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        runs = []  # every launch checked before any update
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            cached = self._launches.get(index)
            if cached is None or not _same_tensors(params, cached[0]) or not all(
                    step.holds(self.state) for step in cached[1]):
                cached = self._launches[index] = (params, self._launches_of(params))
            runs += [(step, group, step_gradients(step.params, step.dtype, group["maximize"])) for step in cached[1]]
        for step, group, (grads, _copies) in runs:  # (the copies live to the launch)
            step.run(group, grads)
        return loss

    def _launches_of(self, params):
        """The launches of a group's ``params`` that have a gradient, one per device and dtype,
        their states made (first step) or brought to the host (loaded from a fused AdamW) and
        every tensor checked."""
        by_kind = {}
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif state["step"].device.type != "cpu":  # loaded from a fused or capturable AdamW: read once
                state["step"] = state["step"].to("cpu", torch.float32)
            _check_param(p, state["exp_avg"], state["exp_avg_sq"])
            by_kind.setdefault((p.device, p.dtype), []).append(p)
        return [_Launch(ps, [self.state[p] for p in ps], device, dtype) for (device, dtype), ps in by_kind.items()]


class _Launch:
    """One kernel launch of a step: a group's parameters of one device and dtype that have a
    gradient. What stays fixed between steps (the parameters' and moments' addresses, sizes and
    chunks) is checked and tabled once; :meth:`holds` tells whether it still stands, and
    :meth:`run` fills in the step's gradients and step counts and launches."""

    def __init__(self, params, states, device, dtype):
        self.params, self.states, self.device, self.dtype = params, states, device, dtype
        # The step counts become views of one tensor: a step counts them in one add and tables
        # them without a copy.
        self.steps = torch.tensor([float(s["step"]) for s in states], dtype=torch.float32)
        for s, count in zip(states, self.steps):
            s["step"] = count
        self.fixed = [(p.shape, s["exp_avg"], s["exp_avg_sq"], s["step"],
                       (p.data_ptr(), s["exp_avg"].data_ptr(), s["exp_avg_sq"].data_ptr())) for p, s in zip(params, states)]
        self.meta, self.chunks = fixed_columns(params, states)

    def holds(self, state):
        """Whether the parameters keep their data and ``state`` (the optimizer's) their state
        tensors (a parameter's data or a state may have been swapped since)."""
        for p, s, (shape, m, v, t, addresses) in zip(self.params, self.states, self.fixed):
            if state.get(p) is not s or s["exp_avg"] is not m or s["exp_avg_sq"] is not v or s["step"] is not t \
                    or (p.data_ptr(), m.data_ptr(), v.data_ptr()) != addresses or p.dtype != self.dtype \
                    or p.shape != shape:
                return False
        return True

    def run(self, group, grads):
        """Count the step and launch the update with ``grads``, the gradients' addresses
        (:func:`step_gradients`)."""
        self.steps.add_(1.0)
        if not self.chunks:
            return
        meta = self.meta
        meta[:, GRAD] = grads
        meta[:, STEP] = self.steps.numpy()
        table = torch.from_numpy(meta).pin_memory().to(self.device, non_blocking=True)
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        launch(adamw_kernel(KERNEL_DTYPES[self.dtype]), self.device, self.chunks, THREADS, table, np.float32(lr),
               np.float32(lr * group["weight_decay"]), np.float32(beta1), np.float32(beta2), np.float32(group["eps"]))


def _same_tensors(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def fixed_columns(params, states):
    """The kernel's table of one launch (``numba_hopper.kernels.adamw``) with the columns that stay
    fixed between steps filled in (the gradients' and the steps' are each step's), and the
    chunks it spans (its grid)."""
    meta = np.zeros((len(params), META_COLUMNS), np.int64)
    chunks = 0
    for row, p, state in zip(meta, params, states):
        row[PARAM], row[EXP_AVG], row[EXP_AVG_SQ] = p.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr()
        row[NUMEL], row[FIRST_CHUNK] = p.numel(), chunks
        chunks += -(-p.numel() // CHUNK)
    return meta, chunks


def step_gradients(params, dtype, maximize=False):
    """The addresses of the gradients as the kernel reads them, and the copies they point to,
    which must live until the launch: a gradient not contiguous, not 16-byte aligned or of
    another dtype is copied, and negated for ``maximize``."""
    addresses, copies = [], []
    for p in params:
        grad = p.grad
        if grad.is_sparse:
            raise RuntimeError("numba_hopper.torch.AdamW does not support sparse gradients")
        if grad.dtype != dtype or not grad.is_contiguous() or grad.data_ptr() % 16:
            grad = grad.to(dtype, memory_format=torch.contiguous_format, copy=True)
            copies.append(grad)
        if maximize:
            grad = -grad
            copies.append(grad)
        addresses.append(grad.data_ptr())
    return addresses, copies


def _check_param(p, *state):
    """``p`` (and its moments, ``state``) as the kernel reads them, or a clear error."""
    if p.dtype not in KERNEL_DTYPES:
        raise DtypeError(f"numba_hopper.torch.AdamW updates bf16 and fp16 parameters; got {p.dtype} "
                         "(use torch.optim.AdamW for these)")
    for t in (p, *state):
        if (not t.is_contiguous() or t.data_ptr() % 16 or t.dtype != p.dtype or t.shape != p.shape
                or t.device != p.device):
            raise LayoutError(f"numba_hopper.torch.AdamW needs contiguous parameters and moments of one dtype, "
                              f"shape and device that start on 16 bytes; got shape {tuple(t.shape)}, strides "
                              f"{t.stride()}, {t.dtype} on {t.device}, address {t.data_ptr():#x}")
    if p.device.type != "cuda":
        raise DeviceMismatchError(f"numba_hopper.torch.AdamW updates CUDA parameters; got one on {p.device}")
