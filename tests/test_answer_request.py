"""One answer's request is checked once (issue 52): an API request, a page answer and a Compare each take the model's
snapshot at most once, compile their grammar once and make the model's checks once, on the real server and page
service with the real default model (``test_api``'s ``served``)."""

import json
from collections import Counter

import pytest

from app.chat import Chat
from app.chat_settings import ChatSettings
from ppd_core import engine as engine_module
from ppd_core.answer_request import PromptTooLongError, RequestError, check_answer
from ppd_core.engine import Engine
from ppd_core.sampling.fields import FIELDS, SamplingField
from test_api import served  # noqa: F401 - a fixture

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ASK = [{"role": "user", "content": "Name a city in France, as JSON."}]


@pytest.fixture
def counted(monkeypatch):
    """How often each piece of a request's work ran: the snapshot, the grammar's compilation, the model's checks, the
    chat template."""
    counts: Counter = Counter()

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(engine_module, "take_snapshot", counting("snapshot", engine_module.take_snapshot))
    monkeypatch.setattr(engine_module, "check_answer", counting("check", engine_module.check_answer))
    monkeypatch.setattr(Engine, "_constraint", counting("grammar", Engine._constraint))
    monkeypatch.setattr(Engine, "chat_ids", counting("template", Engine.chat_ids))
    return counts


def test_an_api_request_takes_the_snapshot_compiles_its_grammar_and_checks_once(served, counted, monkeypatch):
    client, service, app, url = served
    service.engine.replan()  # a new plan: the snapshot kept for the old one is no longer this model's picture
    answer = client.chat.completions.create(
        model="m", messages=ASK, temperature=0, max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}})
    assert counted == {"snapshot": 1, "grammar": 1, "check": 1, "template": 1}, counted
    content = answer.choices[0].message.content
    if answer.choices[0].finish_reason == "stop":
        assert "city" in json.loads(content)
    counted.clear()
    checked: Counter = Counter()
    problem = SamplingField.problem
    monkeypatch.setattr(SamplingField, "problem", lambda field, value: checked.update([field.name]) or problem(field, value))
    client.chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=4)  # same plan: no new snapshot
    assert counted == {"check": 1, "template": 1}, counted
    assert checked == {field.name: 1 for field in FIELDS}, checked  # each sampling field's range checked once


def test_a_page_answer_and_a_comparison_compile_the_schema_once(served, counted):
    _, service, _, _ = served
    chat = Chat(service)
    settings = ChatSettings(max_new_tokens=16, schema=json.dumps(SCHEMA))
    updates = list(chat.answer(ASK, settings))
    assert updates[-1].stop_reason in ("eos", "length")
    assert counted["grammar"] == 1 and counted["check"] == 1, counted
    counted.clear()
    comparison = chat.compare(ASK, settings)  # both modes answer the one request, each with its own grammar state
    assert counted["grammar"] == 1 and counted["check"] == 1, counted
    assert comparison.identical and comparison.plain_text == comparison.ppd_text
    assert comparison.ppd_text == updates[-1].text  # greedy: the page's answer, the grammar followed both ways


def test_the_checks_name_the_field_at_fault():
    with pytest.raises(PromptTooLongError) as long:
        check_answer([1] * 16, 4, 16)
    assert (long.value.prompt_tokens, long.value.context, long.value.field) == (16, 16, "ids")
    for args, kwargs, field in (([[], 4, 16], {}, "ids"), ([[1], 0, 16], {}, "max_new_tokens"),
                                ([[1], 4, 16], {"logprobs": 21}, "logprobs"), ([[1], 4, 16], {"mode": "fast"}, "mode"),
                                ([[1], 4, 16], {"grammar": "root ::= \"a\""}, "grammar")):  # no grammar engine
        with pytest.raises(RequestError) as raised:
            check_answer(*args, **kwargs)
        assert raised.value.field == field and "\n" not in str(raised.value)
    request = check_answer([1, 2, 3], None, 16)  # no limit: the rest of the context
    assert request.max_new_tokens == 13 and request.ids == (1, 2, 3)
