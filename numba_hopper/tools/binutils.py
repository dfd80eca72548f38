"""The CUDA binary utilities (``nvdisasm``, ``cuobjdump``) that SASS inspection runs."""

from __future__ import annotations

import shutil

__all__ = ["ToolNotFoundError", "find_tool"]


class ToolNotFoundError(RuntimeError):
    """A CUDA binary utility (nvdisasm, cuobjdump) is not installed."""


def find_tool(name: str) -> str:
    """Path of a CUDA binary utility: the pip wheels first, then CUDA_HOME, then PATH."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        path = find_nvidia_binary_utility(name)
    except Exception:  # older cuda-pathfinder, or not installed
        path = None
    path = path or shutil.which(name)
    if not path:
        raise ToolNotFoundError(
            f"'{name}' was not found. Install the inspect extra, which brings nvidia-cuda-nvdisasm and "
            f"nvidia-cuda-cuobjdump: pip install 'numba-hopper[inspect]' (from a clone of the repository: "
            f"pip install -e '.[inspect]'), or put a CUDA 13 toolkit's bin directory on PATH."
        )
    return path
