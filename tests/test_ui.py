"""The chat app launched for real: gradio_client against its API, and Chromium clicking its UI."""

import json
import time

import pytest

from app.cli import main
from app.history import ConversationStore
from app.model_host import ModelHost
from app.ui import build_app
from ppd_core import Engine, EngineConfig, SamplingParams
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port


# the page's sampling fields, greedy with the penalties off (it opens with llama-server's and a repeat penalty of 1.1)
SAMPLING_OFF = tuple(SamplingParams().values().values())


def text_of(content) -> str:
    """Chatbot message content: a string, or (Gradio 6) a list of typed parts."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def slow_down(service, monkeypatch, seconds: float) -> None:
    """At most a decoding step every ``seconds`` from ``service`` for this test: its answers stream long enough for a
    browser to watch them."""
    decode = service.decode

    def slow_decode(*args, **kwargs):
        for event in decode(*args, **kwargs):
            yield event
            time.sleep(seconds)

    monkeypatch.setattr(service, "decode", slow_decode)


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    """The app on the default model on the llama.cpp backend, on localhost; a quick calibration so the button
    test stays short."""
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    service = ModelHost(engine, calibration_options=dict(prompts=2, max_new_tokens=24, contexts=(128,), repeats=1))
    store = ConversationStore(tmp_path_factory.mktemp("conversations"))
    app = build_app(service, store)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/", service, store
    app.close()


def test_gradio_client_streams_the_answer_of_ppd_generate(running_app, capsys):
    from gradio_client import Client

    url, service, store = running_app
    question = "Name the capital city of France."
    client = Client(url, verbose=False)
    job = client.submit(question, "", 48, True, "lossless", False, "", *SAMPLING_OFF, api_name="/send")
    updates = list(job)
    chats = [u[0] for u in updates if isinstance(u[0], list) and u[0]]  # the last update only refreshes the list
    answers = [text_of(c[-1]["content"]) for c in chats if c[-1]["role"] == "assistant"]
    assert len({a for a in answers if a}) >= 2  # the answer grew over several updates: streamed

    code = main(["generate", question, "--max-new-tokens", "48", "--json", "--tree", "medium", "--backend", "llamacpp"])
    expected = json.loads(capsys.readouterr().out)["text"]
    assert code == 0 and answers[-1] == expected and "Paris" in expected
    saved = store.list()
    assert saved and {**saved[0].messages[-1], "model": None} == {"role": "assistant", "content": expected, "model": None}
    assert saved[0].messages[-1]["model"] == service.engine.loaded.name  # the model that wrote it, saved with it


def test_browser_chat_stop_compare_and_calibrate(running_app, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, service, store = running_app
    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install chromium (make test does it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(url)
        message = page.locator("#message textarea")
        readout, note = page.locator("#readout"), page.locator("#note")

        # an empty message is refused politely
        page.locator("#send").click()
        expect(note).to_contain_text("Please type a message first.", timeout=30_000)

        # a streamed answer with a live speed readout
        message.fill("Give me three tips for staying healthy.")
        page.locator("#send").click()
        expect(readout).to_contain_text("(streaming)", timeout=120_000)
        bot = page.locator("#chat [data-testid='bot']").last
        expect(bot).not_to_be_empty()
        expect(readout).to_contain_text("tokens per step")
        expect(readout).not_to_contain_text("(streaming)", timeout=180_000)
        assert "tokens/s" in readout.inner_text()

        # Stop ends a running answer
        message.fill("Write a long story about a dragon who learns to bake bread.")
        page.locator("#send").click()
        expect(readout).to_contain_text("(streaming)", timeout=120_000)
        page.locator("#stop").click()
        expect(note).to_contain_text("Stopped.", timeout=30_000)

        # compare with plain decoding: both answers side by side, with a verdict
        page.locator("#compare").click()
        expect(page.locator("#verdict")).to_contain_text("identical text", timeout=240_000)
        expect(page.locator("#plain-answer")).to_contain_text("Plain decoding")
        expect(page.locator("#ppd-answer")).to_contain_text("PPD")
        page.screenshot(path=str(tmp_path / "after-compare.png"), full_page=True)

        # one-click calibration with its progress, then the curve and the expected speedup
        page.get_by_text("Calibration", exact=True).click()
        page.locator("#calibrate").click()
        expect(page.locator("#calibration")).to_contain_text("Expected speedup", timeout=240_000)
        page.screenshot(path=str(tmp_path / "after-calibration.png"), full_page=True)
        browser.close()
    assert (tmp_path / "after-compare.png").stat().st_size > 10_000
    assert service.engine.plan.profile is not None and service.engine.plan.family.name.startswith("calibrated-")


def test_send_is_off_and_enter_sends_nothing_while_an_answer_streams(running_app, monkeypatch):
    """As the peers do: while an answer streams Send is disabled, Stop shown, and Enter in the box sends nothing (the
    text stays there); once it ends, Send is back, Stop hidden, and Enter sends the text. Before, Send stayed enabled
    and the second message queued behind the first (lost if the page was then closed). The page's timer ticks
    throughout (a background line), as while a calibration or a training runs: it must not turn Send back on."""
    from playwright.sync_api import expect, sync_playwright

    url, service, store = running_app
    slow_down(service, monkeypatch, 0.05)  # the answer streams for seconds on any machine
    # ``background`` is a property of the host's calibration job: the class's, for this test only
    monkeypatch.setattr(type(service), "background", property(lambda _: "A background job runs (test)."))
    story, fruit = "Tell me a long story about a lighthouse keeper and a whale.", "Name one fruit."

    def conversation() -> list:
        found = [c.messages for c in store.list() if c.messages and c.messages[0]["content"] == story]
        return found[0] if found else []

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(url)
        message, send, stop = page.locator("#message textarea"), page.locator("#send"), page.locator("#stop")
        readout, users = page.locator("#readout"), page.locator("#chat [data-testid='user']")
        expect(page.locator("#startup")).to_contain_text("A background job runs", timeout=60_000)  # the timer ticks
        page.locator("#clear").click()  # the first page after launch may reopen the latest conversation
        expect(users).to_have_count(0)
        expect(send).to_be_enabled()
        expect(stop).to_be_hidden()

        message.fill(story)
        message.press("Enter")
        expect(readout).to_contain_text("(streaming)", timeout=120_000)
        expect(send).to_be_disabled()
        expect(stop).to_be_visible()
        message.fill(fruit)
        message.press("Enter")
        send.click(force=True)  # a click on the disabled button: nothing either
        page.wait_for_timeout(2500)  # two ticks of the page's timer; an answer to it would have joined the line
        expect(readout).to_contain_text("(streaming)")  # still the first answer
        expect(send).to_be_disabled()
        assert service.queue.waiting == 0
        expect(message).to_have_value(fruit)  # kept in the box
        expect(users).to_have_count(1)

        stop.click()
        expect(page.locator("#note")).to_contain_text("Stopped.", timeout=30_000)
        expect(send).to_be_enabled()
        expect(stop).to_be_hidden()
        expect(message).to_have_value(fruit)
        message.press("Enter")  # now it is sent
        expect(users).to_have_count(2, timeout=30_000)
        expect(users.last).to_contain_text(fruit)
        expect(message).to_have_value("")
        deadline = time.monotonic() + 180
        while len(conversation()) < 4 or "interrupted" in conversation()[-1]:  # its answer, whole and saved
            assert time.monotonic() < deadline, conversation()
            time.sleep(0.1)
        expect(send).to_be_enabled()
        expect(stop).to_be_hidden()
        browser.close()
    assert [(m["role"], m["content"] if m["role"] == "user" else "") for m in conversation()] == [
        ("user", story), ("assistant", ""), ("user", fruit), ("assistant", "")]


def test_two_pages_keep_two_conversations(running_app, tmp_path):
    """Two pages, one message each, then reload: both conversations are saved, listed and reopen with their own messages."""
    from playwright.sync_api import expect, sync_playwright

    url, service, store = running_app
    questions = ["Name one fruit.", "Name one color."]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        first = browser.new_page()
        first.goto(url)  # the first page after launch may reopen the latest conversation: not the case under test
        expect(first.locator("#device")).to_contain_text("Device", timeout=60_000)
        pages = [browser.new_page(viewport={"width": 1400, "height": 1100}) for _ in questions]
        for page, question in zip(pages, questions):
            page.goto(url)
            expect(page.locator("#device")).to_contain_text("Device", timeout=60_000)
            page.locator("#message textarea").fill(question)
            page.locator("#send").click()
            expect(page.locator("#readout")).to_contain_text("tokens/s", timeout=120_000)
            expect(page.locator("#readout")).not_to_contain_text("(streaming)", timeout=180_000)

        saved = {c.messages[0]["content"]: c for c in store.list() if c.messages}
        assert set(questions) <= set(saved), saved.keys()
        assert saved[questions[0]].id != saved[questions[1]].id
        for question in questions:
            assert [m["role"] for m in saved[question].messages] == ["user", "assistant"]

        page = pages[0]
        page.reload()
        expect(page.locator("#device")).to_contain_text("Device", timeout=60_000)
        for question in questions:  # in the sidebar's list
            page.locator("#saved label").filter(has_text=question).first.click()
            bot = page.locator("#chat [data-testid='bot']").last
            user = page.locator("#chat [data-testid='user']")
            expect(user).to_have_count(1, timeout=30_000)
            expect(user.first).to_contain_text(question)
            expect(bot).to_contain_text(text_of(saved[question].messages[1]["content"])[:20])
        page.screenshot(path=str(tmp_path / "reopened.png"), full_page=True)
        browser.close()


def test_the_page_comes_first_and_shows_the_model_loading_and_calibrating(tmp_path, monkeypatch):
    """As `ppd chat` starts on a device with no profile: the page is served before the model exists, shows the load,
    keeps Send off (the API answers 503 with Retry-After) and opens sending once the model is ready; the calibration
    then runs in the background beside the answers (they decode plainly meanwhile), shown on the page until done."""
    import threading

    import httpx
    from playwright.sync_api import expect, sync_playwright

    from app.api import api_routes

    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "profiles")  # a first launch
    service = ModelHost(None, calibration_options=dict(prompts=2, max_new_tokens=24, contexts=(128,), repeats=2),
                          calibrate_in_background=True)
    app = build_app(service, ConversationStore(tmp_path / "conversations"))
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               app_kwargs={"routes": api_routes(service)})
    url, page_open, seen = f"http://127.0.0.1:{port}", threading.Event(), set()

    def load(progress):  # what `ppd chat` loads: no calibration before the first answers
        assert page_open.wait(120)
        engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False),
                             progress)
        assert engine.plan.profile is None and engine.plan.family.name == "plain"  # plain decoding until calibrated
        return engine

    loader = threading.Thread(target=lambda: service.attach(service.startup.run(load)))
    loader.start()
    try:
        response = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
        assert response.status_code == 503 and response.headers["retry-after"] == "5"
        assert response.json()["error"]["code"] == "model_not_ready" and "Loading the model" in response.json()["error"]["message"]
        assert httpx.get(f"{url}/health").status_code == 503
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url + "/")
            startup, send = page.locator("#startup"), page.locator("#send")
            expect(startup).to_contain_text("Loading the model", timeout=30_000)
            expect(send).to_be_disabled()
            page_open.set()
            expect(startup).to_contain_text("Calibrating this device in the background", timeout=120_000)
            seen.add(startup.inner_text().split(":")[0])
            expect(send).to_be_enabled(timeout=10_000)  # answers do not wait for the calibration
            expect(page.locator("#device")).to_contain_text("Device")
            page.locator("#message textarea").fill("Name the capital city of France.")
            send.click()
            expect(page.locator("#readout")).to_contain_text("tokens/s", timeout=120_000)
            deadline = time.monotonic() + 240
            while service.background is not None or startup.inner_text().strip():
                seen.add(startup.inner_text().split(":")[0])
                assert time.monotonic() < deadline, seen
                time.sleep(0.2)
            assert any(line.startswith("Calibrating this device in the background") for line in seen), seen
            browser.close()
        assert service.engine.plan.profile is not None and service.engine.plan.family.name.startswith("calibrated-")
        assert list((tmp_path / "profiles").glob("SmolLM2-135M-Instruct-*.json"))  # saved: the next launch uses it
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    finally:
        page_open.set()
        loader.join(240)
        app.close()
        if service.ready:
            service.engine.close()


def test_highlight_marks_accepted_guesses_in_two_colours_while_streaming_and_after(running_app, monkeypatch):
    """With "Highlight" ticked (and the repeat penalty off, so the answer copies), the answer under the chat shows its
    accepted guesses marked, prompt tokens yellow and copied tokens blue, while it streams and once it has ended
    (Chromium, 1400 px); the chat's own message and what is saved stay plain text."""
    from playwright.sync_api import expect, sync_playwright

    url, service, store = running_app
    slow_down(service, monkeypatch, 0.03)  # the answer streams long enough to be seen
    service.engine.replan(lookup=4)
    question = "List the days of the week, then list them again in the same order."
    colours = "Array.from(document.querySelectorAll('#marked mark')).map(m => getComputedStyle(m).backgroundColor)"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url)
            expect(page.locator("#send")).to_be_enabled(timeout=60_000)
            page.locator("#highlight input").check()
            page.locator("#greedy").click()
            page.get_by_text("Repetition penalties (llama.cpp's)").click()
            penalty = page.locator("#repeat-penalty input[type='number']")
            penalty.fill("1")
            penalty.press("Enter")
            page.locator("#message textarea").fill(question)
            page.locator("#send").click()
            readout = page.locator("#readout")
            expect(readout).to_contain_text("(streaming)", timeout=120_000)
            expect(page.locator("#marked mark").first).to_be_visible(timeout=60_000)
            assert "(streaming)" in readout.inner_text()  # marked while it streams
            expect(readout).not_to_contain_text("(streaming)", timeout=180_000)
            found = set(page.evaluate(colours))
            assert {"rgb(255, 224, 102)", "rgb(191, 227, 255)"} <= found, found  # yellow and blue, once it ended
            bot = page.locator("#chat [data-testid='bot']").last.inner_text()
            browser.close()
    finally:
        service.engine.replan(lookup=None)
    assert "<mark" not in bot and "mark>" not in bot
    saved = [c for c in store.list() if c.messages and c.messages[0]["content"] == question][0].messages[-1]["content"]
    assert "<mark" not in saved and "Monday" in saved and "Monday" in bot
