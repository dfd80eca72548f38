"""Turn a PTX template and a Python signature into a numba intrinsic.

Each PTX intrinsic of this package is a ``def`` whose signature declares the operands and
whose decorator holds the PTX, one function per instruction (the layout of CUTLASS's
``cute/arch/copy_sm90_tma.hpp``)::

    @ptx_asm("mbarrier.arrive.shared::cta.b64 _, [{bar}];")
    def mbarrier_arrive(bar: u32):
        \"\"\"PTX ISA 9.7.13.15.13 mbarrier.arrive: one arrival (release, CTA scope).\"\"\"

The ``def``'s body is empty: :func:`ptx_asm` reads its name, parameters, annotations and
docstring and returns the numba intrinsic, which has the same name, signature
(``inspect.signature``) and docstring (with the PTX appended, for ``help``). A call with
the wrong arguments is a typing error with Python's own message for the ``def``.

Each parameter is an operand, in call order, annotated with its kind:

- ``u16 u32 s32 b32 u64 s64 b64 f32 f64`` (this module's :class:`Reg` constants, or the
  same names as strings): a run-time value in a register. Integer kinds accept any numba
  integer (or boolean) and are truncated or extended; float kinds accept any number.
- ``Const(check)``: a compile-time integer; the caller must pass a literal (or a global
  or closure constant). ``check(value)`` returns an error string (or None) and runs at
  typing time, so a bad value, or a run-time value, is a typing error naming the
  intrinsic and the operand. The value is pasted into the template as text.
- ``Choice("a", "b", ...)``: a compile-time string literal from a fixed set, pasted into
  the template.

``{name}`` in the template is replaced by the operand (``$i`` for registers, the text for
constants). Braces that do not enclose a declared operand name are left alone, so PTX
scope blocks (``{ .reg .pred p; ... }``) and vector operands (``{{x}, {y}}``) need no
escaping.

The return annotation is the result: none (or ``None``) for void, a register kind (the PTX
writes it as ``{out}``), ``bool`` (the PTX writes a ``u32`` 0/1 into ``{out}``, usually
through ``selp``, and the intrinsic returns a numba boolean), or ``tuple[k, k, ...]``
(the PTX writes ``{out0}`` .. ``{out<count-1>}`` and the intrinsic returns a ``UniTuple``
of that many ``k``, as ``ldmatrix`` does).

By default an intrinsic is a volatile asm with a memory clobber, which is what every
synchronizing or memory instruction needs. ``pure=True`` lets LLVM CSE and hoist it
(``mapa``, register conversions, reading special registers that do not change).

:func:`ptx_intrinsic` builds the same intrinsic without a ``def`` (a quick experiment, a
test). Intrinsics written by hand with numba's ``@intrinsic`` (a ``typer(typingctx, ...)``
returning a signature and a codegen) use this module's :func:`intrinsic` or
:func:`literal_intrinsic`, which show the signature without ``typingctx``.
"""

from __future__ import annotations

import inspect
import re
import types as pytypes
from dataclasses import dataclass
from typing import Callable, Optional

from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic as _numba_intrinsic

from .. import _numba_internals

__all__ = [
    "ptx_asm",
    "ptx_intrinsic",
    "intrinsic",
    "literal_intrinsic",
    "Reg",
    "Const",
    "Choice",
    "in_range",
    "u16",
    "u32",
    "s32",
    "b32",
    "u64",
    "s64",
    "b64",
    "f32",
    "f64",
    "emit_asm",
    "REG",
    "cast_to",
    "const_value",
]


class Reg(str):
    """A register operand kind (a PTX type name); shown bare in signatures (``addr: u32``)."""

    __slots__ = ()

    def __repr__(self):
        return str(self)


u16, u32, s32, b32, u64, s64, b64, f32, f64 = (
    Reg(k) for k in ("u16", "u32", "s32", "b32", "u64", "s64", "b64", "f32", "f64")
)


@dataclass(frozen=True)
class Const:
    """A compile-time integer operand; ``check(v)`` returns an error message or None."""

    check: Optional[Callable[[int], Optional[str]]] = None

    def __repr__(self):
        return f"Const({getattr(self.check, '__name__', '') if self.check else ''})"


@dataclass(frozen=True)
class Choice:
    """A compile-time string operand restricted to ``options``."""

    options: tuple

    def __init__(self, *options):
        object.__setattr__(self, "options", tuple(options))

    def __repr__(self):
        return f"Choice({', '.join(map(repr, self.options))})"


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

    check.__name__ = check.__qualname__ = f"in_range({lo}, {hi}{f', {step}' if step > 1 else ''})"
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


# --- numba @intrinsic, shown with the signature its callers use ------------------------


def _show_user_signature(handle, typer):
    """Make ``inspect.signature(handle)`` the typer's without its first (``typingctx``) parameter.

    numba's ``_Intrinsic`` wraps the typer (``functools.update_wrapper``: its name, docstring
    and ``__wrapped__``), so ``inspect.signature`` would otherwise show the typer's, with
    ``typingctx`` first.
    """
    sig = inspect.signature(typer)
    handle.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
    return handle


def intrinsic(typer):
    """numba's ``@intrinsic`` for the CUDA target, with the user-facing signature."""
    return _show_user_signature(_numba_intrinsic(typer), typer)


def literal_intrinsic(typer):
    """``_numba_internals.literal_intrinsic`` (literal argument types typed first), with the
    user-facing signature."""
    return _show_user_signature(_numba_internals.literal_intrinsic(typer), typer)


# --- PTX intrinsics ---------------------------------------------------------------------

_FIELD = re.compile(r"\{(\w+)\}")
_PARAM = inspect.Parameter.POSITIONAL_OR_KEYWORD


def _result_kind(annotation, name):
    """A return annotation as ``None``, a register kind, ``"bool"`` or ``(kind, count)``."""
    if annotation is inspect.Signature.empty or annotation is None:
        return None
    if annotation is bool:
        return "bool"
    if isinstance(annotation, pytypes.GenericAlias) and annotation.__origin__ is tuple:
        kinds = set(annotation.__args__)
        if len(kinds) != 1 or not kinds <= set(REG):
            raise TypeError(
                f"{name}: a tuple result needs one register kind, e.g. tuple[u32, u32]; got {annotation}"
            )
        return (Reg(annotation.__args__[0]), len(annotation.__args__))
    if annotation in REG:
        return Reg(annotation)
    raise TypeError(
        f"{name}: the result must be a register kind, bool or tuple[kind, ...]; got {annotation!r}"
    )


def _check_kind(kind, name, opname):
    if not isinstance(kind, (Const, Choice)) and kind not in REG:
        got = "no annotation" if kind is inspect.Parameter.empty else repr(kind)
        raise TypeError(f"{name}: operand '{opname}' needs a kind ({', '.join(REG)}, Const or Choice); got {got}")
    return Reg(kind) if isinstance(kind, str) else kind


_KINDS = {k: Reg(k) for k in REG}


def _resolve(annotation, stub):
    """An annotation as an object: a string (``from __future__ import annotations``, or
    written as a string) is evaluated in the def's module, the kind names always defined."""
    if not isinstance(annotation, str) or isinstance(annotation, Reg):
        return annotation
    return _KINDS.get(annotation) or eval(annotation, stub.__globals__, dict(_KINDS))


def _resolved_signature(stub):
    sig = inspect.signature(stub)
    params = [p.replace(annotation=_resolve(p.annotation, stub)) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=_resolve(sig.return_annotation, stub))


def ptx_asm(template, *, pure=False):
    """Decorator: the numba intrinsic declared by a ``def`` (see the module docstring).

    ``template`` is the PTX; the ``def``'s parameters (annotated with operand kinds), return
    annotation and docstring declare the operands, the result and the documentation. Write
    only the docstring as its body.
    """

    def build(stub):
        name = stub.__name__
        sig = _resolved_signature(stub)
        operands = {}
        for p in sig.parameters.values():
            if p.kind is not _PARAM or p.default is not p.empty:
                raise TypeError(f"{name}: operand '{p.name}' must be a plain positional parameter")
            operands[p.name] = _check_kind(p.annotation, name, p.name)
        result = _result_kind(sig.return_annotation, name)
        doc = inspect.getdoc(stub) or ""
        handle = _build(name, template, operands, result, pure, stub)
        handle.__signature__ = sig
        handle.__wrapped__ = stub
        handle.__module__ = stub.__module__
        handle.__qualname__ = stub.__qualname__
        handle.__doc__ = _describe(name, sig, doc, template)
        return handle

    return build


def ptx_intrinsic(name, ptx, *, result=None, pure=False, doc="", **operands):
    """Build the numba intrinsic ``name`` from ``ptx`` without a ``def``: operands are keyword
    arguments (``addr="u32"``), ``result`` is None, a kind, ``"bool"`` or ``(kind, count)``."""
    operands = {n: _check_kind(k, name, n) for n, k in operands.items()}
    if isinstance(result, tuple):
        result = (Reg(result[0]), result[1])
        ret = tuple[(result[0],) * result[1]]
    elif result is None:
        ret = inspect.Signature.empty
    elif result == "bool":
        ret = bool
    else:
        result = ret = Reg(result)
    sig = inspect.Signature([inspect.Parameter(n, _PARAM, annotation=k) for n, k in operands.items()],
                            return_annotation=ret)
    handle = _build(name, ptx, operands, result, pure)
    handle.__signature__ = sig
    handle.__doc__ = _describe(name, sig, doc, ptx)
    return handle


def _build(name, ptx, operands, result, pure, stub=None):
    """The numba intrinsic: a typer that checks the operands and substitutes the template.

    A call with the wrong arguments is reported by calling ``stub`` (the ``def``, which does
    nothing) with them: Python's own message, naming the missing operand.
    """
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
    user_sig = inspect.Signature([inspect.Parameter(n, _PARAM) for n in names])

    def typer(typingctx, *args, **kws):
        try:
            argtys = user_sig.bind(*args, **kws).args  # keyword arguments put in operand order
        except TypeError as e:
            if stub is not None:
                stub(*args, **kws)
            raise TypeError(f"{name}{user_sig}: {e}") from None
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

    # numba reads the typer's signature (its parameters after typingctx name the call's).
    typer.__signature__ = inspect.Signature(
        [inspect.Parameter("typingctx", _PARAM)] + list(user_sig.parameters.values())
    )
    typer.__name__ = typer.__qualname__ = name
    return _numba_internals.literal_intrinsic(typer)


def _describe(name, sig, doc, ptx):
    """The intrinsic's ``__doc__``: its signature (``help`` lists intrinsics as data, without
    one), the docstring, then the PTX."""
    return f"{name}{sig}\n\n{doc}\n\nPTX::\n\n    {ptx}\n"
