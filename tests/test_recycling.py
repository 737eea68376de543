"""Token Recycling: the table (per token and per token pair) against the rows it was filled from (synthetic and the
real model's), the best-first tree grown through it against brute force, the acceptance it learns,
``StepLogits.top_k`` and ``top_k_probs`` against brute force (host and torch), its memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from ppd_core.backends.torch.decoder import DeviceLogits
from ppd_core.drafters.base import Guesses
from ppd_core.drafters.recycling import (
    AcceptanceCounts, RecyclingDrafter, RecyclingTable, class_priors, grow, node_classes, outcomes,
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


def test_top_k_probs_are_the_softmax_of_the_top_k_on_host_and_device():
    values = (np.random.default_rng(8).standard_normal((5, 300)) * 4).astype(np.float32)
    softmax = np.exp(values - values.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    rows = np.array([4, 0, 2])
    for logits in (HostLogits(values), DeviceLogits(torch.from_numpy(values.copy()))):
        ids, probs = logits.top_k_probs(rows, 6)
        assert np.array_equal(ids, top_k(values[rows], 6)) and probs.dtype == np.float32
        assert np.allclose(probs, np.take_along_axis(softmax[rows], ids, -1), rtol=1e-4, atol=1e-7)


def test_top_k_of_real_valued_rows_equals_a_full_sort():
    values = np.random.default_rng(7).standard_normal((6, 1000)).astype(np.float32)
    assert np.array_equal(top_k(values, 8), np.argsort(-values, axis=-1, kind="stable")[:, :8])


# ---- the table ----

def softmax_top(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    return HostLogits(rows).top_k_probs(slice(None), k)


def test_the_table_keeps_each_token_and_pair_rows_top_k_the_last_row_winning():
    table = RecyclingTable.empty(30, k=4, slots=64)
    assert table.ids.shape == (30, 4) and table.ids.dtype == np.int32 and (table.ids == -1).all()
    rows = np.random.default_rng(0).standard_normal((4, 30)).astype(np.float32)  # [N, vocab]
    ids, probs = softmax_top(rows, 6)
    table.update(np.array([1, 2, 1, -1]), np.array([5, 9, 5, 7]), ids, probs)  # 7: no token before it known
    assert table.ids[5].tolist() == brute_top(rows[2], 4) and table.ids[9].tolist() == brute_top(rows[1], 4)
    assert np.allclose(table.probs[5], probs[2, :4], rtol=1e-3)
    assert table.filled() == 3 and (table.ids[np.setdiff1d(np.arange(30), [5, 7, 9])] == -1).all()
    for before, token, row in ((1, 5, 2), (2, 9, 1), (3, 5, 2), (-1, 7, 3)):  # (3, 5) and (-1, 7): the token's row
        got, got_probs, paired = table.row(before, token)
        assert got.tolist() == brute_top(rows[row], 4) and paired == (before in (1, 2))
    assert (table.pair_keys >= 0).sum() == 2  # (1, 5) once, (2, 9)


def test_a_new_pair_in_a_taken_slot_replaces_the_old_one():
    table = RecyclingTable.empty(1000, k=2, slots=2)  # two slots: three pairs must share
    rows = np.random.default_rng(1).standard_normal((3, 1000)).astype(np.float32)
    for i, (before, token) in enumerate(((1, 2), (3, 4), (5, 6))):
        table.update(np.array([before]), np.array([token]), *softmax_top(rows[i : i + 1], 2))
    held = [table.row(b, t)[2] for b, t in ((1, 2), (3, 4), (5, 6))]
    assert held[2] and sum(held) == (table.pair_keys >= 0).sum() <= 2  # the newest is always there


def test_memory_is_the_token_rows_and_the_pair_slots():
    # the default model: 49,152 tokens x 4 x (4 + 2) B, 65,536 slots x (8 + 4 x 4 + 4 x 2) B
    assert RecyclingTable.empty(49152).nbytes == 49152 * 4 * 6 + 65536 * 32 == 3_276_800
    assert RecyclingTable.empty(100, k=3, slots=4).nbytes == 100 * 3 * 6 + 4 * (8 + 12 + 6)


def test_observe_fills_the_table_from_every_node_row_with_the_token_before_it_and_keeps_the_next_root():
    vocab, rng = 40, np.random.default_rng(1)
    drafter = RecyclingDrafter(RecyclingTable.empty(vocab, k=4, slots=256), widths=(2, 1), before=30)
    first = rng.standard_normal(vocab).astype(np.float32)
    drafter.observe(prefill(7, first, int(first.argmax())))
    assert drafter.table.ids[7].tolist() == brute_top(first, 4) and drafter.table.row(30, 7)[2]  # (30, 7) known
    assert (drafter.before, drafter.root) == (7, first.argmax())
    rows = rng.standard_normal((4, vocab)).astype(np.float32)  # three nodes, then a prompt-token row
    nodes = np.array([drafter.root, 3, 11])
    drafter.observe(FakeVerified(nodes, (-1, 0, 0), HostLogits(rows), [0, 2], {}, FakeStats([11, 25])))
    for i, (before, token) in enumerate(((7, nodes[0]), (nodes[0], 3), (nodes[0], 11))):
        got, _, paired = drafter.table.row(int(before), int(token))
        assert paired and got.tolist() == brute_top(rows[i], 4)
    assert drafter.table.filled() == 4 and (drafter.before, drafter.root) == (11, 25)


# ---- the tree ----

def random_table(seed: int, vocab: int = 12) -> RecyclingTable:
    """Token rows with repeats across rows and unknowns, distinct within a row, random probabilities; a few pairs."""
    rng = np.random.default_rng(seed)
    table = RecyclingTable.empty(vocab, k=4, slots=64)
    for token in range(vocab):
        known = int(rng.integers(0, 5))
        table.ids[token, :known] = rng.permutation(vocab)[:known]
        table.probs[token, :known] = np.sort(rng.random(known))[::-1]
    for _ in range(6):
        before, token, known = int(rng.integers(vocab)), int(rng.integers(vocab)), int(rng.integers(1, 5))
        ids, probs = np.full((1, 4), -1), np.zeros((1, 4))
        ids[0, :known], probs[0, :known] = rng.permutation(vocab)[:known], np.sort(rng.random(known))[::-1]
        table.update(np.array([before]), np.array([token]), ids, probs)
    return table


def every_node(table, estimates, before, root, widths):
    """Brute force: every node the widths allow, as (path of tokens, path product)."""
    out, level = [], [((), before, root, 1.0)]
    for width in widths:
        deeper = []
        for path, above, token, product in level:
            ids, probs, paired = table.row(above, token)
            for child, prob in zip(ids[:width].tolist(), probs[:width].tolist()):
                if child < 0:
                    break
                cls = node_classes(np.array([paired]), np.array([len(path) + 1]), np.array([prob]))[0]
                deeper.append((path + (child,), token, child, product * estimates[cls]))
        out += [(path, product) for path, _, _, product in deeper]
        level = deeper
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_grown_tree_is_the_best_nodes_by_path_product(seed):
    table, rng = random_table(seed), np.random.default_rng(100 + seed)
    estimates, widths = rng.uniform(0.05, 0.95, len(class_priors())), (4, 2, 2, 1)
    before, root = int(rng.integers(12)), int(rng.integers(12))
    everything = every_node(table, estimates, before, root, widths)
    for limit in (1, 3, 7, 40):
        proposal = grow(table, estimates, before, root, limit, widths)
        paths = []
        for i, (token, parent) in enumerate(zip(proposal.tokens.tolist(), proposal.parents.tolist())):
            assert parent < i and proposal.depths[i] == (1 if parent < 0 else proposal.depths[parent] + 1)
            paths.append((paths[parent] if parent >= 0 else ()) + (token,))
        assert len(set(paths)) == len(paths) == min(limit, len(everything))
        best = sorted((product for _, product in everything), reverse=True)[: len(paths)]
        got = dict(everything)
        assert np.allclose(sorted((got[path] for path in paths), reverse=True), best)  # the best products
        assert np.allclose(Guesses(proposal.tokens.tolist(), proposal.parents.tolist(),
                                   proposal.probs.tolist()).path_probs(), [got[path] for path in paths])


def hand_table() -> RecyclingTable:
    table = RecyclingTable.empty(20, k=4, slots=64)
    table.ids[1], table.probs[1] = [2, 3, -1, -1], [0.95, 0.02, 0, 0]
    table.ids[2], table.probs[2] = [4, 5, 6, 7], [0.5, 0.3, 0.1, 0.05]
    table.ids[3], table.probs[3] = [6, -1, -1, -1], [0.9, 0, 0, 0]
    table.ids[4], table.probs[4] = [8, 9, -1, -1], [0.85, 0.1, 0, 0]
    return table


def test_a_pairs_row_comes_before_the_tokens_row_and_is_its_own_class():
    table = hand_table()
    plain = grow(table, class_priors(), 0, 1, 3, (2, 2))
    assert plain.tokens.tolist() == [2, 4, 5] and plain.parents.tolist() == [-1, 0, 0]  # 0.76, 0.76 x 0.4, x 0.28
    table.update(np.array([0]), np.array([1]), np.array([[3, 2, -1, -1]]), np.array([[0.97, 0.01, 0, 0]]))
    paired = grow(table, class_priors(), 0, 1, 3, (2, 2))  # after 0 then 1, the pair's row says 3
    assert paired.tokens.tolist() == [3, 6, 2] and paired.parents.tolist() == [-1, 0, -1]
    assert paired.classes[0] != plain.classes[0] and paired.classes[0] == node_classes(np.array([True]),
                                                                                         np.array([1]), np.array([0.97]))[0]


def test_no_root_no_proposal():
    draft = FakeDraft()
    RecyclingDrafter(hand_table()).propose(draft)  # before the prefill
    assert draft.added == []


# ---- learning ----

def test_outcomes_decide_only_nodes_whose_path_was_emitted():
    proposal = grow(hand_table(), np.full(len(class_priors()), 0.5), -1, 1, 20, (2, 2, 1))
    assert proposal.tokens.tolist() == [2, 3, 4, 5, 6, 8]  # by product: depth 1, then 2, then 3 (8 under 4)
    tried, accepted = outcomes(proposal, [2, 4, 9])  # 2 accepted, then 4, then the model's own 9
    assert tried.tolist() == [True, True, True, True, False, True]
    assert accepted.tolist() == [True, False, True, False, False, False]
    tried, accepted = outcomes(proposal, [7])  # nothing accepted: only depth 1 decided
    assert tried.tolist() == [True, True] + [False] * 4 and not accepted.any()


def test_estimates_move_toward_what_was_accepted():
    drafter = RecyclingDrafter(RecyclingTable.empty(20, k=4, slots=64), widths=(2, 2))
    start = drafter.counts.estimates().copy()
    rows = np.full((3, 20), -10.0, dtype=np.float32)  # the verified step's rows: root 1, then 2, then 5
    rows[0, [2, 3]], rows[1, [5, 4]], rows[2, 19] = (2, 1), (2, 1), 1
    for _ in range(20):  # every step from root 1: depth 1's best guess (2) is right, then the second under it (5)
        drafter.table = hand_table()  # the hand rows, whatever the last step wrote, no pairs
        drafter.root, drafter.before = 1, -1
        draft = FakeDraft()
        drafter.propose(draft)
        [(_, guesses)] = draft.added
        drafter.observe(FakeVerified(np.array([1, 2, 5]), (-1, 0, 1), HostLogits(rows), [0, 1, 2], {},
                                     FakeStats([2, 5, 19])))
        assert drafter.root == 19 and drafter.table.ids[2].tolist()[:2] == [5, 4]
    estimates = drafter.counts.estimates()
    depth1 = node_classes(np.array([False, False]), np.array([1, 1]), np.array([0.95, 0.02]))  # 2, then 3
    depth2 = node_classes(np.array([False, False]), np.array([2, 2]), np.array([0.5, 0.3]))  # 4, then 5 under 2
    assert estimates[depth1[0]] > start[depth1[0]] and estimates[depth1[1]] < start[depth1[1]]
    assert estimates[depth2[1]] > 0.8 and estimates[depth2[0]] < start[depth2[0]]
    assert drafter.counts.tried[depth2].tolist() == [20, 20]


def test_the_prior_holds_until_there_are_counts():
    counts = AcceptanceCounts.new()
    assert np.allclose(counts.estimates(), class_priors())
    counts.add(np.array([3, 3]), np.array([True, False]))
    strength = counts.prior_strength
    assert np.isclose(counts.estimates()[3], (1 + strength * class_priors()[3]) / (2 + strength))  # one of two
    others = np.arange(len(class_priors())) != 3
    assert np.allclose(counts.estimates()[others], class_priors()[others])  # other classes untouched


# ---- the real model ----

def test_the_table_holds_the_real_models_own_next_tokens(llama_default):
    """Plain greedy decoding of the default GGUF on llama.cpp for 40 tokens, the table filled from each step's real
    row: every token's (and pair's) row is the top-k of the last row it was the input of, with the row's softmax
    probabilities, and its best is the token greedy decoding emitted after it there."""
    decoder = llama_default.loaded.backend
    prompt = llama_default.chat_ids([{"role": "user", "content": "Give me three tips for staying healthy."}])
    table = RecyclingTable.empty(decoder.vocab_size)
    cache = decoder.new_cache()
    inputs, last_row = list(prompt[-2:]), {}
    logits = decoder.prefill(cache, prompt)
    for _ in range(40):
        table.update(np.array(inputs[-2:-1]), np.array(inputs[-1:]), *logits.top_k_probs(np.array([0]), table.k))
        last_row[inputs[-1]] = logits.rows(slice(0, 1))[0].astype(np.float64)
        inputs.append(int(logits.argmax()[0]))
        logits = decoder.prefill(cache, [inputs[-1]])
    decoder.truncate(cache, 0)
    assert table.filled() == len(last_row) > 10
    for token, row in last_row.items():  # a full sort, by value then index
        best = np.lexsort((np.arange(len(row)), -row))[: table.k]
        assert table.ids[token].tolist() == best.tolist()
        softmax = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        assert np.allclose(table.probs[token], softmax[best], atol=2e-3)  # float16
    next_after = {inputs[i]: inputs[i + 1] for i in range(1, len(inputs) - 1)}  # the last occurrence's successor
    assert all(table.ids[token, 0] == after for token, after in next_after.items())
    pair_next = {(inputs[i - 1], inputs[i]): inputs[i + 1] for i in range(1, len(inputs) - 1)}  # the last's
    assert all(table.row(*pair)[0][0] == after and table.row(*pair)[2] for pair, after in pair_next.items())
