"""The array user's GEMMs: :func:`gemm`, :func:`gemm_sum`, :func:`gemm_glu_backward`, :func:`bmm` and
:func:`grouped_gemm`, and their host call path.

- :mod:`.api`: ``gemm``, ``gemm_sum``, ``gemm_glu_backward`` and ``bmm``, what a call checks and how its
  output is made;
- :mod:`.grouped`: ``grouped_gemm`` (mixture-of-experts layers);
- :mod:`.plan_cache`: the cache of plans by call layout, shared by every entry point;
- :mod:`.plan`: a call layout's plan (tensor-map templates, prepared launches, scratch);
- :mod:`.heuristics`: which kernel a call gets (tile, ring depth, cluster, K splits);
- :mod:`.checks`, :mod:`.fusion`, :mod:`.scales`: what a call's arguments may be, the fused
  epilogue's keywords and the fp8 scales;
- :mod:`.extra_launches`: the aligned copies and split-K's reduce a plan may add.
"""

from ..kernels.gemm_config import GemmConfig
from .api import bmm, gemm, gemm_glu_backward, gemm_sum
from .grouped import grouped_gemm
from .plan_cache import clear_plans

__all__ = ["gemm", "gemm_sum", "gemm_glu_backward", "bmm", "grouped_gemm", "GemmConfig", "clear_plans"]
