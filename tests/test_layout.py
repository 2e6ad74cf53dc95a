"""The package's layers import downwards only, in the order ARCHITECTURE.md's table states them
(top to bottom; one row may import itself), and no module imports itself through others. Imports
inside functions count: they hide a dependency or a cycle, they do not remove it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import specq

PACKAGE = Path(specq.__file__).parent
ARCHITECTURE = Path(__file__).parents[1] / "ARCHITECTURE.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(module: str, tree: ast.AST, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of `modules` that `module`'s syntax tree imports, anywhere in it (a `from pkg
    import name` of a submodule counts as importing that submodule)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[:len(here) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in modules and t != module:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of specq and the modules of specq it imports."""
    files = {module_name(f): f for f in PACKAGE.rglob("*.py")}
    return {m: imports(m, ast.parse(f.read_text()), f.name == "__init__.py", set(files))
            for m, f in files.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the path of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def stated_layers(text: str) -> list[set[str]]:
    """The layers of ARCHITECTURE.md's "Layers" table, top to bottom, each as the names under
    specq its first column gives (`cli.py` -> cli, `serve/` -> serve)."""
    table = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("|")]
    return [names for row in rows if (names := set(re.findall(r"`(\w+)(?:\.py|/)`", row)))]


def layer_of(module: str, layers: list[set[str]]) -> int | None:
    """The row of a module's top-level name under specq; -1 for the package itself (`specq`, the
    public API: it imports from every layer), None for a name the table leaves out."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    return next((i for i, names in enumerate(layers) if parts[1] in names), None)


def upward(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of a module from a layer above its own."""
    return [f"{m} -> {t}" for m in sorted(graph) for t in sorted(graph[m])
            if layer_of(t, layers) < layer_of(m, layers)]


def test_no_import_cycle():
    found = cycle(import_graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "specq.core.decode" in graph["specq.api"]  # the graph sees real imports


def test_every_layer_imports_only_the_layers_below_it():
    layers = stated_layers(ARCHITECTURE.read_text())
    graph = import_graph()
    unplaced = sorted({m.split(".")[1] for m in graph if layer_of(m, layers) is None})
    assert not unplaced, f"not in ARCHITECTURE.md's layers table: {', '.join(unplaced)}"
    found = upward(graph, layers)
    assert not found, "imports from a layer above (ARCHITECTURE.md, Layers):\n" + "\n".join(found)


def test_the_check_finds_an_upward_import_even_inside_a_function():
    layers = stated_layers(ARCHITECTURE.read_text())
    order = ["specq.cli", "specq.loading.kinds", "specq.core.decode", "specq.errors"]
    rows = [layer_of(m, layers) for m in order]
    assert rows == sorted(set(rows))  # the table is read: four rows, top to bottom
    modules = {"specq.core", "specq.core.decode", "specq.core.gamma", "specq.loading",
               "specq.loading.kinds"}
    source = "from .gamma import AUTO\n\ndef run():\n    from ..loading import kinds\n"
    planted = imports("specq.core.decode", ast.parse(source), False, modules)
    assert planted == {"specq.core.gamma", "specq.loading.kinds"}
    assert upward({"specq.core.decode": planted}, layers) == \
        ["specq.core.decode -> specq.loading.kinds"]
    assert upward({"specq.loading.kinds": {"specq.core.decode"}}, layers) == []
