"""`ppd serve`: the OpenAI-compatible API alone, listening at once, the model loading behind."""

from __future__ import annotations

import argparse
import sys

from app.commands.loading import load_engine
from app.commands.options import add_model_options, check_threads
from app.commands.serving import (API_KEY_ENV, add_guard_options, add_queue_option, api_key_of, check_max_queue,
                                  check_port_free, guard_policy, url_host)


def register(commands) -> None:
    """Add `ppd serve`'s sub-parser to ``commands``."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible API (/v1/chat/completions) for editors and chat front-ends")
    serve.add_argument("--host", default="127.0.0.1", help="address to serve on; any but a loopback one needs --api-key or --no-auth")
    serve.add_argument("--port", type=int, default=8000)
    add_queue_option(serve)
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=None, metavar="KEY", help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV} if set)")
    keys.add_argument("--no-auth", action="store_true", help="serve a non-loopback --host without a key (anyone who reaches it can use it)")
    add_guard_options(serve)
    add_model_options(serve)


def run(args: argparse.Namespace) -> int:
    _, api_key = api_key_of(args)  # bad host, key, queue or port: fail before loading the model
    check_max_queue(args)
    check_threads(args)
    check_port_free(args.host, args.port)
    from app.model_host import ModelHost
    from app.server import Serving, server_app
    from ppd_core.memory import limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start
    # listening at once (/health and /v1 answer 503 with Retry-After while the model loads); a first launch on this
    # device calibrates behind the answers
    service = ModelHost(None, max_waiting=args.max_queue, spec=args.model, calibrate_in_background=True)
    app = server_app(service, guard_policy(args), api_key=api_key)
    url = f"http://{url_host(args.host)}:{args.port}/v1"
    print(f"ppd: OpenAI-compatible API on {url}" + (" (key required)" if api_key else "")
          + " (Ctrl+C to quit); it answers once the model is loaded", file=sys.stderr)
    Serving(app, args.host, args.port).run(
        service, lambda progress: load_engine(args, auto_calibrate=False, progress=progress),
        lambda: print("ppd: the model is ready", file=sys.stderr))
    return 0
