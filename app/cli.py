"""The `ppd` command line: one module per command in ``app/commands/``, each registering its own sub-parser
(``register``) and running it (``run``); here only the dispatch, and the exit codes (2: bad input, 130: Ctrl+C)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

# only plain data at import time: `ppd --help` and argument errors answer without importing torch or model code
from app.commands import bench, calibrate, chat, doctor, generate, quantize, serve, train
from ppd_core.errors import PpdError

COMMANDS = {"generate": generate, "bench": bench, "chat": chat, "serve": serve, "calibrate": calibrate,
            "train": train, "quantize": quantize, "doctor": doctor}  # in `ppd --help`'s order


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppd", description="Parallel Prompt Decoding for local chat")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="ppd: %(message)s")
    try:
        return COMMANDS[args.command].run(args)
    except PpdError as error:  # bad input: one line; anything else is a bug and keeps its traceback
        message = " ".join(str(error).split("\n")).strip() or type(error).__name__
        print(f"ppd: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppd: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `ppd` command. The servers (chat, serve) have stopped everything they could within their quit time when
    main returns: the process then ends at once, not waiting on a thread still inside llama.cpp (a calibration step)
    or a worker; what matters is on disk already (conversations and trainings are written atomically as they go)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in ("chat", "serve"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
