"""Where each tensor of a GGUF file lies, read from the header without materialising its metadata.

``gguf.GGUFReader`` turns every metadata value into numpy arrays (a tokenizer's 49k tokens and
merges included): about 160 MB held while it lives, for the 100 MB default model. This reads the
header once through a buffered file, skipping metadata values, and keeps only the tensor table.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# ggml tensor types this project reads: (name, bytes per block, weights per block)
TYPES = {0: ("F32", 4, 1), 1: ("F16", 2, 1), 2: ("Q4_0", 18, 32), 3: ("Q4_1", 20, 32), 8: ("Q8_0", 34, 32)}
# metadata value types of fixed size: struct format
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    kind: str  # "Q4_1", "F32", ...; "other" for types this project does not read
    shape: tuple[int, ...]  # ggml order: the row length first
    offset: int  # absolute, in bytes
    n_bytes: int  # 0 for "other"

    @property
    def rows(self) -> int:
        count = 1
        for size in self.shape[1:]:
            count *= size
        return count


def _read(file: BinaryIO, fmt: str):
    return struct.unpack("<" + fmt, file.read(struct.calcsize("<" + fmt)))[0]


def _string(file: BinaryIO) -> str:
    return file.read(_read(file, "Q")).decode("utf-8", errors="replace")


def _value(file: BinaryIO, kind: int, keep: bool):
    """Read (``keep``) or skip one metadata value."""
    if kind in SCALARS:
        return _read(file, SCALARS[kind])
    if kind == STRING:
        size = _read(file, "Q")
        data = file.read(size) if keep else file.seek(size, 1)
        return data.decode("utf-8", errors="replace") if keep else None
    if kind == ARRAY:
        item, count = _read(file, "I"), _read(file, "Q")
        if item in SCALARS:
            file.seek(count * struct.calcsize("<" + SCALARS[item]), 1)
        else:
            for _ in range(count):
                _value(file, item, False)
        return None
    raise ValueError(f"unknown GGUF metadata type {kind}")


def tensor_index(path: Path) -> dict[str, TensorInfo]:
    """Every tensor's type, shape and byte range; raises ValueError for a file that is not GGUF v2/v3."""
    with open(path, "rb", buffering=1 << 20) as file:
        if file.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = _read(file, "I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        n_tensors, n_metadata = _read(file, "Q"), _read(file, "Q")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_metadata):
            key = _string(file)
            value = _value(file, _read(file, "I"), keep=key == "general.alignment")
            if key == "general.alignment":
                alignment = int(value)
        entries = []
        for _ in range(n_tensors):
            name = _string(file)
            shape = tuple(_read(file, "Q") for _ in range(_read(file, "I")))
            kind, offset = _read(file, "I"), _read(file, "Q")
            entries.append((name, shape, kind, offset))
        start = -(-file.tell() // alignment) * alignment
    index = {}
    for name, shape, kind, offset in entries:
        label, block_bytes, block_weights = TYPES.get(kind, ("other", 0, 1))
        weights = 1
        for size in shape:
            weights *= size
        index[name] = TensorInfo(name, label, shape, start + offset, weights // block_weights * block_bytes)
    return index
