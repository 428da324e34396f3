"""The shape of the code, checked: no import cycle, ctypes only in the binding, modules kept small.

Pure AST over llamaspec/: no model, no llama.cpp.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llamaspec"
# Modules allowed past the size limit, each with its reason in the README's code map.
LONG_MODULES = {"llama/model.py"}
MAX_LINES = 350


def _modules() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Every import, at any depth (a lazy import inside a function hides a cycle, it does not
    remove it), as edges between llamaspec modules."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                            for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt) and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node) and (cycle := visit(node, [node])):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None, find_cycle(import_graph())


def test_the_cycle_finder_finds_one():
    # The check has power: the decoder <-> openai_api cycle it was written against.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_ctypes_and_llama_cpp_only_under_llama():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("llamaspec.llama"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            imported = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for module in imported:
                root = module.split(".")[0]
                # reference.py drives llama-cpp-python's high-level Llama (no ctypes): the independent reference.
                if root == "ctypes" or (root == "llama_cpp" and name != "llamaspec.reference"):
                    offenders.append(f"{name} imports {module}")
    assert not offenders, offenders


def test_modules_stay_small():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= LONG_MODULES, long
    readme = (PACKAGE.parent / "README.md").read_text()
    for module in LONG_MODULES:
        assert f"`{Path(module).name}`" in readme and "lines, because" in readme, module
