"""A step's tree as torch attends over it: the additive mask, derived from the rows' parents and cached by them."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

MAX_KEPT = 256  # tree shapes whose mask block is kept (a few hundred recur)


def ancestor_mask(row_parents: tuple[int, ...]) -> np.ndarray:
    """[T, T] bool: row i may attend to row j when j is i or one of its ancestors (rows come parent first)."""
    mask = np.eye(len(row_parents), dtype=bool)
    for row, parent in enumerate(row_parents):
        if parent >= 0:
            mask[row] |= mask[parent]
    return mask


def additive_mask(row_parents: tuple[int, ...], cache_length: int, dtype: torch.dtype, device: torch.device,
                  block: torch.Tensor | None = None) -> torch.Tensor:
    """The tree's float mask [1, 1, T, cache_length + T]: 0 where allowed, the dtype's minimum elsewhere (``block``:
    the tree part, made before)."""
    if block is None:
        block = tree_block(row_parents, dtype).to(device)
    context = torch.zeros(len(row_parents), cache_length, dtype=dtype, device=device)
    return torch.cat([context, block], dim=1)[None, None]


def tree_block(row_parents: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """[T, T] the tree part of the additive mask, on the CPU."""
    block = torch.zeros(len(row_parents), len(row_parents), dtype=dtype)
    return block.masked_fill_(~torch.from_numpy(ancestor_mask(row_parents)), torch.finfo(dtype).min)


class TreeMasks:
    """One decoder's tree blocks by parents, on its device in its dtype, the least recently used dropped."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device = dtype, device
        self._blocks: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def additive(self, row_parents: tuple[int, ...], cache_length: int) -> torch.Tensor:
        block = self._blocks.pop(row_parents, None)
        if block is None:
            block = tree_block(row_parents, self.dtype).to(self.device)
        self._blocks[row_parents] = block
        if len(self._blocks) > MAX_KEPT:
            self._blocks.popitem(last=False)
        return additive_mask(row_parents, cache_length, self.dtype, self.device, block)
