"""The step policy calibration chooses (``choose_step_policy``): trees between 1-token steps, every step padded to one
shape, or plain steps, whichever the measured costs and the acceptance say gives the most tokens per second; checked
against the rates computed by hand, on a CPU-like and an H200-like set of costs (the latter as measured there:
benchmarks/measurements/h200-steps-repeated-vs-alternating.json), and the profile round trip."""

import pytest

from ppd_core.calibration.calibrate import choose_step_policy, choose_tree_and_chains, rate
from ppd_core.calibration.step_policy import StepPolicy
from test_latency_curve import PROBS, answers

N, V = 3, 1


def curve(ms_by_size: dict[int, float]) -> dict[int, dict[int, float]]:
    return {640: dict(ms_by_size)}


def test_a_cpu_keeps_trees_between_single_steps():
    """Every row costs most of a step, in either pattern: padding only adds rows."""
    lookup, _ = answers(0)
    alternating = curve({s: 10.0 + 8.0 * (s - 1) for s in range(1, 33)})
    fixed = {1: 10.0, 2: 18.5, 4: 35.0, 8: 68.0}
    search = choose_tree_and_chains(PROBS, lookup, N, V, alternating)
    chosen, policy = choose_step_policy(search, lookup, fixed)
    assert policy.kind in ("trees", "plain") and policy.pads is None and chosen is search
    assert policy.rates["trees"] >= max(value for name, value in policy.rates.items() if name != "trees")


def test_a_gpu_whose_shape_changes_cost_a_graph_pads_every_step():
    """The H200's pattern: a tree between 1-token steps costs 9-19 ms, the same step repeated 1.9-3.5 ms."""
    lookup, _ = answers(1)
    alternating = curve({1: 1.9, **{s: 9.0 + 0.3 * s for s in range(2, 33)}})
    fixed = {1: 1.9, 2: 2.0, 4: 2.1, 8: 2.4, 12: 2.9, 16: 3.5, 24: 4.6, 32: 6.0}
    search = choose_tree_and_chains(PROBS, lookup, N, V, alternating)
    chosen, policy = choose_step_policy(search, lookup, fixed)
    assert policy.kind == "fixed" and policy.pads == policy.rows > 1
    best = max(policy.rates.values())
    assert policy.rates[f"fixed {policy.rows}"] == best > policy.rates["trees"]
    assert chosen.seconds(policy.rows) == pytest.approx(fixed[policy.rows] / 1000)
    assert chosen.seconds(policy.rows + 1) == float("inf")  # nothing past the padded shape
    assert chosen.best.sizes[-1] <= policy.rows
    assert rate(chosen, lookup) == pytest.approx(best, rel=1e-3)


def test_two_timings_of_the_same_steps_do_not_decide_by_their_noise():
    """On a CPU, the repeated 1-token step timed a little faster than the trees' own 1-token step (the same step,
    timed apart), and fixed shapes a little cheaper than the alternation's (within ``FIXED_MARGIN``): the trees and
    their lookup chains stay (this machine's calibration once chose plain steps without chains on such noise)."""
    lookup, _ = answers(0)
    alternating = curve({s: 10.0 + 8.0 * (s - 1) for s in range(1, 33)})
    search = choose_tree_and_chains(PROBS, lookup, N, V, alternating)
    fixed = {1: 8.5, **{rows: 0.97 * (10.0 + 8.0 * (rows - 1)) for rows in (2, 4, 8)}}
    chosen, policy = choose_step_policy(search, lookup, fixed)
    assert policy.kind == "trees" and chosen is search and "fixed 1" not in policy.rates
    assert any(search.lengths) or search.budget > 1  # what the trees chose, kept


def test_nothing_pays_plain_steps():
    lookup, _ = answers(2)
    lookup.probs[:] = [[0.0] * len(row) for row in lookup.probs]  # no copy ever right
    search = choose_tree_and_chains([[0.0] * 4] * 3, lookup, N, V, curve({s: 10.0 * s for s in range(1, 33)}))
    _, policy = choose_step_policy(search, lookup, {1: 10.0, 2: 20.0, 4: 40.0})
    assert policy.kind == "plain" and policy.pads is None


def test_the_policy_round_trips_and_says_what_runs():
    policy = StepPolicy("fixed", 8, {1: 1.9, 8: 2.4}, {"trees": 1.0, "fixed 8": 2.0})
    assert StepPolicy.from_json(policy.to_json()) == policy
    assert policy.line() == "every step padded to 8 rows (2.40 ms each; a 1-token step 1.90 ms)"
    assert StepPolicy.from_json({}) == StepPolicy() and StepPolicy().pads is None  # profiles from before policies
