"""Sparse guess trees: pure data and buffer construction, no model in sight.

A step's input is a tree of tokens laid out in one sequence:

    [root, candidate nodes in breadth-first order, prompt tokens]

* The root is the last accepted token (not yet in the KV cache).
* A candidate node is named by its path of ranks: ``(0, 1)`` is the 2nd most likely guess
  at depth 2 under the most likely guess at depth 1. Its token is the rank-``r`` guess of
  prompt token ``depth`` from the previous step.
* ``m`` prompt tokens attached to a node (each ``V`` ensemble members) produce the next
  step's guesses for depths ``1..m`` should that node be the last one accepted.

``TreeSpec`` is the description (what calibration chooses); ``Tree`` holds the buffers the
decoding step needs (attention mask, position offsets, guess indices, paths).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

Path = tuple[int, ...]


@dataclass(frozen=True)
class TreeSpec:
    """Candidate rank paths and the number of prompt tokens attached to each node.

    Args:
        prompt_counts: maps every node path (``()`` is the root) to its prompt-token count.
            The keys are the tree's nodes; a candidate's parent must be a node too.
    """

    prompt_counts: dict[Path, int]

    @property
    def candidates(self) -> list[Path]:
        return sorted((p for p in self.prompt_counts if p), key=lambda p: (len(p), p))

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.prompt_counts), default=0)

    @property
    def num_tokens(self) -> int:
        """Tree tokens in one forward pass with ensemble size 1."""
        return len(self.prompt_counts) + sum(self.prompt_counts.values())

    def restricted(self, max_depth: int) -> TreeSpec:
        """The same tree with candidates deeper than ``max_depth`` removed."""
        return TreeSpec({p: c for p, c in self.prompt_counts.items() if len(p) <= max_depth})

    def to_json(self) -> list[list]:
        return [[list(p), c] for p, c in sorted(self.prompt_counts.items(), key=lambda i: (len(i[0]), i[0]))]

    @staticmethod
    def from_json(items: list[list]) -> TreeSpec:
        return TreeSpec({tuple(int(r) for r in p): int(c) for p, c in items})


@dataclass(frozen=True, eq=False)
class Tree:
    """Buffers for one tree forward pass, as NumPy arrays (a backend converts what it needs at its edge).

    Token layout: nodes ``[0, num_nodes)`` (root first, breadth-first), then prompt tokens.
    """

    spec: TreeSpec
    num_prompt_tokens: int  # n: prompt tokens the model was trained with
    ensemble_size: int  # V: members per prompt token
    paths: tuple[Path, ...]  # node paths, breadth-first
    parents: tuple[int, ...]  # parent node index of each node, -1 for the root
    row_parents: tuple[int, ...]  # parent row of every token row (nodes and prompt tokens), -1 for the root
    node_paths: tuple[tuple[int, ...], ...]  # node indices from the root to each node
    prompt_counts: tuple[int, ...]  # prompt tokens attached to each node
    candidate_depths: np.ndarray  # [num_nodes - 1] int64 depth (1-based) of each candidate
    candidate_ranks: np.ndarray  # [num_nodes - 1] int64 rank of each candidate's guess
    position_offsets: np.ndarray  # [num_tokens] int64 position id minus cache length
    prompt_embedding_index: np.ndarray  # [num_tokens - num_nodes] int64 row of the flattened [n*V] table
    prompt_slots: np.ndarray  # [num_nodes, n, V] int64 token index of (node, prompt k, member j); -1 if absent
    attention_mask: np.ndarray  # [num_tokens, num_tokens] bool, True where attending is allowed (a row's ancestors)

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    @property
    def num_tokens(self) -> int:
        return self.attention_mask.shape[0]

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_rank(self) -> int:
        return max((p[-1] for p in self.paths if p), default=-1)

    @functools.cached_property
    def max_offset(self) -> int:
        """The largest position offset: how far past the root this tree reaches."""
        return int(self.position_offsets.max())


def build_tree(spec: TreeSpec, num_prompt_tokens: int, ensemble_size: int = 1, max_depth: int | None = None) -> Tree:
    """Build the buffers of ``spec``; raises ValueError on an inconsistent description.

    ``max_depth``: the deepest candidate allowed (default: the ``num_prompt_tokens`` depths that
    prompt tokens guess; a lookup chain can reach deeper).
    """
    n, V = num_prompt_tokens, ensemble_size
    check_spec(spec, n, V, n if max_depth is None else max_depth)

    paths = [()] + spec.candidates
    index = {p: i for i, p in enumerate(paths)}
    parents = [-1] + [index[p[:-1]] for p in paths[1:]]
    node_paths = [(0,)]
    for p in paths[1:]:
        node_paths.append(node_paths[index[p[:-1]]] + (index[p],))
    counts = [spec.prompt_counts[p] for p in paths]

    num_nodes = len(paths)
    num_tokens = num_nodes + V * sum(counts)
    offsets = [len(p) for p in paths]
    embedding_index: list[int] = []
    slots = np.full((num_nodes, max(n, 1), V), -1, dtype=np.int64)
    mask = np.zeros((num_tokens, num_tokens), dtype=bool)
    for i, ancestors in enumerate(node_paths):
        mask[i, list(ancestors)] = True  # a node sees its ancestors and itself

    row_parents = list(parents)
    position = num_nodes
    for i, path in enumerate(paths):
        for k in range(counts[i]):  # prompt token k+1 of node i
            for j in range(V):
                slots[i, k, j] = position
                row_parents.append(i if k == 0 else int(slots[i, k - 1, j]))  # member j's chain hangs under node i
                offsets.append(len(path) + k + 1)
                embedding_index.append(k * V + j)
                mask[position, list(node_paths[i])] = True  # the node's path
                earlier = slots[i, : k + 1, j]  # member j of prompt tokens 1..k+1, itself included
                mask[position, earlier] = True
                position += 1

    return Tree(
        spec=spec,
        num_prompt_tokens=n,
        ensemble_size=V,
        paths=tuple(paths),
        parents=tuple(parents),
        row_parents=tuple(row_parents),
        node_paths=tuple(node_paths),
        prompt_counts=tuple(counts),
        candidate_depths=np.array([len(p) for p in paths[1:]], dtype=np.int64),
        candidate_ranks=np.array([p[-1] for p in paths[1:]], dtype=np.int64),
        position_offsets=np.array(offsets, dtype=np.int64),
        prompt_embedding_index=np.array(embedding_index, dtype=np.int64),
        prompt_slots=slots,
        attention_mask=mask,
    )


def check_spec(spec: TreeSpec, n: int, V: int, deepest: int) -> None:
    """Raise ValueError unless ``spec`` is a tree of ranks with ``n`` prompt tokens of ``V`` members at most."""
    if () not in spec.prompt_counts:
        raise ValueError("tree has no root node ()")
    if n < 0 or V < 1:
        raise ValueError(f"need num_prompt_tokens >= 0 and ensemble_size >= 1, got {n}, {V}")
    for path, count in spec.prompt_counts.items():
        if any(r < 0 for r in path):
            raise ValueError(f"negative rank in {path}")
        if path and path[:-1] not in spec.prompt_counts:
            raise ValueError(f"candidate {path} has no parent in the tree")
        if len(path) > deepest:
            raise ValueError(f"candidate {path} is deeper than the {deepest} depths guessed")
        if not 0 <= count <= n:
            raise ValueError(f"node {path} has {count} prompt tokens; allowed 0..{n}")


@dataclass(frozen=True, eq=False)
class TreeFamily:
    """One tree per number of guessed depths available (0..n), chosen per step.

    The prompt tokens on the last accepted node decide how deep the next step's guesses
    go, so the tree used next depends on them ("dynamic" tree).
    """

    name: str
    trees: tuple[Tree, ...]  # trees[m]: the tree used when m depths of guesses are available

    def for_depth(self, available: int) -> Tree:
        return self.trees[min(available, len(self.trees) - 1)]

    @property
    def num_tokens(self) -> int:
        """Tokens in the full-depth tree (the size quoted in reports)."""
        return self.trees[-1].num_tokens

    @property
    def max_rank(self) -> int:
        return max(t.max_rank for t in self.trees)


def family_from_spec(name: str, spec: TreeSpec, num_prompt_tokens: int, ensemble_size: int = 1) -> TreeFamily:
    """A family whose tree for depth m is ``spec`` restricted to candidates of depth <= m."""
    trees = tuple(
        build_tree(spec.restricted(m), num_prompt_tokens, ensemble_size) for m in range(spec.depth + 1)
    )
    return TreeFamily(name=name, trees=trees)


def family_from_specs(name: str, specs: list[TreeSpec], num_prompt_tokens: int, ensemble_size: int = 1) -> TreeFamily:
    """A family whose tree for depth m is ``specs[m]`` (calibration designs each one)."""
    return TreeFamily(name=name, trees=tuple(build_tree(s, num_prompt_tokens, ensemble_size) for s in specs))


@functools.cache
def root_only_tree() -> Tree:
    """The root alone: one plain autoregressive step."""
    return build_tree(TreeSpec({(): 0}), 0)


def plain_family() -> TreeFamily:
    """Plain autoregressive decoding: no guesses, no prompt tokens."""
    return TreeFamily(name="plain", trees=(root_only_tree(),))
