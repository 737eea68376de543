"""Issue 44's size and layering targets for the product code (ppd_core/ and app/): no module over 400 lines, no
function over 60, ppd_core's import graph at most 8 levels deep, and no dispatch on which backend runs outside
``ppd_core/backends/`` (a backend's differences are methods of its protocol).

Read with ``ast``, never by running the code.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from test_structure import ROOT, import_graph

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_IMPORT_LEVELS = 8
PRODUCT = ("ppd_core", "app")
BACKENDS = ROOT / "ppd_core" / "backends"


def product_files() -> list[Path]:
    return sorted(path for folder in PRODUCT for path in (ROOT / folder).rglob("*.py"))


def levels(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each module's level: 1 when it imports no other ppd_core module, else one more than its highest import."""

    @cache
    def level(module: str) -> int:
        return 1 + max((level(target) for target in graph.get(module, ())), default=0)

    return {module: level(module) for module in graph}


def longest_chain(graph: dict[str, set[str]], found: dict[str, int]) -> list[str]:
    chain = [max(found, key=found.get)]
    while graph.get(chain[-1]):
        chain.append(max(graph[chain[-1]], key=found.get))
    return chain


def backend_classes() -> set[str]:
    return {node.name for path in BACKENDS.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def names_backend(node: ast.AST) -> bool:
    """``backend`` or ``<anything>.backend``: the expression a dispatch on the backend starts from."""
    return (isinstance(node, ast.Name) and node.id == "backend") or (isinstance(node, ast.Attribute) and node.attr == "backend")


def dispatches(node: ast.AST, classes: set[str]) -> bool:
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(isinstance(side, ast.Attribute) and side.attr == "name" and names_backend(side.value) for side in sides)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
        if node.func.id == "hasattr":
            return names_backend(node.args[0])
        if node.func.id == "isinstance":
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            return any(isinstance(kind, (ast.Name, ast.Attribute)) and ast.unparse(kind).split(".")[-1] in classes
                       for kind in kinds)
    return False


def test_no_module_is_over_400_lines():
    long = [f"{path.relative_to(ROOT)}: {count}" for path in product_files()
            if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, "modules over 400 lines:\n" + "\n".join(long)


def test_no_function_is_over_60_lines():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
            for path in product_files() for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_ppd_core_imports_are_at_most_8_levels_deep():
    graph = import_graph()
    found = levels(graph)
    assert max(found.values()) <= MAX_IMPORT_LEVELS, "longest chain: " + " -> ".join(longest_chain(graph, found))


def test_levels_count_from_modules_that_import_nothing():
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}
    assert levels(graph) == {"a": 3, "b": 2, "c": 1, "d": 2}
    assert longest_chain(graph, levels(graph)) == ["a", "b", "c"]


def test_only_backends_dispatch_on_the_backend():
    classes = backend_classes()
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}" for path in product_files()
             if BACKENDS not in path.parents
             for node in ast.walk(ast.parse(path.read_text())) if dispatches(node, classes)]
    assert not found, "dispatch on the backend outside ppd_core/backends/:\n" + "\n".join(found)


def test_the_dispatch_finder_finds_each_kind():
    classes = {"StaticCache"}
    found = [dispatches(ast.parse(text, mode="eval").body, classes) for text in (
        'loaded.backend.name == "torch"', 'hasattr(self.backend, "threads")', "isinstance(cache, StaticCache)",
        "isinstance(cache, (tuple, transformers.StaticCache))", "isinstance(value, str)", 'model.name == "x"')]
    assert found == [True, True, True, True, False, False]
