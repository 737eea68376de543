"""`ppd doctor`: check ppd on this machine (``app.doctor``) and write a report to paste into an issue."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands.loading import load_engine
from app.commands.options import add_model_options, model_threads
from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core.errors import PpdError


def register(commands) -> None:
    """Add `ppd doctor`'s sub-parser to ``commands``."""
    doctor = commands.add_parser("doctor", help="check ppd on this machine (environment, exactness, step latency, "
                                 "speed) and write a report to paste into an issue")
    doctor.add_argument("--prompts", type=int, default=5, metavar="N",
                        help="MT-Bench first turns answered both ways (default 5)")
    doctor.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    doctor.add_argument("--out", type=Path, default=Path("doctor-report"), metavar="DIR",
                        help="where doctor.json and doctor.md go (default ./doctor-report)")
    add_model_options(doctor)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every check passes, 1 when one fails (the report says which); bad input is 2, as elsewhere."""
    if args.prompts < 1:
        raise PpdError(f"--prompts must be at least 1, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise PpdError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    model_threads(args)  # a bad --threads fails before the heavy imports
    import shlex

    from app.doctor import DoctorConfig, check_out, markdown, run_doctor as check, write_report

    questions = read_questions(DEFAULT_QUESTIONS, None)
    if args.prompts > len(questions):
        raise PpdError(f"--prompts must be at most {len(questions)} (the MT-Bench questions shipped), got {args.prompts}")
    check_out(args.out)
    engine = load_engine(args)  # --tree auto: the device's profile, calibrated first where there is none (as `ppd bench`)
    config = DoctorConfig(args.prompts, args.max_new_tokens, shlex.join(command_line(args)))
    report = check(engine, [q.turns[0] for q in questions[: args.prompts]], config)
    summary = markdown(report, engine.tokenizer)
    paths = write_report(report, summary, args.out)
    print(summary, end="")
    print(f"ppd doctor: report written to {paths[0]} and {paths[1]}", file=sys.stderr)
    return 0 if report["verdict"] == "PASS" else 1


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as run, for the report: the options that differ from their defaults, and the sizes."""
    parser = argparse.ArgumentParser(prog="ppd")
    register(parser.add_subparsers(dest="command"))
    defaults = vars(parser.parse_args(["doctor"]))
    return ["ppd", "doctor"] + [word for name, value in vars(args).items()
                                if name in ("prompts", "max_new_tokens") or value != defaults[name]
                                for word in (f"--{name.replace('_', '-')}", str(value))]
