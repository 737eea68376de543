"""The engine session: a loaded model and its decode plan stream answers, PPD or plain, keeping the last
conversation's cache for the next turn. The load sequence is ``engine_load``; the plan is ``plan``; what the page and
the API show is ``snapshot``; calibrating an engine is ``engine_calibration``.

    engine = Engine.load(EngineConfig(model="default"))
    for event in engine.stream(engine.chat_ids([{"role": "user", "content": "Hi"}])):
        print(event.delta, end="")
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ppd_core import decoding
from ppd_core.answer_request import AnswerRequest, Mode, check_answer
from ppd_core.calibration.profiles import DeviceProfile
from ppd_core.engine_load import EngineConfig, load_parts, settle_plan
from ppd_core.errors import PpdError
from ppd_core.drafters.forced import ForcedText, char_tokens
from ppd_core.drafters.merge import Merger
from ppd_core.drafters.registry import DraftContext, answer_drafters, check_names, sized_per_step
from ppd_core.loaded import LoadedModel
from ppd_core.drafters.base import ChainPolicy
from ppd_core.memory import release_free_heap
from ppd_core.plan import DecodePlan, make_plan
from ppd_core.progress import Progress
from ppd_core.drafters.prompt_tokens import PromptTokens
from ppd_core.sampling.params import GREEDY, SamplingParams
from ppd_core.snapshot import ModelSnapshot, take_snapshot, thread_count
from ppd_core.stats import GenerationStats, StepStats, StopReason
from ppd_core.text import chat_ids, text_stream
from ppd_core.tree import plain_family
from ppd_core.turn_end import TurnEnd, turn_stops

log = logging.getLogger(__name__)


@dataclass
class GenerationEvent:
    """The answer so far, after one forward pass."""

    text: str
    delta: str  # text added by this step
    tokens: list[int]  # answer token ids so far
    step: StepStats
    stats: GenerationStats
    stop_reason: StopReason | None = None  # set on the last event

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None


@dataclass
class KeptCache:
    """The KV cache of the last conversation streamed with ``reuse_cache``: its next turn starts from it."""

    cache: object  # the backend's
    ids: list[int]  # the tokens whose keys and values the cache holds
    chains: ChainPolicy | None = None  # the conversation's lookup chain policy: what its turns so far taught it


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: GenerationStats
    stop_reason: StopReason
    steps: list[StepStats] = field(default_factory=list)

    @classmethod
    def of(cls, events: Iterable[GenerationEvent], told: Callable[[int], object] | None = None) -> GenerationResult:
        """The stream ``events`` run to its end; ``told(tokens so far)`` after each event."""
        steps: list[StepStats] = []
        last: GenerationEvent | None = None
        for last in events:
            steps.append(last.step)
            if told is not None:
                told(last.stats.new_tokens)
        if last is None or last.stop_reason is None:
            raise RuntimeError("the answer's stream ended before its last event")
        return cls(last.text, last.tokens, last.stats, last.stop_reason, steps)


class Engine:
    """A frozen model, its prompt tokens and its decode plan; streams answers."""

    def __init__(self, loaded: LoadedModel, prompt_tokens: PromptTokens, plan: DecodePlan, max_context: int):
        self.loaded = loaded
        self.prompt_tokens = prompt_tokens
        self.plan = plan  # replaced whole (``replan``), never edited
        self.max_context = max_context
        self._kept: KeptCache | None = None
        self._snapshot: tuple[DecodePlan, int, ModelSnapshot] | None = None  # ``snapshot``'s, with its plan and threads
        self._plain = plain_family()
        self._prompt_table = prompt_tokens.table() if prompt_tokens.num_prompt_tokens else None  # [n * V, hidden]
        self._char_tokens: dict[str, int] | None = None  # the forced-text drafter's single-character tokens
        self._merger = Merger()  # the steps' merge: the tree shapes it built serve every answer
        self._drafter_memory: dict[str, object] = {}  # what guess sources keep across answers, by name
        self.drafters: tuple[str, ...] | None = None  # the guess sources beside the prompt tokens (None: the default)
        # what a step of r rows costs in plain steps, to size each step's tree by (``Draft.row_costs``); None: the
        # plan's curve where sources calibration does not price yet are on and no budget was asked for
        self.row_costs: tuple[float, ...] | None = None

    def _row_costs(self) -> tuple[float, ...] | None:
        """The costs each step's tree is sized by: ``row_costs`` if set; else, where a source beyond the default ones
        is on, the plan's curve, or with ``--tree N`` N rows at the cost of one (the tree fills them, the prompt
        tokens' rows weighed against other guesses); None: the default sources' calibrated sizes."""
        if self.row_costs is not None or not sized_per_step(self.drafters):
            return self.row_costs
        return self.plan.row_costs() if self.plan.budget is None else (1.0,) * (self.plan.budget + 1)

    @classmethod
    def load(cls, config: EngineConfig, progress: Progress | None = None) -> Engine:
        """Load the model and prompt tokens (``engine_load``), then give the plan its profile: the saved one, or a
        calibration now that ``progress`` hears (``settle_plan``). A failure frees the model first."""
        drafters = None if config.drafters is None else check_names(config.drafters)
        parts = load_parts(config, progress)
        try:
            plan = settle_plan(parts, config.tree, config.auto_calibrate, progress)
        except BaseException:  # nothing of a failed load stays in memory
            parts.loaded.backend.close()
            raise
        engine = cls(parts.loaded, parts.prompt_tokens, plan, parts.max_context)
        engine.drafters = drafters
        return engine

    def replan(self, profile: DeviceProfile | None | str = "same", **options) -> DecodePlan:
        """Decode with ``profile`` (None: none; "same": the plan's) and the ``PlanOptions`` fields in ``options``
        changed, e.g. ``replan(lookup=4)``, ``replan(tree=family)``, ``replan(profile, tree="auto")``."""
        plan = self.plan
        profile = plan.profile if profile == "same" else profile
        self.plan = make_plan(profile, replace(plan.options, **options), plan.guesses)
        return self.plan

    def snapshot(self) -> ModelSnapshot:
        """What the page, the API and the device panel show of this model, as it is now: taken once per plan (the
        plan is replaced whole) and thread count."""
        plan, threads = self.plan, self.threads
        kept = self._snapshot
        if kept is None or kept[0] is not plan or kept[1] != threads:
            kept = self._snapshot = (plan, threads, take_snapshot(self.loaded, self.prompt_tokens, plan, self.max_context))
        return kept[2]

    @property
    def threads(self) -> int:
        """CPU threads a step runs on: llama.cpp's, or torch's (process-wide)."""
        return thread_count(self.loaded)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def new_forced_text(self) -> ForcedText:
        """One answer's drafter of the text its grammar forces (``ppd_core.drafters.forced``)."""
        tokenizer = self.tokenizer

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        if self._char_tokens is None:
            self._char_tokens = char_tokens(encode)
        return ForcedText(self._char_tokens, encode, lambda token: self.token_bytes(token).decode(errors="replace"))

    def chat_ids(self, messages: Sequence[dict], **variables) -> list[int]:
        """Token ids of a conversation in the model's chat template, ready for the answer; ``variables`` (such as
        ``tools=[...]``) reach the template."""
        if not messages or not any(str(m.get("content", "")).strip() for m in messages if m.get("role") == "user"):
            raise PpdError("the message is empty")
        return chat_ids(self.tokenizer, messages, **variables)

    @property
    def chat_template(self) -> str:
        """The chat template's source ("" where the tokenizer names none)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else ""

    def completion_ids(self, text: str) -> list[int]:
        """Token ids of raw text to complete (a model without a chat template: ``ppd generate``)."""
        if not text.strip():
            raise PpdError("the text is empty")
        return self.tokenizer.encode(text, add_special_tokens=True)

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` adds to a text (a control token's own text): what API logprobs name it by."""
        return self.loaded.token_bytes(token)

    @property
    def has_chat_template(self) -> bool:
        """Whether the model brings its own chat template (else chats use ChatML, and say so)."""
        return self.loaded.template_note is None

    def _constraint(self, grammar: str):
        """The backend's grammar state for GBNF ``grammar``; a PpdError (one line) where it has no grammar engine."""
        return self.loaded.backend.grammar(grammar)

    def check(self, ids: Sequence[int], max_new_tokens: int | None = 256, *, mode: Mode = "ppd",
              sampling: SamplingParams = GREEDY, logprobs: int | None = None, grammar: str | None = None,
              chat: bool = False, reuse_cache: bool = False) -> AnswerRequest:
        """One answer's request, checked once for this model (``answer_request.check_answer``): ``ids`` fit the
        context (``max_new_tokens`` None: the rest of it), ``grammar`` (GBNF, a ``root`` rule) compiled and able to
        begin an answer. With ``chat`` (``ids`` are a chat in this model's template) the template's turn markers
        written as text end the answer; with ``reuse_cache`` the answer goes on from the last such answer's cache
        (multi-turn chat). A ``RequestError`` names the field at fault."""
        return check_answer(ids, max_new_tokens, self.max_context, mode=mode, sampling=sampling, logprobs=logprobs,
                            grammar=grammar, compile_grammar=self._constraint, chat=chat, reuse_cache=reuse_cache)

    def stream(self, request: AnswerRequest | Sequence[int], mode: Mode = "ppd", max_new_tokens: int = 256,
               guess_hook: decoding.GuessHook | None = None, **options) -> Generator[GenerationEvent, None, None]:
        """``answer`` a checked request, or ``check`` ``request`` (token ids), ``mode``, ``max_new_tokens`` and
        ``options`` first (a script's or a test's shorthand)."""
        if not isinstance(request, AnswerRequest):
            request = self.check(request, max_new_tokens, mode=mode, **options)
        return self.answer(request, guess_hook)

    def answer(self, request: AnswerRequest, guess_hook: decoding.GuessHook | None = None
               ) -> Generator[GenerationEvent, None, None]:
        """Yield the growing answer to ``request`` after every forward pass (the prompt's first).

        With ``request.reuse_cache`` the KV cache of the previous such answer is kept and only the tokens after its
        longest common prefix with the request's ids are prefilled. With ``request.logprobs`` each step's
        ``logprobs`` has its tokens' log-probabilities. ``guess_hook``: a test's view of each step's guesses.
        """
        plan, input_ids = self.plan, request.ids
        ppd = request.mode == "ppd" and not plan.guesses.plain_only
        family = plan.family if ppd else self._plain
        cache, reused, chains = self._take_cache(input_ids) if request.reuse_cache else (None, 0, None)
        stats = GenerationStats(prompt_tokens=len(input_ids), reused_tokens=reused)
        tokens: list[int] = []
        text = text_stream(self.tokenizer)  # incremental: O(new tokens) per step
        if not ppd:
            chains = None
        elif chains is None:  # a new conversation (a follow-up goes on with what its turns taught)
            chains = plan.new_chains()
        backend = self.loaded.backend
        constraint = request.grammar_state()  # this answer's: the request's compiled grammar stays as it was
        acceptance = plan.profile.acceptance if ppd and plan.profile is not None else None
        speculator = decoding.Speculator(backend, family, self._prompt_table, acceptance, self._merger,
                                         plan.budget if ppd else None,  # ``--tree N``: N rows a step in all
                                         self._row_costs() if ppd else None, eos_token_ids=self.loaded.eos_token_ids,
                                         pad_to=plan.padded_rows if ppd else None)  # the profile's step shape; plain: 1 row
        context = DraftContext(input_ids, chains, constraint, self.new_forced_text, plan.new_forced_chains,
                               backend.info.vocab_size, self._drafter_memory)
        answering = decoding.Answering(cache, reused, answer_drafters(context, self.drafters) if ppd else [],
                                       constraint, guess_hook)
        steps = decoding.generate(speculator, request, answering)
        ends = TurnEnd(turn_stops(self.tokenizer)) if request.chat else None
        try:
            yield from self._events(steps, stats, tokens, text, ends)
        except GeneratorExit:  # stopped by the consumer between steps: the cache is consistent
            if cache is not None:
                self._keep_cache(cache, list(input_ids) + tokens, chains)
            raise
        finally:
            steps.close()  # ended at a turn marker: the decoding ends between steps too
        if cache is not None:
            self._keep_cache(cache, list(input_ids) + tokens, chains)

    @staticmethod
    def _events(steps: Generator[StepStats, None, None], stats: GenerationStats, tokens: list[int], text,
                ends: TurnEnd | None) -> Iterator[GenerationEvent]:
        """``stream``'s events from the decoding's ``steps``, adding to ``stats``, ``tokens`` and ``text``; with
        ``ends`` (the stop texts' ``TurnEnd``; none are empty) a step is cut at the token completing one, the answer
        ends there, and the text shown holds back what may begin one."""
        shown = ""
        for step in steps:
            if ends is None or not ends.stops:
                delta = text.extend(step.tokens) + (text.flush() if step.stop else "")
                shown = text.text
            else:
                step.clip(ends.add(text, step.tokens, step.stop is not None))
                step.stop = "eos" if ends.hit else step.stop
                delta, shown = text.text[len(shown) : ends.shown], text.text[: ends.shown]
            stats.add(step)
            tokens.extend(step.tokens)
            yield GenerationEvent(shown, delta, list(tokens), step, stats, step.stop)
            if step.stop:
                return

    def close(self) -> None:
        """Give the model's memory back (before another model loads: one model in memory at a time)."""
        self._kept = None
        self._drafter_memory.clear()
        self.loaded.backend.close()
        self.loaded.release_model()
        gc.collect()
        release_free_heap()

    def forget_conversation(self) -> None:
        """Drop the cache kept for the next turn: the next answer processes its whole prompt."""
        self._kept = None

    def forget_answers(self) -> None:
        """The user deleted saved answers: every guess source's per-model memory that holds answers forgets them (those
        with a ``forget_answers()`` method, ``DraftContext.memory``); what holds no text stays. Safe beside an answer
        being written (which keeps what it already read)."""
        for memory in list(self._drafter_memory.values()):
            forget = getattr(memory, "forget_answers", None)
            if callable(forget):
                forget()

    def _take_cache(self, input_ids: Sequence[int]) -> tuple[object, int, ChainPolicy | None]:
        """The kept cache cut to its common prefix with ``input_ids`` (at least one token left to prefill), and the
        kept conversation's chain policy where ``input_ids`` goes on with that whole conversation (a follow-up)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return self.loaded.backend.new_cache(), 0, None
        common = 0
        for cached, new in zip(kept.ids, input_ids):
            if cached != new:
                break
            common += 1
        follow_up = common == len(kept.ids)
        common = min(common, len(input_ids) - 1)
        self.loaded.backend.truncate(kept.cache, common)
        return kept.cache, common, kept.chains if follow_up else None

    def _keep_cache(self, cache: object, ids: list[int], chains: ChainPolicy | None = None) -> None:
        """Keep ``cache`` (and the conversation's ``chains``) for the next turn, holding the keys and values of a
        prefix of ``ids``."""
        length = min(self.loaded.backend.cache_length(cache), len(ids))
        self.loaded.backend.truncate(cache, length)  # drops guesses accepted past a stop
        self._kept = KeptCache(cache, ids[:length], chains)

    def generate(self, request: AnswerRequest | Sequence[int], mode: Mode = "ppd", max_new_tokens: int = 256,
                 **options) -> GenerationResult:
        """Run ``stream`` to the end."""
        return GenerationResult.of(self.stream(request, mode, max_new_tokens, **options))
