"""The answer's drafters by name: each source registers a factory that makes its drafter for one answer from a
``DraftContext`` (None: the source is off for it). The engine builds them in registration order, after the model's
own prompt tokens (``decoding.Speculator.prompt_drafter``); a new source adds a module to this package and a line
here, nothing in the engine or the app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ppd_core.drafters import suffix as suffix_source
from ppd_core.drafters.base import ChainPolicy, Drafter
from ppd_core.drafters.forced import GrammarDrafter
from ppd_core.drafters.lookup import LookupDrafter
from ppd_core.drafters.recycling import RecyclingDrafter, RecyclingTable
from ppd_core.errors import PpdError

if TYPE_CHECKING:
    from ppd_core.drafters.forced import ForcedText
    from ppd_core.sampling.constraint import Grammar


@dataclass
class DraftContext:
    """What a factory may use to make one answer's drafter."""

    input_ids: Sequence[int]  # the whole prompt: the conversation so far, ready for the answer
    chains: ChainPolicy | None = None  # the conversation's lookup chain policy (None: lookup off)
    grammar: Grammar | None = None  # the answer's grammar state (None: free text)
    forced_text: Callable[[], ForcedText] | None = None  # a new answer's forced-text reader (with a grammar)
    forced_chains: Callable[[], ChainPolicy] | None = None  # a new answer's forced-text chain policy
    vocab_size: int = 0
    # what a source keeps per loaded model across answers, by its name (the engine's, emptied with the model); one
    # holding the model's answers has a ``forget_answers()`` method: ``Engine.forget_answers`` calls it when the user
    # deletes saved answers
    memory: dict[str, Any] = field(default_factory=dict)


Factory = Callable[[DraftContext], Drafter | None]


def lookup(context: DraftContext) -> Drafter | None:
    """Chains copied from the conversation (``lookup``), where the plan has a chain policy."""
    return None if context.chains is None else LookupDrafter(context.chains, context.input_ids, context.grammar)


def grammar(context: DraftContext) -> Drafter | None:
    """The text the grammar forces (``forced``), where the answer has a grammar."""
    if context.grammar is None or context.forced_text is None or context.forced_chains is None:
        return None
    return GrammarDrafter(context.forced_text(), context.forced_chains(), context.grammar)


def recycling(context: DraftContext) -> Drafter | None:
    """The model's own top-k next tokens per token and token pair (``recycling``): its table and acceptance counts
    are the loaded model's, kept across answers (3.3 MB for a 49,152-token vocabulary: ``RecyclingTable``)."""
    if context.vocab_size < 1:
        return None
    table, counts = context.memory.setdefault("recycling", (RecyclingTable.empty(context.vocab_size), None))
    before = int(context.input_ids[-2]) if len(context.input_ids) > 1 else -1
    drafter = RecyclingDrafter(table, counts=counts, before=before)
    context.memory["recycling"] = (table, drafter.counts)
    return drafter


def suffix(context: DraftContext) -> Drafter | None:
    """Continuations of the longest earlier match in this conversation and the model's earlier answers (``suffix``)."""
    return suffix_source.make(context)


# in drafting order (ties: the earlier)
FACTORIES: dict[str, Factory] = {"lookup": lookup, "grammar": grammar, "recycling": recycling, "suffix": suffix}
# on unless the user names others (``--drafters``): the sources calibration prices today; recycling and suffix wait
# for it to price them per device (issue 51, item 4), measured first with ``--drafters``
DEFAULT_SOURCES = ("lookup", "grammar")


def sized_per_step(names: Sequence[str] | None) -> bool:
    """Whether steps with these sources (None: the default) size their trees by the device's step curve: where one
    calibration does not price yet is on (it fills rows whatever they cost, else)."""
    return names is not None and any(name not in DEFAULT_SOURCES for name in names)


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as registered source names; a PpdError (one line) naming an unknown one."""
    unknown = [name for name in names if name not in FACTORIES]
    if unknown:
        raise PpdError(f"no guess source named {', '.join(unknown)}; choose from {', '.join(FACTORIES)}")
    return tuple(names)


def answer_drafters(context: DraftContext, names: Sequence[str] | None = None) -> list[Drafter]:
    """The drafters of one answer, in registration order: those of ``names`` (None: ``DEFAULT_SOURCES``) that are
    on for it."""
    chosen = check_names(DEFAULT_SOURCES if names is None else names)
    made = (factory(context) for name, factory in FACTORIES.items() if name in chosen)
    return [drafter for drafter in made if drafter is not None]
