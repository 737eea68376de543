"""Models from the Hugging Face Hub (``hf:OWNER/REPO``, ``hf:OWNER/REPO:FILE.gguf``), served by a local fake Hub."""

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest

from fake_hub import FakeHub
from ppd_core import hub
from ppd_core import Engine, EngineConfig
from ppd_core.loading import default_model_file

QUESTION = "Name the capital city of France."
ROOT = Path(__file__).resolve().parent.parent


def ppd_generate(model: str, hub_url: str, home: Path, *extra: str) -> subprocess.CompletedProcess:
    """`ppd generate` in a fresh process whose Hub is ``hub_url`` and whose Hub cache is under ``home``."""
    env = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    command = [sys.executable, "-m", "app.cli", "generate", QUESTION, "--model", model, "--max-new-tokens", "24",
               "--mode", "plain", "--json", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """The tiny random Llama (safetensors, with a README the download leaves out) and the default model's GGUF."""
    with FakeHub() as fake:
        fake.repos["me/tiny-llama"] = {path.name: path.read_bytes() for path in tiny_model_dir.iterdir() if path.is_file()}
        fake.repos["me/tiny-llama"]["README.md"] = b"# a tiny random Llama"
        fake.repos["me/smol-gguf"] = {"smol.Q4_1.gguf": default_model_file().read_bytes()}
        fake.repos["me/not-a-model"] = {"config.json": b'{"model_type": "no-such-architecture"}'}
        fake.repos["me/gated"] = {"config.json": b"{}"}
        fake.gated.add("me/gated")
        yield fake


@pytest.fixture
def local_hub(served, tmp_path, monkeypatch):
    """This process's huggingface_hub pointed at the fake Hub, with an empty cache."""
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", served.url)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", served.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return served


def test_a_safetensors_repository_downloads_resumes_and_loads_offline(served, tiny_model_dir, tmp_path):
    served.cut_after["model.safetensors"] = 4096  # the first download of the weights breaks off
    done = ppd_generate("hf:me/tiny-llama", served.url, tmp_path)
    assert done.returncode == 0, done.stderr
    expected = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", auto_calibrate=False))
    expected = expected.generate(expected.chat_ids([{"role": "user", "content": QUESTION}]), "plain", 24).text
    assert json.loads(done.stdout)["text"] == expected
    weights = [r for r in served.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert len(weights) == 2 and not served.cut_after  # broken off once, then downloaded whole
    snapshot = next((tmp_path / "hub" / "models--me--tiny-llama" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    assert not (snapshot / "README.md").exists()  # only what a model needs
    # no Hub at all: the cached model loads
    done = ppd_generate("hf:me/tiny-llama", "http://127.0.0.1:9", tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["text"] == expected


def test_one_gguf_file_of_a_repository_runs_on_llama_cpp(served, llama_default, tmp_path):
    done = ppd_generate("hf:me/smol-gguf:smol.Q4_1.gguf", served.url, tmp_path, "--backend", "llamacpp")
    assert done.returncode == 0, done.stderr
    assert "smol.Q4_1.gguf: 100%" in done.stderr  # the download's progress bar
    text = llama_default.generate(llama_default.chat_ids([{"role": "user", "content": QUESTION}]), "plain", 24).text
    assert json.loads(done.stdout)["text"] == text and "Paris" in text


@pytest.mark.parametrize("model, line", [
    ("hf:me/no-such-repo", "hf:me/no-such-repo: no such repository on the Hub (or it is private: set HF_TOKEN)"),
    ("hf:me/gated", "hf:me/gated is gated: accept its terms on the Hub and set HF_TOKEN (or `hf auth login`)"),
    ("hf:me/smol-gguf:other.gguf", "hf:me/smol-gguf:other.gguf: the repository has no file other.gguf"),
    ("hf:me/not-a-model", "is not a supported causal LM"),
    ("hf:me", "'hf:me': write a Hub model as hf:OWNER/REPO or hf:OWNER/REPO:FILE.gguf"),
    ("hf:me/tiny-llama:weights.bin", "'hf:me/tiny-llama:weights.bin': the file after the repository must be a .gguf file"),
])
def test_hub_errors_are_one_line(local_hub, model, line):
    with pytest.raises(ValueError) as refused:
        Engine.load(EngineConfig(model=model, device="cpu", backend="torch"))
    assert line in str(refused.value) and "\n" not in str(refused.value)


def test_no_network_and_nothing_cached_is_one_line(local_hub, monkeypatch):
    """(huggingface_hub retries a refused file request five times, 23 s of back-off: its waits are skipped here.)"""
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
    for model in ("hf:me/tiny-llama", "hf:me/smol-gguf:smol.Q4_1.gguf"):
        with pytest.raises(hub.HubError, match=f"^{model} is not in the Hub cache and the Hub cannot be reached"):
            hub.fetch(hub.parse(model))


def test_the_cli_says_a_hub_error_in_one_line(served, tmp_path):
    done = ppd_generate("hf:me/no-such-repo", served.url, tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "ppd: error: hf:me/no-such-repo: no such repository on the Hub (or it is private: set HF_TOKEN)"]


def test_the_download_reports_its_progress_to_the_page(local_hub):
    """Engine.load hears the download (files of a repository, megabytes of a file), then the model's loading; the
    page's startup line says it."""
    from app.startup import Startup

    heard = []
    Engine.load(EngineConfig(model="hf:me/tiny-llama", device="cpu", tree="auto", auto_calibrate=False),
                lambda phase, done, total: heard.append((phase, done, total)))
    downloads = [(done, total) for phase, done, total in heard if phase == "downloading"]
    assert downloads and downloads[-1][0] == downloads[-1][1] > 0  # to the end
    assert heard[-1] == ("loading the model", 0, 0)
    startup = Startup()
    startup.report("downloading", 12, 98)
    assert startup.line().startswith("Downloading 12/98 MB… ")
