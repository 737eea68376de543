"""What the page says, as text: the chat's messages, the marked answer, the notes and lines around the chat, the
saved conversations' labels, the calibration summary and the sampling widgets' labels."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

import gradio as gr

from app.highlight import GRAMMAR_MARK, LOOKUP_MARK, NEUTRAL_STYLE, PROMPT_MARK
from app.history import Conversation, ConversationStore
from app.model_catalog import DEFAULT_SPEC, size_words
from app.readout import duration
from ppd_core import ChosenSampling
from ppd_core.drafters.lookup import chains_text
from ppd_core.sampling.fields import FIELDS
from ppd_core.training.cost import TrainingCost

INTERRUPTED = "\n\n*(interrupted)*"  # shown after an answer that did not finish
LENGTH_LIMIT = "\n\n*(stopped at the length limit: Continue goes on from here)*"  # an answer cut at Max new tokens
LIMITED = "length_limit"  # a saved answer's mark: it ended at the length limit
STOPPED = "\n\n*(stopped)*"  # shown after an answer ended by Stop


def chat_messages(conversation: Conversation, streaming: bool = False) -> list[dict]:
    """The chat's messages for the page; an interrupted answer, or one cut at the length limit, says so (unless it is
    the one streaming), and one ended by Stop says it was stopped (the marks are the page's: the conversation and the
    model keep the text)."""
    shown = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
    for message, original in zip(shown, conversation.messages):
        if streaming and original is conversation.messages[-1]:
            continue
        if original.get("interrupted"):
            message["content"] += INTERRUPTED
        elif original.get(LIMITED):
            message["content"] += LENGTH_LIMIT
        elif original.get("stopped"):
            message["content"] += STOPPED
    return shown


MODEL_KEY = "model"  # a saved answer's model: the name of the model that wrote it


def switched_line(conversation: Conversation, model: str) -> str:
    """The line over the chat where the conversation's last answer came from another model than ``model`` (the one
    loaded now, which reads it all as its prompt); "" otherwise."""
    answered = next((m.get(MODEL_KEY) for m in reversed(conversation.messages) if m["role"] == "assistant"), None)
    if not answered or answered == model:
        return ""
    return (f"This conversation continues on **{model}**: its answers so far came from {answered}, and {model} reads "
            "them all as its prompt.")


def switch_panels(chat, line: str) -> dict:
    """Updates of the chat panel's ``switched`` line and its New chat button: shown with a line, hidden without."""
    return {chat.switched: gr.update(value=line, visible=bool(line)), chat.new_for_model: gr.update(visible=bool(line))}


def continuable(conversation: Conversation) -> bool:
    """Whether the conversation ends with an answer cut at the length limit (Continue is offered)."""
    return bool(conversation.messages) and bool(conversation.messages[-1].get(LIMITED))


def marked_answer(marked: str) -> str:
    """The answer with its accepted guesses marked (``Highlighter.html``) as the page shows it under the chat, its
    lines kept; "" when not asked for (nothing shown)."""
    if not marked:
        return ""
    legend = f'{PROMPT_MARK}prompt tokens</mark>, {LOOKUP_MARK}copied from the conversation</mark>'
    legend += f' and {GRAMMAR_MARK}forced by the JSON schema</mark>' if GRAMMAR_MARK in marked else ""
    legend += f' and <mark {NEUTRAL_STYLE}>other sources</mark> (hover for the name)' if NEUTRAL_STYLE in marked else ""
    return (f'<div class="ppd-marked"><p><b>Accepted guesses</b> in this answer: {legend}</p>'
            f'<div style="white-space: pre-wrap">{marked}</div></div>')


def model_note(model, spec: str) -> str:
    """The line above the chat: a model with no chat template (a base model) writes on from a chat rather than answer
    it; the embedded default is a tiny demo. "" for any other model."""
    if model.template_note:
        return (f"**{model.name} has no chat template** (a base model?): chats go to it as ChatML, and it may continue "
                "the text instead of answering. Load a chat (instruction-tuned) model to chat.")
    if spec == DEFAULT_SPEC:
        return (f"**{model.name}** is a tiny demo model: fast on any CPU, but its answers are simple. Load another "
                "in Model (a `.gguf` path or `hf:OWNER/REPO`).")
    return ""


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


SAMPLING_LABELS = {field.name: field.label for field in FIELDS}  # the sampling widgets' labels (``FIELDS``' order)
# the window's special values, behind the penalties' Details toggle
REPEAT_WINDOW_DETAILS = ("<details><summary>Details</summary>\n\nRepeat window: -1 looks at the whole conversation, 0 "
                         "turns the penalties off, N looks at the last N tokens (llama.cpp's `repeat_last_n`).\n\n"
                         "</details>")


def sampling_defaults(chosen: ChosenSampling) -> dict[str, dict]:
    """Updates of the sampling widgets (by ``SAMPLING_LABELS``' names) to the values a request leaving them unset gets,
    each label saying where its value came from (the model, ppd's measured default, llama-server's default)."""
    return {name: gr.update(value=chosen.values[name], label=f"{label} · {chosen.sources[name]}")
            for name, label in SAMPLING_LABELS.items()}


def chosen_label(name: str) -> str:
    return f"{SAMPLING_LABELS[name]} · your choice"


def spoken_time(stamp: float, now: float | None = None, seconds: bool = False) -> str:
    """When, as a person reads it: "today 18:49", "yesterday 09:12", "Nov 20" (this year), "Nov 20, 2023"; with
    ``seconds``, to the second (the day then with its time)."""
    when, today = datetime.fromtimestamp(stamp), datetime.fromtimestamp(time.time() if now is None else now).date()
    clock = f"{when:%H:%M:%S}" if seconds else f"{when:%H:%M}"
    days = (today - when.date()).days
    if days in (0, 1):
        return f"{'today' if days == 0 else 'yesterday'} {clock}"
    day = f"{when:%b} {when.day}" + ("" if when.year == today.year else f", {when.year}")
    return f"{day} {clock}" if seconds else day


def conversation_choices(store: ConversationStore, now: float | None = None, query: str = "") -> list[tuple[str, str]]:
    """(label, id), newest first: the title and when it was last written; labels that would read alike give the
    time to the second, and a number where even that repeats. With ``query``, only the conversations that hold it
    (case aside) in their title or a message."""
    conversations = [c for c in store.list() if holds(c, query)]
    labels = [f"{c.title} · {spoken_time(c.updated, now)}" for c in conversations]
    alike = Counter(labels)
    labels = [f"{c.title} · {spoken_time(c.updated, now, seconds=True)}" if alike[label] > 1 else label
              for c, label in zip(conversations, labels)]
    alike, numbered = Counter(labels), Counter()
    choices = []
    for conversation, label in zip(conversations, labels):
        if alike[label] > 1:
            numbered[label] += 1
            label = f"{label} ({numbered[label]})"
        choices.append((label, conversation.id))
    return choices


def holds(conversation: Conversation, query: str) -> bool:
    """Whether ``query`` (its words, in any order, case aside) is in the conversation's title or messages."""
    words = query.casefold().split()
    text = " ".join([conversation.title, *(m["content"] for m in conversation.messages)]).casefold()
    return all(word in text for word in words)


def exchange(messages: list[dict], index: int) -> tuple[int, int]:
    """(start, end) of the exchange holding message ``index``: its user message and the answers up to the next one."""
    start = index
    while start > 0 and messages[start]["role"] != "user":
        start -= 1
    end = start + 1
    while end < len(messages) and messages[end]["role"] != "user":
        end += 1
    return start, end


def quoted(text: str, chars: int = 40) -> str:
    text = " ".join(text.split())
    return f"“{text[:chars]}…”" if len(text) > chars else f"“{text}”"


def selection_line(messages: list[dict], index: int) -> str:
    """What the page says of a clicked message: which one, and that Delete takes its whole exchange."""
    question = messages[exchange(messages, index)[0]]
    if messages[index]["role"] == "user":
        return f"**Selected:** your message {quoted(question['content'])}; Delete removes it with its answer."
    about = f"the answer to {quoted(question['content'])}" if question["role"] == "user" else "this answer"
    return f"**Selected:** {about}; Delete removes it with its question."


SPEEDUP_FIGURE = r"\b\d+\.\d\dx\b"  # a speedup as the page writes it ("1.42x"): the readout's is the one shown


def calibration_summary(profile, tree_name: str = "") -> str:
    """The calibration panel: what calibration chose, in words, on one line; its forecasts (speedups for the chosen
    tree, alone and with chains) behind Details, named as forecasts: the page shows one speedup figure, the readout's
    estimate for the answer just given (Compare measures it)."""
    if profile is None:  # --tree auto decodes plainly until calibrated; a named static tree is used as asked
        return ("Not calibrated yet: decoding plainly until it is." if tree_name == "plain" else
                "Not calibrated yet: using a built-in tree.")
    chains = any(profile.lookup_lengths)
    trees = f"trees of up to {profile.budget} tokens" if profile.budget > 1 else ""
    chosen = " and ".join(filter(None, (trees, "copied chains" if chains else ""))) or "plain steps"
    return (  # two lines at most in the side column at 1400 px, the rest behind a toggle
        f"**Calibrated for this device:** {chosen}.\n\n"
        f"<details><summary>Details</summary>\n\nEach answer's speedup is under the chat. "
        f"Expected speedup, calibration's forecast for the chosen tree alone: "
        f"{profile.expected_speedup:.2f}x ({profile.expected_tokens_per_step:.2f} tokens per step expected)"
        f"{lookup_summary(profile)}. Trees of {', '.join(map(str, profile.tree_sizes))} tokens by guess depth. "
        f"Measured {profile.created}, took {profile.calibration_seconds:.0f} s.\n\n</details>"
    )


def lookup_summary(profile) -> str:
    """The calibrated lookup chains and what they are forecast to add, first turns and follow-ups apart."""
    if not any(profile.lookup_lengths):
        return ""
    parts = ", ".join(f"{name} {part['speedup']:.2f}x" for name, part in profile.expected_with_lookup_by_turn.items())
    return (f"; calibration's forecast with chains copied from the conversation ({chains_text(profile.lookup_lengths)}): "
            f"**{profile.expected_speedup_with_lookup:.2f}x**, "
            f"{profile.expected_tokens_per_step_with_lookup:.2f} tokens per step" + (f" ({parts})" if parts else ""))


def conversations(count: int) -> str:
    return f"{count:,} conversation{'' if count == 1 else 's'}"


def time_words(cost: TrainingCost) -> str:
    return f"about {duration(cost.seconds)}" if cost.seconds is not None else "time not measured yet"


def training_offer(name: str, quick: TrainingCost, full: TrainingCost) -> str:
    """What a training of ``name``'s PPD tokens costs, said before it starts: its size, its time at this device's
    measured speed, its memory and disk; and the smaller run."""
    if full.seconds is None:
        speed = ("How long it takes is not measured yet for this model here: calibrate this device (Calibration), or "
                 "ask something in a new chat, and this says it.")
    else:
        speed = (f"It takes **{time_words(full)}** at this device's speed (measured by {full.source}; the training's "
                 "own rate shows once it runs).")
    return (f"**Train PPD tokens for {name}?** The model answers {conversations(full.conversations)}, then learns "
            f"from its answers. {speed} It uses about {size_words(full.memory_bytes)} of memory while it runs and "
            f"{size_words(full.disk_bytes)} of disk.\n\nA quick run of {conversations(quick.conversations)} takes "
            f"{time_words(quick)} ({size_words(quick.disk_bytes)} of disk); its guesses are right less often. The chat "
            "stays usable meanwhile, and Stop keeps what is done.")


def training_choice(kind: str, cost: TrainingCost) -> str:
    """A start button's label: "Quick: 200 conversations, about 19 min"."""
    time = f", {time_words(cost)}" if cost.seconds is not None else ""
    return f"{kind}: {conversations(cost.conversations)}{time}"
