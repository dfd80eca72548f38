"""An on-disk cache of compiled kernels, so that a new process does not compile them again.

numba compiles a kernel on its first launch in every process (the GEMM kernel: seconds of
typing, NVVM and nvJitLink). :func:`numba_hopper.launch.prepare_launch` with a
``cache_key`` looks here first and stores what numba compiled after a miss.

Why not numba's own ``cache=True``: its index keys an entry on the kernel's source file
(its modification time) and its closure variables. Device functions the kernel calls from
other modules (``numba_hopper.pipeline``, the intrinsics) are pickled by reference, so an
edit to them would load a stale kernel. Here the key holds a digest of every source file of
the package, numba-cuda's version, the device's compute capability, the argument types and
the caller's ``cache_key`` (for the GEMM, its ``GemmConfig``: every constant its closure
bakes in).

An entry is numba's compiled kernel as numba's own cache pickles it (its linked cubin for
the device, PTX, LLVM IR), written atomically. An entry that does not load is recompiled
and overwritten. Like numba's cache the entries are pickles: keep the directory private.

``NUMBA_HOPPER_CACHE_DIR`` sets the directory (default ``$XDG_CACHE_HOME/numba_hopper``,
else ``~/.cache/numba_hopper``); set it to an empty string to turn the cache off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pathlib
import tempfile

from . import _numba_internals as _internals

__all__ = ["cache_dir", "entry_path", "kernel_for_args"]


def cache_dir() -> pathlib.Path | None:
    """Where entries live; None when ``NUMBA_HOPPER_CACHE_DIR`` is set empty (cache off)."""
    configured = os.environ.get("NUMBA_HOPPER_CACHE_DIR")
    if configured is not None:
        return pathlib.Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "numba_hopper"


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """A digest of the package's sources: any edit to a kernel or what it calls misses."""
    root = pathlib.Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _numba_cuda_version() -> str:
    from importlib.metadata import version

    return version("numba-cuda")


def entry_path(key, argtypes, cc) -> pathlib.Path | None:
    """The file of the entry for ``key`` compiled for ``argtypes`` on a ``cc`` device."""
    directory = cache_dir()
    if directory is None:
        return None
    ident = repr((_package_digest(), _numba_cuda_version(), tuple(cc), tuple(map(str, argtypes)), key))
    return directory / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".nbk")


def kernel_for_args(dispatcher, args, key, cc):
    """``_numba_internals.kernel_for_args`` through the disk cache (see the module doc)."""
    argtypes = _internals.arg_types(dispatcher, args)
    path = None if _internals.has_overload(dispatcher, argtypes) else entry_path(key, argtypes, cc)
    if path is None:
        return _internals.kernel_for_args(dispatcher, args)
    try:
        return _internals.add_serialized_kernel(dispatcher, path.read_bytes())
    except Exception:  # no entry, or one this numba cannot load: compile and (re)write it
        pass
    kernel = _internals.kernel_for_args(dispatcher, args)
    _write_atomically(path, _internals.serialize_kernel(kernel))
    return kernel


def _write_atomically(path: pathlib.Path, data: bytes):
    """Write ``data`` so that a concurrent reader sees the whole file or none; never raise."""
    # A read-only or full disk costs a recompile next time, nothing more.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
