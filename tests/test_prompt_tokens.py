"""The prompt-token file: round trip, and clear refusals for bad or foreign files."""

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.drafters.prompt_tokens import PromptTokenError, PromptTokens
from ppd_core.training.prompt_tensors import check_compatible, initial_prompt_tokens


def make(model, n=3, V=2):
    return initial_prompt_tokens(model.get_input_embeddings().weight, [1, 2], "tiny", n, V)


def test_round_trip_with_metadata(tmp_path):
    model = tiny_llama()
    tokens = make(model)
    tokens.training = {"samples": 10, "steps": 5, "final_loss": 1.5, "top1_acceptance": [0.3, 0.2, 0.1]}
    tokens.save(tmp_path / "p.safetensors")
    loaded = PromptTokens.load(tmp_path / "p.safetensors")
    assert np.array_equal(loaded.embeddings, tokens.embeddings)
    assert loaded.embeddings.shape == (3, 2, 64)
    assert loaded.training == tokens.training and loaded.base_model == "tiny"
    check_compatible(loaded, model.get_input_embeddings().weight, "tiny")
    # ensemble members start apart, or they could never diverge in training
    assert not np.array_equal(loaded.embeddings[0, 0], loaded.embeddings[0, 1])


def test_signature_tolerates_a_bf16_cast():
    model = tiny_llama()
    check_compatible(make(model), model.get_input_embeddings().weight.bfloat16(), "tiny")


def test_other_model_is_refused():
    tokens = make(tiny_llama(seed=0))
    with pytest.raises(PromptTokenError, match="made for tiny, not for other"):
        check_compatible(tokens, tiny_llama(seed=1).get_input_embeddings().weight, "other")


def test_other_hidden_size_is_refused():
    tokens = make(tiny_llama())
    with pytest.raises(PromptTokenError, match="hidden size 64 but wide has 32"):
        check_compatible(tokens, tiny_llama(hidden_size=32).get_input_embeddings().weight, "wide")


def test_corrupt_and_missing_files(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00\x01 not a safetensors file")
    with pytest.raises(PromptTokenError, match="not a valid prompt-token file"):
        PromptTokens.load(bad)
    with pytest.raises(PromptTokenError, match="not found"):
        PromptTokens.load(tmp_path / "missing.safetensors")


def test_file_without_metadata_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "bare.safetensors"
    save_file({"prompt_embeddings": torch.zeros(3, 1, 64)}, str(path))
    with pytest.raises(PromptTokenError, match="bad metadata"):
        PromptTokens.load(path)


def test_shape_disagreeing_with_metadata_is_refused(tmp_path):
    tokens = make(tiny_llama(), V=1)
    tokens.embeddings = np.zeros((3, 1, 64), np.float32)
    tokens.save(tmp_path / "p.safetensors")
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(tmp_path / "p.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    save_file({"prompt_embeddings": torch.zeros(2, 1, 64)}, str(tmp_path / "q.safetensors"), metadata)
    with pytest.raises(PromptTokenError, match="disagrees with its metadata"):
        PromptTokens.load(tmp_path / "q.safetensors")


def test_save_is_atomic(tmp_path):
    tokens = make(tiny_llama())
    tokens.save(tmp_path / "p.safetensors")
    assert [p.name for p in tmp_path.iterdir()] == ["p.safetensors"]


def test_an_ensemble_shrinks_to_one_averaged_member():
    model = tiny_llama()
    tokens = make(model, V=2)
    single = tokens.with_ensemble_size(1)
    assert single.embeddings.shape == (3, 1, 64)
    assert np.array_equal(single.embeddings[:, 0], tokens.embeddings.mean(1))
    assert tokens.with_ensemble_size(2) is tokens
    with pytest.raises(PromptTokenError, match="not 2 into 3"):
        tokens.with_ensemble_size(3)


def test_one_member_grows_into_several_close_but_different_members():
    single = make(tiny_llama(), V=1)
    grown = single.with_ensemble_size(3, seed=1)
    assert grown.embeddings.shape == (3, 3, 64)
    spread = np.abs(grown.embeddings - single.embeddings).max()
    assert 0 < spread < 0.2 * np.abs(single.embeddings).max()
    assert not np.array_equal(grown.embeddings[:, 0], grown.embeddings[:, 1])
    assert np.array_equal(grown.embeddings, single.with_ensemble_size(3, seed=1).embeddings)  # seeded
    assert np.allclose(grown.with_ensemble_size(1).embeddings, single.embeddings, atol=0.05 * np.abs(single.embeddings).max())


def test_the_users_tokens_are_found_by_the_models_fingerprint_not_its_name(tiny_model_dir, tmp_path):
    """Two models named alike (two repositories' model.gguf, say): the tokens trained for one are not used for the
    other (it guesses by lookup alone), and given explicitly they are refused in one line."""
    import json
    import shutil

    from ppd_core import Engine, EngineConfig

    mine = Engine.load(EngineConfig(model=str(tiny_model_dir), device="cpu", tree="auto", auto_calibrate=False))
    assert mine.prompt_tokens.num_prompt_tokens == 3 and mine.prompt_tokens.source.name.startswith(f"{tiny_model_dir.name}-")
    other = tmp_path / tiny_model_dir.name  # the same folder name, another embedding table
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tiny_llama(vocab_size=config["vocab_size"], max_positions=512, seed=7).save_pretrained(other)
    engine = Engine.load(EngineConfig(model=str(other), device="cpu", tree="auto", auto_calibrate=False))
    assert engine.prompt_tokens.num_prompt_tokens == 0
    with pytest.raises(ValueError, match="embedding table differs"):
        Engine.load(EngineConfig(model=str(other), device="cpu", prompt_tokens=str(mine.prompt_tokens.source)))
