"""Hopper (sm_90a) PTX instructions as numba intrinsics, one function per instruction.

Use them inside any ``@cuda.jit`` kernel compiled for ``cc=(9, 0, "a")`` (numba-cuda does
this on its own when it launches on a Hopper GPU). Shared-memory operands (mbarriers,
TMA destinations, wgmma tiles) are 32-bit shared-state-space addresses (``uint32``): see
``shared_address`` and ``dynamic_shared_base``.

Modules: ``mbarrier`` (async transaction barriers), ``wgmma`` (warpgroup MMA), ``sync``
(fences, elect.sync, named barriers, setmaxnreg, griddepcontrol), ``smem`` (shared addresses, dynamic
shared memory, matrix descriptors), ``matrix`` (ldmatrix/stmatrix), ``tma`` (bulk tensor
copies), ``tma_reduce`` (tensor reductions, L2 prefetch), ``bulk`` (non-tensor bulk
copies, tensor-map operations), ``cluster`` (cluster ids, mapa, DSMEM, cluster barriers),
``gmem`` (raw global addresses: atomics, release/acquire flags, vector stores and loads;
``gmem_f32``: a scalar float32 store), ``opaque`` (a value LLVM cannot hoist or fold),
``arith`` (inline 32-bit division), ``convert`` (bf16/f16/fp8 conversions, whole accumulators
packed for RS wgmma, hardware tanh), ``fastmath`` (ex2/rcp/lg2 approximations, float max/min,
byte permute), ``registers`` (accumulator tuples as thread-local arrays).

Each intrinsic is a ``def`` in its module, with its PTX in the ``@ptx_asm(...)`` above it
and its operands in its signature (``inspect.signature`` shows them); its docstring cites
the PTX ISA section. Section numbers are those of the PTX ISA 8.x manual
(https://docs.nvidia.com/cuda/parallel-thread-execution/); they shift between releases, the
instruction names do not. A new instruction is one more ``@ptx_asm`` def (see ``_ptx``)
and its name in the module's ``__all__``.
"""

from . import (arith, bulk, cluster, convert, fastmath, gmem, gmem_f32, matrix, mbarrier, opaque, registers, smem, sync,
               tma, tma_reduce, wgmma)
from ._ptx import Choice, Const, in_range, ptx_asm, ptx_intrinsic
from .arith import *  # noqa: F401,F403
from .bulk import *  # noqa: F401,F403
from .cluster import *  # noqa: F401,F403
from .convert import *  # noqa: F401,F403
from .fastmath import *  # noqa: F401,F403
from .gmem import *  # noqa: F401,F403
from .gmem_f32 import *  # noqa: F401,F403
from .matrix import *  # noqa: F401,F403
from .mbarrier import *  # noqa: F401,F403
from .opaque import *  # noqa: F401,F403
from .registers import *  # noqa: F401,F403
from .smem import *  # noqa: F401,F403
from .sync import *  # noqa: F401,F403
from .tma import *  # noqa: F401,F403
from .tma_reduce import *  # noqa: F401,F403
from .wgmma import *  # noqa: F401,F403

# Every intrinsic (and helper) of the submodules, then what writing a new intrinsic needs.
__all__ = [
    *arith.__all__,
    *bulk.__all__,
    *cluster.__all__,
    *convert.__all__,
    *fastmath.__all__,
    *gmem.__all__,
    *gmem_f32.__all__,
    *matrix.__all__,
    *mbarrier.__all__,
    *opaque.__all__,
    *registers.__all__,
    *smem.__all__,
    *sync.__all__,
    *tma.__all__,
    *tma_reduce.__all__,
    *wgmma.__all__,
    "ptx_asm",
    "ptx_intrinsic",
    "Const",
    "Choice",
    "in_range",
]
