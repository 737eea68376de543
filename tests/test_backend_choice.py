"""The backend is chosen by a measured plain step where both can run the model, and the choice is kept."""

from __future__ import annotations

import json

import pytest

from ppd_core.backend_choice import choice_path, choose, device_key
from ppd_core.engine import Engine, EngineConfig
from ppd_core.loading import load_model

pytestmark = pytest.mark.slow


def test_both_backends_are_timed_the_faster_is_chosen_and_saved(tmp_path):
    on_llama = load_model("default", backend="llamacpp", threads=2)
    on_torch = load_model("default", backend="torch")
    path = tmp_path / "choice.json"
    record = choose({"llamacpp": lambda: on_llama.backend, "torch": lambda: on_torch.backend}, path, device_key(on_llama))
    assert set(record["step_ms"]) == {"llamacpp", "torch"} and all(ms > 0 for ms in record["step_ms"].values())
    assert record["chosen"] == min(record["step_ms"], key=record["step_ms"].get)
    assert json.loads(path.read_text()) == record

    def no_timing(decoder):
        raise AssertionError("a saved choice is not measured again")

    assert choose({"llamacpp": lambda: on_llama.backend, "torch": lambda: on_torch.backend}, path,
                  device_key(on_llama), timer=no_timing) == record
    on_llama.backend.close()


def test_auto_follows_the_saved_choice():
    probe = load_model("default", backend="llamacpp", threads=2)
    path = choice_path(device_key(probe), probe.gguf_file)
    probe.backend.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        for faster in ("torch", "llamacpp"):
            step_ms = {"llamacpp": 10.0, "torch": 20.0} if faster == "llamacpp" else {"llamacpp": 20.0, "torch": 10.0}
            path.write_text(json.dumps({"chosen": faster, "step_ms": step_ms, "context": 256}))
            engine = Engine.load(EngineConfig(model="default", tree="small", threads=2))
            assert engine.loaded.backend.name == faster and engine.backend_choice["step_ms"] == step_ms
            result = engine.generate(engine.chat_ids([{"role": "user", "content": "Name a color."}]), "ppd", 8)
            assert result.stats.new_tokens > 0
        # --backend torch / llamacpp are obeyed whatever was measured
        assert Engine.load(EngineConfig(model="default", tree="small", backend="torch")).loaded.backend.name == "torch"
    finally:
        path.unlink(missing_ok=True)
