"""Issue 50, page item 3 and the API's first-launch wait: on a first launch (`ppd chat` from empty folders, its own
process, the default model on llama.cpp), an answer asked for while the background calibration runs goes first: the
calibration pauses for it at its next pause point and goes on after. The page says so ("pausing it for your answer"),
never "1 answer ahead" when no answer is; an API request is served the same way, and /health says what holds the model.

Ordering, not speed: the calibration still runs once the answer has ended (it began before the calibration ended),
and it counts the calls it paused for. The time to the first token (3 s on a quiet machine) is a measurement:
benchmarks/scripts/answer_during_calibration.py."""

import json
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from page_open import CHROMIUM, CHROMIUM_ARGS, reach
from test_page_readout import ROOT
from ports import free_port

pytestmark = pytest.mark.slow
COUNTED = re.compile(r"Calibrating this device in the background \([a-z' ]+ \d+/\d+")  # it holds the model, counting
NOTES = """() => { window.notes = []; const note = document.querySelector('#note');
    new MutationObserver(() => window.notes.push(note.innerText))
        .observe(note, {subtree: true, childList: true, characterData: true}); }"""  # every text the note ever shows


@pytest.fixture(scope="module")
def first_launch(tmp_path_factory):
    """`ppd chat` with data, settings and state folders of its own, empty (a first launch: it calibrates in the
    background), and a Chromium page on it once the model is ready; (page, port)."""
    from playwright.sync_api import expect, sync_playwright

    port, home = free_port(), tmp_path_factory.mktemp("first-launch")
    folders = {name: str(home / name.lower()) for name in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    process = subprocess.Popen([sys.executable, "-c", "from app.cli import entry; entry()", "chat", "--port", str(port)],
                               cwd=ROOT, env={**os.environ, **folders}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            tab = browser.new_page(viewport={"width": 1400, "height": 1100})
            reach(tab, f"http://127.0.0.1:{port}/", process, 120)
            expect(tab.locator("#startup")).to_contain_text(COUNTED, timeout=300_000)
            yield tab, port
            browser.close()
    finally:
        process.terminate()
        process.wait(60)


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60) as response:
        return json.load(response)


def test_an_answer_during_the_calibration_goes_first_and_no_answer_is_said_ahead(first_launch):
    from playwright.sync_api import expect

    tab, port = first_launch
    before = health(port)
    expect(tab.locator("#send")).to_be_enabled()
    tab.evaluate(NOTES)
    tab.locator("#message textarea").fill("Say hello.")
    tab.locator("#send").click()
    readout = tab.locator("#readout")
    expect(readout).to_contain_text("tokens/s", timeout=300_000)
    expect(readout).not_to_contain_text("(streaming)", timeout=300_000)
    after = health(port)
    notes = tab.evaluate("window.notes")
    assert not [note for note in notes if "ahead" in note], notes  # no answer was ahead: none is said
    assert any("pausing it for your answer" in note for note in notes), notes  # what it waited for, said
    assert after["background"] and after["background"].startswith("Calibrating"), after  # it has not ended yet
    assert "Calibrating this device in the background" in tab.locator("#startup").inner_text()
    assert before.get("held_by") == "background calibration", before  # the answer came while it held the model
    assert after["calibration_paused_for"] > before["calibration_paused_for"], (before, after)  # it paused for it


def test_an_api_request_during_the_calibration_goes_first(first_launch):
    _, port = first_launch
    before = health(port)
    assert before["held_by"] == "background calibration", before
    body = {"model": "default", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.load(response)
    assert answer["choices"][0]["message"]["content"].strip() and answer["ppd"]["queued_seconds"] >= 0
    after = health(port)
    assert after["background"] and after["background"].startswith("Calibrating"), after
    assert after["calibration_paused_for"] > before["calibration_paused_for"], (before, after)
