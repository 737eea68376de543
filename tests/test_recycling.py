"""Token Recycling: the table against the rows it was filled from (synthetic and the real model's), the breadth-first
tree through it, the acceptance it learns, ``StepLogits.top_k`` against brute force (host and torch), its memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from ppd_core.backends.torch.decoder import DeviceLogits
from ppd_core.drafters.recycling import (
    PRIOR_MEAN, AcceptanceCounts, RecyclingDrafter, RecyclingTable, expand, outcomes,
)
from ppd_core.sampling.logits import HostLogits, top_k


# ---- a minimal fake of the step protocol's ``Draft`` and ``Verified`` (the fields the drafters rely on) ----

@dataclass
class FakeStats:
    tokens: list[int]  # emitted: the accepted guesses, then the model's own next token


@dataclass
class FakeVerified:
    node_tokens: np.ndarray  # [N] int64, the root first
    parents: tuple  # [N]
    logits: HostLogits  # row i: node i's
    path: list[int]  # accepted node indices, root first
    kept: dict  # drafter name -> merged index per proposed node (-1: left out)
    stats: FakeStats


@dataclass
class FakeDraft:
    added: list = field(default_factory=list)  # (name, guesses)

    def add(self, name, guesses) -> None:
        self.added.append((name, guesses))


def brute_top(row: np.ndarray, k: int) -> list[int]:
    """The k largest, largest first, ties to the lower index: by sorting every entry."""
    return sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]


def prefill(token: int, row: np.ndarray, first: int) -> FakeVerified:
    """The prefill's step: the last prompt token's one row; it emits ``first``."""
    return FakeVerified(np.array([token]), (-1,), HostLogits(row[None]), [0], {}, FakeStats([first]))


# ---- top_k ----

@pytest.mark.parametrize("seed", range(4))
def test_top_k_orders_by_value_then_index_on_host_and_device(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 6, size=(5, 40)).astype(np.float32)  # [rows, vocab]: ties everywhere, across every cut
    values[1] = 2.0  # a row of one value: the lowest indices, in order
    host, device = HostLogits(values), DeviceLogits(torch.from_numpy(values.copy()))
    for rows in (np.array([3, 0, 1]), slice(1, 4)):
        for k in (1, 3, 8, 40, 50):
            expected = np.array([brute_top(row, k) for row in values[rows]])
            assert np.array_equal(host.top_k(rows, k), expected)
            assert np.array_equal(device.top_k(rows, k), expected)
            assert host.top_k(rows, k).dtype == device.top_k(rows, k).dtype == np.int64
    assert host.top_k(np.array([1]), 4).tolist() == [[0, 1, 2, 3]]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_top_k_on_a_gpu_equals_the_host():
    values = np.random.default_rng(3).integers(0, 4, size=(6, 49152)).astype(np.float32)  # ties across every cut
    values[2] = np.random.default_rng(4).standard_normal(49152)
    device = DeviceLogits(torch.from_numpy(values).to("cuda"))
    for k in (1, 8):
        assert np.array_equal(device.top_k(np.array([5, 2, 0]), k), HostLogits(values).top_k(np.array([5, 2, 0]), k))


def test_top_k_of_real_valued_rows_equals_a_full_sort():
    values = np.random.default_rng(7).standard_normal((6, 1000)).astype(np.float32)
    assert np.array_equal(top_k(values, 8), np.argsort(-values, axis=-1, kind="stable")[:, :8])


# ---- the table ----

def test_the_table_takes_each_node_rows_top_k_the_last_row_of_a_repeated_token_winning():
    table = RecyclingTable.empty(30, k=4)
    assert table.ids.shape == (30, 4) and table.ids.dtype == np.int32 and (table.ids == -1).all()
    rows = np.random.default_rng(0).standard_normal((3, 30)).astype(np.float32)  # [N, vocab]
    table.update(np.array([5, 9, 5]), top_k(rows, 6))
    assert table.ids[5].tolist() == brute_top(rows[2], 4) and table.ids[9].tolist() == brute_top(rows[1], 4)
    assert table.filled() == 2 and (table.ids[np.setdiff1d(np.arange(30), [5, 9])] == -1).all()


def test_memory_is_vocab_times_k_times_four_bytes():
    assert RecyclingTable.empty(49152).nbytes == 49152 * 8 * 4 == 1_572_864  # the default model, k = 8
    assert RecyclingTable.empty(100, k=3).nbytes == 1200


def test_observe_fills_the_table_from_every_node_row_and_keeps_the_next_root():
    vocab, rng = 40, np.random.default_rng(1)
    drafter = RecyclingDrafter(RecyclingTable.empty(vocab, k=4), shape=(2, 1))
    first = rng.standard_normal(vocab).astype(np.float32)
    drafter.observe(prefill(7, first, first.argmax()))
    assert drafter.table.ids[7].tolist() == brute_top(first, 4) and drafter.root == first.argmax()
    rows = rng.standard_normal((4, vocab)).astype(np.float32)  # three nodes, then a prompt-token row
    nodes = np.array([drafter.root, 3, 11])
    drafter.observe(FakeVerified(nodes, (-1, 0, 0), HostLogits(rows), [0, 2], {}, FakeStats([11, 25])))
    for i, token in enumerate(nodes):
        assert drafter.table.ids[token].tolist() == brute_top(rows[i], 4)
    assert drafter.table.filled() == 4 and drafter.root == 25


# ---- the tree ----

def hand_table() -> RecyclingTable:
    table = RecyclingTable.empty(20, k=4)
    table.ids[1] = [2, 3, 3, -1]  # a repeat and an unknown: skipped
    table.ids[2] = [4, 5, 6, 7]
    table.ids[3] = [6, 1, -1, -1]
    table.ids[4] = [8, 9, -1, -1]
    table.ids[6] = [10, -1, -1, -1]
    return table


def test_the_tree_is_breadth_first_along_the_shape_through_the_table():
    drafter = RecyclingDrafter(hand_table(), limit=5, shape=(3, 2, 1))
    drafter.root = 1
    draft = FakeDraft()
    drafter.propose(draft)
    [(name, guesses)] = draft.added
    assert name == "recycling" and guesses.limit == 5
    # depth 1: 2, 3 (the repeated 3 and the -1 skipped); depth 2: 4, 5 under 2, then 6, 1 under 3; depth 3: 8 under 4,
    # 10 under 6, 2 under 1 (5 has no row yet)
    assert guesses.tokens == [2, 3, 4, 5, 6, 1, 8, 10, 2]
    assert guesses.parents == [-1, -1, 0, 0, 1, 1, 2, 4, 5]
    assert guesses.depths() == [1, 1, 2, 2, 2, 2, 3, 3, 3]
    prior = [PRIOR_MEAN[r] for r in (0, 1, 0, 1, 0, 1, 0, 0, 0)]
    assert np.allclose(guesses.probs, prior)


@pytest.mark.parametrize("seed", range(5))
def test_random_trees_put_parents_first_never_repeat_a_sibling_and_follow_the_table(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(-1, 12, size=(12, 4)).astype(np.int32)  # repeats and unknowns in rows
    shape, root = (4, 3, 2, 1), int(rng.integers(12))
    proposal = expand(ids, root, shape)
    children: dict[int, list[int]] = {}
    for i, (token, parent, depth, rank) in enumerate(zip(proposal.tokens, proposal.parents, proposal.depths,
                                                         proposal.ranks)):
        assert parent < i and depth == (1 if parent < 0 else proposal.depths[parent] + 1)
        above = root if parent < 0 else proposal.tokens[parent]
        assert token >= 0 and rank < shape[depth - 1] and ids[above, rank] == token  # its parent's row, at its rank
        children.setdefault(int(parent), []).append(int(token))
    for parent, siblings in children.items():
        assert len(siblings) == len(set(siblings))
        above = root if parent < 0 else proposal.tokens[parent]
        depth = 1 if parent < 0 else proposal.depths[parent] + 1
        assert set(siblings) == set(ids[above, : shape[depth - 1]].tolist()) - {-1}  # every distinct known one
    expandable = [i for i in range(len(proposal.tokens)) if proposal.depths[i] < len(shape)]
    assert all((ids[proposal.tokens[i], : shape[proposal.depths[i]]] < 0).all() or i in children for i in expandable)


def test_no_root_no_proposal():
    draft = FakeDraft()
    RecyclingDrafter(hand_table()).propose(draft)  # before the prefill
    assert draft.added == []


# ---- learning ----

def test_outcomes_decide_only_nodes_whose_path_was_emitted():
    proposal = expand(hand_table().ids, 1, (3, 2, 1))  # tokens 2 3 | 4 5 6 1 | 8 10 2
    tried, accepted = outcomes(proposal, [2, 4, 9])  # 2 accepted, then 4, then the model's own 9
    assert tried.tolist() == [True, True, True, True, False, False, True, False, False]
    assert accepted.tolist() == [True, False, True, False, False, False, False, False, False]
    tried, accepted = outcomes(proposal, [7])  # nothing accepted: only depth 1 decided
    assert tried.tolist() == [True, True] + [False] * 7 and not accepted.any()


def test_estimates_move_toward_what_was_accepted():
    drafter = RecyclingDrafter(RecyclingTable.empty(20, k=4), shape=(3, 2, 1))
    start = drafter.counts.estimates().copy()
    rows = np.zeros((3, 20), dtype=np.float32)  # the verified step's rows: root 1, then 2, then 5
    rows[0, [2, 3]], rows[1, [5, 4]], rows[2, 19] = (2, 1), (2, 1), 1
    for _ in range(20):  # every step from root 1: depth 1's rank-0 guess (2) is right, then its rank-1 child (5)
        drafter.table.ids[:] = hand_table().ids  # the hand rows, whatever the last step wrote
        drafter.root = 1
        draft = FakeDraft()
        drafter.propose(draft)
        [(_, guesses)] = draft.added
        kept = {"recycling": [1, -1, -1, 2] + [-1] * (len(guesses) - 4)}  # the merge kept 2 and 5
        drafter.observe(FakeVerified(np.array([1, 2, 5]), (-1, 0, 1), HostLogits(rows), [0, 1, 2], kept,
                                     FakeStats([2, 5, 19])))
        assert drafter.root == 19 and drafter.table.ids[2].tolist() == [5, 4, 0, 1]
    estimates = drafter.counts.estimates()
    assert estimates[0, 0] > 0.8 > start[0, 0] and estimates[0, 1] < start[0, 1]  # depth 1: rank 0 right, rank 1 not
    assert estimates[1, 1] > 0.8 and estimates[1, 0] < start[1, 0]  # depth 2 under 2: rank 1 (5) right, rank 0 (4) not
    assert drafter.counts.tried[1, :2].tolist() == [20, 20] and drafter.counts.tried[1, 2:].sum() == 0


def test_the_prior_holds_until_there_are_counts():
    counts = AcceptanceCounts.new(3, 8)
    assert np.allclose(counts.estimates(), np.array(PRIOR_MEAN)[None].repeat(3, 0))
    counts.add(np.array([1, 1]), np.array([0, 0]), np.array([True, False]))
    strength = counts.prior_strength
    assert np.isclose(counts.estimates()[0, 0], (1 + strength * PRIOR_MEAN[0]) / (2 + strength))  # one of two
    assert np.allclose(counts.estimates()[1:], np.array(PRIOR_MEAN)[None])  # other depths untouched


# ---- the real model ----

def test_the_table_holds_the_real_models_own_next_tokens(llama_default):
    """Plain greedy decoding of the default GGUF on llama.cpp for 40 tokens, the table filled from each step's real
    row: every token's row is the top-k of the last row it was the input of, and its best is the token greedy decoding
    emitted after it there."""
    decoder = llama_default.loaded.backend
    prompt = llama_default.chat_ids([{"role": "user", "content": "Give me three tips for staying healthy."}])
    table = RecyclingTable.empty(decoder.vocab_size)
    cache = decoder.new_cache()
    inputs, last_row = [prompt[-1]], {}
    logits = decoder.prefill(cache, prompt)
    for _ in range(40):
        table.update(np.array([inputs[-1]]), logits.top_k(np.array([0]), table.k))
        last_row[inputs[-1]] = logits.rows(slice(0, 1))[0].copy()
        inputs.append(int(logits.argmax()[0]))
        logits = decoder.prefill(cache, [inputs[-1]])
    decoder.truncate(cache, 0)
    assert table.filled() == len(last_row) > 10
    for token, row in last_row.items():  # a full sort, by value then index
        assert table.ids[token].tolist() == np.lexsort((np.arange(len(row)), -row))[: table.k].tolist()
    next_after = {inputs[i]: inputs[i + 1] for i in range(len(inputs) - 1)}  # the last occurrence's successor
    assert all(table.ids[token, 0] == after for token, after in next_after.items())
