"""Verification: which guessed candidates the model itself would have produced.

Greedy: a candidate is accepted when it is its parent's argmax. Lossless sampling: walk
from the root, sampling each node's token from the model's (adjusted) distribution; when
the sample is one of the node's candidate children, move there, else emit it and stop.
Every emitted token is then an honest sample from the model, so the output distribution is
exactly the model's. Typical acceptance (the paper's) accepts a child whose probability
clears an entropy-dependent bar: faster, not distribution-preserving.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ppd_core.sampling import SamplingParams, adjusted_probs, sample, typical_threshold


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


def children_of(parents: Sequence[int]) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def accept(
    parents: Sequence[int],
    node_tokens: Sequence[int],
    node_logits: torch.Tensor,  # [N, vocab]
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """The last accepted node and the token the model adds after it (its argmax or a sample)."""
    if params.greedy:
        targets = node_logits.argmax(-1).tolist()
        last = greedy_accept(parents, node_tokens, targets)
        return last, targets[last]
    children = children_of(parents)
    node = 0
    while True:
        probs = adjusted_probs(node_logits[node], params)  # [vocab]
        if params.acceptance == "lossless":
            token = sample(probs, generator)
            nxt = next((c for c in children[node] if node_tokens[c] == token), None)
            if nxt is None:
                return node, token
        else:
            bar = typical_threshold(probs, params)
            passing = [c for c in children[node] if float(probs[node_tokens[c]]) > bar]
            if not passing:
                return node, sample(probs, generator)
            nxt = max(passing, key=lambda c: float(probs[node_tokens[c]]))
        node = nxt
