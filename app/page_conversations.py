"""The page's conversation: opening, saving, clicking a message, deleting, undoing, a new chat and exporting it;
the saved conversations' list (the open one marked), its search, rename and delete.

Each event returns ``{component: update}`` (components of ``Page``); what it leaves out stays as it is.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

import gradio as gr

from app.history import NAME_CHARS, Conversation, ConversationStore, export_folder
from app.model_host import ModelHost
from app.page_layout import Page, Session
from app.page_text import chat_messages, conversation_choices, exchange, one_line, quoted, selection_line
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)
WAIT = "Wait for the answer to end."


def wait_line() -> str:
    """``WAIT``, also as a toast: while the answer streams, its updates rewrite the note under the chat."""
    gr.Warning(WAIT)
    return WAIT


class ConversationHandlers:
    """The events that change which conversation a page shows, or what it holds, without the model answering."""

    def __init__(self, host: ModelHost, store: ConversationStore, page: Page, api: str = ""):
        self.host = host
        self.api = api  # the API's line on the page ("": none served), ``{url}`` standing for the page's address
        self.store = store
        self.page = page
        self._export_dir: Path | None = None  # made on the first export
        self._restored = False  # the first page after launch with none of its own reopens the latest conversation

    def load(self, session: Session, page_conversation: str | None = None, request: gr.Request | None = None) -> dict:
        """A page opens: the conversation it had before a reload (``page_conversation``, kept by the browser), else on the
        first page after launch the latest one, else a new one. A conversation file set aside as unusable is a
        warning on the page."""
        opened = self._saved(page_conversation)
        if opened is None and not self._restored:
            opened = next(iter(self.store.list()), None)
        self._restored = True
        if opened is not None:
            session.conversation = opened
        conversation, page = session.conversation, self.page
        listed = self.listed(session)
        for line in self.store.notices():
            gr.Warning(line)
        return {page.session: session, page.chat.chatbot: chat_messages(conversation),
                page.settings.system: conversation.system_prompt, page.history.saved: listed,
                page.history.name: conversation.name, page.api: self.api_line(request),
                page.chat.context: self.context(conversation), page.page_id: conversation.id}

    def api_line(self, request: gr.Request | None) -> str:
        """The API's line, at the address the page was reached by; "" where the server serves no API."""
        host = request.headers.get("host") if request is not None else None
        if not self.api or not host:
            return ""
        scheme = urlsplit(str(getattr(request, "url", ""))).scheme or "http"
        return self.api.format(url=f"{scheme}://{host}/v1")

    def listed(self, session: Session) -> dict:
        """The saved conversations' list for ``session``: those its search finds, the open one selected."""
        choices = conversation_choices(self.store, query=session.search)
        opened = session.conversation.id if any(value == session.conversation.id for _, value in choices) else None
        return gr.update(choices=choices, value=opened)

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
        if not self.host.ready:
            return ""
        engine = self.host.engine
        system = conversation.system_prompt if system is None else system
        turns = [{"role": m["role"], "content": m["content"]} for m in conversation.messages]
        try:
            used = len(engine.chat_ids(([{"role": "system", "content": system}] if system.strip() else []) + turns))
        except PpdError:  # nothing asked yet: nothing is in the context
            used = 0
        limit = engine.max_context
        over = ": the earliest turns are left out" if used > limit else ""
        return f"Context: {used:,} of {limit:,} tokens ({used / limit:.0%}){over}"

    def changed(self, session: Session) -> dict:
        """After the conversation changed: the saved list, the context meter and the page's conversation id (a save may
        have given it a new one)."""
        conversation, page = session.conversation, self.page
        return {page.history.saved: self.listed(session),
                page.chat.context: self.context(conversation), page.page_id: conversation.id}

    def save(self, conversation: Conversation) -> float:
        """Save; a failed write is one line on the page and in the log (the next save retries the same file)."""
        try:
            self.store.save(conversation)
        except OSError as error:
            line = f"Could not save the conversation ({one_line(error)}); it is kept on this page and saved again later."
            log.warning(line)
            gr.Warning(line)
        return time.monotonic()

    def select(self, clicked: gr.SelectData, session: Session) -> dict:
        """A message clicked: the page offers to delete it or answer again from it (the selection row and its line)."""
        messages, index, page = session.conversation.messages, clicked.index, self.page
        index = index[0] if isinstance(index, (list, tuple)) and index else index
        if not (isinstance(index, int) and 0 <= index < len(messages)):
            session.selected = None
            return {page.session: session, page.chat.selection: gr.update(visible=False), page.chat.selected: ""}
        session.selected = (index, messages[index]["role"], messages[index]["content"])
        return {page.session: session, page.chat.selection: gr.update(visible=True),
                page.chat.selected: selection_line(messages, index)}

    def selected(self, session: Session) -> int | None:
        """The clicked message's index, if the conversation still holds it there (else None: it changed since)."""
        if session.selected is None:
            return None
        index, role, content = session.selected
        messages = session.conversation.messages
        ok = index < len(messages) and (messages[index]["role"], messages[index]["content"]) == (role, content)
        return index if ok else None

    def delete(self, session: Session) -> dict:
        """Delete the clicked message with the rest of its exchange (a question with its answer, an answer with its
        question), so the turns still alternate and the model sees what the page shows."""
        index, page = self.selected(session), self.page
        with session.unless_answering() as idle:
            if not idle or index is None:
                line = wait_line() if not idle else "Click a message in the chat first."
                return {page.chat.note: line, page.session: session, page.chat.selection: gr.update(visible=False)}
            self._remove(session, index)
        return {page.chat.chatbot: chat_messages(session.conversation), page.chat.note: "", page.session: session,
                page.chat.selection: gr.update(visible=False), **self.changed(session)}

    def undo(self, session: Session) -> dict:
        """The last answer's Undo icon: its exchange removed and the question put back in the box, to change and send
        again."""
        page = self.page
        with session.unless_answering() as idle:
            messages = session.conversation.messages
            questions = [i for i, message in enumerate(messages) if message["role"] == "user"]
            if not idle or not questions:
                return {page.chat.chatbot: chat_messages(session.conversation), page.session: session}
            text = messages[questions[-1]]["content"]
            self._remove(session, questions[-1])
        return {page.chat.chatbot: chat_messages(session.conversation), page.chat.message: text, page.chat.note: "",
                page.session: session, **self.changed(session)}

    def _remove(self, session: Session, index: int) -> None:
        """Remove the exchange holding message ``index`` and save; a conversation left empty is deleted from disk. The
        model forgets the answers it kept for its guesses (``ModelHost.forget_answers``)."""
        conversation = session.conversation
        start, end = exchange(conversation.messages, index)
        del conversation.messages[start:end]
        session.selected = None
        if conversation.messages:
            self.save(conversation)
        else:
            self.store.delete(conversation.id)
        self.host.forget_answers()

    def clear(self, session: Session, note: str = "") -> dict:
        """New chat: a new conversation, with a new id; the old one stays saved (``note``: the line shown). Refused
        while the page's answer streams (it goes into the conversation it began in, shown to its end)."""
        page = self.page
        with session.unless_answering() as idle:
            if not idle:
                return {page.session: session, page.chat.chatbot: chat_messages(session.conversation),
                        page.chat.note: wait_line()}
            session.conversation = Conversation(system_prompt=session.conversation.system_prompt)
        session.selected = session.deleting = None
        return {page.session: session, page.chat.chatbot: [], page.chat.readout: "", page.chat.note: note,
                page.history.saved: self.listed(session), page.history.name: "",
                page.history.confirm: gr.update(visible=False), page.chat.context: self.context(session.conversation),
                page.page_id: session.conversation.id}

    def open(self, conversation_id: str, session: Session) -> dict:
        """A saved conversation opened (clicked in the list); one that cannot be opened is a line."""
        page = self.page
        with session.unless_answering() as idle:
            if not conversation_id or not idle:
                note = wait_line() if conversation_id else ""
                return {page.session: session, page.chat.note: note, page.history.saved: self.listed(session)}
            try:
                session.conversation = self.store.load(conversation_id)
            except (OSError, ValueError) as error:
                line = f"Could not open that conversation: {one_line(error)}"
                return {page.session: session, page.chat.note: line, page.history.saved: self.listed(session)}
        session.selected = session.deleting = None
        conversation = session.conversation
        return {page.session: session, page.chat.chatbot: chat_messages(conversation), page.chat.note: "",
                page.settings.system: conversation.system_prompt, page.chat.context: self.context(conversation),
                page.history.name: conversation.name, page.history.confirm: gr.update(visible=False),
                page.page_id: conversation.id}

    def search(self, query: str, session: Session) -> dict:
        """The list narrowed to the conversations holding ``query`` (in their title or any message)."""
        session.search = query or ""
        return {self.page.session: session, self.page.history.saved: self.listed(session)}

    def rename(self, name: str, session: Session) -> dict:
        """The open conversation named ``name`` ("": its first message again), saved if it has begun."""
        conversation, page = session.conversation, self.page
        conversation.name = " ".join((name or "").split())[:NAME_CHARS]
        if conversation.messages and not session.answering:  # an answer streaming saves it (with its name) itself
            self.save(conversation)
        line = f"Renamed to {quoted(conversation.title)}." if conversation.name else "Named after its first message."
        return {page.session: session, page.history.saved: self.listed(session), page.history.name: conversation.name,
                page.chat.note: line, page.page_id: conversation.id}

    def ask_delete(self, session: Session) -> dict:
        """Delete: what it would remove, with Delete and Cancel (nothing removed yet)."""
        conversation, page = session.conversation, self.page
        if not conversation.messages or session.answering:
            line = wait_line() if session.answering else "This chat is empty: nothing to delete."
            return {page.session: session, page.chat.note: line, page.history.confirm: gr.update(visible=False)}
        session.deleting = conversation.id
        count = len(conversation.messages)
        line = (f"Delete {quoted(conversation.title)} and its {count} message{'s' if count != 1 else ''} from this "
                "computer? This cannot be undone.")
        return {page.session: session, page.history.confirm_line: line, page.history.confirm: gr.update(visible=True)}

    def delete_conversation(self, session: Session) -> dict:
        """Delete confirmed: the open conversation's file goes, and the page opens a new chat."""
        conversation, page = session.conversation, self.page
        with session.unless_answering() as idle:
            if not idle or session.deleting != conversation.id:  # it changed since Delete was asked
                session.deleting = None
                line = wait_line() if not idle else ""
                return {page.session: session, page.chat.note: line, page.history.confirm: gr.update(visible=False)}
            self.store.delete(conversation.id)
            self.host.forget_answers()  # the answers the model kept for its guesses go with it
            return self.clear(session, f"Deleted {quoted(conversation.title)}.")

    def cancel_delete(self, session: Session) -> dict:
        session.deleting = None
        return {self.page.session: session, self.page.history.confirm: gr.update(visible=False)}

    def export(self, kind: str, session: Session):
        """The conversation as a file to download (``kind``: "json" or "md"); None for an empty one."""
        if not session.conversation.messages:
            gr.Warning("The conversation is empty.")
            return None
        self._export_dir = self._export_dir or export_folder()
        return gr.update(value=str(self.store.export(session.conversation, kind, self._export_dir)), visible=True)
