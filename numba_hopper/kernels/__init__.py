"""Device code built from ``numba_hopper.intrinsics``: the GEMM kernel and its components.

``gemm_config`` (the kernel's interface), ``pipeline``, ``mainloop``, ``scheduler`` and
``epilogue`` (its components), ``gemm_sm90`` (the kernel), ``elementwise`` (the small
kernels a call may add). Host code lives in the package's top-level modules.
"""

from .gemm_config import gemm_argument_types

__all__ = ["gemm_argument_types", "shipped_kernels"]



def shipped_kernels():
    """``[(label, dispatcher, argument types), ...]`` for every kernel the package ships."""
    from .gemm_config import GemmConfig
    from .gemm_sm90 import make_gemm_kernel

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
