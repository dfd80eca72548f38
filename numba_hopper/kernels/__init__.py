"""Kernels built from numba_hopper.intrinsics, and the list ``python -m numba_hopper`` reports on."""


def gemm_argument_types(cfg, epilogue_types=None) -> tuple:
    """The numba types of ``make_gemm_kernel(cfg)``'s arguments, as ``gemm`` passes them:
    tensor-map templates and addresses, the slots' address, ten int64 scalars (sizes, batch
    flags, the stream-K split and workspace, the debug record's address) and, with a fused
    epilogue, its tuple of ``epilogue_types``."""
    from numba.cuda import types

    maps = cfg.tensormaps
    scalars = (types.int64,) * 10
    head = (types.UniTuple(types.UniTuple(types.uint64, 16), maps), types.UniTuple(types.uint64, maps), types.uint64)
    return head + scalars + ((types.Tuple(tuple(epilogue_types)),) if epilogue_types is not None else ())


def shipped_kernels():
    """``[(label, dispatcher, argument types), ...]`` for every kernel the package ships."""
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
         f"{', stream-K' if c.stream_k else ''}", make_gemm_kernel(c), gemm_argument_types(c))
        for c in configs
    ]
