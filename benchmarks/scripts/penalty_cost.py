"""What repetition penalties add to a tree step, against the time of a plain decoding step on this machine.

    .venv/bin/python benchmarks/scripts/penalty_cost.py [--rows 16] [--window 64] [--repeats 2000] [--threads 2]
        [--model FILE.gguf] [--json FILE]

The penalty's cost is measured where decoding pays it, in ``verify.accept``: greedy acceptance over a tree of
``--rows`` nodes (depths 1-4, each row's logits the model's vocabulary wide) with llama.cpp's repeat, presence and
frequency penalties over a ``--window``-token window, against the same acceptance without penalties, ``--repeats``
times each, interleaved; the median of each. A plain step is the median decoding step of the default model (one row,
llama.cpp, ``--threads``) over a 128-token greedy answer. The JSON has both, and the penalty's cost as a share of a
plain step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from measurement import default_gguf, machine, now, report

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def tree(rows: int) -> list[int]:
    """Parents of a tree of ``rows`` nodes, breadth first: a root, four children, each the head of a chain (16 rows:
    depths 1 to 4)."""
    return [-1] + [0 if node <= 4 else node - 4 for node in range(1, rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from ppd_core import Engine, EngineConfig
    from ppd_core.sampling.logits import HostLogits
    from ppd_core.sampling.penalties import window
    from ppd_core.sampling.params import SamplingParams
    from ppd_core.sampling.verify import accept
    from ppd_core.engine_calibration import next_token_logits

    engine = Engine.load(EngineConfig(model=str(args.model or default_gguf()), backend="llamacpp", tree="medium",
                                      threads=args.threads))
    try:
        ids = engine.chat_ids([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
        engine.generate(ids, "plain", 16)  # warm-up
        answer = engine.generate(ids, "plain", 128)
        plain_step = statistics.median(step.seconds for step in answer.steps if not step.prefill)
        vocab = next_token_logits(engine, ids).shape[0]
    finally:
        engine.close()

    rng = np.random.default_rng(0)
    parents = tree(args.rows)
    sequence = rng.integers(0, 2000, size=300).tolist()  # a context whose window repeats tokens, as text does
    tokens = [sequence[-1]] + rng.integers(0, 2000, size=args.rows - 1).tolist()
    logits = HostLogits(rng.normal(0, 3, size=(args.rows, vocab)).astype(np.float32))  # [rows, vocab]
    greedy = SamplingParams()
    penalised = SamplingParams(repeat_penalty=1.1, repeat_last_n=args.window, presence_penalty=0.2, frequency_penalty=0.1)
    recent = window(sequence, penalised)
    times = {"plain": [], "penalised": []}
    for _ in range(args.repeats):
        for name, params in (("plain", greedy), ("penalised", penalised)):
            start = time.perf_counter()
            accept(parents, tokens, logits, params, None, recent if params.penalized else None)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    cost = medians["penalised"] - medians["plain"]
    report({"what": "repetition penalties' cost in a tree step's acceptance, against a plain decoding step",
            "command": "python " + " ".join(sys.argv), "machine": machine(), "measured": now(),
            "rows": args.rows, "window": args.window, "vocab": vocab, "repeats": args.repeats,
            "accept_ms": {name: round(value * 1000, 4) for name, value in medians.items()},
            "penalty_ms": round(cost * 1000, 4), "plain_step_ms": round(plain_step * 1000, 3),
            "penalty_share_of_plain_step": round(cost / plain_step, 4)}, args.json)


if __name__ == "__main__":
    main()
