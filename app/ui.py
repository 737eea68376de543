"""The Gradio chat app: one builder per panel, wired to ``Handlers``; the work is in ``ChatService``.

Events that run the model start at once (Gradio's queue does not hold them back) and wait in
``ChatService``'s line for the model, which the API shares: two browser tabs chatting at once are
served one answer at a time, each with its own conversation (``gr.State(new_session)`` makes a new
session, with a new conversation id, for every page); a waiting page says how many answers are
ahead, and a full line is a one-line "busy" notice. Stop only sets a flag, so it runs at once; an
answer waiting its turn gives up its place, a running one ends after the decoding step in flight. A streamed answer reaches the page a few times a second, not once per step: the page's
rendering competes with the model for the same CPU cores.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import gradio as gr
import psutil

from app.calibration_progress import CompareProgress, followed
from app.chat_service import (DEFAULT_SPEC, GRAMMAR_MARK, LOOKUP_MARK, PENALTY_FIELDS, PROMPT_MARK, AnswerUpdate,
                               ChatService, ChatSettings)
from app.history import Conversation, ConversationStore
from app.model_catalog import available
from app.plots import COLUMNS, latency_points
from app.readout import SPEED_DEFINITION
from app.system_info import device_panel
from ppd_core.engine import ChosenSampling, chains_text, default_sampling
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

MODEL = dict(concurrency_limit=None)  # events that run the model: they queue in ChatService, not in Gradio
# The page's own status lines say what is going on; Gradio 6 draws its progress overlay and elapsed-time counter
# ("0.1s") on every output of a running event whatever ``show_progress`` says (gradio-app/gradio#12406): not on these.
OWN_LINES = ("startup", "device", "training", "model-note", "calibration", "verdict", "readout", "note", "context")
PAGE_STYLE = "<style>" + ", ".join(f'#{line} [data-testid="status-tracker"]' for line in OWN_LINES) + \
    " { display: none !important; }</style>"
UPDATE_SECONDS = 0.25  # how often a streamed answer is sent to the page
SAVE_SECONDS = 3.0  # how often the answer so far is saved while it streams
INTERRUPTED = "\n\n*(interrupted)*"  # shown after an answer that did not finish
EXPORT_PREFIX = "ppd-export-"
TRAIN, RESUME_TRAINING, STOP_TRAINING = "Train PPD tokens for this model", "Resume training", "Stop training"


@dataclass
class Session:
    """One page: its conversation, its stop flag, and whether its answer streams (Send is off meanwhile)."""

    conversation: Conversation = field(default_factory=Conversation)
    stop_requested: bool = False
    answering: bool = False
    chosen: set[str] = field(default_factory=set)  # sampling widgets set on this page: a model's defaults keep off them
    selected: tuple | None = None  # the message clicked in the chat: (index, role, content), checked before use


def new_session() -> Session:
    """``gr.State``'s initial value, called for every new page (a dataclass type would be taken for a value)."""
    return Session()


def export_folder(root: Path | None = None) -> Path:
    """A private folder for this process's exports, removed at exit; folders left by dead processes go now."""
    root = root or Path(tempfile.gettempdir())
    for old in root.glob(f"{EXPORT_PREFIX}*"):
        pid = old.name.removeprefix(EXPORT_PREFIX).split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = root / f"{EXPORT_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o700)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def chat_messages(conversation: Conversation, streaming: bool = False) -> list[dict]:
    """The chat's messages for the page; an interrupted answer says so (unless it is the one streaming)."""
    shown = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
    for message, original in zip(shown, conversation.messages):
        if original.get("interrupted") and not (streaming and original is conversation.messages[-1]):
            message["content"] += INTERRUPTED
    return shown


def marked_answer(marked: str) -> str:
    """The answer with its accepted guesses marked (``Highlighter.html``) as the page shows it under the chat, its
    lines kept; "" when not asked for (nothing shown)."""
    if not marked:
        return ""
    legend = f'{PROMPT_MARK}prompt tokens</mark>, {LOOKUP_MARK}copied from the conversation</mark>'
    legend += f' and {GRAMMAR_MARK}forced by the JSON schema</mark>' if GRAMMAR_MARK in marked else ""
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


TIMER = 5  # where the timer is in ``model_panels``' outputs (startup, Send, device, summary, curve, timer, ...)
SAMPLING_LABELS = {"temperature": "Temperature (0 = greedy)", "top_p": "Top-p", "top_k": "Top-k (0 = off)",
                   "repeat_penalty": "Repeat penalty (1 = off)",
                   "repeat_last_n": "Repeat window (the last N tokens; -1 = all, 0 = no penalties)",
                   "presence_penalty": "Presence penalty", "frequency_penalty": "Frequency penalty"}


def sampling_defaults(chosen: ChosenSampling) -> tuple:
    """Updates of the sampling widgets (``SAMPLING_LABELS``' order) to the values a request leaving them unset gets,
    each label saying where its value came from (the model, ppd's measured default, llama-server's default)."""
    return tuple(gr.update(value=chosen.values[name], label=f"{label} · {chosen.sources[name]}")
                 for name, label in SAMPLING_LABELS.items())


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


def conversation_choices(store: ConversationStore, now: float | None = None) -> list[tuple[str, str]]:
    """(label, id), newest first: the title and when it was last written; labels that would read alike give the
    time to the second, and a number where even that repeats."""
    conversations = store.list()
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


def calibration_summary(profile, tree_name: str = "") -> str:
    if profile is None:  # --tree auto decodes plainly until calibrated; a named static tree is used as asked
        return ("Not calibrated yet: decoding plainly until it is." if tree_name == "vanilla" else
                "Not calibrated yet: using a built-in tree.")
    chains = " (more with copied chains: Details)" if any(profile.lookup_lengths) else ""
    return (  # one line at 1400 px, the rest behind a toggle
        f"**Expected speedup {profile.expected_speedup:.2f}x** with {profile.budget} tokens per step "
        f"({profile.expected_tokens_per_step:.2f} expected){chains}.\n\n<details><summary>Details</summary>\n\n"
        f"Trees of {', '.join(map(str, profile.tree_sizes))} tokens by guess depth{lookup_summary(profile)}. "
        f"Measured {profile.created}, took {profile.calibration_seconds:.0f} s.\n\n</details>"
    )


def lookup_summary(profile) -> str:
    """The calibrated lookup chains and what they are expected to add, first turns and follow-ups apart."""
    if not any(profile.lookup_lengths):
        return ""
    parts = ", ".join(f"{name} {part['speedup']:.2f}x" for name, part in profile.expected_with_lookup_by_turn.items())
    return (f"; with chains copied from the conversation ({chains_text(profile.lookup_lengths)}): "
            f"**{profile.expected_speedup_with_lookup:.2f}x**, "
            f"{profile.expected_tokens_per_step_with_lookup:.2f} tokens per step" + (f" ({parts})" if parts else ""))


# ---- panels: components only ----


@dataclass
class ChatPanel:
    chatbot: gr.Chatbot
    message: gr.Textbox
    send: gr.Button
    stop: gr.Button
    regenerate: gr.Button
    clear: gr.Button
    readout: gr.Markdown
    note: gr.Markdown
    marked: gr.HTML  # the last answer with its accepted guesses marked (when asked): the chat itself stays plain text
    context: gr.Markdown  # the context meter: tokens the conversation takes of the model's context
    selection: gr.Row  # shown once a message is clicked: what it is, Delete, Answer again from here
    selected: gr.Markdown
    delete: gr.Button
    again: gr.Button


def chat_panel() -> ChatPanel:
    # the pencil on a user message edits it (answered again from there); the last answer has Retry and Undo; a click on
    # any message offers to delete it or answer again from it
    chatbot = gr.Chatbot(label="Chat · click a message to delete it or answer again from it", height=460,
                         elem_id="chat", sanitize_html=True, editable="user")
    with gr.Row():  # on a phone the buttons go under the box (its min_width), not beside a box 178 px wide
        message = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5, min_width=300,
                             elem_id="message")
        send = gr.Button("Send", variant="primary", scale=1, elem_id="send")
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop", visible=False)  # shown while an answer streams
    with gr.Row():
        regenerate = gr.Button("Regenerate", size="sm")
        clear = gr.Button("Clear", size="sm", elem_id="clear")
    with gr.Row(visible=False, elem_id="selection") as selection:
        selected = gr.Markdown("", elem_id="selected")
        delete = gr.Button("Delete", size="sm", variant="stop", scale=0, elem_id="delete-message")
        again = gr.Button("Answer again from here", size="sm", scale=0, elem_id="answer-again")
    context = gr.Markdown("", elem_id="context")
    readout = gr.Markdown("", elem_id="readout")
    note = gr.Markdown("", elem_id="note")
    marked = gr.HTML("", elem_id="marked")
    return ChatPanel(chatbot, message, send, stop, regenerate, clear, readout, note, marked, context, selection, selected,
                     delete, again)


@dataclass
class ModelPanel:
    choice: gr.Dropdown
    load: gr.Button
    training: gr.Markdown
    train: gr.Button


def model_panel() -> ModelPanel:
    with gr.Row():
        # the label one line at 1400 px; the ways to name a model in the line under it
        choice = gr.Dropdown([], label="Model, hf:OWNER/REPO or a local path",
                             info="A local .gguf file or model folder works too; hf:OWNER/REPO:FILE.gguf picks one file",
                             allow_custom_value=True, interactive=True, scale=4, elem_id="model")
        load = gr.Button("Load", scale=1, elem_id="load-model")
    with gr.Row():
        training = gr.Markdown("", elem_id="training")
        train = gr.Button(TRAIN, visible=False, size="sm", elem_id="train")  # or Resume, or Stop
    return ModelPanel(choice, load, training, train)


@dataclass
class SettingsPanel:
    system: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new: gr.Slider
    ppd: gr.Checkbox
    acceptance: gr.Radio
    highlight: gr.Checkbox
    top_k: gr.Slider
    greedy: gr.Button
    repeat_penalty: gr.Slider
    repeat_last_n: gr.Number
    presence_penalty: gr.Slider
    frequency_penalty: gr.Slider
    schema: gr.Textbox  # a JSON schema the answers follow; empty: free text

    @property
    def inputs(self) -> list:
        """In the order of ``ChatSettings``' fields."""
        return [self.system, self.temperature, self.top_p, self.max_new, self.ppd, self.acceptance, self.highlight,
                self.top_k, *self.penalties, self.schema]

    @property
    def penalties(self) -> list:
        return [self.repeat_penalty, self.repeat_last_n, self.presence_penalty, self.frequency_penalty]

    @property
    def sampling(self) -> list:
        """What a model's sampling defaults set (``SAMPLING_LABELS``' order)."""
        return [self.temperature, self.top_p, self.top_k, *self.penalties]


def settings_panel() -> SettingsPanel:
    """The answer settings, opening on what a request leaving them unset gets with no model recommendation (each
    model's own defaults replace them once it is loaded, ``sampling_defaults``)."""
    start = default_sampling({})
    sliders = {"temperature": (0.0, 2.0, 0.05), "top_p": (0.05, 1.0, 0.05), "top_k": (0, 200, 1),
               "repeat_penalty": (0.5, 2.0, 0.01), "presence_penalty": (-2.0, 2.0, 0.05),
               "frequency_penalty": (-2.0, 2.0, 0.05)}

    def slider(name: str, **options) -> gr.Slider:
        low, high, step = sliders[name]
        return gr.Slider(low, high, start.values[name], step=step, label=f"{SAMPLING_LABELS[name]} · {start.sources[name]}",
                         elem_id=name.replace("_", "-"), **options)

    with gr.Accordion("Settings", open=True):
        ppd = gr.Checkbox(True, label="PPD (parallel prompt decoding)", elem_id="ppd")
        highlight = gr.Checkbox(False, label="Highlight tokens from accepted guesses (yellow: prompt tokens, blue: copied "
                                "from the conversation, green: forced by the JSON schema)", elem_id="highlight")
        system = gr.Textbox("", label="System prompt", lines=2)
        with gr.Row():
            temperature = slider("temperature", scale=4)
            greedy = gr.Button("Greedy", size="sm", scale=1, elem_id="greedy")
        top_p, top_k = slider("top_p"), slider("top_k")
        max_new = gr.Slider(16, 1024, 256, step=16, label="Max new tokens")
        schema = gr.Textbox("", label="JSON schema: the answers follow it (empty: free text)", lines=3, max_lines=12,
                            placeholder='{"type": "object", "properties": {"name": {"type": "string"}}}',
                            elem_id="json-schema")
        with gr.Accordion("Repetition penalties (llama.cpp's)", open=False):
            repeat_penalty = slider("repeat_penalty")
            repeat_last_n = gr.Number(start.values["repeat_last_n"], precision=0, minimum=-1,
                                      label=f"{SAMPLING_LABELS['repeat_last_n']} · {start.sources['repeat_last_n']}",
                                      elem_id="repeat-last-n")
            presence_penalty, frequency_penalty = slider("presence_penalty"), slider("frequency_penalty")
        acceptance = gr.Radio(
            [("Lossless (exact model distribution)", "lossless"), ("Typical (faster, not distribution-preserving)", "typical")],
            value="lossless", label="Acceptance when sampling",
        )
    return SettingsPanel(system, temperature, top_p, max_new, ppd, acceptance, highlight, top_k, greedy,
                         repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, schema)


@dataclass
class HistoryPanel:
    saved: gr.Dropdown
    export_json: gr.Button
    export_md: gr.Button
    exported: gr.File


def history_panel() -> HistoryPanel:
    with gr.Accordion("Conversations", open=False):
        saved = gr.Dropdown([], label="Open a saved conversation", interactive=True, elem_id="saved")
        with gr.Row():
            export_json = gr.Button("Export JSON", size="sm")
            export_md = gr.Button("Export Markdown", size="sm")
        exported = gr.File(label="Export", interactive=False)
    return HistoryPanel(saved, export_json, export_md, exported)


def device_block() -> gr.Markdown:
    with gr.Accordion("Device", open=True):
        return gr.Markdown("", elem_id="device")


@dataclass
class CalibrationPanel:
    button: gr.Button
    summary: gr.Markdown
    curve: gr.LinePlot


def calibration_panel() -> CalibrationPanel:
    with gr.Accordion("Calibration", open=False):
        button = gr.Button("Calibrate for this device", elem_id="calibrate")
        summary = gr.Markdown("", elem_id="calibration")
        # whole tree sizes on an axis from 0 (the chosen size's line off the edge, also at 1 token); no legend title
        # ("series" said nothing): the labels say what each line is
        curve = gr.LinePlot(x=COLUMNS[0], y=COLUMNS[1], color=COLUMNS[2], label="Step latency against tree size",
                            x_axis_format="d", x_lim=[0, None], color_title=" ", elem_id="latency-curve")
    return CalibrationPanel(button, summary, curve)


@dataclass
class ComparePanel:
    button: gr.Button
    verdict: gr.Markdown
    plain: gr.Markdown
    ppd: gr.Markdown


def compare_panel() -> ComparePanel:
    """Under the chat: the readout estimates each answer's speedup, Compare measures it."""
    with gr.Accordion("Compare with plain decoding", open=True):
        button = gr.Button("Compare: answer the last message both ways, plain and PPD (greedy), and time them",
                           size="sm", elem_id="compare")
        verdict = gr.Markdown("", elem_id="verdict")
        with gr.Row():
            plain = gr.Markdown("", elem_id="plain-answer")
            ppd = gr.Markdown("", elem_id="ppd-answer")
    return ComparePanel(button, verdict, plain, ppd)


# ---- what the events do ----


class Handlers:
    """The event functions; each takes and returns the page's ``Session``."""

    def __init__(self, service: ChatService, store: ConversationStore):
        self.service = service
        self.store = store
        self._export_dir: Path | None = None  # made on the first export
        self._restored = False  # the first page after launch with none of its own reopens the latest conversation
        self._shown_model = None  # the engine whose sampling and name the pages were last given
        self._answers = threading.Lock()  # marks a page answering, one at a time

    def load(self, session: Session, page_conversation: str | None = None):
        """A page opens: the conversation it had before a reload (``page_conversation``, kept by the browser), else on the
        first page after launch the latest one, else a new one. Outputs: session, chat, system prompt, saved list,
        context meter, the page's conversation id, then ``model_panels``."""
        opened = self._saved(page_conversation)
        if opened is None and not self._restored:
            opened = next(iter(self.store.list()), None)
        self._restored = True
        if opened is not None:
            session.conversation = opened
        conversation = session.conversation
        return (session, chat_messages(conversation), conversation.system_prompt,
                gr.update(choices=conversation_choices(self.store), value=None), self.context(conversation),
                conversation.id, *self.model_panels(fresh_page=True))

    def _saved(self, conversation_id: str | None) -> Conversation | None:
        """The saved conversation ``conversation_id``; None where there is none (never saved, deleted, unreadable)."""
        if not conversation_id or not isinstance(conversation_id, str):
            return None
        try:
            return self.store.load(conversation_id)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def context(self, conversation: Conversation, system: str | None = None) -> str:
        """The context meter: the tokens the conversation takes of the model's context, counted with the model's own
        template, system prompt (``system``, default the conversation's) included; "" while no model is ready."""
        if not self.service.ready:
            return ""
        engine = self.service.engine
        system = conversation.system_prompt if system is None else system
        turns = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
        try:
            used = len(engine.chat_ids(([{"role": "system", "content": system}] if system.strip() else []) + turns))
        except PpdError:  # nothing asked yet: nothing is in the context
            used = 0
        limit = engine.max_context
        over = ": the earliest turns are left out" if used > limit else ""
        return f"Context: {used:,} of {limit:,} tokens ({used / limit:.0%}){over}"

    def model_panels(self, fresh_page: bool = False) -> tuple:
        """(startup line, Send, device panel, calibration summary, latency plot, timer, the sampling widgets
        (``SAMPLING_LABELS``), model picker, training line, training button, the note above the chat): what depends on
        the model. While it loads: its progress, Send
        off, and the timer on so the page keeps asking; once ready, the model's sampling defaults (its recommendation,
        else ppd's and llama-server's, each widget naming its source) and the
        models to switch to: set on a fresh page and once per newly loaded model, never over the user's choices on the
        timer's later ticks (while a training runs, say)."""
        service = self.service
        if not service.ready:  # loading; or no model could load: the line says so and the picker opens
            failed = service.startup.error is not None and not service.switching
            return (f"**{service.startup.line()}**", gr.update(interactive=False),
                    "No model is loaded." if failed else "The model is loading.", gr.update(), gr.update(),
                    gr.Timer(active=not failed), *(gr.update(),) * len(SAMPLING_LABELS), gr.update(interactive=failed),
                    gr.update(), gr.update(interactive=False), "")
        engine, model = service.engine, service.snapshot()
        training, train, training_running = self.training_panel()
        new_model, self._shown_model = self._shown_model is not engine, engine
        if fresh_page or new_model:
            sampling = sampling_defaults(model.sampling_defaults)
            picker = gr.update(choices=available(service.spec), value=service.spec, interactive=True)
        else:
            sampling, picker = (gr.update(),) * len(SAMPLING_LABELS), gr.update(interactive=True)
        return (service.switch_note or (f"*{service.background}*" if service.background else ""),
                gr.update(interactive=True), device_panel(model), calibration_summary(model.profile, model.tree["name"]),
                latency_points(model.profile) if model.profile else None,
                gr.Timer(active=service.switching or training_running or service.background is not None), *sampling,
                picker, training, train, model_note(model, service.spec))

    def training_panel(self) -> tuple:
        """(status line, train button, whether a training runs): the offer to train PPD tokens for a model that has
        none, a running training's progress, a stopped one's resume; a finished one loads its tokens (recalibrating)."""
        service = self.service
        job, has_tokens = service.training(), service.snapshot().prompt_tokens.count > 0
        status = job.status()
        # trained while this app ran (its own trainer or an adopted one): load the new tokens (the engine finds them) and
        # calibrate them, once for every page
        if status.state == "done" and job.ran and service.apply_training(job):
            return "Training finished: loading the new PPD tokens…", gr.update(visible=False), True
        if status.state == "running":  # this app's trainer, or one adopted from an earlier app: either can be stopped
            return status.line, training_button(STOP_TRAINING, variant="stop"), True
        if status.state == "stopping":  # Resume once the trainer is gone
            return status.line, gr.update(visible=True, value=STOP_TRAINING, variant="stop", interactive=False), True
        if status.state in ("stopped", "failed"):
            return status.line, training_button(RESUME_TRAINING), False
        if has_tokens:
            return "", gr.update(visible=False), False
        return ("No PPD tokens yet: guesses come from the conversation alone.", training_button(TRAIN),
                False)  # two lines at most beside the button

    def training_button(self, label: str | None):
        """The training button clicked: ``label`` is what it said (Stop while a training ran), so a click never
        does what the page did not show. The page's timer is left on: clicks are answered concurrently (a Stop waits
        for its trainer to end), so an answer can arrive after a later one, and the next tick puts the page right."""
        panels = self.stop_training() if label == STOP_TRAINING else self.train()
        return *panels[:TIMER], gr.Timer(active=True), *panels[TIMER + 1:]

    def train(self):
        """Start (or resume) training PPD tokens for the loaded model in a background process."""
        try:
            self.service.training().start()
        except (PpdError, OSError) as error:
            gr.Warning(one_line(error))
        return self.model_panels()

    def stop_training(self):
        """Stop the model's training where it is (resumable; an adopted trainer too); the panel then offers Resume."""
        if self.service.ready:
            self.service.training().stop()
        return self.model_panels()

    def switch_model(self, spec: str):
        """Load another model in the background; the page follows its progress (the timer) until it is ready."""
        spec = (spec or "").strip()
        service = self.service
        if not spec or (spec == service.spec and service.ready):
            return self.model_panels()
        try:
            service.queue.check_room()
            service.start_switch(spec)  # one at a time: another model asked for meanwhile is one line
        except PpdError as error:
            gr.Warning(str(error))
        return self.model_panels()

    def device(self) -> str:
        return device_panel(self.service.snapshot()) if self.service.ready else gr.update()

    def _respond(self, session: Session, updates: Iterator[AnswerUpdate]):
        """Stream ``updates`` (``ChatService.answer`` for the conversation's last user message); yields
        (chat, readout, note, the marked answer), the first at once: the message taken.

        The user's message is saved before decoding starts and the answer so far every ``SAVE_SECONDS``
        (marked interrupted until it ends), so a crash loses neither. Any error keeps both, marks the
        partial answer interrupted, saves, and shows one line.
        """
        conversation = session.conversation
        answer = {"role": "assistant", "content": "", "interrupted": True}
        self._save(conversation)
        yield chat_messages(conversation) + [{"role": "assistant", "content": ""}], gr.update(), "", ""
        update, sent, saved, ahead = None, 0.0, time.monotonic(), 0
        try:
            for update in updates:
                if update.queued:  # waiting for the model: say so when the number of answers ahead changes
                    if update.queued != ahead:
                        ahead = update.queued
                        yield (chat_messages(conversation) + [{"role": "assistant", "content": ""}], gr.update(), update.note,
                               gr.update())
                    continue
                answer["content"] = update.text
                if update.text and conversation.messages[-1] is not answer:
                    conversation.messages.append(answer)
                if update.stop_reason is None and time.monotonic() - saved >= SAVE_SECONDS:
                    saved = self._save(conversation)
                if update.stop_reason is None and time.monotonic() - sent < UPDATE_SECONDS:
                    continue  # coalesced: the page gets a few updates a second
                sent = time.monotonic()
                shown = chat_messages(conversation, streaming=True)
                if conversation.messages[-1] is not answer and update.stop_reason is None:
                    shown.append({"role": "assistant", "content": ""})
                yield shown, update.readout or gr.update(), update.note, marked_answer(update.marked)
        except Exception as error:  # noqa: BLE001 - whatever failed, the conversation is kept and saved
            line = str(error) if isinstance(error, PpdError) else f"The answer was interrupted: {one_line(error)}"
            if not isinstance(error, PpdError):
                log.exception("answering failed")
            gr.Warning(line)
            self._save(conversation)
            yield chat_messages(conversation), gr.update(), line, gr.update()
            return
        if update is not None and update.stats is not None:  # finished or stopped by the user: a whole answer
            del answer["interrupted"]
            if conversation.messages[-1] is not answer:
                conversation.messages.append(answer)
        self._save(conversation)

    def _start(self, session: Session, messages: list[dict], settings: ChatSettings) -> Iterator[AnswerUpdate]:
        """The answer's updates; a refusal (too long, the line full) raises PpdError before anything changes."""
        session.stop_requested = False  # a Stop pressed from here on counts, also while the answer waits its turn
        session.conversation.system_prompt = settings.system_prompt
        return self.service.answer(messages, settings, stop=lambda: session.stop_requested)

    def _save(self, conversation: Conversation) -> float:
        """Save; a failed write is one line on the page and in the log (the next save retries the same file)."""
        try:
            self.store.save(conversation)
        except OSError as error:
            line = f"Could not save the conversation ({one_line(error)}); it is kept on this page and saved again later."
            log.warning(line)
            gr.Warning(line)
        return time.monotonic()

    def _begin_answer(self, session: Session) -> bool:
        """Mark the page answering; False while its answer streams already (a second send does nothing)."""
        with self._answers:
            if session.answering:
                return False
            session.answering = True
            return True

    def page_panels(self, session: Session, panels: tuple) -> tuple:
        """``model_panels``' outputs for one page: its Send stays off while its own answer streams, and the sampling
        values its user set stay as set when another model's defaults come."""
        panels = list(panels)
        if session.answering:
            panels[1] = gr.update(interactive=False)
        for index, name in enumerate(SAMPLING_LABELS, start=TIMER + 1):
            if name in session.chosen and panels[index].get("value") is not None:
                panels[index] = gr.update(label=chosen_label(name))
        return tuple(panels)

    def choose(self, name: str, session: Session):
        """The user set sampling widget ``name``: its label says so, and a model loaded later leaves it as set."""
        session.chosen.add(name)
        return session, gr.update(label=chosen_label(name))

    def send(self, message: str, session: Session, *settings):
        """Answer ``message``; outputs: chat, message box, readout, note, session, saved list, Send, Stop, marked answer,
        context meter, the page's conversation id. While the answer streams, Send is off and Stop shown, and another
        send from the page does nothing: its text stays in the box, which is emptied once, when the message is taken."""
        keep = gr.update
        if not message or not message.strip():
            gr.Warning("Please type a message first.")
            yield keep(), keep(), keep(), "Please type a message first.", session, keep(), keep(), keep(), keep(), keep(), keep()
            return
        if not self._begin_answer(session):
            yield keep(), keep(), keep(), keep(), session, keep(), keep(), keep(), keep(), keep(), keep()
            return
        try:
            conversation = session.conversation
            asked = conversation.messages + [{"role": "user", "content": message}]
            try:  # a refused message (too long, ppd busy) stays in the textbox and out of the conversation
                updates = self._start(session, asked, ChatSettings(*settings))
            except PpdError as error:
                gr.Warning(str(error))
                yield keep(), keep(), keep(), str(error), session, keep(), keep(), keep(), keep(), keep(), keep()
                return
            conversation.messages.append(asked[-1])
            shown_updates = self._respond(session, updates)
            shown, readout, note, marked = next(shown_updates)  # taken and saved: a reload from here shows it
            yield shown, "", readout, note, session, keep(), *answering(), marked, keep(), conversation.id
            for shown, readout, note, marked in shown_updates:
                yield shown, keep(), readout, note, session, keep(), keep(), keep(), marked, keep(), keep()
        finally:
            session.answering = False
        yield (keep(), keep(), keep(), keep(), session, keep(choices=conversation_choices(self.store)), *answered(), keep(),
               self.context(conversation), conversation.id)  # a save may have given it a new id

    def regenerate(self, session: Session, *settings):
        """The last user message answered again (the Regenerate button, the last answer's Retry icon); outputs: chat,
        readout, note, session, Send, Stop, marked answer, context meter, the page's conversation id (as ``send``)."""

        def last_question(messages: list[dict]) -> list[dict]:
            return messages[:-1] if messages and messages[-1]["role"] == "assistant" else messages

        yield from self._answer_again(session, settings, last_question, "Nothing to regenerate yet.")

    def edit(self, edited: gr.EditData, session: Session, *settings):
        """A sent message edited on the page (the pencil): the conversation after it goes, and it is answered again as
        edited; outputs as ``regenerate``. Refused (busy, too long, empty), the page shows the conversation as it was."""
        index, text = edited.index, edited.value if isinstance(edited.value, str) else ""

        def cut(messages: list[dict]) -> list[dict]:
            if not (isinstance(index, int) and 0 <= index < len(messages)) or messages[index]["role"] != "user":
                return []
            return messages[:index] + [{"role": "user", "content": text}] if text.strip() else []

        yield from self._answer_again(session, settings, cut, "A message cannot be empty.", restore=True)

    def again(self, session: Session, *settings):
        """Answer again from the clicked message (the question it is, or the one it answers); outputs as
        ``regenerate``."""
        index = self._selected(session)

        def cut(messages: list[dict]) -> list[dict]:
            start = exchange(messages, index)[0] if index is not None else 0
            return messages[:start + 1] if index is not None and messages[start]["role"] == "user" else []

        yield from self._answer_again(session, settings, cut, "Click a message in the chat first.")

    def _answer_again(self, session: Session, settings: tuple, cut: Callable[[list[dict]], list[dict]], empty: str,
                      restore: bool = False):
        """Answer ``cut(the conversation's messages)`` (ending with the user message to answer; [] says ``empty``):
        it replaces the conversation once the answer is taken, so a refusal keeps it (``restore``: the chat is shown
        again, for an edit the page made itself). Outputs as ``regenerate``."""
        keep = gr.update
        shown = (lambda: chat_messages(session.conversation)) if restore else keep
        if not self._begin_answer(session):
            yield shown(), keep(), keep(), session, keep(), keep(), keep(), keep(), keep()
            return
        try:
            messages = cut(list(session.conversation.messages))
            if not messages:
                gr.Warning(empty)
                yield shown(), keep(), empty, session, keep(), keep(), keep(), keep(), keep()
                return
            try:  # a refused prompt keeps the conversation as it was
                updates = self._start(session, messages, ChatSettings(*settings))
            except PpdError as error:
                gr.Warning(str(error))
                yield shown(), keep(), str(error), session, keep(), keep(), keep(), keep(), keep()
                return
            session.conversation.messages[:] = messages
            shown_updates = self._respond(session, updates)
            chat, readout, note, marked = next(shown_updates)  # taken and saved
            yield chat, readout, note, session, *answering(), marked, keep(), session.conversation.id
            for chat, readout, note, marked in shown_updates:
                yield chat, readout, note, session, keep(), keep(), marked, keep(), keep()
        finally:
            session.answering = False
        yield (keep(), keep(), keep(), session, *answered(), keep(), self.context(session.conversation),
               session.conversation.id)

    def select(self, clicked: gr.SelectData, session: Session):
        """A message clicked: the page offers to delete it or answer again from it; outputs: session, the selection
        row, its line."""
        messages, index = session.conversation.messages, clicked.index
        index = index[0] if isinstance(index, (list, tuple)) and index else index
        if not (isinstance(index, int) and 0 <= index < len(messages)):
            session.selected = None
            return session, gr.update(visible=False), ""
        session.selected = (index, messages[index]["role"], messages[index]["content"])
        return session, gr.update(visible=True), selection_line(messages, index)

    def _selected(self, session: Session) -> int | None:
        """The clicked message's index, if the conversation still holds it there (else None: it changed since)."""
        if session.selected is None:
            return None
        index, role, content = session.selected
        messages = session.conversation.messages
        ok = index < len(messages) and (messages[index]["role"], messages[index]["content"]) == (role, content)
        return index if ok else None

    def delete(self, session: Session):
        """Delete the clicked message with the rest of its exchange (a question with its answer, an answer with its
        question), so the turns still alternate and the model sees what the page shows; outputs: chat, note, session,
        saved list, selection row, context meter, the page's conversation id."""
        keep = gr.update
        index = self._selected(session)
        if session.answering or index is None:
            line = "Wait for the answer to end." if session.answering else "Click a message in the chat first."
            return keep(), line, session, keep(), gr.update(visible=False), keep(), keep()
        self._remove(session, index)
        conversation = session.conversation
        return (chat_messages(conversation), "", session, keep(choices=conversation_choices(self.store)),
                gr.update(visible=False), self.context(conversation), conversation.id)

    def undo(self, session: Session):
        """The last answer's Undo icon: its exchange removed and the question put back in the box, to change and send
        again; outputs: chat, message box, note, session, saved list, context meter, the page's conversation id."""
        keep = gr.update
        messages = session.conversation.messages
        questions = [i for i, message in enumerate(messages) if message["role"] == "user"]
        if session.answering or not questions:
            return chat_messages(session.conversation), keep(), keep(), session, keep(), keep(), keep()
        text = messages[questions[-1]]["content"]
        self._remove(session, questions[-1])
        conversation = session.conversation
        return (chat_messages(conversation), text, "", session, keep(choices=conversation_choices(self.store)),
                self.context(conversation), conversation.id)

    def _remove(self, session: Session, index: int) -> None:
        """Remove the exchange holding message ``index`` and save; a conversation left empty is deleted from disk."""
        conversation = session.conversation
        start, end = exchange(conversation.messages, index)
        del conversation.messages[start:end]
        session.selected = None
        if conversation.messages:
            self._save(conversation)
        else:
            self.store.delete(conversation.id)

    def stop(self, session: Session):
        session.stop_requested = True
        return session

    def clear(self, session: Session):
        """A new conversation, with a new id; the old one stays saved. Outputs: session, chat, readout, note, saved
        list, context meter, the page's conversation id."""
        session.conversation = Conversation(system_prompt=session.conversation.system_prompt)
        session.selected = None
        return session, [], "", "", gr.update(value=None), self.context(session.conversation), session.conversation.id

    def open(self, conversation_id: str, session: Session):
        """A saved conversation opened; outputs: session, chat, system prompt, context meter, the page's conversation
        id."""
        if not conversation_id:
            return session, gr.update(), gr.update(), gr.update(), gr.update()
        session.conversation = self.store.load(conversation_id)
        session.selected = None
        conversation = session.conversation
        return session, chat_messages(conversation), conversation.system_prompt, self.context(conversation), conversation.id

    def export(self, kind: str, session: Session):
        if not session.conversation.messages:
            gr.Warning("The conversation is empty.")
            return None
        self._export_dir = self._export_dir or export_folder()
        return str(self.store.export(session.conversation, kind, self._export_dir))

    def compare(self, session: Session, system: str, max_new: int, *penalties_and_schema):
        """Compare the last user message both ways; the inputs after ``max_new``: the repetition penalties
        (``PENALTY_FIELDS``), then the JSON schema box (each left out: its default). Yields (plain answer, PPD answer,
        verdict): the verdict line shows the progress (which way, tokens so far) until the verdict in words."""
        messages = list(session.conversation.messages)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            gr.Warning("Send a message first, then compare.")
            yield gr.update(), gr.update(), "Send a message first, then compare."
            return
        settings = ChatSettings(system, max_new_tokens=int(max_new),
                                **dict(zip((*PENALTY_FIELDS, "schema"), penalties_and_schema)))
        lines = followed(lambda progress: self.service.compare(messages, settings, progress), CompareProgress())
        try:
            yield "", "", next(lines)  # the last comparison's answers go: this one's come
            while True:
                yield gr.update(), gr.update(), next(lines)
        except StopIteration as end:
            result = end.value
        except PpdError as error:  # too long, ppd busy, a box it cannot use: one line
            gr.Warning(str(error))
            yield gr.update(), gr.update(), str(error)
            return
        plain, ppd = result.vanilla_stats, result.ppd_stats
        yield (f"**Plain decoding** · {plain.tok_s:.1f} tokens/s · {plain.seconds:.2f} s\n\n{result.vanilla_text}",
               f"**PPD** · {ppd.tok_s:.1f} tokens/s · {ppd.seconds:.2f} s\n\n{result.ppd_text}",
               result.verdict())

    def calibrate(self):
        """Calibrate for this device; outputs: latency plot, summary, device panel. The summary's place says what runs,
        with numbers, from the click on (``followed``), then shows the new summary."""
        lines = followed(self.service.calibrate)
        try:
            while True:
                yield gr.update(), next(lines), gr.update()
        except StopIteration as end:
            profile = end.value
        except PpdError as error:  # ppd busy
            gr.Warning(str(error))
            yield gr.update(), str(error), gr.update()
            return
        yield latency_points(profile), calibration_summary(profile), device_panel(self.service.snapshot())


def training_button(label: str, variant: str = "secondary") -> dict:
    """The training button's update: shown, clickable, saying ``label``."""
    return gr.update(visible=True, value=label, variant=variant, interactive=True)


def answering() -> tuple:
    """(Send, Stop) while a page's answer streams."""
    return gr.update(interactive=False), gr.update(visible=True)


def answered() -> tuple:
    """(Send, Stop) once it has ended (a model loading meanwhile turns Send off on the page's next tick)."""
    return gr.update(interactive=True), gr.update(visible=False)


# ---- wiring ----


def wire_chat(handlers: Handlers, session: gr.State, chat: ChatPanel, settings: SettingsPanel, history: HistoryPanel,
              device: gr.Markdown, page: gr.BrowserState) -> None:
    """``page``: the browser's copy of the page's conversation id, set whenever it changes (a reload reopens it)."""
    outputs = [chat.chatbot, chat.message, chat.readout, chat.note, session, history.saved, chat.send, chat.stop, chat.marked,
               chat.context, page]
    # Enter and Send are one event: while its answer streams the page does not send it again (trigger_mode "once");
    # ``Handlers.send`` also ignores a send from a page whose answer streams (one started by Regenerate)
    gr.on([chat.message.submit, chat.send.click], handlers.send, [chat.message, session, *settings.inputs], outputs,
          **MODEL, api_name="send", trigger_mode="once").then(handlers.device, None, device, api_name=False)
    again = [chat.chatbot, chat.readout, chat.note, session, chat.send, chat.stop, chat.marked, chat.context, page]
    # the Regenerate button and the last answer's Retry icon are one action
    gr.on([chat.regenerate.click, chat.chatbot.retry], handlers.regenerate, [session, *settings.inputs], again, **MODEL,
          api_name=False, trigger_mode="once")
    chat.chatbot.edit(handlers.edit, [session, *settings.inputs], again, **MODEL, api_name=False)
    chat.again.click(handlers.again, [session, *settings.inputs], again, **MODEL, api_name=False)
    chat.chatbot.undo(handlers.undo, [session],
                      [chat.chatbot, chat.message, chat.note, session, history.saved, chat.context, page], api_name=False)
    chat.chatbot.select(handlers.select, [session], [session, chat.selection, chat.selected], queue=False, api_name=False)
    chat.delete.click(handlers.delete, [session],
                      [chat.chatbot, chat.note, session, history.saved, chat.selection, chat.context, page], api_name=False)
    # whatever changes the conversation puts the offer for a clicked message away (its index would point elsewhere)
    gr.on([chat.send.click, chat.message.submit, chat.regenerate.click, chat.chatbot.retry, chat.chatbot.edit,
           chat.chatbot.undo, chat.again.click, chat.clear.click, chat.chatbot.clear, history.saved.change],
          lambda: gr.update(visible=False), None, chat.selection, queue=False, api_name=False)
    settings.system.blur(lambda page_session, system: handlers.context(page_session.conversation, system),
                         [session, settings.system], chat.context, queue=False, api_name=False)
    chat.stop.click(handlers.stop, [session], [session], queue=False, api_name=False)
    # the chat's own trash icon is the Clear button: a new conversation (else it only emptied the display, and the
    # next message brought the cleared turns back, to the page and to the model)
    gr.on([chat.clear.click, chat.chatbot.clear], handlers.clear, [session],
          [session, chat.chatbot, chat.readout, chat.note, history.saved, chat.context, page], api_name=False)


def wire_sampling(handlers: Handlers, session: gr.State, settings: SettingsPanel) -> None:
    """A sampling widget the user sets (Greedy sets the temperature) is the user's choice, said in its label."""
    for name, widget in zip(SAMPLING_LABELS, settings.sampling):
        widget.input(lambda page, name=name: handlers.choose(name, page), [session], [session, widget], queue=False,
                     api_name=False, show_progress="hidden")
    def greedy(page: Session):  # one click to greedy
        page, label = handlers.choose("temperature", page)
        return page, {**label, "value": 0.0}

    settings.greedy.click(greedy, [session], [session, settings.temperature], queue=False, api_name=False,
                          show_progress="hidden")


def wire_history(handlers: Handlers, session: gr.State, chat: ChatPanel, settings: SettingsPanel, history: HistoryPanel,
                 page: gr.BrowserState) -> None:
    history.saved.change(handlers.open, [history.saved, session],
                         [session, chat.chatbot, settings.system, chat.context, page], api_name=False)
    history.export_json.click(lambda s: handlers.export("json", s), [session], [history.exported], api_name=False)
    history.export_md.click(lambda s: handlers.export("md", s), [session], [history.exported], api_name=False)


def build_app(service: ChatService, store: ConversationStore | None = None) -> gr.Blocks:
    handlers = Handlers(service, store or ConversationStore())
    with gr.Blocks(title="ppd chat") as app:
        session = gr.State(new_session)  # called for every new page: its own conversation and id
        # the page's conversation id in the browser (its own per browser profile), so that a reload reopens it
        page = gr.BrowserState(None, storage_key="ppd-conversation")
        gr.HTML(PAGE_STYLE, container=False, padding=False)  # in the page itself: `launch` and `mount_gradio_app` alike
        gr.Markdown(f"## ppd · local chat with Parallel Prompt Decoding\nSpeeds are {SPEED_DEFINITION}.")
        startup = gr.Markdown("", elem_id="startup")  # the model's loading progress, until it is ready
        timer = gr.Timer(1.0, active=False)
        with gr.Row():
            with gr.Column(scale=3):
                model_note = gr.Markdown("", elem_id="model-note")  # what this model is, where that matters to a chat
                chat = chat_panel()
                compare = compare_panel()
            with gr.Column(scale=2):
                model = model_panel()
                settings = settings_panel()
                history = history_panel()
                device = device_block()
                calibration = calibration_panel()

        model_panels = [startup, chat.send, device, calibration.summary, calibration.curve, timer, *settings.sampling,
                        model.choice, model.training, model.train, model_note]
        app.load(handlers.load, [session, page],
                 [session, chat.chatbot, settings.system, history.saved, chat.context, page, *model_panels])
        # the context meter once the model is ready (or another one is): the startup line changes then
        startup.change(lambda page_session, system: handlers.context(page_session.conversation, system),
                       [session, settings.system], chat.context, queue=False, api_name=False)
        # each page's Send stays off while its own answer streams (``Handlers.page_panels``)
        # the page's own lines say what is going on: no Gradio timers flashing inside them
        timer.tick(lambda page: handlers.page_panels(page, handlers.model_panels()), [session], model_panels,
                   queue=False, api_name=False, show_progress="hidden")
        model.load.click(lambda spec, page: handlers.page_panels(page, handlers.switch_model(spec)), [model.choice, session],
                         model_panels, queue=False, api_name=False, show_progress="hidden")
        # the button's label says what the click does: train, resume, or stop the training
        model.train.click(lambda label, page: handlers.page_panels(page, handlers.training_button(label)),
                          [model.train, session], model_panels, queue=False, api_name=False, show_progress="hidden")
        wire_chat(handlers, session, chat, settings, history, device, page)
        wire_sampling(handlers, session, settings)
        wire_history(handlers, session, chat, settings, history, page)
        compare.button.click(handlers.compare,
                             [session, settings.system, settings.max_new, *settings.penalties, settings.schema],
                             [compare.plain, compare.ppd, compare.verdict],
                             **MODEL, api_name="compare", show_progress="hidden")  # the verdict line says how far
        calibration.button.click(handlers.calibrate, None, [calibration.curve, calibration.summary, device],
                                 **MODEL, api_name="calibrate", show_progress="hidden")  # the summary's place says it
    app.queue(default_concurrency_limit=1)
    return app
