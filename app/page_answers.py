"""The page's answers: Send, Regenerate (and Retry), an edited message, Answer again from here, Stop, and Compare.

Each event yields ``{component: update}`` (components of ``Page``); what it leaves out stays as it is. A streamed answer
reaches the page a few times a second, not once per step: the page's rendering competes with the model for the same
CPU cores.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import gradio as gr

from app.calibration_progress import CompareProgress, followed
from app.chat import AnswerUpdate, Chat
from app.chat_settings import PENALTY_FIELDS, ChatSettings
from app.page_conversations import ConversationHandlers
from app.page_layout import Page, Session
from app.page_text import (LIMITED, MODEL_KEY, chat_messages, continuable, exchange, marked_answer, one_line,
                           switch_panels, switched_line)
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

UPDATE_SECONDS = 0.25  # how often a streamed answer is sent to the page
SAVE_SECONDS = 3.0  # how often the answer so far is saved while it streams
NOTHING_TO_CONTINUE = "Nothing to continue: the last answer did not stop at the length limit."


class AnswerHandlers:
    """The events that run the model for a page's conversation."""

    def __init__(self, chat: Chat, conversations: ConversationHandlers, page: Page):
        self.chat = chat
        self.conversations = conversations
        self.page = page

    def answering(self) -> dict:
        """Send and Stop while a page's answer streams (Continue put away)."""
        chat = self.page.chat
        return {chat.send: gr.update(interactive=False), chat.stop: gr.update(visible=True),
                chat.resume: gr.update(visible=False)}

    def answered(self, session: Session) -> dict:
        """Send and Stop once it has ended (a model loading meanwhile turns Send off on the page's next tick), and
        Continue where the answer ended at the length limit; the line saying the conversation continues on another
        model goes once the loaded one has answered."""
        chat, host = self.page.chat, self.chat.host
        line = switched_line(session.conversation, host.engine.loaded.name) if host.ready else ""
        return {chat.send: gr.update(interactive=True), chat.stop: gr.update(visible=False),
                chat.resume: gr.update(visible=continuable(session.conversation)), **switch_panels(chat, line)}

    def _respond(self, session: Session, updates: Iterator[AnswerUpdate], answer: dict | None = None) -> Iterator[dict]:
        """Stream ``updates`` (``Chat.answer`` for the conversation's last user message) as the chat, readout, note and
        marked answer, the first at once: the message taken. ``answer``: the conversation's last message, continued
        (``Chat.resume``: the updates' text is all of it), else a new answer.

        The user's message is saved before decoding starts and the answer so far every ``SAVE_SECONDS``
        (marked interrupted until it ends), so a crash loses neither. Any error keeps both, marks the
        partial answer interrupted, saves, and shows one line. An answer ending at the length limit is marked so
        (the bubble says it, Continue goes on).
        """
        conversation, chat = session.conversation, self.page.chat
        answer = answer if answer is not None else {"role": "assistant", "content": ""}
        answer.pop(LIMITED, None), answer.pop("stopped", None)
        answer["interrupted"], session.unfinished = True, None
        self.conversations.save(conversation)
        waiting = [] if conversation.messages and conversation.messages[-1] is answer else [
            {"role": "assistant", "content": ""}]
        yield {chat.chatbot: chat_messages(conversation, streaming=True) + waiting, chat.note: "", chat.marked: ""}
        update, sent, saved, ahead = None, 0.0, time.monotonic(), ""
        try:
            for update in updates:
                if update.queued:  # waiting for the model: say so when what is ahead changes
                    if update.note != ahead:
                        ahead = update.note
                        yield {chat.chatbot: chat_messages(conversation, streaming=True) + waiting,
                               chat.note: update.note}
                    continue
                answer["content"] = update.text
                if update.text and conversation.messages[-1] is not answer:
                    conversation.messages.append(answer)
                if update.stop_reason is None and time.monotonic() - saved >= SAVE_SECONDS:
                    saved = self.conversations.save(conversation)
                if update.stop_reason is None and time.monotonic() - sent < UPDATE_SECONDS:
                    continue  # coalesced: the page gets a few updates a second
                sent = time.monotonic()
                shown = chat_messages(conversation, streaming=True)
                if conversation.messages[-1] is not answer and update.stop_reason is None:
                    shown += waiting
                yield {chat.chatbot: shown, chat.readout: update.readout or gr.update(), chat.note: update.note,
                       chat.marked: marked_answer(update.marked)}
        except Exception as error:  # noqa: BLE001 - whatever failed, the conversation is kept and saved
            line = str(error) if isinstance(error, PpdError) else f"The answer was interrupted: {one_line(error)}"
            if not isinstance(error, PpdError):
                log.exception("answering failed")
            gr.Warning(line)
            self.conversations.save(conversation)
            yield {chat.chatbot: chat_messages(conversation), chat.note: line}
            return
        if update is not None and update.stats is not None:  # finished or stopped by the user: a whole answer
            finished(session, answer, update)
        self.conversations.save(conversation)
        if answer.get(LIMITED) or answer.get("stopped"):  # the line in its bubble
            yield {chat.chatbot: chat_messages(conversation)}

    def _start(self, session: Session, messages: list[dict], settings: ChatSettings) -> Iterator[AnswerUpdate]:
        """The answer's updates; a refusal (too long, the line full) raises PpdError before anything changes."""
        session.stop_requested = False  # a Stop pressed from here on counts, also while the answer waits its turn
        session.conversation.system_prompt = settings.system_prompt
        return self.chat.answer(messages, settings, stop=lambda: session.stop_requested)

    def send(self, message: str, session: Session, *settings) -> Iterator[dict]:
        """Answer ``message``. While the answer streams, Send is off and Stop shown, and another send from the page
        does nothing: its text stays in the box, which is emptied once, when the message is taken."""
        page = self.page
        if not message or not message.strip():
            gr.Warning("Please type a message first.")
            yield {page.chat.note: "Please type a message first.", page.session: session}
            return
        if not session.begin_answer():
            yield {page.session: session}
            return
        try:
            conversation = session.conversation
            asked = conversation.messages + [{"role": "user", "content": message}]
            try:  # a refused message (too long, ppd busy) stays in the textbox and out of the conversation
                updates = self._start(session, asked, ChatSettings.of(*settings))
            except PpdError as error:
                gr.Warning(str(error))
                yield {page.chat.note: str(error), page.session: session}
                return
            conversation.messages.append(asked[-1])
            shown_updates = self._respond(session, updates)
            # taken and saved: a reload from here shows it
            yield {**next(shown_updates), page.chat.message: "", page.session: session, **self.answering(),
                   page.page_id: conversation.id}
            for shown in shown_updates:
                yield {**shown, page.session: session}
        finally:
            session.answering = False
        yield {page.session: session, **self.answered(session), **self.conversations.changed(session)}

    def regenerate(self, session: Session, *settings) -> Iterator[dict]:
        """The last user message answered again (the Regenerate button, the last answer's Retry icon)."""

        def last_question(messages: list[dict]) -> list[dict]:
            return messages[:-1] if messages and messages[-1]["role"] == "assistant" else messages

        yield from self._answer_again(session, settings, last_question, "Nothing to regenerate yet.")

    def edit(self, edited: gr.EditData, session: Session, *settings) -> Iterator[dict]:
        """A sent message edited on the page (the pencil): the conversation after it goes, and it is answered again as
        edited. Refused (busy, too long, empty), the page shows the conversation as it was."""
        index, text = edited.index, edited.value if isinstance(edited.value, str) else ""

        def cut(messages: list[dict]) -> list[dict]:
            if not (isinstance(index, int) and 0 <= index < len(messages)) or messages[index]["role"] != "user":
                return []
            return messages[:index] + [{"role": "user", "content": text}] if text.strip() else []

        yield from self._answer_again(session, settings, cut, "A message cannot be empty.", restore=True)

    def again(self, session: Session, *settings) -> Iterator[dict]:
        """Answer again from the clicked message (the question it is, or the one it answers)."""
        index = self.conversations.selected(session)

        def cut(messages: list[dict]) -> list[dict]:
            start = exchange(messages, index)[0] if index is not None else 0
            return messages[:start + 1] if index is not None and messages[start]["role"] == "user" else []

        yield from self._answer_again(session, settings, cut, "Click a message in the chat first.")

    def _answer_again(self, session: Session, settings: tuple, cut: Callable[[list[dict]], list[dict]], empty: str,
                      restore: bool = False) -> Iterator[dict]:
        """Answer ``cut(the conversation's messages)`` (ending with the user message to answer; [] says ``empty``):
        it replaces the conversation once the answer is taken, so a refusal keeps it (``restore``: the chat is shown
        again, for an edit the page made itself)."""
        page = self.page
        shown = {page.chat.chatbot: chat_messages(session.conversation)} if restore else {}
        if not session.begin_answer():
            yield {**shown, page.session: session}
            return
        try:
            messages = cut(list(session.conversation.messages))
            if not messages:
                gr.Warning(empty)
                yield {**shown, page.chat.note: empty, page.session: session}
                return
            try:  # a refused prompt keeps the conversation as it was
                updates = self._start(session, messages, ChatSettings.of(*settings))
            except PpdError as error:
                gr.Warning(str(error))
                yield {**shown, page.chat.note: str(error), page.session: session}
                return
            session.conversation.messages[:] = messages
            shown_updates = self._respond(session, updates)
            yield {**next(shown_updates), page.session: session, **self.answering(),  # taken and saved
                   page.page_id: session.conversation.id}
            for update in shown_updates:
                yield {**update, page.session: session}
        finally:
            session.answering = False
        yield {page.session: session, **self.answered(session), page.page_id: session.conversation.id,
               page.chat.context: self.conversations.context(session.conversation)}

    def resume(self, session: Session, *settings) -> Iterator[dict]:
        """Continue the last answer, cut at the length limit, where it stopped, in its own bubble (Continue)."""
        page = self.page
        if not session.begin_answer():
            yield {page.session: session}
            return
        conversation = session.conversation  # no other while it answers (``Session.unless_answering``)
        try:
            if not continuable(conversation):
                gr.Warning(NOTHING_TO_CONTINUE)
                yield {page.chat.note: NOTHING_TO_CONTINUE, page.chat.resume: gr.update(visible=False),
                       page.session: session}
                return
            messages = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
            chosen = ChatSettings.of(*settings)
            try:  # refused (too long, ppd busy): the answer stays as it was, Continue with it
                session.stop_requested, conversation.system_prompt = False, chosen.system_prompt
                updates = self.chat.resume(messages, chosen, lambda: session.stop_requested, session.unfinished)
            except PpdError as error:
                gr.Warning(str(error))
                yield {page.chat.note: str(error), page.session: session}
                return
            shown_updates = self._respond(session, updates, conversation.messages[-1])
            yield {**next(shown_updates), page.session: session, **self.answering(), page.page_id: conversation.id}
            for update in shown_updates:
                yield {**update, page.session: session}
        finally:
            session.answering = False
        yield {page.session: session, **self.answered(session), page.page_id: conversation.id,
               page.chat.context: self.conversations.context(conversation)}

    def stop(self, session: Session) -> Session:
        session.stop_requested = True
        return session

    def compare(self, session: Session, system: str, max_new: int, *penalties_and_schema) -> Iterator[dict]:
        """Compare the last user message both ways; the inputs after ``max_new``: the repetition penalties
        (``PENALTY_FIELDS``), then the JSON schema box (each left out: its default). The verdict line shows the progress
        (which way, tokens so far) until the verdict in words."""
        panel = self.page.compare
        messages = list(session.conversation.messages)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            gr.Warning("Send a message first, then compare.")
            yield {panel.verdict: "Send a message first, then compare."}
            return
        given = dict(zip((*PENALTY_FIELDS, "schema"), penalties_and_schema))
        settings = ChatSettings(system, max_new_tokens=int(max_new), schema=given.pop("schema", ""), values=given)
        lines = followed(lambda progress: self.chat.compare(messages, settings, progress), CompareProgress())
        try:
            yield {panel.plain: "", panel.ppd: "", panel.verdict: next(lines)}  # the last comparison's answers go
            while True:
                yield {panel.verdict: next(lines)}
        except StopIteration as end:
            result = end.value
        except PpdError as error:  # too long, ppd busy, a box it cannot use: one line
            gr.Warning(str(error))
            yield {panel.verdict: str(error)}
            return
        plain, ppd = result.plain_stats, result.ppd_stats
        yield {panel.plain: f"**Plain decoding** · {plain.tok_s:.1f} tokens/s · {plain.seconds:.2f} s\n\n{result.plain_text}",
               panel.ppd: f"**PPD** · {ppd.tok_s:.1f} tokens/s · {ppd.seconds:.2f} s\n\n{result.ppd_text}",
               panel.verdict: result.verdict()}


def finished(session: Session, answer: dict, update: AnswerUpdate) -> None:
    """A whole answer (it ended, or the user stopped it): in the conversation, with the model that wrote it (the line
    over the chat tells another model's answers) and how it ended, when its bubble says so (the length limit, Stop)."""
    conversation = session.conversation
    del answer["interrupted"]
    if conversation.messages[-1] is not answer:
        conversation.messages.append(answer)
    answer[MODEL_KEY] = update.model
    if update.stop_reason == "length":
        answer[LIMITED], session.unfinished = True, update.unfinished
    elif update.stop_reason == "stopped":
        answer["stopped"] = True
