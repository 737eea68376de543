"""Prefill, one guess-and-verify step over a sparse tree, and the generation loop.

``generate`` reads like gpt-fast's loop: every drafter (``ppd_core.drafters``: the prompt tokens, then the answer's
own, such as chains copied from the conversation or forced by a grammar) proposes candidate nodes; one merge
(``drafters.merge``) makes them the step's tree under the row budget; ``verify`` runs one forward pass with the tree
mask, accepts the longest path the model agrees with (its own next token comes free) and keeps that path's KV
entries; every drafter then observes what was accepted. Plain decoding is the same loop with a root-only tree.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppd_core.answer_request import AnswerRequest
from ppd_core.backend import Decoder, StepRows
from ppd_core.drafters.base import Draft, Drafter, Verified
from ppd_core.drafters.merge import Merger, StepTree, root_only
from ppd_core.drafters.prompt_tokens import GuessHook, PromptTokenDrafter, prompt_rows
from ppd_core.sampling.constraint import Grammar
from ppd_core.sampling.logits import token_logprobs
from ppd_core.sampling.params import GREEDY, SamplingParams
from ppd_core.sampling.penalties import window
from ppd_core.sampling.verify import accept
from ppd_core.stats import StepStats, StopReason
from ppd_core.tree import TreeFamily, root_only_tree


@dataclass
class Speculator:
    """What every step uses and no step changes: the model, its prompt tokens and the trees."""

    decoder: Decoder
    family: TreeFamily  # one tree per number of guessed depths; a root-only family is plain decoding
    prompt_table: np.ndarray | None = None  # [n * V, hidden] float32
    acceptance: Sequence[Sequence[float]] | None = None  # calibration's p_d(r) of the prompt tokens, [n][k]
    merger: Merger = field(default_factory=Merger)  # the steps' merge (it keeps the tree shapes it built)
    rows: int | None = None  # every source's nodes together fill at most this many rows a step (None: the decoder's)
    # [R + 1] what a step of r rows costs in plain steps (r <= R; ``Draft.row_costs``): each step's tree is only as big
    # as pays; None: every step fills its budget
    row_costs: tuple[float, ...] | None = None
    eos_token_ids: frozenset[int] = frozenset()  # the model's end-of-generation tokens: an answer ends at one
    pad_to: int | None = None  # every step computed as exactly this many rows (``StepRows.pad_to``); None: its own

    @property
    def top_k(self) -> int:
        """Guesses kept per depth: the trees' largest candidate rank + 1."""
        return self.family.max_rank + 1

    def prompt_drafter(self, hook: GuessHook | None = None) -> PromptTokenDrafter:
        """A new answer's prompt-token drafter over these trees."""
        return PromptTokenDrafter(self.family, self.top_k, hook, self.acceptance)

    def new_draft(self) -> Draft:
        """An empty draft for a step: the row budget (``rows``, at most the decoder's), the prompt tokens' shape."""
        tree, most = self.family.trees[0], self.pad_to or self.decoder.info.max_tree_rows
        budget = most if self.rows is None else min(self.rows, most)
        if self.row_costs is not None:
            budget = min(budget, len(self.row_costs) - 1)  # no larger than the costs say
        return Draft(budget, tree.num_prompt_tokens, tree.ensemble_size, row_costs=self.row_costs)


@dataclass
class Answering:
    """What one answer adds to its ``AnswerRequest``: the cache it goes on from, its drafters, its grammar's state."""

    cache: Any = None  # the decoder's cache holding the request's first ``reused`` tokens; None: a new one
    reused: int = 0
    # this answer's own drafters (``drafters.registry``), in order (on ties the earlier's nodes are kept first); the
    # prompt tokens' drafter comes from the speculator, ahead of them
    drafters: Sequence[Drafter] = ()
    grammar: Grammar | None = None  # the grammar's state, advanced as tokens are emitted; None: a clone of the request's
    guess_hook: GuessHook | None = None


@dataclass
class DecodeState:
    """What one step hands the next; the request it answers (None: greedy, no logprobs) is read, never copied."""

    cache: Any  # the decoder's
    root: int  # the last emitted token: the next tree's root
    request: AnswerRequest | None = None
    generator: np.random.Generator | None = None
    sequence: list[int] | None = None  # with repetition penalties: every token so far (the cache's, the root last)
    grammar: Grammar | None = None  # the request's grammar, after the tokens emitted so far

    @property
    def sampling(self) -> SamplingParams:
        return GREEDY if self.request is None else self.request.sampling

    @property
    def logprobs(self) -> int | None:
        return None if self.request is None else self.request.logprobs


def prefill(
    decoder: Decoder,
    cache: Any,
    input_ids: Sequence[int],
    sampling: SamplingParams = GREEDY,
    generator: np.random.Generator | None = None,
    sequence: Sequence[int] = (),
    logprobs: int | None = None,
    grammar: Grammar | None = None,
) -> Verified:
    """Process the prompt (after whatever ``cache`` already holds): a root-only step that emits the first new token,
    its tree the last prompt token. ``sequence``: the whole sequence so far (the cache's tokens, then ``input_ids``),
    for repetition penalties."""
    start = time.perf_counter()
    logits = decoder.prefill(cache, input_ids)  # [1, vocab]: the last prompt token's
    recent = window(sequence, sampling) if sampling.penalized else None
    _, token = accept([-1], [0], logits, sampling, generator, recent, grammar)
    reported = None if logprobs is None else token_logprobs(logits.rows(slice(0, 1)), [token], logprobs)
    stats = StepStats(tokens=[token], from_guesses=0, tree_tokens=len(input_ids), seconds=time.perf_counter() - start,
                      prefill=True, logprobs=reported)
    return Verified(np.array([input_ids[-1]], dtype=np.int64), (-1,), logits, [0], {}, stats, root_only_tree())


def verify(speculator: Speculator, state: DecodeState, step: StepTree) -> Verified:
    """One forward pass over the step's merged tree; accepts the longest path the model agrees with.

    Updates ``state``: the cache keeps the accepted path's KV at contiguous positions, ``root`` is the last token.
    """
    start = time.perf_counter()
    decoder, cache, tree = speculator.decoder, state.cache, step.tree
    cached = decoder.cache_length(cache)
    node_tokens = step.node_tokens  # [N]: the root, then the kept candidates
    rows = StepRows.of(tree, node_tokens, prompt_rows(speculator.prompt_table, tree), speculator.pad_to)
    logits = decoder.tree_logits(cache, rows)  # [T, vocab]

    # the longest path the model agrees with; its own next token comes free
    node_list = node_tokens.tolist()
    recent = window(state.sequence, state.sampling) if state.sequence is not None else None  # [W], the root last
    last, bonus = accept(tree.parents, node_list, logits, state.sampling, state.generator, recent, state.grammar)
    path = list(tree.node_paths[last])  # node indices, root first
    tokens = [node_list[i] for i in path[1:]] + [bonus]
    reported = None  # the emitted tokens' log-probabilities, from the rows that chose them: the path's
    if state.logprobs is not None:
        reported = token_logprobs(logits.rows(np.asarray(path)), tokens, state.logprobs)

    decoder.keep(cache, cached, path, rows)  # the accepted path's KV; the rest dropped
    state.root = tokens[-1]
    stats = StepStats(tokens=tokens, from_guesses=len(path) - 1, tree_tokens=tree.num_tokens,
                      seconds=time.perf_counter() - start, logprobs=reported,
                      sources=[step.owners[i] for i in path[1:]], drafted=step.drafted)
    return Verified(node_tokens, step.parents, logits, path, step.kept, stats, tree)


def observe(drafters: Sequence[Drafter], verified: Verified) -> None:
    """Every drafter learns what the step accepted; the notes and memory sizes they keep go to the step's stats."""
    for drafter in drafters:
        drafter.observe(verified)
        note = getattr(drafter, "note", "")
        if note:
            verified.stats.notes[drafter.name] = note
        size = getattr(drafter, "memory_bytes", None)
        if size is not None:
            verified.stats.memory_bytes[drafter.name] = int(size)


def tree_step(speculator: Speculator, state: DecodeState, step: StepTree, drafters: Sequence[Drafter]) -> Verified:
    """One step after the merge: ``verify`` its tree and let ``drafters`` observe what was accepted (the step's
    seconds count both: the prompt tokens read the next guesses off the step's rows)."""
    start = time.perf_counter()
    verified = verify(speculator, state, step)
    observe(drafters, verified)
    verified.stats.seconds = time.perf_counter() - start
    return verified


def propose(speculator: Speculator, drafters: Sequence[Drafter]) -> Draft:
    """The step's draft: every drafter's proposal, in drafter order."""
    draft = speculator.new_draft()
    for drafter in drafters:
        drafter.propose(draft)
    return draft


def merge(speculator: Speculator, state: DecodeState, draft: Draft, reach: int) -> StepTree:
    """The step's tree (``Merger.merge``); the root alone where it would reach ``reach`` positions past the root or
    more (the context's end)."""
    step = speculator.merger.merge(draft, state.root, state.grammar)
    return step if step.tree.max_offset < reach else root_only(state.root)


def generate(speculator: Speculator, request: AnswerRequest, answering: Answering | None = None
             ) -> Generator[StepStats, None, None]:
    """Yield the stats of each forward pass, prefill first, until EOS, the token limit or the context end.

    A step's tokens are cut at EOS (kept, as ``generate()`` does) and at the limits, so the
    concatenated tokens equal plain greedy decoding exactly (or, sampling losslessly, follow
    the model's distribution). The last step has ``stop`` set. ``request`` was checked when it was made
    (``check_answer``): nothing is checked again here.
    """
    answering = answering or Answering()
    decoder, state = speculator.decoder, start(speculator, request, answering)
    prompt_end = len(request.ids)  # the sequence's length before the answer
    drafters = [speculator.prompt_drafter(answering.guess_hook), *answering.drafters]
    verified = prefill(decoder, state.cache, request.ids[answering.reused:], state.sampling, state.generator,
                       state.sequence or (), state.logprobs, state.grammar)
    state.root = verified.stats.tokens[-1]
    observe(drafters, verified)
    produced: list[int] = []
    while True:
        stats = verified.stats
        room = request.context - prompt_end - len(produced)
        kept, stats.stop = clip_tokens(stats.tokens, len(produced), speculator.eos_token_ids, request.max_new_tokens,
                                       room)
        stats.clip(len(kept))  # the stats count only the tokens kept
        produced.extend(stats.tokens)
        if state.sequence is not None:
            state.sequence.extend(stats.tokens)
        yield stats
        if stats.stop:
            return

        started = time.perf_counter()
        draft = propose(speculator, drafters)  # 1. every drafter proposes its nodes
        reach = request.context - (prompt_end + len(produced) - 1)  # positions left after the root's
        step = merge(speculator, state, draft, reach)  # 2. one tree under the row budget
        verified = verify(speculator, state, step)  # 3. one forward pass: the longest path the model agrees with
        observe(drafters, verified)  # 4. every drafter learns what was accepted
        verified.stats.seconds = time.perf_counter() - started  # the whole step's: proposing and merging included


def start(speculator: Speculator, request: AnswerRequest, answering: Answering) -> DecodeState:
    """The first state: the cache to fill (the root is set by prefill), the sampler's generator, the sequence
    penalties count, the grammar's state."""
    sampling = request.sampling
    cache = speculator.decoder.new_cache() if answering.cache is None else answering.cache
    generator = None if sampling.greedy else sampling.generator()
    sequence = list(request.ids) if sampling.penalized else None  # what penalties count
    grammar = answering.grammar if answering.grammar is not None else request.grammar_state()
    return DecodeState(cache, root=-1, request=request, generator=generator, sequence=sequence, grammar=grammar)


def clip_tokens(
    tokens: list[int], done: int, eos_token_ids: frozenset[int], max_new_tokens: int, room: int
) -> tuple[list[int], StopReason | None]:
    """Cut a step's tokens at the first EOS and the limits; say why generation stops, if it does."""
    keep = next((i + 1 for i, t in enumerate(tokens) if t in eos_token_ids), len(tokens))
    keep = min(keep, max_new_tokens - done, room)
    tokens = tokens[:keep]
    if tokens and tokens[-1] in eos_token_ids:
        return tokens, "eos"
    if done + keep >= max_new_tokens:
        return tokens, "length"
    if keep >= room:
        return tokens, "context"
    return tokens, None
