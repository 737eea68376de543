"""Repetition penalties against llama.cpp's own sampler, on the real default GGUF: greedy ppd with each penalty,
plain and PPD (a tree with prompt-token rows and lookup chains), over two turns, equals llama.cpp's penalties +
greedy sampler chain (``llama_sampler_init_penalties``, every prompt token accepted first, as llama-server does)
token for token."""

from __future__ import annotations

import pytest

from ppd_core.backends.llamacpp.library import chat_model
from ppd_core.loading import default_model_file
from ppd_core.sampling.params import SamplingParams
from ppd_core.engine_calibration import next_token_logits

pytestmark = pytest.mark.slow

PENALTIES = {
    "repeat": SamplingParams(repeat_penalty=1.3),
    "presence+frequency": SamplingParams(presence_penalty=0.8, frequency_penalty=0.5),
    "repeat, short window": SamplingParams(repeat_penalty=1.5, repeat_last_n=6),
    "all, whole context": SamplingParams(repeat_penalty=1.1, repeat_last_n=-1, presence_penalty=0.3, frequency_penalty=0.2),
}
TURNS = ["Write a short poem about the sea, with a refrain.", "Now write it again, word for word."]
ANSWER = 64


@pytest.fixture(scope="module")
def oracle():
    from llama_cpp import GGML_TYPE_Q8_0

    llm = chat_model(default_model_file(), n_ctx=2048, n_threads=2, n_threads_batch=2, flash_attn=True,
                     type_k=GGML_TYPE_Q8_0, type_v=GGML_TYPE_Q8_0, verbose=False)
    yield llm
    llm.close()


def llama_cpp_answer(llm, prompt: list[int], params: SamplingParams, eos: frozenset[int]) -> list[int]:
    """llama.cpp's greedy answer under its penalties sampler: the prompt's tokens accepted into the chain first, each
    answer token sampled (and accepted) by ``llama_sampler_sample``."""
    import llama_cpp.llama_cpp as lc

    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    last_n = llm.n_ctx() if params.repeat_last_n < 0 else params.repeat_last_n  # llama-server's reading of -1
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(
        llm.n_vocab(), last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    try:
        for token in prompt:
            lc.llama_sampler_accept(chain, token)
        llm.reset()
        llm.eval(prompt)
        answer = []
        while len(answer) < ANSWER:
            answer.append(lc.llama_sampler_sample(chain, llm.ctx, -1))
            if answer[-1] in eos:
                break
            llm.eval([answer[-1]])
        return answer
    finally:
        lc.llama_sampler_free(chain)


@pytest.mark.parametrize("name", PENALTIES)
def test_greedy_with_penalties_equals_llama_cpps_sampler_chain(llama_default, oracle, name):
    engine, params = llama_default, PENALTIES[name]
    eos = engine.loaded.eos_token_ids
    engine.replan(lookup=4)  # lookup chains on top of the static tree's prompt-token rows
    try:
        answers = {}
        for mode in ("plain", "ppd"):
            engine.forget_conversation()
            messages, tokens = [], []
            for turn in TURNS:
                messages.append({"role": "user", "content": turn})
                ids = engine.chat_ids(messages)
                answer = engine.generate(ids, mode, ANSWER, reuse_cache=True, sampling=params)
                assert answer.tokens == llama_cpp_answer(oracle, ids, params, eos), (mode, len(messages))
                messages.append({"role": "assistant", "content": answer.text})
                tokens.append(answer.tokens)
            answers[mode] = tokens
        assert answers["ppd"] == answers["plain"]
        unpenalized = engine.generate(engine.chat_ids(messages[:1]), "plain", ANSWER)
        assert unpenalized.tokens != answers["plain"][0]  # the penalty changed the answer
    finally:
        engine.replan(lookup=None)
        engine.forget_conversation()


def test_logprobs_of_ppd_equal_plain_decodings_bitwise(llama_default):
    """Each token's log-probability and its 5 likeliest alternatives, read off the accepted path's rows of PPD's tree
    steps (prompt-token rows and lookup chains, a copy-heavy follow-up), equal plain decoding's bit for bit; the first
    equals the log-softmax of the prompt's next-token logits."""
    import numpy as np

    engine = llama_default
    engine.replan(lookup=4)
    try:
        ids = engine.chat_ids([{"role": "user", "content": "List the days of the week, then list them again."}])
        reported = {mode: engine.generate(ids, mode, 80, logprobs=5) for mode in ("plain", "ppd")}
    finally:
        engine.replan(lookup=None)
    flat = {mode: [item for step in result.steps for item in step.logprobs] for mode, result in reported.items()}
    assert flat["ppd"] == flat["plain"] and len(flat["ppd"]) == len(reported["ppd"].tokens)
    assert [item.token for item in flat["ppd"]] == reported["ppd"].tokens
    assert reported["ppd"].stats.from_guesses > 0  # tree rows gave some of them
    logits = next_token_logits(engine, ids).astype(np.float64)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    first = flat["ppd"][0]
    assert first.logprob == expected[first.token] and [t for t, _ in first.top] == list(np.argsort(-logits, kind="stable")[:5])
