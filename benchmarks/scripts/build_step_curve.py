"""Step cost of the llama.cpp backend against rows per step, and prompt processing, for one llama-cpp-python build.

Run it once per build (e.g. ppd's, and another on PYTHONPATH) in one sitting to compare builds:

    python benchmarks/scripts/build_step_curve.py [FILE.gguf|default] [--threads 2]

Prints one JSON line: median ms of a ``tree_logits`` over a chain of 1/2/4/8/16 rows after 256 cached tokens (20 runs
after 5 warm-ups), the ms to prefill 512 tokens, whether the file's tree rows are bitwise, and llama.cpp's system info.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder  # noqa: E402
from ppd_core.loading import default_model_file  # noqa: E402
from ppd_core.tree import TreeSpec, build_tree  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="default")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    path = default_model_file() if args.model == "default" else Path(args.model)
    decoder = LlamaCppDecoder(path, threads=args.threads)
    context = np.linspace(100, decoder.vocab_size - 1, 256).astype(np.int64).tolist()
    step_ms = {}
    for size in (1, 2, 4, 8, 16):
        tree = build_tree(TreeSpec({(0,) * depth: 0 for depth in range(size)}), 0, 1, max_depth=max(size - 1, 1))
        cache = decoder.new_cache()
        decoder.prefill(cache, context)
        times = []
        for _ in range(25):
            start = time.perf_counter()
            decoder.tree_logits(cache, tree, np.arange(500, 500 + size), None)
            times.append(time.perf_counter() - start)
            decoder.keep(cache, len(context), [0])
            decoder.truncate(cache, len(context))
        step_ms[size] = round(1000 * statistics.median(times[5:]), 2)
    cache = decoder.new_cache()
    start = time.perf_counter()
    decoder.prefill(cache, np.linspace(100, decoder.vocab_size - 1, 512).astype(np.int64).tolist())
    prefill_ms = round(1000 * (time.perf_counter() - start), 1)
    print(json.dumps({"model": path.name, "threads": args.threads, "step_ms": step_ms, "prefill_512_ms": prefill_ms,
                      "bitwise": decoder.bitwise, "system": decoder.system}))
    decoder.close()


if __name__ == "__main__":
    main()
