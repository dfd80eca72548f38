"""Fused GEMM epilogues: the math between the f32 accumulator and the packed output.

For each in-bounds element (row r, column c) of the kernel's row-major output tile:

    v = acc * alpha * row_scale[r] * col_scale[c]      (each factor only if asked)
    v = v + beta * C[r, c] + bias[r or c]              (likewise)
    aux[r, c] = v                                      (the pre-activation value, if asked)
    v = activation(v)
    v = user(v, r, c, *user_args)                      (a @cuda.jit(device=True) function)

Every feature is a compile-time flag of :class:`EpilogueConfig`, so a kernel carries only
the code it uses, and the run-time values reach the kernel as one tuple argument laid out
by ``EpilogueConfig.arg_names``. ``C`` is not read here: the kernel loads it into shared
memory by TMA and hands each element's value to :func:`make_epilogue`'s function.

Coordinates are the KERNEL's: for a column-major output the host runs the kernel on the
transposed problem and passes transposed operands, swapped scales and the bias along the
other dimension; ``transposed`` then swaps (row, col) back for the user's function.
16-bit vectors and ``aux`` travel as their ``uint16`` bits (numba has no bf16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda

from ..intrinsics import (bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, ld_shared_v2_f32, st_shared_v2_f32,
                          tanh_approx)

__all__ = ["EpilogueConfig", "ACTIVATIONS", "make_epilogue"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
FLOAT_DTYPES = ("bf16", "f16", "f32")

# float32 constants: a Python float would promote the math to float64.
_ZERO, _ONE, _HALF = np.float32(0), np.float32(1), np.float32(0.5)
_SQRT_HALF = np.float32(math.sqrt(0.5))
_GELU_K = np.float32(math.sqrt(2 / math.pi))
_GELU_KC = np.float32(math.sqrt(2 / math.pi) * 0.044715)


@dataclass(frozen=True)
class EpilogueConfig:
    """Compile-time shape of a fused epilogue (kernel coordinates; see the module doc).

    ``c_dtype``: dtype of ``C`` (None: no ``beta * C``); ``bias``: None, "row" (``bias[r]``,
    length M) or "col" (``bias[c]``, length N); ``aux_dtype``: dtype of the pre-activation
    output (None: none); ``user``: a ``@cuda.jit(device=True)`` function or None.
    """

    alpha: bool = False
    row_scale: bool = False
    col_scale: bool = False
    c_dtype: str | None = None
    bias: str | None = None
    bias_dtype: str = "f32"
    activation: str | None = None
    aux_dtype: str | None = None
    user: object = None
    transposed: bool = False

    def __post_init__(self):
        if self.activation not in (None,) + ACTIVATIONS:
            raise ValueError(f"activation must be None or one of {ACTIVATIONS}, got {self.activation!r}")
        if self.bias not in (None, "row", "col"):
            raise ValueError(f"bias must be None, 'row' or 'col', got {self.bias!r}")
        for name in ("c_dtype", "aux_dtype"):
            if getattr(self, name) not in (None,) + FLOAT_DTYPES:
                raise ValueError(f"{name} must be None or one of {FLOAT_DTYPES}, got {getattr(self, name)!r}")
        if self.bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"bias_dtype must be one of {FLOAT_DTYPES}, got {self.bias_dtype!r}")

    @property
    def arg_names(self) -> tuple:
        """The run-time epilogue arguments, in the order of the kernel's tuple argument.

        ``alpha``/``beta``: float32; ``row_scale``/``col_scale``: float32 vectors; ``bias``:
        a vector (uint16 bits or float32); ``aux``: a 2-D array (likewise); ``user_args``: a
        tuple. (C itself arrives through a tensor map, not here.)
        """
        present = (("beta", self.c_dtype), ("alpha", self.alpha),
                   ("row_scale", self.row_scale), ("col_scale", self.col_scale), ("bias", self.bias),
                   ("aux", self.aux_dtype), ("user_args", self.user))
        return tuple(name for name, used in present if used)

    def column_bytes(self, block_n):
        """Shared memory a consumer stages its tile's column vectors in (f32, ``block_n`` each)."""
        return 4 * block_n * (self.col_scale + (self.bias == "col"))


@cuda.jit(device=True, forceinline=True)
def _f32(x):
    return x


_LOAD = {"bf16": bf16_to_f32, "f16": f16_to_f32, "f32": _f32}
_STORE = {"bf16": f32_to_bf16, "f16": f32_to_f16, "f32": _f32}


@cuda.jit(device=True, forceinline=True)
def _relu(v):
    return v if v > _ZERO else _ZERO


@cuda.jit(device=True, forceinline=True)
def _gelu(v):
    return _HALF * v * (_ONE + math.erf(v * _SQRT_HALF))


@cuda.jit(device=True, forceinline=True)
def _gelu_tanh(v):
    # 0.5 v (1 + tanh(k (v + c v^3))) in five FP32 operations and one MUFU.TANH
    return v * (_HALF + _HALF * tanh_approx(v * (_GELU_K + _GELU_KC * (v * v))))


@cuda.jit(device=True, forceinline=True)
def _sigmoid(v):
    return _HALF + _HALF * tanh_approx(_HALF * v)  # = 1 / (1 + exp(-v)), one MUFU op


@cuda.jit(device=True, forceinline=True)
def _silu(v):
    return v * _sigmoid(v)


_ACTIVATION = {None: _f32, "relu": _relu, "gelu": _gelu, "gelu_tanh": _gelu_tanh,
               "silu": _silu, "sigmoid": _sigmoid}


def make_epilogue(ecfg: EpilogueConfig, block_n: int):
    """Device functions ``(tile_terms, stage_columns, column_terms, apply)`` for ``ecfg``.

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
    column's ``(scale, bias)``, ``ep`` the kernel's epilogue tuple.

    The math is branch-free: vectors are read at indices clamped into range, so elements
    outside the M x N output (the padding of partial tiles, which the TMA store clips) read
    valid memory and their values are dropped. Only side effects are guarded: ``aux`` is
    written and the user function called for in-bounds elements only.
    """
    names = ecfg.arg_names
    at = {name: names.index(name) for name in names}
    ALPHA, ROW_SCALE, COL_SCALE = ecfg.alpha, ecfg.row_scale, ecfg.col_scale
    HAS_C, BIAS, AUX = ecfg.c_dtype is not None, ecfg.bias, ecfg.aux_dtype is not None
    COL_BIAS = BIAS == "col"
    USER, HAS_USER = ecfg.user, ecfg.user is not None  # (branches prune on bools, not functions)
    TRANSPOSED = ecfg.transposed
    I_ALPHA, I_BETA = at.get("alpha", 0), at.get("beta", 0)
    I_ROW, I_COL, I_BIAS = at.get("row_scale", 0), at.get("col_scale", 0), at.get("bias", 0)
    I_AUX, I_USER = at.get("aux", 0), at.get("user_args", 0)
    BIAS_AT = 4 * block_n if COL_SCALE else 0  # the staged bias follows the staged scales
    load_bias = _LOAD[ecfg.bias_dtype]
    store_aux = _STORE[ecfg.aux_dtype or "f32"]
    activation = _ACTIVATION[ecfg.activation]

    @cuda.jit(device=True, forceinline=True)
    def clamp(i, n):
        """``i`` clamped to ``[0, n)``, unsigned: numba then emits no negative-index wraparound."""
        return np.uint64(min(i, n - 1))

    @cuda.jit(device=True, forceinline=True)
    def row_terms(row, M, ep):
        r = clamp(row, M)
        scale = ep[I_ROW][r] if ROW_SCALE else _ONE
        bias = load_bias(ep[I_BIAS][r]) if BIAS == "row" else _ZERO
        return scale, bias

    @cuda.jit(device=True, forceinline=True)
    def column_pair(vec, col0, N):
        c0, c1 = clamp(col0, N), clamp(col0 + 1, N)
        return vec[c0], vec[c1]

    @cuda.jit(device=True, forceinline=True)
    def tile_terms(row, col0, t, M, N, ep):
        col = col0 + 2 * t
        scales = column_pair(ep[I_COL], col, N) if COL_SCALE else (_ONE, _ONE)
        raw = column_pair(ep[I_BIAS], col, N) if COL_BIAS else (0, 0)
        biases = (load_bias(raw[0]), load_bias(raw[1])) if COL_BIAS else (_ZERO, _ZERO)
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
        scales = ld_shared_v2_f32(addr + 4 * col) if COL_SCALE else (_ONE, _ONE)
        biases = ld_shared_v2_f32(addr + BIAS_AT + 4 * col) if COL_BIAS else (_ZERO, _ZERO)
        return (scales[0], biases[0]), (scales[1], biases[1])

    @cuda.jit(device=True, forceinline=True)
    def apply(v, c, rt, ct, row, col, M, N, ep):
        if ALPHA:
            v = v * ep[I_ALPHA]
        if ROW_SCALE:
            v = v * rt[0]
        if COL_SCALE:
            v = v * ct[0]
        if HAS_C:
            v = v + ep[I_BETA] * c
        if BIAS == "row":
            v = v + rt[1]
        if COL_BIAS:
            v = v + ct[1]
        inside = row < M and col < N
        if AUX:
            if inside:
                ep[I_AUX][np.uint64(row), np.uint64(col)] = store_aux(v)
        v = activation(v)
        if HAS_USER:
            if inside:
                v = np.float32(USER(v, col, row, *ep[I_USER]) if TRANSPOSED else USER(v, row, col, *ep[I_USER]))
        return v

    return tile_terms, stage_columns, column_terms, apply
