"""The user's real folders, listed before the suite runs, and the test run's own folders that replace them.

conftest.py, before anything imports huggingface_hub or transformers, calls ``record()`` (the real ppd and Hugging
Face folders as the environment names them, listed: names, sizes, mtimes), then ``redirect()`` (``XDG_*_HOME`` and
``HF_HOME`` point at one temporary folder, for this process and every process it starts). ``changes()`` says what
differs from the listing (tests/test_user_folders.py, run last); ``clean_up()`` removes the temporary folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import platformdirs

XDG = ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")
# Hub folders that would otherwise be read from the environment rather than derived from HF_HOME
HF_OVERRIDES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_ASSETS_CACHE", "TRANSFORMERS_CACHE",
                "HF_DATASETS_CACHE")
# set-up and benchmark caches the Makefile and benchmarks/ write, never the tests (docs/backends.md:
# the wheel; benchmarks/README.md: llama-server)
NOT_THE_SUITES = {"ppd-build", "ppd-bench"}

_start: dict[str, tuple] = {}
_deep: list[Path] = []
_shallow: list[Path] = []
_home: Path | None = None


def real_folders() -> tuple[list[Path], list[Path]]:
    """(folders listed in depth, folders whose entries are listed by name), from the environment as it is now."""
    hf_home = Path(os.environ.get("HF_HOME") or Path(platformdirs.user_cache_dir()) / "huggingface")
    deep = [Path(get("ppd")) for get in (platformdirs.user_data_dir, platformdirs.user_cache_dir,
                                         platformdirs.user_config_dir, platformdirs.user_state_dir)]
    deep += [hf_home] + [Path(os.environ[name]) for name in HF_OVERRIDES if os.environ.get(name)]
    shallow = [Path(get()) for get in (platformdirs.user_data_dir, platformdirs.user_cache_dir,
                                       platformdirs.user_config_dir, platformdirs.user_state_dir)]
    return deep, shallow


def listing(deep: list[Path], shallow: list[Path]) -> dict[str, tuple]:
    """Every file and folder under ``deep`` (size and mtime for files), and the entry names directly in ``shallow``."""
    found: dict[str, tuple] = {}
    for top in deep:
        for folder, dirs, files in os.walk(top):
            found[folder] = ("folder",)
            for name in files:
                path = os.path.join(folder, name)
                try:
                    stat = os.lstat(path)
                except FileNotFoundError:
                    continue
                found[path] = (stat.st_size, stat.st_mtime_ns)
    for top in shallow:
        if top.is_dir():
            found.update({str(entry): found.get(str(entry), ("entry",)) for entry in top.iterdir()
                          if entry.name not in NOT_THE_SUITES})
    return found


def record() -> None:
    """List the user's folders as the environment names them now."""
    deep, shallow = real_folders()
    _deep[:], _shallow[:] = deep, shallow
    _start.clear()
    _start.update(listing(deep, shallow))


def redirect() -> Path:
    """Give this process (and the processes it starts) empty folders of its own; returns their parent."""
    global _home
    _home = Path(tempfile.mkdtemp(prefix="ppd-test-home-"))
    for name in XDG:
        os.environ[name] = str(_home / name.lower())
    os.environ["HF_HOME"] = str(_home / "hf_home")
    for name in HF_OVERRIDES:
        os.environ.pop(name, None)
    return _home


def changes() -> list[str]:
    """What differs in the user's folders since ``record()``: one line per path added, removed or changed."""
    now = listing(_deep, _shallow)
    lines = [f"added {path}" for path in sorted(now.keys() - _start.keys())]
    lines += [f"removed {path}" for path in sorted(_start.keys() - now.keys())]
    lines += [f"changed {path}" for path in sorted(now.keys() & _start.keys()) if now[path] != _start[path]]
    return lines


def clean_up() -> None:
    """Remove the run's own folders (GGUF conversions, profiles, histories)."""
    if _home is not None:
        shutil.rmtree(_home, ignore_errors=True)
