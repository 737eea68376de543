"""The page's JSON schema box: answers that follow it (and Compare's, both ways), one line for a box it cannot use,
free text with the box empty; grammar-forced guesses counted as their own source in the readout and the highlighter."""

import json

import jsonschema
import pytest

from app.highlight import GRAMMAR_MARK, LOOKUP_MARK, NEUTRAL_STYLE, PROMPT_MARK, Highlighter, mark
from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_layout import new_session
from app.page_text import marked_answer
from app.readout import AnswerSpeed
from app.ui import Handlers, build
from ppd_core.sampling.params import SamplingParams
from ppd_core.stats import GenerationStats, StepStats

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]}},
          "required": ["name", "age", "city"]}
QUESTION = "Extract the person as JSON: Anna is 31 and lives in Rome."
KEEP = {"__type__": "update"}


def settings(schema: str = "", max_new: int = 96, highlight: bool = False) -> tuple:
    """The page's settings inputs (``SettingsPanel.inputs``): PPD on, the schema box, then every sampling field off
    (greedy, penalties off)."""
    return ("", max_new, True, "lossless", highlight, schema, *SamplingParams().values().values())


@pytest.fixture()
def page(llama_default, tmp_path):
    """Handlers over the default GGUF (llama.cpp's grammar engine) and a new page."""
    llama_default.forget_conversation()
    return build(ModelHost(llama_default), ConversationStore(tmp_path / "c"))[1], new_session()


def answered(handlers: Handlers, session, message: str, inputs: tuple) -> tuple[str, str, str]:
    """``message`` sent from the page: (the answer on the page, the readout, the note) of its last update."""
    shown = {}
    for update in handlers.answers.send(message, session, *inputs):
        shown.update({component: value for component, value in update.items() if value != KEEP})
    chat = handlers.page.chat
    return shown[chat.chatbot][-1]["content"], shown.get(chat.readout), shown.get(chat.note)


def test_a_schema_in_the_box_constrains_the_answers_and_compare(page):
    handlers, session = page
    text, readout, note = answered(handlers, session, QUESTION, settings(json.dumps(PERSON), highlight=True))
    jsonschema.validate(json.loads(text), PERSON)
    assert "grammar " in readout and "grammar: " in readout and "follows the JSON schema" in note
    *_, compared = handlers.answers.compare(session, "", 96, 1.0, 64, 0.0, 0.0, json.dumps(PERSON))
    verdict = compared[handlers.page.compare.verdict]
    result = handlers.chat.last_comparison
    for answer in (result.plain_text, result.ppd_text):
        jsonschema.validate(json.loads(answer), PERSON)
    assert "; identical text." in verdict


@pytest.mark.parametrize("box, line", [
    ('{"type": "object",', "the JSON schema box does not hold JSON: "),
    ("[1, 2]", "the JSON schema box: a JSON schema is an object"),
    ('{"type": "string", "maxLength": -1}', "the JSON schema box: minItems, maxItems, minLength and maxLength"),
])
def test_a_box_it_cannot_use_is_one_line_and_the_message_stays_in_the_textbox(page, box, line):
    handlers, session = page
    answered(handlers, session, "Hello there.", settings(max_new=16))
    before = list(session.conversation.messages)
    updates = list(handlers.answers.send(QUESTION, session, *settings(box)))
    assert len(updates) == 1
    page, note = handlers.page, updates[0][handlers.page.chat.note]
    assert page.chat.message not in updates[0] and note.startswith(line) and "\n" not in note  # the textbox keeps the text
    assert session.conversation.messages == before == handlers.conversations.store.load(session.conversation.id).messages
    [refused] = handlers.answers.regenerate(session, *settings(box))  # Regenerate keeps the last answer
    assert refused[page.chat.note].startswith(line) and session.conversation.messages == before
    *_, compared = handlers.answers.compare(session, "", 16, 1.0, 64, 0.0, 0.0, box)
    assert compared[page.compare.verdict].startswith(line)


def test_an_empty_box_answers_free_text_as_before(page, llama_default):
    handlers, session = page
    text, readout, note = answered(handlers, session, "Hello there.", settings("  ", max_new=24))
    ids = llama_default.chat_ids([{"role": "user", "content": "Hello there."}])
    assert text == llama_default.generate(ids, "plain", 24).text
    assert "grammar" not in readout and "JSON schema" not in note


def test_every_source_is_marked_and_counted_by_its_name():
    """A path's accepted guesses are marked by their sources, whatever order the merge gave them; an unknown source gets
    a neutral mark with its name; the readout counts each source by name."""

    class Pieces:  # a tokenizer whose token ``n`` reads "wn "
        def text_stream(self):
            return type("Stream", (), {"add": lambda self, token: f"w{token} "})()

    step = StepStats(tokens=[1, 2, 3, 4, 5, 6], from_guesses=5, tree_tokens=20, seconds=0.01,
                     sources=["prompt tokens", "lookup", "grammar", "grammar", "suffix"],
                     drafted={"prompt tokens": 8, "lookup": 3, "grammar": 4, "suffix": 2},
                     notes={"lookup": "drafted 3 copied tokens (why)"})
    highlighter = Highlighter(Pieces())
    highlighter.add(step.tokens, step.sources)
    assert [source for _, source in highlighter.pieces] == [*step.sources, None]
    assert highlighter.html == (f"{PROMPT_MARK}w1 </mark>{LOOKUP_MARK}w2 </mark>{GRAMMAR_MARK}w3 </mark>"
                                f"{GRAMMAR_MARK}w4 </mark>{mark('suffix')}w5 </mark>w6 ")
    assert 'title="suffix"' in mark("suffix") and NEUTRAL_STYLE in mark("suffix")
    assert "forced by the JSON schema" in marked_answer(highlighter.html) and "other sources" in marked_answer(highlighter.html)
    assert "forced by" not in marked_answer(f"{PROMPT_MARK}w1 </mark>")

    stats = GenerationStats(prefill_seconds=0.1, decode_seconds=0.1)
    stats.add(step)
    assert stats.accepted == {"prompt tokens": 1, "lookup": 1, "grammar": 2, "suffix": 1}
    assert stats.accepted_by_depth == {("prompt tokens", 1): 1, ("lookup", 2): 1, ("grammar", 3): 1, ("grammar", 4): 1,
                                       ("suffix", 5): 1}
    details = AnswerSpeed(stats, True, True).details()
    assert "accepted per step: prompt tokens 1.00, lookup 1.00, grammar 2.00, suffix 1.00;" in details
    assert "lookup: 1 of 3 drafted tokens right; last step drafted 3 copied tokens (why)" in details
    assert "grammar: 2 of 4 drafted tokens right" in details and "suffix: 1 of 2 drafted tokens right" in details
    step.clip(3)  # a limit inside the guesses: the sources cut with them
    assert step.sources == ["prompt tokens", "lookup", "grammar"] and step.from_guesses == 3
