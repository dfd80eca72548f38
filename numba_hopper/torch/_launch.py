"""Launch the torch layer's small streaming kernels (the loss's, the optimizer's) on PyTorch's
current stream, prepared once per grid and argument layout."""

from __future__ import annotations

import torch

from ..runtime.device import on_device
from ..runtime.launch import prepare_launch

__all__ = ["launch", "KERNEL_DTYPES"]

KERNEL_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}  # the streaming kernels' element types

_PREPARED = {}  # (kernel, device, grid, block, argument layouts) -> (PreparedLaunch, binds)


def launch(kernel, device, grid, block, *args):
    """``kernel[grid, block](*args)`` on PyTorch's current stream of ``device``: tensors are
    passed as numba arrays, everything else as it is. The launch is prepared once per grid and
    argument layout (``runtime.launch.prepare_launch``); each call then rebinds the tensors'
    data pointers and the scalars, without numba's per-call argument handling."""
    key = (kernel, device.index, grid, block,
           tuple((t.shape, t.stride(), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in args))
    values = [t.data_ptr() if isinstance(t, torch.Tensor) else t for t in args]
    with on_device(device.index or 0):
        entry = _PREPARED.get(key)
        if entry is None:
            from numba import cuda

            prepared = prepare_launch(kernel, grid, block,
                                      [cuda.as_cuda_array(t.detach(), sync=False) if isinstance(t, torch.Tensor) else t
                                       for t in args])  # (detached: a custom op's input may require grad)
            if len(_PREPARED) >= 64:
                _PREPARED.clear()
            entry = _PREPARED[key] = (prepared, [(prepared.leaves[i], i, 0) for i in range(len(args))])
        prepared, binds = entry
        prepared(torch.cuda.current_stream(device).cuda_stream, values, binds)
