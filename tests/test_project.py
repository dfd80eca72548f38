"""Project plumbing that CI depends on."""

import importlib.util
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.+?)\n```", readme, re.S)
    assert block, "README.md must mark its test command with <!-- test-command -->"
    command = block.group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_gpu_marker_is_registered():
    assert "gpu:" in (ROOT / "pyproject.toml").read_text()


def test_ci_has_what_the_cpu_tests_need():
    # CI sets CI=true: there the torch layer's CPU tests and the documentation build must run,
    # not skip for a missing install (`.[test]` brings them; .ci/constraints.txt pins torch's CPU build).
    if not os.environ.get("CI"):
        pytest.skip("checks CI's install (CI=true)")
    for module in ("torch", "expecttest", "sphinx", "myst_parser"):
        assert importlib.util.find_spec(module) is not None, f"CI's install has no {module}"


def test_the_package_version_has_one_source():
    # pyproject.toml reads it from numba_hopper.__version__ (what --version prints)
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "numba_hopper.__version__"}
