"""A preallocated KV cache written by position (the lean forward's; the torch decoder edits it through its methods).

A step writes its T rows right after the context; keeping an accepted path is one gather of a
few rows for all layers at once, and a rejected guess costs nothing: the length just stays.
Capacity doubles when a sequence outgrows it, so no tensor grows step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

FIRST_CAPACITY = 1024  # positions; doubled as needed, up to the model's context


@dataclass
class StaticCache:
    keys: torch.Tensor  # [layers, kv_heads, capacity, head_dim]
    values: torch.Tensor  # [layers, kv_heads, capacity, head_dim]
    max_length: int  # the model's context: capacity never exceeds it
    length: int = 0  # positions holding the sequence so far

    @staticmethod
    def empty(layers: int, kv_heads: int, max_length: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> StaticCache:
        shape = (layers, kv_heads, min(FIRST_CAPACITY, max_length), head_dim)
        # empty, not zeros: nothing reads past ``length``, and untouched pages take no memory until written
        return StaticCache(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device), max_length)

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def reserve(self, end: int) -> None:
        """Make room for positions up to ``end`` (doubling; the filled part is copied once)."""
        if end <= self.capacity:
            return
        if end > self.max_length:
            raise ValueError(f"{end} positions exceed the model's context of {self.max_length}")
        capacity = min(max(end, 2 * self.capacity), self.max_length)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty(old.shape[0], old.shape[1], capacity, old.shape[3])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys/values [kv_heads, T, head_dim] at ``start``; return the layer's [kv_heads, start + T, head_dim] views."""
        end = start + keys.shape[1]
        self.keys[layer, :, start:end] = keys
        self.values[layer, :, start:end] = values
        return self.keys[layer, :, :end], self.values[layer, :, :end]

    def keep(self, start: int, rows: Sequence[int]) -> None:
        """Keep rows ``start + rows[i]`` at ``start + i`` (an accepted path, root first) and drop the rest."""
        count = len(rows)
        if list(rows) != list(range(count)):
            index = torch.tensor(rows, device=self.keys.device) + start
            self.keys[:, :, start : start + count] = self.keys[:, :, index]
            self.values[:, :, start : start + count] = self.values[:, :, index]
        self.length = start + count

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
