"""The kernel-authoring kit: the parts of a fast Hopper kernel, for any ``@cuda.jit`` kernel.

Each part is a device function, or a factory that checks its compile-time arguments on the
host and returns device functions (a named tuple), with its formula or diagram in its
docstring. The guide, "Writing Hopper kernels", builds a persistent warp-specialized GEMM
from them step by step (``examples/``).

- :mod:`.fragments`: which element each wgmma accumulator register holds, a thread's rows,
  quad row reductions (max, sum), row scaling and ``exp2``, the f32 accumulator as an RS
  A operand (bf16, f16, fp8), an A operand loaded from shared memory by ldmatrix,
  ldmatrix/stmatrix lane addressing.
- :mod:`.layouts`: operand tiles by name (K- or MN-major, 32/64/128-byte swizzle), their
  TMA loads (whole, or parts multicast in a cluster), wgmma descriptors and k-steps, SS
  wgmmas over them (``make_mma``), TMA swizzle addressing, :class:`~.layouts.SmemPlan` for
  placing buffers in shared memory.
- :mod:`.pipeline`: TMA producer/consumer rings (:func:`~.pipeline.make_ring`), any number
  per kernel, with explicit arrival counts and per-slot transaction bytes; cluster release.
- :mod:`.barriers`: named-barrier ids by name, warpgroup barriers, the ordered barrier of
  ping-pong consumers.
- :mod:`.warpspec`: the warp-specialized skeleton: register budget, ``setmaxnreg``, role
  dispatch, barrier set-up, the warp-uniform warpgroup index.
- :mod:`.epilogue`: a warpgroup's tile to global memory (stmatrix, swizzled shared memory,
  TMA store) and a guarded direct store.
- :mod:`.overlap`: work kept between a wgmma and its wait (the pinned wait), and the SASS
  check that it stayed there.
- :mod:`.scheduler`: persistent tile walks, linear or grouped raster.
- :mod:`.host`: tensor maps by value, the persistent grid, cluster launch with large
  shared memory.

The fast math these use (``ex2.approx``, ``rcp.approx``, ``max.f32``, packed conversions) is
in :mod:`numba_hopper.intrinsics` (``fastmath``, ``convert``).
"""

from .barriers import NamedBarriers, make_ordered_barrier, warpgroup_arrive, warpgroup_sync
from .epilogue import make_tile_store
from .fragments import (a_operand, acc_col, acc_row, exp2_rows, make_a_loader, make_a_operand_fp8, make_exp2_rows,
                        mask_cols, quad_max, quad_sum, row_max, row_sum, scale_rows, thread_row_sum, thread_rows,
                        x4_lane_offset)
from .layouts import SmemPlan, box_address, make_descriptors, make_mma, make_tile_loads, operand_layout
from .overlap import make_wait_after, wgmma_stages
from .pipeline import PipelineState, make_ring, make_tma_pipeline
from .scheduler import make_tile_scheduler
from .warpspec import register_budget, warp_specialization, warpgroup_index

__all__ = [
    "NamedBarriers", "make_ordered_barrier", "warpgroup_arrive", "warpgroup_sync",
    "make_tile_store",
    "a_operand", "acc_col", "acc_row", "exp2_rows", "make_a_loader", "make_a_operand_fp8", "make_exp2_rows",
    "mask_cols", "quad_max", "quad_sum", "row_max",
    "row_sum", "scale_rows", "thread_row_sum", "thread_rows", "x4_lane_offset",
    "SmemPlan", "box_address", "make_descriptors", "make_mma", "make_tile_loads", "operand_layout",
    "make_wait_after", "wgmma_stages",
    "PipelineState", "make_ring", "make_tma_pipeline",
    "make_tile_scheduler",
    "register_budget", "warp_specialization", "warpgroup_index",
]
