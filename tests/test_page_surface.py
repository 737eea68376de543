"""Issue 50, page items 9 and 11: the page speaks plainly on its surface, its figures behind a Details toggle (the device
panel's step costs and lookup chains, the repeat window's special values), and the model picker names the model, its
quantization and its size rather than "default"."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from app.history import ConversationStore
from app.model_catalog import choices, file_facts, local_facts, model_label
from app.model_host import ModelHost
from app.page_text import SAMPLING_LABELS
from app.system_info import device_panel
from app.ui import build_app
from ppd_core import Engine, EngineConfig
from ppd_core.calibration.profiles import read_profile
from page_open import CHROMIUM, CHROMIUM_ARGS
from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
NUMBER_LIST = re.compile(r"\d+(?:\.\d+)?/\d+(?:\.\d+)?(?:/\d+)?")  # "1/2/4", "80.06/163.06", "0/3/3"
DEFAULT_LABEL = re.compile(r"^SmolLM2-135M-Instruct · Q4_1 · \d+ MB \(default\)$")


def surface(panel: str) -> str:
    """The panel's text outside its Details toggle."""
    return re.sub(r"<details>.*?</details>", "", panel, flags=re.DOTALL)


def test_the_device_panels_figures_are_behind_details_and_its_surface_is_plain_words(llama_default):
    profile = read_profile(ROOT / "profiles" / "llamacpp-amd-epyc-avx2build-2threads.json")
    policy = dataclasses.replace(profile.policy, fixed_ms={1: 80.06, 2: 163.06, 4: 170.2, 8: 190.5})
    profile = dataclasses.replace(profile, step_policy=policy.to_json())
    before = llama_default.plan  # the session's engine, as earlier tests left it: this test's own plan, then theirs
    llama_default.replan(None, tree="medium", lookup=3)
    try:
        snapshot = llama_default.snapshot()
    finally:
        llama_default.plan = before
    snapshot = dataclasses.replace(snapshot, profile=profile, tree={**snapshot.tree, "step_policy": profile.policy.line()})
    panel = device_panel(snapshot)
    shown, details = surface(panel), panel[panel.index("<details>"):]
    # the issue's examples are in Details, with their numbers
    assert "a fixed shape would cost 1/2/4/8 rows: 80.06/163.06/170.20/190.50 ms" in details
    assert "chains of 3/3/3/3/3/3 tokens after a match of 1/2/3/4-7/8-15/16+ tokens" in details
    assert not NUMBER_LIST.search(shown), shown
    assert "rows" not in shown and "chains of" not in shown and "ms" not in shown.split()
    assert "**PPD guesses:** the model's prompt tokens and text repeated from the conversation" in shown
    assert "**Steps:** guesses checked together with the next token" in shown
    assert "SmolLM2-135M-Instruct" in shown  # the model by name on the surface


def test_the_picker_names_each_model_by_its_name_quantization_and_size(tmp_path):
    assert file_facts("SmolLM2-135M-Instruct.Q4_1.gguf", 103_000_000) == "SmolLM2-135M-Instruct · Q4_1 · 103 MB"
    assert file_facts("qwen2.5-0.5b-instruct-q8_0.gguf", 531_000_000) == "qwen2.5-0.5b-instruct · Q8_0 · 531 MB"
    assert file_facts("model.gguf", 2_400_000_000) == "model · GGUF · 2.4 GB"
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"0" * 3_000_000)
    assert local_facts(folder) == "tiny-llama · safetensors · 3 MB"
    assert model_label(str(folder), {}) == f"tiny-llama · safetensors · 3 MB ({folder})"
    assert model_label("hf:me/tiny:tiny-Q8_0.gguf", {"hf:me/tiny:tiny-Q8_0.gguf": ("tiny-Q8_0.gguf", 5_000_000)}) \
        == "tiny · Q8_0 · 5 MB (me/tiny)"
    assert model_label("hf:me/not-downloaded", {}) == "hf:me/not-downloaded"  # nothing on disk to read: as typed
    assert model_label(str(tmp_path / "missing.gguf"), {}) == str(tmp_path / "missing.gguf")
    listed = choices("default")
    assert listed[0][1] == "default" and DEFAULT_LABEL.match(listed[0][0]), listed


@pytest.mark.slow
def test_the_page_shows_plain_words_with_the_figures_behind_details_and_the_models_name_in_the_picker(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    engine = Engine.load(EngineConfig(model="default", tree="medium", auto_calibrate=False, threads=1, lookup=3))
    service = ModelHost(engine, spec="default")
    app, port = build_app(service, ConversationStore(tmp_path / "conversations")), free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"http://127.0.0.1:{port}/")
            device = page.locator("#device")
            expect(device).to_contain_text("PPD guesses", timeout=60_000)
            expect(device.get_by_text("chains of", exact=False)).to_be_hidden()  # Details closed
            shown = device.inner_text()  # what a person sees
            assert not NUMBER_LIST.search(shown) and "chains of" not in shown, shown
            assert "text repeated from the conversation" in shown
            device.locator("summary").click()
            expect(device).to_contain_text("chains of 3/3/3/3/3/3 tokens after a match of 1/2/3/4-7/8-15/16+ tokens")

            picker = page.locator("#model input")
            expect(picker).to_have_value(DEFAULT_LABEL)  # not "default"

            page.get_by_text("Repetition penalties (llama.cpp's)").click()
            window = page.locator("#repeat-last-n")
            expect(window).to_contain_text("how many recent tokens the penalties look at")
            assert "-1" not in window.locator("label, span").first.inner_text()
            penalties = page.locator("#penalty-details")
            expect(penalties.get_by_text("-1 looks at", exact=False)).to_be_hidden()  # until Details is opened
            penalties.locator("summary").click()
            expect(penalties).to_contain_text("-1 looks at the whole conversation, 0 turns the penalties off")
            browser.close()
        assert "-1" not in SAMPLING_LABELS["repeat_last_n"]
    finally:
        app.close()
        service.shutdown()
