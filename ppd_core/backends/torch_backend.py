"""The torch backend: the lean forward (``ppd_core.lean``) or a transformers model, with ``kv_cache``.

A tree step feeds embeddings (token rows from the embedding table, prompt-token rows as trained) with
the tree's additive mask and explicit positions; ``kv_cache`` keeps the accepted path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ppd_core import kv_cache
from ppd_core.device_policy import properties_of, rows_bitwise
from ppd_core.kv_cache import Cache
from ppd_core.lean.model import LeanDecoder
from ppd_core.tree import Tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB


def forward_hidden(
    model: PreTrainedModel | LeanDecoder,
    cache: Cache,
    inputs_embeds: torch.Tensor,  # [T, hidden]
    position_ids: torch.Tensor,  # [T]
    attention_mask: torch.Tensor | None,  # [1, 1, T, cached + T] additive, or None for causal
    exact_rows: int | None = None,  # leading rows (a tree's nodes) that must equal plain steps bitwise
) -> torch.Tensor:
    """Run the decoder body (no LM head) and return the last hidden states [T, hidden]."""
    if isinstance(model, LeanDecoder):
        return model(inputs_embeds, position_ids, attention_mask, cache, exact_rows)
    output = model.base_model(
        inputs_embeds=inputs_embeds[None],
        position_ids=position_ids[None],
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
    )
    return output.last_hidden_state[0]


def logits_of(model: PreTrainedModel | LeanDecoder, hidden: torch.Tensor) -> torch.Tensor:
    """LM head on selected rows only: [rows, hidden] -> [rows, vocab] float32."""
    return model.get_output_embeddings()(hidden).float()


class TorchDecoder:
    """``Decoder`` over a ``LeanDecoder`` or a transformers model."""

    name = "torch"

    def __init__(self, model: PreTrainedModel | LeanDecoder):
        self.model = model
        weight = model.get_input_embeddings().weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.vocab_size = weight.shape[0]
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        # the lean forward's packed int4/int8 CPU kernels with row-by-row tree attention; fp32 and GPU matmuls
        # are not row-invariant
        quant = getattr(model, "quant", None) if isinstance(model, LeanDecoder) else None
        self.bitwise = rows_bitwise(properties_of(self.device), self.name, quant or "none")

    @property
    def has_kernel_choice(self) -> bool:
        """The lean fp32 forward has two matmul kernels; calibration times both per step size."""
        return bool(getattr(self.model, "has_kernel_choice", False))

    @property
    def skinny_sizes(self) -> frozenset[int]:
        return getattr(self.model, "skinny_sizes", frozenset())

    @skinny_sizes.setter
    def skinny_sizes(self, sizes: frozenset[int]) -> None:
        if hasattr(self.model, "skinny_sizes"):
            self.model.skinny_sizes = frozenset(sizes)

    def new_cache(self) -> Cache:
        return kv_cache.new_cache(self.model)

    def cache_length(self, cache: Cache) -> int:
        return kv_cache.cache_length(cache)

    @torch.inference_mode()
    def prefill(self, cache: Cache, token_ids: Sequence[int]) -> torch.Tensor:
        past = kv_cache.cache_length(cache)
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [P]
        positions = torch.arange(past, past + len(ids), device=self.device)  # [P]
        hidden = forward_hidden(self.model, cache, self.model.get_input_embeddings()(ids), positions, None)
        return logits_of(self.model, hidden[-1:])[0]  # [vocab]

    @torch.inference_mode()
    def tree_logits(self, cache: Cache, tree: Tree, node_tokens: torch.Tensor, prompt_rows: torch.Tensor | None) -> torch.Tensor:
        cached = kv_cache.cache_length(cache)
        embeds = self.model.get_input_embeddings()(node_tokens)  # [N, hidden]
        if prompt_rows is not None:
            embeds = torch.cat([embeds, prompt_rows.to(embeds.dtype)])  # [T, hidden]
        positions = tree.position_offsets + cached  # [T]
        mask = tree.additive_mask(cached, embeds.dtype, self.device) if tree.num_tokens > 1 else None
        # one LM-head call over all rows: on a CPU a matmul of 2..16 rows costs about what one of 2 does
        hidden = forward_hidden(self.model, cache, embeds, positions, mask, tree.num_nodes)  # [T, hidden]
        return logits_of(self.model, hidden)  # [T, vocab]

    def keep(self, cache: Cache, start: int, path: Sequence[int]) -> None:
        kv_cache.keep_tree_entries(cache, start, path)

    def truncate(self, cache: Cache, length: int) -> None:
        kv_cache.truncate(cache, length)

    @torch.inference_mode()
    def embedding_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(token_ids.to(self.device)).float()

    def close(self) -> None:
        """Nothing outside Python: the weights go with the last reference."""

    def describe(self) -> dict:
        kernels = self.model.kernels if isinstance(self.model, LeanDecoder) else {"linear": "transformers modules", "compiled": False}
        return {"backend": self.name, "forward": "lean" if isinstance(self.model, LeanDecoder) else "transformers", **kernels}
