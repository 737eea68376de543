"""Verification: which guessed candidates the model itself would have produced.

Greedy: a candidate is accepted when it is its parent's argmax. Lossless sampling: walk
from the root, sampling each node's token from the model's (adjusted) distribution; when
the sample is one of the node's candidate children, move there, else emit it and stop.
Every emitted token is then an honest sample from the model, so the output distribution is
exactly the model's. Typical acceptance (the paper's, after Medusa) accepts a node whose
probability under its parent's softmax(logits / T) clears an entropy-dependent bar, keeps
the longest accepted path (ties: the likeliest), then samples the bonus token: faster, not
distribution-preserving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ppd_core.sampling import adjusted_probs, sample, typical_threshold
from ppd_core.sampling_params import SamplingParams


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


def typical_accept(parents: Sequence[int], node_tokens: Sequence[int], node_logits: torch.Tensor, params: SamplingParams) -> int:
    """The last node of the longest path accepted by typical acceptance (Medusa's rule).

    A node is accepted when its parent is and its token's probability under the parent's
    untruncated softmax(logits / T) exceeds min(epsilon, alpha * exp(-entropy)) there.
    Among the deepest accepted nodes the one whose path is likeliest (sum of log-probs) wins.
    Nodes are in breadth-first order (a parent before its children).
    """
    probs = (node_logits.float() / params.temperature).softmax(-1)  # [N, vocab], untruncated
    bars = typical_threshold(probs, params).tolist()  # [N]
    rows = torch.tensor(parents[1:], dtype=torch.long, device=probs.device)  # [N-1]
    cols = torch.tensor(node_tokens[1:], dtype=torch.long, device=probs.device)  # [N-1]
    token_probs = [1.0] + probs[rows, cols].tolist()  # [N]: p(node's token | parent)
    depth = [0] * len(parents)
    log_likelihood = [0.0] * len(parents)
    accepted = [True] + [False] * (len(parents) - 1)
    best = 0
    for node in range(1, len(parents)):
        parent = parents[node]
        if not (accepted[parent] and token_probs[node] > bars[parent]):
            continue
        accepted[node] = True
        depth[node] = depth[parent] + 1
        log_likelihood[node] = log_likelihood[parent] + math.log(token_probs[node])
        if (depth[node], log_likelihood[node]) > (depth[best], log_likelihood[best]):
            best = node
    return best


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
    if params.acceptance == "typical":
        last = typical_accept(parents, node_tokens, node_logits, params)
        return last, sample(adjusted_probs(node_logits[last], params), generator)
    children = children_of(parents)
    node = 0
    while True:
        probs = adjusted_probs(node_logits[node], params)  # [vocab]
        token = sample(probs, generator)
        nxt = next((c for c in children[node] if node_tokens[c] == token), None)
        if nxt is None:
            return node, token
        node = nxt
