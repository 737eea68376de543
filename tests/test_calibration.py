"""Calibration: acceptance counting, latency probes, profiles on disk, and the engine using them."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ppd_core.calibration.acceptance import (
    CUTS_PER_STEP, answer_ranks, calibration_prompts, conversation_answers, decoder_answers, guess_ranks,
)
from conftest import tiny_llama
from ppd_core.calibration import latency
from ppd_core.calibration.latency import measure_latency, probe_tree
from ppd_core.calibration.tree_search import mean_curve
from ppd_core.backends.torch.lean.model import LeanDecoder
from ppd_core.calibration.profiles import ProfileError, load_profile, profile_path, read_profile, save_profile
from ppd_core.calibration.calibrate import acceptance_key, tokens_per_step_ceiling
from ppd_core.calibration.records import read_records, AcceptanceStats
from ppd_core.training.prompt_tensors import prompt_table
from ppd_core import Engine, EngineConfig
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.engine_calibration import calibrate_engine, export_acceptance


def test_acceptance_counts_are_conditional_on_earlier_depths():
    stats = AcceptanceStats(hits=[[0] * 3 for _ in range(3)], trials=[0, 0, 0])
    ranks = torch.tensor([
        [0, 0, 1],  # all three guessed: depth 3 counted at rank 1
        [1, -1, 0],  # depth 2 missed: depth 3 is not eligible
        [-1, 0, 0],  # depth 1 missed: depths 2 and 3 not eligible
        [0, 2, -1],
    ])
    stats.add(ranks)
    assert stats.trials == [4, 3, 2]  # depth 2: rows 0, 1, 3; depth 3: rows 0, 3
    assert stats.hits == [[2, 1, 0], [1, 0, 1], [0, 1, 0]]
    assert stats.top1 == [0.5, 1 / 3, 0.0]
    assert stats.probs == [[0.5, 0.25, 0.0], [1 / 3, 0.0, 1 / 3], [0.0, 0.5, 0.0]]


def test_guess_ranks_finds_the_models_token_among_the_guesses():
    guesses = np.array([[[1, 2, 0]], [[0, 2, 3]]])  # [C=2, n=1, k=3], best first
    # cut 0: token 2 is the 2nd guess (rank 1); cut 1: token 1 is not among the 3 guesses
    assert guess_ranks(guesses, np.array([[2], [1]])).tolist() == [[1], [-1]]


def test_ranks_through_the_decoder_equal_trainings_evaluation_on_the_transformers_model(tiny_model_dir):
    """The acceptance calibration records (the decoding backend's tree rows, several cuts per step) ranks the guesses
    as ``ppd train``'s evaluation does (``distillation``'s student rows over the teacher's own pass), cut for cut."""
    from ppd_core.training.distillation import student_logits, teacher_pass, valid_cuts

    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", auto_calibrate=False))
    tokens, backend = engine.prompt_tokens, engine.loaded.backend
    n, V = tokens.num_prompt_tokens, tokens.ensemble_size
    assert n == 3 and CUTS_PER_STEP == 16  # 40 answer tokens: steps of 16, 16 and 8 cuts
    eos = sorted(engine.loaded.eos_token_ids)
    prompt = engine.chat_ids([{"role": "user", "content": "Tell me a long story about a cat."}])
    [answer] = decoder_answers(backend, 40, [])([prompt])  # no EOS: 40 tokens
    assert len(answer) == 40 and eos
    ranks = answer_ranks(backend, tokens.table(), n, V, prompt, answer, top_k=1600)  # a random model: a wide top k
    model = engine.loaded.model
    cache, teacher = teacher_pass(model, prompt + answer)
    cuts = valid_cuts(len(prompt), len(prompt) + len(answer), n)
    with torch.no_grad():
        student = student_logits(model, cache, prompt_table(tokens, torch.float32, "cpu"), cuts, n, V)  # [C, n, vocab]
    truth = teacher.argmax(-1)[cuts[:, None] + torch.arange(1, n + 1)[None, :]]  # [C, n]
    expected = guess_ranks(student.topk(1600, dim=-1).indices.numpy(), truth.numpy())
    assert ranks.shape == (len(cuts), n) == (37, 3)
    assert np.array_equal(ranks, expected)
    assert (ranks >= 0).any() and (ranks == -1).any()  # both outcomes occur: the comparison is not vacuous


def test_calibration_prompts_are_not_from_mt_bench():
    from app.questions import DEFAULT_QUESTIONS

    conversations = calibration_prompts()
    prompts = [turn for turns in conversations for turn in turns]
    assert len(conversations) >= 24 and len(set(prompts)) == len(prompts)
    assert sum(len(turns) > 1 for turns in conversations[:12]) >= 4  # follow-ups among the prompts calibration uses
    bench = [json.loads(line)["turns"] for line in DEFAULT_QUESTIONS.read_text().splitlines() if line.strip()]
    assert len(bench) == 80  # the MT-Bench questions shipped in app/data/
    assert not set(prompts) & {turn for turns in bench for turn in turns}


def test_a_follow_up_is_answered_after_the_earlier_answer(tiny_model_dir):
    """Turn 2 of a conversation is asked with turn 1 and the model's answer to it in the chat, as a chat holds them."""
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", auto_calibrate=False))
    tokenizer, eos = engine.tokenizer, sorted(engine.loaded.eos_token_ids)
    conversations = [["Hello there", "Say it again"], ["Name a colour"]]
    answers = conversation_answers(tokenizer, conversations, decoder_answers(engine.loaded.backend, 12, eos))
    assert [(turn, prompt) for turn, prompt, _ in answers[:2]] == [(1, engine.chat_ids([{"role": "user", "content": t[0]}])) for t in conversations]
    turn, prompt, answer = answers[2]
    first = tokenizer.decode(answers[0][2], skip_special_tokens=True)
    assert turn == 2 and prompt == engine.chat_ids([{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
                                                    {"role": "user", "content": "Say it again"}])
    assert 0 < len(answer) <= 12 and len(answers) == 3


@pytest.mark.parametrize("size", [1, 2, 4, 7, 16, 33])
def test_probe_trees_have_the_asked_size(size):
    for ensemble in (1, 2):
        assert probe_tree(size, 3, ensemble).num_tokens == size


@pytest.mark.parametrize("costs, measured", [
    ({1: 10, 2: 12, 3: 40, 4: 20, 5: 45, 6: 50, 8: 80}, [1, 2, 3, 4, 5, 6]),  # stops after two sizes in a row past 3.5x
    ({1: 10, 2: 10, 3: 10, 4: 11, 5: 12, 6: 12, 8: 13}, [1, 2, 3, 4, 5, 6, 8]),  # flat (a GPU): every size
])
def test_latency_stops_at_the_sizes_that_cannot_beat_plain_decoding(monkeypatch, costs, measured):
    """With a ceiling of 3.5 tokens per step, a size costing more than 3.5 plain steps cannot win; once two in a row
    do (one alone may be a blocking hiccup, as 3 here), the larger sizes are not measured, at any context."""
    decoder = LeanDecoder(tiny_llama(seed=1))
    calls = []

    def fake_step(speculator, cache, tree, guesses, context, warmup, repeats, between=None, then=None):
        calls.append((context, tree.num_tokens))
        return float(costs[tree.num_tokens] + costs[then.num_tokens])  # the probe, then a 1-token step

    monkeypatch.setattr(latency, "step_ms", fake_step)
    result = measure_latency(TorchDecoder(decoder), np.zeros((3, 64), np.float32), 3, 1, sorted(costs), contexts=(64, 96), ceiling=3.5)
    assert sorted(result[64]) == sorted(result[96]) == measured
    assert calls == [(64, size) for size in measured] + [(96, size) for size in measured]


def test_step_timing_stops_once_the_median_settles(monkeypatch):
    """At most ``repeats`` timed runs, fewer once one more run moves the median by 2% or less."""
    decoder = TorchDecoder(LeanDecoder(tiny_llama(seed=1)))
    tree = probe_tree(2, 3, 1)
    speculator = latency.Speculator(decoder, latency.TreeFamily("probe", (tree,)), np.zeros((3, 64), np.float32))
    cache = decoder.new_cache()
    latency.prefill(decoder, cache, list(range(8)))
    guesses = np.zeros((max(tree.depth, 1), max(tree.max_rank + 1, 1)), dtype=np.int64)
    runs = []
    real_step = latency.tree_step
    monkeypatch.setattr(latency, "tree_step", lambda *args: runs.append(1) or real_step(*args))
    latency.step_ms(speculator, cache, tree, guesses, 8, warmup=1, repeats=30)
    assert latency.MIN_RUNS + 1 <= len(runs) <= 31 and decoder.cache_length(cache) == 8
    # the model lent to an answer before the third run: the timing starts over, warm-up included
    runs.clear()
    lent = iter([False, False, True])
    latency.step_ms(speculator, cache, tree, guesses, 8, warmup=1, repeats=2, between=lambda: next(lent, False))
    assert len(runs) == 2 + 1 + 2 and decoder.cache_length(cache) == 8


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    """The tiny model, calibrated (a fresh profile in the tests' data directory)."""
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium"))
    phases = []
    calibrate_engine(engine, lambda phase, done, total: phases.append((phase, done, total)), prompts=3, max_new_tokens=24, contexts=(64,), repeats=2)
    engine.phases = phases
    return engine


def test_calibration_measures_and_chooses(tiny_engine):
    profile = tiny_engine.plan.profile
    n = tiny_engine.prompt_tokens.num_prompt_tokens
    assert {phase for phase, _, _ in tiny_engine.phases} == {"latency", "lookup", "acceptance", "tree search"}
    assert all(done <= total for _, done, total in tiny_engine.phases)
    curve = profile.latency_ms[64]
    sizes = sorted(curve)
    assert sizes == [s for s in latency.CPU_SIZES if s <= sizes[-1]] and len(sizes) >= 3 and all(ms > 0 for ms in curve.values())
    key = acceptance_key(tiny_engine.loaded, tiny_engine.prompt_tokens, prompts=3, max_new_tokens=24)
    [record] = [r for r in read_records(Path(profile.acceptance_from)) if r.key == key]
    ceiling = tokens_per_step_ceiling(record.acceptance, record.lookup, n, 1, max(latency.CPU_SIZES))
    if sizes[-1] < max(latency.CPU_SIZES):  # stopped early: the last two sizes each cost more than the ceiling
        assert curve[sizes[-1]] > ceiling * curve[1] and curve[sizes[-2]] > ceiling * curve[1]
    assert len(profile.acceptance) == n and all(len(row) == 10 for row in profile.acceptance)
    assert all(0 <= sum(row) <= 1.0 + 1e-6 for row in profile.acceptance)
    assert profile.acceptance_positions > 0
    # the choice is the best budget it tried, and the engine decodes with it
    best = max(profile.budgets, key=lambda row: row["tokens_per_second"])
    assert best["budget"] == profile.budget
    assert profile.expected_speedup == pytest.approx(best["tokens_per_second"] * curve_at_one(profile) / 1000, rel=1e-3)
    assert tiny_engine.plan.family.name == f"calibrated-{profile.budget}"
    assert [t.num_tokens for t in tiny_engine.plan.family.trees] == profile.tree_sizes


def curve_at_one(profile) -> float:
    return mean_curve(profile.latency_ms)[1]


def test_calibrated_tree_is_exact(tiny_engine):
    ids = tiny_engine.chat_ids([{"role": "user", "content": "Tell me a story"}])
    for budget in (None, 4, 12):
        tiny_engine.replan(tiny_engine.plan.profile, tree=str(budget))
        assert tiny_engine.generate(ids, "ppd", 24).tokens == tiny_engine.generate(ids, "plain", 24).tokens


def test_profile_round_trip_and_key_mismatch(tiny_engine, tmp_path):
    profile = tiny_engine.plan.profile
    path = save_profile(profile, tmp_path)
    assert path == profile_path(profile.key, tmp_path)
    again = read_profile(path)
    assert again == profile
    assert load_profile(profile.key, tmp_path) == profile
    # another device or model: its key names another file, so this profile is never used for it
    for field, value in (("device", {**profile.key["device"], "name": "Other CPU"}), ("model", {"name": "x", "fingerprint": "0"}),
                         ("quant", "4bit"), ("prompt_tokens", "feedfacefeedface"),
                         ("build", "CPU : AVX2 = 1 | CUDA : ARCHS = 890"), ("gpu_layers", -1)):
        assert load_profile({**profile.key, field: value}, tmp_path) is None


def test_corrupt_and_stale_profiles_are_errors(tiny_engine, tmp_path):
    profile = tiny_engine.plan.profile
    path = save_profile(profile, tmp_path)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not a readable profile"):
        load_profile(profile.key, tmp_path)
    data = profile.to_json()
    data["trees"] = [[[[0], 1]]]  # a candidate without its root
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="malformed"):
        load_profile(profile.key, tmp_path)
    data = profile.to_json()
    data["key"] = {**profile.key, "quant": "8bit"}  # a file at this key's path made for another key
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="another device or model"):
        load_profile(profile.key, tmp_path)


def test_engine_uses_the_saved_profile_and_recalibrates_a_corrupt_one(tiny_engine, tiny_model_dir, caplog):
    config = EngineConfig(model=str(tiny_model_dir), device="cpu", tree="auto", auto_calibrate=False)
    engine = Engine.load(config)
    assert engine.plan.profile == tiny_engine.plan.profile  # found on disk: no calibration
    assert engine.plan.family.name == tiny_engine.plan.profile.family().name == f"calibrated-{engine.plan.profile.budget}"
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="6", auto_calibrate=False))
    assert engine.plan.family.name == "budget-6" and max(t.num_tokens for t in engine.plan.family.trees) <= 6

    path = profile_path(tiny_engine.plan.profile.key)
    path.write_text("garbage")
    with caplog.at_level(logging.WARNING):
        engine = Engine.load(config)  # auto_calibrate off: warns and decodes plainly until calibrated
    assert "ignoring the saved calibration" in caplog.text and engine.plan.profile is None
    assert engine.plan.family.name == "plain" and engine.plan.lookup_lengths == ()
    with pytest.raises(ValueError, match="needs a calibration profile"):
        Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="6", auto_calibrate=False))
    save_profile(tiny_engine.plan.profile)


def test_unknown_tree_name_is_refused():
    with pytest.raises(ValueError, match="unknown tree 'huge'"):
        Engine.load(EngineConfig(tree="huge"))


def test_lookup_is_replayed_on_the_decoding_backends_own_answers(tiny_model_dir):
    """Calibration's lookup answers are plain decoding on the backend that decodes, not the transformers model's."""
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", auto_calibrate=False))
    eos = sorted(engine.loaded.eos_token_ids)
    prompts = [engine.chat_ids([{"role": "user", "content": text}]) for text in ("Hello there", "Name a colour")]
    answers = decoder_answers(engine.loaded.backend, 12, eos)(prompts)
    assert answers == [engine.generate(prompt, "plain", 12).tokens for prompt in prompts]


def test_acceptance_is_measured_once_and_travels_beside_the_prompt_tokens(tiny_engine, tiny_model_dir, tmp_path, monkeypatch, caplog):
    """A second calibration of the same model, prompt tokens and numerics measures the latency curve only, with the
    statistics the first measured; another quantization measures them again; a record shipped beside the prompt-token
    file serves a machine that never measured them."""
    import ppd_core.calibration.calibrate as calibration
    from ppd_core.calibration.records import beside, user_records_dir

    first = tiny_engine.plan.profile
    assert first.acceptance_from == str(user_records_dir() / f"{tiny_engine.prompt_tokens.fingerprint}.json")
    measure = calibration.measure_record

    def refuse(*args, **kwargs):
        raise AssertionError("the acceptance was measured again")

    monkeypatch.setattr(calibration, "measure_record", refuse)
    phases = []
    with caplog.at_level(logging.WARNING):
        again = calibrate_engine(tiny_engine, lambda phase, done, total: phases.append(phase), prompts=3, max_new_tokens=24,
                                      contexts=(64,), repeats=2)
    assert "measuring the latency curve only" in caplog.text and {"lookup", "acceptance"}.isdisjoint(phases)
    assert again.acceptance == first.acceptance and again.lookup_trials == first.lookup_trials
    assert again.lookup_acceptance == first.lookup_acceptance and again.acceptance_from == first.acceptance_from

    # the record, shipped beside the prompt-token file, serves a machine with an empty data directory
    shipped = tmp_path / "tokens.prompt-tokens.safetensors"
    shutil.copy(tiny_engine.prompt_tokens.source, shipped)
    assert export_acceptance(tiny_engine, beside(shipped)) == tmp_path / "tokens.prompt-tokens.acceptance.json"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "elsewhere"))
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", prompt_tokens=str(shipped)))
    profile = calibrate_engine(engine, prompts=3, max_new_tokens=24, contexts=(64,), repeats=2)
    assert profile.acceptance_from == str(beside(shipped)) and profile.acceptance == first.acceptance

    # other numerics (bf16 instead of fp32): measured anew, and said so
    monkeypatch.setattr(calibration, "measure_record", measure)
    bf16 = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="medium", quant="none", dtype="bfloat16",
                                    prompt_tokens=str(shipped)))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        profile = calibrate_engine(bf16, prompts=3, max_new_tokens=24, contexts=(64,), repeats=1)
    assert "no record for" in caplog.text and "torch/none" in caplog.text
    assert profile.acceptance_from == str(user_records_dir() / f"{bf16.prompt_tokens.fingerprint}.json")
