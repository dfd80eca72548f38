"""A GEMM call's fused-epilogue keywords: checked into a :class:`Fusion`, and read cheaply per call.

``out = act(alpha * row_scale[:, None] * col_scale[None, :] * (a @ b) + beta * c + bias)``, with
``aux_out`` the value before the activation, ``epilogue`` a user device function after it,
``amax_out`` the largest ``|out|`` and ``scale_out`` a last factor (fp8 outputs)
(``kernels/epilogue`` compiles each feature in only when it is asked for). The fp8 block-wise
scales and a gated product's ``up`` come with these keywords, though the mainloop reads them.

Each operand's keyword, shape, dtypes and place in a call's values are its row of
:data:`~numba_hopper.kernels.operands.OPERANDS`; this module reads the rows, once at import.
"""

from __future__ import annotations

import dataclasses
from numbers import Real

from numba import cuda

from .. import _numba_internals as _internals
from ..runtime.arrays import DeviceView, device_view, transpose
from .checks import FP8_DTYPES, check_dtype, check_strides, rows_of
from ..runtime.operands import describe
from ..errors import DeviceMismatchError, DtypeError, ShapeError
from ..kernels.epilogue_config import ACTIVATIONS, EpilogueConfig
from ..kernels.gemm_config import KBLOCK_SCALE
from ..kernels.operands import OPERAND, OPERANDS

__all__ = ["NAMES", "VALUE_OPERANDS", "fusion_args", "fusion_key_and_values", "Fusion", "check_fusion", "numba_array",
           "numba_array_type", "user_arg", "is_array"]

# The call's fused keywords: the operands' and the compile-time choices'.
NAMES = (*(op.keyword for op in OPERANDS), "bias_dim", "activation", "epilogue")
# The operands with a value in a call's values, in their order (the user's arguments come last).
VALUE_OPERANDS = tuple(op for op in OPERANDS if op.form != "args")
NUMBER = "number"  # the signature of a scale given as a Python number (its value is a call's)
# What fusion_key_and_values reads of each: (keyword, a number's default or None, number or array).
_KEYED = tuple((op.keyword, op.default if op.form == "number" else None, op.form == "number or array")
               for op in VALUE_OPERANDS)
# The transposed problem's names (Fusion.transposed).
_SWAPPED = {"row_scale": "col_scale", "col_scale": "row_scale"}
# The fused keywords that a gated product (``up``) leaves at their defaults.
_NOT_GATED = tuple(name for name in NAMES
                   if name not in ("activation", "up", "aux_out", "epilogue_args", "alpha", "beta"))


def fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args, row_scale, col_scale,
                block_scales=None, scale_out=None, amax_out=None, up=None):
    """The epilogue keywords as a dict (``gemm`` calls this only when one of them is not its
    default: a plain GEMM runs the plain kernel). ``block_scales``: fp8 block-wise ``(scale_a,
    scale_b)`` (``scales``), which the mainloop reads."""
    scale_a, scale_b = block_scales or (None, None)
    return {"alpha": alpha, "beta": beta, "c": c, "bias": bias, "bias_dim": bias_dim, "activation": activation,
            "aux_out": aux_out, "epilogue": epilogue, "epilogue_args": tuple(epilogue_args), "row_scale": row_scale,
            "col_scale": col_scale, "scale_a": scale_a, "scale_b": scale_b, "scale_out": scale_out,
            "amax_out": amax_out, "up": up}


def fusion_key_and_values(f):
    """``(key, values)`` of a fused call: what decides its kernel and plan (array layouts,
    compile-time flags, user scalars), and what changes from call to call (the numbers and
    the arrays' addresses, in ``VALUE_OPERANDS``' order, then the user's arrays).
    ``c`` counts only if ``beta != 0``."""
    if f["beta"] == 0.0 and f["c"] is not None:  # BLAS: C is not read
        f = {**f, "c": None}
    key, values = [f["bias_dim"], f["activation"], f["epilogue"]], []
    for keyword, default, number_or_array in _KEYED:
        x = f[keyword]
        if default is not None:  # a number
            key.append(x != default)
            values.append(float(x))
        elif x is None:
            key.append(None)
            values.append(0)
        elif number_or_array and isinstance(x, Real):
            key.append(NUMBER)
            values.append(float(x))
        else:
            sig, ptr = describe(x)
            key.append(sig)
            values.append(ptr)
    for x in f["epilogue_args"]:
        if is_array(x):
            sig, ptr = describe(x)
            key.append(sig)
            values.append(ptr)
        else:  # scalars are packed into the kernel's arguments once: part of the key
            key.append((type(x), x))
    return tuple(key), tuple(values)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """A checked fused epilogue, in the user's (M, N) coordinates: ``operands``, name -> the
    checked view (or the number) of each operand of ``OPERANDS`` that compiles something
    (alpha only where it is not 1, beta and c only where beta is not 0), and the compile-time
    choices."""

    operands: dict = dataclasses.field(default_factory=dict)
    bias_dim: int = 1
    activation: str | None = None
    user: object = None
    user_args: tuple = ()

    @property
    def block_scaled(self) -> bool:
        """Whether the mainloop scales each k-block (fp8 block-wise ``scale_a``, ``scale_b``)."""
        return "a_block_scales" in self.operands

    @property
    def gated(self) -> bool:
        """Whether the product is gated (``up``)."""
        return "up" in self.operands

    def of_zero_product(self):
        """This epilogue for a product with K == 0, or None where it leaves the output zero: the
        block-wise scales go (they would scale nothing); what is left runs as usual on a zero
        accumulator (``act(beta * c + bias)``, ``act(0) * 0`` gated, ...)."""
        operands = {name: v for name, v in self.operands.items() if name not in ("a_block_scales", "b_block_scales")}
        if not operands and self.activation is None and self.user is None:
            return None
        return dataclasses.replace(self, operands=operands)

    def transposed(self):
        """The same epilogue for the kernel that computes ``out.T``."""
        operands = {_SWAPPED.get(name, name): transpose(v) if OPERAND[name].shape == ("rows", "N") else v
                    for name, v in self.operands.items()}
        return dataclasses.replace(self, operands=operands, bias_dim=1 - self.bias_dim)

    def config(self, transposed):
        """The :class:`EpilogueConfig` that compiles this epilogue in (``transposed``: for the
        kernel of ``out.T``)."""
        ops = self.operands
        c, bias, aux, scale = ops.get("c"), ops.get("bias"), ops.get("aux"), ops.get("out_scale")
        col_scale = ops.get("col_scale")
        return EpilogueConfig(
            alpha="alpha" in ops, row_scale="row_scale" in ops, col_scale=col_scale is not None,
            scalar_col_scale=col_scale is not None and (col_scale.strides[0] == 0 or col_scale.shape[0] == 1),
            c_dtype=c and c.dtype, bias=bias and ("row", "col")[self.bias_dim],
            bias_dtype=bias.dtype if bias else "f32", activation=self.activation,
            aux_dtype=aux and aux.dtype, user=self.user, transposed=transposed, amax="amax" in ops,
            out_scale=None if scale is None else "number" if isinstance(scale, float) else "array")


def check_fusion(f, M, N, K, device, dtype, out_dtype, rows=None) -> Fusion:
    """Check the epilogue keywords against an (M, N) output of ``out_dtype`` of a K-long
    product, or a ``(*rows, N)`` one whose leading dimensions merge into the M rows; return a
    :class:`Fusion` (in (M, N))."""
    if f["activation"] not in (None,) + ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {ACTIVATIONS}; got {f['activation']!r}")
    if f["beta"] != 0.0 and f["c"] is None:
        raise ValueError(f"beta = {f['beta']} needs c")
    bias_dim, bias_shape = _bias_dim(f, M, N)
    user = f["epilogue"]
    if user is not None and not hasattr(user, "py_func"):
        raise TypeError(f"epilogue must be a @cuda.jit(device=True) function; got {type(user).__name__}")
    if f["epilogue_args"] and user is None:
        raise ValueError("epilogue_args were given without an epilogue function")
    if f["scale_out"] is not None and out_dtype not in FP8_DTYPES:
        raise DtypeError(f"scale_out scales an fp8 output (out_dtype 'e4m3' or 'e5m2'); this one is "
                         f"{out_dtype}: fold the factor into alpha")
    if f["up"] is not None:
        others = [name for name in _NOT_GATED if f[name] is not None] + \
            [name for name in ("alpha", "beta") if f[name] != OPERAND[name].default]
        if others:
            raise ValueError(f"up= fuses only an activation and aux_out; got {', '.join(others)} too")
    sizes = {"M": M, "N": N, "K": K, "KB": -(-K // KBLOCK_SCALE), "NB": -(-N // KBLOCK_SCALE), "rows": rows or (M,),
             "bias": bias_shape}
    gated_sizes = {**sizes, "N": 2 * N}  # a gated aux_out holds both products
    operands = {}
    for op in VALUE_OPERANDS:
        x = f[op.keyword]
        if op.form == "number":
            if x != op.default:
                operands[op.name] = float(x)
        elif x is not None and (op.name != "c" or f["beta"] != 0.0):  # BLAS: C is not read when beta == 0
            operands[op.name] = float(x) if op.form != "array" and isinstance(x, Real) else \
                _checked_view(op, x, gated_sizes if op.name == "aux" and f["up"] is not None else sizes, device, dtype)
    return Fusion(operands, 1 if bias_dim is None else bias_dim, f["activation"], user, f["epilogue_args"])


def _bias_dim(f, M, N):
    """``(dim, shape)`` of ``bias``: the dimension it runs along (0: one value per row, 1: per
    column) and its shape as checked, or ``(None, None)`` without one. As ``torch.addmm`` and
    ``F.linear`` broadcast it, a 1-D bias is one value per column, whatever M and N are; per
    row is asked for with ``bias_dim=0`` or an (M, 1) bias ((1, N) is per column)."""
    bias, bias_dim = f["bias"], f["bias_dim"]
    if bias is None:
        if bias_dim is not None:
            raise ValueError("bias_dim was given without a bias")
        return None, None
    if bias_dim is not None and (isinstance(bias_dim, bool) or bias_dim not in (0, 1)):
        raise ValueError(f"bias_dim must be None, 0 (one value per row) or 1 (one per column); got {bias_dim!r}")
    shape = tuple(device_view(bias).shape)
    if bias_dim is None:
        fits = {1: ((N,), (1, N)), 0: ((M, 1),)}
    else:
        fits = {int(bias_dim): (((M,), (M, 1)), ((N,), (1, N)))[int(bias_dim)]}
    for dim, shapes in fits.items():
        if shape in shapes:
            return dim, shape
    per_col = f"(N,) = ({N},) or (1, N) = (1, {N}), one value per column"
    expected = {None: f"{per_col}, or (M, 1) = ({M}, 1), one per row (or (M,) = ({M},) with bias_dim=0)",
                0: f"(M,) = ({M},) or (M, 1) = ({M}, 1), one value per row", 1: per_col}[bias_dim]
    given = "" if bias_dim is None else f" with bias_dim={bias_dim}"
    raise ShapeError(f"bias has shape {shape}{given} for the {M} x {N} output; expected {expected}")


def _checked_view(op, x, sizes, device, dtype):
    """The array ``x`` of operand ``op``, checked against its row: shape (``sizes`` resolves
    its symbols), dtype, device and strides. ``dtype`` reads ``uint16`` arrays as bf16/f16."""
    name = op.keyword
    v = device_view(x)
    if v.dtype == "u16" and dtype:
        v = v.with_dtype(dtype)
    if op.shape == ("one",):
        shape = tuple(v.shape)
        if shape not in ((), (1,), (1, 1)):
            raise ShapeError(f"{name} must hold one element (shape (), (1,) or (1, 1)); got shape {shape}")
    else:
        shape = tuple(n for symbol in op.shape for n in (sizes[symbol] if symbol in ("rows", "bias")
                                                         else (sizes[symbol],)))
        if tuple(v.shape) != shape:
            raise ShapeError(f"{name} has shape {tuple(v.shape)}, expected {shape}")
    check_dtype(f"{name}.dtype", v.dtype, op.dtypes)
    if v.device != device:
        raise DeviceMismatchError(f"{name} is on device {v.device}, the inputs on device {device}")
    check_strides(name, v)
    if op.shape == ("one",):
        return dataclasses.replace(v, shape=(1,), strides=(1,))
    if op.shape == ("bias",) and v.ndim == 2:  # (M, 1) or (1, N): the vector along its long side
        keep = 0 if v.shape[1] == 1 else 1
        return dataclasses.replace(v, shape=(v.shape[keep],), strides=(v.strides[keep],))
    return rows_of(name, v) if op.shape[0] == "rows" else v


def numba_array(v: DeviceView, typestr=None):
    """A numba device array over a view (16-bit floats as their uint16 bits, or ``typestr``),
    for a kernel."""
    return cuda.from_cuda_array_interface(_interface(v, typestr), owner=None, sync=False)


def numba_array_type(v: DeviceView, typestr=None):
    """The numba type of ``numba_array(v, typestr)`` as a kernel argument (its layout types
    it: "C" or "F" where contiguous, else "A"), found without a device."""
    return _internals.array_interface_type(_interface(v, typestr))


def _interface(v: DeviceView, typestr):
    return {"shape": tuple(v.shape), "strides": v.byte_strides,
            "typestr": typestr or ("<f4" if v.itemsize == 4 else "<u2"), "data": (v.ptr, False), "version": 3}


def user_arg(x):
    """An epilogue argument as numba can pass it: device arrays become numba arrays."""
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, cuda.devicearray.DeviceNDArray):
        return cuda.as_cuda_array(x, sync=False)
    return x


def is_array(x) -> bool:
    """Whether ``x`` is a device array (a user epilogue's argument passed by address)."""
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "data_ptr")
