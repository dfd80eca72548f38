"""numba_hopper: Hopper (sm_90a) instructions for numba-cuda, and a GEMM built from them.

    import numba_hopper
    c = numba_hopper.gemm(a, b)          # PyTorch, CuPy or numba arrays; bf16/fp16 in

Layers, each importing only the ones above it:

- ``numba_hopper.intrinsics``: one numba intrinsic per PTX instruction (device side);
- ``numba_hopper.tensormap`` / ``numba_hopper.launch``: TMA descriptors and cluster launch;
- ``numba_hopper.kernels.pipeline``: the mbarrier ring buffer (producer/consumer state);
- ``numba_hopper.kernels``: kernels built from those pieces;
- ``numba_hopper.matmul``: the public GEMM (``gemm``, ``bmm``), re-exported here with
  :class:`GemmConfig` and the exceptions of ``numba_hopper.errors``.

``numba_hopper.sass`` compiles any kernel for sm_90a without a GPU and reports its SASS;
``python -m numba_hopper`` (``numba_hopper.cli``) checks, inspects and times the shipped
kernels (``--help``).
"""

from .errors import (  # noqa: F401
    DeviceMismatchError,
    DtypeError,
    LayoutError,
    NumbaHopperError,
    OverlapError,
    PipelineHangError,
    ShapeError,
    UnsupportedDeviceError,
)
from .matmul import GemmConfig, bmm, gemm  # noqa: F401

__version__ = "0.1.0"

__all__ = ["gemm", "bmm", "GemmConfig", "NumbaHopperError", "DtypeError", "ShapeError", "LayoutError",
           "OverlapError", "DeviceMismatchError", "UnsupportedDeviceError", "PipelineHangError"]
