"""What a decoding step costs on this device, read from its calibration profile, and an answer's speedup over plain
decoding estimated from those costs while it streams (the page's readout; Compare measures it).

The estimate prices each PPD step by its rows and the same tokens as plain 1-token steps, both sides on ONE timing of
the profile: the latency curve (a 1-row PPD step and a plain step are the same step, its 1-row point), or, where every
step is padded to one shape, the fixed-shape timings (``fixed_ms``: R rows repeated, and 1 row repeated). An answer
decoded in 1-row steps is therefore exactly 1.00x. (The fixed timings' 1-row step beside the curve's was the bug of
issue 50: two timings of one step taken at different moments, 80.1 ms against 56.6 ms on a busy CPU, so every 1-token
step counted as 1.41x.) The steps' own times say how much slower or faster than at calibration the device runs now (its
load), which scales both sides alike and says when the device is busy.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from ppd_core.calibration.tree_search import step_seconds
from ppd_core.stats import StepStats

DRIFT = 1.3  # a median step this much slower (or 1/DRIFT faster) than calibration's cost: the device is not as it was
DRIFT_STEPS = 8  # steps needed before the drift is told


@dataclass(frozen=True)
class StepPrices:
    """Seconds of a step on the device a profile measured."""

    plain: float  # a plain 1-token step, repeated (what plain decoding runs)
    ppd: Callable[[int], float]  # a PPD step of so many rows, as its step policy runs it

    @classmethod
    def of(cls, profile) -> StepPrices | None:
        """The prices in ``profile`` (a ``DeviceProfile``); None without one or without a latency curve."""
        if profile is None or not profile.latency_ms:
            return None
        policy = profile.policy
        curve = step_seconds(profile.latency_ms)
        if policy.pads and 1 in policy.fixed_ms:  # padded steps: both sides from the fixed-shape timings
            return cls(policy.fixed_ms[1] / 1000, policy.seconds(curve))
        return cls(curve(1), curve)  # each step its own shape: both sides from the curve


@dataclass
class LiveEstimate:
    """One answer's speedup over plain decoding, from its steps as they come (``add``)."""

    prices: StepPrices
    prefill_seconds: float = 0.0  # both ways alike: plain decoding would read the same prompt
    decode_seconds: float = 0.0  # the PPD steps' measured time
    priced_seconds: float = 0.0  # the same steps priced on the profile
    plain_seconds: float = 0.0  # their tokens priced as plain 1-token steps, on the same timing
    tokens: int = 0  # produced by those steps
    ratios: list[float] = field(default_factory=list)  # each step's time over its price

    def add(self, step: StepStats) -> None:
        if step.prefill:
            self.prefill_seconds += step.seconds
            return
        price = self.prices.ppd(step.tree_tokens)
        self.decode_seconds += step.seconds
        self.priced_seconds += price
        self.plain_seconds += self.prices.plain * len(step.tokens)  # a 1-row step of 1 token: the same figure added
        self.tokens += len(step.tokens)
        self.ratios.append(step.seconds / price)

    @property
    def speedup(self) -> float | None:
        """Plain decoding's estimated time for these tokens over PPD's measured time, prompt processing included on
        both sides (as Compare times them); None before the first step."""
        if not self.tokens or not self.priced_seconds:
            return None
        # the device's load now against calibration scales both sides alike: plain decoding's time is the measured
        # steps' time times the priced ratio (exactly the measured time where every step was 1 row and 1 token)
        plain = self.decode_seconds * (self.plain_seconds / self.priced_seconds)
        return (self.prefill_seconds + plain) / (self.prefill_seconds + self.decode_seconds)

    @property
    def drift(self) -> float | None:
        """The median step's time over its price once ``DRIFT_STEPS`` ran, where it is beyond ``DRIFT`` either way
        (the device busier, or calmer, than when calibrated); else None."""
        if len(self.ratios) < DRIFT_STEPS:
            return None
        ratio = statistics.median(self.ratios)
        return ratio if ratio > DRIFT or ratio < 1 / DRIFT else None
