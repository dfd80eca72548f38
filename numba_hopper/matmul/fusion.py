"""A GEMM call's fused-epilogue keywords: checked into a :class:`Fusion`, and read cheaply per call.

``out = act(alpha * row_scale[:, None] * col_scale[None, :] * (a @ b) + beta * c + bias)``, with
``aux_out`` the value before the activation, ``epilogue`` a user device function after it,
``amax_out`` the largest ``|out|`` and ``scale_out`` a last factor (fp8 outputs)
(``kernels/epilogue.py`` compiles each feature in only when it is asked for).
"""

from __future__ import annotations

import dataclasses
from numbers import Real

from numba import cuda

from ..runtime.arrays import DeviceView, device_view, transpose
from .checks import EPILOGUE_DTYPES, FP8_DTYPES, check_dtype, check_strides, rows_of
from ..runtime.operands import describe
from ..errors import DeviceMismatchError, DtypeError, ShapeError
from ..kernels.epilogue import ACTIVATIONS, EpilogueConfig
from ..kernels.gemm_config import KBLOCK_SCALE

__all__ = ["NAMES", "fusion_args", "fusion_key_and_values", "Fusion", "check_fusion", "numba_array", "user_arg",
           "is_array"]

NAMES = ("alpha", "beta", "c", "bias", "bias_dim", "activation", "aux_out", "epilogue", "epilogue_args",
         "row_scale", "col_scale", "a_block_scales", "b_block_scales", "scale_out", "amax_out", "up")
# The arrays whose addresses a call passes, in the order of the call's values (after alpha,
# beta); ``scale_out`` given as a number passes the number.
ARRAYS = ("c", "row_scale", "col_scale", "bias", "aux_out", "a_block_scales", "b_block_scales", "scale_out",
          "amax_out", "up")
NUMBER = "number"  # the signature of a scale given as a Python number (its value is a call's)


def fusion_args(alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, epilogue_args, row_scale, col_scale,
                block_scales=None, scale_out=None, amax_out=None, up=None):
    """The epilogue keywords as a dict (``gemm`` calls this only when one of them is not its
    default: a plain GEMM runs the plain kernel). ``block_scales``: fp8 block-wise ``(scale_a,
    scale_b)`` (``_scales``), which the kernel reads with the epilogue's arrays."""
    return dict(zip(NAMES, (alpha, beta, c, bias, bias_dim, activation, aux_out, epilogue, tuple(epilogue_args),
                            row_scale, col_scale, *(block_scales or (None, None)), scale_out, amax_out, up)))


def fusion_key_and_values(f):
    """``(key, values)`` of a fused call: what decides its kernel and plan (array layouts,
    compile-time flags, user scalars), and what changes from call to call (``alpha``,
    ``beta`` and the arrays' addresses, user arrays last). ``c`` counts only if ``beta != 0``."""
    key, values = [f["alpha"] != 1.0, f["beta"] != 0.0, f["bias_dim"], f["activation"], f["epilogue"]], []
    for name in ARRAYS:
        x = f[name] if name != "c" or f["beta"] != 0.0 else None
        if name == "scale_out" and isinstance(x, Real):
            sig, ptr = NUMBER, float(x)
        else:
            sig, ptr = describe(x) if x is not None else (None, 0)
        key.append(sig)
        values.append(ptr)
    for x in f["epilogue_args"]:
        if is_array(x):
            sig, ptr = describe(x)
            key.append(sig)
            values.append(ptr)
        else:  # scalars are packed into the kernel's arguments once: part of the key
            key.append((type(x), x))
    return tuple(key), (float(f["alpha"]), float(f["beta"]), *values)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """A checked fused epilogue: views of its arrays, in the user's (M, N) coordinates."""

    alpha: float
    beta: float
    c: DeviceView | None
    bias: DeviceView | None
    bias_dim: int
    activation: str | None
    aux: DeviceView | None
    user: object
    user_args: tuple
    row_scale: DeviceView | None
    col_scale: DeviceView | None
    a_block_scales: DeviceView | None = None
    b_block_scales: DeviceView | None = None
    out_scale: float | DeviceView | None = None
    amax: DeviceView | None = None
    up: DeviceView | None = None

    def transposed(self):
        """The same epilogue for the kernel that computes ``out.T``."""
        return dataclasses.replace(
            self, c=self.c and transpose(self.c), aux=self.aux and transpose(self.aux), bias_dim=1 - self.bias_dim,
            row_scale=self.col_scale, col_scale=self.row_scale)

    def config(self, transposed):
        return EpilogueConfig(
            alpha=self.alpha != 1.0, row_scale=self.row_scale is not None, col_scale=self.col_scale is not None,
            c_dtype=self.c and self.c.dtype, bias=self.bias and ("row", "col")[self.bias_dim],
            bias_dtype=self.bias.dtype if self.bias else "f32", activation=self.activation,
            aux_dtype=self.aux and self.aux.dtype, user=self.user, transposed=transposed,
            block_scales=self.a_block_scales is not None, amax=self.amax is not None,
            out_scale=None if self.out_scale is None else "number" if isinstance(self.out_scale, float) else "array",
            gated=self.up is not None)


def check_fusion(f, M, N, K, device, dtype, out_dtype, rows=None) -> Fusion:
    """Check the epilogue keywords against an (M, N) output of ``out_dtype`` of a K-long
    product, or a ``(*rows, N)`` one whose leading dimensions merge into the M rows; return a
    :class:`Fusion` (in (M, N))."""
    def matrix(name, x):
        return rows_of(name, view(name, x, (*(rows or (M,)), N)))

    def view(name, x, shape, dtypes=EPILOGUE_DTYPES):
        v = device_view(x)
        if v.dtype == "u16" and dtype:
            v = v.with_dtype(dtype)
        if tuple(v.shape) != shape:
            raise ShapeError(f"{name} has shape {tuple(v.shape)}, expected {shape}")
        check_dtype(f"{name}.dtype", v.dtype, dtypes)
        if v.device != device:
            raise DeviceMismatchError(f"{name} is on device {v.device}, the inputs on device {device}")
        check_strides(name, v)
        return v

    if f["activation"] not in (None,) + ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {ACTIVATIONS}; got {f['activation']!r}")
    if f["beta"] != 0.0 and f["c"] is None:
        raise ValueError(f"beta = {f['beta']} needs c")
    c = f["c"] if f["beta"] != 0.0 else None  # BLAS: C is not read when beta == 0
    bias, bias_dim = f["bias"], f["bias_dim"]
    if bias is not None:
        length = device_view(bias).shape[0] if len(device_view(bias).shape) == 1 else None
        if bias_dim is None:
            if M == N:
                raise ValueError(f"bias of length {length} fits rows and columns of the {M} x {N} output: "
                                 "pass bias_dim=0 (one value per row) or bias_dim=1 (per column)")
            bias_dim = {N: 1, M: 0}.get(length)
        if bias_dim not in (0, 1):
            raise ValueError(f"bias_dim must be 0 (per row, length M = {M}) or 1 (per column, length N = {N}); "
                             f"got bias_dim={f['bias_dim']!r} for a bias of shape {device_view(bias).shape}")
    elif bias_dim is not None:
        raise ValueError("bias_dim was given without a bias")
    user = f["epilogue"]
    if user is not None and not hasattr(user, "py_func"):
        raise TypeError(f"epilogue must be a @cuda.jit(device=True) function; got {type(user).__name__}")
    if f["epilogue_args"] and user is None:
        raise ValueError("epilogue_args were given without an epilogue function")
    return Fusion(
        alpha=float(f["alpha"]), beta=float(f["beta"]),
        c=c if c is None else matrix("c", c),
        bias=bias if bias is None else view("bias", bias, ((M, N)[bias_dim],)),
        bias_dim=1 if bias_dim is None else bias_dim,
        activation=f["activation"],
        aux=f["aux_out"] if f["aux_out"] is None else matrix("aux_out", f["aux_out"]),
        user=user,
        user_args=f["epilogue_args"],
        row_scale=f["row_scale"] if f["row_scale"] is None else view("row_scale", f["row_scale"], (M,), ("f32",)),
        col_scale=f["col_scale"] if f["col_scale"] is None else view("col_scale", f["col_scale"], (N,), ("f32",)),
        **_block_scale_views(f, M, N, K, view),
        **_fp8_output_views(f, out_dtype, view),
        **_up_view(f, K, N, view),
    )


def _up_view(f, K, N, view):
    """``up``, checked: a (K, N) B like ``b``, with nothing else fused but the activation."""
    if f["up"] is None:
        return {}
    others = [name for name in NAMES if name not in ("activation", "up", "epilogue_args", "alpha", "beta")
              and f[name] is not None] + [name for name, plain in (("alpha", 1.0), ("beta", 0.0)) if f[name] != plain]
    if others:
        raise ValueError(f"up= fuses only an activation; got {', '.join(others)} too")
    return {"up": view("up", f["up"], (K, N), ("bf16", "f16"))}


def _block_scale_views(f, M, N, K, view):
    if f["a_block_scales"] is None:
        return {}
    kb, nb = -(-K // KBLOCK_SCALE), -(-N // KBLOCK_SCALE)
    return {"a_block_scales": view("scale_a", f["a_block_scales"], (M, kb), ("f32",)),
            "b_block_scales": view("scale_b", f["b_block_scales"], (kb, nb), ("f32",))}


def _fp8_output_views(f, out_dtype, view):
    """``out_scale`` (a number or a one-element view) and ``amax``, checked."""
    def one_element(name, x):
        shape = tuple(device_view(x).shape)
        if shape not in ((), (1,), (1, 1)):
            raise ShapeError(f"{name} must hold one element (shape (), (1,) or (1, 1)); got shape {shape}")
        return dataclasses.replace(view(name, x, shape, ("f32",)), shape=(1,), strides=(1,))

    views = {}
    scale, amax = f["scale_out"], f["amax_out"]
    if scale is not None:
        if out_dtype not in FP8_DTYPES:
            raise DtypeError(f"scale_out scales an fp8 output (out_dtype 'e4m3' or 'e5m2'); this one is "
                             f"{out_dtype}: fold the factor into alpha")
        views["out_scale"] = float(scale) if isinstance(scale, Real) else one_element("scale_out", scale)
    if amax is not None:
        views["amax"] = one_element("amax_out", amax)
    return views


def numba_array(v: DeviceView, typestr=None):
    """A numba device array over a view (16-bit floats as their uint16 bits, or ``typestr``),
    for a kernel."""
    return cuda.from_cuda_array_interface(
        {"shape": tuple(v.shape), "strides": v.byte_strides,
         "typestr": typestr or ("<f4" if v.itemsize == 4 else "<u2"),
         "data": (v.ptr, False), "version": 3},
        owner=None, sync=False)


def user_arg(x):
    """An epilogue argument as numba can pass it: device arrays become numba arrays."""
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, cuda.devicearray.DeviceNDArray):
        return cuda.as_cuda_array(x, sync=False)
    return x


def is_array(x) -> bool:
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "data_ptr")
