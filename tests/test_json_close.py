"""``app.json_close``: every cut of a JSON text (each prefix) closes to valid JSON by appending only, and what a stream
sent of it (``held``) stays a prefix of the closed text."""

import json

import pytest

from app.json_close import closed, held
from app.structured import JsonContent

TEXTS = [
    '{"name": "Jo\\u00e9 \\"x\\", y", "tags": ["a", {"b": [1.5e3, true, null]}], "n": -12.5, "f": false}',
    '{\n  "a" : [ 1 ,\n 2 ] ,\n "b" : "x" , "c":{ } }',
    '[ {"k": "v"} , [ ] , "s" , 0 ]',
]


@pytest.mark.parametrize("text", TEXTS)
def test_every_cut_closes_to_json_keeping_what_was_sent(text):
    assert json.loads(text) is not None
    for end in range(1, len(text)):
        cut = text[:end]
        whole = closed(cut)
        json.loads(whole)  # valid JSON
        assert whole.startswith(held(cut.rstrip())), (cut, whole)


def test_a_fenced_stream_cut_anywhere_ends_in_json_it_began():
    text = '```json\n{\n    "name": "Jo,hn",\n    "age": 45,\n   "tags": [1, 2, {"a": "b"}]}\n```'
    for end in range(len("```json\n{"), len(text)):
        pieces = []
        stream = JsonContent(lambda piece, _: pieces.append(piece))
        for char in text[:end]:
            stream.feed(char)
        final = stream.close(complete=False)
        assert "".join(pieces) == final and isinstance(json.loads(final), dict), text[:end]
