"""Launch the torch layer's small streaming kernels (the loss's, the norm's, the optimizer's) on
PyTorch's current stream, prepared once per grid and argument layout."""

from __future__ import annotations

import torch

from ..runtime.device import on_device
from ..runtime.launch import prepare_launch

__all__ = ["launch", "prepare", "Launcher", "KERNEL_DTYPES"]

KERNEL_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}  # the streaming kernels' element types

_PREPARED = {}  # (kernel, device, grid, block, argument layouts) -> Launcher


class Launcher:
    """A kernel's launch prepared for one argument layout (``runtime.launch.prepare_launch``):
    ``launcher(stream, *values)`` rebinds each argument, a tensor's data pointer or a scalar,
    and launches, without numba's per-call argument handling."""

    __slots__ = ("_prepared", "_binds", "_device")

    def __init__(self, prepared, arguments, device):
        self._prepared, self._device = prepared, device
        self._binds = [(prepared.leaves[i], i, 0) for i in range(arguments)]

    def __call__(self, stream, *values):
        with on_device(self._device):
            self._prepared(stream, values, self._binds)


def prepare(kernel, device, grid, block, *args):
    """``kernel[grid, block]`` prepared for ``args``' layout (tensors as numba arrays, everything
    else as it is) on ``device``: a :class:`Launcher`."""
    from numba import cuda

    index = device.index or 0
    with on_device(index):
        prepared = prepare_launch(kernel, grid, block,
                                  [cuda.as_cuda_array(t.detach(), sync=False) if isinstance(t, torch.Tensor) else t
                                   for t in args])  # (detached: a custom op's input may require grad)
    return Launcher(prepared, len(args), index)


def launch(kernel, device, grid, block, *args):
    """``kernel[grid, block](*args)`` on PyTorch's current stream of ``device``, prepared
    (:func:`prepare`) once per grid and argument layout."""
    key = (kernel, device.index, grid, block,
           tuple((t.shape, t.stride(), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in args))
    launcher = _PREPARED.get(key)
    if launcher is None:
        if len(_PREPARED) >= 64:
            _PREPARED.clear()
        launcher = _PREPARED[key] = prepare(kernel, device, grid, block, *args)
    launcher(torch.cuda.current_stream(device).cuda_stream, *[t.data_ptr() if isinstance(t, torch.Tensor) else t
                                                              for t in args])
