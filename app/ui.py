"""The Gradio chat app: components and event wiring only; the work is in ``ChatService``.

Every event that runs the model shares one queue slot (``concurrency_id="model"``): two
browser tabs chatting at once are served one answer at a time, each with its own
conversation (per-tab ``gr.State``). Stop only sets a flag, so it runs at once; the answer
ends after the decoding step in flight.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import gradio as gr

from app.chat_service import ChatService, ChatSettings
from app.history import Conversation, ConversationStore
from app.plots import latency_figure
from app.system_info import device_panel

MODEL = "model"  # the shared concurrency group of everything that runs the model


@dataclass
class Session:
    """One browser tab: its conversation and its stop flag."""

    conversation: Conversation = field(default_factory=Conversation)
    stop_requested: bool = False

    def __deepcopy__(self, memo):  # gr.State copies the initial value for every new tab
        return Session(copy.deepcopy(self.conversation, memo))


def chat_messages(conversation: Conversation) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in conversation.messages]


def conversation_choices(store: ConversationStore) -> list[tuple[str, str]]:
    return [(f"{datetime.fromtimestamp(c.updated):%b %d %H:%M} · {c.title}", c.id) for c in store.list()]


def calibration_summary(profile) -> str:
    if profile is None:
        return "Not calibrated yet: using a built-in tree."
    return (
        f"**Expected speedup {profile.expected_speedup:.2f}x** with {profile.budget} tokens per step "
        f"({profile.expected_tokens_per_step:.2f} tokens per step expected; trees of "
        f"{', '.join(map(str, profile.tree_sizes))} tokens by guess depth). Measured {profile.created}, "
        f"took {profile.calibration_seconds:.0f} s."
    )


def build_app(service: ChatService, store: ConversationStore | None = None) -> gr.Blocks:
    store = store or ConversationStore()
    export_dir = Path(tempfile.mkdtemp(prefix="ppd-export-"))
    restored = {"done": False}  # the first tab after launch reopens the latest conversation

    def settings_of(system, temperature, top_p, max_new, ppd, acceptance, highlight) -> ChatSettings:
        return ChatSettings(system, float(temperature), float(top_p), int(max_new), bool(ppd), acceptance, bool(highlight))

    def on_load(session: Session):
        if not restored["done"]:
            restored["done"] = True
            saved = store.list()
            if saved:
                session.conversation = saved[0]
        conversation = session.conversation
        return (session, chat_messages(conversation), conversation.system_prompt,
                gr.update(choices=conversation_choices(store), value=None), device_panel(service.engine),
                calibration_summary(service.engine.profile),
                latency_figure(service.engine.profile) if service.engine.profile else None)

    def respond(session: Session, settings: ChatSettings):
        """Stream the answer to the conversation's last user message into the chat."""
        conversation = session.conversation
        conversation.system_prompt = settings.system_prompt
        session.stop_requested = False
        shown = chat_messages(conversation) + [{"role": "assistant", "content": ""}]
        update = None
        try:
            for update in service.answer(conversation.messages, settings, stop=lambda: session.stop_requested):
                shown[-1]["content"] = update.display
                yield shown, update.readout, update.note
        except ValueError as error:
            gr.Warning(str(error))
            conversation.messages.pop()  # the refused message is not kept
            yield chat_messages(conversation), gr.update(), str(error)
            return
        if update is not None:
            conversation.messages.append({"role": "assistant", "content": update.text})
            store.save(conversation)

    def send(message, session: Session, system, temperature, top_p, max_new, ppd, acceptance, highlight):
        if not message or not message.strip():
            gr.Warning("Please type a message first.")
            yield gr.update(), gr.update(), gr.update(), "Please type a message first.", session, gr.update()
            return
        session.conversation.messages.append({"role": "user", "content": message})
        settings = settings_of(system, temperature, top_p, max_new, ppd, acceptance, highlight)
        for shown, readout, note in respond(session, settings):
            yield shown, "", readout, note, session, gr.update()
        yield gr.update(), "", gr.update(), gr.update(), session, gr.update(choices=conversation_choices(store))

    def regenerate(session: Session, system, temperature, top_p, max_new, ppd, acceptance, highlight):
        messages = session.conversation.messages
        if messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            gr.Warning("Nothing to regenerate yet.")
            yield gr.update(), gr.update(), "Nothing to regenerate yet.", session
            return
        settings = settings_of(system, temperature, top_p, max_new, ppd, acceptance, highlight)
        for shown, readout, note in respond(session, settings):
            yield shown, readout, note, session

    def stop(session: Session):
        session.stop_requested = True
        return session

    def clear(session: Session):
        session.conversation = Conversation(system_prompt=session.conversation.system_prompt)
        return session, [], "", "", gr.update(value=None)

    def open_conversation(conversation_id, session: Session):
        if not conversation_id:
            return session, gr.update(), gr.update()
        session.conversation = store.load(conversation_id)
        return session, chat_messages(session.conversation), session.conversation.system_prompt

    def export(kind: str, session: Session):
        if not session.conversation.messages:
            gr.Warning("The conversation is empty.")
            return None
        return str(store.export(session.conversation, kind, export_dir))

    def compare(session: Session, system, max_new):
        messages = list(session.conversation.messages)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            gr.Warning("Send a message first, then compare.")
            return gr.update(), gr.update(), "Send a message first, then compare."
        result = service.compare(messages, ChatSettings(system_prompt=system, max_new_tokens=int(max_new)))
        return (f"**Plain decoding** · {result.vanilla_stats.tok_s:.1f} tokens/s · {result.vanilla_stats.seconds:.2f} s\n\n{result.vanilla_text}",
                f"**PPD** · {result.ppd_stats.tok_s:.1f} tokens/s · {result.ppd_stats.seconds:.2f} s\n\n{result.ppd_text}",
                result.verdict())

    def calibrate(progress=gr.Progress()):
        def report(phase: str, done: int, total: int) -> None:
            progress((done, total), desc=f"Calibrating: {phase}")

        profile = service.calibrate(report)
        return latency_figure(profile), calibration_summary(profile), device_panel(service.engine)

    with gr.Blocks(title="ppd chat") as app:
        session = gr.State(Session())
        gr.Markdown("## ppd · local chat with Parallel Prompt Decoding")
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(label="Chat", height=460, elem_id="chat", sanitize_html=True)
                with gr.Row():
                    message = gr.Textbox(placeholder="Type a message and press Enter", show_label=False, scale=5, elem_id="message")
                    send_button = gr.Button("Send", variant="primary", scale=1, elem_id="send")
                    stop_button = gr.Button("Stop", variant="stop", scale=1, elem_id="stop")
                with gr.Row():
                    regenerate_button = gr.Button("Regenerate", size="sm")
                    clear_button = gr.Button("Clear", size="sm")
                readout = gr.Markdown("", elem_id="readout")
                note = gr.Markdown("", elem_id="note")
            with gr.Column(scale=2):
                with gr.Accordion("Settings", open=True):
                    ppd = gr.Checkbox(True, label="PPD (parallel prompt decoding)", elem_id="ppd")
                    highlight = gr.Checkbox(False, label="Highlight tokens from accepted guesses")
                    system = gr.Textbox("", label="System prompt", lines=2)
                    temperature = gr.Slider(0.0, 2.0, 0.0, step=0.05, label="Temperature (0 = greedy)")
                    top_p = gr.Slider(0.05, 1.0, 1.0, step=0.05, label="Top-p")
                    max_new = gr.Slider(16, 1024, 256, step=16, label="Max new tokens")
                    acceptance = gr.Radio(
                        [("Lossless (exact model distribution)", "lossless"), ("Typical (faster, not distribution-preserving)", "typical")],
                        value="lossless", label="Acceptance when sampling",
                    )
                with gr.Accordion("Conversations", open=False):
                    saved = gr.Dropdown([], label="Open a saved conversation", interactive=True)
                    with gr.Row():
                        export_json = gr.Button("Export JSON", size="sm")
                        export_md = gr.Button("Export Markdown", size="sm")
                    exported = gr.File(label="Export", interactive=False)
                with gr.Accordion("Device", open=True):
                    device = gr.Markdown("", elem_id="device")
                with gr.Accordion("Calibration", open=False):
                    calibrate_button = gr.Button("Calibrate for this device", elem_id="calibrate")
                    calibration = gr.Markdown("", elem_id="calibration")
                    curve = gr.Plot(label="Step latency against tree size")
        with gr.Accordion("Compare with plain decoding", open=True):
            compare_button = gr.Button("Compare the last message: plain vs PPD (greedy)", elem_id="compare")
            verdict = gr.Markdown("", elem_id="verdict")
            with gr.Row():
                plain_answer = gr.Markdown("", elem_id="plain-answer")
                ppd_answer = gr.Markdown("", elem_id="ppd-answer")

        settings_inputs = [system, temperature, top_p, max_new, ppd, acceptance, highlight]
        app.load(on_load, [session], [session, chatbot, system, saved, device, calibration, curve])
        send_outputs = [chatbot, message, readout, note, session, saved]
        for trigger in (message.submit, send_button.click):
            trigger(send, [message, session, *settings_inputs], send_outputs, concurrency_id=MODEL, api_name="send" if trigger == send_button.click else False).then(
                lambda: device_panel(service.engine), None, device, api_name=False)
        regenerate_button.click(regenerate, [session, *settings_inputs], [chatbot, readout, note, session], concurrency_id=MODEL, api_name=False)
        stop_button.click(stop, [session], [session], queue=False, api_name=False)
        clear_button.click(clear, [session], [session, chatbot, readout, note, saved], api_name=False)
        saved.change(open_conversation, [saved, session], [session, chatbot, system], api_name=False)
        export_json.click(lambda s: export("json", s), [session], [exported], api_name=False)
        export_md.click(lambda s: export("md", s), [session], [exported], api_name=False)
        compare_button.click(compare, [session, system, max_new], [plain_answer, ppd_answer, verdict], concurrency_id=MODEL, api_name="compare")
        calibrate_button.click(calibrate, None, [curve, calibration, device], concurrency_id=MODEL, api_name="calibrate")
    app.queue(default_concurrency_limit=1)
    return app
