"""A CPU stand-in for ``numba_hopper.gemm`` / ``numba_hopper.bmm`` on PyTorch tensors, for
testing the PyTorch layer (``numba_hopper.torch``) without a GPU.

It computes in float64 and keeps the contract the PyTorch layer relies on: dtypes, shapes,
``K == 0`` refused with a fused epilogue, ``bias_dim`` needed when M == N, and ``bmm``'s
TMA rules (16-byte base, row pitch and batch stride; row-major ``out``), so that the layer's
own handling of those cases is what the tests exercise. Install it with :func:`install`.
"""

from __future__ import annotations

import torch

from numba_hopper import errors

_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, None: None}
_ACT = {
    None: lambda x: x,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
}


def _inputs(a, b):
    if a.dtype not in (torch.bfloat16, torch.float16) or a.dtype != b.dtype:
        raise errors.DtypeError(f"a and b must be bf16 or f16 and the same; got {a.dtype}, {b.dtype}")


def gemm(a, b, out=None, *, alpha=1.0, beta=0.0, c=None, bias=None, bias_dim=None, activation=None,
         out_dtype=None, aux_out=None, up=None):
    _inputs(a, b)
    if up is not None:  # gated: act(a @ b) * (a @ up), b and up column-major
        if up.dtype != b.dtype or up.shape != b.shape or b.stride(0) != 1 or up.stride(0) != 1:
            raise errors.LayoutError("up= takes column-major b and up of one dtype and shape")
        result = (_ACT[activation](a.double() @ b.double()) * (a.double() @ up.double())).to(a.dtype)
        return result if out is None else out.copy_(result)
    if a.dim() < 2 or b.dim() != 2 or a.shape[-1] != b.shape[0]:
        raise errors.ShapeError(f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    rows = a.shape[:-1]  # (..., K): the leading dimensions are rows, as numba_hopper.gemm reads them
    a = a.reshape(rows.numel(), a.shape[-1])
    m, k = a.shape
    n = b.shape[1]
    fused = alpha != 1.0 or beta != 0.0 or bias is not None or activation is not None or aux_out is not None
    if k == 0 and fused:
        raise ValueError("K == 0 with a fused epilogue is not supported")
    if bias is not None and bias_dim is None and m == n:
        raise ValueError("bias_dim is needed when M == N")
    acc = alpha * (a.double() @ b.double())
    if c is not None and beta != 0:
        acc = acc + beta * c.double()
    if bias is not None:
        acc = acc + (bias.double()[:, None] if bias_dim == 0 else bias.double()[None, :])
    if aux_out is not None:
        aux_out.copy_(acc.reshape(aux_out.shape))
    result = _ACT[activation](acc).to(_DTYPES[out_dtype] or a.dtype).reshape(*rows, n)
    return result if out is None else out.copy_(result)


def _tma_matrices(name, t, row_major_only=False):
    s_batch, s_row, s_col = t.stride() if t.dim() == 3 else (0, *t.stride())
    size = t.element_size()
    pitch = s_row if s_col == 1 else (None if row_major_only else s_col if s_row == 1 else None)
    batch_ok = t.dim() == 2 or t.shape[0] == 1 or s_batch * size % 16 == 0
    if pitch is None or pitch * size % 16 or t.data_ptr() % 16 or not batch_ok:
        raise ValueError(f"bmm: {name} must hold 16-byte-aligned matrices; strides {t.stride()}")


def bmm(a, b, out=None, *, out_dtype=None):
    _inputs(a, b)
    if {a.dim(), b.dim()} - {2, 3}:
        raise errors.ShapeError("bmm takes 2-D or 3-D operands")
    if a.shape[-1] != b.shape[-2]:
        raise errors.ShapeError(f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[-1] > 0:
        _tma_matrices("a", a)
        _tma_matrices("b", b)
        if out is not None:
            _tma_matrices("out", out, row_major_only=True)
    result = (a.double() @ b.double()).to(_DTYPES[out_dtype] or (out.dtype if out is not None else a.dtype))
    return result if out is None else out.copy_(result)


def install(monkeypatch):
    """Route ``numba_hopper.torch``'s calls to this stand-in for the test."""
    from numba_hopper.matmul import api

    monkeypatch.setattr(api, "gemm", _no_grad(gemm))
    monkeypatch.setattr(api, "bmm", _no_grad(bmm))


def _no_grad(fn):
    """``fn`` recording no autograd graph, as the GPU kernels record none: gradients must come
    from ``numba_hopper.torch``'s formulas."""
    return torch.no_grad()(fn)
