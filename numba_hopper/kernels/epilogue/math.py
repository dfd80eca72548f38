"""The fused epilogue's math: the activations and :func:`epilogue_math`, the per-element
``v = act(alpha * row_scale[r] * col_scale[c] * acc + beta * C + bias)`` of an
:class:`~numba_hopper.kernels.epilogue_config.EpilogueConfig` (the order is the package doc's)."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from numba import cuda

from ...intrinsics import (bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, ld_shared_v2_f32, st_shared_v2_f32,
                           tanh_approx)
from ...kit.epilogue import NO_MAX
from ..epilogue_config import EpilogueConfig

__all__ = ["EpilogueMath", "epilogue_math", "glu_backward", "sigmoid", "STORE", "ZERO", "ONE", "NO_AMAX"]

# float32 constants: a Python float would promote the math to float64.
ZERO, ONE, _HALF = np.float32(0), np.float32(1), np.float32(0.5)
NO_AMAX = NO_MAX  # the bits of +0.0: no |value| yet (what the tile store's pair hooks return unused)
_SQRT_HALF = np.float32(math.sqrt(0.5))
_GELU_K = np.float32(math.sqrt(2 / math.pi))
_GELU_KC = np.float32(math.sqrt(2 / math.pi) * 0.044715)



@cuda.jit(device=True, forceinline=True)
def _f32(x):
    return x


_LOAD = {"bf16": bf16_to_f32, "f16": f16_to_f32, "f32": _f32}
STORE = {"bf16": f32_to_bf16, "f16": f32_to_f16, "f32": _f32}


@cuda.jit(device=True, forceinline=True)
def _relu(v):
    return v if v > ZERO else ZERO


@cuda.jit(device=True, forceinline=True)
def _gelu(v):
    return _HALF * v * (ONE + math.erf(v * _SQRT_HALF))


@cuda.jit(device=True, forceinline=True)
def _gelu_tanh(v):
    # 0.5 v (1 + tanh(k (v + c v^3))) in five FP32 operations and one MUFU.TANH
    return v * (_HALF + _HALF * tanh_approx(v * (_GELU_K + _GELU_KC * (v * v))))


@cuda.jit(device=True, forceinline=True)
def sigmoid(v):
    """``1 / (1 + exp(-v))`` as ``0.5 + 0.5 tanh(v / 2)``: one MUFU.TANH (relative error about 2^-11)."""
    return _HALF + _HALF * tanh_approx(_HALF * v)


@cuda.jit(device=True, forceinline=True)
def _silu(v):
    return v * sigmoid(v)


_ACTIVATION = {None: _f32, "relu": _relu, "gelu": _gelu, "gelu_tanh": _gelu_tanh,
               "silu": _silu, "sigmoid": sigmoid}


@cuda.jit(device=True, forceinline=True)
def _silu_glu_backward(dh, g, u):
    s = sigmoid(g)  # silu(g) = g s, silu'(g) = s (1 + g (1 - s))
    return dh * u * s * (ONE + g * (ONE - s)), dh * g * s


_GLU_BACKWARD = {"silu": _silu_glu_backward}


def glu_backward(activation):
    """``grads(dh, g, u) -> (dg, du)``: the gradients of a gated unit ``h = act(g) * u``'s two
    inputs from ``dh`` (f32), for ``activation`` in ``GLU_ACTIVATIONS``."""
    return _GLU_BACKWARD[activation]


EpilogueMath = namedtuple("EpilogueMath", ["tile_terms", "stage_columns", "column_terms", "apply"])


def epilogue_math(ecfg: EpilogueConfig, block_n: int, aux_elements: bool = True) -> EpilogueMath:
    """Device functions ``(tile_terms, stage_columns, column_terms, apply)`` for ``ecfg``;
    ``aux_elements``: ``apply`` writes ``aux`` (False: the caller stores it another way).

    The vectors are read once per tile, not per element: ``tile_terms(row, col0, t, M, N,
    ep) -> (rt0, rt1, cols)``, called when a tile's main loop starts so that the loads land
    during it, gives the float32 ``(scale, bias)`` of output rows ``row`` and ``row + 8``
    (a thread's rows; 1 and 0 where unused) and ``cols``, the column terms of columns
    ``col0 + 2t`` and ``col0 + 2t + 1`` for thread ``t`` (of 128) of a consumer. After the
    main loop ``stage_columns(addr, t, cols)`` stores them to the consumer's
    :meth:`EpilogueConfig.column_bytes` of shared memory at ``addr``, where
    ``column_terms(addr, col)`` returns the ``(scale, bias)`` pairs of tile columns ``col``
    and ``col + 1`` (``col`` even) with one 8-byte load per vector.

    ``apply(v, c, rt, ct, row, col, M, N, ep) -> float32``: ``v`` the f32 accumulator, ``c``
    the f32 value of ``C[row, col]`` (ignored without C), ``rt``/``ct`` the row's and the
    column's ``(scale, bias)``, ``ep`` the kernel's :class:`EpilogueArgs`.

    The math is branch-free: vectors are read at indices clamped into range, so elements
    outside the M x N output (the padding of partial tiles, which the TMA store clips) read
    valid memory and their values are dropped. Only side effects are guarded: ``aux`` is
    written and the user function called for in-bounds elements only.
    """
    ALPHA, ROW_SCALE = ecfg.alpha, ecfg.row_scale
    # a stride-0 col_scale is one factor of every row's (loaded once), not a staged vector
    COL_SCALAR = ecfg.col_scale and ecfg.scalar_col_scale
    COL_SCALE = ecfg.col_scale and not COL_SCALAR
    ROW_FACTOR = ROW_SCALE or COL_SCALAR
    HAS_C, BIAS, AUX = ecfg.c_dtype is not None, ecfg.bias, ecfg.aux_dtype is not None and aux_elements
    COL_BIAS = BIAS == "col"
    USER, HAS_USER = ecfg.user, ecfg.user is not None  # (branches prune on bools, not functions)
    TRANSPOSED = ecfg.transposed
    BIAS_AT = 4 * block_n if COL_SCALE else 0  # the staged bias follows the staged scales
    load_bias = _LOAD[ecfg.bias_dtype]
    store_aux = STORE[ecfg.aux_dtype or "f32"]
    activation = _ACTIVATION[ecfg.activation]

    @cuda.jit(device=True, forceinline=True)
    def clamp(i, n):
        """``i`` clamped to ``[0, n)``, unsigned: numba then emits no negative-index wraparound."""
        return np.uint64(min(i, n - 1))

    @cuda.jit(device=True, forceinline=True)
    def row_terms(row, M, ep):
        r = clamp(row, M)
        scale = ep.row_scale[r] if ROW_SCALE else ONE
        if COL_SCALAR:
            scale = scale * ep.col_scale[0]
        bias = load_bias(ep.bias[r]) if BIAS == "row" else ZERO
        return scale, bias

    @cuda.jit(device=True, forceinline=True)
    def column_pair(vec, col0, N):
        c0, c1 = clamp(col0, N), clamp(col0 + 1, N)
        return vec[c0], vec[c1]

    @cuda.jit(device=True, forceinline=True)
    def tile_terms(row, col0, t, M, N, ep):
        col = col0 + 2 * t
        scales = column_pair(ep.col_scale, col, N) if COL_SCALE else (ONE, ONE)
        raw = column_pair(ep.bias, col, N) if COL_BIAS else (0, 0)
        biases = (load_bias(raw[0]), load_bias(raw[1])) if COL_BIAS else (ZERO, ZERO)
        return row_terms(row, M, ep), row_terms(row + 8, M, ep), (scales, biases)

    @cuda.jit(device=True, forceinline=True)
    def stage_columns(addr, t, cols):
        if 2 * t < block_n:
            if COL_SCALE:
                st_shared_v2_f32(addr + 8 * t, cols[0][0], cols[0][1])
            if COL_BIAS:
                st_shared_v2_f32(addr + BIAS_AT + 8 * t, cols[1][0], cols[1][1])

    @cuda.jit(device=True, forceinline=True)
    def column_terms(addr, col):
        scales = ld_shared_v2_f32(addr + 4 * col) if COL_SCALE else (ONE, ONE)
        biases = ld_shared_v2_f32(addr + BIAS_AT + 4 * col) if COL_BIAS else (ZERO, ZERO)
        return (scales[0], biases[0]), (scales[1], biases[1])

    @cuda.jit(device=True, forceinline=True)
    def apply(v, c, rt, ct, row, col, M, N, ep):
        if ALPHA:
            v = v * ep.alpha
        if ROW_FACTOR:
            v = v * rt[0]
        if COL_SCALE:
            v = v * ct[0]
        if HAS_C:
            v = v + ep.beta * c
        if BIAS == "row":
            v = v + rt[1]
        if COL_BIAS:
            v = v + ct[1]
        inside = row < M and col < N
        if AUX:
            if inside:
                ep.aux[np.uint64(row), np.uint64(col)] = store_aux(v)
        v = activation(v)
        if HAS_USER:
            if inside:
                v = np.float32(USER(v, col, row, *ep.user_args) if TRANSPOSED else USER(v, row, col, *ep.user_args))
        return v

    return EpilogueMath(tile_terms, stage_columns, column_terms, apply)

