"""Every registered guess source at once, through the engine as `--drafters` turns them on: greedy answers token for
token plain decoding's on the default GGUF (llama.cpp), over a conversation's two turns, with the model-wide sources
(recycling, suffix) carrying what they learnt from one answer into the next; an unknown source name is one line."""

from __future__ import annotations

import pytest

from ppd_core import EngineConfig
from ppd_core.drafters.registry import FACTORIES, check_names
from ppd_core.errors import PpdError

TURNS = ["Write a short poem about the sea.", "Write the same poem again, changing only its last line."]


@pytest.mark.slow
def test_every_source_on_decodes_what_plain_decoding_does(llama_default):
    engine = llama_default
    before = engine.drafters
    engine.drafters = tuple(FACTORIES)  # lookup, grammar, recycling, suffix
    try:
        messages, accepted = [], {}
        for question in TURNS:
            messages.append({"role": "user", "content": question})
            ids = engine.chat_ids(messages)
            plain = engine.generate(ids, "vanilla", 96)
            ppd = engine.generate(ids, "ppd", 96)
            assert ppd.tokens == plain.tokens, question
            for name, count in ppd.stats.accepted.items():
                accepted[name] = accepted.get(name, 0) + count
            messages.append({"role": "assistant", "content": ppd.text})
        assert accepted.get("recycling", 0) > 0 and accepted.get("suffix", 0) > 0, accepted
        assert {"recycling", "suffix"} <= set(engine._drafter_memory), "their tables are the model's, kept"
    finally:
        engine.drafters = before


def test_an_unknown_source_is_one_line_naming_it():
    with pytest.raises(PpdError, match="no guess source named copying; choose from lookup, grammar, recycling, suffix"):
        check_names(("lookup", "copying"))
    assert EngineConfig(drafters=("suffix",)).drafters == ("suffix",)
