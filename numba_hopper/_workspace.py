"""Device scratch for a call's launches, taken without waiting for the device.

A GEMM plan needs device memory beside its operands: the per-CTA tensor-map slots
(``kernels/descriptors.py``), and for some plans split-K partial sums, stream-K partials or
aligned copies of operands. Launches on one stream run one after another, so all plans on a
stream share one buffer per (device, stream): allocated in stream order (``cuMemAllocAsync``)
the first time, and replaced by a larger one when a plan needs more, the old one freed in
stream order behind the launches that used it.

While a stream is being captured into a CUDA graph, a call gets scratch of its own, allocated
and freed inside the graph (memory nodes): graph replays never share scratch with eager calls,
with other graphs or with each other.

Limits: a stream's buffer lives as long as the process. A stream destroyed while work that
uses its buffer is still queued, then replaced by a new stream with the same handle, would
share the buffer with that work.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

__all__ = ["run_with_scratch", "ALIGN"]

ALIGN = 256  # every region a plan carves out starts on this boundary


class _StreamBuffer:
    __slots__ = ("lock", "ptr", "size")

    def __init__(self):
        self.lock = threading.Lock()  # held from reserving the buffer until the launches are queued
        self.ptr, self.size = 0, 0

    def reserve(self, nbytes, stream):
        if nbytes > self.size:
            size = max(nbytes, 2 * self.size)
            ptr = _alloc_async(size, stream)
            if self.ptr:
                _free_async(self.ptr, stream)
            self.ptr, self.size = ptr, size
        return self.ptr


_buffers: dict = {}
_buffers_lock = threading.Lock()


def _stream_buffer(device, stream) -> _StreamBuffer:
    key = (device, stream)
    buf = _buffers.get(key)
    if buf is None:
        with _buffers_lock:
            buf = _buffers.setdefault(key, _StreamBuffer())
    return buf


def run_with_scratch(device, stream, nbytes, launch, values):
    """``launch(stream, values)`` with ``values[0]`` replaced by the address of ``nbytes`` of
    device scratch, usable by work queued on ``stream``."""
    if not nbytes:
        return launch(stream, values)
    if _capturing(stream):
        ptr = _alloc_async(nbytes, stream)
        launch(stream, (ptr,) + values[1:])
        _free_async(ptr, stream)
        return None
    buf = _stream_buffer(device, stream)
    with buf.lock:
        return launch(stream, (buf.reserve(nbytes, stream),) + values[1:])


def _check(result, what):
    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {result[0]}")
    return result[1] if len(result) > 1 else None


def _capturing(stream) -> bool:
    status = _check(driver.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    return status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _alloc_async(nbytes, stream) -> int:
    return int(_check(driver.cuMemAllocAsync(nbytes, stream), f"cuMemAllocAsync({nbytes})"))


def _free_async(ptr, stream):
    _check(driver.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
