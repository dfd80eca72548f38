"""``mm``, ``addmm``, ``bmm``, ``baddbmm`` and ``matmul`` with PyTorch's semantics, on
numba_hopper's GEMMs (bf16/fp16 CUDA tensors).

Each is written with the custom ops of :mod:`numba_hopper.torch.ops` and plain aten ops, so
``torch.compile`` traces it without a graph break and autograd differentiates it. What each
maps to, and what costs beyond the GEMM:

- ``addmm``: ``input`` broadcast along rows (1-D, (1, N), a scalar) becomes the fused bias,
  along columns ((M, 1)) a per-row bias, and a full (M, N) ``input`` the fused ``beta * c``:
  one launch, ``K == 0`` included (the kernel's epilogue of a zero product). ``beta == 0``
  ignores ``input`` (NaN included), as BLAS and torch do.
- ``baddbmm``: the batched product in fp32, then ``alpha * p + beta * input`` and one rounding,
  by torch: one more pass over the output.
- ``matmul``: 1-D operands are made 2-D and squeezed back; an N-D ``a`` times a 1-D or 2-D
  ``b`` folds the batch into M (one ``gemm``); otherwise the batch dimensions broadcast and
  run as one ``bmm`` (``reshape`` copies an operand only where torch.matmul's does).
"""

from __future__ import annotations

import math

import torch

from . import ops

__all__ = ["mm", "addmm", "bmm", "baddbmm", "matmul"]


def _check_tensors(name, *args):
    """torch's TypeError for a non-tensor argument."""
    for x in args:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected Tensor arguments, got {type(x).__name__}")


def _check_dims(name, want, *tensors):
    _check_tensors(name, *tensors)
    for t in tensors:
        if t.dim() != want:
            raise RuntimeError(f"{name}: expected {want}-D tensors, got shape {tuple(t.shape)}")


def mm(a, b):
    """``torch.mm(a, b)``."""
    _check_dims("mm", 2, a, b)
    return ops.gemm(a, b)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """``torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)``: ``beta * input + alpha * mat1 @ mat2``."""
    _check_tensors("addmm", input)
    _check_dims("addmm", 2, mat1, mat2)
    m, n = mat1.shape[0], mat2.shape[1]
    full = input.expand(m, n)  # (raises as torch does when input does not broadcast)
    if beta == 0 or full.numel() == 0:  # (an empty output: nothing to add, nothing launched)
        return ops.gemm(mat1, mat2, alpha=float(alpha))
    bias = c = None
    if full.stride(0) == 0 or m == 1:  # every row the same: one value per column
        bias = (beta * full[0].float()).contiguous()
    elif full.stride(1) == 0 or n == 1:  # every column the same: one value per row, an (M, 1) bias
        bias = (beta * full[:, :1].float()).contiguous()
    else:
        c = full
    return ops.gemm(mat1, mat2, c=c, bias=bias, alpha=float(alpha), beta=float(beta))


def bmm(a, b):
    """``torch.bmm(a, b)``."""
    _check_dims("bmm", 3, a, b)
    return ops.bmm(a, b)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha)``."""
    _check_tensors("baddbmm", input)
    _check_dims("baddbmm", 3, batch1, batch2)
    product = ops.bmm(batch1, batch2, out_dtype=torch.float32)
    if beta == 0:
        return (alpha * product).to(batch1.dtype)
    return (alpha * product + beta * input.float()).to(batch1.dtype)


def matmul(a, b):
    """``torch.matmul(a, b)`` (``a @ b``), with its 1-D and batch-broadcast rules."""
    _check_tensors("matmul", a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError("matmul: both arguments need at least 1 dimension")
    if a.dim() <= 2 and b.dim() <= 2:
        out = ops.gemm(a.unsqueeze(0) if a.dim() == 1 else a, b.unsqueeze(1) if b.dim() == 1 else b)
        out = out.squeeze(-1) if b.dim() == 1 else out
        return out.squeeze(0) if a.dim() == 1 else out
    if b.dim() <= 2:  # fold a's batch dimensions into M
        b2 = b.unsqueeze(1) if b.dim() == 1 else b
        out = ops.gemm(a.flatten(0, -2), b2)
        return out.view(*a.shape[:-1], *b.shape[1:])
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    batch = torch.broadcast_shapes(a2.shape[:-2], b.shape[:-2])
    (m, k), n = a2.shape[-2:], b.shape[-1]
    count = math.prod(batch)
    a3 = a2.expand(*batch, m, k).reshape(count, m, k)
    b3 = b.expand(*batch, k, n).reshape(count, k, n)
    out = ops.bmm(a3, b3).view(*batch, m, n)
    return out.squeeze(-2) if a.dim() == 1 else out

