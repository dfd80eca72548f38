"""Turn a PTX template and operand types into a numba intrinsic.

Each intrinsic in this package is one call to :func:`ptx_intrinsic`::

    mbarrier_arrive = ptx_intrinsic(
        "mbarrier_arrive",
        "mbarrier.arrive.shared::cta.b64 _, [{bar}];",
        bar="u32",
        doc="PTX ISA 9.7.13.15.13 mbarrier.arrive",
    )

Operands are declared as keyword arguments, in call order, each with a kind:

- ``"u16" "u32" "u64" "s32" "s64" "b32" "b64" "f32" "f64"``: a run-time value in a
  register. Integer kinds accept any numba integer (or boolean) and are truncated or
  extended; float kinds accept any number.
- ``Const(check)``: a compile-time integer; the caller must pass a literal (or a global
  or closure constant). ``check(value)`` returns an error string (or None) and runs at
  typing time, so a bad value, or a run-time value, is a typing error naming the
  intrinsic and the operand. The value is pasted into the template as text.
- ``Choice("a", "b", ...)``: a compile-time string literal from a fixed set, pasted into
  the template.

``{name}`` in the template is replaced by the operand (``$i`` for registers, the text for
constants). Braces that do not enclose a declared operand name are left alone, so PTX
scope blocks (``{ .reg .pred p; ... }``) need no escaping.

``result`` is ``None`` (void), a register kind (the PTX writes it as ``{out}``),
``"bool"``: the PTX writes a ``u32`` 0/1 into ``{out}`` (usually through ``selp``) and the
intrinsic returns a numba boolean, or ``(kind, count)``: the PTX writes ``{out0}`` ..
``{out<count-1>}`` and the intrinsic returns a ``UniTuple`` of ``count`` (``ldmatrix``).

By default an intrinsic is a volatile asm with a memory clobber, which is what every
synchronizing or memory instruction needs. ``pure=True`` lets LLVM CSE and hoist it
(``mapa``, register shuffles, reading special registers that do not change).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from llvmlite import ir
from numba.cuda import types

from .._numba_internals import literal_intrinsic

__all__ = ["Const", "Choice", "ptx_intrinsic", "emit_asm", "REG", "cast_to", "const_value"]


@dataclass(frozen=True)
class Const:
    """A compile-time integer operand; ``check(v)`` returns an error message or None."""

    check: Optional[Callable[[int], Optional[str]]] = None


@dataclass(frozen=True)
class Choice:
    """A compile-time string operand restricted to ``options``."""

    options: tuple

    def __init__(self, *options):
        object.__setattr__(self, "options", tuple(options))


# kind -> (LLVM type, inline-asm constraint letter, numba type)
REG = {
    "u16": (ir.IntType(16), "h", types.uint16),
    "u32": (ir.IntType(32), "r", types.uint32),
    "s32": (ir.IntType(32), "r", types.int32),
    "b32": (ir.IntType(32), "r", types.uint32),
    "u64": (ir.IntType(64), "l", types.uint64),
    "s64": (ir.IntType(64), "l", types.int64),
    "b64": (ir.IntType(64), "l", types.uint64),
    "f32": (ir.FloatType(), "f", types.float32),
    "f64": (ir.DoubleType(), "d", types.float64),
}


def in_range(lo, hi, step=1):
    """A ``Const`` check: ``lo <= v <= hi`` and ``v % step == 0``."""

    def check(v):
        if not (lo <= v <= hi) or v % step:
            extra = f", a multiple of {step}" if step > 1 else ""
            return f"must be in [{lo}, {hi}]{extra}; got {v}"
        return None

    return check


def const_value(ty):
    """The Python value of a literal numba type, or None if ``ty`` is not a literal."""
    if isinstance(ty, (types.IntegerLiteral, types.BooleanLiteral, types.StringLiteral)):
        return ty.literal_value
    return None


def cast_to(context, builder, value, fromty, kind):
    """Convert a numba value to the LLVM type of register kind ``kind``."""
    llty, _, nbty = REG[kind]
    return context.cast(builder, value, fromty, nbty)


def emit_asm(builder, ptx, constraints, args, out_type=None, side_effect=True):
    """``builder.asm`` with the memory clobber appended for volatile asm."""
    if side_effect:
        constraints = ",".join(c for c in (constraints, "~{memory}") if c)
    arg_types = [a.type for a in args]
    fnty = ir.FunctionType(out_type or ir.VoidType(), arg_types)
    return builder.asm(fnty, ptx, constraints, args, side_effect=side_effect)


_FIELD = re.compile(r"\{(\w+)\}")


def ptx_intrinsic(name, ptx, *, result=None, pure=False, doc="", **operands):
    """Build a numba intrinsic called ``name`` from ``ptx`` (see the module docstring)."""
    names = list(operands)
    if isinstance(result, tuple):
        result_kind, nout = result
        outs = [f"out{i}" for i in range(nout)]
        ret_numba = types.UniTuple(REG[result_kind][2], nout)
    else:
        result_kind = "u32" if result == "bool" else result
        outs = ["out"] if result else []
        ret_numba = types.boolean if result == "bool" else (REG[result][2] if result else types.void)
    for o in outs:
        if "{%s}" % o not in ptx:
            raise ValueError(f"{name}: the result needs {{{o}}} in the PTX template")

    def typer(typingctx, *argtys):
        if len(argtys) != len(names):
            raise TypeError(f"{name}() takes {len(names)} arguments ({', '.join(names)}), got {len(argtys)}")
        consts = {}
        for opname, kind, ty in zip(names, operands.values(), argtys):
            if isinstance(kind, Const):
                v = const_value(ty)
                if v is None or isinstance(v, (bool, str)):
                    raise TypeError(f"{name}: '{opname}' must be a compile-time integer constant; got {ty}")
                err = kind.check(int(v)) if kind.check else None
                if err:
                    raise TypeError(f"{name}: '{opname}' {err}")
                consts[opname] = str(int(v))
            elif isinstance(kind, Choice):
                v = const_value(ty)
                if v is None:
                    raise TypeError(f"{name}: '{opname}' must be a string literal, one of {kind.options}; got {ty}")
                if v not in kind.options:
                    raise TypeError(f"{name}: '{opname}' must be one of {kind.options}; got {v!r}")
                consts[opname] = v
            elif not isinstance(ty, (types.Integer, types.Boolean, types.Float)):
                raise TypeError(f"{name}: '{opname}' must be a number ({kind}); got {ty}")

        # Registers are numbered: the results first ($0...), then run-time operands in order.
        slots = {}
        constraints = []
        for o in outs:
            slots[o] = "$%d" % len(constraints)
            constraints.append("=" + REG[result_kind][1])
        for n in names:
            if n not in consts:
                slots[n] = "$%d" % len(constraints)
                constraints.append(REG[operands[n]][1])
        slots.update(consts)
        text = _FIELD.sub(lambda m: slots.get(m.group(1), m.group(0)), ptx)
        # Constants keep their literal type (one lowering per value); registers do not.
        sig = ret_numba(*[t if n in consts else types.unliteral(t) for n, t in zip(names, argtys)])

        def codegen(context, builder, sig, args):
            vals = [
                cast_to(context, builder, v, t, operands[n])
                for n, v, t in zip(names, args, sig.args)
                if n not in consts
            ]
            out_ty = None
            if outs:
                llty = REG[result_kind][0]
                out_ty = ir.LiteralStructType([llty] * len(outs)) if len(outs) > 1 else llty
            res = emit_asm(builder, text, ",".join(constraints), vals, out_ty, side_effect=not pure)
            if result == "bool":
                return builder.icmp_unsigned("!=", res, ir.Constant(res.type, 0))
            if isinstance(result, tuple):
                items = [builder.extract_value(res, i) for i in range(len(outs))] if len(outs) > 1 else [res]
                return context.make_tuple(builder, sig.return_type, items)
            return res if outs else None

        return sig, codegen

    # @intrinsic reads the typer's signature: build one with the operand names.
    params = ", ".join(["typingctx"] + names)
    ns = {"typer": typer}
    exec(f"def {name}({params}):\n    return typer({params})\n", ns)
    fn = ns[name]
    fn.__doc__ = doc or None
    wrapped = literal_intrinsic(fn)
    wrapped.__doc__ = _describe(name, ptx, operands, result, doc)
    return wrapped


def _describe(name, ptx, operands, result, doc):
    sig = ", ".join(
        f"{n}: {'const' if isinstance(k, Const) else ('choice' + str(k.options) if isinstance(k, Choice) else k)}"
        for n, k in operands.items()
    )
    ret = f" -> {result}" if result else ""
    return f"{name}({sig}){ret}\n\n{doc}\n\nPTX::\n\n    {ptx}\n"
