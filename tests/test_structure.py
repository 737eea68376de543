"""The shape of the code: app/ imports ppd_core's public API (the package, ``ppd_core/__init__``: the session API, typed
for a type checker, loaded lazily) plus the light modules (plain data, the errors and the atomic writes it uses
directly) and the tool modules its commands use, ppd_core has no import cycle, and importing the engine stays light.

Imports are read with ``ast`` (top-level and inside functions alike, but not those under ``if TYPE_CHECKING:``, which
never run), never by running them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = "ppd_core"
API = CORE  # app/ imports ppd_core's public API from the package
LIGHT = {"ppd_core.options", "ppd_core.errors", "ppd_core.sampling", "ppd_core.sampling.params", "ppd_core.sampling.fields"}  # plain data, read before any heavy import
DIRECT = {"ppd_core.atomic_files", "ppd_core.cpu_cores"}  # helpers app/ and ppd_core share, imported where used
TOOLS = {  # modules of what is not the session API (calibration, training, quantizing, diagnostics...): their commands'
    "ppd_core.backends.llamacpp.library", "ppd_core.backends.llamacpp.perplexity", "ppd_core.backends.llamacpp.quantize",
    "ppd_core.calibration.curves", "ppd_core.calibration.prices", "ppd_core.calibration.profiles",
    "ppd_core.calibration.tree_search", "ppd_core.calibration.type_curves", "ppd_core.engine_calibration",
    "ppd_core.decoding", "ppd_core.device_info", "ppd_core.diagnostics", "ppd_core.drafters.lookup",
    "ppd_core.drafters.prompt_tokens", "ppd_core.engine_load", "ppd_core.loading", "ppd_core.memory", "ppd_core.text",
    "ppd_core.training.cost", "ppd_core.training.greedy", "ppd_core.training.pipeline", "ppd_core.training.trainer",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / CORE).rglob("*.py"))}


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the statements inside ``if TYPE_CHECKING:`` blocks: imports for annotations, never run."""
    skipped = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None) if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imported_names(path: Path, type_checking: bool = False) -> set[str]:
    """Every module an ``import`` statement in the file names: ``from a import b`` gives ``a`` and ``a.b``. Imports
    inside functions count; those under ``if TYPE_CHECKING:`` only with ``type_checking`` (they never run)."""
    names = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if type_checking else type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


WINGS = "ppd_core.backends"  # its subpackages (the llama.cpp and torch wings) are units of their own


def unit(module: str) -> str:
    """A top-level module, or a whole subpackage (``ppd_core.training.trainer`` -> ``ppd_core.training``); a backend's
    wing is one (``ppd_core.backends.torch.lean.model`` -> ``ppd_core.backends.torch``)."""
    parts = module.split(".")
    return ".".join(parts[:3] if module.startswith(WINGS + ".") and len(parts) > 3 else parts[:2])


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


def with_packages(names: set[str]) -> set[str]:
    """``names`` and the packages above them (``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``): importing a module runs them."""
    return {".".join(name.split(".")[:i]) for name in names for i in range(1, name.count(".") + 2)}


def test_app_imports_only_the_public_api_and_the_tool_modules_from_ppd_core():
    modules = core_modules()
    allowed = with_packages({API, *LIGHT, *DIRECT, *TOOLS})
    wrong = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for name in sorted(core_imports(path, modules) - allowed)
    ]
    assert not wrong, "app/ imports ppd_core modules other than the public API and the tools':\n" + "\n".join(wrong)


def door_imports() -> dict[str, str]:
    """The names ``ppd_core/__init__`` imports under ``TYPE_CHECKING`` (what a type checker reads), by module."""
    tree = ast.parse((ROOT / CORE / "__init__.py").read_text())
    skipped = type_checking_only(tree)
    return {alias.name: node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and id(node) in skipped and node.module for alias in node.names}


def test_the_door_types_what_it_loads():
    """The type checker's imports, the run-time table and ``__all__`` name the same names from the same modules."""
    import ppd_core

    assert door_imports() == ppd_core._WHERE
    assert sorted(ppd_core.__all__) == sorted(ppd_core._WHERE)


def test_app_takes_the_session_api_through_the_door():
    """A name the door exports is imported from ``ppd_core`` (or a light module), never from the module behind it:
    so a module moving behind the door changes the door's one line."""
    door = door_imports()
    wrong = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module not in (API, *LIGHT) and node.level == 0:
                wrong += [f"{path.relative_to(ROOT)}: {alias.name} from {node.module}" for alias in node.names
                          if door.get(alias.name) == node.module]
    assert not wrong, wrong


def test_importing_the_door_imports_nothing_behind_it():
    """``import ppd_core`` loads no module of its own, nor ``typing``: each name's module loads on first use, and the
    engine's brings no torch."""
    code = ("import sys; before = set(sys.modules); import ppd_core; after = set(sys.modules) - before; "
            "ppd_core.Engine; print(' '.join(sorted(after)), '|', ' '.join(m for m in ('torch', 'transformers') if m in sys.modules))")
    loaded, heavy = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                   check=True).stdout.split("|")
    assert loaded.split() == ["ppd_core"] and not heavy.strip(), (loaded, heavy)


def test_the_public_api_names_modules_that_define_its_names():
    """Every name ``ppd_core/__init__`` lists resolves (the table is strings: a moved module shows here)."""
    import ppd_core

    missing = [name for name in ppd_core.__all__ if not _resolves(ppd_core, name)]
    assert not missing, missing
    modules = [name for name in ppd_core.__all__ if f"{CORE}.{name}" in core_modules()]
    assert not modules, f"public names that are also module names (an import of the module hides them): {modules}"


def _resolves(package, name: str) -> bool:
    try:
        getattr(package, name)
    except (ImportError, AttributeError):
        return False
    return True


def test_importing_the_engine_loads_no_quantizer_perplexity_or_diagnostics():
    """``import ppd_core.engine`` (what every command runs) stays light: `ppd quantize` and `ppd doctor`'s modules
    load when those commands run."""
    code = ("import sys, ppd_core.engine; print(' '.join(m for m in sys.modules if m.startswith('ppd_core') and "
            "any(word in m for word in ('quantize', 'perplexity', 'diagnostics'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert not loaded.strip(), loaded


def test_app_takes_atomic_writes_from_their_own_module():
    """``atomic_write`` comes from ``ppd_core.atomic_files``, not through the package."""
    wrong = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == API:
                wrong += [f"{path.name}: {alias.name}" for alias in node.names if alias.name == "atomic_write"]
    assert not wrong, wrong


def test_ppd_core_modules_import_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle among ppd_core modules: " + " -> ".join(cycle)


def test_ppd_core_subpackages_import_no_cycle():
    """Counting calibration/, training/ and each backend wing as one unit: e.g. no engine -> calibration -> training ->
    engine. ``engine_calibration`` takes an engine but names its class under ``TYPE_CHECKING`` only."""
    cycle = find_cycle(import_graph(units=True))
    assert cycle is None, "import cycle among ppd_core modules and subpackages: " + " -> ".join(cycle)


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


TORCH = ("torch", "transformers")
TORCH_WING = ("ppd_core.backends.torch", "ppd_core.training")  # the packages that may import torch and transformers


def imports_torch(path: Path) -> bool:
    return any(name.split(".")[0] in TORCH for name in imported_names(path))


def test_only_the_torch_wing_and_training_import_torch():
    """"No torch on a GGUF" by structure: outside ``backends/torch/`` and ``training/`` no module imports torch or
    transformers, even inside a function; so nothing a GGUF on llama.cpp runs can load them."""
    wrong = sorted(
        name for name, path in core_modules().items()
        if not name.startswith(TORCH_WING) and imports_torch(path)
    )
    assert not wrong, "modules outside the torch wing import torch or transformers: " + ", ".join(wrong)
