"""Calibration: latency curve + acceptance statistics -> the tree family for this device.

    profile = calibrate(loaded, prompt_tokens)   # the latency curve only, where an acceptance record exists
    profile = calibrate(loaded, prompt_tokens, curve=read_curve(FILE))  # another device's curve, timing nothing
    save_profile(profile)
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ppd_core.calibration.acceptance import (
    calibration_prompts, conversation_answers, decoder_acceptance, decoder_answers, lookup_stats,
)
from ppd_core.calibration.latency import (
    CONTEXTS, CPU_SIZES, GPU_SIZES, measure_fixed, measure_latency,
)
from ppd_core.calibration.count import CalibrationCount, Pace, plan
from ppd_core.calibration.profiles import (DeviceProfile, ProfileError, load_profile, profile_path, save_profile,
                                           set_aside)
from ppd_core.calibration.records import AcceptanceRecord, AcceptanceStats, candidate_files, find_record, now, save_record
from ppd_core.calibration.step_policy import FIXED_LADDER, StepPolicy
from ppd_core.calibration.tree_search import (
    Choice, FamilyEstimate, Probs, choose_family, mean_curve, step_seconds, within,
)
from ppd_core.device_info import describe
from ppd_core.device_policy import profile_fields
from ppd_core.faults import fault
from ppd_core.drafters.lookup import LookupStats, best_with_chains, with_lookup
from ppd_core.progress import Progress
from ppd_core.drafters.prompt_tokens import PromptTokens, signature_of

if TYPE_CHECKING:
    from ppd_core.calibration.curves import LatencyCurve
    from ppd_core.loaded import LoadedModel

log = logging.getLogger(__name__)


def profile_key(loaded: LoadedModel, prompt_tokens: PromptTokens) -> dict:
    """Device + model fingerprint + quantization + dtype + backend (with llama.cpp's build and offload) + forward +
    prompt tokens. A rebuilt llama.cpp (another CPU feature set, CUDA, Metal) or another offload is another curve."""
    backend = loaded.info
    signature = signature_of(loaded.backend.embedding_rows, backend.vocab_size)
    kernels = backend.kernels
    device = profile_fields(backend.properties, describe(backend.properties).driver, offloaded=backend.offloaded == -1)
    return {
        "device": device,
        "model": {"name": loaded.name, "fingerprint": hashlib.sha256(json.dumps(signature).encode()).hexdigest()[:16]},
        "quant": loaded.quant,
        "dtype": backend.dtype,
        "backend": backend.name,
        "build": kernels.get("system", ""),  # llama.cpp's CPU features and GPU backends ("" on torch)
        "gpu_layers": kernels.get("gpu_layers", 0),
        "forward": backend.forward,  # the lean and transformers forwards differ in step latency
        "prompt_tokens": prompt_tokens.fingerprint,
    }


def acceptance_key(loaded: LoadedModel, prompt_tokens: PromptTokens, prompts: int, max_new_tokens: int) -> dict:
    """What the guesses' acceptance depends on: the model, the prompt tokens, the numerics that answer, the prompts."""
    key = profile_key(loaded, prompt_tokens)
    return {"model": key["model"], "prompt_tokens": key["prompt_tokens"], "backend": key["backend"], "quant": key["quant"],
            "dtype": key["dtype"], "prompts": prompts, "max_new_tokens": max_new_tokens}


def measure_record(loaded: LoadedModel, prompt_tokens: PromptTokens, key: dict, prompts: int, max_new_tokens: int,
                   report: Progress, between: Callable[[], object] | None = None) -> AcceptanceRecord:
    """Answer the calibration prompts greedily with the decoding backend and count how often the guesses (prompt
    tokens' and lookup's) were right on those answers, through the same backend's tree rows. ``between()`` before
    each of those answers' steps: a pause point (an answer to the chat may run there)."""
    n, V = prompt_tokens.num_prompt_tokens, prompt_tokens.ensemble_size
    eos = sorted(loaded.eos_token_ids)
    conversations, turns = prompt_turns(prompts)
    report("lookup", 0, turns)  # the count from the start: the first answer can take a while
    answer = decoder_answers(loaded.backend, max_new_tokens, eos, lambda done: report("lookup", done, turns), between)
    answers = conversation_answers(loaded.tokenizer, conversations, answer)
    lookup = lookup_stats(answers)
    stats = AcceptanceStats([], [])
    if n:
        stats = decoder_acceptance(loaded.backend, prompt_tokens.table(), n, V, answers,
                                   progress=lambda d, t: report("acceptance", d, t), between=between)
    return AcceptanceRecord(key, stats, lookup, now())


def prompt_turns(prompts: int) -> tuple[list[list[str]], int]:
    """The first ``prompts`` calibration conversations, and their turns in all (the answers calibration asks for)."""
    conversations = calibration_prompts()[:prompts]
    return conversations, sum(map(len, conversations))


def tokens_per_step_ceiling(stats: AcceptanceStats, lookup: LookupStats, n: int, V: int, largest: int) -> float:
    """The most tokens one step can be expected to yield: the best tree of ``largest`` tokens plus the longest lookup
    chain after the surest kind of match (a step that copies can be worth many, even where most steps are not)."""
    tree = choose_family(stats.probs, {1: 1.0, largest: 1.0}, n, V, [largest]).best.tokens_per_step if n else 1.0
    return tree + max((sum(row) for row in lookup.probs), default=0.0)  # E[right chain tokens | match class]


@dataclass(frozen=True)
class TreeAndChains:
    """The tree family and lookup chains chosen together for a latency curve."""

    choice: Choice  # every budget's best family
    budgets: list[int]  # the budgets tried, ascending
    budget: int  # the chosen one
    lengths: list[int]  # chain length by match class (0: none)
    seconds: Callable[[int], float]  # step seconds against tree tokens; infinite past the curve's largest size

    @property
    def best(self) -> FamilyEstimate:
        return self.choice.by_budget[self.budget]

    def with_lookup(self, lookup: LookupStats) -> tuple[float, float]:
        """Expected (tokens, seconds) per step of the chosen tree with its chains, on ``lookup``'s answers."""
        return with_lookup(lookup, self.lengths, self.best.tokens_per_step, self.best.sizes[-1], self.seconds)


def choose_tree_and_chains(probs: Probs, lookup: LookupStats, n: int, V: int,
                           latency_ms: dict[int, dict[int, float]], pace: Pace | None = None) -> TreeAndChains:
    """The budget and chain lengths with the most expected tokens/s on ``latency_ms`` (context -> size -> ms),
    measured here or read from a curve file: every small tree, and the curve's sizes beyond; none past its largest.
    ``pace``: the search's progress and pause points."""
    curve = mean_curve(latency_ms)
    budgets = sorted(set(range(1, min(32, max(curve)) + 1)) | set(curve))
    choice = choose_family(probs, curve, n, V, budgets, tick=pace.part(0, 0.3).tick if pace else None)
    seconds = within(step_seconds(latency_ms), max(curve))
    # chains join each budget's full tree: a smaller tree may pay more with them than the best tree alone
    # (budgets ascend: on a tie the smaller tree wins)
    trees = [(choice.by_budget[b].tokens_per_step, choice.by_budget[b].sizes[-1]) for b in budgets]
    chosen, lengths = best_with_chains(lookup, trees, seconds, pace.part(0.3, 1, every=25).tick if pace else None)
    return TreeAndChains(choice, budgets, budgets[chosen], lengths, seconds)


def fixed_search(search: TreeAndChains, lookup: LookupStats, rows: int, ms: float,
                 pace: Pace | None = None) -> TreeAndChains:
    """The best trees and chains when every step is padded to ``rows`` rows and costs ``ms`` whatever it holds."""
    seconds = StepPolicy("fixed", rows, {rows: ms}).seconds(search.seconds)
    budgets = [b for b in search.budgets if search.choice.by_budget[b].sizes[-1] <= rows]
    trees = [(search.choice.by_budget[b].tokens_per_step, search.choice.by_budget[b].sizes[-1]) for b in budgets]
    chosen, lengths = best_with_chains(lookup, trees, seconds, pace.tick if pace else None)
    return TreeAndChains(search.choice, budgets, budgets[chosen], lengths, seconds)


def rate(search: TreeAndChains, lookup: LookupStats) -> float:
    """Expected tokens per second of ``search``'s trees and chains on ``lookup``'s answers."""
    tokens, seconds = search.with_lookup(lookup)
    return tokens / seconds


FIXED_MARGIN = 1.05  # how much more tokens/s a fixed shape must promise than the trees to be chosen


def choose_step_policy(search: TreeAndChains, lookup: LookupStats, fixed_ms: dict[int, float],
                       pace: Pace | None = None) -> tuple[TreeAndChains, StepPolicy]:
    """Trees between 1-token steps (``search``: plain steps where its budget is 1 without chains), or every step
    padded to one of ``fixed_ms``' shapes, whichever is expected to give the most tokens per second. A fixed shape
    must beat the trees by ``FIXED_MARGIN``: the two are timed apart, and on a CPU, where padding only adds rows,
    the noise between two timings must not decide (on a GPU the fixed shape wins by a factor, or not at all).
    ``fixed_ms[1]`` (1-token steps repeated) is the same step as the trees' 1-token one: said, not weighed."""
    rates = {"trees": rate(search, lookup)}
    best, policy = search, StepPolicy("trees", 0, fixed_ms)
    bar = rates["trees"] * FIXED_MARGIN  # what a fixed shape must beat: the trees by the margin, then the best one
    shapes = sorted(rows for rows in fixed_ms if rows != 1)
    for index, rows in enumerate(shapes):
        part = pace.part(index / len(shapes), (index + 1) / len(shapes), every=25) if pace else None
        candidate = fixed_search(search, lookup, rows, fixed_ms[rows], part)
        rates[f"fixed {rows}"] = value = rate(candidate, lookup)
        if value > bar * (1 + 1e-9):
            best, policy, bar = candidate, StepPolicy("fixed", rows, fixed_ms), value
    if policy.kind == "trees" and best.budget == 1 and not any(best.lengths):
        policy = StepPolicy("plain", 0, fixed_ms)
    rounded = {name: round(value, 3) for name, value in rates.items()}
    return best, StepPolicy(policy.kind, policy.rows, policy.fixed_ms, rounded)


def calibrate(
    loaded: LoadedModel,
    prompt_tokens: PromptTokens,
    progress: Progress | None = None,
    prompts: int = 12,
    max_new_tokens: int = 96,
    contexts: tuple[int, ...] = CONTEXTS,
    repeats: int = 9,
    curve: LatencyCurve | None = None,
    between: Callable[[], bool] | None = None,
) -> DeviceProfile:
    """Measure this device and these prompt tokens; choose the tree family and lookup chains with the most tokens/s.

    ``curve``: another device's step latency (``curves.read_curve``) instead of timing this one; the profile's key
    then names the curve, not this device. ``progress(phase, done, total)``: one count over every phase
    (``CalibrationCount``). ``between``: the pause point, called before every timed step, every answer's step and
    every item of the tree search: it may lend the model to other work (the chat's answers), then returns."""
    started = time.perf_counter()
    n, V = prompt_tokens.num_prompt_tokens, prompt_tokens.ensemble_size
    table = prompt_tokens.table() if n else None  # [n * V, hidden]
    key = acceptance_key(loaded, prompt_tokens, prompts, max_new_tokens)
    found = find_record(prompt_tokens.source, prompt_tokens.fingerprint, key)
    sizes, pads = ([], False) if curve is not None else probe_sizes(loaded)
    turns = 0 if found is not None else prompt_turns(prompts)[1]
    count = CalibrationCount(progress or (lambda phase, done, total: None),
                             plan(turns, bool(n), len(contexts) * len(sizes), len(fixed_ladder(sizes)) if pads else 0))
    count("lookup" if turns else "latency" if sizes else "tree search", 0, 1)  # the whole count from the start
    record, source = acceptance_record(loaded, prompt_tokens, key, found, prompts, max_new_tokens, count, curve, between)
    stats, lookup = record.acceptance, record.lookup
    if curve is not None:
        latency, fixed_ms = curve.latency_ms, dict(curve.fixed_ms)  # another device's fixed-shape steps, if it has them
    else:
        latency, fixed_ms = measure_steps(loaded, table, n, V, stats, lookup, (sizes, pads), contexts, repeats, count,
                                          between)
    fault("calibrate.tree_search")
    pace = Pace("tree search", count, between)
    search = choose_tree_and_chains(stats.probs, lookup, n, V, latency, pace.part(0, 0.6))
    plain_seconds = search.seconds(1)  # a 1-token step between trees: what every speedup is over
    search, policy = choose_step_policy(search, lookup, fixed_ms, pace.part(0.6, 1))
    count("tree search", 1, 1)
    key = profile_key(loaded, prompt_tokens)
    if curve is not None:
        key["device"] = curve.device_key()
    return DeviceProfile(
        key=key, latency_ms=latency, acceptance=[[round(p, 6) for p in row] for row in stats.probs],
        acceptance_positions=stats.trials[0] if stats.trials else 0, ensemble_size=V,
        **chosen_fields(search, policy, lookup, plain_seconds),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        calibration_seconds=round(time.perf_counter() - started, 1), acceptance_from=str(source),
    )


def acceptance_record(loaded: LoadedModel, prompt_tokens: PromptTokens, key: dict,
                      found: tuple[AcceptanceRecord, Path] | None, prompts: int, max_new_tokens: int, report: Progress,
                      curve: LatencyCurve | None, between: Callable[[], object] | None) -> tuple[AcceptanceRecord, Path]:
    """The acceptance record for these numerics (``key``), and its file: ``found`` (``find_record``'s), else measured
    (once) and saved."""
    fault("calibrate.acceptance")
    if found is not None:  # measured before for this model, these prompt tokens and these numerics
        log.warning("guess acceptance: the record in %s (%s, %s); %s", found[1], key["backend"], key["quant"],
                    "the latency curve from " + curve.path if curve else "measuring the latency curve only")
        return found
    log.warning("guess acceptance: no record for %s with %s/%s: measuring it (once)", loaded.name, key["backend"],
                key["quant"])
    record = measure_record(loaded, prompt_tokens, key, prompts, max_new_tokens, report, between)
    return record, save_record(record, candidate_files(None, prompt_tokens.fingerprint)[-1])


def probe_sizes(loaded: LoadedModel) -> tuple[list[int], bool]:
    """The tree sizes this device's curve is timed at (a GPU's reach further), and whether decoding pads steps (the
    fixed shapes are timed too)."""
    sizes = [size for size in (GPU_SIZES if loaded.info.on_gpu else CPU_SIZES) if size <= loaded.info.max_tree_rows]
    return sizes, loaded.info.pads_steps


def fixed_ladder(sizes: list[int]) -> list[int]:
    """The fixed shapes timed (rows), the 1-row step included."""
    return sorted({1, *(rows for rows in FIXED_LADDER if rows <= max(sizes))})


def measure_steps(loaded: LoadedModel, table, n: int, V: int, stats: AcceptanceStats, lookup: LookupStats,
                  probes: tuple[list[int], bool], contexts: tuple[int, ...], repeats: int, report: Progress,
                  between: Callable[[], bool] | None) -> tuple[dict[int, dict[int, float]], dict[int, float]]:
    """This device's step curve (context -> size -> ms, on the forward that decodes; sizes that cannot win skipped)
    and, where decoding pads steps, each fixed shape's cost (rows -> ms): ``probes`` (``probe_sizes``)."""
    fault("calibrate.latency")
    sizes, pads = probes
    ceiling = tokens_per_step_ceiling(stats, lookup, n, V, max(sizes))
    latency = measure_latency(loaded.backend, table, n, V, sizes, contexts, repeats,
                              progress=lambda d, t: report("latency", d, t), ceiling=ceiling, between=between)
    fixed_ms = {}
    if pads:  # one shape per step, as decoding would pad it
        fixed_ms = measure_fixed(loaded.backend, table, n, V, fixed_ladder(sizes), contexts[0], repeats,
                                 ceiling=ceiling, between=between, progress=lambda d, t: report("fixed", d, t))
    return latency, fixed_ms


def chosen_fields(search: TreeAndChains, policy: StepPolicy, lookup: LookupStats, plain_seconds: float) -> dict:
    """The profile's fields for the chosen trees, chains and step policy, with what they are expected to give over
    plain steps of ``plain_seconds``."""
    best, seconds, choice = search.best, search.seconds, search.choice
    lookup_tokens, lookup_seconds = search.with_lookup(lookup)
    return dict(
        budget=search.budget, trees=list(best.specs), tree_sizes=list(best.sizes),
        expected_tokens_per_step=round(best.tokens_per_step, 4),  # the tree alone, without chains
        expected_ms_per_step=round(1000 * (seconds(best.sizes[-1]) if policy.pads else best.seconds_per_step), 3),
        expected_speedup=round(best.tokens_per_step / seconds(best.sizes[-1]) * plain_seconds if policy.pads
                               else best.tokens_per_second / choice.plain_tokens_per_second, 4),
        budgets=[{"budget": budget, "tokens_per_step": round(e.tokens_per_step, 4),
                  "ms_per_step": round(1000 * e.seconds_per_step, 3), "tokens_per_second": round(e.tokens_per_second, 3)}
                 for budget, e in sorted(choice.by_budget.items())],
        lookup_acceptance=[[round(p, 6) for p in row] for row in lookup.probs], lookup_trials=list(lookup.trials),
        lookup_lengths=search.lengths, expected_tokens_per_step_with_lookup=round(lookup_tokens, 4),
        expected_speedup_with_lookup=round(lookup_tokens / lookup_seconds * plain_seconds, 4),  # over plain decoding
        step_policy=policy.to_json(), expected_with_lookup_by_turn=by_turn(search, lookup, plain_seconds),
    )


def by_turn(search: TreeAndChains, lookup: LookupStats, plain_seconds: float) -> dict[str, dict]:
    """The chosen trees and chains on first turns and follow-ups apart: follow-ups copy more."""
    parts = {}
    for name, keep in (("first turns", lambda turn: turn == 1), ("follow-ups", lambda turn: turn > 1)):
        part = lookup.select(keep)
        if part.matches:
            tokens, per_step = search.with_lookup(part)
            parts[name] = {"answers": len(part.matches), "tokens_per_step": round(tokens, 4),
                           "speedup": round(tokens / per_step * plain_seconds, 4)}
    return parts


def find_profile(loaded: LoadedModel, prompt_tokens: PromptTokens) -> DeviceProfile | None:
    """The profile saved for this device, model and prompt tokens; a corrupt or stale one is set aside (``NAME.bad``)
    with a warning, so that no start trips on it again."""
    key = profile_key(loaded, prompt_tokens)
    try:
        return load_profile(key)
    except ProfileError as error:
        aside = set_aside(profile_path(key))
        where = f"moved to {aside}" if aside is not None else "it could not be moved"
        log.warning("ignoring the saved calibration: %s; %s; recalibrating", error, where)
        return None


def calibrate_and_save(loaded: LoadedModel, prompt_tokens: PromptTokens, progress: Progress | None = None,
                       **options) -> DeviceProfile:
    """``calibrate`` this device, and save the profile where ``find_profile`` finds it next time."""
    log.warning("calibrating the guess tree for this device")
    profile = calibrate(loaded, prompt_tokens, progress, **options)
    save_profile(profile)
    return profile
