"""The intrinsics' Python surface (CPU): every public intrinsic is a greppable definition with a
docstring citing the PTX ISA, is listed in ``__all__`` and by ``help()``, and shows the
signature its callers use (no numba ``typingctx``).
"""

import importlib
import inspect
import pathlib
import pydoc
import re

import pytest
from numba import cuda
from numba.cuda.extending import _Intrinsic

import numba_hopper
import numba_hopper.intrinsics as I
from numba_hopper.intrinsics._ptx import u32

SUBMODULES = sorted(
    p.stem for p in pathlib.Path(I.__file__).parent.glob("*.py") if not p.stem.startswith("_")
)
PACKAGE_ROOT = pathlib.Path(numba_hopper.__file__).parent


def _module(name):
    return importlib.import_module(f"numba_hopper.intrinsics.{name}")


def _is_device_callable(obj):
    """An intrinsic, or a device function (a numba CUDA dispatcher)."""
    return isinstance(obj, _Intrinsic) or type(obj).__name__ == "CUDADispatcher"


def _defined_here(mod):
    """Public intrinsics and device functions whose home is ``mod`` (not imported into it)."""
    return {
        name: obj
        for name, obj in vars(mod).items()
        if not name.startswith("_")
        and _is_device_callable(obj)
        and getattr(obj, "__module__", None) == mod.__name__
    }


def test_submodules_found():
    assert {"tma", "cluster", "wgmma", "mbarrier", "smem"} <= set(SUBMODULES)


def test_no_globals_injection_in_the_package():
    offenders = [
        str(p.relative_to(PACKAGE_ROOT))
        for p in PACKAGE_ROOT.rglob("*.py")
        if re.search(r"globals\(\)\s*\[", p.read_text())
    ]
    assert not offenders, f"names injected with globals()[...] in {offenders}"


@pytest.mark.parametrize("name", SUBMODULES)
def test_every_public_name_is_a_real_definition(name):
    """Each name in ``__all__`` is found by ``grep 'def NAME('`` (or ``NAME = ``) in its module."""
    mod = _module(name)
    source = pathlib.Path(mod.__file__).read_text()
    assert mod.__all__, f"{name} has an empty __all__"
    assert len(set(mod.__all__)) == len(mod.__all__), f"{name}: duplicates in __all__"
    missing = [
        n for n in mod.__all__ if not re.search(rf"^(def {n}\(|class {n}\b|{n}\s*=)", source, re.M)
    ]
    assert not missing, f"{name}: no def or assignment for {missing}"
    for n in mod.__all__:
        assert hasattr(mod, n), f"{name}.__all__ names {n}, which does not exist"


@pytest.mark.parametrize("name", SUBMODULES)
def test_every_intrinsic_is_in_all(name):
    mod = _module(name)
    defined = _defined_here(mod)
    assert defined, f"{name} defines no intrinsic"
    missing = sorted(set(defined) - set(mod.__all__))
    assert not missing, f"{name}: not in __all__: {missing}"


def test_package_all_covers_every_submodule():
    missing = {n for m in SUBMODULES for n in _module(m).__all__} - set(I.__all__)
    assert not missing, f"numba_hopper.intrinsics.__all__ lacks {sorted(missing)}"
    for n in I.__all__:
        assert hasattr(I, n), n


def test_help_lists_every_public_name():
    text = pydoc.render_doc(I, renderer=pydoc.plaintext)
    # pydoc lists an intrinsic under DATA ("    name = <intrinsic name>") followed by its
    # docstring, a device function or a function under FUNCTIONS ("    name(...)"), a class
    # under CLASSES ("    class Name(...)").
    missing = [n for n in I.__all__ if not re.search(rf"^    (class )?{n}( = |\()", text, re.M)]
    assert not missing, f"help(numba_hopper.intrinsics) does not list {missing}"
    assert "cp.async.bulk.tensor.3d.shared::cluster" in text  # the PTX of tma_load_3d, in its entry


@pytest.mark.parametrize("name", SUBMODULES)
def test_every_intrinsic_has_a_docstring_and_a_user_signature(name):
    mod = _module(name)
    problems = []
    for n in mod.__all__:
        obj = getattr(mod, n)
        if not callable(obj) or inspect.isclass(obj):
            continue
        own_doc = inspect.getdoc(inspect.unwrap(obj)) if isinstance(obj, _Intrinsic) else obj.__doc__
        if not (own_doc or "").strip():
            problems.append(f"{n}: no docstring")
        params = list(inspect.signature(obj).parameters)
        if "typingctx" in params or "context" in params:
            problems.append(f"{n}: signature {inspect.signature(obj)} shows numba's typing context")
        if isinstance(obj, _Intrinsic):
            # what the caller sees is what numba types: the typer's parameters after typingctx
            typer_params = list(inspect.signature(obj._defn).parameters)[1:]
            if params != typer_params:
                problems.append(f"{n}: signature {params} but the typer takes {typer_params}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", SUBMODULES)
def test_ptx_intrinsics_cite_the_ptx_isa(name):
    mod = _module(name)
    problems = []
    for n, obj in _defined_here(mod).items():
        if not isinstance(obj, _Intrinsic) or "\nPTX::\n" not in (obj.__doc__ or ""):
            continue  # hand-written intrinsics (LLVM IR, no PTX of their own)
        stub = inspect.unwrap(obj)
        if stub is obj or stub.__name__ != n:
            problems.append(f"{n}: not a @ptx_asm def")
            continue
        doc = inspect.getdoc(stub) or ""
        if not re.search(r"PTX ISA \d+(\.\d+)*", doc):
            problems.append(f"{n}: the docstring cites no PTX ISA section")
        if re.search(r"\bseed\s*\d", doc, re.I):
            problems.append(f"{n}: the docstring cites a 'seed'")
        # the def's source holds its PTX
        src = inspect.getsource(stub)
        if f"def {n}(" not in src or "@ptx_asm(" not in src:
            problems.append(f"{n}: its PTX is not beside its def")
    assert not problems, "\n".join(problems)


def test_signature_shows_operand_kinds():
    assert str(inspect.signature(I.tma_load_3d)) == "(dst: u32, tmap: u64, c0: s32, c1: s32, c2: s32, bar: u32)"
    assert str(inspect.signature(I.elect_sync)) == "() -> bool"
    assert str(inspect.signature(I.ldmatrix_x2)) == "(addr: u32) -> tuple[u32, u32]"
    assert str(inspect.signature(I.bulk_wait_group)) == "(n: Const(in_range(0, 63)))"
    assert list(inspect.signature(I.shared_array).parameters) == ["byte_offset", "shape", "dtype"]
    assert list(inspect.signature(I.wgmma_mma_async).parameters)[:2] == ["acc", "desc_a"]


def test_ptx_asm_def_and_call_forms_agree():
    @I.ptx_asm("add.u32 {out}, {a}, {b};", pure=True)
    def add_u32(a: "u32", b: u32) -> "u32":
        """PTX ISA 9.7.1.1 add."""

    called = I.ptx_intrinsic("add_u32", "add.u32 {out}, {a}, {b};", result="u32", pure=True, a="u32", b="u32",
                             doc="PTX ISA 9.7.1.1 add.")
    assert inspect.signature(add_u32) == inspect.signature(called)
    assert add_u32.__doc__ == called.__doc__
    assert add_u32.__name__ == "add_u32" and add_u32.__wrapped__.__name__ == "add_u32"


def test_ptx_asm_rejects_undeclared_operands():
    with pytest.raises(TypeError, match="operand 'a' needs a kind"):
        @I.ptx_asm("mov.u32 {out}, {a};")
        def f(a) -> "u32":
            """no kind"""

    with pytest.raises(ValueError, match=r"needs \{out\}"):
        @I.ptx_asm("mov.u32 $0, {a};")
        def g(a: "u32") -> "u32":
            """no {out}"""


def test_keyword_arguments_reach_the_ptx():
    @cuda.jit
    def k(out, bar):
        I.mbarrier_init(count=3, bar=bar)
        out[0] = I.div_u32(b=out[1], a=out[2])

    ptx, _ = cuda.compile_ptx(k, "void(uint32[::1], uint32)", cc=(9, 0))
    assert "mbarrier.init.shared::cta.b64" in ptx
    assert re.search(r"div\.u32\s+%r\d+, %r\d+, %r\d+;", ptx)
