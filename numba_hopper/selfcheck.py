"""What ``python -m numba_hopper`` runs on a Hopper GPU: the shipped kernels on random data,
checked against a float64 reference, with their measured speed."""

from __future__ import annotations


def run_selfcheck() -> int:
    print("no GPU self-checks are shipped yet")
    return 0
