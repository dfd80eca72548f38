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
from ..kernels.adamw import CHUNK, META_COLUMNS, THREADS, adamw_kernel
from ._launch import KERNEL_DTYPES, launch

__all__ = ["AdamW"]


class AdamW(torch.optim.Optimizer):
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay, maximize=)`` for bf16 and fp16
    parameters on a CUDA device, each contiguous and 16-byte aligned (as PyTorch allocates
    them): the same update, to float32 rounding (the moments kept in the parameter's dtype, as
    PyTorch keeps them), and the same ``state_dict`` (``step``, ``exp_avg``, ``exp_avg_sq`` per
    parameter; it loads into ``torch.optim.AdamW`` and back).

    Each ``step()`` updates the parameters of a group that have a gradient, per dtype in one
    kernel launch, without waiting for the GPU. The step counts live on the host and the table
    of addresses is built there each step, so a step cannot be captured in a CUDA graph (as
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
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=False,
                                      maximize=maximize))
        for group in self.param_groups:
            for p in group["params"]:
                _check_param(p)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            _check_param(p)

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step of every parameter with a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        launches = {}  # (group index, device, dtype) -> parameters: all checked before any update
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("numba_hopper.torch.AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif state["step"].device.type != "cpu":  # loaded from a fused or capturable AdamW: read once
                    state["step"] = state["step"].to("cpu", torch.float32)
                _check_param(p, state["exp_avg"], state["exp_avg_sq"])  # (a parameter's data may have been swapped)
                launches.setdefault((index, p.device, p.dtype), []).append(p)
        for (index, device, dtype), params in launches.items():
            self._update(self.param_groups[index], device, dtype, params)
        return loss

    def _update(self, group, device, dtype, params):
        states = [self.state[p] for p in params]
        torch._foreach_add_([state["step"] for state in states], 1.0)
        meta, chunks, copies = step_table(params, states, dtype, group["maximize"])  # (copies: live to the launch)
        if not chunks:
            return
        table = torch.from_numpy(meta).pin_memory().to(device, non_blocking=True)
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        launch(adamw_kernel(KERNEL_DTYPES[dtype]), device, chunks, THREADS, table, np.float32(lr),
               np.float32(lr * group["weight_decay"]), np.float32(beta1), np.float32(beta2), np.float32(group["eps"]))


def step_table(params, states, dtype, maximize=False):
    """The kernel's table of one launch (``numba_hopper.kernels.adamw``), the chunks it spans (its
    grid), and the gradient copies the table points to, which must live until the launch: a
    gradient not contiguous, not 16-byte aligned or of another dtype is copied, and negated for
    ``maximize``."""
    meta = np.empty((len(params), META_COLUMNS), np.int64)
    chunks, copies = 0, []
    for row, p, state in zip(meta, params, states):
        grad = p.grad
        if grad.dtype != dtype or not grad.is_contiguous() or grad.data_ptr() % 16:
            grad = grad.to(dtype, memory_format=torch.contiguous_format, copy=True)
            copies.append(grad)
        if maximize:
            grad = -grad
            copies.append(grad)
        row[:] = (p.data_ptr(), grad.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(),
                  p.numel(), chunks, int(state["step"].item()))
        chunks += -(-p.numel() // CHUNK)
    return meta, chunks, copies


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
