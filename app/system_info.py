"""The device panel: what the model runs on and how much memory it takes."""

from __future__ import annotations

from ppd_core.engine import chains_text, describe, memory_of


def gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def weights_label(loaded) -> str:
    """How the weights are stored, and whether that was the automatic choice."""
    return {"none": "not quantized", "4bit": "bitsandbytes NF4", "8bit": "bitsandbytes int8",
            "gguf": "the GGUF file's own quantization, run by llama.cpp"}.get(loaded.quant, loaded.quant)


def guess_sources(engine) -> str:
    """Which sources guess in a PPD step: the prompt tokens' tree, lookup chains, both, or none."""
    summary = engine.tree_summary()
    sources = []
    if summary["candidates"] or summary["prompt_tokens"]:
        sources.append(f"prompt tokens ({summary['candidates']} candidates, {summary['prompt_tokens']} prompt tokens per step)")
    chains = summary["lookup_chain_by_match_length"]
    if any(chains):
        sources.append(f"n-gram lookup in the conversation ({chains_text(chains)})")
    return " + ".join(sources) if sources else "nothing: calibration chose plain decoding"


def prompt_tokens_line(tokens) -> str:
    if not tokens.num_prompt_tokens:
        return "**Prompt tokens:** none for this model (guesses come from the conversation; `ppd train` makes them)"
    trained = "trained" if tokens.training.get("trained") else "untrained"
    return (f"**Prompt tokens:** {tokens.num_bytes:,} bytes ({tokens.num_prompt_tokens} x {tokens.ensemble_size} "
            f"embeddings, {trained})")


def backend_line(engine) -> str:
    """What decodes, with its settings."""
    kernels = engine.loaded.kernels
    if kernels["backend"] == "llamacpp":
        offload = f"{kernels['gpu_layers']} layers on the GPU" if kernels["gpu_layers"] else "CPU"
        line = (f"**Backend:** llama.cpp (llama-cpp-python {kernels['llama_cpp_python']}, {offload}, "
                f"{kernels['threads']} threads, flash attention, {kernels['kv_cache'].upper()} KV cache)")
    else:
        line = f"**Backend:** torch ({kernels.get('forward', 'transformers')} forward)"
    return line


def policy_line(engine) -> str:
    """The device policy's choices that apply to this backend."""
    policy = engine.device_policy()
    sources = {"system": "the system (psutil)", "unified": "unified memory (psutil, /proc/meminfo)",
               "nvml": "NVML, by the GPU's UUID", "cuda": "torch.cuda.mem_get_info"}
    line = f"**Device policy:** memory read from {sources[policy['memory_source']]}"
    if engine.loaded.backend.name == "torch":
        dtype = policy["compute_dtype"] + (" (native bf16)" if policy["native_bf16"] else "")
        line += f"; compute dtype {dtype} (running {str(engine.loaded.dtype).removeprefix('torch.')}); {policy['attention']}"
    return line + "".join(f"; {note}" for note in policy["version_notes"])


def device_panel(engine) -> str:
    """Markdown for the device panel."""
    loaded = engine.loaded
    info = describe(loaded.device, engine.threads)
    memory = memory_of(loaded.device)
    lines = [
        f"**Device:** {info.name} ({info.kind}, {info.threads} threads)" + (f", driver {info.driver}" if info.driver else ""),
        f"**{memory.label}:** {gib(memory.used_bytes)} used of {gib(memory.total_bytes)}",
        f"**Model:** {loaded.name}, {gib(loaded.num_bytes)} ({weights_label(loaded)}, "
        f"{str(loaded.dtype).removeprefix('torch.')}, {loaded.forward} forward)",
        backend_line(engine),
        prompt_tokens_line(engine.prompt_tokens),
        f"**Chat template:** {loaded.template_note or 'the model' + chr(39) + 's own'}",
        "**Tree:** {name}, {tokens_per_step} tokens per step".format(**engine.tree_summary()),
        f"**Guesses from:** {guess_sources(engine) if not engine.plain_only else loaded.backend.tree_note}",
        f"**Exactness:** {engine.exactness()}",
        policy_line(engine),
    ]
    if loaded.device_kind == "cpu" and not loaded.kernels.get("gpu_layers"):
        lines.append("*Running on the CPU.*")
    return "  \n".join(lines)
