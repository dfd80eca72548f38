"""Every public function and class has a docstring (CPU)."""

import importlib
import inspect

import pytest

PUBLIC_MODULES = [
    "numba_hopper",
    "numba_hopper.matmul",
    "numba_hopper.matmul.grouped",
    "numba_hopper.runtime.launch",
    "numba_hopper.runtime.tensormap",
    "numba_hopper.kit.pipeline",
    "numba_hopper.tools.sass",
    "numba_hopper.tools.cli",
    "numba_hopper.kernels.gemm_sm90",
    "numba_hopper.kernels.gemm_config",
    "numba_hopper.kernels.mainloop",
    "numba_hopper.kernels.epilogue",
    "numba_hopper.kernels.elementwise",
    "numba_hopper.kernels.scheduler",
    *(f"numba_hopper.intrinsics.{m}" for m in ("bulk", "cluster", "matrix", "mbarrier", "registers", "smem", "sync", "tma", "tma_reduce", "wgmma")),
]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_a_docstring(module):
    mod = importlib.import_module(module)
    assert (mod.__doc__ or "").strip(), f"{module} has no module docstring"
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not callable(obj):  # constants (sizes, tables) are described where they are defined
            continue
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__  # not inherited
        if not (doc or "").strip():
            missing.append(name)
    assert not missing, f"{module}: no docstring on {missing}"
