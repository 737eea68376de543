"""What the recycling drafter costs a step on the host: ``propose`` on a full table and ``observe`` of a step.

    python benchmarks/scripts/recycling_cost.py [--rows 4]

The default model's vocabulary (49152) and the default table width, widths and limit; a table full of random ids and
probabilities (every node has children: the largest tree the widths allow) and random float32 rows. Prints
microseconds per call (the best of 5 repeats of 200).
"""

from __future__ import annotations

import argparse
import timeit
from types import SimpleNamespace

import numpy as np

from ppd_core.drafters.recycling import RecyclingDrafter, RecyclingTable
from ppd_core.sampling.logits import HostLogits

VOCAB, CALLS = 49152, 200


class Collect:
    def add(self, name, guesses) -> None:
        self.guesses = guesses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4, help="the observed step's rows")
    ROWS = parser.parse_args().rows
    rng = np.random.default_rng(0)
    table = RecyclingTable.empty(VOCAB)
    table.ids[:] = rng.integers(0, VOCAB, size=table.ids.shape)
    table.probs[:] = np.sort(rng.random(table.probs.shape), axis=1)[:, ::-1]
    drafter, draft = RecyclingDrafter(table), Collect()
    logits = HostLogits(rng.standard_normal((ROWS, VOCAB)).astype(np.float32))  # [rows, vocab]

    def propose() -> None:
        drafter.root = 5
        drafter.propose(draft)

    propose()
    verified = SimpleNamespace(node_tokens=rng.integers(0, VOCAB, size=ROWS), parents=(-1,) + (0,) * (ROWS - 1),
                               logits=logits,
                               stats=SimpleNamespace(tokens=[draft.guesses.tokens[0], 7]))

    def step() -> None:
        propose()
        drafter.observe(verified)

    best = lambda call: min(timeit.repeat(call, number=CALLS, repeat=5)) / CALLS * 1e6  # noqa: E731
    print(f"nodes proposed: {len(draft.guesses)}")
    print(f"propose: {best(propose):.0f} us")
    print(f"propose + observe of {ROWS} rows: {best(step):.0f} us")
    print(f"of which top_k_probs of {ROWS} rows: {best(lambda: logits.top_k_probs(np.arange(ROWS), table.k)):.0f} us")


if __name__ == "__main__":
    main()
