"""How often int8 / int4 weights pick the fp32 model's greedy token, teacher-forced, and their step speed.

    python benchmarks/scripts/quant_agreement.py [--limit 20] [--max-new-tokens 128] [--json FILE]

The fp32 model answers the first turns of MT-Bench questions 1-20 greedily; each quantized forward
then reads prompt + answer in one pass, and agreement is the share of answer positions where its
argmax equals the fp32 token. Speed: median ms of a 1-token and a 4-token step at 256 cached tokens,
fp32 and quantized interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from app.bench import read_questions
from app.cli import DEFAULT_QUESTIONS
from ppd_core import kv_cache
from ppd_core.backends.torch_backend import forward_hidden, logits_of
from ppd_core.engine import Engine, EngineConfig
from ppd_core.lean.gguf_blocks import int4_layers
from ppd_core.lean.gguf_index import tensor_index
from ppd_core.lean.model import LeanDecoder
from ppd_core.loading import default_model_file
from measurement import report


@torch.inference_mode()
def agreement(decoder, embedding, sequences: list[tuple[list[int], list[int]]]) -> float:
    hits = total = 0
    for prompt, answer in sequences:
        ids = torch.tensor(prompt + answer)
        cache = kv_cache.new_cache(decoder)
        logits = logits_of(decoder, forward_hidden(decoder, cache, embedding(ids), torch.arange(len(ids)), None))
        predicted = logits[len(prompt) - 1 : -1].argmax(-1)  # the token each position predicts next
        hits += int((predicted == torch.tensor(answer)).sum())
        total += len(answer)
    return hits / total


@torch.inference_mode()
def step_ms(decoder, embedding, rows: int, repeats: int = 15) -> float:
    cache = kv_cache.new_cache(decoder)
    context = torch.randint(0, embedding.weight.shape[0], (256,), generator=torch.Generator().manual_seed(0))
    forward_hidden(decoder, cache, embedding(context), torch.arange(256), None)
    tokens = context[:rows]
    mask = torch.zeros(1, 1, rows, 256 + rows) if rows > 1 else None
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        logits_of(decoder, forward_hidden(decoder, cache, embedding(tokens), torch.arange(256, 256 + rows), mask))
        times.append((time.perf_counter() - start) * 1000)
        kv_cache.truncate(cache, 256)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(device="cpu", quant="none", tree="small"))  # fp32, lean
    model = engine.loaded.model
    embedding = model.get_input_embeddings()
    sequences = []
    for turns in read_questions(DEFAULT_QUESTIONS, args.limit):
        prompt = engine.chat_ids([{"role": "user", "content": turns[0]}])
        sequences.append((prompt, engine.generate(prompt, "vanilla", args.max_new_tokens).tokens))
    blocks = int4_layers(default_model_file(), tensor_index(default_model_file()), model.config)  # the GGUF's own Q4_1 blocks (what --quant auto uses)
    decoders = {"fp32": engine.loaded.decoder, "int8": LeanDecoder(model, "int8"), "int4-requantized": LeanDecoder(model, "int4"),
                "int4-gguf-blocks": LeanDecoder(model, "int4", blocks)}
    result = {"questions": len(sequences), "answer_tokens": sum(len(a) for _, a in sequences), "modes": {}}
    for name, decoder in decoders.items():
        result["modes"][name] = {"agreement": round(agreement(decoder, embedding, sequences), 4)}
    for rows in (1, 4, 16):
        for round_ in range(2):  # interleaved
            for name, decoder in decoders.items():
                result["modes"][name].setdefault(f"ms_{rows}", []).append(round(step_ms(decoder, embedding, rows), 2))
    for name, numbers in result["modes"].items():
        for key in [k for k in numbers if k.startswith("ms_")]:
            numbers[key] = min(numbers[key])
    result["device"] = engine.loaded.device.type
    report(result, args.json)


if __name__ == "__main__":
    main()
