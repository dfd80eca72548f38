"""With the prebuilt kernels, a new process's first gemm, fp8 gemm and grouped gemm compile
nothing (GPU)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from numba_hopper.runtime import kernel_cache as kc

pytestmark = [pytest.mark.gpu, pytest.mark.serial]

# A new process, empty kernel cache: 2048^3 bf16 into a NaN-filled ``out``; prints one JSON line.
CHILD = r"""
import json, time
import numpy as np
from numba_hopper import gemm
from numba_hopper.runtime import kernel_cache as _kernel_cache

M = N = K = 2048
rng = np.random.default_rng(0)
a64, b64 = rng.standard_normal((M, K)), rng.standard_normal((K, N))
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    a, b = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (a64, b64))
    out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    start = time.perf_counter()
    gemm(a, b, out=out)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    exact_a, exact_b, result = (x.double().cpu().numpy() for x in (a, b, out))
else:  # numba arrays of bf16 bit patterns
    from numba import cuda

    def bf16_bits(x):  # truncated to bf16
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def value(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    ha, hb = bf16_bits(a64), bf16_bits(b64)
    a, b = cuda.to_device(ha), cuda.to_device(hb)
    out = cuda.to_device(np.full((M, N), 0x7FC0, np.uint16))  # NaN
    cuda.synchronize()
    start = time.perf_counter()
    gemm(a, b, out=out, dtype="bf16", out_dtype="bf16")
    cuda.synchronize()
    seconds = time.perf_counter() - start
    exact_a, exact_b, result = value(ha), value(hb), value(out.copy_to_host())
ref = exact_a @ exact_b
print(json.dumps({"first_call_s": seconds, "rel_error": float(np.linalg.norm(result - ref) / np.linalg.norm(ref)),
                  "kernel_sources": dict(_kernel_cache.kernel_sources), "torch": torch is not None}))
"""


def test_first_gemm_of_a_new_process_loads_prebuilt_kernels(tmp_path):
    if not (kc.PREBUILT_DIR / kc.MANIFEST).exists():
        pytest.skip(f"no prebuilt kernels in {kc.PREBUILT_DIR}: python -m numba_hopper.tools.prebuild")
    reason = kc.prebuilt_status()
    assert reason is None, f"the prebuilt kernels would not be used ({reason}): python -m numba_hopper.tools.prebuild"
    env = dict(os.environ, NUMBA_HOPPER_CACHE_DIR=str(tmp_path / "empty cache"))
    env.pop("NUMBA_HOPPER_PREBUILT", None)
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["rel_error"] < 1e-2, run  # NaN (an unwritten out) fails too
    assert run["kernel_sources"].get("prebuilt", 0) >= 1 and "compiled" not in run["kernel_sources"], run
    assert not (tmp_path / "empty cache").exists() or not list((tmp_path / "empty cache").iterdir()), run
    assert run["first_call_s"] < 1.0, run  # a prebuilt kernel loads, it does not compile


FIRST_CALL = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "first_call.py"


def test_first_fp8_and_grouped_calls_of_a_new_process_load_prebuilt_kernels(tmp_path):
    pytest.importorskip("torch")
    if not (kc.PREBUILT_DIR / kc.MANIFEST).exists():
        pytest.skip(f"no prebuilt kernels in {kc.PREBUILT_DIR}: python -m numba_hopper.tools.prebuild")
    cases = ["gemm-fp8-tensor", "gemm-fp8-rowwise", "gemm-fp8-blockwise", "grouped-bf16", "grouped-fp8-blockwise"]
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_HOPPER_PREBUILT"}
    result = tmp_path / "first_call.json"
    subprocess.run([sys.executable, str(FIRST_CALL), "--out", str(result), "--cases", *cases], env=env, check=True,
                   timeout=600)
    cold = [r for r in json.loads(result.read_text())["records"] if r["process"] == "cold"]
    assert [r["name"] for r in cold] == cases
    for r in cold:
        assert r["used_prebuilt"] and "compiled" not in r["kernel_sources"] and not r["wrote_cache_entries"], r
        assert r["rel_error"] < 1e-2, r  # (each within its dtype's and scaling's bound: bench_fp8.tolerance)
