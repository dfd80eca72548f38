"""The GEMM's device code, built from :mod:`numba_hopper.intrinsics` and :mod:`numba_hopper.kit`.

``gemm_config`` (the kernel's interface: ``GemmConfig``, the shared-memory layout, ``GemmParams``),
``epilogue_config`` (the fused epilogue's: ``EpilogueConfig``, ``EpilogueArgs``) and ``operands``
(the table of a call's operands beside A, B and D: ``EpilogueArgs`` and the host's call values,
plan keys and checks derive from it); ``mainloop``,
``scheduler`` and ``epilogue`` (its components, each a folder or module of builders, one per
variant); ``gemm_sm90`` (the kernel, which only orchestrates them); ``elementwise`` (the small
kernels a call may add) and ``placement`` (the SM-placement probe's kernel). The host call path
lives in :mod:`numba_hopper.matmul`.
"""

from .gemm_sm90 import gemm_argument_types, make_gemm_kernel

__all__ = ["gemm_argument_types", "shipped_kernels"]


def shipped_kernels():
    """``[(label, dispatcher, argument types), ...]`` for every kernel the package ships."""
    from .gemm_config import GemmConfig

    configs = [
        GemmConfig("bf16", "bf16", "K", "N"),
        GemmConfig("bf16", "bf16", "K", "N", cluster_n=2),
        GemmConfig("bf16", "f32", "M", "K", stages=3),
        GemmConfig("bf16", "bf16", "K", "N", block_n=128, stream_k=True),
        GemmConfig("bf16", "bf16", "K", "N", block_m=64, block_n=64, stages=13),
    ]
    return [
        (f"gemm {c.in_dtype}->{c.out_dtype} A {c.a_major}-major, B {c.b_major}-major, "
         f"{c.block_m}x{c.block_n}x64, {c.stages} stages, cluster {c.cluster_m}x{c.cluster_n}"
         f"{', stream-K' if c.stream_k else ''}", make_gemm_kernel(c), gemm_argument_types(c))
        for c in configs
    ]
