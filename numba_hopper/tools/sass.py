"""Compile a ``@cuda.jit`` kernel for sm_90a on any machine and report what it became.

No GPU or driver is needed: PTX comes from NVVM, the cubin from numba's own default link
path (LTO-IR through nvJitLink: the code a launch would load) with ptxas' verbose report,
which gives the resource counts, and the SASS from ``nvdisasm``::

    from numba_hopper.tools.sass import inspect_kernel
    report = inspect_kernel(my_kernel, "void(float32[::1])")
    assert report.count("HGMMA") and report.spill_bytes == 0
    print(report.summary())

Set ``NUMBA_HOPPER_DUMP=ptx,sass`` to print those for every kernel inspected.
Set ``NUMBA_HOPPER_SASS_CACHE_DIR`` to keep the reports on disk: a later process reads
them back instead of compiling again (``numba_hopper.tools.sass_cache``; the tests use it).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from dataclasses import fields as fields_of
from functools import cached_property

from .. import _numba_internals as _internals
from . import sass_cache as _sass_cache
from .binutils import ToolNotFoundError, find_tool

HOPPER_CC = (9, 0, "a")
# What summary() counts: the Hopper-specific instructions. WARPGROUP.ARRIVE is wgmma.fence and
# WARPGROUP.DEPBAR wgmma.wait_group (or a wait ptxas inserted itself: warning C7517).
KEY_OPCODES = ("HGMMA", "QGMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "UTMALDG", "UTMASTG", "UTMAPF",
               "UTMAREDG", "UBLKCP", "USETMAXREG", "SYNCS", "ELECT", "STSM", "LDSM", "UCGABAR_ARV",
               "UCGABAR_WAIT")

__all__ = ["inspect_kernel", "compile_report", "KernelReport", "ToolNotFoundError", "find_tool", "HOPPER_CC"]


_PTXAS_USAGE = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_CODE = re.compile(r"\(C\d{4}\)")
_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


@dataclass
class KernelReport:
    """What a kernel compiled to. ``opcodes`` counts full SASS mnemonics."""

    name: str
    cc: tuple
    ptx: str
    cubin: bytes
    sass: str
    link_log: str
    registers: int
    stack_frame: int
    spill_store_bytes: int
    spill_load_bytes: int
    static_shared: int
    opcodes: Counter = field(repr=False)

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @cached_property
    def warnings(self) -> list:
        """ptxas/nvJitLink warnings, e.g. C7504/C7508 (setmaxnreg ignored), C7517 (wgmma wait).

        ptxas prints some of them as ``info`` lines with a code (``ptxas info : (C7508)
        Potential Performance Loss: 'setmaxnreg' ignored; ...``): those count too.
        """
        return [l.strip() for l in self.link_log.splitlines()
                if "warning" in l.lower() or _PTXAS_CODE.search(l)]

    @property
    def setmaxnreg_ignored(self) -> bool:
        """True when the PTX has ``setmaxnreg`` but the SASS has no ``USETMAXREG``.

        ptxas drops setmaxnreg (info C7508) when it cannot tell the register count at kernel
        entry: declare ``@cuda.jit(launch_bounds=(threads, 1))``. It is also dropped (C7504)
        when the PTX is linked relocatably (``lto=False`` or ``debug=True``).
        """
        return "setmaxnreg." in self.ptx and self.count("USETMAXREG") == 0

    @property
    def warpsync_before_wgmma(self) -> bool:
        """True when a ``WARPSYNC`` comes within 8 instructions before a batch of wgmmas
        (``WARPGROUP.ARRIVE``): ptxas puts one there when it cannot prove that the loop's warps
        are converged, and then keeps the loop's state in vector registers, moved to uniform
        ones (``R2UR``) before each wgmma. A branch on ``threadIdx.x // 128`` does that; the
        same index broadcast from lane 0 (``shfl.sync``) does not."""
        lines = self.sass.splitlines()
        return any("WARPSYNC" in before for i, line in enumerate(lines) if "WARPGROUP.ARRIVE" in line
                   for before in lines[max(0, i - 8):i])

    def count(self, prefix: str) -> int:
        """Number of SASS instructions whose mnemonic is ``prefix`` or starts with ``prefix.``."""
        return sum(n for op, n in self.opcodes.items() if op == prefix or op.startswith(prefix + "."))

    def key_opcodes(self) -> dict:
        return {op: self.count(op) for op in KEY_OPCODES if self.count(op)}

    def summary(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in self.key_opcodes().items()) or "none"
        lines = [
            f"{self.name} [sm_{self.cc[0]}{self.cc[1]}{self.cc[2] if len(self.cc) > 2 else ''}]",
            f"  registers {self.registers}, spill {self.spill_store_bytes}+{self.spill_load_bytes} B, "
            f"stack frame {self.stack_frame} B, static smem {self.static_shared} B",
            f"  key SASS: {ops}",
        ]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _disassemble(cubin: bytes, spills: bool) -> str:
    """The SASS listing of ``cubin``. nvdisasm's dataflow pass, a quarter of its time, only
    marks spill stores and reloads on sm_90 (``(*"SpillRefill"*)``): run it where ptxas
    reported spills."""
    nvdisasm = find_tool("nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        flags = ["-c"] if spills else ["-c", "--no-dataflow"]
        out = subprocess.run([nvdisasm, *flags, path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode:
        raise RuntimeError(f"nvdisasm failed: {out.stderr.strip()}")
    return out.stdout


def _first_int(pattern, text, group=1, default=0):
    m = pattern.search(text)
    return int(m.group(group)) if m else default


def inspect_kernel(kernel, signature, cc=HOPPER_CC) -> KernelReport:
    """Compile ``kernel`` (a ``@cuda.jit`` dispatcher) for ``signature`` and ``cc``; report.

    ``signature`` is anything ``cuda.jit`` accepts: a string such as
    ``"void(float32[::1])"`` or a tuple of numba types.

    With ``NUMBA_HOPPER_SASS_CACHE_DIR`` set, reports are kept in that directory and a call
    for a kernel, signature and ``cc`` reported before, under the same package sources,
    toolchain and kernel identity, reads the report back (``numba_hopper.tools.sass_cache``).
    """
    report = _cached_report(kernel, signature, cc)
    dump = os.environ.get("NUMBA_HOPPER_DUMP", "")
    for what in ("ptx", "sass"):
        if what in dump:
            print(f"==== {what.upper()} {report.name} ====\n{getattr(report, what)}")
    return report


def _cached_report(kernel, signature, cc) -> KernelReport:
    directory = _sass_cache.cache_dir()
    if directory is None:
        return compile_report(kernel, signature, cc)
    try:
        key = _sass_cache.entry_key(kernel, signature, cc)
    except _sass_cache.Unkeyable:
        return compile_report(kernel, signature, cc)
    with _sass_cache.locked(directory, key):
        fields = _sass_cache.load(directory, key)
        if fields is not None:
            try:
                return KernelReport(**dict(fields, name=kernel.py_func.__name__))
            except TypeError:  # written by another KernelReport: compile and overwrite
                pass
        report = compile_report(kernel, signature, cc)
        _sass_cache.store(directory, key, {f.name: getattr(report, f.name) for f in fields_of(report)})
        return report


def compile_report(kernel, signature, cc=HOPPER_CC) -> KernelReport:
    """:func:`inspect_kernel` without the report cache: PTX from NVVM, the cubin of numba's
    (LTO) link with ptxas' report (``-v``), and the SASS of that cubin from nvdisasm."""
    lib, entry = _internals.compile_kernel_library(kernel, signature, cc)
    cubin, log = _internals.link_verbose(lib, cc)
    frame = _PTXAS_FRAME.search(log)
    sass = _disassemble(cubin, spills=bool(frame and (int(frame.group(2)) or int(frame.group(3)))))
    opcodes = Counter(m.group(1) for m in _SASS_LINE.finditer(sass))
    return KernelReport(
        name=kernel.py_func.__name__,
        cc=cc,
        ptx=lib.get_asm_str(cc=cc),
        cubin=cubin,
        sass=sass,
        link_log=log,
        registers=_first_int(_PTXAS_USAGE, log),
        stack_frame=int(frame.group(1)) if frame else 0,
        spill_store_bytes=int(frame.group(2)) if frame else 0,
        spill_load_bytes=int(frame.group(3)) if frame else 0,
        static_shared=_first_int(_PTXAS_SMEM, log),
        opcodes=opcodes,
    )
