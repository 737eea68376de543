"""Issue 40, item 5: the chat's own trash icon (Gradio's Chatbot "Clear") starts a new conversation, as the New chat
button (then "Clear") does; before, it only emptied the display, and the next message brought the "cleared" turns
back, to the page and to the model (Chromium on the real page, the default model on llama.cpp)."""

import re
import time

import pytest

from app.history import ConversationStore
from app.model_host import ModelHost
from app.ui import build_app
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

pytestmark = pytest.mark.slow

FIRST, SECOND = "Name one fruit.", "Name one color."


def answered(store: ConversationStore, question: str, seconds: float = 180.0):
    """The saved conversation whose last turn is ``question`` with its whole answer (waits for it)."""
    deadline = time.monotonic() + seconds
    while True:
        for conversation in store.list():
            messages = conversation.messages
            if (len(messages) >= 2 and messages[-2] == {"role": "user", "content": question}
                    and messages[-1]["role"] == "assistant" and "interrupted" not in messages[-1]):
                return conversation
        assert time.monotonic() < deadline, [c.messages for c in store.list()]
        time.sleep(0.1)


def test_the_chats_trash_icon_starts_a_new_conversation_as_clear_does(tmp_path, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install chromium (make browser does it)"
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    prompts: list[list[int]] = []  # what the model was given, answer by answer
    answer_request = engine.answer  # every answer the page asks for: a checked request, passed whole

    def seen(request, *args, **kwargs):
        prompts.append(list(request.ids))
        return answer_request(request, *args, **kwargs)

    monkeypatch.setattr(engine, "answer", seen)
    service = ModelHost(engine)
    store = ConversationStore(tmp_path / "conversations")
    app = build_app(service, store)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/")
            message, send = page.locator("#message textarea"), page.locator("#send")
            users, bots = page.locator("#chat [data-testid='user']"), page.locator("#chat [data-testid='bot']")
            expect(page.locator("#device")).to_contain_text("Device", timeout=60_000)

            message.fill(FIRST)
            send.click()
            first = answered(store, FIRST)
            expect(users).to_have_count(1, timeout=30_000)
            expect(send).to_be_enabled(timeout=30_000)
            assert len(prompts) == 1 and first.messages[0] == {"role": "user", "content": FIRST}

            page.locator("#chat button[aria-label='Clear']").click()  # the chat's own trash icon
            expect(users).to_have_count(0)
            expect(bots).to_have_count(0)
            message.fill(SECOND)
            send.click()
            second = answered(store, SECOND)
            assert prompts[-1] == engine.chat_ids([{"role": "user", "content": SECOND}])  # the cleared turns unseen
            expect(users).to_have_count(1, timeout=30_000)  # the page shows the new exchange only
            expect(users.first).to_contain_text(SECOND)
            expect(bots).to_have_count(1)
            for word in re.findall(r"[A-Za-z]{3,}", second.messages[-1]["content"])[:3]:  # as rendered (Markdown)
                expect(bots.first).to_contain_text(word)
            assert [m["role"] for m in second.messages] == ["user", "assistant"] and second.id != first.id

            saved = {c.id: c.messages for c in store.list()}  # the cleared conversation stays saved, as with Clear
            assert saved[first.id] == first.messages and [m["role"] for m in first.messages] == ["user", "assistant"]
            expect(page.locator("#saved label").filter(has_text=FIRST)).to_have_count(1)  # the sidebar's list
            expect(page.locator("#saved label").filter(has_text=SECOND)).to_have_count(1)
            browser.close()
    finally:
        app.close()
        engine.close()
