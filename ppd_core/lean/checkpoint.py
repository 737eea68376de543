"""Named tensors of a safetensors checkpoint, memory-mapped, without building the transformers model.

The int4 forward takes its layers and LM head from a GGUF file; from the converted checkpoint it
needs only the embedding table, the norms and a few rows for its guards. Mapping the file (not
reading it) keeps the 113 MB fp32 embedding of the default model out of memory except for the
rows a prompt touches, and skipping the transformers model skips its imports (about 90 MB).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class Checkpoint:
    """``model.safetensors`` (or its shards) in a Hugging Face folder: ``tensor(name)`` maps one tensor."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.entries: dict[str, tuple[Path, dict, int]] = {}  # name -> (file, header entry, data start)
        for name in files:
            path = folder / name
            with path.open("rb") as handle:
                (size,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(size))
            for tensor, entry in header.items():
                if tensor != "__metadata__":
                    self.entries[tensor] = (path, entry, 8 + size)
        self._storages: dict[Path, torch.UntypedStorage] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name``, backed by a private mapping of its file (pages are read when touched)."""
        path, entry, data = self.entries[name]
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"{path.name}: {name} is {entry['dtype']}, not one of {', '.join(DTYPES)}")
        storage = self._storages.get(path)
        if storage is None:
            storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=path.stat().st_size)
            self._storages[path] = storage
        begin, end = entry["data_offsets"]
        raw = torch.empty(0, dtype=torch.uint8).set_(storage, data + begin, (end - begin,))
        return raw.view(DTYPES[entry["dtype"]]).view(entry["shape"])

    def numel(self, name: str) -> int:
        """Elements of ``name``, from the header alone."""
        return math.prod(self.entries[name][1]["shape"])
