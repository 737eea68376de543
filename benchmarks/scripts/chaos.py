"""Chaos rounds against a real `ppd chat`: nothing stuck, nothing leaked, nothing run twice (issue 31).

    .venv/bin/python benchmarks/scripts/chaos.py --rounds N [--port P] [--keep DIR]

`ppd chat` runs on the default model (llama.cpp) in a subprocess, its data, cache, config and Hugging Face folders
in a temporary folder (``--keep DIR``: in DIR, kept), driven through its page in Chromium. Each round:

a. (re)start the app; b. send a message and let it answer; c. load a broken model (a truncated copy of the default
GGUF, a file that is no GGUF, a GGUF cut inside its header: one per round in turn) in the page's model box: the page
says why in one line and is back on the default model, with one llama.cpp model alive (``/health``), and answers;
d. start (or resume) a training from the page (tiny options, through ``$PPD_TRAIN_OPTIONS``); e. send a long message
and ``kill -9`` the app mid-answer; f. restart it: it adopts the trainer still running (no second one), then
``kill -9`` it mid-training, once the trainer answers its conversations (every second round the trainer too);
g. restart and check: every typed message is on disk, the trainer's answers so far too, at most one trainer works in
the work directory (trainer.json names it), one llama.cpp model alive, the training is resumable (Stop, then Resume
from the page starts one trainer again, train.log kept), and the page answers.

The model is loaded without its shipped prompt tokens (``--prompt-tokens none``), so the page offers a training;
before the first launch a short real calibration (one prompt) saves this device's profile, so the app never
calibrates in the background. One line per round; the first broken invariant ends the run, named, exit 1.
tests/test_chaos.py runs three rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script: ppd's packages from this checkout

from app.history import ConversationStore  # noqa: E402
from app.trainer_lock import OWNER_NAME, live_trainer  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# no shipped prompt tokens: the page offers a training; --tree auto with the profile seeded below: nothing calibrates
MODEL_ARGS = ["--backend", "llamacpp", "--prompt-tokens", "none", "--tree", "auto"]
SEED_PROFILE = ("import sys; from app import cli; from app.commands.loading import load_engine; "
                "args = cli.build_parser().parse_args(['chat', *sys.argv[1:]]); "
                "engine = load_engine(args, auto_calibrate=False); from ppd_core.engine_calibration import calibrate_engine; "
                "calibrate_engine(engine, prompts=1, max_new_tokens=16, repeats=1); engine.close()")
BROKEN_KINDS = ("truncated", "not a GGUF", "header cut")
STORY = "Write a long story about a dragon who learns to bake bread, with many details."
TRAINING = "Training PPD tokens"
STOP, RESUME, TRAIN = "Stop training", "Resume training", "Train PPD tokens for this model"
STARTUP_SECONDS = 180  # the app serves /health (its model loaded)
ANSWER_SECONDS = 240
TRAINER_SECONDS = 90  # a trainer takes its folder's lock (before its model loads)
TRAINER_ANSWERS = 2  # the trainer's answers before the kill mid-training (it loads torch and the model first: ~40 s)


class Broken(Exception):
    """An invariant that did not hold: its name and what was seen."""

    def __init__(self, invariant: str, seen: str):
        super().__init__(f"{invariant}: {seen}")
        self.invariant, self.seen = invariant, seen


def check(condition: bool, invariant: str, seen: str | Callable[[], str]) -> None:
    if not condition:
        raise Broken(invariant, seen() if callable(seen) else seen)


def wait_for(condition: Callable[[], object], seconds: float, invariant: str, seen: str | Callable[[], str]):
    """``condition()``'s first true value within ``seconds``; else Broken."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise Broken(invariant, seen() if callable(seen) else seen)
        time.sleep(0.2)
    return value


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ---- the folders -----------------------------------------------------------------------------------------------


class Folders:
    """Everything one chaos run writes: the app's data, cache, config and Hub folders, its log, the inputs."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.data = self.root / "data"
        self.log = self.root / "chat.log"
        self.conversations = self.data / "ppd" / "conversations"

    def environment(self, train_options: list[str]) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "PPD_FAULTS"}
        env.update(XDG_DATA_HOME=str(self.data), XDG_CACHE_HOME=str(self.root / "cache"),
                   XDG_CONFIG_HOME=str(self.root / "config"), XDG_STATE_HOME=str(self.root / "state"),
                   HF_HOME=str(self.root / "hf"), HF_HUB_OFFLINE="1", PPD_TRAIN_OPTIONS=shlex.join(train_options))
        return env

    def training_data(self, conversations: int = 2000) -> Path:
        """Short user turns for the tiny training (it answers one at a time: it runs for minutes)."""
        path = self.root / "chats.jsonl"
        path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say something about {n}."}]})
                                + "\n" for n in range(conversations)))
        return path

    def broken_models(self) -> list[Path]:
        """Three broken models, in the order of ``BROKEN_KINDS``."""
        from ppd_core.loading import default_model_file

        whole = default_model_file().read_bytes()
        files = {"truncated.gguf": whole[: len(whole) // 3], "not-a-gguf.gguf": b"these are not weights\n" * 4096,
                 "header-cut.gguf": whole[:4096]}
        for name, content in files.items():
            (self.root / name).write_bytes(content)
        return [self.root / name for name in files]


def tiny_training(data: Path) -> list[str]:
    """`ppd train` options the page's trainings get: one short answer at a time, one thread, nothing evaluated."""
    return ["--samples", "2000", "--generation-batch", "1", "--max-new-tokens", "8", "--data", str(data),
            "--eval-limit", "0", "--acceptance-prompts", "0", "--device", "cpu", "--threads", "1"]


# ---- the app ---------------------------------------------------------------------------------------------------


class App:
    """`ppd chat` on ``port``, one process after another on the same folders."""

    def __init__(self, folders: Folders, port: int, env: dict[str, str]):
        self.folders, self.port, self.env = folders, port, env
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "app.cli", "chat", "--port", str(self.port), *MODEL_ARGS]
        with self.folders.log.open("a") as log:
            log.write(f"----- {time.strftime('%H:%M:%S')} ppd chat -----\n")
            log.flush()
            self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        wait_for(self._serving, STARTUP_SECONDS, "the app starts", lambda: f"no model served: {self.log_tail()}")

    def _serving(self) -> bool:
        check(self.process.poll() is None, "the app starts",
              lambda: f"exit {self.process.returncode}: {self.log_tail()}")
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def kill(self) -> None:
        """``kill -9``: nothing of the app runs after it (its trainer, a process of its own, lives on)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def quit(self, seconds: float = 60.0) -> None:
        """As a service manager stops it (SIGTERM), killed if it has not ended within ``seconds``."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(seconds)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.folders.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "no log"


# ---- the page --------------------------------------------------------------------------------------------------


class Page:
    """The app's page in Chromium (one browser for the whole run; a new page for each launch)."""

    def __init__(self, browser, url: str):
        self.browser, self.url, self.page = browser, url, None

    def open(self) -> None:
        if self.page is not None:
            self.page.close()
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 1100})
        self.page.goto(self.url + "/")
        self.expect("#device", "to_contain_text", "SmolLM2-135M-Instruct", "the page shows the model", 60)
        self.expect("#send", "to_be_enabled", None, "the page can send", 60)

    def expect(self, selector: str, assertion: str, value, invariant: str, seconds: float) -> None:
        """A Playwright expectation on ``selector``; Broken (naming ``invariant``) if it does not come true in time."""
        from playwright.sync_api import expect

        target = expect(self.page.locator(selector))
        try:
            getattr(target, assertion)(*([] if value is None else [value]), timeout=seconds * 1000)
        except AssertionError as error:
            raise Broken(invariant, f"{selector} {assertion} {value!r}: {self.text(selector)!r}") from error

    def text(self, selector: str) -> str:
        try:
            return self.page.locator(selector).inner_text(timeout=5000)
        except Exception as error:  # noqa: BLE001 - for a message only
            return f"<{type(error).__name__}>"

    def clear(self) -> None:
        """A new conversation (the earlier ones stay saved): short prompts for this round."""
        self.page.locator("#clear").click()
        self.expect("#chat", "not_to_contain_text", "Round", "a new conversation", 30)

    def type(self, message: str) -> None:
        self.expect("#send", "to_be_enabled", None, "the page can send", 120)
        self.page.locator("#message textarea").fill(message)
        self.page.locator("#message textarea").press("Enter")

    def load_model(self, spec: str) -> None:
        self.page.locator("#model input").fill(spec)
        self.page.locator("#model input").press("Enter")
        self.page.locator("#load-model").click()

    def training_button(self) -> str:
        """The training button's label ('' while hidden)."""
        button = self.page.locator("#train")
        return button.inner_text().strip() if button.is_visible() else ""


# ---- the checks ------------------------------------------------------------------------------------------------


def user_messages(folders: Folders) -> list[str]:
    return [m["content"] for c in ConversationStore(folders.conversations).list() for m in c.messages
            if m["role"] == "user"]


def saved_answer(folders: Folders, message: str) -> str | None:
    """The whole answer saved after ``message`` (None while there is none, or only an interrupted one)."""
    for conversation in ConversationStore(folders.conversations).list():
        messages = conversation.messages
        for index, turn in enumerate(messages[:-1]):
            following = messages[index + 1]
            if turn == {"role": "user", "content": message} and not following.get("interrupted"):
                return following["content"] or None
    return None


def trainer_processes(folder: Path) -> list[psutil.Process]:
    """Live `ppd train` processes working in ``folder``."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        command = process.info["cmdline"] or []
        if process.info["status"] != psutil.STATUS_ZOMBIE and "train" in command and str(folder) in command:
            found.append(process)
    return found


def one_trainer(folder: Path) -> psutil.Process | None:
    """The one trainer working in ``folder`` (None: none), named by its trainer.json; Broken if two work there."""
    processes = trainer_processes(folder)
    check(len(processes) <= 1, "one trainer per work directory", lambda: f"{len(processes)} trainers: "
          f"{[p.pid for p in processes]}")
    if not processes:
        return None
    owner = wait_for(lambda: live_trainer(folder), TRAINER_SECONDS, "one trainer per work directory",
                     lambda: f"process {processes[0].pid} trains without the lock ({OWNER_NAME}: "
                     f"{_read(folder / OWNER_NAME)!r})")
    check(owner.pid == processes[0].pid, "one trainer per work directory",
          f"{OWNER_NAME} names process {owner.pid}, process {processes[0].pid} trains")
    return processes[0]


def ended(process: psutil.Process) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def trainer_answers(folder: Path) -> int:
    """The trainer's progress in its answering phase (status.json; 0 before it answers)."""
    try:
        status = json.loads(_read(folder / "status.json"))
        return int(status["done"]) if status.get("phase") == "answers" else 0
    except (ValueError, KeyError, TypeError):
        return 0


def cached_answers(folder: Path) -> int:
    """Whole records in the trainer's answer cache (a torn last line does not count)."""
    count = 0
    for line in _read(folder / "answers.jsonl").splitlines():
        try:
            json.loads(line)
        except ValueError:
            break
        count += 1
    return count


def no_leaked_model(app: App) -> None:
    models = app.health().get("llama_cpp_models")
    check(models == 1, "no leaked model", f"{models} llama.cpp models alive in the app (one is loaded)")


# ---- a round ---------------------------------------------------------------------------------------------------


class Chaos:
    """The run: its folders, the app, the page, every message typed so far."""

    def __init__(self, folders: Folders, port: int, browser):
        self.folders = folders
        self.train_options = tiny_training(folders.training_data())
        self.broken = folders.broken_models()
        self.app = App(folders, port, folders.environment(self.train_options))
        self.page = Page(browser, self.app.url)
        self.typed: list[str] = []
        self.work_dir: Path | None = None  # the model's training folder, once known

    def seed_profile(self) -> None:
        """A short real calibration for the app's model options, saved where the app finds it: it never calibrates."""
        done = subprocess.run([sys.executable, "-c", SEED_PROFILE, *MODEL_ARGS], cwd=ROOT, env=self.app.env,
                              capture_output=True, text=True, timeout=600)
        check(done.returncode == 0, "the device profile is seeded", done.stderr.strip()[-500:])

    def launch(self) -> None:
        self.app.start()
        self.page.open()
        line = self.page.text("#startup")
        check("Calibrating" not in line, "nothing calibrates", line)
        self.work_dir = self.folders.data / "ppd" / "train" / self.app.health()["model"]

    def ask(self, message: str) -> str:
        """Type ``message``, wait for its whole answer on disk and on the page."""
        self.typed.append(message)
        self.page.type(message)
        answer = wait_for(lambda: saved_answer(self.folders, message), ANSWER_SECONDS, "the page answers",
                          lambda: f"no answer to {message!r} saved; page: {self.page.text('#note')!r}")
        words = re.findall(r"[A-Za-z]{3,}", answer)[:3]
        for word in words:
            self.page.expect("#chat", "to_contain_text", word, "the page answers", 60)
        self.page.expect("#send", "to_be_enabled", None, "the page answers", 60)
        return answer

    def broken_switch(self, model: Path) -> str:
        """(c) a broken model in the model box: one line, back on the default model, answering, nothing leaked."""
        self.page.load_model(str(model))
        self.page.expect("#startup", "to_contain_text", f"Could not load {model}", "one line on a broken model", 120)
        line = self.page.text("#startup")
        check("\n" not in line.strip(), "one line on a broken model", repr(line))
        check(line.strip().endswith("Back on default."), "back on the previous model", repr(line))
        self.page.expect("#device", "to_contain_text", "SmolLM2-135M-Instruct", "back on the previous model", 60)
        health = self.app.health()
        check(health["status"] == "ok" and health["model"] == "SmolLM2-135M-Instruct", "back on the previous model",
              json.dumps(health))
        no_leaked_model(self.app)
        return line.strip()

    def start_training(self) -> psutil.Process:
        """(d) Train (or Resume) on the page; one trainer takes the folder. An adopted one runs already: kept."""
        label = self.page.training_button()
        check(label in (TRAIN, RESUME, STOP), "training starts", f"the training button says {label!r}")
        if label != STOP:
            self.page.page.locator("#train").click()
        if label == TRAIN:  # Train first says what the run costs: the full run (the tiny options' size) is chosen
            self.page.page.locator("#train-full").click()
        return self.running_training()

    def running_training(self, invariant: str = "training runs") -> psutil.Process:
        """The page shows a training running (Stop offered) and exactly one trainer works in the folder."""
        try:
            self.page.expect("#training", "to_contain_text", TRAINING, invariant, 60)
            self.page.expect("#train", "to_have_text", STOP, invariant, 30)
        except Broken as broken:  # what the trainers wrote says why
            raise Broken(invariant, f"{broken.seen}; train.log: {self.train_log_tail(8)}") from broken
        return wait_for(lambda: one_trainer(self.work_dir), TRAINER_SECONDS, invariant,
                        lambda: f"the page says it trains, no trainer runs: {self.train_log_tail()}")

    def kill_mid_answer(self, message: str, rng: random.Random) -> None:
        """(e) a long answer streams (in a new conversation: the story comes out long); ``kill -9`` within a second
        of its start."""
        self.page.clear()
        self.typed.append(message)
        self.page.type(message)
        self.page.expect("#readout", "to_contain_text", "(streaming)", "the page answers", ANSWER_SECONDS)
        time.sleep(rng.uniform(0.0, 1.0))
        check("(streaming)" in self.page.text("#readout"), "killed mid-answer",
              "the answer ended before the kill (the harness needs a longer one)")
        self.app.kill()

    def resume(self) -> psutil.Process:
        """(g) the training is resumable: a running one stops on the page (Stop), then Resume starts one trainer,
        appending to train.log."""
        if (running := one_trainer(self.work_dir)) is not None:
            self.running_training()
            self.page.page.locator("#train").click()  # Stop
            wait_for(lambda: ended(running), 60, "training resumable", f"trainer {running.pid} did not stop on Stop")
        self.page.expect("#training", "to_contain_text", "stopped", "training resumable", 30)
        self.page.expect("#train", "to_have_text", RESUME, "training resumable", 30)
        check(one_trainer(self.work_dir) is None, "training resumable", "a trainer runs after Stop")
        earlier = _read(self.work_dir / "train.log")
        self.page.page.locator("#train").click()  # Resume
        trainer = self.running_training()
        log = _read(self.work_dir / "train.log")
        check(log.startswith(earlier) and "resumed `ppd train`" in log[len(earlier):], "training resumable",
              "train.log was not appended to")
        return trainer

    def messages_on_disk(self) -> None:
        on_disk = set(user_messages(self.folders))
        lost = [message for message in self.typed if message not in on_disk]
        check(not lost, "every typed message is on disk", f"lost: {lost}")

    def train_log_tail(self, count: int = 3) -> str:
        lines = _read(self.work_dir / "train.log").strip().splitlines() if self.work_dir else []
        return " | ".join(lines[-count:])

    def round(self, number: int) -> str:
        """One round, (a) to (g); its verdict line. Broken on the first invariant that does not hold."""
        rng = random.Random(number)
        started, took = time.monotonic(), Phases()
        self.app.quit()  # (a) the last round's app, stopped as a service manager does
        self.launch()
        self.page.clear()
        took("quit, launch")
        self.ask(f"Round {number}: say hello in three words.")  # (b)
        took("answer")
        broken = self.broken[(number - 1) % len(self.broken)]
        self.broken_switch(broken)  # (c)
        took("broken model")
        self.ask(f"Round {number}: name one color.")
        trainer = self.start_training()  # (d)
        took("answer, training started")
        self.kill_mid_answer(f"Round {number}: {STORY}", rng)  # (e)
        self.app.start()  # (f) the trainer outlived the app: adopted, not started twice
        self.page.open()
        adopted = self.running_training("adopted, not run twice")
        took("kill, adopted")
        check(adopted.pid == trainer.pid, "adopted, not run twice", f"trainer {trainer.pid}, now {adopted.pid}")
        # mid-training: once the trainer answers its conversations (before, it loads torch and its model: ~40 s)
        answered = wait_for(lambda: (done := trainer_answers(self.work_dir)) >= TRAINER_ANSWERS and done,
                            ANSWER_SECONDS, "training runs",
                            lambda: f"no answers from the trainer: {self.train_log_tail()}")
        check(adopted.is_running(), "training runs", lambda: f"the trainer ended: {self.train_log_tail()}")
        took("trainer answering")
        self.app.kill()
        also = number % 2 == 0  # the trainer dies too: a stale lock is left behind
        if also:
            adopted.kill()
            adopted.wait(30)
        self.launch()  # (g)
        self.messages_on_disk()
        kept = cached_answers(self.work_dir)
        check(kept >= answered, "the trainer's answers are on disk", f"{answered} answered, {kept} cached")
        one_trainer(self.work_dir)
        no_leaked_model(self.app)
        took("kill, relaunch")
        resumed = self.resume()
        took("stop, resume")
        self.ask(f"Round {number}: what is two plus two?")
        no_leaked_model(self.app)
        self.messages_on_disk()
        took("answer")
        kind = BROKEN_KINDS[(number - 1) % len(BROKEN_KINDS)]
        return (f"round {number}: ok in {time.monotonic() - started:.0f} s: answered; {kind} model refused in one "
                f"line, back on the default; training {trainer.pid} adopted after kill -9 mid-answer, then "
                f"mid-training ({answered} answers in){' (trainer killed too)' if also else ''}; {len(self.typed)} "
                f"messages and {kept} trainer answers on disk, one trainer ({resumed.pid}, resumed), one llama.cpp "
                f"model; the page answers (seconds: {took})")

    def close(self) -> None:
        """Quit the app; trainers left working in the folder (one, or more where an invariant broke) are stopped
        (SIGTERM: resumable), killed after 30 s."""
        self.app.quit()
        left = trainer_processes(self.work_dir) if self.work_dir is not None else []
        for process in left:
            process.terminate()
        for process in psutil.wait_procs(left, timeout=30)[1]:
            process.kill()


class Phases:
    """Seconds per phase of a round, called with each phase's name as it ends; ``str``: "launch 3, answer 2, ..."."""

    def __init__(self):
        self.last, self.spent = time.monotonic(), []

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.spent.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.0f}" for name, seconds in self.spent)


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def run(rounds: int, folder: Path, port: int | None = None, say: Callable[[str], None] = print) -> list[str]:
    """``rounds`` chaos rounds with the app's folders in ``folder``; their verdict lines. Broken on the first
    invariant that does not hold (the app and its trainer are stopped either way)."""
    with chromium() as browser:
        chaos = Chaos(Folders(folder), port or free_port(), browser)
        try:
            chaos.seed_profile()
            verdicts = []
            for number in range(1, rounds + 1):
                verdicts.append(chaos.round(number))
                say(verdicts[-1])
            return verdicts
        finally:
            chaos.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=None, help="the app's port (default: a free one)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the app's folders, its log and the trainer's work here (default: a temporary "
                        "folder, removed)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="ppd-chaos-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        run(args.rounds, folder, args.port)
    except Broken as broken:
        print(f"BROKEN: {broken} (the app's log: {folder / 'chat.log'})", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"all {args.rounds} rounds held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
