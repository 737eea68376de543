"""Verification: which guessed candidates the model itself would have produced."""

from __future__ import annotations

from collections.abc import Sequence


def greedy_accept(parents: Sequence[int], node_tokens: Sequence[int], targets: Sequence[int]) -> int:
    """The deepest node whose whole path matches the model's greedy choices.

    A candidate is accepted when its token equals the argmax at its parent and its parent
    is accepted. Nodes are in breadth-first order, so a later accepted node is never
    shallower than an earlier one.

    Args:
        parents: parent node index of each node (-1 for the root, node 0).
        node_tokens: token of each node.
        targets: argmax of the model's logits at each node.
    Returns:
        index of the last accepted node (0 when no guess matched).
    """
    accepted = [False] * len(parents)
    accepted[0] = True
    last = 0
    for node in range(1, len(parents)):
        parent = parents[node]
        if accepted[parent] and node_tokens[node] == targets[parent]:
            accepted[node] = True
            last = node
    return last
