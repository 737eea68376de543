"""The decode plan: what a step needs from calibration and the user's options, as one frozen value.

    plan = make_plan(profile, PlanOptions(tree="auto", lookup=None), Guesses(n, V))
    engine.plan = make_plan(profile, replace(plan.options, lookup=4), plan.guesses)   # what ``Engine.replan`` does

The tree family, the tree budget, the lookup chains (their lengths and whether they are learnt per conversation),
whether a step is padded to a fixed shape, and whether the engine waits for a calibration all follow from the
device profile (or none) and the options; nothing else sets them, so they cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ppd_core.calibration.prior import forced_chains, uncalibrated_chains
from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.calibration.tree_search import design_family, mean_curve, step_seconds, within
from ppd_core.errors import PpdError
from ppd_core.drafters.lookup import MATCH_CLASSES
from ppd_core.drafters.base import ChainPolicy
from ppd_core.drafters.chain_policy import AdaptiveChains, FixedChains
from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeFamily, family_from_spec, family_from_specs, plain_family

LookupPolicy = Literal["adaptive", "fixed", "none"]  # chains learnt per conversation, the profile's, or no lookup


@dataclass(frozen=True)
class PlanOptions:
    """What the user asked for."""

    tree: str | TreeFamily = "auto"  # "auto" (the profile's), a static tree name, a token budget ("12"), or trees as given
    lookup: int | str | None = None  # None: chains learnt per conversation; "fixed": the profile's; 0: none; N: up to N


@dataclass(frozen=True)
class Guesses:
    """What the model can guess with: its prompt tokens' shape, and whether its cache holds a tree at all."""

    num_prompt_tokens: int = 0
    ensemble_size: int = 1
    plain_only: bool = False  # a recurrent cache: every answer decodes plainly


@dataclass(frozen=True)
class DecodePlan:
    """How PPD decodes now; ``make_plan`` builds it."""

    options: PlanOptions
    guesses: Guesses
    profile: DeviceProfile | None  # the calibration behind the trees and chains, if any
    family: TreeFamily  # the trees PPD steps with (the plain family: 1-token steps)
    budget: int | None  # a budget asked for instead of the profile's choice
    lookup_lengths: tuple[int, ...]  # chain length by match class (empty: no lookup)
    lookup_policy: LookupPolicy
    awaiting_calibration: bool  # --tree auto with no profile yet: plain steps and prior chains meanwhile
    padded_rows: int | None  # the rows every PPD step is padded to (a ``fixed`` step policy); None: each its own
    expectation: dict | None = field(default=None)  # calibration's figures for the budget in use (None: no profile)

    def new_chains(self) -> ChainPolicy | None:
        """A new conversation's lookup chain policy (None: no lookup)."""
        if self.lookup_policy == "adaptive" and self.awaiting_calibration:
            return uncalibrated_chains()
        if self.lookup_policy == "adaptive":
            return AdaptiveChains(self.profile.lookup_acceptance, *self.chain_pricing())
        return FixedChains(self.lookup_lengths) if any(self.lookup_lengths) else None

    def new_forced_chains(self) -> ChainPolicy:
        """How long a chain of grammar-forced text to draft: learnt per answer, priced on the profile's curve if any."""
        if self.profile is None or self.awaiting_calibration or not self.profile.latency_ms:
            return forced_chains()
        return forced_chains(*self.chain_pricing())

    def chain_pricing(self) -> tuple:
        """(seconds of a step of so many rows, tokens per step of the trees, their rows) on the profile's curve."""
        return self.step_seconds(), self.expectation["expected_tokens_per_step"] or 1.0, self.family.trees[-1].num_tokens

    def row_costs(self) -> tuple[float, ...] | None:
        """[R + 1] what a step of r rows costs in plain steps on the profile's curve, r up to its largest measured
        size (``Draft.row_costs``; index 0 unused); None without a measured curve."""
        if self.profile is None or self.awaiting_calibration or not self.profile.latency_ms:
            return None
        return relative_costs(self.step_seconds(), max(mean_curve(self.profile.latency_ms)))

    def step_seconds(self) -> Callable[[int], float]:
        """Seconds of a step against its rows on the profile's curve, under its step policy (beyond the largest
        measured size: never)."""
        latency = self.profile.latency_ms
        return self.profile.policy.seconds(within(step_seconds(latency), max(mean_curve(latency))))

    @property
    def expected_speedup(self) -> float | None:
        """Calibration's expected speedup for what decodes now: with its lookup chains while they are on."""
        if self.profile is None:
            return None
        chains = any(self.lookup_lengths) and list(self.lookup_lengths) == self.profile.lookup_lengths
        return self.profile.expected_speedup_with_lookup if chains else self.profile.expected_speedup


def relative_costs(seconds: Callable[[int], float], largest: int) -> tuple[float, ...]:
    """[R + 1] ``seconds(r) / seconds(1)`` for r up to ``largest`` or the first size that cannot run (index 0: 1)."""
    costs = [1.0]
    for rows in range(1, largest + 1):
        if not math.isfinite(seconds(rows)):
            break
        costs.append(seconds(rows) / seconds(1))
    return tuple(costs)


def make_plan(profile: DeviceProfile | None, options: PlanOptions, guesses: Guesses) -> DecodePlan:
    """The plan for ``options`` on ``profile`` (None: uncalibrated) with the model's ``guesses``."""
    budget = int(options.tree) if isinstance(options.tree, str) and options.tree.isdigit() else None
    awaiting = options.tree == "auto" and profile is None and not guesses.plain_only
    lengths = lookup_lengths(profile, options.lookup)
    adaptive = options.lookup is None and ((profile is not None and bool(profile.lookup_acceptance)) or awaiting)
    return DecodePlan(
        options=options, guesses=guesses, profile=profile, family=tree_family(profile, options.tree, budget, guesses),
        budget=budget, lookup_lengths=lengths,
        lookup_policy="adaptive" if adaptive else "fixed" if any(lengths) else "none",
        awaiting_calibration=awaiting,
        padded_rows=None if profile is None or budget is not None or guesses.plain_only else profile.policy.pads,
        expectation=calibration_expectation(profile, budget),
    )


def tree_family(profile: DeviceProfile | None, tree: str | TreeFamily, budget: int | None, guesses: Guesses) -> TreeFamily:
    """The trees for ``tree``: as given, a static tree, the best for ``budget`` tokens, or the profile's choice."""
    n, V = guesses.num_prompt_tokens, guesses.ensemble_size
    if guesses.plain_only:
        return plain_family()
    if isinstance(tree, TreeFamily):
        return tree
    if tree in STATIC_TREES:
        return family_from_spec(tree, STATIC_TREES[tree], n, V)
    if budget is not None:
        if profile is None:
            raise PpdError(f"--tree {tree} needs a calibration profile (run `ppd calibrate`)")
        return family_from_specs(f"budget-{budget}", design_family(profile.acceptance, budget, n, V), n, V)
    return profile.family() if profile is not None else plain_family()


def lookup_lengths(profile: DeviceProfile | None, lookup: int | str | None) -> tuple[int, ...]:
    """Chain lengths by match class: the asked-for length, else the profile's (none without one)."""
    if lookup is None or lookup == "fixed":
        return tuple(profile.lookup_lengths) if profile is not None else ()
    return (lookup,) * len(MATCH_CLASSES) if lookup else ()


def calibration_expectation(profile: DeviceProfile | None, budget: int | None) -> dict | None:
    """What calibration expects of the trees in use (None without a profile)."""
    if profile is None:
        return None
    budget = budget or profile.budget
    row = next((r for r in profile.budgets if r["budget"] == budget), {})
    return {
        "budget": budget,
        "chosen_budget": profile.budget,
        "expected_tokens_per_step": row.get("tokens_per_step"),
        "expected_tokens_per_second": row.get("tokens_per_second"),
        "expected_speedup_of_chosen": profile.expected_speedup,
        "lookup_lengths": profile.lookup_lengths,
        "expected_tokens_per_step_with_lookup": profile.expected_tokens_per_step_with_lookup,
        "expected_speedup_with_lookup": profile.expected_speedup_with_lookup,
        "expected_with_lookup_by_turn": profile.expected_with_lookup_by_turn,
    }
