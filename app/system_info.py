"""The device panel: what the model runs on and how much memory it takes."""

from __future__ import annotations

from ppd_core import ModelSnapshot, PromptTokensInfo, chains_text, describe, memory_of


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
    if model.backend == "torch":
        dtype = policy["compute_dtype"] + (" (native bf16)" if policy["native_bf16"] else "")
        line += f"; compute dtype {dtype} (running {model.dtype}); {policy['attention']}"
    return line + "".join(f"; {note}" for note in policy["version_notes"])


def device_panel(model: ModelSnapshot) -> str:
    """Markdown for the device panel, from a snapshot of the loaded model."""
    device = model.device if model.device_kind == "cuda" else "cpu"
    info = describe(device if device == "cpu" else _torch_device(device), model.threads)
    memory = memory_of(device if device == "cpu" else _torch_device(device))
    lines = [
        f"**Device:** {info.name} ({info.kind}, {info.threads} threads)" + (f", driver {info.driver}" if info.driver else ""),
        f"**{memory.label}:** {gib(memory.used_bytes)} used of {gib(memory.total_bytes)}",
        f"**Model:** {model.name}, {gib(model.weights_bytes)} ({weights_label(model)}, {model.dtype}, "
        f"{model.forward} forward)",
        backend_line(model),
        prompt_tokens_line(model.prompt_tokens),
        f"**Chat template:** {model.template_note or 'the model' + chr(39) + 's own'}",
        "**Tree:** {name}, {tokens_per_step} tokens per step".format(**model.tree),
        f"**Steps:** {model.tree.get('step_policy', 'each its own shape')}",
        f"**Guesses from:** {guess_sources(model)}",
        f"**Exactness:** {model.exactness}",
        policy_line(model),
    ]
    if model.device_kind == "cpu" and not model.kernels.get("gpu_layers"):
        lines.append("*Running on the CPU.*")
    return "  \n".join(lines)


def _torch_device(name: str):
    import torch  # noqa: PLC0415 - a torch model on a GPU: torch is loaded already

    return torch.device(name)
