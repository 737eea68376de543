"""The shape of the code: app/ goes through ppd_core.engine only (plus plain-data modules, and the errors and the
atomic writes it uses directly), and ppd_core has no import cycle.

Imports are read with ``ast`` (top-level and inside functions alike), never by running them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "ppd_core"
API = "ppd_core.engine"  # the ppd_core module app/ uses
LIGHT = {"ppd_core.options", "ppd_core.errors", "ppd_core.sampling_params"}  # plain data, read before any heavy import
DIRECT = {"ppd_core.atomic_files"}  # one helper app/ and ppd_core share, imported where it is used


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / CORE).rglob("*.py"))}


def imported_names(path: Path) -> set[str]:
    """Every module an ``import`` statement in the file names: ``from a import b`` gives ``a`` and ``a.b``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def core_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ppd_core modules a file imports; a package's ``__init__`` counts, as Python runs it first."""
    found = set()
    for name in imported_names(path):
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules)
    return found


def unit(module: str) -> str:
    """A top-level module, or a whole subpackage (``ppd_core.training.trainer`` -> ``ppd_core.training``)."""
    return ".".join(module.split(".")[:2])


def import_graph(units: bool = False) -> dict[str, set[str]]:
    modules = core_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        source = unit(name) if units else name
        targets = {unit(t) if units else t for t in core_imports(path, modules)}
        graph.setdefault(source, set()).update(targets - {source})
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_app_imports_only_the_engine_from_ppd_core():
    modules = core_modules()
    wrong = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "app").glob("*.py"))
        for name in sorted(core_imports(path, modules) - {CORE, API, *LIGHT, *DIRECT})
    ]
    assert not wrong, "app/ imports ppd_core modules other than ppd_core.engine:\n" + "\n".join(wrong)


def test_app_takes_errors_and_atomic_writes_from_their_own_modules():
    """``PpdError`` and ``atomic_write`` come from ``ppd_core.errors`` and ``ppd_core.atomic_files``, not through the
    engine facade."""
    wrong = []
    for path in sorted((ROOT / "app").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == API:
                wrong += [f"{path.name}: {alias.name}" for alias in node.names if alias.name in ("PpdError", "atomic_write")]
    assert not wrong, wrong


def test_ppd_core_modules_import_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle among ppd_core modules: " + " -> ".join(cycle)


def test_ppd_core_subpackages_import_no_cycle():
    """Counting calibration/, training/ and lean/ each as one unit: e.g. no engine -> calibration -> training -> engine."""
    cycle = find_cycle(import_graph(units=True))
    assert cycle is None, "import cycle among ppd_core modules and subpackages: " + " -> ".join(cycle)


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
