"""The import layers (issue 52): with each folder one node (``ppd_core/calibration/``, ``ppd_core/backends/`` with
its wings, ``app/api/``, ``app/commands/``, ...) and each top-level module one, the graph of ``ppd_core`` and that of
``app`` have no cycle even counting the imports under ``if TYPE_CHECKING:`` (no import from a lower level back up),
and neither is more than ``MAX_LEVELS`` deep in the imports that run. A package's ``__init__`` (the door) is not a node: it imports its
modules on use.
"""

from __future__ import annotations

from pathlib import Path

from test_structure import ROOT, find_cycle, imported_names, module_name

MAX_LEVELS = 8


def node(module: str) -> str:
    """The module's node: its top-level module or folder (``app.api.jobs`` -> ``app.api``)."""
    return ".".join(module.split(".")[:2])


def layer_graph(package: str, type_only: bool = True) -> dict[str, set[str]]:
    """{node: the nodes it imports} within ``package`` (``type_only``: counting the imports under ``TYPE_CHECKING``)."""
    modules = {module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == package:
            continue
        source = node(name)
        graph.setdefault(source, set())
        for imported in imported_names(path, type_checking=type_only):
            parts = imported.split(".")
            targets = {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & modules.keys()
            graph[source].update(node(target) for target in targets if node(target) != source)
    return graph


def levels(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each node's level in an acyclic ``graph``: 1 for a node importing none, else one more than its highest import."""
    found: dict[str, int] = {}

    def level(name: str) -> int:
        if name not in found:
            found[name] = 1 + max((level(target) for target in graph.get(name, ())), default=0)
        return found[name]

    for name in graph:
        level(name)
    return found


def deepest(found: dict[str, int], graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports, top first."""
    chain = [max(found, key=lambda name: found[name])]
    while graph.get(chain[-1]):
        chain.append(max(graph[chain[-1]], key=lambda name: found[name]))
    return chain


def check_layers(package: str) -> None:
    graph = layer_graph(package)
    cycle = find_cycle(graph)
    assert cycle is None, f"an import back up among {package}'s folders and modules: " + " -> ".join(cycle)
    graph = layer_graph(package, type_only=False)
    found = levels(graph)
    assert max(found.values()) <= MAX_LEVELS, f"{package} is {max(found.values())} levels deep: " + " -> ".join(
        deepest(found, graph))


def test_ppd_core_has_at_most_eight_levels_and_no_import_back_up():
    check_layers("ppd_core")


def test_app_has_at_most_eight_levels_and_no_import_back_up():
    check_layers("app")


def test_the_layers_are_counted_as_described():
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert levels(graph) == {"a": 3, "b": 2, "c": 1} and deepest(levels(graph), graph) == ["a", "b", "c"]
    assert node("app.api.jobs") == "app.api" and node("ppd_core.engine") == "ppd_core.engine"
