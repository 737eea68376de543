"""A step of N tree tokens timed repeated (N, N, N, ...) and between 1-token steps (N, 1, N, 1, ...), as decoding runs.

    PYTHONPATH=. .venv/bin/python benchmarks/scripts/step_alternation.py [--threads N] [--json FILE]

The default model on its llama.cpp backend (all layers on the GPU where llama.cpp is built with CUDA), 256 cached
tokens, calibration's own ``step_ms`` (medians after a warm-up). "between" is the pair (an N-token step, then a
1-token step) less half a pair of 1-token steps: what calibration now takes as the N-token figure. llama.cpp rebuilds
its compute graph when the batch's shape changes, and on CUDA re-captures its CUDA graph too.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ppd_core.calibration import latency
from ppd_core.decoding import Speculator, prefill
from ppd_core.engine import Engine, EngineConfig
from ppd_core.tree import TreeFamily

SIZES = (1, 2, 4, 8, 16, 32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", threads=args.threads, auto_calibrate=False))
    decoder = engine.loaded.backend
    n, V = engine.prompt_tokens.num_prompt_tokens, engine.prompt_tokens.ensemble_size
    cache = decoder.new_cache()
    prefill(decoder, cache, np.random.default_rng(0).integers(decoder.vocab_size, size=256).tolist())
    plain = latency.probe_tree(1, n, V)
    out = {}
    for size in SIZES:
        tree = latency.probe_tree(size, n, V)
        guesses = np.zeros((max(tree.depth, 1), max(tree.max_rank + 1, 1)), dtype=np.int64)
        speculator = Speculator(decoder, TreeFamily("probe", (tree,)), engine._prompt_table)
        out[size] = {"repeated_ms": round(latency.step_ms(speculator, cache, tree, guesses, 256, 3, 15), 3),
                     "pair_ms": round(latency.step_ms(speculator, cache, tree, guesses, 256, 3, 15, then=plain), 3)}
    single = out[1]["pair_ms"] / 2
    for row in out.values():
        row["between_1_token_steps_ms"] = round(row["pair_ms"] - single, 3)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
