"""Atomic writes survive kills and errors; private files stay private; GGUF conversions are locked and pruned."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ppd_core import atomic_files
from ppd_core.backends.torch import gguf_copy
from ppd_core.atomic_files import atomic_directory, atomic_output, atomic_write

REPO = Path(__file__).resolve().parents[1]
OLD = b'{"old": true}\n'


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_sigkill_between_write_and_rename_leaves_the_old_file(tmp_path):
    target = tmp_path / "conv.json"
    target.write_bytes(OLD)
    ready = tmp_path / "ready"
    payload_size = 4 * 2**20
    child = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from ppd_core import atomic_files

        def stall(src, dst):  # the temp is written and fsynced: tell the parent, then hang before the rename
            with open({str(ready)!r}, "w") as f:
                f.write(str(src))
            time.sleep(600)

        atomic_files.os.replace = stall
        atomic_files.atomic_write({str(target)!r}, b"n" * {payload_size})
    """)
    process = subprocess.Popen([sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text()):
            assert process.poll() is None, "the child exited before reaching the rename"
            assert time.monotonic() < deadline, "the child never reached the rename"
            time.sleep(0.05)
        temp = Path(ready.read_text())
        assert temp.parent == tmp_path and temp.name.startswith(".") and temp.stat().st_size == payload_size
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert process.returncode == -signal.SIGKILL
    assert target.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["conv.json"]  # the leftover temp is hidden


def test_error_before_rename_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "conv.json"
    target.write_bytes(OLD)

    def fail(src, dst):
        assert Path(src).read_bytes() == b"new"  # the temp was complete when the rename failed
        raise OSError("disk on fire")

    monkeypatch.setattr(atomic_files.os, "replace", fail)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write(target, b"new")
    assert target.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["conv.json"]


def test_write_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "fsync", fsync)
    monkeypatch.setattr(atomic_files.os, "replace", replace)
    path = atomic_write(tmp_path / "sub" / "a.txt", "héllo")
    assert path.read_text(encoding="utf-8") == "héllo"
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_private_files_are_0600_in_0700_folders_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        existing = tmp_path / "existing"
        existing.mkdir(mode=0o755)
        atomic_write(existing / "a.json", "{}", private=True)
        assert mode(existing / "a.json") == 0o600 and mode(existing) == 0o700

        deep = tmp_path / "new" / "deeper" / "b.json"
        atomic_write(deep, "{}", private=True)
        assert mode(deep) == 0o600
        assert mode(tmp_path / "new") == 0o700 and mode(tmp_path / "new" / "deeper") == 0o700

        public = atomic_write(tmp_path / "public" / "c.json", "{}")
        assert mode(public) == 0o644
    finally:
        os.umask(previous)


def test_saved_conversations_are_private(tmp_path):
    from app.history import Conversation, ConversationStore

    store = ConversationStore(tmp_path / "data" / "conversations")
    path = store.save(Conversation(messages=[{"role": "user", "content": "secret ✓"}]))
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert store.list()[0].messages[0]["content"] == "secret ✓"
    exported = store.export(store.list()[0], "md", tmp_path / "out")
    assert mode(exported) == 0o600 and "secret ✓" in exported.read_text(encoding="utf-8")  # an export is as private
    assert sorted(p.name for p in path.parent.iterdir()) == [".store.lock", path.name]  # no temp left behind


def test_atomic_output_error_keeps_the_old_file_and_removes_the_temp(tmp_path):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(OLD)
    with pytest.raises(RuntimeError, match="writer crashed"):
        with atomic_output(target) as temp:
            assert temp.parent == tmp_path and temp.name.startswith(".") and temp != target
            temp.write_bytes(b"half a check")
            raise RuntimeError("writer crashed")
    assert target.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["ckpt.pt"]

    with atomic_output(target, private=True) as temp:
        temp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and mode(target) == 0o600
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_training_files_are_written_atomically(tmp_path):
    import torch

    from ppd_core.training.trainer import save_checkpoint, write_json

    save_checkpoint(tmp_path / "checkpoint.pt", {"step": 3, "embeddings": torch.ones(2)})
    write_json(tmp_path / "summary.json", {"steps": 3})
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 3
    assert json.loads((tmp_path / "summary.json").read_text()) == {"steps": 3}
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "summary.json"]


def test_atomic_directory_renames_the_staging_folder_into_place(tmp_path):
    target = tmp_path / "cache" / "model-1"
    with atomic_directory(target) as staging:
        assert staging.parent == target.parent and staging.name.startswith(".") and not target.exists()
        (staging / "config.json").write_text("{}")
    assert (target / "config.json").read_text() == "{}"
    assert os.listdir(target.parent) == ["model-1"]

    with pytest.raises(ValueError):
        with atomic_directory(tmp_path / "cache" / "model-2") as staging:
            (staging / "half").write_text("x")
            raise ValueError
    assert os.listdir(target.parent) == ["model-1"]


def test_atomic_directory_keeps_a_target_that_appeared_meanwhile(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("ours")
        target.mkdir()  # another process finished first
        (target / "config.json").write_text("theirs")
    assert (target / "config.json").read_text() == "theirs"
    assert os.listdir(tmp_path) == ["model"]


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """The cache in tmp_path, and a conversion that takes 0.5 s and records its calls."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(gguf_copy.platformdirs, "user_cache_dir", lambda *args, **kwargs: str(cache))
    calls, started = [], threading.Event()

    def convert(gguf_file, staging):
        calls.append(gguf_file)
        started.set()
        time.sleep(0.5)
        (staging / "config.json").write_text(json.dumps({"from": str(gguf_file)}))

    monkeypatch.setattr(gguf_copy, "_convert_gguf", convert)
    return cache / "gguf", calls, started


def make_gguf(folder: Path, content: bytes = b"GGUF fake") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.gguf").write_bytes(content)
    return folder


def test_concurrent_conversions_of_one_gguf_convert_once(tmp_path, fake_conversion, caplog):
    cache, calls, started = fake_conversion
    folder = make_gguf(tmp_path / "models")
    results, finished = {}, {}

    def run(name):
        results[name] = gguf_copy.converted_gguf_dir(folder / "model.gguf")
        finished[name] = time.monotonic()

    caplog.set_level(logging.WARNING, logger=gguf_copy.__name__)
    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert started.wait(10)
    second_started = time.monotonic()
    second = threading.Thread(target=run, args=("second",))
    second.start()
    first.join(10)
    second.join(10)

    assert len(calls) == 1
    assert results["first"] == results["second"] and (results["first"] / "config.json").is_file()
    assert second_started < finished["first"] <= finished["second"]  # the second overlapped, then waited
    assert any("waiting" in record.getMessage() for record in caplog.records)
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [results["first"].name]

    assert gguf_copy.converted_gguf_dir(folder / "model.gguf") == results["first"]  # a cache hit
    assert len(calls) == 1


def test_a_new_conversion_removes_stale_ones_of_the_same_file(tmp_path, fake_conversion):
    cache, calls, _ = fake_conversion
    folder = make_gguf(tmp_path / "models")
    other = make_gguf(tmp_path / "elsewhere", b"another model, same file name")
    old = gguf_copy.converted_gguf_dir(folder / "model.gguf")
    kept = gguf_copy.converted_gguf_dir(other / "model.gguf")
    leftover = cache / f".{old.name}.1234-abcdef.staging"  # a killed conversion's staging folder
    leftover.mkdir()
    unrelated = cache / "model-q4-0123456789abcdef"
    unrelated.mkdir()

    stat_before = (folder / "model.gguf").stat()
    os.utime(folder / "model.gguf", ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns + 10**9))  # edited
    new = gguf_copy.converted_gguf_dir(folder / "model.gguf")

    assert new != old and len(calls) == 3
    assert not old.exists() and not leftover.exists()
    assert (new / "config.json").is_file() and (kept / "config.json").is_file() and unrelated.is_dir()
