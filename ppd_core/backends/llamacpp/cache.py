"""What one conversation holds in llama.cpp's context (``LlamaCache``), and the context's sizes.

One llama.cpp context serves every cache; a cache that is not the one resident in the context is
re-decoded into it first. The context starts with room for ``INITIAL_CONTEXT`` positions (llama.cpp
fills its whole KV cache when it makes a context) and is made anew, twice as large up to
``max_context``, when a conversation outgrows it; the resident cache is then re-decoded in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field


# rows llama.cpp computes at once (it splits longer batches): a tree's limit. Its compute buffer holds this many
# rows of logits and its output buffer one row per sequence (each 6.3 MB at 32 for the default's 49k vocabulary):
# on a CPU a step costs about a plain step per two rows (16 rows: 8.5 plain steps on the AVX2 EPYC), so no tree of
# more than 32 rows can pay there; a GPU's flat curve takes wide trees
TREE_ROWS = {"cpu": 32, "gpu": 128}
# rows llama.cpp computes at once (n_ubatch): prompts split into fewer micro-batches. On the 2-core EPYC, plain decoding
# against llama-server over the 80 MT-Bench first turns: 0.977x with 32, 0.978x with 64, 0.997x with 96; the page's
# RSS after an answer 311.5 MB with 96 (target 320; 128 measured 21 MB more than 32)
PREFILL_ROWS = 96
SPARE_CELLS = 512  # cells beyond the context for parked rows and one step's tree (6 MB of the default's Q8_0 cache)
DEFAULT_MAX_CONTEXT = 8192  # positions held at most (the model's own if smaller): 12 KB of Q8_0 cache each here
# positions the context is made for at first; it doubles (up to max_context) when a conversation needs more.
# llama.cpp fills its whole KV cache at creation, so this is the memory a typical chat costs (37 MB here, 113 MB
# for all 8192 positions)
INITIAL_CONTEXT = 2048


@dataclass
class LlamaCache:
    """What one conversation holds in the context: its accepted tokens, in position order.

    ``cells`` counts the context's occupied cells (accepted and parked), ``clean`` the accepted
    tokens before the first parked cell (their cells are the context's first ``clean`` cells).
    """

    tokens: list[int] = field(default_factory=list)
    cells: int = 0
    clean: int = 0
    width: int = 1  # sequences 0..width-1 hold every accepted cell
