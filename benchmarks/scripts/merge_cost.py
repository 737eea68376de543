"""The cost of one step's merge (``ppd_core.drafters.merge``): a 16-node prompt-token tree (3 depths, prompt-token
rows on its nodes) with a 6-token lookup chain sharing its first node, the tree's shape cached as in decoding.

    nice -n 19 env PYTHONPATH=$PWD .venv/bin/python benchmarks/scripts/merge_cost.py
"""

from __future__ import annotations

import timeit

import numpy as np

from ppd_core.drafters.base import Draft, Guesses
from ppd_core.drafters.merge import Merger
from ppd_core.drafters.prompt_tokens import PromptTokenDrafter
from ppd_core.tree import TreeSpec, family_from_spec

SPEC = TreeSpec({(): 3, (0,): 3, (1,): 2, (2,): 1, (3,): 1, (0, 0): 3, (0, 1): 2, (0, 2): 1, (1, 0): 1, (1, 1): 1,
                 (2, 0): 0, (0, 0, 0): 0, (0, 0, 1): 0, (0, 1, 0): 0, (1, 0, 0): 0, (0, 0, 2): 0, (2, 0, 0): 0})


def main() -> None:
    family = family_from_spec("sixteen", SPEC, 3)
    tree = family.for_depth(3)
    assert tree.num_nodes == 17  # the root and 16 candidates
    drafter = PromptTokenDrafter(family, family.max_rank + 1)
    drafter.guesses = np.arange(3 * (family.max_rank + 1)).reshape(3, -1) + 100  # [3, K]
    chain = Guesses.chain([100, 7, 8, 9, 10, 11], [0.6] * 6)
    merger = Merger()

    def step() -> None:
        draft = Draft(64, 3)
        drafter.propose(draft)
        draft.add("lookup", chain)
        merger.merge(draft, 1)

    step()  # the shape built once, as the first step of its shape is
    number, repeats = 2000, 5
    best = min(timeit.repeat(step, number=number, repeat=repeats)) / number
    print(f"propose + merge of {tree.num_nodes - 1} prompt-token nodes and a 6-token chain: {best * 1e6:.1f} us per step "
          f"(best of {repeats} x {number})")


if __name__ == "__main__":
    main()
