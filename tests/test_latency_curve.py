"""`ppd calibrate --latency-curve FILE`: the tree search on another device's step-latency curve, timing nothing here.

The choice is checked against brute force (every candidate budget's tree with every chain combination, decoded
step by step); the command end to end on a tiny model; a bad curve file is one line before any model loads.
"""

import itertools
import json
import random
from pathlib import Path

import pytest

from app.cli import main
from ppd_core.calibration.calibrate import choose_tree_and_chains
from ppd_core.calibration.curves import LatencyCurve, read_curve
from ppd_core.calibration.latency import CPU_SIZES
from ppd_core.calibration.profiles import profiles_dir
from ppd_core.calibration.records import read_records
from ppd_core.calibration.step_policy import StepPolicy
from ppd_core.drafters.lookup import MATCH_CLASSES, LookupStats, match_class
from test_cli_errors import assert_error, no_model_load  # noqa: F401 (a fixture)
from test_lookup import brute_propose

ROOT = Path(__file__).resolve().parent.parent
FLAT = ROOT / "profiles" / "curves" / "flat-64.json"
CPU_PROFILE = ROOT / "profiles" / "llamacpp-amd-epyc-avx512-2threads.json"  # measured: each row costs most of a step
# prompt tokens' guesses right often enough that deep, wide trees pay where rows are free (as in test_tree_search)
PROBS = [[0.5, 0.15, 0.05, 0.03], [0.4, 0.15, 0.05, 0.03], [0.3, 0.1, 0.05, 0.03]]
CHAIN = 3  # longest lookup chain replayed: 4^6 chain combinations stay cheap to decode one by one


def answers(seed: int) -> tuple[LookupStats, list[tuple[list[int], list[int]]]]:
    """Repetitive random answers (a few tokens: matches and copied runs are common) and their replayed lookup."""
    rng = random.Random(seed)
    stats, conversations = LookupStats.empty(max_chain=CHAIN), []
    for _ in range(5):
        prompt = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        answer = [rng.randrange(4) for _ in range(rng.randint(5, 30))]
        if rng.random() < 0.4:
            answer = prompt + answer  # copies its prompt: long matches
        stats.add_answer(prompt, answer)
        conversations.append((prompt, answer))
    return stats, conversations


def decode(conversations, lengths) -> tuple[int, int, dict[int, int]]:
    """Decode every answer with lookup chains of ``lengths`` (by match class), a fresh suffix search each step:
    (tokens the chains got accepted, steps, steps by chain length)."""
    accepted_total, steps, by_length = 0, 0, {}
    for prompt, answer in conversations:
        i = 0
        while i < len(answer):
            chain, match = brute_propose(prompt + answer[:i], CHAIN)
            chain = chain[: lengths[match_class(match)]] if chain else []
            accepted = 0
            while accepted < len(chain) and i + accepted < len(answer) and answer[i + accepted] == chain[accepted]:
                accepted += 1
            accepted_total, steps = accepted_total + accepted, steps + 1
            by_length[len(chain)] = by_length.get(len(chain), 0) + 1
            i += 1 + accepted
    return accepted_total, steps, by_length


def brute_force(conversations, search, latency_ms: dict[int, float]) -> dict[tuple[int, tuple[int, ...]], float]:
    """Tokens/s of every candidate budget's tree (its largest, as chains join it) with every chain combination that
    does not shrink as the match grows; a step past the curve's largest size is never taken (infinitely slow)."""
    rates = {}
    for lengths in itertools.combinations_with_replacement(range(CHAIN + 1), len(MATCH_CLASSES)):
        accepted, steps, by_length = decode(conversations, lengths)
        for budget in search.budgets:
            family = search.choice.by_budget[budget]
            size = family.sizes[-1]
            ms = sum(count * latency_ms.get(size + length, float("inf")) for length, count in by_length.items()) / steps
            rates[budget, lengths] = (family.tokens_per_step + accepted / steps) / ms
    return rates


def profile_curve(path: Path) -> dict[int, dict[int, float]]:
    data = json.loads(path.read_text())["latency_ms"]
    return {int(c): {int(s): ms for s, ms in curve.items()} for c, curve in data.items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_curve_chooses_a_large_tree_the_brute_force_best(seed):
    curve = read_curve(FLAT)
    assert curve.latency_ms == {0: {size: 10.0 for size in range(1, 65)}} and "synthetic" in curve.source
    stats, conversations = answers(seed)
    search = choose_tree_and_chains(PROBS, stats, 3, 1, curve.latency_ms)
    assert search.budgets == list(range(1, 65))
    rates = brute_force(conversations, search, curve.latency_ms[0])
    best = max(rates.values())
    assert rates[search.budget, tuple(search.lengths)] == pytest.approx(best, rel=1e-9)
    assert search.budget > 16 and search.best.tokens_per_step > 2.0  # deep trees pay where rows are free
    assert search.best.sizes[-1] + max(search.lengths) <= 64  # nothing past the curve's largest size
    # the expectation reported is that pair's, from the same replay
    tokens, seconds = search.with_lookup(stats)
    assert tokens / seconds == pytest.approx(best * 1000, rel=1e-9)


def test_a_curve_that_stops_early_caps_the_tree():
    stats, conversations = answers(0)
    latency = {size: 10.0 for size in range(1, 9)}  # flat, but only up to 8 tokens
    search = choose_tree_and_chains(PROBS, stats, 3, 1, {0: latency})
    assert search.best.sizes[-1] + max(search.lengths) <= 8 and search.budget <= 8
    rates = brute_force(conversations, search, latency)
    assert rates[search.budget, tuple(search.lengths)] == pytest.approx(max(rates.values()), rel=1e-9)


def test_steep_cpu_curve_chooses_a_small_tree_the_brute_force_best():
    latency_ms = profile_curve(CPU_PROFILE)  # measured per context: 256 and 1024 cached tokens
    mean = {size: sum(c[size] for c in latency_ms.values()) / len(latency_ms) for size in latency_ms[256]}
    stats, conversations = answers(0)
    search = choose_tree_and_chains(PROBS, stats, 3, 1, latency_ms)
    assert search.budgets == sorted(set(range(1, 33)) | set(CPU_SIZES))
    interpolated = {s: search.seconds(s) * 1000 for s in range(1, max(mean) + 1)}
    assert all(interpolated[s] == pytest.approx(ms) for s, ms in mean.items())
    rates = brute_force(conversations, search, interpolated)
    assert rates[search.budget, tuple(search.lengths)] == pytest.approx(max(rates.values()), rel=1e-9)
    assert search.budget <= 4 and search.best.tokens_per_step < 1.6


def write(tmp_path, data) -> Path:
    path = tmp_path / "curve.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def curve_file(latency_ms, device="RTX something", source="a paper's table 3") -> dict:
    return {"device": device, "source": source, "latency_ms": latency_ms}


def test_per_context_curves_are_read_as_profiles_hold_them(tmp_path):
    curve = read_curve(write(tmp_path, curve_file({"256": {"1": 5, "4": 6.5}, "1024": {"1": 7, "4": 8}})))
    assert curve == LatencyCurve("RTX something", "a paper's table 3", {256: {1: 5.0, 4: 6.5}, 1024: {1: 7.0, 4: 8.0}},
                                 str(tmp_path / "curve.json"))
    assert curve.device_key() == {"kind": "curve", "name": "RTX something", "source": "a paper's table 3",
                                  "file": str(tmp_path / "curve.json")}


def test_a_curve_with_fixed_shape_steps_forecasts_the_policy_calibration_would_choose(capsys, tiny_model_dir, tmp_path):
    """``fixed_ms`` (a step when every step has R rows) is read beside the alternation's curve; with the H200's
    pattern (a tree between 1-token steps 9-19 ms, repeated shapes 1.9-3.5 ms) the forecast pads every step, and
    its expectation is priced at the fixed step's cost, as ``choose_step_policy`` weighs it."""
    fixed = {"1": 1.9, "2": 2.0, "4": 2.1, "8": 2.4, "16": 3.5, "32": 6.0}
    data = curve_file({"1": 1.9, **{str(s): 9.0 + 0.3 * s for s in (2, 4, 8, 16, 32)}}) | {"fixed_ms": fixed}
    path = write(tmp_path, data)
    assert read_curve(path).fixed_ms == {int(rows): ms for rows, ms in fixed.items()}
    out = tmp_path / "profile.json"
    assert main(["calibrate", "--latency-curve", str(path), "--json", str(out), "--model", str(tiny_model_dir)]) == 0
    profile = json.loads(out.read_text())
    policy = profile["step_policy"]
    rates = policy["rates"]
    assert set(rates) == {"trees", *(f"fixed {rows}" for rows in fixed if rows != "1")}
    chosen = f"fixed {policy['rows']}" if policy["kind"] == "fixed" else "trees"
    assert rates[chosen] == max(rates.values())
    if policy["kind"] == "fixed":  # the tree fits the padded shape; every step costs the fixed step
        assert profile["tree_sizes"][-1] <= policy["rows"]
        assert profile["expected_ms_per_step"] == pytest.approx(fixed[str(policy["rows"])])
    assert f"steps: {StepPolicy.from_json(policy).line()}" in capsys.readouterr().out.splitlines()


BAD_CURVES = [
    ("{not json", "is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("[1, 2]", 'must be a JSON object with "device", "source" and "latency_ms" (tree tokens -> ms)'),
    (curve_file({"1": 10.0, "2": 0}), "a step's latency must be a positive number of ms, got 0 at size 2"),
    (curve_file({"1": -3.0}), "a step's latency must be a positive number of ms, got -3.0 at size 1"),
    (curve_file({"1": "fast"}), "a step's latency must be a positive number of ms, got 'fast' at size 1"),
    (curve_file({"2": 10.0, "4": 11.0}), "tree sizes must start at 1 (the plain step), got 2..4"),
    (curve_file({}), "tree sizes must start at 1 (the plain step), got none"),
    (curve_file({"0": 10.0, "1": 10.0}), "a tree size must be a whole number of at least 1, got '0'"),
    (curve_file({"one": 10.0}), "a tree size must be a whole number, got 'one'"),
    (curve_file({"1": 10.0, "300": 10.0}), "tree sizes go up to 256, got 300"),
    (curve_file({"256": {"1": 5}, "1024": {"1": 6, "2": 7}}), "every context length must list the same tree sizes"),
    (curve_file({"1": 10.0}) | {"fixed_ms": [1, 2]}, '"fixed_ms" must map rows to ms (a step when every step has that many rows)'),
    (curve_file({"1": 10.0}) | {"fixed_ms": {"2": 3.0}}, "fixed_ms: tree sizes must start at 1 (the plain step), got 2..2"),
    (curve_file({"1": 10.0}, source=""), 'needs "source": a non-empty string saying where its numbers come from'),
    ({"source": "x", "latency_ms": {"1": 1}}, 'needs "device": a non-empty string saying which hardware the curve describes'),
]


@pytest.mark.parametrize("data, reason", BAD_CURVES)
def test_a_bad_curve_file_is_one_line_before_the_model_loads(capsys, no_model_load, tmp_path, data, reason):  # noqa: F811
    path = write(tmp_path, data)
    separator = " " if reason.startswith(("is not", "must be", "needs")) else ": "
    assert_error(capsys, f"latency curve {path}{separator}{reason}", "calibrate", "--latency-curve", path,
                 "--json", tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def test_a_missing_curve_file_is_one_line(capsys, no_model_load, tmp_path):  # noqa: F811
    path = tmp_path / "nowhere.json"
    assert_error(capsys, f"cannot read latency curve {path}: No such file or directory", "calibrate", "--latency-curve", path)


def test_calibrate_with_a_curve_end_to_end(capsys, tiny_model_dir, tmp_path, monkeypatch):
    """On a tiny model: the chosen tree and its expectation printed, the profile written to --json with the curve
    as its device, the search's choice for the acceptance record it used; nothing timed, no profile saved."""
    import ppd_core.calibration.calibrate as calibration

    def refuse(*args, **kwargs):
        raise AssertionError("the latency was measured on this machine")

    monkeypatch.setattr(calibration, "measure_latency", refuse)
    saved_before = sorted(profiles_dir().glob("*")) if profiles_dir().is_dir() else []
    out = tmp_path / "profile.json"
    code = main(["calibrate", "--latency-curve", str(FLAT), "--json", str(out), "--model", str(tiny_model_dir)])
    printed = capsys.readouterr().out
    assert code == 0
    assert (sorted(profiles_dir().glob("*")) if profiles_dir().is_dir() else []) == saved_before

    profile = json.loads(out.read_text())
    curve = read_curve(FLAT)
    assert profile["key"]["device"] == curve.device_key()
    assert profile["latency_ms"] == {"0": {str(s): 10.0 for s in range(1, 65)}}
    # the record this calibration used: its numerics and calibration's default prompts (other tests keep others there)
    wanted = {name: profile["key"][name] for name in ("model", "prompt_tokens", "backend", "quant", "dtype")}
    [record] = [r for r in read_records(Path(profile["acceptance_from"]))
                if {name: r.key[name] for name in wanted} == wanted and (r.key["prompts"], r.key["max_new_tokens"]) == (12, 96)]
    n = len(profile["acceptance"])
    search = choose_tree_and_chains(record.acceptance.probs, record.lookup, n, profile["ensemble_size"], curve.latency_ms)
    assert (profile["budget"], profile["lookup_lengths"]) == (search.budget, search.lengths)
    assert profile["tree_sizes"][-1] + max(profile["lookup_lengths"]) <= 64

    lines = printed.splitlines()
    chosen_row = [line for line in lines if line.endswith("<- chosen")]
    assert len(chosen_row) == 1 and chosen_row[0].split()[0] == str(profile["budget"])
    assert len([line for line in lines if line[:6].strip().isdigit()]) == 64  # every size of the curve
    assert (f"chosen: {profile['budget']} tokens per step (trees of {', '.join(map(str, profile['tree_sizes']))} tokens "
            f"by guess depth), expected {profile['expected_tokens_per_step']:.2f} tokens/step") in printed
    assert f"with them expected {profile['expected_tokens_per_step_with_lookup']:.2f} tokens/step" in printed
    assert (f"latency curve from {FLAT}: {curve.device} (source: {curve.source}); not saved as this device's profile; "
            f"guess acceptance from {profile['acceptance_from']}") in lines
    assert "profile saved to" not in printed


@pytest.mark.parametrize("name", ["rtx3090-llama1b-f16", "rtx3090-llama8b-q4_0"])
def test_the_shipped_gpu_curves_are_read_and_choose_the_brute_force_best(name):
    """The published RTX 3090 curves in profiles/curves/ (docs/gpu.md's forecasts): read with their device and source,
    and the search's choice on each is the brute-force best over every budget and chain combination; on the 8B Q4_0
    curve (steep at 2-8 rows) the prompt tokens' tree stays small."""
    curve = read_curve(ROOT / "profiles" / "curves" / f"{name}.json")
    assert "RTX 3090" in curve.device and "not measured here" in curve.source
    stats, conversations = answers(0)
    search = choose_tree_and_chains(PROBS, stats, 3, 1, curve.latency_ms)
    latency = {s: search.seconds(s) * 1000 for s in range(1, max(curve.latency_ms[0]) + 1)}
    rates = brute_force(conversations, search, latency)
    assert rates[search.budget, tuple(search.lengths)] == pytest.approx(max(rates.values()), rel=1e-9)
    if name.endswith("q4_0"):
        assert search.budget <= 4
