"""Chaos: three bounded rounds of benchmarks/scripts/chaos.py against a real `ppd chat` in Chromium (load, a broken
model and back, a training, kill -9 mid-answer and mid-training, restarts); each ends with every typed message on disk,
one trainer per work directory, no leaked llama.cpp model, the training resumable and the page answering."""

from __future__ import annotations

import importlib.util
import shutil
import socket
from pathlib import Path

import pytest

from app.cli import main
from app.commands.chat import TRAIN_OPTIONS_ENV

ROOT = Path(__file__).resolve().parent.parent


def load_chaos():
    spec = importlib.util.spec_from_file_location("chaos", ROOT / "benchmarks" / "scripts" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_three_chaos_rounds_lose_nothing_leak_nothing_and_run_no_training_twice(tmp_path):
    chaos = load_chaos()
    verdicts = []
    try:
        chaos.run(3, tmp_path, say=verdicts.append)
    except chaos.Broken as broken:
        log = (tmp_path / "chat.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"after {len(verdicts)} rounds held, broken: {broken}\n{log}")
    finally:  # pytest keeps the last runs' folders: not the trainer's float32 conversion (0.5 GB), nor the models
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        for model in tmp_path.glob("*.gguf"):
            model.unlink()
    assert [line.startswith(f"round {number}: ok") for number, line in enumerate(verdicts, 1)] == [True] * 3, verdicts


def test_training_options_that_do_not_split_are_one_line(monkeypatch, capsys):
    monkeypatch.setenv(TRAIN_OPTIONS_ENV, '--data "my chats.jsonl')
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["chat", "--port", str(port)]) == 2
    assert capsys.readouterr().err == f"ppd: error: {TRAIN_OPTIONS_ENV}: No closing quotation\n"
