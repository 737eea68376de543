"""docs/layout.md names every module under ``ppd_core/`` and ``app/``, and every path it names exists.

The table's first cell names paths: a module (``ppd_core/tree.py``) or a folder (``ppd_core/backends/llamacpp/``). A
folder row names its modules and subfolders by their paths relative to it, in backticks anywhere in the row
(``decoder.py``, ``lean/model.py``, ``lean/``). A package's ``__init__.py`` counts as named where its folder is (or its
own path is): most are a docstring and a few imports, and the folder's row says what the package is.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGES = ("ppd_core", "app")


def layout_rows() -> list[tuple[list[str], list[str]]]:
    """Each table row of docs/layout.md: the paths its first cell names, and every ``*.py`` or ``folder/`` name in
    backticks in it."""
    rows = []
    for line in LAYOUT.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            rows.append((re.findall(r"`([^`]+)`", line.split("|")[1]), re.findall(r"`([^`]+(?:\.py|/))`", line)))
    return rows


def named_modules() -> set[str]:
    named = set()
    for paths, modules in layout_rows():
        for path in paths:
            if path.endswith("/"):
                named.add(path + "__init__.py")
                named.update(path + name + ("__init__.py" if name.endswith("/") else "") for name in modules)
            else:
                named.add(path)
    return named


def test_every_module_is_named_in_the_layout():
    modules = {path.relative_to(ROOT).as_posix() for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    assert len(modules) > 100  # the walk found the packages
    missing = sorted(modules - named_modules())
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_every_path_the_layout_names_exists():
    named = [path for paths, _ in layout_rows() for path in paths]
    assert "ppd_core/engine.py" in named and "app/api/" in named  # the table was read
    stale = sorted(path for path in named if not (ROOT / path).exists())
    assert not stale, f"docs/layout.md names paths that do not exist: {stale}"
