"""Lookup chains before this device is calibrated: what `ppd generate`, `ppd serve` and `ppd chat` draft while no
calibration has run (or while one runs behind the answers), so no answer waits for it.

Chains are learnt per conversation (``AdaptiveChains``), starting from the lookup figures of the record shipped with the
default model's prompt tokens (how often text copied from the conversation comes true is a property of conversations
more than of the model), priced on the steepest step curve this project measured: a 2-core CPU, where every extra row
costs most of a plain step. Only near-certain copies are drafted until calibration has timed this device.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ppd_core.calibration.records import read_records
from ppd_core.drafters.lookup import MAX_CHAIN
from ppd_core.drafters.chain_policy import AdaptiveChains

SHIPPED_RECORD = Path(__file__).resolve().parents[2] / "assets" / "smollm2-135m-instruct.prompt-tokens.acceptance.json"
ROW_COST = 0.9  # an extra row's cost in plain steps: the default model on the 2-core CPUs here (2 rows: 1.8 steps)


def uncalibrated_chains(record_file: Path = SHIPPED_RECORD) -> AdaptiveChains | None:
    """Chains learnt per conversation from the shipped lookup figures; None where no record is at hand."""
    records = read_records(record_file)
    if not records or not records[0].lookup.probs:
        return None
    return AdaptiveChains(records[0].lookup.probs, lambda rows: 1.0 + ROW_COST * (rows - 1))


# P(the first j tokens of the grammar's forced text are right), before an answer shows its own: text the grammar
# forces is near-certain; what it leaves to the model within it is where the answer writes whitespace and how the
# tokenizer cuts (a geometric 0.9 per token; learnt per answer from there)
FORCED_PRIOR = [0.9 ** j for j in range(1, MAX_CHAIN + 1)]


def forced_chains(latency: Callable[[int], float] | None = None, tokens_per_step: float = 1.0,
                  tree_size: int = 1) -> AdaptiveChains:
    """How long a chain of grammar-forced text to draft (one match class), learnt per answer; priced on ``latency``
    (seconds of a step of that many rows), else on the steepest curve measured (``ROW_COST``)."""
    latency = latency or (lambda rows: 1.0 + ROW_COST * (rows - 1))
    return AdaptiveChains([FORCED_PRIOR], latency, tokens_per_step, tree_size)
