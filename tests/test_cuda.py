"""What only a CUDA GPU can run: skipped without one (this project's machines have none), ready for anyone with
one (`make test` or `make gpu-check` runs them). Each checks on the real device what test_device_policy.py
checks on property records and on the CPU."""

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Speculator, generate
from ppd_core.backends.torch.device import memory_of, torch_properties as properties_of
from ppd_core.device_memory import nvml_probe
from ppd_core.device_policy import attention_plan, compute_dtype, memory_source, native_bf16
from ppd_core.backends.torch.lean.model import LeanDecoder
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, plain_family

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)"),
]
CUDA = torch.device("cuda")


def test_policy_reads_the_real_device():
    properties = properties_of(CUDA)
    capability = torch.cuda.get_device_capability(CUDA)
    assert properties.compute_capability == capability
    assert native_bf16(properties) == (capability >= (8, 0))
    assert compute_dtype(properties) == ("bfloat16" if capability >= (8, 0) else "float16")
    reading = memory_of(CUDA)
    assert 0 < reading.used_bytes < reading.total_bytes
    if memory_source(properties) == "nvml":  # NVML found the same card by UUID as torch numbers it
        nvml = nvml_probe(properties.uuid)
        assert nvml is not None and nvml.total_bytes == reading.total_bytes


def lean_on_cuda(seed: int = 3) -> tuple[torch.nn.Module, LeanDecoder]:
    dtype = getattr(torch, compute_dtype(properties_of(CUDA)))
    model = tiny_llama(seed=seed).to(CUDA, dtype)
    return model, LeanDecoder(model)


def test_lean_forward_on_cuda_matches_the_cpu():
    cpu_model = tiny_llama(seed=3)
    model, lean = lean_on_cuda(3)
    assert lean.attention == attention_plan(properties_of(CUDA))
    prompt = list(range(5, 45))
    with torch.inference_mode():
        expected = cpu_model(torch.tensor([prompt])).logits[0, -1].numpy()
    decoder = TorchDecoder(lean)
    step = decoder.prefill(decoder.new_cache(), prompt)  # kept on the GPU: only what is asked for crosses
    logits = step.rows(slice(0, 1))[0]  # [vocab] float32 NumPy
    assert np.abs(logits - expected).max() <= 0.05 * np.abs(expected).max()  # bf16 / fp16 rounding
    assert step.argmax().tolist() == [int(expected.argmax())] == [int(logits.argmax())]
    top = step.top_of_mean(np.array([[0]]), 5)[0]  # [5] int64: row 0's five likeliest tokens, best first
    np.testing.assert_array_equal(logits[top], np.sort(logits)[::-1][:5])  # ties (bf16) in either order


def table_of(seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((3, 64)) * 5).astype(np.float32)  # [n * V, hidden]: cast on the GPU


def test_prefill_and_tree_steps_never_fall_back_to_the_math_kernel():
    """Under flash / memory-efficient / cuDNN attention only, a math fallback would raise 'No available kernel'."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _, lean = lean_on_cuda(3)
    decoder = TorchDecoder(lean)
    table = table_of()
    family = family_from_spec("large", STATIC_TREES["large"], 3, 1)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        steps = list(generate(Speculator(decoder, family, table), check_answer([(5 + i) % 128 for i in range(150)], 32, 256)))
    assert sum(len(step.tokens) for step in steps) == 32


def test_greedy_ppd_equals_plain_on_cuda():
    """Equal up to floating-point near-ties on a GPU; the tiny model's sharp logits leave none."""
    _, lean = lean_on_cuda(3)
    decoder = TorchDecoder(lean)
    assert not decoder.bitwise
    table = table_of()
    prompt = list(range(5, 25))

    def tokens(family):
        steps = generate(Speculator(decoder, family, table), check_answer(prompt, 60, 256))
        return [t for step in steps for t in step.tokens]

    assert tokens(family_from_spec("large", STATIC_TREES["large"], 3, 1)) == tokens(plain_family())


def test_weights_load_straight_to_the_gpu_in_the_policy_dtype(tiny_model_dir):
    from ppd_core.loading import load_model

    loaded = load_model(str(tiny_model_dir), device="cuda", backend="torch")
    weight = loaded.model.get_input_embeddings().weight
    assert weight.device.type == "cuda"
    assert str(weight.dtype).removeprefix("torch.") == compute_dtype(properties_of(CUDA))
