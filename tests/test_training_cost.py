"""Issue 50, page item 6: before a training starts the page says its size, its time at this device's measured speed,
its memory and disk, and offers a smaller run. The sizes are `ppd train`'s own; the time follows a measurement."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from app.page_text import training_choice, training_offer
from app.training_job import TrainingJob, train_size
from ppd_core import GenerationStats
from ppd_core.training.trainer import TrainConfig
from ppd_core.calibration.profiles import read_profile
from ppd_core.training.cost import (PROMPT_TOKENS, StepCost, TrainSize, answered_step, calibrated_step, model_shape,
                                    training_cost, training_seconds)

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "profiles" / "llamacpp-amd-epyc-avx2build-2threads.json"  # a calibration measured on a 2-core EPYC


def test_the_sizes_are_ppd_trains_own_defaults_and_options():
    size, config = train_size([]), TrainConfig()
    assert size == TrainSize()  # the cost's defaults are `ppd train`'s
    assert (size.samples, size.epochs, size.cuts, size.ensemble, size.max_prompt_tokens, size.max_new_tokens,
            size.generation_batch) == (config.samples, config.epochs, config.cuts, config.ensemble_size,
                                       config.max_prompt_tokens, config.max_new_tokens, config.generation_batch)
    assert PROMPT_TOKENS == config.num_prompt_tokens
    tiny = train_size(["--samples", "4", "--max-new-tokens", "8", "--data", "chats.jsonl", "--eval-limit", "0"])
    assert (tiny.samples, tiny.max_new_tokens, tiny.eval_limit) == (4, 8, 0)


def test_the_quick_run_is_a_tenth_of_the_full_one_at_most_200_and_a_resume_keeps_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert TrainingJob("default", "a").choices() == (200, 2000)
    assert TrainingJob("default", "b", ["--samples", "4"]).choices() == (1, 4)
    job = TrainingJob("default", "c")
    job.folder.mkdir(parents=True)
    assert job._chosen_samples(None) == []  # nothing chosen: the options' (or `ppd train`'s) count
    assert job._chosen_samples(200) == ["--samples", "200"]
    assert json.loads(job.size_file.read_text()) == {"samples": 200}
    assert job._chosen_samples(None) == ["--samples", "200"]  # Resume goes on with the run chosen


def test_the_time_follows_the_measured_step_cost_and_the_size():
    size = TrainSize()
    slow, fast = StepCost({1: 80.0, 16: 400.0}, "its calibration"), StepCost({1: 8.0, 16: 40.0}, "its calibration")
    assert training_seconds(size, slow) == pytest.approx(10 * training_seconds(size, fast))
    quick = dataclasses.replace(size, samples=200)
    assert training_seconds(quick, slow) < training_seconds(size, slow) / 5
    line = StepCost({1: 10.0, 16: 40.0}, "")
    assert line.ms(1) == pytest.approx(10.0) and line.ms(16) == pytest.approx(40.0) and line.ms(32) == pytest.approx(72.0)


def test_a_calibration_and_an_answer_are_measurements_of_the_step_cost():
    profile = read_profile(PROFILE)
    step = calibrated_step(profile, TrainSize())
    nearest = min(profile.latency_ms, key=lambda context: abs(context - TrainSize().conversation_tokens))
    assert step.points == profile.latency_ms[nearest] and step.source == "its calibration"
    stats = GenerationStats(prompt_tokens=120, reused_tokens=20, steps=10, decode_seconds=0.5, prefill_seconds=0.2)
    step = answered_step(stats)
    assert step.points == pytest.approx({1: 50.0, 100: 200.0}) and step.source == "its last answer"
    assert answered_step(None) is None and calibrated_step(None, TrainSize()) is None
    short = GenerationStats(prompt_tokens=40, reused_tokens=30, steps=10, decode_seconds=0.5, prefill_seconds=0.01)
    assert answered_step(short) is None  # 10 new prompt rows: too few to time many rows at once


def test_the_default_models_cost_names_its_size_memory_and_disk(llama_default):
    shape = model_shape(llama_default.loaded)
    assert 130e6 < shape.parameters < 140e6 and shape.gguf  # SmolLM2-135M, from llama.cpp's count
    assert shape.kv_heads == 3 and shape.heads == 9 and shape.layers == 30
    step = calibrated_step(read_profile(PROFILE), TrainSize())
    full, quick = training_cost(TrainSize(), shape, step), training_cost(TrainSize(samples=200), shape, step)
    assert shape.parameters * 4 < full.memory_bytes < 2e9  # the float32 copy and a pass's logits or KV cache
    assert shape.parameters * 4 < full.disk_bytes < 1e9  # the float32 copy and the answers
    assert quick.seconds < full.seconds / 5
    text = training_offer("SmolLM2-135M-Instruct", quick, full)
    assert "answers 2,000 conversations" in text and "measured by its calibration" in text
    assert "of memory" in text and "of disk" in text and "A quick run of 200 conversations takes about" in text
    assert training_choice("Quick", quick).startswith("Quick: 200 conversations, about ")
    unmeasured = training_cost(TrainSize(), shape, None)
    assert unmeasured.seconds is None and "not measured yet" in training_offer("m", unmeasured, unmeasured)
