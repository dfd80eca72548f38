"""``record_sm``: where each CTA of a cluster launch runs, for ``numba_hopper.matmul.placement``'s probe.

A cluster's CTAs run in one GPC, so the SMs of each cluster of a launch name (part of) one
GPC. Each CTA records its ``%smid`` and stays resident for about 100 us, so that a launch's
clusters run side by side on different GPCs instead of one after another on the first free one.
"""

from numba import cuda

from .. import intrinsics as nh

__all__ = ["record_sm"]


@cuda.jit
def record_sm(sm):
    """``sm[blockIdx.x] = %smid``."""
    if cuda.threadIdx.x == 0:
        sm[cuda.blockIdx.x] = nh.smid()
    for _ in range(100):
        cuda.nanosleep(1000)
