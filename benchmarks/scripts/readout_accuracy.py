"""The readout's live speedup estimate against Compare's measured speedup, answer by answer (issue 50, page item 1).

    python benchmarks/scripts/readout_accuracy.py [--busy] [--compares 2] [--model default] [--max-new-tokens 256]
        [--out FILE.json]

Ten greedy answers as the chat gives them (``Chat.answer``, the page's code path; the default model on llama.cpp unless
``--model``): five conversations, each a first turn and a follow-up. After each answer, Compare on the same message
``--compares`` times (it alternates which of plain and PPD runs first: the geometric mean is the measured speedup), and the
readout's estimate for that answer beside it. The target: every estimate within 10% of the measured speedup on a quiet
machine; ``--busy`` keeps one other process busy on a core throughout (a Python spin loop), and the target is 20%.
An answer decoded in 1-row steps only must read exactly 1.00x (tests/test_live_estimate.py checks that without timing).

The device must be calibrated for the model (a profile, as `ppd calibrate` or a first `ppd chat` saves it): the
estimate prices steps with it; without one the script calibrates first (minutes). Timings: run it on a quiet machine
(nothing else on the cores but what ``--busy`` adds). Prints one JSON object (also to ``--out``); exits 1 when an
estimate misses its target.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from app.chat import Chat
from app.chat_settings import ChatSettings
from app.model_host import ModelHost
from ppd_core import Engine, EngineConfig
from ppd_core.engine_calibration import calibrate_engine

CONVERSATIONS = [
    ("Give me three tips for staying healthy.", "Repeat your previous answer word for word."),
    ("Write a short poem about the sea.", "Write the same poem again, changing only its last line."),
    ("Explain what a hash table is in three sentences.", "Now say that again, as a numbered list."),
    ("Write a Python function that reverses a string.", "Show the same function again with a docstring added."),
    ("List the planets of the solar system, one per line.", "List them again, in reverse order."),
]
ESTIMATE = re.compile(r"([0-9.]+)x faster than plain decoding|([0-9.]+)x the speed of plain decoding|"
                      r"as fast as plain decoding \(([0-9.]+)x\)")


def estimated(readout: str) -> float:
    found = ESTIMATE.search(readout)
    if not found:
        raise SystemExit(f"no estimate in the readout: {readout}")
    return float(next(group for group in found.groups() if group))


def run(chat: Chat, settings: ChatSettings, compares: int) -> list[dict]:
    rows = []
    for conversation in CONVERSATIONS:
        messages: list[dict] = []
        for turn, question in enumerate(conversation, 1):
            messages.append({"role": "user", "content": question})
            last = list(chat.answer(messages, settings))[-1]
            estimate = estimated(last.readout)
            speedups = [chat.compare(messages, settings).speedup for _ in range(compares)]
            measured = math.prod(speedups) ** (1 / compares)
            rows.append({"question": question, "turn": turn, "tokens": last.stats.new_tokens,
                         "tokens_per_step": round(last.stats.mean_accepted, 3), "estimate": estimate,
                         "measured": round(measured, 4), "compares": [round(x, 4) for x in speedups],
                         "error": round(estimate / measured - 1, 4)})
            print(json.dumps(rows[-1]), file=sys.stderr)
            messages.append({"role": "assistant", "content": last.text})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--busy", action="store_true", help="keep another process busy on a core meanwhile")
    parser.add_argument("--compares", type=int, default=2, help="Compare runs per answer (an even number: as many "
                        "with plain decoding first as with PPD first)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    backend = "llamacpp" if args.model == "default" else "auto"
    engine = Engine.load(EngineConfig(model=args.model, backend=backend, tree="auto", auto_calibrate=False))
    if engine.plan.profile is None:
        print("no calibration for this device and model: calibrating first", file=sys.stderr)
        calibrate_engine(engine)
    chat = Chat(ModelHost(engine))
    settings = ChatSettings(max_new_tokens=args.max_new_tokens, values={"temperature": 0.0})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        rows = run(chat, settings, args.compares)
    finally:
        if hog is not None:
            hog.kill()
    bound = 0.20 if args.busy else 0.10
    worst = max(abs(row["error"]) for row in rows)
    result = {"model": engine.loaded.name, "busy": args.busy, "compares": args.compares, "bound": bound,
              "worst_error": worst,
              "within": worst <= bound, "answers": rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0 if result["within"] else 1)


if __name__ == "__main__":
    main()
