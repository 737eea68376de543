"""Issue 50, page items 2 and 5, below the page: a model without a chat template ends its answer at the turn markers of
the ChatML ppd chose for it (the engine cuts them, for the page, the API and `ppd generate` alike), and an answer cut
at the length limit goes on from exactly its tokens (Continue).

The base model is built here (tests/base_gguf.py): a bigram model that writes "Hello from Paris.<assistant>" over and
over, as a base model writes chat markers when a chat reaches it as ChatML.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.chat import Chat
from app.chat_settings import ChatSettings
from app.model_host import ModelHost
from base_gguf import SHOWN, write_base_gguf
from ppd_core import Engine, EngineConfig
from ppd_core.text import text_stream
from ppd_core.turn_end import TurnEnd, turn_stops
from tiny_gguf import default_vocabulary

QUESTIONS = ("What is the capital of France?", "Write a haiku about rain.", "Name three colors.")
MARKERS = ("<assistant>", "<|im_start|>", "<|im_end|>", "<", ">")


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory) -> Path:
    from ppd_core.loading import default_model_file

    return write_base_gguf(tmp_path_factory.mktemp("base") / "tiny-base.gguf", default_vocabulary(default_model_file()))


@pytest.fixture(scope="module")
def base_engine(base_gguf):
    engine = Engine.load(EngineConfig(model=str(base_gguf), backend="llamacpp", tree="auto", auto_calibrate=False,
                                      threads=2, lookup=4))
    yield engine
    engine.close()


def test_a_base_model_writes_chat_markers_and_a_chat_ends_its_answer_at_them(base_engine):
    """Before: the answer went on to the token limit, "<assistant>" and all. Now it ends at the marker, the marker not
    shown, stop reason "eos" (a finish_reason "stop" in the API); PPD's tokens are plain decoding's up to the stop."""
    assert not base_engine.has_chat_template and "<assistant>" in turn_stops(base_engine.tokenizer)
    for question in QUESTIONS:
        ids = base_engine.chat_ids([{"role": "user", "content": question}])
        raw = base_engine.generate(ids, "plain", 40)  # the text itself, as the old code showed it
        assert "<assistant>" in raw.text and raw.stop_reason == "length", raw.text
        ended = {mode: base_engine.generate(ids, mode, 40, chat=True) for mode in ("ppd", "plain")}
        for mode, result in ended.items():
            assert result.text == SHOWN and result.stop_reason == "eos", (mode, result.text)
            assert not any(marker in result.text for marker in MARKERS)
        assert ended["ppd"].tokens == ended["plain"].tokens == raw.tokens[: len(ended["plain"].tokens)]
        assert base_engine.tokenizer.decode(ended["ppd"].tokens).endswith(".<assistant>")  # cut at the completing token
        assert ended["ppd"].stats.new_tokens == len(ended["ppd"].tokens)


def test_the_streamed_pieces_never_show_a_piece_of_a_marker(base_engine):
    """What may begin a marker ("<", "<ass") waits until it is known: the pieces shown join to the answer, no "<"."""
    ids = base_engine.chat_ids([{"role": "user", "content": QUESTIONS[0]}])
    for mode in ("ppd", "plain"):
        events = list(base_engine.stream(ids, mode, 40, chat=True))
        assert "".join(event.delta for event in events) == events[-1].text == SHOWN
        assert all("<" not in event.text for event in events)
    limited = base_engine.generate(ids, "plain", 5, chat=True)  # the limit inside "<assistant>": all of it shown
    assert limited.text == SHOWN + "<" and limited.stop_reason == "length"


@pytest.mark.parametrize("text, shown", [
    ("Paris.<|im_end|>\n<|im_start|>user\nmore", "Paris."),
    ("Fine, thanks.\nUser: and you?", "Fine, thanks."),
    ("User: hello", ""),  # the answer's start is a line start
    ("Sure.\n<assistant>\nSure.", "Sure.\n"),
    ("Use x<y and a <b> tag; User: is fine mid-line.", None),  # no marker: all of it
])
def test_turn_markers_end_the_text_at_the_token_that_completes_them(base_engine, text, shown):
    tokenizer = base_engine.tokenizer
    tokens = tokenizer.encode(text, add_special_tokens=False, parse_special=False)  # the markers as plain text
    stream, ends = text_stream(tokenizer), TurnEnd(turn_stops(tokenizer))
    fed = ends.add(stream, tokens, final=True)
    if shown is None:
        assert not ends.hit and fed == len(tokens) and stream.text[: ends.shown] == text
        return
    assert ends.hit and stream.text[: ends.shown] == shown
    assert not ends.hit or any(stop in "\n" + tokenizer.decode(tokens[:fed]) for stop in ends.stops)
    assert not any(stop in "\n" + tokenizer.decode(tokens[: fed - 1]) for stop in ends.stops)  # the first such token


def test_what_may_begin_a_marker_is_held_back_until_the_answer_ends(base_engine):
    tokenizer = base_engine.tokenizer
    tokens = tokenizer.encode("Paris.\nUs", add_special_tokens=False)
    stream, ends = text_stream(tokenizer), TurnEnd(turn_stops(tokenizer))
    ends.add(stream, tokens, final=False)
    assert stream.text[: ends.shown] == "Paris." and not ends.hit
    ends.add(stream, tokenizer.encode("ually", add_special_tokens=False), final=True)
    assert stream.text[: ends.shown] == "Paris.\nUsually"


def test_a_model_with_its_own_template_decodes_as_before(llama_default):
    """Its end-of-turn token ends its answers: no stop text, the same tokens with ``chat`` as without."""
    assert turn_stops(llama_default.tokenizer) == ()
    ids = llama_default.chat_ids([{"role": "user", "content": QUESTIONS[0]}])
    assert llama_default.generate(ids, "ppd", 24, chat=True).tokens == llama_default.generate(ids, "ppd", 24).tokens


def test_continue_goes_on_from_the_answers_own_tokens_as_a_larger_limit_would(llama_default):
    """An answer cut at 16 tokens, continued by 16: the same tokens, and text, as one answer of 32 (greedy), PPD on;
    the model's prompt is the conversation with the partial answer, not a new turn."""
    chat = Chat(ModelHost(llama_default))
    question = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
    settings = ChatSettings(max_new_tokens=16)
    first = list(chat.answer(question, settings))[-1]
    assert first.stop_reason == "length" and first.unfinished is not None
    prompt = llama_default.chat_ids(question)
    assert first.unfinished.ids[: len(prompt)] == prompt and first.unfinished.text == first.text
    answered = question + [{"role": "assistant", "content": first.text}]
    second = list(chat.resume(answered, settings, known=first.unfinished))[-1]
    whole = llama_default.generate(prompt, "plain", 32, chat=True)
    assert second.stop_reason == "length" and second.unfinished.ids == prompt + whole.tokens
    assert second.text == whole.text and second.text.startswith(first.text) and len(second.text) > len(first.text)
    # without the known tokens (after a reload, another model since): the partial answer's text, encoded
    again = list(chat.resume(answered, settings))[-1]
    assert again.text.startswith(first.text) and again.unfinished.ids[: len(prompt)] == prompt


def test_continue_refuses_a_conversation_without_an_answer(llama_default):
    from ppd_core.errors import PpdError

    with pytest.raises(PpdError, match="no answer to continue"):
        Chat(ModelHost(llama_default)).resume([{"role": "user", "content": "Hi"}], ChatSettings())


def test_the_api_ends_a_base_models_chat_answer_at_the_marker_and_leaves_completions_as_written(base_engine):
    """With the ``openai`` client against the served API: a chat answer (streamed too) stops at the marker with
    finish_reason "stop"; a raw completion has no chat template, so no marker of one: the text as written."""
    import openai

    from app.api import create_api
    from test_api import start

    server, thread, port = start(create_api(ModelHost(base_engine)), "127.0.0.1")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
        for question in QUESTIONS:
            answer = client.chat.completions.create(model="ppd", max_tokens=40, temperature=0,
                                                    messages=[{"role": "user", "content": question}])
            assert answer.choices[0].message.content == SHOWN and answer.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(model="ppd", max_tokens=40, temperature=0, stream=True,
                                                     messages=[{"role": "user", "content": QUESTIONS[1]}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SHOWN
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        completion = client.completions.create(model="ppd", prompt="Hi", max_tokens=12, temperature=0)
        assert "<assistant>" in completion.choices[0].text and completion.choices[0].finish_reason == "length"
    finally:
        server.should_exit = True
        thread.join(15)
