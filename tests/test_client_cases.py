"""What a client hit on ppd's API and not on llama-server's, through the real ``openai`` client against the real
``ppd serve`` app on the default GGUF (a 1,024-token context, so a prompt fills it in seconds): a ``json_object``
answer cut by its token limit is still JSON, a ``max_tokens`` beyond the context is answered up to it, the last
logprobs entry is no end-of-turn token, a tool-call history sent without tools goes through the chat template as
is, and ``/v1/embeddings`` says ppd serves none."""

import json

import httpx
import openai
import pytest

from app.tools import prompt
from client_server import CONTEXT, TIMEOUT, client_server  # noqa: F401 - the fixture

QUESTION = [{"role": "user", "content": "Name the capital city of France."}]
PERSON = [{"role": "user", "content": "Describe a person as a JSON object with a name, an age and hobbies."}]


def client_of(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.slow
def test_a_json_object_answer_cut_by_its_token_limit_is_still_json(client_server):  # noqa: F811
    """llama-server's grammar keeps the answer inside one JSON object; cut by ``max_tokens`` the content was
    unterminated and ``json.loads`` failed. It is closed now (appending only), streamed or not; the finish reason
    still says "length"."""
    client = client_of(client_server)
    cut = 0
    for limit in (5, 7, 12, 20):  # at 3 tokens only the ```json fence came: no JSON yet, an empty content
        asked = dict(model="m", messages=PERSON, temperature=0, max_tokens=limit, response_format={"type": "json_object"})
        answer = client.chat.completions.create(**asked).choices[0]
        assert isinstance(json.loads(answer.message.content), dict), answer.message.content
        cut += answer.finish_reason == "length"
        chunks = list(client.chat.completions.create(stream=True, **asked))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == answer.message.content and chunks[-1].choices[0].finish_reason == answer.finish_reason
    assert cut >= 3  # the limits did cut answers inside their JSON


@pytest.mark.slow
def test_max_tokens_beyond_the_context_is_answered_up_to_it(client_server):  # noqa: F811
    """Apps that always send a large ``max_tokens`` get an answer that stops at the context (``finish_reason``
    "length"), as from llama-server, not a 400; a prompt that fills the context is still a 400 naming it."""
    client, engine = client_of(client_server), client_server.service.engine
    word = engine.tokenizer.encode(" blue", add_special_tokens=False)
    ids = word * (CONTEXT - 5)  # room for 5 answer tokens
    answer = client.completions.create(model="m", prompt=ids, max_tokens=100_000, temperature=0)
    assert answer.usage.prompt_tokens == CONTEXT - 5 and answer.usage.completion_tokens <= 5
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 5
    chat = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=10 * CONTEXT, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as full:
        client.completions.create(model="m", prompt=word * CONTEXT, max_tokens=4)
    assert full.value.body["param"] == "prompt" and full.value.body["code"] == "context_length_exceeded"


@pytest.mark.slow
def test_the_last_logprobs_entry_is_no_end_of_turn_token(client_server):  # noqa: F811
    """llama-server leaves the end-of-turn token out of an answer's logprobs (its text is no part of the answer):
    the entries spell the content exactly, streamed or not."""
    client = client_of(client_server)
    asked = dict(model="m", messages=QUESTION, temperature=0, max_tokens=60, logprobs=True, top_logprobs=2)
    answer = client.chat.completions.create(**asked)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"  # the answer ended with its end-of-turn token
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content and entries[-1].token != "<|im_end|>"
    assert len(entries) == answer.usage.completion_tokens - 1
    chunks = list(client.chat.completions.create(stream=True, **asked))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]


@pytest.mark.slow
def test_a_tool_call_history_without_tools_goes_through_the_template(client_server):  # noqa: F811
    """No tools offered: the history reaches the chat template as is, as llama-server gives it (SmolLM2's template
    shows the turns' text), not as the generic format's JSON, which the model then answered in."""
    client, engine = client_of(client_server), client_server.service.engine
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    answer = client.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=30)
    plain = [{"role": m["role"], "content": m["content"] or ""} for m in history]
    text = engine.tokenizer.apply_chat_template(plain, tokenize=False)
    assert "tool_call" not in text and "<|im_start|>tool\n18 degrees and sunny<|im_end|>" in text
    assert answer.usage.prompt_tokens == len(engine.chat_ids(plain))
    assert prompt(plain, None, native=False) == (plain, {})
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content


def test_embeddings_say_ppd_serves_none(client_server):  # noqa: F811
    """Not a bare 404 that reads like a wrong base URL: a 501 in OpenAI's shape saying so, which the client does
    not retry."""
    client = openai.OpenAI(base_url=client_server.base_url, api_key="unused", max_retries=2, timeout=TIMEOUT)
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model="m", input="hello")
    assert refused.value.status_code == 501 and "no embeddings" in refused.value.message
    response = httpx.post(f"{client_server.base_url}/embeddings", json={"input": "hello"}, timeout=TIMEOUT)
    assert response.headers["x-should-retry"] == "false"
    assert response.json()["error"]["code"] == "embeddings_not_supported"
