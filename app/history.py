"""Saved conversations: one JSON file each in the user's data directory, written atomically.

A save never replaces another conversation: each file carries a revision, and a copy whose
revision is not the one on disk (two pages holding the same conversation, or a clash of ids)
is saved under a new id instead, so both versions are kept.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs
import psutil
from filelock import FileLock

from ppd_core.atomic_files import atomic_write

if TYPE_CHECKING:
    from ppd_core import Engine


EXPORT_PREFIX = "ppd-export-"
TITLE_CHARS = 40  # a conversation's title: its first message, cut at a word near here
NAME_CHARS = 80  # a name the user gives a conversation
ROLES = ("user", "assistant")
BAD_SUFFIX = ".bad"  # an unusable conversation file, set aside: ``ID.json.bad``
log = logging.getLogger(__name__)


def new_conversation_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]


def conversations_dir() -> Path:
    return Path(platformdirs.user_data_dir("ppd")) / "conversations"


@dataclass
class Conversation:
    id: str = field(default_factory=new_conversation_id)
    messages: list[dict] = field(default_factory=list)  # {"role", "content"}, system prompt excluded
    system_prompt: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    revision: int = 0  # saves so far; a save must start from the revision on disk
    name: str = ""  # the name the user gave it (Rename); "": its first message is its title

    @property
    def title(self) -> str:
        """Its name, else the first user message, shortened at a word to about ``TITLE_CHARS`` (a list shows it on
        one line)."""
        if self.name.strip():
            return " ".join(self.name.split())
        first = " ".join(next((m["content"] for m in self.messages if m["role"] == "user"), "").split())
        if not first:
            return "New conversation"
        if len(first) <= TITLE_CHARS:
            return first
        cut = first[:TITLE_CHARS + 1].rsplit(" ", 1)[0] if " " in first[:TITLE_CHARS + 1] else first[:TITLE_CHARS]
        return cut.rstrip(" ,.;:") + "…"

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        if self.system_prompt:
            lines += [f"*System:* {self.system_prompt}", ""]
        for message in self.messages:
            lines += [f"**{message['role'].capitalize()}:**", "", message["content"], ""]
        return "\n".join(lines)


def checked(data) -> Conversation:
    """The conversation a file holds; a ValueError naming what is wrong where it is not one (a page would trip on
    it: a string ``updated``, a message without its role, a ``content`` that is no text)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    conversation = Conversation(**{k: data[k] for k in Conversation.__dataclass_fields__ if k in data})
    texts = {"id": conversation.id, "system_prompt": conversation.system_prompt, "name": conversation.name}
    numbers = {"created": conversation.created, "updated": conversation.updated, "revision": conversation.revision}
    wrong = [k for k, v in texts.items() if not isinstance(v, str)]
    wrong += [k for k, v in numbers.items() if isinstance(v, bool) or not isinstance(v, (int, float))
              or not math.isfinite(v)]
    if not isinstance(conversation.messages, list):
        wrong.append("messages")
    else:
        wrong += [f"messages[{i}]" for i, m in enumerate(conversation.messages) if not isinstance(m, dict)
                  or m.get("role") not in ROLES or not isinstance(m.get("content"), str)]
    if wrong:
        raise ValueError(f"{', '.join(wrong[:3])}{' and more' if len(wrong) > 3 else ''} of the wrong type or missing")
    return conversation


class ConversationStore:
    """Conversations on disk; an unusable file is set aside (``ID.json.bad``) with one line, never fatal."""

    def __init__(self, folder: Path | None = None):
        self.folder = folder or conversations_dir()
        self.set_aside: list[str] = []  # a line for each file set aside, until the page says it (``notices``)

    def path(self, conversation_id: str) -> Path:
        if not conversation_id or not all(ch.isalnum() or ch in "-_" for ch in conversation_id):
            raise ValueError(f"bad conversation id {conversation_id!r}")
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        """Write ``conversation``; if its file holds another revision, give it a new id first (nothing is replaced).

        Its id, revision and time change only once the file is written: after a failed write (an OSError)
        the next save writes the same file, not a fork.
        """
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with FileLock(self.folder / ".store.lock", mode=0o600):  # the revision check and the write, as one step
            path = self.path(conversation.id)
            record = replace(conversation, revision=conversation.revision + 1, updated=time.time())
            if path.exists() and self._revision_on_disk(path) != conversation.revision:
                record.id = new_conversation_id()
                path = self.path(record.id)
            text = json.dumps(asdict(record), indent=1, ensure_ascii=False)
            written = atomic_write(path, text, private=True)  # chats are personal: 0600 in a 0700 folder
            conversation.id, conversation.revision, conversation.updated = record.id, record.revision, record.updated
            return written

    @staticmethod
    def _revision_on_disk(path: Path) -> int | None:
        try:
            return int(json.loads(path.read_text(encoding="utf-8")).get("revision", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # unreadable: never overwritten either

    def load(self, conversation_id: str) -> Conversation:
        """The saved conversation; an OSError where there is none, a ValueError where its file is unusable (then set
        aside, with one line in the log and in ``set_aside``)."""
        path = self.path(conversation_id)
        try:  # a missing or unreadable file is an OSError, left where it is
            conversation = checked(json.loads(path.read_text(encoding="utf-8")))
            self.path(conversation.id)  # an id a save can write under
        except (ValueError, TypeError) as error:
            self._put_aside(path, error)
            raise ValueError(f"{path.name} is not a conversation ({error})") from None
        return conversation

    def _put_aside(self, path: Path, error: Exception) -> None:
        aside = path.with_name(path.name + BAD_SUFFIX)
        try:
            path.replace(aside)
            where = f"moved to {aside}"
        except OSError as failure:
            where = f"could not be moved: {failure.strerror or failure}"
        line = f"the conversation file {path} is unusable ({error}) and was set aside: {where}"
        log.warning(line)
        self.set_aside.append(line)

    def notices(self) -> list[str]:
        """The lines about files set aside since last asked (the page shows them once)."""
        lines, self.set_aside[:] = list(self.set_aside), []
        return lines

    def list(self) -> list[Conversation]:
        """Newest first; an unusable file is set aside (``load``) and the others listed."""
        found = []
        for path in self.folder.glob("*.json"):
            try:
                found.append(self.load(path.stem))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda c: c.updated, reverse=True)

    def delete(self, conversation_id: str) -> None:
        self.path(conversation_id).unlink(missing_ok=True)

    def export(self, conversation: Conversation, kind: str, folder: Path) -> Path:
        """Write ``conversation`` as ``json`` or ``md`` into ``folder``; returns the file."""
        if kind == "json":
            text = json.dumps(asdict(conversation), indent=1, ensure_ascii=False)
        elif kind == "md":
            text = conversation.to_markdown()
        else:
            raise ValueError(f"unknown export format {kind!r}")
        return atomic_write(folder / f"{conversation.id}.{kind}", text, private=True)  # 0600, as the chats are


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


@dataclass
class Unfinished:
    """An answer that ended at the length limit: its text, and the ids its model (``engine``) decoded it from and into
    (the prompt, then the answer's tokens), so that Continue goes on from exactly those tokens."""

    text: str
    ids: list[int]
    engine: Engine
