"""Issue 40, item 4: an answer asked for while a switch waits behind a background calibration is answered by the
model switched in, with its own tokens (before, the ids were made by the model loaded when the answer was asked
for, and then decoded by the next one: ``llama_decode failed``, or a wrong answer where they happened to fit).

The race is made deterministic: the calibration of the model with no profile stops at the first report of a phase
(``calibrate_engine``'s progress), holding the model; a switch, then the answer (or Compare), join the line behind
it; then the calibration goes on and lends the model to them, as it does between its steps."""

import dataclasses
import threading

import pytest

from app.chat import Chat
from app.chat_settings import ChatSettings
from app.model_host import ModelHost
from ppd_core import Engine, EngineConfig
from ppd_core.engine_calibration import calibrate_engine
from ppd_core.errors import PpdError
from ppd_core.loading import default_model_file
from tiny_gguf import default_vocabulary, write_tiny_gguf

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name the capital city of France."}]
SMALL_CALIBRATION = dict(prompts=2, max_new_tokens=16, contexts=(64,), repeats=1)
SHIFT = 49152  # the default model's vocabulary size: every token of the shifted model is past its end


@pytest.fixture(scope="module")
def shifted_gguf(tmp_path_factory) -> str:
    """A tiny qwen2 GGUF (another architecture) whose vocabulary is the default's after ``SHIFT`` tokens no text
    tokenizes to (no merge makes them; they print as "[extraN]"): the same text tokenizes to other ids, none of which
    the default model has."""
    vocabulary = default_vocabulary(default_model_file())
    extra = [f"[extra{index}]" for index in range(SHIFT)]
    shifted = dataclasses.replace(
        vocabulary, tokens=extra + list(vocabulary.tokens), token_types=[1] * SHIFT + list(vocabulary.token_types),
        bos=vocabulary.bos + SHIFT, eos=vocabulary.eos + SHIFT, unknown=vocabulary.unknown + SHIFT,
        padding=vocabulary.padding + SHIFT)
    return str(write_tiny_gguf(tmp_path_factory.mktemp("shifted") / "tiny-qwen2-shifted.gguf", "qwen2", shifted))


def load(spec: str, progress=None) -> Engine:
    """What `ppd chat` loads a picked model with: no profile, calibrated beside the answers."""
    return Engine.load(EngineConfig(model=spec, backend="llamacpp", tree="auto", auto_calibrate=False, threads=2),
                       progress)


def greedy_answer(spec: str, max_new_tokens: int) -> str:
    """``spec``'s greedy answer to QUESTION, computed directly by a model of its own."""
    engine = load(spec)
    try:
        return engine.generate(engine.chat_ids(QUESTION), "plain", max_new_tokens).text
    finally:
        engine.close()


def pause_calibration_at(engine: Engine, phase: str, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(reached, go): ``engine``'s calibration stops at the first report of ``phase`` (holding the model) until
    ``go`` is set, then reports it (the service lends the model there to whoever waits)."""
    reached, go = threading.Event(), threading.Event()

    def paused(calibrated: Engine, progress=None, **options):
        def report(name: str, done: int, total: int) -> None:
            if calibrated is engine and name == phase and not reached.is_set():
                reached.set()
                assert go.wait(120), "the test never let the calibration go on"
            progress(name, done, total)

        return calibrate_engine(calibrated, report, **options)

    monkeypatch.setattr("app.model_host.calibrate_engine", paused)
    return reached, go


CASES = [("shifted", "default", phase) for phase in ("lookup", "latency", "tree search")]  # as in the issue
CASES += [("default", "shifted", phase) for phase in ("lookup", "acceptance", "latency", "tree search")]
# an answer at every phase; a comparison (plain, then PPD: the same checked request twice) once each way
ASKED = [("answer", *case) for case in CASES] + [("compare", *CASES[0]), ("compare", *CASES[-1])]


@pytest.mark.parametrize(("asked", "old", "new", "phase"), ASKED, ids=["-".join(case) for case in ASKED])
def test_an_answer_asked_during_a_switch_behind_a_background_calibration_comes_from_the_new_model(
        shifted_gguf, tmp_path, monkeypatch, old, new, phase, asked):
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "profiles")  # no profile
    monkeypatch.setattr("ppd_core.calibration.records.user_records_dir", lambda: tmp_path / "acceptance")  # measured
    monkeypatch.setattr("app.model_host.IDLE_BEFORE_CALIBRATION", 0.05)
    specs = {"shifted": shifted_gguf, "default": "default"}
    settings = ChatSettings(max_new_tokens=24)
    expected = greedy_answer(specs[new], 24)
    assert expected.strip()  # an answer that says something: a lost one cannot pass for it

    engine = load(specs[old])
    assert engine.chat_ids(QUESTION) != load_ids(specs[new])  # the two vocabularies really differ
    reached, go = pause_calibration_at(engine, phase, monkeypatch)
    service = ModelHost(None, SMALL_CALIBRATION, spec=specs[old], loader=load, calibrate_in_background=True)
    service.attach(engine)
    try:
        assert reached.wait(600), f"the calibration never reported {phase!r}"  # a whole calibration on a busy CPU
        switch = service.start_switch(specs[new])  # waits for the model behind the calibration
        wait_for(lambda: service.queue.waiting == 1)
        result: dict = {}

        def ask() -> None:
            try:
                if asked == "answer":
                    result["texts"] = [list(Chat(service).answer(QUESTION, settings))[-1].text]
                else:
                    comparison = Chat(service).compare(QUESTION, settings)
                    result["texts"] = [comparison.plain_text, comparison.ppd_text]
            except BaseException as error:  # noqa: BLE001 - reported below
                result["error"] = error

        asking = threading.Thread(target=ask)
        asking.start()
        wait_for(lambda: service.queue.waiting == 2)  # asked for (its ids made) while the previous model was loaded
        go.set()
        switch.join(120)
        asking.join(120)
        assert not asking.is_alive() and not switch.is_alive()
        assert "error" not in result, f"{type(result.get('error')).__name__}: {result.get('error')}"
        assert service.spec == specs[new] and result["texts"] == [expected] * len(result["texts"])
        assert engine.plan.profile is None  # the previous model's calibration was abandoned
    finally:
        go.set()
        service.shutdown()


def test_ids_made_by_a_model_no_longer_loaded_are_remade_or_refused(shifted_gguf):
    """``ModelHost.decode`` with the engine the request was checked by: another engine loaded by the time the call
    holds the model makes and checks it again (``remake``), or refuses it in one line without it. Without ``made_for``
    (the API: a request checked, then a place in line taken) the model loaded when the place was taken checked it."""
    service = ModelHost(load(shifted_gguf), spec=shifted_gguf, loader=load)
    try:
        old = service.engine
        settings = ChatSettings(max_new_tokens=8)

        def checked(engine):
            return engine.check(engine.chat_ids(QUESTION), 8, mode="plain", sampling=settings.sampling())

        request = checked(old)
        answering = service.queue.hold()  # an answer holds the model; a switch waits behind it
        switch = threading.Thread(target=service.switch, args=("default",))
        switch.start()
        wait_for(lambda: service.queue.waiting == 1)
        ticket = service.queue.join()  # as app/api/routes.py does: the request checked (above), then a place in line
        service.queue.leave(answering)
        with pytest.raises(PpdError, match="^the model changed .*: ask again$"):
            list(service.decode(request, ticket=ticket))
        switch.join(120)
        assert service.spec == "default" and not service.queue.busy and service.queue.waiting == 0
        new = service.engine
        with pytest.raises(PpdError, match="^the model changed .*: ask again$"):
            list(service.decode(request, made_for=old))
        events = list(service.decode(request, made_for=old, remake=checked))
        assert events[-1].text == new.generate(new.chat_ids(QUESTION), "plain", 8).text
        assert not service.queue.busy
    finally:
        service.shutdown()


def load_ids(spec: str) -> list[int]:
    engine = load(spec)
    try:
        return engine.chat_ids(QUESTION)
    finally:
        engine.close()


def wait_for(condition, seconds: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
