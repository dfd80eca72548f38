"""Hopper (sm_90a) PTX instructions as numba intrinsics, one function per instruction.

Use them inside any ``@cuda.jit`` kernel compiled for ``cc=(9, 0, "a")`` (numba-cuda does
this on its own when it launches on a Hopper GPU). Shared-memory operands (mbarriers,
TMA destinations, wgmma tiles) are 32-bit shared-state-space addresses (``uint32``): see
``shared_address`` and ``dynamic_shared_base``.
"""

from ._ptx import Choice, Const, ptx_intrinsic  # noqa: F401
