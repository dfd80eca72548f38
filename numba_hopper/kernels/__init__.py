"""Kernels built from numba_hopper.intrinsics, and the list ``python -m numba_hopper`` reports on."""

# The GEMM kernel's thirteen arguments (descriptor addresses, sizes, batch flags, the
# stream-K split and workspace, the debug record's address) are all Python ints.
GEMM_SIGNATURE = "void(" + ", ".join(["int64"] * 13) + ")"


def shipped_kernels():
    """``[(label, dispatcher, signature), ...]`` for every kernel the package ships."""
    from .gemm_sm90 import GemmConfig, make_gemm_kernel

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
         f"{', stream-K' if c.stream_k else ''}", make_gemm_kernel(c), GEMM_SIGNATURE)
        for c in configs
    ]
