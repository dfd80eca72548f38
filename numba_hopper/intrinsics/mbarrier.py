"""mbarrier: the asynchronous transaction barrier (PTX ISA 9.7.13.15).

An mbarrier is a 64-bit object in shared memory (8-byte aligned), passed as its 32-bit
``.shared::cta`` address (``uint32``, see ``shared_address``). A phase completes when the
pending arrival count reaches 0 and the transaction count is 0; the phase parity (0, 1, 0...)
starts at 0 and flips at each completion. ``*_wait_parity(bar, phase)`` waits for the
completion of the phase with parity ``phase``.
"""

from ._ptx import ptx_asm, u32, u64

__all__ = [
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_expect_tx",
    "mbarrier_complete_tx",
    "mbarrier_try_wait_parity",
    "mbarrier_test_wait_parity",
    "mbarrier_wait_parity",
    "mbarrier_wait_parity_cluster",
    "mbarrier_wait_parity_timeout",
    "mbarrier_inval",
    "fence_mbarrier_init",
    "mbarrier_arrive_cluster",
    "mbarrier_arrive_cluster_rank",
]


@ptx_asm("mbarrier.init.shared::cta.b64 [{bar}], {count};")
def mbarrier_init(bar: u32, count: u32):
    """PTX ISA 9.7.13.15.9 mbarrier.init: expected arrival count ``count`` (1 .. 2**20-1), phase 0."""


@ptx_asm("mbarrier.arrive.shared::cta.b64 _, [{bar}];")
def mbarrier_arrive(bar: u32):
    """PTX ISA 9.7.13.15.13 mbarrier.arrive (release, CTA scope): one arrival."""


@ptx_asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{bar}], {nbytes};")
def mbarrier_arrive_expect_tx(bar: u32, nbytes: u32):
    """PTX ISA 9.7.13.15.13 mbarrier.arrive.expect_tx: expect ``nbytes`` more transaction bytes,
    then arrive.
    """


@ptx_asm("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{bar}], {nbytes};")
def mbarrier_expect_tx(bar: u32, nbytes: u32):
    """PTX ISA 9.7.13.15.11 mbarrier.expect_tx: raise the current phase's tx-count by ``nbytes``."""


@ptx_asm("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [{bar}], {nbytes};")
def mbarrier_complete_tx(bar: u32, nbytes: u32):
    """PTX ISA 9.7.13.15.12 mbarrier.complete_tx: lower the tx-count by ``nbytes`` (as a TMA
    would).
    """


@ptx_asm(
    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{bar}], {phase}; "
    "selp.u32 {out}, 1, 0, p; }"
)
def mbarrier_try_wait_parity(bar: u32, phase: u32) -> bool:
    """PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity: True if the phase of parity ``phase`` has
    completed; may suspend for a system-dependent time and return False (use in a loop).
    """


@ptx_asm(
    "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [{bar}], {phase}; "
    "selp.u32 {out}, 1, 0, p; }"
)
def mbarrier_test_wait_parity(bar: u32, phase: u32) -> bool:
    """PTX ISA 9.7.13.15.16 mbarrier.test_wait.parity: non-blocking test of the phase of parity
    ``phase``.
    """


# try_wait's suspendTimeHint in the waits below: a try_wait that does not pass compiles to
# NANOSLEEP.SYNCS, which sleeps until the barrier changes (or this many ns pass) instead of
# re-issuing the try_wait; at the power limit the spin's instructions cost energy.
SUSPEND_HINT_NS = 50_000


@ptx_asm(
    "{ .reg .pred p; NH_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [{bar}], {phase}, "
    f"{SUSPEND_HINT_NS}; "
    "@!p bra NH_WAIT; }"
)
def mbarrier_wait_parity(bar: u32, phase: u32):
    """PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity in a loop (one asm block, CUTLASS
    ClusterBarrier::wait): returns once the phase of parity ``phase`` has completed. Each try
    carries a suspend-time hint (``SUSPEND_HINT_NS``): a waiting warp sleeps, not spins.
    """


@ptx_asm(
    "{ .reg .pred p; NH_CWAIT: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [{bar}], {phase}, "
    f"{SUSPEND_HINT_NS}; "
    "@!p bra NH_CWAIT; }"
)
def mbarrier_wait_parity_cluster(bar: u32, phase: u32):
    """PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity.acquire.cluster in a loop that sleeps as
    ``mbarrier_wait_parity``'s does: returns once the phase of parity ``phase`` has completed,
    with acquire semantics at cluster scope, so that what another CTA of the cluster stored
    into this CTA's shared memory before its ``.release.cluster`` arrive
    (``mbarrier_arrive_cluster``) is visible.
    """


@ptx_asm(
    "{ .reg .pred done, more; .reg .u64 t0, t; mov.u64 t0, %globaltimer; "
    "NH_TWAIT: mbarrier.try_wait.parity.shared::cta.b64 done, [{bar}], {phase}; @done bra NH_TDONE; "
    "mov.u64 t, %globaltimer; sub.u64 t, t, t0; setp.lt.u64 more, t, {timeout_ns}; @more bra NH_TWAIT; "
    "NH_TDONE: selp.u32 {out}, 1, 0, done; }"
)
def mbarrier_wait_parity_timeout(bar: u32, phase: u32, timeout_ns: u64) -> bool:
    """PTX ISA 9.7.13.15.16 mbarrier.try_wait.parity in a spin loop bounded in time (PTX ISA 10
    Special Registers: %globaltimer): True once the phase of parity ``phase`` has completed,
    False after ``timeout_ns`` nanoseconds. Bounded by time, not by a spin count: how long one
    try_wait suspends is system-dependent.
    """


@ptx_asm("mbarrier.inval.shared::cta.b64 [{bar}];")
def mbarrier_inval(bar: u32):
    """PTX ISA 9.7.13.15.10 mbarrier.inval: invalidate before reusing the memory."""


@ptx_asm("fence.mbarrier_init.release.cluster;")
def fence_mbarrier_init():
    """PTX ISA 9.7.13.4 fence.mbarrier_init: make prior mbarrier.init visible cluster-wide."""


@ptx_asm("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{remote_bar}];")
def mbarrier_arrive_cluster(remote_bar: u32):
    """PTX ISA 9.7.13.15.13 mbarrier.arrive on a ``.shared::cluster`` address (from mapa),
    release at cluster scope.
    """


@ptx_asm(
    "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, {bar}, {cta_rank}; "
    "mbarrier.arrive.shared::cluster.b64 _, [remote]; }"
)
def mbarrier_arrive_cluster_rank(bar: u32, cta_rank: u32):
    """PTX ISA 9.7.9.23 mapa + 9.7.13.15.13 mbarrier.arrive: arrive on the mbarrier at the same
    offset ``bar`` in the shared memory of CTA ``cta_rank`` of the cluster, with the default
    ``.release.cta`` semantics (CUTLASS ClusterBarrier::arrive(cta_id)). Enough to hand back a
    buffer whose readers (wgmma, TMA) are complete; ``.release.cluster`` (see
    ``mbarrier_arrive_cluster``) costs a MEMBAR.ALL.GPU per arrive.
    """
