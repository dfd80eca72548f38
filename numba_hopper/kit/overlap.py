"""Keeping work between a wgmma and its ``wgmma.wait_group``: the pinned wait, and a SASS check.

The point of ``wgmma.mma_async`` is that the warpgroup does something else while the tensor
cores run: issue the wgmmas, commit them, compute, then ``wgmma.wait_group``. ptxas does not
keep that order. Its instruction scheduler treats the wait (``WARPGROUP.DEPBAR``) as an
instruction without operands that the accumulator's readers after it depend on, and hoists it
within its basic block above independent arithmetic, up to the issue: FlashAttention's softmax
written between the P V wgmmas and their wait runs after the wait, and the overlap is gone
without a warning. Once the wait sits early, the registers of the RS A operand are free after
it, and ptxas gives them to the arithmetic's temporaries, so the wait can no longer move back.

ptxas does keep the wait after a shared-memory store that precedes it. A store of values the
overlapped work computes last therefore holds the wait after all of it::

    o = nh.wgmma_mma_async_rs(o, a_regs, v_desc, 1, ...)    # issue, commit
    nh.wgmma_commit_group()
    l0, l1 = softmax(...)                                   # must run under the wgmmas
    wait_after(pin_slot, l0, l1)                            # st.shared.v2.f32, wgmma.wait_group 0
    o = nh.wgmma_fence_operand(o)                           # then read the accumulator

``make_wait_after(n)`` builds ``wait_after(slot, a, b)``: ``st.shared.v2.f32 [slot], {a, b}``
then ``wgmma.wait_group n``. ``slot`` is an 8-byte-aligned shared address reserved for it
(nobody reads it; every thread may write it). The store costs one instruction per warp.

:func:`wgmma_stages` reads a SASS listing (``KernelReport.sass``) and reports, for every run of
wgmmas up to the ``WARPGROUP.DEPBAR`` that ends it, what executes in between: the check that
a kernel's overlap survived compilation (``MUFU.EX2`` counts for a softmax) and that nothing
writes an RS A operand's registers while it is in flight.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from numba import cuda

from ..intrinsics import st_shared_v2_f32, wgmma_wait_group

__all__ = ["make_wait_after", "WgmmaStage", "wgmma_stages"]


def make_wait_after(n: int = 0):
    """``wait_after(slot, a, b)``: store the float32 pair ``(a, b)`` to the shared address
    ``slot`` (8-byte aligned, reserved), then ``wgmma.wait_group n`` (``n`` in 0..7): the wait
    stays after the computation of ``a`` and ``b`` (module doc)."""
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 7:
        raise ValueError(f"wgmma.wait_group takes a pending-group count in 0..7; got {n!r}")

    @cuda.jit(device=True, forceinline=True)
    def wait_after(slot, a, b):
        st_shared_v2_f32(slot, a, b)
        wgmma_wait_group(n)

    return wait_after


_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_RS_WGMMA = re.compile(r"GMMA\.\S+\s+R\d+,\s+R(\d+),")
_DEPBAR = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s+0x([0-9a-f]+)")
_NOT_WRITES = ("HGMMA", "QGMMA", "IGMMA", "WARPGROUP", "BAR", "SYNCS", "ST", "BRA", "RED", "ATOM", "UTMA")


@dataclass
class WgmmaStage:
    """The instructions from a wgmma issue to the ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` that waits
    for every wgmma in flight: ``first_line`` and ``wait_line`` (line numbers in the listing),
    ``wgmmas`` issued in it, ``between`` (opcode counts of everything else, partial waits
    included), ``a_registers`` (read by its RS wgmmas) and ``a_register_writes`` (instructions
    in it that write one of them after the wgmma reading it: ptxas has to wait for the wgmma
    there, which a correct kernel's listing never shows)."""

    first_line: int
    wait_line: int = -1
    wgmmas: int = 0
    between: Counter = field(default_factory=Counter)
    a_registers: set = field(default_factory=set)
    a_register_writes: list = field(default_factory=list)

    def count(self, prefix: str) -> int:
        """Instructions in the stage whose opcode is ``prefix`` or starts with ``prefix.``."""
        return sum(n for op, n in self.between.items() if op == prefix or op.startswith(prefix + "."))


def wgmma_stages(sass: str) -> list:
    """The :class:`WgmmaStage` list of a SASS listing, in order (module doc)."""
    stages, current = [], None
    for number, line in enumerate(sass.splitlines()):
        m = _INSTRUCTION.search(line)
        if not m:
            continue
        op, operands = m.group(1), m.group(2)
        wait = _DEPBAR.search(line)
        if wait and current is not None and int(wait.group(1), 16) == 0:
            current.wait_line = number
            stages.append(current)
            current = None
            continue
        if "GMMA" in op:
            if current is None:
                current = WgmmaStage(number)
            current.wgmmas += 1
            rs = _RS_WGMMA.search(line)
            if rs:
                current.a_registers.update(range(int(rs.group(1)), int(rs.group(1)) + 4))
            continue
        if current is None:
            continue
        current.between[op] += 1
        written = re.match(r"\s*R(\d+)\b", operands)
        if written and not op.startswith(_NOT_WRITES) and int(written.group(1)) in current.a_registers:
            current.a_register_writes.append(line.strip())
    return stages
