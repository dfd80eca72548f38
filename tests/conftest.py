import os

import pytest

from numba_hopper.runtime.device import hopper_device_reason
from numba_hopper.tools.sass_cache import ENV as SASS_CACHE_ENV


def pytest_configure(config):
    # inspect_kernel keeps its reports in pytest's cache directory (.pytest_cache/d/numba_hopper_sass),
    # keyed on the package sources, the toolchain and each kernel's identity: a re-run reads back
    # what an earlier run compiled. `--cache-clear` or `-p no:cacheprovider` compiles everything.
    # (xdist workers inherit the variable, or set the same one themselves.)
    cache = getattr(config, "cache", None)
    if cache is not None and SASS_CACHE_ENV not in os.environ:
        os.environ[SASS_CACHE_ENV] = str(cache.mkdir("numba_hopper_sass"))


@pytest.hookimpl(optionalhook=True)  # (an xdist hook: pytest -p no:xdist still loads this file)
def pytest_xdist_auto_num_workers(config):
    # With a Hopper GPU, `-n auto` is one process: GPU tests time the device and order work on
    # streams, and worker processes beside them change that (on the H100, 3 of the 7 stream-
    # ordering tests of test_gemm_streams_gpu.py failed under 8 workers and passed alone).
    # benchmarks/gpu_session.sh gives the compile-bound rest explicit workers and runs the
    # tests marked `serial` (those that time the host or order streams) alone after them.
    if hopper_device_reason() is None:
        return 0
    return None  # xdist's own count: one worker per core


# Work units of more than one test for xdist (--dist loadgroup, pyproject.toml): a module whose
# module fixtures are costly runs on one worker, which builds them once; the GPU test files run
# on one worker, one test after another (when -n is given beside a GPU). Grouped here by file,
# not with xdist_group marks: xdist 3.8 renames the marked tests' item._nodeid, which pytest
# 9.2 no longer reads, so the marks group nothing.
_ONE_WORKER = {"tests/test_prebuilt.py": "prebuilt"}  # the kernel set and one real build


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        """Every test its own work unit, but for the files grouped above."""

        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            if path.endswith("_gpu.py"):
                return "gpu"
            return _ONE_WORKER.get(path, nodeid)

    return FileGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    reason = hopper_device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
