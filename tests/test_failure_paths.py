"""Failed loads, whatever they raise and at whichever phase of a load or a calibration (``ppd_core.faults``): the
previous model comes back (else the default one), the page and the API say so in one line and go on answering, no
llama.cpp model stays in memory, and one switch runs at a time (a finished training is applied once)."""

import gc
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from app.api import create_api
from app.chat import Chat
from app.chat_settings import ChatSettings
from app.history import ConversationStore
from app.model_host import ModelHost, SwitchBusy, SwitchFailed
from app.server import make_server
from app.training_job import TrainingJob
from app.ui import build
from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder
from ppd_core.backends.llamacpp.library import LIVE_MODELS
from ppd_core import Engine, EngineConfig
from ppd_core.faults import FaultError, fault, inject
from tiny_gguf import tiny_models  # noqa: F401 - the fixture
from ppd_core.engine_calibration import calibrate_engine

pytestmark = pytest.mark.slow

KINDS = (ValueError, MemoryError, KeyboardInterrupt)
LOAD_POINTS = ("load.model", "load.tokenizer", "load.prompt_tokens")
CALIBRATION_POINTS = ("calibrate.acceptance", "calibrate.latency", "calibrate.tree_search")
QUESTION = [{"role": "user", "content": "Hello there."}]
SMALL_CALIBRATION = dict(prompts=2, max_new_tokens=16, contexts=(64,), repeats=1)


def load(spec: str, progress=None) -> Engine:
    """As `ppd chat` loads a picked model: llama.cpp, the profile if any (its calibration runs in the background)."""
    return Engine.load(EngineConfig(model=spec, tree="auto", auto_calibrate=False, threads=1), progress)


def load_calibrating(spec: str, progress=None) -> Engine:
    """As `ppd serve` loads a model: one without a profile is calibrated in the load."""
    return Engine.load(EngineConfig(model=spec, tree="auto", auto_calibrate=True, threads=1), progress)


def counting(loader, loads: list):
    def counted(spec: str, progress=None) -> Engine:
        loads.append(spec)
        return loader(spec, progress)

    return counted


def wait_for(condition, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def serve(service: ModelHost):
    """``ppd serve``'s app for ``service`` on a thread: (server, thread, url)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = make_server(create_api(service), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30)
    return server, thread, f"http://127.0.0.1:{port}"


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


@dataclass
class Served:
    service: ModelHost
    client: openai.OpenAI
    url: str
    previous: str  # the model loaded before each test's switch (a tiny llama GGUF)
    other: str  # another tiny GGUF (qwen3)
    expected: str  # the previous model's answer to QUESTION through the API
    others: set  # llama.cpp models of other tests alive in this process

    def answer(self) -> str:
        return self.client.chat.completions.create(model="any", messages=QUESTION, temperature=0,
                                                   max_tokens=8).choices[0].message.content

    def live_models(self) -> set:
        return LIVE_MODELS - self.others


@pytest.fixture(scope="module")
def served(tiny_models):  # noqa: F811
    """A tiny llama GGUF behind the API, switched with the real GGUF loader (the default model, other tiny files)."""
    previous, other = str(tiny_models.get("llama")), str(tiny_models.get("qwen3"))
    service = ModelHost(load(previous), spec=previous, loader=load)
    server, thread, url = serve(service)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    others = LIVE_MODELS - {id(service.engine.loaded.backend)}
    served = Served(service, client, url, previous, other, "", others)
    served.expected = served.answer()
    yield served
    server.should_exit = True
    thread.join(15)
    if service.ready:
        service.engine.close()


def assert_back_on_the_previous_model(served: Served) -> None:
    service = served.service
    assert service.ready and service.spec == served.previous and not service.switching
    assert served.live_models() == {id(service.engine.loaded.backend)}  # the failed load's model was freed
    assert served.answer() == served.expected  # the previous model answers, through the API


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("point", LOAD_POINTS)
def test_a_load_failing_at_any_phase_brings_the_previous_model_back(served, point, kind):
    service = served.service
    with inject(point, kind, times=1), pytest.raises(SwitchFailed) as raised:
        service.switch("default")
    line = f"Could not load default: {kind.__name__}: injected fault at {point}. Back on {served.previous}."
    assert str(raised.value) == service.switch_note == line
    assert_back_on_the_previous_model(served)


def test_the_pages_switch_falls_back_to_the_default_model_when_the_previous_one_fails_too(served, tmp_path):
    service = served.service
    handlers = build(service, ConversationStore(tmp_path / "conversations"))[1].model
    with inject("load.tokenizer", MemoryError, times=2):  # the model asked for, then the previous one
        handlers.switch_model(served.other)  # on the page's own thread
        wait_for(lambda: not service.switching)
    assert service.ready and service.spec == "default"
    line = (f"Could not load {served.other}: MemoryError: injected fault at load.tokenizer. {served.previous} failed "
            "to load again (MemoryError: injected fault at load.tokenizer): back on the default model.")
    assert service.switch_note == line and handlers.model_panels()[handlers.page.startup] == line
    assert served.live_models() == {id(service.engine.loaded.backend)}
    assert served.answer()  # the default model answers
    service.switch(served.previous)
    assert_back_on_the_previous_model(served)


def test_when_no_model_loads_the_page_and_the_api_say_so_in_one_line_and_stay_responsive(served, tmp_path):
    service = served.service
    with inject("load.prompt_tokens", KeyboardInterrupt), pytest.raises(SwitchFailed) as raised:
        service.switch(served.other)
    fault_line = "KeyboardInterrupt: injected fault at load.prompt_tokens"
    line = (f"The model could not be loaded: {served.other} ({fault_line}), nor {served.previous} ({fault_line}), nor "
            f"default ({fault_line}). Pick a model to load.")
    assert str(raised.value) == service.switch_note == service.startup.line() == line
    assert not service.ready and not service.switching and served.live_models() == set()

    health = httpx.get(f"{served.url}/health", timeout=10)
    assert health.status_code == 503 and health.json()["status"] == "error" and health.json()["detail"] == line
    with pytest.raises(openai.APIStatusError) as refused:
        served.answer()
    assert refused.value.status_code == 503 and refused.value.body["message"] == line

    handlers = build(service, ConversationStore(tmp_path / "conversations"))[1].model
    page, panels = handlers.page, handlers.model_panels()
    startup, send, device, timer = panels[page.startup], panels[page.chat.send], panels[page.device], panels[page.timer]
    picker = panels[page.model.choice]
    assert startup == f"**{line}**" and device == "No model is loaded."
    assert send["interactive"] is False and timer.active is False  # nothing is loading: the page stops asking
    assert picker["interactive"] is True  # and another model can be picked

    service.switch(served.previous)
    assert_back_on_the_previous_model(served)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("point", CALIBRATION_POINTS[:2])
def test_a_calibration_in_the_load_failing_brings_the_previous_model_back(tiny_models, tmp_path, monkeypatch,  # noqa: F811
                                                                           point, kind):
    """`Engine.load` calibrates a model without a profile: a failure there is a failed load like any other."""
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "profiles")
    previous, target = str(tiny_models.get("llama")), str(tiny_models.get("qwen3"))
    engine = load(previous)
    calibrate_engine(engine, **SMALL_CALIBRATION)  # the previous model has a profile: it loads again without calibrating
    loads = []
    service = ModelHost(engine, spec=previous, loader=counting(load_calibrating, loads))
    others = LIVE_MODELS - {id(engine.loaded.backend)}
    chat = Chat(service)
    expected = list(chat.answer(QUESTION, ChatSettings(max_new_tokens=8)))[-1].text
    with inject(point, kind, times=1), pytest.raises(SwitchFailed) as raised:
        service.switch(target)
    assert str(raised.value) == f"Could not load {target}: {kind.__name__}: injected fault at {point}. Back on {previous}."
    assert loads == [target, previous] and service.ready and not service.switching
    assert service.engine.plan.profile is not None and LIVE_MODELS - others == {id(service.engine.loaded.backend)}
    assert list(chat.answer(QUESTION, ChatSettings(max_new_tokens=8)))[-1].text == expected
    service.engine.close()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("point", CALIBRATION_POINTS)
def test_a_background_calibration_failing_at_any_phase_is_one_line_and_answers_go_on(tiny_models, tmp_path,  # noqa: F811
                                                                                      monkeypatch, point, kind):
    """`ppd chat` calibrates a model without a profile beside its answers: a failure there leaves the model decoding
    plainly, and the page's line says why (not "Calibrating..." for ever)."""
    monkeypatch.setattr("ppd_core.calibration.profiles.profiles_dir", lambda: tmp_path / "profiles")
    monkeypatch.setattr("app.model_host.IDLE_BEFORE_CALIBRATION", 0.05)
    model = str(tiny_models.get("llama"))
    service = ModelHost(load(model), SMALL_CALIBRATION, spec=model, loader=load, calibrate_in_background=True)
    with inject(point, kind):
        thread = service.calibrate_in_background()
        thread.join(120)
    assert not thread.is_alive()
    assert service.background == f"The calibration failed ({kind.__name__}: injected fault at {point}); answers decode plainly."
    engine = service.engine
    assert engine.plan.profile is None and not service.switching
    expected = engine.generate(engine.chat_ids(QUESTION), "plain", 8).text
    assert list(Chat(service).answer(QUESTION, ChatSettings(max_new_tokens=8)))[-1].text == expected
    service.shutdown()


def test_twenty_failed_switches_leave_no_model_in_memory(served):
    service = served.service

    def fail(point: str, kind: type[BaseException]) -> None:
        with inject(point, kind, times=1), pytest.raises(SwitchFailed):
            service.switch(served.other)

    fail("load.tokenizer", ValueError)  # first-time allocations (llama.cpp's buffers, the GGUF reader) made here
    before = rss()
    for index in range(20):
        fail(LOAD_POINTS[index % 3], KINDS[index // 3 % 3])
    after = rss()
    assert after - before <= 50 * 2**20, (before, after)
    assert_back_on_the_previous_model(served)


def test_a_decoder_that_fails_half_way_frees_its_model_and_its_file(tiny_models, tmp_path):  # noqa: F811
    path = tmp_path / "tiny.gguf"  # a path of its own: nothing else in this process maps it
    shutil.copyfile(tiny_models.get("llama"), path)
    before = set(LIVE_MODELS)

    def mapped() -> bool:
        """Whether this process maps ``path`` or holds it open."""
        gc.collect()
        opened = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                opened.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # closed meanwhile
                pass
        return str(path) in Path("/proc/self/maps").read_text() or str(path) in opened

    with inject("load.model", MemoryError), pytest.raises(MemoryError):
        LlamaCppDecoder(path, threads=1)  # llama.cpp loaded the weights, then the constructor failed
    with inject("load.tokenizer", KeyboardInterrupt), pytest.raises(KeyboardInterrupt):
        load(str(path))  # the decoder was made
    with inject("load.prompt_tokens", ValueError), pytest.raises(ValueError):
        load(str(path))  # the model was loaded, the engine not made
    assert not LIVE_MODELS - before and not mapped()

    decoder = LlamaCppDecoder(path, threads=1)
    assert mapped() and len(LIVE_MODELS - before) == 1
    decoder.close()
    assert not LIVE_MODELS - before and not mapped()  # llama.cpp's map and the token embedding's
    decoder.close()  # twice: nothing left to free
    LlamaCppDecoder.__new__(LlamaCppDecoder).close()  # a constructor that failed before it made anything


def test_faults_are_armed_from_the_environment_or_refused_in_one_line(tiny_models, monkeypatch):  # noqa: F811
    model = str(tiny_models.get("llama"))
    before = set(LIVE_MODELS)
    monkeypatch.setenv("PPD_FAULTS", "load.tokenizer=MemoryError, calibrate.latency")
    with pytest.raises(MemoryError, match="^injected fault at load.tokenizer$"):
        load(model)
    with pytest.raises(ValueError, match="^injected fault at calibrate.latency$"):
        fault("calibrate.latency")
    fault("load.model")  # not armed
    assert not LIVE_MODELS - before
    monkeypatch.setenv("PPD_FAULTS", "load.tokenizr=MemoryError")
    with pytest.raises(FaultError, match="^unknown fault point 'load.tokenizr'; use one of load.model, "):
        fault("load.model")
    monkeypatch.setenv("PPD_FAULTS", "load.model=SystemExit")
    with pytest.raises(FaultError, match="^PPD_FAULTS: unknown exception 'SystemExit'"):
        fault("load.model")
    with pytest.raises(FaultError, match="unknown fault point"):
        with inject("load.everything"):
            pass


def test_one_switch_at_a_time_another_model_is_refused_and_the_same_one_joins_it(served, tmp_path):
    service = served.service
    loads = []
    service.loader = counting(load, loads)
    try:
        handlers = build(service, ConversationStore(tmp_path / "conversations"))[1].model
        with service.turn():  # an answer in progress: the switch waits for it
            handlers.switch_model(served.other)  # Load clicked on one page
            assert service.switching
            refusal = f"{served.other} is loading: load default once it is ready"
            with pytest.warns(UserWarning, match=f"^{re.escape(refusal)}$"):
                handlers.switch_model("default")  # on another page, meanwhile
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                handlers.switch_model(served.other)  # clicked again: the same switch

            asked = ["default", served.other] * 4  # eight callers at once (the API, pages...)
            barrier, outcomes = threading.Barrier(len(asked)), []

            def ask(spec: str) -> None:
                barrier.wait()
                try:
                    service.switch(spec)
                    outcomes.append(("loaded", spec))
                except SwitchBusy as error:
                    outcomes.append(("refused", str(error)))

            callers = [threading.Thread(target=ask, args=(spec,)) for spec in asked]
            for caller in callers:
                caller.start()
            wait_for(lambda: len(outcomes) == 4)  # the other model's callers are refused at once
            assert outcomes == [("refused", refusal)] * 4
        for caller in callers:
            caller.join(120)
        assert outcomes[4:] == [("loaded", served.other)] * 4  # the same model's callers waited for the one switch
        assert loads == [served.other] and service.spec == served.other and not service.switching
    finally:
        service.loader = load
        service.switch(served.previous)
    assert_back_on_the_previous_model(served)


class SlowToReadJob(TrainingJob):
    """A real training job whose ``applied`` is acted on 0.3 s after it was read: the pages' timer ticks overlap, as on
    a busy machine."""

    @property
    def applied(self) -> bool:
        value = self._applied
        time.sleep(0.3)
        return value

    @applied.setter
    def applied(self, value: bool) -> None:
        self._applied = value


def test_a_finished_training_is_applied_once_whichever_pages_ask(tiny_models, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr("app.model_host.TrainingJob", SlowToReadJob)
    model, loads = str(tiny_models.get("llama")), []
    service = ModelHost(load(model), spec=model, loader=counting(load, loads))
    job = service.training()
    job.folder.mkdir(parents=True, exist_ok=True)
    try:
        job.status_file.write_text(json.dumps({"phase": "done"}))  # what a finished `ppd train` leaves
        job.process = subprocess.Popen([sys.executable, "-c", ""])
        job.process.wait()
        assert job.status().state == "done"
        handlers = build(service, ConversationStore(tmp_path / "conversations"))[1].model
        ticks = 4  # pages open on the app, their timers ticking at once
        barrier, failures = threading.Barrier(ticks), []

        def tick() -> None:
            barrier.wait()
            try:
                handlers.model_panels()
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)

        with service.turn():  # an answer in progress: the ticks all see the model loaded
            pages = [threading.Thread(target=tick) for _ in range(ticks)]
            for page in pages:
                page.start()
            for page in pages:
                page.join(60)
        assert failures == []
        wait_for(lambda: service.ready and not service.switching)
        handlers.model_panels()  # a later tick: nothing more to apply
        assert loads == [model] and job.applied and not service.switching
    finally:
        shutil.rmtree(job.folder, ignore_errors=True)
        service.engine.close()
