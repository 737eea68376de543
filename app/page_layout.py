"""The page's components, panel by panel, and the page's own state (``Session``); no events here (``app/ui.py``
wires them)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import gradio as gr

from app.history import Conversation, Unfinished
from app.page_text import REPEAT_WINDOW_DETAILS
from app.plots import COLUMNS
from app.readout import SPEED_DEFINITION
from ppd_core import ChosenSampling
from ppd_core.sampling.fields import BY_NAME, FIELDS, NAMES, PENALTIES, SamplingField
from ppd_core.sampling.params import default_sampling


# The page's own status lines say what is going on; Gradio 6 draws its progress overlay and elapsed-time counter
# ("0.1s") on every output of a running event whatever ``show_progress`` says (gradio-app/gradio#12406): not on these.
OWN_LINES = ("startup", "device", "training", "train-cost", "model-note", "calibration", "verdict", "readout", "note",
             "context", "switched", "api", "saved")
PAGE_STYLE = "<style>" + ", ".join(f'#{line} [data-testid="status-tracker"]' for line in OWN_LINES) + \
    " { display: none !important; }" + \
    " #saved .wrap { flex-direction: column; align-items: stretch; } #saved label { width: 100%; }</style>"
MATHS = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False},
         {"left": "\\(", "right": "\\)", "display": False}, {"left": "\\[", "right": "\\]", "display": True}]
SIDEBAR_WIDTH = 280  # px: at 1400 px the model picker keeps its label on one line beside it
PHONE_SIDEBAR = """() => { if (window.innerWidth < 768) {
  const open = document.querySelector('#conversations.open');
  if (open) open.querySelector('.toggle-button').click(); } }"""  # run once the page has loaded
TRAIN, RESUME_TRAINING, STOP_TRAINING = "Train PPD tokens for this model", "Resume training", "Stop training"
SEND, LOADING, NO_MODEL = "Send", "Loading model…", "No model loaded"


def send_button(ready: bool, failed: bool = False) -> dict:
    """Send's update: the primary button once a model is ready; else off, plain, saying why."""
    if ready:
        return gr.update(value=SEND, variant="primary", interactive=True)
    return gr.update(value=NO_MODEL if failed else LOADING, variant="secondary", interactive=False)


@dataclass
class Session:
    """One page: its conversation, its stop flag, and whether its answer streams (Send is off meanwhile)."""

    conversation: Conversation = field(default_factory=Conversation)
    stop_requested: bool = False
    answering: bool = False
    chosen: set[str] = field(default_factory=set)  # sampling widgets set on this page: a model's defaults keep off them
    selected: tuple | None = None  # the message clicked in the chat: (index, role, content), checked before use
    unfinished: Unfinished | None = None  # the last answer, cut at the length limit, as decoded (Continue's ids)
    search: str = ""  # the saved conversations' search box: the list shows those that hold it
    deleting: str | None = None  # the conversation Delete asked about, until confirmed or cancelled

    def begin_answer(self) -> bool:
        """Mark the page answering; False while its answer streams already (a second send does nothing)."""
        with self.unless_answering() as idle:
            self.answering = True
            return idle

    @contextmanager
    def unless_answering(self) -> Iterator[bool]:
        """True while no answer streams: the body may then change or replace the conversation, and no answer begins
        before it ends (an answer begun meanwhile would go into the conversation the body replaces)."""
        with _MARKING:
            yield not self.answering


_MARKING = threading.RLock()  # guards every page's ``answering`` mark (one for all: gr.State's Session stays copyable)


def new_session() -> Session:
    """``gr.State``'s initial value, called for every new page (a dataclass type would be taken for a value)."""
    return Session()


# ---- panels: components only ----


@dataclass
class ChatPanel:
    chatbot: gr.Chatbot
    message: gr.Textbox
    send: gr.Button
    stop: gr.Button
    regenerate: gr.Button
    clear: gr.Button
    resume: gr.Button  # Continue: shown under an answer cut at the length limit
    switched: gr.Markdown  # the conversation continues on another model than the one that answered it so far
    new_for_model: gr.Button  # a new chat for the model loaded now
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
    # any message offers to delete it or answer again from it; $…$ and $$…$$ are maths, as \(…\) and \[…\]
    with gr.Row(elem_id="switched-row"):  # shown after a model switch, over a conversation another model answered
        switched = gr.Markdown("", visible=False, elem_id="switched")
        new_for_model = gr.Button("New chat for this model", size="sm", scale=0, visible=False,
                                  elem_id="new-chat-for-model")
    chatbot = gr.Chatbot(label="Chat · click a message to delete it or answer again from it", height=460,
                         elem_id="chat", sanitize_html=True, editable="user", latex_delimiters=MATHS)
    with gr.Row():  # on a phone the buttons go under the box (its min_width), not beside a box 178 px wide
        message = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5, min_width=300,
                             elem_id="message")
        # off, and not the primary colour, until a model is ready (``send_button``): a page opening mid-load
        send = gr.Button(LOADING, variant="secondary", interactive=False, scale=1, elem_id="send")
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop", visible=False)  # shown while an answer streams
    with gr.Row():
        regenerate = gr.Button("Regenerate", size="sm")
        clear = gr.Button("New chat", size="sm", elem_id="clear")  # the old one stays saved, in Conversations
        resume = gr.Button("Continue", size="sm", visible=False, elem_id="continue")
    with gr.Row(visible=False, elem_id="selection") as selection:
        selected = gr.Markdown("", elem_id="selected")
        delete = gr.Button("Delete", size="sm", variant="stop", scale=0, elem_id="delete-message")
        again = gr.Button("Answer again from here", size="sm", scale=0, elem_id="answer-again")
    context = gr.Markdown("", elem_id="context")
    readout = gr.Markdown("", elem_id="readout")
    note = gr.Markdown("", elem_id="note")
    marked = gr.HTML("", elem_id="marked")
    return ChatPanel(chatbot, message, send, stop, regenerate, clear, resume, switched, new_for_model, readout, note,
                     marked, context, selection, selected, delete, again)


@dataclass
class TrainingOffer:
    """Shown when Train is clicked, before anything starts: the run's size, time and cost, and the runs to choose."""

    box: gr.Column
    cost: gr.Markdown
    quick: gr.Button
    full: gr.Button
    cancel: gr.Button


@dataclass
class ModelPanel:
    choice: gr.Dropdown
    load: gr.Button
    training: gr.Markdown
    train: gr.Button
    offer: TrainingOffer


def model_panel() -> ModelPanel:
    with gr.Row():
        # the label one line at 1400 px; the ways to name a model in the line under it
        choice = gr.Dropdown([], label="Model, hf:OWNER/REPO or a local path",
                             info="A local .gguf file or model folder works too; hf:OWNER/REPO:FILE.gguf picks one file",
                             allow_custom_value=True, interactive=True, scale=4, elem_id="model")
        load = gr.Button("Load", scale=1, min_width=80, elem_id="load-model")  # the picker keeps its label on one line
    with gr.Column():  # the line over its button: beside the sidebar the column is too narrow for both in a row
        training = gr.Markdown("", elem_id="training")
        train = gr.Button(TRAIN, visible=False, size="sm", elem_id="train")  # or Resume, or Stop
    with gr.Column(visible=False, elem_id="train-offer") as box:
        cost = gr.Markdown("", elem_id="train-cost")
        with gr.Row():
            quick = gr.Button("Quick run", size="sm", variant="primary", elem_id="train-quick")
            full = gr.Button("Full run", size="sm", elem_id="train-full")
            cancel = gr.Button("Cancel", size="sm", elem_id="train-cancel")
    return ModelPanel(choice, load, training, train, TrainingOffer(box, cost, quick, full, cancel))


@dataclass
class SettingsPanel:
    system: gr.Textbox
    max_new: gr.Slider
    ppd: gr.Checkbox
    acceptance: gr.Radio
    highlight: gr.Checkbox
    schema: gr.Textbox  # a JSON schema the answers follow; empty: free text
    greedy: gr.Button
    by_name: dict  # the sampling widgets by field name (``FIELDS``' order; the repeat window a number box)

    @property
    def inputs(self) -> list:
        """In the order ``ChatSettings.of`` reads them."""
        return [self.system, self.max_new, self.ppd, self.acceptance, self.highlight, self.schema, *self.sampling]

    @property
    def temperature(self) -> gr.Slider:
        return self.by_name["temperature"]

    @property
    def penalties(self) -> list:
        return [self.by_name[name] for name in PENALTIES]

    @property
    def sampling(self) -> list:
        """What a model's sampling defaults set (``FIELDS``' order)."""
        return list(self.by_name.values())


def sampling_widget(field: SamplingField, start: ChosenSampling, **options) -> gr.Slider | gr.Number:
    """A sampling field's widget, on ``start``'s value, its label saying where that came from."""
    label, value = f"{field.label} · {start.sources[field.name]}", start.values[field.name]
    low, high, step = field.page
    if high is None:
        return gr.Number(value, precision=0 if field.kind is int else None, minimum=low, label=label,
                         elem_id=field.name.replace("_", "-"), **options)
    return gr.Slider(low, high, value, step=step, label=label, elem_id=field.name.replace("_", "-"), **options)


def settings_panel() -> SettingsPanel:
    """The answer settings, opening on what a request leaving them unset gets with no model recommendation (each
    model's own defaults replace them once it is loaded, ``sampling_defaults``): every sampling field (``FIELDS``),
    the temperature beside Greedy, the repetition penalties in their own section."""
    start = default_sampling({})
    with gr.Accordion("Settings", open=True):
        ppd = gr.Checkbox(True, label="PPD (parallel prompt decoding)", elem_id="ppd")
        highlight = gr.Checkbox(False, label="Highlight tokens from accepted guesses (yellow: prompt tokens, blue: copied "
                                "from the conversation, green: forced by the JSON schema)", elem_id="highlight")
        system = gr.Textbox("", label="System prompt", lines=2)
        with gr.Row():
            by_name = {"temperature": sampling_widget(BY_NAME["temperature"], start, scale=4)}
            greedy = gr.Button("Greedy", size="sm", scale=1, elem_id="greedy")
        by_name.update({f.name: sampling_widget(f, start) for f in FIELDS if not f.penalty and f.name not in by_name})
        max_new = gr.Slider(16, 1024, 256, step=16, label="Max new tokens", elem_id="max-new-tokens")
        schema = gr.Textbox("", label="JSON schema: the answers follow it (empty: free text)", lines=3, max_lines=12,
                            placeholder='{"type": "object", "properties": {"name": {"type": "string"}}}',
                            elem_id="json-schema")
        with gr.Accordion("Repetition penalties (llama.cpp's)", open=False):
            by_name.update({name: sampling_widget(BY_NAME[name], start) for name in PENALTIES})
            gr.Markdown(REPEAT_WINDOW_DETAILS, elem_id="penalty-details")
        acceptance = gr.Radio(
            [("Lossless (exact model distribution)", "lossless"), ("Typical (faster, not distribution-preserving)", "typical")],
            value="lossless", label="Acceptance when sampling",
        )
    return SettingsPanel(system, max_new, ppd, acceptance, highlight, schema, greedy,
                         {name: by_name[name] for name in NAMES})


@dataclass
class HistoryPanel:
    """The saved conversations, in the sidebar: a search box, the list (the open one selected), rename, delete (asked
    again first) and export."""

    search: gr.Textbox
    saved: gr.Radio
    name: gr.Textbox
    rename: gr.Button
    delete: gr.Button
    confirm: gr.Column  # shown after Delete: what it removes, and Delete or Cancel
    confirm_line: gr.Markdown
    confirm_delete: gr.Button
    cancel: gr.Button
    export_json: gr.Button
    export_md: gr.Button
    exported: gr.File


def history_panel() -> HistoryPanel:
    # open at the top of a wide page; closed on a phone (``PHONE_SIDEBAR``), where it would cover the chat
    with gr.Sidebar(label="Conversations", open=True, width=SIDEBAR_WIDTH, elem_id="conversations"):
        gr.Markdown("### Conversations")
        search = gr.Textbox(placeholder="Search conversations", show_label=False, container=False,
                            elem_id="search-conversations")
        saved = gr.Radio([], label="Saved conversations, newest first; the open one is marked", elem_id="saved")
        name = gr.Textbox(placeholder="A name for the open conversation", show_label=False, container=False,
                          elem_id="conversation-name")
        with gr.Row():
            rename = gr.Button("Rename", size="sm", min_width=80, elem_id="rename")
            delete = gr.Button("Delete", size="sm", variant="stop", min_width=80, elem_id="delete-conversation")
        with gr.Column(visible=False, elem_id="confirm-delete") as confirm:
            confirm_line = gr.Markdown("", elem_id="confirm-line")
            with gr.Row():
                confirm_delete = gr.Button("Delete", size="sm", variant="stop", elem_id="confirm-delete-button")
                cancel = gr.Button("Cancel", size="sm", elem_id="cancel-delete")
        with gr.Row():
            export_json = gr.Button("Export JSON", size="sm")
            export_md = gr.Button("Export Markdown", size="sm")
        exported = gr.File(label="Export", interactive=False, visible=False, elem_id="exported")  # shown with one
    return HistoryPanel(search, saved, name, rename, delete, confirm, confirm_line, confirm_delete, cancel, export_json,
                        export_md, exported)


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



@dataclass
class Page:
    """Every component the events read or write."""

    session: gr.State  # this page's ``Session``
    page_id: gr.BrowserState  # the browser's copy of the page's conversation id: a reload reopens it
    startup: gr.Markdown  # the model's loading progress, until it is ready
    api: gr.Markdown  # where the OpenAI-compatible API is, when this server serves it
    timer: gr.Timer  # on while the page follows something (a model loading, a training, a background calibration)
    model_note: gr.Markdown  # what this model is, where that matters to a chat
    chat: ChatPanel
    compare: ComparePanel
    model: ModelPanel
    settings: SettingsPanel
    history: HistoryPanel
    device: gr.Markdown
    calibration: CalibrationPanel

    @property
    def model_panels(self) -> list:
        """What depends on the model (``ModelHandlers.model_panels``)."""
        return [self.startup, self.chat.send, self.chat.switched, self.chat.new_for_model, self.device,
                self.calibration.summary, self.calibration.curve, self.timer,
                *self.settings.sampling, self.model.choice, self.model.training, self.model.train, self.model_note]


def build_page() -> Page:
    """The page's components, laid out (inside a ``gr.Blocks``)."""
    session = gr.State(new_session)  # called for every new page: its own conversation and id
    # the page's conversation id in the browser (its own per browser profile), so that a reload reopens it
    page_id = gr.BrowserState(None, storage_key="ppd-conversation")
    gr.HTML(PAGE_STYLE, container=False, padding=False)  # in the page itself: `launch` and `mount_gradio_app` alike
    gr.Markdown(f"## ppd · local chat with Parallel Prompt Decoding\nSpeeds are {SPEED_DEFINITION}.")
    api = gr.Markdown("", elem_id="api")
    history = history_panel()  # the sidebar
    startup = gr.Markdown("", elem_id="startup")
    timer = gr.Timer(1.0, active=False)
    with gr.Row():
        with gr.Column(scale=3):
            model_note = gr.Markdown("", elem_id="model-note")
            chat = chat_panel()
            compare = compare_panel()
        with gr.Column(scale=2):
            model = model_panel()
            settings = settings_panel()
            device = device_block()
            calibration = calibration_panel()
    return Page(session, page_id, startup, api, timer, model_note, chat, compare, model, settings, history, device,
                calibration)
