"""The suffix drafter's per-model memory on the real engine (the default GGUF on llama.cpp, suffix among the sources
as `--drafters` turns it on): an answer's tokens join the model's earlier answers, greedy answers stay plain decoding's,
and the page's delete paths (a saved conversation deleted, an exchange deleted: ``ConversationHandlers``, through
``ModelHost`` to ``Engine.forget_answers``) make the model forget them. The handlers are called directly, on a page's
components built but not served (no browser)."""

from __future__ import annotations

import gradio as gr
import pytest

from app.history import Conversation, ConversationStore
from app.model_host import ModelHost
from app.page_conversations import ConversationHandlers
from app.page_layout import build_page, new_session

pytestmark = pytest.mark.slow

POEM, COLOURS, PLANETS, FRUIT = ("Write a short poem about the sea.", "List three colours and what they remind you of.",
                                 "Name the planets of the solar system.", "Describe an apple in two sentences.")
TOKENS = 32


@pytest.fixture
def suffix_on(llama_default):
    """The default model with lookup, grammar and suffix beside the prompt tokens, its memory emptied first."""
    engine, before = llama_default, llama_default.drafters
    engine.drafters = ("lookup", "grammar", "suffix")
    engine.forget_answers()
    yield engine
    engine.drafters = before


def answer(engine, question: str) -> list[int]:
    """PPD's greedy answer, checked against plain decoding's."""
    ids = engine.chat_ids([{"role": "user", "content": question}])
    ppd = engine.generate(ids, "ppd", TOKENS)
    assert ppd.tokens == engine.generate(ids, "plain", TOKENS).tokens, question
    return ppd.tokens


def holds(memory, tokens: list[int]) -> bool:
    """Whether the memory's earlier answers hold ``tokens`` as one run."""
    return memory.automaton.match(tokens).length == len(tokens)


def page_handlers(engine, tmp_path) -> ConversationHandlers:
    with gr.Blocks():
        page = build_page()
    return ConversationHandlers(ModelHost(engine), ConversationStore(tmp_path), page)


def saved_session(handlers: ConversationHandlers, *exchanges: tuple[str, str]):
    session = new_session()
    for question, reply in exchanges:
        session.conversation.messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    handlers.store.save(session.conversation)
    return session


def test_answers_join_the_suffix_memory_and_the_page_deleting_them_forgets_them(suffix_on, tmp_path):
    engine = suffix_on
    handlers = page_handlers(engine, tmp_path)
    first = answer(engine, POEM)
    memory = engine._drafter_memory["suffix"]
    assert memory.pending[:TOKENS] == first and memory.tokens == 0  # written until the next answer starts
    second = answer(engine, COLOURS)
    assert holds(memory, first) and memory.pending[:TOKENS] == second

    session = saved_session(handlers, (POEM, engine.tokenizer.decode(first, skip_special_tokens=True)))
    saved = handlers.store.path(session.conversation.id)
    handlers.ask_delete(session)
    handlers.delete_conversation(session)  # Delete, confirmed
    assert not saved.exists()
    assert memory.tokens == 0 and memory.pending is None and not memory.answers
    third = answer(engine, PLANETS)
    answer(engine, FRUIT)
    assert holds(memory, third) and not holds(memory, first) and not holds(memory, second)

    session = saved_session(handlers, (PLANETS, engine.tokenizer.decode(third, skip_special_tokens=True)), (FRUIT, "…"))
    session.selected = (1, "assistant", session.conversation.messages[1]["content"])
    handlers.delete(session)  # one exchange: the planets' question and answer
    assert [m["content"] for m in handlers.store.load(session.conversation.id).messages] == [FRUIT, "…"]
    assert memory.tokens == 0 and memory.pending is None and not holds(memory, third)
