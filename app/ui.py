"""The Gradio chat app: one builder per panel, wired to ``Handlers``; the work is in ``Chat`` and ``ModelHost``.

Events that run the model start at once (Gradio's queue does not hold them back) and wait in
``ModelHost``'s line for the model, which the API shares: two browser tabs chatting at once are
served one answer at a time, each with its own conversation (``gr.State(new_session)`` makes a new
session, with a new conversation id, for every page); a waiting page says how many answers are
ahead, and a full line is a one-line "busy" notice. Stop only sets a flag, so it runs at once; an
answer waiting its turn gives up its place, a running one ends after the decoding step in flight.
"""

from __future__ import annotations

import gradio as gr

from app.chat import Chat
from app.history import ConversationStore
from app.model_host import ModelHost
from app.page_answers import AnswerHandlers
from app.page_conversations import ConversationHandlers
from app.page_layout import PHONE_SIDEBAR, Page, Session, build_page
from app.page_model import ModelHandlers
from app.page_text import chosen_label, continuable, switch_panels

MODEL = dict(concurrency_limit=None)  # events that run the model: they queue in ModelHost, not in Gradio


class Handlers:
    """The page's events, by what they are about; each takes and returns the page's ``Session``."""

    def __init__(self, host: ModelHost, store: ConversationStore, page: Page, api: str = ""):
        self.host, self.page = host, page
        self.chat = Chat(host)
        self.conversations = ConversationHandlers(host, store, page, api)
        self.answers = AnswerHandlers(self.chat, self.conversations, page)
        self.model = ModelHandlers(host, page)

    def load(self, session: Session, page_conversation: str | None = None, request: gr.Request = None) -> dict:
        """A page opens (``ConversationHandlers.load``), with what depends on the model (``model_panels``)."""
        loaded = self.conversations.load(session, page_conversation, request)  # it sets the session's conversation
        resume = gr.update(visible=continuable(session.conversation))  # Continue: an answer cut at the length limit
        return {**loaded, **self.model.model_panels(fresh_page=True), **self.model.switch_line(session),
                self.page.chat.resume: resume}


def wire_answers(handlers: Handlers, page: Page) -> None:
    """Send, Regenerate (and Retry), an edit, Answer again, Stop, Compare."""
    answers, chat, settings, session = handlers.answers, page.chat, page.settings, page.session
    outputs = [chat.chatbot, chat.message, chat.readout, chat.note, session, page.history.saved, chat.send, chat.stop,
               chat.marked, chat.context, page.page_id, chat.resume, chat.switched, chat.new_for_model]
    # Enter and Send are one event: while its answer streams the page does not send it again (trigger_mode "once");
    # ``AnswerHandlers.send`` also ignores a send from a page whose answer streams (one started by Regenerate)
    gr.on([chat.message.submit, chat.send.click], answers.send, [chat.message, session, *settings.inputs], outputs,
          **MODEL, api_name="send", trigger_mode="once").then(handlers.model.device, None, page.device, api_name=False)
    again = [chat.chatbot, chat.readout, chat.note, session, chat.send, chat.stop, chat.marked, chat.context,
             page.page_id, chat.resume, chat.switched, chat.new_for_model]
    # the Regenerate button and the last answer's Retry icon are one action
    gr.on([chat.regenerate.click, chat.chatbot.retry], answers.regenerate, [session, *settings.inputs], again, **MODEL,
          api_name=False, trigger_mode="once")
    chat.chatbot.edit(answers.edit, [session, *settings.inputs], again, **MODEL, api_name=False)
    chat.again.click(answers.again, [session, *settings.inputs], again, **MODEL, api_name=False)
    # Continue: the answer cut at the length limit goes on in its own bubble
    chat.resume.click(answers.resume, [session, *settings.inputs], again, **MODEL, api_name=False, trigger_mode="once")
    chat.stop.click(answers.stop, [session], [session], queue=False, api_name=False)
    compare = page.compare
    compare.button.click(answers.compare, [session, settings.system, settings.max_new, *settings.penalties, settings.schema],
                         [compare.plain, compare.ppd, compare.verdict],
                         **MODEL, api_name="compare", show_progress="hidden")  # the verdict line says how far


def wire_conversation(handlers: Handlers, page: Page) -> None:
    """Clicking, deleting and undoing messages, New chat, the context meter and exports (the saved conversations'
    list: ``wire_conversation_list``)."""
    conversations, chat, history, session = handlers.conversations, page.chat, page.history, page.session
    chat.chatbot.undo(conversations.undo, [session],
                      [chat.chatbot, chat.message, chat.note, session, history.saved, chat.context, page.page_id],
                      api_name=False)
    chat.chatbot.select(conversations.select, [session], [session, chat.selection, chat.selected], queue=False,
                        api_name=False)
    chat.delete.click(conversations.delete, [session],
                      [chat.chatbot, chat.note, session, history.saved, chat.selection, chat.context, page.page_id],
                      api_name=False)
    # whatever changes the conversation puts the offer for a clicked message away (its index would point elsewhere)
    gr.on([chat.send.click, chat.message.submit, chat.regenerate.click, chat.chatbot.retry, chat.chatbot.edit,
           chat.chatbot.undo, chat.again.click, chat.clear.click, chat.chatbot.clear, history.saved.input,
           history.confirm_delete.click],
          lambda: gr.update(visible=False), None, chat.selection, queue=False, api_name=False)
    # another conversation, or this one changed by hand: no answer of this page's to continue (the list's ``input``,
    # a user's pick: its ``change`` also fires when an answer refreshes the list)
    gr.on([chat.clear.click, chat.chatbot.clear, chat.new_for_model.click, chat.chatbot.undo, chat.delete.click,
           history.saved.input], lambda: gr.update(visible=False), None, chat.resume, queue=False, api_name=False)
    gr.on([chat.clear.click, chat.chatbot.clear, chat.new_for_model.click], lambda: switch_panels(chat, ""), None,
          [chat.switched, chat.new_for_model], queue=False, api_name=False)

    def context(page_session: Session, system: str) -> str:
        return conversations.context(page_session.conversation, system)

    page.settings.system.blur(context, [session, page.settings.system], chat.context, queue=False, api_name=False)
    # the context meter once the model is ready (or another one is): the startup line changes then
    page.startup.change(context, [session, page.settings.system], chat.context, queue=False, api_name=False)
    # the chat's own trash icon is the New chat button: a new conversation (else it only emptied the display, and the
    # next message brought the cleared turns back, to the page and to the model)
    # New chat for this model (after a switch) is New chat too
    gr.on([chat.clear.click, chat.chatbot.clear, chat.new_for_model.click], conversations.clear, [session],
          conversation_outputs(page), api_name=False)
    history.export_json.click(lambda s: conversations.export("json", s), [session], [history.exported], api_name=False)
    history.export_md.click(lambda s: conversations.export("md", s), [session], [history.exported], api_name=False)


def conversation_outputs(page: Page) -> list:
    """What opening another conversation (or a new one) changes."""
    chat, history = page.chat, page.history
    return [page.session, chat.chatbot, chat.readout, chat.note, page.settings.system, chat.context, page.page_id,
            history.saved, history.name, history.confirm]


def wire_conversation_list(handlers: Handlers, page: Page) -> None:
    """The sidebar: a click on a saved conversation opens it; search, rename, delete (asked again first)."""
    conversations, history, session = handlers.conversations, page.history, page.session
    history.saved.input(conversations.open, [history.saved, session], conversation_outputs(page), api_name=False)
    history.search.change(conversations.search, [history.search, session], [session, history.saved], queue=False,
                         api_name=False, show_progress="hidden")
    gr.on([history.rename.click, history.name.submit], conversations.rename, [history.name, session],
          [session, history.saved, history.name, page.chat.note, page.page_id], api_name=False)
    history.delete.click(conversations.ask_delete, [session],
                         [session, page.chat.note, history.confirm_line, history.confirm], queue=False, api_name=False)
    history.confirm_delete.click(conversations.delete_conversation, [session], conversation_outputs(page),
                                 api_name=False)
    history.cancel.click(conversations.cancel_delete, [session], [session, history.confirm], queue=False,
                         api_name=False)


def wire_model(handlers: Handlers, page: Page) -> None:
    """The timer following the model, Load, the training button, Calibrate, and the sampling widgets' labels."""
    model, session, panels = handlers.model, page.session, page.model_panels
    # each page's Send stays off while its own answer streams (``ModelHandlers.page_panels``)
    # the page's own lines say what is going on: no Gradio timers flashing inside them
    page.timer.tick(lambda s: model.page_panels(s, model.model_panels()), [session], panels, queue=False,
                    api_name=False, show_progress="hidden")
    page.model.load.click(lambda spec, s: model.page_panels(s, model.switch_model(spec)), [page.model.choice, session],
                          panels, queue=False, api_name=False, show_progress="hidden")
    # the button's label says what the click does: train, resume, or stop the training
    offer = page.model.offer  # Train shows the run's cost and the runs to choose; nothing starts before a choice
    page.model.train.click(lambda label, s: model.page_panels(s, model.training_button(label)), [page.model.train, session],
                           [*panels, offer.box, offer.cost, offer.quick, offer.full], queue=False, api_name=False,
                           show_progress="hidden")
    for button, run in ((offer.quick, "quick"), (offer.full, "full")):
        button.click(lambda s, run=run: model.page_panels(s, model.start_training(run)), [session],
                     [*panels, offer.box], queue=False, api_name=False, show_progress="hidden")
    offer.cancel.click(lambda: gr.update(visible=False), None, offer.box, queue=False, api_name=False,
                       show_progress="hidden")
    calibration = page.calibration
    calibration.button.click(model.calibrate, None, [calibration.curve, calibration.summary, page.device],
                             **MODEL, api_name="calibrate", show_progress="hidden")  # the summary's place says it
    # a sampling widget the user sets (Greedy sets the temperature) is the user's choice, said in its label
    for name, widget in page.settings.by_name.items():
        widget.input(lambda s, name=name: model.choose(name, s), [session], [session, widget], queue=False,
                     api_name=False, show_progress="hidden")

    def greedy(s: Session) -> dict:  # one click to greedy
        return {**model.choose("temperature", s),
                page.settings.temperature: gr.update(label=chosen_label("temperature"), value=0.0)}

    page.settings.greedy.click(greedy, [session], [session, page.settings.temperature], queue=False, api_name=False,
                               show_progress="hidden")


def build(host: ModelHost, store: ConversationStore | None = None, api: str = "") -> tuple[gr.Blocks, Handlers]:
    """The page over ``host`` (its conversations in ``store``), with its events' handlers; ``api``: the line saying
    where the server's API is (``api_line``), "" where it serves none."""
    with gr.Blocks(title="ppd chat") as app:
        page = build_page()
        handlers = Handlers(host, store or ConversationStore(), page, api)
        app.load(handlers.load, [page.session, page.page_id],
                 [page.session, page.chat.chatbot, page.settings.system, page.history.saved, page.history.name,
                  page.api, page.chat.context, page.page_id, page.chat.resume, *page.model_panels],
                 show_progress="hidden")
        app.load(None, None, None, js=PHONE_SIDEBAR, api_name=False)
        wire_answers(handlers, page)
        wire_conversation(handlers, page)
        wire_conversation_list(handlers, page)
        wire_model(handlers, page)
    app.queue(default_concurrency_limit=1)
    return app, handlers


def build_app(host: ModelHost, store: ConversationStore | None = None, api: str = "") -> gr.Blocks:
    return build(host, store, api)[0]


def api_line(key: bool = False) -> str:
    """``build``'s ``api`` for a server that serves the OpenAI-compatible API (``key``: with a key)."""
    return ("API: `{url}` (OpenAI-compatible: a client's base URL" + (", with the server's API key" if key else "")
            + "; `/health` says the model's state)")
