"""The grammar's forced text as a guess source (``ppd_core.drafters.forced``): what it proposes is the text the grammar leaves
no choice about, in the answer's own whitespace habit, tokenized as the tokenizer does and allowed by the grammar
token by token; drafted as a chain it keeps greedy constrained PPD equal to plain constrained decoding, and the
accepted tokens are counted as the grammar's."""

import json

import jsonschema
import pytest

from ppd_core.backends.llamacpp.grammar import schema_grammar
from ppd_core.drafters.chain_policy import FixedChains
from ppd_core.sampling.params import SamplingParams
from ppd_core.plan import DecodePlan
from schema_prompts import PROMPTS
from test_default_model import planted
from test_structured import ANSWER, SCHEMAS

PERSON = SCHEMAS[0][1]  # name, age, city (an enum)


def texts(engine, tokens) -> str:
    return "".join(engine.tokenizer.token_bytes(t).decode() for t in tokens)


def walk(engine, grammar, drafter, text: str) -> None:
    """The answer so far: ``text``'s tokens accepted by the grammar and seen by the drafter."""
    tokens = engine.tokenizer.encode(text, add_special_tokens=False)
    for token in tokens:
        grammar.accept(token)
    drafter.observe(tokens)


def test_it_proposes_what_the_grammar_forces_in_the_answers_habit(llama_default):
    backend = llama_default.loaded.backend
    grammar, drafter = backend.grammar(schema_grammar(PERSON)), llama_default.new_forced_text()
    assert texts(llama_default, drafter.propose(grammar, 16)) == '{"name": "'  # JSON's usual spacing at first
    walk(llama_default, grammar, drafter, '{\n  "name": "Anna"')
    assert texts(llama_default, drafter.propose(grammar, 16)) == ',\n  "age": '  # its own newline and indent now
    walk(llama_default, grammar, drafter, ',\n  "age": 31')
    assert drafter.propose(grammar, 16) == []  # the number may go on
    walk(llama_default, grammar, drafter, ',')
    assert texts(llama_default, drafter.propose(grammar, 16)) == '\n  "city": "'  # the enum's values differ next
    walk(llama_default, grammar, drafter, '\n  "city": "Ro')
    assert texts(llama_default, drafter.propose(grammar, 16)) == 'me"}'  # one value left: the rest is forced
    assert len(drafter.propose(grammar, 1)) == 1
    walk(llama_default, grammar, drafter, 'me"\n}')
    assert drafter.propose(grammar, 16) == []  # only the end of the answer is left


@pytest.mark.parametrize("penalties", [False, True], ids=["greedy", "penalised"])
def test_drafted_forced_text_keeps_constrained_ppd_equal_to_plain(llama_default, monkeypatch, penalties):
    sampling = SamplingParams(repeat_penalty=1.3, repeat_last_n=64, frequency_penalty=0.2) if penalties else SamplingParams()
    monkeypatch.setattr(DecodePlan, "new_forced_chains", lambda plan: FixedChains((8,)))  # always draft
    vocab, counted = llama_default.loaded.backend.vocab_size, 0
    # the four, and five kinds of the forty; penalised, the four (the penalties are the same code on every prompt)
    for prompt, schema in SCHEMAS if penalties else [*SCHEMAS, *PROMPTS[::8]]:
        ids = llama_default.chat_ids([{"role": "user", "content": prompt}])
        grammar = schema_grammar(schema)
        plain = llama_default.generate(ids, "plain", ANSWER, sampling=sampling, grammar=grammar)
        for hook in (None, planted(plain.tokens, None, vocab)):  # the prompt tokens' own guesses, then all wrong
            ppd = llama_default.generate(ids, "ppd", ANSWER, sampling=sampling, grammar=grammar, guess_hook=hook)
            assert ppd.tokens == plain.tokens, prompt
            assert 0 <= ppd.stats.accepted.get("grammar", 0) <= ppd.stats.drafted.get("grammar", 0)
            counted += ppd.stats.accepted.get("grammar", 0)
        if plain.stop_reason == "eos":
            jsonschema.validate(json.loads(plain.text), schema)
    assert counted > 0  # forced text was drafted and accepted
