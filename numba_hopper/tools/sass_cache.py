"""An on-disk cache of :func:`numba_hopper.tools.sass.inspect_kernel` reports (opt-in).

Compiling a GEMM kernel for sm_90a and reading its SASS takes seconds, most of them numba's
typing and lowering, which no cache keyed on the compiled code could skip. Here an entry is
keyed on everything the report is a function of, all of it known before compiling:

- the package's sources (``kernel_cache.package_digest``: every ``numba_hopper/**/*.py``), the
  versions of Python, numba, numba-cuda, llvmlite, NumPy and the CUDA wheels (NVVM,
  nvJitLink, nvdisasm, ...), nvJitLink's own version and which ``nvdisasm`` runs;
- the ``NUMBA_*`` environment (``NUMBA_HOPPER_DUMP`` and the cache settings aside);
- the compute capability, the signature and the kernel's identity (:func:`kernel_identity`):
  its bytecode, constants and line table, its compile options, and recursively every value it
  can reach: closure cells, default arguments and the module globals its code names
  (functions, ``@cuda.jit`` dispatchers and intrinsics by their own identity, modules and
  classes by name and source file digest, what the code reads of a user's module by the
  identity of those attributes, dataclasses by their fields, plain values by repr).

A kernel that reaches a value with no stable identity (an object whose repr is an address,
an array on a device, ...) is not cached: it is compiled every time.

``NUMBA_HOPPER_SASS_CACHE_DIR`` names the directory; unset or empty, there is no cache. The
test suite sets it to pytest's cache directory (``.pytest_cache/d/numba_hopper_sass``). A
miss compiles and writes the entry atomically under a per-entry file lock, so parallel test
workers that want the same kernel compile it once. Entries are pickles: keep the directory
private.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import inspect
import os
import pathlib
import pickle
import re
import sys
import sysconfig
import types as pytypes
import zlib

from ..runtime import kernel_cache as _kernel_cache
from .binutils import find_tool

__all__ = ["cache_dir", "kernel_identity", "entry_key", "load", "store", "locked", "Unkeyable", "ENV"]

ENV = "NUMBA_HOPPER_SASS_CACHE_DIR"
# Settings that change where reports live or what is printed, not what a kernel compiles to.
_ENV_IGNORED = {ENV, "NUMBA_HOPPER_DUMP", "NUMBA_HOPPER_CACHE_DIR", "NUMBA_HOPPER_PREBUILT"}
_FORMAT = 1


class Unkeyable(Exception):
    """The kernel reaches a value with no stable identity across processes."""


def cache_dir() -> pathlib.Path | None:
    """The directory of the report cache; None when it is off."""
    configured = os.environ.get(ENV)
    return pathlib.Path(configured) if configured else None


# --- identity ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def _module_identity(name: str) -> tuple:
    """A module by name and the digest of its source file (a user module's edit misses)."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if not path:
        return ("module", name)
    try:
        st = os.stat(path)
    except OSError:
        return ("module", name, path)
    return ("module", name, _file_digest(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple:
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_user_module(module) -> bool:
    """Neither this package (its digest covers it) nor an installed library or the standard
    library (their versions do)."""
    if module.__name__.split(".")[0] in ("numba_hopper", *sys.stdlib_module_names):
        return False
    path = getattr(module, "__file__", None)
    return not (path and os.path.realpath(path).startswith(_library_dirs()))


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _code_names(const)
    return names


class _Identity:
    """Builds the identity of one kernel; ``seen`` numbers the objects already described,
    so shared and recursive references cost nothing and terminate."""

    def __init__(self):
        self.seen = {}
        self.keep = []  # the objects numbered, alive while their ids are

    def __call__(self, obj):
        if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
            return (type(obj).__name__, repr(obj))
        ref = self.seen.get(id(obj))
        if ref is not None:
            return ("ref", ref)
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        return self._describe(obj)

    def _describe(self, obj):
        if isinstance(obj, pytypes.CodeType):
            return self._code(obj)
        if isinstance(obj, pytypes.FunctionType):
            return self._function(obj)
        if isinstance(obj, pytypes.ModuleType):
            return _module_identity(obj.__name__)
        if isinstance(obj, type):
            return ("class", obj.__qualname__, _module_identity(obj.__module__))
        if type(obj).__module__ == "numpy" and type(obj).__name__ == "ndarray":  # by value, not its repr
            return ("ndarray", obj.dtype.str, obj.shape, hashlib.sha256(obj.tobytes()).hexdigest())
        if isinstance(obj, inspect.Signature):  # PTX intrinsics bind their operands with one
            return ("signature", tuple((p.name, str(p.kind), self(p.default), self(p.annotation))
                                       for p in obj.parameters.values()), self(obj.return_annotation))
        if isinstance(obj, re.Pattern):
            return ("regex", self(obj.pattern), obj.flags)
        if isinstance(obj, enum.Enum):
            return ("enum", self(type(obj)), obj.name)
        if dataclasses.is_dataclass(obj):
            return ("dataclass", self(type(obj)),
                    tuple((f.name, self(getattr(obj, f.name))) for f in dataclasses.fields(obj)))
        if isinstance(obj, (tuple, list)):
            kind = type(obj) if type(obj) in (tuple, list) else self(type(obj))  # a namedtuple's class too
            return ("seq", str(kind), tuple(self(x) for x in obj))
        if isinstance(obj, dict):
            items = sorted(((self(k), self(v)) for k, v in obj.items()), key=repr)
            return ("dict", str(type(obj)), tuple(items))
        if isinstance(obj, (set, frozenset)):
            return ("set", tuple(sorted((self(x) for x in obj), key=repr)))
        if isinstance(obj, (pytypes.BuiltinFunctionType, pytypes.BuiltinMethodType)):
            return ("builtin", getattr(obj, "__module__", None), obj.__qualname__)
        py_func = getattr(obj, "py_func", None)
        if isinstance(py_func, pytypes.FunctionType) and hasattr(obj, "targetoptions"):  # a @cuda.jit dispatcher
            return ("dispatcher", self(type(obj)), self(py_func), self(dict(obj.targetoptions)))
        defn = getattr(obj, "_defn", None)
        if isinstance(defn, pytypes.FunctionType) and hasattr(obj, "_name"):  # an @intrinsic
            return ("intrinsic", self(type(obj)), obj._name, self(defn),
                    self(getattr(obj, "_prefer_literal", None)), self(getattr(obj, "_ctor_kwargs", None)))
        module = type(obj).__module__ or ""
        if module.split(".")[0] in ("numba", "numba_cuda", "numpy", "llvmlite", "numba_hopper"):
            text = repr(obj)  # numba types, NumPy scalars and dtypes, ufuncs: their repr is their value
            if " at 0x" not in text and "object at" not in text:
                return ("value", self(type(obj)), text)
        raise Unkeyable(f"{type(obj).__module__}.{type(obj).__qualname__} has no stable identity")

    def _code(self, code):
        table = getattr(code, "co_linetable", None) or getattr(code, "co_lnotab", b"")
        return ("code", code.co_name, code.co_filename, code.co_firstlineno, code.co_argcount,
                code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags, code.co_code.hex(), table.hex(),
                tuple(self(c) for c in code.co_consts), code.co_names, code.co_varnames, code.co_freevars,
                code.co_cellvars)

    def _function(self, fn):
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(self(cell.cell_contents))
            except ValueError:  # an empty cell
                cells.append(("empty",))
        names = _code_names(fn.__code__)
        named = []
        for n in sorted(names & fn.__globals__.keys()):
            value = fn.__globals__[n]
            named.append((n, self(value)))
            if isinstance(value, pytypes.ModuleType) and _is_user_module(value):
                # what the code reads of a module of the user's, e.g. ``helpers.scale(x)``:
                # that module's file digest does not cover the modules it imports
                named.append((n, tuple((a, self(getattr(value, a))) for a in sorted(names) if hasattr(value, a))))
        return ("function", fn.__module__, fn.__qualname__, self(fn.__code__), self(fn.__defaults__),
                self(fn.__kwdefaults__), tuple(cells), tuple(named))


def kernel_identity(kernel):
    """The identity of a ``@cuda.jit`` kernel (see the module doc); raises :class:`Unkeyable`."""
    return _Identity()(kernel)


# --- the key -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _toolchain() -> tuple:
    """What compiles, links and disassembles: distribution versions, nvJitLink, nvdisasm."""
    from importlib import metadata

    wanted = ("numba", "numba-cuda", "llvmlite", "numpy")
    dists = sorted({(d.metadata["Name"].lower(), d.version) for d in metadata.distributions()
                    if d.metadata["Name"] and (d.metadata["Name"].lower() in wanted
                                               or d.metadata["Name"].lower().startswith(("nvidia-", "cuda-")))})
    try:
        from cuda.bindings import nvjitlink

        linker = nvjitlink.version()
    except Exception:  # no nvJitLink: the compile fails anyway
        linker = None
    try:
        nvdisasm = find_tool("nvdisasm")
        st = os.stat(nvdisasm)
        disasm = (nvdisasm, st.st_size, st.st_mtime_ns)
    except Exception:  # not installed: the compile fails anyway
        disasm = None
    return (sys.version, tuple(dists), linker, disasm)


def _environment() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_") and k not in _ENV_IGNORED))


def entry_key(kernel, signature, cc) -> str:
    """The entry name of ``kernel`` compiled for ``signature`` and ``cc``; raises Unkeyable."""
    ident = _Identity()
    described = (_FORMAT, _kernel_cache.package_digest(), _toolchain(), _environment(), tuple(cc),
                 ident(signature), ident(kernel))
    return hashlib.sha256(repr(described).encode()).hexdigest()[:40]


# --- entries -----------------------------------------------------------------------------


def load(directory: pathlib.Path, key: str):
    """The fields of the stored report, or None (no entry, or one this code cannot read)."""
    try:
        return pickle.loads(zlib.decompress((directory / f"{key}.report").read_bytes()))
    except Exception:  # missing or unreadable: compile, then overwrite
        return None


def store(directory: pathlib.Path, key: str, fields: dict):
    """Write an entry atomically; a failure to write costs a compile next time, nothing more."""
    _kernel_cache.write_atomically(directory / f"{key}.report", zlib.compress(pickle.dumps(fields, protocol=4), 6))


@contextlib.contextmanager
def locked(directory: pathlib.Path, key: str):
    """Hold the entry's lock: a second process that wants it waits, then finds it written."""
    try:
        import fcntl

        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):  # no locking here: at worst two processes compile it
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
