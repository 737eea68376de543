"""The llama.cpp backend on the real default GGUF, through the real llama.cpp library (no mock).

Claims tested: one tree step gives every node the logits single-token decoding gives it along its
path, bit for bit (flash attention + Q8_0 KV cache, long contexts included); an embedding batch
equals the token batch; parked rows keep later steps exact, through truncation and through the
re-decode that drops them (a short context); greedy PPD equals plain decoding on every static tree, with
lookup chains, with prompt-token rows, over an answer that fills its context and rebuilds the cache several times,
in a context that grows mid-answer, and in a follow-up turn that reuses the cache.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from ppd_core.backend import StepRows
from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder

from ppd_core.backends.llamacpp.library import chat_model
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Answering, Speculator, generate
from ppd_core import Engine, EngineConfig
from ppd_core.loading import default_model_file
from ppd_core.drafters.lookup import MATCH_CLASSES, LookupDrafter
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeSpec, build_tree, family_from_spec, plain_family
from ppd_core.calibration.calibrate import profile_key

pytestmark = pytest.mark.slow

PROMPTS = [
    "Give me three tips for staying healthy.",
    "Write a Python function that merges two sorted lists, and explain it.",
    "Rewrite this sentence in a formal tone: the cat sat on the mat and would not move at all.",
    "What is the capital of France, and why is it famous?",
    "Write a short poem about autumn leaves.",
]
# a branching tree with a chain deeper than prompt tokens guess, and prompt tokens on several nodes
BRANCHING = TreeSpec({(): 1, (0,): 2, (1,): 0, (2,): 1, (0, 0): 0, (0, 1): 1, (1, 0): 0, (0, 0, 0): 0})


@pytest.fixture(scope="module")
def llama_engine(llama_default):
    return llama_default  # the session's (tests/conftest.py)


@pytest.fixture(scope="module")
def decoder(llama_engine):
    return llama_engine.loaded.backend


def context_ids(engine, length: int) -> list[int]:
    """A real chat prompt padded with the model's own text to ``length`` tokens."""
    ids = engine.chat_ids([{"role": "user", "content": "Tell me about the history of tea. " * 200}])
    return ids[:length]


@pytest.fixture(scope="module")
def reference():
    """A second context for single-token decodes, so the tested cache stays resident in its own."""
    decoder = LlamaCppDecoder(default_model_file(), threads=2)
    yield decoder
    decoder.close()


def one_by_one(decoder, cache, tokens) -> list[np.ndarray]:
    """Logits [vocab] after each of ``tokens`` fed one per decode after ``cache``, which is then cut back."""
    length = decoder.cache_length(cache)
    logits = [decoder.prefill(cache, [token]).rows(slice(0, 1))[0] for token in tokens]
    decoder.truncate(cache, length)
    return logits


def node_tokens_of(tree, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 40000, size=tree.num_nodes)  # [N] int64


@pytest.mark.parametrize("cached", [40, 1200])
def test_every_tree_node_equals_single_token_decoding_bitwise(llama_engine, decoder, reference, cached):
    context = context_ids(llama_engine, cached)
    plain_cache = reference.new_cache()
    reference.prefill(plain_cache, context)
    tree = build_tree(BRANCHING, 3, 1, max_depth=3)
    nodes = node_tokens_of(tree, cached)
    expected = [one_by_one(reference, plain_cache, [int(nodes[i]) for i in path])[-1] for path in tree.node_paths]
    prompt_rows = llama_engine.prompt_tokens.table()[tree.prompt_embedding_index]  # [T - N, hidden]
    plain_tree = build_tree(TreeSpec({p: 0 for p in BRANCHING.prompt_counts}), 3, 1, max_depth=3)
    cache = decoder.new_cache()
    decoder.prefill(cache, context)
    for rows in (None, prompt_rows):  # a token batch (no prompt rows), then an embedding batch after it was cut back
        step = StepRows.of(tree if rows is not None else plain_tree, nodes, rows)
        logits = decoder.tree_logits(cache, step).rows(slice(None))
        decoder.keep(cache, len(context), [0], step)
        decoder.truncate(cache, len(context))  # as a follow-up turn cuts a cache back
        for node in range(tree.num_nodes):
            assert np.array_equal(logits[node], expected[node]), f"node {node} at {cached} cached tokens"


def test_embedding_batch_equals_token_batch_bitwise(llama_engine, decoder):
    context = context_ids(llama_engine, 300)
    chain = np.array(llama_engine.chat_ids([{"role": "user", "content": "one two three four five"}])[:6])
    tree = build_tree(TreeSpec({(0,) * d: 0 for d in range(6)}), 0, 1, max_depth=5)
    results = []
    for embed in (False, True):
        cache = decoder.new_cache()
        decoder.prefill(cache, context)
        if embed:  # the same token rows, given as the file's own embedding rows, plus a prompt row the tree ignores
            rows = decoder.embedding_rows(chain[:1])
            with_prompt = build_tree(TreeSpec({**{(0,) * d: 0 for d in range(5)}, (0,) * 5: 1}), 1, 1, max_depth=5)
            results.append(decoder.tree_logits(cache, StepRows.of(with_prompt, chain, rows)).rows(slice(0, 6)))
        else:
            results.append(decoder.tree_logits(cache, StepRows.of(tree, chain)).rows(slice(None)))
    assert np.array_equal(results[0], results[1])


def test_parked_rows_keep_later_steps_exact_through_truncation_and_rebuild(reference):
    decoder = LlamaCppDecoder(default_model_file(), threads=2, max_context=256, spare_cells=64)
    context = list(range(1000, 1040))
    tree = build_tree(BRANCHING, 3, 1, max_depth=3)
    plain = build_tree(TreeSpec({p: 0 for p in BRANCHING.prompt_counts}), 3, 1, max_depth=3)
    cache = decoder.new_cache()
    decoder.prefill(cache, context)
    accepted = list(context)
    choices = random.Random(0)
    for step in range(100):  # rejected rows pile up in parked cells until a rebuild drops them
        rebuilds = decoder.rebuilds
        nodes = node_tokens_of(plain, step)
        path = plain.node_paths[choices.choice([0, 0, 1, 3, 5, 6, 7])]  # a random branch, often the root alone
        start = decoder.cache_length(cache)
        rows = StepRows.of(plain, nodes)
        decoder.tree_logits(cache, rows)
        decoder.keep(cache, start, path, rows)
        accepted += [int(nodes[i]) for i in path]
        assert decoder.cache_length(cache) == len(accepted) and cache.tokens == accepted
        if step == 7:  # a follow-up turn that cut the answer back
            decoder.truncate(cache, len(accepted) - 3)
            accepted = accepted[:-3]
        if step % 6 != 5 and decoder.rebuilds == rebuilds:
            continue
        fresh = reference.new_cache()  # the accepted tokens decoded in order, nothing parked
        reference.prefill(fresh, accepted)
        expected = one_by_one(reference, fresh, [7, 8, 9])
        got = one_by_one(decoder, cache, [7, 8, 9])
        assert all(np.array_equal(a, b) for a, b in zip(got, expected)), f"step {step}"
    assert decoder.rebuilds > 0  # the cells past the context filled with parked rows at least once
    decoder.close()


def greedy(engine, prompt, mode, max_new_tokens=64, **kwargs):
    return engine.generate(engine.chat_ids([{"role": "user", "content": prompt}]), mode, max_new_tokens, **kwargs)


def test_greedy_ppd_equals_plain_on_every_static_tree_with_lookup(llama_engine):
    """Three of the prompts (a list, code, a rewrite): every static tree with lookup chains, then chains alone."""
    n = llama_engine.prompt_tokens.num_prompt_tokens
    prompts = PROMPTS[:3]
    plain = [greedy(llama_engine, p, "plain").tokens for p in prompts]
    llama_engine.replan(lookup=4)  # lookup chains join the prompt tokens' guesses in the same steps
    try:
        for name, spec in STATIC_TREES.items():
            llama_engine.replan(tree=family_from_spec(name, spec, n))
            accepted = {"prompt tokens": 0, "lookup": 0}
            for prompt, expected in zip(prompts, plain):
                result = greedy(llama_engine, prompt, "ppd")
                assert result.tokens == expected, (name, prompt)
                for source in accepted:
                    accepted[source] += result.stats.accepted.get(source, 0)
            assert all(accepted.values()), (name, accepted)  # both sources were verified, and some guesses kept
        llama_engine.replan(tree=plain_family())  # lookup chains alone, on plain trees
        for prompt, expected in zip(prompts, plain):
            assert greedy(llama_engine, prompt, "ppd").tokens == expected
    finally:
        llama_engine.replan(lookup=None)


def test_an_answer_filling_its_context_with_rebuilds_equals_plain(llama_engine):
    # 448 of 512 positions answered, 16 spare cells: parked rows fill the few free cells again and again, and each
    # time the cache is re-decoded (5 times here; a 1024-token answer in 2048 positions rebuilt 3 times, at 2.5x the cost)
    decoder = LlamaCppDecoder(default_model_file(), threads=2, max_context=512, spare_cells=16)
    prompt = llama_engine.chat_ids([{"role": "user", "content": "List the numbers from 1 to 400, one per line."}])
    tokens = llama_engine.prompt_tokens
    small = family_from_spec("small", STATIC_TREES["small"], tokens.num_prompt_tokens, tokens.ensemble_size)
    answers = []
    for family, chains in ((plain_family(), ()), (small, (4,) * len(MATCH_CLASSES))):
        speculator = Speculator(decoder, family, llama_engine._prompt_table)
        request = check_answer(prompt, 448, decoder.max_context)  # the speculator knows no EOS: all 448 tokens
        answering = Answering(drafters=[LookupDrafter(FixedChains(chains), prompt)] if chains else [])
        answers.append([t for step in generate(speculator, request, answering) for t in step.tokens])
    assert len(answers[0]) == 448 and answers[1] == answers[0]
    assert decoder.rebuilds >= 3
    decoder.close()


def test_the_llama_cpp_cpu_path_says_it_is_bitwise(llama_engine):
    from app.system_info import device_panel

    assert llama_engine.loaded.backend.bitwise and "**Exactness:** bitwise" in device_panel(llama_engine.snapshot())


def test_follow_up_turn_reusing_the_cache_equals_plain(llama_engine):
    first = [{"role": "user", "content": "Write a short paragraph about rivers."}]
    results = {}
    for mode in ("plain", "ppd"):
        llama_engine.replan(lookup=4)
        turn1 = llama_engine.generate(llama_engine.chat_ids(first), mode, 96, reuse_cache=True)
        follow = first + [{"role": "assistant", "content": turn1.text},
                          {"role": "user", "content": "Now repeat that paragraph, word for word."}]
        turn2 = llama_engine.generate(llama_engine.chat_ids(follow), mode, 128, reuse_cache=True)
        assert turn2.stats.reused_tokens > 0
        results[mode] = (turn1.tokens, turn2.tokens, turn2.stats)
    llama_engine.replan(lookup=None)
    assert results["ppd"][:2] == results["plain"][:2]
    assert results["ppd"][2].steps < len(results["ppd"][1])  # the copy was guessed


def test_plain_decoding_equals_llama_cpp_chat_completion(llama_engine):
    """The backend's plain decoding is llama.cpp's own: llama-cpp-python's chat API on the same file, with the
    same KV cache type, flash attention and threads, answers every prompt with the same text."""
    from llama_cpp import GGML_TYPE_Q8_0

    llm = chat_model(default_model_file(), n_ctx=2048, n_threads=2, n_threads_batch=2, flash_attn=True,
                type_k=GGML_TYPE_Q8_0, type_v=GGML_TYPE_Q8_0, verbose=False)
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        theirs = llm.create_chat_completion(messages, max_tokens=64, temperature=0.0, top_k=1, repeat_penalty=1.0)
        ours = llama_engine.generate(llama_engine.chat_ids(messages), "plain", 64)
        assert ours.text.strip() == theirs["choices"][0]["message"]["content"].strip(), prompt


def test_stats_count_only_the_tokens_kept_when_the_limit_cuts_a_step(llama_engine):
    family = llama_engine.plan.family
    llama_engine.replan(tree=plain_family())
    llama_engine.replan(lookup=4)  # copying a count: steps accept up to 4 guessed tokens
    try:
        ids = llama_engine.chat_ids([{"role": "user", "content": "Write the numbers from 1 to 30 separated by commas."}])
        full = llama_engine.generate(ids, "ppd", 64).steps  # the same steps, uncut (greedy)
        cut_in_guesses = 0
        for limit in range(16, 32):
            result = llama_engine.generate(ids, "ppd", limit)
            for step in result.steps:
                assert len(step.sources) == step.from_guesses <= len(step.tokens), (limit, step)
            stats, last = result.stats, result.steps[-1]
            assert stats.from_guesses == sum(s.from_guesses for s in result.steps) <= stats.new_tokens - stats.steps
            if full[len(result.steps) - 1].from_guesses > len(last.tokens):  # the limit fell inside the step's guesses
                cut_in_guesses += 1
                assert last.sources == ["lookup"] * len(last.tokens) and last.stop == "length"
        assert cut_in_guesses
    finally:
        llama_engine.replan(lookup=None)
        llama_engine.replan(tree=family)


def test_the_profile_key_names_the_llama_cpp_build_and_offload(llama_engine):
    """A rebuilt llama.cpp (other CPU features, CUDA, Metal) or another offload calibrates anew."""
    key = profile_key(llama_engine.loaded, llama_engine.prompt_tokens)
    assert key["backend"] == "llamacpp" and key["build"] == llama_engine.loaded.kernels["system"]
    assert "CPU" in key["build"] and key["gpu_layers"] == llama_engine.loaded.backend.gpu_layers
    assert key["device"]["threads"] == llama_engine.threads  # on a CPU the curve depends on the threads


def test_a_fully_offloaded_model_keys_its_profile_without_the_cpu_threads(llama_engine, monkeypatch):
    """Every layer on the GPU (llama.cpp's -1): the CPU threads barely change the curve, so `ppd chat` (cores - 1)
    and `ppd bench` (all cores) share one profile; a partial offload keeps them in the key."""
    backend = llama_engine.loaded.backend
    info = backend.info
    for layers, keyed in ((-1, False), (12, True), (0, True)):  # what the wing's record would say of that offload
        offloaded = dataclasses.replace(info, kernels={**info.kernels, "gpu_layers": layers}, offloaded=layers)
        monkeypatch.setattr(backend, "info", offloaded)
        key = profile_key(llama_engine.loaded, llama_engine.prompt_tokens)
        assert ("threads" in key["device"]) == keyed and key["gpu_layers"] == layers


def test_a_context_that_grows_mid_answer_keeps_it_equal_to_plain(llama_engine):
    """The context starts small and is made anew, twice as large, as the answer outgrows it (the cache re-decoded
    in order each time): PPD with trees and chains still equals plain decoding in a context made large at once.
    500 tokens after a 45-token prompt outgrow the first two contexts (256 and 512 cells, llama.cpp's padding)."""
    prompt = llama_engine.chat_ids([{"role": "user", "content": "List the numbers from 1 to 300, one per line."}])
    tokens = llama_engine.prompt_tokens
    small = family_from_spec("small", STATIC_TREES["small"], tokens.num_prompt_tokens, tokens.ensemble_size)
    large = LlamaCppDecoder(default_model_file(), threads=2, max_context=1024, spare_cells=64, initial_context=1024)
    request = check_answer(prompt, 500, 1024)  # the speculator knows no EOS: all 500 tokens
    plain = [t for step in generate(Speculator(large, plain_family()), request) for t in step.tokens]
    large.close()
    growing = LlamaCppDecoder(default_model_file(), threads=2, max_context=1024, spare_cells=64, initial_context=64)
    first_cells = growing.cells
    speculator = Speculator(growing, small, llama_engine._prompt_table)
    chained = Answering(drafters=[LookupDrafter(FixedChains((4,) * len(MATCH_CLASSES)), prompt)])
    assert [t for step in generate(speculator, request, chained) for t in step.tokens] == plain
    assert growing.grows >= 2 and growing.cells > 2 * first_cells
    growing.close()
    assert len(plain) == 500


def test_a_gguf_files_recommended_sampling_becomes_the_default(llama_engine, tmp_path):
    """llama.cpp's general.sampling.* keys (written into a copy of the default model's file) are the model's
    recommended sampling, as a generation_config.json's are; the shipped file has none (greedy)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from ppd_core.sampling.params import gguf_sampling

    assert gguf_sampling({"general.sampling.temp": "0.7", "general.sampling.top_k": "20"}.get) == \
        {"do_sample": True, "temperature": 0.7, "top_k": 20}
    assert gguf_sampling({}.get) == {} and gguf_sampling({"general.sampling.temp": "warm"}.get) == {}
    reader = gguf.GGUFReader(default_model_file(), "r")
    copy = tmp_path / "sampling.gguf"
    writer = gguf.GGUFWriter(copy, arch=reader.get_field(gguf.Keys.General.ARCHITECTURE).contents(), endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {
        "general.sampling.temp": MetadataDetails(gguf.GGUFValueType.FLOAT32, 0.5),
        "general.sampling.top_p": MetadataDetails(gguf.GGUFValueType.FLOAT32, 0.75),
        "general.sampling.top_k": MetadataDetails(gguf.GGUFValueType.INT32, 30)}, [])
    engine = Engine.load(EngineConfig(model=str(copy), backend="llamacpp", tree="medium"))
    try:
        assert engine.snapshot().recommended_sampling == {"temperature": 0.5, "top_p": 0.75, "top_k": 30}
    finally:
        engine.loaded.backend.close()
    assert llama_engine.snapshot().recommended_sampling == {}  # the shipped file


def test_acceptance_through_llama_cpp_equals_one_cut_at_a_time(llama_engine, decoder, reference):
    """The acceptance calibration records on a GGUF: the shipped prompt tokens' guesses at every cut of a greedy
    answer, measured 8 cuts per llama.cpp step (a chain of the answer's tokens, each with its prompt-token rows),
    rank the model's own next tokens exactly as one step per cut does (a cache of the text up to the cut, then the
    cut's token and its prompt-token rows), the model's tokens read from the answer itself."""
    from ppd_core.calibration.acceptance import answer_ranks, decoder_answers, guess_ranks

    tokens = llama_engine.prompt_tokens
    n, V, table = tokens.num_prompt_tokens, tokens.ensemble_size, tokens.table()
    prompt = llama_engine.chat_ids([{"role": "user", "content": "Write a short poem about autumn leaves."}])
    [answer] = decoder_answers(decoder, 30, [])([prompt])
    ranks = answer_ranks(decoder, table, n, V, prompt, answer)
    assert decoder.info.max_tree_rows // (1 + n * V) == 8 and ranks.shape == (30 - n, n)  # 4 steps, the last of 6 cuts

    sequence = prompt + answer
    cache = reference.new_cache()
    after_last = int(reference.prefill(cache, sequence).argmax()[0])  # the model's token after the answer's last
    reference.truncate(cache, 0)
    model_tokens = sequence[len(prompt) + 1 :] + [after_last]  # greedy: each answer token is the model's own
    single = build_tree(TreeSpec({(): n}), n, V)
    guesses = []
    for cut in range(len(prompt), len(sequence) - n):
        reference.prefill(cache, sequence[:cut])
        rows = StepRows.of(single, np.array([sequence[cut]]), table[single.prompt_embedding_index])
        logits = reference.tree_logits(cache, rows)
        guesses.append(logits.top_of_mean(single.prompt_slots[0], 10))  # [n, 10]
        reference.truncate(cache, 0)
    truth = np.array([model_tokens[c + 1 : c + n + 1] for c in range(len(answer) - n)])  # [C, n]
    assert np.array_equal(ranks, guess_ranks(np.array(guesses), truth))
    assert (ranks[:, 0] >= 0).sum() >= 5 and (ranks == -1).any()  # the shipped tokens guess some, miss some
