"""Debug mode: bounded pipeline waits that report a hang instead of hanging.

Turn it on per call (``gemm(..., debug=True)``) or for the process (``NUMBA_HOPPER_DEBUG=1``
in the environment when numba_hopper is imported, or ``numba_hopper.runtime.debug.DEFAULT = True``).
The GEMM is then compiled with ``GemmConfig(debug=True)``: every mbarrier wait gives up after
``DEBUG_TIMEOUT_NS`` (2 s), the first thread to give up writes what it was waiting
for into a :class:`DebugRecord` and traps. The host synchronizes after the launch and raises
:class:`~numba_hopper.errors.PipelineHangError` from the record. Release builds (the default)
have none of this code.

Debug mode costs a synchronization per call and a record per launch; use it to find a hang,
not in production.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import PipelineHangError

__all__ = ["debug_enabled", "DebugRecord", "DEFAULT", "RECORD_FIELDS", "ROLES", "DEBUG_TIMEOUT_NS"]

ENV_VAR = "NUMBA_HOPPER_DEBUG"

# The record a timed-out wait fills (``numba_hopper.kit.pipeline``): uint32 words in this order;
# "status" is 0 until a wait times out.
RECORD_FIELDS = ("status", "role", "slot", "phase", "barrier", "tile", "k_block", "block", "thread")
PRODUCER, CONSUMER = 1, 2  # the producer waits on empty[slot], consumers on full[slot]
ROLES = {PRODUCER: "producer", CONSUMER: "consumer"}
DEBUG_TIMEOUT_NS = 2_000_000_000  # far beyond any healthy wait, short enough to fail a test


def debug_enabled(flag=None) -> bool:
    """``flag`` if given, else whether ``NUMBA_HOPPER_DEBUG`` is set (to anything but 0)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV_VAR, "0") not in ("", "0")


# Calls without ``debug=`` use this, read once here: reading the environment on every call
# would cost each GEMM call about a microsecond.
DEFAULT = debug_enabled()


class DebugRecord:
    """A zeroed debug record in host-mapped memory; pass ``address`` to a debug kernel.

    Host-mapped because a trap makes the CUDA context unusable: device memory could no
    longer be copied back, host memory is simply read.
    """

    def __init__(self):
        from numba import cuda

        self._host = cuda.mapped_array(len(RECORD_FIELDS), dtype=np.uint32)
        self._host[:] = 0
        self.address = self._host.device_ctypes_pointer.value

    def read(self) -> dict | None:
        """The record as a dict (``role`` as a name), or None if no wait timed out."""
        rec = dict(zip(RECORD_FIELDS, (int(v) for v in self._host)))
        if not rec.pop("status"):
            return None
        rec["role"] = ROLES.get(rec["role"], f"role {rec['role']}")
        return rec

    def synchronize(self, stream: int):
        """Wait for ``stream``; raise PipelineHangError (or RuntimeError) if its work failed."""
        from cuda.bindings import driver

        (err,) = driver.cuStreamSynchronize(stream)
        if err == driver.CUresult.CUDA_SUCCESS:
            return
        rec = self.read()
        if rec is None:
            raise RuntimeError(f"a numba_hopper kernel failed: {err}")
        raise PipelineHangError(rec, err, DEBUG_TIMEOUT_NS / 1e9)
