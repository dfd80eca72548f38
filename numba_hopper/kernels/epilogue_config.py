"""The fused epilogue's interface: its compile-time :class:`EpilogueConfig` and its run-time
:class:`EpilogueArgs` (whose fields are the epilogue rows of :data:`~.operands.OPERANDS`).
The device code is :mod:`numba_hopper.kernels.epilogue`."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

from .operands import FLOAT_DTYPES, OPERANDS

__all__ = ["EpilogueConfig", "EpilogueArgs", "ACTIVATIONS", "GLU_ACTIVATIONS", "FLOAT_DTYPES", "epilogue_argument_type"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid")
GLU_ACTIVATIONS = ("silu",)

# The epilogue's operands, in the order of EpilogueArgs' fields.
_ARGS = tuple(op for op in OPERANDS if op.kernel == "epilogue")


@dataclasses.dataclass(frozen=True)
class EpilogueConfig:
    """Compile-time shape of a fused epilogue (kernel coordinates; see :mod:`~numba_hopper.kernels.epilogue`).

    ``scalar_col_scale``: ``col_scale`` has one value for every column (stride 0: a per-tensor
    device scale), read once per tile into each row's factor instead of staged per column.
    ``c_dtype``: dtype of ``C`` (None: no ``beta * C``); ``bias``: None, "row" (``bias[r]``,
    length M) or "col" (``bias[c]``, length N); ``aux_dtype``: dtype of the pre-activation
    output (None: none); ``user``: a ``@cuda.jit(device=True)`` function or None;
    ``out_scale``: None, "number" (a float32 argument) or "array" (a one-element float32
    array, read on the device); ``amax``: whether to raise a one-element array to the
    largest ``|v|`` stored.
    ``glu``: None, or the activation (one of ``GLU_ACTIVATIONS``) of a gated linear unit
    ``h = act(g) * u`` whose gradient ``dh`` the product is: the kernel reads the gate's
    products ``g`` and the up products ``u`` (the output's 16-bit dtype) through C's path and
    writes ``dg = dh * u * act'(g)`` to the output and ``du = dh * act(g)`` to a second output,
    so ``dh`` never reaches memory; no other term.
    """

    alpha: bool = False
    row_scale: bool = False
    col_scale: bool = False
    scalar_col_scale: bool = False
    c_dtype: str | None = None
    bias: str | None = None
    bias_dtype: str = "f32"
    activation: str | None = None
    aux_dtype: str | None = None
    user: object = None
    transposed: bool = False
    out_scale: str | None = None
    amax: bool = False
    glu: str | None = None

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
        if self.scalar_col_scale and not self.col_scale:
            raise ValueError("scalar_col_scale describes a col_scale: set col_scale too")
        if self.out_scale not in (None, "number", "array"):
            raise ValueError(f"out_scale must be None, 'number' or 'array', got {self.out_scale!r}")
        if self.glu is not None:
            others = [f.name for f in dataclasses.fields(self) if f.name not in ("glu", "bias_dtype")
                      and getattr(self, f.name) != f.default]
            if self.glu not in GLU_ACTIVATIONS or others:
                raise ValueError(f"glu takes an activation in {GLU_ACTIVATIONS} and no other term; got "
                                 f"glu={self.glu!r}" + (f", {', '.join(others)}" if others else ""))

    @property
    def scale_only(self) -> bool:
        """Whether it only multiplies (``alpha``, ``row_scale``, ``col_scale``): then split-K's
        reduce can apply it after summing the K slices."""
        return (self.c_dtype, self.bias, self.activation, self.aux_dtype, self.user, self.out_scale) == (None,) * 6 \
            and not self.amax

    @property
    def arg_names(self) -> tuple:
        """The :class:`EpilogueArgs` fields this epilogue uses (those whose ``flag`` it sets).

        ``alpha``/``beta``: float32; ``row_scale``/``col_scale``: float32 vectors; ``bias``:
        a vector (uint16 bits or float32); ``aux``: a 2-D array (likewise); ``user_args``: a
        tuple; ``out_scale``: a float32, or a one-element float32 array; ``amax``: a
        one-element uint32 array (a float32's bits). (C arrives through a tensor map.)
        """
        return tuple(op.name for op in _ARGS if getattr(self, op.flag))

    @property
    def fuses_more(self) -> bool:
        """Whether it computes more than ``alpha`` times the product."""
        return bool(self.row_scale or self.col_scale or self.c_dtype or self.bias or self.activation or self.aux_dtype
                    or self.user is not None or self.transposed or self.out_scale or self.amax)

    def column_bytes(self, block_n):
        """Shared memory a consumer stages its tile's column vectors in (f32, ``block_n`` each)."""
        vectors = (self.col_scale and not self.scalar_col_scale) + (self.bias == "col")
        return 4 * block_n * vectors


EpilogueArgs = namedtuple("EpilogueArgs", [op.name for op in _ARGS],
                          defaults=tuple(() if op.form == "args" else 0 for op in _ARGS))
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
