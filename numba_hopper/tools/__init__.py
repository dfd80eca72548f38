"""Developer tools: the command line (``python -m numba_hopper``), SASS inspection without a GPU,
the prebuilt kernel set and the self-check.

- :mod:`.sass`: :func:`~numba_hopper.tools.sass.inspect_kernel` compiles any ``@cuda.jit``
  kernel for sm_90a and reports its registers, spills, warnings and SASS opcodes;
- :mod:`.cli`: ``python -m numba_hopper [check | inspect | bench | prebuild]``;
- :mod:`.prebuild`: the kernels a default ``gemm``/``bmm`` can pick, compiled ahead;
- :mod:`.selfcheck`: what ``python -m numba_hopper check`` runs on a Hopper GPU.
"""

from .sass import KernelReport, inspect_kernel

__all__ = ["inspect_kernel", "KernelReport"]
