"""Model loading paths and the `ppd` command line, bad inputs included."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import tiny_llama
from app.cli import main
from ppd_core import Engine, EngineConfig
from app.system_info import weights_label
from ppd_core.loading import ModelLoadError, default_model_file, load_model
from ppd_core.training.greedy import reference_answer


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_hugging_face_directory_loads_and_decodes_exactly(tiny_model_dir):
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), quant="none", device="cpu", tree="medium"))
    assert engine.loaded.name == tiny_model_dir.name and engine.prompt_tokens.hidden_size == 64
    ids = engine.chat_ids([{"role": "user", "content": "Hello there"}])
    ppd = engine.generate(ids, "ppd", 24)
    assert ppd.tokens == engine.generate(ids, "plain", 24).tokens == reference_answer(engine.loaded, ids, 24)


@pytest.mark.slow
def test_gguf_file_path_loads_on_torch_when_asked():
    loaded = load_model(str(default_model_file()), quant="none", device="cpu", backend="torch")
    assert loaded.model.config.num_hidden_layers == 30 and loaded.dtype == torch.float32
    assert (loaded.quant, loaded.forward, loaded.gguf_file) == ("none", "lean", default_model_file())
    assert weights_label(loaded) == "not quantized"


def test_auto_quant_is_the_models_own_weights_on_torch(tiny_model_dir):
    automatic = load_model(str(tiny_model_dir), device="cpu")
    assert (automatic.quant, automatic.quant_is_default, automatic.forward) == ("none", True, "lean")
    assert weights_label(automatic).startswith("not quantized")
    generic = load_model(str(tiny_model_dir), device="cpu", forward="transformers")
    assert (generic.quant, generic.forward) == ("none", "transformers") and weights_label(generic) == "not quantized"
    with pytest.raises(ModelLoadError, match="unknown quantization 'int8'"):  # the lean CPU int4 / int8 kernels are gone
        load_model(str(tiny_model_dir), quant="int8", device="cpu")


@pytest.mark.slow
def test_bitsandbytes_4bit_on_cpu_is_exact():
    engine = Engine.load(EngineConfig(quant="4bit", device="cpu", tree="medium", backend="torch"))
    assert engine.loaded.num_bytes < 250 * 2**20  # NF4: about 166 MB against 540 MB in fp32
    ids = engine.chat_ids([{"role": "user", "content": "Name three planets."}])
    assert engine.generate(ids, "ppd", 32).tokens == engine.generate(ids, "plain", 32).tokens


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "/no/such/model"}, "model not found"),
        ({"quant": "8bit", "device": "cpu"}, "a GGUF runs in its own quantization on llama.cpp: --quant 8bit is for"),
        ({"quant": "4bit"}, "a GGUF runs in its own quantization on llama.cpp: --quant 4bit is for"),
        ({"quant": "8bit", "device": "cpu", "backend": "torch"}, "8-bit runs on CUDA only"),  # checked before converting
        ({"quant": "2bit"}, "unknown quantization"),
    ],
)
def test_load_errors(kwargs, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_missing_gpu_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="^--device cuda: this llama-cpp-python build has no GPU support") as refused:
        load_model(device="cuda")  # the default GGUF, on llama.cpp
    assert "\n" not in str(refused.value)
    with pytest.raises(ModelLoadError, match="no CUDA GPU was found"):
        load_model(device="cuda", backend="torch")  # checked before transformers converts the file


def test_not_a_model_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="neither a Hugging Face model directory nor a .gguf"):
        load_model(str(tmp_path / "notes.txt"))


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelLoadError, match="not a supported causal LM"):
        load_model(str(tmp_path))


def test_sliding_window_models_are_refused_in_one_line_before_loading(tmp_path, capsys):
    """A tiny random Mistral attending to a 16-token window: the torch backend's cache compaction keeps every
    position, so the model is refused before any weight or tokenizer is read (there are none in the folder)."""
    from transformers import MistralConfig

    tmp_path = tmp_path / "mistral"
    MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, sliding_window=16).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="sliding window of 16 tokens") as refused:
        load_model(str(tmp_path), backend="torch")
    assert "\n" not in str(refused.value) and "llama.cpp" in str(refused.value)
    assert main(["generate", "hi", "--model", str(tmp_path), "--backend", "torch"]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "sliding_window": None}))  # no window: not refused
    with pytest.raises(ModelLoadError) as other:
        load_model(str(tmp_path), backend="torch")
    assert str(other.value).startswith("could not load mistral: ")  # past the check: the folder has no tokenizer


def test_model_too_large_for_memory(tmp_path, tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config.update(hidden_size=16384, intermediate_size=65536, num_hidden_layers=80, num_attention_heads=128, num_key_value_heads=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"needs about .* GiB \(weights and a 512-token KV cache\) but only .* GiB is free"):
        load_model(str(tmp_path), device="cpu")


def test_cli_errors_are_one_line(capsys, tmp_path, tiny_model_dir):
    code, out, err = run_cli(capsys, "generate", "   ")
    assert code == 2 and err.strip() == "ppd: error: the message is empty"
    code, out, err = run_cli(capsys, "generate", "hi", "--model", str(tmp_path / "missing"))
    assert code == 2 and err.count("\n") == 1 and "model not found" in err
    # prompt tokens made for the tiny model (hidden 64) given to the default model (hidden 576)
    tiny = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium"))
    tiny.prompt_tokens.save(tmp_path / "tiny.safetensors")
    code, out, err = run_cli(capsys, "generate", "hi", "--prompt-tokens", str(tmp_path / "tiny.safetensors"))
    assert code == 2 and "hidden size 64 but SmolLM2-135M-Instruct has 576" in err and err.count("\n") == 1
    code, out, err = run_cli(capsys, "generate", "hello " * 9000, "--max-new-tokens", "4")
    assert code == 2 and "context holds 8192" in err and err.count("\n") == 1


@pytest.mark.slow
def test_cli_generate_json_matches_plain_mode(capsys):
    from ppd_core.calibration.profiles import profiles_dir

    def profiles() -> dict:  # the default model's saved profiles (earlier tests may have left some), as written
        return {path: path.stat().st_mtime_ns for path in profiles_dir().glob("SmolLM2-135M-Instruct-*.json")}

    before = profiles()
    code, out, _ = run_cli(capsys, "generate", "Name the capital city of France.", "--max-new-tokens", "24", "--json")
    ppd = json.loads(out)
    code2, out2, _ = run_cli(capsys, "generate", "Name the capital city of France.", "--max-new-tokens", "24", "--json", "--mode", "plain")
    plain = json.loads(out2)
    assert code == code2 == 0
    assert set(ppd) == {"text", "new_tokens", "steps", "mean_accepted", "tok_s", "mode", "sampling"}
    assert ppd["sampling"]["temperature"] == 0.0 and ppd["sampling"]["distribution_preserving"]
    assert ppd["text"] == plain["text"] and ppd["mode"] == "ppd" and plain["mean_accepted"] == 1.0
    assert "Paris" in ppd["text"]
    assert profiles() == before  # the answer waited for no calibration


@pytest.mark.slow
def test_cli_sampling_is_seeded_and_validated(capsys):
    args = ["generate", "Tell me a joke.", "--max-new-tokens", "16", "--json", "--temperature", "0.8", "--seed", "7"]
    first, second = (json.loads(run_cli(capsys, *args)[1]) for _ in range(2))
    assert first["text"] == second["text"] and first["sampling"]["acceptance"] == "lossless"
    typical = json.loads(run_cli(capsys, *args, "--acceptance", "typical")[1])
    assert typical["sampling"]["distribution_preserving"] is False
    code, out, err = run_cli(capsys, "generate", "hi", "--temperature", "0.5", "--top-p", "0")
    assert code == 2 and err.strip() == "ppd: error: top-p must be greater than 0 and at most 1, got 0.0"


@pytest.mark.slow
def test_cli_bench_writes_the_contract(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "\n".join(json.dumps({"turns": [t, "Say it again, shorter."]}) for t in ["Name a fruit.", "Name a color."]) + "\n"
    )
    ppd = shutil.which("ppd") or [sys.executable, "-m", "app.cli"]
    command = ([ppd] if isinstance(ppd, str) else ppd) + [
        "bench", "--questions", str(questions), "--turns", "2", "--max-new-tokens", "12",
        "--json", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # far from the repo
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "b.json").read_text())
    for key in ("model", "device", "quant", "questions", "max_new_tokens", "tree", "plain", "ppd", "speedup",
                "identical", "mismatches", "memory_overhead_bytes"):
        assert key in result
    assert set(result["tree"]) >= {"tokens_per_step", "candidates", "prompt_tokens"}
    assert set(result["ppd"]) == {"new_tokens", "seconds", "tok_s", "peak_mem_mb", "steps", "mean_accepted",
                                  "accepted_per_step_by_source", "drafted_per_step_by_source",
                                  "accepted_per_step_by_depth"}
    assert set(result["ppd"]["accepted_per_step_by_source"]) == set(result["ppd"]["drafted_per_step_by_source"]) >= {"prompt_tokens", "lookup"}
    assert result["identical"] is True and result["questions"] == 2 and result["ppd"]["peak_mem_mb"] > 100
    assert result["plain"]["new_tokens"] == result["ppd"]["new_tokens"] > 0
    groups = result["groups"]  # per turn and per category (these questions have none: "-")
    assert set(groups) == {"turn 1", "turn 2", "-"}
    assert groups["turn 1"]["ppd"]["new_tokens"] + groups["turn 2"]["ppd"]["new_tokens"] == result["ppd"]["new_tokens"]
    assert groups["-"]["ppd"]["new_tokens"] == result["ppd"]["new_tokens"]
    for part, answers in ((result["ppd"], 4), (groups["turn 1"]["ppd"], 2), (groups["turn 2"]["ppd"], 2)):
        assert_tokens_per_step_by_depth(part, answers)
    assert "first turns:" in done.stderr and "follow-ups (turn 2):" in done.stderr, done.stderr  # the table
    assert (tmp_path / "b.png").stat().st_size > 1000


@pytest.mark.slow
def test_bench_counts_tokens_per_step_by_source_and_depth(llama_default):
    """A small bench in process (the default GGUF, lookup and suffix beside the prompt tokens): its per-depth counts
    add up, first turns and follow-ups apart, and the log ends with their table."""
    import io

    from app.bench import BenchConfig, run_benchmark
    from app.questions import Question

    engine, before = llama_default, llama_default.drafters
    engine.drafters = ("lookup", "suffix")
    questions = [Question(["List three colours, one per line.", "List them again, in the same order."]),
                 Question(["Name the planets of the solar system.", "Name them again, in reverse order."])]
    log = io.StringIO()
    try:
        result = run_benchmark(engine, questions, BenchConfig(turns=2, max_new_tokens=32), log)
    finally:
        engine.drafters = before
    assert result["identical"] is True
    groups = result["groups"]
    for part, answers in ((result["ppd"], 4), (groups["turn 1"]["ppd"], 2), (groups["turn 2"]["ppd"], 2)):
        assert_tokens_per_step_by_depth(part, answers)
    follow_ups = groups["turn 2"]["ppd"]["accepted_per_step_by_depth"]
    assert len(next(iter(follow_ups.values()))) >= 2 and sum(row[1] for row in follow_ups.values()) > 0  # depth 2
    table = log.getvalue().split("PPD tokens per step by source and depth")[1]
    first = groups["turn 1"]["ppd"]
    assert f"first turns: {first['mean_accepted']:.3f} tokens per step over {first['steps']} steps" in table
    assert "follow-ups (turn 2):" in table and "all sources" in table
    for name in first["accepted_per_step_by_depth"]:
        assert f"  {name} " in table


def assert_tokens_per_step_by_depth(ppd: dict, answers: int) -> None:
    """A bench part's accepted guesses per step by source and depth add up to its accepted guesses per step by
    source; all sources together accept no more at depth d + 1 than at d; and tokens per step are 1 + accepted guesses
    per step, less at most one own token per answer (its last step, cut at the token limit). The JSON's figures are
    rounded to 4 decimals."""
    by_depth, by_source, steps = ppd["accepted_per_step_by_depth"], ppd["accepted_per_step_by_source"], ppd["steps"]
    assert set(by_depth) == set(by_source) and steps > 0
    assert len({len(row) for row in by_depth.values()}) == 1  # every source's row reaches the deepest depth
    for name, row in by_depth.items():
        assert sum(row) == pytest.approx(by_source[name], abs=1e-3), name
    at_depth = [sum(column) for column in zip(*by_depth.values())]
    assert all(deeper <= shallower + 1e-3 for shallower, deeper in zip(at_depth, at_depth[1:])), at_depth
    cut = 1 + sum(by_source.values()) - ppd["mean_accepted"]  # own tokens per step cut off
    assert -1e-3 <= cut <= answers / steps + 1e-3, (cut, answers, steps)
