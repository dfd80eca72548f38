"""The exceptions numba_hopper raises.

Each subclasses the built-in exception the package raised before it had its own (TypeError,
ValueError, RuntimeError), so existing ``except ValueError:`` clauses keep working; catch
``NumbaHopperError`` for all of them.
"""

from __future__ import annotations

__all__ = [
    "NumbaHopperError",
    "DtypeError",
    "ShapeError",
    "LayoutError",
    "OverlapError",
    "DeviceMismatchError",
    "UnsupportedDeviceError",
    "DeviceOutOfMemoryError",
    "PipelineHangError",
]


class NumbaHopperError(Exception):
    """Base class of every numba_hopper exception."""


class DtypeError(NumbaHopperError, TypeError):
    """An unsupported element type, or operands whose types do not match."""


class ShapeError(NumbaHopperError, ValueError):
    """Wrong number of dimensions, or extents that do not match."""


class LayoutError(NumbaHopperError, ValueError):
    """Strides the operation cannot use (e.g. negative ones)."""


class OverlapError(NumbaHopperError, ValueError):
    """An output whose memory overlaps an input's."""


class DeviceMismatchError(NumbaHopperError, ValueError):
    """Operands on different devices."""


class UnsupportedDeviceError(NumbaHopperError, RuntimeError):
    """No Hopper (compute capability 9.x) GPU to run on."""


class DeviceOutOfMemoryError(NumbaHopperError, MemoryError):
    """The device had no memory left for what a call allocates itself (its scratch). Nothing
    was launched: the call can be made again once memory is free. ``nbytes``: the bytes
    asked for; ``device``: the device's ordinal."""

    def __init__(self, message, nbytes, device):
        super().__init__(message)
        self.nbytes, self.device = nbytes, device


class PipelineHangError(NumbaHopperError, RuntimeError):
    """A debug-mode kernel's mbarrier wait timed out (see ``numba_hopper.runtime.debug``).

    Attributes, from the kernel's debug record: ``role`` ("producer" waited on an empty
    slot, "consumer" on a full one), ``slot``, ``phase`` (the parity waited for),
    ``barrier`` (its shared-memory address), ``tile``, ``k_block``, ``block`` and ``thread``
    (who gave up first), and ``cuda_error``. The kernel trapped, which leaves this process's
    CUDA context unusable: every later CUDA call in the process fails (numba_hopper's, PyTorch's
    and any other library's), so the process has to be restarted. To look into a hang and
    carry on, run the debug call in a process of its own.
    """

    def __init__(self, record: dict, cuda_error, timeout_s: float):
        self.record = record
        self.cuda_error = cuda_error
        for name, value in record.items():
            setattr(self, name, value)
        super().__init__(
            f"pipeline hang: the {record['role']} waited {timeout_s:g} s on "
            f"{'empty' if record['role'] == 'producer' else 'full'}[slot {record['slot']}] for "
            f"parity {record['phase']} (barrier at shared 0x{record['barrier']:x}, tile {record['tile']}, "
            f"k-block {record['k_block']}, block {record['block']}, thread {record['thread']}). The kernel "
            f"trapped ({cuda_error}), which leaves this process's CUDA context unusable: every later CUDA call in "
            "this process fails (numba_hopper's, PyTorch's and any other library's). Restart the process; to debug "
            "a hang and carry on, run the debug call in a process of its own"
        )
