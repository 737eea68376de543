"""int4 from a GGUF file without the transformers model: same forward, same tokens, less memory.

The model-free decoder maps embeddings and norms from the converted checkpoint and computes RoPE
itself; built from the same 4-bit layers and int8 head, it must equal the decoder built from the
loaded transformers model bit for bit.
"""

import json
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import tiny_llama
from ppd_core import kv_cache
from ppd_core.backends.torch_backend import forward_hidden, logits_of
from ppd_core.lean.checkpoint import Checkpoint
from ppd_core.lean.gguf_blocks import int4_layers, int8_head
from ppd_core.lean.gguf_index import tensor_index
from ppd_core.lean.model import LeanDecoder, fused, rope_tables
from ppd_core.lean.quant import quantize
from ppd_core.loading import default_model_file, load_model, plain_config
from test_lean import tiny_qwen2


def file_weights(model):
    """What a GGUF file would hold: int4 layers (no biases) and an int8 head, built anew for each decoder."""
    layers = []
    for block in model.model.layers:
        attention, mlp = block.self_attn, block.mlp
        layers.append({
            "wqkv": quantize(fused(attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight), None, "int4"),
            "wo": quantize(attention.o_proj.weight, None, "int4"),
            "w13": quantize(fused(mlp.gate_proj.weight, mlp.up_proj.weight), None, "int4"),
            "w2": quantize(mlp.down_proj.weight, None, "int4"),
        })
    return layers, quantize(model.get_output_embeddings().weight, None, "int8")


def snapped(model):
    """``model`` with every layer weight on its int4 grid, as a converted GGUF's weights are (the guards compare)."""
    with torch.no_grad():
        for block in model.model.layers:
            for linear in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj, block.self_attn.o_proj,
                           block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj):
                linear.weight.copy_(quantize(linear.weight, None, "int4").dequantized())
    return model


def logits(decoder, ids: list[int]) -> torch.Tensor:
    cache = kv_cache.new_cache(decoder)
    with torch.inference_mode():
        hidden = forward_hidden(decoder, cache, decoder.get_input_embeddings()(torch.tensor(ids)), torch.arange(len(ids)), None)
        return logits_of(decoder, hidden)


def llama3_rope_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2, llama3_rope_llama], ids=["llama", "qwen2-biases", "llama3-rope"])
def test_rope_tables_equal_the_models_rotary_module(make):
    model = make()
    positions = torch.arange(model.config.max_position_embeddings)[None]
    cos, sin = model.model.rotary_emb(torch.ones(1, dtype=torch.float32), positions)
    mine = rope_tables(model.config)
    assert mine is not None
    assert torch.equal(mine[0], cos[0]) and torch.equal(mine[1], sin[0])


def test_rope_tables_decline_types_that_change_with_the_sequence():
    config = LlamaConfig(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert rope_tables(config) is None


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2], ids=["llama-tied", "qwen2-biases-untied"])
def test_model_free_decoder_equals_the_model_built_one(make, tmp_path):
    model = snapped(make())
    model.save_pretrained(tmp_path)
    config = plain_config(tmp_path)
    assert config is not None
    checkpoint = Checkpoint(tmp_path)
    assert torch.equal(checkpoint.tensor("model.embed_tokens.weight"), model.get_input_embeddings().weight)
    free = LeanDecoder.from_checkpoint(config, checkpoint, *file_weights(model))
    built = LeanDecoder(model, "int4", *file_weights(model))
    assert free.model is None
    ids = torch.randint(0, 128, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = logits(built, ids)
    assert expected.abs().max() > 1.0
    assert torch.equal(logits(free, ids), expected)
    if make is tiny_qwen2:  # the checkpoint's q/k/v biases were folded in
        assert free.layers[0].wqkv.bias is not None and torch.equal(free.layers[0].wqkv.bias, built.layers[0].wqkv.bias)


def test_model_free_decoder_guards_refuse_another_models_weights(tmp_path):
    model = snapped(tiny_llama(seed=1))
    model.save_pretrained(tmp_path)
    layers, head = file_weights(snapped(tiny_llama(seed=2)))
    with pytest.raises(ValueError, match="4-bit blocks"):
        LeanDecoder.from_checkpoint(plain_config(tmp_path), Checkpoint(tmp_path), layers, head)
    layers, _ = file_weights(model)
    with pytest.raises(ValueError, match="LM head"):
        LeanDecoder.from_checkpoint(plain_config(tmp_path), Checkpoint(tmp_path), layers, head)


def test_plain_config_needs_the_keys_the_lean_forward_reads(tmp_path):
    tiny_llama().config.save_pretrained(tmp_path)
    assert plain_config(tmp_path).num_hidden_layers == 2
    values = json.loads((tmp_path / "config.json").read_text())
    del values["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert plain_config(tmp_path) is None
    assert plain_config(tmp_path / "missing") is None


@pytest.mark.slow
def test_default_int4_loads_without_the_model_and_builds_it_on_first_use():
    loaded = load_model("default", "int4", "cpu")
    assert loaded.network is None and loaded.forward == "lean"
    assert loaded.eos_token_ids and loaded.max_context == 8192
    ids = loaded.tokenizer.encode("The capital of France is", add_special_tokens=False)
    free = logits(loaded.decoder, ids)
    model = loaded.model  # built now
    assert loaded.network is model
    path = default_model_file()
    tensors = tensor_index(path)
    built = LeanDecoder(model, "int4", int4_layers(path, tensors, model.config), int8_head(path, tensors, model.config))
    assert torch.equal(free, logits(built, ids))
    loaded.release_model()
    assert loaded.network is None


@pytest.mark.slow
def test_default_int4_answers_without_importing_model_code():
    """The mechanism behind the memory figure: decoding never imports transformers' model code (about 90 MB)."""
    script = (
        "import sys\n"
        "from ppd_core.engine import Engine, EngineConfig\n"
        "engine = Engine.load(EngineConfig(model='default', quant='int4', device='cpu', tree='small'))\n"
        "result = engine.generate(engine.chat_ids([{'role': 'user', 'content': 'Name a planet.'}]), max_new_tokens=8)\n"
        "print(len(result.tokens), engine.loaded.network is None, 'transformers.modeling_utils' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["8", "True", "False"]
