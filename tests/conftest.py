"""Shared fixtures: tiny random Llama models built in the test, and the real default model."""

from __future__ import annotations

import user_folders

# Profiles, histories, prompt tokens, GGUF conversions, training work and the Hub's cache go to the user's folders:
# the user's are listed first (tests/test_user_folders.py compares them at the end), then every XDG_*_HOME and HF_HOME
# points at this run's own, for this process and the processes it starts, before huggingface_hub reads them.
user_folders.record()
user_folders.redirect()

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ppd_core.backends.torch.device import fit_threads_to_cores  # noqa: E402

fit_threads_to_cores()  # as ppd's torch wing does on a load: the tests' own torch models too


def tiny_llama(seed: int = 0, vocab_size: int = 128, hidden_size: int = 64, max_positions: int = 256) -> LlamaForCausalLM:
    """A 2-layer random Llama in fp32: fast, and with peaked enough logits to avoid argmax ties."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)  # sharpen the logits
    return model


@pytest.fixture(scope="session")
def default_engine():
    """The embedded default model on torch in fp32 with its shipped prompt tokens (loaded once per test session).

    ``backend="torch"``: transformers' de-quantized copy of the GGUF, so these tests compare against transformers' own
    forward and ``generate()`` (the default GGUF on llama.cpp is tests/test_llamacpp.py's).
    """
    from ppd_core import Engine, EngineConfig

    return Engine.load(EngineConfig(model="default", quant="none", device="cpu", tree="medium", backend="torch"))


@pytest.fixture(scope="session")
def llama_default():
    """The embedded default model on llama.cpp (a static tree, 2 threads), loaded once per test session for the tests
    that only decode with it; a test that changes its tree or lookup puts them back."""
    from ppd_core import Engine, EngineConfig

    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium", threads=2))
    yield engine
    engine.close()


def save_tiny_model(folder, default_engine, seed: int = 0):
    vocab = default_engine.loaded.model.config.vocab_size
    model = tiny_llama(seed=seed, vocab_size=vocab, max_positions=512)
    model.generation_config.eos_token_id = default_engine.tokenizer.eos_token_id
    model.save_pretrained(folder)
    default_engine.tokenizer.save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_engine):
    """A tiny random Llama saved as a Hugging Face directory, with the default model's tokenizer, and
    untrained prompt tokens where ``ppd train`` would have saved trained ones (the engine finds them there)."""
    from ppd_core.drafters.prompt_tokens import INIT_TEXT
    from ppd_core.drafters.prompt_tokens import PromptTokens
    from ppd_core.engine_load import user_prompt_tokens_path
    from ppd_core.training.prompt_tensors import initial_prompt_tokens

    folder = tmp_path_factory.mktemp("tiny")
    model = save_tiny_model(folder, default_engine)
    ids = default_engine.tokenizer.encode(INIT_TEXT, add_special_tokens=False)
    tokens = initial_prompt_tokens(model.get_input_embeddings().weight, ids, folder.name)
    path = user_prompt_tokens_path(folder.name, tokens.signature)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens.save(path)
    return folder


@pytest.fixture(scope="session")
def lookup_only_dir(tmp_path_factory, default_engine):
    """Another tiny Llama (another seed: prompt tokens are found by the embedding table's fingerprint) with no prompt
    tokens anywhere: the engine guesses by n-gram lookup alone."""
    folder = tmp_path_factory.mktemp("tiny-lookup-only")
    save_tiny_model(folder, default_engine, seed=5)
    return folder


REAL_MODEL_FIXTURES = {"default_engine", "llama_default", "running_app"}  # tiny_model_dir needs default_engine (its tokenizer)


def pytest_collection_modifyitems(items):
    """Mark ``slow`` every test that loads the real default model through a fixture (others mark themselves), and
    run tests/test_user_folders.py last (it compares the user's folders with their listing at the start)."""
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.nodeid.startswith("tests/test_user_folders.py"))


def machine_line() -> str:
    """The machine the tests ran on, in one line (a CI log says what it timed)."""
    import os

    import psutil

    from ppd_core.cpu_cores import CGROUP, cpu_quota, usable_cores

    quota = cpu_quota(CGROUP)
    return (f"ppd tests on {os.cpu_count()} cores ({usable_cores()} usable, CPU quota "
            f"{'none' if quota is None else f'{quota:g} cores'}), {psutil.virtual_memory().total / 2**30:.0f} GiB")


def pytest_sessionstart(session):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(machine_line())


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(machine_line())


def pytest_unconfigure(config):
    user_folders.clean_up()
