"""int8 / int4 CPU layers: packing round trips, GGUF 4-bit blocks taken as they are, exact greedy PPD."""


import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from gguf.quants import quantize as ggml_quantize

from conftest import tiny_llama
from ppd_core.decoding import Request, Speculator, generate
from ppd_core.lean.gguf_blocks import block_levels, int4_layers, int8_head, read_raw, unpermute_rows
from ppd_core.lean.gguf_index import tensor_index
from ppd_core.lean.model import LeanDecoder, fused, same_rows, same_weight
from ppd_core.lean.quant import INT4_GROUP, int4_from_levels, quantize
from ppd_core.loading import default_model_file, pick_decoder
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, vanilla_family
from ppd_core.backends.torch_backend import TorchDecoder

BF16_EPS = 2.0**-8  # relative rounding of a bf16 value (8 significant bits)


def test_int8_round_trip_within_half_a_step():
    weight = torch.randn(96, 160, generator=torch.Generator().manual_seed(0))
    weight[5] *= 40  # one loud channel must not hurt the others: scales are per output channel
    layer = quantize(weight, None, "int8")
    step = weight.abs().amax(1, keepdim=True) / 127
    error = (layer.dequantized() - weight).abs()
    assert (error <= step / 2 * (1 + BF16_EPS) + weight.abs() * BF16_EPS).all()
    assert error.max() > 0  # it did round


def test_int4_round_trip_within_half_a_step():
    weight = torch.randn(64, 4 * INT4_GROUP, generator=torch.Generator().manual_seed(1))
    layer = quantize(weight, None, "int4")
    groups = weight.view(64, -1, INT4_GROUP)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(INT4_GROUP, 1)  # [out, in]
    error = (layer.dequantized() - weight).abs()
    assert (error <= step / 2 * (1 + 2 * BF16_EPS) + 2 * weight.abs() * BF16_EPS + 1e-6).all()
    assert (error > step / 4).any()  # 4 bits are coarse: the bound is not vacuous


def q4_1_weight(rows: int, cols: int, seed: int):
    """Weights that are exactly Q4_1 blocks: w = d * q + m with fp16 d, m; every block uses levels 0 and 15."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 16, (rows, cols), generator=g)
    levels[:, ::INT4_GROUP], levels[:, 1::INT4_GROUP] = 0, 15
    d = (torch.rand(rows, cols // INT4_GROUP, generator=g) * 0.05 + 0.001).half().float()
    m = (-torch.rand(rows, cols // INT4_GROUP, generator=g) * 0.4).half().float()
    weight = d.repeat_interleave(INT4_GROUP, 1) * levels + m.repeat_interleave(INT4_GROUP, 1)
    return weight, levels, d, m


def test_q4_1_levels_are_found_again_up_to_scale_rounding():
    weight, levels, d, m = q4_1_weight(48, 3 * INT4_GROUP, seed=2)
    from_file = int4_from_levels(levels, d, m + 8 * d).dequantized()
    requantized = quantize(weight, None, "int4").dequantized()
    # the file's blocks, with d and m + 8d rounded to bf16: off by at most that rounding
    rounding = (8 * d + (m + 8 * d).abs()).repeat_interleave(INT4_GROUP, 1) * BF16_EPS + weight.abs() * BF16_EPS
    assert ((from_file - weight).abs() <= rounding).all()
    # re-quantizing the de-quantized weights lands on the same levels: the same values, up to that rounding
    assert ((requantized - from_file).abs() <= 2 * rounding).all()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_decode_like_ggml(kind):
    values = np.random.default_rng(3).standard_normal((6, 4 * INT4_GROUP)).astype(np.float32)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = ggml_quantize(values, qtype)
    levels, scale, zero = block_levels(raw, kind)
    ours = (levels.float() - 8) * scale.repeat_interleave(INT4_GROUP, 1) + zero.repeat_interleave(INT4_GROUP, 1)
    assert torch.allclose(ours, torch.from_numpy(dequantize(raw, qtype)), atol=1e-6, rtol=0)
    assert levels.min() >= 0 and levels.max() <= 15


def test_default_gguf_blocks_decode_like_ggml():
    reader = gguf.GGUFReader(default_model_file())
    tensor = next(t for t in reader.tensors if t.name == "blk.7.ffn_down.weight")
    levels, scale, zero = block_levels(tensor.data, tensor.tensor_type.name)
    ours = (levels.float() - 8) * scale.repeat_interleave(INT4_GROUP, 1) + zero.repeat_interleave(INT4_GROUP, 1)
    assert torch.equal(ours, torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)))


def test_unpermute_rows_inverts_llama_cpp_interleaving():
    heads, head_dim = 3, 8
    rows = torch.arange(heads * head_dim)[:, None].float()  # [rows, 1]
    # llama.cpp's permute: within each head, the two halves are interleaved
    permuted = rows.reshape(heads, 2, head_dim // 2, 1).transpose(1, 2).reshape(rows.shape)
    assert torch.equal(unpermute_rows(permuted, heads), rows)


@pytest.mark.slow
def test_default_int4_layers_are_the_files_blocks(default_engine):
    """All 30 layers from the file's Q4_1 blocks equal the weights transformers de-quantized, up to scale rounding."""
    model = default_engine.loaded.model
    layers = int4_layers(default_model_file(), tensor_index(default_model_file()), model.config)
    assert layers is not None and len(layers) == model.config.num_hidden_layers
    for block, layer in zip(model.model.layers, layers):
        attention, mlp = block.self_attn, block.mlp
        assert same_weight(layer["wqkv"], fused(attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight), 0.01)
        assert same_weight(layer["w13"], fused(mlp.gate_proj.weight, mlp.up_proj.weight), 0.01)
        assert same_weight(layer["wo"], attention.o_proj.weight, 0.01)
        assert same_weight(layer["w2"], mlp.down_proj.weight, 0.01)
    # without un-permuting the rows the guard refuses the blocks
    q = layers[0]["wqkv"].dequantized()[: model.config.hidden_size]
    assert not torch.allclose(q, unpermute_rows(q, model.config.num_attention_heads), atol=1e-3)
    decoder = LeanDecoder(model, "int4", layers)
    assert decoder.layers[0].wqkv is layers[0]["wqkv"]  # taken as they are


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("tree_name", list(STATIC_TREES))
def test_greedy_ppd_equals_plain_in_quant_modes(kind, tree_name):
    """PPD verifies against the same quantized model, so it must reproduce its plain greedy answer."""
    model = tiny_llama(seed=5)
    decoder = pick_decoder(model, "lean", kind)
    table = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)) * 5
    prompt = list(range(7, 27))

    def tokens(family, prompt_table):
        steps = generate(Speculator(TorchDecoder(decoder), family, prompt_table), Request(prompt, 60, frozenset(), 256))
        return [t for s in steps for t in s.tokens]

    plain = tokens(vanilla_family(), None)
    assert tokens(family_from_spec(tree_name, STATIC_TREES[tree_name], 3, 1), table) == plain
    fp32_steps = generate(Speculator(TorchDecoder(pick_decoder(model, "lean")), vanilla_family()), Request(prompt, 60, frozenset(), 256))
    fp32_plain = [t for s in fp32_steps for t in s.tokens]
    assert plain[:5] == fp32_plain[:5]  # the quantized model still is the model


def test_tensor_index_matches_the_gguf_reader():
    """Offsets, types, shapes and bytes of every tensor of the default file, as gguf's own reader sees them."""
    path = default_model_file()
    index = tensor_index(path)
    tensors = gguf.GGUFReader(path).tensors
    assert len(index) == len(tensors)
    for tensor in tensors:
        info = index[tensor.name]
        assert (info.offset, info.n_bytes, info.kind) == (tensor.data_offset, tensor.n_bytes, tensor.tensor_type.name)
        assert info.shape == tuple(int(size) for size in tensor.shape)
    embedding = next(t for t in tensors if t.name == "token_embd.weight")
    info = index["token_embd.weight"]
    assert np.array_equal(read_raw(path, info, 100, 105), np.asarray(embedding.data)[100:105].view(np.uint8))


@pytest.mark.slow
def test_the_files_int8_head_is_the_models_head_quantized(default_engine):
    """Built from the file's Q8_0 rows a chunk at a time, it equals quantizing the model's de-quantized head."""
    model = default_engine.loaded.model
    head = int8_head(default_model_file(), tensor_index(default_model_file()), model.config)
    reference = quantize(model.get_output_embeddings().weight, None, "int8")
    assert torch.equal(head.qweight, reference.qweight) and torch.equal(head.scales, reference.scales)
    assert same_rows(head, model.get_output_embeddings().weight)
    assert not same_rows(head, model.get_output_embeddings().weight.roll(1, 0))  # the guard sees a wrong file
