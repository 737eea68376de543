"""The models the app can switch to: the default, those in the Hugging Face Hub cache, and recently loaded ones.

Each is named as ``--model`` takes it: ``default``, ``hf:OWNER/REPO``, ``hf:OWNER/REPO:FILE.gguf``, or a path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import platformdirs

from ppd_core.atomic_files import atomic_write

DEFAULT_SPEC = "default"  # the embedded model: what a failed switch falls back to when the previous model fails too

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
    return list(hub_models())


def hub_models() -> dict[str, tuple[str, int]]:
    """``hub_cached``'s models with their file name (a GGUF's; a repository's name) and bytes on disk."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except (CacheNotFound, OSError, ValueError):
        return {}
    models = {}
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        files = {file.file_name: file.size_on_disk for revision in repo.revisions for file in revision.files}
        models.update({f"hf:{repo.repo_id}:{name}": (name, size) for name, size in sorted(files.items())
                       if name.endswith(".gguf")})
        if "config.json" in files and any(name.endswith(".safetensors") for name in files):
            weights = sum(size for name, size in files.items() if name.endswith(".safetensors"))
            models[f"hf:{repo.repo_id}"] = (repo.repo_id.split("/")[-1], weights)
    return models


def public_name(spec: str) -> str:
    """How the API names ``spec``: a local file or folder by its name alone (the API shows no path of the server's
    file system), ``default`` and ``hf:...`` as they are."""
    return spec if spec == "default" or spec.startswith("hf:") else Path(spec).name


def available(current: str) -> list[str]:
    """Every model to offer, the loaded one (``current``) first, each once."""
    return list(dict.fromkeys([current, "default", *recent(), *hub_cached()]))


# a GGUF file's quantization at the end of its stem: "SmolLM2-135M-Instruct.Q4_1", "qwen2.5-0.5b-instruct-q8_0"
QUANTIZATION = re.compile(r"[-_.]((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)$", re.IGNORECASE)


def size_words(count: int) -> str:
    """Bytes as a file manager lists them: "100 MB", "1.2 GB" (decimal units)."""
    if count >= 10**9:
        return f"{count / 10**9:.1f} GB"
    return f"{max(count, 1) / 10**6:.0f} MB"


def file_facts(name: str, size: int, folder: bool = False) -> str:
    """"SmolLM2-135M-Instruct · Q4_1 · 100 MB": a model file's (or folder's) name, its quantization and size."""
    if folder:
        return f"{name} · safetensors · {size_words(size)}"
    stem = Path(name).stem
    quantization = QUANTIZATION.search(stem)
    if quantization is None:
        return f"{stem} · GGUF · {size_words(size)}"
    return f"{stem[:quantization.start()]} · {quantization.group(1).upper()} · {size_words(size)}"


def local_facts(path: Path) -> str | None:
    """``file_facts`` of a local .gguf file or model folder; None where it is neither (the spec is shown as typed)."""
    try:
        if path.is_file():
            return file_facts(path.name, path.stat().st_size)
        if (path / "config.json").is_file():
            return file_facts(path.name, sum(p.stat().st_size for p in path.glob("*.safetensors")), folder=True)
    except OSError:
        return None
    return None


def model_label(spec: str, hub: dict[str, tuple[str, int]]) -> str:
    """How the picker shows ``spec``: its name, quantization and size ("... (default)" for the default); the spec
    itself where none of that can be read without a download."""
    if spec == "default":
        from ppd_core.loading import model_path
        from ppd_core.errors import PpdError

        try:
            facts = local_facts(model_path("default"))
        except PpdError:  # the default model's package is missing: loading it says so
            facts = None
        return f"{facts} (default)" if facts else "default"
    if spec in hub:
        name, size = hub[spec]
        facts = file_facts(name, size, folder=not name.endswith(".gguf"))
        return f"{facts} ({spec.removeprefix('hf:').partition(':')[0]})"
    if spec.startswith("hf:"):
        return spec
    facts = local_facts(Path(spec).expanduser())
    return f"{facts} ({spec})" if facts else spec


def choices(current: str) -> list[tuple[str, str]]:
    """``available`` for the page's picker: (label, spec), each label naming the model, its quantization and size."""
    hub = hub_models()
    specs = list(dict.fromkeys([current, "default", *recent(), *hub]))
    return [(model_label(spec, hub), spec) for spec in specs]
