"""Prefill, one guess-and-verify step over a sparse tree, and the generation loop.

Read top to bottom: ``prefill`` runs the prompt; ``tree_step`` builds the step's tokens
(root, guessed candidates, prompt tokens), runs one forward pass with the tree mask,
accepts the longest path the model agrees with, keeps that path's KV entries and reads
the next guesses off the prompt tokens of the last accepted node; ``generate`` loops.
Plain decoding is the same loop with a root-only tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppd_core.backends import Decoder
from ppd_core.errors import PpdError
from ppd_core.forced import ForcedText, allowed_prefix
from ppd_core.grammar import Grammar
from ppd_core.logprobs import token_logprobs
from ppd_core.lookup import ChainedTrees, NgramIndex, match_class, right_guesses
from ppd_core.lookup_policy import ChainPolicy
from ppd_core.penalties import window
from ppd_core.sampling_params import GREEDY, SamplingParams
from ppd_core.stats import StepStats
from ppd_core.tree import Tree, TreeFamily, root_only_tree
from ppd_core.verify import accept

# (tokens so far, the model's guesses [m, K]) -> guesses [m, K]; lets tests plant guesses.
GuessHook = Callable[[list[int], np.ndarray], np.ndarray]


class PromptTooLongError(PpdError):
    """The prompt leaves no room in the model's context for an answer."""


@dataclass
class Speculator:
    """What every step uses and no step changes: the model, its prompt tokens and the trees."""

    decoder: Decoder
    family: TreeFamily  # one tree per number of guessed depths; a root-only family is plain decoding
    prompt_table: np.ndarray | None = None  # [n * V, hidden] float32

    @property
    def top_k(self) -> int:
        """Guesses kept per depth: the trees' largest candidate rank + 1."""
        return self.family.max_rank + 1

    @property
    def lookup_rank(self) -> int:
        """The rank that marks lookup-chain nodes in a step's tree: one past the prompt tokens' guesses."""
        return self.top_k


@dataclass
class Request:
    """One answer to generate."""

    input_ids: Sequence[int]  # the prompt (after whatever ``cache`` already holds)
    max_new_tokens: int
    eos_token_ids: frozenset[int]
    max_context: int
    sampling: SamplingParams = GREEDY
    cache: Any = None  # the decoder's cache to continue (multi-turn); None: a new one
    guess_hook: GuessHook | None = None
    history: Sequence[int] = ()  # the tokens ``cache`` already holds (lookup guesses copy from them too)
    logprobs: int | None = None  # report each token's log-probability and this many alternatives; None: none
    chains: ChainPolicy | None = None  # lookup chains copied from the conversation, and how long; None: none
    grammar: Grammar | None = None  # the answer must follow it (a fresh state, advanced as tokens are emitted)
    forced: ForcedText | None = None  # with ``grammar``: the text it forces, drafted as a chain ...
    forced_chains: ChainPolicy | None = None  # ... this long (one match class, 0)


@dataclass
class DecodeState:
    """What one step hands the next."""

    cache: Any  # the decoder's
    root: int  # the last emitted token: the next tree's root
    guesses: np.ndarray | None = None  # [m, K] int64 for depths 1..m; None before the first tree step
    sampling: SamplingParams = GREEDY
    generator: np.random.Generator | None = None
    sequence: list[int] | None = None  # with repetition penalties: every token so far (the cache's, the root last)
    logprobs: int | None = None  # ``Request.logprobs``
    grammar: Grammar | None = None  # ``Request.grammar``, after the tokens emitted so far


def prefill(
    decoder: Decoder,
    cache: Any,
    input_ids: Sequence[int],
    sampling: SamplingParams = GREEDY,
    generator: np.random.Generator | None = None,
    sequence: Sequence[int] = (),
    logprobs: int | None = None,
    grammar: Grammar | None = None,
) -> StepStats:
    """Process the prompt (after whatever ``cache`` already holds); emits the first new token. ``sequence``: the
    whole sequence so far (the cache's tokens, then ``input_ids``), for repetition penalties."""
    start = time.perf_counter()
    logits = decoder.prefill(cache, input_ids)  # [1, vocab]: the last prompt token's
    recent = window(sequence, sampling) if sampling.penalized else None
    _, token = accept([-1], [0], logits, sampling, generator, recent, grammar)
    reported = None if logprobs is None else token_logprobs(logits.rows(slice(0, 1)), [token], logprobs)
    return StepStats(tokens=[token], from_guesses=0, tree_tokens=len(input_ids), seconds=time.perf_counter() - start,
                     prefill=True, logprobs=reported)


def tree_step(speculator: Speculator, state: DecodeState, tree: Tree) -> StepStats:
    """One forward pass over ``tree``: verify the guesses, make the next ones.

    Updates ``state``: the cache keeps the accepted path, ``root`` and ``guesses`` are the next step's.
    """
    start = time.perf_counter()
    decoder, cache = speculator.decoder, state.cache
    cached = decoder.cache_length(cache)

    # 1. The step's rows: root, guessed candidates, then prompt tokens.
    node_tokens = np.array([state.root], dtype=np.int64)  # [1]
    if tree.num_nodes > 1:
        candidates = state.guesses[tree.candidate_depths - 1, tree.candidate_ranks]  # [N - 1]
        node_tokens = np.concatenate([node_tokens, candidates])  # [N]
    prompt_rows = None
    if tree.num_tokens > tree.num_nodes:
        prompt_rows = speculator.prompt_table[tree.prompt_embedding_index]  # [T - N, hidden]

    # 2. One forward pass; the model's own choice at every row.
    logits = decoder.tree_logits(cache, tree, node_tokens, prompt_rows)  # [T rows, vocab]

    # 3. Accept the longest path the model agrees with; its own next token comes free.
    node_list = node_tokens.tolist()
    recent = window(state.sequence, state.sampling) if state.sequence is not None else None  # [W], the root last
    last, bonus = accept(tree.parents, node_list, logits, state.sampling, state.generator, recent, state.grammar)
    path = tree.node_paths[last]  # node indices, root first
    tokens = [node_list[i] for i in path[1:]] + [bonus]
    from_lookup = sum(1 for i in path[1:] if tree.paths[i][-1] == speculator.lookup_rank)

    reported = None  # the emitted tokens' log-probabilities, from the rows that chose them: the path's
    if state.logprobs is not None:
        reported = token_logprobs(logits.rows(np.asarray(path)), tokens, state.logprobs)

    # 4. Keep the accepted path's KV at contiguous positions; drop the rest.
    decoder.keep(cache, cached, path)

    # 5. Next guesses: the prompt tokens attached to the last accepted node.
    depth = tree.prompt_counts[last]
    state.guesses = None
    if depth:
        slots = tree.prompt_slots[last, :depth]  # [m, V]
        state.guesses = logits.top_of_mean(slots, speculator.top_k)  # [m, K]: the ensemble's mean, best first
    state.root = tokens[-1]
    return StepStats(tokens=tokens, from_guesses=len(path) - 1, tree_tokens=tree.num_tokens,
                     seconds=time.perf_counter() - start, from_lookup=from_lookup, logprobs=reported)


def generate(speculator: Speculator, request: Request) -> Iterator[StepStats]:
    """Yield the stats of each forward pass, prefill first, until EOS, the token limit or the context end.

    A step's tokens are cut at EOS (kept, as ``generate()`` does) and at the limits, so the
    concatenated tokens equal plain greedy decoding exactly (or, sampling losslessly, follow
    the model's distribution). The last step has ``stop`` set.
    """
    if not request.input_ids:
        raise PpdError("the prompt is empty")
    if request.max_new_tokens < 1:
        raise PpdError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")
    decoder, max_context = speculator.decoder, request.max_context
    cache = decoder.new_cache() if request.cache is None else request.cache
    prompt_end = decoder.cache_length(cache) + len(request.input_ids)  # sequence length before the answer
    check_prompt_fits(prompt_end, max_context)
    last_resort = root_only_tree()
    chains = request.chains
    lookup = NgramIndex([*request.history, *request.input_ids]) if chains is not None else None
    chained = ChainedTrees(speculator.lookup_rank)

    sampling = request.sampling
    generator = None if sampling.greedy else sampling.generator()
    sequence = [*request.history, *request.input_ids] if sampling.penalized else None  # what penalties count
    stats = prefill(decoder, cache, request.input_ids, sampling, generator, sequence or (), request.logprobs,
                    request.grammar)
    state = DecodeState(cache, root=stats.tokens[-1], sampling=sampling, generator=generator, sequence=sequence,
                        logprobs=request.logprobs, grammar=request.grammar)
    produced: list[int] = []
    while True:
        room = max_context - prompt_end - len(produced)
        kept, stats.stop = clip_tokens(stats.tokens, len(produced), request.eos_token_ids, request.max_new_tokens, room)
        stats.clip(len(kept))  # the stats count only the tokens kept
        produced.extend(stats.tokens)
        if sequence is not None:
            sequence.extend(stats.tokens)
        yield stats
        if stats.stop:
            return

        # the depth-0 tree (no guesses yet) only attaches prompt tokens to the root
        tree = speculator.family.for_depth(0 if state.guesses is None else state.guesses.shape[0])
        room = max(0, decoder.max_tree_rows - tree.num_tokens)  # rows left for a chain
        offered, match, drafted = [], 0, 0  # the lookup's proposal, its match class, the tokens drafted of it
        if lookup is not None:
            lookup.extend(stats.tokens)
            offered, match = lookup.propose(chains.longest)
            if offered and state.grammar is not None:
                offered = allowed_prefix(state.grammar, offered)  # never draft what the grammar forbids
            if offered:
                match = match_class(match)
                drafted = min(chains.length(match, len(offered)), room)
        forced, forcing = [], 0  # the grammar's forced text, the tokens drafted of it
        if request.forced is not None:
            request.forced.observe(stats.tokens)
            if request.forced_chains.length(0, request.forced_chains.longest):  # a chain could pay on this device
                forced = request.forced.propose(state.grammar, request.forced_chains.longest)
                forcing = min(request.forced_chains.length(0, len(forced)), room) if forced else 0
        if forcing and forcing >= drafted:  # one chain a step: the grammar's where it is at least as long
            chain, drafted = forced[:forcing], 0
        else:
            chain, forcing = offered[:drafted], 0
        if chain:
            tree, state.guesses = chained.step(tree, state.guesses, chain)
        if prompt_end + len(produced) - 1 + tree.max_offset >= max_context:
            tree, drafted, forcing = last_resort, 0, 0  # no room left for guesses near the end of the context
        stats = tree_step(speculator, state, tree)
        if offered:  # the emitted tokens show how much of the proposal was right, drafted or not
            chains.observe(match, right_guesses(offered, stats.tokens, 0), drafted, len(offered))
            stats.chain, stats.chain_match = drafted, match
        if forced:
            request.forced_chains.observe(0, right_guesses(forced, stats.tokens, 0), forcing, len(forced))
            if forcing:  # the chain's accepted tokens were the grammar's
                stats.from_grammar, stats.from_lookup, stats.forced = stats.from_lookup, 0, forcing
        if request.guess_hook is not None and state.guesses is not None:
            state.guesses = request.guess_hook(produced + stats.tokens, state.guesses)


def check_prompt_fits(prompt_length: int, max_context: int) -> None:
    """Raise PromptTooLongError unless the prompt leaves room for at least one answer token."""
    if prompt_length >= max_context:
        raise PromptTooLongError(
            f"the prompt has {prompt_length} tokens but the model's context holds {max_context} "
            "(prompt and answer together)"
        )


def clip_tokens(
    tokens: list[int], done: int, eos_token_ids: frozenset[int], max_new_tokens: int, room: int
) -> tuple[list[int], str | None]:
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
