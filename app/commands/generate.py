"""`ppd generate`: answer one chat message, streamed to the terminal (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from app.commands.loading import load_engine
from app.commands.options import add_model_options, add_sampling_options, sampling_of
from ppd_core.errors import PpdError


def mode_name(mode: str) -> str:
    """``--mode``'s value; "vanilla", plain decoding's name in the README before issue 52, is taken as "plain"."""
    return "plain" if mode == "vanilla" else mode


def register(commands) -> None:
    """Add `ppd generate`'s sub-parser to ``commands``."""
    generate = commands.add_parser("generate", help="answer one chat message")
    generate.add_argument("text")
    generate.add_argument("--mode", default="ppd", choices=["ppd", "plain"], type=mode_name,
                          help="PPD (the default), or plain decoding: one token a step")
    generate.add_argument("--max-new-tokens", type=int, default=256)
    add_sampling_options(generate)
    generate.add_argument("--system", default=None, help="system prompt")
    generate.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_model_options(generate)


def run(args: argparse.Namespace) -> int:
    sampling = sampling_of(args)
    if args.max_new_tokens < 1:  # refused before the model loads (``Engine.check`` makes the model's checks)
        raise PpdError("--max-new-tokens must be at least 1")
    if not args.text.strip():
        raise PpdError("the message is empty")
    engine = load_engine(args, auto_calibrate=False)  # the answer never waits for a calibration
    if engine.has_chat_template:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.text}
        ]
        ids = engine.chat_ids(messages)
    else:  # a base model: it completes the text as written
        if args.system:
            raise PpdError(f"--system needs a chat template, and {engine.loaded.name} has none")
        print(f"ppd: {engine.loaded.name} has no chat template: completing the text as written", file=sys.stderr)
        ids = engine.completion_ids(args.text)
    request = engine.check(ids, args.max_new_tokens, mode=args.mode, sampling=sampling, chat=engine.has_chat_template)
    if engine.plan.awaiting_calibration and args.mode == "ppd":
        print("ppd: this device is not calibrated for this model yet: plain steps with chains copied from the "
              "conversation (`ppd calibrate` measures it once; `ppd chat` and `ppd serve` do it in the background)",
              file=sys.stderr)
    event = None
    for event in engine.answer(request):
        if not args.json:
            print(event.delta, end="", flush=True)
    stats = event.stats
    if args.json:
        print(json.dumps({
            "text": event.text,
            "new_tokens": stats.new_tokens,
            "steps": stats.steps,
            "mean_accepted": round(stats.mean_accepted, 4),
            "tok_s": round(stats.tok_s, 3),
            "mode": args.mode,
            "sampling": sampling.describe(),
        }))
    else:
        print()
        if event.stop_reason == "context":
            print("ppd: stopped at the end of the model's context window", file=sys.stderr)
        print(
            f"[{args.mode}] {stats.new_tokens} tokens in {stats.seconds:.2f} s, {stats.tok_s:.1f} tokens/s, "
            f"{stats.mean_accepted:.2f} tokens/step",
            file=sys.stderr,
        )
    return 0
