"""Per-step and per-answer statistics, with the guesses counted by source (the drafter's name: ``drafters``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

StopReason = Literal["eos", "length", "context"]  # why an answer ended: end of turn, its token limit, the context full


@dataclass
class StepStats:
    """One forward pass: the tokens it produced and what it cost."""

    tokens: list[int]  # emitted this step: accepted guesses, then the model's own next token
    from_guesses: int  # how many of ``tokens`` were accepted guesses
    tree_tokens: int  # tokens in the forward pass
    seconds: float
    prefill: bool = False  # the prompt forward that yields the first token
    stop: StopReason | None = None  # set on the last step
    logprobs: list | None = None  # ``logprobs.TokenLogprob`` per token, when the request asked for them
    sources: list[str] = field(default_factory=list)  # [from_guesses] the source of each accepted guess, path order
    drafted: dict[str, int] = field(default_factory=dict)  # nodes each source owned in the step's tree
    notes: dict[str, str] = field(default_factory=dict)  # a source's words on what it did this step (its choice)
    memory_bytes: dict[str, int] = field(default_factory=dict)  # what a source keeps per loaded model (its drafter's)

    def clip(self, keep: int) -> None:
        """Keep the first ``keep`` tokens, and count only the guesses among them."""
        self.tokens = self.tokens[:keep]
        if self.logprobs is not None:
            self.logprobs = self.logprobs[:keep]
        self.from_guesses = min(self.from_guesses, keep)
        self.sources = self.sources[: self.from_guesses]


@dataclass
class GenerationStats:
    """Totals for one answer."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous turn's cache
    new_tokens: int = 0
    steps: int = 0  # forward passes after the prefill
    from_guesses: int = 0
    accepted: dict[str, int] = field(default_factory=dict)  # of ``from_guesses``, by source
    drafted: dict[str, int] = field(default_factory=dict)  # tree nodes each source owned, over the steps
    accepted_by_depth: dict[tuple[str, int], int] = field(default_factory=dict)  # (source, depth 1..) -> accepted
    notes: dict[str, str] = field(default_factory=dict)  # each source's last note (``StepStats.notes``)
    memory_bytes: dict[str, int] = field(default_factory=dict)  # each source's last size (``StepStats.memory_bytes``)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)
    rows_per_step: list[int] = field(default_factory=list)  # tokens each step's forward pass took

    def add(self, step: StepStats) -> None:
        self.new_tokens += len(step.tokens)
        self.from_guesses += step.from_guesses
        for name, count in step.drafted.items():
            self.drafted[name] = self.drafted.get(name, 0) + count
        for depth, name in enumerate(step.sources, 1):
            self.accepted[name] = self.accepted.get(name, 0) + 1
            self.accepted_by_depth[name, depth] = self.accepted_by_depth.get((name, depth), 0) + 1
        self.notes.update(step.notes)
        self.memory_bytes.update(step.memory_bytes)
        if step.prefill:
            self.prefill_seconds += step.seconds
        else:
            self.steps += 1
            self.decode_seconds += step.seconds
            self.accepted_per_step.append(len(step.tokens))
            self.rows_per_step.append(step.tree_tokens)

    @property
    def source_names(self) -> list[str]:
        """Every source that drafted or had a guess accepted, in the order they first did."""
        return list(dict.fromkeys([*self.drafted, *self.accepted]))

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def mean_accepted(self) -> float:
        """Tokens per decoding forward pass (1.0 for plain decoding)."""
        return sum(self.accepted_per_step) / self.steps if self.steps else 0.0

    @property
    def tok_s(self) -> float:
        """New tokens per second, prompt processing included."""
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second of the decoding steps alone."""
        tokens = sum(self.accepted_per_step)
        return tokens / self.decode_seconds if self.decode_seconds else 0.0
