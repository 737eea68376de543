"""Issue 43, items 2 and 5, on the real page (Chromium, the default model on llama.cpp): a reload reopens the page's
conversation and its system prompt; conversations of one first message are told apart in the list; a sent message
edited is answered again from there; one answer regenerated, one message deleted (its exchange with it), the last
exchange undone; a context meter under the chat. After each change the model is given exactly the turns the page shows
(``engine.stream``'s prompt ids against ``engine.chat_ids`` of the saved conversation)."""

import time
from dataclasses import replace

import pytest

from app.history import Conversation, ConversationStore
from app.model_host import ModelHost
from app.ui import build, build_app
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

pytestmark = pytest.mark.slow

MAX_NEW = 32  # answers kept short: the module runs in a few minutes on two slow cores
WIDE, NARROW = {"width": 1400, "height": 1100}, {"width": 420, "height": 900}
FRUIT, COLOR, ANIMAL, CITY = "Name one fruit.", "Name one color.", "Name one animal.", "Name one city."


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """The app and a Chromium, shared by the module; ``prompts`` collects the ids the model is given, answer by answer."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium is needed: apt-get install chromium (make browser does it)"
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium"))
    prompts: list[list[int]] = []
    answer_request = engine.answer  # every answer the page asks for: a checked request, passed whole

    def seen(request, *args, **kwargs):
        prompts.append(list(request.ids))
        return answer_request(request, *args, **kwargs)

    engine.answer = seen
    service = ModelHost(engine)
    store = ConversationStore(tmp_path_factory.mktemp("conversations"))
    app, handlers = build(service, store)
    answer = handlers.chat.answer
    handlers.chat.answer = lambda messages, settings, stop=None: answer(
        messages, replace(settings, max_new_tokens=min(settings.max_new_tokens, MAX_NEW)), stop=stop)
    port = free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            yield f"http://127.0.0.1:{port}/", browser, engine, store, prompts
            browser.close()
    finally:
        app.close()
        engine.close()


class Page:
    """One browser profile's page of the app, with what the tests look at."""

    def __init__(self, running, viewport=WIDE):
        from playwright.sync_api import expect

        self.url, browser, self.engine, self.store, self.prompts = running
        self.context = browser.new_context(viewport=viewport)  # its own localStorage: another person's browser
        self.page = self.context.new_page()
        self.page.goto(self.url)
        self.message, self.send = self.page.locator("#message textarea"), self.page.locator("#send")
        self.users = self.page.locator("#chat [data-testid='user']")
        self.bots = self.page.locator("#chat [data-testid='bot']")
        self.meter = self.page.locator("#context")
        expect(self.page.locator("#device")).to_contain_text("Device", timeout=60_000)

    def ask(self, question: str) -> Conversation:
        """Send ``question`` and wait for its whole answer, shown and saved."""
        since = time.time()
        self.message.fill(question)
        self.send.click()
        return self.answered(question, since)

    def answered(self, question: str, since: float, seconds: float = 180.0) -> Conversation:
        """The conversation saved after ``since`` whose last turn is ``question`` with its whole answer, once the page
        has it (Send back on)."""
        from playwright.sync_api import expect

        deadline = time.monotonic() + seconds
        while True:
            for conversation in self.store.list():
                messages = conversation.messages
                if (conversation.updated >= since and len(messages) >= 2 and messages[-2] == {"role": "user", "content": question}
                        and messages[-1]["role"] == "assistant" and "interrupted" not in messages[-1]):
                    expect(self.send).to_be_enabled(timeout=30_000)
                    expect(self.page.locator("#stop")).to_be_hidden()
                    return self.store.load(conversation.id)
            assert time.monotonic() < deadline, [c.messages for c in self.store.list()]
            time.sleep(0.1)

    def shows(self, conversation: Conversation) -> None:
        """The chat shows ``conversation``'s turns, and nothing else."""
        from playwright.sync_api import expect

        questions = [m["content"] for m in conversation.messages if m["role"] == "user"]
        expect(self.users).to_have_count(len(questions), timeout=30_000)
        expect(self.bots).to_have_count(len(conversation.messages) - len(questions))
        for shown, question in zip(self.users.all(), questions):
            expect(shown).to_contain_text(question)

    def model_saw(self, conversation: Conversation, system: str = "") -> None:
        """The model's last prompt was exactly ``conversation``'s turns before its last answer."""
        turns = [{"role": m["role"], "content": m["content"]} for m in conversation.messages[:-1]]
        system_turn = [{"role": "system", "content": system}] if system else []
        assert self.prompts[-1] == self.engine.chat_ids(system_turn + turns)

    def used(self, conversation: Conversation, system: str = "") -> int:
        turns = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
        return len(self.engine.chat_ids(([{"role": "system", "content": system}] if system else []) + turns)) if turns else 0

    def meter_says(self, used: int) -> None:
        from playwright.sync_api import expect

        limit = self.engine.max_context
        expect(self.meter).to_contain_text(f"Context: {used:,} of {limit:,} tokens ({used / limit:.0%})", timeout=30_000)

    def click_message(self, locator) -> None:
        """Click a message in the chat: the page offers Delete and Answer again from here."""
        from playwright.sync_api import expect

        locator.click()
        expect(self.page.locator("#selection")).to_be_visible(timeout=10_000)

    def close(self) -> None:
        self.context.close()


def test_a_reload_shows_the_pages_conversation_and_its_system_prompt(running):
    """Before: a reload showed an empty chat (only the first page after launch reopened the latest conversation), and
    the conversation was only in the collapsed list. Another browser still opens its own, new, conversation."""
    from playwright.sync_api import expect

    page = Page(running)
    system = "Answer in one short sentence."
    page.page.get_by_label("System prompt").fill(system)
    page.ask(FRUIT)
    conversation = page.ask(COLOR)
    page.page.reload()
    expect(page.page.locator("#device")).to_contain_text("Device", timeout=60_000)
    page.shows(conversation)
    expect(page.page.get_by_label("System prompt")).to_have_value(system)
    page.meter_says(page.used(conversation, system))
    page.ask(ANIMAL)  # and it goes on from there, with its system prompt
    latest = page.store.load(conversation.id)
    assert [m["content"] for m in latest.messages if m["role"] == "user"] == [FRUIT, COLOR, ANIMAL]
    page.model_saw(latest, system)

    other = Page(running)  # another browser: a new conversation, not this one
    expect(other.users).to_have_count(0)
    other.close()
    page.close()


def test_conversations_of_one_first_message_are_told_apart_by_a_short_title_and_their_time(running):
    """Before: "May 14 10:03 · <the first message, 60 characters>", so two conversations begun alike the same minute
    read the same. Now: a short title, then the time in words, to the second (or numbered) where two would read alike."""
    from playwright.sync_api import expect

    url, browser, engine, store, prompts = running
    long = "Please tell me everything you know about the history of the lighthouse keepers of Scotland."
    for first in (CITY, CITY, long):
        store.save(Conversation(messages=[{"role": "user", "content": first}, {"role": "assistant", "content": "Ok."}]))
    page = Page(running)
    entries = page.page.locator("#saved label")  # the sidebar's list
    cities = entries.filter(has_text=CITY)
    expect(cities).to_have_count(2)
    labels = [label.strip() for label in cities.all_inner_texts()]
    assert labels[0] != labels[1] and all(label.startswith(f"{CITY} · today ") for label in labels), labels
    lighthouse = entries.filter(has_text="Please tell me").inner_text().strip()
    title = lighthouse.split(" · ")[0]
    assert long.startswith(title.rstrip("…")) and title.endswith("…") and len(title) <= 41, lighthouse
    cities.first.click()  # and it opens
    expect(page.users).to_have_count(1, timeout=30_000)
    expect(page.users.first).to_contain_text(CITY)
    page.close()


def test_an_edited_message_is_answered_again_from_there(running):
    """The pencil on a sent message: the conversation after it goes, it is answered again as edited (Send off and Stop
    shown meanwhile), saved, and the model sees exactly the turns shown. Before, the chat had no pencil."""
    from playwright.sync_api import expect

    page = Page(running)
    page.ask(FRUIT)
    before = page.ask(COLOR)
    asked = len(page.prompts)
    page.users.first.hover()
    page.page.locator("#chat button[aria-label='Edit']").first.click()  # the first message's pencil
    editor = page.page.locator("#chat textarea.edit-textarea")
    editor.fill(ANIMAL)
    since = time.time()
    page.page.locator("#chat button[aria-label='Submit']").first.click()
    after = page.answered(ANIMAL, since)
    assert after.id == before.id and len(page.prompts) == asked + 1
    assert [m["content"] for m in after.messages if m["role"] == "user"] == [ANIMAL]
    page.shows(after)
    page.model_saw(after)
    page.meter_says(page.used(after))
    page.page.reload()  # what the page shows is what is saved
    expect(page.page.locator("#device")).to_contain_text("Device", timeout=60_000)
    page.shows(after)
    page.close()


def test_one_answer_is_regenerated_and_the_last_one_retried(running):
    """A click on an earlier answer, then "Answer again from here": the conversation is cut before that answer and
    answered again; the last answer's Retry icon answers its question again. Before: only the last could be."""
    page = Page(running)
    page.ask(FRUIT)
    page.ask(COLOR)
    asked = len(page.prompts)
    page.click_message(page.bots.first)
    since = time.time()
    page.page.locator("#answer-again").click()
    again = page.answered(FRUIT, since)
    assert [m["content"] for m in again.messages if m["role"] == "user"] == [FRUIT] and len(page.prompts) == asked + 1
    page.shows(again)
    page.model_saw(again)

    page.ask(COLOR)
    page.bots.last.hover()
    since = time.time()
    page.page.locator("#chat button[aria-label='Retry']").click()
    retried = page.answered(COLOR, since)
    assert [m["content"] for m in retried.messages if m["role"] == "user"] == [FRUIT, COLOR]
    assert len(page.prompts) == asked + 3
    page.shows(retried)
    page.model_saw(retried)
    page.close()


def test_one_message_is_deleted_with_its_exchange_and_the_last_undone_at_420_px(running):
    """On a phone-wide page: a click on a question, then Delete, removes it and its answer (the turns still
    alternate); the model then sees what is shown. The last answer's Undo takes its exchange back and puts the
    question in the box. Before: no message could be deleted."""
    from playwright.sync_api import expect

    page = Page(running, NARROW)
    page.ask(FRUIT)
    page.ask(COLOR)
    page.click_message(page.users.first)
    expect(page.page.locator("#selected")).to_contain_text(FRUIT)
    page.page.locator("#delete-message").click()
    expect(page.users).to_have_count(1, timeout=30_000)
    expect(page.page.locator("#selection")).to_be_hidden()
    kept = page.store.list()[0]
    assert [m["content"] for m in kept.messages if m["role"] == "user"] == [COLOR]
    assert [m["role"] for m in kept.messages] == ["user", "assistant"]
    page.shows(kept)
    page.meter_says(page.used(kept))
    line = page.meter.locator("p").evaluate("e => parseFloat(getComputedStyle(e).lineHeight) || 24")
    assert page.meter.bounding_box()["height"] <= 2.5 * line  # two lines at most on a phone

    after = page.ask(ANIMAL)
    page.model_saw(after)  # the deleted exchange is gone for the model too
    assert [m["content"] for m in after.messages if m["role"] == "user"] == [COLOR, ANIMAL]

    page.bots.last.hover()
    page.page.locator("#chat button[aria-label='Undo']").click()
    expect(page.message).to_have_value(ANIMAL, timeout=30_000)
    expect(page.users).to_have_count(1)
    assert page.store.load(after.id).messages == kept.messages
    page.meter_says(page.used(kept))
    page.close()


def test_the_context_meter_follows_the_conversation_in_two_lines_at_most(running):
    """Under the chat: the tokens the conversation takes of the model's context by its own template, after loading,
    an answer and Clear; at 1400 px the meter is one line, the model picker's label (which says local paths work) too.
    Before: no meter, and the picker did not say it takes local paths."""
    from playwright.sync_api import expect

    page = Page(running)
    page.page.locator("#clear").click()
    page.meter_says(0)
    conversation = page.ask(FRUIT)
    page.meter_says(page.used(conversation))
    assert page.used(conversation) > 10

    def lines(locator) -> float:
        return locator.evaluate("e => parseFloat(getComputedStyle(e).lineHeight) || 24")

    assert page.meter.bounding_box()["height"] <= 1.5 * lines(page.meter.locator("p"))
    label, info = page.page.locator("#model [data-testid='block-info']"), page.page.locator("#model").get_by_text("local .gguf")
    expect(label).to_contain_text("local path")
    expect(info).to_be_visible()
    assert label.bounding_box()["height"] <= 1.5 * lines(label) and info.bounding_box()["height"] <= 2.5 * lines(info)
    page.page.locator("#clear").click()
    page.meter_says(0)
    page.close()
