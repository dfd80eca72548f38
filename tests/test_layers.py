"""The package's layers: no import cycles, and each folder imports only the layers below it."""

import ast
import pathlib

import numba_hopper

PACKAGE = pathlib.Path(numba_hopper.__file__).parent


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
    """``{module: {imported numba_hopper module, ...}}``, every import statement counted (also
    those inside functions and under ``TYPE_CHECKING``)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            targets.update(c for c in candidates if c in modules and c != name)
        graph[name] = targets
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None (packages import their own submodules:
    a package's ``__init__`` is not counted as imported by its submodules' relative imports)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if m.startswith(t + "."):  # a submodule importing its package runs the package first: not a cycle
                continue
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    assert _cycle(_imports()) is None, " -> ".join(_cycle(_imports()))


# Each folder may import the layers before it in this order (and itself), never a later one.
LAYERS = ("errors", "_numba_internals", "intrinsics", "runtime", "kit", "kernels", "matmul", "attention", "torch",
          "tools")


def _layer(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_layers_import_only_the_layers_below_them():
    wrong = []
    for module, targets in _imports().items():
        layer = _layer(module)
        if layer not in LAYERS:
            continue
        for t in targets:
            below = _layer(t)
            if below in LAYERS and LAYERS.index(below) > LAYERS.index(layer):
                wrong.append(f"{module} imports {t}")
    assert not wrong, wrong
