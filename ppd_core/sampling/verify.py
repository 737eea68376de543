"""Verification: which guessed candidates the model itself would have produced, and the distribution it samples.

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
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.sampling.logits import HostLogits, StepLogits
from ppd_core.sampling.penalties import penalize

if TYPE_CHECKING:
    from ppd_core.sampling.constraint import Grammar
    from ppd_core.sampling.params import SamplingParams


def softmax(scaled: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in float64; -inf entries get probability 0."""
    shifted = np.exp(scaled - scaled.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def adjusted_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T) cut to top-k, top-p and min-p, renormalised.

    Min-p is llama.cpp's (``llama_sampler_min_p_apply``), at its place in llama.cpp's sampler chain (after the
    penalties, top-k and top-p, before the temperature): it keeps the tokens whose logit is at least the top logit +
    log(min_p), in float32, on the logits before the temperature.
    logits: [..., vocab]; returns float64 probabilities of the same shape.
    """
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = -np.partition(-scaled, params.top_k - 1, axis=-1)[..., params.top_k - 1 : params.top_k]  # [..., 1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = softmax(scaled)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")  # [..., vocab] likeliest first
        sorted_probs = np.take_along_axis(probs, order, -1)
        before = np.cumsum(sorted_probs, -1) - sorted_probs  # mass of the tokens ranked above
        sorted_probs = np.where(before >= params.top_p, 0.0, sorted_probs)  # the top token always stays
        probs = np.zeros_like(probs)
        np.put_along_axis(probs, order, sorted_probs, -1)
        probs /= probs.sum(-1, keepdims=True)
    if params.min_p > 0.0:
        raw = logits.astype(np.float32)  # [..., vocab]: the top token survives top-k and top-p, so it is the top here
        cut = raw.max(-1, keepdims=True) + np.float32(math.log(np.float32(params.min_p)))  # [..., 1] float32
        probs = np.where(raw >= cut, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, generator: np.random.Generator) -> int:
    """One token from a [vocab] distribution (inverse CDF of one uniform draw: a seed reproduces it anywhere)."""
    cumulative = np.cumsum(probs, dtype=np.float64)
    token = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
    return min(token, len(probs) - 1)


def typical_threshold(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The typical-acceptance bar min(epsilon, alpha * exp(-entropy)) of each distribution.

    probs: [..., vocab], the untruncated softmax(logits / T) (no top-k / top-p); returns [...].
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, probs * np.log(probs), 0.0)  # 0 * log 0 counts as 0
    entropy = -terms.sum(-1)
    return np.minimum(params.typical_alpha * np.exp(-entropy), params.typical_epsilon)


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


def typical_accept(parents: Sequence[int], node_tokens: Sequence[int], node_logits: np.ndarray, params: SamplingParams) -> int:
    """The last node of the longest path accepted by typical acceptance (Medusa's rule).

    A node is accepted when its parent is and its token's probability under the parent's
    untruncated softmax(logits / T) exceeds min(epsilon, alpha * exp(-entropy)) there.
    Among the deepest accepted nodes the one whose path is likeliest (sum of log-probs) wins.
    Nodes are in breadth-first order (a parent before its children). node_logits: [N, vocab].
    """
    probs = softmax(node_logits.astype(np.float64) / params.temperature)  # [N, vocab], untruncated
    bars = typical_threshold(probs, params).tolist()  # [N]
    token_probs = [1.0] + probs[list(parents[1:]), list(node_tokens[1:])].tolist()  # [N]: p(node's token | parent)
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
    logits: StepLogits,  # rows [0, N) are the nodes'
    params: SamplingParams,
    generator: np.random.Generator | None,
    recent: np.ndarray | None = None,  # [W] the penalties' window of the sequence, the root last (``penalties.window``)
    grammar: Grammar | None = None,  # the grammar's state after the tokens so far (the root's); advanced in place
) -> tuple[int, int]:
    """The last accepted node and the token the model adds after it (its argmax or a sample).

    With repetition penalties, each node's row is penalised with its own path's tokens first (in place; put back
    before returning, so the step's logits stay the model's own). With a grammar, each row reached is constrained by
    the grammar's state after its own path, and ``grammar`` ends after the emitted tokens."""
    if not params.penalized:
        return accept_rows(parents, node_tokens, logits, params, generator, grammar)
    rows = logits.rows(slice(0, len(parents)))  # [N, vocab]
    changed_rows, changed_tokens, earlier = penalize(rows, recent, parents, node_tokens, params)
    try:
        return accept_rows(parents, node_tokens, HostLogits(rows), params, generator, grammar)
    finally:
        rows[changed_rows, changed_tokens] = earlier


def grammar_accept(parents: Sequence[int], node_tokens: Sequence[int], logits: StepLogits, params: SamplingParams,
                   generator: np.random.Generator | None, grammar: Grammar) -> tuple[int, int]:
    """``accept`` under a grammar: greedy takes each reached row's constrained argmax (``Grammar.best``), sampling
    draws from the constrained distribution (typical acceptance too: lossless here). States are made only for the
    nodes reached (the parent's, one token further); ``grammar`` ends after the path and the bonus token."""
    children = children_of(parents)
    states = {0: grammar}  # node -> the grammar after its path
    if params.greedy:  # every node whose path matches, breadth-first: the last is the deepest, as ``greedy_accept``
        last, target = 0, -1
        for node in range(len(parents)):
            if node not in states:
                continue
            choice = states[node].best(logits.rows(slice(node, node + 1))[0])
            last, target = node, choice
            for child in children[node]:
                if node_tokens[child] == choice:
                    states[child] = states[node].child(choice)
        node, token = last, target
    else:
        node = 0
        while True:
            row = states[node].allowed(logits.rows(slice(node, node + 1))[0])
            token = sample(adjusted_probs(row, params), generator)
            nxt = next((c for c in children[node] if node_tokens[c] == token), None)
            if nxt is None:
                break
            states[nxt] = states[node].child(token)
            node = nxt
    grammar.take(states[node])
    grammar.accept(token)
    return node, token


def accept_rows(parents: Sequence[int], node_tokens: Sequence[int], logits: StepLogits, params: SamplingParams,
                generator: np.random.Generator | None, grammar: Grammar | None = None) -> tuple[int, int]:
    """``accept`` on logits as they are."""
    if grammar is not None:
        return grammar_accept(parents, node_tokens, logits, params, generator, grammar)
    count = len(parents)
    if params.greedy:
        targets = logits.argmax(slice(0, count)).tolist()
        last = greedy_accept(parents, node_tokens, targets)
        return last, targets[last]
    if params.acceptance == "typical":
        last = typical_accept(parents, node_tokens, logits.rows(slice(0, count)), params)
        return last, sample(adjusted_probs(logits.rows(slice(last, last + 1))[0], params), generator)
    children = children_of(parents)
    node = 0
    while True:
        probs = adjusted_probs(logits.rows(slice(node, node + 1))[0], params)  # [vocab]
        token = sample(probs, generator)
        nxt = next((c for c in children[node] if node_tokens[c] == token), None)
        if nxt is None:
            return node, token
        node = nxt
