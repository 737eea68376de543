"""Device policy: what ppd does on a device, as pure functions of the device's properties.

Every choice that depends on the hardware is made here and nowhere else: the compute dtype, where
free memory is read, which fields key a calibration profile, whether tree rows are bitwise plain
steps, which attention kernels a step uses, and how much context fits. ``cpu_properties`` is the only
part that reads a live device (``device_info.properties_of`` reads any); everything else takes a
``DeviceProperties`` record, so an
RTX 4090, an RTX 2060, a Jetson Orin Nano and a CPU are all tested here on a machine without a GPU.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

MIN_CONTEXT = 2048  # a model whose weights leave less room than this for the KV cache is refused
MEMORY_HEADROOM = 0.9  # use at most this share of the free memory (allocator slack, activations)


@dataclass(frozen=True)
class DeviceProperties:
    """What the policy needs to know of a device (one record per CPU or GPU)."""

    kind: str  # "cpu" or "cuda"
    name: str
    total_memory_bytes: int
    compute_capability: tuple[int, int] | None = None  # CUDA only, e.g. (8, 9) for an RTX 4090
    integrated: bool = False  # the GPU shares the system's memory (Jetson)
    uuid: str | None = None  # NVML's id of a CUDA device ("GPU-..."): names it under any CUDA_VISIBLE_DEVICES
    threads: int = 1  # CPU threads the model runs on
    torch_version: tuple[int, int] = (2, 13)


@dataclass(frozen=True)
class AttentionPlan:
    """Which SDPA calls a step makes (``ppd_core/backends/torch/lean/attention.py`` carries them out)."""

    causal_prefill: bool  # a prefill from an empty cache uses ``is_causal`` (flash kernel) instead of a mask
    gqa: str  # "native": SDPA's ``enable_gqa``; "folded": query groups folded into rows (no repeated K/V);
    #           "repeat": K/V repeated per group (torch < 2.5 without a mask only)
    masked_gqa: str  # how a masked call (tree step, prefill after a cache) handles query groups: "native" or "folded"
    masked_prefill_rows: int | None = None  # a prefill after a cache runs in chunks of this many rows (bounds its mask)

    def describe(self) -> str:
        prefill = "is_causal" if self.causal_prefill else "a causal mask"
        return f"prefill with {prefill}; GQA {self.gqa}; masked steps GQA {self.masked_gqa}"


def native_bf16(properties: DeviceProperties) -> bool:
    """bf16 runs in hardware: Ampere (compute capability 8.0) and newer. ``torch.cuda.is_bf16_supported()``
    also says yes where it is emulated (RTX 20, GTX 10), which is slow."""
    capability = properties.compute_capability
    return properties.kind == "cuda" and capability is not None and capability >= (8, 0)


def compute_dtype(properties: DeviceProperties) -> str:
    """fp32 on a CPU (its bf16 matmuls scale badly with tree size), native bf16 on a GPU, else fp16."""
    if properties.kind != "cuda":
        return "float32"
    return "bfloat16" if native_bf16(properties) else "float16"


def memory_source(properties: DeviceProperties) -> str:
    """Where free and used memory are read: "system" (psutil) on a CPU; "unified" (psutil and /proc/meminfo,
    reclaimable memory included) on a GPU that shares the system's memory (Jetson: NVML does not work there,
    and ``cudaMemGetInfo`` leaves out the page cache); "nvml" on a discrete GPU NVML can name by UUID;
    "cuda" (``torch.cuda.mem_get_info``) otherwise."""
    if properties.kind != "cuda":
        return "system"
    if properties.integrated:
        return "unified"
    return "nvml" if properties.uuid else "cuda"


def profile_fields(properties: DeviceProperties, driver: str = "", offloaded: bool = False) -> dict:
    """The device part of a calibration profile's key: the fields that change the latency curve. CPU threads do
    on a CPU; on a GPU, or with every llama.cpp layer offloaded (``offloaded``), they barely do, so a chat and a
    bench with other thread counts share one profile there, while the compute capability tells two cards of
    one marketing name apart."""
    fields = {"kind": properties.kind, "name": properties.name, "memory_bytes": properties.total_memory_bytes,
              "driver": driver}
    if properties.kind == "cuda":
        fields["compute_capability"] = ".".join(map(str, properties.compute_capability or (0, 0)))
        fields["integrated"] = properties.integrated
    elif not offloaded:
        fields["threads"] = properties.threads
    return fields


def rows_bitwise(properties: DeviceProperties, gpu_layers: int = 0) -> bool:
    """Whether llama.cpp's tree step rows can get exactly the logits a 1-token step gives them, so greedy PPD equals
    plain decoding bit for bit: on a CPU with nothing offloaded (Q8_0 cache, flash attention; each file's kernels are
    then probed at load: ``LlamaCppDecoder.rows_match_single_steps``). GPU kernels pick other reduction orders for
    other row counts, as torch's matmuls do everywhere (its wing says not bitwise): there output is equal up to
    floating-point near-ties."""
    return properties.kind == "cpu" and gpu_layers == 0


def attention_plan(properties: DeviceProperties) -> AttentionPlan:
    """The SDPA calls of the lean forward on this device.

    CUDA: with a boolean or additive mask and ``enable_gqa``, SDPA falls back to its math kernel, which
    repeats the cache per query group and builds a full fp32 [heads, T, S] score matrix (about 2.4 GB for an
    8k prompt). So a fresh prefill passes no mask (``is_causal``: flash), masked calls fold each group's
    queries into rows over the shared K/V, which the memory-efficient kernel takes with the mask as is, and a
    prefill after a cache (a follow-up) runs 512 rows at a time, so its mask stays small.
    CPU: SDPA's native GQA with masks, as measured and tested here. torch < 2.5 has no ``enable_gqa``:
    masked calls fold, unmasked ones repeat K/V (linear memory).
    """
    has_gqa = properties.torch_version >= (2, 5)
    if properties.kind == "cuda":  # a follow-up's mask: [groups x 512, context] booleans, not [groups x prompt, context]
        return AttentionPlan(causal_prefill=True, gqa="native" if has_gqa else "repeat", masked_gqa="folded",
                             masked_prefill_rows=512)
    return AttentionPlan(causal_prefill=False, gqa="native" if has_gqa else "repeat",
                         masked_gqa="native" if has_gqa else "folded")


def llama_extra_buffers(system_info: str) -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types. Not on a build with AMX (Intel
    Sapphire Rapids and newer): its AMX matmul segfaults at the first decode there (seen on this project's
    Xeon; ggml-org/llama.cpp#20824, still open), and without the extra buffers the AVX-512 kernels run."""
    return "AMX_INT8 = 1" not in system_info


def policy_summary(properties: DeviceProperties) -> dict:
    """The policy's choices for a device, as the device panel and `ppd doctor` report them."""
    return {"compute_dtype": compute_dtype(properties), "native_bf16": native_bf16(properties),
            "attention": attention_plan(properties).describe(), "memory_source": memory_source(properties),
            "version_notes": version_notes(properties)}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys and values of one position in every layer."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def context_that_fits(weights_bytes: int, staging_bytes: int, per_token_bytes: int, max_positions: int,
                      free_bytes: int) -> int:
    """The longest context (up to the model's) whose KV cache fits beside the weights and the loading's staging
    in ``MEMORY_HEADROOM`` of the free memory; 0 when not even ``MIN_CONTEXT`` (or the model's context) fits."""
    room = MEMORY_HEADROOM * free_bytes - weights_bytes - staging_bytes
    if room <= 0:
        return 0
    context = min(max_positions, int(room // max(per_token_bytes, 1)))
    return context if context >= min(MIN_CONTEXT, max_positions) else 0


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "2.13.0+cpu" or "2.1.0a0+41361538.nv23.06"."""
    parts = (text.split("+")[0].split(".") + ["0", "0"])[:2]
    return tuple(int("".join(ch for ch in part if ch.isdigit()) or 0) for part in parts)  # type: ignore[return-value]


def cpu_properties(threads: int = 1) -> DeviceProperties:
    """This machine's CPU, read without torch (the GGUF path never imports it)."""
    import psutil

    return DeviceProperties("cpu", cpu_name(), int(psutil.virtual_memory().total), threads=threads)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvml_uuid(torch_uuid: str) -> str:
    """NVML's form of a device UUID: torch prints "58c5...", NVML names it "GPU-58c5..."."""
    return torch_uuid if torch_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{torch_uuid}"


def version_notes(properties: DeviceProperties) -> list[str]:
    """One line per feature this torch lacks, with the fallback ppd takes (older JetPack builds)."""
    version = ".".join(map(str, properties.torch_version))
    notes = []
    if properties.torch_version < (2, 4):
        notes.append(f"torch {version} has no F.rms_norm (2.4+): the lean forward uses the same norm in plain ops")
    if properties.torch_version < (2, 5):
        notes.append(f"torch {version} has no enable_gqa in SDPA (2.5+): grouped queries are folded into rows "
                     "(masked steps) or keys and values repeated per group (prefill)")
    return notes
