"""`ppd chat`: the chat page and the OpenAI-compatible API on one server, the model loading behind."""

from __future__ import annotations

import argparse
import os
import sys

from app.commands.loading import load_engine
from app.commands.options import add_model_options, check_threads
from app.commands.serving import (API_KEY_ENV, add_guard_options, add_queue_option, api_key_of, check_max_queue,
                                  check_port_free, guard_policy, is_loopback, url_host)
from ppd_core.errors import PpdError

AUTH_ENV = "PPD_AUTH"  # USER:PASS for `ppd chat`, instead of --auth (keeps the password out of `ps`)
TRAIN_OPTIONS_ENV = "PPD_TRAIN_OPTIONS"  # more `ppd train` arguments for the trainings `ppd chat` starts (tests: tiny)


def register(commands) -> None:
    """Add `ppd chat`'s sub-parser to ``commands``."""
    chat = commands.add_parser("chat", help="the chat app, in your browser")
    chat.add_argument("--host", default="127.0.0.1", help="address to serve on; any but a loopback one needs --auth or --no-auth")
    chat.add_argument("--port", type=int, default=7860)
    login = chat.add_mutually_exclusive_group()
    login.add_argument("--auth", default=None, metavar="USER:PASS", help=f"require this login (default: ${AUTH_ENV} if set)")
    login.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without a login (anyone who reaches it can use it)")
    chat.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"key for the OpenAI-compatible API at /v1 (default: ${API_KEY_ENV} if set); on a non-loopback --host "
        "the API is served only with a key or --no-auth",
    )
    add_queue_option(chat)
    add_guard_options(chat)
    add_model_options(chat)


def run(args: argparse.Namespace) -> int:
    auth = chat_auth(args)  # bad host, login, key, queue or port: fail before loading the model
    serve_api, api_key = api_key_of(args)
    check_max_queue(args)
    check_threads(args)
    check_port_free(args.host, args.port)
    train_options = train_options_of_environment()
    from app.model_host import ModelHost
    from ppd_core.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start

    def load(spec: str, progress):  # the model options, with another model (the page switches models)
        # a first launch on this device calibrates beside the first answers (ModelHost.calibrate_in_background)
        return load_engine(argparse.Namespace(**{**vars(args), "model": spec}), auto_calibrate=False, progress=progress)

    # the page first: it shows the model's loading, and sends once it is ready; one model and one line for it, for the
    # page and the API
    service = ModelHost(None, max_waiting=args.max_queue, spec=args.model, loader=load, calibrate_in_background=True,
                        train_options=train_options)
    # gradio's import first (loading the model beside it measured no sooner to a first answer, and the page later)
    from app.server import Serving, server_app
    from app.ui import api_line, build_app

    page = build_app(service, api=api_line(api_key is not None) if serve_api else "")  # the page says where /v1 is
    app = server_app(service, guard_policy(args), page=page, auth=auth, api_key=api_key, serve_api=serve_api)
    print(f"ppd: chat on http://{url_host(args.host)}:{args.port} (Ctrl+C to quit); the page shows the model loading",
          file=sys.stderr)

    def ready() -> None:
        if serve_api:
            print(f"ppd: OpenAI-compatible API on http://{url_host(args.host)}:{args.port}/v1"
                  + (" (key required)" if api_key else ""), file=sys.stderr)
        print("ppd: the model is ready", file=sys.stderr)

    Serving(app, args.host, args.port).run(service, lambda progress: load(args.model, progress), ready)
    return 0


def parse_auth(value: str) -> tuple[str, str]:
    """``USER:PASS`` (the password may hold colons) -> (user, password)."""
    user, colon, password = value.partition(":")
    if not colon or not user or not password:
        raise PpdError("--auth must be USER:PASS with a non-empty user and password")
    return user, password


def chat_auth(args: argparse.Namespace) -> tuple[str, str] | None:
    """The login for `ppd chat`; a non-loopback --host needs --auth (or $PPD_AUTH) or an explicit --no-auth."""
    value = args.auth if args.auth is not None else (None if args.no_auth else os.environ.get(AUTH_ENV) or None)
    if value is not None:
        return parse_auth(value)
    if not is_loopback(args.host):
        if not args.no_auth:
            raise PpdError(
                f"--host {args.host} serves beyond this machine: add --auth USER:PASS (or set {AUTH_ENV}), "
                "or --no-auth to serve it without a login"
            )
        print(
            f"ppd: warning: serving on {args.host} without a login (--no-auth): anyone who can reach it can read "
            "the saved conversations and recalibrate",
            file=sys.stderr,
        )
    return None


def train_options_of_environment() -> list[str]:
    """``$PPD_TRAIN_OPTIONS``, split as a shell would: more `ppd train` arguments for the page's trainings (a testing
    hook: tests and benchmarks/scripts/chaos.py make them tiny); a value that does not split is one line."""
    import shlex

    try:
        return shlex.split(os.environ.get(TRAIN_OPTIONS_ENV, ""))
    except ValueError as error:
        raise PpdError(f"{TRAIN_OPTIONS_ENV}: {error}") from None
