"""The drafter protocol, as transformers' candidate generators and llama.cpp's ``common_speculative``: each step every
drafter ``propose``s into the step's ``Draft`` (the prompt tokens choose the tree, then one chain at most joins it),
and ``observe``s the ``Verified`` step: which node was accepted, the tokens emitted, the step's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ppd_core.sampling.logits import StepLogits
from ppd_core.stats import StepStats
from ppd_core.tree import ChainedTrees, Tree, root_only_tree


class Drafter(Protocol):
    """A guess source: one per answer."""

    def propose(self, draft: Draft) -> None:
        """Add this step's guesses to ``draft``."""

    def observe(self, verified: Verified) -> None:
        """Learn from a step (the prefill included): what it accepted and emitted."""


class ChainPolicy(Protocol):
    """How long a chain each step drafts (``chain_policy``): one per conversation for the lookup, one per answer for
    forced text (the drafter asks, then tells)."""

    longest: int  # the longest chain it ever drafts

    def length(self, match: int, offered: int) -> int:
        """Tokens to draft of the ``offered`` a match of class ``match`` proposes (0: none)."""

    def observe(self, match: int, right: int, drafted: int, offered: int) -> None:
        """What the step showed: the first ``right`` of the ``offered`` tokens were right, ``drafted`` were drafted."""

    def why(self, match: int, drafted: int) -> str:
        """A few words on the last choice, for the page's readout."""


@dataclass
class Draft:
    """One step's guesses: the tree to verify, the guess table its candidates read, and the chain drafted into it."""

    tree: Tree = field(default_factory=root_only_tree)
    guesses: np.ndarray | None = None  # [depth, ranks] int64: candidate (depth d, rank r) is guesses[d - 1, r]
    max_rows: int = 0  # rows the decoder takes in one step
    chain: list[int] = field(default_factory=list)  # the chain's tokens, at depths 1, 2, ...
    owner: Drafter | None = None  # whose chain it is

    @property
    def room(self) -> int:
        """Rows left for a chain beside the tree."""
        return max(0, self.max_rows - self.tree.num_tokens)

    def offer(self, owner: Drafter, chain: Sequence[int]) -> None:
        """One chain a step: a later drafter's replaces an earlier one's where it is at least as long."""
        if chain and len(chain) >= len(self.chain):
            self.chain, self.owner = list(chain), owner

    def merged(self, chained: ChainedTrees) -> Draft:
        """The draft with its chain merged into the tree and the guess table (``ChainedTrees.step``)."""
        if not self.chain:
            return self
        tree, guesses = chained.step(self.tree, self.guesses, self.chain)
        return Draft(tree, guesses, self.max_rows, self.chain, self.owner)

    def node_tokens(self, root: int) -> np.ndarray:
        """[N] int64: the tree's node tokens, the root first, then each candidate's guess."""
        tree, tokens = self.tree, np.array([root], dtype=np.int64)
        if tree.num_nodes == 1:
            return tokens
        return np.concatenate([tokens, self.guesses[tree.candidate_depths - 1, tree.candidate_ranks]])


@dataclass
class Verified:
    """What one step showed: the drafters observe it."""

    draft: Draft  # what was verified (its tree the step's)
    logits: StepLogits  # the step's rows
    last: int  # the last accepted node
    stats: StepStats  # the emitted tokens: the accepted path's, then the model's own next token
    from_chain: int = 0  # how many accepted guesses were the chain's


def propose(drafters: Sequence[Drafter], max_rows: int, chained: ChainedTrees) -> Draft:
    """The step's draft: each drafter's guesses in turn, the chain merged into the tree."""
    draft = Draft(max_rows=max_rows)
    for drafter in drafters:
        drafter.propose(draft)
    return draft.merged(chained)


def observe(drafters: Sequence[Drafter], verified: Verified) -> None:
    """Every drafter learns what the step accepted."""
    for drafter in drafters:
        drafter.observe(verified)


def right_guesses(chain: Sequence[int], answer: Sequence[int], i: int) -> int:
    """How many leading tokens of ``chain`` equal ``answer[i:]``."""
    right = 0
    while right < len(chain) and i + right < len(answer) and answer[i + right] == chain[right]:
        right += 1
    return right


# ---- the tree protocol (issue 51): every drafter proposes candidate nodes; one merge per step builds the tree ----


@dataclass
class Guesses:
    """One drafter's candidate nodes for one step, parents before children.

    A node is a token under the root (parent -1) or under an earlier node of the same proposal, with the drafter's
    estimate of the chance it is accepted given its parent is (the PPD paper's Proposition B.1: a tree's expected
    accepted tokens is the sum over its nodes of the product of these along the node's path). A chain is a tree with
    one branch.
    """

    tokens: list[int] = field(default_factory=list)  # [M] the node tokens
    parents: list[int] = field(default_factory=list)  # [M] -1: under the root; else an earlier index in this list
    probs: list[float] = field(default_factory=list)  # [M] P(accepted | parent accepted), in (0, 1]
    prompt_counts: list[int] = field(default_factory=list)  # [M] prompt-token rows on each node ([]: none)
    limit: int | None = None  # the most nodes of this proposal the step may keep (None: the step's budget decides)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, prob: float, prompt_count: int = 0) -> int:
        """Append a node; its index (a parent for later nodes)."""
        if not -1 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} of a new node is not an earlier node")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.probs.append(float(prob))
        if prompt_count or self.prompt_counts:
            self.prompt_counts.extend([0] * (len(self.tokens) - 1 - len(self.prompt_counts)))
            self.prompt_counts.append(int(prompt_count))
        return len(self.tokens) - 1

    @staticmethod
    def chain(tokens: Sequence[int], probs: Sequence[float]) -> Guesses:
        """A chain: token i under token i - 1, the first under the root."""
        return Guesses(list(map(int, tokens)), list(range(-1, len(tokens) - 1)), list(map(float, probs)))

    def depths(self) -> list[int]:
        """[M] each node's depth (1: under the root)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def path_probs(self) -> list[float]:
        """[M] each node's expected acceptance: the product of ``probs`` along its path."""
        out: list[float] = []
        for parent, prob in zip(self.parents, self.probs):
            out.append(prob if parent < 0 else out[parent] * prob)
        return out
