"""The chat app's logic without a browser: trimming, stopping, highlighting, comparison, history."""

import json
from pathlib import Path

import pytest

from app.chat import Chat
from app.chat_settings import ChatSettings
from app.highlight import LOOKUP_MARK, PROMPT_MARK, Highlighter
from app.history import Conversation, ConversationStore
from app.page_text import LENGTH_LIMIT, LIMITED
from app.model_host import ModelHost
from app.system_info import device_panel, guess_sources
from ppd_core import Engine, EngineConfig, SamplingParams


def shown(answer: dict) -> str:
    """A whole answer as its bubble shows it: its text, and the length limit's line when it ended there."""
    return answer["content"] + (LENGTH_LIMIT if answer.get(LIMITED) else "")


@pytest.fixture(scope="module")
def service(tiny_model_dir):
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", max_context=160))
    return ModelHost(engine)


@pytest.fixture(scope="module")
def chat(service):
    return Chat(service)


def page_handlers(host, store):
    """The page's handlers over ``host``, with the page's components (``handlers.page``) their updates are keyed by."""
    from app.ui import build

    return build(host, store)[1]


def user(text):
    return {"role": "user", "content": text}


def test_stream_matches_plain_greedy_generation(service, chat):
    messages = [user("Hello there")]
    updates = list(chat.answer(messages, ChatSettings(max_new_tokens=24)))
    ids = service.engine.chat_ids(messages)
    assert updates[-1].text == service.engine.generate(ids, "plain", 24).text
    assert updates[-1].stop_reason == "length" and "tokens/s" in updates[-1].readout
    assert all(u.stop_reason is None for u in updates[:-1])


def test_empty_message_is_refused(chat):
    with pytest.raises(ValueError, match="the message is empty"):
        list(chat.answer([user("   ")], ChatSettings()))


def test_long_conversations_are_trimmed_with_a_note(service, chat):
    settings = ChatSettings(max_new_tokens=32)
    turn = "tell me more about the history of this place " * 2
    messages = []
    for index in range(6):
        messages += [user(f"{index}: {turn}"), {"role": "assistant", "content": turn}]
    messages.append(user("and now?"))
    request, note = chat.prepare(messages, settings)
    ids = list(request.ids)
    assert request.max_new_tokens == 32 and len(ids) + 32 <= service.engine.max_context
    assert note.startswith("Trimmed the ") and "160-token context" in note
    assert service.engine.tokenizer.decode(ids).count("and now?") == 1
    with pytest.raises(ValueError, match="too long: .* tokens, but the model's context holds 160"):
        chat.prepare([user("word " * 400)], settings)


def test_stop_ends_the_answer_within_one_step(chat):
    requested = {"stop": False}
    steps = 0
    updates = []
    for update in chat.answer([user("Count to fifty")], ChatSettings(max_new_tokens=100), stop=lambda: requested["stop"]):
        updates.append(update)
        steps += 1
        if steps == 3:
            requested["stop"] = True
    assert len(updates) == 4  # three steps, then the final "stopped" update and nothing more
    assert updates[-1].stop_reason == "stopped" and "Stopped." in updates[-1].note
    assert updates[-1].stats.new_tokens < 100


def test_highlighter_marks_accepted_guesses(service):
    tokenizer = service.engine.tokenizer
    ids = tokenizer.encode(" the cat sat on the mat", add_special_tokens=False)
    highlighter = Highlighter(tokenizer)
    highlighter.add(ids[:3], ["prompt tokens"] * 2)  # two accepted guesses, then the model's own token
    highlighter.add(ids[3:])
    assert "".join(p for p, _ in highlighter.pieces) == tokenizer.decode(ids)
    assert [source for _, source in highlighter.pieces] == ["prompt tokens"] * 2 + [None] * (len(ids) - 2)
    assert highlighter.html.startswith(PROMPT_MARK)
    copied = Highlighter(tokenizer)
    copied.add(ids[:4], ["prompt tokens", "lookup", "lookup"])  # one prompt-token guess, two copied, the model's own
    assert [source for _, source in copied.pieces] == ["prompt tokens", "lookup", "lookup", None]
    assert copied.html.count(LOOKUP_MARK) == sum(1 for p, s in copied.pieces if s == "lookup" and p.strip())


def test_compare_runs_both_ways_and_tells_its_progress(chat):
    told = []
    result = chat.compare([user("Say something nice")], ChatSettings(max_new_tokens=20),
                             lambda mode, tokens, total: told.append((mode, tokens, total)))
    assert result.identical and result.ppd_text == result.plain_text
    assert result.speedup > 0 and "; identical text." in result.verdict() and "(measured)" not in result.verdict()
    first = "plain decoding" if result.first == "plain" else "PPD"
    assert told[0] == (first, 1, 20) and {mode for mode, _, _ in told} == {"plain decoding", "PPD"}
    assert [tokens for mode, tokens, _ in told if mode == "PPD"][-1] == result.ppd_stats.new_tokens


def test_history_round_trip_export_and_corrupt_files(tmp_path):
    store = ConversationStore(tmp_path / "c")
    first = Conversation(messages=[user("First question"), {"role": "assistant", "content": "An answer"}], system_prompt="Be brief.")
    store.save(first)
    second = Conversation(messages=[user("Second")])
    store.save(second)
    (store.folder / "broken.json").write_text("{oops")
    listed = store.list()
    assert [c.id for c in listed] == [second.id, first.id]  # newest first, the broken file skipped
    assert store.load(first.id) == first
    exported = json.loads(store.export(first, "json", tmp_path / "out").read_text())
    assert exported["messages"] == first.messages
    markdown = store.export(first, "md", tmp_path / "out").read_text()
    assert "# First question" in markdown and "An answer" in markdown and "Be brief." in markdown
    assert not list(store.folder.glob("*.tmp"))  # atomic writes leave nothing behind
    with pytest.raises(ValueError, match="bad conversation id"):
        store.path("../escape")


def test_a_failed_save_keeps_the_id_and_revision_and_the_retry_writes_the_same_file(tmp_path, monkeypatch):
    import app.history

    store = ConversationStore(tmp_path / "c")
    conversation = Conversation(messages=[user("Keep me")])
    store.save(conversation)
    saved_id, revision = conversation.id, conversation.revision
    conversation.messages.append({"role": "assistant", "content": "An answer"})
    real_write = app.history.atomic_write

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(app.history, "atomic_write", full_disk)
    with pytest.raises(OSError):
        store.save(conversation)
    assert (conversation.id, conversation.revision) == (saved_id, revision)
    assert store.load(saved_id).messages == [user("Keep me")]  # the previous file is still there
    monkeypatch.setattr(app.history, "atomic_write", real_write)
    store.save(conversation)  # the retry
    assert conversation.id == saved_id and [c.id for c in store.list()] == [saved_id]  # no fork
    assert store.load(saved_id).messages == conversation.messages and store.load(saved_id).revision == revision + 1


def test_every_page_gets_its_own_conversation(service, tmp_path):
    """Sessions made the way Gradio makes them (one SessionState per page) never share a conversation id."""
    from gradio.state_holder import SessionState

    from app.page_layout import Session
    from app.ui import build_app

    app = build_app(service, ConversationStore(tmp_path / "c"))
    state_id = next(key for key, block in app.blocks.items() if block.stateful)
    sessions = [SessionState(app)[state_id] for _ in range(3)]
    assert all(isinstance(s, Session) for s in sessions)
    assert len({s.conversation.id for s in sessions}) == 3
    assert len({id(s.conversation.messages) for s in sessions}) == 3  # nothing shared between pages


def test_no_save_replaces_another_conversation(tmp_path):
    import copy

    store = ConversationStore(tmp_path / "c")
    original = Conversation(messages=[user("First")])
    store.save(original)
    twin = copy.deepcopy(original)  # e.g. two pages holding the same conversation
    original.messages.append({"role": "assistant", "content": "from page one"})
    store.save(original)
    twin.messages.append({"role": "assistant", "content": "from page two"})
    store.save(twin)  # its revision is stale: kept under a new id
    clash = Conversation(id=original.id, messages=[user("Unrelated")])
    store.save(clash)
    kept = {c.id: c.messages[-1]["content"] for c in store.list()}
    assert kept == {original.id: "from page one", twin.id: "from page two", clash.id: "Unrelated"}
    assert len({original.id, twin.id, clash.id}) == 3
    original.messages.append(user("again"))
    assert store.save(original) == store.path(original.id)  # the owner keeps saving in place
    assert store.load(original.id).messages[-1] == user("again") and store.load(original.id).revision == 3


def test_export_folders_are_private_and_cleaned(tmp_path):
    import subprocess
    import sys

    from app.history import EXPORT_PREFIX, export_folder

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left_over = tmp_path / f"{EXPORT_PREFIX}{dead.stdout.strip()}-abcd1234"  # from a process that is gone
    left_over.mkdir()
    (left_over / "old.md").write_text("old export")
    mine = export_folder(tmp_path)
    assert not left_over.exists() and mine.is_dir() and (mine.stat().st_mode & 0o777) == 0o700
    child = f"from pathlib import Path; from app.history import export_folder; print(export_folder(Path({str(tmp_path)!r})))"
    made = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip()
    assert made and not Path(made).exists()  # removed when that process exited
    assert mine.is_dir()  # a live process's folder is left alone


def test_device_panel_names_the_guess_sources(service):
    engine = service.engine
    try:
        engine.replan(lookup=3)
        assert "n-gram lookup in the conversation (chains of 3/3/3/3/3/3 tokens after a match of 1/2/3/4-7/8-15/16+ tokens)" in guess_sources(engine.snapshot())
        assert guess_sources(engine.snapshot()).startswith("prompt tokens (")  # the medium tree guesses too
        engine.replan(lookup=0)
        assert "lookup" not in guess_sources(engine.snapshot())
        assert "**Guesses from:** prompt tokens (" in device_panel(engine.snapshot())
    finally:
        engine.replan(lookup=None)  # no profile with a static tree: no lookup


def test_the_calibration_panel_says_what_decodes_before_a_profile(service):
    from app.page_text import calibration_summary

    assert service.engine.plan.profile is None and service.engine.plan.family.name == "medium"  # a static tree, as asked
    assert calibration_summary(None, service.engine.snapshot().tree["name"]) == "Not calibrated yet: using a built-in tree."
    # --tree auto without a profile decodes plainly until calibrated (ppd chat calibrates beside the first answers)
    assert calibration_summary(None, "plain") == "Not calibrated yet: decoding plainly until it is."


class FailingDecoder:
    """The engine's decoder, raising at its ``fail_at``-th tree step (after some of the answer streamed)."""

    def __init__(self, decoder, fail_at: int):
        self._decoder, self._left = decoder, fail_at

    def __getattr__(self, name):
        return getattr(self._decoder, name)

    def tree_logits(self, *args):
        self._left -= 1
        if self._left == 0:
            raise RuntimeError("CUDA out of memory (injected)")
        return self._decoder.tree_logits(*args)


SETTINGS = ("", 40, True, "lossless", False)  # the page's inputs: system, max new, PPD, ... (sampling: off, greedy)


def test_a_failure_mid_answer_keeps_the_message_and_the_partial_answer_saved(service, tmp_path, monkeypatch):
    import app.page_answers
    from app.page_layout import new_session
    from app.page_text import INTERRUPTED

    monkeypatch.setattr(app.page_answers, "SAVE_SECONDS", 0.0)
    store = ConversationStore(tmp_path / "c")
    handlers, session = page_handlers(service, store), new_session()
    page = handlers.page
    real = service.engine.loaded.backend
    monkeypatch.setattr(service.engine.loaded, "backend", FailingDecoder(real, fail_at=6))
    updates = handlers.answers.send("Tell me a story.", session, *SETTINGS)
    first = next(updates)
    assert store.load(session.conversation.id).messages[0] == user("Tell me a story.")  # on disk before the answer
    *_, answered, listed = [first, *updates]  # the last update refreshes the saved-conversation list
    chat, note = answered[page.chat.chatbot], answered[page.chat.note]
    textbox = first[page.chat.message]  # emptied once, when the message is taken
    saved = store.load(session.conversation.id).messages
    assert saved[0] == user("Tell me a story.") and saved[1]["role"] == "assistant" and saved[1]["interrupted"]
    assert saved[1]["content"] and saved == session.conversation.messages  # the partial answer, kept and saved
    assert note == "The answer was interrupted: RuntimeError: CUDA out of memory (injected)"
    assert chat[-1]["content"] == saved[1]["content"] + INTERRUPTED and textbox == ""

    monkeypatch.setattr(service.engine.loaded, "backend", real)  # Regenerate replaces it with a whole answer
    *_, answered, _ = handlers.answers.regenerate(session, *SETTINGS)
    chat = answered[page.chat.chatbot]
    saved = store.load(session.conversation.id).messages
    assert len(saved) == 2 and "interrupted" not in saved[1] and chat[-1]["content"] == shown(saved[1])
    assert [c.id for c in store.list()] == [session.conversation.id]


def test_a_refused_message_stays_in_the_textbox_and_out_of_the_conversation(service, tmp_path):
    from app.page_layout import new_session

    store = ConversationStore(tmp_path / "c")
    handlers, session = page_handlers(service, store), new_session()
    page = handlers.page
    list(handlers.answers.send("Hello there.", session, *SETTINGS))
    before = list(session.conversation.messages)
    updates = list(handlers.answers.send("word " * 400, session, *SETTINGS))  # beyond the tiny model's 160-token context
    assert len(updates) == 1
    assert page.chat.message not in updates[0] and "too long" in updates[0][page.chat.note]  # the textbox keeps the text
    assert session.conversation.messages == before == store.load(session.conversation.id).messages
    session.conversation.messages[:] = [user("word " * 400)]  # Regenerate of a message the model refuses
    [refused] = handlers.answers.regenerate(session, *SETTINGS)
    assert "too long" in refused[page.chat.note] and session.conversation.messages == [user("word " * 400)]  # kept, not popped


def test_exactness_is_stated_per_path(service, llama_default):
    from app.chat import Comparison
    from ppd_core.stats import GenerationStats

    stats = GenerationStats(new_tokens=8, prefill_seconds=0.1, decode_seconds=0.1)
    verdicts = {bitwise: Comparison("a", "b", stats, stats, False, "plain", bitwise).verdict() for bitwise in (True, False)}
    assert "please report this" in verdicts[True] and "near-tie" in verdicts[False] and "report" not in verdicts[False]
    assert all("different text (" in verdict for verdict in verdicts.values())
    assert "; identical text." in Comparison("a", "a", stats, stats, True, "plain", False).verdict()
    # the default GGUF on llama.cpp on the CPU (its rows probed equal to single steps at load), and the tiny model
    # in fp32 on torch, whose tree matmuls round differently
    assert llama_default.loaded.backend.bitwise and "**Exactness:** bitwise" in device_panel(llama_default.snapshot())
    fp32 = service.engine
    assert not fp32.loaded.backend.bitwise and "**Exactness:** equal up to floating-point near-ties" in device_panel(fp32.snapshot())


def test_a_page_waits_its_turn_and_stop_while_waiting_gives_up_the_place(service, tmp_path):
    from app.page_layout import new_session

    store = ConversationStore(tmp_path / "c")
    handlers, session = page_handlers(service, store), new_session()
    page = handlers.page
    with service.turn():  # another answer holds the model
        updates = handlers.answers.send("Hello there.", session, *SETTINGS)
        taken, waiting = next(updates), next(updates)
        assert waiting[page.chat.note] == "Waiting for the model: 1 answer ahead." and taken[page.chat.message] == ""
        assert store.load(session.conversation.id).messages == [user("Hello there.")]  # saved while it waits
        assert service.queue.waiting == 1
        handlers.answers.stop(session)
        *_, stopped, _ = updates
    assert stopped[page.chat.note] == "Stopped before the answer began." and service.queue.waiting == 0 and not service.queue.busy
    assert session.conversation.messages == store.load(session.conversation.id).messages == [user("Hello there.")]
    list(handlers.answers.regenerate(session, *SETTINGS))  # the stop flag does not outlive its answer
    assert session.conversation.messages[-1]["role"] == "assistant" and "interrupted" not in session.conversation.messages[-1]


def test_while_a_pages_answer_streams_send_is_off_and_another_send_or_regenerate_does_nothing(service, tmp_path):
    """The page's buttons follow its answer (Send off and Stop shown from the moment the message is taken, back at the
    end), and a send or Regenerate from the same page meanwhile changes nothing (before, it queued a second answer)."""
    from app.page_layout import new_session

    keep = {"__type__": "update"}
    handlers, session = page_handlers(service, ConversationStore(tmp_path / "c")), new_session()
    page, answers = handlers.page, handlers.answers
    updates = answers.send("Tell me a story.", session, *SETTINGS)
    taken = next(updates)
    assert taken[page.chat.message] == "" and taken[page.chat.send] == {**keep, "interactive": False}
    assert taken[page.chat.stop] == {**keep, "visible": True}
    assert list(answers.send("Another one.", session, *SETTINGS)) == [{page.session: session}]
    assert list(answers.regenerate(session, *SETTINGS)) == [{page.session: session}]
    *_, last = updates
    assert last[page.chat.send] == {**keep, "interactive": True} and last[page.chat.stop] == {**keep, "visible": False}
    assert [m["role"] for m in session.conversation.messages] == ["user", "assistant"] and not service.queue.waiting
    *_, last = answers.regenerate(session, *SETTINGS)  # free again once it ended
    assert last[page.chat.send] == {**keep, "interactive": True} and last[page.chat.stop] == {**keep, "visible": False}
    assert [m["role"] for m in session.conversation.messages] == ["user", "assistant"]


def test_a_full_line_is_a_busy_notice_that_keeps_the_text(tiny_model_dir, tmp_path):
    from app.page_layout import new_session

    service = ModelHost(Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", max_context=160)),
                        max_waiting=0)
    store = ConversationStore(tmp_path / "c")
    handlers, session = page_handlers(service, store), new_session()
    page, answers = handlers.page, handlers.answers
    with service.turn():
        updates = list(answers.send("Hello there.", session, *SETTINGS))
        assert len(updates) == 1
        assert page.chat.message not in updates[0] and updates[0][page.chat.note].startswith("ppd is busy")
        assert session.conversation.messages == []
        [refused] = answers.compare(session, "", 16)
        assert refused[page.compare.verdict] == "Send a message first, then compare."
        session.conversation.messages.append(user("Hello there."))
        *_, refused = answers.compare(session, "", 16)
        assert refused[page.compare.verdict].startswith("ppd is busy")
    list(answers.regenerate(session, *SETTINGS))  # free again: answered
    assert session.conversation.messages[-1]["role"] == "assistant"


def test_a_failure_frees_the_model_for_the_next_answer(service, chat, monkeypatch):
    real = service.engine.loaded.backend
    monkeypatch.setattr(service.engine.loaded, "backend", FailingDecoder(real, fail_at=3))
    with pytest.raises(RuntimeError, match="injected"):
        list(chat.answer([user("Tell me a story.")], ChatSettings(max_new_tokens=40)))
    assert not service.queue.busy and service.queue.waiting == 0
    monkeypatch.setattr(service.engine.loaded, "backend", real)
    messages = [user("Hello there")]
    updates = list(chat.answer(messages, ChatSettings(max_new_tokens=24)))
    assert updates[-1].text == service.engine.generate(service.engine.chat_ids(messages), "plain", 24).text


def test_a_full_disk_during_an_answer_is_one_line_and_the_next_save_catches_up(service, tmp_path, monkeypatch):
    import app.history
    from app.page_layout import new_session

    store = ConversationStore(tmp_path / "c")
    handlers, session = page_handlers(service, store), new_session()
    list(handlers.answers.send("Hello there.", session, *SETTINGS))
    first = list(session.conversation.messages)
    real_write = app.history.atomic_write

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(app.history, "atomic_write", full_disk)
    with pytest.warns(UserWarning, match=r"^Could not save the conversation \(OSError: \[Errno 28\] No space left on device\); "
                                         r"it is kept on this page and saved again later\.$"):
        *_, answered, _ = handlers.answers.send("Tell me more.", session, *SETTINGS)
    chat = answered[handlers.page.chat.chatbot]
    assert len(session.conversation.messages) == 4 and chat[-1]["content"] == shown(session.conversation.messages[-1])
    assert store.load(session.conversation.id).messages == first  # the previous file, untouched
    monkeypatch.setattr(app.history, "atomic_write", real_write)  # room again: the next save writes everything
    list(handlers.answers.send("Thanks.", session, *SETTINGS))
    assert [c.id for c in store.list()] == [session.conversation.id]  # the same file, no fork
    assert store.load(session.conversation.id).messages == session.conversation.messages and len(session.conversation.messages) == 6


def test_sampling_defaults_come_from_the_models_generation_config(service, tiny_model_dir, tmp_path):
    """A model whose generation_config.json samples (and sets a repetition penalty): the page opens with its
    temperature, top-p and penalty, each widget saying it is the model's, the rest llama-server's defaults; one that
    recommends nothing (the tiny model, the default) opens on llama-server's defaults and ppd's measured repeat
    penalty. Compare stays greedy, with the page's penalties."""
    import shutil

    from app.page_layout import new_session
    from app.page_text import sampling_defaults
    from ppd_core.sampling.params import default_sampling
    from ppd_core.sampling.params import recommended

    assert recommended({"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20}) == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert recommended({"temperature": 0.6}) == {} and recommended({"do_sample": True, "temperature": -1}) == {}
    assert recommended({"repetition_penalty": 1.2}) == {"repeat_penalty": 1.2, "repeat_last_n": -1}  # transformers': all
    assert service.engine.snapshot().recommended_sampling == {}
    plain = sampling_defaults(default_sampling({}))
    assert plain["temperature"]["value"] == 0.8 and "llama-server's default" in plain["temperature"]["label"]
    assert plain["repeat_penalty"]["value"] == 1.1 and "ppd's default" in plain["repeat_penalty"]["label"]

    folder = tmp_path / "sampler"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                                               "repetition_penalty": 1.15}))
    sampler = ModelHost(Engine.load(EngineConfig(model=str(folder), device="cpu", tree="auto", auto_calibrate=False,
                                                 max_context=160)))
    assert sampler.engine.snapshot().recommended_sampling == {"temperature": 0.6, "top_p": 0.9, "repeat_penalty": 1.15,
                                                     "repeat_last_n": -1}
    handlers = page_handlers(sampler, ConversationStore(tmp_path / "c"))
    page, widgets = handlers.page, handlers.page.settings.by_name
    loaded = handlers.load(new_session())
    shown = {name: loaded[widget] for name, widget in widgets.items()}
    assert shown["temperature"]["value"] == 0.6 and "the model" in shown["temperature"]["label"]
    assert shown["top_p"]["value"] == 0.9 and shown["top_k"]["value"] == 40 and "llama-server" in shown["top_k"]["label"]
    assert shown["repeat_penalty"]["value"] == 1.15 and shown["repeat_last_n"]["value"] == -1
    picker = handlers.load(new_session())[page.model.choice]
    # the loaded model's name, as --model takes it, labelled with what it is
    assert picker["value"] == "default" and picker["choices"][0][1] == "default"
    assert picker["choices"][0][0].endswith("(default)")
    later = handlers.model.model_panels()  # the timer's next tick: the user's choices stay
    assert not any(widget in later for widget in widgets.values()) and "value" not in later[page.model.choice]
    settings = ChatSettings(values=dict(temperature=0.6, top_p=0.9, top_k=20))
    assert settings.sampling().top_k == 20 and settings.sampling().temperature == 0.6
    messages = [user("Hello there")]
    penalised = ChatSettings(max_new_tokens=16, values=dict(temperature=0.9, repeat_penalty=1.5))
    result = Chat(sampler).compare(messages, penalised)  # Compare: greedy both ways, with the page's penalty
    expected = sampler.engine.generate(sampler.engine.chat_ids(messages), "plain", 16,
                                       sampling=SamplingParams(repeat_penalty=1.5))
    assert result.identical and result.plain_text == expected.text


def wait_for(condition, seconds: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_first_launch_calibrates_beside_the_answers_and_a_switch_abandons_it(tiny_model_dir, lookup_only_dir,
                                                                              tmp_path, monkeypatch):
    """`ppd chat` on a device with no profile: the page's line is up as soon as the model is (so its timer keeps
    ticking), answers decode plainly meanwhile and are not held back, then the profile is used (still exactly the
    plain answer); a model switched away from mid-calibration leaves that calibration unfinished, and the line to the
    model switched in; quitting stops a calibration before the model is freed."""
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "profiles")  # a first launch

    def load(spec, progress=None):
        return Engine.load(EngineConfig(model=spec, device="cpu", tree="auto", auto_calibrate=False, max_context=160),
                           progress)

    service = ModelHost(None, dict(prompts=2, max_new_tokens=16, contexts=(64,), repeats=1), spec=str(tiny_model_dir),
                        loader=load, calibrate_in_background=True)
    chat = Chat(service)
    plain = load(str(tiny_model_dir))  # its answer without PPD
    messages = [user("Hello there")]
    expected = plain.generate(plain.chat_ids(messages), "plain", 24).text
    engine = load(str(tiny_model_dir))
    with service.turn():  # an answer holds the model: the calibration waits for it
        service.attach(engine)
        assert service.ready and service.background.startswith("Calibrating this device in the background")
        assert engine.plan.family.name == "plain" and engine.plan.profile is None
    assert list(chat.answer(messages, ChatSettings(max_new_tokens=24)))[-1].text == expected
    wait_for(lambda: service.background is None)
    assert engine.plan.profile is not None and engine.plan.family.name.startswith("calibrated-")
    assert list(chat.answer(messages, ChatSettings(max_new_tokens=24)))[-1].text == expected  # exact with PPD too
    service.engine.forget_conversation()

    service.switch(str(lookup_only_dir))  # a model with no profile yet, switched away from mid-calibration
    first, abandoned = service.engine, service._background_thread
    assert service.background.startswith("Calibrating this device in the background")
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "elsewhere")  # no profile
    service.switch(str(tiny_model_dir))  # calibrates in its turn
    abandoned.join(30)
    assert not abandoned.is_alive() and first.plan.profile is None  # abandoned unfinished
    assert service.background.startswith("Calibrating this device in the background")  # the new model's line stays
    wait_for(lambda: service.background is None)
    assert service.engine.plan.profile is not None and not service._background_thread.is_alive()
    service.switch(str(tiny_model_dir))  # calibrated now: nothing runs in the background
    assert service.background is None and service.engine.plan.profile is not None
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "third")
    service.switch(str(tiny_model_dir))
    pending = service._background_thread
    assert pending.is_alive() and service.engine.plan.profile is None
    service.shutdown()  # ppd quits mid-calibration: it stops before the model is freed
    assert not pending.is_alive() and service.engine.plan.profile is None


def test_the_readout_says_what_the_lookup_chains_are_doing(service, chat):
    """With chains on, the readout says how many drafted tokens were right and what the last proposal got, and why."""
    service.engine.replan(lookup=3)
    try:
        prompt = "one two three four five six seven eight nine ten " * 3
        updates = list(chat.answer([user(f"Repeat: {prompt}")], ChatSettings(max_new_tokens=40)))
        stats = updates[-1].stats
        note = stats.notes["lookup"]  # the tiny model's answer repeats itself: the lookup proposes
        line = (f"lookup: {stats.accepted.get('lookup', 0)} of {stats.drafted['lookup']} drafted tokens right; "
                f"last step {note}")
        assert line in updates[-1].readout and "fixed lengths: 3 after a" in note
        plain = list(chat.answer([user(f"Repeat: {prompt}")], ChatSettings(max_new_tokens=40, ppd=False)))
        assert "lookup:" not in plain[-1].readout  # PPD off: nothing drafted, nothing said
    finally:
        service.engine.replan(lookup=None)


def test_conversations_are_listed_by_a_short_title_and_their_time_in_words(tmp_path):
    """Issue 43, item 2: "<title> · today 18:49"; alike labels give the second, then a number."""
    from datetime import datetime

    from app.page_text import conversation_choices, spoken_time

    now = datetime(2025, 11, 27, 19, 6, 30).timestamp()
    assert spoken_time(now - 60, now) == "today 19:05" and spoken_time(now - 86_400, now) == "yesterday 19:06"
    assert spoken_time(now - 7 * 86_400, now) == "Nov 20" and spoken_time(now - 400 * 86_400, now) == "Oct 23, 2024"
    assert spoken_time(now - 7 * 86_400, now, seconds=True) == "Nov 20 19:06:30"
    store = ConversationStore(tmp_path / "c")
    long = "Please tell me everything you know about the history of lighthouses."
    for first, updated in (("Hi", now - 5), ("Hi", now - 5), ("Hi", now - 50), (long, now)):
        conversation = Conversation(messages=[user(first)])
        store.save(conversation)
        data = json.loads(store.path(conversation.id).read_text())
        store.path(conversation.id).write_text(json.dumps({**data, "updated": updated}))
    labels = [label for label, _ in conversation_choices(store, now)]
    assert labels[0] == "Please tell me everything you know about… · today 19:06"
    assert sorted(labels[1:]) == ["Hi · today 19:05", "Hi · today 19:06:25 (1)", "Hi · today 19:06:25 (2)"]
