"""The documentation: the site builds with warnings as errors, its API reference covers the
intrinsics, and product text describes the product, not how it got there (CPU only)."""

import importlib.util
import inspect
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_docs_build_without_warnings(tmp_path):
    """``sphinx-build -W --keep-going -b html docs <tmp>``: autodoc imports the package (no GPU
    needed) and every docstring it renders, page and cross-reference must be clean."""
    for module, extra in (("sphinx", "docs"), ("myst_parser", "docs")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[{extra}]')")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                           str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"


def test_api_reference_lists_every_intrinsics_module():
    """A module of intrinsics the package exports has its section in docs/api/intrinsics.md."""
    import numba_hopper.intrinsics as nh

    page = (DOCS / "api" / "intrinsics.md").read_text()
    modules = [name for name, obj in vars(nh).items() if inspect.ismodule(obj) and not name.startswith("_")
               and obj.__name__.startswith("numba_hopper.intrinsics.")]
    assert modules
    missing = [m for m in modules if f"autointrinsics:: numba_hopper.intrinsics.{m}\n" not in page]
    assert not missing, f"add a section to docs/api/intrinsics.md for: {missing}"


# Pointers into the development record: "session 12", "issue 20", commit hashes (7 to 40 hex
# digits with at least one letter and one digit), the retired lab notebook.
HISTORY = {
    "a session": re.compile(r"\bsessions? \d+", re.IGNORECASE),
    "an issue": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "the lab notebook": re.compile(r"\bNOTES\b"),
}
TEXT_SUFFIXES = {".py", ".md", ".rst", ".txt", ".sh", ".toml", ".cfg", ".css"}
# Product text: the package (code and docstrings), the README, the docs, the examples and the
# benchmark scripts. Not benchmarks/results (data, which records commits) nor CHANGELOG.md.
PRODUCT_TEXT = {
    "README.md": [ROOT / "README.md"],
    "docs": sorted(p for p in DOCS.rglob("*") if "_build" not in p.parts),
    "examples": sorted((ROOT / "examples").rglob("*")),
    "benchmarks": sorted((ROOT / "benchmarks").glob("*.*")),
    "numba_hopper": sorted((ROOT / "numba_hopper").rglob("*")),
}


def _shown(path):
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def history_mentions(paths):
    """``path:line: what: the match`` for every history mention in the text files of ``paths``."""
    found = []
    for path in paths:
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for what, pattern in HISTORY.items():
                found += [f"{_shown(path)}:{number}: {what}: {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


@pytest.mark.parametrize("area", sorted(PRODUCT_TEXT))
def test_product_text_has_no_development_history(area):
    """Product text says what the product is and why, with evidence a reader can rerun (a
    benchmark command), never which session, issue or commit it came from."""
    found = history_mentions(PRODUCT_TEXT[area])
    assert not found, f"{len(found)} history mentions in {area}:\n" + "\n".join(found)


def test_the_history_check_catches_what_it_looks_for(tmp_path):
    text = tmp_path / "sample.md"
    text.write_text("Measured in session 12 (issue 20, at 5889a9d; benchmarks/NOTES.md).\n"
                    "Tiles 128x256, e4m3 x e5m2, 0xdeadbeef, 1024x1024x1024, deadbeef, 12345678.\n")
    found = history_mentions([text])
    assert [f.split(": ")[1] for f in found] == ["a session", "an issue", "a commit hash", "the lab notebook"]
    assert all(":1:" in f for f in found)
