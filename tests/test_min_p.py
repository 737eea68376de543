"""min-p against llama.cpp's own sampler chain: the distribution ppd samples from (``adjusted_probs`` after the
penalties, every row of a tree with its own path) equals what llama.cpp's chain leaves, in llama-server's order
(penalties, top-k, top-p, min-p, temperature, then ``dist``), on the same float32 logits, the row's whole sequence
accepted into the chain first. And min-p through the doors: the API's field and its 400, the command line's option
and its error, the page's widget, ``describe``, a GGUF's recommendation, the llama-server peer's request."""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np
import pytest

from ppd_core.errors import PpdError
from ppd_core.sampling.params import SamplingParams, default_sampling, gguf_sampling, recommended
from ppd_core.sampling.penalties import penalize, window
from ppd_core.sampling.verify import adjusted_probs
from test_penalties import path_tokens, random_tree

VOCAB = 48


def llama_cpp_probs(logits: np.ndarray, params: SamplingParams, sequence: list[int]) -> np.ndarray:
    """[vocab] float64: the probabilities llama.cpp's chain gives each token of one row (0 where it cut it), the
    sequence so far accepted into the chain (the penalties' window) first, as llama-server does."""
    import llama_cpp.llama_cpp as lc

    vocab = len(logits)
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    samplers = [lc.llama_sampler_init_penalties(vocab, params.repeat_last_n, params.repeat_penalty,
                                                params.frequency_penalty, params.presence_penalty),
                lc.llama_sampler_init_top_k(params.top_k), lc.llama_sampler_init_top_p(params.top_p, 0),
                lc.llama_sampler_init_min_p(params.min_p, 0), lc.llama_sampler_init_temp(params.temperature),
                lc.llama_sampler_init_dist(1)]
    for sampler in samplers:
        lc.llama_sampler_chain_add(chain, sampler)
    try:
        for token in sequence:
            lc.llama_sampler_accept(chain, token)
        data = (lc.llama_token_data * vocab)(*(lc.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)))
        candidates = lc.llama_token_data_array(data=data, size=vocab, selected=-1, sorted=False)
        lc.llama_sampler_apply(chain, ctypes.byref(candidates))
        probs = np.zeros(vocab)
        for index in range(candidates.size):
            probs[data[index].id] = data[index].p
        return probs
    finally:
        lc.llama_sampler_free(chain)


# top-p with a temperature other than 1 is left out: ppd cuts the nucleus after the temperature, llama.cpp before it
SETTINGS = {
    "min-p": SamplingParams(temperature=1.0, min_p=0.1),
    "min-p, hot": SamplingParams(temperature=1.7, min_p=0.05),
    "min-p, cold, top-k": SamplingParams(temperature=0.4, top_k=20, min_p=0.02),
    "min-p after top-p": SamplingParams(temperature=1.0, top_p=0.8, min_p=0.3),
    "min-p after the penalties": SamplingParams(temperature=0.8, min_p=0.15, repeat_penalty=1.5, repeat_last_n=8,
                                                presence_penalty=0.5, frequency_penalty=0.4),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", SETTINGS)
def test_every_tree_rows_distribution_equals_llama_cpps_chain(name, seed):
    """A random tree's rows, penalised with their own paths as a step does (``penalize``), then ``adjusted_probs``:
    each row's distribution equals llama.cpp's chain on the row's logits with the row's sequence accepted; min-p cuts
    tokens (the test would see a misplaced cut), the support is the same token for token."""
    params = SETTINGS[name]
    rng = np.random.default_rng(seed)
    parents, tokens = random_tree(rng, 12)
    history = rng.integers(0, VOCAB, size=10).tolist()  # the tokens so far, the root's token last
    tokens[0] = history[-1]
    rows = (rng.standard_normal((len(parents), VOCAB)) * 2.5).astype(np.float32)  # [N, vocab]
    rows[:, history[:3]] += np.float32(3.0)  # likely tokens the penalties hold back
    own = rows.copy()
    if params.penalized:
        penalize(own, window(history, params), parents, tokens, params)
    ours = adjusted_probs(own, params)  # [N, vocab]
    cut = 0
    for node in range(len(parents)):
        theirs = llama_cpp_probs(rows[node], params, history + path_tokens(parents, tokens, node))
        assert np.array_equal(ours[node] > 0, theirs > 0), (name, node)
        np.testing.assert_allclose(ours[node], theirs, rtol=2e-5, atol=1e-7)
        cut += int((adjusted_probs(own[node], replace(params, min_p=0.0)) > 0).sum() - (theirs > 0).sum())
    assert cut > 0  # min-p took tokens away


def test_min_p_keeps_the_top_token_and_is_off_at_zero():
    logits = np.array([3.0, 2.0, 0.0, -5.0], dtype=np.float32)
    kept = adjusted_probs(logits, SamplingParams(temperature=1.0, min_p=float(np.exp(-3.0)) * 0.999))  # 0 - 3 > log(min_p)
    assert (kept > 0).tolist() == [True, True, True, False]
    assert (adjusted_probs(logits, SamplingParams(temperature=1.0, min_p=1.0)) > 0).tolist() == [True, False, False, False]
    off = adjusted_probs(logits, SamplingParams(temperature=1.0))
    assert (off > 0).all() and np.array_equal(off, adjusted_probs(logits, SamplingParams(temperature=1.0, min_p=0.0)))


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_min_p_out_of_range_is_refused(value):
    with pytest.raises(PpdError, match=f"min-p must be between 0 \\(off\\) and 1, got {value}"):
        SamplingParams(min_p=value)


def test_min_p_defaults_describe_and_a_models_recommendation():
    """Unset, a request gets llama-server's 0.05 (as the other fields llama-server's defaults); a GGUF's
    ``general.sampling.min_p`` is the model's recommendation where it samples; ``describe`` reports it."""
    chosen = default_sampling({})
    assert chosen.values["min_p"] == 0.05 and chosen.sources["min_p"] == "llama-server's default"
    assert chosen.describe()["min_p"] == {"value": 0.05, "from": "llama-server's default"}
    advice = gguf_sampling({"general.sampling.temp": "0.6", "general.sampling.min_p": "0.1"}.get)
    assert advice == {"do_sample": True, "temperature": 0.6, "min_p": 0.1}
    assert recommended(advice) == {"temperature": 0.6, "min_p": 0.1}
    assert default_sampling(recommended(advice)).sources["min_p"] == "the model"
    assert SamplingParams().min_p == 0.0 and SamplingParams(min_p=0.2).describe()["min_p"] == 0.2


def test_min_p_on_the_command_line_the_api_the_page_and_the_peer():
    import argparse

    import gradio as gr

    from app.api.jobs import sampling_of
    from app.api.errors import ApiError
    from app.api.schemas import ChatCompletionRequest
    from app.chat_settings import ChatSettings
    from app.commands.options import add_sampling_options
    from app.commands.options import sampling_of as options_sampling
    from app.page_layout import settings_panel
    from app.server_peer import server_request

    parser = argparse.ArgumentParser()
    add_sampling_options(parser)
    assert options_sampling(parser.parse_args(["--temperature", "0.7", "--min-p", "0.2"])).min_p == 0.2
    assert options_sampling(parser.parse_args([])).min_p == 0.0
    question = [{"role": "user", "content": "Hi"}]
    request = ChatCompletionRequest(messages=question, min_p=0.25)
    assert sampling_of(request, default_sampling({})).min_p == 0.25
    assert sampling_of(ChatCompletionRequest(messages=question), default_sampling({})).min_p == 0.05
    with pytest.raises(ApiError) as refused:
        sampling_of(ChatCompletionRequest(messages=question, min_p=1.5), default_sampling({}))
    assert refused.value.param == "min_p" and str(refused.value) == "min_p must be between 0 (off) and 1, got 1.5"
    with gr.Blocks():
        panel = settings_panel()
    widget = panel.by_name["min_p"]
    assert widget.elem_id == "min-p" and widget.value == 0.05 and "llama-server's default" in widget.label
    values = [0.7 if name == "temperature" else 0.3 if name == "min_p" else None for name in panel.by_name]
    assert ChatSettings.of("", 32, True, "lossless", False, "", *values).sampling().min_p == 0.3
    assert server_request(question, 8, SamplingParams(min_p=0.1))["min_p"] == 0.1
