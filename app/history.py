"""Saved conversations: one JSON file each in the user's data directory, written atomically."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs


def conversations_dir() -> Path:
    return Path(platformdirs.user_data_dir("ppd")) / "conversations"


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    messages: list[dict] = field(default_factory=list)  # {"role", "content"}, system prompt excluded
    system_prompt: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def title(self) -> str:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "New conversation")
        first = " ".join(first.split())
        return first[:60] + ("..." if len(first) > 60 else "")

    def to_markdown(self) -> str:
        lines = [f"# {self.title}", ""]
        if self.system_prompt:
            lines += [f"*System:* {self.system_prompt}", ""]
        for message in self.messages:
            lines += [f"**{message['role'].capitalize()}:**", "", message["content"], ""]
        return "\n".join(lines)


class ConversationStore:
    """Conversations on disk; a corrupt file is skipped, never fatal."""

    def __init__(self, folder: Path | None = None):
        self.folder = folder or conversations_dir()

    def path(self, conversation_id: str) -> Path:
        if not conversation_id or not all(ch.isalnum() or ch in "-_" for ch in conversation_id):
            raise ValueError(f"bad conversation id {conversation_id!r}")
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> Path:
        conversation.updated = time.time()
        path = self.path(conversation.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(conversation), indent=1, ensure_ascii=False))
        os.replace(tmp, path)
        return path

    def load(self, conversation_id: str) -> Conversation:
        data = json.loads(self.path(conversation_id).read_text())
        return Conversation(**{k: data[k] for k in Conversation.__dataclass_fields__ if k in data})

    def list(self) -> list[Conversation]:
        """Newest first."""
        found = []
        for path in self.folder.glob("*.json"):
            try:
                found.append(self.load(path.stem))
            except (OSError, ValueError, TypeError, KeyError):
                continue
        return sorted(found, key=lambda c: c.updated, reverse=True)

    def delete(self, conversation_id: str) -> None:
        self.path(conversation_id).unlink(missing_ok=True)

    def export(self, conversation: Conversation, kind: str, folder: Path) -> Path:
        """Write ``conversation`` as ``json`` or ``md`` into ``folder``; returns the file."""
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "json":
            path = folder / f"{conversation.id}.json"
            path.write_text(json.dumps(asdict(conversation), indent=1, ensure_ascii=False))
        elif kind == "md":
            path = folder / f"{conversation.id}.md"
            path.write_text(conversation.to_markdown())
        else:
            raise ValueError(f"unknown export format {kind!r}")
        return path
