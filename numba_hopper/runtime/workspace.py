"""Device scratch for a call's launches, taken and given back in the call's stream order.

Some GEMM plans need device memory beside their operands: split-K and stream-K partial sums,
aligned copies of operands TMA cannot address, the cluster claims of GPC-ordered kernels. A
call takes its scratch with :func:`alloc_scratch` before it queues its launches and gives it
back with :func:`free_scratch` after them, both queued on the call's stream
(``cuMemAllocFromPoolAsync``, ``cuMemFreeAsync``). The driver lets other work have the
memory only once that stream has passed the free, so:

- scratch is never shared with queued work, whatever becomes of the stream: nothing is kept
  per stream handle, and a stream destroyed with work queued, whose handle a new stream
  then reuses, holds nothing the new one could be given;
- the memory held is what the calls in flight need at once, however many streams come and
  go (a server that makes a stream per request stays flat);
- neither call waits for the device.

The memory comes from a pool of numba_hopper's own per device (``cuMemPoolCreate``), not the
device's default pool, whose settings other libraries may change, nor the caller's
framework (PyTorch's caching allocator keeps each freed block for the stream it was made on,
so a stream per request would grow its cache). Its settings:

- release threshold ``KEEP_BYTES``: what the pool keeps mapped through a synchronization, so
  that steady calls reuse memory rather than map it again (the driver returns the excess
  to the device at the next stream, event or context synchronization);
- no internal dependencies (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`` off): memory
  freed on one stream goes to another only once its free has completed or the other stream
  waits for it. Otherwise the driver may make the second stream wait for the first to reuse
  a block, serializing independent streams; the pool grows instead.

A stream being captured into a CUDA graph gets the same calls, which capture as an
allocation node (graph-owned memory, with the pool's properties) and a free node: graph
replays never share scratch with eager calls, other graphs or each other.

Every scratch region starts with ``CLAIMS_BYTES`` of cluster claims
(``GemmParams.cluster_claims``) before the address a plan gets; a plan whose kernel claims
tile slots asks for them zeroed (one ``cuMemsetD8Async`` queued before its launches).

Out of memory, :func:`alloc_scratch` raises
:class:`~numba_hopper.errors.DeviceOutOfMemoryError` (a MemoryError) having queued nothing, so
the call can be made again once memory is free.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

from ..errors import DeviceOutOfMemoryError

__all__ = ["ALIGN", "CLAIMS_BYTES", "KEEP_BYTES", "NO_CONTEXT", "alloc_scratch", "bind_primary_context",
           "ensure_context", "free_scratch", "scratch_pool_bytes"]

ALIGN = 256  # every region a plan carves out starts on this boundary
CLAIMS_BYTES = 4 * ALIGN  # a u32 count and 255 slots: 2-CTA clusters on up to 510 SMs
KEEP_BYTES = 256 << 20  # the pool's release threshold

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_OUT_OF_MEMORY = driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
NO_CONTEXT = driver.CUresult.CUDA_ERROR_INVALID_CONTEXT

_pools: dict = {}  # device ordinal -> CUmemoryPool
_lock = threading.Lock()


def alloc_scratch(device, stream, nbytes, zero_claims) -> int:
    """The address of ``nbytes`` of device memory on ``device`` for work queued on ``stream``
    until :func:`free_scratch`, after ``CLAIMS_BYTES`` of claims, zeroed in stream order if
    ``zero_claims``. Waits for nothing."""
    pool = _pools.get(device)
    if pool is None:
        pool = _pool(device)
    asked = CLAIMS_BYTES + nbytes
    err, base = driver.cuMemAllocFromPoolAsync(asked, pool, stream)
    if err == NO_CONTEXT:  # a thread the driver has no context for: PyTorch's autograd threads
        bind_primary_context(device)
        err, base = driver.cuMemAllocFromPoolAsync(asked, pool, stream)
    if err == _OUT_OF_MEMORY:
        raise DeviceOutOfMemoryError(
            f"out of device memory on device {device}: a GEMM call's scratch needs {asked} bytes "
            f"({asked / 2**20:.1f} MiB: partial sums, aligned operand copies or cluster claims); nothing was launched. "
            "Free device memory (e.g. torch.cuda.empty_cache()) and call again", nbytes=asked, device=device)
    _check(err, f"cuMemAllocFromPoolAsync({asked})")
    base = int(base)
    if zero_claims:
        (err,) = driver.cuMemsetD8Async(base, 0, CLAIMS_BYTES, stream)
        if err != _SUCCESS:
            driver.cuMemFreeAsync(base, stream)
            _check(err, "cuMemsetD8Async")
    return base + CLAIMS_BYTES


def bind_primary_context(device):
    """Make ``device``'s primary context (the one PyTorch, CuPy and numba use) current in this
    thread. Stream-ordered allocation needs a current context, and a thread that has made no
    runtime-API call has none (PyTorch runs backward in threads of its own). The context stays
    retained: its users hold it for the life of the process anyway."""
    dev = _check(driver.cuDeviceGet(device), f"cuDeviceGet({device})")
    ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def ensure_context(device):
    """Bind ``device``'s primary context (:func:`bind_primary_context`) where this thread has no
    current context: before a driver call that fails without one (encoding a tensor map)."""
    err, ctx = driver.cuCtxGetCurrent()
    if err != _SUCCESS or not int(ctx):
        bind_primary_context(device)


def free_scratch(scratch, stream):
    """Give back the scratch at ``scratch`` (from :func:`alloc_scratch` on ``stream``) once the
    work queued on ``stream`` so far is done."""
    (err,) = driver.cuMemFreeAsync(scratch - CLAIMS_BYTES, stream)
    _check(err, "cuMemFreeAsync")


def scratch_pool_bytes(device) -> tuple:
    """``(reserved, used)``: the bytes of device memory ``device``'s scratch pool holds, and of
    those the bytes given out and not yet freed in stream order ((0, 0) before its first use)."""
    pool = _pools.get(device)
    if pool is None:
        return 0, 0
    attrs = driver.CUmemPool_attribute
    return tuple(int(_check(driver.cuMemPoolGetAttribute(pool, attr), "cuMemPoolGetAttribute"))
                 for attr in (attrs.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, attrs.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))


def _pool(device):
    """``device``'s scratch pool, made on its first use (module docstring: its settings)."""
    with _lock:
        pool = _pools.get(device)
        if pool is None:
            props = driver.CUmemPoolProps()
            props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            props.handleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
            props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            props.location.id = device
            pool = _check(driver.cuMemPoolCreate(props), f"cuMemPoolCreate(device {device})")
            attrs = driver.CUmemPool_attribute
            for attr, value in ((attrs.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, driver.cuuint64_t(KEEP_BYTES)),
                                (attrs.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, 0)):
                _check(driver.cuMemPoolSetAttribute(pool, attr, value), f"cuMemPoolSetAttribute({attr.name})")
            _pools[device] = pool
        return pool


def _check(result, what):
    """``result``'s value (a driver call's ``(CUresult, value)`` or ``CUresult``), or RuntimeError."""
    err, *value = result if isinstance(result, tuple) else (result,)
    if err != _SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return value[0] if value else None
