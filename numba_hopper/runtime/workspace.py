"""Device scratch for a call's launches, taken without waiting for the device.

Some GEMM plans need device memory beside their operands: split-K partial sums, stream-K
partials or aligned copies of operands. Launches on one stream run one after another, so all plans on a
stream share one buffer per (device, stream) (:func:`stream_scratch`): allocated in stream
order (``cuMemAllocAsync``) the first time, and replaced by a larger one when a plan needs
more.

Every buffer starts with ``CLAIMS_BYTES`` of cluster claims (``GemmParams.cluster_claims``),
zeroed when the buffer is made and left zero by each kernel that claims slots there; the
address a plan gets is past them.

While a stream is being captured into a CUDA graph, a call gets scratch of its own, allocated
and freed inside the graph (memory nodes), its claims zeroed in the graph: graph replays never
share scratch with eager calls, with other graphs or with each other (``Plan.__call__`` asks
:func:`capturing`).

Limits: a stream's buffers live as long as the process. A stream destroyed while work that
uses its buffer is still queued, then replaced by a new stream with the same handle, would
share the buffer with that work.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

__all__ = ["ALIGN", "CLAIMS_BYTES", "stream_scratch", "capturing", "alloc_async", "free_async", "zero_async"]

ALIGN = 256  # every region a plan carves out starts on this boundary
CLAIMS_BYTES = 4 * ALIGN  # a u32 count and 255 slots: 2-CTA clusters on up to 510 SMs


class _StreamBuffer:
    __slots__ = ("ptr", "size", "retired")

    def __init__(self):
        self.ptr, self.size, self.retired = 0, 0, []


_buffers: dict = {}
_lock = threading.Lock()


def stream_scratch(device, stream, nbytes) -> int:
    """The address of at least ``nbytes`` of device memory that work queued on ``stream`` may use,
    after ``CLAIMS_BYTES`` of zeroed claims.

    A buffer outgrown by a later plan is kept, not freed: another thread may have read its
    address and not yet queued the launch that uses it. The buffers grow by doubling, so
    what is kept is at most the size of the newest.
    """
    buf = _buffers.get((device, stream))
    if buf is not None and buf.ptr and buf.size >= nbytes:  # (a buffer another thread still makes has no ptr)
        return buf.ptr + CLAIMS_BYTES
    with _lock:
        buf = _buffers.setdefault((device, stream), _StreamBuffer())
        if not buf.ptr or buf.size < nbytes:
            size = max(nbytes, 2 * buf.size)
            if buf.ptr:
                buf.retired.append(buf.ptr)
            buf.ptr, buf.size = alloc_async(CLAIMS_BYTES + size, stream), size
            zero_async(buf.ptr, CLAIMS_BYTES, stream)
        return buf.ptr + CLAIMS_BYTES


def _check(result, what):
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {result[0]}")
    return result[1] if len(result) > 1 else None


_NOT_CAPTURING = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def capturing(stream) -> bool:
    """Whether ``stream`` is being captured into a CUDA graph."""
    return _check(driver.cuStreamIsCapturing(stream), "cuStreamIsCapturing") != _NOT_CAPTURING


def alloc_async(nbytes, stream) -> int:
    """``cuMemAllocAsync``: device memory usable by work queued on ``stream`` after this call."""
    return int(_check(driver.cuMemAllocAsync(nbytes, stream), f"cuMemAllocAsync({nbytes})"))


def zero_async(ptr, nbytes, stream):
    """``cuMemsetD8Async``: zero ``nbytes`` at ``ptr`` in stream order."""
    _check(driver.cuMemsetD8Async(ptr, 0, nbytes, stream), "cuMemsetD8Async")


def free_async(ptr, stream):
    """``cuMemFreeAsync``: free ``ptr`` once the work queued on ``stream`` so far is done."""
    _check(driver.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
