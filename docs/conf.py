"""Sphinx configuration of the numba_hopper documentation site.

Why Sphinx with autodoc and MyST rather than MkDocs with mkdocstrings: the package's
docstrings are reStructuredText with Sphinx roles (``:class:``, ``:func:``, ``literals``),
which autodoc renders as written and mkdocstrings would not; autodoc imports the modules,
which works without a GPU (numba-cuda compiles nothing at import). MyST lets the pages be
Markdown. Build (what ``tests/test_docs.py`` runs in CI, warnings as errors)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

No extension reaches the network (no intersphinx), so the build works offline.
"""

import importlib
import importlib.util
import inspect
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, installed or not

project = "numba_hopper"
author = "numba_hopper contributors"
copyright = "numba_hopper contributors"  # noqa: A001 (Sphinx's name)

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
myst_heading_anchors = 3  # links to a page's sections: [text](gemm.md#layouts)
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# numba_hopper.torch needs torch, an optional dependency (its operators are built at import,
# so autodoc's mock imports cannot stand in for it): without torch, its API page says so.
HAVE_TORCH = importlib.util.find_spec("torch") is not None
WITHOUT_TORCH = """# `numba_hopper.torch`

This build of the documentation ran without PyTorch, which `numba_hopper.torch` imports: its
reference is generated where PyTorch is installed (`pip install -e '.[torch,docs]'`). The
guide is [PyTorch integration](../pytorch.md).
"""

html_theme = "furo" if importlib.util.find_spec("furo") else "alabaster"
html_title = "numba_hopper"
html_static_path = []


def _module_reference(module_name):
    """reST for a module of intrinsics: its docstring, then every name of its ``__all__``.

    autodoc's ``:members:`` would skip the intrinsics, which are callable objects (numba's
    intrinsic wrapper) rather than functions; ``autofunction`` renders them as functions
    (their operands and their docstrings)."""
    module = importlib.import_module(module_name)
    lines = [f".. automodule:: {module_name}", "   :no-members:", ""]
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or callable(obj):
            lines += [f".. {'autoclass' if inspect.isclass(obj) else 'autofunction'}:: {module_name}.{name}", ""]
        else:  # a table (its type's docstring is not its documentation)
            lines += [f".. py:data:: {module_name}.{name}", f"   :type: {type(obj).__name__}", ""]
    return lines


def setup(app):
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util.docutils import SphinxDirective

    class AutoIntrinsics(SphinxDirective):
        """``.. autointrinsics:: numba_hopper.intrinsics.mbarrier``: the module's reference."""

        required_arguments = 1

        def run(self):
            node = nodes.container()
            lines = StringList(_module_reference(self.arguments[0]), source=self.get_source_info()[0])
            self.state.nested_parse(lines, self.content_offset, node)
            return node.children

    app.add_directive("autointrinsics", AutoIntrinsics)
    if not HAVE_TORCH:
        app.connect("source-read", _torch_page_without_torch)


def _torch_page_without_torch(app, docname, source):
    if docname == "api/torch":
        source[0] = WITHOUT_TORCH
