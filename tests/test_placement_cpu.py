"""The GPC-major order of TPCs (``numba_hopper.matmul.placement``) and the cluster claims' place in
the scratch, on a CPU."""

import numpy as np

from numba_hopper.matmul.placement import gpc_major_ranks
from numba_hopper.matmul.plan import SCRATCH, _Scratch
from numba_hopper.runtime.workspace import ALIGN, CLAIMS_BYTES


def test_a_clusters_tpcs_take_consecutive_ranks():
    # SMs numbered round-robin over GPCs, as the driver numbers them: 16-CTA clusters
    # found two GPCs, an 8-CTA cluster part of a third, a 2-CTA one a TPC of it
    gpc0 = [2, 3, 10, 11, 18, 19, 26, 27, 34, 35, 42, 43, 50, 51, 58, 59]
    gpc1 = [s + 2 for s in gpc0]
    part = [0, 1, 8, 9, 16, 17, 24, 25]
    ranks = gpc_major_ranks([gpc0, gpc1, part, [32, 33]], tpcs=40)
    assert sorted(ranks) == list(range(40))  # a permutation: every TPC its own slot
    for i, group in enumerate((gpc0, gpc1, part)):
        tpcs = sorted({s // 2 for s in group})
        assert [ranks[t] for t in tpcs] == list(range(8 * i, 8 * i + len(tpcs))), group
    assert ranks[16] == 20  # the 2-CTA cluster's TPC next


def test_a_later_cluster_on_a_gpc_seen_before_adds_nothing():
    first = [4, 5, 20, 21]
    again = [4, 5, 20, 21]  # a launch's 8th cluster of 16 ran after the 2nd, on its GPC
    overlapping = [20, 21, 36, 37]
    ranks = gpc_major_ranks([first, again, overlapping, [6, 7]], tpcs=20)
    assert [ranks[2], ranks[10]] == [0, 1] and ranks[3] == 2
    unseen = [t for t in range(20) if t not in (2, 10, 3)]  # (TPC 18: only in the overlapping cluster)
    assert [ranks[t] for t in unseen] == list(range(3, 20))


def test_tpcs_no_cluster_ran_on_come_last():
    ranks = gpc_major_ranks([[6, 7, 2, 3]], tpcs=6)
    assert list(ranks) == [2, 0, 3, 1, 4, 5]
    assert ranks.dtype == np.uint32


def test_claims_sit_before_the_plans_scratch_regions():
    scratch = _Scratch()
    first = scratch.take(100)
    assert not scratch.claimed
    claims = scratch.claims()
    assert scratch.claimed and claims == (SCRATCH, -CLAIMS_BYTES)
    assert first == (SCRATCH, 0) and scratch.take(1) == (SCRATCH, ALIGN)  # regions stay at offsets >= 0
    # a count and a slot per 2-CTA cluster of up to 510 SMs, on the regions' alignment
    assert CLAIMS_BYTES % ALIGN == 0 and CLAIMS_BYTES // 4 - 1 >= 510 // 2
