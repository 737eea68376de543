"""Step latency against tree size on this device: the hardware half of the tree choice.

Each probe is a real ``tree_step`` (forward with the tree mask, LM head, verification, KV
compaction, next guesses) over a tree of the given number of tokens, after a context of
realistic length; the cache is cut back to the context after every probe. Medians of
repeated runs after a warm-up. A step ends with its answers on the host (the accepted
tokens and the next guesses), so a GPU's work is done when the clock is read.

A probe is timed as decoding meets it, between steps of another shape: each run is the tree's step and then a
1-token step, and a size's figure is that pair less half a pair of 1-token steps. llama.cpp rebuilds its compute
graph (and on CUDA its CUDA graph) whenever the batch's shape changes, a cost a step of one size repeated never
pays: on an H200 with the default model, a 2-to-8-token step repeated cost 1.4-2.4x a 1-token step, yet decoding with
the chains that curve chose ran at 0.75x plain on first turns (benchmarks/README.md, "On an NVIDIA H200").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from ppd_core.backend import Decoder
from ppd_core.decoding import DecodeState, Speculator, prefill, tree_step
from ppd_core.drafters.merge import from_tree
from ppd_core.tree import Tree, TreeFamily, TreeSpec, build_tree

# Every small size: step cost is not monotone there (on this project's CPU 4 tokens cost less
# than 3, and 16 less than 12: matmul blocking favours multiples of 4), so no interpolation.
CPU_SIZES = tuple(range(1, 17)) + (20, 24, 32, 48, 64)
GPU_SIZES = CPU_SIZES + (96, 128, 160, 192, 256)
# One context at the middle of the range chats run at (256 to 1024 cached tokens): a step's cost grows linearly
# with the context (the attention part), so this is the mean of the two ends at half the probes.
CONTEXTS = (640,)
MIN_RUNS = 4  # timed runs before the median may be taken as settled
STABLE = 0.02  # settled: one more run moves the median by at most 2%
CHUNK = 32  # the probes' context is decoded this many tokens at a time, with a pause point before each


class ProbeContext:
    """The cached context the probes run after: ``tokens`` decoded in chunks of ``CHUNK`` with a pause point
    (``between``) before each, never in one long call an answer lent the model would wait behind (640 tokens took
    15 s on a busy 2-core CPU: the first answer of a first launch waited that long). An answer given the model
    meanwhile takes its place in the backend: ``ready()`` decodes it again, in chunks too."""

    def __init__(self, decoder: Decoder, tokens: list[int], between: Callable[[], bool] | None = None):
        self.decoder, self.tokens, self.between = decoder, tokens, between
        self.cache = None

    def ready(self):
        """A cache holding the context, decoded anew (where another call had the model in between: from the start)."""
        while True:
            if self.cache is not None:
                self.decoder.truncate(self.cache, 0)
            self.cache = self.decoder.new_cache()
            for start in range(0, len(self.tokens), CHUNK):
                if self.between is not None and self.between():
                    break  # the model was lent: what was decoded is gone from it
                prefill(self.decoder, self.cache, self.tokens[start : start + CHUNK])
            else:
                return self.cache

    def close(self) -> None:
        if self.cache is not None:
            self.decoder.truncate(self.cache, 0)


def probe_tree(size: int, num_prompt_tokens: int, ensemble_size: int) -> Tree:
    """A tree of exactly ``size`` tokens: prompt tokens on the root, the rest depth-1 candidates."""
    if size <= 1:
        return build_tree(TreeSpec({(): 0}), num_prompt_tokens, ensemble_size)
    prompts = min(num_prompt_tokens, (size - 1) // ensemble_size)
    spec = {(): prompts}
    spec.update({(rank,): 0 for rank in range(size - 1 - prompts * ensemble_size)})
    return build_tree(TreeSpec(spec), max(num_prompt_tokens, 1), ensemble_size)


def measure_latency(
    decoder: Decoder,
    prompt_table: np.ndarray | None,  # [n * V, hidden]
    num_prompt_tokens: int,
    ensemble_size: int,
    sizes: Sequence[int],
    contexts: Sequence[int] = CONTEXTS,
    repeats: int = 9,
    warmup: int = 2,
    progress: Callable[[int, int], None] | None = None,
    ceiling: float | None = None,
    between: Callable[[], bool] | None = None,
) -> dict[int, dict[int, float]]:
    """Median step milliseconds: ``{context length: {tree tokens: ms}}``.

    ``ceiling``: the most tokens per step any tree with its lookup chains can yield. Sizes ascend; once two sizes in
    a row cost more than ``ceiling`` plain steps (at the first context), no larger tree can beat plain decoding, and
    the larger sizes are not measured (on a CPU, where each row costs most of a step, that is most of them).

    ``between()`` runs before every timed step: it may lend the model to other work (the chat's answers while a first
    launch calibrates) and returns True if it did; that size's timing then starts over, warm-up included.
    """
    vocab, max_context = decoder.info.vocab_size, decoder.info.max_context
    generator = np.random.default_rng(0)
    measured: dict[tuple[int, int], float] = {}  # (context, size) -> ms
    sizes = sorted(set(sizes) | {1})  # every figure is taken against the 1-token step's
    total, done = len(contexts) * len(sizes), 0
    plain = probe_tree(1, num_prompt_tokens, ensemble_size)
    for first, context in enumerate(contexts):
        context = min(context, max_context - max(sizes) - 4)
        probe = ProbeContext(decoder, generator.integers(vocab, size=context).tolist(), between)
        probe.ready()
        for size in list(sizes):
            tree = probe_tree(size, num_prompt_tokens, ensemble_size)
            guesses = generator.integers(vocab, size=(max(tree.depth, 1), max(tree.max_rank + 1, 1)))  # [depth, K]
            speculator = Speculator(decoder, TreeFamily(f"probe-{size}", (tree,)), prompt_table)
            pair = step_ms(speculator, probe, tree, guesses, context, warmup, repeats, between, then=plain)
            if size == 1:
                single = pair / 2  # a 1-token step after a 1-token step
            measured[context, size] = max(pair - single, 1e-3)
            done += 1
            if first == 0 and ceiling is not None and beyond_reach(measured, context, sizes, size, ceiling):
                sizes = [s for s in sizes if s <= size]  # the larger trees cannot win: not measured
                total = len(contexts) * len(sizes)
            if progress:
                progress(done, total)
            if size == sizes[-1]:
                break
        probe.close()
    result: dict[int, dict[int, float]] = {}
    for (context, size), ms in measured.items():
        result.setdefault(context, {})[size] = round(ms, 3)
    return result


def measure_fixed(
    decoder: Decoder,
    prompt_table: np.ndarray | None,  # [n * V, hidden]
    num_prompt_tokens: int,
    ensemble_size: int,
    ladder: Sequence[int],
    context: int = CONTEXTS[0],
    repeats: int = 9,
    warmup: int = 2,
    ceiling: float | None = None,
    between: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[int, float]:
    """Median milliseconds of a step of R rows repeated (R, R, R, ...), as decoding runs every step when it pads them
    all to R rows (``StepRows.pad_to``): ``{R: ms}``, 1 (a plain step repeated) included. Past two rungs in a row
    that cost more than ``ceiling`` plain steps, no larger one can win: not measured (``progress(done, total)`` after
    each rung then counts them done)."""
    generator = np.random.default_rng(1)
    context = min(context, decoder.info.max_context - max(ladder) - 4)
    probe = ProbeContext(decoder, generator.integers(decoder.info.vocab_size, size=context).tolist(), between)
    probe.ready()
    measured: dict[int, float] = {}
    rungs = sorted(set(ladder) | {1})
    try:
        for rows in rungs:
            tree = probe_tree(rows, num_prompt_tokens, ensemble_size)
            guesses = generator.integers(decoder.info.vocab_size, size=(max(tree.depth, 1), max(tree.max_rank + 1, 1)))
            speculator = Speculator(decoder, TreeFamily(f"fixed-{rows}", (tree,)), prompt_table, pad_to=rows)
            measured[rows] = round(step_ms(speculator, probe, tree, guesses, context, warmup, repeats, between), 3)
            over = [r for r in measured if ceiling is not None and r > 1 and measured[r] > ceiling * measured[1]]
            beyond = len(over) >= 2 and sorted(measured)[-2:] == sorted(over)[-2:]
            if progress:
                progress(len(rungs) if beyond else len(measured), len(rungs))
            if beyond:
                break
    finally:
        probe.close()
    return measured


def beyond_reach(measured: dict, context: int, sizes: Sequence[int], size: int, ceiling: float) -> bool:
    """Whether ``size`` and the size before it both cost more than ``ceiling`` one-token steps (every kernel)."""
    def ratio(s: int) -> float:
        return measured[context, s] / base

    base = measured[context, sizes[0]]
    index = sizes.index(size)
    return index >= 2 and ratio(size) > ceiling and ratio(sizes[index - 1]) > ceiling


def step_ms(speculator: Speculator, cache, tree: Tree, guesses: np.ndarray, context: int, warmup: int, repeats: int,
            between: Callable[[], bool] | None = None, then: Tree | None = None) -> float:
    """Median milliseconds of a real ``tree_step`` after ``context`` cached tokens (the cache is cut back after each),
    and of a ``then`` step after it where given: at most ``repeats`` runs after the warm-up, fewer once the median
    holds still (within ``STABLE``). ``between()`` before each run: where it lent the model to other work, the warm-up
    and the timing start anew, after ``cache`` is decoded again where it is a ``ProbeContext`` (its pause points)."""
    probe = cache if isinstance(cache, ProbeContext) else None
    cache = probe.cache if probe is not None else cache
    times = []
    run = 0
    while run < warmup + repeats:
        if between is not None and between():  # the model did other work meanwhile: warm up and time anew
            times, run = [], 0
            if probe is not None:
                cache = probe.ready()
        start = time.perf_counter()
        for step in (tree, then) if then is not None else (tree,):
            tree_step(speculator, DecodeState(cache, root=0), from_tree(step, guesses, 0), [speculator.prompt_drafter()])
            speculator.decoder.truncate(cache, context)
        if run >= warmup:
            times.append(time.perf_counter() - start)
        run += 1
        if len(times) >= MIN_RUNS and abs(statistics.median(times) - statistics.median(times[:-1])) <= STABLE * statistics.median(times):
            break
    return 1000 * statistics.median(times)
