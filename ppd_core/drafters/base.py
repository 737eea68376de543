"""The drafter protocol, as transformers' candidate generators and llama.cpp's ``common_speculative``: each step every
drafter ``propose``s its candidate nodes (``Guesses``) into the step's ``Draft``, one merge (``merge``) builds the step's
tree from them under the row budget, and every drafter ``observe``s the ``Verified`` step: the tree, which path was
accepted, what became of each of its nodes, the step's logits. ``observe`` only learns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ppd_core.sampling.logits import StepLogits
from ppd_core.stats import StepStats
from ppd_core.tree import Tree


class Drafter(Protocol):
    """A guess source: one per answer, named ("prompt tokens", "lookup", "grammar", ...)."""

    name: str

    def propose(self, draft: Draft) -> None:
        """Add this step's guesses to ``draft`` (``draft.add(self.name, guesses)``), or nothing."""

    def observe(self, verified: Verified) -> None:
        """Learn from a step (the prefill included): what it accepted and emitted. A drafter may keep a ``note``
        attribute (words on its last choice): the step's ``stats.notes`` carries it; and a ``memory_bytes`` attribute
        (int: the bytes its source keeps for the loaded model across answers): ``stats.memory_bytes`` carries it."""


class ChainPolicy(Protocol):
    """How long a chain each step drafts (``chain_policy``): one per conversation for the lookup, one per answer for
    forced text (the drafter asks, then tells)."""

    longest: int  # the longest chain it ever drafts

    def length(self, match: int, offered: int) -> int:
        """Tokens to draft of the ``offered`` a match of class ``match`` proposes (0: none)."""

    def chances(self, match: int, count: int) -> list[float] | None:
        """[count] P(chain token j right | the ones before it right) after a match of class ``match``, as far as the
        policy knows them; None: it keeps none."""

    def observe(self, match: int, right: int, drafted: int, offered: int) -> None:
        """What the step showed: the first ``right`` of the ``offered`` tokens were right, ``drafted`` were drafted."""

    def why(self, match: int, drafted: int) -> str:
        """A few words on the last choice, for the page's readout."""


@dataclass
class Draft:
    """One step's proposals, by drafter name in the order they came, and what the merge needs besides."""

    max_rows: int  # rows the decoder takes in one step: the budget
    num_prompt_tokens: int = 0  # n: prompt tokens the trees' rows may carry (the prompt tokens' drafter's)
    ensemble_size: int = 1  # V: rows per prompt token
    root_prompts: int = 0  # prompt tokens on the root (set by the prompt tokens' drafter; V rows each)
    # [R + 1] a step of r rows costs row_costs[r] plain steps (r <= R = max_rows): the merge keeps the best nodes only
    # as far as they pay for their rows (None: it fills the budget)
    row_costs: tuple[float, ...] | None = None
    # with row_costs: the tokens the prompt tokens' guesses are expected to add to the next step, which their rows on
    # this step's nodes make (set by their drafter); the merge weighs those rows against other guesses with it
    prompt_value: float = 0.0
    proposals: dict[str, Guesses] = field(default_factory=dict)

    def add(self, name: str, guesses: Guesses) -> None:
        """``name``'s proposal for this step (one per drafter)."""
        if name in self.proposals:
            raise ValueError(f"{name} proposed twice in one step")
        self.proposals[name] = guesses


@dataclass
class Verified:
    """What one step showed (the prefill included: its tree is the last prompt token alone): the drafters observe it."""

    node_tokens: np.ndarray  # [N] int64: the tree's node tokens, the root first, breadth-first
    parents: tuple[int, ...]  # [N] each node's parent index, -1 for the root
    logits: StepLogits  # the step's rows: node i's is row i (prompt-token rows after the nodes)
    path: list[int]  # the accepted node indices, root first
    kept: dict[str, list[int]]  # per drafter that proposed: the node each of its proposal's became (-1: none)
    stats: StepStats  # the emitted tokens: the accepted path's, then the model's own next token
    tree: Tree  # the step's tree buffers (the prompt-token rows: ``prompt_counts``, ``prompt_slots``)

    @property
    def last(self) -> int:
        """The last accepted node."""
        return self.path[-1]


def right_guesses(chain: Sequence[int], answer: Sequence[int], i: int) -> int:
    """How many leading tokens of ``chain`` equal ``answer[i:]``."""
    right = 0
    while right < len(chain) and i + right < len(answer) and answer[i + right] == chain[right]:
        right += 1
    return right


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
