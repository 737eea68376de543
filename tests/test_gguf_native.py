"""A GGUF file runs on llama.cpp end to end: no torch, no transformers, no converted copy, and bad files are
one line each.

Each command runs in a fresh interpreter (what is imported is the claim), with its own empty data and cache
folders; after it has answered, the interpreter reports whether torch or transformers were imported and
whether libtorch is mapped into the process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ppd_core.loading import default_model_file
from ports import free_port

pytestmark = pytest.mark.slow

# runs a command of `ppd` in-process, then prints what the interpreter holds as its last line (JSON)
PROBE = textwrap.dedent("""
    import json, sys
    from app.cli import main
    code = main(sys.argv[1:])
    maps = open("/proc/self/maps").read()
    print(json.dumps({"code": code, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                      "libtorch": "libtorch" in maps}))
""")


def fresh_env(tmp_path: Path) -> dict:
    """Empty data, cache and Hub folders, as a new user has."""
    env = dict(os.environ)
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "HF_HOME"):
        env[name] = str(tmp_path / name.lower())
    return env


def probe(tmp_path: Path, *args: str, timeout: int = 600) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=fresh_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    return json.loads(lines[-1]), done.stderr


# generate on a static tree: a first launch's calibration is the calibrate command's code, probed on its own below
@pytest.mark.parametrize("command", [
    ["generate", "Say hello.", "--max-new-tokens", "16", "--threads", "2", "--tree", "medium"],
    ["bench", "--limit", "1", "--max-new-tokens", "8", "--threads", "2", "--tree", "medium"],
    ["calibrate", "--threads", "1"],
])
def test_commands_on_a_gguf_import_neither_torch_nor_transformers(tmp_path, command):
    report, stderr = probe(tmp_path, *command)
    assert report == {"code": 0, "torch": False, "transformers": False, "libtorch": False}, stderr
    cache = tmp_path / "xdg_cache_home"
    assert not any(cache.rglob("*.safetensors")), "a GGUF must not be converted"


CHAT_PROBE = textwrap.dedent("""
    import json, sys, threading, time, urllib.request
    from app.cli import main
    port = sys.argv[1]
    threading.Thread(target=main, args=(["chat", "--port", port, "--threads", "1"],), daemon=True).start()
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": 16, "temperature": 0}).encode()
    deadline = time.time() + 500
    while True:
        try:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=60).status
    maps = open("/proc/self/maps").read()
    print(json.dumps({"page": page, "text": answer["choices"][0]["message"]["content"],
                      "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules,
                      "libtorch": "libtorch" in maps}))
""")


def test_ppd_chat_answers_without_torch_or_transformers(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHAT_PROBE, str(free_port())], env=fresh_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    report = json.loads(lines[-1])
    assert report["page"] == 200 and report["text"].strip(), done.stderr
    assert (report["torch"], report["transformers"], report["libtorch"]) == (False, False, False), done.stderr


def copy_of_default(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    shutil.copyfile(default_model_file(), path)
    return path


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=fresh_env(tmp_path), capture_output=True,
                          text=True, timeout=300)


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    """Exit code 2 and one line on stderr naming the cause; no traceback."""
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("ppd: error:")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_bad_gguf_files_are_one_line_each(tmp_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are my notes, not a model\n" * 100)
    one_line_error(run_cli(tmp_path, "generate", "hi", "--model", str(not_gguf)), "not a GGUF")

    truncated = copy_of_default(tmp_path, "truncated.gguf")
    with truncated.open("r+b") as handle:
        handle.truncate(truncated.stat().st_size // 2)
    one_line_error(run_cli(tmp_path, "generate", "hi", "--model", str(truncated)), "truncated")

    unknown = tmp_path / "unknown.gguf"
    import gguf

    writer = gguf.GGUFWriter(unknown, arch="notanarch")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    one_line_error(run_cli(tmp_path, "generate", "hi", "--model", str(unknown)), "notanarch")

    one_line_error(run_cli(tmp_path, "generate", "hi", "--quant", "4bit"), "own quantization")


def test_a_model_too_big_for_the_free_memory_is_one_line(tmp_path, monkeypatch):
    from ppd_core.backends.llamacpp import info as gguf_info
    from ppd_core.backends.llamacpp import loading as gguf_loading  # imported before the patch: it copies the name
    from ppd_core.errors import PpdError
    from ppd_core.loading import load_model

    monkeypatch.setattr(gguf_info, "available_memory", lambda: 150 * 2**20)  # 150 MiB free: file + cache do not fit
    monkeypatch.setattr(gguf_loading, "available_memory", lambda: 150 * 2**20)
    with pytest.raises(PpdError, match="needs about .* GiB .* but only .* GiB is free"):
        load_model("default")
