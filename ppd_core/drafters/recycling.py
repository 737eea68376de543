"""Token Recycling (Luo et al., ACL 2025, arXiv 2408.08696): guesses from the model's own earlier next-token lists.

Every verify step computes a row of logits for each node of its tree and plain decoding reads one argmax of them.
``RecyclingTable`` keeps, for every token of the vocabulary, the k likeliest next tokens (and their probabilities) of
the last row computed with that token as the input, whatever its context (candidates recycled from steps that
already paid for them), and, in a hashed table, the same for every pair of tokens (the node and the one before it),
a closer context where the pair was seen. ``RecyclingDrafter`` grows each step's tree from the last emitted token
through the table (a pair's row where there is one, else the token's). No training, any model, from the first step;
the table belongs to the loaded model and outlives answers and conversations (the engine holds it).

Where this differs from the paper: it verifies its whole static tree (about 80 nodes) every step; here a step has a
few rows shared with other sources, so each node carries an estimate of P(accepted | parent accepted) by class
(from a pair's row or a token's, its depth, and the model's own probability of the token in that row, binned),
learnt from what the drafter proposed and what the model then emitted (a Beta prior for the first steps), and the
tree is grown best-first by path product, so the step's merge takes its best nodes first.

Measured by an offline replay of 40 MT-Bench first turns (plain greedy rows only, 5,079 answer tokens; the rows'
top-8 and probabilities from ``StepLogits.top_k_probs``), tokens per step of the recycling tree alone at 2 / 4 / 8
rows: estimates by (depth, rank) 1.206 / 1.301 / 1.432; by (depth, probability) 1.202 / 1.329 / 1.425; with the pair
table 1.231 / 1.382 / 1.489 (a third, three-token table added nothing: 1.231 / 1.382 / 1.488).

Cost on the host (``python benchmarks/scripts/recycling_cost.py --rows R``, the 2-core AMD EPYC, nothing else
running, two runs each; a full table, 12 nodes proposed): ``propose`` 0.35-0.57 ms; ``propose`` + ``observe`` of a
4-row step 1.5-2.4 ms (``top_k_probs`` of the rows 1.0-1.5 ms of it), of an 8-row step 2.6-2.7 ms; against steps of
38.86 ms at 4 rows and 68.26 ms at 8 for the default model on llama.cpp, 2 threads, on such a CPU (a step
curve timed there, not kept in the repository): 4-6% more per step while recycling is on.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.drafters.base import Guesses

if TYPE_CHECKING:
    from ppd_core.drafters.base import Draft, Verified

DEFAULT_K = 4  # next tokens kept per token and per token pair (the tables' width)
PAIR_SLOTS = 1 << 16  # token pairs kept (a hashed table: the newest pair in a slot wins)
DEFAULT_LIMIT = 12  # nodes a step may keep of one proposal
# Children a node may have at depth 1, 2, ...: the grown tree takes the best of them by path product
DEFAULT_WIDTHS = (4, 2, 2, 2, 2, 2)
# P(accepted | parent accepted) is learnt by class: whether the node came from its pair's row (the two tokens before
# it as in the row's input, a closer context than its token's alone), its depth (1, 2, 3+) and the model's own
# probability of the token in the row it came from, in these bins
PROB_EDGES = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
DEPTH_CLASSES = 3
CLASSES = 2 * DEPTH_CLASSES * (len(PROB_EDGES) + 1)
# the Beta prior of a class: its bin's middle probability, discounted (the row was computed in another context),
# worth PRIOR_STRENGTH steps
PRIOR_DISCOUNT = 0.8
PRIOR_STRENGTH = 4.0


@dataclass
class RecyclingTable:
    """Per token, and per pair of tokens, the model's k likeliest next tokens (and their probabilities) the last time
    a step computed a row with it as the input (the pair: with that token before it).

    Memory (``nbytes``), for the default model's vocabulary of 49,152 at k = 4: 786,432 B of token ids and 393,216 B
    of probabilities (float16), and 65,536 pair slots x (8 + 16 + 8) B = 2,097,152 B: 3.3 MB.
    """

    ids: np.ndarray  # [vocab, k] int32: best first; -1: not seen yet
    probs: np.ndarray  # [vocab, k] float16: the model's probability of each, in its row
    pair_keys: np.ndarray  # [slots] int64: the pair held (before * vocab + token); -1: none
    pair_ids: np.ndarray  # [slots, k] int32
    pair_probs: np.ndarray  # [slots, k] float16

    @staticmethod
    def empty(vocab_size: int, k: int = DEFAULT_K, slots: int = PAIR_SLOTS) -> RecyclingTable:
        """A table for a model of ``vocab_size`` tokens that knows nothing yet (``slots`` a power of two)."""
        return RecyclingTable(np.full((vocab_size, k), -1, dtype=np.int32), np.zeros((vocab_size, k), np.float16),
                              np.full(slots, -1, dtype=np.int64), np.full((slots, k), -1, dtype=np.int32),
                              np.zeros((slots, k), np.float16))

    @property
    def vocab_size(self) -> int:
        return self.ids.shape[0]

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.ids, self.probs, self.pair_keys, self.pair_ids, self.pair_probs))

    def filled(self) -> int:
        """How many tokens have a row."""
        return int((self.ids[:, 0] >= 0).sum())

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """[n] the pair slots of ``keys`` [n] int64 (a multiplicative hash)."""
        shift = np.uint64(64 - int(np.log2(len(self.pair_keys))))
        return ((keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> shift).astype(np.int64)

    def update(self, before: np.ndarray, tokens: np.ndarray, top: np.ndarray, probs: np.ndarray) -> None:
        """Rows with inputs ``tokens`` [N], ``before`` [N] the token before each (-1: unknown), gave the next tokens
        ``top`` [N, >= k] (best first) with probabilities ``probs`` [N, >= k]; a token (pair) twice keeps its last."""
        tokens, before = np.asarray(tokens, dtype=np.int64), np.asarray(before, dtype=np.int64)
        self.ids[tokens], self.probs[tokens] = top[:, : self.k], probs[:, : self.k]
        known = before >= 0
        keys = before[known] * self.vocab_size + tokens[known]
        slots = self.slots(keys)
        self.pair_keys[slots], self.pair_ids[slots], self.pair_probs[slots] = keys, top[known, : self.k], probs[
            known, : self.k]

    def row(self, before: int, token: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """The next tokens [k] and probabilities [k] after ``token`` with ``before`` before it: the pair's row where
        the table has it (True), else the token's (False)."""
        if before >= 0:
            key = before * self.vocab_size + token
            slot = int(self.slots(np.array([key]))[0])
            if self.pair_keys[slot] == key:
                return self.pair_ids[slot], self.pair_probs[slot], True
        return self.ids[token], self.probs[token], False


def node_classes(paired: np.ndarray, depths: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """[n] each node's estimate class from whether it came from a pair's row, its depth and its row probability."""
    bins = np.searchsorted(PROB_EDGES, probs, side="right")
    return ((paired.astype(np.int64) * DEPTH_CLASSES + np.minimum(depths, DEPTH_CLASSES) - 1) * (len(PROB_EDGES) + 1)
            + bins)


def class_priors() -> np.ndarray:
    """[CLASSES] each class's prior mean: its bin's middle, discounted."""
    edges = np.concatenate([[0.0], PROB_EDGES, [1.0]])
    middles = (edges[:-1] + edges[1:]) / 2  # [bins]
    return np.tile(middles * PRIOR_DISCOUNT, 2 * DEPTH_CLASSES)


@dataclass
class AcceptanceCounts:
    """P(accepted | parent accepted) by class (``node_classes``): counts with a Beta prior."""

    tried: np.ndarray  # [classes] float64: nodes whose parent was accepted
    accepted: np.ndarray  # [classes] float64: of those, the ones accepted too
    prior_mean: np.ndarray  # [classes] float64
    prior_strength: float = PRIOR_STRENGTH

    @staticmethod
    def new() -> AcceptanceCounts:
        return AcceptanceCounts(np.zeros(CLASSES), np.zeros(CLASSES), class_priors())

    def estimates(self) -> np.ndarray:
        """[classes] the posterior means, in (0, 1)."""
        return (self.accepted + self.prior_strength * self.prior_mean) / (self.tried + self.prior_strength)

    def add(self, classes: np.ndarray, accepted: np.ndarray) -> None:
        """Nodes of ``classes`` [n] were tried; ``accepted`` [n] bool."""
        np.add.at(self.tried, classes, 1.0)
        np.add.at(self.accepted, classes, accepted.astype(np.float64))


@dataclass
class Proposal:
    """A tree grown from the table, best path product first: parents before children."""

    tokens: np.ndarray  # [M] int64
    parents: np.ndarray  # [M] int64: -1 under the root, else an earlier index
    depths: np.ndarray  # [M] int64: 1 under the root
    classes: np.ndarray  # [M] int64: each node's estimate class
    probs: np.ndarray  # [M] float64: each node's estimate of P(accepted | parent accepted)

    def __len__(self) -> int:
        return len(self.tokens)


def grow(table: RecyclingTable, estimates: np.ndarray, before: int, root: int, limit: int,
         widths: Sequence[int] = DEFAULT_WIDTHS) -> Proposal:
    """The ``limit`` nodes of highest path product under ``root`` (``before`` the token before it): a node's children
    are the first ``widths[d - 1]`` of its row at depth d, their estimates ``estimates`` [classes] by class."""
    nodes: list[tuple[int, int, int, int, float]] = []  # (token, parent, depth, class, estimate)
    frontier: list[tuple[float, int, int, int, int, int, float, int]] = []  # a heap, best path product first
    order = itertools.count()  # ties: the earlier offered

    def offer(parent: int, above: int, token: int, depth: int, path: float) -> None:
        if depth > len(widths):
            return
        ids, probs, paired = table.row(above, token)
        count = int((ids[: widths[depth - 1]] >= 0).sum())
        classes = node_classes(np.full(count, paired), np.full(count, depth), probs[:count].astype(np.float64))
        for child, cls in zip(ids[:count].tolist(), classes.tolist()):
            p = float(estimates[cls])
            heapq.heappush(frontier, (-path * p, next(order), child, parent, depth, cls, p, token))

    offer(-1, before, root, 1, 1.0)
    while frontier and len(nodes) < limit:
        negative, _, token, parent, depth, cls, p, above = heapq.heappop(frontier)
        nodes.append((token, parent, depth, cls, p))
        offer(len(nodes) - 1, above, token, depth + 1, -negative)
    columns = list(zip(*nodes)) or [(), (), (), (), ()]
    return Proposal(*(np.array(c, dtype=d) for c, d in zip(columns, (np.int64,) * 4 + (np.float64,))))


def outcomes(proposal: Proposal, emitted: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """[M] bool twice: which nodes were tried (their path above them is what the step emitted) and which of those were
    accepted (their token is the one emitted after their parent). ``emitted``: the step's tokens, the accepted guesses
    then the model's own, so a node at depth d is decided when d <= len(emitted)."""
    emitted = np.asarray(emitted, dtype=np.int64)
    known = proposal.depths <= len(emitted)  # [M]
    right = known & (proposal.tokens == emitted[np.minimum(proposal.depths, len(emitted)) - 1])  # [M]
    tried = known & (proposal.depths == 1)  # [M]: under the root, decided whenever known
    for depth in range(2, int(proposal.depths.max(initial=0)) + 1):  # a depth at a time: its parents are decided
        at = np.nonzero(proposal.depths == depth)[0]
        parents = proposal.parents[at]
        tried[at] = known[at] & tried[parents] & right[parents]
    return tried, tried & right


@dataclass
class RecyclingDrafter:
    """Trees grown through a ``RecyclingTable``, with acceptance learnt by class (``node_classes``).

    ``limit``: nodes it proposes a step (the best by path product; the merge keeps what the budget allows).
    ``counts``: the acceptance counts to learn into (pass the engine's to keep them across answers; default: new).
    ``before``: the token before the first root (the prompt's second last; -1: unknown). A grammar needs nothing here:
    the step's merge prunes the nodes it forbids.

    It learns from the tokens the step emitted, not from which of its nodes the merge kept: a node whose path above
    it was emitted is decided by the token emitted after that path, kept or not (its parent was accepted; the same
    prefix from another source is the same node).
    """

    table: RecyclingTable
    limit: int = DEFAULT_LIMIT
    widths: tuple[int, ...] = DEFAULT_WIDTHS
    counts: AcceptanceCounts | None = None
    before: int = -1
    name: str = "recycling"
    root: int = -1  # the last emitted token: the next tree's root (-1: before the prefill)
    proposed: Proposal | None = field(default=None, repr=False)  # the last proposal, until its step is observed

    def __post_init__(self) -> None:
        if max(self.widths, default=0) > self.table.k:
            raise ValueError(f"{max(self.widths)} children need a table of that width, not {self.table.k}")
        if self.counts is None:
            self.counts = AcceptanceCounts.new()

    @property
    def memory_bytes(self) -> int:
        """What this source keeps for the loaded model: the table (the counts are a few hundred bytes)."""
        return self.table.nbytes

    def propose(self, draft: Draft) -> None:
        """The best ``limit`` nodes under the last emitted token, each with its class's estimate."""
        self.proposed = None
        if self.root < 0:
            return
        proposal = grow(self.table, self.counts.estimates(), self.before, self.root, self.limit, self.widths)
        if not len(proposal):
            return
        self.proposed = proposal
        draft.add(self.name, Guesses(proposal.tokens.tolist(), proposal.parents.tolist(), proposal.probs.tolist()))

    def observe(self, verified: Verified) -> None:
        """Fill the table from the step's node rows, learn what the last proposal would have had accepted, and keep
        the next root and the token before it."""
        node_tokens = np.asarray(verified.node_tokens, dtype=np.int64)  # [N]
        rows = min(len(node_tokens), verified.logits.num_rows)
        parents = np.asarray(verified.parents[:rows], dtype=np.int64)  # [rows]
        before = np.where(parents >= 0, node_tokens[np.maximum(parents, 0)], self.before)  # [rows]
        self.table.update(before, node_tokens[:rows], *verified.logits.top_k_probs(np.arange(rows), self.table.k))
        emitted = list(verified.stats.tokens)
        if self.proposed is not None and emitted:
            tried, accepted = outcomes(self.proposed, emitted)
            self.counts.add(self.proposed.classes[tried], accepted[tried])
        self.proposed = None
        if emitted:
            self.before, self.root = ([int(node_tokens[0])] + [int(t) for t in emitted])[-2:]
