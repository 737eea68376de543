"""How often the grammar's forced text (``ppd_core.drafters.forced``) is right, replayed on the 40 schema prompts.

    .venv/bin/python benchmarks/scripts/forced_acceptance.py [--json OUT] [--limit 40] [--max-new-tokens 80]

Each prompt is answered greedily under llama-server's chat grammar for its schema (plain steps); then, at every
position of the answer, the drafter (having seen the answer so far) proposes up to 8 tokens, and the proposal is held
against the tokens that came. Prints P(the first j proposed tokens are right) over the positions with a proposal,
the share of positions that had one, and the tokens per step a chain of each length would give where every step
drafts it: the figures a device's curve turns into a speed (``ppd_core.drafters.chain_policy.AdaptiveChains``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from ppd_core import Engine, EngineConfig  # noqa: E402
from ppd_core import schema_grammar  # noqa: E402
from ppd_core.drafters.base import right_guesses  # noqa: E402
from schema_prompts import PROMPTS  # noqa: E402

LONGEST = 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium", threads=2,
                                      auto_calibrate=False))
    backend, eos = engine.loaded.backend, engine.loaded.eos_token_ids
    right = [0] * (LONGEST + 1)  # positions whose proposal's first j tokens were right, j = 0..LONGEST
    positions = proposed = 0
    for prompt, schema in PROMPTS[: args.limit]:
        grammar = schema_grammar(schema, response_format=True)
        answer = engine.generate(engine.chat_ids([{"role": "user", "content": prompt}]), "plain",
                                 args.max_new_tokens, grammar=grammar).tokens
        state, drafter = backend.grammar(grammar), engine.new_forced_text()
        for i, token in enumerate(answer):  # the drafter after answer[:i + 1], as decoding asks it
            if token in eos:
                break
            state.accept(token)
            drafter.observe([token])
            positions += 1
            chain = drafter.propose(state, LONGEST)
            if chain:
                proposed += 1
                hits = right_guesses(chain, answer[i + 1:], 0)
                for j in range(hits + 1):
                    right[j] += 1
        state.close()
    probs = [right[j] / proposed for j in range(1, LONGEST + 1)] if proposed else []
    result = {"positions": positions, "with_a_proposal": proposed,
              "p_first_j_right": [round(p, 3) for p in probs],
              "tokens_per_step_drafting_j": [round(1 + sum(probs[:j]) * proposed / positions, 3)
                                             for j in range(LONGEST + 1)],
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
