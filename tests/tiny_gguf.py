"""Tiny random-weight GGUF models for tests, written with ``gguf.GGUFWriter`` (no Hub access).

Every model has 2 layers, hidden size 256 (a multiple of 256: K-quant and IQ token embeddings are
really exercised), 4 heads of 64 (2 KV heads), an FFN of 512 and a 4096-token context; it reuses the
default GGUF's BPE tokenizer (``tokenizer.ggml.*``, 49152 tokens) so prompts tokenize as in the app.
Weights are seeded normal values: matrices and the token embedding in F16, norms and biases in F32.

Architectures, as llama.cpp's converter writes them:

* ``llama``: like the default model (tied output, ChatML template).
* ``gemma3``: sliding-window attention, q/k norms, post norms, token rows scaled by sqrt(n_embd)
  inside the graph, no chat template.
* ``gemma2``: sliding window and soft-capping; scales token *and* embedding rows (a contrast to gemma3).
* ``qwen2``: q/k/v biases. ``qwen3``: q/k norms. ``phi3``: fused ``attn_qkv`` and gate+up ``ffn_up``,
  untied ``output``.

``requantize`` re-quantizes a file with llama.cpp's own ``llama_model_quantize``. A token embedding of any
ggml type is also written directly: ``DISTINCT_ROWS`` rows quantized by ggml's ``ggml_quantize_chunk``
(``quantize_rows``), repeated over the vocabulary, which takes a fraction of a second where quantizing 49k
rows to an IQ type takes up to 20 s. ``write_table_gguf`` writes a file holding a small ``token_embd`` only.
``TinyModels`` builds and caches the files for a pytest session (fixture ``tiny_models``; import it into a
test module).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ARCHITECTURES = ("llama", "gemma3", "gemma2", "qwen2", "qwen3", "phi3")
HIDDEN = 256
HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 64
FFN = 512
LAYERS = 2
CONTEXT = 4096
SLIDING_WINDOW = 8  # small, so a test's few dozen positions cross it
# file types ``requantize`` names (llama.cpp's LLAMA_FTYPE_*); token_embd gets the file type's choice
FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
              "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1", "Q8_0": "MOSTLY_Q8_0",
              "Q2_K": "MOSTLY_Q2_K", "Q3_K_M": "MOSTLY_Q3_K_M", "Q4_K_S": "MOSTLY_Q4_K_S", "Q4_K_M": "MOSTLY_Q4_K_M",
              "Q5_K_S": "MOSTLY_Q5_K_S", "Q5_K_M": "MOSTLY_Q5_K_M", "Q6_K": "MOSTLY_Q6_K", "IQ4_NL": "MOSTLY_IQ4_NL",
              "IQ4_XS": "MOSTLY_IQ4_XS", "TQ1_0": "MOSTLY_TQ1_0", "TQ2_0": "MOSTLY_TQ2_0"}


@dataclass(frozen=True)
class Vocabulary:
    """The default GGUF's tokenizer metadata."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos: int
    eos: int
    unknown: int
    padding: int
    chat_template: str


def default_vocabulary(gguf_file: Path) -> Vocabulary:
    """The ``tokenizer.ggml.*`` keys of ``gguf_file`` (read with ``GGUFReader``; the reader is dropped)."""
    from gguf import GGUFReader  # noqa: PLC0415

    reader = GGUFReader(gguf_file)

    def value(key: str):
        return reader.get_field(key).contents()

    vocabulary = Vocabulary(
        tokens=value("tokenizer.ggml.tokens"), token_types=[int(kind) for kind in value("tokenizer.ggml.token_type")],
        merges=value("tokenizer.ggml.merges"), pre=value("tokenizer.ggml.pre"),
        bos=int(value("tokenizer.ggml.bos_token_id")), eos=int(value("tokenizer.ggml.eos_token_id")),
        unknown=int(value("tokenizer.ggml.unknown_token_id")), padding=int(value("tokenizer.ggml.padding_token_id")),
        chat_template=value("tokenizer.chat_template"))
    del reader
    return vocabulary


def ggml_library():
    """llama_cpp's libggml-base (ctypes), with ``ggml_quantize_chunk`` declared."""
    from ppd_core.backends.llamacpp.rows import ggml_type_traits  # noqa: PLC0415

    library = ggml_type_traits().library
    library.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.ggml_quantize_chunk.restype = ctypes.c_size_t
    return library


# IQ types whose ggml quantizer first builds search tables for seconds (IQ1_S: ~10 s): their test rows are
# random codes under a fixed fp16 block scale instead (every code is a valid grid index). The scale is a block's
# first two bytes, but IQ1_M's, whose 4 nibbles top its 4 uint16 scales (the block's last 8 bytes)
SLOW_TO_QUANTIZE = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")
BLOCK_SCALE = np.float16(0.002)


def quantize_rows(type_name: str, values: np.ndarray, seed: int = 0) -> np.ndarray:
    """``values`` [rows, width] float32 as ggml type ``type_name`` blocks [rows, row bytes] uint8, quantized by
    ggml's own ``ggml_quantize_chunk`` (with a unit importance matrix for the types that need one)."""
    from ppd_core.backends.llamacpp.rows import row_format  # noqa: PLC0415

    type_id = type_id_of(type_name)
    _name, block, block_bytes = row_format(type_id)
    rows, width = values.shape
    if type_name in SLOW_TO_QUANTIZE:
        raw = np.random.default_rng(seed).integers(0, 256, (rows, width // block, block_bytes), dtype=np.uint8)
        scale = int(BLOCK_SCALE.view(np.uint16))
        if type_name == "IQ1_M":
            scales = raw[:, :, -8:].copy().view("<u2")  # [rows, blocks, 4]
            for nibble in range(4):
                scales[:, :, nibble] = (scales[:, :, nibble] & 0x0FFF) | (((scale >> (4 * nibble)) & 0xF) << 12)
            raw[:, :, -8:] = scales.view(np.uint8)
        else:
            raw[:, :, :2] = np.frombuffer(BLOCK_SCALE.tobytes(), dtype=np.uint8)
        return raw.reshape(rows, -1)
    raw = np.zeros((rows, width // block * block_bytes), dtype=np.uint8)
    values = np.ascontiguousarray(values, dtype=np.float32)
    importance = np.ones(width, dtype=np.float32)
    written = ggml_library().ggml_quantize_chunk(type_id, values.ctypes.data, raw.ctypes.data, 0, rows, width,
                                                 importance.ctypes.data)
    assert written == raw.nbytes, (type_name, written, raw.nbytes)
    return raw


def type_id_of(type_name: str) -> int:
    """The ggml type id of ``type_name`` (the gguf package's, else llama_cpp's GGML_TYPE_*)."""
    from gguf import GGMLQuantizationType  # noqa: PLC0415

    if type_name in GGMLQuantizationType.__members__:
        return int(GGMLQuantizationType[type_name])
    import llama_cpp  # noqa: PLC0415

    return int(getattr(llama_cpp, f"GGML_TYPE_{type_name}"))


DISTINCT_ROWS = 512  # a quantized token embedding repeats this many quantized rows (quantizing 49k rows takes seconds)


def write_table_gguf(path: Path, type_name: str, rows: int = 64, architecture: str = "llama", seed: int = 0) -> np.ndarray:
    """A GGUF file holding only ``general.architecture`` and a ``token_embd`` of ``rows`` x HIDDEN random rows in
    ``type_name`` (not a model llama.cpp loads); returns the table's raw blocks [rows, row bytes] (fp32 values
    for F32)."""
    from gguf import GGMLQuantizationType, GGUFWriter  # noqa: PLC0415

    values = np.random.default_rng(seed).standard_normal((rows, HIDDEN), dtype=np.float32)
    writer = GGUFWriter(path, architecture)
    if type_name == "F32":
        table = values
        writer.add_tensor("token_embd.weight", table)
    else:
        table = values.astype(np.float16).view(np.uint8) if type_name == "F16" else quantize_rows(type_name, values, seed)
        writer.add_tensor("token_embd.weight", table, raw_dtype=GGMLQuantizationType[type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return table


def add_vocabulary(writer, vocabulary: Vocabulary, tokens, token_types, chat_template: bool = True) -> None:
    """The default model's BPE tokenizer keys on ``writer``, with ``tokens`` and ``token_types`` as its token list (the
    vocabulary's own, or padded to a larger model's size)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocabulary.pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(vocabulary.merges)
    writer.add_bos_token_id(vocabulary.bos)
    writer.add_eos_token_id(vocabulary.eos)
    writer.add_unk_token_id(vocabulary.unknown)
    writer.add_pad_token_id(vocabulary.padding)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(vocabulary.chat_template)


def write_tiny_gguf(path: Path, architecture: str, vocabulary: Vocabulary, seed: int = 0,
                    embedding_type: str = "F16") -> Path:
    """A tiny random ``architecture`` model at ``path``: F16 matrices, its token embedding in ``embedding_type``
    (F16, F32, or any type the gguf package names: then ``DISTINCT_ROWS`` rows quantized by ggml, repeated)."""
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType  # noqa: PLC0415

    if architecture not in ARCHITECTURES:
        raise ValueError(f"no tiny {architecture} model; one of {', '.join(ARCHITECTURES)}")
    generator = np.random.default_rng(seed)
    vocab = len(vocabulary.tokens)
    q_size, kv_size = HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE
    gemma = architecture.startswith("gemma")

    def matrix(rows: int, columns: int, std: float) -> np.ndarray:  # [rows, columns]: ggml's {columns, rows}
        return (generator.standard_normal((rows, columns), dtype=np.float32) * std).astype(np.float16)

    def norm(size: int) -> np.ndarray:  # [size] around 1 (Gemma's converter stores 1 + w, as written here)
        return (1.0 + 0.1 * generator.standard_normal(size, dtype=np.float32)).astype(np.float32)

    def bias(size: int) -> np.ndarray:
        return (0.02 * generator.standard_normal(size, dtype=np.float32)).astype(np.float32)

    writer = GGUFWriter(path, architecture)
    writer.add_name("tiny random model")  # not "phi3": llama.cpp would look for Phi-3's special tokens
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_SIZE)
    writer.add_value_length(HEAD_SIZE)
    writer.add_rope_dimension_count(HEAD_SIZE)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6 if gemma else 1e-5)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    if architecture in ("gemma3", "gemma2"):
        writer.add_sliding_window(SLIDING_WINDOW)
    if architecture == "gemma2":
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    add_vocabulary(writer, vocabulary, vocabulary.tokens, vocabulary.token_types, architecture != "gemma3")

    # token rows: Gemma's graph multiplies them by sqrt(256) = 16
    embedding_std = 0.05 if gemma else 0.5
    if embedding_type == "F16":
        writer.add_tensor("token_embd.weight", matrix(vocab, HIDDEN, embedding_std))
    elif embedding_type == "F32":
        writer.add_tensor("token_embd.weight", matrix(vocab, HIDDEN, embedding_std).astype(np.float32))
    else:
        distinct = quantize_rows(embedding_type, matrix(DISTINCT_ROWS, HIDDEN, embedding_std).astype(np.float32), seed)
        table = np.tile(distinct, (-(-vocab // DISTINCT_ROWS), 1))[:vocab]  # [vocab, row bytes]
        writer.add_tensor("token_embd.weight", table, raw_dtype=GGMLQuantizationType[embedding_type])
    writer.add_tensor("output_norm.weight", norm(HIDDEN))
    if architecture == "phi3":
        writer.add_tensor("output.weight", matrix(vocab, HIDDEN, 0.5))
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", norm(HIDDEN))
        if architecture == "phi3":
            writer.add_tensor(f"{block}.attn_qkv.weight", matrix(q_size + 2 * kv_size, HIDDEN, 0.08))
        else:
            writer.add_tensor(f"{block}.attn_q.weight", matrix(q_size, HIDDEN, 0.08))
            writer.add_tensor(f"{block}.attn_k.weight", matrix(kv_size, HIDDEN, 0.08))
            writer.add_tensor(f"{block}.attn_v.weight", matrix(kv_size, HIDDEN, 0.08))
        if architecture == "qwen2":
            writer.add_tensor(f"{block}.attn_q.bias", bias(q_size))
            writer.add_tensor(f"{block}.attn_k.bias", bias(kv_size))
            writer.add_tensor(f"{block}.attn_v.bias", bias(kv_size))
        if architecture in ("qwen3", "gemma3"):
            writer.add_tensor(f"{block}.attn_q_norm.weight", norm(HEAD_SIZE))
            writer.add_tensor(f"{block}.attn_k_norm.weight", norm(HEAD_SIZE))
        writer.add_tensor(f"{block}.attn_output.weight", matrix(HIDDEN, q_size, 0.08))
        writer.add_tensor(f"{block}.ffn_norm.weight", norm(HIDDEN))
        if architecture == "phi3":
            writer.add_tensor(f"{block}.ffn_up.weight", matrix(2 * FFN, HIDDEN, 0.08))  # gate then up
        else:
            writer.add_tensor(f"{block}.ffn_gate.weight", matrix(FFN, HIDDEN, 0.08))
            writer.add_tensor(f"{block}.ffn_up.weight", matrix(FFN, HIDDEN, 0.08))
        writer.add_tensor(f"{block}.ffn_down.weight", matrix(HIDDEN, FFN, 0.06))
        if gemma:
            writer.add_tensor(f"{block}.post_attention_norm.weight", norm(HIDDEN))
            writer.add_tensor(f"{block}.post_ffw_norm.weight", norm(HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quiet_llama_logs(llama) -> None:
    """Silence llama.cpp's per-tensor logs (errors still print)."""
    if getattr(quiet_llama_logs, "callback", None) is None:
        @llama.llama_log_callback
        def callback(level, text, user_data):
            if level == 4:  # ERROR
                print(text.decode(errors="replace"), end="")

        quiet_llama_logs.callback = callback  # must outlive the call
        llama.llama_log_set(callback, ctypes.c_void_p(0))


def requantize(src: Path, dst: Path, type_name: str, embedding_type: str | None = None, threads: int = 2) -> Path:
    """``src`` re-quantized to ``type_name`` (a key of FILE_TYPES) by llama.cpp's ``llama_model_quantize``
    (``ppd_core.backends.llamacpp.quantize.quantize_file``), its ``token_embd`` to the ggml type ``embedding_type`` where given (e.g.
    "Q3_K", "IQ3_S", "Q1_0"; not IQ2_XXS/IQ2_XS/IQ1_S, which ggml quantizes only with an importance matrix)."""
    from ppd_core.backends.llamacpp.quantize import quantize_file  # noqa: PLC0415

    if type_name not in FILE_TYPES:
        raise ValueError(f"unknown quantization {type_name}; one of {', '.join(FILE_TYPES)}")
    quantize_file(src, dst, type_name, threads, None if embedding_type is None else type_id_of(embedding_type))
    return dst


class TinyModels:
    """Tiny GGUF files built on demand in ``folder`` and cached.

    ``get(architecture, type_name)``: the F16 model re-quantized by llama.cpp (``type_name`` a FILE_TYPES key);
    ``get(architecture, "F16", embedding_type)``: the token embedding in that ggml type, written directly
    (``requantize_embedding=True``: by llama.cpp's quantizer, for types the gguf package cannot write).
    """

    def __init__(self, folder: Path, default_gguf: Path):
        self.folder = Path(folder)
        self.default_gguf = Path(default_gguf)
        self._vocabulary: Vocabulary | None = None
        self._files: dict[tuple, Path] = {}

    @property
    def vocabulary(self) -> Vocabulary:
        if self._vocabulary is None:
            self._vocabulary = default_vocabulary(self.default_gguf)
        return self._vocabulary

    def get(self, architecture: str, type_name: str = "F16", embedding_type: str | None = None,
            requantize_embedding: bool = False) -> Path:
        key = (architecture, type_name, embedding_type, requantize_embedding)
        if key not in self._files:
            base = self.folder / f"tiny-{architecture}-F16.gguf"
            if not base.exists():
                write_tiny_gguf(base, architecture, self.vocabulary)
            suffix = f"-embd-{embedding_type}" if embedding_type else ""
            path = self.folder / f"tiny-{architecture}-{type_name}{suffix}{'-q' if requantize_embedding else ''}.gguf"
            if type_name == "F16" and embedding_type in (None, "F16"):
                path = base
            elif type_name == "F16" and not requantize_embedding:
                write_tiny_gguf(path, architecture, self.vocabulary, embedding_type=embedding_type)
            else:
                requantize(base, path, type_name, embedding_type)
            self._files[key] = path
        return self._files[key]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    """Tiny GGUF models of every architecture, built once per session (import this fixture into a test module)."""
    from ppd_core.loading import default_model_file  # noqa: PLC0415

    return TinyModels(tmp_path_factory.mktemp("tiny-gguf"), default_model_file())
