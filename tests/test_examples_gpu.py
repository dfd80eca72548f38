"""Every example runs on the GPU and passes its own check."""

import pathlib
import runpy
import sys

import pytest

pytestmark = pytest.mark.gpu

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_and_checks(path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(path)])  # the example parses its command line, not pytest's
    runpy.run_path(str(path), run_name="__main__")  # each example asserts its result
    assert capsys.readouterr().out.rstrip().endswith("OK")
