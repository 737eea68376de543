"""The suffix drafter (ppd_core/drafters/suffix.py) and its index (suffix_automaton.py): the longest earlier match and
its continuations against a brute-force scan, the bounded history, the shape of a proposal, and learning from steps.
Steps are faked with the tree protocol's names (``Draft.add``; ``Verified.stats.tokens``, ``.kept``, ``.path``)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

from ppd_core.drafters.suffix import (CONVERSATION, HISTORY, MATCH_CLASSES, SuffixDrafter, SuffixMemory, make,
                                     match_class)
from ppd_core.drafters.suffix_automaton import GrowingText, SuffixAutomaton


def brute_match(text: list[int]) -> int:
    """The length of the longest suffix of ``text`` that also ends before its last position."""
    n = len(text)
    for length in range(n - 1, 0, -1):
        suffix = text[n - length:]
        if any(text[j:j + length] == suffix for j in range(0, n - length)):
            return length
    return 0


def brute_continuations(text: list[int], pattern: list[int]) -> Counter:
    """How often each token followed ``pattern`` in ``text``."""
    k = len(pattern)
    return Counter(text[j + k] for j in range(len(text) - k) if text[j:j + k] == pattern)


def automaton_counts(automaton: SuffixAutomaton, state: int) -> Counter:
    return Counter({token: count for token, _, count in automaton.continuations(state)})


def test_the_longest_earlier_match_and_its_continuations_equal_a_brute_force_scan():
    rng = random.Random(51)
    for trial in range(60):
        vocab = rng.choice([2, 3, 5])
        text = GrowingText()
        tokens: list[int] = []
        for _ in range(rng.randint(1, 70)):
            token = rng.randrange(vocab)
            tokens.append(token)
            text.extend([token])
            length = brute_match(tokens)
            assert text.match.length == length, (trial, tokens)
            if not length:
                continue
            pattern = tokens[len(tokens) - length:]
            state = text.match.state
            assert automaton_counts(text.automaton, state) == brute_continuations(tokens, pattern)
            for token_next, child, _ in text.automaton.continuations(state):  # one level further: the trie's
                deeper = brute_continuations(tokens, pattern + [token_next])
                assert automaton_counts(text.automaton, child) == deeper


def test_a_static_match_is_the_longest_suffix_of_the_query_found_anywhere():
    rng = random.Random(7)
    for _ in range(40):
        text = [rng.randrange(3) for _ in range(rng.randint(1, 40))]
        query = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        found = SuffixAutomaton(text).match(query)
        expected = max((k for k in range(len(query) + 1)
                        if any(text[j:j + k] == query[len(query) - k:] for j in range(len(text) - k + 1))), default=0)
        assert found.length == expected


def test_the_history_keeps_the_newest_answers_within_its_budget():
    memory = SuffixMemory(budget=100)
    answers = [[1000 + 10 * a + i for i in range(30)] for a in range(10)]  # tokens unique to each answer
    for answer in answers:
        memory.remember(answer)
        assert memory.tokens <= 100
        assert memory.tokens == sum(len(kept) + 1 for kept in memory.answers)
    assert memory.automaton.match([answers[-1][5], answers[-1][6]]).length == 2  # the newest is there
    assert memory.automaton.match([answers[0][5]]).length == 0  # the oldest was dropped
    memory.remember(list(range(500)))  # one answer over the budget keeps its end
    assert memory.tokens <= 100 and memory.automaton.match([499]).length == 1
    memory.forget_answers()
    assert memory.tokens == 0 and not memory.answers


@dataclass
class FakeDraft:
    added: list = field(default_factory=list)

    def add(self, name, guesses):
        self.added.append((name, guesses))


def fake_verified(tokens, kept=None, path=(0,)):
    """A step that emitted ``tokens``; ``kept``: the suffix nodes' merged indices; ``path``: the accepted nodes."""
    return SimpleNamespace(stats=SimpleNamespace(tokens=list(tokens)), kept={} if kept is None else {"suffix": kept},
                           path=list(path))


def test_a_proposal_is_a_valid_tree_within_its_limit():
    rng = random.Random(3)
    for _ in range(50):
        vocab, limit = rng.choice([2, 4, 8]), rng.choice([1, 2, 4, 8, 12])
        context = [rng.randrange(vocab) for _ in range(rng.randint(2, 300))]
        drafter = SuffixDrafter(context, limit=limit, floor=rng.choice([0.0, 0.05, 0.3]))
        draft = FakeDraft()
        drafter.propose(draft)
        if not draft.added:
            assert drafter.text.match.length == 0 or drafter.floor > 0
            continue
        (name, guesses), = draft.added
        assert name == "suffix" and guesses.limit == limit and 1 <= len(guesses) <= limit
        assert all(-1 <= parent < i for i, parent in enumerate(guesses.parents))
        assert len(set(zip(guesses.parents, guesses.tokens))) == len(guesses)  # no duplicate siblings
        assert all(0.0 < prob <= 1.0 for prob in guesses.probs)
        assert min(guesses.path_probs()) >= drafter.floor
        assert max(guesses.depths()) <= drafter.max_depth


def test_a_copied_passage_is_proposed_as_its_continuation():
    passage = list(range(100, 140))
    drafter = SuffixDrafter([1, 2, *passage, 3, 4, *passage[:10]], limit=6, floor=0.0)
    guesses = drafter.guesses()
    assert drafter.source == CONVERSATION and match_class(drafter.text.match.length) == match_class(10)
    assert guesses.tokens == passage[10:16] and guesses.parents == [-1, 0, 1, 2, 3, 4]


def test_the_history_proposes_where_it_matches_longer():
    memory = SuffixMemory()
    memory.remember([7, 8, 9, 10, 11, 12])
    drafter = SuffixDrafter([5, 7, 8, 9], memory=memory, limit=2, floor=0.0)
    assert drafter.guesses().tokens == [10, 11] and drafter.source == HISTORY
    drafter.observe(fake_verified([10, 11, 12], kept=[1, 2], path=[0, 1, 2]))
    drafter.finish()
    assert memory.answers[-1] == [10, 11, 12]


def learnt_ratio(accept: bool, steps: int = 30) -> tuple[float, float]:
    """The conversation's depth-1 ratio for 16+-token matches before and after ``steps`` steps that accept (or
    reject) the proposal after a copied passage."""
    passage = list(range(100, 200))
    context, memory, cls = [*passage, 1, *passage[:20]], SuffixMemory(), match_class(20)
    before = memory.acceptance.ratio(CONVERSATION, cls, 1)
    for _ in range(steps):
        drafter = SuffixDrafter(context, memory=memory, limit=1, floor=0.0)
        assert drafter.guesses().tokens == [passage[20]] and drafter.match_class == cls
        drafter.observe(fake_verified([passage[20] if accept else 5], kept=[1], path=[0, 1] if accept else [0]))
    return before, memory.acceptance.ratio(CONVERSATION, cls, 1)


def test_learnt_estimates_move_toward_what_was_accepted():
    before, after = learnt_ratio(accept=True)
    assert after > before and after > 0.95
    before, after = learnt_ratio(accept=False)
    assert after < before and after < 0.2


def test_nodes_left_out_of_the_tree_are_judged_by_the_emitted_tokens():
    passage = list(range(100, 140))
    drafter = SuffixDrafter([*passage, 1, *passage[:20]], limit=3, floor=0.0)
    guesses = drafter.guesses()
    acceptance, cls = drafter.memory.acceptance, drafter.match_class
    drafter.observe(fake_verified([guesses.tokens[0], guesses.tokens[1]], kept=[1, -1, -1], path=[0, 1]))
    assert [acceptance.accepted[CONVERSATION][cls][d] for d in range(3)] == [1.0, 1.0, 0.0]  # depth 3 not shown
    assert [acceptance.expected[CONVERSATION][cls][d] for d in range(3)] == [1.0, 1.0, 0.0]


def test_an_answer_joins_the_history_when_the_next_one_starts():
    memory = SuffixMemory()
    first = make(SimpleNamespace(input_ids=[1, 2, 3], memory={"suffix": memory}))
    first.observe(fake_verified([40, 41, 42]))
    assert memory.tokens == 0 and first.memory is memory
    second = SuffixDrafter([5, 40, 41], memory=memory, floor=0.0)
    assert list(memory.answers) == [[40, 41, 42]]
    assert second.guesses().tokens == [42] and second.source == HISTORY


def test_a_class_below_the_floor_is_still_judged_and_climbs_back():
    passage = list(range(100, 200))
    context, memory = [*passage, 1, *passage[:20]], SuffixMemory()
    memory.acceptance.prior[CONVERSATION] = [0.5] * len(MATCH_CLASSES)
    for steps in range(40):
        drafter = SuffixDrafter(context, memory=memory, limit=1, floor=0.9)
        guesses = drafter.guesses()
        if len(guesses):
            break
        drafter.observe(fake_verified([passage[20]]))  # nothing drafted; the model's own token was the one left out
    assert len(guesses) == 1 and guesses.tokens == [passage[20]] and steps > 0
