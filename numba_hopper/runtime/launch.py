"""Launch ``@cuda.jit`` kernels with thread-block clusters and > 48 KB of dynamic shared memory.

::

    from numba_hopper.runtime.launch import launch
    launch(kernel, grid=(8, 4), block=384, args=(tmap_a.device_ptr, out, n),
           cluster=(2, 1), shared_mem=200 * 1024, stream=torch.cuda.current_stream())

``grid`` counts BLOCKS, as ``kernel[grid, block]`` does, with or without a cluster; each
cluster dimension must divide the grid's. ``grid``, ``block`` and ``cluster`` are ints or
tuples of 1-3 ints (x first).

What it does beyond ``kernel[grid, block, stream, shared_mem](*args)``:

- opts the kernel into ``shared_mem`` bytes of dynamic shared memory
  (``cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`` on its
  ``CUkernel``, once per kernel and device for the largest size asked so far);
- launches with a cluster dimension (``cuLaunchKernelEx``; and sets
  ``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` for clusters of 9-16 CTAs when
  ``non_portable_cluster=True``);
- checks the configuration first (:func:`validate_launch`) and raises ``ValueError``
  instead of a driver error;
- accepts any stream object (:func:`as_stream_handle`);
- with ``dependent=True``, launches as a programmatic dependent
  (``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``; CUDA C++ Programming Guide,
  "Programmatic Dependent Launch and Synchronization"): the kernel may start while the
  previous kernel of the stream still runs, so it must execute ``griddepcontrol.wait``
  (:func:`numba_hopper.intrinsics.griddepcontrol_wait`) before it touches global memory
  that kernel writes or reads. Stream capture keeps the edge in a CUDA graph.

Arguments are packed by numba's own rules, so device arrays and scalars work as usual;
host (numpy) arrays are refused (copy them first). The launch does not synchronize.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from dataclasses import dataclass

from . import kernel_cache as _kernel_cache
from .workspace import NO_CONTEXT as _NO_CONTEXT, bind_primary_context
from .. import _numba_internals as _internals

__all__ = [
    "launch",
    "prepare_launch",
    "max_active_clusters",
    "PreparedLaunch",
    "validate_launch",
    "DeviceLimits",
    "device_limits",
    "as_stream_handle",
    "LaunchDims",
    "PORTABLE_CLUSTER_SIZE",
    "NON_PORTABLE_CLUSTER_SIZE",
]

PORTABLE_CLUSTER_SIZE = 8
NON_PORTABLE_CLUSTER_SIZE = 16  # H100/H200, with the non-portable attribute set


@dataclass(frozen=True)
class DeviceLimits:
    """What ``validate_launch`` checks against; read with :func:`device_limits`."""

    device: int
    cc: tuple
    sm_count: int
    max_threads_per_block: int = 1024
    max_block_dim: tuple = (1024, 1024, 64)
    max_grid_dim: tuple = (2**31 - 1, 65535, 65535)
    max_shared_per_block_optin: int = 232448  # 227 KB on H100/H200
    cluster_launch: bool = True


def _attr(driver, dev, name):
    err, value = driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name), dev)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGetAttribute({name}) failed: {err}")
    return int(value)


@functools.lru_cache(maxsize=None)
def device_limits(device_id: int = 0) -> DeviceLimits:
    """Launch limits of ``device_id``, read once through ``cuda.bindings``."""
    from cuda.bindings import driver

    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit failed: {err}")
    err, dev = driver.cuDeviceGet(device_id)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGet({device_id}) failed: {err}")
    a = functools.partial(_attr, driver, dev)
    return DeviceLimits(
        device=device_id,
        cc=(a("COMPUTE_CAPABILITY_MAJOR"), a("COMPUTE_CAPABILITY_MINOR")),
        sm_count=a("MULTIPROCESSOR_COUNT"),
        max_threads_per_block=a("MAX_THREADS_PER_BLOCK"),
        max_block_dim=(a("MAX_BLOCK_DIM_X"), a("MAX_BLOCK_DIM_Y"), a("MAX_BLOCK_DIM_Z")),
        max_grid_dim=(a("MAX_GRID_DIM_X"), a("MAX_GRID_DIM_Y"), a("MAX_GRID_DIM_Z")),
        max_shared_per_block_optin=a("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        cluster_launch=bool(a("CLUSTER_LAUNCH")),
    )


@dataclass(frozen=True)
class LaunchDims:
    """A checked launch configuration: 3-tuples, ``grid`` in blocks; ``cluster`` None if unset."""

    grid: tuple
    block: tuple
    cluster: tuple | None
    shared_mem: int


def _dims(value, what) -> tuple:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints; got {value!r}")
    if isinstance(value, int):
        value = (value,)
    try:
        dims = tuple(value)
    except TypeError:
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints; got {value!r}") from None
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ValueError(f"{what} must be an int or a tuple of 1-3 ints; got {value!r}")
    if any(d < 1 for d in dims):
        raise ValueError(f"{what} dimensions must be >= 1; got {value!r}")
    return dims + (1,) * (3 - len(dims))


def validate_launch(
    grid,
    block,
    cluster,
    shared_mem: int,
    limits: DeviceLimits,
    *,
    static_shared: int = 0,
    non_portable_cluster: bool = False,
) -> LaunchDims:
    """Check a launch against ``limits`` before the driver sees it; raise ValueError if bad.

    ``grid`` counts blocks. ``static_shared`` is the kernel's static shared memory (the
    opt-in limit covers static + dynamic).
    """
    if limits.cc[0] != 9:
        raise ValueError(
            f"device {limits.device} is compute capability {limits.cc[0]}.{limits.cc[1]}; numba_hopper "
            f"kernels are compiled for sm_90a and run only on Hopper (9.0)"
        )
    g = _dims(grid, "grid")
    b = _dims(block, "block")
    threads = math.prod(b)
    if threads > limits.max_threads_per_block:
        raise ValueError(
            f"block {b} has {threads} threads; the device allows at most {limits.max_threads_per_block} per block"
        )
    for axis, (d, m) in enumerate(zip(b, limits.max_block_dim)):
        if d > m:
            raise ValueError(f"block dimension {'xyz'[axis]} = {d} exceeds the device limit {m}")
    for axis, (d, m) in enumerate(zip(g, limits.max_grid_dim)):
        if d > m:
            raise ValueError(f"grid dimension {'xyz'[axis]} = {d} exceeds the device limit {m}")
    c = None
    if cluster is not None:
        c = _dims(cluster, "cluster")
        if not limits.cluster_launch:
            raise ValueError(f"device {limits.device} does not support cluster launch")
        size = math.prod(c)
        most = NON_PORTABLE_CLUSTER_SIZE if non_portable_cluster else PORTABLE_CLUSTER_SIZE
        if size > most:
            hint = "" if non_portable_cluster else " (up to 16 with non_portable_cluster=True)"
            raise ValueError(f"cluster {c} has {size} CTAs; at most {most} are allowed{hint}")
        for axis, (gd, cd) in enumerate(zip(g, c)):
            if gd % cd:
                raise ValueError(
                    f"cluster dimension {'xyz'[axis]} = {cd} does not divide grid dimension {gd} "
                    f"(grid {g} counts blocks; cluster {c})"
                )
    if isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or shared_mem < 0:
        raise ValueError(f"shared_mem must be a non-negative int (bytes); got {shared_mem!r}")
    budget = limits.max_shared_per_block_optin - static_shared
    if shared_mem > budget:
        static = f" minus the kernel's {static_shared} bytes of static shared memory" if static_shared else ""
        raise ValueError(
            f"shared_mem = {shared_mem} bytes exceeds the {budget} bytes available per block "
            f"(the device's opt-in limit {limits.max_shared_per_block_optin}{static})"
        )
    return LaunchDims(g, b, c, shared_mem)


# --- streams ---------------------------------------------------------------------------


def _handle_int(h) -> int:
    if isinstance(h, int):
        return h
    if isinstance(h, ctypes.c_void_p):
        return h.value or 0
    return int(h)  # cuda.bindings CUstream and friends


def as_stream_handle(stream) -> int:
    """The ``CUstream`` handle (an int; 0 = the default stream) of any stream object.

    Accepts None, an int handle, objects with ``__cuda_stream__`` (cuda.core, numba, recent
    CuPy), ``.cuda_stream`` (torch.cuda.Stream), ``.ptr`` (cupy.cuda.Stream) or ``.handle``
    (numba/cuda.core, a CUstream or ctypes pointer).
    """
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"a stream handle cannot be negative; got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        version, handle = proto() if callable(proto) else proto
        return _handle_int(handle)
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return _handle_int(getattr(stream, attr))
    raise TypeError(
        f"cannot get a CUDA stream handle from {type(stream).__name__}: expected None, an int, or an "
        f"object with __cuda_stream__, .cuda_stream, .ptr or .handle"
    )


# --- launch ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _core_grid_counts_clusters() -> bool:
    """cuda.core >= 0.4.0 reads LaunchConfig.grid as clusters when a cluster is set."""
    import cuda.core

    version = getattr(cuda.core, "__version__", "0")
    parts = []
    for p in version.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts) >= (0, 4)


def _core_grid(dims: LaunchDims, grid_counts_clusters: bool) -> tuple:
    if dims.cluster is None or not grid_counts_clusters:
        return dims.grid
    return tuple(g // c for g, c in zip(dims.grid, dims.cluster))


_attr_lock = threading.Lock()
_dyn_smem_set: dict = {}  # (CUkernel handle, device) -> largest dynamic smem opted into
_non_portable_set: set = set()


def _set_kernel_attribute(handle, device: int, name: str, value: int):
    from cuda.bindings import driver

    attr = getattr(driver.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_" + name)
    (err,) = driver.cuKernelSetAttribute(attr, value, handle, device)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuKernelSetAttribute({name}, {value}) failed: {err}")


def _opt_in(core_kernel, device: int, shared_mem: int, non_portable: bool):
    handle = core_kernel.handle
    key = (int(handle), device)
    with _attr_lock:
        if shared_mem > _dyn_smem_set.get(key, 0):
            _set_kernel_attribute(handle, device, "MAX_DYNAMIC_SHARED_SIZE_BYTES", shared_mem)
            _dyn_smem_set[key] = shared_mem
        if non_portable and key not in _non_portable_set:
            _set_kernel_attribute(handle, device, "NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1)
            _non_portable_set.add(key)


class PreparedLaunch:
    """A validated, opted-in, argument-packed launch; ``launch(stream, values=(), binds=())``
    runs it.

    Everything but the stream and the bound values is fixed at preparation: the call is one
    ``cuLaunchKernelEx`` (cuda.bindings) on a ``void*[]`` of numba's packed arguments and a
    launch configuration built once per stream. That costs ~5 us of host time where
    ``cuda.core.launch``, which re-packs its arguments on every call, costs ~12 us
    (an H100 host; ``python benchmarks/profile_overhead.py``): for a small GEMM the host's call rate, not the GPU,
    sets the pace. ``config`` is the same launch as a ``cuda.core.LaunchConfig`` (less
    ``dependent``).

    Rebinding: ``leaves[i]`` says where argument i landed in ``args`` (an index for a scalar,
    or for an array its data pointer; a list for a tuple), and a call may pass ``binds``,
    ``(index in args, index in values, offset)`` triples: before launching, ``args[index]``
    is set to ``values[i] + offset``. One prepared launch so serves new operands of the same
    layout without numba's per-call packing.
    """

    __slots__ = ("kernel", "config", "args", "leaves", "dependent", "device", "_dims", "_shared", "_func", "_params",
                 "_params_address", "_per_stream", "_launch_ex", "_success", "_lock")

    def __init__(self, kernel, config, args, dims, shared_mem, leaves=(), dependent=False, device=0):
        from cuda.bindings import driver

        self.kernel, self.config, self.args, self.leaves = kernel, config, args, leaves  # args: ctypes values
        self.dependent, self.device = dependent, device
        self._dims, self._shared = dims, shared_mem
        self._lock = threading.Lock()  # binds and the launch that reads them go together
        self._func = driver.CUfunction(int(kernel.handle))  # a CUkernel launches as a CUfunction
        self._params = (ctypes.c_void_p * max(1, len(args)))(*[ctypes.addressof(a) for a in args])
        self._params_address = ctypes.addressof(self._params)
        self._per_stream = {}
        self._launch_ex, self._success = driver.cuLaunchKernelEx, driver.CUresult.CUDA_SUCCESS

    def _driver_config(self, handle):
        from cuda.bindings import driver

        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self._dims.grid  # blocks, also with clusters
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self._dims.block
        cfg.sharedMemBytes = self._shared
        cfg.hStream = handle
        attrs = []
        if self._dims.cluster is not None:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = self._dims.cluster
            attrs.append(attr)
        if self.dependent:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        cfg.attrs, cfg.numAttrs = attrs, len(attrs)
        return cfg

    def __call__(self, stream=None, values=(), binds=()):
        handle = stream if type(stream) is int else as_stream_handle(stream)
        cfg = self._per_stream.get(handle)
        if cfg is None:
            if len(self._per_stream) >= 64:  # streams come and go: keep the table small
                self._per_stream.clear()
            cfg = self._per_stream.setdefault(handle, self._driver_config(handle))
        args = self.args
        with self._lock:
            for index, value, offset in binds:
                args[index].value = values[value] + offset
            (err,) = self._launch_ex(cfg, self._func, self._params_address, 0)
            if err == _NO_CONTEXT:  # a thread without a current context (PyTorch's autograd threads)
                bind_primary_context(self.device)
                (err,) = self._launch_ex(cfg, self._func, self._params_address, 0)
        if err != self._success:
            raise RuntimeError(f"cuLaunchKernelEx failed: {err}")


@functools.lru_cache(maxsize=64)
def _core_stream(handle: int):
    """A (non-owning) cuda.core Stream for a raw handle, reused across launches."""
    from cuda.core import Stream

    return Stream.from_handle(handle)


def prepare_launch(kernel, grid, block, args=(), *, cluster=None, shared_mem: int = 0,
                   non_portable_cluster: bool = False, cache_key=None, dependent: bool = False) -> PreparedLaunch:
    """Validate and set up ``kernel`` for the current device; see :func:`launch`.

    ``cache_key``: if given (a hashable repr-stable value naming every compile-time
    constant of ``kernel`` that its source does not show, e.g. a config dataclass), the
    compiled kernel is kept on disk and a new process loads it instead of compiling
    (``numba_hopper.runtime.kernel_cache``). ``dependent``: launch as a programmatic dependent (the
    module doc says what the kernel must do).
    """
    from cuda.core import LaunchConfig
    from numba import cuda

    args = tuple(args)
    device = cuda.get_current_device().id
    limits = device_limits(device)
    dims = validate_launch(grid, block, cluster, shared_mem, limits, non_portable_cluster=non_portable_cluster)
    compiled, core_kernel = _loaded(kernel, args, cache_key, limits.cc)
    static = _internals.static_shared_bytes(compiled)
    if static:
        dims = validate_launch(
            grid, block, cluster, shared_mem, limits, static_shared=static, non_portable_cluster=non_portable_cluster
        )
    _opt_in(core_kernel, device, shared_mem, non_portable_cluster and dims.cluster is not None)
    packed = _internals.pack_kernel_args(compiled, args)
    config = {"grid": _core_grid(dims, _core_grid_counts_clusters()), "block": dims.block, "shmem_size": shared_mem}
    if dims.cluster is not None:
        config["cluster"] = dims.cluster
    return PreparedLaunch(core_kernel, LaunchConfig(**config), packed, dims, shared_mem,
                          _internals.argument_leaves(compiled), dependent, device)


# numba compiles and loads kernels without a lock: two threads asking for the same new kernel
# each add an overload (or load a module), and the one dropped is unloaded while the other
# thread may hold it (seen on the H100: "key already in dictionary: <CUlibrary ...>" from
# numba's module table, then a double free at exit).
_LOAD_LOCK = threading.Lock()


def _loaded(kernel, args, cache_key, cc):
    """``(compiled kernel, its cuda.core Kernel)`` for ``args``, loaded in the current context;
    from the on-disk cache when ``cache_key`` is given."""
    with _LOAD_LOCK:
        if cache_key is None:
            compiled = _internals.kernel_for_args(kernel, args)
        else:
            compiled = _kernel_cache.kernel_for_args(kernel, args, cache_key, cc)
        return compiled, _internals.cu_kernel(compiled)


def max_active_clusters(kernel, cluster, block, args=(), *, shared_mem: int = 0, cache_key=None) -> int:
    """How many clusters of ``cluster`` CTAs can be resident at once (cuOccupancyMaxActiveClusters).

    A persistent kernel must not launch more: GPCs have uneven numbers of free SMs, so
    e.g. 132 SMs hold fewer than 33 clusters of 4, and CTAs beyond the resident ones
    would wait for a second wave.
    """
    from cuda.core import LaunchConfig
    from numba import cuda

    device = cuda.get_current_device().id
    _, core_kernel = _loaded(kernel, tuple(args), cache_key, device_limits(device).cc)
    _opt_in(core_kernel, device, shared_mem, False)
    dims = validate_launch(cluster, block, cluster, shared_mem, device_limits(device))
    config = LaunchConfig(grid=_core_grid(dims, _core_grid_counts_clusters()), cluster=dims.cluster,
                          block=dims.block, shmem_size=shared_mem)
    return int(core_kernel.occupancy.max_active_clusters(config, stream=_core_stream(0)))


def launch(
    kernel,
    grid,
    block,
    args=(),
    *,
    cluster=None,
    shared_mem: int = 0,
    stream=None,
    non_portable_cluster: bool = False,
    dependent: bool = False,
):
    """Launch ``kernel`` (a ``@cuda.jit`` dispatcher) on the current device; see the module doc.

    ``grid`` counts blocks. Raises ValueError before launching if the configuration cannot
    run on this device. To launch the same configuration repeatedly, keep the result of
    :func:`prepare_launch` and call it with a stream.
    """
    prepare_launch(kernel, grid, block, args, cluster=cluster, shared_mem=shared_mem,
                   non_portable_cluster=non_portable_cluster, dependent=dependent)(stream)
