import os

import pytest

from numba_hopper.runtime.device import hopper_device_reason
from numba_hopper.tools.sass_cache import ENV as SASS_CACHE_ENV


# One thread per test process for PyTorch's CPU kernels (OpenMP): the suite already runs a
# process on every core (xdist), the tensors are small, and idle OpenMP threads spin. Set
# before any test module imports torch; the processes tests start inherit it. (The torch and
# distributed CPU tests take a third less CPU time.)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    # The compilers' caches live in pytest's cache directory (.pytest_cache/d/), so a re-run
    # reads back what an earlier run compiled, and a fresh clone or `--cache-clear` compiles
    # everything (`-p no:cacheprovider`: no cache at all):
    # - inspect_kernel's SASS reports (numba_hopper_sass), keyed on the package sources, the
    #   toolchain and each kernel's identity;
    # - TorchInductor's (torchinductor: its C++ and FX graph caches, by default shared by every
    #   run on the machine under /tmp).
    # (xdist workers inherit the variables, or set the same ones themselves.)
    cache = getattr(config, "cache", None)
    if cache is not None:
        os.environ.setdefault(SASS_CACHE_ENV, str(cache.mkdir("numba_hopper_sass")))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache.mkdir("torchinductor")))


def pytest_addoption(parser):
    parser.addoption("--kernel-matrix", action="store_true",
                     help="run every parameter of the tests marked kernel_matrix (default: the first of each)")


def _first_parameters_only(config, items):
    """A test marked ``kernel_matrix`` compiles one kernel per parameter (a code path each: tile
    shape, dtype, cluster, variant), 3-6 s of CPU apiece. By default only its first parameter
    runs, so that the suite on a fresh clone of a 2-core machine takes minutes, not many;
    ``--kernel-matrix`` runs them all (CI does, after the default run: .ci/run)."""
    if config.getoption("--kernel-matrix"):
        return
    first, kept, deselected = set(), [], []
    for item in items:
        if item.get_closest_marker("kernel_matrix") is not None and hasattr(item, "callspec"):
            key = (item.nodeid.split("::")[0], item.originalname)
            if key in first:
                deselected.append(item)
                continue
            first.add(key)
        kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


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
# Files whose tests read kernels a module fixture compiles once per parameter: the tests of one
# parameter are one unit, so that a second worker does not wait on the first one's compile
# (the SASS cache's lock) and then read it back.
_BY_PARAMETER = {"tests/test_attention_cpu.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        """Every test its own work unit, but for the files grouped above. (xdist hands out the
        units of more than one test first, largest first: the costly ones start early.)"""

        def _split_scope(self, nodeid):
            path, _, name = nodeid.partition("::")
            if path.endswith("_gpu.py"):
                return "gpu"
            if path in _BY_PARAMETER and name.endswith("]"):
                return path + name[name.index("["):]
            return _ONE_WORKER.get(path, nodeid)

    return FileGroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    _first_parameters_only(config, items)
    # Tests that start a compiler or processes of their own (Inductor's C++ build, gloo ranks)
    # take 10-20 s each: handed out first, they run beside the rest instead of after it.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    reason = hopper_device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
