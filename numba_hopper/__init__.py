"""numba_hopper: Hopper (sm_90a) instructions for numba-cuda, and a GEMM built from them.

    import numba_hopper
    c = numba_hopper.gemm(a, b)          # PyTorch, CuPy or numba arrays; bf16/fp16 in

Layers, each importing only the ones above it:

- ``numba_hopper.intrinsics`` (device): one numba intrinsic per PTX instruction;
- ``numba_hopper.kernels`` (device): the GEMM kernel and its components (the TMA ring,
  mainloop, tile scheduler, epilogue);
- ``numba_hopper.tensormap`` / ``numba_hopper.launch`` (host): TMA descriptors and cluster
  launch;
- ``numba_hopper.matmul`` (host): the public GEMM (``gemm``, ``bmm``) over the host layers
  (``_checks``, ``_heuristics``, ``_plan``, ...), and ``numba_hopper.grouped``
  (``grouped_gemm``, mixture-of-experts layers) on the same call path, re-exported here with
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
from .grouped import grouped_gemm  # noqa: F401
from .matmul import GemmConfig, bmm, gemm  # noqa: F401

__version__ = "0.1.0"

__all__ = ["gemm", "bmm", "grouped_gemm", "GemmConfig", "NumbaHopperError", "DtypeError", "ShapeError", "LayoutError",
           "OverlapError", "DeviceMismatchError", "UnsupportedDeviceError", "PipelineHangError"]
