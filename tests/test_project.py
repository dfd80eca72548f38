"""Project plumbing that CI depends on."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- test-command -->\s*```(?:sh|bash)?\n(.+?)\n```", readme, re.S)
    assert block, "README.md must mark its test command with <!-- test-command -->"
    command = block.group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_gpu_marker_is_registered():
    assert "gpu:" in (ROOT / "pyproject.toml").read_text()
