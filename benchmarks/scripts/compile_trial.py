"""Does torch.compile (inductor, CPU) pay for the lean forward? Eager vs compiled step time, and compile time.

    python benchmarks/scripts/compile_trial.py [--quant int4|int8|none] [--rows 1 4 16]

Times the lean decoder's forward (plus LM head) for a few row counts at 256 cached tokens,
eager and compiled interleaved, and reports the one-off compile time per row count. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ppd_core import kv_cache
from ppd_core.decoding import forward_hidden, logits_of
from ppd_core.loading import load_model

CONTEXT = 256


def step_ms(run, decoder, rows: int, repeats: int = 20) -> float:
    cache = kv_cache.new_cache(decoder)
    embed = decoder.get_input_embeddings()
    forward_hidden(decoder, cache, embed(torch.arange(CONTEXT)), torch.arange(CONTEXT), None)
    x = embed(torch.arange(rows) + 7)
    positions = torch.arange(CONTEXT, CONTEXT + rows)
    mask = torch.ones(rows, CONTEXT + rows, dtype=torch.bool).tril(CONTEXT)[None, None] if rows > 1 else None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(x, positions, mask, cache).argmax(-1).tolist()
        times.append((time.perf_counter() - start) * 1000)
        kv_cache.truncate(cache, CONTEXT)
    return statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant", default="int4")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    loaded = load_model(quant=args.quant, device="cpu")
    decoder = loaded.decoder

    @torch.inference_mode()
    def eager(x, positions, mask, cache):
        return logits_of(decoder, decoder(x, positions, mask, cache))

    compiled = torch.compile(eager, dynamic=True)
    result = {"quant": loaded.quant, "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": {}}
    for rows in args.rows:
        start = time.perf_counter()
        step_ms(compiled, decoder, rows, repeats=4)  # first calls compile
        compile_s = time.perf_counter() - start
        eager_ms, compiled_ms = [], []
        for _ in range(3):  # interleaved
            eager_ms.append(step_ms(eager, decoder, rows))
            compiled_ms.append(step_ms(compiled, decoder, rows))
        result["rows"][rows] = {"eager_ms": round(min(eager_ms), 2), "compiled_ms": round(min(compiled_ms), 2),
                                "compile_s": round(compile_s, 1)}
        print(json.dumps({rows: result["rows"][rows]}), flush=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
