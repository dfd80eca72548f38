"""``GEMM_CONFIG``: the kernel choice of a training step's products.

A training step runs its products back to back at the board's power limit, where the largest
forward and weight-gradient products are faster in 2x1 clusters, which spend less energy per
FLOP, than in the tiles tuned on bursts (``docs/performance.md``, sustained load). So the
products ``numba_hopper.torch`` makes for training (eagerly, a linear's with a gradient and
every gradient's; compiled, a training graph's plain products) pass ``GEMM_CONFIG`` to
:func:`numba_hopper.gemm`: "sustained" (the default), or None for the burst-tuned choice. Eager
calls read it on every call; a compiled graph keeps the value it was compiled with (set it
before compiling).
"""

from __future__ import annotations

from ..matmul.heuristics import SUSTAINED

__all__ = ["GEMM_CONFIG"]

GEMM_CONFIG = SUSTAINED
