"""``python -m numba_hopper``: run and check the shipped kernels on a Hopper GPU, or, with
none, compile them for sm_90a and print what they compiled to."""

from __future__ import annotations

import sys

from ._device import hopper_device_reason
from .kernels import shipped_kernels
from .sass import inspect_kernel


def report_compiled() -> int:
    kernels = shipped_kernels()
    if not kernels:
        print("no kernels are shipped yet")
    worst = 0
    for label, kernel, signature in kernels:
        r = inspect_kernel(kernel, signature)
        print(f"[{label}]\n{r.summary()}")
        worst = max(worst, r.spill_bytes)
    return 1 if worst else 0


def run_on_gpu() -> int:
    from .selfcheck import run_selfcheck

    return run_selfcheck()


def main() -> int:
    reason = hopper_device_reason()
    if reason is None:
        status = run_on_gpu()
        print("\ncompiled kernels (sm_90a):")
        return report_compiled() or status
    print(f"No Hopper GPU was found ({reason}): compiling the shipped kernels for sm_90a "
          f"and reporting what they became; nothing is run.\n")
    return report_compiled()


if __name__ == "__main__":
    sys.exit(main())
