"""Is there a Hopper GPU here? Answered without creating a CUDA context when there is none.
And :func:`on_device`: numba's current device made a PyTorch tensor's for a launch."""

from __future__ import annotations

import contextlib
import functools


@functools.lru_cache(maxsize=None)
def hopper_device_reason() -> str | None:
    """None if device 0 is compute capability 9.x, else a sentence saying why not."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return "no CUDA driver or GPU found"
        cc = cuda.get_current_device().compute_capability
    except Exception as exc:  # driver present but broken, or no device
        return f"no usable CUDA device ({exc.__class__.__name__}: {exc})"
    if cc[0] != 9:
        return f"device 0 is compute capability {cc[0]}.{cc[1]}, not Hopper (9.x)"
    return None


def has_hopper() -> bool:
    return hopper_device_reason() is None


def on_device(device: int):
    """numba's current device made ``device`` for a launch on PyTorch's tensors (a no-op where
    it already is)."""
    from numba import cuda

    if _single_device() or cuda.get_current_device().id == device:
        return contextlib.nullcontext()
    return cuda.gpus[device]


@functools.lru_cache(maxsize=1)
def _single_device():
    import torch

    return torch.cuda.device_count() == 1
