"""The benchmarks' ratio estimator (benchmarks/bench_gemm.py), options and trace arithmetic: host
arithmetic, no GPU."""

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


def test_gemm_times_align_each_steps_products_and_clip_an_early_start():
    """``profile_train.py --gemms``: the GEMMs of each step by position, the median over steps, a
    kernel that started under the previous one's tail (a dependent launch) timed from its end,
    other kernels left out."""
    from profile_train import gemm_times

    def kernel(name, ts, dur):
        return {"name": name, "ts": ts, "dur": dur, "args": {"grid": [132, 1, 1]}}

    kernels = []
    for step, t0 in enumerate((0.0, 1000.0, 2000.0)):
        kernels += [kernel("gemm_a", t0, 100.0 + step), kernel("triton_poi_fused_mul", t0 + 100 + step, 50.0),
                    kernel("nvjet_sm90_b", t0 + 140 + step, 60.0)]  # started 10 us under the previous tail
    assert gemm_times(kernels[::-1], 3) == [(101.0, "gemm_a", (132, 1, 1)), (50.0, "nvjet_sm90_b", (132, 1, 1))]


def test_attention_configs_parse_per_head_dim():
    """``bench_attention.py --configs``: ``field=value`` lists, each point's head dim, skipped
    where they do not fit."""
    from bench_attention import parse_config, point_configs, points

    cfg = parse_config("block_n=160,stages=3,early_q_release=false", 64)
    assert (cfg.head_dim, cfg.block_n, cfg.stages, cfg.early_q_release) == (64, 160, 3, False)
    assert parse_config("take_turns=TRUE", 128).take_turns
    specs = ("block_n=160,stages=3,early_q_release=false", "consumers=3,block_n=96,stages=3")
    assert tuple(point_configs(specs, 64)) == specs
    assert point_configs(specs, 256) == {}  # (neither fits in shared memory at head dim 256)
    assert list(points((1024, 2048), (64,), (True,))) == [(64, 32, 32, 1024, True), (64, 32, 32, 2048, True)]
    assert sum(1 for p in points((2048,), (128,), (False,)) if p[2] != p[1]) == 2  # GQA 8:1, 4:1


@pytest.mark.parametrize("stdout,field", [("702.15\n", "power.draw.instant"), ("[N/A]\n", "power.draw"),
                                          ("", "power.draw")])
def test_sustained_power_prefers_the_instantaneous_reading(monkeypatch, stdout, field):
    """``bench_sustained.py`` samples ``power.draw.instant`` where nvidia-smi reports a number for
    it, else ``power.draw`` (a one-second average on some drivers)."""
    import subprocess

    import bench_sustained

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout, ""))
    bench_sustained._power_field.cache_clear()
    try:
        assert bench_sustained._power_field() == field
    finally:
        bench_sustained._power_field.cache_clear()



def test_sustained_checks_each_output_against_float64():
    """``bench_sustained.checked_error``: the output is poisoned before the call, so a call that
    writes nothing (or garbage) raises instead of being timed."""
    import torch

    from bench_sustained import checked_error

    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    out = torch.empty(64, 48, dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    assert checked_error(lambda: torch.matmul(a, b, out=out), out, ref) < 1e-2
    with pytest.raises(AssertionError, match="relative error"):
        checked_error(lambda: None, out, ref)  # (NaN left in place)
    with pytest.raises(AssertionError, match="relative error"):
        checked_error(lambda: out.copy_(a[:, :1].expand(64, 48)), out, ref)
