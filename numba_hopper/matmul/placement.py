"""The GPC-major order of a GPU's TPCs, probed once per device (:func:`tpc_order`).

GPC-ordered GEMM kernels (``GemmConfig.cluster_order = "gpc"``) give a 2-CTA cluster the tile
slot of the TPC it runs on, ranked so that the TPCs of each GPC take consecutive slots
(``kernels/scheduler.py``). No API names an SM's GPC, and which SMs a chip has differs from
chip to chip, so a probe finds them: launches of 16-, 8-, 4- and 2-CTA clusters
(``kernels/placement.py``) record where their CTAs run, and a cluster's SMs lie in one GPC.
Clusters of 16 find whole the GPCs with 16 free SMs; smaller ones place the TPCs left over,
in groups that are parts of GPCs. The probe waits for its launches: once per device and
process, on the first call whose kernel needs the order.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

from ..kernels.placement import record_sm
from ..runtime.launch import device_limits, prepare_launch

__all__ = ["TPCS", "PROBE_CLUSTERS", "gpc_major_ranks", "probe_clusters", "tpc_order"]

TPCS = 512  # entries of the order: every %smid below 1024 has one (H100: 132 SMs)
PROBE_CLUSTERS = (16, 8, 4, 2)

_orders: dict = {}
_lock = threading.Lock()


def gpc_major_ranks(clusters, tpcs=TPCS) -> np.ndarray:
    """The rank of each of ``tpcs`` TPCs (u32) from the SM sets of probe ``clusters``, larger
    clusters first: a cluster's TPCs take consecutive ranks, in SM order; a cluster that
    overlaps one before it adds nothing (it ran later, on part of the same GPC); TPCs no
    cluster ran on come last."""
    order, seen = [], set()
    for sms in clusters:
        group = sorted({int(s) // 2 for s in sms})
        if seen.isdisjoint(group):
            order += group
            seen.update(group)
    order += [t for t in range(tpcs) if t not in seen]
    ranks = np.empty(tpcs, np.uint32)
    ranks[order] = np.arange(tpcs, dtype=np.uint32)
    return ranks


def probe_clusters(device) -> list:
    """The SM sets of the clusters of probe launches on ``device``, 16-CTA clusters first,
    until every TPC has been seen. Each CTA takes all the shared memory a block may have: one
    CTA per SM. 16-CTA clusters (non-portable) are skipped where the device refuses them."""
    limits = device_limits(device)
    clusters, seen = [], set()
    for size in PROBE_CLUSTERS:
        grid = limits.sm_count // size * size
        sm = cuda.device_array(grid, np.int32)
        try:
            prepare_launch(record_sm, grid, 32, (sm,), cluster=size, shared_mem=limits.max_shared_per_block_optin,
                           non_portable_cluster=size > 8, cache_key="record_sm")()
        except Exception:  # (cuda.core's CUDAError, or prepare_launch's ValueError)
            if size <= 8:
                raise
            continue
        sms = sm.copy_to_host()
        clusters += [sms[c:c + size].tolist() for c in range(0, grid, size)]
        seen.update(int(s) // 2 for s in sms)
        if len(seen) * 2 >= limits.sm_count:
            break
    return clusters


def tpc_order(device) -> int:
    """The device address of ``device``'s GPC-major TPC ranks (``TPCS`` u32, indexed by
    ``%smid // 2``), probed and uploaded on the first call."""
    with _lock:
        if device not in _orders:
            with cuda.gpus[device]:
                _orders[device] = cuda.to_device(gpc_major_ranks(probe_clusters(device)))
        return _orders[device].__cuda_array_interface__["data"][0]
