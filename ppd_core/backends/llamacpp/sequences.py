"""A step's tree as llama.cpp sees it: sequence ids per row, derived from the rows' parents and cached by them."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=512)  # a few hundred step shapes recur: each derived once
def tree_sequences(row_parents: tuple[int, ...]) -> tuple[list[list[int]], int]:
    """``leaf_sequences`` of the rows, and the number of leaves (sequences) they use."""
    sequences = leaf_sequences(row_parents)
    return sequences, max((ids[-1] for ids in sequences), default=-1) + 1


def leaf_sequences(row_parents: tuple[int, ...]) -> list[list[int]]:
    """One sequence id per leaf row (numbered in row order); each row gets the ids of the leaves below it,
    itself included, ascending. A row's first id then names a sequence whose rows up to the row's own depth are
    exactly its ancestors and itself: the tree mask in llama.cpp's terms (a query sees the cells that hold its
    first sequence id at positions up to its own). Rows come parent first."""
    has_child = [False] * len(row_parents)
    for parent in row_parents:
        if parent >= 0:
            has_child[parent] = True
    sequences: list[list[int]] = [[] for _ in row_parents]
    leaves = [row for row, inner in enumerate(has_child) if not inner]
    for seq, leaf in enumerate(leaves):
        row = leaf
        while row >= 0:
            sequences[row].append(seq)
            row = row_parents[row]
    return sequences
