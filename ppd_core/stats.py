"""Per-step and per-answer statistics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepStats:
    """One forward pass: the tokens it produced and what it cost."""

    tokens: list[int]  # emitted this step: accepted guesses, then the model's own next token
    from_guesses: int  # how many of ``tokens`` were accepted guesses
    tree_tokens: int  # tokens in the forward pass
    seconds: float
    prefill: bool = False  # the prompt forward that yields the first token
    stop: str | None = None  # set on the last step: "eos", "length" or "context"
    from_lookup: int = 0  # how many of the accepted guesses came from the n-gram lookup chain
    logprobs: list | None = None  # ``logprobs.TokenLogprob`` per token, when the request asked for them
    chain: int = 0  # lookup tokens drafted in the step
    chain_match: int = -1  # the match class (``lookup.MATCH_CLASSES``) of the lookup's proposal; -1: none
    from_grammar: int = 0  # how many of the accepted guesses were text the grammar forced (drafted after the lookup's)
    forced: int = 0  # forced tokens drafted in the step

    def clip(self, keep: int) -> None:
        """Keep the first ``keep`` tokens, and count only the guesses among them (the prompt tokens' come
        first on a path, then the lookup chain's)."""
        prompt_guesses = self.from_guesses - self.from_lookup - self.from_grammar
        self.tokens = self.tokens[:keep]
        if self.logprobs is not None:
            self.logprobs = self.logprobs[:keep]
        self.from_guesses = min(self.from_guesses, keep)
        chained = max(0, self.from_guesses - prompt_guesses)  # the lookup's tokens, then the grammar's
        self.from_lookup = min(self.from_lookup, chained)
        self.from_grammar = chained - self.from_lookup


@dataclass
class GenerationStats:
    """Totals for one answer."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV came from the previous turn's cache
    new_tokens: int = 0
    steps: int = 0  # forward passes after the prefill
    from_guesses: int = 0
    from_lookup: int = 0  # of ``from_guesses``, those the lookup chain proposed
    from_grammar: int = 0  # of ``from_guesses``, text the grammar forced
    forced: int = 0  # forced tokens drafted (``from_grammar`` of them accepted)
    drafted: int = 0  # lookup chain tokens drafted (``from_lookup`` of them accepted)
    lookup_note: str = ""  # what the lookup chain policy did at its last proposal, and why
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    accepted_per_step: list[int] = field(default_factory=list)

    def add(self, step: StepStats) -> None:
        self.new_tokens += len(step.tokens)
        self.from_guesses += step.from_guesses
        self.from_lookup += step.from_lookup
        self.from_grammar += step.from_grammar
        self.drafted += step.chain
        self.forced += step.forced
        if step.prefill:
            self.prefill_seconds += step.seconds
        else:
            self.steps += 1
            self.decode_seconds += step.seconds
            self.accepted_per_step.append(len(step.tokens))

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
