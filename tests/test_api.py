"""The OpenAI-compatible API (app/api/), served for real and called with the official ``openai`` client."""

import json
import socket
import threading
import time

import httpx
import openai
import pytest

from app.api import create_api
from app.cli import build_parser, main
from app.model_catalog import recent_file
from app.model_host import ModelHost
from app.server import make_server
from ppd_core import Engine, EngineConfig, SamplingParams
from ports import free_port

KEY = "test-key-3141"
QUESTION = [{"role": "user", "content": "Name the capital city of France."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def start(app, host: str):
    """``app`` served by uvicorn on a thread, as ``ppd serve`` serves it; returns (server, thread, port)."""
    port = free_port()
    server = make_server(app, host, port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return server, thread, port


@pytest.fixture(scope="module")
def served():
    """The default model behind the API on 127.0.0.1 with no key (the `ppd serve` default).

    On llama.cpp in the file's own quantization, with the small static tree (the cheapest PPD steps here), and
    one thread: with two, a CPU shared with other work slows every step several-fold (threads wait for each other).
    """
    engine = Engine.load(EngineConfig(model="default", device="cpu", tree="small", threads=1))
    service = ModelHost(engine)
    app = create_api(service)
    server, thread, port = start(app, "127.0.0.1")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    yield client, service, app, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)
    engine.close()


EXPECTED: dict = {}


def expected_result(service: ModelHost, messages, max_tokens: int, sampling: SamplingParams | None = None):
    """What the engine answers in this process (computed once per question) with ``sampling``, by default what a
    request setting only ``temperature`` 0 gets (the model's defaults for the rest: its repeat penalty)."""
    sampling = sampling or service.snapshot().sampling_defaults.params(temperature=0.0)
    key = (json.dumps(messages), max_tokens, sampling)
    if key not in EXPECTED:
        engine = service.engine
        with service.turn():  # never beside an answer the server is still finishing
            EXPECTED[key] = engine.generate(engine.chat_ids(messages), "ppd", max_tokens, sampling=sampling)
    return EXPECTED[key]


def expected_text(service: ModelHost, messages, max_tokens: int, sampling: SamplingParams | None = None) -> str:
    return expected_result(service, messages, max_tokens, sampling).text


def streamed_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def wait_idle(service: ModelHost, app, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while app.state.ppd.running or service.queue.busy:
        assert time.monotonic() < deadline, "the decoding did not end"
        time.sleep(0.02)


@pytest.mark.slow
def test_models_and_health(served):
    client, service, app, url = served
    recent_file().unlink(missing_ok=True)  # models other tests of the session loaded would be listed too
    models = client.models.list().data
    assert [m.id for m in models] == [service.engine.loaded.name]
    meta = models[0].model_extra["ppd"]
    assert meta["quant"] == service.engine.loaded.quant == "gguf" and meta["backend"] == "llamacpp"
    assert meta["prompt_tokens"]["count"] == service.engine.prompt_tokens.num_prompt_tokens
    assert meta["tree"]["name"] == "small" and meta["max_context"] == service.engine.max_context
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["model"] == models[0].id and health["busy"] is False


@pytest.mark.slow
def test_answers_equal_ppd_generate_streamed_or_not(served):
    client, service, app, url = served
    expected = expected_text(service, QUESTION, 32)
    assert "Paris" in expected

    answer = client.chat.completions.create(model="anything", messages=QUESTION, temperature=0, max_tokens=32)
    assert answer.choices[0].message.content == expected
    assert answer.choices[0].message.role == "assistant" and answer.object == "chat.completion"
    ids = service.engine.chat_ids(QUESTION)
    tokens = expected_result(service, QUESTION, 32).tokens
    assert answer.usage.prompt_tokens == len(ids) and answer.usage.completion_tokens == len(tokens)
    assert answer.choices[0].finish_reason == ("stop" if len(tokens) < 32 else "length")
    figures = answer.model_extra["ppd"]
    assert figures["tokens_per_second"] > 0 and figures["tokens_per_step"] >= 1.0
    assert figures["acceptance"] == "greedy" and figures["new_tokens"] == len(tokens)

    stream = client.chat.completions.create(model="anything", messages=QUESTION, temperature=0,
                                            max_completion_tokens=32, stream=True, stream_options={"include_usage": True})
    text, chunks = streamed_text(stream)
    assert text == expected
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 2 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    last_choice = [c for c in chunks if c.choices][-1]
    assert last_choice.choices[0].finish_reason == answer.choices[0].finish_reason
    assert last_choice.model_extra["ppd"]["new_tokens"] == len(tokens)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)

    # on the wire: server-sent events ending with [DONE]
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    pieces = [json.loads(line[6:])["choices"][0]["delta"].get("content") or "" for line in events[:-1]]
    assert "".join(pieces) == expected_text(service, QUESTION, 8)


@pytest.mark.slow
def test_stop_strings_cut_the_answer(served):
    client, service, app, url = served
    expected = expected_text(service, QUESTION, 32)
    stop = expected.split()[2]  # a word from the middle of the answer
    cut = expected[: expected.index(stop)]
    answer = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=32, stop=[stop, "\u2603"])
    assert answer.choices[0].message.content == cut and answer.choices[0].finish_reason == "stop"
    text, _ = streamed_text(client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=32,
                                                           stop=stop, stream=True))
    assert text == cut


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(served):
    client, service, app, url = served
    sampled = dict(model="m", messages=STORY, temperature=0.9, top_p=0.95, max_tokens=16)
    first = client.chat.completions.create(seed=11, **sampled).choices[0].message.content
    streamed, _ = streamed_text(client.chat.completions.create(seed=11, stream=True, **sampled))
    assert first == streamed
    defaults = service.snapshot().sampling_defaults  # top-k and the repeat penalty: the model's defaults
    assert first == expected_text(service, STORY, 16, defaults.params(temperature=0.9, top_p=0.95, seed=11))
    assert client.chat.completions.create(seed=12, **sampled).choices[0].message.content != first  # another seed, another answer


@pytest.mark.slow
def test_two_concurrent_streams_are_serialised_and_each_equals_its_own_answer(served):
    client, service, app, url = served
    prompts = [STORY, [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."}]]
    expected = [expected_text(service, messages, 24) for messages in prompts]
    results: list = [None, None]
    barrier = threading.Barrier(2)

    def ask(index: int) -> None:
        barrier.wait()
        stream = client.chat.completions.create(model="m", messages=prompts[index], temperature=0, max_tokens=24, stream=True)
        text, chunks = streamed_text(stream)
        results[index] = (text, [c for c in chunks if c.choices][-1].model_extra["ppd"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert [r[0] for r in results] == expected
    (a_start, a_end), (b_start, b_end) = sorted((r[1]["started_at"], r[1]["finished_at"]) for r in results)
    assert a_end <= b_start  # one after the other on the model
    assert max(r[1]["queued_seconds"] for r in results) > 0.05  # the second one waited for the first


@pytest.mark.slow
def test_disconnect_mid_stream_stops_decoding_and_the_next_request_works(served):
    client, service, app, url = served
    stream = client.chat.completions.create(model="m", messages=STORY, temperature=0, max_tokens=400, stream=True)
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 3:
            break
    closed = time.monotonic()
    stream.close()
    wait_idle(service, app)
    assert time.monotonic() - closed < 5.0
    job, outcome = app.state.ppd.finished[-1]
    assert job.max_new_tokens == 400 and outcome.finish_reason == "cancelled"
    assert outcome.steps_after_cancel <= 1 and outcome.completion_tokens < 400

    # a non-streamed request whose client goes away stops too
    body = json.dumps({"messages": STORY, "temperature": 0, "max_tokens": 400}).encode()
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while not service.queue.busy:  # until its decoding has started
            assert time.monotonic() < deadline, "the request did not reach the model"
            time.sleep(0.01)
        time.sleep(0.5)  # a few steps in
    closed = time.monotonic()
    wait_idle(service, app)
    assert time.monotonic() - closed < 5.0
    job, outcome = app.state.ppd.finished[-1]
    assert job.max_new_tokens == 400 and outcome.finish_reason == "cancelled" and outcome.completion_tokens < 400
    # the engine is ready: the next answer is exactly the single-request one
    answer = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=32)
    assert answer.choices[0].message.content == expected_text(service, QUESTION, 32)


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"]
    return error


@pytest.mark.slow
def test_bad_requests_get_400_in_openai_shape(served):
    client, service, app, url = served
    endpoint = f"{url}/v1/chat/completions"

    def post(body) -> dict:
        content = body if isinstance(body, str) else json.dumps(body)
        return error_of(httpx.post(endpoint, content=content, headers={"content-type": "application/json"}, timeout=30))

    assert "not valid JSON" in post('{"messages": [')["message"]
    assert post('[1, 2]')["message"].startswith("the request body:")
    assert post({"model": "m"})["param"] == "messages"
    assert "empty" in post({"messages": []})["message"]
    assert "unknown role 'wizard'" in post({"messages": [{"role": "wizard", "content": "hi"}]})["message"]
    assert post({"messages": [{"role": "user", "content": "   "}]})["param"] == "messages[0].content"
    assert post({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})["param"] == "messages[0].content"
    assert post({"messages": QUESTION, "n": 2})["param"] == "n"
    assert post({"messages": QUESTION, "temperature": 3})["param"] == "temperature"
    assert post({"messages": QUESTION, "top_p": 0})["param"] == "top_p"
    assert post({"messages": QUESTION, "max_tokens": 0})["param"] == "max_tokens"
    assert post({"messages": QUESTION, "stop": ["a", "b", "c", "d", "e"]})["param"] == "stop"
    too_long = post({"messages": [{"role": "user", "content": "word " * (service.engine.max_context + 100)}]})
    assert too_long["code"] == "context_length_exceeded" and str(service.engine.max_context) in too_long["message"]
    assert post({"messages": QUESTION, "max_tokens": 2**31})["param"] == "max_tokens"  # past llama-server's int32

    with pytest.raises(openai.BadRequestError) as raised:  # the official client sees an OpenAI error
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": ""}], max_tokens=8)
    assert raised.value.status_code == 400 and raised.value.body["param"] == "messages[0].content"
    assert not service.queue.busy and app.state.ppd.running == 0  # nothing reached the model
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@pytest.mark.slow
def test_chat_on_a_non_local_host_serves_the_page_and_the_keyed_api(served, monkeypatch):
    """`ppd chat --host 0.0.0.0 --auth USER:PASS --api-key KEY`: page and API on one server, one model lock; no key, 401."""
    from gradio_client import Client

    from app.server import Serving

    _, service, _, _ = served
    servings = []
    init = Serving.__init__

    def recorded(self, *args):
        init(self, *args)
        servings.append(self)

    monkeypatch.setattr(Serving, "__init__", recorded)
    monkeypatch.setattr("app.commands.chat.load_engine", lambda args, **_: service.engine)  # the model already loaded
    quits = []  # the model is the module's: freed by the fixture
    monkeypatch.setattr(ModelHost, "shutdown", lambda self, timeout=30.0: quits.append(self.engine))
    port = free_port()
    codes = []
    chat = threading.Thread(target=lambda: codes.append(main(
        ["chat", "--host", "0.0.0.0", "--port", str(port), "--auth", "me:secret", "--api-key", KEY])))
    chat.start()
    deadline = time.monotonic() + 60
    base = f"http://127.0.0.1:{port}"
    while not (servings and servings[0].server.started and httpx.get(f"{base}/health").status_code == 200):
        assert time.monotonic() < deadline and chat.is_alive(), "ppd chat did not start"
        time.sleep(0.05)
    try:
        for key in ("wrong", None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            response = httpx.post(f"{base}/v1/chat/completions", json={"messages": QUESTION}, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        keyed = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)
        assert keyed.models.list().data[0].id == service.engine.loaded.name

        # a page answer and an API answer share the model lock: the API one waits for the page's
        page = Client(f"{base}/", auth=("me", "secret"), verbose=False)
        job = page.submit("Give me three tips for staying healthy.", "", 32, True, "lossless", False, "",
                          0.0, 1.0, api_name="/send")
        deadline = time.monotonic() + 60
        while not httpx.get(f"{base}/health").json()["busy"]:
            assert time.monotonic() < deadline, "the page's answer did not start"
            time.sleep(0.01)
        answer = keyed.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=32)
        list(job)
        assert answer.model_extra["ppd"]["queued_seconds"] > 0.05
        assert answer.choices[0].message.content == expected_text(service, QUESTION, 32)
    finally:
        servings[0].server.should_exit = True  # as Ctrl+C ends the serving
        chat.join(30)
    assert codes == [0] and quits == [service.engine]  # quitting frees ppd chat's model


def test_serve_on_a_non_loopback_host_needs_a_key_or_no_auth(capsys, monkeypatch):
    from app.commands.serving import api_key_of

    monkeypatch.delenv("PPD_API_KEY", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    assert "--api-key KEY" in capsys.readouterr().err
    assert api_key_of(build_parser().parse_args(["serve"])) == (True, None)  # loopback: no key needed
    assert api_key_of(build_parser().parse_args(["serve", "--host", "0.0.0.0", "--api-key", KEY])) == (True, KEY)
    assert api_key_of(build_parser().parse_args(["serve", "--host", "0.0.0.0", "--no-auth"])) == (True, None)
    assert "without a key" in capsys.readouterr().err
    monkeypatch.setenv("PPD_API_KEY", KEY)
    assert api_key_of(build_parser().parse_args(["serve", "--host", "0.0.0.0"])) == (True, KEY)
    # `ppd chat` with a page login but no API key on a non-loopback host serves the page without the API
    monkeypatch.delenv("PPD_API_KEY")
    assert api_key_of(build_parser().parse_args(["chat", "--host", "0.0.0.0", "--auth", "me:secret"])) == (False, None)
    assert "API (/v1) is off" in capsys.readouterr().err
    assert main(["serve", "--api-key", " ", "--port", str(free_port())]) == 2


def test_openai_client_on_the_torch_backend(default_engine):
    """The same API on the torch backend (the default GGUF de-quantized by transformers; the module's server runs
    llama.cpp): /v1/models says so, and a streamed greedy answer equals the engine's own."""
    engine = default_engine
    server, thread, port = start(create_api(ModelHost(engine)), "127.0.0.1")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        meta = client.models.list().data[0].model_extra["ppd"]
        assert (meta["backend"], meta["quant"]) == ("torch", "none")
        stream = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=32, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        defaults = ModelHost(engine).snapshot().sampling_defaults.params(temperature=0.0)  # the default penalty
        expected = engine.generate(engine.chat_ids(QUESTION), "ppd", 32, sampling=defaults).text  # PPD's own answer
        assert text == expected and "Paris" in expected
    finally:
        server.should_exit = True
        thread.join(15)


def malformed_requests() -> list[tuple[str, bytes]]:
    """Over 200 bodies no client should send: broken JSON, wrong types, missing fields, values out of range."""
    good = {"messages": QUESTION, "max_tokens": 1, "temperature": 1.0}  # sampled: a seed is used
    bodies: list[tuple[str, bytes]] = []

    def with_field(name, value):
        bodies.append((f"{name}={value!r}"[:80], json.dumps({**good, name: value}).encode()))

    for text in (b"", b"{", b"}", b"[", b"null", b"[]", b'"hi"', b"123", b"true", b"{'messages': []}", b'{"messages": [}',
                 b'{"messages": ' + b"[" * 5000, b"\xff\xfe\xfd", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
                 json.dumps(good).encode()[:-1], b"{}" * 3, b"\x00" * 10):
        bodies.append((f"raw {text[:20]!r}", text))
    for value in (None, "hi", 3, 2.5, True, {}, {"role": "user"}, [], [None], [1, 2], ["hi"], [{}], [{"role": "user"}],
                  [{"content": "hi"}], [{"role": 5, "content": "hi"}], [{"role": "robot", "content": "hi"}],
                  [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image_url"}]}],
                  [{"role": "user", "content": [5]}], [{"role": "user", "content": None}], [{"role": "user", "content": ""}],
                  [{"role": "user", "content": "   "}], [{"role": "assistant", "content": "only me"}],
                  [{"role": "system", "content": "only a system prompt"}], [{"role": "user", "content": "word " * 9000}]):
        with_field("messages", value)
    wrong_types = ("x", "", [], [1], {}, {"a": 1}, float("nan"), 1e309, -1e309)
    out_of_range = {"temperature": (-1, 2.5, 10**30), "top_p": (-1, 0, 1.5), "max_tokens": (-1, 0, 10**30, 3.5),
                    "max_completion_tokens": (-1, 0, 10**30, 3.5), "top_k": (-1, 3.5), "seed": (3.5, 2**64),
                    "n": (0, 2, -1, 3.5), "presence_penalty": (2.5, -3), "frequency_penalty": (2.01, -2.5),
                    "repeat_penalty": (0, -1, 101), "repeat_last_n": (-2, 3.5), "top_logprobs": (-1, 21, 3.5)}
    for name, values in out_of_range.items():
        for value in (*wrong_types, *values):
            with_field(name, value)
    for name, value in (("stream", "maybe"), ("stream", 2), ("stream", [1]), ("stream_options", "x"),
                        ("stream_options", {"include_usage": "x"}), ("stream_options", [1]),
                        ("stop", 5), ("stop", [1]), ("stop", [""]), ("stop", ["a"] * 10), ("stop", {"a": 1}),
                        ("logprobs", 5), ("logprobs", "x"), ("top_logprobs", 3), ("tools", [{"type": "function"}]), ("tools", "x"),
                        ("functions", [{}]), ("response_format", {"type": "xml"}), ("response_format", "x"), ("grammar", "root ::= ["),
                        ("acceptance", "fast"), ("acceptance", 1), ("model", 5), ("model", ["m"]), ("model", {"a": 1})):
        with_field(name, value)
    for value in wrong_types:
        if value != "x":  # a message may say "x"
            with_field("messages", [{"role": "user", "content": value}])
        with_field("messages", [{"role": value, "content": "hi"}])
    for text in (b'{"messages": "', b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": }', b"NaN", b"-",
                 b'{"messages": [{"role": "user", "content": "hi"}]]', b"{" * 100, b'{"a": 1', b"1e999", b'{"messages": null}',
                 b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 0,}', b'{"messages": [1, 2, 3]'):
        bodies.append((f"raw {text[:20]!r}", text))
    without = {k: v for k, v in good.items() if k != "messages"}
    bodies.append(("no messages", json.dumps(without).encode()))
    bodies.append(("2 MB body", json.dumps({**good, "padding": "x" * (2 << 20)}).encode()))
    return bodies


@pytest.mark.slow
def test_malformed_requests_are_all_4xx_and_the_server_answers_after(served):
    client, service, app, url = served
    bodies = malformed_requests()
    assert len(bodies) >= 200
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        for name, body in bodies:
            response = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:200])
            assert response.json()["error"]["message"], name

        def chunked():  # 2 MB with no Content-Length: counted as it arrives
            for _ in range(32):
                yield b"x" * (64 << 10)

        response = http.post("/v1/chat/completions", content=chunked(), headers={"Content-Type": "application/json"})
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    for _ in range(3):  # slow clients: half a request, then gone
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as raw:
            raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"messages\": [")
    assert statuses == {400: len(bodies) - 1, 413: 1}  # the 2 MB body: 413; every other one: 400
    answer = client.chat.completions.create(model="m", messages=QUESTION, temperature=0, max_tokens=8)
    assert answer.choices[0].message.content == expected_text(service, QUESTION, 8)
    print(f"bad input: {len(bodies) + 1} malformed requests and 3 half-sent ones: {statuses[400]} 400s, "
          f"{statuses[413] + 1} 413s, no 5xx; the next good request answered")
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


@pytest.mark.slow
def test_penalties_and_logprobs_through_the_openai_client_equal_plain_decoding(served):
    """llama.cpp's penalties as llama-server takes them (repeat_penalty and repeat_last_n beside OpenAI's presence and
    frequency penalties), and logprobs with 3 alternatives: the answer, PPD on the server, equals plain decoding's in
    this process, and so does every logprob, to the last bit, streamed or not."""
    client, service, app, url = served
    penalties = {"repeat_penalty": 1.3, "repeat_last_n": 32, "presence_penalty": 0.5, "frequency_penalty": 0.3}
    engine = service.engine
    with service.turn():
        plain = engine.generate(engine.chat_ids(STORY), "plain", 40, sampling=SamplingParams(**penalties), logprobs=3)
    expected = [item for step in plain.steps for item in step.logprobs]
    asked = dict(model="m", messages=STORY, temperature=0, max_tokens=40, logprobs=True, top_logprobs=3,
                 presence_penalty=penalties["presence_penalty"], frequency_penalty=penalties["frequency_penalty"],
                 extra_body={name: penalties[name] for name in ("repeat_penalty", "repeat_last_n")})
    answer = client.chat.completions.create(**asked)
    assert answer.choices[0].message.content == plain.text
    streamed = list(client.chat.completions.create(stream=True, **asked))
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain.text
    streamed_entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    for entries in (answer.choices[0].logprobs.content, streamed_entries):
        assert len(entries) == len(expected)
        for entry, item in zip(entries, expected):
            assert bytes(entry.bytes) == engine.token_bytes(item.token) and entry.logprob == item.logprob
            assert [(bytes(t.bytes), t.logprob) for t in entry.top_logprobs] == \
                [(engine.token_bytes(token), logprob) for token, logprob in item.top]
    unpenalised = client.chat.completions.create(model="m", messages=STORY, temperature=0, max_tokens=40,
                                                 extra_body={"repeat_penalty": 1.0})
    assert unpenalised.choices[0].message.content != plain.text and answer.choices[0].logprobs.content[0].logprob <= 0


def test_unset_sampling_fields_get_the_models_defaults_and_bad_ones_a_400(served):
    """A request leaving the sampling unset gets what /v1/models names (the model's recommendation, else ppd's
    measured repeat penalty, else llama-server's defaults); bad penalties and logprobs are one-line 400s."""
    client, service, app, url = served
    card = client.models.list().data[0].model_extra["ppd"]["sampling_defaults"]
    assert card["temperature"] == {"value": 0.8, "from": "llama-server's default"}  # the default model recommends none
    assert card["repeat_penalty"] == {"value": 1.1, "from": "ppd's default (measured)"}
    from app.api.jobs import sampling_of
    from app.api.schemas import ChatCompletionRequest

    chosen = service.snapshot().sampling_defaults
    unset = sampling_of(ChatCompletionRequest(messages=QUESTION), chosen)
    assert unset == SamplingParams(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.1, repeat_last_n=64)
    assert sampling_of(ChatCompletionRequest(messages=QUESTION, temperature=0, repeat_penalty=1.0), chosen) == \
        SamplingParams(top_p=0.95, top_k=40, min_p=0.05)
    endpoint = f"{url}/v1/chat/completions"
    for field, value in [("min_p", 1.5), ("repeat_penalty", 0), ("repeat_last_n", -2), ("presence_penalty", 2.5),
                         ("frequency_penalty", -3), ("top_logprobs", 21)]:
        body = {"messages": QUESTION, field: value, **({"logprobs": True} if field == "top_logprobs" else {})}
        error = error_of(httpx.post(endpoint, json=body, timeout=30))
        assert error["param"] == field and "\n" not in error["message"], (field, error)
    error = error_of(httpx.post(endpoint, json={"messages": QUESTION, "top_logprobs": 2}, timeout=30))
    assert error["param"] == "top_logprobs" and "logprobs" in error["message"]
    assert not service.queue.busy and app.state.ppd.running == 0
