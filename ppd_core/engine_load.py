"""The load sequence: the model, its prompt tokens, the tree, and the profile (or a calibration).

    engine = load_engine(Engine, EngineConfig(model="default"), progress)   # what Engine.load does
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import platformdirs

from ppd_core import hub
from ppd_core.calibration.calibrate import Progress
from ppd_core.errors import PpdError
from ppd_core.faults import fault
from ppd_core.loading import DEFAULT_NAME, LoadedModel, load_model
from ppd_core.options import MAX_LOOKUP
from ppd_core.prompt_tokens import PromptTokenError, PromptTokens, signature_of
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, vanilla_family

ASSETS = Path(__file__).resolve().parent.parent / "assets"
SHIPPED_PROMPT_TOKENS = {DEFAULT_NAME: ASSETS / "smollm2-135m-instruct.prompt-tokens.safetensors"}
NO_PROMPT_TOKENS = "none"  # as the prompt-token file: decode with lookup guesses only

log = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    model: str = "default"
    prompt_tokens: str | None = None  # a prompt-token file, or "none"; None: the user's, else the shipped one
    quant: str = "auto"  # a GGUF: its own; a Hugging Face model: none, 4bit or 8bit (bitsandbytes)
    device: str = "auto"
    dtype: str = "auto"
    forward: str = "lean"  # "lean" (Llama-family fast path, where supported) or "transformers"
    tree: str = "auto"  # "auto" (the device profile), a static tree name, or a token budget like "12"
    auto_calibrate: bool = True  # "auto" without a profile: calibrate now (else use the default static tree)
    max_context: int | None = None  # default: the model's
    threads: int = 0  # CPU threads (llama.cpp's; torch's process-wide); 0: one per core
    lookup: int | str | None = None  # n-gram lookup chains: None, learnt per conversation from the profile's figures;
    # "fixed", the profile's lengths; 0, none; N, up to N
    backend: str = "auto"  # "auto": llama.cpp for a GGUF file, torch for a Hugging Face model; "torch" on a GGUF: de-quantized
    gpu_layers: int | None = None  # llama.cpp: layers offloaded to the GPU (None: all, on a GPU build)


def user_prompt_tokens_dir() -> Path:
    """Where `ppd train` writes prompt tokens by default, and where the engine looks for a model's first."""
    return Path(platformdirs.user_data_dir("ppd")) / "prompt-tokens"


def user_prompt_tokens_path(model_name: str, signature: list[float]) -> Path:
    """The file `ppd train` writes for a model: named by the model and its embedding table's fingerprint, so two
    models of one name never share a file (the engine finds tokens by that fingerprint, whatever the name)."""
    digest = hashlib.sha256(json.dumps(signature).encode()).hexdigest()[:12]
    return user_prompt_tokens_dir() / f"{model_name}-{digest}.safetensors"


def model_signature(loaded: LoadedModel) -> list[float]:
    """The loaded model's embedding fingerprint (``signature_of``), as prompt-token files record it."""
    return signature_of(loaded.backend.embedding_rows, loaded.backend.vocab_size)


def users_prompt_tokens(signature: list[float], vocab: int, hidden: int, name: str) -> PromptTokens | None:
    """The newest of the user's prompt-token files made for this embedding table, if any (unreadable ones skipped)."""
    files = sorted(user_prompt_tokens_dir().glob("*.safetensors"), key=lambda f: f.stat().st_mtime, reverse=True)
    for file in files:
        try:
            tokens = PromptTokens.load(file)
            tokens.check_signature(signature, vocab, hidden, name)
        except PromptTokenError:
            continue
        return tokens
    return None


def resolve_prompt_tokens(loaded: LoadedModel, path: str | None) -> PromptTokens:
    """The given file, else the user's own made for this model's embedding table (``users_prompt_tokens``), else
    one shipped for that table, else (or for ``path`` "none") none: then the n-gram lookup guesses alone. A given
    file made for another model is refused in one line."""
    backend = loaded.backend
    signature = model_signature(loaded)
    hidden = backend.embedding_rows(np.array([0])).shape[-1]
    if path == NO_PROMPT_TOKENS:
        return PromptTokens.none(signature, backend.vocab_size, hidden, loaded.name)
    if not backend.accepts_embeddings:
        log.warning("%s reads its token embeddings in ways an input row cannot stand in for: guessing from the "
                    "conversation only (n-gram lookup)", loaded.name)
        return PromptTokens.none(signature, backend.vocab_size, hidden, loaded.name)
    if path is not None:
        tokens = PromptTokens.load(path)
        tokens.check_signature(signature, backend.vocab_size, hidden, loaded.name)
        return tokens
    own = users_prompt_tokens(signature, backend.vocab_size, hidden, loaded.name)
    if own is not None:
        return own
    for shipped in SHIPPED_PROMPT_TOKENS.values():  # by fingerprint too: a renamed copy of the default model has them
        if shipped.is_file():
            tokens = PromptTokens.load(shipped)
            try:
                tokens.check_signature(signature, backend.vocab_size, hidden, loaded.name)
            except PromptTokenError:
                continue
            return tokens
    log.warning("no prompt tokens for %s: guessing from the conversation only (n-gram lookup); "
                "`ppd train` makes prompt tokens", loaded.name)
    return PromptTokens.none(signature, backend.vocab_size, hidden, loaded.name)


def check_tree_name(tree: str) -> None:
    if tree != "auto" and tree not in STATIC_TREES and not (tree.isdigit() and int(tree) >= 1):
        raise PpdError(f"unknown tree {tree!r}; use auto, {', '.join(STATIC_TREES)} or a token budget such as 12")


def load_engine(cls, config: EngineConfig, progress: Progress | None = None):
    """``cls(...)`` (the ``Engine``) for ``config``: the model loaded, its prompt tokens found, the tree picked from the
    saved profile (or a calibration, with ``auto_calibrate``). A failure after the model loaded frees it first."""
    check_tree_name(config.tree)
    if config.lookup not in (None, "fixed") and not (isinstance(config.lookup, int) and 0 <= config.lookup <= MAX_LOOKUP):
        raise PpdError(f"lookup must be auto, fixed, 0 (off) or a chain length up to {MAX_LOOKUP}, got {config.lookup}")
    if config.threads < 0:
        raise PpdError(f"threads must be positive (or 0 for one per core), got {config.threads}")
    hub_model = hub.parse(config.model)
    if hub_model is not None:  # downloaded here, where the progress is heard; load_model finds it fetched
        hub.fetch(hub_model, progress)
        if progress is not None:
            progress("loading the model", 0, 0)
    loaded = load_model(config.model, config.quant, config.device, config.dtype, config.forward, config.backend,
                        config.threads, config.gpu_layers)
    try:
        return _with_tree(cls, loaded, config, progress)
    except BaseException:  # nothing of a failed load stays in memory
        loaded.backend.close()
        raise


def _with_tree(cls, loaded: LoadedModel, config: EngineConfig, progress: Progress | None):
    """The engine on ``loaded``: prompt tokens, the tree, the profile."""
    if config.threads and loaded.backend.name == "torch":  # before calibration: profiles are per thread count
        import torch  # noqa: PLC0415 - the torch backend's process-wide setting

        torch.set_num_threads(config.threads)
    fault("load.prompt_tokens")
    prompt_tokens = resolve_prompt_tokens(loaded, config.prompt_tokens)
    n, V = prompt_tokens.num_prompt_tokens, prompt_tokens.ensemble_size
    if not n and config.tree in STATIC_TREES:
        raise PpdError(f"--tree {config.tree} needs prompt tokens, and {loaded.name} has none: use --tree auto "
                       "(n-gram lookup only) or train them with `ppd train`")
    # a static tree where one is asked for; else plain steps until a profile says otherwise (an uncalibrated tree
    # can be slower than plain decoding on a CPU: 0.66x measured for the medium tree on a 2-core Xeon)
    static = config.tree in STATIC_TREES
    family = family_from_spec(config.tree, STATIC_TREES[config.tree], n, V) if static else vanilla_family()
    max_context = min(config.max_context or loaded.max_context, loaded.max_context)
    engine = cls(loaded, prompt_tokens, family, max_context)
    engine.set_lookup(config.lookup)
    if engine.plain_only:
        log.warning(loaded.backend.tree_note)
    elif config.tree not in STATIC_TREES:
        profile = engine.saved_profile()
        if profile is None and config.auto_calibrate:
            profile = engine.calibrate(progress)
        if profile is not None:
            engine.use_profile(profile, None if config.tree == "auto" else int(config.tree))
        elif config.tree != "auto":
            raise PpdError(f"--tree {config.tree} needs a calibration profile (run `ppd calibrate`)")
        else:  # answers do not wait for a calibration: plain steps, and chains learnt from the shipped figures
            engine.awaiting_calibration = True
    return engine

