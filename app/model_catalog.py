"""The models the app can switch to: the default, those in the Hugging Face Hub cache, and recently loaded ones.

Each is named as ``--model`` takes it: ``default``, ``hf:OWNER/REPO``, ``hf:OWNER/REPO:FILE.gguf``, or a path.
"""

from __future__ import annotations

import json
from pathlib import Path

import platformdirs

from ppd_core.atomic_files import atomic_write

RECENT = 8  # recently loaded models kept


def recent_file() -> Path:
    return Path(platformdirs.user_data_dir("ppd")) / "recent-models.json"


def recent() -> list[str]:
    """Models loaded before, newest first (an unreadable list is empty)."""
    try:
        names = json.loads(recent_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def remember(spec: str) -> None:
    """Put ``spec`` first in the recent list (the default is always listed: not kept)."""
    if spec == "default":
        return
    names = [spec, *(name for name in recent() if name != spec)][:RECENT]
    try:
        recent_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write(recent_file(), json.dumps(names) + "\n")
    except OSError:
        pass  # a list of conveniences: never worth an error


def hub_cached() -> list[str]:
    """Models in the Hub cache: each GGUF file of a repository, and each repository with a config and safetensors."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except (CacheNotFound, OSError, ValueError):
        return []
    specs = []
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        files = {file.file_name for revision in repo.revisions for file in revision.files}
        specs += [f"hf:{repo.repo_id}:{name}" for name in sorted(files) if name.endswith(".gguf")]
        if "config.json" in files and any(name.endswith(".safetensors") for name in files):
            specs.append(f"hf:{repo.repo_id}")
    return specs


def public_name(spec: str) -> str:
    """How the API names ``spec``: a local file or folder by its name alone (the API shows no path of the server's
    file system), ``default`` and ``hf:...`` as they are."""
    return spec if spec == "default" or spec.startswith("hf:") else Path(spec).name


def available(current: str) -> list[str]:
    """Every model to offer, the loaded one (``current``) first, each once."""
    return list(dict.fromkeys([current, "default", *recent(), *hub_cached()]))
