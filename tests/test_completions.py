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


FIM_NAMES = {"<jupyter_text>": "<fim_prefix>", "<jupyter_code>": "<fim_suffix>", "<jupyter_output>": "<fim_middle>"}


@pytest.fixture
def vocab_only(tmp_path):
    """A tokenizer (llama.cpp, vocabulary only) of a tiny GGUF with the default model's vocabulary, its tokens renamed
    by ``names``; freed after the test."""
    import dataclasses

    import llama_cpp

    from ppd_core.backends.llamacpp.text import GgufTokenizer
    from ppd_core.loading import default_model_file

    models = []

    def tokenizer(names: dict[str, str]):
        vocabulary = default_vocabulary(default_model_file())
        tokens = [names.get(t, t) for t in vocabulary.tokens]
        path = write_tiny_gguf(tmp_path / f"vocab-{len(models)}.gguf", "llama", dataclasses.replace(vocabulary, tokens=tokens))
        models.append(load(path, vocab_only=True))
        return GgufTokenizer(models[-1], llama_cpp)

    yield tokenizer
    for model in models:
        llama_cpp.llama_model_free(model)


def test_suffix_fills_in_the_middle_with_the_models_fim_tokens(vocab_only):
    """``suffix`` (and ``/infill``): llama-server's infill layout with the FIM tokens llama.cpp finds in the
    vocabulary (a vocabulary with SmolLM2's special tokens renamed to them): BOS where it adds one, ``<fim_prefix>``
    prefix ``<fim_suffix>`` suffix ``<fim_middle>``; ``/infill`` puts the typed ``prompt`` after the prefix and other
    files' chunks before (behind a snippet line, or llama.cpp's FIM_REP/FIM_SEP tokens where it finds them), as
    llama-server does."""
    from app.api.infill import InfillRequest, infill_ids

    tokenizer = vocab_only(FIM_NAMES)
    pre, suf, mid = fim_tokens(tokenizer)
    assert [tokenizer.token_text(t) for t in (pre, suf, mid)] == ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    ids = [pre, *encode(prefix), suf, *encode(suffix), mid]
    assert completion_prompt(tokenizer, prefix, suffix, False).ids == ids  # SmolLM2's vocabulary adds no BOS
    # a context of one batch leaves no room for the repository header (llama-server's rule)
    assert infill_ids(tokenizer, InfillRequest(input_prefix=prefix, input_suffix=suffix), 2048) == ids
    llama, vocab = tokenizer.llama, tokenizer.vocab
    rep, sep = llama.llama_vocab_fim_rep(vocab), llama.llama_vocab_fim_sep(vocab)
    request = InfillRequest(input_prefix=prefix, input_suffix=suffix, prompt="a",
                            input_extra=[{"filename": "util.py", "text": "x = 1\n"}])
    header = [rep, *encode("myproject\n")] if rep >= 0 else []  # llama-server's repository header, where it has one
    chunk = [sep, *encode("util.py\n")] if sep >= 0 else encode("\n\n--- snippet ---\n\n")
    assert infill_ids(tokenizer, request, 4096) == [*header, *chunk, *encode("x = 1\n"),
                                                    *([sep, *encode("filename\n")] if sep >= 0 else []), pre,
                                                    *encode(prefix), *encode("a"), suf, *encode(suffix), mid]
    assert infill_ids(tokenizer, request, 2048) == [pre, *encode(prefix), *encode("a"), suf, *encode(suffix), mid]


@pytest.mark.slow
def test_the_default_model_has_no_fim_tokens_so_suffix_and_infill_are_a_400(served):  # noqa: F811
    """SmolLM2's vocabulary has no FIM tokens (llama.cpp finds none): ``suffix`` is a 400 naming it, ``/infill`` one
    naming ``input_suffix``, before the model is asked."""
    client, service, app, url = served
    assert fim_tokens(service.engine.tokenizer) is None
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="m", prompt="def add(a, b):", suffix="\n", max_tokens=4)
    assert refused.value.body["param"] == "suffix" and "fill-in-the-middle" in refused.value.message
    infill = httpx.post(f"{url}/infill", json={"input_prefix": "def f(", "input_suffix": ")"}, timeout=60)
    assert infill.status_code == 400 and infill.json()["error"]["param"] == "input_suffix"
    bad = httpx.post(f"{url}/infill", json={"input_prefix": "x", "input_extra": "no"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input_extra"
    assert not service.queue.busy and app.state.ppd.running == 0


def test_a_model_without_fim_tokens_refuses_suffix_naming_it(vocab_only):
    """The default vocabulary as it is: no FIM tokens, ``suffix`` a 400 naming it; no suffix, a plain prompt."""
    tokenizer = vocab_only({})
    assert fim_tokens(tokenizer) is None
    with pytest.raises(ApiError) as refused:
        completion_prompt(tokenizer, "def f(", ")", False)
    assert refused.value.param == "suffix" and "fill-in-the-middle" in refused.value.message
    assert completion_prompt(tokenizer, "def f(", None, True).echo == "def f("
