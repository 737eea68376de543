"""The device panel: what the model runs on and how much memory it takes."""

from __future__ import annotations

from ppd_core import ModelSnapshot, PromptTokensInfo
from ppd_core.device_info import describe
from ppd_core.drafters.lookup import chains_text


def gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def weights_label(model: ModelSnapshot) -> str:
    """How the weights are stored."""
    return {"none": "not quantized", "4bit": "bitsandbytes NF4", "8bit": "bitsandbytes int8",
            "gguf": "the GGUF file's own quantization, run by llama.cpp"}.get(model.quant, model.quant)


def guess_sources(model: ModelSnapshot) -> str:
    """Which sources guess in a PPD step: the prompt tokens' tree, lookup chains, both, or none."""
    if model.plain_only:
        return model.plain_only
    summary = model.tree
    sources = []
    if summary["candidates"] or summary["prompt_tokens"]:
        sources.append(f"prompt tokens ({summary['candidates']} candidates, {summary['prompt_tokens']} prompt tokens per step)")
    chains = summary["lookup_chain_by_match_length"]
    if summary.get("lookup_policy") == "adaptive":
        sources.append(f"n-gram lookup in the conversation (chains learnt per conversation, starting from calibration's "
                       f"{chains_text(chains)})")
    elif any(chains):
        sources.append(f"n-gram lookup in the conversation ({chains_text(chains)})")
    if sources:
        return " + ".join(sources)
    return "nothing: calibration chose plain decoding" if model.profile is not None else "nothing yet: plain decoding until calibrated"


def prompt_tokens_line(tokens: PromptTokensInfo) -> str:
    if not tokens.count:
        return "**Prompt tokens:** none for this model (guesses come from the conversation; `ppd train` makes them)"
    trained = "trained" if tokens.trained else "untrained"
    return f"**Prompt tokens:** {tokens.bytes:,} bytes ({tokens.count} x {tokens.ensemble_size} embeddings, {trained})"


def backend_line(model: ModelSnapshot) -> str:
    """What decodes, with its settings."""
    kernels = model.kernels
    if kernels["backend"] == "llamacpp":
        offload = f"{kernels['gpu_layers']} layers on the GPU" if kernels["gpu_layers"] else "CPU"
        return (f"**Backend:** llama.cpp (llama-cpp-python {kernels['llama_cpp_python']}, {offload}, "
                f"{kernels['threads']} threads, flash attention, {kernels['kv_cache'].upper()} KV cache)")
    return f"**Backend:** torch ({kernels.get('forward', 'transformers')} forward)"


def policy_line(model: ModelSnapshot) -> str:
    """The device policy's choices that apply to this backend."""
    policy = model.device_policy
    sources = {"system": "the system (psutil)", "unified": "unified memory (psutil, /proc/meminfo)",
               "nvml": "NVML, by the GPU's UUID", "cuda": "torch.cuda.mem_get_info"}
    line = f"**Device policy:** memory read from {sources[policy['memory_source']]}"
    if model.info.policy_dtype:
        dtype = policy["compute_dtype"] + (" (native bf16)" if policy["native_bf16"] else "")
        line += f"; compute dtype {dtype} (running {model.dtype}); {policy['attention']}"
    return line + "".join(f"; {note}" for note in policy["version_notes"])


def device_panel(model: ModelSnapshot) -> str:
    """Markdown for the device panel, from a snapshot of the loaded model: what runs where and what PPD does, in plain
    words; the figures (backend settings, tree sizes, step costs, chain lengths, policy) behind a Details toggle."""
    info = describe(model.info.properties)
    memory = model.info.read_memory()
    surface = [
        f"**Device:** {info.name} ({info.kind}, {info.threads} threads)" + (f", driver {info.driver}" if info.driver else ""),
        f"**{memory.label}:** {gib(memory.used_bytes)} used of {gib(memory.total_bytes)}",
        f"**Model:** {model.name}, {gib(model.weights_bytes)} ({weights_label(model)})",
        f"**PPD guesses:** {guess_words(model)}",
        f"**Steps:** {step_words(model)}",
        f"**Answers:** the same as plain decoding, {'token for token' if model.bitwise else 'but for rare near-ties'}",
    ]
    if not model.info.on_gpu:
        surface.append("*Running on the CPU.*")
    details = [
        backend_line(model),
        f"**Weights:** {model.dtype}, {model.forward} forward",
        prompt_tokens_line(model.prompt_tokens),
        f"**Chat template:** {model.template_note or 'the model' + chr(39) + 's own'}",
        "**Tree:** {name}, {tokens_per_step} tokens per step".format(**model.tree),
        f"**Step policy:** {model.tree.get('step_policy', 'each its own shape')}",
        f"**Guesses from:** {guess_sources(model)}",
        f"**Exactness:** {model.exactness}",
        policy_line(model),
    ]
    return "  \n".join(surface) + "\n\n<details><summary>Details</summary>\n\n" + "  \n".join(details) + "\n\n</details>"


def guess_words(model: ModelSnapshot) -> str:
    """``guess_sources`` in plain words, no figures."""
    if model.plain_only:
        return "none: this model decodes one token per step"
    summary = model.tree
    sources = ["the model's prompt tokens"] if summary["candidates"] or summary["prompt_tokens"] else []
    if summary.get("lookup_policy") == "adaptive" or any(summary["lookup_chain_by_match_length"]):
        sources.append("text repeated from the conversation")
    if sources:
        return " and ".join(sources)
    return "none: calibration found that guessing does not pay off here" if model.profile is not None else \
        "none until this device is calibrated"


def step_words(model: ModelSnapshot) -> str:
    """How decoding shapes its steps, in plain words (the step policy's costs are in Details)."""
    if model.profile is None:
        return ("one token at a time until this device is calibrated" if model.tree["name"] == "plain" else
                "a built-in tree of guesses checked with each next token (not calibrated for this device)")
    kind = getattr(model.profile.policy, "kind", "trees")
    if kind == "fixed":
        return "every step the same size, the fastest way on this GPU"
    if kind == "plain":
        return "one token at a time: checking guesses does not pay off on this device"
    return "guesses checked together with the next token, each step as large as pays off on this device"

