"""A page's answer stays in the conversation it began in: New chat, opening another conversation or deleting one,
pressed while the request is being prepared or the answer streams, is refused with one line and the answer ends in
its own conversation (before: New chat pressed right after Send replaced the conversation under the answer, which
failed with "IndexError: list index out of range" and lost it; the chaos run's first round in CI). The page's
handlers are called directly on the default model (llama.cpp), on a page's components built but not served."""

from __future__ import annotations

import gradio as gr
import pytest

from app.chat import Chat
from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_answers import AnswerHandlers
from app.page_conversations import WAIT, ConversationHandlers
from app.page_layout import build_page, new_session
from ppd_core.sampling.fields import NAMES

pytestmark = pytest.mark.slow

QUESTION, TOKENS = "Name three rivers in Europe.", 24


@pytest.fixture
def handlers(llama_default, tmp_path) -> AnswerHandlers:
    with gr.Blocks():
        page = build_page()
    host = ModelHost(llama_default)
    return AnswerHandlers(Chat(host), ConversationHandlers(host, ConversationStore(tmp_path), page), page)


def greedy_settings() -> tuple:
    """The page's widgets' values (``SettingsPanel.inputs``' order): PPD on, greedy, ``TOKENS`` new tokens."""
    return ("", TOKENS, True, "lossless", False, "", *[0.0 if name == "temperature" else None for name in NAMES])


def test_new_chat_open_and_delete_while_the_request_is_prepared_leave_the_answer_in_its_conversation(
        handlers, llama_default, monkeypatch):
    conversations, session = handlers.conversations, new_session()
    page = conversations.page
    other = new_session().conversation
    other.messages += [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    conversations.store.save(other)
    asked = session.conversation
    refusals = []
    start = handlers._start

    def clicks_meanwhile(*args, **kwargs):  # the clicks land while Send prepares the request
        refusals.append(conversations.clear(session))
        refusals.append(conversations.open(other.id, session))
        session.deleting = asked.id
        refusals.append(conversations.delete_conversation(session))
        return start(*args, **kwargs)

    monkeypatch.setattr(handlers, "_start", clicks_meanwhile)
    shown = list(handlers.send(QUESTION, session, *greedy_settings()))

    assert [refused[page.chat.note] for refused in refusals] == [WAIT] * 3
    assert session.conversation is asked and [m["role"] for m in asked.messages] == ["user", "assistant"]
    ids = llama_default.chat_ids([{"role": "user", "content": QUESTION}])
    assert asked.messages[1]["content"] == llama_default.generate(ids, "plain", TOKENS).text
    assert "interrupted" not in asked.messages[1]
    assert not any("interrupted" in str(update.get(page.chat.note, "")) for update in shown)
    assert conversations.store.load(asked.id).messages == asked.messages  # saved, whole

    cleared = conversations.clear(session)  # once it has ended, New chat is a new conversation
    assert cleared[page.chat.chatbot] == [] and session.conversation is not asked and not session.conversation.messages
