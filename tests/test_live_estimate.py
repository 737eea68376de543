"""Issue 50, page item 1: the readout's live speedup estimate (``LiveEstimate`` over ``StepPrices``) prices both sides
on one timing of the profile, so an answer decoded in 1-row, 1-token steps is exactly 1.00x whatever the device's load;
before, plain decoding was priced at the fixed-shape timings' 1-row step (80.1 ms on the filer's saved profile) and a
1-row PPD step at the latency curve's (56.6 ms): every 1-token step counted as 1.41x."""

import pytest

from app.readout import AnswerSpeed
from ppd_core import GenerationStats
from ppd_core.calibration.prices import LiveEstimate, StepPrices
from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.calibration.step_policy import StepPolicy
from ppd_core.stats import StepStats

CURVE = {1: 56.6, 2: 70.0, 4: 90.0, 8: 160.0}  # ms by tree tokens, as the filer's saved profile's curve began
FIXED = {1: 80.1, 2: 163.06, 4: 240.0, 8: 400.0}  # rows -> ms of a step of that shape repeated (the same profile's)


def profile(kind: str = "trees", rows: int = 0) -> DeviceProfile:
    return DeviceProfile(key={}, latency_ms={640: dict(CURVE)}, acceptance=[], acceptance_positions=0, budget=1,
                         trees=[], tree_sizes=[1], expected_tokens_per_step=1.0, expected_ms_per_step=56.6,
                         expected_speedup=1.0, ensemble_size=1, step_policy=StepPolicy(kind, rows, FIXED).to_json())


def step(rows: int, tokens: int, seconds: float, prefill: bool = False) -> StepStats:
    return StepStats(list(range(tokens)), tokens - 1, rows, seconds, prefill=prefill)


@pytest.mark.parametrize("load", [0.7, 1.0, 1.41, 3.3])
def test_an_answer_in_1_row_1_token_steps_is_exactly_1x(load):
    """Each step timed at the curve's 1-row cost times the device's load now, unevenly, a prompt before: exactly 1.0
    (not approximately: the readout must say 1.00x at 1.00 tokens per step)."""
    estimate, stats = LiveEstimate(StepPrices.of(profile())), GenerationStats()
    steps = [step(1, 1, 0.412, prefill=True)]
    steps += [step(1, 1, CURVE[1] / 1000 * load * (1 + 0.3 * (index % 3 - 1))) for index in range(37)]
    for each in steps:
        estimate.add(each)
        stats.add(each)
    assert estimate.speedup == 1.0
    line = AnswerSpeed(stats, True, True, estimate).line()
    assert "1.00 tokens per step" in line and "(1.00x)" in line, line


def test_tree_steps_are_priced_against_plain_steps_on_the_same_curve():
    """A 4-row step that yields 3 tokens, at calibration's speed: plain decoding would take 3 of the curve's 1-row
    steps for them; the prompt counts on both sides."""
    estimate = LiveEstimate(StepPrices.of(profile()))
    estimate.add(step(4, 3, 0.5, prefill=True))
    for _ in range(10):
        estimate.add(step(4, 3, CURVE[4] / 1000))
    plain, ppd = 10 * 3 * CURVE[1] / 1000, 10 * CURVE[4] / 1000
    assert estimate.speedup == pytest.approx((0.5 + plain) / (0.5 + ppd))


def test_padded_steps_are_priced_on_the_fixed_shape_timings_alone():
    """Every step padded to 4 rows: a step costs ``fixed_ms[4]`` whatever it holds and plain decoding ``fixed_ms[1]``,
    both from the repeated-shape timings (never the curve's 1-row point beside them)."""
    prices = StepPrices.of(profile("fixed", 4))
    assert prices.plain == FIXED[1] / 1000 and prices.ppd(1) == prices.ppd(4) == FIXED[4] / 1000
    estimate = LiveEstimate(prices)
    for _ in range(5):
        estimate.add(step(4, 2, FIXED[4] / 1000))
    assert estimate.speedup == pytest.approx(2 * FIXED[1] / FIXED[4])
