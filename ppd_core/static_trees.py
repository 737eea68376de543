"""Hand-written trees used until calibration picks one for the device.

Each keeps the most likely chain (0), (0, 0), (0, 0, 0) well supplied with prompt tokens,
because the last accepted node's prompt tokens decide how deep the next step can guess.
Sizes are tree tokens per forward pass with ensemble size 1.
"""

from __future__ import annotations

from ppd_core.tree import TreeSpec

STATIC_TREES: dict[str, TreeSpec] = {
    # 3 nodes + 5 prompt tokens = 8 tokens
    "small": TreeSpec({(): 2, (0,): 2, (0, 0): 1}),
    # 5 nodes + 11 prompt tokens = 16 tokens
    "medium": TreeSpec({(): 3, (0,): 3, (1,): 1, (0, 0): 3, (0, 0, 0): 1}),
    # 11 nodes + 20 prompt tokens = 31 tokens
    "large": TreeSpec(
        {
            (): 3,
            (0,): 3, (1,): 2, (2,): 1, (3,): 1,
            (0, 0): 3, (0, 1): 1, (0, 2): 1, (1, 0): 1,
            (0, 0, 0): 3, (0, 0, 1): 1,
        }
    ),
}

DEFAULT_TREE = "medium"
