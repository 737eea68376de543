"""An API answer is labelled by the model that gave it: a model switch right after its decoding, before its response
is assembled, neither fails it nor relabels it (the real server, the real ``openai`` client, real llama.cpp models)."""

import socket
import threading
import time

import openai
import pytest

from app.api import decoding
from app.api import create_api
from app.api.routes import check_ready
from app.model_host import ModelHost
from app.server import make_server
from ppd_core import Engine, EngineConfig
from tiny_gguf import tiny_models  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name the capital city of France."}]


def serve(service: ModelHost, app=None):
    """``ppd serve``'s app for ``service`` (or ``app``) on a free port, on a thread; returns (server, thread, client)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = make_server(app or create_api(service), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    return server, thread, client


@pytest.fixture
def switchable(tiny_models):  # noqa: F811 - the fixture imported above
    """The default model behind the API, with a loader that can switch to a tiny GGUF; ``gate`` holds a load back."""
    gate = threading.Event()
    gate.set()

    def load(spec: str, progress=None) -> Engine:
        assert gate.wait(120), "the test never let the load go on"
        return Engine.load(EngineConfig(model=spec, device="cpu", tree="auto", auto_calibrate=False, threads=1), progress)

    service = ModelHost(load("default"), spec="default", loader=load)
    server, thread, client = serve(service)
    yield client, service, str(tiny_models.get("llama")), gate
    gate.set()
    server.should_exit = True
    thread.join(15)
    if service.ready:
        service.engine.close()


@pytest.mark.parametrize("moment", ["while the next model loads", "once it is loaded"])
def test_a_switch_between_the_answer_and_its_response_keeps_its_model(switchable, monkeypatch, moment):
    """Before the fix the response read the model after decoding: a 500 (``NotReady``) while the next model loaded,
    or the next model's name once it had."""
    client, service, tiny, gate = switchable
    answered_by = service.snapshot()
    switches: list[threading.Thread] = []
    decode = decoding.decode

    def decode_then_switch(*args, **kwargs):  # on the API's worker, after the decoding gave the model back
        outcome = decode(*args, **kwargs)
        if moment == "while the next model loads":
            gate.clear()
        switch = threading.Thread(target=service.switch, args=(tiny,))
        switch.start()
        switches.append(switch)
        if moment == "while the next model loads":
            deadline = time.monotonic() + 30
            while service.ready:  # the switch holds the model and the old one is closed
                assert time.monotonic() < deadline, "the switch did not begin"
                time.sleep(0.005)
        else:
            switch.join(120)
            assert service.snapshot().name != answered_by.name
        return outcome

    monkeypatch.setattr(decoding, "decode", decode_then_switch)
    answer = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=8, temperature=0)
    assert answer.model == answered_by.name
    assert answer.choices[0].message.content
    assert answer.model_extra["ppd"]["tree"] == answered_by.tree["name"]

    monkeypatch.setattr(decoding, "decode", decode)
    gate.set()
    switches[0].join(120)
    assert service.ready and service.spec == tiny
    following = client.chat.completions.create(model=tiny, messages=QUESTION, max_tokens=4, temperature=0)
    assert following.model == service.snapshot().name != answered_by.name


def test_a_streamed_answer_keeps_its_model_and_figures_across_a_switch(switchable, monkeypatch):
    """The stream's last chunk carries ppd's figures: read from the answer's own snapshot, not from the model loading
    after it (before the fix the stream broke off there with an error event)."""
    client, service, tiny, gate = switchable
    answered_by = service.snapshot()
    switches: list[threading.Thread] = []
    decode = decoding.decode

    def decode_then_switch(*args, **kwargs):
        outcome = decode(*args, **kwargs)
        gate.clear()
        switch = threading.Thread(target=service.switch, args=(tiny,))
        switch.start()
        switches.append(switch)
        deadline = time.monotonic() + 30
        while service.ready:
            assert time.monotonic() < deadline, "the switch did not begin"
            time.sleep(0.005)
        return outcome

    monkeypatch.setattr(decoding, "decode", decode_then_switch)
    chunks = list(client.chat.completions.create(model="default", messages=QUESTION, max_tokens=8, temperature=0,
                                                 stream=True))
    assert {chunk.model for chunk in chunks} == {answered_by.name}
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["ppd"]["tree"] == answered_by.tree["name"]
    gate.set()
    switches[0].join(120)
    assert service.ready and service.spec == tiny


def test_a_model_loading_after_the_readiness_check_is_a_503_not_a_500(tiny_models):  # noqa: F811
    """The readiness check passed, then a switch took the model: naming the model (a request, /v1/models) is the 503
    ``model_not_ready`` with Retry-After, as before the check (it was a 500: ``NotReady`` is no ``ApiError``)."""
    import httpx

    async def passed():  # the check ran just before the switch began
        return None

    gate = threading.Event()

    def load(spec: str, progress=None) -> Engine:
        assert gate.wait(120), "the test never let the load go on"
        return Engine.load(EngineConfig(model=spec, device="cpu", tree="auto", auto_calibrate=False, threads=1), progress)

    gate.set()
    service = ModelHost(load("default"), spec="default", loader=load)
    app = create_api(service)
    v1 = next(route.app.app for route in app.routes if getattr(route, "path", None) == "/v1")  # under its body limit
    v1.dependency_overrides[check_ready] = passed
    server, thread, client = serve(service, app)
    gate.clear()
    switch = threading.Thread(target=service.switch, args=(str(tiny_models.get("llama")),))
    try:
        switch.start()
        deadline = time.monotonic() + 30
        while service.ready:
            assert time.monotonic() < deadline, "the switch did not begin"
            time.sleep(0.005)
        url = str(client.base_url).rstrip("/")
        for response in (httpx.post(f"{url}/chat/completions", json={"messages": QUESTION}, timeout=30),
                         httpx.get(f"{url}/models", timeout=30)):
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "model_not_ready" and response.headers["retry-after"]
    finally:
        gate.set()
        switch.join(120)
        server.should_exit = True
        thread.join(15)
        if service.ready:
            service.engine.close()
