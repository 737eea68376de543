"""Per-step time early and late in a long answer, against what the KV cache's growth alone explains.

    python benchmarks/scripts/step_growth.py [--max-new-tokens 1024] [--mode plain|ppd] [--model FILE.gguf]
        [--backend auto|llamacpp|torch] [--threads N]

Times each step as the consumer of ``Engine.stream`` sees it (decoding step + detokenizing +
bookkeeping), and a bare 1-token step of the decoding backend (``prefill`` of one token and the argmax of
its logits, then ``truncate`` back) at the same two context lengths. Default: the default GGUF on llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ppd_core.backend import Decoder
from ppd_core import Engine, EngineConfig
from ppd_core.options import BACKEND_CHOICES

PROMPT = "Count from 1 to 1000, one number per line, and do not stop early."


def bare_step_ms(backend: Decoder, ids: list[int], repeats: int = 15) -> float:
    """Median time of one 1-token step of ``backend`` (its logits and their argmax) after ``ids[:-1]`` are cached."""
    cache = backend.new_cache()
    backend.prefill(cache, ids[:-1])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        int(backend.prefill(cache, ids[-1:]).argmax()[0])
        times.append((time.perf_counter() - start) * 1000)
        backend.truncate(cache, len(ids) - 1)
    backend.truncate(cache, 0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--mode", default="plain", choices=["plain", "ppd"])
    parser.add_argument("--early", type=int, default=50)
    parser.add_argument("--late", type=int, default=900)
    parser.add_argument("--model", default="default", help="a GGUF file or Hugging Face model (default: the default GGUF)")
    parser.add_argument("--backend", default="auto", choices=BACKEND_CHOICES)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: one per core)")
    args = parser.parse_args()
    # ppd: the device profile's tree (calibrated now where there is none); plain needs no tree
    engine = Engine.load(EngineConfig(model=args.model, backend=args.backend, threads=args.threads, tree="auto",
                                      auto_calibrate=args.mode == "ppd"))
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
    bare_early = bare_step_ms(engine.loaded.backend, ids + tokens[: args.early])
    bare_late = bare_step_ms(engine.loaded.backend, ids + tokens[: args.late])
    print(json.dumps({
        "mode": args.mode, "model": engine.loaded.name, "backend": engine.loaded.backend.name, "quant": engine.loaded.quant,
        "threads": engine.threads, "answer_tokens": len(tokens), "prompt_tokens": len(ids),
        "stream_ms_per_token": {"early": round(early, 2), "late": round(late, 2), "growth": round(late - early, 2)},
        "bare_forward_ms": {"early": round(bare_early, 2), "late": round(bare_late, 2), "growth": round(bare_late - bare_early, 2)},
        "positions": [args.early, args.late],
    }, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
