"""What a JSON schema's size costs llama.cpp's grammar: why the API caps ``enum`` values and ``properties`` (issue 50).

    .venv/bin/python benchmarks/scripts/grammar_limits.py [--json FILE]

For schemas with n ``enum`` values and with n optional string properties, on the default GGUF (llama.cpp): seconds to
turn the schema into GBNF (llama-server's converter, ``schema_grammar``), to build the grammar, and to mask one full
vocabulary row at the answer's start (``Grammar.allowed``: what every sampled token costs at least). Run on a quiet
machine; the costs grow with n, and ``app/schema_bounds.py`` caps n at 200 (benchmarks/README.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from measurement import machine, now, report
from ppd_core import Engine, EngineConfig
from ppd_core import schema_grammar

ENUMS = (50, 100, 200, 400)
PROPERTIES = (100, 200, 400)


def timed(schema: dict, engine: Engine) -> dict:
    started = time.perf_counter()
    text = schema_grammar(schema)
    converted = time.perf_counter()
    grammar = engine.loaded.backend.grammar(text)
    built = time.perf_counter()
    grammar.allowed(np.zeros(engine.loaded.backend.vocab_size, dtype=np.float32))
    masked = time.perf_counter()
    grammar.close()
    return {"convert_s": round(converted - started, 3), "build_s": round(built - converted, 3),
            "mask_one_row_s": round(masked - built, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="small", auto_calibrate=False))
    rows = []
    for n in ENUMS:
        schema = {"type": "string", "enum": [f"value number {i}" for i in range(n)]}
        rows.append({"enum_values": n, **timed(schema, engine)})
        print(json.dumps(rows[-1]), flush=True)
    for n in PROPERTIES:
        schema = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(n)}}
        rows.append({"properties": n, **timed(schema, engine)})
        print(json.dumps(rows[-1]), flush=True)
    report({"machine": machine(), "when": now(), "command": "benchmarks/scripts/grammar_limits.py", "rows": rows},
           args.json)


if __name__ == "__main__":
    main()
