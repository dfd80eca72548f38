"""numba_hopper: Hopper (sm_90a) kernels from Python.

    import numba_hopper
    c = numba_hopper.gemm(a, b)          # PyTorch, CuPy or numba arrays; bf16/fp16/fp8 in

Layers, each importing only the ones listed before it:

- :mod:`numba_hopper.intrinsics` (device): one numba intrinsic per PTX instruction;
- :mod:`numba_hopper.kit` (device): parts for any Hopper kernel (pipelines, ...);
- :mod:`numba_hopper.kernels` (device): the GEMM kernel and its components;
- :mod:`numba_hopper.runtime` (host): device arrays, TMA tensor maps, cluster launch, the kernel
  cache;
- :mod:`numba_hopper.matmul` (host): ``gemm``, ``gemm_sum``, ``gemm_glu_backward``, ``bmm`` and
  ``grouped_gemm`` and their call path, re-exported here with :class:`GemmConfig` and the
  exceptions of :mod:`numba_hopper.errors`;
- :mod:`numba_hopper.attention` (host and device): ``attention``, a FlashAttention-3-style
  forward built on the kit, re-exported here;
- :mod:`numba_hopper.torch`: custom ops, autograd and modules for PyTorch (imports torch);
- :mod:`numba_hopper.tools`: SASS inspection without a GPU, the command line
  (``python -m numba_hopper``), the prebuilt kernel set.

``numba_hopper._numba_internals`` holds every use of numba-cuda's private internals.
"""

from .errors import (  # noqa: F401
    DeviceMismatchError,
    DeviceOutOfMemoryError,
    DtypeError,
    LayoutError,
    NumbaHopperError,
    OverlapError,
    PipelineHangError,
    ShapeError,
    UnsupportedDeviceError,
)
from .matmul import GemmConfig, bmm, gemm, gemm_glu_backward, gemm_sum, grouped_gemm  # noqa: F401
from .attention import attention  # noqa: F401

__version__ = "0.1.0"

__all__ = ["gemm", "gemm_sum", "gemm_glu_backward", "bmm", "grouped_gemm", "GemmConfig", "attention", "NumbaHopperError", "DtypeError",
           "ShapeError", "LayoutError", "OverlapError", "DeviceMismatchError", "UnsupportedDeviceError", "DeviceOutOfMemoryError",
           "PipelineHangError"]
