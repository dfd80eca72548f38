"""numba_hopper: Hopper (sm_90a) instructions for numba-cuda, and a GEMM built from them.

Layers, each importing only the ones above it:

- ``numba_hopper.intrinsics``: one numba intrinsic per PTX instruction (device side);
- ``numba_hopper.tensormap`` / ``numba_hopper.launch``: TMA descriptors and cluster launch;
- ``numba_hopper.pipeline``: the mbarrier ring buffer (producer/consumer state);
- ``numba_hopper.kernels``: kernels built from those pieces;
- ``numba_hopper.gemm``: the public GEMM.

``numba_hopper.inspect`` compiles any kernel for sm_90a without a GPU and reports its SASS.
"""

__version__ = "0.1.0"
