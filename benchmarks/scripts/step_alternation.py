"""A step of N tree tokens timed repeated (N, N, N, ...) and between 1-token steps (N, 1, N, 1, ...), as decoding runs.

    PYTHONPATH=. .venv/bin/python benchmarks/scripts/step_alternation.py [--threads N] [--json FILE] [--graph-log]

The default model on its llama.cpp backend (all layers on the GPU where llama.cpp is built with CUDA), 256 cached
tokens, calibration's own ``step_ms`` (medians after a warm-up). "between" is the pair (an N-token step, then a
1-token step) less half a pair of 1-token steps: what calibration now takes as the N-token figure. llama.cpp rebuilds
its compute graph when the batch's shape changes, and on CUDA re-captures its CUDA graph too. "fixed_ms" is the step
when every step is padded to N rows (``pad_steps``: the pair N, then a 1-token step padded to N, halved).

``--graph-log`` counts ggml's CUDA-graph debug lines ("CUDA Graph id .. reused", "warmup complete", "warmup reset")
in each pattern: whether llama.cpp replayed its graph (a CPU build prints none).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from collections import Counter

import numpy as np

from ppd_core.calibration import latency
from ppd_core.decoding import Speculator, prefill
from ppd_core import Engine, EngineConfig
from ppd_core.tree import TreeFamily

SIZES = (1, 2, 4, 8, 16, 32)


GRAPH_LINES = {"reused": "reused", "warmup complete": "warmup_complete", "warmup reset": "warmup_reset",
               "update failed": "update_failed", "disabling CUDA graphs": "disabled"}


def count_graph_lines(llama) -> Counter:
    """From now on every llama.cpp/ggml log line (debug included) is read: CUDA-graph events counted here."""
    counts = Counter()

    @llama.llama_log_callback
    def callback(level, text, user_data):
        line = text.decode(errors="replace")
        for needle, name in GRAPH_LINES.items():
            if needle in line:
                counts[name] += 1

    count_graph_lines.callback = callback  # must outlive the call
    llama.llama_log_set(callback, ctypes.c_void_p(0))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=str, default=None)
    parser.add_argument("--graph-log", action="store_true", help="count ggml's CUDA-graph log lines per pattern")
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", threads=args.threads, auto_calibrate=False))
    decoder = engine.loaded.backend
    n, V = engine.prompt_tokens.num_prompt_tokens, engine.prompt_tokens.ensemble_size
    cache = decoder.new_cache()
    prefill(decoder, cache, np.random.default_rng(0).integers(decoder.vocab_size, size=256).tolist())
    plain = latency.probe_tree(1, n, V)
    counts = count_graph_lines(decoder.llama) if args.graph_log else None
    padded = hasattr(decoder, "pad_steps")
    out = {}
    for size in SIZES:
        tree = latency.probe_tree(size, n, V)
        guesses = np.zeros((max(tree.depth, 1), max(tree.max_rank + 1, 1)), dtype=np.int64)
        speculator = Speculator(decoder, TreeFamily("probe", (tree,)), engine._prompt_table)
        row, graphs = {}, {}
        for pattern, rows, then in (("repeated", None, None), ("pair", None, plain), ("fixed_pair", size, plain)):
            if rows is not None and not padded:
                continue
            if counts is not None:
                counts.clear()
            if padded:
                decoder.pad_steps(rows)
            try:
                row[f"{pattern}_ms"] = round(latency.step_ms(speculator, cache, tree, guesses, 256, 3, 15, then=then), 3)
            finally:
                if padded:
                    decoder.pad_steps(None)
            if counts is not None:
                graphs[pattern] = dict(counts)
        if "fixed_pair_ms" in row:
            row["fixed_ms"] = round(row.pop("fixed_pair_ms") / 2, 3)
        if graphs:
            row["cuda_graph_log"] = graphs
        out[size] = row
        print(size, json.dumps(row), flush=True)
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
