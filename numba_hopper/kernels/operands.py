"""A GEMM call's operands besides ``a``, ``b`` and ``out``, declared once: :data:`OPERANDS`.

Each row names one operand and says how it travels: the keyword a call gives it by, its
shape and dtypes (what the call checks), and where the kernel reads it. Everything that
lists operands derives from this table: the fused epilogue's run-time record
(:class:`~numba_hopper.kernels.epilogue_config.EpilogueArgs` and
``EpilogueConfig.arg_names``), the order of a call's values (``numba_hopper.matmul.plan``),
its plan-cache key and the checks of its keywords (``numba_hopper.matmul.fusion``). Adding an
operand is adding a row here, then the device code that reads it and the compile-time flag
that compiles that code in.

Most rows are the fused epilogue's. The fp8 block-wise scales and a gated product's B_up are
the mainloop's, given to the call beside the epilogue's keywords and handled alike up to the
launch.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Operand", "OPERANDS", "OPERAND", "FLOAT_DTYPES"]

FLOAT_DTYPES = ("bf16", "f16", "f32")  # of the epilogue's arrays (c, bias, aux)


class Operand(NamedTuple):
    """One row of :data:`OPERANDS`.

    ``name``: the operand's name in the host's records (``Fusion.operands``, the plan's
    ``VALUE_INDEX``) and, for the epilogue's, its :class:`EpilogueArgs` field. ``keyword``: the
    call's keyword (checks name it). ``form``: "number" (a float32 scalar), "array", "number or
    array" (a float32 scalar, or a one-element array read on the device) or "args" (the user
    epilogue's argument tuple, whose arrays follow the table's values). ``shape``: an array's
    shape in symbols, resolved by the call: "M", "N", "K", "KB" and "NB" (ceil(K / 128) and
    ceil(N / 128): the 128-blocks of fp8 block-wise scales), "rows" (the output's leading
    dimensions, merged into its M rows), "bias" (the bias's checked shape: (N,) or (1, N) per
    column, (M,) or (M, 1) per row; the kernel reads it as a vector) and "one" (one element,
    shape (), (1,) or (1, 1)). ``dtypes``: an array's allowed dtypes. ``kernel``: where the
    kernel reads it: "epilogue" (an :class:`EpilogueArgs` field), "map" (a tensor map) or
    "params" (a ``GemmParams`` field). ``flag``: the ``EpilogueConfig`` field that compiles an
    epilogue operand in (the operand is used where it is set). ``access``: "read", "written"
    (the kernel writes it), or None (a vector or a scalar, left out of the calls' per-call
    overlap check, which stays short). ``default``: a number's value that compiles nothing.
    ``bits``: the typestr the kernel reads an array as, where that is not its dtype's.
    """

    name: str
    keyword: str
    form: str
    shape: tuple = ()
    dtypes: tuple = ()
    kernel: str = "epilogue"
    flag: str | None = None
    access: str | None = None
    default: float = 0.0
    bits: str | None = None


_F32 = ("f32",)

OPERANDS = (
    Operand("beta", "beta", "number", flag="c_dtype"),
    Operand("alpha", "alpha", "number", flag="alpha", default=1.0),
    Operand("c", "c", "array", ("rows", "N"), FLOAT_DTYPES, kernel="map", access="read"),
    Operand("row_scale", "row_scale", "array", ("M",), _F32, flag="row_scale"),
    Operand("col_scale", "col_scale", "array", ("N",), _F32, flag="col_scale"),
    Operand("bias", "bias", "array", ("bias",), FLOAT_DTYPES, flag="bias"),
    Operand("aux", "aux_out", "array", ("rows", "N"), FLOAT_DTYPES, flag="aux_dtype", access="written"),
    Operand("user_args", "epilogue_args", "args", flag="user"),
    Operand("out_scale", "scale_out", "number or array", ("one",), _F32, flag="out_scale"),
    # (raised with an integer atomic max on the float32's bits, which order as |v| does)
    Operand("amax", "amax_out", "array", ("one",), _F32, flag="amax", access="written", bits="<u4"),
    Operand("a_block_scales", "scale_a", "array", ("M", "KB"), _F32, kernel="map"),
    Operand("b_block_scales", "scale_b", "array", ("KB", "NB"), _F32, kernel="params"),
    Operand("up", "up", "array", ("K", "N"), ("bf16", "f16"), kernel="map", access="read"),
)
OPERAND = {op.name: op for op in OPERANDS}
