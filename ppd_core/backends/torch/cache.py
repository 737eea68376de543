"""The transformers forward's KV cache: ``DynamicCache`` with the tree's two edits as methods, as the lean
forward's ``StaticCache`` has them, so the decoder never asks which cache it holds.

A tree forward appends every tree token's keys and values; afterwards only the accepted
path (root first) is kept, moved to contiguous positions right after the old context.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ppd_core.backends.torch.lean.cache import StaticCache


class TreeCache(DynamicCache):
    """transformers' ``DynamicCache`` that keeps a tree's accepted path and truncates, like ``StaticCache``."""

    @property
    def length(self) -> int:
        return self.get_seq_length()

    @torch.inference_mode()
    def keep(self, start: int, keep: Sequence[int]) -> None:
        """Keep tree rows ``start + keep[i]`` at ``start + i`` and drop all rows after them.

        ``keep`` lists tree token indices in increasing order (an accepted path, root first).
        """
        count = len(keep)
        contiguous = list(keep) == list(range(count))
        index = None if contiguous else torch.tensor(keep, dtype=torch.long)
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            for name in ("keys", "values"):
                states = getattr(layer, name)  # [batch, kv_heads, length, head_dim]
                if index is not None:
                    rows = index.to(states.device) + start
                    states[:, :, start : start + count] = states[:, :, rows]
                setattr(layer, name, states[:, :, : start + count])

    def truncate(self, length: int) -> None:
        """Drop every row at position ``length`` and later."""
        extra = self.length - length
        if extra > 0:
            self.crop(-extra)


Cache = TreeCache | StaticCache


def new_cache(model) -> Cache:
    """An empty cache for ``model``: the lean forward's own, or a ``TreeCache`` for a transformers model."""
    make = getattr(model, "new_cache", None)  # the lean forward makes its StaticCache
    return make() if make is not None else TreeCache(config=model.config)
