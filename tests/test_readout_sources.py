"""The readout's details by guess source (app/readout.py): what a source keeps for the loaded model, read from its
drafter's optional ``memory_bytes`` through the steps' stats (``drafters.base.observe``, ``GenerationStats``), for any
source name; a source without it says nothing of memory."""

from __future__ import annotations

from types import SimpleNamespace

from app.readout import AnswerSpeed, size_words
from ppd_core import GenerationStats
from ppd_core.decoding import observe
from ppd_core.stats import StepStats


class Source:
    """A drafter that proposes nothing, with or without a memory size."""

    def __init__(self, name: str, memory_bytes: int | None = None):
        self.name, self.observed = name, 0
        if memory_bytes is not None:
            self.memory_bytes = memory_bytes

    def observe(self, verified) -> None:
        self.observed += 1
        if hasattr(self, "memory_bytes"):
            self.memory_bytes += 1000  # grows as it learns: the last size is the one said


def step(prefill: bool = False) -> StepStats:
    """A step that accepted nothing (the prefill drafts nothing)."""
    return StepStats(tokens=[7], from_guesses=0, tree_tokens=1, seconds=0.01, prefill=prefill,
                     drafted={} if prefill else {"table source": 2, "plain source": 1})


def test_each_source_with_a_memory_size_says_it_in_the_details():
    table, plain = Source("table source", 1_572_864), Source("plain source")
    stats = GenerationStats()
    for index in range(3):
        verified = SimpleNamespace(stats=step(prefill=index == 0))
        observe([table, plain], verified)
        stats.add(verified.stats)
    assert table.observed == plain.observed == 3
    assert stats.memory_bytes == {"table source": 1_575_864}
    details = AnswerSpeed(stats, True, True).details()
    assert "table source: 0 of 4 drafted tokens right; keeps 1.5 MiB for this model" in details
    assert "plain source: 0 of 2 drafted tokens right" in details and details.count("keeps") == 1


def test_sizes_in_words():
    assert [size_words(n) for n in (300, 12_288, 1_572_864, 8 * 2**20)] == ["300 bytes", "12 KiB", "1.5 MiB",
                                                                            "8.0 MiB"]
