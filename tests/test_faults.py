"""Faults that must lose nothing: `ppd chat` killed with SIGKILL in the middle of a streamed answer."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_layout import new_session
from app.page_text import INTERRUPTED
from app.ui import build
from ports import free_port

pytestmark = pytest.mark.slow

STORY = "Write a long story about a dragon who learns to bake bread."


def launch_chat(data_home: Path, port: int) -> subprocess.Popen:
    """`ppd chat` on the default model (llama.cpp, a built-in tree: no calibration), its data in ``data_home``."""
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    command = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", "chat", "--port", str(port),
               "--backend", "llamacpp", "--tree", "medium"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while True:
        assert process.poll() is None, process.stderr.read()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "ppd chat did not start"
        time.sleep(0.2)


def test_sigkill_six_seconds_into_an_answer_keeps_the_message_and_the_answer_so_far(tmp_path, llama_default):
    from gradio_client import Client

    port = free_port()
    process = launch_chat(tmp_path, port)
    try:
        job = Client(f"http://127.0.0.1:{port}/", verbose=False).submit(
            STORY, "", 1024, True, "lossless", False, "", 0.0, 1.0, api_name="/send")
        deadline = time.monotonic() + 120
        while not job.outputs():  # the first streamed update: the answer has begun
            assert time.monotonic() < deadline and not job.done(), "the answer did not start"
            time.sleep(0.05)
        time.sleep(6.0)
        assert not job.done(), "the answer ended before the kill: the test needs a longer one"
        streamed = [u[0] for u in job.outputs() if isinstance(u[0], list) and u[0] and u[0][-1]["role"] == "assistant"]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    assert process.returncode == -signal.SIGKILL

    store = ConversationStore(tmp_path / "ppd" / "conversations")
    [saved] = store.list()
    user, answer = saved.messages
    assert user == {"role": "user", "content": STORY}
    assert answer["role"] == "assistant" and answer["interrupted"] and len(answer["content"]) > 40
    shown = streamed[-1][-1]["content"]
    shown = shown if isinstance(shown, str) else shown[0]["text"]
    assert shown.startswith(answer["content"][:40])  # the answer the page showed, saved a few seconds behind at most

    # the next launch opens it again, marked interrupted, and Regenerate answers it whole (the default model on
    # llama.cpp with a static tree, as launched: the session's)
    engine = llama_default
    try:
        handlers = build(ModelHost(engine), store)[1]
        page = handlers.page
        opened = handlers.load(new_session())
        session, chat = opened[page.session], opened[page.chat.chatbot]
        assert session.conversation.id == saved.id and chat[0]["content"] == STORY
        assert chat[1]["content"] == answer["content"] + INTERRUPTED
        list(handlers.answers.regenerate(session, "", 32, True, "lossless", False))
        expected = engine.generate(engine.chat_ids([user]), "plain", 32).text
        # whole now, by the model named, and ended at the 32-token limit (its bubble says so)
        assert store.load(saved.id).messages == [user, {"role": "assistant", "content": expected,
                                                        "model": engine.loaded.name, "length_limit": True}]
    finally:
        engine.forget_conversation()
