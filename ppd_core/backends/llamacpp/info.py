"""What a GGUF file is, read from its header before llama.cpp loads it, and whether it fits in memory.

``gguf.GGUFReader`` materialises every metadata value as NumPy arrays (the vocabulary and merges
included): about 1.9 s and 160 MB for the 100 MB default model. ``read_gguf_info`` walks the header
of a memory-mapped file instead, keeping the scalar and string values and the few small arrays it
needs (per-layer head counts) and skipping the others by their lengths: a few tens of milliseconds,
and only the header's pages are read. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
(versions 2 and 3, the ones llama.cpp reads).

The file is checked the way llama.cpp would refuse it, with one line naming the file: not a GGUF
file, truncated (the header, or the last tensor's data, ends past the end of the file), or an
architecture llama.cpp does not know. llama.cpp has no API listing its architectures and says why a
load failed only in its log, so the names are kept here (``LLAMA_CPP_ARCHITECTURES``, from the
llama.cpp vendored by the pinned llama-cpp-python) and the check is made only when that version is
the installed one; with any other version llama.cpp's own load decides.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES

from ppd_core.errors import PpdError

# llama.cpp's LLM_ARCH_NAMES (src/llama-arch.cpp) in llama-cpp-python 0.3.36 (vendored llama.cpp 0c1e570); "clip"
# is left out: llama.cpp names it only for llama-quantize (a vision projector, not a model it can load)
ARCHITECTURES_VERSION = "0.3.36"
LLAMA_CPP_ARCHITECTURES = (
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan", "starcoder", "refact",
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert",
    "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl",
    "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3",
    "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4",
    "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba", "mamba2", "maple", "jamba", "falcon-h1", "xverse",
    "command-r", "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic",
    "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa",
    "bitnet", "t5", "t5encoder", "jais", "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4",
    "exaone-moe", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid",
    "graniteswitch", "granite_swa", "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2",
    "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe",
    "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "dream",
    "smallthinker", "llada", "llada-moe", "seed_oss", "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2",
    "minimax-m3", "cogvlm", "rnd1", "pangu-embedded", "mistral3", "eagle3", "dflash", "mistral4", "paddleocr",
    "mimo2", "step35", "spark2_5", "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie",
    "mellum", "nanbeige", "qwen3tts", "pockettts",
)

GIB = 1 << 30
# beyond the weights and the KV cache: llama.cpp's compute buffers, its output rows, and the Python process
COMPUTE_MARGIN_BYTES = 256 << 20
LOGIT_ROWS = 256  # rows of vocabulary-wide logits held at once (llama.cpp's output buffer plus a tree's compute rows)
KV_VALUE_BYTES = {"q8_0": 34 / 32, "f16": 2.0, "f32": 4.0}  # bytes per cached value (Q8_0: 34-byte blocks of 32)

VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # type: format
STRING, ARRAY = 8, 9
KEPT_ARRAY_LENGTH = 4096  # scalar arrays up to this long are kept (per-layer values); longer ones are skipped


class GgufFileError(PpdError):
    """A file llama.cpp cannot load as a model (not GGUF, truncated, unknown architecture); one line naming it."""


class NotEnoughMemoryError(PpdError):
    """The model and its KV cache do not fit in the memory that is free; one line."""


class _Truncated(Exception):
    """Internal: a read past the end of the file."""


@dataclass(frozen=True)
class GgufInfo:
    """A GGUF model's shape and recommendations, from its header."""

    path: Path
    architecture: str
    name: str | None
    file_size: int  # bytes
    context_length: int | None  # positions the model was trained for (llama.cpp's n_ctx_train)
    block_count: int
    embedding_length: int
    head_count: int | tuple[int, ...]  # a tuple where the file gives one per layer
    head_count_kv: int | tuple[int, ...]  # likewise; the model's head_count where the file has none
    key_length: int  # per head; embedding_length // head_count where the file has none
    value_length: int
    sliding_window: int | None
    vocab_size: int | None  # tokens in tokenizer.ggml.tokens
    has_chat_template: bool
    sampling: dict[str, object] = field(default_factory=dict)  # general.sampling.* keys, prefix removed
    tensor_count: int = 0
    data_end: int = 0  # byte offset where the last tensor's data ends

    def kv_heads(self, layer: int) -> int:
        """Key/value heads of ``layer``."""
        heads = self.head_count_kv
        return heads[layer] if isinstance(heads, tuple) else heads


def read_gguf_info(path: str | Path, check_architecture: bool = True) -> GgufInfo:
    """The header of the GGUF file at ``path``; GgufFileError (one line) where llama.cpp could not load it."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            if size < 4 or file.read(4) != b"GGUF":
                raise GgufFileError(f"{path.name} is not a GGUF file (it does not start with the GGUF magic bytes)")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
                values, tensor_count, data_end = _parse(view, path)
    except _Truncated:
        raise GgufFileError(f"{path.name} is truncated: its header ends past the end of the file "
                            f"({size} bytes); download it again") from None
    except OSError as error:
        raise GgufFileError(f"{path.name} cannot be read: {error.strerror or error}") from None
    if data_end > size:
        raise GgufFileError(f"{path.name} is truncated: its tensor data ends at byte {data_end} but the file has only "
                            f"{size} bytes; download it again")
    architecture = values.get("general.architecture")
    if not isinstance(architecture, str):
        raise GgufFileError(f"{path.name} names no model architecture (general.architecture): it is not a model file")
    if check_architecture and not known_architecture(architecture):
        raise GgufFileError(f"{path.name} has architecture '{architecture}', which this llama.cpp (llama-cpp-python "
                            f"{ARCHITECTURES_VERSION}) does not know")
    return _info(path, size, values, tensor_count, data_end)


def known_architecture(architecture: str) -> bool:
    """Whether the installed llama.cpp loads ``architecture``: by the name list where it is the version the list
    was taken from; True otherwise (llama.cpp's load then decides)."""
    try:
        installed = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        installed = None
    return architecture in LLAMA_CPP_ARCHITECTURES or installed != ARCHITECTURES_VERSION


def kv_cache_bytes(info: GgufInfo, context: int, kv_type: str = "q8_0") -> int:
    """Bytes of a KV cache for ``context`` positions: per layer and position, keys of n_head_kv * key_length
    values and values of n_head_kv * value_length (sliding-window layers included: ppd keeps every position)."""
    per_value = KV_VALUE_BYTES[kv_type]
    values_per_position = sum(info.kv_heads(layer) * (info.key_length + info.value_length)
                              for layer in range(info.block_count))
    return int(values_per_position * context * per_value)


def memory_needed(info: GgufInfo, context: int, kv_type: str = "q8_0") -> int:
    """Bytes to run ``info``'s model with a ``context``-position KV cache: the file, the cache and a margin."""
    logits = LOGIT_ROWS * (info.vocab_size or 0) * 4
    return info.file_size + kv_cache_bytes(info, context, kv_type) + COMPUTE_MARGIN_BYTES + logits


def available_memory() -> int:
    """Bytes of memory free for a new model now (psutil's ``available``: free plus reclaimable caches)."""
    import psutil  # noqa: PLC0415 - only the memory check needs it

    return int(psutil.virtual_memory().available)


def check_memory(info: GgufInfo, context: int, available_bytes: int | None = None, kv_type: str = "q8_0") -> None:
    """NotEnoughMemoryError where the model and a ``context``-position KV cache do not fit in ``available_bytes``
    (the memory free now where None)."""
    available = available_memory() if available_bytes is None else available_bytes
    needed = memory_needed(info, context, kv_type)
    if needed > available:
        raise NotEnoughMemoryError(
            f"{info.path.name} needs about {needed / GIB:.1f} GiB (the file and a {context}-token KV cache) "
            f"but only {available / GIB:.1f} GiB is free")


# --- the header walk --------------------------------------------------------------------------


class _Cursor:
    """Little-endian reads from a buffer, raising _Truncated past its end."""

    def __init__(self, buffer):
        self.buffer, self.position, self.size = buffer, 0, len(buffer)

    def read(self, fmt: str):
        width = struct.calcsize(fmt)
        if self.position + width > self.size:
            raise _Truncated
        value = struct.unpack_from("<" + fmt, self.buffer, self.position)[0]
        self.position += width
        return value

    def skip(self, count: int) -> None:
        if self.position + count > self.size:
            raise _Truncated
        self.position += count

    def string(self, keep: bool = True) -> str | None:
        length = self.read("Q")
        start = self.position
        self.skip(length)
        return bytes(self.buffer[start : self.position]).decode("utf-8", errors="replace") if keep else None

    def value(self, kind: int, keep: bool):
        """A metadata value (``keep``) or None after skipping it; an array is kept as a tuple of its scalars when
        short, and as its length otherwise (an array's length is all this module uses of a long one)."""
        if kind in SCALARS:
            return self.read(SCALARS[kind])
        if kind == STRING:
            return self.string(keep)
        if kind != ARRAY:
            raise ValueError(f"unknown GGUF metadata type {kind}")
        item, count = self.read("I"), self.read("Q")
        if item in SCALARS:
            width = struct.calcsize("<" + SCALARS[item])
            if keep and count <= KEPT_ARRAY_LENGTH:
                start = self.position
                self.skip(width * count)
                return struct.unpack_from(f"<{count}{SCALARS[item]}", self.buffer, start)
            self.skip(width * count)
        elif item == STRING:
            for _ in range(count):  # the vocabulary: one length each
                self.skip(self.read("Q"))
        else:
            for _ in range(count):
                self.value(item, keep=False)
        return count


def _parse(view, path: Path) -> tuple[dict[str, object], int, int]:
    """(metadata values, tensor count, end of the last tensor's data) of a GGUF file mapped at ``view``."""
    cursor = _Cursor(view)
    cursor.skip(4)  # the magic, checked by the caller
    version = cursor.read("I")
    if version not in VERSIONS:
        raise GgufFileError(f"{path.name} is GGUF version {version}; llama.cpp reads versions 2 and 3")
    tensor_count, metadata_count = cursor.read("Q"), cursor.read("Q")
    values: dict[str, object] = {}
    try:
        for _ in range(metadata_count):
            key = cursor.string()
            values[key] = cursor.value(cursor.read("I"), keep=True)
    except ValueError as error:
        raise GgufFileError(f"{path.name} has a corrupt GGUF header ({error})") from None
    alignment = int(values.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
    end = 0
    for _ in range(tensor_count):
        cursor.string(keep=False)
        dimensions = cursor.read("I")
        elements = 1
        for _ in range(dimensions):
            elements *= cursor.read("Q")
        kind, offset = cursor.read("I"), cursor.read("Q")
        block_weights, block_bytes = GGML_QUANT_SIZES.get(kind, (1, 0))  # a type gguf does not know: its start only
        end = max(end, offset + elements // block_weights * block_bytes)
    data_start = -(-cursor.position // alignment) * alignment
    return values, tensor_count, data_start + end if tensor_count else cursor.position


def _info(path: Path, size: int, values: dict[str, object], tensor_count: int, data_end: int) -> GgufInfo:
    architecture = str(values["general.architecture"])

    def get(key: str, default=None):
        return values.get(f"{architecture}.{key}", default)

    def per_layer(value):
        return tuple(int(v) for v in value) if isinstance(value, tuple) else int(value)

    embedding = int(get("embedding_length", 0))
    heads = per_layer(get("attention.head_count", 0))
    first_heads = max(heads) if isinstance(heads, tuple) and heads else heads
    head_dimension = embedding // first_heads if first_heads else 0
    tokens = values.get("tokenizer.ggml.tokens")
    window = get("attention.sliding_window")
    context = get("context_length")
    return GgufInfo(
        path=path,
        architecture=architecture,
        name=values.get("general.name") if isinstance(values.get("general.name"), str) else None,
        file_size=size,
        context_length=int(context) if context else None,
        block_count=int(get("block_count", 0)),
        embedding_length=embedding,
        head_count=heads,
        head_count_kv=per_layer(get("attention.head_count_kv", heads)),
        key_length=int(get("attention.key_length", head_dimension)),
        value_length=int(get("attention.value_length", head_dimension)),
        sliding_window=int(window) if window else None,
        vocab_size=int(tokens) if isinstance(tokens, int) else None,
        has_chat_template="tokenizer.chat_template" in values,
        sampling={key.removeprefix("general.sampling."): value for key, value in values.items()
                  if key.startswith("general.sampling.")},
        tensor_count=tensor_count,
        data_end=data_end,
    )
