"""A GGUF file's 4-bit blocks (ggml's Q4_0 and Q4_1) as int4 layers, without de-quantizing them.

A Q4_1 block holds 32 weights as d (fp16), m (fp16) and 16 bytes of 4-bit levels q
(low nibbles: weights 0-15, high nibbles: 16-31): w = d * q + m, i.e. torch's int4 group-32
format with scale d and zero m + 8d. Q4_0 has no m: w = d * (q - 8), zero 0. The only change is
the rounding of d and zero to bf16, the kernel's scale type.

Tensors are read with plain file reads, one at a time (``gguf_index`` says where), never through a
memory map: mapped pages a process has touched count in its resident memory.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ppd_core.lean.gguf_index import TYPES, TensorInfo
from ppd_core.lean.quant import INT4_GROUP, QuantLinear, int4_from_levels, quantize

log = logging.getLogger(__name__)
BLOCK_BYTES = {name: size for name, size, _ in TYPES.values() if name in ("Q4_0", "Q4_1")}
Q8_0_BYTES = TYPES[8][1]  # fp16 d, then 32 int8 levels: w = d * q
HEAD_CHUNK = 1024  # rows de-quantized at a time for the int8 LM head (2.4 MB of fp32: small transients)
# (name in the lean layer, GGUF tensors fused along the output dimension)
LAYER_TENSORS = {"wqkv": ("attn_q", "attn_k", "attn_v"), "wo": ("attn_output",), "w13": ("ffn_gate", "ffn_up"), "w2": ("ffn_down",)}
ROPE_PERMUTED = ("llama",)  # llama.cpp stores q/k rows of these interleaved; transformers un-permutes them


def block_levels(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw blocks [rows, blocks * bytes] -> levels [rows, blocks * 32] (0..15), scale and zero [rows, blocks]."""
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, BLOCK_BYTES[kind])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]
    if kind == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d
    else:
        zero = np.zeros_like(d)
    packed = blocks[..., BLOCK_BYTES[kind] - 16 :]  # [rows, blocks, 16]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)  # weights 0-15, then 16-31
    return torch.from_numpy(levels.astype(np.int32)), torch.from_numpy(d), torch.from_numpy(zero)


def unpermute_rows(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's RoPE row interleaving (what transformers' ``_reverse_permute_weights`` does)."""
    half = tensor.shape[0] // heads // 2
    return tensor.reshape(heads, half, 2, *tensor.shape[1:]).transpose(1, 2).reshape(tensor.shape)


def read_raw(path: Path, tensor: TensorInfo, begin: int = 0, end: int | None = None) -> np.ndarray:
    """A tensor's rows ``begin:end`` as bytes [rows, row bytes], by a file read (transient memory, no mapped pages)."""
    row_bytes = tensor.n_bytes // tensor.rows
    end = tensor.rows if end is None else min(end, tensor.rows)
    with open(path, "rb") as file:
        file.seek(tensor.offset + begin * row_bytes)
        raw = np.frombuffer(file.read((end - begin) * row_bytes), dtype=np.uint8)
    return raw.reshape(end - begin, row_bytes)


def int8_head(path: Path, tensors: dict[str, TensorInfo], config) -> QuantLinear | None:
    """The LM head (``output.weight``, or the tied token embedding) as per-row int8 from a Q8_0 / F32 / F16
    tensor, de-quantized a chunk of rows at a time; None for other types (the caller quantizes the model's).
    ``tensors``: the file's ``tensor_index``."""
    tensor = tensors.get("output.weight") or (tensors.get("token_embd.weight") if config.tie_word_embeddings else None)
    if tensor is None or tensor.kind not in ("Q8_0", "F32", "F16"):
        return None
    width, vocab = tensor.shape[0], tensor.rows
    # filled in place: small long-lived pieces between the chunks' transients would fragment the heap (+100 MB)
    qweight, scales = torch.empty(vocab, width, dtype=torch.int8), torch.empty(vocab, dtype=torch.bfloat16)
    for begin in range(0, vocab, HEAD_CHUNK):
        chunk = read_raw(path, tensor, begin, begin + HEAD_CHUNK)
        if tensor.kind == "Q8_0":
            blocks = chunk.reshape(chunk.shape[0], -1, Q8_0_BYTES)
            d = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # [rows, blocks, 1]
            rows = (d * blocks[..., 2:].view(np.int8)).reshape(chunk.shape[0], -1)  # as transformers de-quantizes
        else:
            rows = chunk.view(np.float32 if tensor.kind == "F32" else np.float16).astype(np.float32)
        part = quantize(torch.from_numpy(rows), None, "int8")  # per row: chunks quantize independently
        qweight[begin : begin + len(rows)], scales[begin : begin + len(rows)] = part.qweight, part.scales
    return QuantLinear("int8", qweight, scales, None, width)


def int4_layers(path: Path, tensors: dict[str, TensorInfo], config) -> list[dict[str, QuantLinear]] | None:
    """Per layer the fused int4 weights {"wqkv", "wo", "w13", "w2"} from ``path``'s blocks (no biases).

    None (with a log line) unless every one of these tensors is Q4_0 or Q4_1 and the architecture's
    row order is known; the caller then quantizes the de-quantized weights instead.
    """
    kinds = {t.kind for name, t in tensors.items() if name.startswith("blk.")
             and any(f".{part}.weight" in name for parts in LAYER_TENSORS.values() for part in parts)}
    if not kinds or not kinds <= set(BLOCK_BYTES) or config.model_type not in ROPE_PERMUTED + ("qwen2", "mistral"):
        log.info("GGUF layers are %s: quantizing de-quantized weights instead", ", ".join(sorted(kinds)) or "absent")
        return None
    heads = {"attn_q": config.num_attention_heads, "attn_k": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    layers = []
    for index in range(config.num_hidden_layers):
        layer = {}
        for key, parts in LAYER_TENSORS.items():
            pieces = []
            for part in parts:
                tensor = tensors[f"blk.{index}.{part}.weight"]
                levels, scale, zero = block_levels(read_raw(path, tensor), tensor.kind)
                if part in heads and config.model_type in ROPE_PERMUTED:
                    levels, scale, zero = (unpermute_rows(t, heads[part]) for t in (levels, scale, zero))
                pieces.append((levels, scale, zero))
            levels, scale, zero = (torch.cat(column) for column in zip(*pieces))
            if levels.shape[1] % INT4_GROUP:
                return None
            layer[key] = int4_from_levels(levels, scale, zero)
        layers.append(layer)
    return layers
