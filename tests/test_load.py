"""Many clients at once against `ppd chat` on the default model (the page and the API on one server, llama.cpp):
every request ends with its whole answer or a 503, none hangs, and the server is fine afterwards."""

import gc
import threading
import time

import httpx
import openai
import psutil
import pytest

from app.api import api_routes
from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_text import LENGTH_LIMIT
from app.ui import build_app
from ppd_core import Engine, EngineConfig, SamplingParams
from ppd_core.memory import limit_malloc_arenas
from ports import free_port

pytestmark = pytest.mark.slow

TOPICS = ("the sea", "a forest", "bread", "the moon", "trains", "rain", "a city at night", "bees", "winter", "music",
          "a library", "mountains", "coffee", "a garden", "the desert", "snow")
QUESTIONS = [[{"role": "user", "content": f"Write two sentences about {topic}."}] for topic in TOPICS]
PAGE_QUESTION = "Give me three tips for staying healthy."
MAX_TOKENS = 32
TIMEOUT = 120  # seconds a client waits for its whole answer

# the page's sampling fields, greedy with the penalties off (it opens with llama-server's and a repeat penalty of 1.1)
SAMPLING_OFF = tuple(SamplingParams().values().values())


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """What `ppd chat` serves: the page and /v1 on one Gradio server, one ModelHost (a line of 8), with glibc's
    malloc arenas capped as `ppd chat` caps them before its server threads start (without: each of the 17 request
    threads keeps a partly free arena of its own: RSS grew 11% over the burst here, 6% with the cap)."""
    limit_malloc_arenas()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    service = ModelHost(engine)
    store = ConversationStore(tmp_path_factory.mktemp("conversations"))
    app = build_app(service, store)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               app_kwargs={"routes": api_routes(service)})
    yield f"http://127.0.0.1:{port}", service, store
    app.close()
    engine.loaded.backend.close()


def streamed(client: openai.OpenAI, messages) -> str:
    stream = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=MAX_TOKENS, stream=True)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def test_sixteen_streaming_clients_and_a_page_answer_at_once(chat_server):
    from gradio_client import Client

    url, service, store = chat_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    sequential = [streamed(client, messages) for messages in QUESTIONS]  # one at a time, first
    engine = service.engine
    plain = engine.generate(engine.chat_ids([{"role": "user", "content": PAGE_QUESTION}]), "plain", MAX_TOKENS)
    page_expected = plain.text + (LENGTH_LIMIT if plain.stop_reason == "length" else "")  # as its bubble shows it
    gc.collect()
    rss_before = psutil.Process().memory_info().rss

    results: list = [None] * len(QUESTIONS)
    start = threading.Barrier(len(QUESTIONS) + 1)

    def call(index):
        start.wait()
        try:
            results[index] = ("answer", streamed(client, QUESTIONS[index]))
        except openai.APIStatusError as error:
            results[index] = (error.status_code, error.response.headers.get("retry-after"), error.body)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(QUESTIONS))]
    for thread in threads:
        thread.start()
    page = Client(f"{url}/", verbose=False)
    job = page.submit(PAGE_QUESTION, "", MAX_TOKENS, True, "lossless", False, "", *SAMPLING_OFF, api_name="/send")
    deadline = time.monotonic() + TIMEOUT
    while not service.queue.busy and not job.done():  # the page's answer first, then all 16 clients at once
        assert time.monotonic() < deadline, "the page's answer did not start"
        time.sleep(0.005)
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a client hung"
    page_updates = job.result(timeout=TIMEOUT) and list(job.outputs())

    answers = [i for i, r in enumerate(results) if r[0] == "answer"]
    refused = [r for r in results if r[0] != "answer"]
    for index in answers:
        assert results[index][1] == sequential[index]  # each answer equals its own sequential answer
    for status, retry_after, body in refused:
        assert status == 503 and int(retry_after) >= 1 and body["code"] == "server_busy"
    chats = [u[0] for u in page_updates if isinstance(u[0], list) and u[0]]
    page_busy = not chats
    if page_busy:  # the line was full: one update, a busy notice, the message kept in the textbox
        assert len(page_updates) == 1 and page_updates[0][3].startswith("ppd is busy")
    else:  # the page got its answer
        content = chats[-1][-1]["content"]
        assert (content if isinstance(content, str) else content[0]["text"]) == page_expected
    assert len(answers) + (not page_busy) >= 1 + service.queue.max_waiting  # none refused while the line had room
    took = time.monotonic() - began

    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["running"] == 0 and not health["busy"] and health["waiting"] == 0
    assert streamed(client, QUESTIONS[0]) == sequential[0]  # served as before
    gc.collect()
    rss_after = psutil.Process().memory_info().rss
    print(f"16 streaming API clients + 1 page answer: {len(answers)} API answers, {len(refused)} 503s, page "
          f"{'busy' if page_busy else 'answered'}, {took:.1f} s; RSS {rss_before / 2**20:.0f} MB before, "
          f"{rss_after / 2**20:.0f} MB after")
    assert rss_after <= 1.10 * rss_before, (rss_before, rss_after)
