"""``/v1/completions`` (prompt in, text out) through the real ``openai`` client on the real server: the answer is the
engine's for the prompt tokenized as llama-server tokenizes it, streamed or not, with stop strings, logprobs in the
legacy shape, a grammar, and bad requests one 400 naming the field."""

import httpx
import openai
import pytest

from test_api import error_of, served, streamed_text  # noqa: F401 - a fixture

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
    assert post(prompt=["a", "b"])["param"] == "prompt"
    assert post(prompt="")["param"] == "prompt"
    assert post(prompt="hi", echo=True)["param"] == "echo"
    assert post(prompt="hi", suffix="x")["param"] == "suffix"
    assert post(prompt="hi", logprobs=6)["param"] == "logprobs"
    assert post(prompt="hi", max_tokens=0)["param"] == "max_tokens"
    assert post(prompt="word " * (service.engine.max_context + 10))["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="hi", temperature=5)
    assert not service.queue.busy and app.state.ppd.running == 0
