"""mbarrier: the asynchronous transaction barrier (PTX ISA 9.7.13.15).

An mbarrier is a 64-bit object in shared memory (8-byte aligned), passed as its 32-bit
``.shared::cta`` address (``uint32``, see ``shared_address``). A phase completes when the
pending arrival count reaches 0 and the transaction count is 0; the phase parity (0, 1, 0...)
starts at 0 and flips at each completion. ``*_wait_parity(bar, phase)`` waits for the
completion of the phase with parity ``phase``.
"""

from ._ptx import ptx_intrinsic

__all__ = [
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_expect_tx",
    "mbarrier_complete_tx",
    "mbarrier_try_wait_parity",
    "mbarrier_test_wait_parity",
    "mbarrier_wait_parity",
    "mbarrier_wait_parity_timeout",
    "mbarrier_inval",
    "fence_mbarrier_init",
    "mbarrier_arrive_cluster",
    "mbarrier_arrive_cluster_rank",
]

mbarrier_init = ptx_intrinsic(
    "mbarrier_init",
    "mbarrier.init.shared::cta.b64 [{bar}], {count};",
    bar="u32",
    count="u32",
    doc="PTX ISA 9.7.13.15.9 mbarrier.init: expected arrival count ``count`` (1 .. 2**20-1), phase 0.",
)

mbarrier_arrive = ptx_intrinsic(
    "mbarrier_arrive",
    "mbarrier.arrive.shared::cta.b64 _, [{bar}];",
    bar="u32",
    doc="PTX ISA 9.7.13.15.13 mbarrier.arrive (release, CTA scope): one arrival.",
)

mbarrier_arrive_expect_tx = ptx_intrinsic(
    "mbarrier_arrive_expect_tx",
    "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{bar}], {nbytes};",
    bar="u32",
    nbytes="u32",
    doc="PTX ISA 9.7.13.15.13 mbarrier.arrive.expect_tx: expect ``nbytes`` more transaction bytes, then arrive.",
)

mbarrier_expect_tx = ptx_intrinsic(
    "mbarrier_expect_tx",
    "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{bar}], {nbytes};",
    bar="u32",
    nbytes="u32",
    doc="PTX ISA 9.7.13.15.11 mbarrier.expect_tx: raise the current phase's tx-count by ``nbytes``.",
)

mbarrier_complete_tx = ptx_intrinsic(
    "mbarrier_complete_tx",
    "mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [{bar}], {nbytes};",
    bar="u32",
    nbytes="u32",
    doc="PTX ISA 9.7.13.15.12 mbarrier.complete_tx: lower the tx-count by ``nbytes`` (as a TMA would).",
)

mbarrier_try_wait_parity = ptx_intrinsic(
    "mbarrier_try_wait_parity",
    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{bar}], {phase}; selp.u32 {out}, 1, 0, p; }",
    result="bool",
    bar="u32",
    phase="u32",
    doc="PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity: True if the phase of parity ``phase`` has "
    "completed; may suspend for a system-dependent time and return False (use in a loop).",
)

mbarrier_test_wait_parity = ptx_intrinsic(
    "mbarrier_test_wait_parity",
    "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [{bar}], {phase}; selp.u32 {out}, 1, 0, p; }",
    result="bool",
    bar="u32",
    phase="u32",
    doc="PTX ISA 9.7.13.15.16 mbarrier.test_wait.parity: non-blocking test of the phase of parity ``phase``.",
)

mbarrier_wait_parity = ptx_intrinsic(
    "mbarrier_wait_parity",
    "{ .reg .pred p; NH_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [{bar}], {phase}; "
    "@!p bra NH_WAIT; }",
    bar="u32",
    phase="u32",
    doc="PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity in a spin loop (one asm block, CUTLASS "
    "ClusterBarrier::wait): returns once the phase of parity ``phase`` has completed.",
)

mbarrier_wait_parity_timeout = ptx_intrinsic(
    "mbarrier_wait_parity_timeout",
    "{ .reg .pred done, more; .reg .u64 t0, t; mov.u64 t0, %globaltimer; "
    "NH_TWAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [{bar}], {phase}; @done bra NH_TDONE; "
    "mov.u64 t, %globaltimer; sub.u64 t, t, t0; setp.lt.u64 more, t, {timeout_ns}; @more bra NH_TWAIT; "
    "NH_TDONE: selp.u32 {out}, 1, 0, done; }",
    result="bool",
    bar="u32",
    phase="u32",
    timeout_ns="u64",
    doc="mbarrier_wait_parity bounded in time: spin on try_wait.parity until the phase of parity "
    "``phase`` has completed (True) or ``timeout_ns`` nanoseconds of %globaltimer have passed "
    "(False). Bounded by time, not by a spin count: how long one try_wait suspends is "
    "system-dependent.",
)

mbarrier_inval = ptx_intrinsic(
    "mbarrier_inval",
    "mbarrier.inval.shared::cta.b64 [{bar}];",
    bar="u32",
    doc="PTX ISA 9.7.13.15.10 mbarrier.inval: invalidate before reusing the memory.",
)

fence_mbarrier_init = ptx_intrinsic(
    "fence_mbarrier_init",
    "fence.mbarrier_init.release.cluster;",
    doc="PTX ISA 9.7.13.4 fence.mbarrier_init: make prior mbarrier.init visible cluster-wide.",
)

mbarrier_arrive_cluster = ptx_intrinsic(
    "mbarrier_arrive_cluster",
    "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{remote_bar}];",
    remote_bar="u32",
    doc="PTX ISA 9.7.13.15.13 mbarrier.arrive on a ``.shared::cluster`` address (from mapa), "
    "release at cluster scope.",
)

mbarrier_arrive_cluster_rank = ptx_intrinsic(
    "mbarrier_arrive_cluster_rank",
    "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, {bar}, {cta_rank}; "
    "mbarrier.arrive.shared::cluster.b64 _, [remote]; }",
    bar="u32",
    cta_rank="u32",
    doc="PTX ISA mapa + 9.7.13.15.13 mbarrier.arrive: arrive on the mbarrier at the same "
    "offset ``bar`` in the shared memory of CTA ``cta_rank`` of the cluster, with the default "
    "``.release.cta`` semantics (CUTLASS ClusterBarrier::arrive(cta_id)). Enough to hand back "
    "a buffer whose readers (wgmma, TMA) are complete; ``.release.cluster`` (see "
    "``mbarrier_arrive_cluster``) costs a MEMBAR.ALL.GPU per arrive.",
)
