"""The device policy on property records of GPUs this project has never had, and the lean forward's CUDA
attention forms run on the CPU: the same code a GPU runs, checked against the forms tested here."""

import numpy as np
import psutil
import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_llama
from ppd_core import device_info, device_memory
from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.answer_request import check_answer
from ppd_core.decoding import Speculator, generate
from ppd_core.device_policy import (
    MEMORY_HEADROOM, AttentionPlan, DeviceProperties, attention_plan, compute_dtype, context_that_fits,
    llama_extra_buffers, memory_source, native_bf16, parse_version, profile_fields, rows_bitwise,
    version_notes,
)
from ppd_core.backends.torch.lean.attention import attend
from ppd_core.backends.torch.lean.model import LeanDecoder, _rms_norm
from ppd_core import Engine, EngineConfig
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import family_from_spec, plain_family
from ppd_core.calibration.calibrate import profile_key

GiB = 2**30
RTX_4090 = DeviceProperties("cuda", "NVIDIA GeForce RTX 4090", 24 * GiB, (8, 9), uuid="GPU-4090")
RTX_2060 = DeviceProperties("cuda", "NVIDIA GeForce RTX 2060", 6 * GiB, (7, 5), uuid="GPU-2060")
ORIN_NANO = DeviceProperties("cuda", "Orin", 8 * GiB, (8, 7), integrated=True, torch_version=(2, 3))
CPU = DeviceProperties("cpu", "AMD EPYC", 24 * GiB, threads=2)


def test_dtype_native_bf16_only_from_ampere():
    assert [native_bf16(p) for p in (RTX_4090, RTX_2060, ORIN_NANO, CPU)] == [True, False, True, False]
    # an RTX 2060 emulates bf16 (torch.cuda.is_bf16_supported() says yes): fp16 there
    assert [compute_dtype(p) for p in (RTX_4090, RTX_2060, ORIN_NANO, CPU)] == ["bfloat16", "float16", "bfloat16", "float32"]


def test_memory_source_by_kind():
    assert memory_source(RTX_4090) == "nvml"  # by UUID: any CUDA_VISIBLE_DEVICES order
    assert memory_source(ORIN_NANO) == "unified"  # Jetson: no NVML, and cudaMemGetInfo leaves out the page cache
    assert memory_source(CPU) == "system"
    assert memory_source(DeviceProperties("cuda", "old torch", GiB, (7, 0))) == "cuda"  # no UUID known


def test_profile_fields_keep_threads_only_on_a_cpu():
    assert profile_fields(CPU) == {"kind": "cpu", "name": "AMD EPYC", "memory_bytes": 24 * GiB, "driver": "", "threads": 2}
    assert "threads" not in profile_fields(CPU, offloaded=True)  # every llama.cpp layer on a GPU
    gpu = profile_fields(RTX_4090, driver="580.1")
    assert gpu == {"kind": "cuda", "name": "NVIDIA GeForce RTX 4090", "memory_bytes": 24 * GiB, "driver": "580.1",
                   "compute_capability": "8.9", "integrated": False}
    assert profile_fields(ORIN_NANO)["integrated"] is True


def test_cpu_profile_key_is_the_one_saved_profiles_have(tiny_model_dir):
    """A CPU profile's device key keeps the fields it had before the policy, so profiles users have stay valid."""
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir), prompt_tokens="none", backend="torch", quant="none",
                                      device="cpu", auto_calibrate=False))
    device = profile_key(engine.loaded, engine.prompt_tokens)["device"]
    assert set(device) == {"kind", "name", "memory_bytes", "threads", "driver"}
    assert device == {**device_info.describe(engine.loaded.info.properties).to_json(), "threads": torch.get_num_threads()}


def test_rows_bitwise_where_tested():
    """llama.cpp's policy; torch's wing says not bitwise everywhere (fp32 matmuls are not row-invariant, and neither
    are bitsandbytes': the lean CPU int4 / int8 kernels are gone)."""
    assert rows_bitwise(CPU)  # then probed per file at load (test_gguf_exact.py)
    assert not rows_bitwise(CPU, gpu_layers=-1)  # offloaded: GPU kernels
    assert not any(rows_bitwise(p) for p in (RTX_4090, RTX_2060, ORIN_NANO))
    assert not TorchDecoder(tiny_llama()).info.bitwise


def test_attention_plans():
    assert attention_plan(RTX_4090) == AttentionPlan(causal_prefill=True, gqa="native", masked_gqa="folded",
                                                     masked_prefill_rows=512)
    assert attention_plan(ORIN_NANO) == AttentionPlan(causal_prefill=True, gqa="repeat", masked_gqa="folded",
                                                      masked_prefill_rows=512)  # torch 2.3
    assert attention_plan(CPU) == AttentionPlan(causal_prefill=False, gqa="native", masked_gqa="native")
    old_cpu = DeviceProperties("cpu", "x", GiB, torch_version=(2, 2))
    assert attention_plan(old_cpu) == AttentionPlan(causal_prefill=False, gqa="repeat", masked_gqa="folded")
    assert version_notes(CPU) == [] and len(version_notes(ORIN_NANO)) == 2
    assert [n.split(" has no ")[1][:10] for n in version_notes(DeviceProperties("cuda", "x", GiB, torch_version=(2, 4)))] == ["enable_gqa"]


def test_versions_and_llama_buffers():
    assert parse_version("2.13.0+cpu") == (2, 13)
    assert parse_version("2.1.0a0+41361538.nv23.06") == (2, 1)
    assert parse_version("2.5") == (2, 5)
    assert not llama_extra_buffers("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert llama_extra_buffers("CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")


def test_context_that_fits_against_brute_force():
    per_token, weights, staging = 1000, 5_000_000, 1_000_000
    for free in (0, 6_000_000, 8_000_000, 20_000_000, 10**10):
        for positions in (512, 4096, 8192):
            fitting = [c for c in range(1, positions + 1) if weights + staging + c * per_token <= MEMORY_HEADROOM * free]
            longest = max(fitting, default=0)
            expected = longest if longest >= min(2048, positions) else 0
            assert context_that_fits(weights, staging, per_token, positions, free) == expected, (free, positions)


def test_memory_reading_follows_the_policy(monkeypatch):
    unified = device_info.memory_of(ORIN_NANO)
    assert unified.label == "unified memory" and unified.total_bytes == psutil.virtual_memory().total
    asked = []

    def fake_nvml(uuid):
        asked.append(uuid)
        return device_memory.NvmlReading("NVIDIA GeForce RTX 4090", 24 * GiB, 3 * GiB, "580.1")

    monkeypatch.setattr(device_memory, "nvml_probe", fake_nvml)
    reading = device_info.memory_of(RTX_4090)
    assert asked == ["GPU-4090"]  # NVML is asked by UUID, never by torch's index
    assert (reading.label, reading.used_bytes, reading.free_bytes) == ("GPU", 3 * GiB, 21 * GiB)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_attention_forms_agree(groups):
    """native GQA, folded groups and repeated K/V are one attention; is_causal equals the causal mask."""
    generator = torch.Generator().manual_seed(groups)
    T, S, Hkv, D = 7, 19, 2, 16
    q = torch.randn(T, Hkv * groups, D, generator=generator)
    keys, values = torch.randn(Hkv, S, D, generator=generator), torch.randn(Hkv, S, D, generator=generator)
    mask = torch.rand(T, S, generator=generator) > 0.4
    mask[:, 0] = True  # every row sees something
    mask = mask[None, None]
    native = attend(q, keys, values, AttentionPlan(False, "native", "native"), mask)
    folded = attend(q, keys, values, AttentionPlan(False, "native", "folded"), mask)
    brute = torch.stack([
        F.scaled_dot_product_attention(q[:, h][None], keys[h // groups][None], values[h // groups][None], attn_mask=mask[0])[0]
        for h in range(Hkv * groups)], dim=1)  # head by head, mapped as transformers' repeat_kv maps them
    torch.testing.assert_close(native, brute, atol=1e-5, rtol=0)
    torch.testing.assert_close(folded, brute, atol=1e-5, rtol=0)
    square_keys, square_values = keys[:, :T], values[:, :T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    by_mask = attend(q, square_keys, square_values, AttentionPlan(False, "native", "native"), causal)
    for plan in (AttentionPlan(True, "native", "folded"), AttentionPlan(True, "repeat", "folded")):
        torch.testing.assert_close(attend(q, square_keys, square_values, plan, causal=True), by_mask, atol=1e-5, rtol=0)


def test_rms_norm_fallback_equals_torch():
    x, weight = torch.randn(5, 64), torch.randn(64)
    torch.testing.assert_close(_rms_norm(x, (64,), weight, 1e-5), F.rms_norm(x, (64,), weight, 1e-5), atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", [RTX_4090, ORIN_NANO], ids=["rtx4090-plan", "jetson-torch2.3-plan"])
def test_gpu_attention_plan_decodes_as_plain_on_the_cpu(device):
    """The lean forward with a GPU's attention plan (is_causal prefill, folded masked steps; repeated K/V for an
    old torch) gives the transformers model's logits and greedy PPD equal to plain decoding."""
    model = tiny_llama(seed=3)
    lean = LeanDecoder(model)
    lean.attention = attention_plan(device)
    prompt = list(range(5, 25))
    with torch.inference_mode():
        expected = model(torch.tensor([prompt])).logits[0, -1].numpy()
    decoder = TorchDecoder(lean)
    np.testing.assert_allclose(decoder.prefill(decoder.new_cache(), prompt).rows(slice(0, 1))[0], expected, atol=1e-4, rtol=0)
    table = (np.random.default_rng(1).standard_normal((3, 64)) * 5).astype(np.float32)  # [n * V, hidden]

    def tokens(family):
        steps = list(generate(Speculator(decoder, family, table), check_answer(prompt, 60, 256)))
        return [t for s in steps for t in s.tokens], len(steps)

    plain, _ = tokens(plain_family())
    ppd, steps = tokens(family_from_spec("large", STATIC_TREES["large"], 3, 1))
    assert ppd == plain and len(plain) == 60 and steps <= 60


def test_device_panel_shows_the_policy(default_engine):
    from app.system_info import device_panel

    line = next(line for line in device_panel(default_engine.snapshot()).split("  \n") if line.startswith("**Device policy:**"))
    assert line.startswith("**Device policy:** memory read from the system (psutil)")
    if default_engine.loaded.backend.name == "torch":
        assert "compute dtype float32" in line and attention_plan(CPU).describe() in line


def test_a_follow_up_prefill_in_chunks_equals_transformers(monkeypatch):
    """A GPU plan's prefill after a cache runs in chunks of rows (8 here, 512 on a GPU): the logits of every row
    equal transformers' forward over the whole sequence."""
    from ppd_core.backends.torch import cache as kv_cache
    from ppd_core.backends.torch.decoder import forward_hidden, logits_of

    model = tiny_llama(seed=5)
    lean = LeanDecoder(model)
    lean.attention = AttentionPlan(causal_prefill=True, gqa="native", masked_gqa="folded", masked_prefill_rows=8)
    ids = torch.randint(0, 128, (70,), generator=torch.Generator().manual_seed(9)).tolist()
    import ppd_core.backends.torch.lean.model as lean_model

    rows = []  # query rows of each attention call
    monkeypatch.setattr(lean_model, "attend", lambda q, *args, **kwargs: rows.append(q.shape[0]) or attend(q, *args, **kwargs))
    with torch.inference_mode():
        expected = model(torch.tensor([ids])).logits[0]
        cache = kv_cache.new_cache(lean)
        embedding = model.get_input_embeddings()
        first = forward_hidden(lean, cache, embedding(torch.tensor(ids[:25])), torch.arange(25), None)  # is_causal
        follow_up = forward_hidden(lean, cache, embedding(torch.tensor(ids[25:])), torch.arange(25, 70), None)  # 6 chunks
        logits = logits_of(lean, torch.cat([first, follow_up]))
    assert follow_up.shape[0] == 45 and cache.length == 70
    assert rows == [25] * 2 + [8] * 10 + [5] * 2  # 2 layers: the first prefill whole, the follow-up in 8-row chunks
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
