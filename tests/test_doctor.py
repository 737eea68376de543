"""`ppd doctor`: the real command on the default model (llama.cpp and torch), its verdict, and its bad input."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from app.cli import main
from ppd_core.diagnostics import (
    NEAR_TIE_LOGITS, AnswerComparison, FirstDifference, compare_answer, first_index, probe_environment, verdict,
)
from ppd_core import AnswerRequest, Engine
from ppd_core.device_policy import cpu_properties

# one thread: the CPU is shared with other work; a static tree: no calibration (--tree auto calibrates first)
SMALL = ["--prompts", "2", "--max-new-tokens", "24", "--threads", "1", "--tree", "medium"]


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # --threads is process-wide: leave it as the other tests expect


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_report(out):
    return json.loads((out / "doctor.json").read_text()), (out / "doctor.md").read_text()


# --- the command, end to end ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["llamacpp", "torch"])
def test_doctor_passes_on_the_cpu_paths(capsys, tmp_path, backend):
    """llama.cpp on the CPU is the bitwise path: every answer identical. torch runs transformers' float32 copy of
    the GGUF, whose tree matmuls round differently from single steps (its bitwise int4 / int8 CPU kernels are
    gone): there the doctor passes under the near-tie rule."""
    out = tmp_path / "report"
    bitwise = backend == "llamacpp"
    # on the CPU even where a GPU is (`make test` on one)
    code, stdout, stderr = run_cli(capsys, "doctor", *SMALL, "--backend", backend, "--device", "cpu", "--gpu-layers", "0",
                                   "--out", out)
    assert code == 0, stderr
    report, summary = read_report(out)
    assert stdout == summary and f"{out / 'doctor.json'}" in stderr and f"{out / 'doctor.md'}" in stderr
    assert report["verdict"] == "PASS" and not report["reasons"]
    assert report["command"] == f"ppd doctor --prompts 2 --max-new-tokens 24 --out {out} --backend {backend} --gpu-layers 0 --device cpu --threads 1 --tree medium"
    env, engine = report["environment"], report["engine"]
    assert env["torch"] == torch.__version__ and env["torch_cuda"] == torch.version.cuda
    assert env["cuda_available"] is torch.cuda.is_available() and env["device"]["kind"] == "cpu"
    assert env["compute_dtype"] == "float32" and "CPU" in env["llama_cpp"]["system_info"]
    assert env["llama_cpp"]["gpu_offload"] is bool(__import__("llama_cpp").llama_supports_gpu_offload())
    assert engine["backend"] == backend and engine["bitwise"] is bitwise and engine["threads"] == 1
    assert (engine["tree"]["name"], engine["calibrated"]) == ("medium", False)
    exact = report["exactness"]
    assert (exact["prompts"], exact["bitwise"]) == (2, bitwise)
    if bitwise:
        assert exact["identical"] == 2
        assert all(a["identical"] and a["plain_tokens"] == a["ppd_tokens"] == 24 for a in exact["answers"])
    else:  # answers may part only at a near-tie (the verdict's rule, checked on its own below)
        assert "not bitwise: answers may part only at near-ties" in summary
        assert all(a["identical"] or a["difference"]["ppd_margin"] < NEAR_TIE_LOGITS for a in exact["answers"])
    latency = report["latency"]
    assert list(latency["ms"]) == ["1", "2", "4", "8", "16"] and latency["context"] == 256  # a CPU: up to 16
    assert all(ms > 0 for ms in latency["ms"].values()) and latency["ratio"]["1"] == 1.0
    bench = report["bench"]
    assert bench["plain"]["new_tokens"] == bench["ppd"]["new_tokens"] == 48
    assert bench["plain"]["mean_accepted"] == 1.0 and bench["ppd"]["mean_accepted"] >= 1.0
    assert bench["speedup"] == pytest.approx(bench["ppd"]["tok_s"] / bench["plain"]["tok_s"], rel=1e-3)
    assert "## ppd doctor: PASS" in summary and f"**Exactness:** {exact['identical']}/2 identical" in summary
    assert "| 1 | " in summary and f"torch {torch.__version__}" in summary and summary.rstrip().endswith("**PASS**")


@pytest.mark.slow
def test_doctor_fails_with_the_first_difference_on_a_bitwise_path(capsys, tmp_path, monkeypatch):
    """A PPD answer altered at token 3: the report names the place, both tokens and plain decoding's real logits
    there (its own token is their best), and the command exits 1 with the report written."""
    generate, plain = Engine.generate, {}

    def altered(self, request, *args, **kwargs):
        result = generate(self, request, *args, **kwargs)
        if isinstance(request, AnswerRequest) and request.max_new_tokens == 24:  # the checked answers, not the warm-up
            if request.mode == "ppd":
                result.tokens[3] = (result.tokens[3] + 1) % self.loaded.info.vocab_size
            else:
                plain["tokens"], plain["vocab"] = list(result.tokens), self.loaded.info.vocab_size
        return result

    monkeypatch.setattr(Engine, "generate", altered)
    out = tmp_path / "report"
    code, stdout, _ = run_cli(capsys, "doctor", "--prompts", "1", "--max-new-tokens", "24", "--threads", "1",
                              "--tree", "medium", "--backend", "llamacpp", "--out", out)
    assert code == 1
    report, summary = read_report(out)
    assert report["verdict"] == "FAIL" and report["exactness"]["identical"] == 0 and stdout == summary
    difference = report["exactness"]["answers"][0]["difference"]
    assert difference["index"] == 3 and difference["plain_token"] == plain["tokens"][3]
    assert difference["ppd_token"] == (plain["tokens"][3] + 1) % plain["vocab"]
    assert difference["top2_gap"] > 0 and difference["ppd_margin"] >= difference["top2_gap"]  # plain's token is the argmax
    assert report["reasons"] == ["prompt 0: answers part at token 3 on a bitwise path (every answer must be identical)"]
    assert "## ppd doctor: FAIL" in summary and f"| 0 | 3 | {plain['tokens'][3]} " in summary


@pytest.mark.parametrize("args, line", [
    (["--prompts", "0"], "--prompts must be at least 1, got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--prompts", "81"], "--prompts must be at most 80 (the MT-Bench questions shipped), got 81"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
])
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, args, line):
    monkeypatch.setattr("ppd_core.engine_load.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    out = tmp_path / "report"
    assert run_cli(capsys, "doctor", *args, "--out", out) == (2, "", f"ppd: error: {line}\n")
    assert not out.exists()


def test_out_that_is_a_file_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("ppd_core.engine_load.load_model", lambda *a, **k: pytest.fail("the model loaded"))
    taken = tmp_path / "taken"
    taken.write_text("mine")
    assert run_cli(capsys, "doctor", "--out", taken) == (2, "", f"ppd: error: --out {taken} is a file, not a folder\n")
    assert taken.read_text() == "mine"


# --- the comparison and the verdict --------------------------------------------------------------


def differing(margin: float, gap: float | None = None) -> AnswerComparison:
    return AnswerComparison(0, 24, 24, FirstDifference(7, 11, 12, margin if gap is None else gap, margin))


def test_verdict_accepts_near_ties_only_off_the_bitwise_paths():
    identical = AnswerComparison(1, 24, 24)
    near_tie = differing(0.1)
    assert verdict([identical, identical], bitwise=True).passed
    assert verdict([identical, near_tie], bitwise=False) == verdict([], bitwise=False)  # a pass, no reasons
    on_bitwise = verdict([identical, near_tie], bitwise=True)
    assert not on_bitwise.passed and on_bitwise.reasons == [
        "prompt 0: answers part at token 7 on a bitwise path (every answer must be identical)"]
    far = verdict([differing(3.0)], bitwise=False)
    assert not far.passed and "3.000 logits from plain decoding's choice" in far.reasons[0]
    # the margin of PPD's own token decides: a near-tie between the best two does not excuse taking a third
    assert not verdict([differing(2.0, gap=0.05)], bitwise=False).passed
    assert not verdict([differing(NEAR_TIE_LOGITS)], bitwise=False).passed
    assert verdict([differing(NEAR_TIE_LOGITS - 0.01)], bitwise=False).passed


def test_first_index():
    assert first_index([1, 2, 3], [1, 2, 3]) is None
    assert first_index([1, 2, 3], [1, 5, 3]) == 1
    assert first_index([1, 2, 3], [1, 2]) == 2  # one answer ended first
    assert first_index([], []) is None


def test_compare_answer_reads_plain_logits_after_the_shared_prefix():
    asked = []

    def logits(ids):
        asked.append(ids)
        row = torch.zeros(16)
        row[5], row[7], row[9] = 3.0, 2.75, 1.0
        return row

    assert compare_answer(0, [100, 101], [4, 5, 6], [4, 5, 6], logits).identical and not asked
    runner_up = compare_answer(2, [100, 101], [4, 5, 6], [4, 7, 6], logits)
    assert asked == [[100, 101, 4]] and runner_up.prompt == 2
    assert runner_up.difference == FirstDifference(1, 5, 7, 0.25, 0.25)
    assert compare_answer(0, [100], [4, 5], [4, 9], logits).difference == FirstDifference(1, 5, 9, 0.25, 2.0)
    ended = compare_answer(0, [100], [4, 5], [4], logits).difference  # PPD's answer stopped there
    assert (ended.plain_token, ended.ppd_token, ended.ppd_margin) == (5, None, 0.25)


def test_environment_without_the_optional_packages(monkeypatch):
    from ppd_core.backends.llamacpp import library as llamacpp

    def missing():
        raise llamacpp.LlamaCppError("llama-cpp-python is not usable here (No module named 'llama_cpp')")

    monkeypatch.setattr(llamacpp, "import_llama_cpp", missing)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    env = probe_environment(cpu_properties(1)).to_json()
    assert env["llama_cpp"] == {"version": None, "system_info": None, "gpu_offload": None,
                                "error": "llama-cpp-python is not usable here (No module named 'llama_cpp')"}
    assert env["bitsandbytes"] == "not installed"
    assert env["torch"] == torch.__version__ and env["device"]["threads"] == 1 and env["gpu"] is None
    assert env["memory_source"] == "system" and 0 < env["memory"]["used_bytes"] < env["memory"]["total_bytes"]


@pytest.mark.slow
def test_every_timed_answer_processes_its_own_prompt(llama_default, monkeypatch):
    """Plain and PPD answer the same prompt in turn: the second must not reuse the cache the first left, or it
    skips the prompt and the bench's ratio favours whichever mode went second."""
    from app import doctor

    reused = []
    generate = llama_default.generate

    def spy(*args, **kwargs):
        result = generate(*args, **kwargs)
        reused.append(result.stats.reused_tokens)
        return result

    monkeypatch.setattr(llama_default, "generate", spy)
    comparisons, totals = doctor.check_answers(llama_default, ["Name a colour.", "Name a fruit."], 6, log=sys.stderr)
    assert len(comparisons) == 2 and totals["plain"].new_tokens and totals["ppd"].new_tokens
    assert reused == [0] * 6  # two warm-ups, then four answers from an empty cache


def test_the_version_line_survives_a_source_checkout(monkeypatch):
    """Run from a source folder on PYTHONPATH (no installed metadata), the report says so instead of failing."""
    import importlib.metadata

    from app import doctor

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    assert doctor.ppd_version() == importlib.metadata.version("ppd")
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert doctor.ppd_version() == "not installed (run from source)"
