"""Kernels built from numba_hopper.intrinsics, and the list ``python -m numba_hopper`` reports on."""


def shipped_kernels():
    """``[(label, dispatcher, signature), ...]`` for every kernel the package ships."""
    return []
