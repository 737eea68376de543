"""Torch loading: a Hugging Face directory, and a GGUF through transformers only where asked for (one warning first)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import tiny_llama
from ppd_core.backends.torch import gguf_copy
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.backends.torch.gguf_copy import dequantization_note
from ppd_core.backends.torch.lean.model import LeanDecoder
from ppd_core.backends.torch.loading import load_hf, training_network
from ppd_core.backends.torch import loading as torch_loading
from ppd_core.device_memory import MemoryReading
from ppd_core.loaded import LoadOptions, ModelLoadError
from ppd_core.loading import load_model


def load_gguf_with_transformers(path, name, quant="auto", device="auto", dtype="auto", forward="lean"):
    return torch_loading.load_gguf_with_transformers(path, name, LoadOptions(quant, device, dtype, forward, "torch"))

NOTE = re.compile(r"transformers de-quantizes (\S+) to float32: about (\d+\.\d+) GB of memory "
                  r"\(and (\d+\.\d+) GB on disk for the cached copy\)")


def save_tiny(folder, seed: int = 0):
    """A tiny random Llama as a Hugging Face directory, with a word-level tokenizer of its 128 tokens."""
    model = tiny_llama(seed=seed)
    model.generation_config.eos_token_id = 127
    model.save_pretrained(folder)
    vocabulary = {f"w{i}": i for i in range(126)} | {"<unk>": 126, "</s>": 127}
    words = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    return model


@pytest.fixture
def tiny_dir(tmp_path):
    save_tiny(tmp_path / "tiny-hf")
    return tmp_path / "tiny-hf"


def test_a_hugging_face_directory_loads_on_torch(tiny_dir):
    loaded = load_hf(tiny_dir, "tiny-hf", LoadOptions(device="cpu"))
    assert (loaded.quant, loaded.quant_is_default, loaded.forward) == ("none", True, "lean")  # auto: the model's own weights
    assert loaded.name == "tiny-hf" and loaded.source == str(tiny_dir) and loaded.gguf_file is None
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert isinstance(loaded.backend, TorchDecoder) and isinstance(loaded.backend.model, LeanDecoder)
    assert not loaded.backend.bitwise  # fp32 matmuls: tree rows equal plain steps up to rounding only
    assert isinstance(loaded.generation_config, dict) and loaded.generation_config["eos_token_id"] == 127
    assert "do_sample" not in loaded.generation_config  # only what the model's files set: no defaults
    assert loaded.eos_token_ids == frozenset({127}) and loaded.max_context == 256
    assert loaded.num_bytes == loaded.network.get_memory_footprint()  # the lean forward shares the model's weights
    # the step the app takes: prefill logits as NumPy, equal to transformers' own forward
    ids = loaded.tokenizer.encode("w5 w6 w7 w8")
    assert ids == [5, 6, 7, 8]
    logits = loaded.backend.prefill(loaded.backend.new_cache(), ids).rows(slice(0, 1))[0]
    with torch.inference_mode():
        expected = loaded.network(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(loaded.backend.embedding_rows(np.array([3, 4])),
                                  loaded.network.get_input_embeddings().weight[[3, 4]].numpy())

    generic = load_hf(tiny_dir, "tiny-hf", LoadOptions("none", "cpu", forward="transformers"))
    assert (generic.quant, generic.quant_is_default, generic.forward) == ("none", False, "transformers")
    assert generic.backend.model is generic.network


@pytest.mark.parametrize("quant, message", [
    ("int4", "unknown quantization 'int4'; choose one of auto, none, 4bit, 8bit"),  # the lean CPU kernels are gone
    ("int8", "unknown quantization 'int8'"),
    ("8bit", "bitsandbytes 8-bit runs on CUDA only"),
])
def test_torch_quantizations_are_none_4bit_and_8bit(tiny_dir, quant, message):
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load_model(str(tiny_dir), quant, "cpu")


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="model not found"):
        load_model(str(tmp_path / "missing"))
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(str(tmp_path))


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A .gguf file whose conversion saves a tiny Llama (counted calls), with the cache in tmp_path."""
    monkeypatch.setattr(gguf_copy.platformdirs, "user_cache_dir", lambda *args, **kwargs: str(tmp_path / "cache"))
    calls = []

    def convert(gguf_file, staging):
        calls.append(gguf_file)
        save_tiny(staging)

    monkeypatch.setattr(gguf_copy, "_convert_gguf", convert)
    path = tmp_path / "models" / "tiny.Q4_0.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(4_500_000))  # unreadable header: its size gives the estimate
    return path, calls


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_a_gguf_through_transformers_says_what_it_costs_first_and_converts_once(fake_gguf, caplog):
    path, calls = fake_gguf
    caplog.set_level(logging.INFO, logger=gguf_copy.__name__)
    loaded = load_gguf_with_transformers(path, "tiny", "auto", "cpu")
    [note] = warnings_of(caplog)
    name, memory, disk = NOTE.fullmatch(note).groups()
    estimate = 4_500_004 * 8 / gguf_copy.GGUF_BITS_PER_WEIGHT * 4 / 1e9  # 8M weights at about 4.5 bits, in float32
    assert name == "tiny" and float(memory) == float(disk) == pytest.approx(estimate, abs=0.005)
    assert calls == [path] and (loaded.gguf_file, loaded.source, loaded.quant) == (path, str(path), "none")
    assert isinstance(loaded.backend.model, LeanDecoder) and isinstance(loaded.tokenizer, PreTrainedTokenizerFast)

    caplog.clear()
    again = load_gguf_with_transformers(path, "tiny", "none", "cpu", "bfloat16", "transformers")
    assert calls == [path]  # the cached copy
    [note] = warnings_of(caplog)  # said again: the memory is spent again; the size now the copy's own
    copy = gguf_copy.copy_bytes(gguf_copy.conversion_folder(path))
    assert note == dequantization_note("tiny", copy // 4) and copy > 0
    assert (again.dtype, again.forward) == (torch.bfloat16, "transformers")


def test_a_gguf_whose_float32_copy_does_not_fit_is_refused_before_converting(fake_gguf, monkeypatch, caplog):
    path, calls = fake_gguf
    with pytest.raises(ModelLoadError, match="8-bit runs on CUDA only"):  # a wrong choice: refused before anything
        load_gguf_with_transformers(path, "tiny", "8bit", "cpu")
    assert calls == [] and warnings_of(caplog) == []
    monkeypatch.setattr(gguf_copy, "memory_of", lambda device: MemoryReading("RAM", 2**30 - 10**6, 2**30))
    with pytest.raises(ModelLoadError, match=r"float32 copy of tiny needs about 0\.03 GB but only 0\.00 GB is free"):
        load_gguf_with_transformers(path, "tiny", "none", "cpu")
    assert calls == [] and len(warnings_of(caplog)) == 1


def test_training_network_is_the_float32_model_on_the_cpu(fake_gguf, caplog):
    path, calls = fake_gguf
    network = training_network(path)
    assert calls == [path] and len(warnings_of(caplog)) == 1 and "tiny.Q4_0 to float32" in warnings_of(caplog)[0]
    weight = network.get_input_embeddings().weight
    assert (weight.dtype, weight.device.type, weight.requires_grad, network.training) == (torch.float32, "cpu", False, False)
    assert torch.equal(weight, tiny_llama(seed=0).get_input_embeddings().weight)


def test_the_note_gives_two_digits_below_a_gigabyte():
    assert dequantization_note("SmolLM2", 134_515_008) == ("transformers de-quantizes SmolLM2 to float32: about 0.54 GB of "
                                                           "memory (and 0.54 GB on disk for the cached copy)")
    assert "about 28.0 GB" in dequantization_note("big", 7_000_000_000)


@pytest.mark.slow
def test_the_default_gguf_through_transformers_counts_its_weights_exactly():
    """The real file: the note's count is the GGUF's tensors' and the float32 model's, and the copy holds them."""
    from ppd_core.loading import DEFAULT_NAME, default_model_file

    path = default_model_file()
    parameters = gguf_copy.gguf_parameters(path)
    assert parameters == 134_515_008  # SmolLM2-135M, embedding tied
    loaded = load_gguf_with_transformers(path, DEFAULT_NAME, "none", "cpu")
    assert sum(p.numel() for p in loaded.model.parameters()) == parameters
    copy = gguf_copy.copy_bytes(gguf_copy.conversion_folder(path))
    assert 4 * parameters <= copy < 4 * parameters + 2**20  # float32 weights and a safetensors header
    assert loaded.forward == "lean" and loaded.model.config.num_hidden_layers == 30
