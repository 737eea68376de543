"""``/v1/responses`` (OpenAI's Responses API) through the real ``openai`` client's ``client.responses`` against the real
``ppd serve`` app: input as a string or messages, instructions, ``max_output_tokens``, streamed events,
``text.format`` with a schema (``responses.parse``), function calls and their outputs; bad fields one 400."""

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from client_server import TIMEOUT, client_server  # noqa: F401 - the fixture

QUESTION = "Name the capital city of France."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


class City(BaseModel):
    name: str
    country: str


def client_of(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.slow
def test_a_response_is_the_chat_answer_whole_or_streamed(client_server):  # noqa: F811
    client = client_of(client_server)
    chat = client.chat.completions.create(model="m", temperature=0, max_tokens=24,
                                          messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": QUESTION}])
    response = client.responses.create(model="m", input=QUESTION, instructions="Be brief.", temperature=0,
                                       max_output_tokens=24)
    assert response.output_text == chat.choices[0].message.content and "Paris" in response.output_text
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    as_messages = client.responses.create(model="m", temperature=0, max_output_tokens=24, input=[
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert as_messages.output_text == response.output_text
    events = list(client.responses.create(model="m", input=QUESTION, instructions="Be brief.", temperature=0,
                                          max_output_tokens=24, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{response.status}"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == response.output_text == events[-1].response.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))
    short = client.responses.create(model="m", input=QUESTION, temperature=0, max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 2


@pytest.mark.slow
def test_text_format_with_a_schema_parses(client_server):  # noqa: F811
    client = client_of(client_server)
    parsed = client.responses.parse(model="m", input="Paris is a city in France. Give its name and country.",
                                    text_format=City, temperature=0, max_output_tokens=60)
    assert isinstance(parsed.output_parsed, City)
    plain = client.responses.create(model="m", input="A JSON object about Paris.", temperature=0,
                                    max_output_tokens=8, text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(plain.output_text), dict)  # cut at 8 tokens: closed all the same


@pytest.mark.slow
def test_function_calls_and_their_outputs_round_trip(client_server):  # noqa: F811
    client = client_of(client_server)
    asked = dict(model="m", input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                 temperature=0, max_output_tokens=60)
    response = client.responses.create(**asked)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    events = list(client.responses.create(stream=True, **asked))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(calls[0].name, calls[0].arguments)]
    named = client.responses.create(**{**asked, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert [item.name for item in named.output if item.type == "function_call"] == ["get_weather"]
    follow = client.responses.create(model="m", tools=[WEATHER], temperature=0, max_output_tokens=30, input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees and sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.output


def test_bad_responses_fields_are_one_400_naming_them(client_server):  # noqa: F811
    def error(**fields) -> dict:
        response = httpx.post(f"{client_server.base_url}/responses", json={"max_output_tokens": 4, **fields},
                              timeout=TIMEOUT)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    assert error()["param"] == "input"
    assert error(input=[{"type": "image", "url": "x"}])["param"] == "input[0].type"
    assert error(input=[{"role": "robot", "content": "hi"}])["param"] == "input[0].role"
    assert error(input="hi", previous_response_id="resp_1")["param"] == "previous_response_id"
    assert error(input="hi", max_output_tokens=0)["param"] == "max_output_tokens"
    assert error(input="hi", tools=[{"type": "web_search"}])["param"] == "tools[0].type"
    assert error(input="hi", text={"format": {"type": "json_schema"}})["param"] == "text.format.schema"
    assert error(input="hi", temperature=5)["param"] == "temperature"
