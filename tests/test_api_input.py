"""The API's edges (issue 40): text UTF-8 cannot encode, the wait it reports, and the model ids it answers to and
lists, on a real server with the real default model (``test_api``'s ``served``)."""

import json

import httpx
import pytest

from app import model_catalog
from ppd_core.errors import PpdError
from test_api import QUESTION, error_of, expected_text, served  # noqa: F401 - served is a fixture

pytestmark = pytest.mark.slow

SURROGATE = "hi \ud800 there"  # json.dumps writes it as the escape "\ud800": Python reads a lone surrogate back


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body), timeout=60,
                      headers={"Content-Type": "application/json"})


def test_a_lone_surrogate_in_any_text_field_is_a_400_naming_it(served):
    client, service, app, url = served
    user = {"role": "user", "content": "Hi"}
    cases = {
        "messages[0].content": {"messages": [{"role": "user", "content": SURROGATE}]},
        "messages[1].content": {"messages": [user, {"role": "assistant", "content": SURROGATE}, user]},
        "messages[0].content[1].text": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "fine"}, {"type": "text", "text": SURROGATE}]}]},
        "stop": {"messages": [user], "stop": SURROGATE},
        "stop[1]": {"messages": [user], "stop": ["ok", SURROGATE]},
        "model": {"messages": [user], "model": SURROGATE},
    }
    for role in ("system", "developer"):
        cases[f"{role}: messages[0].content"] = {"messages": [{"role": role, "content": "\udfff"}, user]}
    for name, body in cases.items():
        for stream in (False, True):
            error = error_of(post(url, {**body, "max_tokens": 4, "stream": stream}))
            assert error["param"] == name.split(": ")[-1] and error["code"] == "invalid_text", (name, error)
            assert "lone UTF-16 surrogate" in error["message"] and "\n" not in error["message"]
    role = error_of(post(url, {"messages": [{"role": "us\ud800er", "content": "hi"}], "max_tokens": 4}))
    assert role["param"] == "messages[0].role"
    assert not service.queue.busy and app.state.ppd.running == 0  # nothing reached the model
    # the core says it in one line too (the chat page shows a PpdError as one line)
    with pytest.raises(PpdError, match="U\\+D800") as raised:
        service.engine.tokenizer.encode(SURROGATE)
    assert "\n" not in str(raised.value)
    with pytest.raises(PpdError, match="message 1's content"):
        service.engine.chat_ids([{"role": "user", "content": SURROGATE}])
    answer = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=8)
    assert answer.choices[0].message.content == expected_text(service, QUESTION, 8)


def test_queued_seconds_is_the_wait_for_the_model_not_the_prefill(served):
    """Alone on the server a request waits for nothing: its ``queued_seconds`` is a small fraction of its prompt's
    prefill (it included the prefill before the fix), and its turn spans its prefill and decoding."""
    client, service, app, url = served
    long_question = [{"role": "user", "content": "Summarise: " + "the river flows to the sea. " * 40}]
    for stream in (False, True):
        response = post(url, {"messages": long_question, "temperature": 0, "max_tokens": 2, "stream": stream})
        assert response.status_code == 200, response.text
        if stream:
            chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
            figures = next(chunk["ppd"] for chunk in chunks if "ppd" in chunk)
        else:
            figures = response.json()["ppd"]
        assert figures["prefill_seconds"] > 0.02, figures
        assert 0 <= figures["queued_seconds"] < figures["prefill_seconds"] / 4, figures
        assert figures["finished_at"] - figures["started_at"] >= figures["seconds"] - 0.002, figures


def test_model_ids_default_spec_and_name_and_no_local_paths(served, tmp_path, monkeypatch):
    client, service, app, url = served
    name = service.snapshot().name
    for model_id in ("default", name):
        card = httpx.get(f"{url}/v1/models/{model_id}", timeout=30)
        assert card.status_code == 200, (model_id, card.text)
        assert card.json()["id"] == name and card.json()["ppd"]["loaded"] is True
        assert card.json()["ppd"]["model"] == "default" == service.spec
    missing = httpx.get(f"{url}/v1/models/no-such-model", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"

    # a recently loaded local file: listed by its file name alone, never by its path
    folder = tmp_path / "private-folder"
    recent = tmp_path / "recent-models.json"
    monkeypatch.setattr(model_catalog, "recent_file", lambda: recent)
    recent.write_text(json.dumps([str(folder / "other-model.gguf"), str(folder / "hf-dir")]))
    listing = httpx.get(f"{url}/v1/models", timeout=30)
    ids = [entry["id"] for entry in listing.json()["data"]]
    assert ids[0] == name and {"other-model.gguf", "hf-dir"} <= set(ids), ids
    assert "private-folder" not in listing.text and str(tmp_path) not in listing.text
    card = httpx.get(f"{url}/v1/models/other-model.gguf", timeout=30).json()
    assert card == {"id": "other-model.gguf", "object": "model", "created": card["created"], "owned_by": "ppd",
                    "ppd": {"loaded": False}}
    assert httpx.get(f"{url}/v1/models/{folder / 'other-model.gguf'}", timeout=30).status_code == 404
    # naming a listed model that is not loaded is refused; its path names nothing listed: the loaded model answers
    refused = error_of(post(url, {"messages": QUESTION, "model": "other-model.gguf", "max_tokens": 2}))
    assert refused["param"] == "model" and refused["code"] == "model_not_loaded"
    for model in ("default", name, str(folder / "other-model.gguf")):
        answered = post(url, {"messages": QUESTION, "model": model, "max_tokens": 2, "temperature": 0})
        assert answered.status_code == 200 and answered.json()["model"] == name, (model, answered.text)


def test_a_penalty_window_past_any_sequence_is_the_whole_sequence(served):
    """``repeat_last_n`` 10**30 (too big for NumPy: a 500 before the fix) counts what -1 counts: all of it."""
    client, service, app, url = served
    answers = [client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=12,
                                              extra_body={"repeat_last_n": last_n, "repeat_penalty": 1.5})
               for last_n in (10**30, 2**63, -1, 1)]
    texts = [answer.choices[0].message.content for answer in answers]
    assert texts[0] == texts[1] == texts[2] != texts[3], texts


def test_min_p_through_the_api(served):
    """``min_p`` 1 keeps only the likeliest token: a hot seeded request answers what greedy answers (PPD's trees
    included); unset it is llama-server's 0.05, named in ``/v1/models``; out of range, a 400 naming it."""
    client, service, app, url = served
    card = client.models.list().data[0].model_extra["ppd"]["sampling_defaults"]
    assert card["min_p"] == {"value": 0.05, "from": "llama-server's default"}
    answers = [client.chat.completions.create(model="m", messages=QUESTION, max_tokens=24, seed=seed,
                                              extra_body={"repeat_penalty": 1.0, **fields})
               for seed, fields in ((1, {"temperature": 1.5, "min_p": 1.0}), (2, {"temperature": 1.5, "min_p": 1.0}),
                                    (0, {"temperature": 0}))]
    texts = [answer.choices[0].message.content for answer in answers]
    assert texts[0] == texts[1] == texts[2], texts
    error = error_of(post(url, {"messages": QUESTION, "min_p": 1.5}))
    assert error["param"] == "min_p" and error["message"] == "min_p must be between 0 (off) and 1, got 1.5", error
