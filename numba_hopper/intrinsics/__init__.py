"""Hopper (sm_90a) PTX instructions as numba intrinsics, one function per instruction.

Use them inside any ``@cuda.jit`` kernel compiled for ``cc=(9, 0, "a")`` (numba-cuda does
this on its own when it launches on a Hopper GPU). Shared-memory operands (mbarriers,
TMA destinations, wgmma tiles) are 32-bit shared-state-space addresses (``uint32``): see
``shared_address`` and ``dynamic_shared_base``.

Modules: ``mbarrier`` (async transaction barriers), ``wgmma`` (warpgroup MMA), ``sync``
(fences, elect.sync, named barriers, setmaxnreg), ``smem`` (shared addresses, dynamic
shared memory, matrix descriptors), ``matrix`` (ldmatrix/stmatrix), ``tma`` (bulk tensor
copies), ``cluster`` (cluster ids, mapa, DSMEM, cluster barriers), ``gmem`` (raw global
addresses: atomics, release/acquire flags, vector stores and loads), ``arith`` (inline
32-bit division), ``convert`` (bf16/f16 conversions, hardware tanh).
"""

from ._ptx import Choice, Const, ptx_intrinsic  # noqa: F401
from .arith import *  # noqa: F401,F403
from .cluster import *  # noqa: F401,F403
from .convert import *  # noqa: F401,F403
from .gmem import *  # noqa: F401,F403
from .matrix import *  # noqa: F401,F403
from .mbarrier import *  # noqa: F401,F403
from .registers import *  # noqa: F401,F403
from .smem import *  # noqa: F401,F403
from .sync import *  # noqa: F401,F403
from .tma import *  # noqa: F401,F403
from .wgmma import *  # noqa: F401,F403
