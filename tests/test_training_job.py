"""Training PPD tokens from the app: a background `ppd train` for a model without tokens, followed on the page,
resumed after it was stopped, and loaded (and calibrated) when it is done."""

import json
import shutil
import threading
import time

import pytest

from conftest import tiny_llama
from app.commands.train import StatusFile, training_stages
from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_layout import new_session
from app.training_job import progress_line
from app.ui import build
from ppd_core import Engine, EngineConfig
from ppd_core.engine_calibration import calibrate_engine

pytestmark = pytest.mark.slow


def load(spec: str, progress=None) -> Engine:
    """As `ppd chat` loads a model: the profile, else a calibration where there are prompt tokens (a short one)."""
    engine = Engine.load(EngineConfig(model=spec, device="cpu", tree="auto", auto_calibrate=False), progress)
    if engine.plan.profile is None and engine.prompt_tokens.num_prompt_tokens:
        calibrate_engine(engine, progress, prompts=2, max_new_tokens=16, contexts=(64,), repeats=1)
    return engine


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_progress_lines_say_the_stage_its_count_the_loss_and_the_time_left():
    assert progress_line({}) == "Training PPD tokens: starting the trainer…"
    assert progress_line({"phase": "load", "done": 0, "total": 0, "first": 0, "phase_seconds": 0.0, "stage": 1,
                          "stages": 6, "age": 12.3}) == "Training PPD tokens (1/6): loading the model, 12 s…"
    assert progress_line({"phase": "train", "done": 10, "total": 40, "first": 0, "phase_seconds": 60, "loss": 2.31449,
                          "stage": 5, "stages": 6}) == \
        "Training PPD tokens (5/6): step 10/40, loss 2.314, ~3 min left…"
    # resumed at 30 answers: the rate is this run's (10 answers in 20 s), not 40 in 20 s
    assert progress_line({"phase": "answers", "done": 40, "total": 50, "first": 30, "phase_seconds": 20, "stage": 4,
                          "stages": 6}) == "Training PPD tokens (4/6): answering 40/50, ~20 s left…"
    # a record from an older trainer (no stage, no first count) still reads
    assert progress_line({"phase": "answers", "done": 3, "total": 4, "phase_seconds": 30}) == \
        "Training PPD tokens: answering 3/4, ~10 s left…"
    assert progress_line({"phase": "train", "done": 1, "total": 1000, "phase_seconds": 6.0}).endswith("~1.7 h left…")


def test_the_status_file_numbers_the_stages_and_starts_a_stage_clock_at_its_first_report(tmp_path):
    clock = iter([0.0, 5.0, 5.5, 9.0, 20.0])
    status = StatusFile(tmp_path / "status.json", training_stages(False, True))
    status.clock = lambda: next(clock)
    read = lambda: json.loads((tmp_path / "status.json").read_text())  # noqa: E731
    status.write("load", 0, 0)
    assert read() == {"phase": "load", "done": 0, "total": 0, "first": 0, "phase_seconds": 0.0, "stage": 1, "stages": 6}
    status.write("train", 3, 40, loss=2.5)  # resumed at step 3
    status.write("train", 4, 40, loss=2.4)  # within a second: not written
    assert read()["done"] == 3
    status.write("train", 5, 40, loss=2.25)
    assert read() == {"phase": "train", "done": 5, "total": 40, "first": 3, "phase_seconds": 4.0, "stage": 5,
                      "stages": 6, "loss": 2.25}
    status.write("acceptance", 1, 4)
    assert read()["stage"] == 6 and read()["first"] == 1


def test_the_train_button_trains_resumes_and_switches_to_the_new_tokens(lookup_only_dir, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q}]}) for q in
                              ["Tell me about cats.", "Write a haiku about rain.", "What is a CPU?", "Give me a pasta recipe."]) + "\n")
    options = ["--samples", "4", "--epochs", "1", "--accumulate", "2", "--cuts", "4", "--max-new-tokens", "12", "--data",
               str(data), "--eval-limit", "0", "--acceptance-prompts", "0", "--device", "cpu"]
    folder = tmp_path / "untrained"  # a model of its own (no other test finds the tokens trained here)
    shutil.copytree(lookup_only_dir, folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tiny_llama(seed=11, vocab_size=vocab, max_positions=512).save_pretrained(folder)
    spec = str(folder)
    service = ModelHost(load(spec), spec=spec, loader=load, train_options=options)
    page_handlers = build(service, ConversationStore(tmp_path / "c"))[1]
    handlers, page = page_handlers.model, page_handlers.page

    def training_panel(panels: dict) -> tuple[str, dict]:
        return panels[page.model.training], panels[page.model.train]

    training, train = training_panel(page_handlers.load(new_session()))
    assert "guesses come from the conversation alone" in training and train["visible"] and train["interactive"]

    handlers.train()  # stopped once while it runs (at once: a tiny training can end within a second), then resumed
    job = service.training()
    assert job.running
    # while Stop waits for the trainer to end, the page says so and offers no Resume (a click then would race the
    # Stop's own answer); the trainer's end is held back here until the page has been looked at
    ended, wait = threading.Event(), job.process.wait
    job.process.wait = lambda timeout=None: ended.wait(timeout) and wait(timeout)
    stopping = threading.Thread(target=job.stop)
    stopping.start()
    wait_for(lambda: job.stopping, 30, "the Stop did not begin")
    training, train = training_panel(handlers.model_panels())
    assert training.startswith("Stopping the training") and train["value"] == "Stop training" and not train["interactive"]
    assert handlers.model_panels()[page.timer].active  # the page keeps asking until the trainer is gone
    ended.set()
    stopping.join(60)
    assert job.status().state == "stopped"
    training, train = training_panel(handlers.model_panels())
    assert "resumes where it was" in training and train["value"] == "Resume training"
    panels = handlers.training_button("Resume training")  # a click's answer leaves the timer on, whatever it says
    assert panels[page.timer].active
    training, train = training_panel(handlers.model_panels())
    assert training.startswith("Training PPD tokens") and train["value"] == "Stop training" and train["interactive"]

    wait_for(lambda: not job.running, 600, "the training did not end")
    assert job.status().state == "done", job.log_file.read_text()[-2000:]
    handlers.model_panels()  # the page's next tick: loads the new tokens and calibrates them
    wait_for(lambda: service.ready and not service.switching, 300, "the new tokens were not loaded")
    engine = service.engine
    assert engine.prompt_tokens.num_prompt_tokens == 3 and engine.prompt_tokens.training["trained"]
    assert engine.plan.profile is not None and engine.plan.family.name.startswith("calibrated-")
    ids = engine.chat_ids([{"role": "user", "content": "Hello there."}])
    assert engine.generate(ids, "ppd", 48).tokens == engine.generate(ids, "plain", 48).tokens
    training, train = training_panel(handlers.model_panels())
    assert training == "" and train["visible"] is False  # nothing left to offer
