"""One merge per step: every drafter's proposal (``base.Guesses``) becomes the step's one tree, under its row budget.

Identical prefixes from different sources become one node, its acceptance estimate the highest of theirs (the sources
read the same text, so one agreeing with another is little evidence: 1 - prod(1 - p), which takes them as
independent, sized trees on another device's step curve worse, ``merged_tree.py --curve``); its owner is the first
source (in drafter order) that proposed it. Nodes are kept in order of expected accepted tokens, the product of the estimates along the
node's path (the PPD paper's Proposition B.1), ties to the earlier drafter, then to proposal order; a child's product
is never above its parent's, so parents come first. A node is kept while its rows (1, plus its prompt-token rows) fit
the budget, one of the sources proposing it is within its proposal's ``limit``, its parent is kept and, with a
grammar, the grammar allows its token after its path (a forbidden node goes with its subtree, whichever source's).
With the step's costs by rows (``Draft.row_costs``), the step keeps the best nodes only as far as they pay: the count
with the most expected tokens per unit of step time (``paying``); a step with no node worth its row is a plain step.

The kept nodes are laid out breadth-first, each depth ordered by parent, then by (drafter, proposal) order, and each
is given as its rank its order among the nodes of its depth: the rank paths describe the tree (``tree.TreeSpec``),
and ``tree.build_tree`` makes its buffers in the same order. Trees are kept by shape (``Merger``, an LRU), so a step
whose tree has the shape of an earlier one reuses its buffers (and a backend's masks converted for it).

Cost: ``nice -n 19 env PYTHONPATH=$PWD .venv/bin/python benchmarks/scripts/merge_cost.py`` (python 3.11, 2 cores busy
with other work meanwhile) timed the prompt tokens' proposal and the merge of a 16-node prompt-token tree (3 depths,
prompt-token rows on its nodes) with a 6-token lookup chain sharing its first node, no grammar, the tree's shape
cached: 129 us per step, against 13.3 ms for the cheapest llama.cpp step of the default model on 2 threads
(a step curve not kept in the repository).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.drafters.base import Draft
from ppd_core.tree import Tree, TreeSpec, build_tree, root_only_tree

if TYPE_CHECKING:
    from ppd_core.sampling.constraint import Grammar

MAX_BUILT = 256  # tree shapes kept


@dataclass(frozen=True, eq=False)
class StepTree:
    """The step's tree: what the decoder verifies and what the drafters learn from."""

    node_tokens: np.ndarray  # [N] int64: the root (the token the step starts from), then the kept nodes, breadth-first
    parents: tuple[int, ...]  # [N] each node's parent index, -1 for the root
    owners: tuple[str, ...]  # [N] the source that proposed each node first ("" for the root)
    tree: Tree  # the buffers (its ``prompt_counts``: the prompt-token rows carried over from the prompt tokens' proposal)
    kept: dict[str, list[int]]  # per proposing drafter: the node each node of its proposal became (-1: not kept)

    @property
    def prompt_counts(self) -> tuple[int, ...]:
        """[N] prompt tokens on each node (V rows each)."""
        return self.tree.prompt_counts

    @property
    def drafted(self) -> dict[str, int]:
        """Nodes each proposing source owns in the tree (0 for one whose nodes all went, or all were another's)."""
        counts = dict.fromkeys(self.kept, 0)
        for owner in self.owners[1:]:
            counts[owner] = counts.get(owner, 0) + 1
        return counts


def root_only(root: int) -> StepTree:
    """The root alone: a plain step."""
    return StepTree(np.array([root], dtype=np.int64), (-1,), ("",), root_only_tree(), {})


def from_tree(tree: Tree, guesses: np.ndarray | None, root: int, owner: str = "prompt tokens") -> StepTree:
    """A given tree as a step's (calibration times fixed shapes): candidate (depth d, rank r) is ``guesses[d - 1, r]``."""
    tokens = [root]
    if tree.num_nodes > 1:
        tokens += guesses[tree.candidate_depths - 1, tree.candidate_ranks].tolist()
    return StepTree(np.array(tokens, dtype=np.int64), tree.parents, ("",) + (owner,) * (tree.num_nodes - 1), tree, {})


@dataclass
class _Nodes:
    """The union of the proposals, one entry per distinct (parent, token), in order of creation (parents first)."""

    token: list[int]
    parent: list[int]  # -1: under the root
    miss: list[float]  # 1 - the highest estimate of the sources proposing it
    prompts: list[int]  # prompt tokens on it (the prompt tokens' proposal's)
    owner: list[int]  # the first proposing source, by index
    proposers: list[list[int]]  # every proposing source, by index
    maps: list[list[int]]  # per source: the entry each of its proposal's nodes became


def union(proposals: Sequence) -> _Nodes:
    """The proposals' nodes with identical prefixes joined (``proposals``: ``Guesses`` in drafter order)."""
    nodes = _Nodes([], [], [], [], [], [], [])
    token, parent, miss, prompts, owner, proposers = (nodes.token, nodes.parent, nodes.miss, nodes.prompts,
                                                      nodes.owner, nodes.proposers)
    children: dict[tuple[int, int], int] = {}
    for source, guesses in enumerate(proposals):
        mapping: list[int] = []
        counts = guesses.prompt_counts
        for j, (tok, up, prob) in enumerate(zip(guesses.tokens, guesses.parents, guesses.probs)):
            up = -1 if up < 0 else mapping[up]
            m = children.get((up, tok))
            if m is None:
                m = children[up, tok] = len(token)
                token.append(tok)
                parent.append(up)
                miss.append(1.0)
                prompts.append(0)
                owner.append(source)
                proposers.append([source])
            elif proposers[m][-1] != source:
                proposers[m].append(source)
            miss[m] = min(miss[m], 1.0 - prob)
            if j < len(counts) and counts[j] > prompts[m]:
                prompts[m] = counts[j]
            mapping.append(m)
        nodes.maps.append(mapping)
    return nodes


def select(nodes: _Nodes, draft: Draft, limits: Sequence[int | None], grammar: Grammar | None) -> tuple[list[bool], bool]:
    """Which entries the step keeps: best path product first, within the budget, the limits and the grammar; with
    the step's costs by rows only as many as pay (``paying``). And whether the step drops every prompt-token row: with
    costs, where its guesses pay more without them than with them and what the prompt tokens would guess next step
    (``Draft.prompt_value``)."""
    value: list[float] = []
    for m, up in enumerate(nodes.parent):
        value.append((1.0 - nodes.miss[m]) * (value[up] if up >= 0 else 1.0))
    states = GrammarStates(grammar, nodes.token, nodes.parent) if grammar is not None else None
    try:
        kept, order = best_first(nodes, value, draft, limits, states, draft.ensemble_size)
        if draft.row_costs is None:
            return kept, False
        rows = 1 + draft.root_prompts * draft.ensemble_size
        prompted = rows > 1 or any(cost > 1 for _, cost in order)
        count, rate = paying(order, value, rows, draft.row_costs, draft.prompt_value if prompted else 0.0)
        strip = False
        if prompted:  # the same step without prompt-token rows: its rows go to guesses
            bare, bare_order = best_first(nodes, value, draft, limits, states, 0)
            bare_count, bare_rate = paying(bare_order, value, 1, draft.row_costs, 0.0)
            if bare_rate > rate:
                kept, order, count, strip = bare, bare_order, bare_count, True
    finally:
        if states is not None:
            states.close()
    for m, _ in order[count:]:
        kept[m] = False
    return kept, strip


def best_first(nodes: _Nodes, value: Sequence[float], draft: Draft, limits: Sequence[int | None],
               states: GrammarStates | None, V: int) -> tuple[list[bool], list[tuple[int, int]]]:
    """The entries kept best path product first while they fit the budget (``V`` rows per prompt token; 0: none),
    their source's limits and the grammar; and (entry, its rows) in the order kept."""
    parent, prompts, proposers = nodes.parent, nodes.prompts, nodes.proposers
    kept = [False] * len(parent)
    order: list[tuple[int, int]] = []
    used = [0] * len(limits)
    rows = 1 + draft.root_prompts * V
    for m in sorted(range(len(parent)), key=lambda m: (-value[m], m)):
        up, cost = parent[m], 1 + prompts[m] * V
        if (up >= 0 and not kept[up]) or rows + cost > draft.max_rows:
            continue
        if not any(limits[s] is None or used[s] < limits[s] for s in proposers[m]):
            continue
        if states is not None and not states.allows(m):
            continue
        kept[m] = True
        order.append((m, cost))
        rows += cost
        for s in proposers[m]:
            used[s] += 1
    return kept, order


def paying(order: Sequence[tuple[int, int]], value: Sequence[float], rows: int, row_costs: Sequence[float],
           bonus: float = 0.0) -> tuple[int, float]:
    """How many of the kept entries (``order``: best first, parents first, with their rows) the step keeps, and its
    expected tokens per unit of step cost: the count with the most (1 + ``bonus`` + the sum of their path products
    over ``row_costs[r]``, an r-row step's cost in plain steps; ``rows``: the root's). Any such count is a tree: a
    parent comes before its child."""
    if rows + sum(cost for _, cost in order) > len(row_costs) - 1:
        return len(order), 0.0  # beyond the costs known: the budget decides
    best, count, tokens = (1.0 + bonus) / row_costs[rows], 0, 1.0 + bonus
    for i, (m, cost) in enumerate(order, 1):
        tokens, rows = tokens + value[m], rows + cost
        if tokens / row_costs[rows] > best:
            best, count = tokens / row_costs[rows], i
    return count, best


class GrammarStates:
    """The grammar's state after each entry's path, made as the check of a child needs it, freed after the merge."""

    def __init__(self, grammar: Grammar, token: list[int], parent: list[int]):
        self.grammar, self.token, self.parent = grammar, token, parent
        self.states: dict[int, Grammar] = {}

    def state(self, m: int) -> Grammar:
        """The state after entry ``m``'s token (-1: the answer's own)."""
        if m < 0:
            return self.grammar
        if m not in self.states:
            self.states[m] = self.state(self.parent[m]).child(self.token[m])
        return self.states[m]

    def allows(self, m: int) -> bool:
        """Whether the grammar allows entry ``m``'s token after its parent's path (after the end: only the end)."""
        state = self.state(self.parent[m])
        if state.ended is not None:
            return self.token[m] == state.ended
        return bool(state.allows([self.token[m]])[0])

    def close(self) -> None:
        for state in self.states.values():
            state.close()


class Merger:
    """Merges each step's draft into its tree; keeps the last ``capacity`` tree shapes' buffers."""

    def __init__(self, capacity: int = MAX_BUILT):
        self.capacity = capacity
        self._built: OrderedDict[tuple, Tree] = OrderedDict()

    def merge(self, draft: Draft, root: int, grammar: Grammar | None = None) -> StepTree:
        """The step's tree from ``draft``'s proposals, ``root`` its first node; with ``grammar`` (the answer's state
        before the step) nodes it forbids are dropped."""
        names = list(draft.proposals)
        proposals = list(draft.proposals.values())
        if not draft.root_prompts and not any(proposals):  # nothing guessed: a plain step (most steps on a CPU)
            step = root_only(root)
            return StepTree(step.node_tokens, step.parents, step.owners, step.tree, {name: [] for name in names})
        nodes = union(proposals)
        kept, strip = select(nodes, draft, [g.limit for g in proposals], grammar)
        levels: list[list[int]] = []  # kept entries by depth, in creation order (a parent before its children)
        depth = [0] * len(kept)
        for m, up in enumerate(nodes.parent):
            if kept[m]:
                depth[m] = 1 if up < 0 else depth[up] + 1
                if depth[m] > len(levels):
                    levels.append([])
                levels[depth[m] - 1].append(m)
        index = [-1] * len(kept)  # entry -> node index in the tree
        parents, tokens, owners, counts = [-1], [root], [""], [0 if strip else draft.root_prompts]
        for level in levels:
            level.sort(key=lambda m: (index[nodes.parent[m]] if nodes.parent[m] >= 0 else 0, m))
            for m in level:
                index[m] = len(tokens)
                parents.append(index[nodes.parent[m]] if nodes.parent[m] >= 0 else 0)
                tokens.append(nodes.token[m])
                owners.append(names[nodes.owner[m]])
                counts.append(0 if strip else nodes.prompts[m])
        tree = self.tree(parents, counts, [len(level) for level in levels], draft)
        placed = {name: [index[m] for m in mapping] for name, mapping in zip(names, nodes.maps)}
        return StepTree(np.array(tokens, dtype=np.int64), tree.parents, tuple(owners), tree, placed)

    def tree(self, parents: list[int], counts: list[int], widths: list[int], draft: Draft) -> Tree:
        """The buffers of the tree whose nodes (breadth-first, ``widths[d - 1]`` at depth d) have these parents and
        prompt-token counts: built once per shape."""
        n, V = draft.num_prompt_tokens, draft.ensemble_size
        key = (n, V, tuple(parents), tuple(counts))
        tree = self._built.get(key)
        if tree is not None:
            self._built.move_to_end(key)
            return tree
        paths: list[tuple[int, ...]] = [()]
        for width in widths:  # rank: the node's order among the nodes of its depth
            start = len(paths)
            paths.extend([paths[parents[start + rank]] + (rank,) for rank in range(width)])
        spec = TreeSpec(dict(zip(paths, counts)))
        tree = build_tree(spec, n, V, max(n, len(widths)))
        if tree.parents != key[2]:
            raise AssertionError(f"the merged tree's layout {tree.parents} is not the merge's {key[2]}")
        self._built[key] = tree
        if len(self._built) > self.capacity:
            self._built.popitem(last=False)
        return tree
