"""What the page says of an answer's speed: one line in plain words (tokens per second, tokens per step, this answer's
speedup over plain decoding estimated live), the internals behind a details toggle; and Compare's verdict."""

from __future__ import annotations

from dataclasses import dataclass

from ppd_core import GenerationStats, SamplingParams
from ppd_core.calibration.prices import DRIFT, LiveEstimate

SPEED_DEFINITION = "answer tokens per second, prompt processing included"
SAME_SPEED = 0.03  # within this of 1x, "about as fast"


def speedup_words(speedup: float) -> str:
    """"1.42x faster than plain decoding", "0.62x the speed of plain decoding", "about as fast as plain decoding
    (1.01x)"."""
    if abs(speedup - 1) <= SAME_SPEED:
        return f"about as fast as plain decoding ({speedup:.2f}x)"
    if speedup > 1:
        return f"{speedup:.2f}x faster than plain decoding"
    return f"{speedup:.2f}x the speed of plain decoding"


def drift_words(drift: float | None) -> str:
    """What the steps' times against calibration's say of the device now ("" where they agree)."""
    if drift is None:
        return ""
    if drift >= DRIFT:
        return f"this device is busy (steps {drift:.1f}x slower than when calibrated): the estimate is rough"
    return f"steps {1 / drift:.1f}x faster than when calibrated: recalibrate for a better estimate"


@dataclass
class AnswerSpeed:
    """What the readout tells of one answer."""

    stats: GenerationStats
    finished: bool
    ppd: bool  # False: plain decoding asked for (nothing to estimate)
    estimate: LiveEstimate | None = None  # None: no calibration to price steps with
    backend: str = ""  # what decodes: "llama.cpp" or "torch"
    penalties: str = ""  # the repetition penalties on ("" for none)

    def line(self) -> str:
        """The readout's first line: speed, tokens per step and the estimated speedup (or why there is none)."""
        stats = self.stats
        state = " (streaming)" if not self.finished else ""
        parts = [f"**{stats.tok_s:.1f} tokens/s**{state}"]
        if not self.ppd:
            parts.append("plain decoding (PPD off)")
        else:
            parts.append(f"{stats.mean_accepted:.2f} tokens per step")
            speedup = self.estimate.speedup if self.estimate is not None else None
            if speedup is not None:
                parts.append(f"**{speedup_words(speedup)}** (estimated)")
            elif self.estimate is None:
                parts.append("speedup not estimated: calibrate this device (Calibration) or run Compare")
            drift = drift_words(self.estimate.drift) if self.estimate is not None else ""
            if drift:
                parts.append(drift)
        return " · ".join(parts)

    def details(self) -> str:
        """The internals: where the guesses came from (by source), prompt processing, penalties."""
        stats = self.stats
        steps = max(stats.steps, 1)
        items = [f"{stats.new_tokens} tokens in {stats.seconds:.2f} s ({SPEED_DEFINITION})"
                 + (f" on {self.backend}" if self.backend else "")]
        reused = f", {stats.reused_tokens} reused from the last turn" if stats.reused_tokens else ""
        items.append(f"prompt processing {stats.prefill_seconds * 1000:.0f} ms "
                     f"({stats.prompt_tokens - stats.reused_tokens} tokens{reused})")
        if self.ppd:
            names = stats.source_names
            per_step = ", ".join(f"{name} {stats.accepted.get(name, 0) / steps:.2f}" for name in names)
            items.append(f"guessed tokens accepted per step: {per_step or 'none drafted'}")
            items += [f"{name}: {source_line(stats, name)}" for name in names]
            if self.estimate is not None and self.estimate.speedup is not None:
                items.append("the speedup is estimated from this device's calibrated step costs: each step's rows "
                             "priced against plain 1-token steps; Compare measures it")
        if self.penalties:
            items.append(f"{self.penalties} (fewer tokens copied from the conversation)")
        return "; ".join(items)

    def markdown(self) -> str:
        """The line, then the details behind a toggle (closed)."""
        return f"{self.line()}\n\n<details><summary>Details</summary>\n\n{self.details()}.\n\n</details>"


def source_line(stats: GenerationStats, name: str) -> str:
    """What a source's guesses did so far, what it keeps for the model, and its note on the last step: "12 of 15
    drafted tokens right; keeps 1.5 MiB for this model; last step drafted 5 copied tokens (...)"."""
    line = f"{stats.accepted.get(name, 0)} of {stats.drafted.get(name, 0)} drafted tokens right"
    if name in stats.memory_bytes:
        line += f"; keeps {size_words(stats.memory_bytes[name])} for this model"
    return f"{line}; last step {stats.notes[name]}" if name in stats.notes else line


def size_words(size: int) -> str:
    """"1.5 MiB", "12 KiB", "300 bytes"."""
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 2**10:.0f} KiB" if size >= 2**10 else f"{size} bytes"


def penalties_line(sampling: SamplingParams) -> str:
    """"repeat penalty 1.1 over 64 tokens" (and the others that are on), or "" with none on."""
    if not sampling.penalized:
        return ""
    window = "the whole context" if sampling.repeat_last_n < 0 else f"{sampling.repeat_last_n} tokens"
    parts = [f"repeat penalty {sampling.repeat_penalty:g}"] if sampling.repeat_penalty != 1.0 else []
    parts += [f"{name} penalty {value:g}" for name, value in (("presence", sampling.presence_penalty),
                                                               ("frequency", sampling.frequency_penalty)) if value]
    return f"{', '.join(parts)} over {window}"


def compare_verdict(speedup: float, ppd_tok_s: float, plain_tok_s: float, identical: bool, same_line: str,
                    details: str) -> str:
    """Compare's verdict in words: "**PPD was 1.42x faster on this answer**; identical text." with the figures
    behind a toggle; ``same_line`` says what differing text means on this path."""
    if abs(speedup - 1) <= SAME_SPEED:
        head = f"**PPD was about as fast as plain decoding on this answer ({speedup:.2f}x)**"
    elif speedup > 1:
        head = f"**PPD was {speedup:.2f}x faster on this answer**"
    else:
        head = f"**PPD was slower on this answer: {speedup:.2f}x the speed of plain decoding**"
    text = "identical text" if identical else f"different text ({same_line})"
    return (f"{head} ({ppd_tok_s:.1f} against {plain_tok_s:.1f} tokens/s, measured); {text}.\n\n"
            f"<details><summary>Details</summary>\n\n{details}\n\n</details>")

def duration(seconds: float) -> str:
    """A time in words: seconds up to 90, minutes up to 90, then hours."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
