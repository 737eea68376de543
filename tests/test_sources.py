"""Every registered guess source at once, through the engine as `--drafters` turns them on: greedy answers token for
token plain decoding's on the default GGUF (llama.cpp), over a conversation's two turns, with the model-wide sources
(recycling, suffix) carrying what they learnt from one answer into the next; an unknown source name is one line."""

from __future__ import annotations

import pytest

from ppd_core import EngineConfig
from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.calibration.step_policy import StepPolicy
from ppd_core.drafters.registry import FACTORIES, check_names, sized_per_step
from ppd_core.errors import PpdError
from ppd_core.plan import Guesses, PlanOptions, make_plan

TURNS = ["Write a short poem about the sea.", "Write the same poem again, changing only its last line."]


@pytest.mark.slow
def test_every_source_on_decodes_what_plain_decoding_does(llama_default):
    engine = llama_default
    before = engine.drafters
    engine.drafters = tuple(FACTORIES)  # lookup, grammar, recycling, suffix
    try:
        messages, accepted = [], {}
        for question in TURNS:
            messages.append({"role": "user", "content": question})
            ids = engine.chat_ids(messages)
            plain = engine.generate(ids, "plain", 96)
            ppd = engine.generate(ids, "ppd", 96)
            assert ppd.tokens == plain.tokens, question
            for name, count in ppd.stats.accepted.items():
                accepted[name] = accepted.get(name, 0) + count
            messages.append({"role": "assistant", "content": ppd.text})
        assert accepted.get("recycling", 0) > 0 and accepted.get("suffix", 0) > 0, accepted
        assert {"recycling", "suffix"} <= set(engine._drafter_memory), "their tables are the model's, kept"
    finally:
        engine.drafters = before


def test_an_unknown_source_is_one_line_naming_it():
    with pytest.raises(PpdError, match="no guess source named copying; choose from lookup, grammar, recycling, suffix"):
        check_names(("lookup", "copying"))
    assert EngineConfig(drafters=("suffix",)).drafters == ("suffix",)


@pytest.mark.slow
def test_steps_sized_by_a_curve_decode_what_plain_decoding_does(llama_default):
    """Each step's tree only as big as pays on a curve where a row costs 0.15 of a step: the answer is still plain
    decoding's, token for token, and its steps differ in size (a tree where guesses are likely, fewer rows else)."""
    engine = llama_default
    before = engine.drafters, engine.row_costs
    engine.drafters = tuple(FACTORIES)
    engine.row_costs = tuple([1.0] + [1 + 0.15 * (rows - 1) for rows in range(1, 17)])  # up to 16 rows
    try:
        ids = engine.chat_ids([{"role": "user", "content": TURNS[0]}])
        plain = engine.generate(ids, "plain", 96)
        ppd = engine.generate(ids, "ppd", 96)
        assert ppd.tokens == plain.tokens
        assert len(set(ppd.stats.rows_per_step)) > 1 and max(ppd.stats.rows_per_step) <= 16, ppd.stats.rows_per_step
    finally:
        engine.drafters, engine.row_costs = before


CURVE = {1: 50.0, 2: 70.0, 4: 90.0, 8: 160.0}  # ms by tree tokens
FIXED = {1: 60.0, 2: 100.0, 4: 120.0}  # ms of a step padded to so many rows


def plan_on(kind: str, rows: int = 0):
    profile = DeviceProfile(key={}, latency_ms={640: dict(CURVE)}, acceptance=[], acceptance_positions=0, budget=1,
                            trees=[], tree_sizes=[1], expected_tokens_per_step=1.0, expected_ms_per_step=50.0,
                            expected_speedup=1.0, ensemble_size=1,
                            step_policy=StepPolicy(kind, rows, FIXED).to_json())
    return make_plan(profile, PlanOptions(), Guesses())


def test_the_steps_costs_come_from_the_profiles_curve_and_only_beyond_the_default_sources():
    """Trees of each step's own shape: an r-row step costs the curve's ms at r (interpolated) over its 1-row ms; steps
    padded to 4 rows all cost the same, so the tree fills them; steps are sized only with a source beyond the
    default ones on (the default ones keep the sizes calibration priced)."""
    assert plan_on("trees").row_costs() == pytest.approx((1.0, 1.0, 1.4, 1.6, 1.8, 2.15, 2.5, 2.85, 3.2))
    assert plan_on("fixed", 4).row_costs() == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert make_plan(None, PlanOptions(), Guesses()).row_costs() is None  # no curve measured yet
    assert not sized_per_step(None) and not sized_per_step(("lookup", "grammar"))
    assert sized_per_step(("lookup", "recycling"))
