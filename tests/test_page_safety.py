"""Issue 50, items 4, 5 and 11 (part), on what `ppd chat` serves (``server_app``: the guard, the API, the page) in
Chromium: the model's and the user's text never runs as script on the page (the highlight view put the answer's text
into the page's HTML unescaped), no other site can frame the page (clickjacking), and the page says where its API is."""

from __future__ import annotations

import http.server
import json
import threading
import time

import httpx
import pytest

from app.guard import Policy
from app.history import ConversationStore
from app.model_host import ModelHost
from app.server import make_server, server_app
from app.ui import api_line, build_app
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

pytestmark = pytest.mark.slow

FLAG = "ppdPwned"  # what an injected handler would set
PAYLOAD = f"<img src=x onerror=window.{FLAG}=1>"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`ppd chat`'s app on the default model (llama.cpp), on a free port; yields its URL and conversation store."""
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    service = ModelHost(engine)
    store = ConversationStore(tmp_path_factory.mktemp("conversations"))
    page = build_app(service, store, api=api_line())
    port = free_port()
    server = make_server(server_app(service, Policy("127.0.0.1"), page=page), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", store
    server.should_exit = True
    thread.join(10)
    engine.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install chromium (make browser does it)"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def test_an_answer_holding_markup_is_shown_as_text_in_the_highlight_view_and_everywhere_else(served, browser):
    """The answer is forced by the JSON schema box (a ``const`` string holding an ``<img onerror>``), decoded plainly
    (PPD off: every token the model's own, the tokens the highlight view left unescaped), with Highlight on; the user's
    message holds the same markup (the chat, the conversations list, the clicked message's line show it), and so does a
    refused JSON schema the note and a toast quote. Before, the highlight view ran the handler: the window flag was set.
    Now the markup is text wherever the page shows it."""
    from playwright.sync_api import expect

    url, store = served
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url)
    expect(page.locator("#send")).to_be_enabled(timeout=60_000)
    page.locator("#highlight input").check()
    page.locator("#ppd input").uncheck()
    page.locator("#json-schema textarea").fill(json.dumps({"const": PAYLOAD}))
    question = f"Repeat this: {PAYLOAD}"
    page.locator("#message textarea").fill(question)
    page.locator("#send").click()
    expect(page.locator("#chat [data-testid='bot']").last).to_contain_text("onerror", timeout=120_000)
    expect(page.locator("#readout")).not_to_contain_text("(streaming)", timeout=120_000)
    expect(page.locator("#marked")).to_contain_text("Accepted guesses", timeout=30_000)
    expect(page.locator("#saved")).to_contain_text("Repeat this", timeout=30_000)
    page.locator("#chat [data-testid='user']").last.click()  # the clicked message's line quotes it
    expect(page.locator("#selected")).to_contain_text("Repeat this", timeout=30_000)
    time.sleep(1.0)  # an image error fires at once: give it time all the same
    assert page.evaluate(f"window.{FLAG}") is None
    expect(page.locator("#marked")).to_contain_text(PAYLOAD)  # the markup shown as text, whole
    # a refusal quoting the user's text: in the note and in a toast
    page.locator("#json-schema textarea").fill(json.dumps({"type": PAYLOAD}))
    page.locator("#message textarea").fill("Hello")
    page.locator("#send").click()
    expect(page.locator("#note")).to_contain_text(f"unrecognized type {PAYLOAD}", timeout=30_000)
    expect(page.get_by_text("unrecognized type").first).to_be_visible()
    time.sleep(1.0)
    assert page.evaluate(f"window.{FLAG}") is None
    assert page.locator("#marked img, #chat img[src='x'], #saved img, #selected img").count() == 0
    saved = [c for c in store.list() if c.messages and c.messages[0]["content"] == question][0]
    assert json.loads(saved.messages[-1]["content"]) == PAYLOAD  # the answer the schema forced, as the model wrote it
    page.close()


def test_every_response_forbids_framing(served):
    url, _ = served
    for path in ("/", "/health", "/v1/models", "/config", "/nothing-here"):
        response = httpx.get(f"{url}{path}")
        assert response.headers.get("x-frame-options") == "DENY", path
        assert response.headers.get("content-security-policy") == "frame-ancestors 'none'", path
    refused = httpx.get(f"{url}/", headers={"Host": "attacker.example"})  # the guard's own 403 too
    assert refused.status_code == 403 and refused.headers.get("x-frame-options") == "DENY"


def test_a_foreign_page_cannot_frame_the_page(served, browser):
    """A page on another origin frames ppd's page over a button of its own (the clickjacking set-up). Before, the frame
    showed the page, Send and all; now Chromium refuses to render it: the frame holds no part of the page."""
    url, _ = served
    html = f'<!doctype html><title>framing</title><iframe id="ppd" src="{url}/" width="1200" height="900"></iframe>'

    class FramingPage(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html.encode())

        def log_message(self, *args):
            pass

    framing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FramingPage)
    threading.Thread(target=framing.serve_forever, daemon=True).start()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(f"http://localhost:{framing.server_address[1]}/")  # another origin: localhost, another port
        deadline = time.monotonic() + 30
        frame = None
        while frame is None and time.monotonic() < deadline:
            frame = next((f for f in page.frames if f is not page.main_frame), None)
            time.sleep(0.1)
        assert frame is not None, "the framing page made no frame"
        time.sleep(3.0)  # the page, were it shown, renders its Send button in well under this
        assert frame.locator("#send").count() == 0
        assert frame.evaluate("document.title") != "ppd chat"
        page.close()
    finally:
        framing.shutdown()


def test_the_page_says_where_its_api_is_and_a_client_reaches_it_there(served, browser):
    from playwright.sync_api import expect

    url, _ = served
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url)
    line = page.locator("#api")
    expect(line).to_contain_text(f"{url}/v1", timeout=60_000)
    expect(line).to_contain_text("OpenAI-compatible")
    assert line.is_visible() and line.bounding_box()["y"] < 300  # at the top of the page, not under the fold
    shown = line.inner_text().split("API:", 1)[1].split()[0].strip("`")
    models = httpx.get(f"{shown}/models")
    assert models.status_code == 200 and models.json()["data"]
    page.close()
