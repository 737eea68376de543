"""Structured answers: JSON schemas and GBNF grammars through llama.cpp's grammar engine, exact under PPD's trees.

Greedy constrained PPD gives the tokens plain constrained decoding gives (each tree row constrained by the grammar
after its own path; guesses planted right and wrong so that trees are accepted and rejected), with and without
repetition penalties; every answer validates against its schema (``jsonschema``); the API takes OpenAI's
``response_format`` and llama-server's ``grammar`` through the real ``openai`` client, and bad ones are one 400.
"""

import json
from typing import Literal

import httpx
import jsonschema
import numpy as np
import pydantic
import pytest

from app.structured import json_content
from ppd_core import SamplingParams
from ppd_core.backends.llamacpp.grammar import schema_grammar
from test_api import error_of, served  # noqa: F401 - a fixture
from test_default_model import planted

SCHEMAS = [
    ("Extract the person: Anna is 31 and lives in Rome.",
     {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                       "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]}},
      "required": ["name", "age", "city"]}),
    ("Is this review positive or negative? 'The soup was cold and the waiter rude.'",
     {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                       "confidence": {"type": "number"}}, "required": ["sentiment", "confidence"]}),
    ("List three fruits with their colours.",
     {"type": "object", "properties": {"fruits": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
         "type": "object", "properties": {"name": {"type": "string"}, "colour": {"type": "string"}},
         "required": ["name", "colour"]}}}, "required": ["fruits"]}),
    ("Give the capital of France and whether it is on a river.",
     {"type": "object", "properties": {"capital": {"type": "string"}, "river": {"type": "boolean"},
                                       "facts": {"type": "object", "properties": {"population": {"type": "integer"}},
                                                 "required": ["population"]}},
      "required": ["capital", "river", "facts"]}),
]
ANSWER = 80


def test_schemas_become_the_grammar_llama_server_makes_of_them():
    """The set-up built llama.cpp's own converter (llama-server's, common/json-schema-to-grammar.cpp) and schemas go
    through it: its whitespace rule and integer bounds (from llama.cpp's tests/test-json-schema-to-grammar.cpp; the
    older Python port gives `" "?` and no bound); json_object and an empty schema are any object, as there; a chat's
    response_format is the JSON bare or in a ```json fence, whitespace around it, as llama-server's chat grammar."""
    from ppd_core.backends.llamacpp.grammar import json_grammar
    from ppd_core.native.schema import converter

    assert converter() is not None, "make setup did not build ppd_core/native (llama.cpp's schema converter)"
    assert schema_grammar({"type": "integer", "minimum": 3}).split("\n")[:2] == [
        "root ::= ([1-2] [0-9]{1,15} | [3-9] [0-9]{0,15})", 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}']
    assert "response-format-schema ::= object" in json_grammar()
    assert 'root ::= space (space ("```json" space response-format-schema space "```" | space response-format-schema ' \
           'space))' in json_grammar()
    with pytest.raises(Exception, match="unrecognized type foo"):
        schema_grammar({"type": "foo"})


def test_the_constrained_argmax_is_the_masked_rows_argmax(llama_default):
    """``Grammar.best`` (the row's argmax where allowed, else a few likeliest, else the whole masked row) is the
    argmax of the row with every forbidden token at -inf, in every state of a real answer."""
    backend = llama_default.loaded.backend
    grammar = backend.grammar(schema_grammar(SCHEMAS[2][1]))
    rng = np.random.default_rng(0)
    for step in range(40):
        row = rng.standard_normal(backend.vocab_size).astype(np.float32)
        if step % 2:  # many exact ties, as coarse logits have
            row = np.round(row, 1)
        masked = grammar.allowed(row)
        assert np.isfinite(masked).sum() >= 1
        token = grammar.best(row)
        assert token == int(np.argmax(masked))
        grammar.accept(token)


def test_a_response_formats_json_is_taken_out_of_its_fence_as_it_streams():
    from app.structured import JsonContent, json_content

    answer = '  ```json\n{"a": "x ``` y", "b": [1, 2]}\n```\n'
    for text in (answer, '{"a": "x ``` y", "b": [1, 2]} \n', '\n```json{"a": "x ``` y", "b": [1, 2]}```'):
        assert json_content(text) == '{"a": "x ``` y", "b": [1, 2]}'
        pieces = []
        stream = JsonContent(lambda piece, extra: pieces.append(piece))
        for i in range(0, len(text), 3):  # three characters a step: each piece extends what went out before
            stream.feed(text[i:i + 3])
            assert '{"a": "x ``` y", "b": [1, 2]}'.startswith("".join(pieces))
        assert stream.close() == "".join(pieces) == json_content(text)
    assert json_content("``") == json_content("   ") == ""
    assert json_content('```json\n{"a": [1,\n ', complete=False) == '{"a": [1]}'  # cut short: closed, its dangling comma left out
    assert json_content('```json\n{"a": [1]}\n`', complete=False) == '{"a": [1]}'  # cut after its JSON


@pytest.mark.parametrize("penalties", [False, True], ids=["greedy", "penalised"])
def test_constrained_ppd_equals_constrained_plain_decoding_and_validates(llama_default, penalties):
    sampling = SamplingParams(repeat_penalty=1.3, repeat_last_n=64, frequency_penalty=0.2) if penalties else SamplingParams()
    vocab = llama_default.loaded.backend.vocab_size
    for prompt, schema in SCHEMAS:
        ids = llama_default.chat_ids([{"role": "user", "content": prompt}])
        grammar = schema_grammar(schema)
        plain = llama_default.generate(ids, "plain", ANSWER, sampling=sampling, grammar=grammar)
        assert plain.tokens[-1] in llama_default.loaded.eos_token_ids, plain.text  # the grammar ended the answer
        jsonschema.validate(json.loads(plain.text), schema)
        free = llama_default.generate(ids, "plain", ANSWER, sampling=sampling)
        assert free.tokens != plain.tokens  # the grammar did change the answer
        for ranks in ((0, 1, 0), None):  # right guesses accepted, then all wrong (every tree rejected)
            ppd = llama_default.generate(ids, "ppd", ANSWER, sampling=sampling, grammar=grammar,
                                          guess_hook=planted(plain.tokens, ranks, vocab))
            assert ppd.tokens == plain.tokens, (prompt, ranks)
        ppd = llama_default.generate(ids, "ppd", ANSWER, sampling=sampling, grammar=grammar)
        assert ppd.tokens == plain.tokens


def test_seeded_constrained_sampling_is_valid_json(llama_default):
    """Sampled under the grammar, every token is one it allows, and every answer that ends is valid JSON."""
    from ppd_core.sampling.constraint import allowed_prefix

    prompt, schema = SCHEMAS[0]
    ids = llama_default.chat_ids([{"role": "user", "content": prompt}])
    grammar, ended = schema_grammar(schema), 0
    for seed in range(4):
        sampled = llama_default.generate(ids, "ppd", 120, sampling=SamplingParams(temperature=0.7, seed=seed),
                                          grammar=grammar)
        state = llama_default.loaded.backend.grammar(grammar)
        body = [t for t in sampled.tokens if t not in llama_default.loaded.eos_token_ids]
        assert allowed_prefix(state, body) == body
        if sampled.stop_reason == "eos":
            jsonschema.validate(json.loads(sampled.text), schema)
            ended += 1
    assert ended >= 2, ended  # most answers end within the budget


@pytest.mark.slow
def test_response_format_and_grammar_through_the_openai_client(served):  # noqa: F811
    client, service, app, url = served
    prompt, schema = SCHEMAS[0]
    messages = [{"role": "user", "content": prompt}]
    answer = client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=ANSWER,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    text = answer.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    engine = service.engine
    sampling = service.snapshot().sampling_defaults.params(temperature=0.0)
    with service.turn():  # what the API does: llama-server's chat grammar, the JSON as the content
        expected = engine.generate(engine.chat_ids(messages), "plain", ANSWER, sampling=sampling,
                                   grammar=schema_grammar(schema, response_format=True))
    assert text == json_content(expected.text, complete=expected.stop_reason == "eos")
    streamed = client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=ANSWER, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == text

    class Person(pydantic.BaseModel):  # the openai client's own schema from a Pydantic model, and its parse
        name: str
        age: int
        city: Literal["Paris", "Berlin", "Rome"]

    parsed = client.beta.chat.completions.parse(model="m", messages=messages, temperature=0, max_tokens=ANSWER,
                                                response_format=Person)
    assert isinstance(parsed.choices[0].message.parsed, Person)
    yes_no = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Is water wet?"}],
                                            temperature=0, max_tokens=8, extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert yes_no.choices[0].message.content in ("yes", "no")
    anything = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=ANSWER,
                                              response_format={"type": "json_object"})
    assert isinstance(json.loads(anything.choices[0].message.content), dict)  # json_object: an object


def test_bad_schemas_and_grammars_are_one_400_naming_the_field(served):  # noqa: F811
    client, service, app, url = served
    question = [{"role": "user", "content": "Hi"}]

    def post(**fields) -> dict:
        body = {"messages": question, "max_tokens": 4, **fields}
        return error_of(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30))

    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "array", "items": deep}
    cases = [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "array", "minItems": 10**9}}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20000)}}}}},
         "response_format.json_schema.schema"),
        ({"grammar": "root ::= ["}, "grammar"),
        ({"grammar": 'start ::= "x"'}, "grammar"),
        ({"grammar": 'root ::= "x"', "response_format": {"type": "json_object"}}, "grammar"),
    ]
    for fields, param in cases:
        error = post(**fields)
        assert error["param"] == param, (fields if len(json.dumps(fields)) < 300 else param, error)
        assert "\n" not in error["message"]
    assert not service.queue.busy and app.state.ppd.running == 0  # nothing reached the model
    answer = httpx.post(f"{url}/v1/chat/completions", json={"messages": question, "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]  # and it answers after


def test_grammar_and_schema_bounds_are_checked_before_llama_cpp_sees_them():
    """What made llama.cpp's grammar code allocate until the process aborted, hang or take a minute (issue 50) is
    refused in one line, by reading the text or the schema once; what llama.cpp takes stays taken."""
    from app.schema_bounds import schema_problem
    from ppd_core.grammar_bounds import gbnf_problem

    refused = {'root ::= "a"{5,1}': "{5,1} has its most below its least", 'root ::= "a"{2001}': "over 1000",
               'root ::= "a"{1000}{1000}': "more than 1,000,000", 'root ::= "' + "x" * 2000 + '"{999}': "more than",
               "root ::= <[32000]>": "beyond this model's vocabulary of 32000", 'root ::= [a-z]{3, 1}': "{3, 1}"}
    for grammar, message in refused.items():
        assert message in (gbnf_problem(grammar, 32000) or ""), grammar
    taken = ('root ::= "a"{1,5} [a-z]{0,}', 'root ::= "{5,1}" [{] # {5,1}\nx ::= ("a" | "b"){2}', "root ::= <[31999]>",
             'root ::= "\\"{5,1}"', "root ::= [\\]{5,1}]")
    for grammar in taken:
        assert gbnf_problem(grammar, 32000) is None, grammar
    inverted = {"minLength": 5, "maxLength": 1}
    assert "minLength 5 is above maxLength 1 at '/properties/a~1b'" in schema_problem(
        {"type": "object", "properties": {"a/b": {"type": "string", **inverted}}})
    assert "enum values" in schema_problem({"enum": list(range(5000))})
    assert "properties" in schema_problem({"properties": {f"p{i}": {} for i in range(2000)}})
    assert "2**53" in schema_problem({"type": "integer", "maximum": float("nan")})
    for fine in ({"enum": [inverted]}, {"properties": {"minimum": {"type": "integer"}}}, {"const": inverted},
                 {"type": "integer", "minimum": -5, "maximum": 2**53}):
        assert schema_problem(fine) is None, fine


@pytest.fixture(scope="module")
def oracle():
    from llama_cpp import GGML_TYPE_Q8_0

    from ppd_core.backends.llamacpp.library import chat_model
    from ppd_core.loading import default_model_file

    llm = chat_model(default_model_file(), n_ctx=2048, n_threads=2, n_threads_batch=2, flash_attn=True,
                     type_k=GGML_TYPE_Q8_0, type_v=GGML_TYPE_Q8_0, verbose=False)
    yield llm
    llm.close()


def llama_cpp_answer(llm, prompt: list[int], grammar: str, params: SamplingParams, eos, limit: int) -> list[int]:
    """llama.cpp's own greedy constrained answer: a sampler chain of its penalties (the prompt accepted into them
    first, as llama-server does), its grammar sampler and greedy, each token sampled by ``llama_sampler_sample``."""
    import llama_cpp.llama_cpp as lc

    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    penalties = lc.llama_sampler_init_penalties(llm.n_vocab(), params.repeat_last_n, params.repeat_penalty,
                                                params.frequency_penalty, params.presence_penalty)
    for token in prompt:
        lc.llama_sampler_accept(penalties, token)  # the grammar sees the answer only
    lc.llama_sampler_chain_add(chain, penalties)
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_grammar(llm._model.vocab, grammar.encode(), b"root"))
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    try:
        llm.reset()
        llm.eval(prompt)
        answer = []
        while len(answer) < limit:
            answer.append(lc.llama_sampler_sample(chain, llm.ctx, -1))
            if answer[-1] in eos:
                break
            llm.eval([answer[-1]])
        return answer
    finally:
        lc.llama_sampler_free(chain)


@pytest.mark.parametrize("penalties", [False, True], ids=["greedy", "penalised"])
def test_forty_schema_answers_equal_llama_cpps_grammar_sampler_and_validate(llama_default, oracle, penalties):
    """The 40 schema prompts (``schema_prompts``): ppd's PPD answers (the static tree's prompt-token rows and lookup
    chains) equal llama.cpp's grammar sampler chain token for token, and parse and validate; its plain answers on
    every fourth prompt (ten, each kind of schema at least once: plain constrained decoding is one token a step, the
    same code on every prompt; test_constrained_ppd_equals_constrained_plain_decoding_and_validates holds it to PPD).
    With the penalties, every fourth prompt, plain and PPD: the penalised chain is the same code on every prompt, and
    the forty are over three minutes on two cores."""
    from schema_prompts import PROMPTS

    sampling = SamplingParams(repeat_penalty=1.2, repeat_last_n=64, presence_penalty=0.3) if penalties else SamplingParams()
    engine, eos = llama_default, llama_default.loaded.eos_token_ids
    engine.replan(lookup=4)
    try:
        for index, (prompt, schema) in enumerate(PROMPTS[::4] if penalties else PROMPTS):
            ids = engine.chat_ids([{"role": "user", "content": prompt}])
            grammar = schema_grammar(schema)
            expected = llama_cpp_answer(oracle, ids, grammar, sampling, eos, ANSWER)
            for mode in ("plain", "ppd") if penalties or index % 4 == 0 else ("ppd",):
                answer = engine.generate(ids, mode, ANSWER, sampling=sampling, grammar=grammar)
                assert answer.tokens == expected, (prompt, mode)
            if expected[-1] in eos:  # a finished answer (not cut at the limit) is valid
                jsonschema.validate(json.loads(answer.text), schema)
    finally:
        engine.replan(lookup=None)
