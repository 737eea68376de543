"""Switching models in the app: a Hub model picked on the page (a local fake Hub), answered with, and back."""

import gc

import httpx
import huggingface_hub
import psutil
import pytest

from app.api import api_routes
from app.chat import Chat
from app.chat_settings import ChatSettings
from app.history import ConversationStore
from app.model_catalog import available, recent
from app.model_host import ModelHost
from app.ui import build_app
from fake_hub import FakeHub
from ppd_core import Engine, EngineConfig, hub
from ports import free_port

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
QUESTION = "Hello there."


def load(spec: str, progress=None) -> Engine:
    """What `ppd chat` loads a picked model with (its own options, another --model)."""
    return Engine.load(EngineConfig(model=spec, tree="auto", auto_calibrate=False), progress)


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_the_page_switches_to_a_hub_model_answers_with_it_and_switches_back(tiny_model_dir, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    with FakeHub() as fake, pytest.MonkeyPatch.context() as patch:
        fake.repos["me/tiny-llama"] = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
        patch.setattr(huggingface_hub.constants, "ENDPOINT", fake.url)
        patch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}")
        patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        service = ModelHost(load("default"), spec="default", loader=load)
        store = ConversationStore(tmp_path / "conversations")
        app = build_app(service, store)
        port = free_port()
        app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                   app_kwargs={"routes": api_routes(service)})
        url = f"http://127.0.0.1:{port}"
        try:
            before = rss()
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(url + "/")
                device = page.locator("#device")
                expect(device).to_contain_text("SmolLM2-135M-Instruct", timeout=60_000)

                page.locator("#model input").fill("hf:me/tiny-llama")
                page.locator("#model input").press("Enter")
                page.locator("#load-model").click()
                expect(device).to_contain_text("tiny-llama", timeout=180_000)  # downloaded from the Hub and loaded
                expect(page.locator("#send")).to_be_enabled()
                assert service.spec == "hf:me/tiny-llama" and "hf:me/tiny-llama" in recent()

                # the API lists both; a request naming the one not loaded is a clear 400
                listed = httpx.get(f"{url}/v1/models").json()["data"]
                assert listed[0]["id"] == "tiny-llama" and listed[0]["ppd"]["loaded"] and listed[0]["ppd"]["model"] == "hf:me/tiny-llama"
                assert {"id": "default", "loaded": False} in [{"id": m["id"], "loaded": m["ppd"]["loaded"]} for m in listed]
                refused = httpx.post(f"{url}/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": "Hi"}]})
                assert refused.status_code == 400 and refused.json()["error"]["code"] == "model_not_loaded"

                page.locator("#message textarea").fill(QUESTION)
                page.locator("#send").click()
                expect(page.locator("#readout")).to_contain_text("tokens/s", timeout=120_000)
                expect(page.locator("#readout")).not_to_contain_text("(streaming)", timeout=180_000)
                local = Engine.load(EngineConfig(model=str(tiny_model_dir), tree="auto", auto_calibrate=False))
                expected = local.generate(local.chat_ids([{"role": "user", "content": QUESTION}]), "plain", 256).text
                [saved] = [c for c in store.list() if c.messages and c.messages[0]["content"] == QUESTION]
                assert saved.messages[1]["content"] == expected  # answered by the picked model
                del local

                page.locator("#model input").fill("default")
                page.locator("#model input").press("Enter")
                page.locator("#load-model").click()
                expect(device).to_contain_text("SmolLM2-135M-Instruct", timeout=180_000)
                expect(page.locator("#send")).to_be_enabled()
                browser.close()
            assert service.spec == "default" and "hf:me/tiny-llama" in available("default")
            after = rss()
            assert after <= 1.10 * before, (before, after)  # the tiny model's memory went with it
        finally:
            app.close()
            if service.ready:
                service.engine.close()
    

def test_a_model_that_cannot_load_brings_the_previous_one_back(tiny_model_dir, tmp_path):
    service = ModelHost(load(str(tiny_model_dir)), spec=str(tiny_model_dir), loader=load)
    with pytest.raises(ValueError, match="model not found"):
        service.switch(str(tmp_path / "no-such-model"))
    assert service.ready and service.spec == str(tiny_model_dir) and not service.switching
    assert service.switch_note.startswith(f"Could not load {tmp_path / 'no-such-model'}: model not found")
    assert service.switch_note.endswith(f"Back on {tiny_model_dir}.")
    messages = [{"role": "user", "content": QUESTION}]
    *_, last = Chat(service).answer(messages, ChatSettings(max_new_tokens=16))
    assert last.text == service.engine.generate(service.engine.chat_ids(messages), "plain", 16).text
