"""Named barriers: ids allocated by name, warpgroup barriers, and the ordered barrier that
hands turns between consumer warpgroups (ping-pong).

A CTA has 16 hardware named barriers (PTX ISA 9.7.13.1 ``bar.sync`` / ``bar.arrive``): id 0
is ``__syncthreads``'s, 1-15 are free. A barrier completes when ``nthreads`` threads (a
multiple of 32) have arrived, by ``sync`` (arrive and wait) or ``arrive`` (no wait). Two
parts of a kernel that use one id for different groups of threads corrupt each other's
counts, so allocate ids by name on the host, once per kernel::

    ids = NamedBarriers()
    EPI = ids.allocate("epilogue", 2)       # ids 1, 2: one per consumer warpgroup
    TURNS = ids.allocate("turns", 2)        # ids 3, 4
    order = make_ordered_barrier(TURNS, members=2)

**Ordered barrier** (CUTLASS's ``OrderedSequenceBarrier``): members 0, 1, ..., n-1 (a
warpgroup each) take turns, in that order, forever. Member ``i`` waits at barrier ``first +
i`` for its own threads and the arrival of member ``i - 1``'s threads; when done it arrives at
``first + (i + 1) % n``::

    order.start(cw)          # once: the last member hands member 0 the first turn
    while ...:
        order.wait(cw)       # my turn: issue this tile's wgmmas
        ...
        order.arrive(cw)     # the next member's turn
"""

from __future__ import annotations

from collections import namedtuple

from numba import cuda

from ..intrinsics import named_barrier_arrive, named_barrier_sync

__all__ = ["NamedBarriers", "OrderedBarrier", "make_ordered_barrier", "warpgroup_sync", "warpgroup_arrive",
           "NAMED_BARRIERS"]

NAMED_BARRIERS = 16  # per CTA; id 0 is __syncthreads's


class NamedBarriers:
    """Allocates a kernel's named-barrier ids (host side). ``allocate(name, count=1)``
    returns the first of ``count`` consecutive free ids (from 1) and raises ``ValueError``
    past 15, naming every allocation; ``ids`` maps names to their first id."""

    def __init__(self):
        self.ids = {}
        self.counts = {}
        self.next = 1

    def allocate(self, name: str, count: int = 1) -> int:
        if name in self.ids:
            raise ValueError(f"named barrier {name!r} is already allocated (ids {self._span(name)})")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"{name}: count must be a positive int; got {count!r}")
        if self.next + count > NAMED_BARRIERS:
            raise ValueError(f"{name}: {count} more named barriers do not fit: ids 1-{NAMED_BARRIERS - 1} exist "
                             f"(0 is __syncthreads') and {self} are taken. Share ids between parts that never run "
                             "at the same time, or use mbarriers")
        first = self.ids[name] = self.next
        self.counts[name] = count
        self.next += count
        return first

    def _span(self, name):
        first, count = self.ids[name], self.counts[name]
        return f"{first}" if count == 1 else f"{first}-{first + count - 1}"

    def __str__(self):
        return ", ".join(f"{n}: {self._span(n)}" for n in self.ids) or "none"

    __repr__ = __str__


@cuda.jit(device=True, inline="always", forceinline=True)
def warpgroup_sync(barrier_id):
    """Wait until the 128 threads of this warpgroup reach named barrier ``barrier_id``."""
    named_barrier_sync(barrier_id, 128)


@cuda.jit(device=True, forceinline=True)
def warpgroup_arrive(barrier_id):
    """Arrive at named barrier ``barrier_id`` (counted for 128 threads) without waiting."""
    named_barrier_arrive(barrier_id, 128)


OrderedBarrier = namedtuple("OrderedBarrier", ["members", "first", "start", "wait", "arrive"])
OrderedBarrier.__doc__ = """Turns between ``members`` warpgroups on named barriers ``first`` ..
``first + members - 1`` (:func:`make_ordered_barrier`): device functions ``start(member)``,
``wait(member)`` and ``arrive(member)``."""


def make_ordered_barrier(first, members=2, threads=128) -> OrderedBarrier:
    """An :class:`OrderedBarrier` of ``members`` groups of ``threads`` threads (a warpgroup:
    128) on named barriers ``first`` to ``first + members - 1`` (from
    :meth:`NamedBarriers.allocate`). Every member calls ``start`` once before its first
    ``wait``; then ``wait`` / ``arrive`` alternate."""
    if not isinstance(members, int) or members < 2:
        raise ValueError(f"an ordered barrier takes turns between >= 2 members; got {members!r}")
    if not isinstance(first, int) or first < 1 or first + members > NAMED_BARRIERS:
        raise ValueError(f"named barriers {first}..{first + members - 1} are not all in 1-{NAMED_BARRIERS - 1}; "
                         "allocate them with NamedBarriers")
    if threads % 32 or not 32 <= threads <= 512:
        raise ValueError(f"threads per member must be a multiple of 32 (a barrier counts whole warps); got {threads}")
    PAIR = 2 * threads  # the member's own threads and its predecessor's arrival

    @cuda.jit(device=True, inline="always", forceinline=True)
    def start(member):
        if member == members - 1:
            named_barrier_arrive(first, PAIR)

    @cuda.jit(device=True, inline="always", forceinline=True)
    def wait(member):
        named_barrier_sync(first + member, PAIR)

    @cuda.jit(device=True, forceinline=True)
    def successor(member):
        """The barrier of the member after ``member``."""
        if members == 2:  # (no modulo: one subtraction)
            return first + 1 - member
        return first + (member + 1) % members

    @cuda.jit(device=True, inline="always", forceinline=True)
    def arrive(member):
        named_barrier_arrive(successor(member), PAIR)

    return OrderedBarrier(members, first, start, wait, arrive)
