"""Every public module, function and class has a docstring, and the deprecated module paths still
import, with a warning (CPU)."""

import importlib
import inspect
import pathlib
import sys

import pytest

import numba_hopper

PACKAGE = pathlib.Path(numba_hopper.__file__).parent
# Old paths, kept as aliases that warn: {old: new}
DEPRECATED = {
    "numba_hopper.launch": "numba_hopper.runtime.launch",
    "numba_hopper.tensormap": "numba_hopper.runtime.tensormap",
    "numba_hopper.debug": "numba_hopper.runtime.debug",
    "numba_hopper.sass": "numba_hopper.tools.sass",
}


def _public_modules():
    """Every module of the package with no ``_`` name on its path, aliases aside."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        name = ".".join(parts)
        if name not in DEPRECATED:
            found.append(name)
    return found


PUBLIC_MODULES = _public_modules()


def test_the_public_modules_are_found():
    for name in ("numba_hopper", "numba_hopper.matmul", "numba_hopper.matmul.grouped", "numba_hopper.runtime.launch",
                 "numba_hopper.runtime.tensormap", "numba_hopper.kit.pipeline", "numba_hopper.tools.sass",
                 "numba_hopper.tools.cli", "numba_hopper.kernels.gemm_sm90", "numba_hopper.torch.linear",
                 "numba_hopper.intrinsics.wgmma"):
        assert name in PUBLIC_MODULES


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_has_a_docstring(module):
    if module.split(".")[:2] == ["numba_hopper", "torch"]:
        pytest.importorskip("torch")
    mod = importlib.import_module(module)
    assert (mod.__doc__ or "").strip(), f"{module} has no module docstring"
    missing = []
    for name in getattr(mod, "__all__", ()):
        obj = getattr(mod, name)
        if not callable(obj):  # constants (sizes, tables) are described where they are defined
            continue
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__  # not inherited
        if not (doc or "").strip():
            missing.append(name)
    assert not missing, f"{module}: no docstring on {missing}"


@pytest.mark.parametrize("old, new", DEPRECATED.items())
def test_deprecated_paths_import_and_warn(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # the warning comes with the first import
    with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
