"""A new process loads the GEMM kernel from the disk cache instead of compiling it (GPU)."""

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "first_call.py"


def test_second_process_first_call_loads_the_cached_kernel(tmp_path):
    pytest.importorskip("torch")
    result = tmp_path / "first_call.json"
    subprocess.run([sys.executable, str(SCRIPT), "--json", str(result), "--no-prebuilt", "--cases", "gemm-bf16"],
                   check=True, timeout=300)
    runs = json.loads(result.read_text())["records"]
    cold, warm = runs
    assert cold["wrote_cache_entries"] and not warm["wrote_cache_entries"], runs  # warm compiled nothing
    assert warm["first_call_s"] < cold["first_call_s"] / 3, runs
    assert cold["rel_error"] < 1e-2 and warm["rel_error"] < 1e-2, runs
