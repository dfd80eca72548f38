"""The documentation: the site builds with warnings as errors, its API reference covers the
intrinsics, and product text describes the product, not how it got there (CPU only)."""

import contextlib
import importlib.metadata
import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _tools() -> str:
    """What the build is made with beyond its sources, which Sphinx does not track: Python, the
    versions of the documentation tools, whether PyTorch is there (docs/conf.py's api/torch)."""
    versions = []
    for dist in ("sphinx", "docutils", "myst-parser", "furo"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} none")
    return "\n".join([sys.version, *versions, f"torch {importlib.util.find_spec('torch') is not None}"])


@contextlib.contextmanager
def _locked(path):
    """Hold ``path``'s lock: another pytest run in this checkout builds after this one."""
    try:
        import fcntl
    except ImportError:  # no locking here
        yield
        return
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def sphinx_build(source, build):
    """``sphinx-build -W --keep-going -a -b html`` of ``source`` into ``build`` (kept between runs).

    Incremental: Sphinx reads again the pages whose sources or autodoc'd modules changed since
    the last build (autodoc records the file of each object it documents) and ``-a`` writes every
    page again, which resolves every cross-reference. Sound only from a build that passed, so a
    build is kept only when it passed: ``build/passed`` records the tools it was made with, and
    a build that failed, was interrupted or was made with other tools is deleted first (then
    every page is read and its warnings reported again). Returns the finished process."""
    build = pathlib.Path(build)
    build.parent.mkdir(parents=True, exist_ok=True)
    with _locked(build.parent / f"{build.name}.lock"):
        stamp, tools = build / "passed", _tools()
        if not stamp.exists() or stamp.read_text() != tools:
            shutil.rmtree(build, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-a", "-b", "html",
                               "-d", str(build / "doctrees"), str(source), str(build / "html")],
                              capture_output=True, text=True, cwd=ROOT, timeout=600)
        if proc.returncode == 0:
            stamp.write_text(tools)
        else:
            shutil.rmtree(build, ignore_errors=True)
    return proc


def _needs_sphinx():
    for module in ("sphinx", "myst_parser"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")


@pytest.mark.long
def test_docs_build_without_warnings(request, tmp_path):
    """The site builds with warnings as errors: autodoc imports the package (no GPU needed) and
    every docstring it renders, page and cross-reference must be clean. The build is kept in
    pytest's cache directory (.pytest_cache/d/docs), so a re-run reads only what changed."""
    _needs_sphinx()
    cache = getattr(request.config, "cache", None)  # (none with -p no:cacheprovider: a full build)
    proc = sphinx_build(DOCS, cache.mkdir("docs") / "build" if cache else tmp_path / "build")
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"


def test_a_kept_build_reports_a_changed_docstring_until_it_is_fixed(tmp_path):
    """The incremental build reads a page again when the module it documents changes, and a
    warning it finds there fails every build until the docstring is fixed."""
    _needs_sphinx()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                                              "extensions = ['sphinx.ext.autodoc']\n")
    (tmp_path / "src" / "index.rst").write_text("Sample\n======\n\n.. automodule:: sample_module\n   :members:\n")
    module = tmp_path / "sample_module.py"
    module.write_text('def f():\n    """Fine."""\n')
    build = tmp_path / "build"
    assert sphinx_build(tmp_path / "src", build).returncode == 0
    module.write_text('def f():\n    """Broken ``literal."""\n')
    os.utime(module, ns=(module.stat().st_mtime_ns + 10**9,) * 2)  # (later than the build, whatever the clock)
    for _ in range(2):  # the build reads the changed page, and the next does not forget the warning
        proc = sphinx_build(tmp_path / "src", build)
        assert proc.returncode != 0 and "sample_module.f" in proc.stderr, proc.stderr


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
