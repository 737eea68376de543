"""Issue 50, page items 10 and 11 (part), items 6 and 7 (part), on the real page (Chromium, the default model on
llama.cpp): the saved conversations in a sidebar at the top (the open one marked, search, rename, delete), "New chat"
for "Clear", a stopped answer marked in its bubble, inline ``$…$`` maths, a conversation file of the wrong shape set
aside with one line while the page loads the others, and exports written 0600."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from app.history import Conversation, ConversationStore
from app.model_host import ModelHost
from app.ui import build_app
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from test_ui import slow_down
from ports import free_port

pytestmark = pytest.mark.slow

CITY, FRUIT = "Name one city.", "Name one fruit."
LIGHTHOUSE = "Tell me about the lighthouse keepers of Scotland."
STORY = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """The page on the default model, with a store of three saved conversations, and a Chromium."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install chromium (make browser does it)"
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    service = ModelHost(engine)
    store = ConversationStore(tmp_path_factory.mktemp("conversations"))
    for first in (LIGHTHOUSE, FRUIT, CITY):  # CITY the newest
        store.save(Conversation(messages=[{"role": "user", "content": first}, {"role": "assistant", "content": "Ok."}]))
        time.sleep(0.01)
    app = build_app(service, store)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            yield f"http://127.0.0.1:{port}/", browser, service, store
            browser.close()
    finally:
        app.close()
        engine.close()


def open_page(running, viewport=None):
    from playwright.sync_api import expect

    url, browser, _, _ = running
    context = browser.new_context(viewport=viewport or {"width": 1400, "height": 1100})
    page = context.new_page()
    page.goto(url)
    expect(page.locator("#device")).to_contain_text("Device", timeout=60_000)
    return page


def entry(page, text: str):
    """The saved conversation's entry in the sidebar's list whose label holds ``text``."""
    return page.locator("#saved label").filter(has_text=text)


def test_the_sidebar_lists_the_conversations_marks_the_open_one_and_searches_renames_and_deletes(running):
    """Before: "Clear" (read as deleting), the conversations in a collapsed accordion below Settings, the open one not
    marked, no search, rename or delete."""
    from playwright.sync_api import expect

    _, _, _, store = running
    page = open_page(running)
    expect(page.locator("#clear")).to_have_text("New chat")
    listed = page.locator("#saved")
    expect(listed).to_be_visible()  # no click needed, at the top of the page
    assert listed.bounding_box()["y"] < 400
    for first in (CITY, FRUIT, "lighthouse keepers"):  # titles: the first message, cut near 40 characters
        expect(entry(page, first)).to_have_count(1)
    assert listed.locator("label").first.inner_text().startswith(CITY)  # newest first

    entry(page, FRUIT).click()  # opens it, marked as the open one
    users = page.locator("#chat [data-testid='user']")
    expect(users).to_have_count(1, timeout=30_000)
    expect(users.first).to_contain_text(FRUIT)
    expect(entry(page, FRUIT).locator("input")).to_be_checked()
    expect(listed.locator("input:checked")).to_have_count(1)

    search = page.locator("#search-conversations textarea")
    search.press_sequentially("LIGHTHOUSE scotland")  # words in any case and order, as typed
    expect(listed.locator("label")).to_have_count(1, timeout=30_000)
    expect(entry(page, "lighthouse keepers")).to_have_count(1)
    search.fill("")
    expect(listed.locator("label")).to_have_count(3, timeout=30_000)

    fruit_id = next(c.id for c in store.list() if c.messages[0]["content"] == FRUIT)
    name = page.locator("#conversation-name textarea")
    name.fill("Fruit talk")
    page.locator("#rename").click()
    expect(entry(page, "Fruit talk")).to_have_count(1, timeout=30_000)
    expect(entry(page, "Fruit talk").locator("input")).to_be_checked()
    assert store.load(fruit_id).name == "Fruit talk" and store.load(fruit_id).messages[0]["content"] == FRUIT
    search.fill("fruit talk")  # found by its name
    expect(listed.locator("label")).to_have_count(1, timeout=30_000)
    search.fill("")

    page.locator("#delete-conversation").click()  # asked first: what goes
    expect(page.locator("#confirm-line")).to_contain_text("Fruit talk", timeout=30_000)
    expect(page.locator("#confirm-line")).to_contain_text("2 messages")
    page.locator("#cancel-delete").click()
    expect(page.locator("#confirm-line")).to_be_hidden()
    assert store.load(fruit_id).messages
    page.locator("#delete-conversation").click()
    page.locator("#confirm-delete-button").click()
    expect(page.locator("#note")).to_contain_text("Deleted", timeout=30_000)
    expect(entry(page, "Fruit talk")).to_have_count(0)
    expect(users).to_have_count(0)  # a new chat
    assert fruit_id not in {c.id for c in store.list()} and len(store.list()) == 2
    expect(listed.locator("input:checked")).to_have_count(0)  # the new chat is not saved yet
    page.context.close()


def test_a_stopped_answer_says_so_in_its_bubble_and_after_a_reload(running, monkeypatch):
    """Before: the note under the chat said "Stopped." until the next answer; the bubble said nothing."""
    from playwright.sync_api import expect

    _, _, service, store = running
    slow_down(service, monkeypatch, 0.05)
    page = open_page(running)
    page.locator("#clear").click()
    page.locator("#message textarea").fill(STORY)
    page.locator("#send").click()
    expect(page.locator("#readout")).to_contain_text("(streaming)", timeout=120_000)
    page.locator("#stop").click()
    bot = page.locator("#chat [data-testid='bot']").last
    expect(bot).to_contain_text("(stopped)", timeout=30_000)
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    saved = [c for c in store.list() if c.messages and c.messages[0]["content"] == STORY][0].messages[-1]
    assert saved.get("stopped") is True and "interrupted" not in saved and "(stopped)" not in saved["content"]
    page.reload()
    expect(page.locator("#chat [data-testid='bot']").last).to_contain_text("(stopped)", timeout=60_000)
    page.context.close()


def test_new_chat_pressed_while_an_answer_streams_waits_for_it(running, monkeypatch):
    """Before: New chat replaced the conversation under a streaming answer (one just sent failed with an IndexError).
    The refusal is a toast: the streaming answer's updates rewrite the note under the chat."""
    from playwright.sync_api import expect

    _, _, service, store = running
    slow_down(service, monkeypatch, 0.1)
    question = STORY + " Set it in a windmill."
    page = open_page(running)
    page.locator("#clear").click()
    expect(page.locator("#note")).to_have_text("", timeout=30_000)
    page.locator("#message textarea").fill(question)
    page.locator("#send").click()
    expect(page.locator("#readout")).to_contain_text("(streaming)", timeout=120_000)
    page.locator("#clear").click()
    expect(page.get_by_text("Wait for the answer to end.").first).to_be_visible(timeout=30_000)
    page.locator("#stop").click()
    bot = page.locator("#chat [data-testid='bot']").last
    expect(bot).to_contain_text("(stopped)", timeout=30_000)
    users = page.locator("#chat [data-testid='user']")
    expect(users).to_have_count(1)
    expect(users.first).to_contain_text("Set it in a windmill.")
    saved = [c for c in store.list() if c.messages and c.messages[0]["content"] == question]
    assert len(saved) == 1 and saved[0].messages[-1].get("stopped") is True and saved[0].messages[-1]["content"]
    expect(page.locator("#send")).to_be_enabled(timeout=30_000)
    page.locator("#clear").click()  # answered: a new chat now
    expect(users).to_have_count(0, timeout=30_000)
    page.context.close()


def test_inline_dollar_maths_is_rendered(running):
    """Before, only ``$$…$$`` was maths: ``$a^2 + b^2 = c^2$`` showed its dollars and carets."""
    from playwright.sync_api import expect

    _, _, _, store = running
    maths = Conversation(messages=[{"role": "user", "content": "What is Pythagoras' theorem?"},
                                   {"role": "assistant", "content": "It says $a^2 + b^2 = c^2$ for a right triangle."}])
    store.save(maths)
    page = open_page(running)
    entry(page, "Pythagoras").click()
    bot = page.locator("#chat [data-testid='bot']").last
    expect(bot).to_contain_text("right triangle", timeout=30_000)
    expect(bot.locator(".katex")).to_have_count(1)
    assert "$" not in bot.inner_text()
    page.context.close()


def test_conversation_files_of_the_wrong_shape_are_set_aside_and_the_page_lists_the_others(running, caplog):
    """Valid JSON with wrong types: a string ``updated``, a message without its role, a ``content`` of 5. Before, one
    such file broke every page load (the list sorted or titled them and raised)."""
    from playwright.sync_api import expect

    _, _, _, store = running
    good = Conversation(messages=[{"role": "user", "content": "A good one."}, {"role": "assistant", "content": "Yes."}])
    store.save(good)
    bad = {"string-updated": {"updated": "yesterday"}, "no-role": {"messages": [{"content": "hi"}]},
           "content-five": {"messages": [{"role": "user", "content": 5}]}}
    for name, change in bad.items():
        data = {"id": name, "messages": [{"role": "user", "content": name}], "system_prompt": "", "created": 1.0,
                "updated": 2.0, "revision": 1, **change}
        (store.folder / f"{name}.json").write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="app.history"):
        page = open_page(running)
        expect(entry(page, "A good one.")).to_have_count(1, timeout=30_000)
        expect(page.get_by_text("was set aside").first).to_be_visible(timeout=30_000)  # said on the page too
    for name in bad:
        assert not (store.folder / f"{name}.json").exists() and (store.folder / f"{name}.json.bad").exists()
    lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(lines) == 3 and all(len(line.splitlines()) == 1 for line in lines), lines
    assert good.id in {c.id for c in store.list()}
    page.context.close()


def test_exports_are_written_0600(running):
    """Before: exports were 0644 (in a private folder, then copied by Gradio into its shared temp folder)."""
    from playwright.sync_api import expect

    page = open_page(running)
    entry(page, CITY).click()
    expect(page.locator("#chat [data-testid='user']")).to_have_count(1, timeout=30_000)
    for button in ("Export JSON", "Export Markdown"):
        page.get_by_role("button", name=button).click()
        link = page.locator("#exported a[href*='file=']").first
        expect(link).to_be_attached(timeout=30_000)
        path = Path(unquote(link.get_attribute("href").split("file=", 1)[1]))
        deadline = time.monotonic() + 30
        while not path.suffix.endswith("json" if "JSON" in button else "md"):
            assert time.monotonic() < deadline, path
            time.sleep(0.2)
            path = Path(unquote(page.locator("#exported a[href*='file=']").first.get_attribute("href").split("file=", 1)[1]))
        assert path.is_file() and (os.stat(path).st_mode & 0o777) == 0o600, (path, oct(os.stat(path).st_mode))
        assert CITY in path.read_text()
    page.context.close()


def test_on_a_phone_the_sidebar_starts_closed_and_opens_from_its_toggle(running):
    """At 420 px an open sidebar would cover the chat: it starts closed, its toggle opens it over the page."""
    from playwright.sync_api import expect

    page = open_page(running, {"width": 420, "height": 900})
    expect(page.locator("#saved")).not_to_be_in_viewport(timeout=30_000)
    expect(page.locator("#message textarea")).to_be_visible()
    page.locator("#conversations .toggle-button").click()
    expect(page.locator("#saved")).to_be_in_viewport(timeout=30_000)
    expect(entry(page, CITY)).to_have_count(1)
    page.context.close()
