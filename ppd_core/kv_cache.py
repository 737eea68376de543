"""The KV cache: the only module that touches cache internals, for both forward paths.

A tree forward appends every tree token's keys and values; afterwards only the accepted
path (root first) is kept, moved to contiguous positions right after the old context. The
lean forward (``ppd_core.lean``) uses a preallocated ``StaticCache``; the transformers path a
``DynamicCache``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ppd_core.lean.cache import StaticCache
from ppd_core.lean.model import LeanDecoder

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB

Cache = DynamicCache | StaticCache


def new_cache(model: PreTrainedModel | LeanDecoder) -> Cache:
    if isinstance(model, LeanDecoder):
        return model.new_cache()
    return DynamicCache(config=model.config)


def cache_length(cache: Cache) -> int:
    if isinstance(cache, StaticCache):
        return cache.length
    return cache.get_seq_length()


@torch.inference_mode()
def keep_tree_entries(cache: Cache, start: int, keep: Sequence[int]) -> None:
    """Keep tree rows ``start + keep[i]`` at ``start + i`` and drop all rows after them.

    ``keep`` lists tree token indices in increasing order (an accepted path, root first).
    """
    if isinstance(cache, StaticCache):
        cache.keep(start, keep)
        return
    count = len(keep)
    contiguous = list(keep) == list(range(count))
    index = None if contiguous else torch.tensor(keep, dtype=torch.long)
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        for name in ("keys", "values"):
            states = getattr(layer, name)  # [batch, kv_heads, length, head_dim]
            if index is not None:
                rows = index.to(states.device) + start
                states[:, :, start : start + count] = states[:, :, rows]
            setattr(layer, name, states[:, :, : start + count])


def truncate(cache: Cache, length: int) -> None:
    """Drop every row at position ``length`` and later."""
    if isinstance(cache, StaticCache):
        cache.truncate(length)
        return
    extra = cache_length(cache) - length
    if extra > 0:
        cache.crop(-extra)
