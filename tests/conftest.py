import os

import pytest

from numba_hopper._device import hopper_device_reason
from numba_hopper._sass_cache import ENV as SASS_CACHE_ENV


def pytest_configure(config):
    # inspect_kernel keeps its reports in pytest's cache directory (.pytest_cache/d/numba_hopper_sass),
    # keyed on the package sources, the toolchain and each kernel's identity: a re-run reads back
    # what an earlier run compiled. `--cache-clear` or `-p no:cacheprovider` compiles everything.
    # (xdist workers inherit the variable, or set the same one themselves.)
    cache = getattr(config, "cache", None)
    if cache is not None and SASS_CACHE_ENV not in os.environ:
        os.environ[SASS_CACHE_ENV] = str(cache.mkdir("numba_hopper_sass"))


def pytest_xdist_auto_num_workers(config):
    # With a Hopper GPU, `-n auto` is one process: GPU tests time the device and order work on
    # streams, and worker processes beside them change that (on the H100, 3 of the 7 stream-
    # ordering tests of test_gemm_streams_gpu.py failed under 8 workers and passed alone).
    if hopper_device_reason() is None:
        return 0
    return None  # xdist's own count: one worker per core


def pytest_collection_modifyitems(config, items):
    reason = hopper_device_reason()
    if reason is None:
        # One GPU for every worker: the GPU tests run one after another, on one xdist worker
        # (--dist loadgroup), and time and measure memory as they would alone.
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.xdist_group("gpu"))
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
