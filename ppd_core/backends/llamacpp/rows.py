"""Token rows of a GGUF file's ``token_embd``, exactly as llama.cpp feeds them to the model.

An embedding batch (``llama_batch_init(n, n_embd, ...)``) whose rows come from here gives the same
logits, bit for bit, as the batch of those tokens:

* **De-quantized by ggml itself.** llama.cpp's CPU ``get_rows`` turns a quantized row into fp32
  with ``ggml_get_type_traits(type)->to_float`` (ggml-cpu/ops.cpp); F16/BF16/F32 rows convert
  exactly. This module calls that same function of the ``libggml-base`` that ``llama_cpp`` ships,
  so every type llama.cpp runs is read (Q4_0..Q8_0, Q2_K..Q6_K, IQ*, TQ*, MXFP4, BF16...). Only where
  the library or its traits cannot be used does it fall back to ``gguf.quants.dequantize``.
  The token embedding always lives in host memory (llama.cpp's input layer is on the CPU).
* **Scaled as the graph scales tokens only.** Most architectures scale the input inside the graph
  for token and embedding batches alike (Gemma, Gemma 2, Granite's ``embedding_scale``, MiniCPM...):
  nothing to add. Gemma 3 / 3n / 4 and Gemma-embedding scale by ``sqrtf(n_embd)`` only when the
  batch holds tokens (``ggml_scale(inpL, ubatch.token ? sqrtf(n_embd) : 1.0f)``), so their rows
  are multiplied here in fp32, as ggml's ``ggml_vec_scale_f32`` does.
* **No vocabulary in memory.** The header is read by ``gguf.GGUFReader`` taught to step over metadata
  arrays (the stock reader makes numpy arrays of every token and merge: ~160 MB and ~2 s for a 49k-token
  vocabulary), then dropped; a decoder keeps only a read-only memory map of the ``token_embd`` bytes.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

TENSOR_NAME = "token_embd.weight"
# architectures whose graph multiplies token rows (only, not embedding rows) by sqrtf(n_embd)
TOKEN_ONLY_SQRT_SCALE = frozenset({"gemma3", "gemma3n", "gemma4", "gemma-embedding"})
# architectures where an embedding batch takes another path than its tokens would (so no row stands in
# for a token): per-layer token inputs (Gemma 3n; Gemma 4 with ``per_layer_token_embd``, which an embedding
# batch replaces by token 0's), vision weights for embedding rows (CogVLM), a draft model fed the target's
# hidden states (Gemma 4 assistant); and any model with deepstack inputs (Qwen3-VL, Granite 4 Vision: wider
# embedding rows, and ``embedding_scale`` for tokens only)
PER_LAYER_TENSOR = "per_layer_token_embd.weight"
OTHER_PATH = frozenset({"gemma3n", "cogvlm", "gemma4-assistant", "qwen3vl", "qwen3vlmoe"})


class EmbeddingRowsError(PpdError):
    """A GGUF file whose token embedding cannot be read; the message is one line."""


class _TypeTraits(ctypes.Structure):
    """ggml.h's ``struct ggml_type_traits``."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


# void (*ggml_to_float_t)(const void * x, float * y, int64_t k)
_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
GGML_Q8_0 = 8  # a type whose traits check the struct layout: ("q8_0", 32 weights, 34 bytes)


def llama_cpp_library_files() -> list[Path]:
    """The ggml shared libraries shipped next to the ``llama_cpp`` module (``llama_cpp/lib``), ggml-base
    first; empty where llama-cpp-python is not installed. The module itself is not imported."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
    files = []
    for location in spec.submodule_search_locations:
        folder = Path(location) / "lib"
        if folder.is_dir():
            files += [path for path in folder.iterdir() if path.name.endswith(suffix) and "ggml" in path.name]
    return sorted(files, key=lambda path: ("ggml-base" not in path.name, path.name))


@functools.cache
def ggml_type_traits():
    """ggml's ``ggml_get_type_traits`` (type -> ``const struct ggml_type_traits *``) from llama_cpp's
    libraries, or None where none exports it or its struct is not laid out as ``_TypeTraits``."""
    for path in llama_cpp_library_files():
        try:
            library = ctypes.CDLL(str(path))  # the same library when llama_cpp already loaded this file
        except OSError:
            continue
        function = getattr(library, "ggml_get_type_traits", None)
        if function is None:
            continue
        function.argtypes = [ctypes.c_int]
        function.restype = ctypes.POINTER(_TypeTraits)
        probe = function(GGML_Q8_0).contents
        if (probe.type_name, probe.blck_size, probe.type_size, probe.is_quantized) != (b"q8_0", 32, 34, True):
            log.warning("%s's ggml_type_traits is laid out differently; token rows de-quantized by gguf.quants", path.name)
            return None
        function.library = library  # keeps it loaded
        return function
    return None


@functools.cache
def ggml_type_count() -> int:
    """GGML_TYPE_COUNT of the llama.cpp build (llama_cpp's binding states it; ggml exports no bound): the
    traits table's length, never read past. 0 without llama_cpp."""
    try:
        from llama_cpp import llama_cpp  # noqa: PLC0415 - loaded anyway where llama.cpp decodes
    except (ImportError, OSError):
        return 0
    return int(getattr(llama_cpp, "GGML_TYPE_COUNT", 0))


def row_format(type_id: int) -> tuple[str, int, int]:
    """(type name, weights per block, bytes per block) of a ggml type: the gguf package's, or ggml's own for
    a type newer than the package. Raises EmbeddingRowsError for a type neither knows."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415

    if type_id in GGMLQuantizationType._value2member_map_:
        kind = GGMLQuantizationType(type_id)
        if kind in GGML_QUANT_SIZES:
            return (kind.name, *GGML_QUANT_SIZES[kind])
    traits_of = ggml_type_traits()
    if traits_of is not None and 0 <= type_id < ggml_type_count():
        traits = traits_of(type_id).contents
        if traits.type_name and traits.blck_size > 0 and traits.type_size > 0:
            return traits.type_name.decode(errors="replace").upper(), int(traits.blck_size), int(traits.type_size)
    raise EmbeddingRowsError(f"ggml type {type_id} is unknown to the gguf package and to llama.cpp")


def ggml_to_float(type_id: int, name: str, block: int, block_bytes: int):
    """ggml's own ``to_float`` for ``type_id`` ((source, destination, count) -> None), or None where the
    library is missing or its traits describe the type otherwise (name, block)."""
    traits_of = ggml_type_traits()
    if traits_of is None or not 0 <= type_id < ggml_type_count():  # past the build's table: no traits to read
        return None
    traits = traits_of(type_id).contents
    if ((traits.type_name or b"").decode(errors="replace").upper(), traits.blck_size, traits.type_size) != (
            name, block, block_bytes) or not traits.to_float:
        return None
    return _TO_FLOAT(traits.to_float)


class _Header(GGUFReader):
    """``gguf.GGUFReader`` that skips over metadata arrays instead of making one numpy array per item (the stock
    reader holds ~160 MB and takes ~2 s for a 49k-token vocabulary), and lists tensors as (raw type, shape,
    absolute offset) without the package's type enum (a type newer than the package stays readable)."""

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        item = GGUFValueType(int(item_type[0]))
        offset = orig_offs + 12
        if item == GGUFValueType.STRING:  # each item: a uint64 length, then its bytes
            length = struct.Struct(">Q" if (self.byte_order == "S") == (sys.byteorder == "little") else "<Q")
            buffer = memoryview(self.data)
            for _ in range(int(count[0])):
                offset += 8 + length.unpack_from(buffer, offset)[0]
        elif item in self.gguf_scalar_to_np:
            offset += int(count[0]) * np.dtype(self.gguf_scalar_to_np[item]).itemsize
        else:  # arrays of arrays: the stock parse
            return super()._get_field_parts(orig_offs, raw_type)
        if offset > len(self.data):
            raise ValueError("a metadata array ends past the end of the file")
        return offset - orig_offs, [item_type, count], [], [GGUFValueType.ARRAY, item]

    def _build_tensors(self, start_offs: int, fields) -> None:
        self.tensor_table = {}
        for field in fields:
            _name_length, name, _dimensions, shape, raw_type, offset = field.parts
            self.tensor_table[bytes(name).decode("utf-8", errors="replace")] = (
                int(raw_type[0]), tuple(int(size) for size in shape), int(start_offs + offset[0]))


class EmbeddingRows:
    """Rows of a GGUF file's ``token_embd``, as the model's input expects them (fp32, scaled if the graph
    scales token rows only).

    ``matches_tokens`` is False where llama.cpp runs an embedding batch through another path than a token
    batch (``mismatch`` says why): rows are then still the de-quantized, scaled table rows.
    """

    def __init__(self, gguf_file: Path, architecture: str | None = None):
        self.gguf_file = Path(gguf_file)
        name = self.gguf_file.name
        try:
            size = self.gguf_file.stat().st_size
            with open(self.gguf_file, "rb") as file:
                magic = file.read(4)
            if magic != b"GGUF":
                raise EmbeddingRowsError(f"{name} is not a GGUF file")
            header = _Header(self.gguf_file)
        except OSError as error:
            raise EmbeddingRowsError(f"cannot read {name}: {error.strerror or error}") from None
        except EmbeddingRowsError:
            raise
        except Exception as error:  # noqa: BLE001 - a cut or damaged header: ValueError, IndexError, struct.error...
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise EmbeddingRowsError(f"{name} is not a complete GGUF file ({detail})") from None
        try:
            if TENSOR_NAME not in header.tensor_table:
                raise EmbeddingRowsError(f"{name} has no {TENSOR_NAME} tensor")
            self.type_id, shape, offset = header.tensor_table[TENSOR_NAME]
            architecture_field = header.get_field("general.architecture")
            file_architecture = architecture_field.contents() if architecture_field is not None else None
            deepstack = any(key.endswith(".deepstack_mapping") or (key.endswith(".n_deepstack_layers") and field.contents())
                            for key, field in header.fields.items())
            other_path = deepstack or PER_LAYER_TENSOR in header.tensor_table
        finally:
            del header  # the reader's metadata arrays (the vocabulary) and its memory map go with it
        if len(shape) != 2:
            raise EmbeddingRowsError(f"{name}'s {TENSOR_NAME} has shape {shape}, not [hidden, vocabulary]")
        self.hidden_size, self.vocab_size = shape  # ggml order: the row length first
        self.kind, block, block_bytes = row_format(self.type_id)
        self.architecture = architecture or file_architecture or "unknown"
        if self.hidden_size % block:
            raise EmbeddingRowsError(f"{name}'s {TENSOR_NAME} rows of {self.hidden_size} do not hold whole {self.kind} blocks")
        self.row_bytes = self.hidden_size // block * block_bytes
        if offset + self.row_bytes * self.vocab_size > size:
            raise EmbeddingRowsError(f"{name} is truncated: its {TENSOR_NAME} ends past the file's {size} bytes")
        self.scale = (np.sqrt(np.float32(self.hidden_size), dtype=np.float32)
                      if self.architecture in TOKEN_ONLY_SQRT_SCALE else None)
        self.mismatch = None
        if self.architecture in OTHER_PATH or other_path:
            self.mismatch = f"llama.cpp runs {self.architecture} embedding batches through another path than tokens"
        self._to_float = None if self.kind == "F32" else ggml_to_float(self.type_id, self.kind, block, block_bytes)
        self.dequantizer = "ggml" if self._to_float is not None or self.kind == "F32" else "gguf.quants"
        self._table = np.memmap(self.gguf_file, dtype=np.uint8, mode="r", offset=offset,
                                shape=(self.vocab_size, self.row_bytes))  # [vocab, row bytes]

    @property
    def matches_tokens(self) -> bool:
        """Whether an embedding batch of these rows gives its tokens' logits."""
        return self.mismatch is None

    def rows(self, token_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """[k, hidden] float32 rows of ``token_ids``, scaled as the model's input expects."""
        if self._table is None:
            raise EmbeddingRowsError(f"the token embedding of {self.gguf_file.name} is closed")
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)  # [k]
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise EmbeddingRowsError(f"token ids must lie in 0..{self.vocab_size - 1} for {self.gguf_file.name}")
        raw = np.ascontiguousarray(self._table[ids])  # [k, row bytes]
        out = self._dequantize(raw, len(ids))  # [k, hidden]
        if self.scale is not None:
            out *= self.scale  # ggml_scale: one fp32 product per value
        return out

    def _dequantize(self, raw: np.ndarray, count: int) -> np.ndarray:
        if self.kind == "F32":
            return raw.view(np.float32).reshape(count, self.hidden_size).copy()
        if self._to_float is not None:
            out = np.empty((count, self.hidden_size), dtype=np.float32)
            if count:
                self._to_float(raw.ctypes.data, out.ctypes.data, count * self.hidden_size)
            return out
        from gguf import GGMLQuantizationType  # noqa: PLC0415
        from gguf.quants import dequantize  # noqa: PLC0415

        try:
            values = dequantize(raw, GGMLQuantizationType(self.type_id))
        except (NotImplementedError, ValueError):
            raise EmbeddingRowsError(f"{self.gguf_file.name}'s {self.kind} token embedding needs llama.cpp's ggml "
                                     "library to be read") from None
        return values.astype(np.float32, copy=False).reshape(count, self.hidden_size)

    def close(self) -> None:
        """Release the memory map (idempotent)."""
        self._table = None  # the map is unmapped with its last reference (rows() returns copies); numpy
        # closed the file descriptor once it had mapped it

    def __enter__(self) -> EmbeddingRows:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EmbeddingRows({self.gguf_file.name}, {self.kind}, {self.vocab_size}x{self.hidden_size})"
