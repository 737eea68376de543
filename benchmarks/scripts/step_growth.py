"""Per-step time early and late in a long answer, against what the KV cache's growth alone explains.

    python benchmarks/scripts/step_growth.py [--max-new-tokens 1024] [--mode vanilla|ppd]

Times each step as the consumer of ``Engine.stream`` sees it (decoding step + detokenizing +
bookkeeping), and a bare 1-token forward of the model at the same two context lengths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ppd_core import kv_cache
from ppd_core.backends.torch_backend import forward_hidden, logits_of
from ppd_core.engine import Engine, EngineConfig

PROMPT = "Count from 1 to 1000, one number per line, and do not stop early."


@torch.inference_mode()
def bare_step_ms(decoder, ids: list[int], repeats: int = 15) -> float:
    """Median time of one 1-token forward plus LM head (the engine's decoder) after ``ids`` are cached."""
    cache = kv_cache.new_cache(decoder)
    embed = decoder.get_input_embeddings()
    forward_hidden(decoder, cache, embed(torch.tensor(ids[:-1])), torch.arange(len(ids) - 1), None)
    last, position = embed(torch.tensor(ids[-1:])), torch.tensor([len(ids) - 1])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        logits_of(decoder, forward_hidden(decoder, cache, last, position, None)).argmax(-1).item()
        times.append((time.perf_counter() - start) * 1000)
        kv_cache.truncate(cache, len(ids) - 1)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--mode", default="vanilla", choices=["vanilla", "ppd"])
    parser.add_argument("--early", type=int, default=50)
    parser.add_argument("--late", type=int, default=900)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(device="cpu", tree="auto" if args.mode == "ppd" else "small"))
    ids = engine.chat_ids([{"role": "user", "content": PROMPT}])
    # EOS off, so that the answer runs to --max-new-tokens (a small model stops counting early)
    engine.loaded.__class__ = type("WithoutEos", (type(engine.loaded),), {"eos_token_ids": property(lambda self: frozenset())})
    marks: list[tuple[int, float]] = []  # (answer tokens so far, step ms)
    tokens: list[int] = []
    last = time.perf_counter()
    for event in engine.stream(ids, args.mode, args.max_new_tokens):
        now = time.perf_counter()
        if not event.step.prefill:
            marks.append((len(event.tokens), (now - last) * 1000 / len(event.step.tokens)))
        tokens = event.tokens
        last = now

    def around(position: int) -> float:
        window = [ms for n, ms in marks if abs(n - position) <= 20]
        return statistics.median(window) if window else float("nan")

    early, late = around(args.early), around(args.late)
    bare_early = bare_step_ms(engine.loaded.decoder, ids + tokens[: args.early])
    bare_late = bare_step_ms(engine.loaded.decoder, ids + tokens[: args.late])
    print(json.dumps({
        "mode": args.mode, "quant": engine.loaded.quant, "answer_tokens": len(tokens), "prompt_tokens": len(ids),
        "stream_ms_per_token": {"early": round(early, 2), "late": round(late, 2), "growth": round(late - early, 2)},
        "bare_forward_ms": {"early": round(bare_early, 2), "late": round(bare_late, 2), "growth": round(bare_late - bare_early, 2)},
        "positions": [args.early, args.late],
    }, indent=1))


if __name__ == "__main__":
    main()
