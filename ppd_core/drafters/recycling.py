"""Token Recycling (Luo et al., ACL 2025, arXiv 2408.08696): guesses from the model's own earlier next-token lists.

Every verify step computes a row of logits for each node of its tree and plain decoding reads one argmax of them.
``RecyclingTable`` keeps, for every token of the vocabulary, the k likeliest next tokens of the last row computed with
that token as the input, whatever its context (candidates recycled from steps that already paid for them), and
``RecyclingDrafter`` grows each step's tree from the last emitted token through the table, breadth-first along a static
shape, as the paper does. No training, any model, from the first step; the table belongs to the loaded model and
outlives answers and conversations (the engine holds it).

Where this differs from the paper: it verifies its whole static tree (about 80 nodes) every step; here a step has a
few rows shared with other sources, so each node carries an estimate of P(accepted | parent accepted) by (depth,
rank), learnt from what the drafter proposed and what the model then emitted (a Beta prior for the first steps), and
the step's merge keeps the nodes of highest path product.

Cost on the host (2-core Xeon, nice'd beside a running test suite, load about 4.6; the default vocabulary, a full
table): ``propose`` 0.35-0.42 ms (76 nodes), ``observe`` of an 8-row step about 2.3 ms, of which 1.9 ms are the rows'
top-8 (``StepLogits.top_k``: an argpartition of 49152 floats a row) (``python benchmarks/scripts/recycling_cost.py``,
three runs); a step of the default model on llama.cpp, 2 threads, costs 38.86 ms at 4 rows and 68.26 ms at 8 on such
a CPU (DESIGN.md's step curve).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ppd_core.drafters.base import Guesses

if TYPE_CHECKING:
    from ppd_core.drafters.base import Draft, Verified

DEFAULT_K = 8  # next tokens kept per token (the table's width)
DEFAULT_LIMIT = 8  # nodes a step may keep of one proposal
# Children per node at depths 1, 2, ...: a step here keeps 1-11 guesses, not the paper's ~80, and the merge keeps them
# by path product, so the shape only has to hold every node a small budget could want: the 4 likeliest next tokens (rank
# 0 is right about a quarter of the time, ranks 1-3 about 1 in 10, 20, 30), 2 under each, then rank-0 chains to depth
# 6 (once on the right track the next rank-0 guess is right about half the time and more). 76 nodes at most. Measured
# by the offline replay (plain greedy rows only, 20 MT-Bench first turns, 2427 tokens; command below), the shape
# hardly matters at these budgets: tokens per step at 4 / 8 / 12 rows 1.270 / 1.358 / 1.385 with this shape,
# 1.272 / 1.346 / 1.363 with 3,1,1,1,1,1,1,1, 1.270 / 1.360 / 1.399 with 8,2,1,1,1, 1.274 / 1.317 / 1.338 with
# 2,2,2,1,1,1; the estimates at the end at 4 rows, depth 1 ranks 0-3: 0.24 0.09 0.05 0.03, rank 0 at depths 2 and 3:
# 0.42 0.64.
#   python benchmarks/scripts/recycling_offline.py --limit 20 --cache /tmp/rec/answers.npz --shape 4,2,2,1,1,1
#       --shape 3,1,1,1,1,1,1,1 --shape 8,2,1,1,1 --shape 2,2,2,1,1,1
DEFAULT_SHAPE = (4, 2, 2, 1, 1, 1)
# the Beta prior of P(accepted | parent accepted) by rank, the same at every depth (depth 1's as measured above), worth
# PRIOR_STRENGTH steps
PRIOR_MEAN = (0.3, 0.1, 0.05, 0.03, 0.02, 0.02, 0.01, 0.01)
PRIOR_STRENGTH = 4.0


@dataclass
class RecyclingTable:
    """Per token, the model's k likeliest next tokens the last time a step computed a row with it as the input.

    Memory: vocab x k x 4 bytes (int32): 49152 x 8 x 4 = 1,572,864 bytes (1.5 MiB) for the default model's vocabulary
    at the default k = 8 (``nbytes``).
    """

    ids: np.ndarray  # [vocab, k] int32: best first; -1: not seen yet

    @staticmethod
    def empty(vocab_size: int, k: int = DEFAULT_K) -> RecyclingTable:
        """A table for a model of ``vocab_size`` tokens that knows nothing yet."""
        return RecyclingTable(np.full((vocab_size, k), -1, dtype=np.int32))

    @property
    def vocab_size(self) -> int:
        return self.ids.shape[0]

    @property
    def k(self) -> int:
        return self.ids.shape[1]

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes

    def filled(self) -> int:
        """How many tokens have a row."""
        return int((self.ids[:, 0] >= 0).sum())

    def update(self, node_tokens: np.ndarray, top: np.ndarray) -> None:
        """Each of ``node_tokens`` [N] gets the next tokens ``top`` [N, >= k] (best first) of its row; a token twice
        in ``node_tokens`` keeps its last row's."""
        self.ids[np.asarray(node_tokens, dtype=np.int64)] = top[:, : self.k]


@dataclass
class AcceptanceCounts:
    """P(accepted | parent accepted) by (depth, rank) of the recycling tree: counts with a Beta prior."""

    tried: np.ndarray  # [depths, ranks] float64: nodes whose parent was accepted
    accepted: np.ndarray  # [depths, ranks] float64: of those, the ones accepted too
    prior_mean: np.ndarray  # [ranks] float64
    prior_strength: float = PRIOR_STRENGTH

    @staticmethod
    def new(depths: int, ranks: int, prior_mean: Sequence[float] = PRIOR_MEAN,
            prior_strength: float = PRIOR_STRENGTH) -> AcceptanceCounts:
        mean = np.array([prior_mean[min(r, len(prior_mean) - 1)] for r in range(ranks)], dtype=np.float64)
        return AcceptanceCounts(np.zeros((depths, ranks)), np.zeros((depths, ranks)), mean, prior_strength)

    def estimates(self) -> np.ndarray:
        """[depths, ranks] the posterior means, in (0, 1)."""
        return (self.accepted + self.prior_strength * self.prior_mean) / (self.tried + self.prior_strength)

    def add(self, depths: np.ndarray, ranks: np.ndarray, accepted: np.ndarray) -> None:
        """Nodes at ``depths`` [n] (1: under the root) and ``ranks`` [n] were tried; ``accepted`` [n] bool."""
        np.add.at(self.tried, (depths - 1, ranks), 1.0)
        np.add.at(self.accepted, (depths - 1, ranks), accepted.astype(np.float64))


@dataclass
class Proposal:
    """A tree grown from the table, breadth-first: parents before children."""

    tokens: np.ndarray  # [M] int64
    parents: np.ndarray  # [M] int64: -1 under the root, else an earlier index
    depths: np.ndarray  # [M] int64: 1 under the root
    ranks: np.ndarray  # [M] int64: the node's column in its parent token's table row

    def __len__(self) -> int:
        return len(self.tokens)


def expand(ids: np.ndarray, root: int, shape: Sequence[int]) -> Proposal:
    """The tree under ``root`` through table ``ids`` [vocab, k]: a node's children are the first ``shape[d - 1]`` of
    its token's row for a node at depth d - 1 (the root at 0), without unknown (-1) or repeated entries."""
    tokens, parents, depths, ranks = [np.empty(0, dtype=np.int64) for _ in range(4)]
    level_tokens, level_index = np.array([root], dtype=np.int64), np.array([-1], dtype=np.int64)  # [n]
    for depth, width in enumerate(shape, 1):
        children = ids[level_tokens, :width].astype(np.int64)  # [n, width]
        earlier = np.tril(np.ones((width, width), dtype=bool), -1)  # [width, width]: column j sees columns < j
        repeated = ((children[:, :, None] == children[:, None, :]) & earlier).any(-1)  # [n, width]
        keep = (children >= 0) & ~repeated  # [n, width]
        if not keep.any():
            break
        parent_rows, columns = np.nonzero(keep)  # row-major: by parent, then rank
        start = len(tokens)
        tokens = np.concatenate([tokens, children[parent_rows, columns]])
        parents = np.concatenate([parents, level_index[parent_rows]])
        depths = np.concatenate([depths, np.full(len(columns), depth, dtype=np.int64)])
        ranks = np.concatenate([ranks, columns.astype(np.int64)])
        level_tokens, level_index = tokens[start:], np.arange(start, len(tokens), dtype=np.int64)
    return Proposal(tokens, parents, depths, ranks)


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
    """Trees through a ``RecyclingTable``, with acceptance learnt by (depth, rank).

    ``limit``: nodes of its proposal a step may keep. ``shape``: children per node by depth (``DEFAULT_SHAPE``).
    ``counts``: the acceptance counts to learn into (pass the engine's to keep them across answers; default: new).
    A grammar needs nothing here: the step's merge prunes the nodes it forbids.

    It learns from the tokens the step emitted, not from which of its nodes the merge kept: a node whose path above
    it was emitted is decided by the token emitted after that path, kept or not (its parent was accepted; the same
    prefix from another source is the same node), so the (depth, rank)s the budget left out are learnt too.
    """

    table: RecyclingTable
    limit: int = DEFAULT_LIMIT
    shape: tuple[int, ...] = DEFAULT_SHAPE
    counts: AcceptanceCounts | None = None
    name: str = "recycling"
    root: int = -1  # the last emitted token: the next tree's root (-1: before the prefill)
    proposed: Proposal | None = field(default=None, repr=False)  # the last proposal, until its step is observed

    def __post_init__(self) -> None:
        if max(self.shape, default=0) > self.table.k:
            raise ValueError(f"a shape of {max(self.shape)} children needs a table of that width, not {self.table.k}")
        if self.counts is None:
            self.counts = AcceptanceCounts.new(len(self.shape), self.table.k)

    def propose(self, draft: Draft) -> None:
        """The tree under the last emitted token, each node with its (depth, rank)'s estimate."""
        self.proposed = None
        if self.root < 0:
            return
        proposal = expand(self.table.ids, self.root, self.shape)
        if not len(proposal):
            return
        probs = self.counts.estimates()[proposal.depths - 1, proposal.ranks]  # [M]
        self.proposed = proposal
        draft.add(self.name, Guesses(proposal.tokens.tolist(), proposal.parents.tolist(), probs.tolist(),
                                     limit=self.limit))

    def observe(self, verified: Verified) -> None:
        """Fill the table from the step's node rows, learn what the last proposal would have had accepted, and keep
        the next root."""
        node_tokens = np.asarray(verified.node_tokens, dtype=np.int64)  # [N]
        rows = min(len(node_tokens), verified.logits.num_rows)
        self.table.update(node_tokens[:rows], verified.logits.top_k(np.arange(rows), self.table.k))
        emitted = list(verified.stats.tokens)
        if self.proposed is not None and emitted:
            tried, accepted = outcomes(self.proposed, emitted)
            self.counts.add(self.proposed.depths[tried], self.proposed.ranks[tried], accepted[tried])
        self.proposed = None
        if emitted:
            self.root = int(emitted[-1])
