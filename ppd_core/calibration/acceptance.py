"""Acceptance statistics p_d(r) of the prompt tokens, measured on this model.

The decoding backend answers the calibration prompts greedily; then, as in training, prompt tokens are
attached at every position of each answer (many positions per step, through the backend's own tree rows), and the
rank of the model's own token among each prompt token's guesses is recorded. p_d(r) counts rank r at
depth d among the positions where depths 1..d-1 were guessed within the top k. n-gram lookup
is replayed on the decoding backend's own greedy answers to the same conversations.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from importlib import resources

import numpy as np

from ppd_core.backend import Decoder, StepRows
from ppd_core.calibration.records import AcceptanceStats
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Speculator, generate
from ppd_core.drafters.lookup import LookupStats
from ppd_core.text import chat_ids
from ppd_core.tree import Tree, TreeSpec, build_tree, plain_family

TOP_K = 10
CUTS_PER_STEP = 16  # the most answer positions one acceptance step measures (fewer where the backend's rows end)


def calibration_prompts() -> list[list[str]]:
    """Conversations shipped with the package, as their user turns (none from MT-Bench): most ask once,
    some follow up (shorten, rewrite, extend code), as chats do and as lookup needs to be measured on."""
    entries = json.loads(resources.files("ppd_core.calibration").joinpath("prompts.json").read_text())
    return [[entry] if isinstance(entry, str) else entry for entry in entries]


Answerer = Callable[[list[list[int]]], list[list[int]]]  # prompts -> the model's greedy answers (token ids)


def conversation_answers(tokenizer, conversations: Sequence[Sequence[str]], answer: Answerer) -> list[tuple[int, list[int], list[int]]]:
    """The model's greedy answer to every turn of each conversation, asked turn by turn (``answer`` takes one
    turn's prompts at once); a later turn follows the earlier answers (as text, as a chat holds them).
    (turn, prompt ids, answer ids) each."""
    histories: list[list[dict]] = [[] for _ in conversations]
    out = []
    for turn in range(max((len(c) for c in conversations), default=0)):
        live = [i for i, turns in enumerate(conversations) if turn < len(turns)]
        for i in live:
            histories[i].append({"role": "user", "content": conversations[i][turn]})
        prompts = [chat_ids(tokenizer, histories[i]) for i in live]
        for i, prompt, reply in zip(live, prompts, answer(prompts)):
            histories[i].append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})
            out.append((turn + 1, prompt, reply))
    return out


def decoder_answers(decoder: Decoder, max_new_tokens: int, eos_ids: Sequence[int],
                    progress: Callable[[int], None] | None = None,
                    between: Callable[[], object] | None = None) -> Answerer:
    """Greedy answers from the decoding backend itself, plain decoding, one prompt at a time (``progress`` gets
    the number answered so far; ``between()`` runs before each step, a pause point): lookup is replayed on exactly
    the text decoding will see (llama.cpp's answers differ from transformers' fp32 ones)."""
    speculator = Speculator(decoder, plain_family(), eos_token_ids=frozenset(eos_ids))
    answered = itertools.count(1)

    def answer(prompts: list[list[int]]) -> list[list[int]]:
        replies = []
        for prompt in prompts:
            request = check_answer(prompt, max_new_tokens, decoder.info.max_context)
            reply = []
            for step in generate(speculator, request):  # the next step runs once asked for: after ``between``
                reply += step.tokens
                if between is not None:
                    between()
            replies.append(reply)
            if progress:
                progress(next(answered))
        return replies

    return answer


def lookup_stats(answers: Sequence[tuple[int, list[int], list[int]]]) -> LookupStats:
    """n-gram lookup replayed on ``conversation_answers``."""
    stats = LookupStats.empty()
    for turn, prompt, reply in answers:
        stats.add_answer(prompt, reply, turn)
    return stats


def guess_ranks(guesses: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Ranks [C, n] of the model's tokens ``truth`` [C, n] among ``guesses`` [C, n, k] (best first); -1 where absent."""
    found = guesses == truth[..., None]  # [C, n, k]
    return np.where(found.any(-1), found.argmax(-1), -1)


def chain_tree(length: int, num_prompt_tokens: int, ensemble_size: int) -> Tree:
    """``length`` consecutive tokens as a chain of nodes, each with all prompt tokens attached: one step measures the
    guesses at ``length`` cuts, with the masks and positions decoding gives them."""
    spec = TreeSpec({(0,) * depth: num_prompt_tokens for depth in range(length)})
    return build_tree(spec, num_prompt_tokens, ensemble_size, max_depth=length - 1)


def answer_ranks(decoder: Decoder, prompt_table: np.ndarray, num_prompt_tokens: int, ensemble_size: int,
                 prompt: list[int], answer: list[int], top_k: int = TOP_K, trees: dict[int, Tree] | None = None) -> np.ndarray:
    """Ranks [C, n] of the model's own tokens among the prompt tokens' guesses at every cut c inside a greedy
    ``answer`` (x[c] the last context token; prompt token k guesses the model's token at c + k + 1), through the
    decoding backend's tree rows, many cuts per step; -1 outside the top k. ``prompt_table`` [n * V, hidden]."""
    n, V = num_prompt_tokens, ensemble_size
    per_step = max(1, min(CUTS_PER_STEP, decoder.info.max_tree_rows // (1 + n * V)))
    trees = {} if trees is None else trees
    sequence = prompt + answer
    cache = decoder.new_cache()
    model_tokens, guesses = [], []  # the model's token after each answer position; [n, k] guesses at each
    try:
        decoder.prefill(cache, prompt)
        for start in range(len(prompt), len(sequence), per_step):
            nodes = np.asarray(sequence[start : start + per_step], dtype=np.int64)
            tree = trees.get(len(nodes)) or trees.setdefault(len(nodes), chain_tree(len(nodes), n, V))
            rows = StepRows.of(tree, nodes, prompt_table[tree.prompt_embedding_index])
            logits = decoder.tree_logits(cache, rows)
            model_tokens.extend(logits.argmax(slice(0, len(nodes))).tolist())
            guesses.extend(logits.top_of_mean(tree.prompt_slots[i], top_k) for i in range(len(nodes)))
            decoder.keep(cache, start, list(range(len(nodes))), rows)
    finally:
        decoder.truncate(cache, 0)
    cuts = max(0, len(answer) - n)  # those whose n targets the model's tokens cover (``distillation.valid_cuts``)
    truth = np.array([model_tokens[c + 1 : c + n + 1] for c in range(cuts)], dtype=np.int64).reshape(cuts, n)
    return guess_ranks(np.array(guesses[:cuts], dtype=np.int64).reshape(cuts, n, top_k), truth)


def decoder_acceptance(decoder: Decoder, prompt_table: np.ndarray, num_prompt_tokens: int, ensemble_size: int,
                       answers: Sequence[tuple[int, list[int], list[int]]], top_k: int = TOP_K,
                       progress: Callable[[int, int], None] | None = None,
                       between: Callable[[], object] | None = None) -> AcceptanceStats:
    """p_d(r) through the decoding backend itself (llama.cpp on a GGUF: its kernels, quantization and masks) on its own
    greedy ``answers`` (``conversation_answers``): ``answer_ranks`` of each, counted as ``ppd train``'s evaluation
    counts them on the transformers model. ``between()`` before each answer: a pause point."""
    stats = AcceptanceStats(hits=[[0] * top_k for _ in range(num_prompt_tokens)], trials=[0] * num_prompt_tokens)
    trees: dict[int, Tree] = {}
    for done, (_, prompt, answer) in enumerate(answers, 1):
        if between is not None:
            between()
        stats.add(answer_ranks(decoder, prompt_table, num_prompt_tokens, ensemble_size, prompt, answer, top_k, trees))
        if progress:
            progress(done, len(answers))
    return stats
