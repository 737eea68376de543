"""Closed to other pages and hosts: the page and the API of `ppd chat` (and `ppd serve`'s API) refuse a foreign
``Host`` (DNS rebinding) and a foreign browser ``Origin`` (another local page) with 403, grant CORS to no one but
the origins allowed, and keep working for their own page (Chromium), same-origin calls and clients that send no
``Origin`` (curl, the ``openai`` client)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time

import httpx
import openai
import pytest

from app.guard import Policy
from app.history import ConversationStore
from app.model_host import ModelHost
from app.server import make_server, server_app
from app.ui import build_app
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

FOREIGN = "http://localhost:9999"
QUESTION = [{"role": "user", "content": "Name the capital city of France."}]


# --- the policy, alone ----------------------------------------------------------------------------------------


def test_hosts_a_loopback_server_answers_to():
    policy = Policy("127.0.0.1", hosts=["ppd.example"])
    for host in ("127.0.0.1:7860", "localhost:7860", "LOCALHOST", "[::1]:7860", "127.0.0.2", "chat.localhost:1",
                 "ppd.example:7860"):
        assert policy.host_allowed(host), host
    for host in ("attacker.example", "attacker.example:7860", "192.168.1.2:7860", "localhost.attacker.example",
                 "127.0.0.1.attacker.example", ""):
        assert not policy.host_allowed(host), host


def test_a_wildcard_address_answers_to_ip_literals_and_this_machines_names_only():
    import socket

    policy = Policy("0.0.0.0", hosts=["*.lan"])
    for host in ("192.168.1.2:7860", "[fe80::1]:7860", "box.lan", socket.gethostname()):
        assert policy.host_allowed(host), host
    assert not policy.host_allowed("attacker.example")


def test_origins_the_server_own_and_the_allowed_ones():
    policy = Policy("127.0.0.1", origins=["http://localhost:3000", "chrome-extension://*"])
    assert policy.origin_allowed("http://127.0.0.1:7860", "127.0.0.1:7860", "http")
    assert policy.origin_allowed("http://localhost", "localhost", "http")  # default ports on both sides
    assert policy.origin_allowed("http://localhost:3000/", "127.0.0.1:7860", "http")
    assert policy.origin_allowed("chrome-extension://abcdef", "127.0.0.1:7860", "http")
    # the scheme is not compared: only ppd itself (or a TLS proxy in front of it) serves pages from its host and port
    assert policy.origin_allowed("https://127.0.0.1:7860", "127.0.0.1:7860", "http")
    for origin in (FOREIGN, "http://127.0.0.1:7861", "null", "file://", "http://[::1]:7860",
                   "http://localhost:3000.attacker.example", "garbage"):
        assert not policy.origin_allowed(origin, "127.0.0.1:7860", "http"), origin


# --- `ppd chat`'s server, for real ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """What `ppd chat` serves (``server_app``: the guard, the API, the page), on the default model; the loader
    records every model the page asks for."""
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    loads: list[str] = []

    def loader(spec, progress):
        loads.append(spec)
        raise AssertionError(f"the page was made to load {spec}")

    service = ModelHost(engine, loader=loader)
    page = build_app(service, ConversationStore(tmp_path_factory.mktemp("conversations")))
    port = free_port()
    server = make_server(server_app(service, Policy("127.0.0.1"), page=page), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", service, page, loads
    server.should_exit = True
    thread.join(10)
    engine.close()


def fn_index(page, elem_id: str) -> int:
    """The page function run by the component ``elem_id`` (what a foreign page would post to)."""
    for index, fn in page.fns.items():
        if any(getattr(page.blocks.get(target), "elem_id", None) == elem_id for target, _ in fn.targets):
            return index
    raise AssertionError(f"no function for #{elem_id}")


def predict(url: str, index: int, data: list, headers: dict) -> httpx.Response:
    return httpx.post(f"{url}/gradio_api/run/predict", headers={"Content-Type": "application/json", **headers},
                      json={"fn_index": index, "data": data, "session_hash": "x"}, timeout=60)


def refused(response: httpx.Response) -> bool:
    return (response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
            and "access-control-allow-origin" not in response.headers)


def test_a_foreign_origin_can_neither_preflight_nor_call_the_page_and_the_model_stays(chat_server):
    url, service, page, loads = chat_server
    preflight = httpx.options(f"{url}/gradio_api/run/predict", headers={
        "Origin": FOREIGN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert refused(preflight)
    # the reproduction: a foreign page made the app load /etc/passwd as its model
    assert refused(predict(url, fn_index(page, "load-model"), ["/etc/passwd", None], {"Origin": FOREIGN}))
    # the page's chat, training and comparison functions, and the queue the page itself uses
    assert refused(predict(url, fn_index(page, "send"), ["hi", None], {"Origin": FOREIGN}))
    assert refused(predict(url, fn_index(page, "train"), ["Train PPD tokens for this model", None], {"Origin": FOREIGN}))
    assert refused(predict(url, fn_index(page, "compare"), [None, "", 16, 1.0, 64, 0.0, 0.0], {"Origin": "null"}))
    joined = httpx.post(f"{url}/gradio_api/queue/join", headers={"Origin": FOREIGN},
                        json={"fn_index": fn_index(page, "send"), "data": ["hi"], "session_hash": "x"})
    assert refused(joined)
    assert refused(httpx.get(f"{url}/config", headers={"Origin": FOREIGN}))
    time.sleep(0.5)
    assert loads == [] and service.spec == "default" and not service.switching and service.ready


def test_a_foreign_host_is_refused_everywhere_dns_rebinding(chat_server):
    url, _, page, loads = chat_server
    for host in ("attacker.example", "attacker.example:7860"):
        assert refused(httpx.get(f"{url}/", headers={"Host": host}))
        assert refused(httpx.get(f"{url}/health", headers={"Host": host}))
        assert refused(httpx.post(f"{url}/v1/chat/completions", headers={"Host": host},
                                  json={"messages": QUESTION, "max_tokens": 4}))
        # the page's own origin, as a rebinding page sends it: still its Host that is refused
        assert refused(predict(url, fn_index(page, "load-model"), ["/etc/passwd", None],
                               {"Host": host, "Origin": f"http://{host}"}))
    assert loads == []


def test_the_api_refuses_foreign_origins_and_answers_its_own_and_originless_clients(chat_server):
    url, service, _, _ = chat_server
    body = {"messages": QUESTION, "max_tokens": 12, "temperature": 0}
    assert refused(httpx.post(f"{url}/v1/chat/completions", headers={"Origin": FOREIGN}, json=body))
    assert refused(httpx.get(f"{url}/v1/models", headers={"Origin": FOREIGN}))
    assert refused(httpx.options(f"{url}/v1/chat/completions",
                                 headers={"Origin": FOREIGN, "Access-Control-Request-Method": "POST"}))
    own = httpx.post(f"{url}/v1/chat/completions", headers={"Origin": url}, json=body, timeout=120)
    plain = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)  # curl: no Origin
    assert own.status_code == plain.status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    answer = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=12, temperature=0)
    text = answer.choices[0].message.content
    assert own.json()["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"] == text
    assert "Paris" in text
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


ATTACK_PAGE = """<!doctype html><title>waiting</title><script>
const target = "%s";
async function attack() {
  const results = [];
  for (const [path, body] of [["/gradio_api/run/predict", %s], ["/v1/chat/completions", %s]]) {
    try {  // a CORS request: the preflight is refused
      const response = await fetch(target + path, {method: "POST", headers: {"Content-Type": "application/json"},
                                                   body: JSON.stringify(body)});
      results.push("cors:" + response.status);
    } catch (error) { results.push("cors:blocked"); }
    try {  // a "simple" request, which needs no preflight: the server must still refuse to run it
      await fetch(target + path, {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
                                  body: JSON.stringify(body)});
      results.push("simple:sent");
    } catch (error) { results.push("simple:blocked"); }
  }
  document.title = results.join(" ");
}
attack();
</script>"""


def test_the_page_works_in_chromium_and_a_foreign_page_cannot_drive_it(chat_server, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    url, service, page, loads = chat_server
    load_call = {"fn_index": fn_index(page, "load-model"), "data": ["/etc/passwd", None], "session_hash": "x"}
    chat_call = {"messages": QUESTION, "max_tokens": 4}
    html = (ATTACK_PAGE % (url, json.dumps(load_call), json.dumps(chat_call))).encode()

    class AttackPage(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args):
            pass

    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AttackPage)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    decodes = []
    decode = service.decode
    monkeypatch.setattr(service, "decode", lambda *args, **kwargs: decodes.append(args) or decode(*args, **kwargs))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            tab = browser.new_page(viewport={"width": 1400, "height": 1100})
            tab.goto(f"http://localhost:{attacker.server_address[1]}/")  # another local page
            expect(tab).not_to_have_title("waiting", timeout=30_000)
            assert tab.title() == "cors:blocked simple:sent cors:blocked simple:sent", tab.title()
            time.sleep(0.5)
            assert decodes == [] and loads == []  # nothing the foreign page sent ran
            # ppd's own page, in the same browser, still answers
            tab.goto(f"{url}/")
            tab.locator("#message textarea").fill("Name the capital city of France.")
            tab.locator("#send").click()
            expect(tab.locator("#readout")).to_contain_text("tokens/s", timeout=120_000)
            # the page samples with the model's recommended temperature: any answer, not a given one
            expect(tab.locator("#chat [data-testid='bot']").last).to_contain_text(re.compile(r"[A-Za-z]{3}"),
                                                                               timeout=120_000)
            browser.close()
    finally:
        attacker.shutdown()
    assert loads == [] and service.spec == "default" and len(decodes) == 1  # the own page's answer


def test_an_allowed_origin_gets_cors_and_others_still_do_not(chat_server):
    """`ppd serve --allow-origin http://localhost:3000` (a chat front-end on another port): its preflight and calls
    are granted; any other origin is still refused."""
    _, service, _, _ = chat_server
    allowed = "http://localhost:3000"
    app = server_app(service, Policy("127.0.0.1", origins=[allowed]))
    port = free_port()
    server = make_server(app, "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            time.sleep(0.05)
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": allowed, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == allowed
        assert "content-type" in preflight.headers["access-control-allow-headers"]
        call = httpx.post(f"{url}/v1/chat/completions", headers={"Origin": allowed},
                          json={"messages": QUESTION, "max_tokens": 4}, timeout=120)
        assert call.status_code == 200 and call.headers["access-control-allow-origin"] == allowed
        assert refused(httpx.post(f"{url}/v1/chat/completions", headers={"Origin": FOREIGN},
                                  json={"messages": QUESTION, "max_tokens": 4}))
    finally:
        server.should_exit = True
        thread.join(10)
