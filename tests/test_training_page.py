"""The training on the page: a running training (this app's, or one adopted from an earlier app) shows Stop, which
stops it where it was and offers Resume; an adopted training that finishes is applied once; `ppd chat` sent SIGTERM
quits as on Ctrl+C, stopping its trainer resumably."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_layout import TRAIN
from app.trainer_lock import live_trainer
from app.training_job import TrainingJob
from app.ui import build, build_app
from ppd_core.training.answers import read_cache
from conftest import tiny_llama
from page_lines import shown_lines
from ppd_core import Engine, EngineConfig
from page_open import CHROMIUM, CHROMIUM_ARGS
from test_training_lock import OLD_APP, ROOT, data_home, kill_left_over, options, wait_for  # noqa: F401 - fixtures
from ports import free_port

pytestmark = pytest.mark.slow

STOP, RESUME = "Stop training", "Resume training"


def load(spec: str, progress=None) -> Engine:
    """The default model on llama.cpp, as `ppd chat` loads it (no calibration: the tree is fixed)."""
    return Engine.load(EngineConfig(model=spec, tree="medium", auto_calibrate=False, threads=1), progress)


def training_buttons(handlers, panels: dict) -> tuple[str, dict]:
    """The training line and its button in the updates of ``handlers`` (``ModelHandlers``)."""
    return panels[handlers.page.model.training], panels[handlers.page.model.train]


def holds_lock(job: TrainingJob) -> bool:
    """This job's own trainer has taken its folder's lock (from then on SIGTERM stops it where it is)."""
    trainer = live_trainer(job.folder)
    return trainer is not None and job.process is not None and trainer.pid == job.process.pid


def test_stop_on_the_page_stops_an_adopted_and_an_own_training_and_offers_resume(data_home, options):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    service = ModelHost(load("default"), spec="default", loader=load, train_options=options)
    handlers = build(service, ConversationStore(data_home / "conversations"))[1].model
    job = service.training()
    app, port = build_app(service, ConversationStore(data_home / "conversations")), free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        # an earlier chat app started the training and quit without stopping it: this app adopts it
        subprocess.run([sys.executable, "-c", OLD_APP, job.name, *options], cwd=ROOT, check=True, timeout=60)
        wait_for(lambda: live_trainer(job.folder) is not None, 120, "the earlier app's trainer did not take the lock")
        adopted = live_trainer(job.folder)
        line, button = training_buttons(handlers, handlers.model_panels())
        assert line.startswith("Training PPD tokens") and button["value"] == STOP, (line, button)
        assert button["visible"] and button["interactive"]

        with sync_playwright() as playwright:  # Stop clicked on the page
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/")
            train = page.locator("#train")
            expect(train).to_have_text(STOP, timeout=60_000)
            train.click()
            expect(train).to_have_text(RESUME, timeout=60_000)
            expect(page.locator("#training")).to_contain_text("resumes where it was")
            browser.close()
        # the trainer lets go of its lock as it stops; its interpreter may take a moment more to exit on a busy machine
        wait_for(lambda: adopted.process() is None, 60, "the stopped trainer's process did not end")
        assert live_trainer(job.folder) is None and job.status().state == "stopped"
        assert "ppd: interrupted" in job.log_file.read_text()  # stopped where it was (SIGTERM), not killed

        line, button = training_buttons(handlers, handlers.training_button(RESUME))  # this app's own trainer now
        assert job.process is not None and button["value"] == STOP, (line, button)
        wait_for(lambda: holds_lock(job), 120, "the resumed trainer did not take the lock")
        line, button = training_buttons(handlers, handlers.training_button(STOP))
        assert job.process.returncode == 130 and live_trainer(job.folder) is None  # 130: `ppd train` interrupted
        assert job.status().state == "stopped" and button["value"] == RESUME, (line, button)
    finally:
        app.close()
        kill_left_over(job.folder)
        service.shutdown()


def load_untrained(spec: str, progress=None) -> Engine:
    """A model with no prompt tokens, as `ppd chat` loads it: the page offers to train them."""
    return Engine.load(EngineConfig(model=spec, device="cpu", tree="auto", auto_calibrate=False), progress)


def test_a_training_started_on_the_page_shows_its_stage_steps_loss_and_time_left_at_once(data_home, lookup_only_dir,  # noqa: F811
                                                                                         tmp_path):
    """Issue 43, item 3: the line said "starting…" until the first answers were in (over 90 s on a large model), and
    then no loss; now the stage is numbered from the trainer's first second, and training shows step, loss and time
    left, in at most two lines at 1400 px."""
    from playwright.sync_api import expect, sync_playwright

    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Tell me about {topic}."}]}) + "\n"
                            for topic in ("cats", "rain", "bread", "trains")))
    # a tiny model, trained for many steps: the training stage lasts until the test stops it
    options = ["--samples", "4", "--epochs", "2000", "--accumulate", "1", "--cuts", "2", "--max-new-tokens", "8",
               "--data", str(data), "--eval-limit", "0", "--acceptance-prompts", "0", "--device", "cpu", "--threads", "1"]
    folder = tmp_path / "untrained-page"  # a model of its own: no other test finds tokens trained here
    shutil.copytree(lookup_only_dir, folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tiny_llama(seed=13, vocab_size=vocab, max_positions=512).save_pretrained(folder)
    spec = str(folder)
    service = ModelHost(load_untrained(spec), spec=spec, loader=load_untrained, train_options=options)
    job = service.training()
    app, port = build_app(service, ConversationStore(data_home / "conversations")), free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/")
            train, line = page.locator("#train"), page.locator("#training")
            expect(train).to_have_text(TRAIN, timeout=60_000)
            assert shown_lines(line) <= 2, line.inner_text()  # the offer to train
            offer_training_then_choose_the_quick_run(page, job)
            # the trainer's first stage, numbered, within seconds of the click (the model has not loaded yet)
            expect(line).to_have_text(re.compile(r"Training PPD tokens \(\d/\d\): "), timeout=10_000)
            assert shown_lines(line) <= 2, line.inner_text()
            stepping = re.compile(r"\(\d/\d\): step \d+/\d+, loss \d+\.\d{3}, ~\d+ (s|min) left")
            expect(line).to_have_text(stepping, timeout=180_000)
            assert shown_lines(line) <= 2, line.inner_text()
            # the quick run: the trainer answered its one conversation (of the 4 the options give the full run)
            assert len(read_cache(job.folder / "answers.jsonl")) == 1
            train.click()  # Stop
            expect(train).to_have_text(RESUME, timeout=60_000)
            browser.close()
        assert job.status().state == "stopped"
    finally:
        app.close()
        kill_left_over(job.folder)
        service.shutdown()


def offer_training_then_choose_the_quick_run(page, job: TrainingJob) -> None:
    """Issue 50, page item 6: Train says the run's size, its time at this device's measured speed (here the last
    answer's), its memory and disk, and offers a quick run beside the full one; nothing starts before a run is chosen
    (Cancel starts nothing either); the quick run then starts."""
    from playwright.sync_api import expect

    page.locator("#message textarea").fill("Hello")  # an answer: this device's speed for this model, measured
    page.locator("#send").click()
    expect(page.locator("#readout")).to_contain_text("tokens/s", timeout=120_000)
    expect(page.locator("#readout")).not_to_contain_text("(streaming)", timeout=120_000)
    train, offer, cost = page.locator("#train"), page.locator("#train-offer"), page.locator("#train-cost")
    expect(offer).to_be_hidden()
    train.click()
    expect(cost).to_contain_text("The model answers 4 conversations", timeout=10_000)
    expect(cost).to_contain_text(re.compile(r"It takes about \d+(\.\d)? (s|min|h) at this device's speed \(measured by "
                                            r"its last answer"))
    expect(cost).to_contain_text(re.compile(r"about \d+ MB of memory while it runs and \d+ MB of disk"))
    expect(cost).to_contain_text(re.compile(r"A quick run of 1 conversation takes about \d+"))
    expect(page.locator("#train-quick")).to_have_text(re.compile(r"Quick: 1 conversation, about \d+"))
    expect(page.locator("#train-full")).to_have_text(re.compile(r"Full: 4 conversations, about \d+"))
    time.sleep(2)  # nothing has started: no trainer, no status
    assert job.process is None and live_trainer(job.folder) is None and not job.status_file.exists()
    assert train.inner_text() == TRAIN
    page.locator("#train-cancel").click()
    expect(offer).to_be_hidden()
    time.sleep(1)
    assert job.process is None and live_trainer(job.folder) is None
    train.click()
    page.locator("#train-quick").click()
    expect(offer).to_be_hidden()


FINISHING_TRAINER = """
import json, sys, time
from pathlib import Path
from app.trainer_lock import WorkDirLock

folder = Path(sys.argv[1])
lock = WorkDirLock(folder).acquire()  # as `ppd train` does, for its whole run
(folder / "status.json").write_text(json.dumps({"phase": "train", "done": 1, "total": 2, "phase_seconds": 1.0}))
while not (folder / "finish").exists():
    time.sleep(0.05)
(folder / "status.json").write_text(json.dumps({"phase": "done", "done": 1, "total": 1, "phase_seconds": 0.0}))
lock.release()
"""


def test_an_adopted_training_that_finishes_is_applied_once(data_home):  # noqa: F811
    loads = []

    def counted(spec: str, progress=None) -> Engine:
        loads.append(spec)
        return load(spec, progress)

    service = ModelHost(load("default"), spec="default", loader=counted)
    handlers = build(service, ConversationStore(data_home / "conversations"))[1].model
    job = service.training()
    job.folder.mkdir(parents=True)
    # a trainer this app did not start (an earlier app's), holding the folder as `ppd train` does, then finishing
    trainer = subprocess.Popen([sys.executable, "-c", FINISHING_TRAINER, str(job.folder)], cwd=ROOT)
    try:
        wait_for(lambda: live_trainer(job.folder) is not None, 60, "the trainer did not take the lock")
        line, button = training_buttons(handlers, handlers.model_panels())
        assert line.startswith("Training PPD tokens: step 1/2") and button["value"] == STOP, (line, button)

        (job.folder / "finish").touch()
        assert trainer.wait(60) == 0 and job.status().state == "done"
        line, _ = training_buttons(handlers, handlers.model_panels())  # the page's next tick applies it
        assert line == "Training finished: loading the new PPD tokens…"
        wait_for(lambda: service.ready and not service.switching, 120, "the model was not loaded again")
        handlers.model_panels()  # later ticks: nothing more to apply
        handlers.model_panels()
        assert loads == ["default"] and job.applied
    finally:
        trainer.kill()
        service.shutdown()


CHAT = """
import sys, threading, time
import app.ui
from app.cli import entry

port, options = sys.argv[1], sys.argv[2:]
build_app = app.ui.build_app

def build_training_app(service, store=None, api=""):
    service.train_options = options  # tiny trainings

    def train():  # Train clicked on the page once the model is ready
        while not service.ready:
            time.sleep(0.1)
        service.training().start()

    threading.Thread(target=train, daemon=True).start()
    return build_app(service, store, api)

app.ui.build_app = build_training_app
sys.argv[1:] = ["chat", "--port", port, "--tree", "medium", "--threads", "1"]
entry()  # as the `ppd` command quits
"""


def test_ppd_chat_sent_sigterm_quits_within_two_seconds_and_stops_its_trainer_resumably(data_home, options):  # noqa: F811
    chat = subprocess.Popen([sys.executable, "-c", CHAT, str(free_port()), *options], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    folders: list[Path] = []
    try:
        def trainer_running() -> bool:
            assert chat.poll() is None, chat.stdout.read()
            folders[:] = [folder for folder in (data_home / "ppd" / "train").glob("*") if live_trainer(folder)]
            return bool(folders)

        wait_for(trainer_running, 180, "ppd chat's trainer did not take its folder's lock")
        trainer = live_trainer(folders[0])
        sent = time.monotonic()
        chat.send_signal(signal.SIGTERM)  # `kill PID`, systemd's stop
        output = chat.communicate(timeout=90)[0]
        quit_seconds = time.monotonic() - sent
        assert chat.returncode == 0 and quit_seconds < 2.0, (quit_seconds, output[-3000:])
        wait_for(lambda: trainer.process() is None, 30, "the trainer did not stop after ppd chat quit")
        assert live_trainer(folders[0]) is None  # no trainer left running
        job = TrainingJob("default", folders[0].name)  # the chat, started again
        assert job.status().state == "stopped"  # resumable
        assert "ppd: interrupted" in job.log_file.read_text()  # stopped where it was, not killed
    finally:
        chat.kill()
        chat.wait()
        for folder in folders:
            kill_left_over(folder)
