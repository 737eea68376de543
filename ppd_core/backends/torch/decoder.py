"""The torch backend: the lean forward (``lean/``) or a transformers model, with its cache (``cache``).

A tree step feeds embeddings (token rows from the embedding table, prompt-token rows as trained) with
the tree's additive mask and explicit positions; the cache keeps the accepted path. NumPy in, NumPy out:
arrays become tensors here. On a GPU the logits stay there (``DeviceLogits``): each step copies back the
argmax per row and the next guesses, not ``[rows, vocab]`` floats.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ppd_core.backend import BackendInfo, StepRows
from ppd_core.backends.torch import device as torch_device
from ppd_core.backends.torch.cache import Cache, new_cache
from ppd_core.backends.torch.masks import TreeMasks
from ppd_core.errors import PpdError
from ppd_core.sampling.logits import HostLogits, StepLogits

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB

    from ppd_core.backends.torch.lean.model import LeanDecoder
    from ppd_core.backend_registry import BackendName


def forward_hidden(
    model: PreTrainedModel | LeanDecoder,
    cache: Cache,
    inputs_embeds: torch.Tensor,  # [T, hidden]
    position_ids: torch.Tensor,  # [T]
    attention_mask: torch.Tensor | None,  # [1, 1, T, cached + T] additive, or None for causal
) -> torch.Tensor:
    """Run the decoder body (no LM head) and return the last hidden states [T, hidden]."""
    if forward_of(model) == "lean":
        return model(inputs_embeds, position_ids, attention_mask, cache)
    output = model.base_model(
        inputs_embeds=inputs_embeds[None],
        position_ids=position_ids[None],
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
    )
    return output.last_hidden_state[0]


def forward_of(model: PreTrainedModel | LeanDecoder) -> str:
    """"lean" (a ``LeanDecoder``) or "transformers" (a transformers model)."""
    return getattr(model, "forward_name", "transformers")


def logits_of(model: PreTrainedModel | LeanDecoder, hidden: torch.Tensor) -> torch.Tensor:
    """LM head on selected rows only: [rows, hidden] -> [rows, vocab] float32."""
    return model.get_output_embeddings()(hidden).float()


class TorchDecoder:
    """``Decoder`` over a ``LeanDecoder`` or a transformers model."""

    name: BackendName = "torch"
    tree_note = None  # a transformers cache holds any tree
    accepts_embeddings = True  # prompt-token rows go in as inputs_embeds
    max_tree_rows = 1 << 16  # one forward of any size (the mask grows with it)
    pads_steps = False  # each step its own shape

    def __init__(self, model: PreTrainedModel | LeanDecoder):
        self.model = model
        weight = model.get_input_embeddings().weight
        self.device: torch.device = weight.device  # pyright: ignore
        self.dtype: torch.dtype = weight.dtype  # pyright: ignore
        self.vocab_size = int(weight.shape[0])
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        # fp32 / bf16 / fp16 matmuls and GPU kernels pick other reduction orders for other row counts: a tree row's
        # logits equal a plain step's up to rounding (greedy output up to near-ties), never bit for bit
        self.bitwise = False
        self._masks = TreeMasks(self.dtype, self.device)
        self.info = self.make_info()

    def make_info(self) -> BackendInfo:
        """What this decoder is now, for everything outside decoding (torch's threads as they are now)."""
        threads = torch_device.num_threads()
        properties = torch_device.torch_properties(self.device, threads)
        return BackendInfo(
            name=self.name, forward=self.forward, vocab_size=self.vocab_size, max_context=self.max_context,
            bitwise=self.bitwise, threads=threads, max_tree_rows=self.max_tree_rows,
            accepts_embeddings=self.accepts_embeddings, tree_note=self.tree_note, pads_steps=self.pads_steps,
            kernels=self.describe(), dtype=str(self.dtype).removeprefix("torch."), device=str(self.device),
            device_kind=self.device.type, properties=properties,
            read_memory=functools.partial(torch_device.memory_of, self.device), policy_dtype=True)

    def new_cache(self) -> Cache:
        return new_cache(self.model)

    def cache_length(self, cache: Cache) -> int:
        return cache.length

    @torch.inference_mode()
    def prefill(self, cache: Cache, token_ids: Sequence[int]) -> StepLogits:
        past = cache.length
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)  # [P]
        positions = torch.arange(past, past + len(ids), device=self.device)  # [P]
        hidden = forward_hidden(self.model, cache, self.model.get_input_embeddings()(ids), positions, None)
        return self._step_logits(logits_of(self.model, hidden[-1:]))  # [1, vocab]

    @torch.inference_mode()
    def tree_logits(self, cache: Cache, rows: StepRows) -> StepLogits:
        """Every row at once with the tree's additive mask (``rows.pad_to`` ignored: a torch step is its rows)."""
        cached = cache.length
        tokens = torch.from_numpy(rows.tokens).to(self.device)  # [N]
        embeds = self.model.get_input_embeddings()(tokens)  # [N, hidden]
        if rows.embeddings is not None:
            prompt = torch.from_numpy(rows.embeddings).to(self.device, embeds.dtype)  # [T - N, hidden]
            embeds = torch.cat([embeds, prompt])  # [T, hidden]
        positions = torch.from_numpy(rows.positions).to(self.device) + cached  # [T]
        mask = self._masks.additive(rows.parents, cached) if rows.num_rows > 1 else None
        # one LM-head call over all rows: on a CPU a matmul of 2..16 rows costs about what one of 2 does
        hidden = forward_hidden(self.model, cache, embeds, positions, mask)  # [T, hidden]
        return self._step_logits(logits_of(self.model, hidden))  # [T, vocab]

    def _step_logits(self, logits: torch.Tensor) -> StepLogits:
        """[rows, vocab] float32: NumPy on the CPU (no copy), left on a GPU."""
        return HostLogits(logits.numpy()) if logits.device.type == "cpu" else DeviceLogits(logits)

    def keep(self, cache: Cache, start: int, path: Sequence[int], rows: StepRows) -> None:
        cache.keep(start, path)

    def truncate(self, cache: Cache, length: int) -> None:
        cache.truncate(length)

    @torch.inference_mode()
    def embedding_rows(self, token_ids: np.ndarray) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64)).to(self.device)  # [k]
        return self.model.get_input_embeddings()(ids).float().cpu().numpy()  # [k, hidden]

    def close(self) -> None:
        """Nothing outside Python: the weights go with the last reference."""

    @property
    def forward(self) -> str:
        return forward_of(self.model)

    @property
    def threads(self) -> int:
        """torch's CPU threads (process-wide)."""
        return torch_device.num_threads()

    def set_threads(self, threads: int) -> None:
        """torch's CPU threads, for the whole process; ``info`` made anew to say so."""
        torch_device.set_threads(threads)
        self.info = self.make_info()

    def grammar(self, text: str):
        raise PpdError("a grammar or JSON schema needs a GGUF model (llama.cpp's grammar engine)")

    def describe(self) -> dict:
        kernels = self.model.kernels if self.forward == "lean" else {"linear": "transformers modules", "compiled": False}
        return {"backend": self.name, "forward": self.forward, **kernels}


class DeviceLogits:
    """``StepLogits`` kept on a GPU: answers are computed there and only they cross to the host."""

    def __init__(self, values: torch.Tensor):
        self.values = values  # [rows, vocab] float32
        self.num_rows = values.shape[0]

    def argmax(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        return self.values[rows].argmax(-1).cpu().numpy().astype(np.int64)

    def rows(self, rows: slice | np.ndarray) -> np.ndarray:
        return self.values[rows].cpu().numpy()

    def top_of_mean(self, slots: np.ndarray, k: int) -> np.ndarray:
        index = torch.from_numpy(slots.reshape(-1)).to(self.values.device)
        mean = self.values[index].view(*slots.shape, -1).mean(1)  # [m, vocab]
        return mean.topk(min(k, mean.shape[-1]), dim=-1).indices.cpu().numpy().astype(np.int64)  # [m, k]

    def top_k(self, rows: slice | np.ndarray, k: int) -> np.ndarray:
        if not isinstance(rows, slice):
            rows = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.values.device)
        values = self.values[rows]  # [m, vocab]
        k = min(k, values.shape[-1])
        kth = values.topk(k, dim=-1).values[:, -1:]  # [m, 1]: the k-th largest
        # topk orders and picks exact ties its own way: keep every entry above the k-th largest, then the entries equal
        # to it from the lowest index on, exactly k a row (as the NumPy ``top_k``)
        above, tied = values > kth, values == kth  # [m, vocab]
        wanted = k - above.sum(-1, keepdim=True)  # [m, 1] tied entries to keep
        chosen = above | (tied & (tied.cumsum(-1) <= wanted))  # [m, vocab], k per row
        index = chosen.nonzero()[:, 1].view(-1, k)  # [m, k], ascending
        order = values.gather(-1, index).sort(dim=-1, descending=True, stable=True).indices  # by value, then index
        return index.gather(-1, order).cpu().numpy().astype(np.int64)  # [m, k]

    def top_k_probs(self, rows: slice | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        best = self.top_k(rows, k)  # [m, k]
        if not isinstance(rows, slice):
            rows = torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.values.device)
        values = self.values[rows].float()  # [m, vocab]
        picked = values.gather(-1, torch.from_numpy(best).to(values.device))  # [m, k]
        probs = (picked - values.logsumexp(-1, keepdim=True)).exp()
        return best, probs.cpu().numpy().astype(np.float32)
