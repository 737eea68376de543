"""``/v1/completions`` (prompt in, text out) through the real ``openai`` client on the real server: the answer is the
engine's for the prompt tokenized as llama-server tokenizes it, streamed or not, with stop strings, logprobs in the
legacy shape, a grammar, and bad requests one 400 naming the field."""

import httpx
import openai
import pytest

from app.api.errors import ApiError
from app.api.prompts import completion_prompt, fim_tokens
from test_api import error_of, served, streamed_text  # noqa: F401 - a fixture
from test_gguf_text import load
from tiny_gguf import default_vocabulary, write_tiny_gguf

PROMPT = "The three primary colours are"


def expected(service, prompt: str, tokens: int, **options):
    engine = service.engine
    sampling = service.snapshot().sampling_defaults.params(temperature=0.0)
    with service.turn():
        return engine.generate(engine.tokenizer.encode(prompt), "ppd", tokens, sampling=sampling, **options)


@pytest.mark.slow
def test_completions_equal_the_engines_answer_streamed_or_not(served):  # noqa: F811
    client, service, app, url = served
    answer = client.completions.create(model="m", prompt=PROMPT, temperature=0)  # OpenAI's default: 16 tokens
    result = expected(service, PROMPT, 16)
    assert answer.object == "text_completion" and answer.choices[0].text == result.text
    assert answer.usage.completion_tokens == len(result.tokens) == 16 and answer.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=24, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected(service, PROMPT, 24).text
    assert chunks[-1].choices[0].finish_reason == "length"
    with_logprobs = client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=6, logprobs=2)
    legacy = with_logprobs.choices[0].logprobs
    assert len(legacy.tokens) == len(legacy.token_logprobs) == len(legacy.top_logprobs) == 6
    assert all(len(top) <= 2 and all(v <= 0 for v in top.values()) for top in legacy.top_logprobs)
    assert "".join(legacy.tokens) == with_logprobs.choices[0].text and legacy.text_offset[0] == 0
    words = client.completions.create(model="m", prompt="Answer yes or no: is fire hot?", temperature=0, max_tokens=4,
                                      extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert words.choices[0].text in ("yes", "no")


def test_bad_completion_requests_are_one_400(served):  # noqa: F811
    client, service, app, url = served

    def post(**fields) -> dict:
        return error_of(httpx.post(f"{url}/v1/completions", json={"max_tokens": 4, **fields}, timeout=30))

    assert post()["param"] == "prompt"
    several = post(prompt=["a", "b"])
    assert several["param"] == "prompt" and "one prompt per request" in several["message"]
    assert post(prompt="")["param"] == "prompt"
    assert post(prompt=[])["param"] == "prompt" and post(prompt=[[1], "a", [2.5]])["param"] == "prompt"
    vocabulary = post(prompt=[1, 99_999_999])
    assert vocabulary["param"] == "prompt" and "99999999" in vocabulary["message"]
    assert post(prompt="hi", suffix=5)["param"] == "suffix"
    assert post(prompt="hi", logprobs=6)["param"] == "logprobs"
    assert post(prompt="hi", max_tokens=0)["param"] == "max_tokens"
    assert post(prompt="word " * (service.engine.max_context + 10))["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="hi", temperature=5)
    assert not service.queue.busy and app.state.ppd.running == 0


@pytest.mark.slow
def test_prompts_as_token_ids_lists_and_echo_as_llama_server_takes_them(served):  # noqa: F811
    """A prompt as token ids, as a list holding one string or one id list, or llama-server's mixed list, is the same
    prompt; ``echo`` puts it before the answer (streamed too), logprobs' offsets after it."""
    client, service, app, url = served
    ids = service.engine.tokenizer.encode(PROMPT)
    result = expected(service, PROMPT, 8)
    for prompt in (ids, [PROMPT], [ids], [PROMPT[:9], *service.engine.tokenizer.encode(PROMPT[9:], add_special_tokens=False)]):
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                            timeout=60).json()
        assert answer["choices"][0]["text"] == result.text and answer["usage"]["prompt_tokens"] == len(ids), prompt
    echoed = client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=8, echo=True, logprobs=1)
    assert echoed.choices[0].text == PROMPT + result.text
    assert echoed.choices[0].logprobs.text_offset[0] == len(PROMPT)
    chunks = list(client.completions.create(model="m", prompt=ids, temperature=0, max_tokens=8, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == service.engine.tokenizer.decode(ids) + result.text


@pytest.mark.slow
def test_suffix_fills_in_the_middle_with_the_models_fim_tokens(served):  # noqa: F811
    """``suffix``: llama-server's infill layout with the model's FIM tokens; the answer is the engine's for it."""
    client, service, app, url = served
    tokenizer = service.engine.tokenizer
    pre, suf, mid = fim_tokens(tokenizer)
    assert [tokenizer.token_text(t) for t in (pre, suf, mid)] == ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    ids = [pre, *tokenizer.encode(prefix, add_special_tokens=False), suf,
           *tokenizer.encode(suffix, add_special_tokens=False), mid]
    assert completion_prompt(tokenizer, prefix, suffix, False).ids == ids  # SmolLM2 adds no BOS
    engine = service.engine
    with service.turn():
        plain = engine.generate(ids, "ppd", 8, sampling=service.snapshot().sampling_defaults.params(temperature=0.0))
    answer = client.completions.create(model="m", prompt=prefix, suffix=suffix, temperature=0, max_tokens=8)
    assert answer.choices[0].text == plain.text and answer.usage.prompt_tokens == len(ids)


def test_a_model_without_fim_tokens_refuses_suffix_naming_it(tmp_path):
    """A GGUF whose vocabulary has no FIM tokens (the default's with them renamed): ``suffix`` is a 400 naming it."""
    import dataclasses

    import llama_cpp

    from ppd_core.backends.llamacpp.text import GgufTokenizer
    from ppd_core.loading import default_model_file

    vocabulary = default_vocabulary(default_model_file())
    renamed = [t.replace("<fim_", "<nofim_") for t in vocabulary.tokens]
    assert renamed != vocabulary.tokens
    path = write_tiny_gguf(tmp_path / "no-fim.gguf", "llama", dataclasses.replace(vocabulary, tokens=renamed))
    model = load(path, vocab_only=True)
    try:
        tokenizer = GgufTokenizer(model, llama_cpp)
        assert fim_tokens(tokenizer) is None
        with pytest.raises(ApiError) as refused:
            completion_prompt(tokenizer, "def f(", ")", False)
        assert refused.value.param == "suffix" and "fill-in-the-middle" in refused.value.message
        assert completion_prompt(tokenizer, "def f(", None, True).echo == "def f("  # no suffix: a plain prompt
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.slow
def test_llama_servers_infill_answers_in_its_own_shape(served):  # noqa: F811
    """``/infill`` (what llama.vim and llama.vscode call): ``input_prefix`` and ``input_suffix`` in llama-server's
    infill layout (with the repository header its FIM_REP/FIM_SEP tokens ask for where the context has room), the
    answer in llama-server's ``/completion`` shape, whole or streamed (no ``[DONE]``)."""
    import json

    from app.api.infill import InfillRequest, infill_ids

    client, service, app, url = served
    tokenizer, context = service.engine.tokenizer, service.engine.max_context
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 6,
            "temperature": 0, "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]}
    ids = infill_ids(tokenizer, InfillRequest(**body), context)
    rep, sep = (tokenizer.llama.llama_vocab_fim_rep(tokenizer.vocab), tokenizer.llama.llama_vocab_fim_sep(tokenizer.vocab))
    assert ids[0] == rep and ids.count(sep) == 2 and ids[-1] == fim_tokens(tokenizer)[2]  # SmolLM2 has both
    engine = service.engine
    with service.turn():
        plain = engine.generate(ids, "ppd", 6, sampling=service.snapshot().sampling_defaults.params(temperature=0.0))
    answer = httpx.post(f"{url}/infill", json=body, timeout=60).json()
    assert answer["content"] == plain.text and answer["stop"] is True and answer["tokens_evaluated"] == len(ids)
    assert answer["tokens_predicted"] == len(plain.tokens)
    with httpx.stream("POST", f"{url}/infill", json={**body, "stream": True}, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == plain.text and events[-1]["stop"] and not events[0]["stop"]
    refused = httpx.post(f"{url}/infill", json={"input_prefix": "x", "input_extra": [5]}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input_extra[0]"
