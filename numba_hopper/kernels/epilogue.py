"""The GEMM's epilogue: accumulators to the output, with the fused math on the way.

The store (:func:`make_epilogue`), per consumer warpgroup and output tile: accumulators
-> output dtype -> shared memory (``stmatrix``, 128-byte-swizzled like the output's tensor
map, so the writes are bank-conflict free; 8-byte stores for f32, 2-byte ones for fp8 pairs)
-> ``fence.proxy.async`` -> one thread issues a TMA store of a 64 x 64 (16-bit, fp8) or
64 x 32 (f32) sub-tile. Two sub-tile buffers per
consumer alternate, so a store drains while the next sub-tile is written, and the last
stores of a tile drain while the next tile's main loop runs (``cfg.epi_buffers`` = 1: one
buffer, each sub-tile waits until the store before it has read it). TMA clips stores outside the
tensor, so partial tiles need no code.

Grouped kernels (``cfg.grouped``): a tile's rows may run past its group's end
(``GroupTile.row_end``), into the next group's rows of the same output, which TMA would not
clip (it clips at the tensor's bounds only). A consumer whose 64 rows all lie before the end
stores them as above; one whose rows cross it writes its sub-tiles to shared memory the same
way, then its 128 threads copy the rows before the end to global memory, 16 bytes each
(coalesced: 8 threads per 128-byte row); one whose rows all lie past the end stores nothing.
That keeps the TMA path for every full warpgroup and costs the few boundary tiles a
copy through registers. The alternative, a tensor map per group rewritten on the device
(``tensormap.replace`` of its row count), would need every CTA to patch and fence a map
whenever its group changes, with TMA stores of the old map possibly still in flight.

The fused math, for each in-bounds element (row r, column c) of the kernel's row-major
output tile:

    v = acc * alpha * row_scale[r] * col_scale[c]      (each factor only if asked)
    v = v + beta * C[r, c] + bias[r or c]              (likewise)
    aux[r, c] = v                                      (the pre-activation value, if asked)
    v = activation(v)
    v = user(v, r, c, *user_args)                      (a @cuda.jit(device=True) function)
    amax = max(amax, |v|)                              (if asked)
    v = v * out_scale                                  (if asked; fp8 outputs saturate)

A gated epilogue (``gated``: ``act(A @ B) * (A @ B_up)``, the GLU of SwiGLU and GeGLU MLPs) has
only the activation: the kernel's tile is B's ``block_n / 2`` columns then B_up's, so register
``k`` of a thread's fragment (column ``col``) and register ``k + block_n / 4`` (column
``col + block_n / 2``) are the same output element's two products, and the store writes
``activation(acc[k]) * acc[k + block_n / 4]`` to the tile's ``block_n / 2`` output columns.

``amax`` is a thread's running maximum over every tile it stores, kept as the bits of
``|v|`` (which order as the floats do, NaN highest); at the end each warp reduces it
(``redux.sync``) and one lane raises the global value with an atomic max: one atomic per
warp per CTA, not per element or tile.

Every feature is a compile-time flag of :class:`EpilogueConfig`, so a kernel carries only
the code it uses; the run-time values reach the kernel as one :class:`EpilogueArgs`. The
row and column vectors are loaded when a tile's main loop starts and the column terms
staged in shared memory after it, so the store reads each with one shared load. C comes
in by TMA, one sub-tile (64 rows x ``epi_cols``) at a time into two buffers per consumer,
each with its own mbarrier: the consumer's leader issues the loads of a tile's first two
sub-tiles as its main loop starts, and that of sub-tile q + 2 as soon as sub-tile q has
been read.

Column-major outputs (``cfg.out_major == "M"``: the 64 x 8 or 64 x 16 tiles of a decode
product computed swapped) take a path of their own: each thread writes its fragment's
elements transposed, one 16-bit store each, into an unswizzled buffer of ``block_n``
128-byte rows (the output's rows are the kernel's columns), and the leader stores it with
one TMA box. Such tiles are small, so the single buffer per consumer costs little.

Coordinates are the KERNEL's: for a column-major output the host runs the kernel on the
transposed problem and passes transposed operands, swapped scales and the bias along the
other dimension; ``transposed`` then swaps (row, col) back for the user's function.
16-bit vectors and ``aux`` travel as their ``uint16`` bits (numba has no bf16).
"""

from __future__ import annotations

import dataclasses
import math
from collections import namedtuple

import numpy as np
from numba import cuda

from .. import intrinsics as nh
from ..intrinsics import (bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, ld_shared_v2_f32, st_shared_v2_f32,
                          tanh_approx)
from .gemm_config import ELEMENT_BYTES, EPI_BUF_BYTES, EPI_ROWS, FP8_DTYPES, WG_ROWS

__all__ = ["EpilogueConfig", "EpilogueArgs", "ACTIVATIONS", "Epilogue", "EpilogueState", "make_epilogue",
           "epilogue_argument_type", "c_box_cols"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
FLOAT_DTYPES = ("bf16", "f16", "f32")

# float32 constants: a Python float would promote the math to float64.
_ZERO, _ONE, _HALF = np.float32(0), np.float32(1), np.float32(0.5)
_NO_AMAX = np.uint32(0)  # the bits of +0.0
_SQRT_HALF = np.float32(math.sqrt(0.5))
_GELU_K = np.float32(math.sqrt(2 / math.pi))
_GELU_KC = np.float32(math.sqrt(2 / math.pi) * 0.044715)


@dataclasses.dataclass(frozen=True)
class EpilogueConfig:
    """Compile-time shape of a fused epilogue (kernel coordinates; see the module doc).

    ``c_dtype``: dtype of ``C`` (None: no ``beta * C``); ``bias``: None, "row" (``bias[r]``,
    length M) or "col" (``bias[c]``, length N); ``aux_dtype``: dtype of the pre-activation
    output (None: none); ``user``: a ``@cuda.jit(device=True)`` function or None;
    ``out_scale``: None, "number" (a float32 argument) or "array" (a one-element float32
    array, read on the device); ``amax``: whether to raise a one-element array to the
    largest ``|v|`` stored.
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
    block_scales: bool = False
    out_scale: str | None = None
    amax: bool = False
    gated: bool = False

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
        if self.out_scale not in (None, "number", "array"):
            raise ValueError(f"out_scale must be None, 'number' or 'array', got {self.out_scale!r}")
        if self.gated:
            others = [f.name for f in dataclasses.fields(self) if f.name not in ("activation", "gated")
                      and getattr(self, f.name) != f.default]
            if others:
                raise ValueError(f"a gated epilogue fuses an activation only; got {', '.join(others)}")

    @property
    def scale_only(self) -> bool:
        """Whether it only multiplies (``alpha``, ``row_scale``, ``col_scale``): then split-K's
        reduce can apply it after summing the K slices."""
        return (self.c_dtype, self.bias, self.activation, self.aux_dtype, self.user, self.out_scale) == (None,) * 6 \
            and not (self.block_scales or self.amax or self.gated)

    @property
    def arg_names(self) -> tuple:
        """The :class:`EpilogueArgs` fields this epilogue uses.

        ``alpha``/``beta``: float32; ``row_scale``/``col_scale``: float32 vectors; ``bias``:
        a vector (uint16 bits or float32); ``aux``: a 2-D array (likewise); ``user_args``: a
        tuple; ``b_block_scales``: a float32 (ceil(K / 128), ceil(N / 128)) matrix; ``out_scale``:
        a float32, or a one-element float32 array; ``amax``: a one-element uint32 array (a
        float32's bits). (C and A's block-wise scales arrive through tensor maps, not here.)
        """
        present = (("beta", self.c_dtype), ("alpha", self.alpha),
                   ("row_scale", self.row_scale), ("col_scale", self.col_scale), ("bias", self.bias),
                   ("aux", self.aux_dtype), ("user_args", self.user), ("b_block_scales", self.block_scales),
                   ("out_scale", self.out_scale), ("amax", self.amax))
        return tuple(name for name, used in present if used)

    @property
    def fuses_more(self) -> bool:
        """Whether it computes more than ``alpha`` times the product (block-wise scaled or not)."""
        return bool(self.row_scale or self.col_scale or self.c_dtype or self.bias or self.activation or self.aux_dtype
                    or self.user is not None or self.transposed or self.out_scale or self.amax or self.gated)

    def column_bytes(self, block_n):
        """Shared memory a consumer stages its tile's column vectors in (f32, ``block_n`` each)."""
        return 4 * block_n * (self.col_scale + (self.bias == "col"))


EpilogueArgs = namedtuple("EpilogueArgs", ["beta", "alpha", "row_scale", "col_scale", "bias", "aux", "user_args",
                                           "b_block_scales", "out_scale", "amax"],
                          defaults=(0, 0, 0, 0, 0, 0, (), 0, 0, 0))
EpilogueArgs.__doc__ = """The fused epilogue's run-time arguments (the fields of
:attr:`EpilogueConfig.arg_names`; an unused field is 0, or ``()`` for ``user_args``)."""


def epilogue_argument_type(ecfg: EpilogueConfig, arg_types):
    """The numba type of the :class:`EpilogueArgs` of ``ecfg`` whose used fields have the
    types ``arg_types`` (in ``ecfg.arg_names`` order)."""
    from numba.cuda import types

    given = dict(zip(ecfg.arg_names, arg_types))
    unused = {"user_args": types.Tuple(())}
    return types.NamedTuple(tuple(given.get(f, unused.get(f, types.int64)) for f in EpilogueArgs._fields),
                            EpilogueArgs)


def c_box_cols(cfg):
    """Columns of one TMA box of the residual C: ``cfg.epi_cols``, at most 128 bytes of them."""
    return min(cfg.epi_cols, 128 // ELEMENT_BYTES[cfg.epilogue.c_dtype])


@cuda.jit(device=True, forceinline=True)
def _f32(x):
    return x


_LOAD = {"bf16": bf16_to_f32, "f16": f16_to_f32, "f32": _f32}
_STORE = {"bf16": f32_to_bf16, "f16": f32_to_f16, "f32": _f32}
_PACK = {"bf16": nh.pack_bf16x2, "f16": nh.pack_f16x2, "e4m3": nh.pack_e4m3x2, "e5m2": nh.pack_e5m2x2}


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


EpilogueMath = namedtuple("EpilogueMath", ["tile_terms", "stage_columns", "column_terms", "apply"])


def epilogue_math(ecfg: EpilogueConfig, block_n: int) -> EpilogueMath:
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
    column's ``(scale, bias)``, ``ep`` the kernel's :class:`EpilogueArgs`.

    The math is branch-free: vectors are read at indices clamped into range, so elements
    outside the M x N output (the padding of partial tiles, which the TMA store clips) read
    valid memory and their values are dropped. Only side effects are guarded: ``aux`` is
    written and the user function called for in-bounds elements only.
    """
    ALPHA, ROW_SCALE, COL_SCALE = ecfg.alpha, ecfg.row_scale, ecfg.col_scale
    HAS_C, BIAS, AUX = ecfg.c_dtype is not None, ecfg.bias, ecfg.aux_dtype is not None
    COL_BIAS = BIAS == "col"
    USER, HAS_USER = ecfg.user, ecfg.user is not None  # (branches prune on bools, not functions)
    TRANSPOSED = ecfg.transposed
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
        scale = ep.row_scale[r] if ROW_SCALE else _ONE
        bias = load_bias(ep.bias[r]) if BIAS == "row" else _ZERO
        return scale, bias

    @cuda.jit(device=True, forceinline=True)
    def column_pair(vec, col0, N):
        c0, c1 = clamp(col0, N), clamp(col0 + 1, N)
        return vec[c0], vec[c1]

    @cuda.jit(device=True, forceinline=True)
    def tile_terms(row, col0, t, M, N, ep):
        col = col0 + 2 * t
        scales = column_pair(ep.col_scale, col, N) if COL_SCALE else (_ONE, _ONE)
        raw = column_pair(ep.bias, col, N) if COL_BIAS else (0, 0)
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
            v = v * ep.alpha
        if ROW_SCALE:
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


Epilogue = namedtuple("Epilogue", ["init", "start", "begin_tile", "store_tile", "drain"])
EpilogueState = namedtuple("EpilogueState", ["stores", "amax"])
EpilogueState.__doc__ = """A consumer's epilogue across its tiles: ``stores``, its sub-tile stores so far
(they pick the buffers and their phases), and ``amax``, the bits of the largest ``|value|``
it has stored (0 unless the epilogue tracks it)."""
# What a sub-tile's store reads besides the fragment: a fused epilogue's coordinates and
# terms (the distance from the output buffer to C's, the sub-tile's first output row and
# column, the row terms of rows row_in_wg and row_in_wg + 8, the staged column terms).
_Subtile = namedtuple("_Subtile", ["c_offset", "row0", "col0", "M", "N", "ep", "row_terms", "row_terms_8", "columns",
                                   "out_scale"])
# One tile's store, passed through the unrolled sub-tile steps.
_TileStore = namedtuple("_TileStore", ["frag", "smem", "c", "row0", "n0", "batch", "tmap_d", "tmap_c", "M", "N", "ep",
                                       "terms"])
# A grouped tile's store through registers: ``rows`` of its 64 to write, at ``d`` (the first
# element of the output matrix, row-major with N columns).
_GuardedStore = namedtuple("_GuardedStore", _TileStore._fields + ("rows", "d"))


def make_epilogue(cfg) -> Epilogue:
    """The epilogue of the GEMM kernel of ``cfg`` (:class:`~.gemm_config.GemmConfig`): an
    :class:`Epilogue` of device functions, for one consumer warpgroup ``c``
    (:class:`~.gemm_config.Consumer`).

    - ``init(smem)``: (one thread, before the block's barrier) C's mbarriers, if any;
    - ``start() -> state``: a consumer's :class:`EpilogueState` before its first tile;
    - ``begin_tile(smem, c, tile, state, tmap_c, params, ep) -> terms``: as the tile's main
      loop starts, the loads of its row and column terms and of its first C sub-tiles;
    - ``store_tile(frag, smem, c, tile, rows, state, tmap_d, tmap_c, params, ep, terms) ->
      state``: the tile's 64-row block ``rows`` (the consumer's own, ``c.cw``, or with
      ping-pong either) from the accumulator fragment ``frag`` to global memory;
    - ``drain(c, state, ep)``: wait for the consumer's last stores; with ``amax``, raise
      ``ep.amax`` to the warp's largest ``|value|``.
    """
    BN, OUT_T, CONSUMERS = cfg.out_block_n, cfg.out_dtype, cfg.consumers
    GATED = cfg.gated
    UP_REGS = cfg.block_n // 4  # (gated) a fragment's B_up registers follow its B registers
    GROUPED, MASKED = cfg.grouped is not None, cfg.grouped == "masked"
    D_BATCHED = cfg.grouped != "contiguous"  # a contiguous grouped output is one matrix
    OUT_BYTES = ELEMENT_BYTES[OUT_T]
    FP8_OUT = OUT_T in FP8_DTYPES
    EPI = cfg.epilogue
    FUSED, HAS_C = EPI is not None, cfg.has_c
    AMAX = FUSED and EPI.amax
    SCALE_OUT, SCALE_OUT_ARRAY = FUSED and EPI.out_scale is not None, FUSED and EPI.out_scale == "array"
    EPI_COLS = cfg.epi_cols
    EPI_CHUNKS = BN // EPI_COLS
    COL_MAJOR = cfg.out_major == "M"
    EPI_ROW_BYTES = cfg.epi_swizzle or 128  # (column-major outputs: unswizzled 128-byte rows)
    EPI_GROUPS = EPI_COLS // 16  # stmatrix 16-column groups of a 16-bit sub-tile
    COL_GROUPS = EPI_COLS // 8  # 8-column groups of a sub-tile
    SWIZZLE_MASK = EPI_ROW_BYTES // 16 - 1
    ROW_SHIFT = {128: 0, 64: 1, 32: 2}[EPI_ROW_BYTES]  # log2 of the rows in 128 bytes
    ROW_CHUNKS = EPI_ROW_BYTES // 16  # 16-byte chunks of a sub-tile row
    CHUNK_COLS = 16 // ELEMENT_BYTES[OUT_T]
    layout = cfg.layout
    EPI_OFF, VEC_OFF, VEC_BYTES = layout.epi, layout.vec, layout.vec_bytes
    EPI_BUFS = cfg.epi_buffers
    STORES_IN_FLIGHT = EPI_BUFS - 1  # a consumer's TMA stores that may still read its buffers
    C_OFF, C_BAR_OFF, C_BUF = layout.c, layout.c_barriers, cfg.c_buf_bytes
    C_BOX_COLS = c_box_cols(cfg) if HAS_C else EPI_COLS
    C_BOX_BYTES = EPI_ROWS * C_BOX_COLS * (ELEMENT_BYTES[EPI.c_dtype] if HAS_C else 2)
    C_BOXES = EPI_COLS // C_BOX_COLS
    c_f32_pair, c_quad = _residual_reader(cfg) if HAS_C else (None, None)
    tile_terms, stage_columns, column_terms, apply = epilogue_math(EPI, BN) if FUSED else (None,) * 4
    pack = _PACK.get(OUT_T)

    @cuda.jit(device=True, forceinline=True)
    def pair(frag, k, row_in_wg, j, col, c, ct, at):
        """Registers ``k``, ``k + 1`` (sub-tile row ``row_in_wg + 8j``, columns ``col``, ``col`` + 1), as
        stored, and the bits of the larger of their in-bounds ``|value|`` (before the output
        scale; 0 without ``amax``).

        ``c``: C's f32 pair there (if any); ``ct``: the two columns' terms (:func:`columns`);
        ``at``: the sub-tile's ``_Subtile`` (None without a fused epilogue).
        """
        if not FUSED:
            return frag[k], frag[k + 1], _NO_AMAX
        row, col = at.row0 + row_in_wg + 8 * j, at.col0 + col
        rt = at.row_terms if j == 0 else at.row_terms_8
        v0 = apply(frag[k], c[0], rt, ct[0], row, col, at.M, at.N, at.ep)
        v1 = apply(frag[k + 1], c[1], rt, ct[1], row, col + 1, at.M, at.N, at.ep)
        if GATED:
            v0, v1 = v0 * frag[k + UP_REGS], v1 * frag[k + 1 + UP_REGS]
        m = _NO_AMAX
        if AMAX and row < at.M:  # the padding of partial tiles holds bias and C terms too
            m = max(nh.abs_bits(v0) if col < at.N else _NO_AMAX, nh.abs_bits(v1) if col + 1 < at.N else _NO_AMAX)
        if SCALE_OUT:
            v0, v1 = v0 * at.out_scale, v1 * at.out_scale
        return v0, v1, m

    @cuda.jit(device=True, forceinline=True)
    def out_scale(ep):
        if SCALE_OUT_ARRAY:
            return ep.out_scale[0]
        return ep.out_scale if SCALE_OUT else _ONE

    @cuda.jit(device=True, forceinline=True)
    def swizzled(buf, r, byte):
        """The address of byte ``byte`` of row ``r`` of an output sub-tile in ``buf``, as TMA
        swizzles it: 16-byte chunk c at chunk c ^ ((r >> ROW_SHIFT) & SWIZZLE_MASK), the row
        bits above 128 bytes (the row's part is the same for every chunk a thread writes)."""
        return buf + r * EPI_ROW_BYTES + (((byte >> 4) ^ ((r >> ROW_SHIFT) & SWIZZLE_MASK)) << 4) + (byte & 15)

    @cuda.jit(device=True, forceinline=True)
    def columns(q, col, at):
        """The staged terms of sub-tile ``q``'s columns ``col`` and ``col + 1`` (fused only)."""
        return column_terms(at.columns, q * EPI_COLS + col) if FUSED else (0, 0)

    @cuda.jit(device=True, forceinline=True)
    def write_subtile(frag, buf, q, row_in_wg, lane, at):
        """Sub-tile ``q`` of this thread's accumulator fragment into swizzled ``buf``.

        Fragment of m64nNk16 (thread t, warp w = t // 32, lane l): register 4i + 2j + c
        holds row 16w + l//4 + 8j, column 8i + 2(l%4) + c. 128B swizzle: the 16-byte
        chunk ``c`` of row ``r`` lives at chunk ``c ^ (r % 8)`` (64B: ``c ^ ((r // 2) % 4)``,
        32B: ``c ^ ((r // 4) % 2)``: :func:`swizzled`). A fused epilogue (:func:`pair`) maps
        each pair of values on the way. Returns the bits of the largest in-bounds ``|value|``
        (0 without ``amax``).
        """
        amax = _NO_AMAX
        if OUT_T == "f32" or FP8_OUT:  # a pair is 8 or 2 bytes, stored at its place in the swizzled row
            for ii in range(COL_GROUPS):
                i = COL_GROUPS * q + ii
                for j in range(2):
                    r = row_in_wg + 8 * j
                    col = 8 * ii + 2 * (lane % 4)
                    addr = swizzled(buf, r, col * OUT_BYTES)
                    k = 4 * i + 2 * j
                    c = c_f32_pair(buf, addr, r, col, at) if HAS_C else (frag[k], frag[k])
                    v0, v1, m = pair(frag, k, row_in_wg, j, col, c, columns(q, col, at), at)
                    amax = max(amax, m)
                    if FP8_OUT:
                        nh.st_shared_u16(addr, pack(v0, v1))
                    else:
                        nh.st_shared_v2_f32(addr, v0, v1)
        else:
            # stmatrix.x4: matrix m (its row addresses from lanes 8m..8m+7) is the 8x8 block
            # at rows 8*(m%2), columns 8*(m//2) of a 16x16 block = registers 8P+2m, 8P+2m+1.
            m = lane // 8
            r = (row_in_wg - lane // 4) + 8 * (m % 2) + lane % 8
            for p in range(EPI_GROUPS):  # 16-column groups of this sub-tile
                base = 8 * (EPI_GROUPS * q + p)
                chunk = 2 * p + m // 2
                addr = swizzled(buf, r, 16 * chunk)
                col = 16 * p + 2 * (lane % 4)
                f = (frag[base], frag[base])
                c = c_quad(buf, addr, row_in_wg, col, at) if HAS_C else (f, f, f, f)
                # register pair x = 2h + j: row row_in_wg + 8j, column col + 8h
                ct0, ct1 = columns(q, col, at), columns(q, col + 8, at)
                v = (
                    pair(frag, base + 0, row_in_wg, 0, col, c[0], ct0, at),
                    pair(frag, base + 2, row_in_wg, 1, col, c[1], ct0, at),
                    pair(frag, base + 4, row_in_wg, 0, col + 8, c[2], ct1, at),
                    pair(frag, base + 6, row_in_wg, 1, col + 8, c[3], ct1, at),
                )
                regs = (
                    pack(v[0][0], v[0][1]),
                    pack(v[1][0], v[1][1]),
                    pack(v[2][0], v[2][1]),
                    pack(v[3][0], v[3][1]),
                )
                amax = max(amax, v[0][2], v[1][2], v[2][2], v[3][2])
                nh.stmatrix_x4(addr, regs[0], regs[1], regs[2], regs[3])
        return amax

    to_bits = f32_to_bf16 if OUT_T == "bf16" else f32_to_f16

    @cuda.jit(device=True, forceinline=True)
    def store_transposed(frag, smem, c, row0, n0, batch, tmap_d, state):
        """(Column-major output) the consumer's 64 x BN tile: element (r, col) of the fragment
        (register 4i + 2j + h: r = row_in_wg + 8j, col = 8i + 2(lane % 4) + h) to byte
        128 col + 2 r of the buffer, then one TMA store of the (BN, 64) box."""
        buf = smem + EPI_OFF + c.cw * EPI_BUF_BYTES
        if c.leader:
            nh.bulk_wait_group_read(0)  # the previous tile's store has read the buffer
        nh.named_barrier_sync(1 + c.cw, 128)
        for i in range(BN // 8):
            for j in range(2):
                for h in range(2):
                    col = 8 * i + 2 * (c.lane % 4) + h
                    nh.st_shared_u16(buf + 128 * col + 2 * (c.row_in_wg + 8 * j), to_bits(frag[4 * i + 2 * j + h]))
        nh.fence_proxy_async()
        nh.named_barrier_sync(1 + c.cw, 128)
        if c.leader:
            nh.tma_store_3d(tmap_d, buf, row0, n0, batch)
            nh.bulk_commit_group()
        return EpilogueState(state.stores + 1, state.amax)

    @cuda.jit(device=True, forceinline=True)
    def load_c(smem, cw, s, tmap, row0, col0, bc):
        """(Leader) start loading C's 64 x EPI_COLS sub-tile at (``row0``, ``col0``) as sub-tile
        ``s`` of this consumer's sequence: into buffer s % 2, completing phase s // 2 of that
        buffer's mbarrier."""
        slot = 2 * cw + s % 2
        bar = smem + C_BAR_OFF + 8 * slot
        nh.mbarrier_arrive_expect_tx(bar, C_BUF)
        for box in range(C_BOXES):
            nh.tma_load_3d(smem + C_OFF + slot * C_BUF + box * C_BOX_BYTES, tmap, col0 + box * C_BOX_COLS, row0, bc,
                           bar)

    @cuda.jit(device=True, forceinline=True)
    def store_subtile(q, state, ts):
        """Sub-tile ``q`` of a tile (the consumer's ``state.stores``-th) to global memory; the next state."""
        c, smem, stores = ts.c, ts.smem, state.stores
        buf = smem + EPI_OFF + (EPI_BUFS * c.cw + stores % EPI_BUFS) * EPI_BUF_BYTES
        if c.leader:
            nh.bulk_wait_group_read(STORES_IN_FLIGHT)  # the store that last read buf is done
        nh.named_barrier_sync(1 + c.cw, 128)
        at = None
        if FUSED:
            slot = 2 * c.cw + stores % 2
            if HAS_C:
                nh.mbarrier_wait_parity(smem + C_BAR_OFF + 8 * slot, (stores // 2) % 2)
            at = _Subtile(smem + C_OFF + slot * C_BUF - buf, ts.row0, ts.n0 + q * EPI_COLS, ts.M, ts.N, ts.ep,
                          ts.terms[0], ts.terms[1], smem + VEC_OFF + c.cw * VEC_BYTES, out_scale(ts.ep))
        amax = write_subtile(ts.frag, buf, q, c.row_in_wg, c.lane, at)
        nh.fence_proxy_async()
        nh.named_barrier_sync(1 + c.cw, 128)
        if c.leader:
            nh.tma_store_3d(ts.tmap_d, buf, ts.n0 + q * EPI_COLS, ts.row0, ts.batch)
            nh.bulk_commit_group()
        if HAS_C and c.leader and q + 2 < EPI_CHUNKS:  # every thread has read C sub-tile q: refill its buffer
            load_c(smem, c.cw, stores + 2, ts.tmap_c, ts.row0, ts.n0 + (q + 2) * EPI_COLS, ts.batch)
        return EpilogueState(stores + 1, max(state.amax, amax))

    @cuda.jit(device=True, forceinline=True)
    def store_subtile_guarded(q, state, ts):
        """Sub-tile ``q`` as :func:`store_subtile`, but only its first ``ts.rows`` rows, copied
        from the swizzled buffer to global memory by every thread (grouped kernels)."""
        c, smem, stores = ts.c, ts.smem, state.stores
        buf = smem + EPI_OFF + (EPI_BUFS * c.cw + stores % EPI_BUFS) * EPI_BUF_BYTES
        if c.leader:
            nh.bulk_wait_group_read(0)  # no TMA store of this consumer still reads either buffer
        nh.named_barrier_sync(1 + c.cw, 128)
        at = None
        if FUSED:
            at = _Subtile(0, ts.row0, ts.n0 + q * EPI_COLS, ts.M, ts.N, ts.ep, ts.terms[0], ts.terms[1],
                          smem + VEC_OFF + c.cw * VEC_BYTES, out_scale(ts.ep))
        amax = write_subtile(ts.frag, buf, q, c.row_in_wg, c.lane, at)
        nh.named_barrier_sync(1 + c.cw, 128)  # the sub-tile is in shared memory
        col0 = ts.n0 + q * EPI_COLS
        for i in range(ROW_CHUNKS // 2):  # 64 rows x ROW_CHUNKS 16-byte chunks over 128 threads
            idx = c.t + 128 * i
            r = idx // ROW_CHUNKS
            k = idx % ROW_CHUNKS
            col = col0 + k * CHUNK_COLS
            if r < ts.rows and col < ts.N:  # N is a multiple of CHUNK_COLS (the host checks)
                v = nh.ld_shared_v4_u32(swizzled(buf, r, 16 * k))
                nh.st_global_v4_u32(ts.d + np.uint64(((ts.row0 + r) * ts.N + col) * OUT_BYTES), v[0], v[1], v[2], v[3])
        return EpilogueState(stores + 1, max(state.amax, amax))

    # q must be a constant in each sub-tile's code: LLVM leaves a loop over a fused epilogue
    # rolled, and a run-time q would index the fragment, moving it to local memory. The
    # plain kernel keeps its loop (LLVM unrolls it).
    subtiles = (_unrolled if FUSED else _looped)(store_subtile, EPI_CHUNKS)
    guarded_subtiles = (_unrolled if FUSED else _looped)(store_subtile_guarded, EPI_CHUNKS) if GROUPED else None

    @cuda.jit(device=True, forceinline=True)
    def init(smem):
        if HAS_C:
            for slot in range(2 * CONSUMERS):
                nh.mbarrier_init(smem + C_BAR_OFF + 8 * slot, 1)

    @cuda.jit(device=True, forceinline=True)
    def start():
        return EpilogueState(0, _NO_AMAX)

    @cuda.jit(device=True, forceinline=True)
    def begin_tile(smem, c, tile, state, tmap_c, p, ep):
        row0 = tile.m0 + c.cw * WG_ROWS
        if MASKED:  # row vectors are (G, M) in one: group g's rows start at g * M
            terms = tile_terms(tile.batch * p.M + row0 + c.row_in_wg, tile.n0, c.t, p.batches * p.M, p.N,
                               ep) if FUSED else ()
        else:
            terms = tile_terms(row0 + c.row_in_wg, tile.n0, c.t, p.M, p.N, ep) if FUSED else ()
        if HAS_C and c.leader:  # C's first two sub-tiles land during the main loop
            for q in range(min(2, EPI_CHUNKS)):
                load_c(smem, c.cw, state.stores + q, tmap_c, row0, tile.n0 + q * EPI_COLS, tile.batch)
        return terms

    @cuda.jit(device=True, forceinline=True)
    def store_tile(frag, smem, c, tile, rows, state, tmap_d, tmap_c, p, ep, terms):
        if FUSED:  # the previous tile's reads of the staged columns are behind its last barrier
            stage_columns(smem + VEC_OFF + c.cw * VEC_BYTES, c.t, terms[2])
        row0 = tile.m0 + rows * WG_ROWS
        if COL_MAJOR:
            return store_transposed(frag, smem, c, row0, tile.n0, tile.batch, tmap_d, state)
        if not GROUPED:
            n0 = tile.n0 // 2 if GATED else tile.n0  # (gated: the kernel's columns are B's and B_up's)
            return subtiles(state, _TileStore(frag, smem, c, row0, n0, tile.batch, tmap_d, tmap_c, p.M, p.N,
                                              ep, terms))
        batch = tile.batch if D_BATCHED else 0
        rows = tile.row_end - row0  # the same for the whole warpgroup: its barriers agree
        if rows >= WG_ROWS:
            return subtiles(state, _TileStore(frag, smem, c, row0, tile.n0, batch, tmap_d, tmap_c, p.M, p.N, ep,
                                              terms))
        if rows > 0:
            d = p.out_address + batch * p.M * p.N * OUT_BYTES
            return guarded_subtiles(state, _GuardedStore(frag, smem, c, row0, tile.n0, batch, tmap_d, tmap_c, p.M,
                                                         p.N, ep, terms, rows, d))
        return state

    @cuda.jit(device=True, forceinline=True)
    def drain(c, state, ep):
        if c.leader:
            nh.bulk_wait_group(0)
        if AMAX:  # one atomic per warp (module doc)
            m = nh.redux_sync_max_u32(state.amax)
            if c.lane == 0:
                cuda.atomic.max(ep.amax, 0, m)

    return Epilogue(init, start, begin_tile, store_tile, drain)


def _residual_reader(cfg):
    """``(c_f32_pair, c_quad)``: the residual C's values as the store needs them, read from
    a C sub-tile buffer at ``at.c_offset`` from the output sub-tile buffer ``buf``."""
    C_ITEM = ELEMENT_BYTES[cfg.epilogue.c_dtype]
    C_BOX_ROW = c_box_cols(cfg) * C_ITEM  # bytes: the box row is also its swizzle span
    C_BOX_BYTES = EPI_ROWS * C_BOX_ROW
    C_SWIZZLE_MASK = C_BOX_ROW // 16 - 1
    C_LIKE_OUT = C_ITEM == ELEMENT_BYTES[cfg.out_dtype]  # C's buffer is laid out as the output's
    unpack = nh.unpack_bf16x2 if cfg.epilogue.c_dtype == "bf16" else nh.unpack_f16x2

    @cuda.jit(device=True, forceinline=True)
    def c_pair(cbuf, r, col):
        """C at (row ``r``, columns ``col``, ``col`` + 1) of the sub-tile in ``cbuf``, as f32."""
        byte = col * C_ITEM
        off = (byte // C_BOX_ROW) * C_BOX_BYTES + r * C_BOX_ROW + byte % C_BOX_ROW
        addr = cbuf + (off ^ (((off >> 7) & C_SWIZZLE_MASK) << 4))  # the TMA swizzle
        if C_ITEM == 4:
            return nh.ld_shared_v2_f32(addr)
        return unpack(nh.ld_shared_u32(addr))


    @cuda.jit(device=True, forceinline=True)
    def c_f32_pair(buf, addr, r, col, at):
        """C's pair at sub-tile (``r``, ``col``) for an f32 output pair stored at ``addr``."""
        if C_LIKE_OUT:  # the same offset in C's buffer
            return nh.ld_shared_v2_f32(addr + at.c_offset)
        return c_pair(buf + at.c_offset, r, col)


    @cuda.jit(device=True, forceinline=True)
    def c_quad(buf, addr, r, col, at):
        """C's four pairs of one stmatrix.x4 (pair x = 2h + j at (r + 8j, col + 8h))."""
        if C_LIKE_OUT:  # ldmatrix.x4 at stmatrix's addresses returns its registers
            regs = nh.ldmatrix_x4(addr + at.c_offset)
            return unpack(regs[0]), unpack(regs[1]), unpack(regs[2]), unpack(regs[3])
        cbuf = buf + at.c_offset
        return (c_pair(cbuf, r, col), c_pair(cbuf, r + 8, col),
                c_pair(cbuf, r, col + 8), c_pair(cbuf, r + 8, col + 8))


    return c_f32_pair, c_quad


def _unrolled(step, n):
    """Device function ``run(x, args)``: ``x = step(q, x, args)`` for q = 0, ..., n - 1.

    Each call has its own q, a compile-time constant (closure constants), so the steps are
    unrolled whatever LLVM's unroller thinks of their size.
    """

    @cuda.jit(device=True, forceinline=True)
    def run(x, args):
        return x

    for q in range(n):
        run = _then(run, step, q)
    return run


def _looped(step, n):
    """``run(x, args)`` as :func:`_unrolled`, as a plain loop (left to LLVM to unroll)."""

    @cuda.jit(device=True, forceinline=True)
    def run(x, args):
        for q in range(n):
            x = step(q, x, args)
        return x

    return run


def _then(run, step, Q):
    @cuda.jit(device=True, forceinline=True)
    def run_then_step(x, args):
        return step(Q, run(x, args), args)

    return run_then_step
