"""The step's merge (``ppd_core.drafters.merge``): shared prefixes joined, the budget spent on the best path products,
limits and the grammar respected, the layout the family's trees had; and greedy decoding with three sources merged
(the prompt tokens, the lookup and a branching third) equal to plain decoding on the default GGUF."""

import itertools
import random

import numpy as np
import pytest

from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core.drafters.base import Draft, Guesses
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.drafters.lookup import MATCH_CLASSES, LookupDrafter
from ppd_core.drafters.merge import Merger
from ppd_core.drafters.prompt_tokens import PromptTokenDrafter
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import build_tree, family_from_spec, plain_family

ROOT = 99


def merged(*proposals, max_rows=64, root_prompts=0, n=0, grammar=None, row_costs=None, prompt_value=0.0):
    """The merge of ``(name, Guesses)`` proposals."""
    draft = Draft(max_rows, n, 1, root_prompts, row_costs=row_costs, prompt_value=prompt_value)
    for name, guesses in proposals:
        draft.add(name, guesses)
    return Merger().merge(draft, ROOT, grammar)


def test_a_prefix_two_sources_share_is_one_node_with_their_estimates_combined():
    step = merged(("a", Guesses.chain([5, 6], [0.5, 0.5])), ("b", Guesses.chain([5, 7], [0.4, 0.9])), max_rows=3)
    # node 5: the higher estimate, 0.5; then 7 (0.45) before 6 (0.25); three rows: the root, 5 and 7
    assert step.node_tokens.tolist() == [ROOT, 5, 7] and step.parents == (-1, 0, 1)
    assert step.owners == ("", "a", "b") and step.kept == {"a": [1, -1], "b": [1, 2]}
    assert step.drafted == {"a": 1, "b": 1}
    whole = merged(("a", Guesses.chain([5, 6], [0.5, 0.5])), ("b", Guesses.chain([5, 7], [0.4, 0.9])))
    assert whole.node_tokens.tolist() == [ROOT, 5, 6, 7] and whole.parents == (-1, 0, 1, 1)  # siblings: a's first
    assert whole.kept == {"a": [1, 2], "b": [1, 3]}


def random_proposal(rng: random.Random, size: int) -> Guesses:
    guesses = Guesses()
    for _ in range(size):
        guesses.add(rng.randrange(4), rng.randrange(-1, len(guesses)), rng.choice([0.1, 0.3, 0.5, 0.7, 0.9, 1.0]))
    return guesses


def brute_best(nodes: list[tuple[int, float]], budget: int) -> float:
    """The most expected tokens of any ancestor-closed set of at most ``budget`` of ``nodes`` ((parent, value))."""
    best = 0.0
    for k in range(budget + 1):
        for chosen in itertools.combinations(range(len(nodes)), k):
            if all(nodes[i][0] < 0 or nodes[i][0] in chosen for i in chosen):
                best = max(best, sum(nodes[i][1] for i in chosen))
    return best


def path_tokens(step, node: int) -> tuple[int, ...]:
    return tuple(step.node_tokens[i] for i in step.tree.node_paths[node][1:])


def test_the_budget_keeps_the_nodes_of_highest_path_product():
    """One row a node: the kept nodes' expected tokens (their path products' sum) is the best any tree of as many
    rows drawn from the proposals has (brute force over every set of nodes that holds its nodes' parents)."""
    rng = random.Random(5)
    for _ in range(60):
        proposals = [(name, random_proposal(rng, rng.randint(1, 5))) for name in ("a", "b")]
        budget = rng.randint(1, 6)
        whole = merged(*proposals)  # every node: the combined estimates and path products by hand
        value = {0: 1.0}
        for node in range(1, len(whole.parents)):
            value[node] = value[whole.parents[node]] * merged_estimate(whole, proposals, node)
        by_path = {path_tokens(whole, node): value[node] for node in value}
        step = merged(*proposals, max_rows=1 + budget)
        nodes = [(whole.parents[i] - 1, value[i]) for i in range(1, len(whole.parents))]  # indices without the root
        assert len(step.parents) - 1 == min(budget, len(nodes))
        kept = sum(by_path[path_tokens(step, node)] for node in range(1, len(step.parents)))
        assert kept == pytest.approx(brute_best(nodes, budget))


def test_a_curve_sizes_each_step_to_the_most_tokens_per_unit_of_time():
    """With the step's costs by rows, the kept nodes give the most expected tokens per unit of step cost that any tree
    drawn from the proposals gives (brute force over every ancestor-closed set within the budget); a step where no
    node pays for its row is the root alone."""
    rng = random.Random(11)
    for _ in range(60):
        proposals = [(name, random_proposal(rng, rng.randint(1, 5))) for name in ("a", "b")]
        budget = rng.randint(1, 6)
        costs = [1.0, 1.0]  # by rows (index 0 unused): a 1-row step costs 1 plain step
        for _ in range(budget):
            costs.append(costs[-1] + rng.choice([0.0, 0.05, 0.3, 0.9]))
        whole = merged(*proposals)
        value = {0: 1.0}
        for node in range(1, len(whole.parents)):
            value[node] = value[whole.parents[node]] * merged_estimate(whole, proposals, node)
        by_path = {path_tokens(whole, node): value[node] for node in value}
        nodes = [(whole.parents[i] - 1, value[i]) for i in range(1, len(whole.parents))]
        best = max((1 + brute_best(nodes, k)) / costs[1 + k] for k in range(min(budget, len(nodes)) + 1))
        step = merged(*proposals, max_rows=1 + budget, row_costs=costs)
        kept = 1 + sum(by_path[path_tokens(step, node)] for node in range(1, len(step.parents)))
        assert kept / costs[len(step.parents)] == pytest.approx(best)
    steep = merged(("a", Guesses.chain([5, 6], [0.9, 0.9])), max_rows=3, row_costs=(1.0, 1.0, 2.0, 3.0))
    assert steep.node_tokens.tolist() == [ROOT]  # 1.9 tokens for 2 steps' time: a plain step pays more
    cheap = merged(("a", Guesses.chain([5, 6], [0.9, 0.9])), max_rows=3, row_costs=(1.0, 1.0, 1.1, 1.2))
    assert cheap.node_tokens.tolist() == [ROOT, 5, 6]


def test_prompt_token_rows_stay_only_where_they_pay_with_what_they_will_guess():
    """On a curve, the step keeps its prompt-token rows (the root's, its nodes') only where the tree with them, and
    what the prompt tokens are expected to add to the next step, pays more per unit of time than the same rows given
    to guesses; else every prompt-token row goes and the step is sized without them."""
    tokens = Guesses([1], [-1], [0.3], [1])  # a guess carrying one prompt-token row; one more on the root
    chain = Guesses.chain([2, 3], [0.9, 0.9])
    costs = (1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
    bare = merged(("prompt tokens", tokens), ("b", chain), max_rows=6, root_prompts=1, n=1, row_costs=costs)
    # with the rows: at best 2.71 tokens for 1.3 steps (2.08); without: the guess at row 4, 3.01 for 1.3 (2.32)
    assert bare.node_tokens.tolist() == [ROOT, 1, 2, 3] and set(bare.prompt_counts) == {0}
    worth = merged(("prompt tokens", tokens), ("b", chain), max_rows=6, root_prompts=1, n=1, row_costs=costs,
                   prompt_value=1.0)  # 3.71 tokens for 1.3 steps (2.85): the root's prompt-token row stays
    assert worth.node_tokens.tolist() == [ROOT, 2, 3] and worth.prompt_counts == (1, 0, 0)


def test_a_step_with_nothing_guessed_is_a_plain_step_that_names_its_proposers():
    step = merged(("prompt tokens", Guesses()), ("lookup", Guesses()))
    assert step.node_tokens.tolist() == [ROOT] and step.tree.num_tokens == 1
    assert step.kept == {"prompt tokens": [], "lookup": []} and step.drafted == {"prompt tokens": 0, "lookup": 0}
    rows = merged(("prompt tokens", Guesses()), root_prompts=2, n=2)  # the root's prompt-token rows still go
    assert rows.tree.prompt_counts == (2,) and rows.tree.num_tokens == 3


def merged_estimate(whole, proposals, node: int) -> float:
    """Node ``node``'s estimate: the highest of its proposers'."""
    return max(p for name, guesses in proposals for n, p in zip(whole.kept[name], guesses.probs) if n == node)


def test_a_proposals_limit_and_the_prompt_token_rows_count():
    step = merged(("a", Guesses([1, 2, 3], [-1, 0, 1], [1.0, 1.0, 1.0])),
                  ("b", Guesses([1, 2, 4, 8], [-1, 0, 1, 2], [0.9, 0.9, 0.9, 0.9], limit=2)))
    assert step.kept["b"] == [1, 2, -1, -1]  # its two shared nodes count against its limit; 4 and 8 are over it
    rows = Guesses([1, 2], [-1, -1], [0.9, 0.8], [2, 1])  # node 1 carries 2 prompt tokens, node 2 one
    tree = merged(("prompt tokens", rows), max_rows=6, root_prompts=1, n=2).tree
    assert tree.prompt_counts == (1, 2) and tree.num_tokens == 5  # 1 + 1 root rows, 1 + 2: node 2's 2 rows do not fit
    tree = merged(("prompt tokens", rows), max_rows=7, root_prompts=1, n=2).tree
    assert tree.prompt_counts == (1, 2, 1) and tree.num_tokens == 7
    tie = merged(("a", Guesses.chain([1], [0.5])), ("b", Guesses.chain([2], [0.5])), max_rows=2)
    assert tie.owners == ("", "a")  # a tie: the earlier drafter's


def test_only_todays_sources_reproduce_todays_trees():
    """The prompt tokens' tree alone is the family's tree, buffers and all; a chain joins it where it shares its
    candidates and hangs the rest under the last shared node, one path from the root."""
    rng, numbers = random.Random(3), np.random.default_rng(3)
    for name, spec in STATIC_TREES.items():
        family = family_from_spec(name, spec, 3)
        drafter = PromptTokenDrafter(family, family.max_rank + 1)
        merger = Merger()
        for _ in range(20):
            drafter.guesses = np.stack([numbers.permutation(20)[: family.max_rank + 1] for _ in range(3)])  # [3, K]
            tree = family.for_depth(3)
            draft = Draft(256, 3)
            drafter.propose(draft)
            alone = merger.merge(draft, ROOT)
            for field in ("parents", "row_parents", "prompt_counts", "node_paths"):
                assert getattr(alone.tree, field) == getattr(tree, field), (name, field)
            assert (alone.tree.attention_mask == tree.attention_mask).all()
            assert (alone.tree.position_offsets == tree.position_offsets).all()
            guessed = drafter.guesses[tree.candidate_depths - 1, tree.candidate_ranks].tolist()
            assert alone.node_tokens.tolist() == [ROOT, *guessed]
            chain = [int(drafter.guesses[0, 0]) if rng.random() < 0.5 else 100 + rng.randrange(5)]
            chain += [int(drafter.guesses[d, rng.randrange(family.max_rank + 1)]) if rng.random() < 0.5
                      else 100 + rng.randrange(5) for d in (1, 2)]
            chain += [100 + rng.randrange(5) for _ in range(rng.randint(0, 3))]
            draft.add("lookup", Guesses.chain(chain, [0.5] * len(chain)))
            step = merger.merge(draft, ROOT)
            tokens = step.node_tokens.tolist()
            for parent in set(step.parents):
                children = [tokens[i] for i, p in enumerate(step.parents) if p == parent]
                assert len(children) == len(set(children)), "a token repeats a sibling"
            paths = {tuple(tokens[i] for i in path[1:]) for path in step.tree.node_paths}
            assert tuple(chain) in paths and step.kept["lookup"][-1] > 0  # the whole chain is one path from the root
            assert step.tree.num_nodes <= tree.num_nodes + len(chain)
            mine = step.kept["prompt tokens"]  # every node of the tree kept, with its prompt-token rows
            assert [tokens[i] for i in mine] == guessed and [step.prompt_counts[i] for i in mine] == list(tree.prompt_counts[1:])
            build_tree(step.tree.spec, 3, 1, max(3, len(chain)))  # a consistent description


def single_token(engine, text: str) -> int:
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_the_grammar_drops_a_forbidden_node_with_its_subtree(llama_default):
    backend = llama_default.loaded.backend
    grammar = backend.grammar('root ::= "yes" | "no"')
    yes, no, maybe = (single_token(llama_default, word) for word in ("yes", "no", "maybe"))
    end = next(iter(llama_default.loaded.eos_token_ids))
    first = Guesses([maybe, yes, yes, no], [-1, 0, -1, 2], [0.9, 0.9, 0.8, 0.7])  # maybe -> yes; yes -> no
    second = Guesses([no, yes, end, yes], [-1, -1, 1, 2], [0.5, 0.5, 0.5, 0.5])  # no; yes -> end -> yes
    step = merged(("first", first), ("second", second), grammar=grammar)
    assert step.kept["first"] == [-1, -1, 1, -1]  # maybe is forbidden: its child goes with it; no after yes too
    tokens = step.node_tokens.tolist()
    assert step.kept["second"][:3] == [2, 1, 3] and tokens[3] == end and step.kept["second"][3] == -1  # none after end
    assert tokens == [ROOT, yes, no, end] and step.parents == (-1, 0, 0, 1)
    assert merged(("first", first), ("second", second)).kept["first"] == [1, 4, 2, 5]  # no grammar: all kept
    grammar.close()


class Branching:
    """A third source that knows the plain answer: each step a branching tree, the right next tokens on one branch
    (sometimes cut short, sometimes wrong at the start) and wrong ones beside them."""

    name = "branching"

    def __init__(self, answer: list[int], vocab: int, seed: int = 0):
        self.answer, self.vocab, self.done = answer, vocab, 0
        self.rng = random.Random(seed)

    def propose(self, draft: Draft) -> None:
        right = self.answer[self.done : self.done + 4]
        guesses = Guesses()
        wrong = lambda: self.rng.randrange(self.vocab)  # noqa: E731
        parent = -1
        for depth, token in enumerate(right):
            if depth == self.rng.randrange(6):  # a wrong turn: the branch goes on from a wrong token
                token = wrong()
            guesses.add(wrong(), parent, 0.2)  # a wrong sibling, with a child of its own
            guesses.add(wrong(), len(guesses) - 1, 0.3)
            parent = guesses.add(token, parent, 0.7)
        draft.add(self.name, guesses)

    def observe(self, verified) -> None:
        self.done += len(verified.stats.tokens)


@pytest.mark.slow
def test_three_sources_merged_decode_exactly_what_plain_decoding_does(llama_default):
    """Prompt tokens (the medium tree), lookup chains and a branching third source in one tree each step, on the default
    GGUF through llama.cpp: greedy output token for token plain decoding's; every source owns nodes and has guesses
    accepted."""
    engine = llama_default
    backend, tokens = engine.loaded.backend, engine.prompt_tokens
    family = family_from_spec("medium", STATIC_TREES["medium"], tokens.num_prompt_tokens, tokens.ensemble_size)
    prompts = ["Repeat exactly: the cat sat on the mat, the cat sat on the mat.", "Count from 1 to 20."]
    totals = {"prompt tokens": 0, "lookup": 0, "branching": 0}
    drafted = dict.fromkeys(totals, 0)
    for prompt in prompts:
        ids = engine.chat_ids([{"role": "user", "content": prompt}])
        plain = [t for s in generate(Speculator(backend, plain_family()),
                                     check_answer(ids, 64, engine.max_context)) for t in s.tokens]
        drafters = [LookupDrafter(FixedChains((4,) * len(MATCH_CLASSES)), ids), Branching(plain, backend.vocab_size)]
        speculator = Speculator(backend, family, engine._prompt_table)
        steps = list(generate(speculator, check_answer(ids, 64, engine.max_context), Answering(drafters=drafters)))
        assert [t for s in steps for t in s.tokens] == plain, prompt
        for step in steps:
            for name in totals:
                totals[name] += step.sources.count(name)
                drafted[name] += step.drafted.get(name, 0)
    assert all(totals.values()) and all(drafted.values()), (totals, drafted)
