"""An on-disk cache of compiled kernels, so that a new process does not compile them again.

numba compiles a kernel on its first launch in every process (the GEMM kernel: seconds of
typing, NVVM and nvJitLink). :func:`numba_hopper.runtime.launch.prepare_launch` with a
``cache_key`` looks here first, then among the package's prebuilt kernels, and stores what
numba compiled after a miss of both.

Why not numba's own ``cache=True``: its index keys an entry on the kernel's source file
(its modification time) and its closure variables. Device functions the kernel calls from
other modules (``numba_hopper.kit.pipeline``, the intrinsics) are pickled by reference, so an
edit to them would load a stale kernel. Here the key holds a digest of every source file of
the package, numba-cuda's version, the device's compute capability, the argument types and
the caller's ``cache_key`` (for the GEMM, its ``GemmConfig``: every constant its closure
bakes in).

An entry is numba's compiled kernel as numba's own cache pickles it (its linked cubin for
the device, PTX, LLVM IR), written atomically. An entry that does not load is recompiled
and overwritten. Like numba's cache the entries are pickles: keep the directory private.

``NUMBA_HOPPER_CACHE_DIR`` sets the directory (default ``$XDG_CACHE_HOME/numba_hopper``,
else ``~/.cache/numba_hopper``); set it to an empty string to turn the cache off.

Prebuilt kernels: ``numba_hopper/_prebuilt/`` holds the kernels that default calls pick
(16-bit ``gemm``/``bmm``, scaled fp8 ``gemm``, ``grouped_gemm``: the module doc of
``numba_hopper.tools.prebuild`` says which), built without a GPU by ``python -m
numba_hopper.tools.prebuild`` and named like the cache's entries, as cubins for sm_90a only (no IR or PTX; see
``_numba_internals.serialize_cubin_kernel``). They are used when the cache misses, unless
its ``manifest.json`` names other package sources or another numba-cuda, or the driver is
of an older CUDA major version than the nvJitLink that linked them (CUDA's minor version
compatibility covers the rest). A kernel loaded from there is not copied to the cache; one
that does not load (or that the driver rejects) is compiled as after a miss.
``NUMBA_HOPPER_PREBUILT=0`` turns the prebuilt kernels off (to measure the compile path).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import pathlib
import tempfile

from .. import _numba_internals as _internals

__all__ = ["cache_dir", "entry_name", "entry_path", "kernel_for_args", "PREBUILT_DIR", "MANIFEST", "build_identity",
           "prebuilt_status", "kernel_sources", "package_digest", "write_atomically"]

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
PREBUILT_DIR = PACKAGE_ROOT / "_prebuilt"
MANIFEST = "manifest.json"
# Where the kernels this process looked up came from: "user cache", "prebuilt" or "compiled".
kernel_sources = collections.Counter()


def cache_dir() -> pathlib.Path | None:
    """Where entries live; None when ``NUMBA_HOPPER_CACHE_DIR`` is set empty (cache off)."""
    configured = os.environ.get("NUMBA_HOPPER_CACHE_DIR")
    if configured is not None:
        return pathlib.Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "numba_hopper"


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """A digest of the package's sources: any edit to a kernel or what it calls misses."""
    root = PACKAGE_ROOT
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _numba_cuda_version() -> str:
    from importlib.metadata import version

    return version("numba-cuda")


def entry_name(key, argtypes, cc) -> str:
    """The file name of the entry for ``key`` compiled for ``argtypes`` on a ``cc`` device."""
    ident = repr((package_digest(), _numba_cuda_version(), tuple(cc), tuple(map(str, argtypes)), key))
    return hashlib.sha256(ident.encode()).hexdigest()[:32] + ".nbk"


def entry_path(key, argtypes, cc) -> pathlib.Path | None:
    """The file of that entry in the cache (None: the cache is off)."""
    directory = cache_dir()
    return None if directory is None else directory / entry_name(key, argtypes, cc)


def kernel_for_args(dispatcher, args, key, cc):
    """``_numba_internals.kernel_for_args`` through the disk cache and the prebuilt kernels
    (see the module doc)."""
    argtypes = _internals.arg_types(dispatcher, args)
    if _internals.has_overload(dispatcher, argtypes):
        return _internals.kernel_for_args(dispatcher, args)
    name, directory = entry_name(key, argtypes, cc), cache_dir()
    path = None if directory is None else directory / name
    if path is not None:
        try:
            kernel = _internals.add_serialized_kernel(dispatcher, path.read_bytes())
            kernel_sources["user cache"] += 1
            return kernel
        except Exception:  # no entry, or one this numba cannot load: look further, then (re)write it
            pass
    if prebuilt_status() is None:
        try:
            kernel = _internals.add_cubin_kernel(dispatcher, (PREBUILT_DIR / name).read_bytes())
            kernel_sources["prebuilt"] += 1
            return kernel
        except Exception:  # not among them, or unloadable: compile
            pass
    kernel = _internals.kernel_for_args(dispatcher, args)
    kernel_sources["compiled"] += 1
    if path is not None:
        write_atomically(path, _internals.serialize_kernel(kernel))
    return kernel


def build_identity() -> dict:
    """What prebuilt kernels must have been built from to be used here: these package sources
    and this numba-cuda (their manifest also names the CUDA version that linked them)."""
    return {"package_digest": package_digest(), "numba_cuda": _numba_cuda_version()}


def prebuilt_status() -> str | None:
    """Why the prebuilt kernels are not used in this process; None when they are."""
    if os.environ.get("NUMBA_HOPPER_PREBUILT") == "0":
        return "turned off by NUMBA_HOPPER_PREBUILT=0"
    try:
        built = json.loads((PREBUILT_DIR / MANIFEST).read_text())
        linked = built["linked_with_cuda"]  # "major.minor"
        linked_major = int(linked.split(".")[0])
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        return f"no valid {MANIFEST} in {PREBUILT_DIR} ({exc.__class__.__name__}: {exc})"
    for field, value in build_identity().items():
        if built.get(field) != value:
            return f"built for {field} {built.get(field)!r}, this is {value!r}"
    driver = _driver_cuda_version()
    if driver is None:
        return "no CUDA driver"
    # CUDA minor version compatibility: a driver runs cubins built by any toolkit of its
    # major version (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html).
    if driver // 1000 < linked_major:
        return f"linked by the nvJitLink of CUDA {linked}; the driver is CUDA {driver // 1000}.{driver % 1000 // 10}"
    return None


@functools.lru_cache(maxsize=1)
def _driver_cuda_version() -> int | None:
    """``cuDriverGetVersion`` (1000 * major + 10 * minor); None without a driver."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
    except Exception:  # no libcuda on this machine
        return None
    return int(version) if err == driver.CUresult.CUDA_SUCCESS else None


def write_atomically(path: pathlib.Path, data: bytes):
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
