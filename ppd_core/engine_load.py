"""The load sequence: the model, its prompt tokens, and the decode plan the options make before any profile.

    parts = load_parts(EngineConfig(model="default"), progress)   # Engine.load's first half, before the profile
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import platformdirs

from ppd_core.backends.llamacpp.library import LIVE_MODELS
from ppd_core.calibration.calibrate import calibrate_and_save, find_profile
from ppd_core.errors import PpdError
from ppd_core.faults import fault
from ppd_core.loading import DEFAULT_NAME, LoadedModel, load_model
from ppd_core.options import MAX_LOOKUP, BackendChoice
from ppd_core.plan import DecodePlan, Guesses, PlanOptions, make_plan
from ppd_core.progress import Progress
from ppd_core.drafters.prompt_tokens import PromptTokenError, PromptTokens, signature_of
from ppd_core.static_trees import STATIC_TREES

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
    backend: BackendChoice = "auto"  # "auto": llama.cpp for a GGUF file, torch for a Hugging Face model; "torch" on a GGUF: de-quantized
    gpu_layers: int | None = None  # llama.cpp: layers offloaded to the GPU (None: all, on a GPU build)
    drafters: tuple[str, ...] | None = None  # the guess sources beside the prompt tokens (None: the default ones)


@dataclass(frozen=True)
class EngineParts:
    """A loaded model, its prompt tokens, the plan the options make before any profile, and the context to use."""

    loaded: LoadedModel
    prompt_tokens: PromptTokens
    plan: DecodePlan
    max_context: int


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
    return signature_of(loaded.backend.embedding_rows, loaded.info.vocab_size)


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
        return PromptTokens.none(signature, backend.info.vocab_size, hidden, loaded.name)
    if not backend.info.accepts_embeddings:
        log.warning("%s reads its token embeddings in ways an input row cannot stand in for: guessing from the "
                    "conversation only (n-gram lookup)", loaded.name)
        return PromptTokens.none(signature, backend.info.vocab_size, hidden, loaded.name)
    if path is not None:
        tokens = PromptTokens.load(path)
        tokens.check_signature(signature, backend.info.vocab_size, hidden, loaded.name)
        return tokens
    own = users_prompt_tokens(signature, backend.info.vocab_size, hidden, loaded.name)
    if own is not None:
        return own
    for shipped in SHIPPED_PROMPT_TOKENS.values():  # by fingerprint too: a renamed copy of the default model has them
        if shipped.is_file():
            tokens = PromptTokens.load(shipped)
            try:
                tokens.check_signature(signature, backend.info.vocab_size, hidden, loaded.name)
            except PromptTokenError:
                continue
            return tokens
    log.warning("no prompt tokens for %s: guessing from the conversation only (n-gram lookup); "
                "`ppd train` makes prompt tokens", loaded.name)
    return PromptTokens.none(signature, backend.info.vocab_size, hidden, loaded.name)


def check_tree_name(tree: str) -> None:
    if tree != "auto" and tree not in STATIC_TREES and not (tree.isdigit() and int(tree) >= 1):
        raise PpdError(f"unknown tree {tree!r}; use auto, {', '.join(STATIC_TREES)} or a token budget such as 12")


def load_parts(config: EngineConfig, progress: Progress | None = None) -> EngineParts:
    """What an ``Engine`` for ``config`` is made of: the model loaded, its prompt tokens found, the plan made from the
    options alone (``Engine.load`` then gives it its profile). A failure after the model loaded frees it first."""
    check_tree_name(config.tree)
    if config.lookup not in (None, "fixed") and not (isinstance(config.lookup, int) and 0 <= config.lookup <= MAX_LOOKUP):
        raise PpdError(f"lookup must be auto, fixed, 0 (off) or a chain length up to {MAX_LOOKUP}, got {config.lookup}")
    if config.threads < 0:
        raise PpdError(f"threads must be positive (or 0 for one per core), got {config.threads}")
    loaded = load_model(config.model, config.quant, config.device, config.dtype, config.forward, config.backend,
                        config.threads, config.gpu_layers, progress)  # a Hub model's download is heard by progress
    try:
        return _with_tree(loaded, config)
    except BaseException:  # nothing of a failed load stays in memory
        loaded.backend.close()
        raise


def _with_tree(loaded: LoadedModel, config: EngineConfig) -> EngineParts:
    """The engine on ``loaded``: its prompt tokens, and a static tree's plan or plain steps until a profile."""
    if config.threads:  # before calibration: profiles are per thread count
        loaded.backend.set_threads(config.threads)
    fault("load.prompt_tokens")
    prompt_tokens = resolve_prompt_tokens(loaded, config.prompt_tokens)
    n, V = prompt_tokens.num_prompt_tokens, prompt_tokens.ensemble_size
    if not n and config.tree in STATIC_TREES:
        raise PpdError(f"--tree {config.tree} needs prompt tokens, and {loaded.name} has none: use --tree auto "
                       "(n-gram lookup only) or train them with `ppd train`")
    # a static tree where one is asked for; else plain steps until a profile says otherwise (an uncalibrated tree
    # can be slower than plain decoding on a CPU: 0.66x measured for the medium tree on a 2-core Xeon)
    static = config.tree in STATIC_TREES
    guesses = Guesses(n, V, loaded.info.tree_note is not None)
    plan = make_plan(None, PlanOptions(config.tree if static else "auto", config.lookup), guesses)
    max_context = min(config.max_context or loaded.max_context, loaded.max_context)
    if guesses.plain_only:
        log.warning(loaded.info.tree_note)
    return EngineParts(loaded, prompt_tokens, plan, max_context)


def settle_plan(parts: EngineParts, tree: str, auto_calibrate: bool, progress: Progress | None = None) -> DecodePlan:
    """A newly loaded model's plan with its profile for ``--tree`` ``tree`` ("auto" or a budget; a static tree needs
    none): the saved one, else a calibration now (with ``auto_calibrate``). "auto" without either decodes plainly, with
    chains learnt from the shipped figures, until calibrated."""
    plan = parts.plan
    if plan.guesses.plain_only or tree in STATIC_TREES:
        return plan
    profile = find_profile(parts.loaded, parts.prompt_tokens)
    if profile is None and auto_calibrate:
        profile = calibrate_and_save(parts.loaded, parts.prompt_tokens, progress)
    if profile is None and tree != "auto":
        raise PpdError(f"--tree {tree} needs a calibration profile (run `ppd calibrate`)")
    return make_plan(profile, replace(plan.options, tree=tree), plan.guesses)


def live_llama_cpp_models() -> int:
    """llama.cpp models loaded in this process now (``/health`` reports it: a failed load must leave none behind)."""
    return len(LIVE_MODELS)
