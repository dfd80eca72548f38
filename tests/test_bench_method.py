"""The benchmarks' ratio estimator (benchmarks/bench_gemm.py): host arithmetic, no GPU."""

import pathlib
import sys

import pytest

pytest.importorskip("torch")  # bench_gemm.py imports torch at the top
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_gemm import paired_ratio  # noqa: E402


def test_paired_ratio_cancels_a_clock_swing_shared_by_the_round():
    # The clock moves between rounds (halved in rounds 2-3) and both timings of a round share it.
    ref = [1.10, 1.43, 2.20, 2.20, 1.10]
    ours = [1.00, 1.30, 2.00, 2.00, 1.00]
    assert paired_ratio({"ref": ref, "ours": ours}, "ref", "ours") == pytest.approx(1.1)


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    times = {"ref": [1.0, 1.0, 1.0], "ours": [0.5, 1.0, 4.0]}  # ratios 2, 1, 0.25
    assert paired_ratio(times, "ref", "ours") == 1.0
