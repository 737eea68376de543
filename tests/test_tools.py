"""OpenAI tool calling on ``/v1/chat/completions`` (``app/tools.py``), through the real ``openai`` client on the real
server and the embedded default model: forced calls (tool_choice "required" or a named function) always parse and
their arguments validate against the tool's schema, streamed or not; a call, its result and a final answer round
trip; bad tool fields are one 400 naming the field; and the parser reads Hermes, Llama 3, Mistral and the generic
JSON format from literal text."""

import copy
import json

import httpx
import jsonschema
import pytest

from app.tools import ToolPlan, call_grammar, parse, plan_tools, prompt
from ppd_core.text import chat_ids
from test_api import error_of, served  # noqa: F401 - a fixture

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                   "required": ["timezone"]}}}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
HERMES_TEMPLATE = (  # a Qwen 2.5-like template that renders tools itself
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{%- endfor %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def checked_call(call) -> dict:
    """A tool call of the answer (an openai object): named after an offered tool, its arguments valid JSON that
    validates against that tool's parameters."""
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return {"name": call.function.name, "arguments": arguments}


def streamed_calls(stream) -> tuple[list[dict], str, str | None]:
    """The calls of a streamed answer (its ``delta.tool_calls`` joined by index), its content and finish_reason."""
    calls: dict[int, dict] = {}
    content, reason = "", None
    for piece in stream:
        if not piece.choices:
            continue
        delta = piece.choices[0].delta
        content += delta.content or ""
        reason = piece.choices[0].finish_reason or reason
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
    for call in calls.values():
        assert call["id"].startswith("call_")
        call["arguments"] = json.loads(call["arguments"])
        jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
    return [{"name": c["name"], "arguments": c["arguments"]} for c in calls.values()], content, reason


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_calls_parse_and_validate_streamed_or_not(served, choice):  # noqa: F811
    client, service, app, url = served
    answer = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                            max_tokens=120)
    picked = answer.choices[0]
    assert picked.finish_reason == "tool_calls" and picked.message.content is None
    assert len(picked.message.tool_calls) == 1
    call = checked_call(picked.message.tool_calls[0])
    if isinstance(choice, dict):
        assert call["name"] == "get_time"
    calls, content, reason = streamed_calls(client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=120, stream=True))
    assert calls == [call] and content == "" and reason == "tool_calls"  # greedy: the same call


def test_a_call_its_result_and_a_final_answer_round_trip(served):  # noqa: F811
    client, service, app, url = served
    first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0, max_tokens=120).choices[0].message
    call = first.tool_calls[0]
    checked_call(call)
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    assert history[1]["role"] == "assistant" and "content" not in history[1]  # content null: left out
    final = client.chat.completions.create(model="m", messages=history, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=40)
    assert isinstance(final.choices[0].message.content, str) and final.choices[0].message.content.strip()
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason in ("stop", "length")
    again = client.chat.completions.create(model="m", messages=history, tools=[WEATHER], tool_choice="auto",
                                           temperature=0, max_tokens=60).choices[0]
    if again.message.tool_calls:  # the free answer may call again: then a valid call
        assert again.finish_reason == "tool_calls" and all(checked_call(c) for c in again.message.tool_calls)
    else:
        assert isinstance(again.message.content, str) and again.finish_reason in ("stop", "length")
    # SmolLM2's template knows no tools. Offered tools, the call and its result reach the prompt as the generic
    # format's JSON text; with none offered ("none"), the history goes to the template as is, as llama-server gives it
    engine = service.engine
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": json.loads(call.function.arguments)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees"}]
    shown, variables = prompt(history, plan_tools([WEATHER], "auto", engine.chat_template), native=False)
    text = engine.tokenizer.apply_chat_template(shown, tokenize=False, **variables)
    assert '{"tool_call": {"name": "get_weather"' in text and '"tool_response": {"name": "get_weather"' in text
    assert "<|im_start|>user\n{\"tool_response\"" in text and "You can call" in text
    shown, variables = prompt(history, None, native=False)
    text = engine.tokenizer.apply_chat_template(shown, tokenize=False, **variables)
    assert "tool_call" not in text and "<|im_start|>tool\n18 degrees<|im_end|>" in text and "You can call" not in text


def test_templates_that_render_tools_get_them_and_each_formats_grammar_parses(served):  # noqa: F811
    client, service, app, url = served
    engine = service.engine
    assert "tools" not in engine.chat_template  # the default model's: the generic format
    hermes = copy.copy(engine.tokenizer)
    hermes.chat_template, hermes._formatters = HERMES_TEMPLATE, {}
    plan = ToolPlan(TOOLS, "required", format="hermes", native=True, names=set(SCHEMAS))
    messages, variables = prompt(ASK, plan, native=True)
    assert messages == ASK and variables == {"tools": TOOLS}
    text = hermes.decode(chat_ids(hermes, messages, **variables))
    assert '"name": "get_weather"' in text and "Tools:" in text
    sampling = service.snapshot().sampling_defaults.params(temperature=0.0)
    ids = engine.chat_ids(prompt(ASK, plan, native=False)[0])
    for form in ("hermes", "llama3", "mistral", "generic"):
        grammar = call_grammar(ToolPlan(TOOLS, "function", "get_weather", form, True, set(SCHEMAS)))
        with service.turn():
            answer = engine.generate(ids, "ppd", 150, sampling=sampling, grammar=grammar)
        assert answer.tokens[-1] in engine.loaded.eos_token_ids, answer.text  # the grammar ended the answer
        content, calls = parse(answer.text, set(SCHEMAS))
        assert content is None and len(calls) == 1 and calls[0].name == "get_weather", (form, answer.text)
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_weather"])
        assert answer.text.lstrip().startswith({"hermes": "<tool_call>", "mistral": "[", "llama3": "{",
                                                "generic": "{"}[form])


def test_bad_tool_fields_are_one_400_naming_the_field(served):  # noqa: F811
    client, service, app, url = served

    def post(**fields) -> dict:
        body = {"messages": ASK, "max_tokens": 4, **fields}
        return error_of(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30))

    nameless = {"type": "function", "function": {"description": "no name"}}
    assert post(tools=[WEATHER, nameless])["param"] == "tools[1].function.name"
    assert post(tools=[{"type": "function", "function": {"name": "a b"}}])["param"] == "tools[0].function.name"
    assert post(tools=[{"type": "retrieval"}])["param"] == "tools[0].type"
    assert post(tools=[{"type": "function"}])["param"] == "tools[0].function"
    assert post(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}])["param"] == \
        "tools[0].function.parameters"
    assert post(tools=[WEATHER, WEATHER])["param"] == "tools[1].function.name"
    assert post(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})["param"] == "tool_choice"
    assert post(tools=TOOLS, tool_choice="sometimes")["param"] == "tool_choice"
    assert post(tool_choice="required")["param"] == "tool_choice"  # no tools to call
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert post(tools=TOOLS, tool_choice="required", response_format=schema)["param"] == "tool_choice"
    assert post(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
                grammar='root ::= "x"')["param"] == "tool_choice"
    assert post(functions=[{"name": "f"}])["param"] == "functions"
    bad_call = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                     "function": {"name": "get_weather", "arguments": "{oops"}}]}
    assert post(messages=[*ASK, bad_call])["param"] == "messages[1].tool_calls[0].function.arguments"
    assert post(messages=[*ASK, {"role": "assistant", "tool_calls": "x"}])["param"] == "messages[1].tool_calls"
    assert post(messages=[*ASK, {"role": "assistant", "content": None}])["param"] == "messages[1].content"
    assert post(messages=[*ASK, {"role": "tool", "tool_call_id": 5, "content": "x"}])["param"] == \
        "messages[1].tool_call_id"
    assert error_of(httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "tools": TOOLS}, timeout=30))["param"] \
        == "tools"
    assert not service.queue.busy and app.state.ppd.running == 0  # nothing reached the model


CALL = {"city": "Paris", "unit": "celsius"}


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',  # Hermes
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',  # Llama 3.2
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',  # Llama 3.1
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',  # Mistral
    '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',  # Mistral, marker decoded away
    '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}',  # generic
    ' {"tool_call": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}}\n',
], ids=["hermes", "llama3", "llama3-python-tag", "mistral", "mistral-bare", "generic", "generic-string-arguments"])
def test_each_format_parses_into_one_call(text):
    content, calls = parse(text, {"get_weather"})
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", CALL)]
    assert calls[0].openai()["type"] == "function" and calls[0].openai(0)["index"] == 0


def test_several_calls_text_before_them_and_text_that_is_no_call():
    content, calls = parse('Let me check. <tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
                           '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>')
    assert content == "Let me check." and [(c.name, c.arguments) for c in calls] == [("a", "{}"), ("b", '{"x": 1}')]
    assert len({c.id for c in calls}) == 2
    content, calls = parse('{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]}')
    assert [c.name for c in calls] == ["a", "b"] and content is None
    content, calls = parse('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"y": 2}}')
    assert [c.name for c in calls] == ["a", "b"] and json.loads(calls[1].arguments) == {"y": 2}
    for text in ("Paris is sunny today.", '{"city": "Paris"}', "Use {\"name\": \"get_weather\"} later",
                 '<tool_call>{"name": "get_weather", "arguments": {"city": ', '[1, 2, 3]', '{"name": "other", "parameters": {}}'):
        assert parse(text, {"get_weather"}) == (text, [])
    assert parse('{"response": "It is sunny."}') == ("It is sunny.", [])  # the generic format's answer


def test_auto_answers_text_or_a_call_and_plain_text_still_streams(served):  # noqa: F811
    client, service, app, url = served
    whole = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="auto", temperature=0,
                                           max_tokens=24).choices[0]
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="auto",
                                                 temperature=0, max_tokens=24, stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    if whole.message.tool_calls:
        assert whole.finish_reason == "tool_calls" and all(checked_call(c) for c in whole.message.tool_calls)
    else:
        assert "".join(pieces) == whole.message.content and whole.finish_reason in ("stop", "length")
        if not whole.message.content.lstrip().startswith(("{", "[")):  # no call can begin: it streams as it grows
            assert len(pieces) > 1
