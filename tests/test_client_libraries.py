"""The client libraries people point at a local server, each the real library (pinned in the ``test`` extra) against
the real ``ppd serve`` app on the default GGUF: ``instructor`` (TOOLS, JSON_SCHEMA, JSON and MD_JSON modes, streamed
partials), ``langchain-openai`` (``with_structured_output`` by function calling and by JSON schema, ``bind_tools``),
``litellm`` (``completion(model="openai/...", api_base=...)`` with and without tools) and ``pydantic-ai`` (an Agent
with an ``output_type``, on its chat model and on its Responses model).

Where ppd constrains the answer (a forced or named tool call, a JSON schema) every client gets a valid object. Where
the library only asks in words (instructor's JSON and MD_JSON modes: a schema in the prompt, any JSON object or a
fenced block back), the 135M default model may answer another object, with llama-server as with ppd; there a
client must still get a valid object or the library's own validation error, within the timeout."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm reads its shipped model list, no network

import instructor  # noqa: E402
import litellm  # noqa: E402
import openai  # noqa: E402
import pydantic  # noqa: E402
import pytest  # noqa: E402
from instructor.core.exceptions import IncompleteOutputException, InstructorRetryException  # noqa: E402
from langchain_core.exceptions import OutputParserException  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

from client_server import TIMEOUT, client_server  # noqa: E402, F401 - the fixture

ASK = [{"role": "user", "content": "Paris is the capital of France. Give the city's name and its country."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class City(BaseModel):
    name: str
    country: str


def openai_client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_constrained_modes_give_a_valid_object(client_server, mode):  # noqa: F811
    """TOOLS names the function (ppd's grammar keeps the call valid); JSON_SCHEMA sends the schema as
    ``response_format``: a valid City every time, streamed partials too."""
    client = instructor.from_openai(openai_client(client_server), mode=mode)
    city = client.chat.completions.create(model="m", response_model=City, messages=ASK, temperature=0, max_tokens=80,
                                          max_retries=0)
    assert isinstance(city, City) and city.name
    partials = list(client.chat.completions.create_partial(model="m", response_model=City, messages=ASK,
                                                           temperature=0, max_tokens=80, max_retries=0))
    # the partial model's schema has every field optional: another grammar, so maybe another (valid) object
    assert partials and isinstance(partials[-1].name, str) and isinstance(partials[-1].country, str)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [instructor.Mode.JSON, instructor.Mode.MD_JSON])
def test_instructor_prompted_modes_give_an_object_or_its_validation_error(client_server, mode):  # noqa: F811
    """JSON (a ``json_object`` answer) and MD_JSON (a fenced block, no constraint) only ask for the schema in words:
    the tiny model may answer another object, or go on past ``max_tokens`` (finish_reason "length"); the client gets
    a City or instructor's own error for what happened, never a hang or a transport error."""
    client = instructor.from_openai(openai_client(client_server), mode=mode)
    try:
        city = client.chat.completions.create(model="m", response_model=City, messages=ASK, temperature=0,
                                              max_tokens=48, max_retries=0)
    except IncompleteOutputException as error:  # the answer ended at max_tokens, and instructor says so
        assert "max_tokens" in str(error)
    except (InstructorRetryException, pydantic.ValidationError) as error:
        assert "City" in str(error) or "validation" in str(error).lower()
    else:
        assert isinstance(city, City)


def chat_model(served, max_tokens: int = 80) -> ChatOpenAI:
    return ChatOpenAI(model="m", base_url=served.base_url, api_key="unused", temperature=0, max_tokens=max_tokens,
                      max_retries=0, timeout=TIMEOUT)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_structured_output_both_ways(client_server, method):  # noqa: F811
    structured = chat_model(client_server).with_structured_output(City, method=method)
    city = structured.invoke(ASK[0]["content"])
    assert isinstance(city, City) and city.name
    raw = chat_model(client_server).with_structured_output(City, method=method, include_raw=True).invoke(ASK[0]["content"])
    assert raw["parsing_error"] is None and raw["parsed"] == city


@pytest.mark.slow
def test_langchain_bind_tools_gives_tool_calls(client_server):  # noqa: F811
    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    message = chat_model(client_server).bind_tools([get_weather], tool_choice="any").invoke(
        "What is the weather in Paris?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    assert isinstance(message.tool_calls[0]["args"].get("city"), str)
    free = chat_model(client_server).bind_tools([get_weather]).invoke("Say hello.")  # auto: text or a valid call
    assert free.content or all(call["name"] == "get_weather" for call in free.tool_calls)


@pytest.mark.slow
def test_langchain_json_mode_gives_an_object_or_a_clear_error(client_server):  # noqa: F811
    """json_mode asks for any JSON object (the schema only in words): the tiny model may answer another object, on
    llama-server too; the client gets a City or langchain's parser error (or openai's, for an answer cut short)."""
    structured = chat_model(client_server, max_tokens=48).with_structured_output(City, method="json_mode")
    try:
        city = structured.invoke(ASK[0]["content"] + " Answer in JSON with the keys name and country.")
    except (OutputParserException, openai.LengthFinishReasonError) as error:
        assert "City" in str(error) or "length" in str(error)
    else:
        assert isinstance(city, City)


@pytest.mark.slow
def test_litellm_completion_with_and_without_tools(client_server):  # noqa: F811
    asked = dict(model="openai/m", api_base=client_server.base_url, api_key="unused", temperature=0,
                 timeout=TIMEOUT, num_retries=0)
    plain = litellm.completion(messages=ASK, max_tokens=24, **asked)
    reference = openai_client(client_server).chat.completions.create(model="m", messages=ASK, max_tokens=24,
                                                                      temperature=0)
    assert plain.choices[0].message.content == reference.choices[0].message.content
    called = litellm.completion(messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                tools=[WEATHER], tool_choice="required", max_tokens=60, **asked)
    calls = called.choices[0].message.tool_calls
    assert called.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]


@pytest.mark.slow
@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
def test_pydantic_ai_agent_with_an_output_type(client_server, model_class):  # noqa: F811
    """pydantic-ai's tool output (a forced ``final_result`` call), on its chat model and on its Responses model
    (``/v1/responses``: on ppd before, a misleading "model not found")."""
    provider = OpenAIProvider(base_url=client_server.base_url, api_key="unused")
    agent = Agent(model_class("m", provider=provider), output_type=City,
                  model_settings={"temperature": 0, "max_tokens": 80, "timeout": TIMEOUT})
    result = agent.run_sync(ASK[0]["content"])
    assert isinstance(result.output, City) and result.output.name
