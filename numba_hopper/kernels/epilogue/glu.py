"""A gated linear unit's backward as a GEMM epilogue: ``glu_backward(activation, dtype)``, a user
epilogue function (``gemm(..., epilogue=, epilogue_args=)``) for the product ``dh = dy @ W_down``
of a gated MLP ``down(act(gate) * up)``.

With ``h = act(g) * u``, the gradients of the two products the forward kept (``gemm(..., up=,
aux_out=)``) are ``dg = dh * u * act'(g)`` and ``du = dh * act(g)``: the function returns ``dg``
(the GEMM's output) and stores ``du`` itself, so ``dh`` never reaches memory. Arguments:
``(gate, up, d_up)``, (M, N) arrays of the 16-bit dtype's bits (``torch.int16`` views, as numba
has no bf16), read and written at the output's (row, col).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...intrinsics import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16
from .math import ONE, sigmoid

__all__ = ["GLU_ACTIVATIONS", "glu_backward"]

GLU_ACTIVATIONS = ("silu",)
_CONVERT = {"bf16": (bf16_to_f32, f32_to_bf16), "f16": (f16_to_f32, f32_to_f16)}


def _make(load, store):
    @cuda.jit(device=True, forceinline=True)
    def silu_glu_backward(dh, row, col, gate, up, d_up):
        g, u = load(np.uint16(gate[row, col])), load(np.uint16(up[row, col]))
        s = sigmoid(g)  # silu(g) = g s, silu'(g) = s (1 + g (1 - s))
        d_up[row, col] = store(dh * g * s)
        return dh * u * s * (ONE + g * (ONE - s))

    return silu_glu_backward


_FUNCTIONS = {dtype: _make(*convert) for dtype, convert in _CONVERT.items()}


def glu_backward(activation: str, dtype: str):
    """The epilogue function of a GLU's backward for ``activation`` (one of ``GLU_ACTIVATIONS``)
    and 16-bit ``dtype`` ("bf16" or "f16"); one function per dtype, so each compiles once."""
    if activation not in GLU_ACTIVATIONS:
        raise ValueError(f"a GLU backward runs activation in {GLU_ACTIVATIONS}; got {activation!r}")
    if dtype not in _FUNCTIONS:
        raise ValueError(f"a GLU backward runs bf16 or f16; got {dtype!r}")
    return _FUNCTIONS[dtype]
